//! What the launcher registers with the gate for a session, and what the gate reports of it:
//! written by one process, read by another (over the control socket, and in `live.json`, which a
//! later `ai-sandbox allow` reads). A gate of the previous version may read these during the
//! hand-over (docs/adr/0017), so fields are only ever added, with `#[serde(default)]`.

use crate::policy::allow::Allowlist;
use crate::policy::rule::Rule;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};

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
        }
    }
}

impl SessionPolicy {
    /// The allowlist the gate (and a live change) works from, as the launch's policy has it.
    pub(crate) fn of(p: &crate::policy::Policy) -> SessionPolicy {
        SessionPolicy {
            allow: p.allow.clone(),
            gate_ports: p.gate_ports.clone(),
            resolve: p.resolve.clone(),
            config_path: crate::config::project::config_path(&p.project).display().to_string(),
            gate_addr: p.gate_addr,
            ask: p.ask,
            rules: p.rules.clone(),
            learn: p.learn,
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
}

/// Never prints the value.
impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bound({} for {})", self.name, self.hosts.join(" "))
    }
}

impl Bound {
    /// A secret `value` bound to `hosts`, seen in the sandbox as `placeholder`.
    pub fn new(name: &str, placeholder: &str, value: &str, hosts: &[&str]) -> Bound {
        let hosts = hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
        Bound { name: name.into(), placeholder: placeholder.into(), value: value.into(), hosts }
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
}
