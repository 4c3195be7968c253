//! The gate's shared state: the registered sessions (token, policy, counters), the decision
//! log, and the `closing` flag that lets an idle gate exit without losing a registration that
//! arrives at the same moment (the late launcher is told to retry and starts the next gate).

use super::ca::Ca;
use super::decide::{self, SessionPolicy};
use super::log::{self, Event, Log};
use super::secrets::{Bound, Secrets};

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

/// The `tools/call`s a session's MCP rules allowed and refused, by host and tool. The agent
/// names the tools, so a session keeps at most `McpTally::TOOLS_MOST` of them; calls of any other
/// are counted under one more name, `McpTally::OTHERS`.
#[derive(Default)]
pub(crate) struct McpTally(std::sync::Mutex<std::collections::BTreeMap<(String, String), (u64, u64)>>);

impl McpTally {
    pub(crate) const TOOLS_MOST: usize = 256;
    pub(crate) const OTHERS: &'static str = "(other tools)";

    /// Counts one call of `tool` on `host`, allowed or refused.
    pub(crate) fn add(&self, host: &str, tool: &str, allowed: bool) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut key = (host.to_string(), tool.to_string());
        if !m.contains_key(&key) && m.len() >= Self::TOOLS_MOST {
            key.1 = Self::OTHERS.to_string();
        }
        let n = m.entry(key).or_default();
        if allowed {
            n.0 += 1;
        } else {
            n.1 += 1;
        }
    }

    fn uses(&self) -> Vec<crate::contract::session::McpUse> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.iter()
            .map(|((host, tool), &(allowed, refused))| crate::contract::session::McpUse {
                host: host.clone(),
                tool: tool.clone(),
                allowed,
                refused,
            })
            .collect()
    }
}

/// What one MCP message being read holds of its session's `McpHeld::MOST`: a request's body
/// until it is decided, an answer's JSON or its event until it is filtered (and an AWS-signed
/// body while it is read to be hashed: `terminate::sign`). The agent decides
/// how many it sends at once and how slowly, so a session's together are bounded (each is
/// bounded too: `mcp::BODY_MOST`, `mcp::ANSWER_MOST`); given back when dropped.
pub(crate) struct McpHeld {
    session: Arc<Session>,
    n: usize,
}

impl McpHeld {
    /// A session's MCP messages hold at most this many bytes at once.
    pub(crate) const MOST: usize = 64 << 20;

    pub(crate) fn new(session: &Arc<Session>) -> McpHeld {
        McpHeld { session: session.clone(), n: 0 }
    }

    /// This message now holds `n` bytes; `Err` (and nothing taken) when its session's would
    /// then hold more than `MOST`.
    pub(crate) fn set(&mut self, n: usize) -> Result<(), String> {
        let all = &self.session.mcp_held;
        if n <= self.n {
            all.fetch_sub(self.n - n, Ordering::Relaxed);
        } else {
            let more = n - self.n;
            all.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                now.checked_add(more).filter(|&sum| sum <= Self::MOST)
            })
            .map_err(|_| {
                format!(
                    "the sandbox's MCP messages the gate holds at once would pass {} MiB",
                    Self::MOST >> 20
                )
            })?;
        }
        self.n = n;
        Ok(())
    }
}

impl Drop for McpHeld {
    fn drop(&mut self) {
        self.session.mcp_held.fetch_sub(self.n, Ordering::Relaxed);
    }
}

pub(crate) struct Session {
    pub(crate) id: String,
    pub(crate) project: String,
    pub(crate) token: String,
    /// Replaced whole by a live change (`ai-sandbox allow`); each connection reads it once.
    policy: RwLock<Arc<SessionPolicy>>,
    pub(crate) started: String,
    pub(crate) allowed: AtomicU64,
    pub(crate) denied: AtomicU64,
    pub(crate) active: AtomicUsize,
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
    /// Secrets bound to hosts (fixed for the session's life; see `secrets`).
    pub(crate) secrets: Secrets,
    /// How the gate verifies the servers it opens TLS to for this session (the host's roots and
    /// its `upstream_ca`): made at registration when a secret is bound or a CA given (so a bad
    /// one refuses the session), else when a host with rules is first terminated.
    upstream: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    upstream_ca: Option<String>,
    /// What the session sent to each budgeted host (`budget`).
    pub(crate) spent: super::budget::Spent,
    /// The MCP tool calls its rules decided, by host and tool (`ps`).
    pub(crate) mcp: McpTally,
    /// Bytes of MCP messages its requests and answers hold at once (`McpHeld`).
    mcp_held: AtomicUsize,
    /// The project's counts of budgets with a period, shared with its other sessions: opened
    /// when a policy (at registration, or a live change) first has such a line.
    counts: RwLock<Option<Arc<super::periods::Counts>>>,
}

impl Session {
    pub(crate) fn new(id: String, project: String, token: String, policy: SessionPolicy) -> Session {
        Session {
            id,
            project,
            token,
            policy: RwLock::new(Arc::new(policy)),
            started: log::now(),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            secrets: Secrets::default(),
            upstream: OnceLock::new(),
            upstream_ca: None,
            spent: Default::default(),
            mcp: McpTally::default(),
            mcp_held: AtomicUsize::new(0),
            counts: RwLock::new(None),
        }
    }

    /// The allowance for `host` under `policy`'s budgets (the session's, as read for the
    /// request), now (`None`: not budgeted).
    pub(crate) fn allowance(&self, policy: &SessionPolicy, host: &str) -> Option<super::budget::Allowance> {
        if policy.budgets.is_empty() {
            return None;
        }
        self.spent.allowance(&policy.budgets, host, self.counts().as_deref(), super::periods::now())
    }

    pub(crate) fn counts(&self) -> Option<Arc<super::periods::Counts>> {
        self.counts.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What the session's budgets have used (`gate status`, `ps`).
    fn budget_uses(&self) -> Vec<crate::contract::session::BudgetUse> {
        self.spent.uses(&self.policy().budgets, self.counts().as_deref(), super::periods::now())
    }

    /// With bound secrets: the gate opens TLS to their hosts (see `terminate`).
    pub(crate) fn with_secrets(
        mut self,
        bound: Vec<Bound>,
        upstream_ca: Option<&str>,
    ) -> anyhow::Result<Session> {
        self.secrets = Secrets::new(bound);
        self.upstream_ca = upstream_ca.map(str::to_string);
        if !self.secrets.is_empty() || upstream_ca.is_some() {
            let _ = self.upstream.set(Ok(super::ca::upstream_config(upstream_ca)?));
        }
        Ok(self)
    }

    /// The upstream TLS config (see `upstream`).
    pub(crate) fn upstream(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.upstream
            .get_or_init(|| {
                super::ca::upstream_config(self.upstream_ca.as_deref()).map_err(|e| format!("{e:#}"))
            })
            .clone()
    }
}

impl Session {
    pub(crate) fn policy(&self) -> Arc<SessionPolicy> {
        self.policy.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub(crate) fn set_policy(&self, p: SessionPolicy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(p);
    }
}

pub use crate::contract::SessionStatus;

struct Registry {
    all: Vec<Arc<Session>>,
    /// When the session count last changed (for idle exit).
    changed: Instant,
    /// Set once, when the gate decides to exit: no registration is accepted after it.
    closing: bool,
}

pub(crate) struct State {
    pub(crate) port: u16,
    /// A duplicate of the listening socket. Each launcher receives it when it registers and
    /// holds it for the sandbox's life, so the port stays bound to this socket even if the
    /// gate dies: nobody else (another local user included) can take it over.
    pub(crate) listener: OwnedFd,
    registry: RwLock<Registry>,
    log: Log,
    pub(crate) stop: tokio::sync::Notify,
    /// Watchers and the requests held for them (`ask = SECONDS`).
    pub(crate) asks: super::ask::Asks,
    /// The CA for terminated hosts, made on first use (in memory only).
    ca: OnceLock<Result<Arc<Ca>, String>>,
    /// The projects' counts of budgets with a period (kept in their state directories).
    pub(crate) periods: super::periods::Periods,
}

impl State {
    pub(crate) fn new(port: u16, listener: OwnedFd, log: Log) -> State {
        State {
            port,
            listener,
            registry: RwLock::new(Registry { all: Vec::new(), changed: Instant::now(), closing: false }),
            log,
            stop: tokio::sync::Notify::new(),
            asks: Default::default(),
            ca: OnceLock::new(),
            periods: Default::default(),
        }
    }

    /// A CA loaded from files (a cluster-mode gate), used instead of one made here.
    pub(crate) fn use_ca(&self, ca: Ca) {
        let _ = self.ca.set(Ok(Arc::new(ca)));
    }

    /// This gate's CA (made on first use; its key never leaves this process).
    pub(crate) fn ca(&self) -> Result<Arc<Ca>, String> {
        self.ca
            .get_or_init(|| Ca::new().map(Arc::new).map_err(|e| format!("making the gate's CA: {e}")))
            .clone()
    }

    /// Adds a session; `false` when the gate is closing (the launcher retries with a new gate).
    pub fn register(&self, s: Arc<Session>) -> bool {
        let mut r = self.registry.write().unwrap_or_else(|e| e.into_inner());
        if r.closing {
            return false;
        }
        r.all.push(s);
        r.changed = Instant::now();
        true
    }

    /// Opens the project's counts for `s` when `policy` has a budget with a period (at
    /// registration, and before a live change takes effect): a session is never counted per
    /// session for a line that says a period.
    pub(crate) fn open_counts(&self, s: &Session, policy: &SessionPolicy) -> Result<(), String> {
        if !policy.budgets.iter().any(|b| b.period.is_some()) || s.counts().is_some() {
            return Ok(());
        }
        let Some(file) = &policy.budget_counts else {
            return Err("a budget with a period (`SIZE/day`) keeps its count in the project's state directory, and this session named none (its launcher is of an older version): start the sandbox again".into());
        };
        let c = self.periods.open(file)?;
        *s.counts.write().unwrap_or_else(|e| e.into_inner()) = Some(c);
        Ok(())
    }

    /// A registered session by id.
    pub(crate) fn session(&self, id: &str) -> Option<Arc<Session>> {
        let r = self.registry.read().unwrap_or_else(|e| e.into_inner());
        r.all.iter().find(|s| s.id == id).cloned()
    }

    pub(crate) fn unregister(&self, s: &Arc<Session>) {
        let mut r = self.registry.write().unwrap_or_else(|e| e.into_inner());
        r.all.retain(|x| !Arc::ptr_eq(x, s));
        r.changed = Instant::now();
    }

    /// The session whose token was presented (every token compared in constant time).
    pub(crate) fn authenticate(&self, presented: Option<&str>) -> Option<Arc<Session>> {
        let r = self.registry.read().unwrap_or_else(|e| e.into_inner());
        let tokens: Vec<&str> = r.all.iter().map(|s| s.token.as_str()).collect();
        decide::authenticate(&tokens, presented).map(|i| r.all[i].clone())
    }

    /// True, and closed for good, when no session has existed for `idle`.
    pub(crate) fn close_if_idle(&self, idle: Duration) -> bool {
        let mut r = self.registry.write().unwrap_or_else(|e| e.into_inner());
        if r.closing || (r.all.is_empty() && r.changed.elapsed() >= idle) {
            r.closing = true;
        }
        r.closing
    }

    /// Closes now (stop command, SIGTERM): registrations from here on are told to retry.
    pub(crate) fn close(&self) {
        self.registry.write().unwrap_or_else(|e| e.into_inner()).closing = true;
        self.stop.notify_one();
    }

    pub(crate) fn status(&self) -> Vec<SessionStatus> {
        let r = self.registry.read().unwrap_or_else(|e| e.into_inner());
        r.all
            .iter()
            .map(|s| SessionStatus {
                session: s.id.clone(),
                project: s.project.clone(),
                started: s.started.clone(),
                allowed: s.allowed.load(Ordering::Relaxed),
                denied: s.denied.load(Ordering::Relaxed),
                active: s.active.load(Ordering::Relaxed) as u64,
                bytes_up: s.up.load(Ordering::Relaxed),
                bytes_down: s.down.load(Ordering::Relaxed),
                budgets: s.budget_uses(),
                mcp: s.mcp.uses(),
            })
            .collect()
    }

    /// Records one decision that lets something through, before the client is answered. An
    /// error means it is not on disk, and the caller refuses instead (no decision without its
    /// record: docs/threat-model.md); the failure is said on the gate's stderr too.
    #[must_use = "an allowing decision whose record failed must be refused"]
    pub(crate) fn log(&self, d: Entry<'_>) -> Result<(), Unlogged> {
        self.record(self.event(d))
    }

    /// Records a refusal, or a note on what was already let through (what was masked): the
    /// answer is the same whether or not it reaches the disk, and a failure is said on stderr.
    pub(crate) fn note(&self, d: Entry<'_>) {
        let _ = self.record(self.event(d));
    }

    fn event(&self, d: Entry<'_>) -> Event {
        Event {
            time: log::now(),
            session: d.session.to_string(),
            project: self.session(d.session).map(|s| s.project.clone()).unwrap_or_default(),
            method: d.method.to_string(),
            host: d.host.to_string(),
            port: d.port,
            decision: d.kind,
            status: d.status,
            reason: d.reason.to_string(),
            hint: d.hint.to_string(),
            allow: d.allow.map(str::to_string),
            path: d.path.map(str::to_string),
            layer: log::Layer::Gate,
            learned: d.learned,
        }
    }

    /// Writes one event to the log and shows a refusal to the watchers (also when the write
    /// failed: they are how a user hears of it).
    pub(crate) fn record(&self, e: Event) -> Result<(), Unlogged> {
        let written = self.log.write(&e).map_err(|err| {
            eprintln!(
                "gate: the decision log could not be written ({err}); lost: {} {} {}:{} of session {}",
                e.decision, e.method, e.host, e.port, e.session
            );
            Unlogged(err.to_string())
        });
        // Watchers see refusals as they are decided.
        if e.decision.refused() && self.asks.watched() {
            self.asks.broadcast(&crate::contract::watch::Watch::Refused(e).line());
        }
        written
    }
}

/// A decision whose record did not reach the log: why the write failed.
#[derive(Debug)]
pub(crate) struct Unlogged(pub(crate) String);

impl Unlogged {
    /// The refusal a request whose allowing decision could not be recorded gets.
    pub(crate) fn denial(&self) -> super::decide::Denial {
        super::decide::Denial {
            status: 503,
            reason: format!("the decision log could not be written ({}); refused, as no decision goes unrecorded", self.0),
            hint: "ai-sandbox gate: this request could not be recorded in the gate's decision log, so it was not sent (is the runtime directory's disk full?)".into(),
            ..super::decide::Denial::default()
        }
    }
}

/// One decision as the connection code logs it: its kind is said where the decision is made
/// (`allowed`, `denied`, or a challenge set explicitly), never worked out from the status.
#[derive(Clone, Copy)]
pub(crate) struct Entry<'a> {
    pub(crate) kind: log::Decision,
    pub(crate) session: &'a str,
    pub(crate) method: &'a str,
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    pub(crate) status: u16,
    pub(crate) reason: &'a str,
    /// What would allow it (the refusal's hint), or empty.
    pub(crate) hint: &'a str,
    /// The `allow =` value that would lift it, when one would.
    pub(crate) allow: Option<&'a str>,
    /// A request's path (no query) on a host whose TLS the gate opened, or plain HTTP.
    pub(crate) path: Option<&'a str>,
    /// Relayed only because the session is a learning run (see `decide::learns`).
    pub(crate) learned: bool,
}

impl<'a> Entry<'a> {
    /// Relayed (status 200).
    pub(crate) fn allowed(
        session: &'a str,
        method: &'a str,
        host: &'a str,
        port: u16,
        reason: &'a str,
    ) -> Entry<'a> {
        Entry {
            kind: log::Decision::Allow,
            session,
            method,
            host,
            port,
            status: 200,
            reason,
            hint: "",
            allow: None,
            path: None,
            learned: false,
        }
    }

    /// Refused with `status`.
    pub(crate) fn denied(
        session: &'a str,
        method: &'a str,
        host: &'a str,
        port: u16,
        status: u16,
        reason: &'a str,
    ) -> Entry<'a> {
        Entry { kind: log::Decision::Deny, status, ..Entry::allowed(session, method, host, port, reason) }
    }
}

#[cfg(test)]
impl State {
    /// A gate's state for a unit test: a listener it never serves, its log in `dir`.
    pub(crate) fn for_test(dir: &std::path::Path) -> State {
        let sock = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        State::new(0, OwnedFd::from(sock), Log::open(&dir.join("gate.log")).unwrap())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::budget::host_line;

    #[test]
    fn a_period_opens_the_projects_counts_shared_by_its_sessions_or_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let st = State::for_test(dir.path());
        let file = dir.path().join("p").join("budgets.json");
        let daily = SessionPolicy {
            budgets: vec![host_line("a.test 1k/day")],
            budget_counts: Some(file.clone()),
            ..SessionPolicy::default()
        };
        let new = |p: &SessionPolicy| Session::new("s".into(), "/p".into(), "t".into(), p.clone());
        let (one, two) = (new(&daily), new(&daily));
        st.open_counts(&one, &daily).unwrap();
        st.open_counts(&two, &daily).unwrap();
        assert!(Arc::ptr_eq(&one.counts().unwrap(), &two.counts().unwrap()), "one count per project");
        assert_eq!(one.allowance(&daily, "a.test").unwrap().take(600), 600);
        assert_eq!(
            two.allowance(&daily, "a.test").unwrap().take(600),
            424,
            "the other session's bytes count"
        );
        // No period: nothing opened. A period without a file (an older launcher's): refused.
        let plain = SessionPolicy { budgets: vec![host_line("a.test 1k")], ..SessionPolicy::default() };
        let three = new(&plain);
        st.open_counts(&three, &plain).unwrap();
        assert!(three.counts().is_none());
        let nameless = SessionPolicy { budget_counts: None, ..daily.clone() };
        let e = st.open_counts(&three, &nameless).unwrap_err();
        assert!(e.contains("named none") && e.contains("start the sandbox again"), "{e}");
        // A live change to a period opens them then.
        st.open_counts(&three, &daily).unwrap();
        assert!(Arc::ptr_eq(&three.counts().unwrap(), &one.counts().unwrap()));
        // A file that does not read refuses the session.
        let bad = dir.path().join("q").join("budgets.json");
        std::fs::create_dir_all(bad.parent().unwrap()).unwrap();
        std::fs::write(&bad, "nope").unwrap();
        let e = st.open_counts(&new(&daily), &SessionPolicy { budget_counts: Some(bad), ..daily.clone() });
        assert!(e.unwrap_err().contains("do not read"));
    }

    #[test]
    fn mcp_calls_are_counted_by_host_and_tool_and_the_names_kept_are_bounded() {
        let t = McpTally::default();
        t.add("a.test", "search", true);
        t.add("a.test", "search", true);
        t.add("a.test", "search", false);
        t.add("b.test", "search", false);
        let u = t.uses();
        assert_eq!(u.len(), 2);
        assert_eq!(
            (u[0].host.as_str(), u[0].tool.as_str(), u[0].allowed, u[0].refused),
            ("a.test", "search", 2, 1)
        );
        assert_eq!((u[1].host.as_str(), u[1].allowed, u[1].refused), ("b.test", 0, 1));
        assert_eq!(u[0].line(), "mcp a.test search: allowed 2, refused 1");
        // Two names kept: this fills it.
        for i in 2..McpTally::TOOLS_MOST {
            t.add("c.test", &format!("t{i}"), false);
        }
        // Full: a name already kept is still counted as itself; a new one under OTHERS.
        t.add("a.test", "search", true);
        t.add("c.test", "new", true);
        t.add("c.test", "newer", false);
        let u = t.uses();
        assert_eq!(u.len(), McpTally::TOOLS_MOST + 1);
        assert_eq!(u.iter().find(|m| m.tool == "search" && m.host == "a.test").unwrap().allowed, 3);
        let others = u.iter().find(|m| m.tool == McpTally::OTHERS).unwrap();
        assert_eq!((others.host.as_str(), others.allowed, others.refused), ("c.test", 1, 1));
        assert!(!u.iter().any(|m| m.tool.starts_with("new")));
    }

    #[test]
    fn a_sessions_held_mcp_bytes_are_bounded_together_and_given_back() {
        let s = Arc::new(Session::new("s".into(), "/p".into(), "t".into(), SessionPolicy::default()));
        let other = Arc::new(Session::new("o".into(), "/p".into(), "t".into(), SessionPolicy::default()));
        let mut a = McpHeld::new(&s);
        let mut b = McpHeld::new(&s);
        a.set(McpHeld::MOST - 10).unwrap();
        b.set(10).unwrap();
        let e = b.set(11).unwrap_err();
        assert!(e.contains("64 MiB"), "{e}");
        assert_eq!(s.mcp_held.load(Ordering::Relaxed), McpHeld::MOST, "a refusal takes nothing");
        // Another session's are its own.
        McpHeld::new(&other).set(McpHeld::MOST).unwrap();
        // Less, then dropped: given back.
        a.set(5).unwrap();
        b.set(McpHeld::MOST - 5).unwrap();
        assert!(McpHeld::new(&s).set(1).is_err());
        drop(a);
        assert_eq!(s.mcp_held.load(Ordering::Relaxed), McpHeld::MOST - 5);
        drop(b);
        assert_eq!(s.mcp_held.load(Ordering::Relaxed), 0);
        McpHeld::new(&s).set(McpHeld::MOST).unwrap();
    }
}
