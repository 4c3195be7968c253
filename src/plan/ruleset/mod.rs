//! Policy → one nftables table (`inet ai_sandbox`) for the container's network namespace.
//!
//! Each rule is built once by a small `make_*` builder that yields both the JSON statements
//! (loaded by the OCI hook with `nft -j -f`) and the nft text of the same rule (printed by
//! `--dry-run` and `ai-sandbox rules --nft`). The golden test loads both forms into real nft
//! and requires identical listings, so the text can never drift from what is enforced.
//!
//! IP/CIDR entries are elements of two concatenated interval sets (address . port), so
//! 10,000 entries still cost two rules and one lookup each.
//!
//! `budget = ADDRESS SIZE` lines are named quotas (`budget_0`, … in the lines' order), each
//! with one rule just after the gate's accept: a TCP packet to its network counts against it,
//! and once it is spent the rule resets the connection. They come before `ct state established`
//! (every packet of an open connection counts, not only its first) and after `oif "lo"` (the
//! reset the kernel sends back to the sandbox's own address must not be counted and refused
//! again) and the gate (what goes through the gate is never counted here).
//!
//! The output chain runs at priority `mangle` (-150), before NAT (`dstnat`, -100, where the
//! kernel runs every nat chain whatever its own priority): it decides on the address the
//! sandbox asked for. That matters for spliced destinations (`splice`), whose connections the
//! nat output chain rewrites from `100.64.0.1:PORT` or an IP entry to an in-sandbox listener; a
//! filter chain after NAT would see the rewritten address with the original interface (the
//! kernel does not update `oif` after the reroute), so neither the allow sets nor `oif "lo"`
//! would match.

mod rules;

use crate::policy::allow::{IpNet, Ports};
use crate::policy::netset::{Box2, disjoint};
use crate::policy::{NetMode, PASTA_DNS, Policy};
use nftables::expr::{Expression, MetaKey, NamedExpression};
use nftables::schema::{
    Chain, NfListObject, NfObject, Nftables, Rule, Set, SetFlag, SetType, SetTypeValue, Table,
};
use nftables::stmt::Statement;
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use rules::*;
use std::collections::HashSet;

pub(crate) const TABLE: &str = "ai_sandbox";
const SET_V4: &str = "allow_v4";
const SET_V6: &str = "allow_v6";
/// `deny =` entries: checked before the allow sets.
const DENY_V4: &str = "deny_v4";
const DENY_V6: &str = "deny_v6";
/// Where the rules record what they refuse (read from outside: `ai-sandbox logs --denied`).
pub(crate) const REFUSED_V4: &str = "refused_v4";
pub(crate) const REFUSED_V6: &str = "refused_v6";
/// At most this many refused destinations are recorded per family; past it the refusals still
/// happen (a failed add only ends that rule), they are not recorded.
pub(crate) const REFUSED_SIZE: u32 = 4096;

/// One rule: its nft text and its JSON statements.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSpec {
    pub(crate) text: String,
    pub(crate) expr: Vec<Statement<'static>>,
}

/// A named set: (address . port) intervals the rules allow, or (address . protocol . port)
/// the rules refused, filled by the packet path (`record`).
#[derive(Debug, Clone, PartialEq)]
pub struct SetSpec {
    pub(crate) name: &'static str,
    pub(crate) v4: bool,
    pub elements: Vec<Box2>,
    pub(crate) record: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ruleset {
    pub sets: Vec<SetSpec>,
    pub output: Vec<RuleSpec>,
    pub input: Vec<RuleSpec>,
    /// Spliced destinations (`splice`): the rewrite to their listeners and of the source; both
    /// empty, and their chains absent, when nothing is spliced.
    pub nat_output: Vec<RuleSpec>,
    pub nat_postrouting: Vec<RuleSpec>,
    /// `budget = ADDRESS SIZE` lines: a named quota each (`quota_name`), in the lines' order.
    pub quotas: Vec<QuotaSpec>,
}

/// A named quota: what the sandbox may send to a network before its rule resets connections.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaSpec {
    pub(crate) name: String,
    pub(crate) bytes: u64,
}

/// The quota of the `i`th `budget = ADDRESS` line (stable while the sandbox runs: a live change
/// replaces a line's size in place, never its position).
pub(crate) fn quota_name(i: usize) -> String {
    format!("budget_{i}")
}

/// One base chain as nft declares it.
struct ChainDecl<'a> {
    name: &'static str,
    nat: bool,
    hook: NfHook,
    hook_text: &'static str,
    prio: i32,
    prio_text: &'static str,
    rules: &'a [RuleSpec],
}

/// The ruleset for `--net allow`; `None` for `none` (no interface) and `full` (no policy).
/// `gate_port` is the port the gate actually listens on (the configured one is where the
/// search for a free port starts).
pub fn build(p: &Policy, gate_port: u16) -> Option<Ruleset> {
    if p.net != NetMode::Allow {
        return None;
    }
    let (v4, v6): (Vec<Box2>, Vec<Box2>) = disjoint(&p.allow.nets).into_iter().partition(|b| b.net.is_v4());
    let (d4, d6): (Vec<Box2>, Vec<Box2>) =
        disjoint(&p.allow.deny_nets).into_iter().partition(|b| b.net.is_v4());
    let splices = &p.splices;
    let mut output = Vec::new();
    if let Some(listeners) = crate::policy::forwards::listener_range(splices) {
        output.push(make_splice_guard(listeners));
    }
    output.push(make_iface_accept("oif", MetaKey::Oif));
    if p.gate {
        // ip daddr GATE_ADDR tcp dport GATE_PORT accept
        output.push(make_dest_accept(p.gate_addr, "tcp", gate_port));
    } else {
        // --no-gate: DNS, and only to the resolver pasta provides.
        output.push(make_dest_accept(PASTA_DNS, "udp", 53));
        output.push(make_dest_accept(PASTA_DNS, "tcp", 53));
    }
    let quotas: Vec<QuotaSpec> = (p.net_budgets.iter().enumerate())
        .map(|(i, b)| QuotaSpec { name: quota_name(i), bytes: b.bytes })
        .collect();
    for (b, q) in p.net_budgets.iter().zip(&quotas) {
        output.push(make_budget(b.net, &q.name));
    }
    output.push(make_established());
    output.push(make_icmpv6_nd(&["nd-neighbor-solicit", "nd-neighbor-advert", "nd-router-solicit"]));
    output.push(make_set_deny(true));
    output.push(make_set_deny(false));
    output.push(make_set_accept(true));
    output.push(make_set_accept(false));
    output.push(make_record(true));
    output.push(make_record(false));
    output.push(make_reject_tcp());
    output.push(make_reject_rest());

    let mut input = vec![make_iface_accept("iif", MetaKey::Iif), make_established()];
    input.push(make_icmpv6_nd(&["nd-neighbor-solicit", "nd-neighbor-advert", "nd-router-advert"]));
    for publ in &p.publish {
        input.push(make_port_accept(publ.container));
    }
    Some(Ruleset {
        sets: vec![
            SetSpec { name: SET_V4, v4: true, elements: v4, record: false },
            SetSpec { name: SET_V6, v4: false, elements: v6, record: false },
            SetSpec { name: DENY_V4, v4: true, elements: d4, record: false },
            SetSpec { name: DENY_V6, v4: false, elements: d6, record: false },
            SetSpec { name: REFUSED_V4, v4: true, elements: Vec::new(), record: true },
            SetSpec { name: REFUSED_V6, v4: false, elements: Vec::new(), record: true },
        ],
        output,
        input,
        nat_output: splices.iter().map(|sp| make_splice_dnat(sp.to, sp.ns)).collect(),
        nat_postrouting: if splices.is_empty() { Vec::new() } else { vec![make_splice_snat()] },
        quotas,
    })
}

/// An nft script that sets the allow and deny sets of a running sandbox to exactly `nets` and
/// `deny` (a live change): all flushed and refilled in one `nft -f` transaction, so no packet
/// sees a state between the old and the new sets, and entries that overlap old ones cannot
/// collide.
pub(crate) fn set_script(nets: &[(IpNet, Ports)], deny: &[(IpNet, Ports)]) -> String {
    let mut t = String::new();
    for (entries, sets) in [(nets, [SET_V4, SET_V6]), (deny, [DENY_V4, DENY_V6])] {
        let boxes = disjoint(entries);
        for (set, v4) in [(sets[0], true), (sets[1], false)] {
            t += &format!("flush set inet {TABLE} {set}\n");
            let els: Vec<String> = boxes
                .iter()
                .filter(|b| b.net.is_v4() == v4)
                .map(|b| format!("{} . {}", b.net, b.ports))
                .collect();
            if !els.is_empty() {
                t += &format!("add element inet {TABLE} {set} {{ {} }}\n", els.join(", "));
            }
        }
    }
    t
}

/// An nft script that sets the size of the running sandbox's quotas to `budgets` (a live
/// change): an existing quota takes the new size and keeps what it has counted.
pub(crate) fn quota_script(budgets: &[crate::policy::budget::NetBudget]) -> String {
    budgets
        .iter()
        .enumerate()
        .map(|(i, b)| format!("add quota inet {TABLE} {} {{ over {} bytes }}\n", quota_name(i), b.bytes))
        .collect()
}

fn element(b: &Box2) -> Expression<'static> {
    Expression::Named(NamedExpression::Concat(vec![net_expr(&b.net), ports_expr(b.ports)]))
}

impl Ruleset {
    /// The JSON document the hook loads with `nft -j -f`.
    fn to_json(&self) -> Nftables<'static> {
        let fam = NfFamily::INet;
        let mut objs = vec![NfListObject::Table(Table { family: fam, name: TABLE.into(), handle: None })];
        for set in &self.sets {
            let addr = if set.v4 { SetType::Ipv4Addr } else { SetType::Ipv6Addr };
            let (types, flag, size) = if set.record {
                (vec![addr, SetType::InetProto, SetType::InetService], SetFlag::Dynamic, Some(REFUSED_SIZE))
            } else {
                (vec![addr, SetType::InetService], SetFlag::Interval, None)
            };
            objs.push(NfListObject::Set(Box::new(Set {
                family: fam,
                table: TABLE.into(),
                name: set.name.into(),
                set_type: SetTypeValue::Concatenated(types.into()),
                flags: Some(HashSet::from([flag])),
                size,
                elem: (!set.elements.is_empty())
                    .then(|| set.elements.iter().map(element).collect::<Vec<_>>().into()),
                ..Set::default()
            })));
        }
        for c in self.chains() {
            objs.push(NfListObject::Chain(Chain {
                family: fam,
                table: TABLE.into(),
                name: c.name.into(),
                _type: Some(if c.nat { NfChainType::NAT } else { NfChainType::Filter }),
                hook: Some(c.hook),
                prio: Some(c.prio),
                policy: Some(if c.nat { NfChainPolicy::Accept } else { NfChainPolicy::Drop }),
                ..Chain::default()
            }));
            for r in c.rules {
                objs.push(NfListObject::Rule(Rule {
                    family: fam,
                    table: TABLE.into(),
                    chain: c.name.into(),
                    expr: r.expr.clone().into(),
                    ..Rule::default()
                }));
            }
        }
        Nftables { objects: objs.into_iter().map(NfObject::ListObject).collect::<Vec<_>>().into() }
    }

    /// The JSON document as text. Quotas are put in here, after the sets and before the
    /// chains whose rules name them: the nftables crate's quota object holds a 32-bit size, and a
    /// budget may be larger than 4 GiB.
    pub fn to_json_string(&self) -> String {
        let mut doc = serde_json::to_value(self.to_json()).expect("nftables schema serialises");
        if let Some(objs) = doc.get_mut("nftables").and_then(|o| o.as_array_mut()) {
            let at = objs.iter().position(|o| o.get("chain").is_some()).unwrap_or(objs.len());
            let quotas = self.quotas.iter().map(|q| {
                serde_json::json!({"quota": {"family": "inet", "table": TABLE, "name": q.name, "bytes": q.bytes, "inv": true}})
            });
            objs.splice(at..at, quotas);
        }
        serde_json::to_string_pretty(&doc).expect("a JSON value serialises")
    }

    /// The same ruleset as nft text (loadable with `nft -f`).
    pub fn to_text(&self) -> String {
        let mut t = format!("table inet {TABLE} {{\n");
        // Quotas first, where nft lists them.
        for q in &self.quotas {
            t += &format!("\tquota {} {{\n\t\tover {} bytes\n\t}}\n\n", q.name, q.bytes);
        }
        for set in &self.sets {
            let addr = if set.v4 { "ipv4_addr" } else { "ipv6_addr" };
            t += &if set.record {
                format!(
                    "\tset {} {{\n\t\ttype {addr} . inet_proto . inet_service\n\t\tsize {REFUSED_SIZE}\n\t\tflags dynamic\n",
                    set.name
                )
            } else {
                format!("\tset {} {{\n\t\ttype {addr} . inet_service\n\t\tflags interval\n", set.name)
            };
            if !set.elements.is_empty() {
                let els: Vec<String> =
                    set.elements.iter().map(|b| format!("{} . {}", b.net, b.ports)).collect();
                t += &format!("\t\telements = {{ {} }}\n", els.join(",\n\t\t\t     "));
            }
            t += "\t}\n\n";
        }
        let chains = self.chains();
        for (i, c) in chains.iter().enumerate() {
            let (kind, policy) = if c.nat { ("nat", "accept") } else { ("filter", "drop") };
            t += &format!(
                "\tchain {} {{\n\t\ttype {kind} hook {} priority {}; policy {policy};\n",
                c.name, c.hook_text, c.prio_text
            );
            for r in c.rules {
                t += &format!("\t\t{}\n", r.text);
            }
            t += if i + 1 < chains.len() { "\t}\n\n" } else { "\t}\n" };
        }
        t + "}\n"
    }

    /// Number of rules (constant in the number of allow entries).
    pub fn rule_count(&self) -> usize {
        self.chains().iter().map(|c| c.rules.len()).sum()
    }

    /// The base chains, in the order nft lists them; the nat chains only when they have rules.
    fn chains(&self) -> Vec<ChainDecl<'_>> {
        let filter = |name, hook, hook_text, prio, prio_text, rules| ChainDecl {
            name,
            nat: false,
            hook,
            hook_text,
            prio,
            prio_text,
            rules,
        };
        let mut out = vec![
            filter("output", NfHook::Output, "output", -150, "mangle", &self.output[..]),
            filter("input", NfHook::Input, "input", 0, "filter", &self.input[..]),
        ];
        if !self.nat_output.is_empty() {
            out.push(ChainDecl {
                nat: true,
                ..filter("nat_output", NfHook::Output, "output", -100, "dstnat", &self.nat_output[..])
            });
            out.push(ChainDecl {
                nat: true,
                ..filter(
                    "nat_postrouting",
                    NfHook::Postrouting,
                    "postrouting",
                    100,
                    "srcnat",
                    &self.nat_postrouting[..],
                )
            });
        }
        out
    }
}
