//! ai-sandbox: run a coding agent (or any command) in a rootless podman sandbox whose network
//! egress is an explicit allowlist, enforced by nftables inside the container's network
//! namespace, applied from outside before the first process runs.
//!
//! Data flows one way: config text + CLI + env → `policy::Policy` → `plan::Plan` → launch.
//!
//! The tree follows the stages and processes (docs/architecture.md draws it, with the rule
//! for where a new effect goes):
//! - pure stages: `config` (the file, approval), `policy` (every key in `policy::keys`), `plan`
//!   (podman argv, ruleset, session facts), `kube` (the export), and the gate's `request`,
//!   `tls`, `decide`, `http`;
//! - `cli` holds the commands; `cli::app` orchestrates and touches the machine only through
//!   `host::Host` (with a recording `FakeHost`);
//! - `launch` runs a Plan through `launch::Machine` (the order is unit-tested with a fake), and
//!   what runs beside it: the keeper, the guard, the relays, the OCI hooks;
//! - `live` changes a running sandbox; `gate` is the egress gate's process and its clients;
//! - `host` is the effect seam, and `sys::process` the one place for spawning and signals.
//!
//! The public surface is what `main`, tests/ and the bench use; the rest is `pub(crate)`.

pub mod cli;
pub mod config;
pub mod contract;
pub mod error;
pub mod gate;
pub mod host;
pub mod kube;
pub mod launch;
pub mod live;
pub mod plan;
pub mod policy;
pub mod sys;
