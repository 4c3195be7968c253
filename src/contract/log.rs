//! One decision of the gate (`Event`): a JSON line in the decision log (read by `logs`,
//! `gate logs`, the launcher's exit summary and `ps`) and a message on the watch stream. Lines
//! of older versions stay in the log after an upgrade and are still read: fields are only added,
//! with `#[serde(default)]`; `decision` is one of three words, set by the gate explicitly (never
//! worked out from the status by a reader).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub(crate) time: String,
    pub(crate) session: String,
    /// The session's project directory (empty for a request with no session, and in lines of
    /// older versions): `logs` shows the project it is run in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) project: String,
    pub(crate) method: String,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) decision: Decision,
    pub(crate) status: u16,
    pub(crate) reason: String,
    /// For a refusal: the hint the client got (what would allow it); absent otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) hint: String,
    /// For a refusal an allow line would lift: its value (`allow = VALUE`). Read by `watch`
    /// (what `a` and `s` add) and `logs --json`; absent in lines of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) allow: Option<String>,
    /// A request's path (never its query, headers or body) where the gate read the request: a
    /// host whose TLS it opened (rules, bound secrets) or plain HTTP to a host with rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) path: Option<String>,
    /// Which layer decided: the gate (absent from the line), or the sandbox's nftables rules
    /// (a direct connection the launcher read from the sandbox and handed to the gate).
    #[serde(default, skip_serializing_if = "Layer::is_gate")]
    pub(crate) layer: Layer,
    /// Relayed only because the session is a learning run (`ai-sandbox learn`): the allowlist
    /// does not hold the host. Its decision is `allow` (it was relayed), so a reader of an
    /// older version reads the line as it was; `learn` proposes these hosts at the end.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) learned: bool,
}

/// The layer of a decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layer {
    /// The gate: hostnames, and IP entries reached through the proxy.
    #[default]
    Gate,
    /// The rules in the sandbox's network namespace: direct connections.
    Rules,
}

impl Layer {
    fn is_gate(&self) -> bool {
        matches!(self, Layer::Gate)
    }
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Layer::Gate => "gate",
            Layer::Rules => "rules",
        }
    }
}

impl Event {
    /// A direct connection the rules refused, as the gate logs it for a session whose config is
    /// `config_path` (the rules record where, not when: `time` is when it was read).
    pub(crate) fn direct(
        d: &super::direct::Direct,
        session: &str,
        project: &str,
        config_path: &str,
        time: String,
    ) -> Event {
        let allow = match d.raise() {
            Some(raised) => Some(raised),
            None => (d.proto == super::direct::Proto::Tcp && d.denied_by.is_none()).then(|| d.dest()),
        };
        Event {
            time,
            session: session.to_string(),
            project: project.to_string(),
            method: d.proto.to_string(),
            host: d.host(),
            port: d.port,
            decision: Decision::Deny,
            status: 0,
            reason: if d.over_budget.is_some() {
                "over budget: a direct connection past its budget, reset by the sandbox's nftables rules"
                    .into()
            } else {
                "a direct connection the sandbox's nftables rules refused".into()
            },
            hint: d.fix(config_path),
            allow,
            path: None,
            layer: Layer::Rules,
            learned: false,
        }
    }
}

/// What the gate did with a request: the one spelling of a decision, in the log and on the
/// control socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Relayed.
    Allow,
    /// Refused.
    Deny,
    /// A 407 asking a client for the credentials it has not sent yet (git, pip and others
    /// first try without, by design, then retry with them).
    Challenge,
}

impl Decision {
    /// Whether the request was refused (what `logs --denied`, `watch` and the launcher's exit
    /// summary show). A challenge is not: the client retries with its credentials.
    pub fn refused(self) -> bool {
        match self {
            Decision::Deny => true,
            Decision::Allow | Decision::Challenge => false,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Deny => "deny",
            Decision::Challenge => "challenge",
        }
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl Event {
    /// What would allow a refusal, as its hint says it, without the prefix clients see
    /// (`blocked by ai-sandbox: `, which lines of older versions also kept in the log); empty
    /// when the decision has no hint.
    pub(crate) fn fix(&self) -> &str {
        self.hint.strip_prefix("blocked by ai-sandbox: ").unwrap_or(&self.hint)
    }
    /// The fix, or the reason when the refusal has none: what the launcher and `watch` say.
    pub(crate) fn fix_or_reason(&self) -> &str {
        if self.fix().is_empty() { &self.reason } else { self.fix() }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn lines_of_older_versions_still_parse_and_new_ones_carry_the_fix_as_a_field() {
        use super::{Decision, Event};
        // 0.x lines: no project, no `allow`, the hint with the prefix clients saw.
        let old = r#"{"time":"2026-11-20T10:00:00Z","session":"s1","method":"CONNECT","host":"x.test","port":443,"decision":"deny","status":403,"reason":"x.test:443 is not in the allowlist","hint":"blocked by ai-sandbox: add \"allow = x.test\" to /p/c"}"#;
        let e: Event = serde_json::from_str(old).unwrap();
        assert_eq!(
            (e.decision, e.allow.as_deref(), e.fix()),
            (Decision::Deny, None, "add \"allow = x.test\" to /p/c")
        );
        let challenge = old.replace("\"deny\"", "\"challenge\"");
        assert_eq!(serde_json::from_str::<Event>(&challenge).unwrap().decision, Decision::Challenge);
        // Now: the value to allow is a field of its own, and the decision one of three words.
        let new = Event { allow: Some("x.test".into()), ..e };
        let line = serde_json::to_string(&new).unwrap();
        assert!(line.contains(r#""decision":"deny""#) && line.contains(r#""allow":"x.test""#), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), new);
        // Control: a decision word no version wrote is refused, not taken for one of the three.
        assert!(serde_json::from_str::<Event>(&old.replace("\"deny\"", "\"maybe\"")).is_err());
    }
}
