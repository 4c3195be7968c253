//! The control socket's server side, inside the gate: one task per connection, one request line,
//! one reply (with the listening socket passed to a registration).
//!
//! Who connected is checked before anything it sent is read, and no line is read past its
//! bound (`REQUEST_MAX` for the request, `ANSWER_MAX` for a watcher's answers): the gate serves
//! every session of the user, and a line that never ends must not grow its memory.

use super::{Refusal, Registered, Reply, Request};
use crate::contract::control::REQUEST_MAX;
use crate::contract::log::Event;
use crate::contract::watch::{ANSWER_MAX, Ended, Watch};
use crate::gate::state::{Session, State};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// How long a refused peer's request is read (and dropped) after its refusal is sent.
const REFUSED_DRAIN: Duration = Duration::from_secs(1);

/// How a bounded line read ended.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A line is in `line`, its newline taken off (the last may have none: the input ended).
    Read,
    /// The input ended with no byte of a line.
    End,
    /// The line is longer than the bound; no more of it was read than the bound and one
    /// buffer's worth.
    TooLong,
}

/// Reads one line and drops it, at most `max` bytes of it and none kept: the input ends, a line
/// ends, or `max` bytes are read.
async fn drop_line<R: AsyncBufRead + Unpin>(rd: &mut R, max: usize) -> std::io::Result<()> {
    let mut left = max;
    loop {
        let buf = rd.fill_buf().await?;
        if buf.is_empty() || left == 0 {
            return Ok(());
        }
        let newline = memchr::memchr(b'\n', buf);
        let n = newline.map_or(buf.len(), |i| i + 1).min(left);
        rd.consume(n);
        left -= n;
        if newline.is_some_and(|i| i < n) {
            return Ok(());
        }
    }
}

/// Reads one line of at most `max` bytes (its newline not counted) into `line`, never taking
/// more of the input than `max` and one buffer's worth. Cancel-safe, as `Lines::next_line` is: a
/// line half read when the future is dropped stays in `line` and the next call goes on with it.
async fn read_line_within<R: AsyncBufRead + Unpin>(
    rd: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    loop {
        let buf = rd.fill_buf().await?;
        if buf.is_empty() {
            return Ok(if line.is_empty() { Line::End } else { Line::Read });
        }
        let (text, taken, ended) = match memchr::memchr(b'\n', buf) {
            Some(i) => (i, i + 1, true),
            None => (buf.len(), buf.len(), false),
        };
        if line.len() + text > max {
            return Ok(Line::TooLong);
        }
        line.extend_from_slice(&buf[..text]);
        rd.consume(taken);
        if ended {
            return Ok(Line::Read);
        }
    }
}

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

/// The socket's second barrier (ADR 0055): it is 0600 in a 0700 directory, so only this user
/// reaches it, and a project may not hold that directory; should a sandboxed process reach it
/// anyway, it is still refused, because every sandbox runs in a user namespace of podman's and
/// the gate answers only processes in its own (the kernel says who connected: SO_PEERCRED).
pub(crate) fn peer_refused(s: &tokio::net::UnixStream) -> Option<String> {
    let cred = match s.peer_cred() {
        Ok(c) => c,
        Err(e) => return Some(format!("cannot tell who connected ({e})")),
    };
    let me = nix::unistd::getuid().as_raw();
    if cred.uid() != me {
        return Some(format!("uid {} is not the gate's user", cred.uid()));
    }
    let Some(pid) = cred.pid() else { return Some("cannot tell which process connected".into()) };
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/user")).ok();
    match (ns(&pid.to_string()), ns("self")) {
        (Some(theirs), Some(mine)) if theirs == mine => None,
        (Some(_), Some(_)) => Some(format!(
            "process {pid} is in another user namespace (a sandbox): the control socket answers the host's processes only"
        )),
        _ => Some(format!("cannot read the user namespace of process {pid}")),
    }
}

/// Serves one control connection.
pub(crate) async fn serve_conn(state: Arc<State>, s: tokio::net::UnixStream) {
    use tokio::io::AsyncReadExt;
    let (rd, wr) = s.into_split();
    let s: &tokio::net::UnixStream = wr.as_ref();
    let mut rd = tokio::io::BufReader::new(rd);
    // Who connected, before a byte it sent is read.
    if let Some(why) = peer_refused(s) {
        eprintln!("gate: control connection refused: {why}");
        reply(s, &Reply::refused(Refusal::Peer(why)), None).await;
        // Its request is then read and dropped (none of it kept, as much as a request may hold,
        // for a moment only), so that the refusal is what the client reads: a connection closed
        // on a request it is still writing would be a broken pipe to it, not the refusal.
        let _ = tokio::time::timeout(REFUSED_DRAIN, drop_line(&mut rd, REQUEST_MAX)).await;
        return;
    }
    let mut line = Vec::new();
    match read_line_within(&mut rd, &mut line, REQUEST_MAX).await {
        Ok(Line::Read) => {}
        Ok(Line::TooLong) => {
            let why = format!("the request line is longer than {REQUEST_MAX} bytes (not read)");
            return reply(s, &Reply::refused(Refusal::BadRequest(why)), None).await;
        }
        Ok(Line::End) | Err(_) => return,
    }
    let (port, pid) = (state.port, std::process::id());
    match serde_json::from_slice::<Request>(&line) {
        Ok(Request::Register { session, project, token, policy, secrets, upstream_ca }) => {
            // The sandbox trusts the gate's CA when the gate opens TLS for it: a bound secret's
            // host, or a host with rules.
            let bound = !secrets.is_empty() || !policy.rules.is_empty();
            let mut said = Registered::by_this_gate(port, None);
            let sess = match Session::new(session, project, token, policy)
                .with_secrets(secrets, upstream_ca.as_deref())
            {
                Ok(s) => Arc::new(s),
                Err(e) => return reply(s, &Reply::refused(Refusal::Session(format!("{e}"))), None).await,
            };
            if let Err(e) = state.open_counts(&sess, &sess.policy()) {
                return reply(s, &Reply::refused(Refusal::Session(e)), None).await;
            }
            let ca = match bound.then(|| state.ca()).transpose() {
                Ok(ca) => ca.map(|c| c.pem.clone()),
                Err(e) => return reply(s, &Reply::refused(Refusal::Session(e)), None).await,
            };
            if !state.register(sess.clone()) {
                return reply(s, &Reply::refused(Refusal::Closing), None).await;
            }
            said.ca = ca;
            reply(s, &Reply::registered(pid, said), Some(&state.listener)).await;
            // The session lives as long as this connection.
            let mut sink = [0u8; 64];
            while rd.read(&mut sink).await.unwrap_or(0) > 0 {}
            state.unregister(&sess);
            // What it sent over a period is on file before the next session of the project asks.
            if let Some(c) = sess.counts() {
                let merged = tokio::task::spawn_blocking(move || c.merge(crate::gate::periods::now())).await;
                if let Ok(Err(e)) = merged {
                    eprintln!("gate: {e}");
                }
            }
        }
        Ok(Request::Update { session, policy }) => match state.session(&session) {
            Some(sess) => match state.open_counts(&sess, &policy) {
                Ok(()) => {
                    let said = Reply::updated(port, pid);
                    sess.set_policy(policy);
                    reply(s, &said, None).await
                }
                Err(e) => reply(s, &Reply::refused(Refusal::Session(e)), None).await,
            },
            None => reply(s, &Reply::refused(Refusal::NoSession(session)), None).await,
        },
        Ok(Request::Watch) => {
            use tokio::io::AsyncWriteExt;
            let (id, mut rx) = state.asks.add_watcher();
            reply(s, &Reply::done(port, pid), None).await;
            let mut wr = wr;
            // `read_line_within` is cancel-safe (a line half read when a message goes out is
            // kept in `answer`).
            let mut answer = Vec::new();
            loop {
                tokio::select! {
                    msg = rx.recv() => match msg {
                        Some(m) if wr.write_all(format!("{m}\n").as_bytes()).await.is_ok() => {}
                        _ => break,
                    },
                    l = read_line_within(&mut rd, &mut answer, ANSWER_MAX) => match l {
                        Ok(Line::Read) => {
                            if let Ok(a) = serde_json::from_slice::<crate::gate::ask::Answer>(&answer) {
                                state.asks.answer(&a);
                            }
                            answer.clear();
                        }
                        Ok(Line::TooLong) => {
                            eprintln!("gate: a watcher sent a line longer than {ANSWER_MAX} bytes; hung up on it");
                            break;
                        }
                        Ok(Line::End) | Err(_) => break,
                    },
                }
            }
            state.asks.remove_watcher(id);
        }
        Ok(Request::Refused { session, refused }) => match state.session(&session) {
            Some(sess) => {
                let config_path = sess.policy().config_path.clone();
                for d in &refused {
                    let _ = state.record(Event::direct(
                        d,
                        &sess.id,
                        &sess.project,
                        &config_path,
                        crate::gate::log::now(),
                    ));
                }
                reply(s, &Reply::done(port, pid), None).await
            }
            None => reply(s, &Reply::refused(Refusal::NoSession(session)), None).await,
        },
        Ok(Request::Review { session }) => match state.session(&session) {
            Some(sess) => {
                let ended = Ended { session: sess.id.clone(), project: sess.project.clone() };
                state.asks.broadcast(&Watch::Review(ended).line());
                reply(s, &Reply::done(port, pid), None).await
            }
            None => reply(s, &Reply::refused(Refusal::NoSession(session)), None).await,
        },
        Ok(Request::Status) => reply(s, &Reply::status(port, pid, state.status()), None).await,
        Ok(Request::Stop) => {
            reply(s, &Reply::done(port, pid), None).await;
            state.close();
        }
        Err(e) => reply(s, &Reply::refused(Refusal::BadRequest(e.to_string())), None).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::SessionPolicy;
    use crate::policy::budget::host_line;

    /// One request through `serve_conn`, its reply read back.
    async fn ask(state: &Arc<State>, req: &Request) -> Reply {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let served = tokio::spawn(serve_conn(state.clone(), theirs));
        let (rd, mut wr) = ours.into_split();
        wr.write_all(format!("{}\n", serde_json::to_string(req).unwrap()).as_bytes()).await.unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(rd).read_line(&mut line).await.unwrap();
        // Hung up: a registration's session ends with its connection.
        drop(wr);
        served.await.unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// Writes spaces, with no newline, until the connection breaks: how many were written.
    async fn endless(mut wr: tokio::net::unix::OwnedWriteHalf) -> usize {
        use tokio::io::AsyncWriteExt;
        let chunk = vec![b' '; 64 << 10];
        let mut sent = 0;
        while wr.write_all(&chunk).await.is_ok() {
            sent += chunk.len();
        }
        sent
    }

    /// `json` after enough spaces that the line is `len` bytes long (JSON allows the spaces).
    fn padded(json: &str, len: usize) -> Vec<u8> {
        let mut line = vec![b' '; len - json.len()];
        line.extend_from_slice(json.as_bytes());
        line.push(b'\n');
        line
    }

    /// A request line of `REQUEST_MAX` bytes is served; a longer one is refused once the bound is
    /// read, never read whole: here it never ends, and the gate still answers and hangs up.
    #[tokio::test]
    async fn a_request_line_over_the_bound_is_refused_without_being_read_whole() {
        use tokio::io::{AsyncWriteExt, BufReader};
        use tokio::time::timeout;
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(State::for_test(dir.path()));
        let wait = Duration::from_secs(20);
        // The control: a status request spaced out to the bound is answered.
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let served = tokio::spawn(serve_conn(state.clone(), theirs));
        let (rd, mut wr) = ours.into_split();
        let status = serde_json::to_string(&Request::Status).unwrap();
        wr.write_all(&padded(&status, REQUEST_MAX)).await.unwrap();
        let mut line = String::new();
        timeout(wait, BufReader::new(rd).read_line(&mut line)).await.unwrap().unwrap();
        let reply: Reply = serde_json::from_str(&line).unwrap();
        assert_eq!(reply.refusal(), None, "{line}");
        drop(wr);
        timeout(wait, served).await.unwrap().unwrap();
        // A line that never ends: refused, and the connection closed under the writer.
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let served = tokio::spawn(serve_conn(state.clone(), theirs));
        let (rd, wr) = ours.into_split();
        let writer = tokio::spawn(endless(wr));
        let mut line = String::new();
        timeout(wait, BufReader::new(rd).read_line(&mut line)).await.unwrap().unwrap();
        let reply: Reply = serde_json::from_str(&line).unwrap();
        let why = format!("the request line is longer than {REQUEST_MAX} bytes (not read)");
        assert_eq!(reply.refusal(), Some(Refusal::BadRequest(why)));
        timeout(wait, served).await.unwrap().unwrap();
        let sent = timeout(wait, writer).await.unwrap().unwrap();
        // What was written before the pipe broke: the bound, the gate's buffer and the socket's.
        assert!(sent < REQUEST_MAX + (1 << 20), "{sent} bytes written");
    }

    /// A watcher's answer of `ANSWER_MAX` bytes is taken; on a longer line the gate hangs up and
    /// the watcher is gone, without the line read whole.
    #[tokio::test]
    async fn a_watchers_answer_over_the_bound_ends_the_watch() {
        use crate::gate::ask::{Answer, Question, Verdict};
        use tokio::io::{AsyncWriteExt, BufReader};
        use tokio::time::timeout;
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(State::for_test(dir.path()));
        let wait = Duration::from_secs(20);
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let served = tokio::spawn(serve_conn(state.clone(), theirs));
        let (rd, mut wr) = ours.into_split();
        let mut rd = BufReader::new(rd);
        wr.write_all(format!("{}\n", serde_json::to_string(&Request::Watch).unwrap()).as_bytes())
            .await
            .unwrap();
        let mut line = String::new();
        timeout(wait, rd.read_line(&mut line)).await.unwrap().unwrap();
        assert_eq!(serde_json::from_str::<Reply>(&line).unwrap().refusal(), None, "{line}");
        // The control: a question, answered with a line spaced out to the bound.
        let asks = state.clone();
        let held = tokio::spawn(async move { asks.asks.ask(Question::example(), wait).await });
        line.clear();
        timeout(wait, rd.read_line(&mut line)).await.unwrap().unwrap();
        let Watch::Ask(q) = Watch::read(&line).unwrap() else { panic!("not a question: {line}") };
        let answer = serde_json::to_string(&Answer { ask: q.ask, verdict: Verdict::Once }).unwrap();
        wr.write_all(&padded(&answer, ANSWER_MAX)).await.unwrap();
        assert_eq!(timeout(wait, held).await.unwrap().unwrap(), Verdict::Once);
        // A line that never ends: the gate hangs up and drops the watcher. Here that is the end
        // of input, or a reset (the kernel's word for a close with what we sent unread).
        let writer = tokio::spawn(endless(wr));
        line.clear();
        match timeout(wait, rd.read_line(&mut line)).await.unwrap() {
            Ok(n) => assert_eq!(n, 0, "{line}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
        timeout(wait, served).await.unwrap().unwrap();
        assert!(!state.asks.watched());
        assert!(timeout(wait, writer).await.unwrap().unwrap() < ANSWER_MAX + (1 << 20));
    }

    /// A line read in parts, the read dropped between them as `select!` drops it, is read whole;
    /// a line at the bound is read, one past it is not; the input's end is said.
    #[tokio::test]
    async fn a_bounded_line_read_is_cancel_safe_and_stops_at_the_bound() {
        use tokio::io::AsyncWriteExt;
        let (a, mut b) = tokio::net::UnixStream::pair().unwrap();
        let mut rd = tokio::io::BufReader::new(a);
        let mut line = Vec::new();
        b.write_all(b"{\"ask\":").await.unwrap();
        let cut = tokio::time::timeout(Duration::from_millis(50), read_line_within(&mut rd, &mut line, 16));
        assert!(cut.await.is_err(), "no newline yet: still reading");
        b.write_all(b"1}\n12345\n123456\nrest").await.unwrap();
        assert_eq!(read_line_within(&mut rd, &mut line, 16).await.unwrap(), Line::Read);
        assert_eq!(line, b"{\"ask\":1}");
        line.clear();
        assert_eq!(read_line_within(&mut rd, &mut line, 5).await.unwrap(), Line::Read);
        assert_eq!(line, b"12345");
        line.clear();
        assert_eq!(read_line_within(&mut rd, &mut line, 5).await.unwrap(), Line::TooLong);
        // Dropped, at most the bound of it: the next line is what follows.
        drop_line(&mut rd, 16).await.unwrap();
        line.clear();
        drop(b);
        assert_eq!(read_line_within(&mut rd, &mut line, 16).await.unwrap(), Line::Read);
        assert_eq!(line, b"rest", "an unended last line");
        line.clear();
        assert_eq!(read_line_within(&mut rd, &mut line, 16).await.unwrap(), Line::End);
    }

    /// A registration is answered with the gate's CA when the gate opens TLS for the session (a
    /// bound secret, or rules), and with the limits it holds.
    #[tokio::test]
    async fn a_registration_gets_the_ca_when_the_gate_opens_tls_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(State::for_test(dir.path()));
        let register = |n: u8, policy: SessionPolicy, secrets| Request::Register {
            session: format!("s{n}"),
            project: "/p".into(),
            token: format!("{n:032}"),
            policy,
            secrets,
            upstream_ca: None,
        };
        let plain = ask(&state, &register(1, SessionPolicy::default(), vec![])).await;
        assert_eq!(plain.refusal(), None);
        assert_eq!(plain.as_registered().ca, None, "a blind tunnel needs no CA");
        let rules = crate::policy::rule::parse("git.test git-push /r.git refs/heads/agent/*").unwrap();
        let ruled =
            ask(&state, &register(2, SessionPolicy { rules, ..SessionPolicy::default() }, vec![])).await;
        let said = ruled.as_registered();
        assert!(
            said.ca.as_deref().is_some_and(|c| c.contains("BEGIN CERTIFICATE"))
                && said.enforces.contains(&crate::contract::capability::Capability::PushRefs),
            "{said:?}"
        );
        let bound =
            vec![crate::contract::session::Bound::new("K", "aisb_placeholder_k", "real", &["a.test"])];
        let keyed = ask(&state, &register(3, SessionPolicy::default(), bound)).await;
        assert!(keyed.as_registered().ca.is_some(), "{keyed:?}");
    }

    /// A live change is answered with what the gate holds of the new policy, as a registration
    /// is: the launcher refuses a change whose new limit a gate does not say (an older one).
    #[tokio::test]
    async fn a_live_change_is_answered_with_the_limits_the_gate_holds() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(State::for_test(dir.path()));
        let plain = SessionPolicy::default();
        state.register(Arc::new(Session::new("s1".into(), "/p".into(), "t".into(), plain.clone())));
        let update =
            |policy: &SessionPolicy| Request::Update { session: "s1".into(), policy: policy.clone() };
        // The control: nothing to hold, nothing said.
        let said = ask(&state, &update(&plain)).await;
        assert_eq!(said.refusal(), None);
        assert_eq!(said.as_registered(), Registered::by_this_gate(0, None));
        let daily = SessionPolicy {
            budgets: vec![host_line("a.test 1k/day")],
            budget_counts: Some(dir.path().join("budgets.json")),
            ..SessionPolicy::default()
        };
        let said = ask(&state, &update(&daily)).await.as_registered();
        assert_eq!(said.enforces, crate::contract::capability::Capability::ALL.into(), "{said:?}");
        assert_eq!(state.session("s1").unwrap().policy().budgets, daily.budgets, "the change held");
        // A session the gate does not hold: refused, nothing said held.
        let other = Request::Update { session: "s2".into(), policy: daily };
        assert_eq!(ask(&state, &other).await.refusal(), Some(Refusal::NoSession("s2".into())));
    }
}
