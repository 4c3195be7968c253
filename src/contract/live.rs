//! The record of a running sandbox (`live.json` in its session directory): written by the
//! launch, read and rewritten under a lock by `ai-sandbox allow`/`deny` in another process, and
//! read by `ps`. A record written by an older version is still read: fields are only added, with
//! `#[serde(default)]`.

use super::SessionPolicy;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A running sandbox's allowlist and how to reach its layers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub session: String,
    pub container: String,
    pub project: PathBuf,
    /// Only `allow` has an allowlist to widen.
    pub net: crate::policy::NetMode,
    /// Whether the gate serves this session (hostnames can be added only then).
    pub gate: bool,
    /// Whether the sandbox trusts the gate's CA (it was started with a bound secret or a rule):
    /// rules can be added only then, since a host with rules is reached through the gate's TLS.
    #[serde(default)]
    pub tls: bool,
    pub policy: SessionPolicy,
    /// The sandbox runs the host's /usr (`image = host`): its commands are the host's, so `exec`
    /// can say a missing one in words (absent in records of older versions: false).
    #[serde(default)]
    pub host_image: bool,
    /// Each `state` line's login and who holds it (`ps` says it): `claude: held by the gate`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logins: Vec<String>,
}
