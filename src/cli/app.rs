//! Orchestration: CLI → project → config → policy → facts → plan → print or launch.
//! Talks to the machine only through `Host`.

use super::facts::state_dir;
pub use super::facts::{Intent, gather_facts};
use crate::cli::{PolicyArgs, RunArgs};
use crate::config::project;
use crate::error::{Diagnostic, Origin, Rejected, hinted};
use crate::host::Host;
use crate::plan::{self, Facts, Plan};
use crate::policy::approval;
use crate::policy::{self, Inputs, Policy};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// The project and its config file, as found from the working directory (or `--project`).
pub(super) struct Located {
    pub(super) project: PathBuf,
    pub(super) cfg_path: PathBuf,
    /// The config path as shown to the user (relative to the working directory when inside it).
    pub(super) display: String,
}

/// A built policy with the config text it came from.
pub(super) struct Loaded {
    pub(super) policy: Policy,
    pub(super) text: Option<String>,
    pub(super) display: String,
}

pub(super) fn locate(host: &dyn Host, flag: Option<&Path>) -> anyhow::Result<Located> {
    let cwd = host.cwd()?;
    let project = match flag {
        Some(p) if p.is_absolute() => host.canonical(p),
        Some(p) => host.canonical(&cwd.join(p)),
        None => project::find(&cwd, |p| host.exists(p)),
    };
    if flag.is_some() && !host.exists(&project) {
        return Err(hinted(
            format!("--project {}: no such directory", project.display()),
            "pass the project's directory (or run from inside it, without --project)",
        )
        .into());
    }
    let home = PathBuf::from(host.env("HOME").unwrap_or_default());
    if flag.is_none() && project == home && host.exists(&home.join(project::CONFIG_DIR)) {
        let found = home.join(project::CONFIG_DIR);
        return Err(hinted(
            format!(
                "{} exists, so your home directory is the project of every directory under it that has no \
                 .ai-sandbox/ of its own; it is refused as a project (your keys and dotfiles would be mounted read-write)",
                found.display()
            ),
            format!("move that config into a project directory (or remove {}), or pass --project DIR", found.display()),
        )
        .into());
    }
    project::check(&project, &home)?;
    project::check_reserved(&project, &super::facts::reserved(host))?;
    if project.to_str().is_none() {
        return Err(hinted(
            format!("the project directory's path is not UTF-8 ({})", project.display()),
            "rename it (or a directory above it) to a UTF-8 name: podman's options and ai-sandbox's session records carry paths as text",
        )
        .into());
    }
    let cfg_path = project::config_path(&project);
    let display = match cfg_path.strip_prefix(&cwd) {
        Ok(rel) => rel.display().to_string(),
        Err(_) => cfg_path.display().to_string(),
    };
    Ok(Located { project, cfg_path, display })
}

/// Resolves the project and builds the policy, reporting every problem at once.
pub(super) fn load_policy(host: &dyn Host, args: &RunArgs) -> anyhow::Result<Loaded> {
    let Located { project, cfg_path, display } = locate(host, args.policy.project.as_deref())?;
    let file = host.read_file(&cfg_path)?;
    let text = file.clone().unwrap_or_default();
    let reject = |diagnostics: Vec<Diagnostic>| Rejected {
        config_path: display.clone(),
        diagnostics,
        outcome: NOT_STARTED,
    };
    let (cfg, mut problems) = crate::policy::keys::read(&text);
    let inputs = Inputs {
        net: args.policy.net,
        allow: args.policy.allow.clone(),
        publish: args.policy.publish.clone(),
        no_gate: args.policy.no_gate,
        shell: args.shell,
        image: args.image.clone(),
        env: args.env.clone(),
        command: args.command.clone(),
        extra_args_env: host.env("AISB_EXTRA_ARGS").filter(|v| !v.trim().is_empty()),
        ssh_agent: args.ssh_agent,
        deny: Vec::new(),
        learn: args.learn,
        review: args.review,
        containers: args.containers,
        home: host.env("HOME").filter(|h| !h.is_empty()).map(PathBuf::from),
        resolve: Some(host.resolver()),
    };
    match policy::build(project, &cfg, &inputs) {
        Ok(mut p) if problems.is_empty() => {
            // Said when it matters: the allowlist applies and nothing at all was allowed.
            if cfg.entries.is_empty()
                && p.net == policy::NetMode::Allow
                && args.policy.allow.is_empty()
                && !args.learn
            {
                p.notices.push(match file {
                    None => format!(
                        "there is no {display}: nothing is allowed beyond --allow flags (`ai-sandbox init` writes a config)"
                    ),
                    Some(_) => format!(
                        "nothing is set in {display}: nothing is allowed beyond --allow flags \
                         (`ai-sandbox allow HOST` adds a line to it)"
                    ),
                });
            }
            Ok(Loaded { policy: p, text: file, display })
        }
        Ok(_) => Err(reject(problems).into()),
        Err(more) => {
            problems.extend(more);
            in_line_order(&mut problems);
            Err(reject(problems).into())
        }
    }
}

/// Config-line problems first, in line order; then flags and environment.
pub(super) fn in_line_order(problems: &mut [Diagnostic]) {
    problems.sort_by_key(|d| match d.origin {
        Origin::Config(l) => (0, l),
        _ => (1, 0),
    });
}

/// Where the approved copy of a project's config lives, what it holds, and how `current`
/// stands against it.
pub(super) struct Approval {
    pub(super) path: PathBuf,
    pub(super) stored: Option<String>,
    pub(super) status: approval::Status,
}

pub(super) fn approval(host: &dyn Host, project: &Path, current: Option<&str>) -> anyhow::Result<Approval> {
    let path = crate::plan::session::approved_config(&state_dir(host, project));
    let stored = host.read_file(&path)?;
    let status = approval::status(current, stored.as_deref());
    Ok(Approval { path, stored, status })
}

/// What would make a launch fail after it started, refused before anything starts (no gate
/// registration, no relay, no record): an image that is not here (never pulled), a published
/// host port in use, a command that cannot run (126/127, as podman would say, returned as the
/// exit code with its words on stderr).
/// The first port an unprivileged process may bind.
const UNPRIVILEGED_PORT_START: &str = "/proc/sys/net/ipv4/ip_unprivileged_port_start";

/// What a launch needs free in the runtime directory (session files, the gate's log, the root
/// skeleton): below it, nothing is started, rather than failing half-way with ENOSPC.
const RUNTIME_FREE_MIN: u64 = 4 << 20;

fn preflight(host: &mut dyn Host, policy: &Policy, facts: &Facts) -> anyhow::Result<Option<i32>> {
    let runtime = super::facts::runtime_dir(host);
    if let Some(free) = host.free_space(&runtime).filter(|f| *f < RUNTIME_FREE_MIN) {
        return Err(hinted(
            format!(
                "the runtime directory {} has {} bytes free (a launch needs {} MiB there: session files, the gate's log); nothing was started",
                runtime.display(),
                free,
                RUNTIME_FREE_MIN >> 20
            ),
            format!(
                "see what fills it: du -sh {0}/* (and `df -h {0}`); `ai-sandbox prune` removes what gone projects left",
                runtime.display()
            ),
        )
        .into());
    }
    if let crate::policy::Image::Named(image) = &policy.image
        && !host.image_present(&facts.podman, image)?
    {
        return Err(hinted(
            format!(
                "the image {image} is not on this machine, and ai-sandbox never pulls one (a pull would reach a \
                 registry outside any policy); nothing was started"
            ),
            format!("fetch it outside the sandbox first: podman pull {image} (or build it: podman build -t {image} ...)"),
        )
        .into());
    }
    // A rootless process binds only ports from the kernel's unprivileged start (1024 unless
    // lowered): pasta would fail after the container exists, with its own words.
    let unprivileged = host
        .read_file(Path::new(UNPRIVILEGED_PORT_START))?
        .and_then(|t| t.trim().parse::<u16>().ok())
        .unwrap_or(1024);
    if let Some(publ) = policy.publish.iter().find(|x| x.host < unprivileged) {
        return Err(hinted(
            format!(
                "host port {} is below {unprivileged}, the first port a user may bind on this host \
                 ({UNPRIVILEGED_PORT_START}); ai-sandbox runs as you, so nothing was started",
                publ.host
            ),
            format!(
                "publish a host port from {unprivileged} up: --publish {}:{}",
                8000 + publ.host % 1000,
                publ.container
            ),
        )
        .into());
    }
    if let Some((publ, who)) = policy.publish.iter().find_map(|x| host.port_taken(x.host).map(|w| (x, w))) {
        return Err(hinted(
            format!("host port {} is in use ({who}); nothing was started", publ.host),
            format!(
                "stop what holds it, or publish another host port: --publish {}:{}",
                publ.host.saturating_add(1),
                publ.container
            ),
        )
        .into());
    }
    if let Some((code, why)) = cannot_run(host, policy, facts) {
        host.eprint(&format!("ai-sandbox: {why}; nothing was started\n"));
        return Ok(Some(code));
    }
    Ok(None)
}

/// The command as the sandbox would find it (the host's own tools, `image = host`): 127 when it
/// is found nowhere, 126 when it is not executable. Not judged when the user sets PATH, or for
/// an image (its files are not the host's).
fn cannot_run(host: &dyn Host, p: &Policy, f: &Facts) -> Option<(i32, String)> {
    let crate::policy::Command::Argv(argv) = &p.command else { return None };
    if p.image != crate::policy::Image::Host || p.user_sets("PATH") {
        return None;
    }
    if let Some(why) = &f.launchable.unreachable {
        return Some((127, why.clone()));
    }
    // A name that is not UTF-8 is left to podman to find (or not).
    let name = f.launchable.program.as_deref().or(argv[0].to_str())?;
    if !name.contains('/') {
        // Yours (an agent in your home is mounted, see `agent`), or the sandbox's own PATH, which
        // has /usr/sbin where a user's often does not.
        let in_sandbox_path = crate::plan::podman::SANDBOX_PATH
            .split(':')
            .any(|d| host.executable(&Path::new(d).join(name)) == Some(true));
        return (host.find_program(name).is_none() && !in_sandbox_path)
            .then(|| (127, format!("`{name}` is not on this host's PATH (the sandbox looks for it in /usr, /opt and the project only): command not found")));
    }
    let path = f.workdir.join(name);
    match host.executable(&path) {
        None => Some((127, format!("{name}: no such file (relative to {})", f.workdir.display()))),
        // A directory: no `chmod` makes it a command.
        Some(false) if host.is_dir(&path) => Some((126, format!("{name}: is a directory, not a command"))),
        Some(false) => Some((126, format!("{name}: not an executable file (`chmod +x {name}`)"))),
        Some(true) => None,
    }
}

/// Applies the config only in a version the user approved (see `trust`). On a terminal, shows
/// the config or the diff and asks; otherwise refuses with what changed and how to approve.
pub(super) fn require_approval(host: &mut dyn Host, l: &Loaded) -> anyhow::Result<()> {
    let a = approval(host, &l.policy.project, l.text.as_deref())?;
    let text = l.text.clone().unwrap_or_default();
    match a.status {
        approval::Status::NoConfig => return Ok(()),
        approval::Status::Approved => {
            // Same entries; keep the stored copy's comments current for the next diff.
            if a.stored.as_deref() != Some(text.as_str()) {
                host.write_file(&a.path, &text)?;
            }
            return Ok(());
        }
        _ => {}
    }
    let explained = approval::explain(&a.status, &text, &l.display);
    if host.can_ask() {
        host.eprint(&explained);
        if host.confirm("Approve this config for this project and start? [y/N] ")? {
            host.write_file(&a.path, &text)?;
            return Ok(());
        }
        bail!("not approved; nothing was started");
    }
    Err(hinted(
        format!("{}nothing was started: this config is not approved", explained),
        "read it, then approve it with `ai-sandbox trust` (`ai-sandbox trust --show` shows this again)",
    )
    .into())
}

/// Notes the project's path in its state dir, for `prune` (the key's hash cannot be reversed).
pub(super) fn record_project(host: &mut dyn Host, project: &Path) -> anyhow::Result<()> {
    let path = state_dir(host, project).join(crate::cli::prune::PROJECT_RECORD);
    let text = format!("{}\n", project.display());
    if host.read_file(&path)?.as_deref() != Some(text.as_str()) {
        host.write_file(&path, &text)?;
    }
    Ok(())
}

/// The default command: plan, then print (`--dry-run`) or launch.
pub fn run(host: &mut dyn Host, args: &RunArgs) -> anyhow::Result<i32> {
    Ok(launch(host, args)?.code)
}

/// What a run did, for a command that goes on after it (`learn`).
pub(super) struct Ran {
    /// The command's exit code (0 for a dry run).
    pub(super) code: i32,
    pub(super) session: String,
    /// ai-sandbox's runtime dir: the gate's log is there.
    pub(super) runtime: PathBuf,
}

/// Plans, then prints (`--dry-run`) or launches.
pub(super) fn launch(host: &mut dyn Host, args: &RunArgs) -> anyhow::Result<Ran> {
    crate::sys::timing::mark("start");
    if !args.dry_run && host.uid() != 0 {
        // An earlier session whose check never finished (its launcher stopped mid-way): the
        // project is verified before anything of it is read, its config included, or planned
        // from (a path the check moves aside must not be planned as a mount).
        let loc = locate(host, args.policy.project.as_deref())?;
        host.settle_leftovers(&state_dir(host, &loc.project))
            .context("verifying what an earlier session of this project left; nothing was started")?;
    }
    let mut loaded = load_policy(host, args)?;
    if args.dry_run {
        if approval(host, &loaded.policy.project, loaded.text.as_deref())?.status.needs_approval() {
            loaded.policy.notices.push(format!(
                "{} is not approved: a launch shows it and asks first (`ai-sandbox trust` approves it)",
                loaded.display
            ));
        }
    } else {
        require_approval(host, &loaded)?;
    }
    let policy = loaded.policy;
    crate::sys::timing::mark("config and trust");
    if !args.dry_run && host.uid() == 0 {
        return Err(hinted(
            "this tool runs rootless and refuses to start as root (podman cannot use pasta as root)",
            format!(
                "run it as a regular user; from a root shell: {}",
                super::doctor::as_user_hint("ai-sandbox ...")
            ),
        )
        .into());
    }
    if !args.dry_run {
        record_project(host, &policy.project)?;
    }
    let intent = if args.dry_run { Intent::DryRun } else { Intent::Launch };
    let mut facts = gather_facts(host, &policy, intent)?;
    crate::sys::timing::mark("facts (the project's repositories found)");
    if !args.dry_run
        && let Some(code) = preflight(host, &policy, &facts)?
    {
        return Ok(ran(code, &facts));
    }
    if !args.dry_run {
        // Before the first effect that starts a thread (the gate's lease watcher, the relays):
        // the signals this launcher forwards to podman must stay blocked in every thread, or a
        // Ctrl-C could land in one that ignores it.
        host.block_forwarded_signals()?;
    }
    if policy.gate && !args.dry_run {
        // The gate's real port (first free at or above gate_port) goes into the ruleset and
        // the proxy URL; the registration lasts as long as this process.
        (facts.gate_port, facts.gate_ca) = host.register_gate(&policy, &facts)?;
        crate::sys::timing::mark("gate registration");
    }
    let mut policy = policy;
    if policy.gate && args.dry_run {
        // The port a launch would use: the running gate's, else the first free one from gate_port.
        match host.gate_port(&facts.runtime_dir) {
            Some(port) => facts.gate_port = port,
            None => policy.notices.push(format!(
                "no gate is running: a launch starts one on the first free port at or above {} (shown here as {})",
                policy.gate_port, policy.gate_port
            )),
        }
    }
    let relays = crate::policy::forwards::relays(&policy.splices);
    if policy.net == crate::policy::NetMode::Allow && !relays.is_empty() && !args.dry_run {
        // Bound now, held for the life of this process: their ports go into pasta's forwards.
        facts.relays = relays.iter().copied().zip(host.start_relays(&relays)?).collect();
    }
    if policy.net == crate::policy::NetMode::Allow
        && !args.dry_run
        && facts.probe == crate::plan::session::Probe::AtLaunch
    {
        let gate_addr = std::net::IpAddr::V4(policy.gate_addr);
        let allowed = |port| crate::policy::allow::reaches(&policy.allow.nets, gate_addr, port);
        facts.probe = match host.bind_canary(&allowed)? {
            Some(port) => crate::plan::session::Probe::Canary(port),
            None => crate::plan::session::Probe::EveryPortAllowed,
        };
    }
    let plan: Plan = plan::build(&policy, &facts);
    if args.dry_run {
        host.print(&plan::render(&plan));
        return Ok(ran(0, &facts));
    }
    for n in &plan.notices {
        host.eprint(&format!("ai-sandbox: {n}\n"));
    }
    if let Some(nft) = host.env("AISB_NFT") {
        host.eprint(&format!(
            "ai-sandbox: AISB_NFT={nft}: the hook loads the ruleset with this program, not the system nft\n"
        ));
    }
    for c in crate::host::loopback::applicable(&policy) {
        let reply = host.probe_loopback(c.port, c.ask);
        if let Some(w) = crate::host::loopback::warning(c, policy.gate_addr, &reply) {
            host.eprint(&format!("ai-sandbox: {w}\n"));
        }
    }
    crate::sys::timing::mark("relays, self-check listener, plan");
    let code = host.launch(&plan)?;
    Ok(ran(code, &facts))
}

fn ran(code: i32, f: &Facts) -> Ran {
    Ran { code, session: f.session_id.clone(), runtime: f.runtime_dir.clone() }
}

/// `ai-sandbox rules [--json|--nft]`
pub fn rules(host: &mut dyn Host, args: &PolicyArgs, json: bool) -> anyhow::Result<i32> {
    let loaded = load_policy(host, &RunArgs { policy: args.clone(), ..RunArgs::default() })?;
    if approval(host, &loaded.policy.project, loaded.text.as_deref())?.status.needs_approval() {
        host.eprint(&format!(
            "ai-sandbox: note: {} is not approved (`ai-sandbox trust --show`)\n",
            loaded.display
        ));
    }
    let policy = loaded.policy;
    match crate::plan::ruleset::build(&policy, policy.gate_port) {
        Some(rs) if json => host.print(&(rs.to_json_string() + "\n")),
        Some(rs) => host.print(&rs.to_text()),
        None => bail!("--net {} applies no nftables ruleset", policy.net.name()),
    }
    Ok(0)
}

pub(super) const NOT_STARTED: &str = "nothing was started";
pub(super) const NOT_APPROVED: &str = "nothing was approved";
