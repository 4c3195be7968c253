//! `rule =` lines (pure): what may be asked of a host below its name, by method and path.
//!
//! `rule = HOST METHOD PATH[?KEY=VALUE&...]`, or a git preset: `rule = HOST git-fetch [REPO]`,
//! `rule = HOST git-push [REPO [REF...]]` (git's smart HTTP; REPO a path pattern, every
//! repository when left out; REFs, when named, the only refs a push may update: see `refs`). Once a host has a rule, a request to it that matches none is refused (403) with
//! the line that would allow it; a host without rules is allowed whole, as before. Rules only
//! allow: a `deny =` line for the host wins over every rule, as deny always does.
//!
//! Paths are matched in their one spelling (`url_path`): a pattern is a path whose segments may be
//! `*` (anything within one segment, also inside one: `*.git`), or `**` alone (any number of
//! segments, none included). The method is matched case-insensitively (`*`: any). A query is
//! ignored unless the rule names one; then each named key must appear once, with that value.

use super::allow::{Allow, HostPattern};
use super::url_path::{Normal, segment};
use serde::{Deserialize, Serialize};

/// One rule, as the gate matches it. A preset line makes several.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub host: HostPattern,
    /// Uppercase; `None`: any method.
    pub method: Option<String>,
    /// The path pattern's segments, decoded as a request path's are. Written as byte arrays (the
    /// form every version reads, on the control socket and in `live.json`); read as those or as
    /// text (the export's readable form, `contract::session::readable`).
    #[serde(deserialize_with = "segments")]
    pub path: Vec<Vec<u8>>,
    /// `key=value` pairs the query must hold (decoded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<(String, String)>,
    /// The config value it came from (`rule = LINE`), for the log and `trust`.
    pub line: String,
    /// A push limited by ref (`git-push REPO REF...`, on its `git-receive-pack` rule only): the
    /// patterns every ref a push updates must match (`*`: any run of characters, `/` included,
    /// as in git's refspecs); a deletion is never allowed then. Empty: no limit (a gate of the
    /// previous version reads a rule without the field; one with it is never sent to such a
    /// gate: `control::client::register`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<String>,
    /// An MCP endpoint's rule (`HOST mcp PATH TOOL...`): the tools its `tools/call` may name
    /// (`*`: any run of characters); `tools/list` answers show only these. Empty: not an MCP
    /// rule. Never sent to a gate that does not say it reads them (`contract::capability`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
}

/// A path's segments as byte arrays or as text, each (see `Rule::path`).
fn segments<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Segments, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Segment {
        Text(String),
        Bytes(Vec<u8>),
    }
    let read = Vec::<Segment>::deserialize(d)?;
    Ok(read
        .into_iter()
        .map(|s| match s {
            Segment::Text(t) => t.into_bytes(),
            Segment::Bytes(b) => b,
        })
        .collect())
}

/// A bad line: what is wrong, and how to write it.
type Bad = (String, &'static str);
type Segments = Vec<Vec<u8>>;
type Pairs = Vec<(String, String)>;

const HINT: &str = "write `rule = HOST METHOD /path` (e.g. `rule = api.github.com GET /repos/acme/**`), `rule = HOST git-fetch [/REPO]` / `git-push [/REPO [refs/heads/agent/*...]]`, or `rule = HOST mcp /PATH TOOL...` (e.g. `rule = mcp.example.com mcp /mcp search_*`)";

/// Reads a `rule` line's value.
pub fn parse(v: &str) -> Result<Vec<Rule>, Bad> {
    let line = v.split_whitespace().collect::<Vec<_>>().join(" ");
    let words: Vec<&str> = line.split(' ').collect();
    let host = match words.first().map(|h| super::allow::parse(h)) {
        Some(Ok(Allow::Host(h, None))) => h,
        Some(Ok(Allow::Host(_, Some(_)))) => {
            return Err((format!("`{}`: a rule names a host without a port", words[0]), HINT));
        }
        Some(Ok(Allow::Net(..))) => {
            return Err((
                format!(
                    "`{}`: rules are for host names (the gate opens TLS to a name), not addresses",
                    words[0]
                ),
                HINT,
            ));
        }
        Some(Err(e)) => return Err((format!("`{}`: {}", words[0], e.reason), HINT)),
        None => return Err(("an empty rule".into(), HINT)),
    };
    let rule = |method: Option<&str>, path: &str| -> Result<Rule, Bad> {
        let (path, query) = pattern(path)?;
        Ok(Rule {
            host: host.clone(),
            method: method.map(str::to_string),
            path,
            query,
            line: line.clone(),
            refs: Vec::new(),
            tools: Vec::new(),
        })
    };
    match words[1..] {
        [preset @ ("git-fetch" | "git-push")] => {
            git(preset, "/**")?.iter().map(|(m, p)| rule(Some(m), p)).collect()
        }
        [preset @ ("git-fetch" | "git-push"), repo] => {
            git(preset, repo)?.iter().map(|(m, p)| rule(Some(m), p)).collect()
        }
        ["git-push", repo, ref refs @ ..] => {
            let refs = refs.iter().map(|r| ref_pattern(r)).collect::<Result<Vec<String>, Bad>>()?;
            let [advert, pack] = git("git-push", repo)?;
            Ok(vec![rule(Some(advert.0), &advert.1)?, Rule { refs, ..rule(Some(pack.0), &pack.1)? }])
        }
        ["git-fetch", _, _, ..] => {
            Err((format!("`{line}`: refs limit a push; a fetch reads every ref the server shows"), HINT))
        }
        ["mcp", _] => Err((
            format!(
                "`{line}`: an MCP rule names the tools it allows (`*` for any), e.g. `{} mcp /mcp search_*`",
                words[0]
            ),
            HINT,
        )),
        ["mcp", path, ref tools @ ..] => {
            let tools = tools.iter().map(|t| tool_pattern(t)).collect::<Result<Vec<String>, Bad>>()?;
            // Streamable HTTP: messages are POSTed, the server's stream is a GET, a DELETE ends
            // the session. Each carries the tools, so every answer on the endpoint is read.
            ["POST", "GET", "DELETE"]
                .iter()
                .map(|m| Ok(Rule { tools: tools.clone(), ..rule(Some(m), path)? }))
                .collect()
        }
        [method, path] => {
            let m = method.to_ascii_uppercase();
            if m != "*" && !(m.bytes().all(|b| b.is_ascii_uppercase() || b == b'-') && m.len() <= 32) {
                return Err((format!("`{method}` is not an HTTP method (or `*` for any)"), HINT));
            }
            Ok(vec![rule((m != "*").then_some(m.as_str()), path)?])
        }
        _ => Err((format!("`{line}` is not HOST METHOD PATH"), HINT)),
    }
}

/// git's smart HTTP: the ref advertisement (`info/refs?service=...`) and the pack exchange.
fn git(preset: &str, repo: &str) -> Result<[(&'static str, String); 2], Bad> {
    if repo.contains('?') {
        return Err((format!("`{repo}`: a repository pattern has no query"), HINT));
    }
    let service = if preset == "git-fetch" { "git-upload-pack" } else { "git-receive-pack" };
    let repo = repo.trim_end_matches('/');
    Ok([("GET", format!("{repo}/info/refs?service={service}")), ("POST", format!("{repo}/{service}"))])
}

/// A ref pattern of a push rule: a full ref name (`refs/...`) whose `*`s match anything.
fn ref_pattern(r: &str) -> Result<String, Bad> {
    let bad = |why: &str| (format!("`{r}`: {why}"), HINT);
    if !r.starts_with("refs/") || r.len() <= 5 {
        return Err(bad("a ref pattern is a full ref name, e.g. `refs/heads/agent/*` or `refs/tags/v*`"));
    }
    if r.contains("..") || r.ends_with('/') || !r.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("a ref name has no `..`, no trailing `/` and no spaces or control characters"));
    }
    Ok(r.to_string())
}

/// A tool pattern of an MCP rule: a tool's name (letters, digits, `_`, `-`, `.`, `/`) whose
/// `*`s match any run of characters.
fn tool_pattern(t: &str) -> Result<String, Bad> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || b"_-./*".contains(&b);
    if t.is_empty() || t.len() > 128 || !t.bytes().all(ok) {
        return Err((
            format!(
                "`{t}`: a tool pattern is a tool's name (letters, digits, `_ - . /`), `*` matching any run of them"
            ),
            HINT,
        ));
    }
    Ok(t.to_string())
}

/// Whether a tool's name can stand in a rule line as itself: a tool pattern's characters and no
/// `*` (a name the agent chose that a line would read as more: a space, a pattern, a new line).
pub fn is_tool_name(t: &str) -> bool {
    !t.contains('*') && tool_pattern(t).is_ok()
}

/// Whether a rule line can name this path as itself: a `*` in it (sent as it is, or as %2A) a
/// line would read as a pattern, allowing more than the request that was refused.
pub fn line_can_name(path: &str) -> bool {
    !path.contains('*')
}

/// Whether an MCP rule's tool pattern matches a tool's name (`*`: any run of characters).
pub fn tool_matches(pattern: &str, name: &str) -> bool {
    seg_matches(pattern.as_bytes(), name.as_bytes())
}

/// The tools a request to an MCP endpoint may call: every pattern of the MCP rules whose host
/// and path it matches, whatever its method, query and whatever other rules allow it (`None`: no
/// MCP rule is for it). An MCP rule governs its endpoint: a plain rule that also allows the
/// request (`HOST * /**`, a narrower one with a query) does not turn the reading off; `*` allows
/// every tool. It governs what a lenient server routes to the endpoint too: a path below it (a
/// mounted app), and its spellings in another case or with `;` parameters (Express ignores case
/// and a trailing `/`), so that another rule, or a watcher's answer, for `/MCP/` still has its
/// calls read.
pub fn mcp_tools(rules: &[Rule], host: &str, target: &Normal) -> Option<Vec<String>> {
    let lenient: Vec<Vec<u8>> = target
        .segments
        .iter()
        .map(|s| s.split(|&b| b == b';').next().unwrap_or(s).to_ascii_lowercase())
        .collect();
    let at_or_below = |r: &Rule| {
        [&target.segments, &lenient]
            .into_iter()
            .any(|segs| (1..=segs.len()).any(|k| path_matches(&r.path, &segs[..k])))
    };
    let here = rules.iter().filter(|r| !r.tools.is_empty() && r.host.matches(host) && at_or_below(r));
    once(here.flat_map(|r| r.tools.iter().cloned()))
}

/// Each pattern once, in the order first seen (an MCP line is a rule per method, each with them).
fn once(patterns: impl Iterator<Item = String>) -> Option<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for p in patterns {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Every tool pattern of the MCP rules for `host`, whatever their path (`None`: none): what a
/// request a watcher lets through once on such a host is still read for.
pub fn host_mcp_tools(rules: &[Rule], host: &str) -> Option<Vec<String>> {
    once(rules.iter().filter(|r| !r.tools.is_empty() && r.host.matches(host)).flat_map(|r| r.tools.clone()))
}

/// Whether a push rule's ref pattern matches a ref name (`*`: any run of bytes, `/` included).
pub fn ref_matches(pattern: &str, name: &[u8]) -> bool {
    seg_matches(pattern.as_bytes(), name)
}

/// The refs a push to `target` at `host` may update: `None` when some rule that allows it sets
/// no limit (rules only allow: the widest wins), else every pattern of the rules that allow it.
pub fn push_refs(rules: &[Rule], host: &str, method: &str, target: &Normal) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for r in rules.iter().filter(|r| r.matches(host, method, target)) {
        if r.refs.is_empty() {
            return None;
        }
        out.extend(r.refs.iter().cloned());
    }
    (!out.is_empty()).then_some(out)
}

/// A path pattern: `/`-rooted, no dot segments, `**` only as a whole segment.
fn pattern(p: &str) -> Result<(Segments, Pairs), Bad> {
    let bad = |why: &str| (format!("`{p}`: {why}"), HINT);
    let (path, query) = p.split_once('?').unwrap_or((p, ""));
    if !path.starts_with('/') {
        return Err(bad("a path pattern starts with `/`"));
    }
    let mut segs = Vec::new();
    let raw: Vec<&str> = path[1..].split('/').collect();
    for (i, r) in raw.iter().enumerate() {
        let s = segment(r.as_bytes()).map_err(bad)?;
        if s == b"." || s == b".." {
            return Err(bad("a path pattern has no `.` or `..` segments"));
        }
        if s.windows(2).any(|w| w == b"**") && s != b"**" {
            return Err(bad("`**` stands alone between slashes (`/a/**/b`); `*` matches within a segment"));
        }
        if s.is_empty() && i != raw.len() - 1 {
            return Err(bad("an empty segment (`//`)"));
        }
        segs.push(s);
    }
    let mut pairs = Vec::new();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        if k.is_empty() || k.contains(['%', '*']) || v.contains(['%', '*']) {
            return Err(bad("a query is `key=value` pairs, written as they are (no `%`, no `*`)"));
        }
        pairs.push((k.to_string(), v.to_string()));
    }
    Ok((segs, pairs))
}

/// Whether a segment pattern (`*` anywhere inside) matches a segment. One pass that returns to
/// the last `*` on a mismatch: at most pattern × segment steps, however many stars (the segment
/// is the agent's; recursion over each star would let a long one cost exponential time).
fn seg_matches(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            // The last star takes one more byte; try the rest of the pattern from there.
            star = Some((sp, ss + 1));
            pi = sp + 1;
            si = ss + 1;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|b| *b == b'*')
}

/// Whether a pattern's segments match a path's (`**`: any number of segments).
fn path_matches(p: &[Vec<u8>], s: &[Vec<u8>]) -> bool {
    // Without `**` (most rules): segment by segment, no table.
    if !p.iter().any(|x| x == b"**") {
        return p.len() == s.len() && p.iter().zip(s).all(|(a, b)| seg_matches(a, b));
    }
    // Table over (pattern index, segment index): no backtracking blow-up.
    let mut ok = vec![vec![false; s.len() + 1]; p.len() + 1];
    ok[p.len()][s.len()] = true;
    for i in (0..p.len()).rev() {
        for j in (0..=s.len()).rev() {
            ok[i][j] = if p[i] == b"**" {
                ok[i + 1][j] || (j < s.len() && ok[i][j + 1])
            } else {
                j < s.len() && seg_matches(&p[i], &s[j]) && ok[i + 1][j + 1]
            };
        }
    }
    ok[0][0]
}

impl Rule {
    /// Whether an allow entry of `hosts` lets this rule's host through (else the rule is never
    /// reached). A wildcard rule is judged by a name under it.
    pub(crate) fn reached(&self, hosts: &[(HostPattern, Option<super::allow::Ports>)]) -> bool {
        let name = match &self.host {
            HostPattern::Exact(n) => n.clone(),
            HostPattern::Suffix(s) => format!("x.{s}"),
        };
        hosts.iter().any(|(pat, _)| pat.matches(&name))
    }

    /// Whether this rule allows `method` (uppercase) on `target` at `host`.
    pub fn matches(&self, host: &str, method: &str, target: &Normal) -> bool {
        self.host.matches(host)
            && self.method.as_deref().is_none_or(|m| m == method)
            && path_matches(&self.path, &target.segments)
            && (self.query.is_empty() || query_matches(&self.query, target))
    }
}

/// Each named key once in the query, with the named value: a repeated key is a guess.
fn query_matches(want: &[(String, String)], target: &Normal) -> bool {
    let Some(pairs) = target.pairs() else { return false };
    want.iter().all(|(k, v)| {
        let mut hits = pairs.iter().filter(|(pk, _)| pk == k);
        matches!((hits.next(), hits.next()), (Some((_, pv)), None) if pv == v)
    })
}

/// The rule in an `ai-sandbox allow` item: `rule = HOST METHOD PATH`, or `HOST METHOD PATH`
/// (an allow entry has no space).
pub fn item(i: &str) -> Option<&str> {
    let t = i.trim();
    if let Some(rest) = t.strip_prefix("rule")
        && let Some(v) = rest.trim_start().strip_prefix('=')
    {
        return Some(v.trim());
    }
    t.contains(char::is_whitespace).then_some(t)
}

/// Whether `host` has rules (then only what they allow goes through).
pub fn ruled(rules: &[Rule], host: &str) -> bool {
    rules.iter().any(|r| r.host.matches(host))
}

/// The rule that allows the request, if one does.
pub fn allowing<'a>(rules: &'a [Rule], host: &str, method: &str, target: &Normal) -> Option<&'a Rule> {
    rules.iter().find(|r| r.matches(host, method, target))
}

/// The line that would allow a refused request: a git preset for git's own requests (scoped to
/// the repository), else the exact method and path.
pub fn suggestion(host: &str, method: &str, target: &Normal) -> String {
    let path = target.path();
    let pairs = target.pairs().unwrap_or_default();
    let service = pairs.iter().find(|(k, _)| k == "service").map(|(_, v)| v.as_str());
    for (svc, preset) in [("git-upload-pack", "git-fetch"), ("git-receive-pack", "git-push")] {
        let repo = path
            .strip_suffix("/info/refs")
            .filter(|_| service == Some(svc))
            .or_else(|| path.strip_suffix(&format!("/{svc}")));
        if let Some(repo) = repo {
            return format!("{host} {preset} {}", if repo.is_empty() { "/" } else { repo });
        }
    }
    format!("{host} {method} {path}")
}

#[cfg(test)]
mod tests {
    use super::super::url_path::normalise;
    use super::*;

    fn allows(line: &str, method: &str, target: &str) -> bool {
        let rules = parse(line).unwrap();
        allowing(&rules, "api.test", method, &normalise(target).unwrap()).is_some()
    }

    #[test]
    fn an_mcp_rule_allows_its_endpoint_and_carries_its_tools_unless_a_wider_rule_allows_it() {
        let rules = parse("api.test mcp /mcp search_* create_issue").unwrap();
        let methods: Vec<_> = rules.iter().map(|r| r.method.clone().unwrap()).collect();
        assert_eq!(methods, ["POST", "GET", "DELETE"]);
        let at = normalise("/mcp").unwrap();
        let tools = mcp_tools(&rules, "api.test", &at);
        assert_eq!(tools, Some(vec!["search_*".to_string(), "create_issue".into()]));
        assert_eq!(mcp_tools(&rules, "api.test", &normalise("/other").unwrap()), None);
        assert_eq!(mcp_tools(&rules, "else.test", &at), None);
        assert!(allowing(&rules, "api.test", "PUT", &at).is_none());
        // A plain rule that also allows the endpoint (with a query, or any path) keeps the limit.
        let mut wide = rules.clone();
        wide.extend(parse("api.test * /**").unwrap());
        wide.extend(parse("api.test POST /mcp?mode=legacy").unwrap());
        assert_eq!(mcp_tools(&wide, "api.test", &normalise("/mcp?mode=legacy").unwrap()), tools);
        // What a lenient server routes to the endpoint: read as it.
        for other in ["/MCP", "/mcp/", "/Mcp;a=b", "/mcp/x/y", "/mcp;v=1/"] {
            assert_eq!(mcp_tools(&wide, "api.test", &normalise(other).unwrap()), tools, "{other}");
        }
        for other in ["/", "/mcp-docs", "/x/mcp", "/mc"] {
            assert_eq!(mcp_tools(&wide, "api.test", &normalise(other).unwrap()), None, "{other}");
        }
        wide.extend(parse("api.test mcp /other x").unwrap());
        assert_eq!(host_mcp_tools(&wide, "api.test").map(|t| t.len()), Some(3));
        assert_eq!(host_mcp_tools(&wide, "else.test"), None);
        assert!(tool_matches("search_*", "search_issues") && !tool_matches("search_*", "delete_x"));
        assert!(tool_matches("*", "anything") && tool_matches("a", "a") && !tool_matches("a", "ab"));
        assert!(is_tool_name("repo/delete_v2.x-y"));
        // A name of up to 128 characters.
        assert!(parse(&format!("api.test mcp /mcp {}", "a".repeat(128))).is_ok());
        assert!(parse(&format!("api.test mcp /mcp {}", "a".repeat(129))).is_err());
        for bad in ["", "a b", "a*", "*", "a\nsecret = X for evil.test", "a\u{1b}[2J"] {
            assert!(!is_tool_name(bad), "{bad:?}");
        }
        for bad in ["api.test mcp /mcp", "api.test mcp /mcp del;rm", "api.test mcp /mcp x\u{7f}"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_method_and_a_path_pattern_allow_exactly_their_requests() {
        for (line, method, target, want) in [
            ("api.test GET /repos/acme/**", "GET", "/repos/acme/x/issues", true),
            ("api.test GET /repos/acme/**", "GET", "/repos/acme", true),
            ("api.test GET /repos/acme/**", "GET", "/repos/acme/", true),
            ("api.test GET /repos/acme/**", "POST", "/repos/acme/x", false),
            ("api.test GET /repos/acme/**", "GET", "/repos/acmeco/x", false),
            ("api.test GET /repos/acme/**", "GET", "/repos/other", false),
            ("api.test get /repos/*", "GET", "/repos/x", true),
            ("api.test GET /repos/*", "GET", "/repos/x/y", false),
            ("api.test GET /repos/*", "GET", "/repos/", true),
            ("api.test POST /repos/*/issues", "POST", "/repos/a/issues", true),
            ("api.test POST /repos/*/issues", "POST", "/repos/a/b/issues", false),
            ("api.test * /x", "DELETE", "/x", true),
            ("api.test GET /a/**/z", "GET", "/a/z", true),
            ("api.test GET /a/**/z", "GET", "/a/b/c/z", true),
            ("api.test GET /a/**/z", "GET", "/a/b/c/y", false),
            ("api.test GET /f/*.git", "GET", "/f/r.git", true),
            ("api.test GET /f/*.git", "GET", "/f/r.gits", false),
            ("api.test GET /f/a*b*c", "GET", "/f/aXbYc", true),
            ("api.test GET /f/a*b*c", "GET", "/f/acb", false),
            ("api.test GET /x", "GET", "/x?anything=1", true),
            ("api.test GET /x?v=2", "GET", "/x?v=2&w=1", true),
            ("api.test GET /x?v=2", "GET", "/x?v=3", false),
            ("api.test GET /x?v=2", "GET", "/x", false),
            ("api.test GET /x?v=2", "GET", "/x?v=2&v=3", false),
            ("api.test GET /my%20doc", "GET", "/my%20doc", true),
            ("api.test GET /a:b", "GET", "/a%3Ab", true),
        ] {
            assert_eq!(allows(line, method, target), want, "{line} / {method} {target}");
        }
        // Another host is not this rule's.
        let r = parse("api.test GET /x").unwrap();
        assert!(allowing(&r, "other.test", "GET", &normalise("/x").unwrap()).is_none());
        assert!(ruled(&r, "api.test") && !ruled(&r, "other.test"));
        let w = parse("*.api.test GET /x").unwrap();
        assert!(ruled(&w, "eu.api.test") && !ruled(&w, "api.test"));
    }

    #[test]
    fn stars_within_a_segment_match_anything_there_and_many_stars_stay_linear() {
        for (p, s, want) in [
            ("*", "", true),
            ("*", "abc", true),
            ("a*", "a", true),
            ("a*", "ba", false),
            ("*c", "abc", true),
            ("*c", "abd", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "abcbc", true),
            ("a*b*c", "acb", false),
            ("**x", "yx", true),
            ("abc", "abc", true),
            ("abc", "abcd", false),
            ("abcd", "abc", false),
            ("", "", true),
            ("", "a", false),
        ] {
            assert_eq!(seg_matches(p.as_bytes(), s.as_bytes()), want, "{p} / {s}");
        }
        // The agent's long segment against a pattern of many stars: answered (no blow-up).
        let long = "a".repeat(20_000);
        assert!(!seg_matches(b"*a*a*a*a*a*a*a*a*a*a*b", long.as_bytes()));
        assert!(seg_matches(b"*a*a*a*a*a*a*a*a*a*a*", long.as_bytes()));
    }

    #[test]
    fn git_presets_are_the_smart_http_requests_of_one_service() {
        let fetch = parse("github.test git-fetch /acme/*").unwrap();
        let ok = |m, t| allowing(&fetch, "github.test", m, &normalise(t).unwrap()).is_some();
        assert!(ok("GET", "/acme/r.git/info/refs?service=git-upload-pack"));
        assert!(ok("POST", "/acme/r.git/git-upload-pack"));
        assert!(!ok("GET", "/acme/r.git/info/refs?service=git-receive-pack"));
        assert!(!ok("POST", "/acme/r.git/git-receive-pack"));
        assert!(!ok("POST", "/other/r.git/git-upload-pack"));
        assert!(!ok("GET", "/acme/r.git/info/refs"));
        let push = parse("github.test git-push").unwrap();
        assert!(
            allowing(&push, "github.test", "POST", &normalise("/a/b/c.git/git-receive-pack").unwrap())
                .is_some()
        );
        assert_eq!(push[0].line, "github.test git-push");
    }

    #[test]
    fn a_refusal_suggests_the_line_that_would_allow_it() {
        let s = |m, t| suggestion("g.test", m, &normalise(t).unwrap());
        assert_eq!(s("GET", "/a//b/../c?x=1"), "g.test GET /a/c");
        assert_eq!(s("GET", "/acme/r.git/info/refs?service=git-receive-pack"), "g.test git-push /acme/r.git");
        assert_eq!(s("POST", "/acme/r.git/git-receive-pack"), "g.test git-push /acme/r.git");
        assert_eq!(s("POST", "/git-upload-pack"), "g.test git-fetch /");
        assert_eq!(s("GET", "/acme/info/refs"), "g.test GET /acme/info/refs");
        // The suggestion is itself a rule that allows the request.
        let line = s("POST", "/acme/r.git/git-receive-pack");
        assert!(
            allowing(
                &parse(&line).unwrap(),
                "g.test",
                "POST",
                &normalise("/acme/r.git/git-receive-pack").unwrap()
            )
            .is_some()
        );
    }

    #[test]
    fn an_allow_item_with_a_space_or_the_rule_key_is_a_rule() {
        assert_eq!(item("rule = a.test GET /x"), Some("a.test GET /x"));
        assert_eq!(item(" rule=a.test GET /x "), Some("a.test GET /x"));
        assert_eq!(item("a.test git-fetch"), Some("a.test git-fetch"));
        assert_eq!(item("github.com"), None);
        assert_eq!(item("rules.test"), None);
        assert_eq!(item("10.0.0.1:22"), None);
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        for (line, says) in [
            ("", "empty"),
            ("api.test", "not HOST METHOD PATH"),
            ("api.test GET", "not HOST METHOD PATH"),
            ("api.test GET x", "starts with `/`"),
            ("api.test GET /a/../b", "`.` or `..`"),
            ("api.test GET /a**", "stands alone"),
            ("api.test GET /a//b", "empty segment"),
            ("api.test G3T /a", "not an HTTP method"),
            ("api.test GET /a%2Fb", "encoded slash"),
            ("api.test GET /a?x=%41", "written as they are"),
            ("api.test:443 GET /a", "without a port"),
            ("10.0.0.1 GET /a", "not addresses"),
            ("api.test git-fetch /a?x", "no query"),
            ("api.test GET /a b", "not HOST METHOD PATH"),
            ("g.test git-fetch /r.git refs/heads/a", "refs limit a push"),
            ("g.test git-push /r.git heads/agent/*", "a full ref name"),
            ("g.test git-push /r.git refs/", "a full ref name"),
            ("g.test git-push /r.git refs/heads/a/../b", "no `..`"),
            ("g.test git-push /r.git refs/heads/agent/", "trailing `/`"),
            ("g.test git-push /r.git?x refs/heads/a", "no query"),
        ] {
            let e = parse(line).expect_err(line);
            assert!(e.0.contains(says), "{line}: {}", e.0);
        }
    }

    #[test]
    fn a_push_rule_with_refs_limits_its_pack_exchange_only() {
        let rs = parse("g.test git-push /acme/r.git refs/heads/agent/* refs/tags/v*").unwrap();
        assert_eq!(rs.len(), 2);
        assert!(rs[0].refs.is_empty(), "the ref advertisement reads, it does not push");
        assert_eq!(rs[1].refs, ["refs/heads/agent/*", "refs/tags/v*"]);
        assert_eq!(rs[1].method.as_deref(), Some("POST"));
        assert_eq!(rs[1].line, "g.test git-push /acme/r.git refs/heads/agent/* refs/tags/v*");
        // The limit is carried on the wire only when there is one (older gates read the rest).
        let json = serde_json::to_string(&rs[0]).unwrap();
        assert!(!json.contains(r#""refs":"#), "{json}");
        let back: Rule = serde_json::from_str(&serde_json::to_string(&rs[1]).unwrap()).unwrap();
        assert_eq!(back, rs[1]);
        // `*` takes any run of characters, `/` included, as in git's refspecs; nothing else is loose.
        assert!(ref_matches("refs/heads/agent/*", b"refs/heads/agent/a/b"));
        assert!(ref_matches("refs/heads/agent/*", b"refs/heads/agent/"));
        assert!(!ref_matches("refs/heads/agent/*", b"refs/heads/agentx"));
        assert!(!ref_matches("refs/heads/agent/*", b"refs/heads/main"));
        assert!(ref_matches("refs/heads/main", b"refs/heads/main"));
        assert!(!ref_matches("refs/heads/main", b"refs/heads/main2"));
        let push = |rules: &[Rule]| {
            push_refs(rules, "g.test", "POST", &normalise("/acme/r.git/git-receive-pack").unwrap())
        };
        assert_eq!(push(&rs).map(|r| r.len()), Some(2));
        assert_eq!(push(&rs[..1]), None, "no rule allows the push at all: nothing to limit");
    }
}
