//! `budget = HOST BYTES`: how much a sandbox may send to an allowed host through the gate in one
//! session. An allowed host that accepts uploads (a registry, a paste service, an API with a
//! large request body) otherwise carries anything at line rate; a budget caps it, and the gate
//! refuses past it (docs/adr/0066). `budget = * BYTES` is the default for every host without a
//! line of its own, each host counted apart. `budget = ADDRESS[/LEN] BYTES` caps what leaves to
//! an IP entry, which never passes the gate: the sandbox's own rules count it, in an nftables
//! quota (docs/adr/0068). Pure: the line's reading and which line a host falls under; the gate
//! and the rules count.

use super::allow::{self, Allow, HostPattern, IpNet, Ports};
use super::limits::{parse_size, show_size};

/// One `budget` line, read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Budget {
    /// `None`: `*`, every host without a line of its own (each counted apart).
    pub host: Option<HostPattern>,
    /// What may be sent to it, in bytes: in one session, or in each `period`.
    pub bytes: u64,
    /// `SIZE/day`: counted over every session of the project, anew each window (ADR 0069).
    /// A gate of the previous version would count it per session, so registration must hear
    /// `periods` said back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
}

impl Budget {
    /// `1m`, or `1m/day`: the size as the line writes it.
    pub(crate) fn size(&self) -> String {
        per(self.bytes, self.period)
    }
}

fn per(bytes: u64, period: Option<Period>) -> String {
    match period {
        Some(p) => format!("{}/{}", show_size(bytes), p.word()),
        None => show_size(bytes),
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            Some(h) => write!(f, "{h} {}", self.size()),
            None => write!(f, "* {}", self.size()),
        }
    }
}

/// A budget's window: fixed in UTC (the hour, the day from 00:00, the week from Monday
/// 00:00), the same for every session and every gate, so a count is kept by its window's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    Hour,
    Day,
    Week,
}

impl Period {
    const ALL: [Period; 3] = [Period::Hour, Period::Day, Period::Week];

    /// The period a line's word names (`word`'s inverse: one table of words).
    fn read(w: &str) -> Option<Period> {
        Period::ALL.into_iter().find(|p| p.word() == w)
    }

    pub(crate) fn word(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Week => "week",
        }
    }

    /// `today`, `this hour`, `this week`: the window a count is for, in words.
    pub(crate) fn this(self) -> &'static str {
        match self {
            Period::Hour => "this hour",
            Period::Day => "today",
            Period::Week => "this week",
        }
    }

    fn secs(self) -> u64 {
        match self {
            Period::Hour => 3600,
            Period::Day => 86400,
            Period::Week => 7 * 86400,
        }
    }

    /// Weeks start on Monday: the epoch was a Thursday, 3 days after one.
    fn shift(self) -> u64 {
        if self == Period::Week { 3 * 86400 } else { 0 }
    }

    /// The window `unix_secs` falls in.
    pub(crate) fn window(self, unix_secs: u64) -> u64 {
        (unix_secs + self.shift()) / self.secs()
    }

    /// When window `w` ends (the next one starts), in seconds since the epoch.
    pub(crate) fn end(self, w: u64) -> u64 {
        ((w + 1) * self.secs()).saturating_sub(self.shift())
    }
}

/// A budget for an address or a network (`budget = 192.0.2.10 1m`): what the sandbox may send
/// to it in one session, IP headers included, counted by the sandbox's rules (its addresses
/// share one count, as a wildcard's hosts do).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetBudget {
    pub net: IpNet,
    pub bytes: u64,
}

impl std::fmt::Display for NetBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.net, show_size(self.bytes))
    }
}

/// A `budget` line: for names (the gate counts) or for addresses (the rules count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Host(Budget),
    Net(NetBudget),
}

impl Line {
    /// Whether both lines are for the same host or network (one line each: a later one
    /// replaces it).
    pub(crate) fn same_target(&self, other: &Line) -> bool {
        match (self, other) {
            (Line::Host(a), Line::Host(b)) => a.host == b.host,
            (Line::Net(a), Line::Net(b)) => a.net == b.net,
            _ => false,
        }
    }
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Line::Host(b) => b.fmt(f),
            Line::Net(b) => b.fmt(f),
        }
    }
}

/// A line that does not read: what is wrong, and what to write.
pub type Bad = (String, String);

const EXAMPLE: &str = "e.g. `budget = registry.npmjs.org 50m` (k, m, g: KiB, MiB, GiB), `budget = * 200m` for every host, or `budget = api.example.com 20m/day` for every session of a day";

/// Reads `HOST BYTES` or `ADDRESS[/LEN] BYTES`.
pub fn parse(v: &str) -> Result<Line, Bad> {
    let words: Vec<&str> = v.split_whitespace().collect();
    let [host, bytes] = words[..] else {
        return Err((format!("`budget = {v}` is not HOST BYTES"), EXAMPLE.into()));
    };
    let (size, period) = match bytes.split_once('/') {
        None => (bytes, None),
        Some((size, word)) => match Period::read(word) {
            Some(p) => (size, Some(p)),
            None => {
                return Err((
                    format!("`budget = {v}`: `/{word}` is not a period"),
                    format!(
                        "write `{size}/hour`, `{size}/day` or `{size}/week` (windows in UTC, shared by the project's sessions), or `{size}` alone for each session"
                    ),
                ));
            }
        },
    };
    let Some(n) = parse_size(size) else {
        return Err((format!("`budget = {v}`: `{size}` is not a size"), EXAMPLE.into()));
    };
    if host == "*" {
        return Ok(Line::Host(Budget { host: None, bytes: n, period }));
    }
    let every_port = |what: String| {
        Err((
            format!("`budget = {v}`: a budget counts what is sent to it on every port"),
            format!("write it alone: `budget = {what} {bytes}`"),
        ))
    };
    match allow::parse(host) {
        Ok(Allow::Host(pattern, None)) => Ok(Line::Host(Budget { host: Some(pattern), bytes: n, period })),
        Ok(Allow::Host(pattern, Some(_))) => every_port(pattern.to_string()),
        Ok(Allow::Net(net, None)) if period.is_some() => Err((
            format!(
                "`budget = {v}`: an address's budget is counted by the sandbox's own rules, for one session; a period is counted by the gate, for names only"
            ),
            format!("write `budget = {net} {size}` (each session gets it anew), or reach the host by name"),
        )),
        Ok(Allow::Net(net, None)) => Ok(Line::Net(NetBudget { net, bytes: n })),
        Ok(Allow::Net(net, Some(_))) => every_port(net.to_string()),
        Err(b) => Err((format!("`budget = {v}`: {}", b.reason), b.hint)),
    }
}

/// Whether an address line is ever reached: an allow entry shares an address with it.
pub(crate) fn net_reached(b: &NetBudget, nets: &[(IpNet, Ports)]) -> bool {
    nets.iter().any(|(n, _)| n.overlaps(&b.net))
}

/// `budgets` with `b` in it: it replaces the line for the same network, or is added.
pub(crate) fn set_net(budgets: &mut Vec<NetBudget>, b: &NetBudget) {
    match budgets.iter_mut().find(|x| x.net == b.net) {
        Some(x) => *x = b.clone(),
        None => budgets.push(b.clone()),
    }
}

/// The line a refusal past a budget offers: the same host or network at twice the size, over
/// the same period (the gate's refusals, the rules' and `watch` all offer this one).
pub(crate) fn raised(target: impl std::fmt::Display, bytes: u64, period: Option<Period>) -> String {
    raised_to(target, bytes.saturating_mul(2), period)
}

/// The line of a budget of `bytes` for `target`.
pub(crate) fn raised_to(target: impl std::fmt::Display, bytes: u64, period: Option<Period>) -> String {
    format!("budget = {target} {}", per(bytes, period))
}

/// `n` rounded up to a whole KiB (under 1 MiB) or MiB, as a line would write a size.
pub(crate) fn round_up(n: u64) -> u64 {
    let unit = if n < 1 << 20 { 1u64 << 10 } else { 1 << 20 };
    n.div_ceil(unit).saturating_mul(unit)
}

/// The budget in an `ai-sandbox allow` item: `budget = HOST SIZE`.
pub fn item(i: &str) -> Option<&str> {
    let rest = i.trim().strip_prefix("budget")?;
    rest.trim_start().strip_prefix('=').map(str::trim)
}

/// `budgets` with `b` in it: it replaces the line for the same host (a live change of a budget),
/// or is added.
pub(crate) fn set(budgets: &mut Vec<Budget>, b: &Budget) {
    match budgets.iter_mut().find(|x| x.host == b.host) {
        Some(x) => *x = b.clone(),
        None => budgets.push(b.clone()),
    }
}

/// Whether a line for `host` is ever reached: the host (or, for a wildcard, a name under it)
/// is allowed. `*` always is.
pub(crate) fn reached(b: &Budget, hosts: &[(HostPattern, Option<Ports>)]) -> bool {
    let name = match &b.host {
        None => return true,
        Some(HostPattern::Exact(n)) => n.clone(),
        Some(HostPattern::Suffix(s)) => format!("x.{s}"),
    };
    hosts.iter().any(|(pat, _)| pat.matches(&name))
}

/// The line `host` falls under, and the key its count is kept by: its own line, else the
/// wildcard line with the longest suffix (a wildcard's hosts share its count), else `*`'s
/// (counted for each host apart).
pub fn of<'a>(budgets: &'a [Budget], host: &str) -> Option<(&'a Budget, String)> {
    if let Some(b) = budgets.iter().find(|b| matches!(&b.host, Some(HostPattern::Exact(h)) if h == host)) {
        return Some((b, host.to_string()));
    }
    let wildcard = budgets
        .iter()
        .filter_map(|b| match &b.host {
            Some(p @ HostPattern::Suffix(s)) if p.matches(host) => Some((b, s.len())),
            _ => None,
        })
        .max_by_key(|(_, len)| *len);
    if let Some((b, _)) = wildcard {
        return Some((b, b.host.as_ref().map(|h| h.to_string()).unwrap_or_default()));
    }
    budgets.iter().find(|b| b.host.is_none()).map(|b| (b, format!("* {host}")))
}

/// A host's line, for tests: `parse` of a line that must be one.
#[cfg(test)]
pub(crate) fn host_line(v: &str) -> Budget {
    match parse(v) {
        Ok(Line::Host(b)) => b,
        other => panic!("`{v}` is not a host's budget line: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_line_reads_host_and_size_and_says_what_is_wrong_otherwise() {
        let b = host_line("registry.npmjs.org 50m");
        assert_eq!(b.host, Some(HostPattern::Exact("registry.npmjs.org".into())));
        assert_eq!(b.bytes, 50 << 20);
        assert_eq!(b.to_string(), "registry.npmjs.org 50m");
        assert_eq!(host_line("*.example.com 1g").host, Some(HostPattern::Suffix("example.com".into())));
        let all = host_line("* 900k");
        assert_eq!((all.host.clone(), all.bytes), (None, 900 << 10));
        assert_eq!(all.to_string(), "* 900k");
        assert_eq!(host_line("Example.COM 1000").bytes, 1000);
        for (line, period) in
            [("a.test 5m/hour", Period::Hour), ("* 1g/day", Period::Day), ("*.a.test 2k/week", Period::Week)]
        {
            let b = host_line(line);
            assert_eq!(b.period, Some(period), "{line}");
            assert_eq!(b.to_string(), line, "written back as read");
        }
        assert_eq!(host_line("a.test 5m").period, None, "one session");
        for (bad, says) in [
            ("example.com", "not HOST BYTES"),
            ("example.com 1m extra", "not HOST BYTES"),
            ("example.com lots", "not a size"),
            ("example.com 0", "not a size"),
            ("example.com 1m/month", "`/month` is not a period"),
            ("example.com x/day", "`x` is not a size"),
            ("192.0.2.1 1m/hour", "for names only"),
            ("example.com:443 1m", "every port"),
            ("192.0.2.1:22 1m", "every port"),
            ("192.0.2.1/24 1m", "host bits"),
            ("https://example.com 1m", "URL"),
        ] {
            let (msg, hint) = parse(bad).unwrap_err();
            assert!(msg.contains(says), "{bad}: {msg}");
            assert!(!hint.is_empty(), "{bad}: a hint");
        }
    }

    #[test]
    fn a_period_is_a_fixed_utc_window_the_same_for_every_session() {
        // 2026-12-03T10:20:00Z, a Thursday.
        let t = 1_796_293_200;
        let day = Period::Day.window(t);
        assert_eq!(Period::Day.end(day), 1_796_342_400, "the next midnight, UTC");
        assert_eq!(Period::Day.window(Period::Day.end(day) - 1), day);
        assert_eq!(Period::Day.window(Period::Day.end(day)), day + 1);
        let hour = Period::Hour.window(t);
        assert_eq!(Period::Hour.end(hour), t + 40 * 60, "the next full hour");
        // Weeks run from Monday 00:00 UTC: the next is 2026-12-07.
        let week = Period::Week.window(t);
        assert_eq!(Period::Week.end(week), 1_796_601_600);
        assert_eq!(Period::Week.window(Period::Week.end(week) - 1), week);
        assert_eq!(Period::Week.window(1_796_601_600 - 7 * 86400), week, "from the Monday before");
        assert_eq!(raised("a.test", 1 << 20, Some(Period::Day)), "budget = a.test 2m/day");
        assert_eq!(raised("192.0.2.1", 1 << 20, None), "budget = 192.0.2.1 2m");
        assert_eq!(
            (Period::Hour.this(), Period::Day.this(), Period::Week.this()),
            ("this hour", "today", "this week")
        );
    }

    #[test]
    fn an_address_line_reads_its_network_and_overlaps_and_reaches_by_address() {
        let Ok(Line::Net(one)) = parse("192.0.2.10 1m") else { panic!("an address line") };
        assert_eq!((one.net.to_string(), one.bytes), ("192.0.2.10".into(), 1 << 20));
        assert_eq!(one.to_string(), "192.0.2.10 1m");
        let Ok(Line::Net(net)) = parse("192.0.2.0/24 5g") else { panic!("a network line") };
        assert_eq!(net.to_string(), "192.0.2.0/24 5g");
        let Ok(Line::Net(v6)) = parse("2001:db8::/32 10k") else { panic!("an IPv6 line") };
        assert!(!v6.net.is_v4());
        assert!(one.net.overlaps(&net.net) && net.net.overlaps(&one.net), "inside, either way round");
        let Ok(Line::Net(other)) = parse("198.51.100.1 1m") else { panic!() };
        assert!(!one.net.overlaps(&other.net) && !v6.net.overlaps(&one.net), "apart, and across families");
        let entry = |e: &str| match allow::parse(e) {
            Ok(Allow::Net(n, p)) => (n, p.unwrap_or(Ports::ALL)),
            _ => panic!("{e}"),
        };
        assert!(net_reached(&one, &[entry("192.0.2.0/28:22")]), "an entry's network holds it");
        assert!(net_reached(&net, &[entry("192.0.2.10:443")]), "it holds an entry");
        assert!(!net_reached(&other, &[entry("192.0.2.10:443")]));
        let a = Line::Net(one.clone());
        assert!(a.same_target(&parse("192.0.2.10 9m").unwrap()));
        assert!(!a.same_target(&Line::Net(net.clone())) && !a.same_target(&parse("* 1m").unwrap()));
        let mut lines = vec![one.clone(), net.clone()];
        set_net(&mut lines, &NetBudget { net: one.net, bytes: 7 });
        set_net(&mut lines, &other);
        assert_eq!(
            lines.iter().map(|b| b.bytes).collect::<Vec<_>>(),
            [7, 5 << 30, 1 << 20],
            "replaced in place"
        );
    }

    #[test]
    fn a_host_falls_under_its_own_line_then_the_longest_wildcard_then_the_default() {
        let lines: Vec<Budget> =
            ["* 10m", "*.example.com 2m", "*.api.example.com 3m", "up.example.com 1m"].map(host_line).into();
        let of = |h: &str| of(&lines, h).map(|(b, key)| (b.bytes >> 20, key));
        assert_eq!(of("up.example.com"), Some((1, "up.example.com".into())), "its own line");
        assert_eq!(of("v1.api.example.com"), Some((3, "*.api.example.com".into())), "the longest wildcard");
        assert_eq!(of("a.example.com"), Some((2, "*.example.com".into())));
        assert_eq!(of("b.example.com").unwrap().1, "*.example.com", "a wildcard's hosts share a count");
        assert_eq!(of("example.com"), Some((10, "* example.com".into())), "a wildcard is strictly below");
        assert_eq!(of("other.test"), Some((10, "* other.test".into())), "the default, per host");
        assert_eq!(super::of(&lines[1..], "other.test"), None, "no default: not counted");
    }

    #[test]
    fn an_allow_item_names_a_budget_and_setting_one_replaces_its_hosts_line() {
        assert_eq!(item("budget = a.test 2m"), Some("a.test 2m"));
        assert_eq!(item(" budget=a.test 2m"), Some("a.test 2m"));
        assert_eq!(item("a.test"), None);
        assert_eq!(item("rule = a.test GET /"), None);
        assert_eq!(item("budgets = a.test 2m"), None);
        let mut lines = vec![host_line("a.test 1m"), host_line("* 5m")];
        set(&mut lines, &host_line("a.test 2m"));
        set(&mut lines, &host_line("b.test 3m"));
        let shown: Vec<String> = lines.iter().map(|b| b.to_string()).collect();
        assert_eq!(shown, ["a.test 2m", "* 5m", "b.test 3m"]);
    }

    #[test]
    fn a_line_for_a_host_that_is_not_allowed_is_never_reached() {
        let hosts =
            [(HostPattern::Exact("a.test".into()), None), (HostPattern::Suffix("b.test".into()), None)];
        assert!(reached(&host_line("a.test 1m"), &hosts));
        assert!(reached(&host_line("x.b.test 1m"), &hosts));
        assert!(reached(&host_line("*.b.test 1m"), &hosts));
        assert!(reached(&host_line("* 1m"), &hosts));
        assert!(!reached(&host_line("c.test 1m"), &hosts));
        assert!(!reached(&host_line("*.a.test 1m"), &hosts));
    }
}
