//! Which directory is the project: the nearest ancestor of the working directory holding
//! `.ai-sandbox/`, else the nearest holding `.git`, else the working directory itself.
//! Pure over an `exists` predicate so the walk is tested without a filesystem.

use crate::error::{Hinted, hinted};
use std::path::{Path, PathBuf};

pub(crate) const CONFIG_DIR: &str = ".ai-sandbox";
pub(crate) const CONFIG_FILE: &str = "config";

/// The project's config file.
pub(crate) fn config_path(project: &Path) -> PathBuf {
    project.join(CONFIG_DIR).join(CONFIG_FILE)
}

pub fn find(cwd: &Path, exists: impl Fn(&Path) -> bool) -> PathBuf {
    for marker in [CONFIG_DIR, ".git"] {
        if let Some(dir) = cwd.ancestors().find(|d| exists(&d.join(marker))) {
            return dir.to_path_buf();
        }
    }
    cwd.to_path_buf()
}

/// A directory no project may hold or lie in: ai-sandbox's own files, or files the host runs
/// or trusts without asking (see `reserved` in `cli::facts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reserved {
    pub(crate) path: PathBuf,
    /// What it holds, in words ("ai-sandbox's runtime directory (the gate's control socket)").
    pub(crate) what: &'static str,
}

/// Refuses a project that equals, contains or lies inside a reserved directory: mounted
/// read-write, it would hand the agent the tool's own state (the gate's control socket, the
/// approvals, other projects' HOMEs) or files the host runs (podman's runtime setting, a user
/// unit). Both sides are compared as given and as the host resolves them (`reserved` lists both).
pub(crate) fn check_reserved(project: &Path, reserved: &[Reserved]) -> Result<(), Hinted> {
    let Some(r) = reserved.iter().find(|r| r.path.starts_with(project) || project.starts_with(&r.path))
    else {
        return Ok(());
    };
    let how = if r.path == project {
        "is"
    } else if r.path.starts_with(project) {
        "contains"
    } else {
        "lies inside"
    };
    Err(hinted(
        format!(
            "the project directory {} {how} {} ({}): the sandbox would mount it read-write, and an agent could change what ai-sandbox or the host later trusts",
            project.display(),
            r.what,
            r.path.display()
        ),
        "use a directory that holds only the project (a repository in ~/.config works from its own subfolder, e.g. ~/.config/nvim); ai-sandbox's own directories are never a project",
    ))
}

/// Refuses project directories whose read-write mount would expose far more than a project.
pub(crate) fn check(project: &Path, home: &Path) -> Result<(), Hinted> {
    let hint = "cd into a project, or pass --project DIR";
    if project == Path::new("/") {
        return Err(hinted(
            "the project directory is `/`: the whole filesystem would be mounted read-write",
            hint,
        ));
    }
    // The sandbox's own directories: its /tmp is a fresh tmpfs, the others are the host's
    // read-only or the skeleton's; a project there would be mounted twice at one place.
    const OWN: &[&str] =
        &["/tmp", "/usr", "/etc", "/opt", "/home", "/proc", "/dev", "/sys", "/run", "/var", "/root", "/mnt"];
    if OWN.iter().any(|d| project == Path::new(d)) {
        return Err(hinted(
            format!("the project directory is {}, which the sandbox has as its own", project.display()),
            format!(
                "make a project directory inside it: mkdir {0}/myproject && cd {0}/myproject",
                project.display()
            ),
        ));
    }
    if project == home {
        return Err(hinted(
            format!(
                "the project directory is your home directory ({}): your keys and dotfiles would be mounted read-write",
                home.display()
            ),
            hint,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_lives_in_the_projects_own_directory() {
        assert_eq!(config_path(Path::new("/w/repo")), Path::new("/w/repo/.ai-sandbox/config"));
    }

    #[test]
    fn prefers_config_dir_then_git_then_cwd() {
        let cwd = Path::new("/w/repo/sub/deep");
        let both = |p: &Path| p == Path::new("/w/repo/.git") || p == Path::new("/w/repo/sub/.ai-sandbox");
        assert_eq!(find(cwd, both), PathBuf::from("/w/repo/sub"));
        let git = |p: &Path| p == Path::new("/w/repo/.git");
        assert_eq!(find(cwd, git), PathBuf::from("/w/repo"));
        assert_eq!(find(cwd, |_| false), PathBuf::from("/w/repo/sub/deep"));
    }

    #[test]
    fn a_project_that_is_holds_or_lies_in_a_reserved_directory_is_refused() {
        let reserved = [
            Reserved {
                path: PathBuf::from("/run/user/7/ai-sandbox"),
                what: "ai-sandbox's runtime directory",
            },
            Reserved { path: PathBuf::from("/h/.config/containers"), what: "podman's configuration" },
        ];
        for (project, how) in [
            ("/run/user/7/ai-sandbox", "is"),
            ("/run/user/7", "contains"),
            ("/run", "contains"),
            ("/run/user/7/ai-sandbox/sessions/ab", "lies inside"),
            ("/h/.config", "contains"),
            ("/h", "contains"),
        ] {
            let e = check_reserved(Path::new(project), &reserved).unwrap_err();
            assert!(e.message.contains(&format!("{project} {how} ")), "{project}: {}", e.message);
        }
        for fine in ["/h/.config/nvim", "/h/.config/containers-notes", "/run/user/77", "/h/src/app"] {
            assert!(check_reserved(Path::new(fine), &reserved).is_ok(), "{fine}");
        }
    }

    #[test]
    fn refuses_root_and_home() {
        assert!(check(Path::new("/"), Path::new("/home/u")).is_err());
        assert!(check(Path::new("/home/u"), Path::new("/home/u")).is_err());
        assert!(check(Path::new("/home/u/p"), Path::new("/home/u")).is_ok());
        let e = check(Path::new("/tmp"), Path::new("/home/u")).unwrap_err();
        assert!(
            e.message.contains("/tmp, which the sandbox has as its own")
                && e.hint.contains("mkdir /tmp/myproject")
        );
        assert!(check(Path::new("/tmp/proj"), Path::new("/home/u")).is_ok());
    }
}
