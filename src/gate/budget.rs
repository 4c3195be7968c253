//! What a session has sent to each budgeted host: the gate's side of `budget =` lines
//! (`policy::budget` reads them and says which line a host falls under). Every path that
//! carries the sandbox's bytes to a host takes them from the host's allowance before they go:
//! a tunnel's relay (every byte after the CONNECT, TLS included), a forwarded request (head and
//! body), a terminated request (target, headers and body) and a WebSocket's client side. What
//! the allowance does not cover is not sent: the connection or request is cut there and the
//! refusal logged, so the host never receives a byte past the budget (docs/adr/0066).

use super::decide::Denial;
use super::periods::Counts;
use crate::contract::session::BudgetUse;
use crate::policy::budget::{self, Budget, Period};
use crate::policy::limits::show_size;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A session's counts, one per budget key (`budget::of`): they outlive a change of the lines'
/// sizes, so raising a budget lets more through without forgetting what was sent. A line with a
/// period is counted in the project's counts (`periods`), not here; its keys are kept here for
/// `uses`.
#[derive(Default)]
pub(crate) struct Spent {
    session: Mutex<HashMap<String, Arc<AtomicU64>>>,
    periodic: Mutex<BTreeSet<String>>,
}

impl Spent {
    /// The allowance for `host` under `budgets`, or `None` when no line covers it. A line with
    /// a period takes from the project's count in `periods` (`None` there: registration let a
    /// period through without its counts, and nothing is allowed).
    pub(crate) fn allowance(
        &self,
        budgets: &[Budget],
        host: &str,
        periods: Option<&Counts>,
        now: u64,
    ) -> Option<Allowance> {
        let (b, key) = budget::of(budgets, host)?;
        let used = match (b.period, periods) {
            (None, _) => {
                self.session.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default().clone()
            }
            (Some(p), Some(c)) => {
                let used = c.count(&key, p, now);
                self.periodic.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
                used
            }
            (Some(_), None) => Arc::new(AtomicU64::new(u64::MAX)),
        };
        let period = b.period.map(|p| (p, p.window(now)));
        Some(Allowance { limit: b.bytes, used, host: host.to_string(), line: b.to_string(), period })
    }

    /// Each count against the budget its line gives now (`gate status`, `ps`), sorted by key:
    /// a line with a period shows the project's count in the window of `now`.
    pub(crate) fn uses(&self, budgets: &[Budget], periods: Option<&Counts>, now: u64) -> Vec<BudgetUse> {
        let session: Vec<(String, u64)> = {
            let m = self.session.lock().unwrap_or_else(|e| e.into_inner());
            m.iter().map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed))).collect()
        };
        let mut keys: BTreeSet<String> = self.periodic.lock().unwrap_or_else(|e| e.into_inner()).clone();
        keys.extend(session.iter().map(|(k, _)| k.clone()));
        keys.into_iter()
            .filter_map(|key| {
                let host = key.strip_prefix("* ").unwrap_or(&key);
                // A wildcard's key is the pattern: a name under it finds the same line.
                let probe = host.strip_prefix("*.").map_or(host.to_string(), |s| format!("x.{s}"));
                let (b, _) = budget::of(budgets, &probe)?;
                let sent = match (b.period, periods) {
                    (Some(p), Some(c)) => c.count(&key, p, now).load(Ordering::Relaxed),
                    (Some(_), None) => return None,
                    (None, _) => session.iter().find(|(k, _)| *k == key).map_or(0, |(_, n)| *n),
                };
                Some(BudgetUse { key, sent, budget: b.bytes, period: b.period })
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
    /// A line with a period: the window counted in.
    period: Option<(Period, u64)>,
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
        self.refusal(config_path, None)
    }

    /// The refusal of a request of `wanted` bytes (its length known beforehand): when the budget
    /// is not spent, said as what it is (more than what is left), with a raise that lets that
    /// request through; when it is spent, as `denial`.
    pub(crate) fn denial_of(&self, config_path: &str, wanted: u64) -> Denial {
        self.refusal(config_path, Some(wanted))
    }

    fn refusal(&self, config_path: &str, wanted: Option<u64>) -> Denial {
        let used = self.used.load(Ordering::Acquire);
        let left = self.limit.saturating_sub(used);
        let wanted = wanted.filter(|w| left > 0 && *w > left);
        let host = &self.host;
        // The line it falls under, raised (twice the size, or enough for the request that did
        // not fit); for the default (`*`), a line of the host's own.
        let pattern = self.line.split_once(' ').map_or("*", |(p, _)| p);
        let named = if pattern == "*" { host.as_str() } else { pattern };
        let need = wanted.map_or(0, |w| budget::round_up(used.saturating_add(w)));
        let raised =
            budget::raised_to(named, self.limit.saturating_mul(2).max(need), self.period.map(|(p, _)| p));
        let (when, whose) = match self.period {
            None => (String::new(), "from this session".to_string()),
            Some((p, w)) => (
                format!(" {}", p.this()),
                format!(
                    "{} from the project's sessions (it counts anew at {})",
                    p.this(),
                    super::log::rfc3339(p.end(w))
                ),
            ),
        };
        let size = show_size(self.limit);
        let (reason, hint) = match wanted {
            Some(w) => (
                format!(
                    "over budget: a request of {} to {host} is more than the {} left of {size}{when} ({} sent; budget = {}); not sent",
                    show_size(w),
                    show_size(left),
                    show_size(used),
                    self.line
                ),
                format!(
                    "blocked by ai-sandbox: this request sends {} to {host}, more than the {} left of its budget of {size} ({} sent {whose}); to send it: ai-sandbox allow '{raised}' (the running sandbox, and {config_path})",
                    show_size(w),
                    show_size(left),
                    show_size(used)
                ),
            ),
            None => (
                format!(
                    "over budget: {host} was sent {} of {size}{when} (budget = {}); the rest was not sent",
                    show_size(used),
                    self.line
                ),
                format!(
                    "blocked by ai-sandbox: {host} has had its budget of {size} {whose}; to send more: ai-sandbox allow '{raised}' (the running sandbox, and {config_path})"
                ),
            ),
        };
        Denial {
            status: 403,
            reason,
            hint,
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
        let a = spent.allowance(&b, "up.test", None, 0).unwrap();
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
        assert_eq!(spent.allowance(&b, "up.test", None, 0).unwrap().left(), 0);
        let other = spent.allowance(&b, "other.test", None, 0).unwrap();
        assert_eq!(other.take(20), 10, "the default line, per host");
        assert_eq!(spent.allowance(&b, "third.test", None, 0).unwrap().left(), 10);
        assert!(
            spent.allowance(&lines(&["up.test 1k"]), "other.test", None, 0).is_none(),
            "no line: not counted"
        );
        let all = lines(&["up.test 1k", "* 10"]);
        let counted: Vec<(String, u64)> =
            spent.uses(&all, None, 0).into_iter().map(|u| (u.key, u.sent)).collect();
        assert_eq!(
            counted,
            [("* other.test".to_string(), 10), ("* third.test".into(), 0), ("up.test".into(), 1000)]
        );
        // A raised budget keeps what was sent.
        let raised = spent.allowance(&lines(&["up.test 1500"]), "up.test", None, 0).unwrap();
        assert_eq!(raised.left(), 500);
        let now = lines(&["up.test 1500", "* 10"]);
        let uses: Vec<(String, u64, u64)> =
            spent.uses(&now, None, 0).into_iter().map(|u| (u.key, u.sent, u.budget)).collect();
        assert_eq!(
            uses,
            [
                ("* other.test".to_string(), 10, 10),
                ("* third.test".into(), 0, 10),
                ("up.test".into(), 1000, 1500)
            ]
        );
        let wild = Spent::default();
        wild.allowance(&lines(&["*.w.test 5"]), "a.w.test", None, 0).unwrap().take(3);
        assert_eq!(
            wild.uses(&lines(&["*.w.test 5"]), None, 0),
            [BudgetUse { key: "*.w.test".into(), sent: 3, budget: 5, period: None }]
        );
    }

    #[test]
    fn a_refusal_says_what_was_sent_of_what_and_the_line_to_raise() {
        let spent = Spent::default();
        let a = spent.allowance(&lines(&["*.up.test 1m"]), "a.up.test", None, 0).unwrap();
        a.take(2 << 20);
        let d = a.denial(".ai-sandbox/config");
        assert_eq!(d.status, 403);
        assert!(d.reason.contains("a.up.test was sent 1m of 1m (budget = *.up.test 1m)"), "{}", d.reason);
        assert!(d.hint.contains("ai-sandbox allow 'budget = *.up.test 2m'"), "{}", d.hint);
        assert!(d.hint.contains(".ai-sandbox/config"), "{}", d.hint);
        assert_eq!(d.allow.as_deref(), Some("budget = *.up.test 2m"), "what a watcher's answer adds");
        assert!(d.askable);
        let all = spent.allowance(&lines(&["* 1k"]), "b.test", None, 0).unwrap();
        assert!(all.denial("c").hint.contains("'budget = b.test 2k'"), "{}", all.denial("c").hint);
        // A request whose length is known and more than what is left (not a spent budget):
        // said as such, with a raise that lets that request through.
        let b = spent.allowance(&lines(&["c.test 100k"]), "c.test", None, 0).unwrap();
        b.take(60_000);
        let d = b.denial_of("cfg", 200_000);
        assert!(
            d.hint.contains("this request sends 200000 to c.test, more than the 42400 left of its budget of 100k (60000 sent from this session)"),
            "{}",
            d.hint
        );
        assert!(
            d.hint.contains("'budget = c.test 254k'"),
            "enough for what was sent and this request: {}",
            d.hint
        );
        assert!(
            d.reason.contains("a request of 200000 to c.test is more than the 42400 left"),
            "{}",
            d.reason
        );
        assert!(b.denial_of("cfg", 1000).hint.contains("has had its budget"), "it fits: the plain refusal");
        assert!(b.denial_of("cfg", 42_400).hint.contains("has had its budget"), "exactly what is left fits");
        assert!(
            b.denial_of("cfg", 42_401).hint.contains("more than the 42400 left"),
            "one byte more does not"
        );
        assert!(
            b.denial_of("cfg", 50_000).hint.contains("'budget = c.test 200k'"),
            "twice, when that covers it"
        );
        b.take(1 << 20);
        assert!(b.denial_of("cfg", 200_000).hint.contains("has had its budget of 100k"), "spent: as before");
        assert_eq!(
            (crate::policy::budget::round_up(260_000), crate::policy::budget::round_up(1024)),
            (260_096, 1024)
        );
        assert_eq!(crate::policy::budget::round_up((1 << 20) + 1), 2 << 20);
        assert!(is_over(&over()));
        assert_eq!(over().to_string(), "over budget", "what a cut relay's error says");
        assert!(!is_over(&std::io::Error::other("else")));
    }

    #[test]
    fn a_line_with_a_period_takes_from_the_projects_count_shared_by_its_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let counts = crate::gate::periods::Periods::default();
        let c = counts.open(&dir.path().join("budgets.json")).unwrap();
        let b = lines(&["up.test 1000/day", "* 10"]);
        // 2026-12-03T10:20:00Z.
        let t = 1_796_293_200;
        let (one, two) = (Spent::default(), Spent::default());
        assert_eq!(one.allowance(&b, "up.test", Some(&c), t).unwrap().take(600), 600);
        let a = two.allowance(&b, "up.test", Some(&c), t).unwrap();
        assert_eq!(a.take(600), 400, "the other session's bytes count");
        assert_eq!(
            two.allowance(&b, "other.test", Some(&c), t).unwrap().take(20),
            10,
            "a line without: per session"
        );
        let uses: Vec<String> =
            two.uses(&b, Some(&c), t).iter().map(|u| format!("{} {}", u.key, u.against())).collect();
        assert_eq!(uses, ["* other.test 10 of 10 (100%)", "up.test 1000 of 1000 today (100%)"]);
        let d = a.denial(".ai-sandbox/config");
        assert!(
            d.reason.contains("up.test was sent 1000 of 1000 today (budget = up.test 1000/day)"),
            "{}",
            d.reason
        );
        assert!(
            d.hint.contains("today from the project's sessions (it counts anew at 2026-12-04T00:00:00Z)"),
            "{}",
            d.hint
        );
        assert_eq!(d.allow.as_deref(), Some("budget = up.test 2000/day"));
        // The next day counts from nothing.
        assert_eq!(one.allowance(&b, "up.test", Some(&c), t + 86400).unwrap().left(), 1000);
        // A period without the project's counts (never registered so): nothing goes.
        assert_eq!(one.allowance(&b, "up.test", None, t).unwrap().take(1), 0);
        assert!(one.uses(&b, None, t).iter().all(|u| u.period.is_none()), "not shown as counted");
    }
}
