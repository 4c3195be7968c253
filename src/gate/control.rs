//! The gate's control socket (`$XDG_RUNTIME_DIR/ai-sandbox/gate.sock`, mode 0600 in a 0700
//! directory: only this user can register sessions). Newline-delimited JSON.
//!
//! A session is registered over a connection the launcher keeps open for the sandbox's whole
//! life; when it closes (the launcher exits or is killed) the gate forgets the session and its
//! token. If the gate dies, the launcher sees EOF and says the sandbox has lost egress.

use super::decide::SessionPolicy;
use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    Register { session: String, project: String, token: String, policy: SessionPolicy },
    Status,
    Stop,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionStatus {
    pub session: String,
    pub project: String,
    pub started: String,
    pub allowed: u64,
    pub denied: u64,
    pub active: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub pid: u32,
    #[serde(default)]
    pub sessions: Vec<SessionStatus>,
}

/// ai-sandbox's per-user runtime directory: `$XDG_RUNTIME_DIR/ai-sandbox`, else
/// `/tmp/ai-sandbox-UID` (pure: the launcher's plan and the gate both use this).
pub fn runtime_dir_for(xdg_runtime_dir: Option<&str>, uid: u32) -> PathBuf {
    match xdg_runtime_dir {
        Some(v) if Path::new(v).is_absolute() => PathBuf::from(v).join("ai-sandbox"),
        _ => PathBuf::from(format!("/tmp/ai-sandbox-{uid}")),
    }
}

pub fn runtime_dir() -> PathBuf {
    runtime_dir_for(std::env::var("XDG_RUNTIME_DIR").ok().as_deref(), nix::unistd::getuid().as_raw())
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
        bail!(
            "{} is not a directory owned by you (uid {me}); refusing to use it\n  hint: remove it, or set XDG_RUNTIME_DIR to a private directory",
            dir.display()
        );
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

fn send(stream: &mut UnixStream, req: &Request) -> anyhow::Result<Reply> {
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(stream.try_clone()?).read_line(&mut reply)?;
    let r: Reply = serde_json::from_str(&reply).context("bad reply from the gate")?;
    if !r.ok {
        bail!("the gate refused: {}", r.error.unwrap_or_default());
    }
    Ok(r)
}

/// One request to a running gate (`None` when no gate runs).
pub fn ask(dir: &Path, req: &Request) -> anyhow::Result<Option<Reply>> {
    match UnixStream::connect(socket_path(dir)) {
        Ok(mut s) => Ok(Some(send(&mut s, req)?)),
        Err(_) => Ok(None),
    }
}

/// A registered session; dropping it (or the process dying) unregisters it.
pub struct Lease {
    pub port: u16,
    stream: UnixStream,
}

impl Lease {
    /// Calls `on_lost` (once, from a thread) if the gate goes away while the lease is held.
    pub fn watch(&self, on_lost: impl FnOnce() + Send + 'static) -> anyhow::Result<()> {
        let mut s = self.stream.try_clone()?;
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            use std::io::Read;
            if matches!(s.read(&mut buf), Ok(0) | Err(_)) {
                on_lost();
            }
        });
        Ok(())
    }
}

/// Connects to the user's gate, starting one (detached, `self_exe gate serve`) if none runs,
/// and registers the session.
pub fn register(dir: &Path, self_exe: &Path, port_from: u16, req: &Request) -> anyhow::Result<Lease> {
    private_dir(dir)?;
    let mut stream = match UnixStream::connect(socket_path(dir)) {
        Ok(s) => s,
        Err(_) => {
            start(dir, self_exe, port_from)?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match UnixStream::connect(socket_path(dir)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => {
                        let err = std::fs::read_to_string(dir.join("gate.err")).unwrap_or_default();
                        bail!("the egress gate did not start ({e}); nothing was started\n{}", err.trim());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    };
    let reply = send(&mut stream, req).context("registering the session with the egress gate")?;
    Ok(Lease { port: reply.port, stream })
}

fn start(dir: &Path, self_exe: &Path, port_from: u16) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let err = std::fs::File::create(dir.join("gate.err"))
        .with_context(|| format!("creating {}/gate.err", dir.display()))?;
    let mut cmd = std::process::Command::new(self_exe);
    cmd.args(["gate", "serve", "--port-from", &port_from.to_string()])
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err);
    // SAFETY: setsid is async-signal-safe; the gate must not die with the launcher's session.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    cmd.spawn().with_context(|| format!("starting the gate ({})", self_exe.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn runtime_dir_prefers_xdg() {
        assert_eq!(runtime_dir_for(Some("/run/user/7"), 7), PathBuf::from("/run/user/7/ai-sandbox"));
        assert_eq!(runtime_dir_for(Some("relative"), 7), PathBuf::from("/tmp/ai-sandbox-7"));
        assert_eq!(runtime_dir_for(None, 7), PathBuf::from("/tmp/ai-sandbox-7"));
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
