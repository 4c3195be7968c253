//! The Plan: everything a launch will do, computed without side effects.
//!
//! `--dry-run` prints it and the snapshot tests compare it; `launch` executes it. Observed
//! host state (paths, the chosen gate port, the session token, whether stdin is a terminal)
//! comes in as `Facts`, so building a Plan never reads the live system.

pub(crate) mod agent;
pub(crate) mod engine;

pub(crate) mod gate_ca;
pub(crate) mod podman;
pub mod protect;
pub(crate) mod root;
pub mod ruleset;
pub(crate) mod session;

use crate::plan::ruleset::Ruleset;
pub(crate) use crate::plan::session::Facts;
use crate::plan::session::Probe;
use crate::policy::{Image, NetMode, Policy};
use std::ffi::OsStr;
use std::path::PathBuf;

/// The OCI hook: its JSON file (in the hooks dir) and the ruleset file it loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookSpec {
    pub(crate) hooks_dir: PathBuf,
    pub(crate) hook_file: PathBuf,
    pub hook_json: String,
    pub(crate) ruleset_file: PathBuf,
    /// The self-check's hook (see `check_hook`).
    pub check: Option<CheckHook>,
}

/// The self-check's hook JSON, and its program's link on the host (see `Facts::check_exe`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckHook {
    pub(crate) file: PathBuf,
    pub json: String,
    pub(crate) exe: PathBuf,
    pub(crate) target: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub argv: Vec<String>,
    pub ruleset: Option<Ruleset>,
    pub hook: Option<HookSpec>,
    /// Lines said to the user before the command starts.
    pub(crate) notices: Vec<String>,
    /// What the hook proves before the command starts, in words (`--dry-run` shows it).
    pub(crate) self_check: Option<String>,
    /// The effective allowlist, one line per entry, as `--dry-run` shows it.
    pub(crate) allowlist: Vec<String>,
    /// The proxy variables' env file (path, text): holds the token, so never on argv.
    pub env_file: Option<(PathBuf, String)>,
    /// What the sandbox trusts when the gate terminates TLS (path, text), see `trust`.
    pub(crate) trust_files: Vec<(PathBuf, String)>,
    /// The inner engine's files (path, text, mode), with `containers = on` (see `engine`).
    pub(crate) engine_files: Vec<engine::File>,
    /// The sandbox's ssh client config (path, text), see `podman::ssh_config`.
    pub(crate) ssh_config: Option<(PathBuf, String)>,
    /// The session's root directory to make before launch (`image = host`), see `root`.
    pub(crate) rootfs: Option<root::Skeleton>,
    pub(crate) sandbox_home: PathBuf,
    /// The logins carried into the sandbox HOME before the session and back after it.
    pub(crate) logins: Option<Logins>,
    pub(crate) session_dir: PathBuf,
    /// The container's name, which the keeper removes if the launcher is killed.
    pub(crate) container: String,
    /// This binary: started again as the session's keeper.
    pub(crate) self_exe: PathBuf,
    /// Where the keeper writes what it did.
    pub(crate) keeper_log: PathBuf,
    /// The file guard: what to record before the session and verify after it.
    pub(crate) guard: GuardSpec,
    /// Where the launcher watches for this session's refusals (it says each new refused
    /// destination as it happens and sums them up at the end); `None` without rules.
    pub(crate) refusals: Option<RefusalWatch>,
    /// `memory = SIZE` as the config wrote it, when the kernel enforces it (cgroup v2): what the
    /// launcher names when the command ends killed (exit 137).
    pub(crate) memory_limit: Option<String>,
    /// The live record (path, JSON): what `ai-sandbox allow` changes and `ps` shows.
    pub(crate) live: (PathBuf, String),
    /// The self-check's never-allowed destination (`ADDR:PORT`), written to the session dir so
    /// that its refusal is not reported as the agent's.
    pub(crate) canary: Option<String>,
    /// Review mode: the session's upper layer and record, made before podman starts.
    pub(crate) review: Option<ReviewSpec>,
}

/// A review-mode session's directory (see `contract::review`): made, with its record, before
/// podman starts; left for `diff`/`apply`/`discard` after it, or removed when nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReviewSpec {
    pub(crate) dir: PathBuf,
    pub(crate) session: String,
    pub(crate) project: PathBuf,
    /// With the gate: its runtime dir, to tell its watchers that the change waits for review.
    pub(crate) gate_runtime: Option<PathBuf>,
}

/// What the launcher watches for refusals: the gate's decision log (when the gate is used) and
/// the sandbox's own records of direct connections the rules refused (read from outside).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefusalWatch {
    pub(crate) session: String,
    /// With the gate: its runtime dir, whose decision log is followed and where the direct
    /// refusals read from the sandbox are handed to it (logged beside its own decisions, shown
    /// to watchers).
    pub(crate) gate_runtime: Option<PathBuf>,
    pub(crate) session_dir: PathBuf,
    /// For the fixes: the config to add a line to.
    pub(crate) config_path: String,
    /// `containers = on`: a refused registry is answered with `image share` too.
    pub(crate) containers: bool,
}

/// The guard's part of a launch (see `guard`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GuardSpec {
    pub(crate) project: PathBuf,
    /// Protected paths, relative to the project.
    pub(crate) paths: Vec<String>,
    /// This project's state dir (approved config, records, quarantine).
    pub(crate) state_dir: PathBuf,
    /// This session's record.
    pub(crate) store: PathBuf,
    /// What was found before the launch: the read-only mounts and the repositories.
    pub(crate) protected: crate::plan::protect::Protected,
    /// Review mode: the sandbox cannot write the project, so only the places outside it that
    /// it writes (its HOME) are checked; a host edit in the project during the session is the
    /// user's and stays.
    pub(crate) review: bool,
}

/// The logins a session carries (see `policy::agent_state`, `launch::logins`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logins {
    /// The sandbox HOME on the host.
    pub(crate) home: PathBuf,
    /// What was carried in, by file (digests, never the values): a file whose login differs
    /// from it after the session was refreshed inside and goes back to the store.
    pub(crate) record: PathBuf,
    pub(crate) files: Vec<LoginCopy>,
}

/// One login file: where the store keeps it, where the sandbox HOME has it, which fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginCopy {
    /// The `state` value it comes from (`claude`, `~/.config/gh/hosts.yml`).
    pub(crate) state: String,
    pub(crate) store: PathBuf,
    /// Where versions before ADR 0056 kept it (read when the store has no login yet).
    pub(crate) legacy: Option<PathBuf>,
    /// Relative to the sandbox HOME.
    pub(crate) home_rel: PathBuf,
    pub(crate) fields: Option<&'static [&'static str]>,
    /// The tokens of it the gate holds: their places, and the placeholder each gets in the
    /// sandbox's copy (ADR 0087).
    pub(crate) held: Vec<(Vec<String>, String)>,
}

/// A `state` line's value as the user wrote it: an agent (`claude`) or a file (`~/PATH`).
fn state_named(s: &crate::policy::agent_state::AgentState) -> String {
    match s.name.as_str() {
        "home" => format!("~/{}", s.home_file(&s.files[0].name).display()),
        agent => agent.to_string(),
    }
}

fn logins(p: &Policy, f: &Facts) -> Option<Logins> {
    let files: Vec<LoginCopy> = p
        .agent_state
        .iter()
        .flat_map(|s| {
            let state = state_named(s);
            s.files.iter().map(move |l| {
                let store = s.store_file(&f.agents_dir, &l.name);
                let held = f
                    .held
                    .iter()
                    .filter(|h| h.store == store)
                    .map(|h| (h.field.clone(), h.placeholder.clone()))
                    .collect();
                LoginCopy {
                    state: state.clone(),
                    legacy: s.legacy_file(&f.agents_dir, &l.name),
                    home_rel: s.home_file(&l.name),
                    fields: l.fields,
                    store,
                    held,
                }
            })
        })
        .collect();
    (!files.is_empty()).then(|| Logins {
        home: f.sandbox_home.clone(),
        record: f.state_dir.join("logins-given"),
        files,
    })
}

/// The record a launch starts with (`live.json`: what `allow` widens and `ps` lists).
fn live_record(p: &Policy, f: &Facts) -> crate::contract::Record {
    crate::contract::Record {
        session: f.session_id.clone(),
        container: f.container_name(),
        project: p.project.clone(),
        net: p.net,
        gate: p.gate,
        tls: f.gate_ca.is_some(),
        policy: crate::contract::SessionPolicy::of(p, Some(&f.state_dir)),
        host_image: p.image == crate::policy::Image::Host,
        logins: login_holders(p, f),
    }
}

/// Each `state` line's login and who holds it: the gate, when the launch gave the sandbox
/// placeholders of its tokens (ADR 0087); else the agent, in clear.
fn login_holders(p: &Policy, f: &Facts) -> Vec<String> {
    p.agent_state
        .iter()
        .map(|s| {
            let held = s.files.iter().any(|l| {
                let store = s.store_file(&f.agents_dir, &l.name);
                f.held.iter().any(|h| h.store == store)
            });
            let who = if held { "held by the gate" } else { "in the agent's hands, in clear" };
            format!("{}: {who}", state_named(s))
        })
        .chain(
            aws_signs(p)
                .filter(|_| p.gate)
                .map(|hosts| format!("aws: held by the gate, which signs for {hosts}")),
        )
        .collect()
}

/// The hosts `secret = aws` is bound to (`None`: no such line).
fn aws_signs(p: &Policy) -> Option<String> {
    use crate::policy::env::SecretSource;
    let s = p.secrets.iter().find(|s| matches!(s.from, SecretSource::Aws { .. }))?;
    Some(s.hosts.join(", "))
}

pub fn build(p: &Policy, f: &Facts) -> Plan {
    let ruleset = ruleset::build(p, f.gate_port);
    let hook = ruleset.as_ref().map(|_| hook_spec(p, f));
    let rules = hook.is_some();
    let record = live_record(p, f);
    let live = (f.live_file(), serde_json::to_string(&record).expect("json"));
    let argv = podman::argv(p, f);
    let review = p.workspace == crate::policy::Workspace::Review;
    Plan {
        review: review.then(|| ReviewSpec {
            dir: f.review_dir(),
            session: f.session_id.clone(),
            project: p.project.clone(),
            gate_runtime: p.gate.then(|| f.runtime_dir.clone()),
        }),
        rootfs: (p.image == Image::Host).then(|| root::skeleton(f.root_dir(), &argv)),
        argv,
        ruleset,
        hook,
        notices: notices(p, f),
        self_check: rules.then(|| self_check_words(p, f)),
        allowlist: allowlist(p),
        env_file: podman::env_file(p, f).map(|t| (f.env_file(), t)),
        ssh_config: podman::ssh_config(p, f).map(|t| (f.ssh_config_file(), t)),
        trust_files: gate_ca::files(f),
        engine_files: engine::files(p, f),
        sandbox_home: f.sandbox_home.clone(),
        logins: logins(p, f),
        session_dir: f.session_dir.clone(),
        container: f.container_name(),
        self_exe: f.self_exe.clone(),
        keeper_log: f.keeper_log(),
        guard: GuardSpec {
            project: p.project.clone(),
            paths: match review {
                true => Vec::new(),
                false => crate::plan::protect::candidates(&p.protect),
            },
            state_dir: f.state_dir.clone(),
            store: crate::plan::session::guard_store(&f.state_dir, &f.session_id),
            protected: crate::plan::protect::Protected {
                writable: vec![f.sandbox_home.clone()],
                ..f.protected.clone()
            },
            review,
        },
        memory_limit: p.limits.memory.filter(|_| f.cgroup_v2).map(crate::policy::limits::show_size),
        refusals: rules.then(|| RefusalWatch {
            session: f.session_id.clone(),
            gate_runtime: p.gate.then(|| f.runtime_dir.clone()),
            session_dir: f.session_dir.clone(),
            config_path: record.policy.config_path.clone(),
            containers: p.containers,
        }),
        live,
        canary: match f.probe {
            Probe::Canary(port) if rules => Some(format!("{}:{port}", p.gate_addr)),
            _ => None,
        },
    }
}

fn hook_spec(p: &Policy, f: &Facts) -> HookSpec {
    let hooks_dir = f.hooks_dir();
    let ruleset_file = f.ruleset_file();
    let exe = f.self_exe.display().to_string();
    let mut args = vec![
        "ai-sandbox".to_string(),
        "hook".into(),
        "--nft".into(),
        f.nft.display().to_string(),
        "--ruleset".into(),
        ruleset_file.display().to_string(),
    ];
    // Without a canary, nothing else proves the rules before the command: the table is listed.
    if canary_port(f.probe).is_none() {
        args.push("--confirm".into());
    }
    // createRuntime: after the namespaces exist, before the container's first process.
    // `always`: every container started with this hooks dir gets the rules (fail closed).
    let json = serde_json::json!({
        "version": "1.0.0",
        "hook": { "path": exe, "args": args },
        "when": { "always": true },
        "stages": ["createRuntime"],
    });
    HookSpec {
        hook_file: f.hook_file(),
        hooks_dir,
        hook_json: serde_json::to_string_pretty(&json).expect("json"),
        ruleset_file,
        check: check_hook(p, f),
    }
}

/// The self-check's hook (see `hook::self_check`): startContainer, so it runs inside the sandbox
/// once pasta has set up its network (after createRuntime) and before the command exists. It is
/// this program, mounted read-only, run through the host's loader and libraries mounted beside
/// it (`Facts::check_exe`), so it runs the same inside any image. None when skipped
/// (`AISB_SKIP_SELF_CHECK=1`).
fn check_hook(p: &Policy, f: &Facts) -> Option<CheckHook> {
    if f.probe == Probe::Skipped {
        return None;
    }
    let exe = f.check_exe().display().to_string();
    let mut args = vec![exe.clone()];
    if f.loader.is_some() {
        args.extend(["--library-path".into(), podman::HOST_LIB_DIR.into(), podman::CONNECT_EXE.into()]);
    }
    args.push("self-check".into());
    if let Some(port) = canary_port(f.probe) {
        args.extend(["--canary".into(), format!("{}:{port}", p.gate_addr)]);
    }
    if p.gate {
        args.extend(["--gate-port".into(), f.gate_port.to_string()]);
    }
    let json = serde_json::json!({
        "version": "1.0.0",
        "hook": { "path": exe, "args": args },
        "when": { "always": true },
        "stages": ["startContainer"],
    });
    Some(CheckHook {
        file: f.check_file(),
        json: serde_json::to_string_pretty(&json).expect("json"),
        exe: f.check_exe(),
        target: f.check_exe_target(),
    })
}

/// The canary's port as the plan shows it (`<canary>` in a dry run: the launch picks it).
fn canary_port(probe: Probe) -> Option<String> {
    match probe {
        Probe::AtLaunch => Some("<canary>".to_string()),
        Probe::Canary(port) => Some(port.to_string()),
        Probe::EveryPortAllowed | Probe::Skipped => None,
    }
}

fn self_check_words(p: &Policy, f: &Facts) -> String {
    let gate = match p.gate {
        true => format!(", then that the gate answers at 127.0.0.1:{} inside", f.gate_port),
        false => String::new(),
    };
    match (f.probe, canary_port(f.probe)) {
        (Probe::Skipped, _) => {
            "SKIPPED (AISB_SKIP_SELF_CHECK=1): nothing proves the rules hold before the command runs".into()
        }
        (_, None) => format!(
            "the createRuntime hook confirms the ruleset's table is loaded{gate}; every port of the host's loopback is allowed, so no refusal can be probed there"
        ),
        (_, Some(port)) => format!(
            "before the command exists, a hook inside the sandbox connects to {}:{port} (no rule allows it; a listener of the launcher's waits on the host's 127.0.0.1:{port}) and requires the rules' refusal{gate}; otherwise the command never runs",
            p.gate_addr
        ),
    }
}

fn notices(p: &Policy, f: &Facts) -> Vec<String> {
    let mut n = p.notices.clone();
    if p.net == NetMode::Allow {
        match f.probe {
            Probe::Skipped => n.push(
                "AISB_SKIP_SELF_CHECK=1: the sandbox starts without proving its rules hold (meant for benchmarks)".into(),
            ),
            Probe::EveryPortAllowed => n.push(
                "every port of the host's loopback is allowed, so the self-check has no port left to prove refused (it checks the gate only)".into(),
            ),
            Probe::AtLaunch | Probe::Canary(_) => {}
        }
    }
    n.extend(f.launchable.notice.iter().cloned());
    if let Some((name, email)) = &f.git_identity {
        let from = match p.git_identity {
            crate::policy::GitIdentity::Given { .. } => "the config's git_identity line",
            _ => {
                "your git config's user.name and user.email, nothing else of it; `git_identity = off` to not"
            }
        };
        n.push(format!("git commits inside are authored by {name} <{email}> ({from})"));
    }
    if p.containers {
        n.push(
            "containers = on: a Docker-compatible engine at DOCKER_HOST (`docker` and `podman` commands work); compose files run with \
             `podman-compose` (or `podman compose`), Docker's `docker compose` plugin is not provided; an image comes from an allowed \
             registry or from your machine with `ai-sandbox image share IMAGE`"
                .into(),
        );
    }
    if p.workspace == crate::policy::Workspace::Review {
        n.push(format!(
            "review mode: the project is not written; what the sandbox changes goes to {} (`ai-sandbox diff {}` afterwards)",
            f.review_dir().join(crate::contract::review::UPPER_DIR).display(),
            f.session_id
        ));
    }
    let (_, ignored) = podman::split_cgroup_v2_only(&p.extra_args, f.cgroup_v2);
    if !ignored.is_empty() {
        n.push(format!(
            "extra_args `{}`: left out, not enforced on this host (rootless podman limits resources on cgroup v2 only; this host runs cgroup v1, and podman would only warn)",
            ignored.join(" ")
        ));
    }
    if let (Some(m), false) = (p.limits.memory, f.cgroup_v2) {
        n.push(format!(
            "memory = {}: not enforced on this host (rootless podman can limit memory on cgroup v2 only; this host runs cgroup v1). \
             The process limit and the size of /tmp still hold; to enforce memory, boot with systemd.unified_cgroup_hierarchy=1",
            crate::policy::limits::show_size(m)
        ));
    }
    for s in &f.missing_secrets {
        // `-e NAME` passes a variable of yours through; `secret = NAME` names a secret.
        let flag = p.secrets.iter().any(|x| x.name == *s && matches!(x.at, crate::error::Origin::Flag(_)));
        n.push(match flag {
            true => format!("-e {s}: {s} is not set in your environment; the sandbox starts without it"),
            false => format!("secret {s} has no value in your environment; the sandbox starts without it"),
        });
    }
    n.extend(gate_ca::notices(p, f));
    let (held, clear): (Vec<_>, Vec<_>) =
        p.agent_state.iter().partition(|s| p.gate && crate::policy::agents::held(&s.name).is_some());
    for s in held {
        let Some(login) = crate::policy::agents::held(&s.name) else { continue };
        let endpoint = login.endpoint;
        let host = endpoint.split('/').next().unwrap_or(endpoint);
        let goes: Vec<String> = login
            .tokens
            .iter()
            .map(|t| {
                let to = match (t.refresh, t.hosts) {
                    (true, _) => format!("only in refreshes at https://{endpoint}"),
                    (false, []) => "nowhere".to_string(),
                    (false, hosts) => format!("to {}", hosts.join(", ")),
                };
                format!("{} {to}", t.field.join("."))
            })
            .collect();
        n.push(format!(
            "state = {}: the gate holds the tokens your login store has ({}); the sandbox holds placeholders, and the \
             gate makes the refreshes (the allowlist must name {host}); with none in the store, the gate takes the \
             tokens of a login made inside the same way",
            state_named(s),
            goes.join("; ")
        ));
    }
    if let (Some(hosts), true) = (aws_signs(p), p.gate) {
        let vars: Vec<&str> = p
            .secrets
            .iter()
            .filter(|s| matches!(s.from, crate::policy::env::SecretSource::Aws { .. }))
            .filter(|s| f.secrets.iter().any(|(n, _)| *n == s.name))
            .map(|s| s.name.as_str())
            .collect();
        n.push(format!(
            "secret = aws: the gate holds your AWS credentials (from {}) and signs the requests to {hosts} that the \
             sandbox signed with its placeholders ({}); they go nowhere else",
            f.aws_from.as_deref().unwrap_or("?"),
            vars.join(", ")
        ));
        // A custom endpoint is possible; a name that is not AWS's is said.
        let aws_names = ["amazonaws.com", "amazonaws.com.cn", "api.aws", "on.aws"];
        let under = |h: &str| aws_names.iter().any(|n| h == *n || h.ends_with(&format!(".{n}")));
        // Under AWS's names too, some hosts run code of others (API Gateway, load balancers,
        // instances, Lambda function URLs).
        let others = ["execute-api", "elb", "compute", "compute-1", "lambda-url"];
        let of_others = |h: &str| h.split('.').any(|l| others.contains(&l));
        for h in hosts.split(", ").filter(|h| !under(h) || of_others(h)) {
            n.push(format!(
                "secret = aws: {h} is not an AWS service endpoint ({} names serve AWS's own APIs; {} ones serve code of \
                 others): the gate sends it your AWS key id, session token and signatures",
                aws_names.join(", "),
                others.join(", ")
            ));
        }
    }
    let clear: Vec<String> = clear.iter().map(|s| format!("state = {}", state_named(s))).collect();
    if !clear.is_empty() {
        // What a bound secret is not: the login's tokens are in the sandbox HOME as they are.
        n.push(format!(
            "{}: the agent holds the login in clear, with any refresh token it carries, and could send it to any host the sandbox reaches",
            clear.join(", ")
        ));
    }
    let entries = p.allow.hosts.len() + p.allow.nets.len();
    match p.net {
        NetMode::Full => n.push(
            "--net full: NO egress policy applies; the sandbox reaches everything this host reaches".into(),
        ),
        NetMode::None if entries > 0 => n.push(if entries == 1 {
            "--net none: no network interface; the config's allow entry does not apply".to_string()
        } else {
            format!("--net none: no network interface; the config's {entries} allow entries do not apply")
        }),
        _ => {}
    }
    n
}

/// What the sandbox may reach, in words: each hostname entry with the ports the gate relays
/// for it, each IP entry with how it is enforced.
fn allowlist(p: &Policy) -> Vec<String> {
    match p.net {
        NetMode::None => return vec!["nothing: no network interface (--net none)".into()],
        NetMode::Full => return vec!["everything this host reaches: no policy (--net full)".into()],
        NetMode::Allow => {}
    }
    let gate_ports = p.gate_ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
    let mut out: Vec<String> = p
        .allow
        .hosts
        .iter()
        .map(|(h, ports)| {
            let ports = ports.map_or_else(|| format!("ports {gate_ports}"), |r| format!("port {r}"));
            format!("{:<32} {ports}, through the gate", h.to_string())
        })
        .collect();
    let splices = &p.splices;
    for (n, r) in &p.allow.nets {
        let spliced = |addr| crate::policy::forwards::covers(splices, addr, *r);
        let via = match n.addr {
            _ if n.contains(std::net::IpAddr::V4(p.gate_addr)) => {
                let path = if spliced(p.gate_addr) { "spliced" } else { "pasta's tap path" };
                format!("direct (nftables): the host's 127.0.0.1, {path}")
            }
            std::net::IpAddr::V4(a) if n.len == 32 && spliced(a) => {
                "direct (nftables), TCP, spliced through a relay of the launcher's".to_string()
            }
            _ => "direct (nftables), TCP".to_string(),
        };
        let ports =
            if *r == crate::policy::allow::Ports::ALL { "every port".into() } else { format!("port {r}") };
        out.push(format!("{:<32} {ports}, {via}", n.to_string()));
    }
    if out.is_empty() {
        out.push("nothing (no allow entries)".into());
    }
    for (h, ports) in &p.allow.deny_hosts {
        let ports = ports.map_or_else(|| "every port".to_string(), |r| format!("port {r}"));
        out.push(format!("{:<32} {ports}, REFUSED (deny), by the gate", h.to_string()));
    }
    for (n, r) in &p.allow.deny_nets {
        let ports =
            if *r == crate::policy::allow::Ports::ALL { "every port".into() } else { format!("port {r}") };
        out.push(format!("{:<32} {ports}, REFUSED (deny), by the rules and the gate", n.to_string()));
    }
    out
}

/// Shell-quotes one argument so the printed command can be pasted into a shell. Bytes that are
/// not UTF-8 are written as bash's `$'\xNN'`, so the pasted command gets the same bytes.
pub fn quote(arg: &OsStr) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Some(arg) = arg.to_str() else {
        let mut out = String::from("$'");
        for &b in arg.as_bytes() {
            match b {
                b'\\' | b'\'' => out += &format!("\\{}", b as char),
                0x20..=0x7e => out.push(b as char),
                _ => out += &format!("\\x{b:02x}"),
            }
        }
        return out + "'";
    };
    shlex::try_quote(arg)
        .map(|c| c.into_owned())
        .unwrap_or_else(|_| format!("'{}'", arg.replace('\'', "'\\''")))
}

/// What `--dry-run` prints.
pub(crate) fn render(plan: &Plan) -> String {
    let mut out = String::new();
    for n in &plan.notices {
        out += &format!("# note: {n}\n");
    }
    out += "# allowlist: what the sandbox may reach\n";
    for a in &plan.allowlist {
        out += &format!("#   {a}\n");
    }
    out += "# podman command (one argument per line, each quoted as a shell reads it back; it names the\n";
    out += "# session's files, the env file, the hooks directory and the root, which a dry run does not\n";
    out += "# write: it shows what runs, it does not run outside a launch)\n";
    let last = plan.argv.len().saturating_sub(1);
    for (i, a) in plan.argv.iter().enumerate() {
        let indent = if i == 0 { "" } else { "  " };
        let cont = if i == last { "" } else { " \\" };
        out += &format!("{indent}{}{cont}\n", quote(OsStr::new(a)));
    }
    if let Some((path, text)) = &plan.env_file {
        out += &format!("\n# {} (mode 0600: it holds the session token and secrets)\n{text}", path.display());
    }
    if let Some((path, text)) = &plan.ssh_config {
        out += &format!("\n# {} (mounted at {} inside)\n{text}", path.display(), podman::SSH_CONFIG);
    }
    for e in &plan.engine_files {
        match &e.said {
            Some(said) => out += &format!("\n# {} ({said})\n", e.path.display()),
            None => out += &format!("\n# {} (in {} inside)\n{}", e.path.display(), engine::CONF_DIR, e.text),
        }
    }
    if let Some(l) = &plan.logins {
        out += "\n# logins carried into the sandbox HOME before the session, and back after it when refreshed inside\n";
        for c in &l.files {
            let fields = c.fields.map_or_else(|| "the whole file".to_string(), |f| f.join(", "));
            out += &format!("#   {} -> ~/{} ({fields})\n", c.store.display(), c.home_rel.display());
        }
    }
    if let Some(r) = &plan.rootfs {
        let dirs: Vec<String> = root::DIRS
            .iter()
            .map(|d| d.to_string())
            .chain(r.parents.iter().map(|p| p.display().to_string()))
            .collect();
        let links: Vec<String> = root::LINKS.iter().map(|(l, t)| format!("{l} -> {t}")).collect();
        out += &format!(
            "\n# {} (the root directory, made for this session; read-only inside)\n#   directories: {}\n#   links: {}\n",
            r.dir.display(),
            dirs.join(" "),
            links.join(", ")
        );
    }
    if let Some(words) = &plan.self_check {
        out += &format!("\n# self-check: {words}\n");
    }
    match (&plan.ruleset, &plan.hook) {
        (Some(rs), Some(h)) => {
            out += &format!(
                "\n# nftables ruleset, loaded into the container's network namespace by the\n# createRuntime hook {} before the first process runs\n",
                h.hook_file.display()
            );
            out += &rs.to_text();
            out += &format!("\n# {}\n{}\n", h.hook_file.display(), h.hook_json);
            if let Some(c) = &h.check {
                out += &format!(
                    "\n# {} ({} links to {})\n{}\n",
                    c.file.display(),
                    c.exe.display(),
                    c.target.display(),
                    c.json
                );
            }
        }
        _ => out += "\n# no nftables ruleset (none is applied in this mode)\n",
    }
    out
}
