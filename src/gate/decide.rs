//! The gate's decisions (pure): who is asking (token), what they ask for (the target in one
//! spelling), whether the allowlist permits it, which resolved addresses may be dialled,
//! whether a tunnel's TLS SNI matches its CONNECT host, and how each outcome is logged.
//!
//! Order matters and is fixed: authenticate → normalise → refuse what the gate never relays
//! (gate_addr, loopback and the other never-classes of an IP literal) → match the allowlist
//! (before any DNS lookup, so a denied name is never resolved) → resolve (elsewhere) → refuse
//! address classes that must never be reached through the gate → dial only what passed →
//! (CONNECT to a TLS port) check the SNI before a byte reaches the destination.

use super::tls::Hello;
use super::view::View;
pub use crate::contract::SessionPolicy;
use crate::policy::allow::{HostPattern, IpNet, Ports, canonical, valid_label};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A target in its one normal spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Name(String),
    Ip(IpAddr),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Name(n) => write!(f, "{n}"),
            Target::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Target::Ip(a) => write!(f, "{a}"),
        }
    }
}

/// A refusal: the HTTP status, a reason for the log, and the hint for the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Denial {
    pub(crate) status: u16,
    pub(crate) reason: String,
    pub(crate) hint: String,
    /// The `allow =` value that would lift it, when one would.
    pub(crate) allow: Option<String>,
    /// Only the allowlist (or a host's rules) said no (not a never-dialled class, a deny line, a
    /// token): a watcher may be asked instead (`ask = SECONDS`).
    pub(crate) askable: bool,
    /// A refused request's normal path (no query), when the gate read the request.
    pub(crate) path: Option<String>,
}

fn deny(status: u16, reason: impl Into<String>, hint: impl Into<String>) -> Denial {
    Denial { status, reason: reason.into(), hint: hint.into(), allow: None, askable: false, path: None }
}

/// Constant-time equality (the token must not leak through timing); the length is not secret.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// Index of the session whose token matches; every token is compared (no early exit).
pub(crate) fn authenticate(tokens: &[&str], presented: Option<&str>) -> Option<usize> {
    let p = presented?;
    let mut found = None;
    for (i, t) in tokens.iter().enumerate() {
        if ct_eq(t.as_bytes(), p.as_bytes()) && found.is_none() {
            found = Some(i);
        }
    }
    found
}

/// One part of an `inet_aton` address: decimal, `0`-prefixed octal, or `0x` hex.
fn aton_part(p: &str) -> Option<u64> {
    if p.is_empty() || p.len() > 12 {
        return None;
    }
    let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
        (h, 16)
    } else if p.len() > 1 && p.starts_with('0') {
        (&p[1..], 8)
    } else {
        (p, 10)
    };
    if digits.is_empty() {
        return if radix == 16 { None } else { Some(0) };
    }
    u64::from_str_radix(digits, radix).ok()
}

/// Every spelling `inet_aton` accepts (`127.1`, `0x7f.0.0.1`, `017700000001`, `2130706433`).
/// `Some(Err)` when the text is all-numeric but not a valid address (`1.2.3.256`).
fn inet_aton(s: &str) -> Option<Result<Ipv4Addr, ()>> {
    let parts: Vec<&str> = s.split('.').collect();
    let numeric = |p: &&str| {
        let l = p.to_ascii_lowercase();
        !l.is_empty()
            && (l.bytes().all(|b| b.is_ascii_digit())
                || (l.starts_with("0x") && l[2..].bytes().all(|b| b.is_ascii_hexdigit())))
    };
    if parts.len() > 4 || !parts.iter().all(numeric) {
        return None;
    }
    let vals: Option<Vec<u64>> = parts.iter().map(|p| aton_part(p)).collect();
    let Some(v) = vals else { return Some(Err(())) };
    let (init, last) = v.split_at(v.len() - 1);
    let last_bits = 32 - 8 * init.len() as u32;
    if init.iter().any(|x| *x > 255) || last[0] >= (1u64 << last_bits) {
        return Some(Err(()));
    }
    let mut n: u64 = 0;
    for (i, x) in init.iter().enumerate() {
        n |= x << (24 - 8 * i);
    }
    Some(Ok(Ipv4Addr::from((n | last[0]) as u32)))
}

/// Normalises a target host: lowercase, no trailing dot, IP literals in every spelling.
pub fn normalise(raw: &str) -> Result<Target, Denial> {
    let bad = |why: &str| {
        deny(400, format!("bad target host `{raw}`: {why}"), "use a hostname or a plain IP address")
    };
    if let Ok(v6) = raw.parse::<Ipv6Addr>() {
        return Ok(Target::Ip(canonical(IpAddr::V6(v6))));
    }
    if !raw.is_ascii() {
        return Err(bad("non-ASCII; use the punycode (xn--) form"));
    }
    let lower = raw.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    match inet_aton(name) {
        Some(Ok(v4)) => return Ok(Target::Ip(IpAddr::V4(v4))),
        Some(Err(())) => return Err(bad("not a valid IPv4 address")),
        None => {}
    }
    if name.len() > 253 || !name.split('.').all(valid_label) {
        return Err(bad("not a valid hostname"));
    }
    if name.rsplit('.').next().is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit())) {
        return Err(bad("a numeric last label is neither a name nor an IPv4 address"));
    }
    Ok(Target::Name(name.to_string()))
}

fn pattern_matches(p: &HostPattern, name: &str) -> bool {
    p.matches(name)
}

fn suggestion(t: &Target, port: u16, gate_ports: &[u16]) -> String {
    match t {
        Target::Name(n) if gate_ports.contains(&port) => n.clone(),
        Target::Name(n) => format!("{n}:{port}"),
        Target::Ip(IpAddr::V6(a)) => format!("[{a}]:{port}"),
        Target::Ip(a) => format!("{a}:{port}"),
    }
}

/// The allowlist check, before any DNS lookup. An IP literal is first held against the
/// address classes the gate never dials, and against gate_addr, which is reached directly.
pub(crate) fn check_target(p: &SessionPolicy, t: &Target, port: u16) -> Result<(), Denial> {
    denied(p, t, port)?;
    if let Target::Ip(ip) = t {
        budgeted_address(p, *ip, port)?;
    }
    let allowed = match t {
        Target::Name(n) => p.allow.hosts.iter().any(|(pat, ports)| {
            pattern_matches(pat, n)
                && match ports {
                    Some(r) => r.contains(&Ports::one(port)),
                    None => p.gate_ports.contains(&port),
                }
        }),
        // The host's loopback port an IP entry allows: reached directly by clients that bypass
        // the proxy, and relayed here for those that do not (NO_PROXY is fixed at launch, and an
        // entry added to a running sandbox is not in it). Any other port is refused.
        Target::Ip(ip) if *ip == IpAddr::V4(p.gate_addr) && host_loopback(p, *ip, port) => true,
        Target::Ip(ip) if *ip == IpAddr::V4(p.gate_addr) => {
            return Err(Denial {
                allow: Some(format!("{ip}:{port}")),
                ..deny(
                    403,
                    format!("{ip}:{port} is gate_addr, the host's loopback mapping"),
                    format!(
                        "blocked by ai-sandbox: {ip}:{port} is a port of the host's loopback that is not allowed; to allow it, add \"allow = {ip}:{port}\" to {}",
                        p.config_path
                    ),
                )
            });
        }
        Target::Ip(ip) => {
            never_dialled(*ip)?;
            crate::policy::gate_relays(&p.allow.nets, p.gate_addr, *ip, port)
        }
    };
    if allowed {
        return Ok(());
    }
    let line = suggestion(t, port, &p.gate_ports);
    Err(Denial {
        askable: true,
        allow: Some(line.clone()),
        ..deny(
            403,
            format!("{t}:{port} is not in the allowlist"),
            format!("blocked by ai-sandbox: add \"allow = {line}\" to {}", p.config_path),
        )
    })
}

/// An address an address budget covers is not relayed: its line is counted by the sandbox's
/// rules on the direct path (an nftables quota), which the gate's relay would go around; the
/// address is in NO_PROXY, so a client reaches it directly (docs/adr/0074).
fn budgeted_address(p: &SessionPolicy, ip: IpAddr, port: u16) -> Result<(), Denial> {
    let ip = canonical(ip);
    let Some(b) = p.net_budgets.iter().find(|b| b.net.contains(ip)) else { return Ok(()) };
    let at = match ip {
        IpAddr::V6(a) => format!("[{a}]:{port}"),
        a => format!("{a}:{port}"),
    };
    Err(deny(
        403,
        format!("{at} has an address budget (budget = {b}), counted on the direct path only"),
        format!(
            "blocked by ai-sandbox: {at} is counted by `budget = {b}` on a direct connection, not through the proxy; it is in NO_PROXY: connect directly (a client that ignores NO_PROXY: unset the proxy variables for it)"
        ),
    ))
}

/// Whether a learning run relays what `check_target` refused as `d`: only a hostname, only on
/// one of the gate's ports, only when the allowlist alone said no (`askable`: not a `deny` line,
/// not an address class the gate never dials), and never a host the config gave rules (its
/// requests are the config's to judge, which needs the TLS a learned tunnel never opens). The
/// resolved addresses are still checked (`check_address`), and the SNI against the name.
pub(crate) fn learns(p: &SessionPolicy, t: &Target, port: u16, d: &Denial) -> bool {
    match t {
        Target::Name(n) => {
            p.learn && d.askable && p.gate_ports.contains(&port) && !crate::policy::rule::ruled(&p.rules, n)
        }
        Target::Ip(_) => false,
    }
}

/// Whether `ip:port` is gate_addr on a port an IP entry allows: the host's own 127.0.0.1:`port`,
/// which the gate then dials (see `check_target`).
pub(crate) fn host_loopback(p: &SessionPolicy, ip: IpAddr, port: u16) -> bool {
    let ip = canonical(ip);
    ip == IpAddr::V4(p.gate_addr) && crate::policy::allow::reaches(&p.allow.nets, ip, port)
}

/// `p` with `t:port` allowed, for one request a watcher let through once (and, for a request a
/// host's rules refused, the rule line its refusal named).
pub(crate) fn with_once(p: &SessionPolicy, t: &Target, port: u16, allow: Option<&str>) -> SessionPolicy {
    let mut out = p.clone();
    if let Some(Ok(rules)) = allow.and_then(|a| a.strip_prefix("rule = ")).map(crate::policy::rule::parse) {
        out.rules.extend(rules);
    }
    match t {
        Target::Name(n) => out.allow.hosts.push((HostPattern::Exact(n.clone()), Some(Ports::one(port)))),
        Target::Ip(ip) => out.allow.nets.push((IpNet::host(*ip), Ports::one(port))),
    }
    out
}

/// `deny =` entries win over allow entries: a name matching a denied pattern (on a denied port;
/// no port: any), or an address inside a denied network and port range.
fn denied(p: &SessionPolicy, t: &Target, port: u16) -> Result<(), Denial> {
    let hit = match t {
        Target::Name(n) => p.allow.deny_hosts.iter().find_map(|(pat, ports)| {
            (pattern_matches(pat, n) && ports.is_none_or(|r| r.contains(&Ports::one(port)))).then(|| {
                match ports {
                    Some(r) => format!("{pat}:{r}"),
                    None => pat.to_string(),
                }
            })
        }),
        Target::Ip(ip) => deny_net(p, *ip, port),
    };
    match hit {
        None => Ok(()),
        Some(line) => Err(deny(
            403,
            format!("{t}:{port} is denied by `deny = {line}`"),
            format!("blocked by ai-sandbox: {t}:{port} is refused by \"deny = {line}\" in {}", p.config_path),
        )),
    }
}

/// The `deny` entry of `p` covering `ip`:`port`, as its line reads (`deny = LINE`).
pub(crate) fn deny_net(p: &SessionPolicy, ip: IpAddr, port: u16) -> Option<String> {
    let ip = canonical(ip);
    p.allow
        .deny_nets
        .iter()
        .find(|(n, r)| n.contains(ip) && r.contains(&Ports::one(port)))
        .map(|(n, r)| if *r == Ports::ALL { n.to_string() } else { format!("{n}:{r}") })
}

/// A refusal's hint as an HTTP reason phrase: printable characters only (a config path with a
/// control character cannot break the status line), at most 400 bytes.
pub(crate) fn reason_phrase(hint: &str) -> String {
    let mut out: String = hint.chars().map(|c| if c.is_control() { '?' } else { c }).collect();
    if out.len() > 400 {
        let mut end = 400;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    if out.is_empty() { "Forbidden".into() } else { out }
}

/// Address classes the gate never dials, whatever the allowlist says. `Ok(true)` for a
/// private address (reached only when an IP entry allows it explicitly).
fn never_dialled(ip: IpAddr) -> Result<bool, Denial> {
    let ip = canonical(ip);
    let never = |what: &str| {
        deny(
            403,
            format!("{ip} is {what}, which the gate never dials"),
            match ip {
                a if a.is_loopback() => format!(
                    "blocked by ai-sandbox: loopback addresses are not reachable through the gate (to reach the host's 127.0.0.1:PORT, allow {}:PORT: it is reached directly)",
                    crate::policy::DEFAULT_GATE_ADDR
                ),
                a if a == IpAddr::V4(crate::policy::addr::NESTED_SANDBOX_ADDR) => format!(
                    "blocked by ai-sandbox: {a} is the sandbox itself, as its containers reach it (the gate, published ports): a client there connects to it directly (it is in their NO_PROXY; one that ignores NO_PROXY sent it to the proxy)"
                ),
                _ => format!("blocked by ai-sandbox: {what} addresses are not reachable through the gate"),
            },
        )
    };
    match crate::policy::addr::classify(ip) {
        Some(c) if c.never() => Err(never(c.words())),
        Some(_) => Ok(true),
        None => Ok(false),
    }
}

/// A resolved address: never-classes refused, private ones reached only when an IP/CIDR entry
/// allows that address and port explicitly.
pub(crate) fn check_address(p: &SessionPolicy, ip: IpAddr, port: u16) -> Result<(), Denial> {
    let ip = canonical(ip);
    if let Some(line) = deny_net(p, ip, port) {
        return Err(deny(
            403,
            format!("resolves to {ip}, denied by `deny = {line}`"),
            format!(
                "blocked by ai-sandbox: it resolves to {ip}, refused by \"deny = {line}\" in {}",
                p.config_path
            ),
        ));
    }
    let private = never_dialled(ip)?;
    if private && !crate::policy::gate_relays(&p.allow.nets, p.gate_addr, ip, port) {
        let line = match ip {
            IpAddr::V6(a) => format!("[{a}]:{port}"),
            a => format!("{a}:{port}"),
        };
        return Err(deny(
            403,
            format!("resolves to the private address {ip}"),
            format!(
                "blocked by ai-sandbox: {ip} is a private address; if that is intended, add \"allow = {line}\" to {}",
                p.config_path
            ),
        ));
    }
    Ok(())
}

/// A pinned address for `name`, if the `resolve =` pins have one.
pub(crate) fn pinned(resolve: &[(String, IpAddr)], name: &str) -> Option<IpAddr> {
    resolve.iter().find(|(n, _)| n == name).map(|(_, ip)| *ip)
}

/// The SNI verdict for a CONNECT to a TLS port: the ClientHello must name exactly the CONNECT
/// host (an IP target: no SNI at all). `Err` holds the reason logged for the refusal.
pub(crate) fn sni_verdict(hello: &Hello, target: &Target) -> Result<(), String> {
    match (hello, target) {
        (Hello::Sni(Some(sni)), Target::Name(n)) if sni == n => Ok(()),
        (Hello::Sni(None), Target::Ip(_)) => Ok(()),
        (Hello::Sni(Some(sni)), _) => Err(format!("TLS SNI `{sni}` differs from the CONNECT host {target}")),
        (Hello::Sni(None), _) => Err("TLS ClientHello without SNI".to_string()),
        (Hello::NotTls(why), _) => Err(format!("not TLS on a TLS port: {why}")),
        (Hello::NeedMore(_), _) => Err("ClientHello too large".to_string()),
    }
}

/// How a request without a usable token (answered 407) is logged, and why: a challenge to a
/// client that sent no credentials yet (git, pip and others retry with them), a refusal of
/// credentials that do not match (an old or stolen token).
pub(crate) fn unauthenticated(presented_token: bool) -> (crate::gate::log::Decision, &'static str) {
    use crate::gate::log::Decision;
    if presented_token {
        (Decision::Deny, "wrong or expired session token")
    } else {
        (
            Decision::Challenge,
            "no proxy credentials yet (407 challenge; clients retry with the session token)",
        )
    }
}

/// A request a host's rules let through, in the spelling the gate forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuleMatch {
    /// Uppercase.
    pub(crate) method: String,
    /// The normal path and the query as sent (what goes upstream).
    pub(crate) target: String,
    /// The normal path alone (what the log shows).
    pub(crate) path: String,
    /// The `rule =` value that allowed it.
    pub(crate) rule: String,
    /// A push limited by ref: the patterns its commands must match (`gate::push`).
    pub(crate) refs: Option<Vec<String>>,
    /// An MCP endpoint: the tools it may call and list (`gate::mcp`).
    pub(crate) tools: Option<Vec<String>>,
}

/// The rules' verdict on one request (pure), from either path (`gate::view`): `Ok(None)` when
/// its host has no rules (allowed whole, as before), the rule that allows it, or the refusal with
/// the line that would allow it. A target the gate would have to guess about is refused whatever
/// the rules say.
pub(crate) fn check_request(p: &SessionPolicy, r: &View) -> Result<Option<RuleMatch>, Denial> {
    use crate::policy::{rule, url_path};
    let host = r.host;
    if !rule::ruled(&p.rules, host) {
        return Ok(None);
    }
    let method = r.method.to_ascii_uppercase();
    let normal = url_path::normalise(r.target).map_err(|why| {
        deny(
            400,
            format!("the request target has {why}"),
            format!(
                "blocked by ai-sandbox: the request target has {why}; {host} has rules, and the gate does not guess how its server would read such a path"
            ),
        )
    })?;
    let path = normal.path();
    match rule::allowing(&p.rules, host, &method, &normal) {
        Some(r) => {
            let refs = rule::push_refs(&p.rules, host, &method, &normal);
            let tools = rule::mcp_tools(&p.rules, host, &normal);
            Ok(Some(RuleMatch { target: normal.target(), path, rule: r.line.clone(), refs, tools, method }))
        }
        // A path a rule line would read as a pattern: no line is offered.
        None if !rule::line_can_name(&path) => Err(Denial {
            path: Some(path.clone()),
            ..deny(
                403,
                format!("{method} {path} matches no rule for {host}"),
                format!(
                    "blocked by ai-sandbox: {host} has rules, and none allows {method} {path}; no line is offered, since a rule reads `*` as a pattern (write the line you mean in {})",
                    p.config_path
                ),
            )
        }),
        None => {
            let line = format!("rule = {}", rule::suggestion(host, &method, &normal));
            Err(Denial {
                askable: true,
                allow: Some(line.clone()),
                path: Some(path.clone()),
                ..deny(
                    403,
                    format!("{method} {path} matches no rule for {host}"),
                    format!(
                        "blocked by ai-sandbox: add \"{line}\" to {} ({host} has rules, and none allows {method} {path})",
                        p.config_path
                    ),
                )
            })
        }
    }
}

/// A CONNECT to a host with rules on a port the gate does not open TLS on: its requests could
/// not be read, so it is refused (plain HTTP goes through the proxy as a forward request).
pub(crate) fn unreadable(p: &SessionPolicy, t: &Target, port: u16, tls_ports: &[u16]) -> Result<(), Denial> {
    match t {
        Target::Name(n) if !tls_ports.contains(&port) && crate::policy::rule::ruled(&p.rules, n) => {
            Err(deny(
                403,
                format!("{n} has rules, and a tunnel to port {port} would hide its requests"),
                format!(
                    "blocked by ai-sandbox: {n} has rules, which the gate checks on HTTPS (443, 8443) and on plain HTTP sent through the proxy, not in a tunnel to port {port}"
                ),
            ))
        }
        _ => Ok(()),
    }
}
