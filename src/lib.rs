//! ai-sandbox: run a coding agent (or any command) in a rootless podman sandbox whose network
//! egress is an explicit allowlist, enforced by nftables inside the container's network
//! namespace, applied from outside before the first process runs.
//!
//! Data flows one way: config text + CLI + env → `policy::Policy` → `plan::Plan` → launch.
//!
//! The tree follows the stages and processes (docs/architecture.md draws it, with the rule
//! for where a new effect goes):
//! - pure stages: `config` (the file), `policy` (every key in `policy::keys`, approval), `plan`
//!   (podman argv, ruleset, session facts), `kube` (the export), and the gate's `request`,
//!   `tls`, `decide`, `http`;
//! - `contract`: every message and record one of our processes writes and another reads;
//! - `cli` holds the commands (a file per group); they touch the machine only through
//!   `host::Host` (with `FakeHost`, which records typed effects and fails any on request);
//! - `launch` runs a Plan through `launch::Machine` (the order is unit-tested with a fake), and
//!   what runs beside it: the keeper, the guard, the relays, the OCI hooks;
//! - `live` changes a running sandbox; `gate` is the egress gate's process and its clients;
//! - `host` is the effect seam (`Os` + `Ports`), and `sys::process` where the fork-time setup
//!   of a spawn and the signal calls are (unsafe: denied outside `sys`, below).
//!
//! Folders import only downwards (`scripts/check-imports`, docs/architecture.md).
//!
//! The public surface is what `main`, tests/ and the bench use; the rest is `pub(crate)`.
//!
//! `unsafe` is denied here and allowed in `sys` alone, so the compiler refuses it anywhere else
//! (main.rs denies it too); each unsafe block says why it is sound in a `// SAFETY:` comment,
//! which clippy requires (`undocumented_unsafe_blocks`).

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

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
pub mod review;
#[allow(unsafe_code)]
pub mod sys;
