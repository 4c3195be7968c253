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
//! The protocol's types (requests, replies, refusals) are in `contract::control`, the runtime
//! directory in `sys::runtime`. By job: `client` (register, call, the lease, and
//! starting the gate), `stand_in` (the lost gate's port answered with refusals), `serve` (the
//! gate's side).

mod client;
mod serve;
mod stand_in;

pub(crate) use client::unheld_change;
pub use client::{Lease, call, register};
pub(crate) use serve::serve_conn;

use std::path::{Path, PathBuf};

pub use super::secrets::Bound;
pub(crate) use super::state::SessionStatus;

pub use crate::contract::control::{GateStatus, Refusal, Registered, Reply, Request};

/// The control socket in a runtime dir (`sys::runtime`).
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("gate.sock")
}

/// The decision log in a runtime dir.
pub fn log_path(dir: &Path) -> PathBuf {
    dir.join("gate.log")
}
