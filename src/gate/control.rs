//! The gate's control socket (`$XDG_RUNTIME_DIR/ai-sandbox/gate.sock`, mode 0600 in a 0700
//! directory: only this user can register sessions). Newline-delimited JSON. The client
//! (launcher, `gate` commands) and the server (inside the gate) are both here, so the protocol
//! is read in one place.
//!
//! A session is registered over a connection the launcher keeps open for the sandbox's whole
//! life; when it closes (the launcher exits or is killed) the gate forgets the session and its
//! token. The registration reply carries, as SCM_RIGHTS, a duplicate of the gate's listening
//! socket: the launcher holds it, so if the gate dies the port stays bound to *that* socket
//! (no other local user can take it) and the launcher answers every request on it with a
//! refusal. Fail closed, with no window.

use super::decide::SessionPolicy;
pub use super::state::SessionStatus;
use super::state::{Session, State};
use anyhow::{Context, bail};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};
use std::io::{IoSlice, IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a launcher waits for a gate to start (or for an exiting one to hand over).
const START_DEADLINE: Duration = Duration::from_secs(10);
/// A launcher starts another gate if the one it started has not answered after this long.
const RESTART_AFTER: Duration = Duration::from_millis(750);
/// The error a closing gate answers a registration with: start the next gate and retry.
const CLOSING: &str = "the gate is closing";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    Register {
        session: String,
        project: String,
        token: String,
        policy: SessionPolicy,
    },
    /// A live change (`ai-sandbox allow`): the session's whole new policy.
    Update {
        session: String,
        policy: SessionPolicy,
    },
    /// `ai-sandbox watch`: after the reply, the gate sends refusals and questions (JSON lines)
    /// and reads answers (`ask::Answer` lines) until the watcher hangs up.
    Watch,
    Status,
    Stop,
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

/// Reads one reply line, collecting any file descriptor passed with it (SCM_RIGHTS,
/// received close-on-exec so podman never inherits it).
fn read_reply(stream: &UnixStream) -> anyhow::Result<(Reply, Option<OwnedFd>)> {
    let mut line = Vec::new();
    let mut fd = None;
    let mut buf = [0u8; 4096];
    while !line.ends_with(b"\n") {
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg =
            match recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
                Ok(m) => m,
                Err(nix::errno::Errno::ECONNRESET) => return Err(HungUp.into()),
                Err(e) => return Err(anyhow::Error::from(e).context("reading the gate's reply")),
            };
        for c in msg.cmsgs().context("reading the gate's reply")? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just installed this descriptor in our table for us.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    fd.get_or_insert(owned);
                }
            }
        }
        let n = msg.bytes;
        if n == 0 {
            return Err(HungUp.into());
        }
        line.extend_from_slice(&buf[..n]);
    }
    let r: Reply = serde_json::from_slice(&line).context("bad reply from the gate")?;
    Ok((r, fd))
}

/// Why a request got no usable answer.
enum Failed {
    /// The gate is going away: it said it is closing, or hung up without answering (its
    /// runtime shut down with the connection accepted). Start the next gate and retry.
    Going(String),
    /// A real refusal or a broken reply: retrying would not help.
    Refused(anyhow::Error),
}

fn send(stream: &mut UnixStream, req: &Request) -> Result<(Reply, Option<OwnedFd>), Failed> {
    let mut line = serde_json::to_string(req).map_err(|e| Failed::Refused(e.into()))?;
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(|e| Failed::Going(format!("the gate hung up ({e})")))?;
    let (r, fd) = read_reply(stream).map_err(|e| match e.downcast_ref::<HungUp>() {
        Some(_) => Failed::Going("the gate hung up without answering".into()),
        None => Failed::Refused(e),
    })?;
    match (r.ok, r.error.as_deref()) {
        (true, _) => Ok((r, fd)),
        (false, Some(CLOSING)) => Err(Failed::Going(CLOSING.into())),
        (false, why) => {
            Err(Failed::Refused(anyhow::anyhow!("the gate refused: {}", why.unwrap_or_default())))
        }
    }
}

/// The gate closed the connection (or reset it) before a whole reply.
#[derive(Debug, thiserror::Error)]
#[error("the gate closed the connection before replying")]
struct HungUp;

/// One request to a running gate (`None` when no gate runs).
pub fn ask(dir: &Path, req: &Request) -> anyhow::Result<Option<Reply>> {
    match UnixStream::connect(socket_path(dir)) {
        Ok(mut s) => match send(&mut s, req) {
            Ok((r, _)) => Ok(Some(r)),
            Err(Failed::Going(_)) => Ok(None),
            Err(Failed::Refused(e)) => Err(e),
        },
        Err(_) => Ok(None),
    }
}

/// A registered session; dropping it (or the process dying) unregisters it.
pub struct Lease {
    pub port: u16,
    stream: UnixStream,
    /// The gate's listening socket (see the module doc).
    listener: Option<OwnedFd>,
}

impl Lease {
    /// If the gate goes away while the lease is held: calls `on_lost` once, then answers every
    /// connection to the gate's port with a refusal for as long as this process lives.
    pub fn watch(&mut self, on_lost: impl FnOnce() + Send + 'static) -> anyhow::Result<()> {
        let mut s = self.stream.try_clone()?;
        let listener = self.listener.take();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            use std::io::Read;
            if matches!(s.read(&mut buf), Ok(0) | Err(_)) {
                on_lost();
                if let Some(l) = listener {
                    stand_in(l);
                }
            }
        });
        Ok(())
    }
}

/// Answers on the dead gate's listening socket: every request is refused at once (fail closed,
/// and fast, rather than a hang or someone else's answer).
fn stand_in(listener: OwnedFd) {
    let l = std::net::TcpListener::from(listener);
    // The O_NONBLOCK flag belongs to the gate's (shared) open file; the gate is gone.
    let _ = l.set_nonblocking(false);
    for c in l.incoming().flatten() {
        std::thread::spawn(move || refuse_one(c));
    }
}

/// Reads the request head (so closing does not reset the connection before the client reads
/// the answer), answers 503, half-closes, and drains briefly.
fn refuse_one(mut c: std::net::TcpStream) {
    use std::io::Read;
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        match c.read(&mut buf) {
            Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let body =
        "blocked by ai-sandbox: the egress gate stopped; this sandbox has no egress until it is restarted\n";
    let _ = write!(
        c,
        "HTTP/1.1 503 ai-sandbox gate stopped\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = c.shutdown(std::net::Shutdown::Write);
    let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
    while matches!(c.read(&mut buf), Ok(n) if n > 0) {}
}

/// Connects to the user's gate, starting one (detached, `self_exe gate serve`) if none runs or
/// the running one is closing, and registers the session.
pub fn register(dir: &Path, self_exe: &Path, port_from: u16, req: &Request) -> anyhow::Result<Lease> {
    private_dir(dir)?;
    let deadline = Instant::now() + START_DEADLINE;
    let mut last_start: Option<Instant> = None;
    let mut last_err = String::new();
    while Instant::now() < deadline {
        match UnixStream::connect(socket_path(dir)) {
            Ok(mut stream) => match send(&mut stream, req) {
                Ok((reply, listener)) => return Ok(Lease { port: reply.port, stream, listener }),
                Err(Failed::Going(why)) => last_err = why,
                Err(Failed::Refused(e)) => {
                    return Err(e.context("registering the session with the egress gate"));
                }
            },
            Err(e) => {
                last_err = e.to_string();
                // None runs (or it is exiting): start one. Gates are one per user (a lock), so
                // a second start while the first is coming up is harmless.
                if last_start.is_none_or(|t| t.elapsed() >= RESTART_AFTER) {
                    start(dir, self_exe, port_from)?;
                    last_start = Some(Instant::now());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = std::fs::read_to_string(dir.join("gate.err")).unwrap_or_default();
    bail!("the egress gate did not start ({last_err}); nothing was started\n{}", err.trim())
}

fn start(dir: &Path, self_exe: &Path, port_from: u16) -> anyhow::Result<()> {
    let err = std::fs::File::create(dir.join("gate.err"))
        .with_context(|| format!("creating {}/gate.err", dir.display()))?;
    let mut cmd = std::process::Command::new(self_exe);
    cmd.args(["gate", "serve", "--port-from", &port_from.to_string()])
        .arg("--runtime-dir")
        .arg(dir)
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err);
    // The gate must not die with the launcher's session (one gate serves every sandbox).
    let child = crate::host::process::spawn(&mut cmd, crate::host::process::Tie::Detached)
        .with_context(|| format!("starting the gate ({})", self_exe.display()))?;
    crate::host::process::reap_later(child);
    Ok(())
}

// ---- server side (inside the gate) ----------------------------------------------------------

async fn reply(wr: &tokio::net::UnixStream, r: &Reply, pass: Option<&OwnedFd>) {
    let line = serde_json::to_string(r).unwrap_or_default() + "\n";
    let fds: Vec<std::os::fd::RawFd> = pass.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = 0;
    while sent < line.len() {
        if wr.writable().await.is_err() {
            return;
        }
        let cmsgs: Vec<ControlMessage> =
            if sent == 0 && !fds.is_empty() { vec![ControlMessage::ScmRights(&fds)] } else { vec![] };
        let res = wr.try_io(tokio::io::Interest::WRITABLE, || {
            sendmsg::<()>(
                wr.as_raw_fd(),
                &[IoSlice::new(&line.as_bytes()[sent..])],
                &cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(std::io::Error::from)
        });
        match res {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// Serves one control connection.
pub async fn serve_conn(state: Arc<State>, s: tokio::net::UnixStream) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let (rd, wr) = s.into_split();
    let s: &tokio::net::UnixStream = wr.as_ref();
    let mut rd = tokio::io::BufReader::new(rd);
    let mut line = String::new();
    if rd.read_line(&mut line).await.unwrap_or(0) == 0 {
        return;
    }
    let ok = Reply { ok: true, port: state.port, pid: std::process::id(), ..Reply::default() };
    let refuse = |why: String| Reply { error: Some(why), ..Reply::default() };
    match serde_json::from_str::<Request>(&line) {
        Ok(Request::Register { session, project, token, policy }) => {
            let sess = Arc::new(Session::new(session, project, token, policy));
            if !state.register(sess.clone()) {
                return reply(s, &refuse(CLOSING.into()), None).await;
            }
            reply(s, &ok, Some(&state.listener)).await;
            // The session lives as long as this connection.
            let mut sink = [0u8; 64];
            while rd.read(&mut sink).await.unwrap_or(0) > 0 {}
            state.unregister(&sess);
        }
        Ok(Request::Update { session, policy }) => match state.session(&session) {
            Some(sess) => {
                sess.set_policy(policy);
                reply(s, &ok, None).await
            }
            None => reply(s, &refuse(format!("no session {session} in this gate")), None).await,
        },
        Ok(Request::Watch) => {
            use tokio::io::AsyncWriteExt;
            let (id, mut rx) = state.asks.add_watcher();
            reply(s, &ok, None).await;
            let mut wr = wr;
            // `next_line` is cancel-safe (a line half read when a message goes out is kept).
            let mut answers = rd.lines();
            loop {
                tokio::select! {
                    msg = rx.recv() => match msg {
                        Some(m) if wr.write_all(format!("{m}\n").as_bytes()).await.is_ok() => {}
                        _ => break,
                    },
                    l = answers.next_line() => match l {
                        Ok(Some(l)) => {
                            if let Ok(a) = serde_json::from_str::<super::ask::Answer>(&l) {
                                state.asks.answer(&a);
                            }
                        }
                        _ => break,
                    },
                }
            }
            state.asks.remove_watcher(id);
        }
        Ok(Request::Status) => reply(s, &Reply { sessions: state.status(), ..ok }, None).await,
        Ok(Request::Stop) => {
            reply(s, &ok, None).await;
            state.close();
        }
        Err(e) => reply(s, &refuse(format!("bad request: {e}")), None).await,
    }
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
