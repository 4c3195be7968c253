//! ai-sandbox: run a coding agent (or any command) in a rootless podman sandbox whose network
//! egress is an explicit allowlist, enforced by nftables inside the container's network
//! namespace, applied from outside before the first process runs.
//!
//! Data flows one way: config text + CLI + env → `policy::Policy` → `plan::Plan` → launch.
//! Everything up to the Plan is pure; `host` is the one module with side effects.

pub mod app;
pub mod cli;
pub mod config;
pub mod doctor;
pub mod error;
pub mod gate;
pub mod hook;
pub mod host;
pub mod init;
pub mod keeper;
pub mod launch;
pub mod loopback;
pub mod manpage;
pub mod plan;
pub mod podman;
pub mod policy;
pub mod project;
pub mod ruleset;
pub mod session;
