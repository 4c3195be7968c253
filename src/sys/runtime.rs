//! The per-user runtime directory of ai-sandbox (the gate's socket and log, the sessions): where it
//! is, and the check that it is private before anything is put in it. Here, at the bottom, because
//! the launcher, the gate, its clients and the commands all need the one answer.

use anyhow::Context;
use std::path::{Path, PathBuf};

/// ai-sandbox's per-user runtime directory (pure: the launcher's plan and the gate both use
/// this): `$AISB_RUNTIME_DIR` if set (an isolated gate and its sessions, e.g. for tests), else
/// `/run/user/UID/ai-sandbox` when the login manager made `/run/user/UID` for this user, else
/// `/tmp/ai-sandbox-UID`. One place per user whatever the environment says: `XDG_RUNTIME_DIR`
/// is not read, because a shell reached through `su` lacks it, and a launch there would start a
/// second gate that `ps` and `allow` from the user's other shells never see (ADR 0055).
///
/// `login_run` is the login manager's directory when it is this user's (`owned_dir`), else None.
pub fn runtime_dir_for(aisb_runtime_dir: Option<&str>, login_run: Option<&Path>, uid: u32) -> PathBuf {
    match (aisb_runtime_dir, login_run) {
        (Some(v), _) if Path::new(v).is_absolute() => PathBuf::from(v),
        (_, Some(run)) => run.join("ai-sandbox"),
        (_, None) => PathBuf::from(format!("/tmp/ai-sandbox-{uid}")),
    }
}

/// The login manager's per-user runtime directory (systemd-logind, elogind).
pub fn login_run(uid: u32) -> PathBuf {
    PathBuf::from(format!("/run/user/{uid}"))
}

/// Whether `dir` is a directory (not a link) owned by `uid`: the login runtime dir is used only
/// then (another user's, or a planted link, is not a place for our socket).
pub fn owned_dir(dir: &Path, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == uid)
}

pub fn runtime_dir() -> PathBuf {
    let uid = nix::unistd::getuid().as_raw();
    let run = login_run(uid);
    runtime_dir_for(
        std::env::var("AISB_RUNTIME_DIR").ok().as_deref(),
        owned_dir(&run, uid).then_some(&*run),
        uid,
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
            "remove it (another user may have made it first), or set AISB_RUNTIME_DIR to a private directory",
        )
        .into());
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn runtime_dir_is_one_place_per_user_whatever_the_environment() {
        let run = login_run(7);
        assert_eq!(runtime_dir_for(None, Some(&run), 7), PathBuf::from("/run/user/7/ai-sandbox"));
        assert_eq!(runtime_dir_for(None, None, 7), PathBuf::from("/tmp/ai-sandbox-7"));
        assert_eq!(runtime_dir_for(Some("/x/rt"), Some(&run), 7), PathBuf::from("/x/rt"));
        assert_eq!(runtime_dir_for(Some("rel"), Some(&run), 7), PathBuf::from("/run/user/7/ai-sandbox"));
        assert_eq!(runtime_dir_for(Some("rel"), None, 7), PathBuf::from("/tmp/ai-sandbox-7"));
    }

    #[test]
    fn the_login_run_dir_counts_only_when_it_is_a_directory_of_this_user() {
        let tmp = tempfile::tempdir().unwrap();
        let me = nix::unistd::getuid().as_raw();
        assert!(owned_dir(tmp.path(), me));
        assert!(!owned_dir(tmp.path(), me + 1), "another user's");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
        assert!(!owned_dir(&link, me), "a link");
        assert!(!owned_dir(&tmp.path().join("none"), me), "missing");
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
