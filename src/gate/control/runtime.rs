//! Where the gate and its sessions live: the per-user runtime directory (its location, and the
//! check that it is private before anything is put in it), the control socket and the log.

use anyhow::Context;
use std::path::{Path, PathBuf};

/// ai-sandbox's per-user runtime directory (pure: the launcher's plan and the gate both use
/// this): `$AISB_RUNTIME_DIR` if set (an isolated gate and its sessions, e.g. for tests), else
/// `$XDG_RUNTIME_DIR/ai-sandbox`, else `/tmp/ai-sandbox-UID`. Relative values are ignored.
pub fn runtime_dir_for(aisb_runtime_dir: Option<&str>, xdg_runtime_dir: Option<&str>, uid: u32) -> PathBuf {
    match (aisb_runtime_dir, xdg_runtime_dir) {
        (Some(v), _) if Path::new(v).is_absolute() => PathBuf::from(v),
        (_, Some(v)) if Path::new(v).is_absolute() => PathBuf::from(v).join("ai-sandbox"),
        _ => PathBuf::from(format!("/tmp/ai-sandbox-{uid}")),
    }
}

pub fn runtime_dir() -> PathBuf {
    let var = |k| std::env::var(k).ok();
    runtime_dir_for(
        var("AISB_RUNTIME_DIR").as_deref(),
        var("XDG_RUNTIME_DIR").as_deref(),
        nix::unistd::getuid().as_raw(),
    )
}

/// Creates `dir` (mode 0700) or checks an existing one: a real directory, owned by this user,
/// closed to others. In /tmp another user could have made it first; then nothing starts.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir).with_context(|| format!("checking {}", dir.display()))?;
    let me = nix::unistd::getuid().as_raw();
    if !meta.is_dir() || meta.uid() != me {
        return Err(crate::error::hinted(
            format!("{} is not a directory owned by you (uid {me}); refusing to use it", dir.display()),
            "remove it, or set XDG_RUNTIME_DIR to a private directory",
        )
        .into());
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private", dir.display()))?;
    }
    Ok(())
}

pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("gate.sock")
}

pub fn log_path(dir: &Path) -> PathBuf {
    dir.join("gate.log")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn runtime_dir_prefers_xdg() {
        assert_eq!(runtime_dir_for(None, Some("/run/user/7"), 7), PathBuf::from("/run/user/7/ai-sandbox"));
        assert_eq!(runtime_dir_for(None, Some("relative"), 7), PathBuf::from("/tmp/ai-sandbox-7"));
        assert_eq!(runtime_dir_for(None, None, 7), PathBuf::from("/tmp/ai-sandbox-7"));
        assert_eq!(runtime_dir_for(Some("/x/rt"), Some("/run/user/7"), 7), PathBuf::from("/x/rt"));
        assert_eq!(
            runtime_dir_for(Some("rel"), Some("/run/user/7"), 7),
            PathBuf::from("/run/user/7/ai-sandbox")
        );
    }

    #[test]
    fn private_dir_creates_tightens_and_refuses_what_is_not_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let fresh = tmp.path().join("a/b");
        private_dir(&fresh).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o700);

        let loose = tmp.path().join("loose");
        std::fs::create_dir(&loose).unwrap();
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o777)).unwrap();
        private_dir(&loose).unwrap();
        assert_eq!(std::fs::metadata(&loose).unwrap().permissions().mode() & 0o777, 0o700);

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&loose, &link).unwrap();
        assert!(private_dir(&link).unwrap_err().to_string().contains("not a directory owned by you"));

        // Someone else's directory (constructible only as root, which CI is).
        if nix::unistd::getuid().is_root() {
            let theirs = tmp.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            assert!(private_dir(&theirs).is_err());
        }
    }
}
