//! What the user is told about refusals while a sandbox runs and when it ends (pure; the
//! launcher feeds it the session's lines of the gate's decision log, and what the rules recorded
//! of direct connections they refused, read from the sandbox's `refused_*` sets).
//!
//! Why: most clients never show the gate's 403 body (curl prints "CONNECT tunnel failed", an
//! agent retries "Reconnecting…" forever), so a refusal would otherwise be invisible to the
//! person who can fix it. The first refusal of each destination is said at once, on the
//! launcher's stderr, with the config line that would allow it; later ones are only counted,
//! so a retry loop cannot flood the terminal; the counts are said once more when the sandbox
//! ends.

use crate::gate::log::Event;

/// Refusals of one session, per destination, in the order first seen.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    session: String,
    seen: Vec<Refused>,
    /// The hosts a learning run relayed (`ai-sandbox learn`), each said once when first seen.
    learned: Vec<String>,
    /// `containers = on`: a refused image registry is also answered with `image share`.
    containers: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Refused {
    host: String,
    port: u16,
    /// `METHOD /path` of a request the gate read (a host with rules or a bound secret).
    request: Option<String>,
    /// How many times; `None` for a direct connection (the rules record that, not how often).
    count: Option<u64>,
    first: String,
    fix: String,
    /// The gate could not reach an allowed destination (a 5xx), rather than refusing it.
    unreachable: bool,
}

impl Refused {
    /// `host:port`, and the request when the gate read it (`api.test:443 POST /x`).
    fn dest(&self) -> String {
        match &self.request {
            Some(r) => format!("{}:{} {r}", self.host, self.port),
            None => format!("{}:{}", self.host, self.port),
        }
    }
}

/// A container image registry an inner engine pulls from: the well-known public ones, and any
/// host whose first label is `registry` (as most private registries are named). A guess used
/// only for a hint; nothing is decided by it.
fn is_registry(host: &str) -> bool {
    const KNOWN: [&str; 9] = [
        "registry-1.docker.io",
        "auth.docker.io",
        "production.cloudflare.docker.com",
        "quay.io",
        "ghcr.io",
        "gcr.io",
        "mcr.microsoft.com",
        "public.ecr.aws",
        "docker.io",
    ];
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    KNOWN.contains(&host.as_str())
        || host.ends_with(".gcr.io")
        || host.ends_with(".pkg.dev")
        || host.starts_with("registry.")
}

/// `HH:MM:SS` of an RFC 3339 time, else the time as given.
fn clock(time: &str) -> &str {
    time.get(11..19).unwrap_or(time)
}

impl Tally {
    pub(crate) fn new(session: &str) -> Tally {
        Tally { session: session.to_string(), ..Tally::default() }
    }

    /// For a session with `containers = on`: an inner engine's pull refused at a registry is
    /// told about `ai-sandbox image share` too (the inner client itself shows only "connection
    /// refused" or the like, never the gate's answer).
    pub(crate) fn with_containers(mut self, on: bool) -> Tally {
        self.containers = on;
        self
    }

    /// Takes one decision; returns the line to say now when it is this session's first refusal
    /// of its destination.
    pub(crate) fn observe(&mut self, e: &Event) -> Option<String> {
        if e.session == self.session && e.learned {
            if self.learned.contains(&e.host) {
                return None;
            }
            self.learned.push(e.host.clone());
            return Some(format!(
                "learned {}:{} (relayed: not in the allowlist, and this is a learning run)",
                e.host, e.port
            ));
        }
        // The rules' refusals this launcher handed to the gate come back in its log: they were
        // taken first-hand (`observe_direct`).
        if e.session != self.session || !e.decision.refused() || e.layer == crate::gate::log::Layer::Rules {
            return None;
        }
        let request = e.path.as_ref().map(|p| format!("{} {p}", e.method));
        if let Some(r) = self
            .seen
            .iter_mut()
            .find(|r| r.host == e.host && r.port == e.port && r.request == request && r.count.is_some())
        {
            r.count = r.count.map(|c| c + 1);
            return None;
        }
        let unreachable = e.status >= 500;
        let mut fix = e.fix_or_reason().to_string();
        if self.containers && !unreachable && is_registry(&e.host) {
            fix.push_str("; or, for an image you have on this machine: ai-sandbox image share IMAGE");
        }
        let r = Refused {
            host: e.host.clone(),
            port: e.port,
            request,
            count: Some(1),
            first: e.time.clone(),
            fix,
            unreachable,
        };
        // A 502 is the gate failing to reach an allowed host (a name that does not resolve, a
        // server that is down): not a refusal, and not fixed by an allow line.
        let line = match r.unreachable {
            true => format!(
                "could not reach {} ({}); later failures of it are counted, not shown",
                r.dest(),
                r.fix
            ),
            false => format!("refused {} ({}); later refusals of it are counted, not shown", r.dest(), r.fix),
        };
        self.seen.push(r);
        Some(line)
    }

    /// Takes one direct connection the rules refused (seen at `time`); returns the line to say
    /// now when it is new.
    pub(crate) fn observe_direct(
        &mut self,
        d: &crate::live::Direct,
        time: &str,
        config_path: &str,
    ) -> Option<String> {
        let host = d.host();
        let host = if d.proto == crate::live::Proto::Tcp { host } else { format!("{host} ({})", d.proto) };
        if self.seen.iter().any(|r| r.host == host && r.port == d.port && r.count.is_none()) {
            return None;
        }
        let r = Refused {
            host,
            port: d.port,
            request: None,
            count: None,
            first: time.to_string(),
            fix: d.fix(config_path),
            unreachable: false,
        };
        let line = format!("refused a direct connection to {}:{} ({})", r.host, r.port, r.fix);
        self.seen.push(r);
        Some(line)
    }

    /// The lines to say when the sandbox ends: nothing when nothing was refused.
    pub(crate) fn summary(&self) -> Vec<String> {
        if self.seen.is_empty() {
            return Vec::new();
        }
        let mut out = vec!["refused during this run (all decisions: ai-sandbox gate logs):".to_string()];
        let dest = Refused::dest;
        let width = self.seen.iter().map(|r| dest(r).len()).max().unwrap_or(0);
        for r in &self.seen {
            let times = match r.count {
                Some(1) => "once".to_string(),
                Some(n) => format!("{n} times"),
                None => "directly".to_string(),
            };
            let what = if r.unreachable { " (could not reach it)" } else { "" };
            out.push(format!("  {:<width$} {times}{what}, first at {}: {}", dest(r), clock(&r.first), r.fix));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::log::Decision;

    #[test]
    fn a_host_the_gate_could_not_reach_is_not_called_refused() {
        let mut t = Tally::new("s1");
        let mut e = ev("s1", "nosuch.test", 443, Decision::Deny, "2026-12-02T10:00:00Z");
        e.status = 502;
        e.reason = "nosuch.test does not resolve".into();
        e.allow = None;
        e.hint = String::new();
        let line = t.observe(&e).unwrap();
        assert!(line.starts_with("could not reach nosuch.test:443 (nosuch.test does not resolve)"), "{line}");
        assert!(t.summary()[1].contains("once (could not reach it)"), "{:?}", t.summary());
    }

    #[test]
    fn a_learning_runs_host_is_said_once_and_is_no_refusal() {
        let mut t = Tally::new("s1");
        let learned =
            Event { learned: true, ..ev("s1", "a.learn.test", 443, Decision::Allow, "2026-12-02T10:00:00Z") };
        let line = t.observe(&learned).unwrap();
        assert!(line.starts_with("learned a.learn.test:443 (relayed"), "{line}");
        assert_eq!(t.observe(&learned), None, "said once");
        // Another session's, and a plain allowed one: nothing.
        assert_eq!(t.observe(&Event { session: "s2".into(), ..learned.clone() }), None);
        assert_eq!(t.observe(&ev("s1", "b.test", 443, Decision::Allow, "2026-12-02T10:00:01Z")), None);
        assert!(t.summary().is_empty(), "learned hosts are not refusals");
    }

    fn ev(session: &str, host: &str, port: u16, decision: Decision, time: &str) -> Event {
        Event {
            time: time.into(),
            session: session.into(),
            project: "/p".into(),
            method: "CONNECT".into(),
            host: host.into(),
            port,
            decision,
            status: if decision == Decision::Deny { 403 } else { 200 },
            reason: format!("{host}:{port} is not in the allowlist"),
            hint: if decision == Decision::Deny {
                format!("blocked by ai-sandbox: add \"allow = {host}\" to /p/.ai-sandbox/config")
            } else {
                String::new()
            },
            allow: (decision == Decision::Deny).then(|| host.to_string()),
            path: None,
            layer: crate::gate::log::Layer::Gate,
            learned: false,
        }
    }

    #[test]
    fn the_first_refusal_of_a_destination_is_said_with_its_fix_and_the_rest_counted() {
        let mut t = Tally::new("s1");
        let first = t.observe(&ev("s1", "chatgpt.com", 443, Decision::Deny, "2026-11-29T15:34:19Z"));
        assert_eq!(
            first.as_deref(),
            Some(
                "refused chatgpt.com:443 (add \"allow = chatgpt.com\" to /p/.ai-sandbox/config); later refusals of it are counted, not shown"
            )
        );
        for _ in 0..11 {
            assert_eq!(
                t.observe(&ev("s1", "chatgpt.com", 443, Decision::Deny, "2026-11-29T15:34:20Z")),
                None
            );
        }
        assert!(
            t.observe(&ev("s1", "ab.chatgpt.com", 443, Decision::Deny, "2026-11-29T15:34:25Z")).is_some()
        );
        assert_eq!(
            t.summary(),
            [
                "refused during this run (all decisions: ai-sandbox gate logs):",
                "  chatgpt.com:443    12 times, first at 15:34:19: add \"allow = chatgpt.com\" to /p/.ai-sandbox/config",
                "  ab.chatgpt.com:443 once, first at 15:34:25: add \"allow = ab.chatgpt.com\" to /p/.ai-sandbox/config",
            ]
        );
    }

    #[test]
    fn other_sessions_allows_and_challenges_are_not_refusals_of_this_run() {
        let mut t = Tally::new("s1");
        assert_eq!(t.observe(&ev("s2", "x.test", 443, Decision::Deny, "t")), None);
        assert_eq!(t.observe(&ev("s1", "x.test", 443, Decision::Allow, "t")), None);
        assert_eq!(t.observe(&ev("s1", "x.test", 443, Decision::Challenge, "t")), None);
        assert!(t.summary().is_empty());
    }

    #[test]
    fn direct_refusals_are_said_once_and_summed_up_beside_the_gates() {
        let mut t = Tally::new("s1");
        let d = crate::live::Direct {
            proto: crate::live::Proto::Tcp,
            addr: "198.51.100.6".parse().unwrap(),
            port: 7000,
            denied_by: None,
            over_budget: None,
        };
        let line = t.observe_direct(&d, "2026-11-29T16:30:01Z", "/p/c").unwrap();
        assert_eq!(
            line,
            "refused a direct connection to 198.51.100.6:7000 (add \"allow = 198.51.100.6:7000\" to /p/c)"
        );
        assert_eq!(t.observe_direct(&d, "later", "/p/c"), None, "said once");
        // Handed to the gate, it comes back through the gate's log: not a second refusal.
        let logged = crate::contract::log::Event::direct(&d, "s1", "/p", "/p/c", "later".into());
        assert_eq!(t.observe(&logged), None, "taken first-hand already");
        let u = crate::live::Direct {
            proto: crate::live::Proto::Udp,
            addr: "fd00::1".parse().unwrap(),
            port: 9,
            denied_by: None,
            over_budget: None,
        };
        assert!(t.observe_direct(&u, "2026-11-29T16:30:02Z", "/p/c").unwrap().contains("[fd00::1] (udp):9"));
        assert_eq!(
            t.summary()[1],
            "  198.51.100.6:7000 directly, first at 16:30:01: add \"allow = 198.51.100.6:7000\" to /p/c"
        );
    }

    #[test]
    fn a_refused_registry_is_answered_with_image_share_when_containers_are_on() {
        let share = "; or, for an image you have on this machine: ai-sandbox image share IMAGE";
        let mut on = Tally::new("s1").with_containers(true);
        let line = on.observe(&ev("s1", "registry-1.docker.io", 443, Decision::Deny, "t")).unwrap();
        assert!(line.contains(&format!("to /p/.ai-sandbox/config{share})")), "{line}");
        let own = on.observe(&ev("s1", "Registry.Example.test.", 443, Decision::Deny, "t")).unwrap();
        assert!(own.contains(share), "{own}");
        // Control: another host, the same session: the plain fix.
        let other = on.observe(&ev("s1", "pypi.org", 443, Decision::Deny, "t")).unwrap();
        assert!(!other.contains("image share"), "{other}");
        // Without containers = on there is no inner engine to share an image with.
        let mut off = Tally::new("s1");
        let line = off.observe(&ev("s1", "registry-1.docker.io", 443, Decision::Deny, "t")).unwrap();
        assert!(!line.contains("image share"), "{line}");
    }

    #[test]
    fn a_refusal_without_a_hint_shows_its_reason() {
        let mut t = Tally::new("s1");
        let mut e = ev("s1", "a.test", 443, Decision::Deny, "t");
        e.hint.clear();
        e.reason = "TLS server name b.test does not match a.test".into();
        assert!(t.observe(&e).unwrap().contains("(TLS server name b.test does not match a.test)"));
    }
}
