//! What a session has sent to each budgeted host: the gate's side of `budget =` lines
//! (`policy::budget` reads them and says which line a host falls under). Every path that
//! carries the sandbox's bytes to a host takes them from the host's allowance before they go:
//! a tunnel's relay (every byte after the CONNECT, TLS included), a forwarded request (head and
//! body), a terminated request (target, headers and body) and a WebSocket's client side. What
//! the allowance does not cover is not sent: the connection or request is cut there and the
//! refusal logged, so the host never receives a byte past the budget (docs/adr/0066).

use super::decide::Denial;
use crate::contract::session::BudgetUse;
use crate::policy::budget::{self, Budget};
use crate::policy::limits::show_size;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A session's counts, one per budget key (`budget::of`): they outlive a change of the lines'
/// sizes, so raising a budget lets more through without forgetting what was sent.
#[derive(Default)]
pub(crate) struct Spent(Mutex<HashMap<String, Arc<AtomicU64>>>);

impl Spent {
    /// The allowance for `host` under `budgets`, or `None` when no line covers it.
    pub(crate) fn allowance(&self, budgets: &[Budget], host: &str) -> Option<Allowance> {
        let (b, key) = budget::of(budgets, host)?;
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let used = counts.entry(key.clone()).or_default().clone();
        Some(Allowance { limit: b.bytes, used, host: host.to_string(), line: b.to_string() })
    }

    /// Each count so far: (key, bytes), sorted by key.
    pub(crate) fn counts(&self) -> Vec<(String, u64)> {
        let counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, u64)> =
            counts.iter().map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed))).collect();
        out.sort();
        out
    }

    /// Each count against the budget its line gives now (`gate status`, `ps`).
    pub(crate) fn uses(&self, budgets: &[Budget]) -> Vec<BudgetUse> {
        self.counts()
            .into_iter()
            .filter_map(|(key, sent)| {
                let host = key.strip_prefix("* ").unwrap_or(&key);
                // A wildcard's key is the pattern: a name under it finds the same line.
                let probe = host.strip_prefix("*.").map_or(host.to_string(), |s| format!("x.{s}"));
                let (b, _) = budget::of(budgets, &probe)?;
                Some(BudgetUse { key, sent, budget: b.bytes })
            })
            .collect()
    }
}

/// What one host may still be sent, shared by every connection to it.
#[derive(Clone)]
pub(crate) struct Allowance {
    limit: u64,
    used: Arc<AtomicU64>,
    host: String,
    /// The line it falls under, as the config would write it.
    line: String,
}

impl Allowance {
    /// How many of `n` bytes may go now: taken from what is left (all of `n`, part, or 0).
    pub(crate) fn take(&self, n: u64) -> u64 {
        let mut got = 0;
        let _ = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            got = n.min(self.limit.saturating_sub(used));
            Some(used + got)
        });
        got
    }

    /// All of `n` bytes, or none of them (a request whose length is known goes whole or not at all).
    pub(crate) fn take_all(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (self.limit.saturating_sub(used) >= n).then_some(used + n)
            })
            .is_ok()
    }

    /// Bytes taken but not sent (a splice that moved less than it asked for).
    pub(crate) fn give_back(&self, n: u64) {
        let _ =
            self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| Some(used.saturating_sub(n)));
    }

    pub(crate) fn left(&self) -> u64 {
        self.limit.saturating_sub(self.used.load(Ordering::Acquire))
    }

    /// The refusal of what would go past the budget: the reason for the log, the hint with the
    /// line to raise it.
    pub(crate) fn denial(&self, config_path: &str) -> Denial {
        let used = self.used.load(Ordering::Acquire);
        let host = &self.host;
        // The line it falls under, raised; for the default (`*`), a line of the host's own.
        let pattern = self.line.split_once(' ').map_or("*", |(p, _)| p);
        let named = if pattern == "*" { host.as_str() } else { pattern };
        let raised = budget::raised(named, self.limit);
        Denial {
            status: 403,
            reason: format!(
                "over budget: {host} was sent {} of {} (budget = {}); the rest was not sent",
                show_size(used),
                show_size(self.limit),
                self.line
            ),
            hint: format!(
                "blocked by ai-sandbox: {host} has had its budget of {} from this session; to send more: ai-sandbox allow '{raised}' (the running sandbox, and {config_path})",
                show_size(self.limit)
            ),
            // A watcher may be asked (`ask = SECONDS`), and offered the raised line.
            allow: Some(raised),
            askable: true,
            ..Denial::default()
        }
    }
}

/// The error a relay ends with when the budget cut it (`is_over` tells it apart).
#[derive(Debug)]
pub(crate) struct OverBudget;

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("over budget")
    }
}

impl std::error::Error for OverBudget {}

pub(crate) fn over() -> std::io::Error {
    std::io::Error::other(OverBudget)
}

pub(crate) fn is_over(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<OverBudget>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(ls: &[&str]) -> Vec<Budget> {
        ls.iter().map(|l| budget::host_line(l)).collect()
    }

    #[test]
    fn an_allowance_gives_what_is_left_and_never_more() {
        let spent = Spent::default();
        let b = lines(&["up.test 1000", "* 10"]);
        let a = spent.allowance(&b, "up.test").unwrap();
        assert_eq!(a.take(600), 600);
        assert_eq!(a.take(600), 400, "part: what is left");
        assert_eq!(a.take(1), 0);
        a.give_back(100);
        assert_eq!(a.left(), 100);
        assert!(!a.take_all(101), "all or nothing");
        assert_eq!(a.left(), 100, "a refused take_all takes nothing");
        assert!(a.take_all(100));
        assert_eq!(a.left(), 0);
        // Another connection to the same host shares the count; another host has its own.
        assert_eq!(spent.allowance(&b, "up.test").unwrap().left(), 0);
        let other = spent.allowance(&b, "other.test").unwrap();
        assert_eq!(other.take(20), 10, "the default line, per host");
        assert_eq!(spent.allowance(&b, "third.test").unwrap().left(), 10);
        assert!(spent.allowance(&lines(&["up.test 1k"]), "other.test").is_none(), "no line: not counted");
        assert_eq!(
            spent.counts(),
            [("* other.test".to_string(), 10), ("* third.test".into(), 0), ("up.test".into(), 1000)]
        );
        // A raised budget keeps what was sent.
        let raised = spent.allowance(&lines(&["up.test 1500"]), "up.test").unwrap();
        assert_eq!(raised.left(), 500);
        let now = lines(&["up.test 1500", "* 10"]);
        let uses: Vec<(String, u64, u64)> =
            spent.uses(&now).into_iter().map(|u| (u.key, u.sent, u.budget)).collect();
        assert_eq!(
            uses,
            [
                ("* other.test".to_string(), 10, 10),
                ("* third.test".into(), 0, 10),
                ("up.test".into(), 1000, 1500)
            ]
        );
        let wild = Spent::default();
        wild.allowance(&lines(&["*.w.test 5"]), "a.w.test").unwrap().take(3);
        assert_eq!(
            wild.uses(&lines(&["*.w.test 5"])),
            [BudgetUse { key: "*.w.test".into(), sent: 3, budget: 5 }]
        );
    }

    #[test]
    fn a_refusal_says_what_was_sent_of_what_and_the_line_to_raise() {
        let spent = Spent::default();
        let a = spent.allowance(&lines(&["*.up.test 1m"]), "a.up.test").unwrap();
        a.take(2 << 20);
        let d = a.denial(".ai-sandbox/config");
        assert_eq!(d.status, 403);
        assert!(d.reason.contains("a.up.test was sent 1m of 1m (budget = *.up.test 1m)"), "{}", d.reason);
        assert!(d.hint.contains("ai-sandbox allow 'budget = *.up.test 2m'"), "{}", d.hint);
        assert!(d.hint.contains(".ai-sandbox/config"), "{}", d.hint);
        assert_eq!(d.allow.as_deref(), Some("budget = *.up.test 2m"), "what a watcher's answer adds");
        assert!(d.askable);
        let all = spent.allowance(&lines(&["* 1k"]), "b.test").unwrap();
        assert!(all.denial("c").hint.contains("'budget = b.test 2k'"), "{}", all.denial("c").hint);
        assert!(is_over(&over()));
        assert_eq!(over().to_string(), "over budget", "what a cut relay's error says");
        assert!(!is_over(&std::io::Error::other("else")));
    }
}
