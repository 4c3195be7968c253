//! The container's environment and extra podman arguments.
//!
//! Podman applies, later winning: containers.conf < image ENV < `--http-proxy` (copies the
//! host's proxy variables) < `--env-file` < `--env`. We pass `--http-proxy=false` and compose
//! every proxy variable ourselves, once, so a user's `env = NO_PROXY=...` is merged into the
//! one value instead of being lost to flag order, and no host proxy leaks in.

use super::allow::{IpNet, Ports};
use super::{Inputs, NetMode};
use crate::config::Config;
use crate::error::{Diagnostic, Origin};
use std::net::{IpAddr, Ipv4Addr};

/// Proxy variables ai-sandbox owns when the gate is in use (compared case-insensitively).
const PROXY_VARS: [&str; 3] = ["http_proxy", "https_proxy", "all_proxy"];
const NO_PROXY_DEFAULTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Podman options that would undo the sandbox (network, capabilities, hooks, user namespace,
/// OCI runtime, publishing outside the input-chain rules). Refused in `allow`/`none` modes.
const GUARDED_FLAGS: &[&str] = &[
    "--network",
    "--net",
    "--privileged",
    "--cap-add",
    "--security-opt",
    "--userns",
    "--uidmap",
    "--gidmap",
    "--subuidname",
    "--subgidname",
    "--pod",
    "--rootfs",
    "--http-proxy",
    "--env-host",
    "--publish",
    "--publish-all",
    "--pid",
    "--ipc",
    "--runtime",
    "--runtime-flag",
    "--hooks-dir",
    "--device",
    "--sysctl",
    "--cgroupns",
    "--uts",
];

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// User `env` lines then `-e` flags. Returns the variables in order and, when the gate is in
/// use, the user's NO_PROXY entries separately (merged later into the one NO_PROXY).
pub fn user_env(
    config: &Config,
    inputs: &Inputs,
    net: NetMode,
    diags: &mut Vec<Diagnostic>,
) -> (Vec<(String, String)>, Vec<String>) {
    let gate = net == NetMode::Allow && !inputs.no_gate;
    let mut vars: Vec<(String, String, Origin)> = Vec::new();
    let mut no_proxy = Vec::new();
    let flags = inputs.env.iter().map(|v| (v.as_str(), Origin::Flag("-e")));
    for (v, at) in config.all("env").chain(flags) {
        let Some((name, value)) = v.split_once('=') else {
            diags
                .push(Diagnostic::new(at, format!("env `{v}` has no `=`")).hint(format!(
                    "write `NAME=VALUE`, e.g. `{v}=1`; host values are not copied implicitly"
                )));
            continue;
        };
        let name = name.trim();
        if !valid_name(name) {
            diags.push(
                Diagnostic::new(at, format!("`{name}` is not a valid environment variable name"))
                    .hint("names are letters, digits and `_`, not starting with a digit"),
            );
            continue;
        }
        let lower = name.to_ascii_lowercase();
        if gate && lower == "no_proxy" {
            no_proxy.extend(value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from));
            continue;
        }
        if gate && PROXY_VARS.contains(&lower.as_str()) {
            diags.push(
                Diagnostic::new(at, format!("{name} is set by ai-sandbox to the egress gate"))
                    .hint("delete this line; use `allow = HOST` to let traffic through the gate, or --net full for your own proxy"),
            );
            continue;
        }
        if let Some(i) = vars.iter().position(|(n, _, _)| n == name) {
            match (&vars[i].2, &at) {
                // -e overrides the project's config: an explicit, visible override.
                (Origin::Config(_), Origin::Flag(_)) => {
                    vars[i] = (name.to_string(), value.to_string(), at);
                }
                (Origin::Config(first), _) => diags.push(
                    Diagnostic::new(at, format!("{name} is already set on line {first}"))
                        .hint("keep one of the two lines"),
                ),
                _ => {
                    diags.push(Diagnostic::new(at, format!("{name} is given twice with -e")).hint("keep one"))
                }
            }
            continue;
        }
        vars.push((name.to_string(), value.to_string(), at));
    }
    (vars.into_iter().map(|(n, v, _)| (n, v)).collect(), no_proxy)
}

/// `extra_args` lines (shell-split) then `AISB_EXTRA_ARGS`.
pub fn extra_args(
    config: &Config,
    inputs: &Inputs,
    net: NetMode,
    diags: &mut Vec<Diagnostic>,
) -> Vec<String> {
    let mut out = Vec::new();
    let from_env = inputs.extra_args_env.as_deref().map(|v| (v, Origin::Env("AISB_EXTRA_ARGS")));
    for (v, at) in config.all("extra_args").chain(from_env) {
        let Some(args) = shlex::split(v) else {
            diags.push(
                Diagnostic::new(at, format!("extra_args `{v}` has unbalanced quotes"))
                    .hint("quote as in a POSIX shell"),
            );
            continue;
        };
        if net != NetMode::Full {
            for a in &args {
                if let Some(flag) = guarded(a) {
                    diags.push(
                        Diagnostic::new(
                            at.clone(),
                            format!("extra argument `{a}` would bypass the sandbox's {flag} setting"),
                        )
                        .hint(match flag {
                            "--publish" | "--publish-all" => {
                                "use `--publish PORT` (bound to 127.0.0.1, with an input rule)"
                            }
                            _ => {
                                "remove it, or run with `--net full` (no egress policy) if you really mean it"
                            }
                        }),
                    );
                }
            }
        }
        out.extend(args);
    }
    out
}

fn guarded(arg: &str) -> Option<&'static str> {
    if let Some(long) = arg.strip_prefix("--") {
        let name = long.split('=').next().unwrap_or(long);
        return GUARDED_FLAGS.iter().copied().find(|f| &f[2..] == name);
    }
    match arg.strip_prefix('-')?.chars().next()? {
        'p' => Some("--publish"),
        'P' => Some("--publish-all"),
        _ => None,
    }
}

/// The one NO_PROXY: defaults, then the user's entries, then gate_addr when an allow entry
/// reaches it on a port the gate does not relay (those clients must connect directly).
pub fn compose_no_proxy(user: &[String], gate_addr: Ipv4Addr, nets: &[(IpNet, Ports)]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let gate = gate_addr.to_string();
    let extra = super::reached_directly(nets, gate_addr, IpAddr::V4(gate_addr)).then_some(gate.as_str());
    for item in NO_PROXY_DEFAULTS.iter().copied().chain(user.iter().map(String::as_str)).chain(extra) {
        if !out.iter().any(|o| o.eq_ignore_ascii_case(item)) {
            out.push(item.to_string());
        }
    }
    out
}
