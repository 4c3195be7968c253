//! The rule builders: each yields one rule's nft text and its JSON statements together, so
//! the text `--dry-run` prints cannot drift from what the hook loads (the golden test loads
//! both and compares the listings).

use super::{DENY_V4, DENY_V6, REFUSED_V4, REFUSED_V6, RuleSpec, SET_V4, SET_V6};
use crate::policy::allow::{IpNet, Ports};
use nftables::expr::{
    BinaryOperation, CT, Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, Prefix, Range,
    SetItem,
};
use nftables::stmt::{
    Accept, Match, NAT, NATFamily, Operator, QuotaOrQuotaRef, Reject, RejectType, Statement,
};
use nftables::types::RejectCode;
use std::borrow::Cow;
use std::net::{Ipv4Addr, SocketAddrV4};

pub(super) fn s(v: impl Into<String>) -> Expression<'static> {
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
pub(super) fn make_iface_accept(word: &str, key: MetaKey) -> RuleSpec {
    RuleSpec {
        text: format!("{word} \"lo\" accept"),
        expr: vec![eq(Expression::Named(NamedExpression::Meta(Meta { key })), s("lo")), accept()],
    }
}

/// `ct state established,related accept`
pub(super) fn make_established() -> RuleSpec {
    RuleSpec {
        text: "ct state established,related accept".into(),
        expr: vec![
            Statement::Match(Match {
                left: ct("state"),
                right: Expression::List(vec![s("established"), s("related")]),
                op: Operator::IN,
            }),
            accept(),
        ],
    }
}

/// `icmpv6 type { nd-neighbor-solicit, ... } accept`: neighbour discovery stays on the link.
pub(super) fn make_icmpv6_nd(types: &[&str]) -> RuleSpec {
    let set = types.iter().map(|t| SetItem::Element(s(*t))).collect();
    RuleSpec {
        text: format!("icmpv6 type {{ {} }} accept", types.join(", ")),
        expr: vec![eq(payload("icmpv6", "type"), Expression::Named(NamedExpression::Set(set))), accept()],
    }
}

/// `ip daddr ADDR PROTO dport PORT accept`
pub(super) fn make_dest_accept(addr: Ipv4Addr, proto: &str, port: u16) -> RuleSpec {
    RuleSpec {
        text: format!("ip daddr {addr} {proto} dport {port} accept"),
        expr: vec![
            eq(payload("ip", "daddr"), s(addr.to_string())),
            eq(payload(proto, "dport"), Expression::Number(u32::from(port))),
            accept(),
        ],
    }
}

/// `ip daddr 192.0.2.0/24 tcp flags & rst == 0 quota name "budget_0" add @refused_v4 { … }
/// reject with tcp reset` (or ip6): what the sandbox sends to a `budget = ADDRESS` line's
/// network over TCP (the only transport its IP entries allow) counts against its quota; once it
/// is over, each packet is recorded as refused and resets its connection (the data is not sent,
/// and the client hears it at once rather than retrying into silence). A reset going out is not
/// counted and passes: it carries no data, and it is how the far end (pasta, then the server)
/// learns that a connection cut here is gone.
pub(super) fn make_budget(net: IpNet, quota: &str) -> RuleSpec {
    let fam = if net.is_v4() { "ip" } else { "ip6" };
    let (record_text, record) = record(net.is_v4());
    RuleSpec {
        text: format!(
            "{fam} daddr {net} tcp flags & rst == 0 quota name \"{quota}\" {record_text} reject with tcp reset"
        ),
        expr: vec![
            eq(payload(fam, "daddr"), net_expr(&net)),
            eq(
                Expression::BinaryOperation(Box::new(BinaryOperation::AND(
                    payload("tcp", "flags"),
                    s("rst"),
                ))),
                Expression::Number(0),
            ),
            Statement::Quota(QuotaOrQuotaRef::QuotaRef(quota.to_string().into())),
            record,
            tcp_reset(),
        ],
    }
}

/// `ip daddr . tcp dport @allow_v4 accept` (and the ip6 twin)
pub(super) fn make_set_accept(v4: bool) -> RuleSpec {
    let (fam, set) = if v4 { ("ip", SET_V4) } else { ("ip6", SET_V6) };
    let key = daddr_dport(fam);
    RuleSpec {
        text: format!("{fam} daddr . tcp dport @{set} accept"),
        expr: vec![eq(key, s(format!("@{set}"))), accept()],
    }
}

/// `ip daddr . tcp dport @deny_v4 add @refused_v4 { … } reject with tcp reset` (and the ip6
/// twin): `deny =` entries win over the allow sets, and their refusals are recorded too.
pub(super) fn make_set_deny(v4: bool) -> RuleSpec {
    let (fam, set) = if v4 { ("ip", DENY_V4) } else { ("ip6", DENY_V6) };
    let key = daddr_dport(fam);
    let (record_text, record) = record(v4);
    RuleSpec {
        text: format!("{fam} daddr . tcp dport @{set} {record_text} reject with tcp reset"),
        expr: vec![eq(key, s(format!("@{set}"))), record, tcp_reset()],
    }
}

/// `meta l4proto { tcp, udp } add @refused_v4 { ip daddr . meta l4proto . th dport }` (and the
/// ip6 twin), just before the rejects: what is refused is recorded where the launcher can read
/// it from outside, without privileges inside and without a log daemon.
pub(super) fn make_record(v4: bool) -> RuleSpec {
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
pub(super) fn make_reject_tcp() -> RuleSpec {
    RuleSpec {
        text: "meta l4proto tcp reject with tcp reset".into(),
        expr: vec![eq(l4proto(), s("tcp")), tcp_reset()],
    }
}

/// `reject with icmpx admin-prohibited`: everything else (UDP, ICMP, v6) fails fast too.
pub(super) fn make_reject_rest() -> RuleSpec {
    RuleSpec {
        text: "reject with icmpx admin-prohibited".into(),
        expr: vec![Statement::Reject(Some(Reject::new(
            Some(RejectType::ICMPX),
            Some(RejectCode::AdminProhibited),
        )))],
    }
}

/// `tcp dport PORT accept` (input chain, one per published port)
pub(super) fn make_port_accept(port: u16) -> RuleSpec {
    RuleSpec {
        text: format!("tcp dport {port} accept"),
        expr: vec![eq(payload("tcp", "dport"), Expression::Number(u32::from(port))), accept()],
    }
}

fn tcp_reset() -> Statement<'static> {
    Statement::Reject(Some(Reject::new(Some(RejectType::TCPReset), None)))
}

/// An address, or a network as its prefix.
pub(super) fn net_expr(net: &IpNet) -> Expression<'static> {
    if net.len == IpNet::max_len(&net.addr) {
        s(net.addr.to_string())
    } else {
        Expression::Named(NamedExpression::Prefix(Prefix {
            addr: Box::new(s(net.addr.to_string())),
            len: u32::from(net.len),
        }))
    }
}

pub(super) fn ports_expr(r: Ports) -> Expression<'static> {
    if r.lo == r.hi {
        Expression::Number(u32::from(r.lo))
    } else {
        Expression::Range(Box::new(Range {
            range: [Expression::Number(u32::from(r.lo)), Expression::Number(u32::from(r.hi))],
        }))
    }
}

fn ct(key: &str) -> Expression<'static> {
    Expression::Named(NamedExpression::CT(CT { key: key.to_string().into(), family: None, dir: None }))
}

/// `oif "lo" tcp dport 61000-61003 ct state new reject with tcp reset`: the spliced
/// destinations' in-sandbox listeners (see `splice`) are reached only through the rewrite of an
/// allowed `100.64.0.1:PORT` or IP entry, never by connecting to them directly (on 127.0.0.1,
/// ::1 or any loopback address), so a live `deny` of that address cannot be side-stepped.
pub(super) fn make_splice_guard(listeners: Ports) -> RuleSpec {
    RuleSpec {
        text: format!("oif \"lo\" tcp dport {listeners} ct state new reject with tcp reset"),
        expr: vec![
            eq(Expression::Named(NamedExpression::Meta(Meta { key: MetaKey::Oif })), s("lo")),
            eq(payload("tcp", "dport"), ports_expr(listeners)),
            Statement::Match(Match { left: ct("state"), right: s("new"), op: Operator::IN }),
            tcp_reset(),
        ],
    }
}

/// `oif != "lo" ip daddr 100.64.0.1 tcp dport 5432 dnat ip to 127.0.0.1:61000` (nat output
/// chain): a spliced destination's new connections go to its in-sandbox listener. Never for a
/// connection that stays inside the sandbox (`oif "lo"`): an IP entry naming the sandbox's own
/// address (pasta gives it the host's) reaches the sandbox itself, as without a splice.
pub(super) fn make_splice_dnat(to: SocketAddrV4, ns_port: u16) -> RuleSpec {
    RuleSpec {
        text: format!(
            "oif != \"lo\" ip daddr {} tcp dport {} dnat ip to 127.0.0.1:{ns_port}",
            to.ip(),
            to.port()
        ),
        expr: vec![
            Statement::Match(Match {
                left: Expression::Named(NamedExpression::Meta(Meta { key: MetaKey::Oif })),
                right: s("lo"),
                op: Operator::NEQ,
            }),
            eq(payload("ip", "daddr"), s(to.ip().to_string())),
            eq(payload("tcp", "dport"), Expression::Number(u32::from(to.port()))),
            Statement::DNAT(Some(NAT {
                addr: Some(s("127.0.0.1")),
                family: Some(NATFamily::IP),
                port: Some(Expression::Number(u32::from(ns_port))),
                flags: None,
            })),
        ],
    }
}

/// `oif "lo" ct status dnat snat ip to 127.0.0.1` (nat postrouting chain): the rewritten
/// connections come from 127.0.0.1, because pasta splices only connections from a loopback
/// address (from the sandbox's own address they stall: measured).
pub(super) fn make_splice_snat() -> RuleSpec {
    RuleSpec {
        text: "oif \"lo\" ct status dnat snat ip to 127.0.0.1".into(),
        expr: vec![
            eq(Expression::Named(NamedExpression::Meta(Meta { key: MetaKey::Oif })), s("lo")),
            Statement::Match(Match { left: ct("status"), right: s("dnat"), op: Operator::IN }),
            Statement::SNAT(Some(NAT {
                addr: Some(s("127.0.0.1")),
                family: Some(NATFamily::IP),
                port: None,
                flags: None,
            })),
        ],
    }
}
