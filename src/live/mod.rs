//! Live policy (pure): what a running sandbox allows, kept beside its session (`live.json` in
//! the session directory), and how `ai-sandbox allow ITEM…` widens it without a restart.
//!
//! Why a record of our own: a running sandbox's allowlist is the launch's config plus its
//! `--allow` flags, which no file holds; a live change must add exactly what was asked to
//! exactly that, at both layers (the gate's session policy for hostnames and for IP entries
//! reached through the proxy, the nftables sets in the sandbox's network namespace for direct
//! connections), and nothing else. The record is updated under a lock, so two concurrent
//! changes both land. Applying it is the host's part (`host::RealHost::live_allow`).

pub(crate) mod apply;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use crate::contract::Record;

/// A running sandbox as `ai-sandbox ps` sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    pub session: String,
    /// The launcher's pid.
    pub pid: i32,
    /// Seconds since launch.
    pub age: u64,
    /// Its record (absent for a launch older than this version, or one starting right now).
    pub record: Option<Record>,
    /// The record's path.
    pub path: PathBuf,
    /// Commands `ai-sandbox exec` runs in it now.
    #[serde(default)]
    pub execs: Vec<Exec>,
    /// What its rules counted against each `budget = ADDRESS` line (the gate counts the others).
    #[serde(default)]
    pub net_budgets: Vec<crate::contract::session::BudgetUse>,
}

/// A command `ai-sandbox exec` runs in a sandbox (see `contract::execd`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exec {
    /// Its `podman exec` process.
    pub pid: i32,
    /// Seconds since it started.
    pub age: u64,
    pub command: Vec<String>,
}

/// `1h02m`, `3m05s`, `42s`.
pub(crate) fn age(secs: u64) -> String {
    match secs {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

pub(crate) use crate::contract::direct::{Direct, Proto};

/// The elements of `nft -j list set … refused_v4|refused_v6`, read through nftables' own schema
/// types. An element of another shape (none is written by our rules) is skipped.
pub(crate) fn parse_refused(json: &str) -> Vec<Direct> {
    use nftables::expr::{Expression, NamedExpression};
    use nftables::schema::{NfListObject, NfObject, Nftables};
    let Ok(doc) = serde_json::from_str::<Nftables>(json) else { return Vec::new() };
    let mut out = Vec::new();
    for obj in doc.objects.iter() {
        let NfObject::ListObject(NfListObject::Set(set)) = obj else { continue };
        for e in set.elem.iter().flat_map(|e| e.iter()) {
            let Expression::Named(NamedExpression::Concat(c)) = e else { continue };
            let [Expression::String(addr), Expression::String(proto), Expression::Number(port)] = &c[..]
            else {
                continue;
            };
            let (Ok(addr), Some(proto), Ok(port)) = (
                addr.parse(),
                serde_json::from_value::<Proto>(serde_json::Value::from(proto.as_ref())).ok(),
                u16::try_from(*port),
            ) else {
                continue;
            };
            out.push(Direct { proto, addr, port, denied_by: None, over_budget: None });
        }
    }
    out
}

/// What each `budget = ADDRESS` line counted, from `nft -j list quotas` of the sandbox's table:
/// the line's network, the bytes its quota counted (at most its size: the kernel counts the
/// packet that crossed it), its size. A line without its quota in the listing is left out.
/// Read as plain JSON: nftables' schema type holds 32-bit counts.
pub(crate) fn net_budget_use(
    budgets: &[crate::policy::budget::NetBudget],
    json: &str,
) -> Vec<crate::contract::session::BudgetUse> {
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(json) else { return Vec::new() };
    let quotas: Vec<&serde_json::Value> = doc
        .get("nftables")
        .and_then(|o| o.as_array())
        .into_iter()
        .flatten()
        .filter_map(|o| o.get("quota"))
        .collect();
    let mut out = Vec::new();
    for (i, b) in budgets.iter().enumerate() {
        let name = crate::plan::ruleset::quota_name(i);
        let Some(used) = quotas
            .iter()
            .find(|q| q.get("name").and_then(|n| n.as_str()) == Some(&name))
            .map(|q| q.get("used").and_then(|u| u.as_u64()).unwrap_or(0))
        else {
            continue;
        };
        out.push(crate::contract::session::BudgetUse {
            key: b.net.to_string(),
            sent: used.min(b.bytes),
            budget: b.bytes,
            period: None,
        });
    }
    out
}

/// What `ai-sandbox allow` (or `deny`) adds: the items' entries, as a policy built from them
/// alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    /// What it adds (`allow`) or refuses from now on (`deny`).
    pub(crate) allow: crate::policy::allow::Allowlist,
    /// `rule =` lines (`ai-sandbox allow 'rule = HOST METHOD PATH'`).
    pub(crate) rules: Vec<crate::policy::rule::Rule>,
    /// `budget =` lines (`ai-sandbox allow 'budget = HOST SIZE'`): each replaces the session's
    /// line for its host; what was sent stays counted.
    pub(crate) budgets: Vec<crate::policy::budget::Budget>,
    /// `budget = ADDRESS SIZE` lines: each replaces the size of the session's line for that
    /// network (its quota in the rules keeps what was counted).
    pub(crate) net_budgets: Vec<crate::policy::budget::NetBudget>,
}

impl Change {
    /// The entries, as the allowlist prints them.
    pub(crate) fn summary(&self) -> String {
        let host = |(h, p): &(crate::policy::allow::HostPattern, Option<crate::policy::allow::Ports>)| match p
        {
            Some(p) => format!("{h}:{p}"),
            None => h.to_string(),
        };
        let net = |(n, p): &(crate::policy::allow::IpNet, crate::policy::allow::Ports)| format!("{n}:{p}");
        let hosts = self.allow.hosts.iter().chain(&self.allow.deny_hosts).map(host);
        let nets = self.allow.nets.iter().chain(&self.allow.deny_nets).map(net);
        let mut rules: Vec<String> = Vec::new();
        for r in &self.rules {
            let line = format!("rule = {}", r.line);
            if !rules.contains(&line) {
                rules.push(line);
            }
        }
        let budgets = self.budgets.iter().map(|b| format!("budget = {b}"));
        let budgets = budgets.chain(self.net_budgets.iter().map(|b| format!("budget = {b}")));
        hosts.chain(nets).chain(rules).chain(budgets).collect::<Vec<_>>().join(", ")
    }
}

/// The record with `c` added; `Err` when it asks for a hostname and the sandbox has no gate.
/// Entries already there are not added twice; nothing else changes.
pub(crate) fn merged(r: &Record, c: &Change) -> Result<Record, String> {
    if r.net != crate::policy::NetMode::Allow {
        return Err(format!("session {} runs with --net {}: it has no allowlist to widen", r.session, r.net));
    }
    let names = !(c.allow.hosts.is_empty() && c.allow.deny_hosts.is_empty());
    if names && !r.gate {
        return Err(format!(
            "session {} was started without the gate (no hostname entries), so hostnames cannot be added while it runs; add the line to the config and restart it",
            r.session
        ));
    }
    if !(c.rules.is_empty() || r.gate && r.tls) {
        return Err(format!(
            "session {} was started without a bound secret or a rule, so it does not trust the gate's CA and a host's requests cannot be read while it runs; add the line to the config and restart it",
            r.session
        ));
    }
    let mut out = r.clone();
    add_missing(&mut out.policy.allow.hosts, &c.allow.hosts);
    for rule in &c.rules {
        if !rule.reached(&out.policy.allow.hosts) {
            return Err(format!(
                "`rule = {}`: {} is not allowed in session {}, so the rule would never be reached; allow the host too (`ai-sandbox allow {} 'rule = {}'`)",
                rule.line, rule.host, r.session, rule.host, rule.line
            ));
        }
    }
    add_missing(&mut out.policy.rules, &c.rules);
    if !c.budgets.is_empty() && !r.gate {
        return Err(format!(
            "session {} was started without the gate, so nothing counts what it sends; add the line to the config and restart it",
            r.session
        ));
    }
    for b in &c.budgets {
        if !crate::policy::budget::reached(b, &out.policy.allow.hosts) {
            let host = b.host.as_ref().map(|h| h.to_string()).unwrap_or_default();
            return Err(format!(
                "`budget = {b}`: {host} is not allowed in session {}, so the budget would never be reached",
                r.session
            ));
        }
        crate::policy::budget::set(&mut out.policy.budgets, b);
    }
    for b in &c.net_budgets {
        // The rules count a network in the quota made for its line at start: a line the
        // session did not start with has no quota (and no rule) to change.
        if !out.policy.net_budgets.iter().any(|x| x.net == b.net) {
            return Err(format!(
                "`budget = {b}`: session {} was started without a budget line for {}, so its rules have nothing that counts it; add the line to the config and restart it",
                r.session, b.net
            ));
        }
        crate::policy::budget::set_net(&mut out.policy.net_budgets, b);
    }
    add_missing(&mut out.policy.allow.nets, &c.allow.nets);
    add_missing(&mut out.policy.allow.deny_hosts, &c.allow.deny_hosts);
    add_missing(&mut out.policy.allow.deny_nets, &c.allow.deny_nets);
    Ok(out)
}

/// Appends each of `new` that `list` does not hold yet, in order.
fn add_missing<T: PartialEq + Clone>(list: &mut Vec<T>, new: &[T]) {
    for x in new {
        if !list.contains(x) {
            list.push(x.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::allow::{Allowlist, HostPattern, IpNet, Ports};

    fn rec(gate: bool) -> Record {
        Record {
            session: "s1".into(),
            container: "aisb-s1".into(),
            project: "/p".into(),
            net: crate::policy::NetMode::Allow,
            gate,
            tls: gate,
            host_image: true,
            logins: Vec::new(),
            policy: crate::contract::SessionPolicy {
                allow: crate::policy::allow::Allowlist {
                    hosts: vec![(HostPattern::Exact("a.test".into()), None)],
                    nets: vec![(
                        IpNet { addr: "10.0.0.1".parse().unwrap(), len: 32 },
                        Ports { lo: 443, hi: 443 },
                    )],
                    deny_hosts: vec![],
                    deny_nets: vec![],
                },
                config_path: "/p/.ai-sandbox/config".into(),
                ..crate::contract::SessionPolicy::default()
            },
        }
    }

    fn hosts(name: &str) -> Allowlist {
        Allowlist { hosts: vec![(HostPattern::Exact(name.into()), None)], ..Allowlist::default() }
    }

    #[test]
    fn a_budget_change_replaces_the_sessions_line_for_its_host() {
        let b = |l: &str| crate::policy::budget::host_line(l);
        let mut r = rec(true);
        r.policy.budgets = vec![b("a.test 1m"), b("* 5m")];
        let c = Change { budgets: vec![b("a.test 3m")], ..Change::default() };
        let out = merged(&r, &c).unwrap();
        let shown: Vec<String> = out.policy.budgets.iter().map(|x| x.to_string()).collect();
        assert_eq!(shown, ["a.test 3m", "* 5m"]);
        assert_eq!(c.summary(), "budget = a.test 3m");
        let far = Change { budgets: vec![b("z.test 1m")], ..Change::default() };
        assert!(merged(&r, &far).unwrap_err().contains("z.test is not allowed"));
        assert!(merged(&rec(false), &c).unwrap_err().contains("without the gate"));
    }

    #[test]
    fn an_address_budget_change_resizes_its_line_and_its_count_is_read_from_nft() {
        let n = |l: &str| match crate::policy::budget::parse(l) {
            Ok(crate::policy::budget::Line::Net(b)) => b,
            other => panic!("{other:?}"),
        };
        let mut r = rec(false);
        r.policy.net_budgets = vec![n("10.0.0.1 1m"), n("10.9.0.0/16 4g")];
        let c = Change { net_budgets: vec![n("10.0.0.1 3m")], ..Change::default() };
        let out = merged(&r, &c).expect("counted by the rules: no gate needed");
        let shown: Vec<String> = out.policy.net_budgets.iter().map(|x| x.to_string()).collect();
        assert_eq!(shown, ["10.0.0.1 3m", "10.9.0.0/16 4g"], "in place: its quota keeps its name");
        assert_eq!(c.summary(), "budget = 10.0.0.1 3m");
        let new = Change { net_budgets: vec![n("10.0.0.2 1m")], ..Change::default() };
        assert!(merged(&r, &new).unwrap_err().contains("started without a budget line for 10.0.0.2"));
        // As nft lists them: sizes over 4 GiB, a count clamped at the size, another table's.
        let json = r#"{"nftables": [{"metainfo": {"version": "1.1.3"}}, {"quota": {"family": "inet", "name": "budget_1", "table": "ai_sandbox", "handle": 3, "bytes": 4294967296, "used": 4294967296, "inv": true}}, {"quota": {"family": "inet", "name": "budget_0", "table": "ai_sandbox", "handle": 2, "bytes": 1048576, "used": 921600, "inv": true}}]}"#;
        let used = net_budget_use(&r.policy.net_budgets, json);
        let shown: Vec<String> = used.iter().map(|u| format!("{} {}", u.key, u.against())).collect();
        assert_eq!(shown, ["10.0.0.1 900k of 1m (88%)", "10.9.0.0/16 4g of 4g (100%)"]);
        assert!(net_budget_use(&r.policy.net_budgets, "not json").is_empty());
        assert_eq!(net_budget_use(&r.policy.net_budgets[..1], json).len(), 1, "only the lines asked about");
        // A refusal past a spent budget names the line to raise, not an allow line.
        let d = Direct {
            proto: Proto::Tcp,
            addr: "10.0.0.1".parse().unwrap(),
            port: 443,
            denied_by: None,
            over_budget: Some(n("10.0.0.1 1m")),
        };
        assert_eq!(d.raise().as_deref(), Some("budget = 10.0.0.1 2m"));
        let fix = d.fix("/p/.ai-sandbox/config");
        assert!(fix.starts_with("over budget: 10.0.0.1 was sent its budget of 1m"), "{fix}");
        assert!(
            fix.contains("ai-sandbox allow 'budget = 10.0.0.1 2m'") && !fix.contains("allow = "),
            "{fix}"
        );
        let e = crate::contract::log::Event::direct(&d, "s", "/p", "/p/.ai-sandbox/config", "t".into());
        assert_eq!(e.allow.as_deref(), Some("budget = 10.0.0.1 2m"), "what a watcher is offered");
        assert!(e.reason.starts_with("over budget"), "{}", e.reason);
    }

    #[test]
    fn a_change_adds_exactly_its_entries_once() {
        let c = Change {
            allow: Allowlist {
                hosts: vec![
                    (HostPattern::Exact("b.test".into()), None),
                    (HostPattern::Exact("a.test".into()), None),
                ],
                nets: vec![(IpNet { addr: "10.0.0.2".parse().unwrap(), len: 32 }, Ports { lo: 22, hi: 22 })],
                ..Allowlist::default()
            },
            ..Change::default()
        };
        let m = merged(&rec(true), &c).unwrap();
        assert_eq!(m.policy.allow.hosts.len(), 2);
        assert_eq!(m.policy.allow.nets.len(), 2);
        let again = merged(&m, &c).unwrap();
        assert_eq!(again, m, "applying the same change twice changes nothing");
        let mut expected = rec(true);
        expected.policy.allow.hosts = m.policy.allow.hosts.clone();
        expected.policy.allow.nets = m.policy.allow.nets.clone();
        assert_eq!(m, expected, "nothing but the lists changes");
    }

    #[test]
    fn refusal_records_are_read_from_nfts_listing_with_their_fix() {
        // As nft 1.1.3 prints it.
        let json = r#"{"nftables": [{"metainfo": {"version": "1.1.3", "release_name": "Commodore Bullmoose #4", "json_schema_version": 1}}, {"set": {"family": "inet", "name": "refused_v4", "table": "aisb", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 1, "size": 1024, "flags": ["dynamic"], "elem": [{"concat": ["10.0.0.1", "tcp", 80]}, {"concat": ["169.254.1.1", "udp", 53]}]}}]}"#;
        let r = parse_refused(json);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].fix("/p/.ai-sandbox/config"), "add \"allow = 10.0.0.1:80\" to /p/.ai-sandbox/config");
        assert!(r[1].fix("c").starts_with("DNS is not reachable"));
        let v6 = r#"{"nftables": [{"set": {"family": "inet", "name": "refused_v6", "table": "aisb", "type": ["ipv6_addr", "inet_proto", "inet_service"], "handle": 2, "elem": [{"concat": ["fd00::1", "udp", 9]}]}}]}"#;
        let r = parse_refused(v6);
        assert_eq!(r[0].dest(), "[fd00::1]:9");
        assert_eq!(r[0].fix("c"), "udp is never allowed: only TCP leaves the sandbox");
        assert!(parse_refused("not json").is_empty());
    }

    #[test]
    fn a_refusal_by_a_deny_entry_names_it_and_never_advises_an_allow() {
        let mut d = Direct {
            proto: Proto::Tcp,
            addr: "100.64.0.1".parse().unwrap(),
            port: 9090,
            denied_by: None,
            over_budget: None,
        };
        assert_eq!(d.fix("c"), "add \"allow = 100.64.0.1:9090\" to c");
        let mut p = rec(true).policy;
        p.allow.deny_nets =
            vec![(crate::policy::allow::IpNet::host(d.addr), crate::policy::allow::Ports::one(9090))];
        d.denied_by = crate::gate::decide::deny_net(&p, d.addr, d.port);
        assert_eq!(d.fix("c"), "refused by \"deny = 100.64.0.1:9090\" in c");
    }

    #[test]
    fn a_rule_is_added_live_only_where_the_sandbox_trusts_the_gates_ca_and_its_host_is_allowed() {
        let rules = crate::policy::rule::parse("a.test POST /x").unwrap();
        let c = Change { rules: rules.clone(), ..Change::default() };
        let m = merged(&rec(true), &c).unwrap();
        assert_eq!(m.policy.rules, rules);
        assert_eq!(merged(&m, &c).unwrap(), m, "added once");
        assert_eq!(c.summary(), "rule = a.test POST /x");
        // No gate CA inside: its clients would refuse the gate's certificate.
        let no_tls = Record { tls: false, ..rec(true) };
        assert!(merged(&no_tls, &c).unwrap_err().contains("does not trust the gate's CA"));
        // A host the sandbox may not reach: refused, unless the same change allows it.
        let other =
            Change { rules: crate::policy::rule::parse("b.test GET /").unwrap(), ..Change::default() };
        assert!(merged(&rec(true), &other).unwrap_err().contains("b.test is not allowed in session s1"));
        let both = Change { allow: hosts("b.test"), ..other };
        assert_eq!(merged(&rec(true), &both).unwrap().policy.rules.len(), 1);
    }

    #[test]
    fn hostnames_need_the_gate_ip_entries_do_not() {
        let host = Change { allow: hosts("b.test"), ..Change::default() };
        assert!(merged(&rec(false), &host).unwrap_err().contains("without the gate"));
        let net = Change {
            allow: Allowlist {
                nets: vec![(IpNet { addr: "10.0.0.2".parse().unwrap(), len: 32 }, Ports { lo: 22, hi: 22 })],
                ..Allowlist::default()
            },
            ..Change::default()
        };
        assert_eq!(merged(&rec(false), &net).unwrap().policy.allow.nets.len(), 2);
        let full = Record { net: crate::policy::NetMode::Full, ..rec(true) };
        assert!(merged(&full, &net).unwrap_err().contains("--net full"));
    }
}
