//! A direct connection the sandbox's nftables rules refused, as the launcher reads it from the
//! sandbox's `refused_*` sets (they hold where, not when or how often) and hands it to the gate
//! (`control::Request::Refused`), which logs it beside its own decisions and shows it to
//! watchers: so `logs` has it after the sandbox is gone, and `watch` while it happens.

use serde::{Deserialize, Serialize};

/// The transport of a direct connection the rules refused: the sets record only these two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl std::fmt::Display for Proto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        })
    }
}

/// A direct connection the rules refused (recorded in the sandbox's `refused_*` sets).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Direct {
    pub(crate) proto: Proto,
    pub(crate) addr: std::net::IpAddr,
    pub(crate) port: u16,
    /// The `deny` entry that refused it, when one did (`ai-sandbox deny`, a `deny =` line):
    /// then no "add allow" is advised, the deny line is named.
    #[serde(default)]
    pub(crate) denied_by: Option<String>,
    /// The `budget = ADDRESS` line whose quota was spent when it was refused: then the line to
    /// raise is named, not an allow line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) over_budget: Option<crate::policy::budget::NetBudget>,
}

impl Direct {
    /// `198.51.100.7:8080`, `[fd00::1]:53`.
    pub(crate) fn dest(&self) -> String {
        format!("{}:{}", self.host(), self.port)
    }
    /// The address as a destination spells it (`[fd00::1]` for IPv6).
    pub(crate) fn host(&self) -> String {
        match self.addr {
            std::net::IpAddr::V6(a) => format!("[{a}]"),
            a => a.to_string(),
        }
    }
    /// The raised budget line for a refusal past a budget (twice the size, as the gate offers).
    pub(crate) fn raise(&self) -> Option<String> {
        let b = self.over_budget.as_ref()?;
        Some(crate::policy::budget::raised(b.net, b.bytes, None))
    }

    /// What would allow it, in the words of a gate hint.
    pub(crate) fn fix(&self, config_path: &str) -> String {
        if let (Proto::Tcp, Some(b)) = (self.proto, &self.over_budget) {
            return format!(
                "over budget: {} was sent its budget of {} from this session (budget = {b}); to send more: ai-sandbox allow '{}' (the running sandbox, and {config_path})",
                b.net,
                crate::policy::limits::show_size(b.bytes),
                self.raise().unwrap_or_default()
            );
        }
        match (self.proto, &self.denied_by) {
            (Proto::Tcp, Some(line)) => format!("refused by \"deny = {line}\" in {config_path}"),
            (Proto::Tcp, None) => format!("add \"allow = {}\" to {config_path}", self.dest()),
            _ if self.port == 53 => {
                "DNS is not reachable: names go through the gate, allow the name instead".to_string()
            }
            (p, _) => format!("{p} is never allowed: only TCP leaves the sandbox"),
        }
    }
}
