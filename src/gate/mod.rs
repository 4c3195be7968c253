//! The egress gate: a loopback-bound, token-gated HTTP CONNECT/forward proxy that enforces the
//! hostname allowlist. The container has no DNS and no route out except the gate's port, so
//! every HTTP(S) client that honours the proxy variables comes through here.
//!
//! Pure stages (`request`, `decide`, `tls`, `secrets`, `scrub`, `push`, `ws`, `grpc`, `proto`)
//! are unit-tested over the threat classes; `server` does the I/O and the process's lifecycle;
//! `state` holds the sessions; `control` is the per-user control socket (client and server) the
//! launcher registers sessions on; `log` the decision log; `http` the one response writer and the
//! head readers. For the hosts whose TLS the gate opens (a bound secret's, a host with rules):
//! `secrets` the placeholders, `terminate` the connection, `normalise`, `scrub` and `response`
//! what comes back, `push` a push's refs, `ws` a WebSocket's frames, `proto` and `upstream` the
//! HTTP version and the upstream connection, `grpc` a gRPC call's refusal and messages,
//! `request_body` and `ws_relay` what the sandbox sends. `view` is a request as every decision
//! below the hostname reads it, from either path. `budget` counts what each session sends to a
//! budgeted host. `connect` is the client side inside the sandbox (ssh's ProxyCommand); `splice`
//! the zero-copy relay; `cluster` the gate as a cluster service (sessions from a policy file
//! instead of the control socket).

pub mod connect;

pub mod ask;
pub(crate) mod budget;
pub(crate) mod ca;
pub mod cluster;
pub mod commands;
pub mod control;
pub mod decide;
pub(crate) mod grpc;
pub(crate) mod http;
pub(crate) mod log;
pub(crate) mod login;
pub(crate) mod mcp;
pub(crate) mod normalise;
pub(crate) mod ocsf;
pub(crate) mod percent;
pub(crate) mod periods;
pub(crate) mod pipeline;
pub(crate) mod proto;
pub mod push;
pub mod request;
mod request_body;
pub(crate) mod response;
pub(crate) mod scrub;
pub(crate) mod secrets;
pub mod server;
pub(crate) mod sigv4;
pub(crate) mod splice;
mod state;
pub(crate) mod terminate;
pub mod tls;
pub(crate) mod upstream;
pub(crate) mod view;
pub(crate) mod ws;
mod ws_relay;

#[cfg(test)]
mod tests;
