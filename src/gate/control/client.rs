//! The control socket's client side: the launcher registers a session (starting the gate when
//! none runs) and holds the lease for the sandbox's life; `gate` commands, `live` and `watch`
//! ask one question each.

use super::{Refusal, Registered, Reply, Request, socket_path};
use crate::contract::SessionPolicy;
use crate::contract::capability::{Capabilities, Capability, missing, required};
use crate::contract::control::REQUEST_MAX;
use crate::sys::runtime::private_dir;
use anyhow::{Context, bail};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a launcher waits for a gate to start (or for an exiting one to hand over).
const START_DEADLINE: Duration = Duration::from_secs(10);
/// A launcher starts another gate if the one it started has not answered after this long.
const RESTART_AFTER: Duration = Duration::from_millis(750);

/// Reads one reply line, collecting any file descriptor passed with it (SCM_RIGHTS,
/// received close-on-exec so podman never inherits it).
fn read_reply(stream: &UnixStream) -> anyhow::Result<(Reply, Option<OwnedFd>)> {
    let mut line = Vec::new();
    let mut fd = None;
    let mut buf = [0u8; 4096];
    while !line.ends_with(b"\n") {
        let (n, fds) = match crate::sys::fdpass::recv_with_fds(stream, &mut buf) {
            Ok(got) => got,
            Err(nix::errno::Errno::ECONNRESET) => return Err(HungUp.into()),
            Err(e) => return Err(anyhow::Error::from(e).context("reading the gate's reply")),
        };
        // The first descriptor passed is the one; any other is closed as it is dropped.
        if fd.is_none() {
            fd = fds.into_iter().next();
        }
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

/// `req` as the line that goes to the gate; one longer than the gate reads is refused here, not
/// sent (the gate would refuse it without reading it all).
fn request_line(req: &Request) -> Result<String, Failed> {
    let mut line = serde_json::to_string(req).map_err(|e| Failed::Refused(e.into()))?;
    if line.len() > REQUEST_MAX {
        return Err(Failed::Refused(anyhow::anyhow!(
            "the request is {} bytes, more than the gate's control socket reads in one ({REQUEST_MAX}); not sent",
            line.len()
        )));
    }
    line.push('\n');
    Ok(line)
}

fn send(stream: &mut UnixStream, req: &Request) -> Result<(Reply, Option<OwnedFd>), Failed> {
    let line = request_line(req)?;
    stream.write_all(line.as_bytes()).map_err(|e| Failed::Going(format!("the gate hung up ({e})")))?;
    let (r, fd) = read_reply(stream).map_err(|e| match e.downcast_ref::<HungUp>() {
        Some(_) => Failed::Going("the gate hung up without answering".into()),
        None => Failed::Refused(e),
    })?;
    match r.refusal() {
        None => Ok((r, fd)),
        Some(Refusal::Closing) => Err(Failed::Going(Refusal::Closing.to_string())),
        Some(why) => Err(Failed::Refused(anyhow::anyhow!("the gate refused: {why}"))),
    }
}

/// The gate closed the connection (or reset it) before a whole reply.
#[derive(Debug, thiserror::Error)]
#[error("the gate closed the connection before replying")]
struct HungUp;

/// How long a one-shot request waits for the gate: a gate that is stopped or stuck must not
/// hold up what asked (the launcher's exit among them), which then goes on without the answer.
const CALL_WAIT: Duration = Duration::from_secs(5);

/// One request to a running gate (`None` when no gate runs; an error when it does not answer
/// within `CALL_WAIT`).
pub fn call(dir: &Path, req: &Request) -> anyhow::Result<Option<Reply>> {
    match UnixStream::connect(socket_path(dir)) {
        Ok(mut s) => match s
            .set_read_timeout(Some(CALL_WAIT))
            .and_then(|()| s.set_write_timeout(Some(CALL_WAIT)))
            .map_err(|e| Failed::Refused(e.into()))
            .and_then(|()| send(&mut s, req))
        {
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
    /// The gate's CA certificate, when the session has bound secrets.
    pub ca: Option<String>,
    stream: UnixStream,
    /// The gate's listening socket (see the module doc).
    listener: Option<OwnedFd>,
}

impl Lease {
    /// If the gate goes away while the lease is held: calls `on_lost` once, then answers every
    /// connection to the gate's port with a refusal for as long as this process lives.
    pub(crate) fn watch(&mut self, on_lost: impl FnOnce() + Send + 'static) -> anyhow::Result<()> {
        let mut s = self.stream.try_clone()?;
        let listener = self.listener.take();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            use std::io::Read;
            if matches!(s.read(&mut buf), Ok(0) | Err(_)) {
                on_lost();
                if let Some(l) = listener {
                    super::stand_in::stand_in(l);
                }
            }
        });
        Ok(())
    }
}

/// Refuses a registration the running gate said it would not honour in full: a gate of an
/// older version ignores what it does not know, and would let through what the policy limits.
fn older_gate(policy: &SessionPolicy, said: &Registered) -> anyhow::Result<()> {
    let Some(what) = missing(policy, &said.enforces, &Capabilities::new()).map(Capability::without) else {
        return Ok(());
    };
    let again = if policy.learn { "run `ai-sandbox learn` again" } else { "start again" };
    Err(crate::error::hinted(
        format!("the running egress gate is of an older version of ai-sandbox and {what}; nothing was started"),
        format!(
            "{again} once your other sandboxes have ended (the old gate exits when idle), or stop it now with `ai-sandbox gate stop` (their hostnames are then refused until they restart)"
        ),
    )
    .into())
}

/// What a live change from `old` to `new` adds that the gate did not say it holds (`said`,
/// its reply to the change): a limit the session had before was said at its registration; a
/// new one must be said now, or a gate of an older version would hold the change without it.
pub(crate) fn unheld_change(
    old: &SessionPolicy,
    new: &SessionPolicy,
    said: &Registered,
) -> Option<&'static str> {
    missing(new, &said.enforces, &required(old)).map(Capability::without)
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
                Ok((reply, listener)) => {
                    let said = reply.as_registered();
                    if let Request::Register { policy, .. } = req {
                        older_gate(policy, &said)?;
                    }
                    let Registered { port, ca, .. } = said;
                    return Ok(Lease { port, ca, stream, listener });
                }
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
    let child = crate::sys::process::spawn(&mut cmd, crate::sys::process::Tie::Detached)
        .with_context(|| format!("starting the gate ({})", self_exe.display()))?;
    crate::sys::process::reap_later(child);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::budget::host_line;

    /// A request the gate would not read whole is not sent; one at the bound is (the control).
    #[test]
    fn a_request_over_the_bound_is_not_sent() {
        let review = |n: usize| Request::Review { session: "s".repeat(n) };
        let base = serde_json::to_string(&review(0)).unwrap().len();
        let at = request_line(&review(REQUEST_MAX - base)).ok().unwrap();
        assert_eq!(at.len(), REQUEST_MAX + 1, "the bound, and its newline");
        let Err(Failed::Refused(e)) = request_line(&review(REQUEST_MAX - base + 1)) else {
            panic!("a request one byte over the bound was not refused")
        };
        assert!(e.to_string().contains(&format!("{} bytes", REQUEST_MAX + 1)), "{e}");
    }

    /// A live change must hear back each limit it adds; one the session had is not asked again
    /// (its gate said it at registration). A gate of an older version says none.
    #[test]
    fn a_live_change_needs_the_gate_to_say_each_limit_it_adds() {
        let older = Registered { port: 0, ca: None, enforces: Capabilities::new() };
        let plain = SessionPolicy { budgets: vec![host_line("a.test 1k")], ..SessionPolicy::default() };
        let daily = SessionPolicy { budgets: vec![host_line("a.test 1k/day")], ..SessionPolicy::default() };
        let pushes = {
            let rules = crate::policy::rule::parse("git.test git-push /r.git refs/heads/agent/*").unwrap();
            SessionPolicy { rules, ..plain.clone() }
        };
        // Added and not said: refused, with what the gate would do.
        let what = unheld_change(&plain, &daily, &older).unwrap();
        assert!(what.contains("over a period"), "{what}");
        let what = unheld_change(&SessionPolicy::default(), &plain, &older).unwrap();
        assert!(what.contains("does not count budgets"), "{what}");
        let what = unheld_change(&plain, &pushes, &older).unwrap();
        assert!(what.contains("does not read rules"), "{what}");
        // Rules the session had (said at registration), a limit by ref added: that one is asked.
        let ruled = SessionPolicy {
            rules: crate::policy::rule::parse("git.test git-push /r.git").unwrap(),
            ..plain.clone()
        };
        let what = unheld_change(&ruled, &pushes, &older).unwrap();
        assert!(what.contains("limit a push by ref"), "{what}");
        // Said by this version's gate: the change holds.
        for (old, new) in [(&plain, &daily), (&SessionPolicy::default(), &plain), (&plain, &pushes)] {
            assert_eq!(unheld_change(old, new, &Registered::by_this_gate(0, None)), None);
        }
        // Had before (said at registration): another change to the same session holds.
        assert_eq!(unheld_change(&daily, &daily, &older), None);
        assert_eq!(unheld_change(&pushes, &pushes, &older), None);
        // Nothing added that a gate must hold: no flag needed.
        assert_eq!(unheld_change(&SessionPolicy::default(), &SessionPolicy::default(), &older), None);
    }

    /// A registration the gate does not say it holds in full starts nothing; one it does, or
    /// one with nothing to hold, goes ahead.
    #[test]
    fn a_registration_an_older_gate_would_hold_without_its_limits_starts_nothing() {
        let older = Registered { port: 0, ca: None, enforces: Capabilities::new() };
        let budgets = SessionPolicy { budgets: vec![host_line("a.test 1k")], ..SessionPolicy::default() };
        let e = format!("{:#}", older_gate(&budgets, &older).unwrap_err());
        assert!(e.contains("older version") && e.contains("does not count budgets"), "{e}");
        assert!(e.contains("nothing was started") && e.contains("start again"), "{e}");
        older_gate(&budgets, &Registered::by_this_gate(0, None)).unwrap();
        older_gate(&SessionPolicy::default(), &older).unwrap();
        let learning = SessionPolicy { learn: true, ..SessionPolicy::default() };
        let e = format!("{:#}", older_gate(&learning, &older).unwrap_err());
        assert!(e.contains("cannot learn") && e.contains("run `ai-sandbox learn` again"), "{e}");
    }

    #[test]
    fn a_gate_that_never_answers_does_not_hold_up_a_call() {
        let dir = tempfile::tempdir().unwrap();
        let listener = std::os::unix::net::UnixListener::bind(super::socket_path(dir.path())).unwrap();
        // Accepts and reads, never answers (a stopped gate's socket still accepts).
        let held = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
        // Without the wait's end this call would block for ever (and the test with it).
        let got = super::call(dir.path(), &crate::contract::control::Request::Status);
        assert!(got.is_err(), "{got:?}");
        drop(held.join());
    }
}
