//! ai-sandbox: run a coding agent (or any command) in a rootless podman sandbox whose network
//! egress is an explicit allowlist, enforced by nftables inside the container's network
//! namespace, applied from outside before the first process runs.
//!
//! Data flows one way: config text + CLI + env → `policy::Policy` → `plan::Plan` → launch.
//!
//! Where side effects live, precisely (docs/architecture.md has the module graph):
//! - pure: `config`, `policy`, `ruleset`, `podman`, `plan`, `session`, `project`, `init`,
//!   `manpage`, `error`, `cli`, and the gate's `request`, `decide`, `tls`;
//! - `app` orchestrates the pipeline and touches the machine only through `host::Host`
//!   (a trait, with a recording `FakeHost` that proves `--dry-run` asks for no effect);
//! - `launch` executes a Plan for `RealHost` (session files, the keeper, podman, signals), and
//!   `relay` serves the launch's spliced IP entries;
//! - processes of their own: `keeper` (removes a sandbox whose launcher died), `hook` (inside
//!   podman's user namespace, loads the ruleset), the gate (`gate::server`, `state`, `control`,
//!   `splice`, `log`);
//! - `doctor` and `loopback`'s probe read the machine (through `Host` for the probe).

pub mod cli;
pub mod config;
pub mod error;
pub mod gate;
pub mod host;
pub mod kube;
pub mod launch;
pub mod live;
pub mod plan;
pub mod policy;
