//! The container's environment and extra podman arguments.
//!
//! Podman applies, later winning: containers.conf < image ENV < `--http-proxy` (copies the
//! host's proxy variables) < `--env-file` < `--env`. We pass `--http-proxy=false` and compose
//! every proxy variable ourselves, once, so a user's `env = NO_PROXY=...` is merged into the
//! one value instead of being lost to flag order, and no host proxy leaks in.

use super::allow::{IpNet, Ports};
pub(crate) use super::secret::{SecretLine, SecretSource, parse_secret};
use super::{Inputs, NetMode};
use crate::config::Config;
use crate::error::{Diagnostic, Origin};
use crate::policy::keys::Name;
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

/// A variable whose value is passed without ever being written down in the config or on a
/// command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Secret {
    pub(crate) name: String,
    pub(crate) from: SecretSource,
    /// The hosts it is bound to (`for`): the sandbox holds a placeholder. Empty: the value.
    pub(crate) hosts: Vec<String>,
    /// Where it was given (a binding is checked against the allow lines).
    pub(crate) at: Origin,
}

/// The environment the user asked for.
#[derive(Debug, Default)]
pub(crate) struct UserEnv {
    /// `NAME=VALUE` from `env` lines and `-e NAME=VALUE`, in order.
    pub(crate) vars: Vec<(String, String)>,
    /// The user's NO_PROXY entries (merged later into the one NO_PROXY).
    pub(crate) no_proxy: Vec<String>,
    pub(crate) secrets: Vec<Secret>,
}

/// One variable as given, before the checks every kind shares.
enum Given {
    Value(String),
    Secret(SecretSource, Vec<String>),
}

/// `env` and `secret` lines, then `-e` flags (`-e NAME=VALUE`, or `-e NAME` for the value of
/// NAME in the launching environment).
pub(crate) fn user_env(
    config: &Config,
    inputs: &Inputs,
    net: NetMode,
    diags: &mut Vec<Diagnostic>,
) -> UserEnv {
    let gate = net == NetMode::Allow && !inputs.no_gate;
    let mut out = UserEnv::default();
    let mut seen: Vec<(String, Origin)> = Vec::new();
    let mut given: Vec<(String, Given, Origin)> = Vec::new();
    // `env` and `secret` lines in file order, so "already set on line N" names the earlier one.
    for e in config.entries.iter().filter(|e| e.key == "env" || e.key == "secret") {
        let (v, at) = (e.value.as_str(), Origin::Config(e.line));
        if e.key == "secret" {
            match parse_secret(v) {
                // One line, the three variables an AWS client reads.
                Ok(SecretLine { from: SecretSource::Aws { profile, .. }, hosts, .. }) => {
                    for part in crate::policy::secret::AwsPart::ALL {
                        let from = SecretSource::Aws { profile: profile.clone(), part };
                        given.push((part.var().to_string(), Given::Secret(from, hosts.clone()), at.clone()));
                    }
                }
                Ok(l) => given.push((l.name, Given::Secret(l.from, l.hosts), at)),
                Err((msg, hint)) => diags.push(Diagnostic::new(at, msg).hint(hint)),
            }
            continue;
        }
        match v.split_once('=') {
            Some((n, value)) => given.push((n.trim().to_string(), Given::Value(value.to_string()), at)),
            None => diags.push(Diagnostic::new(at, format!("env `{v}` has no `=`")).hint(format!(
                "write `{v}=VALUE`; to pass a value from your environment without writing it down, use `secret = {v}`"
            ))),
        }
    }
    for v in &inputs.env {
        let at = Origin::Flag("-e");
        match v.split_once('=') {
            Some((n, value)) => given.push((n.trim().to_string(), Given::Value(value.to_string()), at)),
            None => given.push((v.trim().to_string(), Given::Secret(SecretSource::Env, Vec::new()), at)),
        }
    }
    for (name, g, at) in given {
        if !valid_name(&name) {
            diags.push(
                Diagnostic::new(at, format!("`{name}` is not a valid environment variable name"))
                    .hint("names are letters, digits and `_`, not starting with a digit"),
            );
            continue;
        }
        let lower = name.to_ascii_lowercase();
        if let (true, "no_proxy", Given::Value(value)) = (gate, lower.as_str(), &g) {
            out.no_proxy.extend(value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from));
            continue;
        }
        // "delete this line" only where there is a line: a flag is dropped, not deleted.
        let drop_it = match at {
            Origin::Config(_) => "delete this line",
            _ => "drop this -e",
        };
        if gate && (PROXY_VARS.contains(&lower.as_str()) || lower == "no_proxy") {
            diags.push(
                Diagnostic::new(at, format!("{name} is set by ai-sandbox to the egress gate")).hint(format!(
                    "{drop_it}; use `allow = HOST` to let traffic through the gate, or --net full for your own proxy"
                )),
            );
            continue;
        }
        if name == "HOME" {
            // It would be silently overridden: HOME is where the sandbox's own home is mounted.
            diags.push(
                Diagnostic::new(at, "HOME is the sandbox's own per-project home (mounted at your home's path) and cannot be set")
                    .hint(format!("{drop_it}; files the agent keeps in its HOME persist there between runs")),
            );
            continue;
        }
        if let Given::Value(value) = &g
            && value.contains('\n')
        {
            diags.push(
                Diagnostic::new(at, format!("the value of {name} contains a newline"))
                    .hint("pass one line per variable"),
            );
            continue;
        }
        if let Some((_, first)) = seen.iter().find(|(n, _)| *n == name) {
            match (first, &at) {
                // -e overrides the project's config: an explicit, visible override.
                (Origin::Config(_), Origin::Flag(_)) => {
                    out.vars.retain(|(n, _)| *n != name);
                    // `secret = aws`'s three variables are one line: a flag for one drops them all
                    // (the gate signs with all three or none).
                    let aws = |s: &Secret| matches!(s.from, SecretSource::Aws { .. });
                    let line_is_aws = out.secrets.iter().any(|s| s.name == name && aws(s));
                    out.secrets.retain(|s| s.name != name && !(line_is_aws && aws(s)));
                }
                (Origin::Config(line), _) => {
                    diags.push(
                        Diagnostic::new(at, format!("{name} is already set on line {line}"))
                            .hint("keep one of the two lines"),
                    );
                    continue;
                }
                _ => {
                    diags
                        .push(Diagnostic::new(at, format!("{name} is given twice with -e")).hint("keep one"));
                    continue;
                }
            }
        }
        seen.push((name.clone(), at.clone()));
        match g {
            Given::Value(value) => out.vars.push((name, value)),
            Given::Secret(from, hosts) => out.secrets.push(Secret { name, from, hosts, at }),
        }
    }
    out
}

/// `extra_args` lines (shell-split) then `AISB_EXTRA_ARGS`.
pub(crate) fn extra_args(
    config: &Config,
    inputs: &Inputs,
    net: NetMode,
    diags: &mut Vec<Diagnostic>,
) -> Vec<String> {
    let mut out = Vec::new();
    let from_env = inputs.extra_args_env.as_deref().map(|v| (v, Origin::Env("AISB_EXTRA_ARGS")));
    for (v, at) in config.all(Name::ExtraArgs).chain(from_env) {
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
                            "--network" | "--net" | "--pod" | "--http-proxy" | "--hooks-dir" | "--sysctl" => {
                                "remove it: the egress policy owns the network (`--net full` hands it over, with no policy at all)"
                            }
                            _ => {
                                "remove it: it would give the sandbox what the host keeps from it (capabilities, devices, \
                                 system calls, namespaces); only `--net full`, which is no boundary at all, passes it"
                            }
                        }),
                    );
                }
            }
        }
        if let Some(home) = &inputs.home {
            let resolve =
                |p: &std::path::Path| lexical(&inputs.resolve.map_or_else(|| p.to_path_buf(), |f| f(p)));
            let homes = [home.clone(), resolve(home)];
            for src in binds(&args).into_iter().filter(|(_, ro)| !ro).map(|(s, _)| s) {
                // As the kernel will read it: `/home/u/..` is `/home`; a glob mounts what its
                // directory holds; `/proc/PID/root/…` is any directory of the host; links are
                // followed (`/home/u` is `/var/home/u` where `/home` leads there).
                let written = std::path::Path::new(glob_base(&src));
                let read = [lexical(written), resolve(written)];
                let above =
                    |h: &std::path::PathBuf| read.iter().find(|s| s.is_absolute() && h.starts_with(s));
                let home_hit = homes.iter().find_map(|h| above(h).map(|s| (s, h)));
                if read.iter().any(|s| s.starts_with("/proc")) {
                    diags.push(
                        Diagnostic::new(
                            at.clone(),
                            format!("extra argument mounts {src} read-write: a path below /proc can lead to any directory of the host"),
                        )
                        .hint("mount the directory itself, or add `:ro` (`-v SRC:DST:ro`)"),
                    );
                } else if let Some((s, h)) = home_hit {
                    diags.push(
                        Diagnostic::new(
                            at.clone(),
                            format!(
                                "extra argument mounts {src} read-write: it {} your home directory, whose dotfiles, keys and shell start-up files the agent could then change",
                                if s == h { "is" } else { "holds" }
                            ),
                        )
                        .hint("mount only the directory the command needs, or add `:ro` (`-v SRC:DST:ro`)"),
                    );
                }
            }
        }
        out.extend(args);
    }
    out
}

/// `p` with `.` dropped and each `..` taking the name before it away, as written (no link is
/// read: this stage reads no file).
fn lexical(p: &std::path::Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The directory part of a mount source before its first glob character (`/home/u/.*` is
/// `/home/u/`): what a `type=glob` mount exposes entries of.
fn glob_base(src: &str) -> &str {
    match src.find(['*', '?', '[']) {
        Some(i) => &src[..src[..i].rfind('/').map_or(0, |s| s + 1)],
        None => src,
    }
}

/// podman run's short flags that take no value (`-i`, `-t`, `-d`, `-q`, `-P`). Any other short
/// flag takes one, the rest of its word or the next word (`-p 8080:80`, `-p8080:80`): in
/// `-ip 8080:80` the `i` is a flag of its own and `p` takes the next word, as podman reads it.
const SHORT_FLAGS: &str = "dtiqP";

/// The guarded podman flag `arg` gives, if any: a long flag by name, or any flag of a short
/// cluster, read as podman reads it (flags without a value, then at most one that takes the rest
/// of the word or the next one as its value).
fn guarded(arg: &str) -> Option<&'static str> {
    if let Some(long) = arg.strip_prefix("--") {
        let name = long.split('=').next().unwrap_or(long);
        return GUARDED_FLAGS.iter().copied().find(|f| &f[2..] == name);
    }
    for c in arg.strip_prefix('-')?.chars() {
        match c {
            'p' => return Some("--publish"),
            'P' => return Some("--publish-all"),
            c if SHORT_FLAGS.contains(c) => continue,
            // A flag that takes a value: the rest of the word is that value.
            _ => return None,
        }
    }
    None
}

/// The bind mounts a list of podman arguments asks for: (source, read-only), from `-v`,
/// `--volume` (`SRC:DST[:OPTS]`, a short cluster's `v` too) and `--mount` (`type=bind,src=…`).
pub(crate) fn binds(args: &[String]) -> Vec<(String, bool)> {
    let volume = |v: &str| -> Option<(String, bool)> {
        let mut parts = v.split(':');
        let src = parts.next()?.to_string();
        parts.next()?;
        let ro = parts.next().is_some_and(|o| o.split(',').any(|x| x == "ro" || x == "readonly"));
        Some((src, ro))
    };
    let mount = |v: &str| -> Option<(String, bool)> {
        let fields: Vec<&str> = v.split(',').collect();
        let get = |k: &[&str]| {
            fields.iter().find_map(|f| f.split_once('=').filter(|(n, _)| k.contains(n)).map(|(_, v)| v))
        };
        let bind = get(&["type"]).is_none_or(|t| t == "bind" || t == "glob");
        let src = get(&["src", "source"])?.to_string();
        let ro = fields.iter().any(|f| matches!(*f, "ro" | "readonly" | "ro=true" | "readonly=true"));
        bind.then_some((src, ro))
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let next = args.get(i + 1).map(String::as_str);
        let found = if let Some(v) = a.strip_prefix("--volume=") {
            volume(v)
        } else if let Some(v) = a.strip_prefix("--mount=") {
            mount(v)
        } else if a == "--volume" {
            i += 1;
            next.and_then(volume)
        } else if a == "--mount" {
            i += 1;
            next.and_then(mount)
        } else if let Some(cluster) = a.strip_prefix('-').filter(|c| !c.starts_with('-')) {
            // `-v SRC:DST`, `-vSRC:DST`, `-iv SRC:DST`: the first flag that takes a value decides.
            match cluster.char_indices().find(|(_, c)| !SHORT_FLAGS.contains(*c)) {
                Some((at, 'v')) if at + 1 < cluster.len() => volume(&cluster[at + 1..]),
                Some((_, 'v')) => {
                    i += 1;
                    next.and_then(volume)
                }
                // Another flag's value: attached, or the next word (skipped).
                Some((at, _)) => {
                    if at + 1 == cluster.len() {
                        i += 1;
                    }
                    None
                }
                None => None,
            }
        } else {
            None
        };
        out.extend(found);
        i += 1;
    }
    out
}

/// The one NO_PROXY: defaults, then the user's entries, then gate_addr when an allow entry
/// reaches it on a port the gate does not relay (those clients must connect directly), then each
/// address or network with an address budget (counted on the direct path only: the gate does
/// not relay it).
pub(crate) fn compose_no_proxy(
    user: &[String],
    gate_addr: Ipv4Addr,
    nets: &[(IpNet, Ports)],
    budgeted: &[IpNet],
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let gate = gate_addr.to_string();
    let extra = super::reached_directly(nets, gate_addr, IpAddr::V4(gate_addr)).then_some(gate.clone());
    let budgeted = budgeted.iter().map(|n| n.to_string());
    let items = NO_PROXY_DEFAULTS
        .iter()
        .map(|s| s.to_string())
        .chain(user.iter().cloned())
        .chain(extra)
        .chain(budgeted);
    for item in items {
        let item = item.as_str();
        if !out.iter().any(|o| o.eq_ignore_ascii_case(item)) {
            out.push(item.to_string());
        }
    }
    out
}
