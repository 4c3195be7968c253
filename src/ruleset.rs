//! Policy → one nftables table (`inet ai_sandbox`) for the container's network namespace.
//!
//! Each rule is built once by a small `make_*` builder that yields both the JSON statements
//! (loaded by the OCI hook with `nft -j -f`) and the nft text of the same rule (printed by
//! `--dry-run` and `ai-sandbox rules --nft`). The golden test loads both forms into real nft
//! and requires identical listings, so the text can never drift from what is enforced.
//!
//! IP/CIDR entries are elements of two concatenated interval sets (address . port), so
//! 10,000 entries still cost two rules and one lookup each.

use crate::policy::allow::{IpNet, Ports};
use crate::policy::netset::{Box2, disjoint};
use crate::policy::{NetMode, PASTA_DNS, Policy};
use nftables::expr::{
    CT, Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, Prefix, Range, SetItem,
};
use nftables::schema::{
    Chain, NfListObject, NfObject, Nftables, Rule, Set, SetFlag, SetType, SetTypeValue, Table,
};
use nftables::stmt::{Accept, Match, Operator, Reject, RejectType, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook, RejectCode};
use std::borrow::Cow;
use std::collections::HashSet;
use std::net::Ipv4Addr;

pub const TABLE: &str = "ai_sandbox";
const SET_V4: &str = "allow_v4";
const SET_V6: &str = "allow_v6";
/// `deny =` entries: checked before the allow sets.
const DENY_V4: &str = "deny_v4";
const DENY_V6: &str = "deny_v6";
/// Where the rules record what they refuse (read from outside: `ai-sandbox logs --denied`).
pub const REFUSED_V4: &str = "refused_v4";
pub const REFUSED_V6: &str = "refused_v6";
/// At most this many refused destinations are recorded per family; past it the refusals still
/// happen (a failed add only ends that rule), they are not recorded.
pub const REFUSED_SIZE: u32 = 4096;

/// One rule: its nft text and its JSON statements.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSpec {
    pub text: String,
    pub expr: Vec<Statement<'static>>,
}

/// A named set: (address . port) intervals the rules allow, or (address . protocol . port)
/// the rules refused, filled by the packet path (`record`).
#[derive(Debug, Clone, PartialEq)]
pub struct SetSpec {
    pub name: &'static str,
    pub v4: bool,
    pub elements: Vec<Box2>,
    pub record: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ruleset {
    pub sets: Vec<SetSpec>,
    pub output: Vec<RuleSpec>,
    pub input: Vec<RuleSpec>,
}

/// The ruleset for `--net allow`; `None` for `none` (no interface) and `full` (no policy).
/// `gate_port` is the port the gate actually listens on (the configured one is where the
/// search for a free port starts).
pub fn build(p: &Policy, gate_port: u16) -> Option<Ruleset> {
    if p.net != NetMode::Allow {
        return None;
    }
    let (v4, v6): (Vec<Box2>, Vec<Box2>) = disjoint(&p.nets).into_iter().partition(|b| b.net.is_v4());
    let (d4, d6): (Vec<Box2>, Vec<Box2>) = disjoint(&p.deny_nets).into_iter().partition(|b| b.net.is_v4());
    let mut output = vec![make_iface_accept("oif", MetaKey::Oif), make_established()];
    output.push(make_icmpv6_nd(&["nd-neighbor-solicit", "nd-neighbor-advert", "nd-router-solicit"]));
    if p.gate {
        // ip daddr GATE_ADDR tcp dport GATE_PORT accept
        output.push(make_dest_accept(p.gate_addr, "tcp", gate_port));
    } else {
        // --no-gate: DNS, and only to the resolver pasta provides.
        output.push(make_dest_accept(PASTA_DNS, "udp", 53));
        output.push(make_dest_accept(PASTA_DNS, "tcp", 53));
    }
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
    })
}

fn s(v: impl Into<String>) -> Expression<'static> {
    Expression::String(Cow::Owned(v.into()))
}

fn payload(protocol: &str, field: &str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(PayloadField {
        protocol: Cow::Owned(protocol.into()),
        field: Cow::Owned(field.into()),
    })))
}

fn eq(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match { left, right, op: Operator::EQ })
}

fn accept() -> Statement<'static> {
    Statement::Accept(Some(Accept {}))
}

/// `oif "lo" accept` / `iif "lo" accept`
fn make_iface_accept(word: &str, key: MetaKey) -> RuleSpec {
    RuleSpec {
        text: format!("{word} \"lo\" accept"),
        expr: vec![eq(Expression::Named(NamedExpression::Meta(Meta { key })), s("lo")), accept()],
    }
}

/// `ct state established,related accept`
fn make_established() -> RuleSpec {
    let ct = Expression::Named(NamedExpression::CT(CT { key: "state".into(), family: None, dir: None }));
    RuleSpec {
        text: "ct state established,related accept".into(),
        expr: vec![
            Statement::Match(Match {
                left: ct,
                right: Expression::List(vec![s("established"), s("related")]),
                op: Operator::IN,
            }),
            accept(),
        ],
    }
}

/// `icmpv6 type { nd-neighbor-solicit, ... } accept`: neighbour discovery stays on the link.
fn make_icmpv6_nd(types: &[&str]) -> RuleSpec {
    let set = types.iter().map(|t| SetItem::Element(s(*t))).collect();
    RuleSpec {
        text: format!("icmpv6 type {{ {} }} accept", types.join(", ")),
        expr: vec![eq(payload("icmpv6", "type"), Expression::Named(NamedExpression::Set(set))), accept()],
    }
}

/// `ip daddr ADDR PROTO dport PORT accept`
fn make_dest_accept(addr: Ipv4Addr, proto: &str, port: u16) -> RuleSpec {
    RuleSpec {
        text: format!("ip daddr {addr} {proto} dport {port} accept"),
        expr: vec![
            eq(payload("ip", "daddr"), s(addr.to_string())),
            eq(payload(proto, "dport"), Expression::Number(u32::from(port))),
            accept(),
        ],
    }
}

/// `ip daddr . tcp dport @allow_v4 accept` (and the ip6 twin)
fn make_set_accept(v4: bool) -> RuleSpec {
    let (fam, set) = if v4 { ("ip", SET_V4) } else { ("ip6", SET_V6) };
    let key = daddr_dport(fam);
    RuleSpec {
        text: format!("{fam} daddr . tcp dport @{set} accept"),
        expr: vec![eq(key, s(format!("@{set}"))), accept()],
    }
}

/// `ip daddr . tcp dport @deny_v4 add @refused_v4 { … } reject with tcp reset` (and the ip6
/// twin): `deny =` entries win over the allow sets, and their refusals are recorded too.
fn make_set_deny(v4: bool) -> RuleSpec {
    let (fam, set) = if v4 { ("ip", DENY_V4) } else { ("ip6", DENY_V6) };
    let key = daddr_dport(fam);
    let (record_text, record) = record(v4);
    RuleSpec {
        text: format!("{fam} daddr . tcp dport @{set} {record_text} reject with tcp reset"),
        expr: vec![
            eq(key, s(format!("@{set}"))),
            record,
            Statement::Reject(Some(Reject::new(Some(RejectType::TCPReset), None))),
        ],
    }
}

/// `meta l4proto { tcp, udp } add @refused_v4 { ip daddr . meta l4proto . th dport }` (and the
/// ip6 twin), just before the rejects: what is refused is recorded where the launcher can read
/// it from outside, without privileges inside and without a log daemon.
fn make_record(v4: bool) -> RuleSpec {
    let protos =
        Expression::Named(NamedExpression::Set(vec![SetItem::Element(s("tcp")), SetItem::Element(s("udp"))]));
    let (record_text, record) = record(v4);
    RuleSpec {
        text: format!("meta l4proto {{ tcp, udp }} {record_text}"),
        expr: vec![eq(l4proto(), protos), record],
    }
}

/// `ip daddr . tcp dport` (or ip6): the key of the allow and deny sets.
fn daddr_dport(fam: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Concat(vec![payload(fam, "daddr"), payload("tcp", "dport")]))
}

fn l4proto() -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key: MetaKey::L4proto }))
}

/// `add @refused_v4 { ip daddr . meta l4proto . th dport }` (or the ip6 twin): the statement
/// that records a refusal, as text and as JSON, for the record rule and the deny rule.
fn record(v4: bool) -> (String, Statement<'static>) {
    let (fam, set) = if v4 { ("ip", REFUSED_V4) } else { ("ip6", REFUSED_V6) };
    let elem = Expression::Named(NamedExpression::Concat(vec![
        payload(fam, "daddr"),
        l4proto(),
        payload("th", "dport"),
    ]));
    let stmt = Statement::Set(nftables::stmt::Set {
        op: nftables::stmt::SetOp::Add,
        elem,
        set: format!("@{set}").into(),
    });
    (format!("add @{set} {{ {fam} daddr . meta l4proto . th dport }}"), stmt)
}

/// `meta l4proto tcp reject with tcp reset`: refused connections fail at once.
fn make_reject_tcp() -> RuleSpec {
    RuleSpec {
        text: "meta l4proto tcp reject with tcp reset".into(),
        expr: vec![
            eq(l4proto(), s("tcp")),
            Statement::Reject(Some(Reject::new(Some(RejectType::TCPReset), None))),
        ],
    }
}

/// `reject with icmpx admin-prohibited`: everything else (UDP, ICMP, v6) fails fast too.
fn make_reject_rest() -> RuleSpec {
    RuleSpec {
        text: "reject with icmpx admin-prohibited".into(),
        expr: vec![Statement::Reject(Some(Reject::new(
            Some(RejectType::ICMPX),
            Some(RejectCode::AdminProhibited),
        )))],
    }
}

/// `tcp dport PORT accept` (input chain, one per published port)
fn make_port_accept(port: u16) -> RuleSpec {
    RuleSpec {
        text: format!("tcp dport {port} accept"),
        expr: vec![eq(payload("tcp", "dport"), Expression::Number(u32::from(port))), accept()],
    }
}

/// An nft script that sets the allow and deny sets of a running sandbox to exactly `nets` and
/// `deny` (a live change): all flushed and refilled in one `nft -f` transaction, so no packet
/// sees a state between the old and the new sets, and entries that overlap old ones cannot
/// collide.
pub fn set_script(nets: &[(IpNet, Ports)], deny: &[(IpNet, Ports)]) -> String {
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

fn element(b: &Box2) -> Expression<'static> {
    let addr = if b.net.len == IpNet::max_len(&b.net.addr) {
        s(b.net.addr.to_string())
    } else {
        Expression::Named(NamedExpression::Prefix(Prefix {
            addr: Box::new(s(b.net.addr.to_string())),
            len: u32::from(b.net.len),
        }))
    };
    let port = if b.ports.lo == b.ports.hi {
        Expression::Number(u32::from(b.ports.lo))
    } else {
        Expression::Range(Box::new(Range {
            range: [Expression::Number(u32::from(b.ports.lo)), Expression::Number(u32::from(b.ports.hi))],
        }))
    };
    Expression::Named(NamedExpression::Concat(vec![addr, port]))
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
        for (name, hook, rules) in
            [("output", NfHook::Output, &self.output), ("input", NfHook::Input, &self.input)]
        {
            objs.push(NfListObject::Chain(Chain {
                family: fam,
                table: TABLE.into(),
                name: name.into(),
                _type: Some(NfChainType::Filter),
                hook: Some(hook),
                prio: Some(0),
                policy: Some(NfChainPolicy::Drop),
                ..Chain::default()
            }));
            for r in rules {
                objs.push(NfListObject::Rule(Rule {
                    family: fam,
                    table: TABLE.into(),
                    chain: name.into(),
                    expr: r.expr.clone().into(),
                    ..Rule::default()
                }));
            }
        }
        Nftables { objects: objs.into_iter().map(NfObject::ListObject).collect::<Vec<_>>().into() }
    }

    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(&self.to_json()).expect("nftables schema serialises")
    }

    /// The same ruleset as nft text (loadable with `nft -f`).
    pub fn to_text(&self) -> String {
        let mut t = format!("table inet {TABLE} {{\n");
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
        for (name, rules) in [("output", &self.output), ("input", &self.input)] {
            t += &format!("\tchain {name} {{\n\t\ttype filter hook {name} priority filter; policy drop;\n");
            for r in rules {
                t += &format!("\t\t{}\n", r.text);
            }
            t += "\t}\n";
            if name == "output" {
                t += "\n";
            }
        }
        t + "}\n"
    }

    /// Number of rules (constant in the number of allow entries).
    pub fn rule_count(&self) -> usize {
        self.output.len() + self.input.len()
    }
}
