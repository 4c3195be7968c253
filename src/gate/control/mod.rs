//! The gate's control socket (`/run/user/UID/ai-sandbox/gate.sock`, mode 0600 in a 0700
//! directory: only this user can register sessions). Newline-delimited JSON. The client
//! (launcher, `gate` commands) and the server (inside the gate) are both here, so the protocol
//! is read in one place.
//!
//! A session is registered over a connection the launcher keeps open for the sandbox's whole
//! life; when it closes (the launcher exits or is killed) the gate forgets the session and its
//! token. The registration reply carries, as SCM_RIGHTS, a duplicate of the gate's listening
//! socket: the launcher holds it, so if the gate dies the port stays bound to *that* socket
//! (no other local user can take it) and the launcher answers every request on it with a
//! refusal. Fail closed, with no window.
//!
//! Here: the protocol (the request and reply types). By job: `runtime` (where the socket and
//! the log live, and that the directory is private), `client` (register, ask, the lease, and
//! starting the gate), `stand_in` (the lost gate's port answered with refusals), `serve` (the
//! gate's side).

mod client;
mod runtime;
mod serve;
mod stand_in;

pub use client::{Lease, ask, register};
pub use runtime::{log_path, login_run, owned_dir, private_dir, runtime_dir, runtime_dir_for, socket_path};
pub(crate) use serve::serve_conn;

use super::decide::SessionPolicy;
pub use super::secrets::Bound;
pub(crate) use super::state::SessionStatus;
use serde::{Deserialize, Serialize};

/// The error a closing gate answers a registration with: start the next gate and retry.
pub(super) const CLOSING: &str = "the gate is closing";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    Register {
        session: String,
        project: String,
        token: String,
        policy: SessionPolicy,
        /// Secrets bound to hosts: the gate substitutes them (never written anywhere).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        secrets: Vec<Bound>,
        /// Extra roots (PEM) for the servers the gate opens TLS to (`upstream_ca`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upstream_ca: Option<String>,
    },
    /// A live change (`ai-sandbox allow`): the session's whole new policy.
    Update {
        session: String,
        policy: SessionPolicy,
    },
    /// `ai-sandbox watch`: after the reply, the gate sends refusals and questions (JSON lines)
    /// and reads answers (`ask::Answer` lines) until the watcher hangs up.
    Watch,
    Status,
    Stop,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reply {
    pub(crate) ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    #[serde(default)]
    pub(crate) port: u16,
    #[serde(default)]
    pub pid: u32,
    #[serde(default)]
    pub(crate) sessions: Vec<SessionStatus>,
    /// The gate's CA certificate (PEM), to a registration with bound secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ca: Option<String>,
}
