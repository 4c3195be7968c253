//! `budget = HOST BYTES`: how much a sandbox may send to an allowed host through the gate in one
//! session. An allowed host that accepts uploads (a registry, a paste service, an API with a
//! large request body) otherwise carries anything at line rate; a budget caps it, and the gate
//! refuses past it (docs/adr/0066). `budget = * BYTES` is the default for every host without a
//! line of its own, each host counted apart. Pure: the line's reading and which line a host
//! falls under; the gate counts.

use super::allow::{self, Allow, HostPattern, Ports};
use super::limits::{parse_size, show_size};

/// One `budget` line, read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Budget {
    /// `None`: `*`, every host without a line of its own (each counted apart).
    pub host: Option<HostPattern>,
    /// What the session may send to it, in bytes.
    pub bytes: u64,
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            Some(h) => write!(f, "{h} {}", show_size(self.bytes)),
            None => write!(f, "* {}", show_size(self.bytes)),
        }
    }
}

/// A line that does not read: what is wrong, and what to write.
pub type Bad = (String, String);

const EXAMPLE: &str =
    "e.g. `budget = registry.npmjs.org 50m` (k, m, g: KiB, MiB, GiB), or `budget = * 200m` for every host";

/// Reads `HOST BYTES`.
pub fn parse(v: &str) -> Result<Budget, Bad> {
    let words: Vec<&str> = v.split_whitespace().collect();
    let [host, bytes] = words[..] else {
        return Err((format!("`budget = {v}` is not HOST BYTES"), EXAMPLE.into()));
    };
    if let Some((size, period)) = bytes.split_once('/') {
        return Err((
            format!("`budget = {v}`: a period (`/{period}`) is not counted yet; a budget counts one session"),
            format!("write `budget = {host} {size}` (each session of the project gets it anew)"),
        ));
    }
    let Some(n) = parse_size(bytes) else {
        return Err((format!("`budget = {v}`: `{bytes}` is not a size"), EXAMPLE.into()));
    };
    if host == "*" {
        return Ok(Budget { host: None, bytes: n });
    }
    match allow::parse(host) {
        Ok(Allow::Host(pattern, None)) => Ok(Budget { host: Some(pattern), bytes: n }),
        Ok(Allow::Host(pattern, Some(_))) => Err((
            format!("`budget = {v}`: a budget counts a host on every port"),
            format!("write the host alone: `budget = {pattern} {bytes}`"),
        )),
        Ok(Allow::Net(..)) => Err((
            format!(
                "`budget = {v}`: budgets count what goes through the gate, which sees hostnames; an address is not counted"
            ),
            "name the host the sandbox reaches by name".into(),
        )),
        Err(b) => Err((format!("`budget = {v}`: {}", b.reason), b.hint)),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_line_reads_host_and_size_and_says_what_is_wrong_otherwise() {
        let b = parse("registry.npmjs.org 50m").unwrap();
        assert_eq!(b.host, Some(HostPattern::Exact("registry.npmjs.org".into())));
        assert_eq!(b.bytes, 50 << 20);
        assert_eq!(b.to_string(), "registry.npmjs.org 50m");
        assert_eq!(parse("*.example.com 1g").unwrap().host, Some(HostPattern::Suffix("example.com".into())));
        let all = parse("* 900k").unwrap();
        assert_eq!((all.host.clone(), all.bytes), (None, 900 << 10));
        assert_eq!(all.to_string(), "* 900k");
        assert_eq!(parse("Example.COM 1000").unwrap().bytes, 1000);
        for (bad, says) in [
            ("example.com", "not HOST BYTES"),
            ("example.com 1m extra", "not HOST BYTES"),
            ("example.com lots", "not a size"),
            ("example.com 0", "not a size"),
            ("example.com 1m/day", "a period"),
            ("example.com:443 1m", "every port"),
            ("192.0.2.1 1m", "an address is not counted"),
            ("https://example.com 1m", "URL"),
        ] {
            let (msg, hint) = parse(bad).unwrap_err();
            assert!(msg.contains(says), "{bad}: {msg}");
            assert!(!hint.is_empty(), "{bad}: a hint");
        }
    }

    #[test]
    fn a_host_falls_under_its_own_line_then_the_longest_wildcard_then_the_default() {
        let lines: Vec<Budget> = ["* 10m", "*.example.com 2m", "*.api.example.com 3m", "up.example.com 1m"]
            .map(|l| parse(l).unwrap())
            .into();
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
        let mut lines = vec![parse("a.test 1m").unwrap(), parse("* 5m").unwrap()];
        set(&mut lines, &parse("a.test 2m").unwrap());
        set(&mut lines, &parse("b.test 3m").unwrap());
        let shown: Vec<String> = lines.iter().map(|b| b.to_string()).collect();
        assert_eq!(shown, ["a.test 2m", "* 5m", "b.test 3m"]);
    }

    #[test]
    fn a_line_for_a_host_that_is_not_allowed_is_never_reached() {
        let hosts =
            [(HostPattern::Exact("a.test".into()), None), (HostPattern::Suffix("b.test".into()), None)];
        assert!(reached(&parse("a.test 1m").unwrap(), &hosts));
        assert!(reached(&parse("x.b.test 1m").unwrap(), &hosts));
        assert!(reached(&parse("*.b.test 1m").unwrap(), &hosts));
        assert!(reached(&parse("* 1m").unwrap(), &hosts));
        assert!(!reached(&parse("c.test 1m").unwrap(), &hosts));
        assert!(!reached(&parse("*.a.test 1m").unwrap(), &hosts));
    }
}
