//! Every key of `.ai-sandbox/config`, declared once: its syntax (repeats, shell-split), what it
//! does (the man page and `ai-sandbox help config`), a value it accepts, whether and how a line
//! widens what the sandbox may do (what `trust` calls out before approval), and what the
//! Kubernetes export does with it. A new key is one row here plus its reading in `policy`; the
//! compiler asks for every column, and the tests below build each key's example.
//!
//! The widening and export checks read a value with the same parsers the policy uses
//! (`allow::parse`, `secret::parse_secret`, `addr::classify`), never a second reading.

use super::addr::{Class, DEFAULT_GATE_ADDR, classify, reached_by};
use super::allow::{Allow, HostPattern, IpNet, Ports, parse};
use super::secret::{SecretLine, SecretSource, parse_secret};
use std::net::IpAddr;

/// Every key's name, as the code reads it: `build` and the export read a key through its
/// variant (`config.one(Name::Net)`), so a misspelt key is a compile error, and a new key is a
/// variant, its spelling here, and its row in `KEYS` (a test checks each variant has one row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Name {
    Allow,
    Deny,
    Env,
    ExtraArgs,
    Publish,
    Rule,
    Budget,
    Resolve,
    Protect,
    Secret,
    UpstreamCa,
    State,
    GatePorts,
    GateAddr,
    GatePort,
    Image,
    Cmd,
    Pids,
    Memory,
    TmpSize,
    Ask,
    Net,
    Workspace,
    Containers,
    GitIdentity,
}

impl Name {
    /// Every key, in the registry's order.
    pub const ALL: &[Name] = &[
        Name::Allow,
        Name::Deny,
        Name::Env,
        Name::ExtraArgs,
        Name::Publish,
        Name::Rule,
        Name::Budget,
        Name::Resolve,
        Name::Protect,
        Name::Secret,
        Name::UpstreamCa,
        Name::State,
        Name::GatePorts,
        Name::GateAddr,
        Name::GatePort,
        Name::Image,
        Name::Cmd,
        Name::Pids,
        Name::Memory,
        Name::TmpSize,
        Name::Ask,
        Name::Net,
        Name::Workspace,
        Name::Containers,
        Name::GitIdentity,
    ];

    /// How the config spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Name::Allow => "allow",
            Name::Deny => "deny",
            Name::Env => "env",
            Name::ExtraArgs => "extra_args",
            Name::Publish => "publish",
            Name::Rule => "rule",
            Name::Budget => "budget",
            Name::Resolve => "resolve",
            Name::Protect => "protect",
            Name::Secret => "secret",
            Name::UpstreamCa => "upstream_ca",
            Name::State => "state",
            Name::GatePorts => "gate_ports",
            Name::GateAddr => "gate_addr",
            Name::GatePort => "gate_port",
            Name::Image => "image",
            Name::Cmd => "cmd",
            Name::Pids => "pids",
            Name::Memory => "memory",
            Name::TmpSize => "tmp_size",
            Name::Ask => "ask",
            Name::Net => "net",
            Name::Workspace => "workspace",
            Name::Containers => "containers",
            Name::GitIdentity => "git_identity",
        }
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl crate::config::KeyName for Name {
    fn key_name(&self) -> &'static str {
        self.as_str()
    }
}

/// One config key.
pub struct Key {
    pub name: Name,
    /// May appear on many lines (else once).
    pub(crate) repeats: bool,
    /// Its value is shell-split, so quotes mean something.
    pub(crate) shell: bool,
    pub(crate) doc: &'static str,
    /// A value `policy::build` accepts (tested), as the docs would show it.
    pub(crate) example: &'static str,
    pub(crate) widens: Widens,
    pub(crate) export: Exports,
}

/// Whether a line can give the sandbox more than it had: `trust` calls such lines out.
pub(crate) enum Widens {
    /// Never: it narrows, names, or tunes.
    Never,
    /// Some values do; the function says why for those.
    When(fn(&str) -> Option<String>),
    /// The line narrows: removing it widens, for this reason.
    WhenDropped(&'static str),
}

/// What each export target does with a line. A new target is a field here, so every key must
/// say what that target does with it (a test checks that `Carried` is true of each target).
pub(crate) struct Exports {
    /// `ai-sandbox export kube`.
    pub(crate) kube: Export,
}

/// What an export target does with a line.
pub(crate) enum Export {
    /// Carried into the exported objects.
    Carried,
    /// Carried, except values the function refuses: (why, what to use instead).
    Checked(fn(&str, &ExportCx) -> Option<(String, &'static str)>),
    /// A cluster has no such thing: the export refuses the line: (why, what to use instead).
    Refused(&'static str, &'static str),
    /// Has no meaning in a cluster; the export says it was left out, and why.
    LeftOut(&'static str),
}

/// What an export check needs of the policy.
pub(crate) struct ExportCx {
    /// The host's loopback mapping (no cluster has one).
    pub(crate) gate_addr: IpAddr,
    /// Every allowed network, flags included.
    pub(crate) allowed: Vec<(IpNet, Ports)>,
}

pub const KEYS: &[Key] = &[
    Key {
        name: Name::Allow,
        repeats: true,
        shell: false,
        doc: "what the sandbox may reach: HOST, *.SUFFIX (through the gate), IP[:PORTS], CIDR[:PORTS], [IPv6]:PORTS (direct)",
        example: "github.com",
        widens: Widens::When(allow_widens),
        export: Exports { kube: Export::Checked(|v, cx| reaches_loopback("allow", "allows", v, cx)) },
    },
    Key {
        name: Name::Deny,
        repeats: true,
        shell: false,
        doc: "the same forms, refused even where an allow line would let them through",
        example: "169.254.0.0/16",
        widens: Widens::WhenDropped("removed: that destination is no longer refused"),
        export: Exports { kube: Export::Checked(deny_exports) },
    },
    Key {
        name: Name::Env,
        repeats: true,
        shell: false,
        doc: "NAME=VALUE in the sandbox's environment (NO_PROXY values are merged into the one ai-sandbox sets)",
        example: "RUST_LOG=info",
        widens: Widens::When(env_widens),
        export: Exports { kube: Export::Carried },
    },
    Key {
        name: Name::ExtraArgs,
        repeats: true,
        shell: true,
        doc: "more `podman run` options, shell-split (options that would undo the sandbox are refused)",
        example: "--memory 4g",
        widens: Widens::When(extra_args_widen),
        export: Exports {
            kube: Export::Refused(
                "are podman flags; a Pod has no such thing",
                "express it in the exported Pod (resources, volumes) after export, or remove the line",
            ),
        },
    },
    Key {
        name: Name::Publish,
        repeats: true,
        shell: false,
        doc: "PORT or HOSTPORT:PORT: serve a sandbox port on the host's 127.0.0.1 only",
        example: "8080",
        widens: Widens::Never,
        export: Exports { kube: Export::Carried },
    },
    Key {
        name: Name::Rule,
        repeats: true,
        shell: false,
        doc: "HOST METHOD PATH, or HOST git-fetch [REPO], or HOST git-push [REPO [REF...]], or HOST mcp PATH TOOL... (an MCP endpoint: the tools it may call and list): once a host has rules, the gate lets through only the requests they allow (it opens TLS to read them)",
        example: "api.github.com GET /repos/acme/**",
        widens: Widens::When(rule_widens),
        export: Exports { kube: Export::Carried },
    },
    Key {
        name: Name::Budget,
        repeats: true,
        shell: false,
        doc: "HOST BYTES, or ADDRESS[/LEN] BYTES, or * BYTES for every host without a line: what a session may send to it (the gate counts hosts, the sandbox's rules count addresses); past it nothing more is sent. HOST BYTES/day (or /hour, /week): one count for all of the project's sessions in that window",
        example: "api.github.com 50m",
        widens: Widens::WhenDropped("removed: what the sandbox sends to that host is no longer capped"),
        export: Exports {
            kube: Export::LeftOut(
                "neither the cluster's gate nor its network policies count bytes yet: a budget holds on this machine only",
            ),
        },
    },
    Key {
        name: Name::Resolve,
        repeats: true,
        shell: false,
        doc: "NAME=IP: pin a name for the gate (the address is still checked)",
        example: "api.internal.example=192.0.2.10",
        widens: Widens::When(resolve_widens),
        export: Exports { kube: Export::Carried },
    },
    Key {
        name: Name::Protect,
        repeats: true,
        shell: false,
        doc: "PATH inside the project: read-only inside and verified after each session",
        example: "scripts/deploy.sh",
        widens: Widens::WhenDropped("removed: that path is no longer protected"),
        export: Exports {
            kube: Export::LeftOut(
                "protects files of this machine's project directory; a Pod's volume is not it",
            ),
        },
    },
    Key {
        name: Name::Secret,
        repeats: true,
        shell: false,
        doc: "NAME [from FILE] [for HOST, ...]: a value from your environment or a 0600 file, never written in the config; bound to hosts, the sandbox sees only a placeholder (`aws[:PROFILE] for HOST, ...`: your AWS credentials, which the gate signs with)",
        example: "ANTHROPIC_API_KEY",
        widens: Widens::When(secret_widens),
        export: Exports { kube: Export::Checked(secret_exports) },
    },
    Key {
        name: Name::UpstreamCa,
        repeats: false,
        shell: false,
        doc: "FILE (PEM, outside the project): more roots the gate trusts when it opens TLS to a bound secret's host",
        example: "/etc/my-company/ca.pem",
        widens: Widens::When(|v| {
            Some(format!("the gate trusts servers whose certificates {} signs", v.trim()))
        }),
        export: Exports { kube: Export::Carried },
    },
    Key {
        name: Name::State,
        repeats: true,
        shell: false,
        doc: "AGENT or ~/FILE: a login that follows you from project to project (the login only: settings stay per project)",
        example: "claude",
        widens: Widens::When(|v| Some(crate::policy::agents::shared_words(v))),
        export: Exports {
            kube: Export::Refused(
                "keeps the agent's login on this machine: the export carries no login to the cluster (a gate there would \
                 hold its refresh token in a Secret that whoever reads the namespace's Secrets reads, and could not \
                 write a refresh back to your login store)",
                "use an API key bound to its host (`secret = NAME for HOST`), which the cluster gate holds, or give the Pod \
                 a PersistentVolumeClaim for the agent's home (the agent then holds the login in clear)",
            ),
        },
    },
    Key {
        name: Name::GatePorts,
        repeats: false,
        shell: false,
        doc: "the ports the gate relays for hostname entries without a port (default 80,443,8443)",
        example: "443,8443",
        widens: Widens::When(|v| Some(format!("the gate relays these ports for every allowed name: {v}"))),
        export: Exports { kube: Export::Carried },
    },
    Key {
        name: Name::GateAddr,
        repeats: false,
        shell: false,
        doc: "the address inside the sandbox that is the host's loopback (default 100.64.0.1)",
        example: "100.64.0.2",
        widens: Widens::When(|_| Some("moves the host's loopback mapping".into())),
        export: Exports { kube: Export::LeftOut("a cluster has no host loopback to map") },
    },
    Key {
        name: Name::GatePort,
        repeats: false,
        shell: false,
        doc: "the gate binds the first free port at or above this (default 18081)",
        example: "18100",
        widens: Widens::Never,
        export: Exports { kube: Export::LeftOut("the exported gate is a Service on its own port") },
    },
    Key {
        name: Name::Image,
        repeats: false,
        shell: false,
        doc: "host (default: the host's own /usr, /etc, /opt read-only) or a local image; never pulled",
        example: "localhost/agent:1",
        widens: Widens::When(|v| {
            (v != "host").then(|| format!("runs the image {v} instead of the host's own tools"))
        }),
        // `image = host` (also the default, and `--image`) is judged on the policy by the export.
        export: Exports { kube: Export::Carried },
    },
    Key {
        name: Name::Cmd,
        repeats: false,
        shell: true,
        doc: "the command `ai-sandbox` runs with no `--` (default: an interactive shell)",
        example: "claude",
        widens: Widens::When(|v| Some(format!("sets the command that runs: {v}"))),
        export: Exports { kube: Export::Carried },
    },
    Key {
        name: Name::Pids,
        repeats: false,
        shell: false,
        doc: "N: how many processes the sandbox may run at once (default 4096; a fork bomb stops there)",
        example: "8192",
        widens: Widens::When(super::limits::pids_widen),
        export: Exports {
            kube: Export::LeftOut("a Pod's limits are its resources: set them in the exported Pod"),
        },
    },
    Key {
        name: Name::Memory,
        repeats: false,
        shell: false,
        doc: "SIZE (512m, 8g): the sandbox's memory limit, where the host can enforce it (cgroup v2)",
        example: "8g",
        widens: Widens::WhenDropped("removed: the sandbox's memory is no longer limited"),
        export: Exports {
            kube: Export::LeftOut(
                "a Pod's limits are its resources: set resources.limits.memory in the exported Pod",
            ),
        },
    },
    Key {
        name: Name::TmpSize,
        repeats: false,
        shell: false,
        doc: "SIZE: how much the sandbox's /tmp (in memory, image = host) may hold (default 2g)",
        example: "4g",
        widens: Widens::When(super::limits::tmp_widen),
        export: Exports {
            kube: Export::LeftOut("a Pod's /tmp is its own emptyDir: size it in the exported Pod"),
        },
    },
    Key {
        name: Name::Ask,
        repeats: false,
        shell: false,
        doc: "SECONDS: with `ai-sandbox watch` attached, hold a refused request for an answer",
        example: "30",
        widens: Widens::Never,
        export: Exports { kube: Export::LeftOut("no one watches a cluster's gate to answer") },
    },
    Key {
        name: Name::Net,
        repeats: false,
        shell: false,
        doc: "allow (default: the allowlist), none (no interface) or full (no policy at all)",
        example: "none",
        widens: Widens::When(|v| {
            (v == "full").then(|| "turns the egress policy off: the sandbox reaches everything".into())
        }),
        // `net = full` (or `--net full`) is judged on the policy by the export.
        export: Exports { kube: Export::Carried },
    },
    Key {
        name: Name::Workspace,
        repeats: false,
        shell: false,
        doc: "direct (default: the sandbox writes the project) or review (a copy-on-write layer: `ai-sandbox diff`, then `apply` or `discard`)",
        example: "review",
        widens: Widens::WhenDropped(
            "removed: the sandbox writes the project directly again, with no review before its changes land",
        ),
        export: Exports {
            kube: Export::LeftOut("a Pod works on its own volume; there is no host project to review"),
        },
    },
    Key {
        name: Name::Containers,
        repeats: false,
        shell: false,
        doc: "off (default) or on: the sandbox gets its own rootless podman (a Docker-compatible socket at DOCKER_HOST), whose containers stay in the sandbox's network namespace, under the same policy",
        example: "on",
        widens: Widens::When(|v| {
            (v == "on").then(|| {
                "gives the sandbox its own container engine: a seccomp profile that also allows chroot and sethostname, \
                 /proc and /sys unmasked, /dev/net/tun (its containers still leave through this policy)"
                    .into()
            })
        }),
        export: Exports {
            kube: Export::LeftOut(
                "a Pod gets no nested container engine; the cluster runs the containers a suite needs",
            ),
        },
    },
    Key {
        name: Name::GitIdentity,
        repeats: false,
        shell: false,
        doc: "the author of git commits made inside: host (default: your git config's user.name and user.email, nothing else of it), off, or `Name <email>`",
        example: "Agent <agent@example.com>",
        widens: Widens::Never,
        export: Exports {
            kube: Export::LeftOut("a Pod's commits are authored as its image and environment say"),
        },
    },
];

/// The key called `name`.
impl crate::config::Syntax for Key {
    fn name(&self) -> &'static str {
        self.name.as_str()
    }
    fn repeats(&self) -> bool {
        self.repeats
    }
    fn shell(&self) -> bool {
        self.shell
    }
}

/// Reads a config file's text against the registry: every bad line, with its number.
pub fn read(text: &str) -> (crate::config::Config, Vec<crate::error::Diagnostic>) {
    crate::config::parse(text, KEYS)
}

pub(crate) fn get(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name.as_str() == name)
}

/// Why a line widens the sandbox, if it does.
pub(crate) fn widening(key: &str, value: &str) -> Option<String> {
    match get(key)?.widens {
        Widens::Never | Widens::WhenDropped(_) => None,
        Widens::When(f) => f(value),
    }
}

/// Why removing a line of `key` widens the sandbox, if it does.
pub(crate) fn widening_when_dropped(key: &str) -> Option<&'static str> {
    match get(key)?.widens {
        Widens::WhenDropped(why) => Some(why),
        _ => None,
    }
}

/// Variables that change what programs load or run, or where credentials come from.
const SENSITIVE_ENV: &[&str] = &[
    "PATH",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PERL5OPT",
    "PERL5LIB",
    "RUBYOPT",
    "RUBYLIB",
    "BASH_ENV",
    "ENV",
    "PROMPT_COMMAND",
    "HOME",
    "SHELL",
    "JAVA_TOOL_OPTIONS",
    "CARGO_HOME",
    "RUSTC_WRAPPER",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_CONFIG_GLOBAL",
    "GIT_EXEC_PATH",
    "SSH_AUTH_SOCK",
];

fn env_widens(v: &str) -> Option<String> {
    let name = v.split('=').next().unwrap_or("").trim();
    let upper = name.to_ascii_uppercase();
    let sensitive = SENSITIVE_ENV.iter().any(|s| s.eq_ignore_ascii_case(name))
        || upper.starts_with("GIT_")
        || upper.starts_with("LD_");
    sensitive.then(|| format!("overrides {name}, which changes what programs load or run"))
}

fn extra_args_widen(v: &str) -> Option<String> {
    let args = shlex::split(v).unwrap_or_default();
    let mut why = Vec::new();
    for (i, a) in args.iter().enumerate() {
        let next = args.get(i + 1).map(String::as_str).unwrap_or("");
        let flag = a.split('=').next().unwrap_or(a);
        let val = a.split_once('=').map(|x| x.1).unwrap_or(next);
        match flag {
            "-v" | "--volume" | "--mount" => why.push(format!("mounts a host path ({val})")),
            "--device" => why.push(format!("passes a host device ({val})")),
            "--env-file" => why.push(format!("reads an env file from the host ({val})")),
            "--pids-limit" | "--ulimit" | "--cgroups" | "--cgroup-parent" | "--cgroup-conf" | "--memory"
            | "-m" | "--memory-swap" => {
                why.push(format!("sets the sandbox's resource limits itself ({flag} {val})"))
            }
            _ if a.starts_with("-v") && a.len() > 2 => why.push(format!("mounts a host path ({})", &a[2..])),
            _ if a.starts_with("-m") && a.len() > 2 => {
                why.push(format!("sets the sandbox's resource limits itself (-m {})", &a[2..]))
            }
            _ => {}
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

fn resolve_widens(v: &str) -> Option<String> {
    let (name, ip) = v.split_once('=').unwrap_or((v, ""));
    let class = ip.trim().parse().ok().and_then(classify);
    let class = class.map(|c| format!(", which is {}", c.words())).unwrap_or_default();
    Some(format!("pins {} to {}{class} for the gate (no DNS answer is asked)", name.trim(), ip.trim()))
}

fn rule_widens(v: &str) -> Option<String> {
    let rules = super::rule::parse(v).ok()?;
    let host = rules.first()?.host.to_string();
    Some(format!(
        "lets the sandbox ask {host} for `{}` (the first rule for a host narrows it to its rules; each further rule allows more)",
        v.split_whitespace().skip(1).collect::<Vec<_>>().join(" ")
    ))
}

/// `secret = aws` stays on this machine: the cluster gate does not sign.
fn secret_exports(v: &str, _: &ExportCx) -> Option<(String, &'static str)> {
    match parse_secret(v) {
        Ok(SecretLine { from: SecretSource::Aws { .. }, .. }) => Some((
            format!(
                "`secret = {}`: the export carries no AWS credentials to the cluster (its gate does not sign AWS requests)",
                v.trim()
            ),
            "give the Pod AWS credentials of the cluster's own (an IAM role for its service account), or leave the line out of the export",
        )),
        _ => None,
    }
}

fn secret_widens(v: &str) -> Option<String> {
    Some(match parse_secret(v) {
        Ok(SecretLine { from: SecretSource::Aws { .. }, hosts, .. }) => format!(
            "lets the sandbox use your AWS credentials at {}: the gate signs its requests there (the agent sees only placeholders)",
            hosts.join(", ")
        ),
        Ok(l) if !l.hosts.is_empty() => format!(
            "lets the sandbox use {} at {} (the gate puts it into requests there; the agent sees only a placeholder)",
            l.name,
            l.hosts.join(", ")
        ),
        Ok(SecretLine { name, from: SecretSource::File(file), .. }) => format!(
            "reads the file {file} on your machine into the sandbox's environment as {name}: the agent holds its contents"
        ),
        _ => format!("passes {} from your environment into the sandbox: the agent holds its value", v.trim()),
    })
}

fn allow_widens(v: &str) -> Option<String> {
    match parse(v).ok()? {
        Allow::Host(HostPattern::Suffix(s), _) => Some(format!("every name under {s}")),
        Allow::Host(h, ports) => Some(match ports {
            Some(p) => format!("lets the sandbox reach {h} through the gate, on port {p}"),
            None => format!("lets the sandbox reach {h} through the gate, on the gate's ports"),
        }),
        Allow::Net(n, ports) => {
            let mut why = Vec::new();
            let v4 = n.is_v4();
            if (v4 && n.len < 24) || (!v4 && n.len < 48) {
                why.push(format!("a wide network ({n})"));
            }
            if !v4 {
                why.push("an IPv6 entry (reached directly, by address)".into());
            }
            let host_loopback = n.contains(IpAddr::V4(DEFAULT_GATE_ADDR));
            if host_loopback {
                let p = ports.map_or("every port".to_string(), |p| format!("port {p}"));
                why.push(format!("the host's own loopback services ({p})"));
            }
            for c in reached_by(&n).into_iter().filter(|c| !(host_loopback && *c == Class::Shared)) {
                why.push(match c {
                    Class::Private | Class::UniqueLocal => format!("{} (your private network)", c.words()),
                    c => format!("{} ({n} reaches it)", c.words()),
                });
            }
            if let Some(p) = ports.filter(|p| p.hi - p.lo >= 100) {
                why.push(format!("{} ports ({p})", u32::from(p.hi - p.lo) + 1));
            }
            (!why.is_empty()).then(|| why.join("; "))
        }
    }
}

/// An allow or deny line that reaches this machine's loopback mapping, which a cluster lacks.
fn reaches_loopback(key: &str, what: &str, v: &str, cx: &ExportCx) -> Option<(String, &'static str)> {
    let Ok(Allow::Net(n, _)) = parse(v) else { return None };
    n.contains(cx.gate_addr).then(|| {
        (
            format!("`{key} = {v}` {what} this machine's loopback, which a cluster does not have"),
            "reach the service by its cluster address instead (`allow = 10.96.0.10:5432`, a Service's ClusterIP) or by name through the gate",
        )
    })
}

fn deny_exports(v: &str, cx: &ExportCx) -> Option<(String, &'static str)> {
    if let Some(refusal) = reaches_loopback("deny", "denies", v, cx) {
        return Some(refusal);
    }
    let Ok(Allow::Net(n, Some(r))) = parse(v) else { return None };
    (r != Ports::ALL && cx.allowed.iter().any(|(a, _)| a.contains(n.addr))).then(|| {
        (
            format!("`deny = {v}` refuses some ports of an allowed address; a NetworkPolicy can only carve out whole addresses"),
            "narrow the allow entry's ports instead, or deny the whole address",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Inputs, build};
    use std::path::PathBuf;

    #[test]
    fn every_key_is_read_by_the_policy_and_its_example_is_accepted() {
        // Every example is built beside the allow line a rule's host needs.
        const ALLOWED: &str = "allow = api.github.com\n";
        let (empty, _) = crate::policy::keys::read(ALLOWED);
        let base = build(PathBuf::from("/w/p"), &empty, &Inputs::default()).unwrap();
        for k in KEYS {
            assert!(!k.doc.is_empty() && !k.example.is_empty(), "{}", k.name.as_str());
            let text = format!("{ALLOWED}{} = {}\n", k.name.as_str(), k.example);
            let (cfg, errs) = crate::policy::keys::read(&text);
            assert!(errs.is_empty(), "{text}: {errs:?}");
            let p = build(PathBuf::from("/w/p"), &cfg, &Inputs::default())
                .unwrap_or_else(|e| panic!("{text}: {e:?}"));
            // A key the policy does not read would leave it as it was.
            assert!(
                format!("{p:?}") != format!("{base:?}"),
                "`{}` changes nothing in the policy",
                k.name.as_str()
            );
        }
        let mut names: Vec<&str> = KEYS.iter().map(|k| k.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KEYS.len(), "a key is declared twice");
        // Each name has its row, in the same order.
        assert_eq!(KEYS.iter().map(|k| k.name).collect::<Vec<_>>(), Name::ALL);
    }

    /// `extra_args` that set podman's own resource limits are called out at approval: on cgroup v2
    /// `--pids-limit 0` or `--cgroups=disabled` would lift the sandbox's only process limit.
    #[test]
    fn extra_args_that_set_resource_limits_are_called_out() {
        for v in
            ["--pids-limit 0", "--pids-limit=-1", "--cgroups=disabled", "--ulimit nproc=-1", "-m 1t", "-m1t"]
        {
            let why = extra_args_widen(v).unwrap_or_default();
            assert!(why.contains("sets the sandbox's resource limits itself"), "{v}: {why:?}");
        }
        assert_eq!(extra_args_widen("--tz UTC --init"), None, "control: nothing of the kind");
    }

    #[test]
    fn a_key_that_says_it_widens_does_so_for_some_value_and_one_that_never_does_is_silent() {
        // Values that widen, per key that can; every other key's example is silent.
        let widening = [
            ("allow", "*.example.com"),
            ("env", "LD_PRELOAD=/x.so"),
            ("extra_args", "-v /:/host"),
            ("resolve", "a.example=10.0.0.1"),
            ("rule", "github.com git-push"),
            ("secret", "K"),
            ("upstream_ca", "/ca.pem"),
            ("state", "claude"),
            ("gate_ports", "22"),
            ("gate_addr", "100.64.0.2"),
            ("image", "localhost/x"),
            ("cmd", "sh"),
            ("net", "full"),
            ("pids", "100000"),
            ("tmp_size", "64g"),
            ("containers", "on"),
        ];
        for k in KEYS {
            match (&k.widens, widening.iter().find(|(n, _)| *n == k.name.as_str())) {
                (Widens::When(f), Some((_, v))) => assert!(f(v).is_some(), "{} = {v}", k.name.as_str()),
                (Widens::Never | Widens::WhenDropped(_), None) => {}
                (Widens::When(_), None) => {
                    panic!("`{}` can widen: add a value that does above", k.name.as_str())
                }
                (_, Some(_)) => {
                    panic!("`{}` never widens by being written, yet is listed above", k.name.as_str())
                }
            }
        }
    }

    #[test]
    fn trust_says_which_secrets_the_agent_holds_and_which_it_only_uses() {
        let bound = secret_widens("K for api.example.com").unwrap();
        assert!(
            bound.contains("lets the sandbox use K at api.example.com") && bound.contains("placeholder"),
            "{bound}"
        );
        let clear = secret_widens("K").unwrap();
        assert!(clear.contains("the agent holds its value"), "{clear}");
    }
}
