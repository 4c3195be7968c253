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
    fn prefers_config_dir_then_git_then_cwd() {
        let cwd = Path::new("/w/repo/sub/deep");
        let both = |p: &Path| p == Path::new("/w/repo/.git") || p == Path::new("/w/repo/sub/.ai-sandbox");
        assert_eq!(find(cwd, both), PathBuf::from("/w/repo/sub"));
        let git = |p: &Path| p == Path::new("/w/repo/.git");
        assert_eq!(find(cwd, git), PathBuf::from("/w/repo"));
        assert_eq!(find(cwd, |_| false), PathBuf::from("/w/repo/sub/deep"));
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
