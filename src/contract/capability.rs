//! What a session's policy requires of the gate that holds it, and what a gate says it enforces.
//!
//! A gate of an older version reads a policy with serde's defaults: a field it does not know is
//! dropped, and the session runs without the limit the user wrote (fail open by omission). So a
//! registration (and a live change) hears back the set of capabilities the gate enforces, and the
//! launcher refuses to start when the policy requires one the gate did not say (`missing`).
//!
//! `required` names every field of the policy and of its rules and budgets, without `..`: a new
//! field does not compile until it is classified there, as a capability or as something every
//! gate that speaks this protocol enforces (docs/adr/0083).

use super::session::SessionPolicy;
use crate::policy::allow::Allowlist;
use crate::policy::budget::Budget;
use crate::policy::rule::Rule;
use std::collections::BTreeSet;

/// One thing a gate must enforce of a policy for the policy to mean what it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// A learning run: an unlisted hostname is relayed and logged as learned.
    Learning,
    /// `rule =` lines: a ruled host's TLS is opened and only the requests they allow go. A gate
    /// that drops them tunnels the host blind, every request through (no CA is needed for that).
    Rules,
    /// A push rule limited by ref: each ref a push updates is checked.
    PushRefs,
    /// `budget =` lines: what the session sends to a host is counted and cut.
    Budgets,
    /// A budget over a period: counted across the project's sessions.
    Periods,
    /// An MCP rule's tools: each `tools/call` checked, each `tools/list` answer filtered.
    McpTools,
}

/// A set of capabilities (ordered, so that the first missing one is always the same).
pub type Capabilities = BTreeSet<Capability>;

impl Capability {
    /// Every capability this version knows: what its gate enforces.
    pub const ALL: [Capability; 6] = [
        Capability::Learning,
        Capability::Rules,
        Capability::PushRefs,
        Capability::Budgets,
        Capability::Periods,
        Capability::McpTools,
    ];

    /// Its name on the control socket (also the name of the flag the versions before the set
    /// wrote, see `contract::control::Reply`).
    pub fn name(self) -> &'static str {
        match self {
            Capability::Learning => "learning",
            Capability::Rules => "rules",
            Capability::PushRefs => "push_refs",
            Capability::Budgets => "budgets",
            Capability::Periods => "periods",
            Capability::McpTools => "mcp_tools",
        }
    }

    /// The capability of `name`; `None` for one of a newer version (enforcing more is no harm).
    pub fn from_name(name: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.name() == name)
    }

    /// What a gate that does not enforce it does, for the refusal's words.
    pub fn without(self) -> &'static str {
        match self {
            Capability::Learning => "cannot learn (it would refuse what a learning run records)",
            Capability::Rules => "does not read rules (it would let every request to a ruled host through)",
            Capability::PushRefs => {
                "does not limit a push by ref (it would let every push of such a rule through)"
            }
            Capability::Budgets => "does not count budgets (it would let everything through)",
            Capability::Periods => {
                "does not keep a budget's count over a period (it would give each session the budget anew)"
            }
            Capability::McpTools => {
                "does not read MCP tool calls (it would let every tool of such a rule be called and listed)"
            }
        }
    }
}

/// What `policy` requires of its gate. Every field is named: see the module doc.
pub fn required(policy: &SessionPolicy) -> Capabilities {
    let SessionPolicy {
        allow,
        // Which ports a host entry without one gets: every gate's.
        gate_ports: _,
        // `resolve =` pins: every gate's.
        resolve: _,
        // For hints only.
        config_path: _,
        // Never dialled: every gate's.
        gate_addr: _,
        // Holds a refusal for a watcher; a gate without it refuses at once (closed).
        ask: _,
        rules,
        learn,
        budgets,
        // Counted by the sandbox's own rules, not by the gate.
        net_budgets: _,
        // Where the period counts live: read with `budgets`' periods.
        budget_counts: _,
    } = policy;
    // Hosts, networks and their denials: every gate's (`deny =` came the day of the first gate).
    let Allowlist { hosts: _, nets: _, deny_hosts: _, deny_nets: _ } = allow;
    let mut need = Capabilities::new();
    if *learn {
        need.insert(Capability::Learning);
    }
    for rule in rules {
        // Method, path and query: every gate that says it reads rules.
        let Rule { host: _, method: _, path: _, query: _, line: _, refs, tools } = rule;
        need.insert(Capability::Rules);
        if !refs.is_empty() {
            need.insert(Capability::PushRefs);
        }
        if !tools.is_empty() {
            need.insert(Capability::McpTools);
        }
    }
    for budget in budgets {
        let Budget { host: _, bytes: _, period } = budget;
        need.insert(Capability::Budgets);
        if period.is_some() {
            need.insert(Capability::Periods);
        }
    }
    need
}

/// The first capability `policy` requires that `enforced` lacks, not counting those in `had`
/// (a live change: what the session required before was said at its registration).
pub fn missing(policy: &SessionPolicy, enforced: &Capabilities, had: &Capabilities) -> Option<Capability> {
    required(policy).into_iter().find(|c| !enforced.contains(c) && !had.contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::budget::host_line;

    fn with_rules(line: &str) -> SessionPolicy {
        SessionPolicy { rules: crate::policy::rule::parse(line).unwrap(), ..SessionPolicy::default() }
    }

    #[test]
    fn each_limit_of_a_policy_requires_its_capability_and_nothing_else_requires_one() {
        use Capability::*;
        let set = |c: &[Capability]| c.iter().copied().collect::<Capabilities>();
        assert_eq!(required(&SessionPolicy::default()), set(&[]));
        assert_eq!(required(&SessionPolicy { learn: true, ..SessionPolicy::default() }), set(&[Learning]));
        assert_eq!(required(&with_rules("g.test git-push /r.git refs/heads/a/*")), set(&[Rules, PushRefs]));
        assert_eq!(
            required(&with_rules("g.test git-push /r.git")),
            set(&[Rules]),
            "a push rule without refs"
        );
        assert_eq!(required(&with_rules("g.test GET /x")), set(&[Rules]));
        let plain = SessionPolicy { budgets: vec![host_line("a.test 1k")], ..SessionPolicy::default() };
        assert_eq!(required(&plain), set(&[Budgets]));
        let daily = SessionPolicy { budgets: vec![host_line("a.test 1k/day")], ..SessionPolicy::default() };
        assert_eq!(required(&daily), set(&[Budgets, Periods]));
    }

    #[test]
    fn names_travel_both_ways_and_a_newer_versions_name_is_not_an_error() {
        for c in Capability::ALL {
            assert_eq!(Capability::from_name(c.name()), Some(c));
            assert!(!c.without().is_empty());
        }
        assert_eq!(Capability::from_name("a_later_capability"), None);
    }

    #[test]
    fn what_is_missing_is_what_is_required_and_neither_enforced_nor_had() {
        let daily = SessionPolicy { budgets: vec![host_line("a.test 1k/day")], ..SessionPolicy::default() };
        let none = Capabilities::new();
        assert_eq!(missing(&daily, &none, &none), Some(Capability::Budgets));
        let budgets: Capabilities = [Capability::Budgets].into();
        assert_eq!(missing(&daily, &budgets, &none), Some(Capability::Periods));
        assert_eq!(missing(&daily, &Capability::ALL.into(), &none), None);
        assert_eq!(missing(&daily, &none, &required(&daily)), None, "had before");
        assert_eq!(missing(&SessionPolicy::default(), &none, &none), None);
    }
}
