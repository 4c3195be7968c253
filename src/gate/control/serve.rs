//! The control socket's server side, inside the gate: one task per connection, one request line,
//! one reply (with the listening socket passed to a registration).

use super::{Refusal, Registered, Reply, Request};
use crate::contract::log::Event;
use crate::contract::watch::{Ended, Watch};
use crate::gate::state::{Session, State};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

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
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let (rd, wr) = s.into_split();
    let s: &tokio::net::UnixStream = wr.as_ref();
    let mut rd = tokio::io::BufReader::new(rd);
    let mut line = String::new();
    if rd.read_line(&mut line).await.unwrap_or(0) == 0 {
        return;
    }
    // After the request is read, so the client gets the refusal as its reply.
    if let Some(why) = peer_refused(s) {
        eprintln!("gate: control connection refused: {why}");
        return reply(s, &Reply::refused(Refusal::Peer(why)), None).await;
    }
    let (port, pid) = (state.port, std::process::id());
    match serde_json::from_str::<Request>(&line) {
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
                            if let Ok(a) = serde_json::from_str::<crate::gate::ask::Answer>(&l) {
                                state.asks.answer(&a);
                            }
                        }
                        _ => break,
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
