//! Policy: every value the user gave (config lines, flags, environment), validated and
//! normalised into one structure that later stages read without re-checking.
//!
//! All problems are collected with their origin so a user sees every bad line at once;
//! a `Policy` exists only when there were none (nothing starts on bad input).

pub(crate) mod addr;
pub(crate) mod agent_state;
pub(crate) mod agents;
pub mod allow;
pub(crate) mod approval;
pub mod budget;
pub(crate) mod env;
pub mod forwards;
mod image;
pub mod keys;
pub mod learn;
pub(crate) mod limits;
pub(crate) mod netset;
pub mod rule;
pub(crate) mod secret;
pub mod url_path;

use crate::config::Config;
use crate::error::{Diagnostic, Origin};
use crate::policy::keys::Name;
use allow::{Allow, HostPattern, IpNet, Ports};
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

pub use addr::DEFAULT_GATE_ADDR;
pub(crate) const DEFAULT_GATE_PORT: u16 = 18081;
/// Ports the gate relays for hostname entries without an explicit port.
pub(crate) const GATE_DEFAULT_PORTS: [u16; 3] = [80, 443, 8443];
/// Where pasta forwards DNS inside the namespace (podman passes `--dns-forward 169.254.1.1`).
pub(crate) const PASTA_DNS: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// The one spelling of a mode: `--net`, the config's `net =`, and the live record's `net`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetMode {
    /// Allowlist enforced by nftables (and the gate for hostnames).
    Allow,
    /// No network interface at all, only loopback.
    None,
    /// No policy: the container reaches whatever the host reaches.
    Full,
}

impl NetMode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            NetMode::Allow => "allow",
            NetMode::None => "none",
            NetMode::Full => "full",
        }
    }
}

impl std::fmt::Display for NetMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Image {
    /// The host's own /usr, /etc, /opt read-only on a root made for each session (`plan::root`).
    Host,
    /// A local OCI image.
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// An interactive shell.
    Shell,
    /// Bytes, not text: `-- ls $'caf\xe9.txt'` names a file that is not UTF-8.
    Argv(Vec<OsString>),
}

/// A published port: host 127.0.0.1:`host` → container `container`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Publish {
    pub(crate) host: u16,
    pub(crate) container: u16,
}

/// What the command line (and environment) contributed, as raw strings.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub net: Option<NetMode>,
    pub allow: Vec<String>,
    pub publish: Vec<String>,
    pub no_gate: bool,
    pub shell: bool,
    pub image: Option<String>,
    pub env: Vec<String>,
    pub command: Vec<OsString>,
    /// `AISB_EXTRA_ARGS`, if set.
    pub extra_args_env: Option<String>,
    /// `--ssh-agent`: pass the user's ssh-agent in.
    pub ssh_agent: bool,
    /// Deny entries besides the config's (`ai-sandbox deny ITEM`).
    pub deny: Vec<String>,
    /// `ai-sandbox learn`: the gate records unlisted hostnames instead of refusing them.
    pub learn: bool,
    /// `--review`: the project through a copy-on-write overlay (`workspace = review`).
    pub review: bool,
    /// `--containers`: the sandbox's own container engine (`containers = on`).
    pub containers: bool,
    /// The user's HOME (from the environment): an extra argument that mounts it, or a directory
    /// above it, read-write is refused.
    pub home: Option<PathBuf>,
    /// How the host resolves a path's links (none: as written), so that a mount source is
    /// checked as the kernel will read it (`/home/u` where `/home` leads to `/var/home`).
    pub resolve: Option<fn(&std::path::Path) -> PathBuf>,
}

/// How the sandbox sees the project (`workspace =`, `--review`): `Direct` writes it; `Review`
/// writes a per-session upper layer the user reads with `diff` and promotes with `apply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Workspace {
    #[default]
    Direct,
    Review,
}

/// The validated, normalised policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub(crate) project: PathBuf,
    pub(crate) net: NetMode,
    /// True when hostnames are enforced by the gate (net allow without `--no-gate`).
    pub(crate) gate: bool,
    /// What may be reached; `deny =` exceptions carved out of it win, at both layers.
    pub(crate) allow: allow::Allowlist,
    pub(crate) publish: Vec<Publish>,
    pub(crate) gate_addr: Ipv4Addr,
    pub gate_port: u16,
    pub(crate) image: Image,
    pub(crate) command: Command,
    /// User environment, in order, NO_PROXY entries removed (merged into `no_proxy`).
    pub(crate) env: Vec<(String, String)>,
    /// The one NO_PROXY value (only meaningful with the gate).
    pub(crate) no_proxy: Vec<String>,
    pub(crate) extra_args: Vec<String>,
    /// `resolve = NAME=IP` pins for the gate.
    pub(crate) resolve: Vec<(String, IpAddr)>,
    /// Ports the gate relays for hostname entries without a port.
    pub(crate) gate_ports: Vec<u16>,
    /// Variables whose values are read at launch (from the environment or a file) and passed
    /// through the private env file: names and sources only, never values.
    pub(crate) secrets: Vec<env::Secret>,
    /// `upstream_ca = FILE`: more roots (PEM) the gate trusts for the servers it opens TLS to
    /// (the hosts of bound secrets), for a private CA. Absolute or `~/`, outside the project.
    pub(crate) upstream_ca: Option<String>,
    /// Agent state directories shared by this user's sandboxes (`state = claude`).
    pub(crate) agent_state: Vec<agent_state::AgentState>,
    /// `protect = PATH` lines: more project paths that are read-only inside and verified after.
    pub(crate) protect: Vec<String>,
    /// Things to tell the user before the sandbox starts (printed once; `# note:` in a dry run).
    pub(crate) notices: Vec<String>,
    /// `ask = SECONDS`: the gate holds an allowlist refusal this long while a watcher is attached.
    pub(crate) ask: Option<u32>,
    /// `rule =` lines: what may be asked of a host below its name (see `rule`).
    pub(crate) rules: Vec<rule::Rule>,
    /// `budget =` lines: what a session may send to a host through the gate (see `budget`).
    pub(crate) budgets: Vec<budget::Budget>,
    /// `budget = ADDRESS SIZE` lines: what it may send to an IP entry, counted by its rules.
    pub(crate) net_budgets: Vec<budget::NetBudget>,
    /// `--ssh-agent`: the user's ssh-agent socket is mounted in (a command-line choice only,
    /// never a config key: a cloned repository must not be able to ask for the user's keys).
    pub(crate) ssh_agent: bool,
    /// The destinations pasta splices (see `forwards`), computed once from the entries above:
    /// the ruleset, pasta's options, the allowlist and the launcher's relays all read these.
    pub(crate) splices: Vec<forwards::Splice>,
    /// `pids`, `memory`, `tmp_size`: what the sandbox may take of the machine.
    pub(crate) limits: limits::Limits,
    /// A learning run (`ai-sandbox learn`, never a config key): see `contract::SessionPolicy`.
    pub(crate) learn: bool,
    /// The project written directly, or through a review overlay (see `Workspace`).
    pub(crate) workspace: Workspace,
    /// `containers = on`: the sandbox runs its own rootless podman (see `plan::engine`).
    pub(crate) containers: bool,
    /// `git_identity`: who commits made inside are authored by.
    pub(crate) git_identity: GitIdentity,
}

/// Who git commits made inside are authored by (`git_identity`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum GitIdentity {
    /// The host's `user.name` and `user.email` (and nothing else of its git config).
    #[default]
    Host,
    Off,
    /// `Name <email>`, as the line gives them.
    Given {
        name: String,
        email: String,
    },
}

fn git_identity(config: &Config, c: &mut Collector) -> GitIdentity {
    match config.one(Name::GitIdentity) {
        None | Some(("host", _)) => GitIdentity::Host,
        Some(("off", _)) => GitIdentity::Off,
        Some((v, at)) => {
            let parsed =
                v.strip_suffix('>').and_then(|r| r.split_once('<')).map(|(n, e)| (n.trim(), e.trim()));
            match parsed {
                Some((name, email))
                    if !name.is_empty() && email.contains('@') && !email.contains(['<', '>']) =>
                {
                    GitIdentity::Given { name: name.into(), email: email.into() }
                }
                _ => {
                    c.bad(
                        at,
                        format!("`git_identity = {v}` is not `host`, `off` or `Name <email>`"),
                        "e.g. `git_identity = Agent <agent@example.com>`",
                    );
                    GitIdentity::Host
                }
            }
        }
    }
}

impl Policy {
    /// Whether the user's `env` lines or `-e` flags set `name` (then ai-sandbox does not).
    pub(crate) fn user_sets(&self, name: &str) -> bool {
        self.env.iter().any(|(k, _)| k == name)
    }

    /// Whether the gate opens TLS for some host (a bound secret's, or one with rules): then the
    /// sandbox trusts the gate's CA.
    pub(crate) fn terminates(&self) -> bool {
        self.gate
            && (self.secrets.iter().any(|s| !s.hosts.is_empty())
                || !self.rules.is_empty()
                || self.agent_state.iter().any(|s| agents::held(&s.name).is_some()))
    }
}

struct Collector(Vec<Diagnostic>);

impl Collector {
    fn bad(&mut self, at: Origin, msg: impl Into<String>, hint: impl Into<String>) {
        self.0.push(Diagnostic::new(at, msg).hint(hint));
    }
}

/// Builds the policy from the parsed config and the command line.
pub fn build(project: PathBuf, config: &Config, inputs: &Inputs) -> Result<Policy, Vec<Diagnostic>> {
    let mut c = Collector(Vec::new());

    let net = match inputs.net {
        Some(n) => n,
        None => match config.one(Name::Net) {
            None => NetMode::Allow,
            Some((v, at)) => match v {
                "allow" => NetMode::Allow,
                "none" => NetMode::None,
                "full" => NetMode::Full,
                _ => {
                    c.bad(at, format!("unknown net mode `{v}`"), "use `allow`, `none` or `full`");
                    NetMode::Allow
                }
            },
        },
    };
    if inputs.no_gate && net != NetMode::Allow {
        c.bad(
            Origin::Flag("--no-gate"),
            format!("--no-gate has no meaning with --net {}", net.name()),
            "drop --no-gate, or use it with --net allow",
        );
    }
    let gate = net == NetMode::Allow && !inputs.no_gate;
    if inputs.learn && !gate {
        let what = if inputs.no_gate { "--no-gate".to_string() } else { format!("--net {}", net.name()) };
        c.bad(
            Origin::Flag("learn"),
            format!("a learning run records the hostnames the gate is asked for, and {what} has no gate"),
            "run `ai-sandbox learn -- CMD` with --net allow (the default) and without --no-gate",
        );
    }

    let gate_addr = match config.one(Name::GateAddr) {
        None => DEFAULT_GATE_ADDR,
        Some((v, at)) => match v.parse::<Ipv4Addr>() {
            Ok(a) if !(a.is_loopback() || a.is_unspecified() || a.is_multicast() || a.is_broadcast()) => a,
            Ok(a) => {
                c.bad(
                    at,
                    format!("gate_addr {a} cannot carry the host mapping"),
                    "use an unused address such as 100.64.0.1",
                );
                DEFAULT_GATE_ADDR
            }
            Err(_) => {
                c.bad(at, format!("gate_addr `{v}` is not an IPv4 address"), "e.g. `gate_addr = 100.64.0.1`");
                DEFAULT_GATE_ADDR
            }
        },
    };
    // allow, then deny: config lines first, then flags, through the one entry reader.
    let hostnames = net != NetMode::Allow || gate;
    let flag_allow = inputs.allow.iter().map(|v| (v.as_str(), Origin::Flag("--allow")));
    let (hosts, nets) =
        entries(List::Allow, config.all(Name::Allow).chain(flag_allow), hostnames, gate_addr, &mut c);
    let flag_deny = inputs.deny.iter().map(|v| (v.as_str(), Origin::Flag("ai-sandbox deny")));
    let (deny_hosts, deny_nets) =
        entries(List::Deny, config.all(Name::Deny).chain(flag_deny), hostnames, gate_addr, &mut c);
    let ask = match config.one(Name::Ask) {
        None => None,
        Some((v, at)) => match v.parse::<u32>() {
            Ok(n) if (1..=600).contains(&n) => Some(n),
            _ => {
                c.bad(at, format!("ask = {v}: not a number of seconds from 1 to 600"), "e.g. `ask = 30`");
                None
            }
        },
    };
    if net != NetMode::Allow && !inputs.allow.is_empty() {
        c.bad(
            Origin::Flag("--allow"),
            format!("--allow has no effect with --net {}", net.name()),
            "drop --allow, or use --net allow",
        );
    }

    let gate_port = match config.one(Name::GatePort) {
        None => DEFAULT_GATE_PORT,
        Some((v, at)) => match v.parse::<u16>() {
            Ok(p) if p >= 1024 => p,
            _ => {
                c.bad(
                    at,
                    format!("gate_port `{v}` is not a port from 1024 to 65535"),
                    "e.g. `gate_port = 18081`",
                );
                DEFAULT_GATE_PORT
            }
        },
    };

    let resolve = resolves(config, &mut c);
    let gate_ports = match config.one(Name::GatePorts) {
        None => GATE_DEFAULT_PORTS.to_vec(),
        Some((v, at)) => {
            // Single ports only: a range here would make the gate relay every port in it.
            let ports: Option<Vec<u16>> = v
                .split(',')
                .map(|p| allow::parse_ports(p.trim()).ok().filter(|r| r.lo == r.hi).map(|r| r.lo))
                .collect();
            match ports {
                Some(p) => p,
                None => {
                    c.bad(
                        at,
                        format!("gate_ports `{v}` is not a comma-separated list of ports"),
                        "e.g. `gate_ports = 80,443,8443`",
                    );
                    GATE_DEFAULT_PORTS.to_vec()
                }
            }
        }
    };
    let publish = publishes(config, inputs, net, &mut c);
    let image = image::image(config, inputs, &mut c);
    let command = command(config, inputs, &mut c);
    let env::UserEnv { vars: env, no_proxy: user_no_proxy, secrets } =
        env::user_env(config, inputs, net, &mut c.0);
    let extra_args = env::extra_args(config, inputs, net, &mut c.0);
    let protect = protects(config, &mut c);
    let agent_state = agent_state::states(config, &mut c);
    let upstream_ca = upstream_ca(config, &project, &mut c);
    let rules = rule_lines(config, (net, gate), &hosts, &mut c);
    let (budgets, net_budgets) = budget_lines(config, (net, gate), &hosts, &nets, &mut c);
    let limits = limits_of(config, &mut c);
    let workspace = workspace(config, inputs, &mut c);
    let containers = containers(config, inputs, &image, &mut c);
    let git_identity = git_identity(config, &mut c);

    if !c.0.is_empty() {
        return Err(c.0);
    }
    let budgeted: Vec<IpNet> = net_budgets.iter().map(|b| b.net).collect();
    let no_proxy = env::compose_no_proxy(&user_no_proxy, gate_addr, &nets, &budgeted);
    let learning = inputs.learn.then(|| learning_notice(&gate_ports));
    let mut p = Policy {
        project,
        net,
        gate,
        allow: allow::Allowlist { hosts, nets, deny_hosts, deny_nets },
        ask,
        rules,
        budgets,
        net_budgets,
        publish,
        gate_addr,
        gate_port,
        image,
        command,
        env,
        no_proxy,
        extra_args,
        resolve,
        gate_ports,
        limits,
        notices: inputs
            .ssh_agent
            .then(|| {
                "--ssh-agent: the sandbox can sign with every key your ssh-agent holds, as you, while it runs \
                 (`ssh-add -c KEY` makes each use ask you first)"
                    .to_string()
            })
            .into_iter()
            .chain(learning)
            .chain(skipped_rules(config, net))
            .collect(),
        ssh_agent: inputs.ssh_agent,
        protect,
        secrets,
        upstream_ca,
        agent_state,
        splices: Vec::new(),
        learn: inputs.learn,
        workspace,
        containers,
        git_identity,
    };
    p.notices.extend(uncounted_nets(&p.budgets, &p.net_budgets, &p.allow.nets));
    p.splices = forwards::splices(&p);
    bindings(&p, &mut c);
    if !c.0.is_empty() {
        return Err(c.0);
    }
    Ok(p)
}

/// `workspace = direct|review`, or `--review` (which wins: it only narrows).
/// `containers = on|off`, `--containers`. The inner engine is the host's podman, seen through the
/// host's /usr: a named image brings no engine of its own that this one has configured.
fn containers(config: &Config, inputs: &Inputs, image: &Image, c: &mut Collector) -> bool {
    let (on, at) = match config.one(Name::Containers) {
        _ if inputs.containers => (true, Origin::Flag("--containers")),
        None => return false,
        Some(("off", _)) => return false,
        Some(("on", at)) => (true, at),
        Some((v, at)) => {
            c.bad(at, format!("unknown containers value `{v}`"), "use `on` or `off`");
            return false;
        }
    };
    if let Image::Named(n) = image {
        c.bad(
            at,
            format!("containers = on needs `image = host` (the inner engine is the host's podman), and the image is {n}"),
            "drop `image =` (or use `image = host`), or turn containers off",
        );
        return false;
    }
    on
}

fn workspace(config: &Config, inputs: &Inputs, c: &mut Collector) -> Workspace {
    if inputs.review {
        return Workspace::Review;
    }
    match config.one(Name::Workspace) {
        None => Workspace::Direct,
        Some(("direct", _)) => Workspace::Direct,
        Some(("review", _)) => Workspace::Review,
        Some((v, at)) => {
            c.bad(
                at,
                format!("unknown workspace `{v}`"),
                "use `direct` (the sandbox writes the project) or `review` (it writes a copy-on-write layer you review)",
            );
            Workspace::Direct
        }
    }
}

/// What a learning run says before it starts: it is the one run in which the allowlist does
/// not hold for hostnames.
fn learning_notice(gate_ports: &[u16]) -> String {
    let ports: Vec<String> = gate_ports.iter().map(u16::to_string).collect();
    format!(
        "LEARNING RUN: any hostname on ports {} is relayed and recorded, not refused (as a tunnel: \
         the gate opens no TLS; IP addresses, other ports and `deny` lines are refused as always); run \
         only a command you trust. At the end you are shown the lines to add; nothing is written \
         unless you accept it",
        ports.join(", ")
    )
}

/// `upstream_ca = FILE`: absolute or `~/`, and not in the project (the sandbox writes there).
fn upstream_ca(config: &Config, project: &std::path::Path, c: &mut Collector) -> Option<String> {
    let (v, at) = config.one(Name::UpstreamCa)?;
    let v = v.trim();
    if !(v.starts_with('/') || v.starts_with("~/")) {
        c.bad(
            at,
            format!("upstream_ca `{v}` is not an absolute path (or `~/...`)"),
            "e.g. `upstream_ca = ~/.config/my-ca.pem`",
        );
        return None;
    }
    if std::path::Path::new(v).starts_with(project) {
        c.bad(
            at,
            format!("upstream_ca `{v}` is inside the project, where the sandbox can replace it"),
            "keep the CA file outside the project (e.g. under ~/.config)",
        );
        return None;
    }
    Some(v.to_string())
}

/// A bound secret's hosts must be reachable through the gate on 443 (allowed, not denied), and
/// the gate must be in use: else the placeholder would reach nobody who can replace it.
fn bindings(p: &Policy, c: &mut Collector) {
    let on_443 = |list: &[(HostPattern, Option<Ports>)], h: &str, no_port: bool| {
        list.iter().any(|(pat, ports)| {
            pat.matches(h) && ports.as_ref().map_or(no_port, |r| r.contains(&Ports::one(443)))
        })
    };
    use secret::{AwsPart, SecretSource};
    // `secret = aws`'s three variables are one line: said once, by its key id.
    let said =
        |from: &SecretSource| !matches!(from, SecretSource::Aws { part, .. } if *part != AwsPart::KeyId);
    for s in p.secrets.iter().filter(|s| !s.hosts.is_empty() && said(&s.from)) {
        let aws = matches!(s.from, SecretSource::Aws { .. });
        let name = if aws { "secret = aws (your AWS credentials)" } else { s.name.as_str() };
        if !p.gate && p.net != NetMode::None {
            let why = match p.net {
                NetMode::Full => "--net full has no gate",
                _ => "--no-gate leaves no gate",
            };
            let hint = match aws {
                true => "run with the gate (--net allow), which signs the requests; or write `secret = AWS_ACCESS_KEY_ID` and \
                         `secret = AWS_SECRET_ACCESS_KEY` to hand the agent the keys themselves"
                    .to_string(),
                false => format!("run with the gate (--net allow), or write `secret = {}` to hand the agent the value itself", s.name),
            };
            c.bad(
                s.at.clone(),
                format!(
                    "{name} is bound to {}, but {why} to put its value into requests",
                    s.hosts.join(", ")
                ),
                hint,
            );
            continue;
        }
        for h in &s.hosts {
            let allowed = on_443(&p.allow.hosts, h, p.gate_ports.contains(&443))
                && !on_443(&p.allow.deny_hosts, h, true);
            if !allowed && p.net == NetMode::Allow {
                c.bad(
                    s.at.clone(),
                    format!("{name} is bound to {h}, which the allow lines do not let through on 443"),
                    format!("add `allow = {h}` (a secret goes only to a host the sandbox may reach)"),
                );
            }
        }
    }
}

/// `--net full` with rule lines: they do not apply, and the launch says so (as `--net none`
/// says of allow lines) instead of refusing the config the quick start writes.
fn skipped_rules(config: &Config, net: NetMode) -> Option<String> {
    let n = config.all(Name::Rule).count();
    (net == NetMode::Full && n > 0).then(|| match n {
        1 => "--net full: the config's rule line does not apply (no gate reads requests)".to_string(),
        n => format!("--net full: the config's {n} rule lines do not apply (no gate reads requests)"),
    })
}

/// `rule =` lines, read. A rule's host must be one the gate lets through (else the rule is
/// never reached), and the gate must be in use (else nothing reads the requests).
fn rule_lines(
    config: &Config,
    (net, gate): (NetMode, bool),
    hosts: &[(HostPattern, Option<Ports>)],
    c: &mut Collector,
) -> Vec<rule::Rule> {
    let mut out = Vec::new();
    for (v, at) in config.all(Name::Rule) {
        let rs = match rule::parse(v) {
            Ok(rs) => rs,
            Err((msg, hint)) => {
                c.bad(at, msg, hint);
                continue;
            }
        };
        let r = &rs[0];
        // `--net full` is no policy at all (said at launch, with the rule lines it skips); with
        // `--no-gate` the user asked for the policy without the gate, which cannot hold them.
        if net == NetMode::Full {
            continue;
        }
        if !gate && net != NetMode::None {
            c.bad(
                at,
                format!("`rule = {}` needs the gate to read requests, but --no-gate leaves no gate", r.line),
                "run with the gate (--net allow), or remove the rule lines",
            );
            continue;
        }
        if net == NetMode::Allow && !r.reached(hosts) {
            c.bad(
                at,
                format!("`rule = {}`: {} is not allowed, so the rule is never reached", r.line, r.host),
                format!("add `allow = {}` (a rule narrows what an allowed host may be asked)", r.host),
            );
            continue;
        }
        out.extend(rs);
    }
    out
}

/// `budget =` lines, read. A host's line is counted by the gate: without one (`--no-gate`)
/// nothing counts, so the line is refused; it must name a host the gate lets through. An
/// address's line is counted by the sandbox's rules, with or without the gate; it must share an
/// address with an IP entry, and with no other address line (a packet is counted once). Under
/// `--net full` (no policy) and `--net none` (no egress) there is nothing to count.
fn budget_lines(
    config: &Config,
    (net, gate): (NetMode, bool),
    hosts: &[(HostPattern, Option<Ports>)],
    nets: &[(IpNet, Ports)],
    c: &mut Collector,
) -> (Vec<budget::Budget>, Vec<budget::NetBudget>) {
    let (mut out, mut out_nets) = (Vec::new(), Vec::<budget::NetBudget>::new());
    let mut seen = Vec::new();
    let mut seen_nets: Vec<IpNet> = Vec::new();
    for (v, at) in config.all(Name::Budget) {
        let b = match budget::parse(v) {
            Ok(budget::Line::Host(b)) => b,
            Ok(budget::Line::Net(b)) => {
                if let Some(other) = seen_nets.iter().find(|n| n.overlaps(&b.net)) {
                    c.bad(
                        at,
                        format!("`budget = {v}`: {} shares addresses with the budget line for {other}", b.net),
                        "keep one budget line per address (a network's line counts all its addresses together)",
                    );
                    continue;
                }
                seen_nets.push(b.net);
                if net != NetMode::Allow {
                    continue;
                }
                if budget::net_reached(&b, nets) {
                    out_nets.push(b);
                } else {
                    c.bad(
                        at,
                        format!(
                            "`budget = {v}`: no IP entry reaches {}, so the budget is never reached",
                            b.net
                        ),
                        format!(
                            "add `allow = {}:PORT` (a budget caps what an allowed address is sent)",
                            b.net
                        ),
                    );
                }
                continue;
            }
            Err((msg, hint)) => {
                c.bad(at, msg, hint);
                continue;
            }
        };
        if seen.contains(&b.host) {
            let host = b.host.as_ref().map_or("*".to_string(), |h| h.to_string());
            c.bad(at, format!("`budget = {v}`: a second budget for {host}"), "keep one budget line per host");
            continue;
        }
        seen.push(b.host.clone());
        if net != NetMode::Allow {
            continue;
        }
        if !gate {
            c.bad(
                at,
                format!("`budget = {v}` needs the gate to count, but --no-gate leaves no gate"),
                "run with the gate (--net allow), or remove the budget lines",
            );
        } else if !budget::reached(&b, hosts) {
            let host = b.host.as_ref().map(|h| h.to_string()).unwrap_or_default();
            c.bad(
                at,
                format!("`budget = {v}`: {host} is not allowed, so the budget is never reached"),
                format!("add `allow = {host}` (a budget caps what an allowed host is sent)"),
            );
        } else {
            out.push(b);
        }
    }
    (out, out_nets)
}

/// `budget = *` with IP entries that no address line counts: said, since `*` is counted by the
/// gate, per hostname, and connections to an IP entry never pass the gate.
fn uncounted_nets(
    budgets: &[budget::Budget],
    net_budgets: &[budget::NetBudget],
    nets: &[(IpNet, Ports)],
) -> Option<String> {
    let all = budgets.iter().find(|b| b.host.is_none())?;
    let mut left: Vec<String> = Vec::new();
    for (n, _) in nets.iter().filter(|(n, _)| !net_budgets.iter().any(|b| b.net.contains_net(n))) {
        if !left.contains(&n.to_string()) {
            left.push(n.to_string());
        }
    }
    let first = left.first()?;
    // An address's line counts one session, whatever the period of `*`.
    let per = if all.period.is_some() { ", for each session" } else { "" };
    Some(format!(
        "`budget = {all}` counts hostnames (the gate counts them); the IP entries {} are not counted: give each a line of its own (`budget = {first} {}`{per})",
        left.join(", "),
        limits::show_size(all.bytes)
    ))
}

/// `protect = PATH`: a path inside the project, relative, without `..`.
fn protects(config: &Config, c: &mut Collector) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (v, at) in config.all(Name::Protect) {
        let p = v.trim_end_matches('/');
        let bad = p.is_empty()
            || p.starts_with('/')
            || p.split('/').any(|part| part == ".." || part.is_empty() || part == ".")
            || p.chars().any(|ch| ch.is_control() || ch == ':' || ch == ',');
        if bad {
            c.bad(
                at,
                format!("`{v}` is not a path inside the project"),
                "write a path relative to the project directory, e.g. `protect = scripts/deploy.sh` (no `..`, `:` or `,`)",
            );
        } else if !out.iter().any(|o| o == p) {
            out.push(p.to_string());
        }
    }
    out
}

fn resolves(config: &Config, c: &mut Collector) -> Vec<(String, IpAddr)> {
    let mut out: Vec<(String, IpAddr)> = Vec::new();
    for (v, at) in config.all(Name::Resolve) {
        let hint = "write `resolve = NAME=IP`, e.g. `resolve = api.internal.example=192.0.2.10`";
        let Some((name, ip)) = v.split_once('=') else {
            c.bad(at, format!("resolve `{v}` has no `=`"), hint);
            continue;
        };
        let name = match allow::parse(name.trim()) {
            Ok(Allow::Host(HostPattern::Exact(n), None)) => n,
            _ => {
                c.bad(at, format!("resolve: `{}` is not a hostname", name.trim()), hint);
                continue;
            }
        };
        let Ok(ip) = ip.trim().parse::<IpAddr>() else {
            c.bad(at, format!("resolve: `{}` is not an IP address", ip.trim()), hint);
            continue;
        };
        if out.iter().any(|(n, _)| *n == name) {
            c.bad(at, format!("resolve: {name} is pinned twice"), "keep one line per name");
            continue;
        }
        out.push((name, allow::canonical(ip)));
    }
    out
}

fn publishes(config: &Config, inputs: &Inputs, net: NetMode, c: &mut Collector) -> Vec<Publish> {
    let mut out: Vec<Publish> = Vec::new();
    let flags = inputs.publish.iter().map(|v| (v.as_str(), Origin::Flag("--publish")));
    for (v, at) in config.all(Name::Publish).chain(flags) {
        let parsed = match v.split_once(':') {
            None => allow::parse_ports(v).map(|p| (p, p)),
            Some((h, ct)) => allow::parse_ports(h).and_then(|h| allow::parse_ports(ct).map(|ct| (h, ct))),
        };
        match parsed {
            Ok((h, ct)) if h.lo == h.hi && ct.lo == ct.hi => {
                let p = Publish { host: h.lo, container: ct.lo };
                if let Some(prev) = out.iter().find(|o| o.host == p.host) {
                    c.bad(
                        at,
                        format!("host port {} is already published (to {})", p.host, prev.container),
                        "publish each host port once",
                    );
                } else {
                    out.push(p);
                }
            }
            Ok(_) => {
                c.bad(at, format!("publish `{v}`: ranges are not supported"), "write one `publish` per port")
            }
            Err(b) => c.bad(
                at,
                format!("bad publish `{v}`: {}", b.reason),
                "write `PORT` or `HOSTPORT:CONTAINERPORT`, e.g. `8000` or `8080:3000` (ports 1-65535)",
            ),
        }
    }
    if net == NetMode::None && !out.is_empty() {
        c.bad(
            Origin::Flag("--publish"),
            "nothing can be published with --net none (no interface)",
            "use --net allow (the default) to publish with the egress policy",
        );
    }
    out
}

fn command(config: &Config, inputs: &Inputs, c: &mut Collector) -> Command {
    if inputs.command.first().is_some_and(|a| a.is_empty()) {
        c.bad(
            Origin::Flag("--"),
            "the command after `--` is an empty string",
            "name a program, e.g. `-- npm test`",
        );
    }
    if !inputs.command.is_empty() {
        if inputs.shell {
            c.bad(
                Origin::Flag("--shell"),
                "--shell and a command after `--` both say what to run",
                "drop one of them",
            );
        }
        return Command::Argv(inputs.command.clone());
    }
    if inputs.shell {
        return Command::Shell;
    }
    match config.one(Name::Cmd) {
        None => Command::Shell,
        Some((v, at)) => match shlex::split(v) {
            Some(argv) if argv.first().is_some_and(|a| !a.is_empty()) => {
                Command::Argv(argv.into_iter().map(OsString::from).collect())
            }
            Some(_) => {
                c.bad(
                    at,
                    "`cmd` names no program",
                    "write the command, e.g. `cmd = claude`, or delete the line for a shell",
                );
                Command::Shell
            }
            _ => {
                c.bad(
                    at,
                    format!("cmd `{v}` has unbalanced quotes"),
                    "quote as in a POSIX shell, e.g. `cmd = claude --model 'x y'`",
                );
                Command::Shell
            }
        },
    }
}

/// Which list an entry goes to. Both are read by `entries`, with the same checks, except that
/// only an allow entry can open the host's loopback (a deny entry there only narrows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Allow,
    Deny,
}

impl List {
    fn key(self) -> &'static str {
        match self {
            List::Allow => "allow",
            List::Deny => "deny",
        }
    }
}

type Hosts = Vec<(HostPattern, Option<Ports>)>;
type Nets = Vec<(IpNet, Ports)>;

/// The allow (or deny) entries of `values`, each once, in order; every bad one said by line.
fn entries<'a>(
    list: List,
    values: impl Iterator<Item = (&'a str, Origin)>,
    hostnames: bool,
    gate_addr: Ipv4Addr,
    c: &mut Collector,
) -> (Hosts, Nets) {
    let (mut hosts, mut nets): (Hosts, Nets) = (Vec::new(), Vec::new());
    let key = list.key();
    for (value, at) in values {
        match allow::parse(value) {
            Ok(Allow::Host(..)) if !hostnames => c.bad(
                at,
                format!("`{value}` is a hostname, which only the gate can enforce, and --no-gate is set"),
                "use IP/CIDR entries with --no-gate, or drop --no-gate",
            ),
            Ok(Allow::Host(p, ports)) => {
                if !hosts.contains(&(p.clone(), ports)) {
                    hosts.push((p, ports));
                }
            }
            Ok(Allow::Net(n, None)) if list == List::Allow && n.contains(IpAddr::V4(gate_addr)) => c.bad(
                at,
                format!(
                    "`{value}` has no port, so it would open every port of the host's loopback ({gate_addr} is the host's 127.0.0.1): sshd, databases, the Docker API"
                ),
                format!(
                    "name the port, e.g. `allow = {gate_addr}:5432`; if you really mean every port, write `allow = {value}:1-65535`"
                ),
            ),
            Ok(Allow::Net(n, ports)) => {
                let entry = (n, ports.unwrap_or(Ports::ALL));
                if !nets.contains(&entry) {
                    nets.push(entry);
                }
            }
            Err(b) => {
                // A flag has no lines: say how to give several entries on the command line.
                let hint = match at {
                    Origin::Flag(_) if value.contains(',') => {
                        let items: Vec<&str> = value.split(',').map(str::trim).filter(|i| !i.is_empty()).collect();
                        match list {
                            List::Allow => format!(
                                "give each entry on its own: {} (or `ai-sandbox allow {}` on a running sandbox)",
                                items.iter().map(|i| format!("--allow {i}")).collect::<Vec<_>>().join(" "),
                                items.join(" ")
                            ),
                            List::Deny => format!("give each entry on its own: `ai-sandbox deny {}`", items.join(" ")),
                        }
                    }
                    _ => b.hint.replace("allow =", &format!("{key} =")),
                };
                c.bad(at, format!("bad {key} entry: {}", b.reason), hint)
            }
        }
    }
    (hosts, nets)
}

/// The one answer to "does the gate relay a connection to `ip`:`port`?", used by the gate's
/// decisions, by the NO_PROXY composer and (through them) by the docs' examples.
///
/// Never for gate_addr: that address *is* the host's loopback, reached only directly through
/// its own nftables rule (the gate would otherwise become a way to any host-loopback port).
/// Never for loopback (inside the sandbox it is the sandbox). Otherwise exactly when an IP
/// allow entry covers that address and port.
pub(crate) fn gate_relays(nets: &[(IpNet, Ports)], gate_addr: Ipv4Addr, ip: IpAddr, port: u16) -> bool {
    let ip = allow::canonical(ip);
    ip != IpAddr::V4(gate_addr) && !ip.is_loopback() && allow::reaches(nets, ip, port)
}

/// Whether some IP allow entry reaches `addr` on a port the gate does not relay: then clients
/// must bypass the proxy for `addr`, so it goes into NO_PROXY.
pub(crate) fn reached_directly(nets: &[(IpNet, Ports)], gate_addr: Ipv4Addr, addr: IpAddr) -> bool {
    nets.iter().any(|(n, r)| n.contains(addr) && !gate_relays(nets, gate_addr, addr, r.lo))
}

/// A policy from config text with default inputs, for the unit tests of later stages.
#[cfg(test)]
pub(crate) fn from_text(cfg: &str) -> Policy {
    let (c, errs) = crate::policy::keys::read(cfg);
    assert!(errs.is_empty(), "{errs:?}");
    build("/p".into(), &c, &Inputs::default()).unwrap()
}

/// The limits from the config's `pids`, `memory` and `tmp_size` lines (each bad value said).
fn limits_of(config: &Config, c: &mut Collector) -> limits::Limits {
    let mut l = limits::Limits::default();
    if let Some((v, at)) = config.one(Name::Pids) {
        match limits::parse_pids(v) {
            Some(n) => l.pids = n,
            None => c.bad(
                at,
                format!("pids `{v}` is not a number of processes of at least 16"),
                "e.g. `pids = 8192`",
            ),
        }
    }
    if let Some((v, at)) = config.one(Name::Memory) {
        match limits::parse_size(v) {
            Some(b) if b >= 64 << 20 => l.memory = Some(b),
            _ => c.bad(at, format!("memory `{v}` is not a size of at least 64m"), "e.g. `memory = 8g`"),
        }
    }
    if let Some((v, at)) = config.one(Name::TmpSize) {
        match limits::parse_size(v) {
            Some(b) if b >= 1 << 20 => l.tmp = b,
            _ => c.bad(at, format!("tmp_size `{v}` is not a size of at least 1m"), "e.g. `tmp_size = 4g`"),
        }
    }
    l
}

#[cfg(test)]
mod tests;
