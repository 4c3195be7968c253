//! One `allow` entry: a hostname (for the gate), a `*.suffix` wildcard, or an IP/CIDR
//! (for netfilter), each with an optional port or port range.
//!
//! Normalisation happens here so every later stage sees one spelling: lowercase names
//! without a trailing dot, IPv4-mapped IPv6 written as IPv4, CIDRs with no host bits.
//! Anything that a resolver or `inet_aton` might read differently from a human (hex, octal,
//! or dotless IPv4, numeric "TLDs", userinfo, URLs, paths) is refused with a hint.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// An inclusive port range; a single port has `lo == hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Ports {
    pub(crate) lo: u16,
    pub(crate) hi: u16,
}

impl Ports {
    pub(crate) const ALL: Ports = Ports { lo: 1, hi: 65535 };
    pub fn one(p: u16) -> Ports {
        Ports { lo: p, hi: p }
    }
    pub(crate) fn contains(&self, other: &Ports) -> bool {
        self.lo <= other.lo && other.hi <= self.hi
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi { write!(f, "{}", self.lo) } else { write!(f, "{}-{}", self.lo, self.hi) }
    }
}

/// An address with a prefix length; host bits are always zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct IpNet {
    pub(crate) addr: IpAddr,
    pub(crate) len: u8,
}

impl IpNet {
    pub(crate) fn max_len(addr: &IpAddr) -> u8 {
        if addr.is_ipv4() { 32 } else { 128 }
    }
    pub(crate) fn host(addr: IpAddr) -> IpNet {
        IpNet { addr, len: Self::max_len(&addr) }
    }
    /// The network of `addr/len` (host bits cleared). `len` beyond the family's maximum is
    /// clamped to it.
    pub(crate) fn masked(addr: IpAddr, len: u8) -> IpNet {
        let len = len.min(Self::max_len(&addr));
        let net = ipnet::IpNet::new(addr, len).expect("prefix length within the family's range").trunc();
        IpNet { addr: net.addr(), len }
    }
    pub fn is_v4(&self) -> bool {
        self.addr.is_ipv4()
    }
    fn as_ipnet(&self) -> ipnet::IpNet {
        ipnet::IpNet::new(self.addr, self.len).expect("a valid prefix length")
    }
    /// True when `other` lies entirely inside `self` (same family).
    pub(crate) fn contains_net(&self, other: &IpNet) -> bool {
        self.as_ipnet().contains(&other.as_ipnet())
    }
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        self.contains_net(&IpNet::host(ip))
    }
    /// True when the two share an address: one holds the other (networks never partly overlap;
    /// different families never do).
    pub(crate) fn overlaps(&self, other: &IpNet) -> bool {
        self.contains_net(other) || other.contains_net(self)
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.len == Self::max_len(&self.addr) {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.len)
        }
    }
}

/// What may be reached and what may not, entry by entry: the one shape the launch's policy, the
/// gate's session policy (`contract::SessionPolicy`, which carries it flattened, so its JSON is
/// the four fields as before) and a live change share. Hostnames go to the gate, networks to
/// nftables; `deny_*` wins over `hosts`/`nets` at both layers.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Allowlist {
    pub hosts: Vec<(HostPattern, Option<Ports>)>,
    /// IP/CIDR entries as written (normalised), in order, deduplicated.
    pub nets: Vec<(IpNet, Ports)>,
    /// `deny =` entries: refused even where an allow entry matches.
    #[serde(default)]
    pub deny_hosts: Vec<(HostPattern, Option<Ports>)>,
    #[serde(default)]
    pub deny_nets: Vec<(IpNet, Ports)>,
}

/// A hostname pattern enforced by the gate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum HostPattern {
    /// `github.com`: this name only.
    Exact(String),
    /// `*.npmjs.org`: any name strictly below the suffix, at a label boundary.
    Suffix(String),
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(h) => write!(f, "{h}"),
            HostPattern::Suffix(s) => write!(f, "*.{s}"),
        }
    }
}

impl HostPattern {
    /// Whether `name` (normalised: lowercase, no trailing dot) is this pattern's.
    pub(crate) fn matches(&self, name: &str) -> bool {
        match self {
            HostPattern::Exact(h) => name == h,
            // Strictly below the suffix, at a label boundary: `evilnpmjs.org` does not match.
            HostPattern::Suffix(s) => {
                name.len() > s.len() + 1
                    && name.ends_with(s.as_str())
                    && name.as_bytes()[name.len() - s.len() - 1] == b'.'
            }
        }
    }
}

/// Whether an IP entry of `entries` covers `ip`:`port`.
pub(crate) fn reaches(entries: &[(IpNet, Ports)], ip: IpAddr, port: u16) -> bool {
    entries.iter().any(|(n, r)| n.contains(ip) && r.contains(&Ports::one(port)))
}

/// One spelling per destination: an IPv4-mapped IPv6 address is the IPv4 address it maps.
/// (IPv4-compatible `::a.b.c.d` is deprecated and left as IPv6.)
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// A parsed, normalised allow entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allow {
    /// Enforced by the gate; `None` ports means the gate's default ports.
    Host(HostPattern, Option<Ports>),
    /// Enforced by netfilter; `None` ports means every TCP port.
    Net(IpNet, Option<Ports>),
}

impl Allow {
    /// Whether a `deny` line of this entry refuses what `other` allows, in part or whole: a name
    /// it names or is below; an address or network it holds or shares addresses with (ports
    /// aside: a deny line's own ports narrow what it refuses, and any overlap is a refusal).
    pub(crate) fn refuses(&self, other: &Allow) -> bool {
        match (self, other) {
            (Allow::Host(d, _), Allow::Host(HostPattern::Exact(n), _)) => d.matches(n),
            (Allow::Host(HostPattern::Suffix(d), _), Allow::Host(HostPattern::Suffix(s), _)) => {
                s == d || s.ends_with(&format!(".{d}"))
            }
            (Allow::Net(d, _), Allow::Net(n, _)) => d.overlaps(n),
            // A single name never refuses a whole domain; a name never refuses an address.
            _ => false,
        }
    }
}

/// A rejected entry: the reason and a hint saying what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad {
    pub(crate) reason: String,
    pub(crate) hint: String,
}

fn bad(reason: impl Into<String>, hint: impl Into<String>) -> Bad {
    Bad { reason: reason.into(), hint: hint.into() }
}

/// Whether `name` is itself a public suffix (`com`, `co.uk`, `github.io`): a wildcard under it
/// would cover hosts of unrelated owners. From the Public Suffix List (ICANN and private
/// sections) as compiled into the `psl` crate, which tracks the list's releases.
fn is_public_suffix(name: &str) -> bool {
    psl::suffix_str(name) == Some(name)
}

/// Mistakes of form rather than content, each with the spelling that works: quotes, several
/// entries on one line, a `#` comment without a space before it, a TOML array.
fn shape_mistake(s: &str) -> Option<Bad> {
    let quoted = s.len() >= 2
        && ((s.starts_with('"') && s.ends_with('"')) || (s.starts_with('\'') && s.ends_with('\'')));
    if s.starts_with('[') && (s.contains('"') || s.contains('\'') || s.contains(", ")) {
        let items: Vec<&str> =
            s.trim_matches(['[', ']']).split(',').map(|i| i.trim().trim_matches(['"', '\''])).collect();
        let lines: Vec<String> = items.iter().map(|i| format!("`allow = {i}`")).collect();
        return Some(bad(
            format!("`{s}` is a TOML-style list; this file takes one entry per line"),
            format!("write one line each: {}", lines.join(", ")),
        ));
    }
    if quoted {
        let inner = &s[1..s.len() - 1];
        return Some(bad(
            format!("`{s}` is quoted"),
            format!("values are written without quotes: `allow = {inner}`"),
        ));
    }
    if let Some((before, _)) = s.split_once('#') {
        return Some(bad(
            format!("`{s}` contains `#`"),
            format!("a comment needs whitespace before `#`: `allow = {before}   # ...`"),
        ));
    }
    if s.contains(',') {
        let lines: Vec<String> = s.split(',').map(|i| format!("`allow = {}`", i.trim())).collect();
        return Some(bad(
            format!("`{s}` lists several entries"),
            format!("one entry per line: {}", lines.join(", ")),
        ));
    }
    None
}

/// Parses one allow entry as written by the user.
pub fn parse(input: &str) -> Result<Allow, Bad> {
    let s = input.trim();
    if s.is_empty() {
        return Err(bad("empty allow entry", "write a hostname or an IP, e.g. `allow = github.com`"));
    }
    if let Some(shape) = shape_mistake(s) {
        return Err(shape);
    }
    if let Some((scheme, rest)) = s.split_once("://") {
        let host = rest.split(['/', '?', '#']).next().unwrap_or("");
        return Err(bad(
            format!("`{s}` is a URL ({scheme}://), not a host"),
            format!("write the host alone: `allow = {host}`"),
        ));
    }
    if s.contains('@') {
        return Err(bad(
            format!("`{s}` contains `@` (user information)"),
            "write the host alone, without `user@`",
        ));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(
            format!("`{}` contains whitespace or a control character", s.escape_debug()),
            "one entry per `allow` line",
        ));
    }
    if s == "*" || s == "*.*" {
        return Err(bad(
            "`*` would allow every host",
            "list the hosts the agent needs, or run with `--net full` (no egress policy)",
        ));
    }
    // `[v6]`, `[v6]:port`, `[v6/len]:port`
    if let Some(rest) = s.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or_else(|| bad(format!("`{s}`: missing `]`"), "write IPv6 as `[2001:db8::1]:443`"))?;
        let ports = match after {
            "" => None,
            p => Some(
                parse_ports(p.strip_prefix(':').ok_or_else(|| {
                    bad(format!("`{s}`: expected `:PORT` after `]`"), "write `[2001:db8::1]:443`")
                })?)
                .map_err(in_entry(s))?,
            ),
        };
        return net_entry(inside, ports, s);
    }
    // A path after the host (`github.com/org`) cannot be enforced: the gate sees host names.
    let (addr_part, path) = match s.find('/') {
        Some(i) => (&s[..i], Some(&s[i..])),
        None => (s, None),
    };
    if let Some(path) = path {
        // `10.0.0.0/8` and `10.0.0.0/8:443` are CIDRs, not paths.
        let len_part = path[1..].split(':').next().unwrap_or("");
        let is_cidr = !len_part.is_empty() && len_part.chars().all(|c| c.is_ascii_digit());
        if !is_cidr {
            return Err(bad(
                format!("`{s}`: paths cannot be allowed, only hosts"),
                format!("the gate sees host names only: `allow = {addr_part}`"),
            ));
        }
    }
    let colons = s.matches(':').count();
    if colons >= 2 {
        // Bare IPv6 (no port possible without brackets); but `2001:db8::1:443` reads as an
        // address *and* as an address with a port: say so rather than guess.
        if let Some((before, last)) = s.rsplit_once(':')
            && last.len() >= 2
            && last.chars().all(|c| c.is_ascii_digit())
            && before.parse::<std::net::Ipv6Addr>().is_ok()
        {
            return Err(bad(
                format!("`{s}` is ambiguous: the IPv6 address {s} (every port), or {before} port {last}"),
                format!("did you mean `[{before}]:{last}`? For the address itself write `[{s}]`"),
            ));
        }
        return net_entry(s, None, s);
    }
    let (host, ports) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(parse_ports(p).map_err(in_entry(s))?)),
        None => (s, None),
    };
    if host.contains('/') || host.parse::<IpAddr>().is_ok() {
        return net_entry(host, ports, s);
    }
    host_entry(host, ports, s)
}

const PORT_HINT: &str = "ports are 1-65535, e.g. `:5432` or `:8000-8100`";

/// One port; the reason says what is wrong with *this* text (callers add which entry).
fn parse_port(p: &str) -> Result<u16, Bad> {
    if p.is_empty() {
        return Err(bad("the port is missing", PORT_HINT));
    }
    if let Some(n) = p.strip_prefix('-')
        && !n.is_empty()
        && n.chars().all(|c| c.is_ascii_digit())
    {
        return Err(bad(format!("ports cannot be negative (`{p}`)"), PORT_HINT));
    }
    if !p.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad(format!("`{p}` is not a port number"), PORT_HINT));
    }
    match p.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => Ok(n as u16),
        _ => Err(bad(format!("port {p} is out of range (1-65535)"), PORT_HINT)),
    }
}

/// `N` or `N-M` with `1 <= N <= M <= 65535`.
pub(crate) fn parse_ports(p: &str) -> Result<Ports, Bad> {
    match p.split_once('-') {
        // `-1`: a negative number, not a range with a missing start.
        Some(("", rest)) if !rest.contains('-') => parse_port(p).map(Ports::one),
        None => parse_port(p).map(Ports::one),
        Some((a, b)) => {
            if a.is_empty() || b.is_empty() {
                let which = if a.is_empty() { "start" } else { "end" };
                return Err(bad(format!("port range `{p}` is missing its {which}"), PORT_HINT));
            }
            let (lo, hi) = (parse_port(a)?, parse_port(b)?);
            if lo > hi {
                return Err(bad(format!("port range `{p}` is backwards"), format!("write `{hi}-{lo}`")));
            }
            Ok(Ports { lo, hi })
        }
    }
}

/// Adds which entry a port problem belongs to.
fn in_entry(whole: &str) -> impl Fn(Bad) -> Bad + '_ {
    move |b| Bad { reason: format!("`{whole}`: {}", b.reason), hint: b.hint }
}

fn net_entry(addr: &str, ports: Option<Ports>, whole: &str) -> Result<Allow, Bad> {
    let (ip_text, len_text) = match addr.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (addr, None),
    };
    let ip: IpAddr = ip_text.parse().map_err(|_| {
        bad(
            format!("`{whole}`: `{ip_text}` is not an IP address"),
            "write IPv4 as `1.2.3.4` and IPv6 as `2001:db8::1` (in brackets with a port)",
        )
    })?;
    // IPv4-mapped IPv6 is the IPv4 address: one spelling for one destination.
    let (ip, shift) = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => (IpAddr::V4(v4), 96),
            None => (ip, 0),
        },
        v4 => (v4, 0),
    };
    let max = IpNet::max_len(&ip);
    let len = match len_text {
        None => max,
        Some(l) => match l.parse::<u16>() {
            Ok(n) if n >= shift && usize::from(n - shift) <= usize::from(max) && !l.starts_with('+') => {
                (n - shift) as u8
            }
            _ => {
                return Err(bad(
                    format!("`{whole}`: prefix length `/{l}` is out of range"),
                    "IPv4 prefixes are /0 to /32, IPv6 /0 to /128",
                ));
            }
        },
    };
    let net = IpNet::masked(ip, len);
    if net.addr != ip {
        return Err(bad(
            format!("`{whole}`: {ip}/{len} has host bits set"),
            format!("did you mean `{net}`?"),
        ));
    }
    if len == 0 {
        return Err(bad(
            format!("`{whole}` would allow every address"),
            "list the networks the agent needs, or run with `--net full` (no egress policy)",
        ));
    }
    let loopback = IpNet::masked("127.0.0.0".parse().unwrap(), 8);
    if loopback.overlaps(&net) || ip == IpAddr::V6(Ipv6Addr::LOCALHOST) {
        return Err(bad(
            format!("`{whole}`: inside the sandbox, loopback is the sandbox itself (always allowed)"),
            "to reach a service on the host's 127.0.0.1:PORT, allow `100.64.0.1:PORT` (gate_addr)",
        ));
    }
    if ip.is_unspecified() {
        return Err(bad(
            format!("`{whole}`: the unspecified address reaches nothing"),
            "write a real address",
        ));
    }
    Ok(Allow::Net(net, ports))
}

/// Strict `inet_aton` spellings (`0x7f.1`, `017700000001`, `2130706433`): refused, because the
/// gate's resolver and a human would read them differently.
fn looks_like_odd_ipv4(host: &str) -> bool {
    let parts: Vec<&str> = host.split('.').collect();
    parts.len() <= 4
        && parts.iter().all(|p| {
            let p = p.to_ascii_lowercase();
            !p.is_empty()
                && (p.chars().all(|c| c.is_ascii_digit())
                    || (p.starts_with("0x") && p[2..].chars().all(|c| c.is_ascii_hexdigit())))
        })
}

/// A DNS label as the gate accepts it: letters, digits, `-` (not at either end) and `_`.
pub(crate) fn valid_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

fn host_entry(host: &str, ports: Option<Ports>, whole: &str) -> Result<Allow, Bad> {
    let (wild, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host),
    };
    if name.contains('*') {
        return Err(bad(
            format!("`{whole}`: `*` may only start the entry, as `*.example.com`"),
            "write `*.example.com` (subdomains) or the exact name",
        ));
    }
    if !name.is_ascii() {
        return Err(bad(
            format!("`{whole}`: internationalised names are not accepted as written"),
            "write the punycode form (`xn--...`), which is what the gate compares",
        ));
    }
    let lower = name.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if looks_like_odd_ipv4(name) {
        return Err(bad(
            format!(
                "`{whole}` looks like an IPv4 address but is not plain dotted decimal (an unusual spelling, or out of range)"
            ),
            "write IPv4 addresses as four decimal numbers 0-255, e.g. `192.0.2.10`",
        ));
    }
    if name.len() > 253 {
        return Err(bad(format!("`{whole}`: name longer than 253 characters"), "check the name"));
    }
    let labels: Vec<&str> = name.split('.').collect();
    for l in &labels {
        let ok = !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && !l.starts_with('-')
            && !l.ends_with('-');
        if !ok {
            return Err(bad(
                format!("`{whole}`: `{l}` is not a valid DNS label"),
                "labels are letters, digits and `-`, 1-63 characters, separated by single dots",
            ));
        }
    }
    if labels.last().is_some_and(|l| l.chars().all(|c| c.is_ascii_digit())) {
        return Err(bad(
            format!("`{whole}`: a numeric last label is neither a name nor an IPv4 address"),
            "write a full IPv4 address (`1.2.3.4`) or a hostname",
        ));
    }
    if name == "localhost" || name.ends_with(".localhost") {
        return Err(bad(
            format!("`{whole}`: localhost inside the sandbox is the sandbox itself"),
            "to reach a service on the host's 127.0.0.1:PORT, allow `100.64.0.1:PORT` (gate_addr)",
        ));
    }
    if wild && (labels.len() < 2 || is_public_suffix(name)) {
        return Err(bad(
            format!(
                "`{whole}` covers a public suffix (`{name}` is on the Public Suffix List): hosts of unrelated owners"
            ),
            format!("allow the names you need under it, e.g. `*.myproject.{name}`"),
        ));
    }
    if labels.len() < 2 {
        return Err(bad(
            format!("`{whole}`: single-label names are ambiguous (search domains)"),
            "write the fully qualified name, e.g. `api.example.com`",
        ));
    }
    let pattern =
        if wild { HostPattern::Suffix(name.to_string()) } else { HostPattern::Exact(name.to_string()) };
    Ok(Allow::Host(pattern, ports))
}

#[cfg(test)]
mod refuses_tests {
    use super::*;

    #[test]
    fn a_deny_line_refuses_what_it_names_what_is_below_it_and_what_shares_an_address() {
        let p = |s: &str| parse(s).unwrap();
        let refuses = |d: &str, a: &str| p(d).refuses(&p(a));
        assert!(refuses("x.test", "x.test") && refuses("x.test", "x.test:8080"));
        assert!(
            refuses("*.b.test", "c.b.test")
                && refuses("*.b.test", "*.c.b.test")
                && refuses("*.b.test", "*.b.test")
        );
        assert!(
            !refuses("*.b.test", "b.test")
                && !refuses("*.b.test", "cb.test")
                && !refuses("x.test", "*.x.test")
        );
        assert!(!refuses("x.test", "y.test") && !refuses("*.c.b.test", "*.b.test"));
        assert!(refuses("10.0.0.0/8", "10.1.2.3:443") && refuses("10.1.2.3", "10.0.0.0/8"));
        assert!(
            !refuses("10.0.0.0/8", "11.0.0.1")
                && !refuses("x.test", "10.0.0.1")
                && !refuses("10.0.0.1", "x.test")
        );
    }
}
