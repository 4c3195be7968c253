//! The bottom layer: what every other module may use and which uses none of them.
//!
//! - `untrusted`: reading, moving and writing paths that a sandbox could have made (the project,
//!   the sandbox HOME, the agents' stores), without ever following a link, blocking on a fifo
//!   or reading without bound. Everything on the host that touches such a path after a session
//!   goes through it (see docs/adr/0052).
//! - `quote`: how anything a sandbox named (a path, a setting, a request path) is printed to the
//!   user: control characters, bidi overrides and bytes that are not UTF-8 escaped, as git's
//!   `core.quotePath` does, so that no terminal escape reaches a terminal.
//! - `process`: starting the gate, the keeper, podman and the sandbox's container engine with
//!   the fork-time setup that must be async-signal-safe, waiting on signals, SIGPIPE's default,
//!   and "is that pid alive" — needed by the launcher, the gate's client and live changes alike.
//! - `fdpass`: a descriptor received over a Unix socket (the gate's listening socket, passed to
//!   the launcher that registers), owned from the moment it arrives.
//! - `timing`: the start-up breakdown's marks (`AISB_TIMINGS`, for bench/run).
//! - `ids`: a session id as a user types it (whole, or its start).

pub(crate) mod fdpass;
pub mod ids;
pub mod process;
pub mod quote;
pub mod runtime;
pub mod timing;
pub mod untrusted;
