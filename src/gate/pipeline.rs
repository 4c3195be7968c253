//! The phases both request paths share, so that a tunnel, a forwarded request and a terminated
//! request are decided alike: the watcher's question (`ask`) and the budget phase (`budget`).
//!
//! Each takes the policy the request is decided under, read once for the request by its caller
//! (`Session::policy`), never read again here: a live change mid-request cannot mix two versions.
//! The one exception is said where it is: a watcher's "allowed" *is* a live change, and the
//! request is decided again under the policy it made.

use super::ask::{Question, Verdict};
use super::budget::Allowance;
use super::decide::Denial;
use super::state::{Session, State};
use crate::contract::SessionPolicy;
use std::time::Duration;

/// A request as the log and a watcher see it.
#[derive(Clone, Copy)]
pub(crate) struct Asked<'a> {
    pub(crate) method: &'a str,
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    /// Its path, where the gate read the request (never its query).
    pub(crate) path: Option<&'a str>,
}

/// With `ask = SECONDS` and a watcher attached: holds the refused request for the watcher's
/// answer. `None` when no one is asked (the refusal stands).
pub(crate) async fn ask(
    state: &State,
    s: &Session,
    policy: &SessionPolicy,
    r: &Asked<'_>,
    d: &Denial,
) -> Option<Verdict> {
    let secs = policy.ask.filter(|_| state.asks.watched())?;
    let q = Question {
        ask: 0,
        session: s.id.clone(),
        project: s.project.clone(),
        method: r.method.to_string(),
        host: r.host.to_string(),
        port: r.port,
        seconds: secs,
        allow: d.allow.clone(),
        path: d.path.clone().or(r.path.map(str::to_string)),
    };
    Some(state.asks.ask(q, Duration::from_secs(u64::from(secs))).await)
}

/// What a request needs of its host's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// All of it or nothing, taken now: a request whose length is known beforehand (a
    /// forwarded request, a terminated request's head and declared body).
    Whole(u64),
    /// Something left: a tunnel, counted as its bytes flow.
    Open,
}

impl Need {
    /// Whether `a` has room for it; a whole need is taken from it then.
    fn taken(self, a: &Allowance) -> bool {
        match self {
            Need::Whole(n) => a.take_all(n),
            Need::Open => a.left() > 0,
        }
    }

    /// The refusal when it does not fit.
    fn denial(self, a: &Allowance, config_path: &str) -> Denial {
        match self {
            Need::Whole(n) => a.denial_of(config_path, n),
            Need::Open => a.denial(config_path),
        }
    }
}

/// The budget phase, alike on every path: the allowance the request is counted against (`None`:
/// the host has no budget, or a watcher let this request through uncounted), or the refusal.
/// Over budget with a watcher asked: "once" lets it through uncounted; "allowed" raised the line
/// (a live change), and the request is measured against the new one.
pub(crate) async fn budget(
    state: &State,
    s: &Session,
    policy: &SessionPolicy,
    r: &Asked<'_>,
    need: Need,
) -> Result<Option<Allowance>, Denial> {
    let Some(a) = s.allowance(policy, r.host) else { return Ok(None) };
    if need.taken(&a) {
        return Ok(Some(a));
    }
    let d = need.denial(&a, &policy.config_path);
    match ask(state, s, policy, r, &d).await {
        Some(Verdict::Once) => Ok(None),
        Some(Verdict::Allowed) => {
            let raised = s.policy();
            match s.allowance(&raised, r.host) {
                None => Ok(None),
                Some(b) if need.taken(&b) => Ok(Some(b)),
                Some(b) => Err(need.denial(&b, &raised.config_path)),
            }
        }
        Some(Verdict::Deny) | None => Err(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::budget::host_line;
    use std::sync::Arc;

    fn session(limit: &str) -> (State, Arc<Session>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let state = State::for_test(dir.path());
        let policy = SessionPolicy { budgets: vec![host_line(limit)], ..SessionPolicy::default() };
        let s = Arc::new(Session::new("s1".into(), "/p".into(), "t".into(), policy));
        assert!(state.register(s.clone()));
        (state, s, dir)
    }

    const R: Asked<'static> = Asked { method: "POST", host: "a.test", port: 443, path: Some("/up") };

    /// A whole need is taken or refused as one; an open one needs a byte left and takes none;
    /// both refuse alike once the budget is spent (no watcher: the refusal stands).
    #[tokio::test]
    async fn a_budget_takes_a_known_length_whole_and_a_tunnel_while_anything_is_left() {
        let (state, s, _dir) = session("a.test 100");
        let policy = s.policy();
        let a = budget(&state, &s, &policy, &R, Need::Whole(60)).await.unwrap().unwrap();
        assert_eq!(a.left(), 40, "taken now");
        let Err(d) = budget(&state, &s, &policy, &R, Need::Whole(41)).await else { panic!("41 of 40 left") };
        assert_eq!(d.status, 403, "{d:?}");
        assert!(d.hint.contains("budget = a.test"), "{}", d.hint);
        let a = budget(&state, &s, &policy, &R, Need::Open).await.unwrap().unwrap();
        assert_eq!(a.left(), 40, "a tunnel takes nothing before its bytes flow");
        a.take(40);
        assert!(budget(&state, &s, &policy, &R, Need::Open).await.is_err(), "spent");
        assert!(
            budget(&state, &s, &policy, &Asked { host: "b.test", ..R }, Need::Whole(1000))
                .await
                .unwrap()
                .is_none()
        );
    }

    /// Over budget with a watcher attached: the request is held and asked. "once" lets it through
    /// uncounted; "allowed" measures it against the line the watcher's live change raised, which
    /// may still be too low; "deny" keeps the refusal. Each round is a fresh session.
    #[tokio::test]
    async fn a_spent_budget_is_asked_and_each_answer_decides_as_it_says() {
        use super::super::ask::{Answer, Watch};
        let asking = |line: &str| SessionPolicy {
            budgets: vec![host_line(line)],
            ask: Some(30),
            ..SessionPolicy::default()
        };
        for (verdict, raised, want) in [
            (Verdict::Once, None, Ok(None)),
            (Verdict::Allowed, Some("a.test 200"), Ok(Some(50))),
            (Verdict::Allowed, Some("a.test 120"), Err("budget of 120")),
            (Verdict::Deny, None, Err("budget of 100")),
        ] {
            let (state, s, _dir) = session("a.test 100");
            s.set_policy(asking("a.test 100"));
            let (_, mut watcher) = state.asks.add_watcher();
            let (state, policy) = (Arc::new(state), s.policy());
            let held = {
                let (state, s) = (state.clone(), s.clone());
                tokio::spawn(async move { budget(&state, &s, &policy, &R, Need::Whole(150)).await })
            };
            let asked = tokio::time::timeout(Duration::from_secs(10), watcher.recv());
            let line = asked.await.expect("the watcher was not asked").unwrap();
            let Some(Watch::Ask(q)) = Watch::read(&line) else { panic!("not a question: {line}") };
            assert_eq!((q.host.as_str(), q.path.as_deref()), ("a.test", Some("/up")), "{q:?}");
            if let Some(line) = raised {
                s.set_policy(asking(line));
            }
            assert!(state.asks.answer(&Answer { ask: q.ask, verdict }));
            match (held.await.unwrap(), want) {
                (Ok(a), Ok(left)) => assert_eq!(a.map(|a| a.left()), left, "{verdict:?} {raised:?}"),
                (Err(d), Err(said)) => assert!(d.hint.contains(said), "{verdict:?} {raised:?}: {}", d.hint),
                (got, _) => panic!("{verdict:?} {raised:?}: {:?}", got.map(|a| a.map(|a| a.left()))),
            }
        }
    }

    /// The budget phase decides under the policy it is given, not whatever the session holds by
    /// the time it runs: a live change mid-request does not mix two versions.
    #[tokio::test]
    async fn the_budget_phase_reads_the_policy_it_was_given() {
        let (state, s, _dir) = session("a.test 100");
        let before = s.policy();
        s.set_policy(SessionPolicy { budgets: vec![host_line("a.test 10")], ..SessionPolicy::default() });
        assert!(budget(&state, &s, &before, &R, Need::Whole(50)).await.unwrap().is_some());
        let after = s.policy();
        assert!(budget(&state, &s, &after, &R, Need::Whole(50)).await.is_err());
    }
}
