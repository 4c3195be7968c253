//! What the launcher registers with the gate for a session, and what the gate reports of it:
//! written by one process, read by another (over the control socket, and in `live.json`, which a
//! later `ai-sandbox allow` reads). A gate of the previous version may read these during the
//! hand-over (docs/adr/0017), so fields are only ever added, with `#[serde(default)]`.

use crate::policy::allow::Allowlist;
use crate::policy::rule::Rule;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};

/// The name of the project's counts of budgets with a period, in its state directory.
pub const BUDGET_COUNTS: &str = "budgets.json";

/// What a session registered: its allowlist and where its config lives (for hints).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionPolicy {
    /// Hosts and networks, allowed and denied (the same four JSON fields as before the type).
    #[serde(flatten)]
    pub allow: Allowlist,
    /// Ports relayed for host entries without a port.
    pub gate_ports: Vec<u16>,
    /// `resolve = NAME=IP` pins.
    pub resolve: Vec<(String, IpAddr)>,
    /// For hints: the config file to edit.
    pub config_path: String,
    /// The sandbox-side address of the host's loopback: never dialled by the gate.
    pub gate_addr: Ipv4Addr,
    /// `ask = SECONDS`: hold an allowlist refusal this long for a watcher's answer.
    #[serde(default)]
    pub ask: Option<u32>,
    /// `rule =` lines: a host with rules gets only the requests they allow (see `policy::rule`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// A learning run (`ai-sandbox learn`): a hostname the allowlist does not hold, on one of
    /// `gate_ports`, is relayed as a tunnel and logged as learned instead of refused. Absent
    /// (false) in every other session, and in what a gate of the previous version reads: a
    /// learning run registered with one is refused as before (docs/adr/0059).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub learn: bool,
    /// `budget =` lines: what the session may send to a host (see `policy::budget`). A gate of
    /// the previous version ignores them, so registration must hear `budgets` said back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<crate::policy::budget::Budget>,
    /// `budget = ADDRESS SIZE` lines: counted by the sandbox's rules, not the gate (which
    /// ignores them); here for `ps` and a live change of their size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_budgets: Vec<crate::policy::budget::NetBudget>,
    /// Where the gate keeps the project's counts of budgets with a period (`budgets.json` in
    /// its state directory, out of every sandbox's reach): they outlive the session and the gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_counts: Option<std::path::PathBuf>,
}

/// An empty allowlist with the defaults of a config that says nothing (the gate's ports, the
/// host's loopback mapping): what a test or the bench starts from, naming only what it needs,
/// so that a new field touches no literal.
impl Default for SessionPolicy {
    fn default() -> SessionPolicy {
        SessionPolicy {
            allow: Allowlist::default(),
            gate_ports: crate::policy::GATE_DEFAULT_PORTS.to_vec(),
            resolve: Vec::new(),
            config_path: ".ai-sandbox/config".into(),
            gate_addr: crate::policy::DEFAULT_GATE_ADDR,
            ask: None,
            rules: Vec::new(),
            learn: false,
            budgets: Vec::new(),
            net_budgets: Vec::new(),
            budget_counts: None,
        }
    }
}

impl SessionPolicy {
    /// The allowlist the gate (and a live change) works from, as the launch's policy has it;
    /// the project's counts kept in `state_dir` (none: a gate of the cluster's, with no state).
    pub(crate) fn of(p: &crate::policy::Policy, state_dir: Option<&std::path::Path>) -> SessionPolicy {
        SessionPolicy {
            allow: p.allow.clone(),
            gate_ports: p.gate_ports.clone(),
            resolve: p.resolve.clone(),
            config_path: crate::config::project::config_path(&p.project).display().to_string(),
            gate_addr: p.gate_addr,
            ask: p.ask,
            rules: p.rules.clone(),
            learn: p.learn,
            budgets: p.budgets.clone(),
            net_budgets: p.net_budgets.clone(),
            budget_counts: state_dir.map(|d| d.join(BUDGET_COUNTS)),
        }
    }
}

/// Makes a serialised `SessionPolicy` readable by people: each rule's path segments as text
/// where they are UTF-8 (`"repos"`, not `[114,101,112,111,115]`). For files read by this version
/// or a later one only (the cluster gate's policy file, which the export writes for a gate image of
/// its own version): `Rule` reads both forms from this version on, while the control socket and
/// `live.json` keep the byte arrays a gate or launcher of the previous version reads (ADR 0057).
pub fn readable(policy: &mut serde_json::Value) {
    let Some(rules) = policy.get_mut("rules").and_then(|r| r.as_array_mut()) else { return };
    for rule in rules {
        let Some(path) = rule.get_mut("path").and_then(|p| p.as_array_mut()) else { continue };
        for seg in path.iter_mut() {
            let bytes: Option<Vec<u8>> = seg
                .as_array()
                .map(|b| b.iter().map(|n| n.as_u64().and_then(|n| u8::try_from(n).ok())).collect())
                .and_then(|b: Option<Vec<u8>>| b);
            if let Some(text) = bytes.and_then(|b| String::from_utf8(b).ok()) {
                *seg = text.into();
            }
        }
    }
}

/// One secret bound to hosts, as the launcher registers it (over the 0600 control socket).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bound {
    pub(crate) name: String,
    pub(crate) placeholder: String,
    pub(crate) value: String,
    /// Exact host names (lowercase) the value may be sent to, over TLS the gate terminates.
    pub(crate) hosts: Vec<String>,
    /// A login's token held by the gate (`state = claude`): where the store keeps it, so that
    /// the gate's refresh writes the new one there (`gate::login`). `None`: a `secret` line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) login: Option<LoginRef>,
    /// One of the AWS credentials the gate signs with (`secret = aws for HOST`,
    /// `gate::sigv4`): never put into a request as it is, only signed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) aws: Option<crate::policy::secret::AwsPart>,
}

/// Where a login's token lives in the user's login store, and which token endpoint renews it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoginRef {
    /// The store file (the user's own directory; no sandbox reaches it).
    pub(crate) store: std::path::PathBuf,
    /// The token's place in the file's JSON (`claudeAiOauth`, `accessToken`).
    pub(crate) field: Vec<String>,
    /// The token endpoint, `HOST/PATH`, whose answers carry the token's next value.
    pub(crate) endpoint: String,
    /// The token's name in the endpoint's JSON answer (`access_token`).
    pub(crate) answer: String,
    /// Where the store keeps the login's expiry, in milliseconds since the epoch.
    pub(crate) expiry: Vec<String>,
    /// The login's refresh token: it goes only into the body of a refresh the gate checked,
    /// never into a header.
    #[serde(default)]
    pub(crate) refresh: bool,
    /// A JWT held by its signature: the value is the signature, and the sandbox's copy is the
    /// real header and claims with the placeholder as its signature (`jwt_parts`).
    #[serde(default)]
    pub(crate) jwt: bool,
    /// The login's refresh is a form (`application/x-www-form-urlencoded`: Google's), not JSON.
    #[serde(default)]
    pub(crate) form: bool,
    /// A first login's code exchange is a form (Codex's, Google's), not JSON (ADR 0090).
    #[serde(default)]
    pub(crate) code_form: bool,
}

/// A JWT's `header.claims` and its signature (`None`: not three dot-separated parts).
pub(crate) fn jwt_parts(token: &str) -> Option<(&str, &str)> {
    let (signed, signature) = token.rsplit_once('.')?;
    let (header, claims) = signed.split_once('.')?;
    let part = |p: &str| !p.is_empty() && !p.contains('.');
    (part(header) && part(claims) && part(signature)).then_some((signed, signature))
}

/// Never prints the value.
impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bound({} for {})", self.name, self.hosts.join(" "))
    }
}

impl LoginRef {
    /// The token at `field` of the login file `store`, renewed at `endpoint` (`HOST/PATH`)
    /// whose JSON answer names it `answer`; `refresh`: the login's refresh token.
    pub fn new(
        store: &std::path::Path,
        field: &[&str],
        endpoint: &str,
        answer: &str,
        expiry: &[&str],
        refresh: bool,
    ) -> LoginRef {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        LoginRef {
            store: store.into(),
            field: strings(field),
            endpoint: endpoint.into(),
            answer: answer.into(),
            expiry: strings(expiry),
            refresh,
            jwt: false,
            form: false,
            code_form: false,
        }
    }
}

impl Bound {
    /// This secret as a login's token the gate holds (`gate::login`).
    pub fn held(mut self, login: LoginRef) -> Bound {
        self.login = Some(login);
        self
    }

    /// This secret as one of the AWS credentials the gate signs with (`gate::sigv4`).
    pub fn signs(mut self, part: crate::policy::secret::AwsPart) -> Bound {
        self.aws = Some(part);
        self
    }

    /// A secret `value` bound to `hosts`, seen in the sandbox as `placeholder`.
    pub fn new(name: &str, placeholder: &str, value: &str, hosts: &[&str]) -> Bound {
        let hosts = hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
        Bound {
            name: name.into(),
            placeholder: placeholder.into(),
            value: value.into(),
            hosts,
            login: None,
            aws: None,
        }
    }
}

/// One session as `gate status` shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionStatus {
    pub(crate) session: String,
    pub(crate) project: String,
    pub(crate) started: String,
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    pub(crate) active: u64,
    pub(crate) bytes_up: u64,
    pub(crate) bytes_down: u64,
    /// What the session sent to each budgeted host, against its budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) budgets: Vec<BudgetUse>,
    /// MCP tool calls by host and tool, as the `mcp` rules decided them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) mcp: Vec<McpUse>,
}

/// The `tools/call`s of one tool on one host that a session's `mcp` rules allowed and refused
/// (a call a watcher allowed counts as allowed; a learning run's relayed call too). `tool` is
/// as the agent sent it: whoever prints it escapes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpUse {
    pub(crate) host: String,
    pub(crate) tool: String,
    pub(crate) allowed: u64,
    pub(crate) refused: u64,
}

impl McpUse {
    /// `mcp api.test search_issues: allowed 2, refused 0`, the tool escaped: what `ps` and
    /// `gate status` show.
    pub fn line(&self) -> String {
        format!(
            "mcp {} {}: allowed {}, refused {}",
            crate::sys::quote::text(&self.host),
            crate::sys::quote::text(&self.tool),
            self.allowed,
            self.refused
        )
    }
}

/// One budget's count (`budget =` lines): the host or pattern it is kept for (`* HOST` for the
/// default line's hosts), what was sent, and the budget, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetUse {
    pub(crate) key: String,
    pub(crate) sent: u64,
    pub(crate) budget: u64,
    /// A line with a period: `sent` is the project's count in the window now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) period: Option<crate::policy::budget::Period>,
}

impl BudgetUse {
    /// `1.5m of 2m (75%)`, `1.5m of 2m today (75%)`: what `ps` and `gate status` show.
    pub fn against(&self) -> String {
        let pct = (self.sent as f64 * 100.0 / self.budget.max(1) as f64).round();
        let when = self.period.map_or(String::new(), |p| format!(" {}", p.this()));
        format!("{} of {}{when} ({pct}%)", human(self.sent), human(self.budget))
    }
}

/// Bytes in the config's units, one decimal where it helps (`1.5m`, `900k`, `12`).
fn human(b: u64) -> String {
    for (unit, shift) in [("g", 30), ("m", 20), ("k", 10)] {
        if b >= 1 << shift {
            let v = b as f64 / (1u64 << shift) as f64;
            return if v.fract() == 0.0 { format!("{v}{unit}") } else { format!("{v:.1}{unit}") };
        }
    }
    b.to_string()
}

/// The string at `field` in a login file's JSON (`None`: absent, or not a string).
pub(crate) fn login_field<'a>(v: &'a serde_json::Value, field: &[impl AsRef<str>]) -> Option<&'a str> {
    field.iter().try_fold(v, |v, k| v.get(k.as_ref()))?.as_str()
}

/// Sets `field` of a login file's JSON to `to` where the objects on the way exist (a login
/// that lacks them is left as it is: nothing is made up). Whether it was set.
pub(crate) fn set_login_field(
    v: &mut serde_json::Value,
    field: &[impl AsRef<str>],
    to: serde_json::Value,
) -> bool {
    let Some((last, path)) = field.split_last() else { return false };
    let parent = path.iter().try_fold(v, |v, k| v.get_mut(k.as_ref()));
    match parent.and_then(|p| p.as_object_mut()) {
        Some(o) if o.contains_key(last.as_ref()) => {
            o.insert(last.as_ref().to_string(), to);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jwt_splits_at_its_signature_and_anything_else_does_not() {
        assert_eq!(jwt_parts("h.c.s"), Some(("h.c", "s")));
        for not in ["h.c", "h.c.", ".c.s", "h..s", "h.c.s.x", "opaque", ""] {
            assert_eq!(jwt_parts(not), None, "{not}");
        }
        let mut v = serde_json::json!({"a": {"b": "x"}});
        assert!(set_login_field(&mut v, &["a", "b"], "y".into()));
        assert!(!set_login_field(&mut v, &["a", "c"], "y".into()), "a place the login lacks is not made");
        assert!(!set_login_field(&mut v, &["z", "b"], "y".into()));
        assert!(!set_login_field(&mut v, &[] as &[&str], "y".into()));
        assert_eq!(login_field(&v, &["a", "b"]), Some("y"));
        assert_eq!(login_field(&v, &["a"]), None, "not a string");
    }

    #[test]
    fn a_budgets_use_reads_in_the_configs_units() {
        let u = |sent, budget| BudgetUse { key: "k".into(), sent, budget, period: None }.against();
        assert_eq!(u(3 << 19, 2 << 20), "1.5m of 2m (75%)");
        assert_eq!(u(900 << 10, 1 << 20), "900k of 1m (88%)");
        assert_eq!(u(12, 1000), "12 of 1000 (1%)");
        assert_eq!(u(1 << 30, 1 << 30), "1g of 1g (100%)");
        assert_eq!(u(0, 0), "0 of 0 (0%)");
        let day = BudgetUse { period: Some(crate::policy::budget::Period::Day), ..BudgetUse::default() };
        assert_eq!(BudgetUse { sent: 1 << 20, budget: 4 << 20, ..day }.against(), "1m of 4m today (25%)");
    }

    #[test]
    fn rule_paths_read_as_bytes_and_as_text_and_the_readable_form_is_the_same_policy() {
        let rules = crate::policy::rule::parse("api.test GET /v1/*/x").unwrap();
        let p = SessionPolicy { rules, ..SessionPolicy::default() };
        let mut v = serde_json::to_value(&p).unwrap();
        // The wire form: byte arrays (what a peer of the previous version reads).
        assert_eq!(v["rules"][0]["path"][0], serde_json::json!([118, 49]));
        readable(&mut v);
        assert_eq!(v["rules"][0]["path"], serde_json::json!(["v1", "*", "x"]));
        let back: SessionPolicy = serde_json::from_value(v).unwrap();
        assert_eq!(back, p, "the readable form reads back to the same policy");
        // A segment that is not UTF-8 stays bytes, beside text.
        let mixed: SessionPolicy = serde_json::from_value(serde_json::json!({
            "hosts": [], "nets": [], "gate_ports": [443], "resolve": [], "config_path": "c",
            "gate_addr": "100.64.0.1",
            "rules": [{"host": {"Exact": "a.test"}, "method": null, "path": ["a", [255]], "line": "l"}],
        }))
        .unwrap();
        assert_eq!(mixed.rules[0].path, [b"a".to_vec(), vec![255]]);
    }
}
