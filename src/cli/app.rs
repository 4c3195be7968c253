//! Orchestration: CLI → project → config → policy → facts → plan → print or launch.
//! Talks to the machine only through `Host`.

pub use super::facts::gather_facts;
use super::facts::{agents_dir, runtime_dir, state_dir, xdg};
use crate::cli::{PolicyArgs, RunArgs};
use crate::error::{Diagnostic, Origin, Rejected, hinted};
use crate::host::Host;
use crate::plan::{self, Facts, Plan};
use crate::policy::approval;
use crate::policy::{self, Inputs, Policy};
use crate::{config, config::project};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// The project and its config file, as found from the working directory (or `--project`).
struct Located {
    project: PathBuf,
    cfg_path: PathBuf,
    /// The config path as shown to the user (relative to the working directory when inside it).
    display: String,
}

/// A built policy with the config text it came from.
struct Loaded {
    policy: Policy,
    text: Option<String>,
    display: String,
}

fn locate(host: &dyn Host, flag: Option<&Path>) -> anyhow::Result<Located> {
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
fn load_policy(host: &dyn Host, args: &RunArgs) -> anyhow::Result<Loaded> {
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
    };
    match policy::build(project, &cfg, &inputs) {
        Ok(mut p) if problems.is_empty() => {
            // Said when it matters: the allowlist applies and nothing at all was allowed.
            if cfg.entries.is_empty() && p.net == policy::NetMode::Allow && args.policy.allow.is_empty() {
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
fn in_line_order(problems: &mut [Diagnostic]) {
    problems.sort_by_key(|d| match d.origin {
        Origin::Config(l) => (0, l),
        _ => (1, 0),
    });
}

/// Where the approved copy of a project's config lives, what it holds, and how `current`
/// stands against it.
struct Approval {
    path: PathBuf,
    stored: Option<String>,
    status: approval::Status,
}

fn approval(host: &dyn Host, project: &Path, current: Option<&str>) -> anyhow::Result<Approval> {
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

fn preflight(host: &mut dyn Host, policy: &Policy, facts: &Facts) -> anyhow::Result<Option<i32>> {
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
    if p.image != crate::policy::Image::Host || p.env.iter().any(|(k, _)| k == "PATH") {
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
fn require_approval(host: &mut dyn Host, l: &Loaded) -> anyhow::Result<()> {
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
    if host.stdio_is_tty() {
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

/// `ai-sandbox login import AGENT`: copies an existing login from the real HOME into the store
/// that `state = AGENT` shares with this user's sandboxes, after saying which files.
pub fn login_import(host: &mut dyn Host, agent: &str) -> anyhow::Result<i32> {
    use crate::policy::agents::{KNOWN, fields_of, login_files};
    let Some(files) = login_files(agent) else {
        let names: Vec<&str> = KNOWN.iter().map(|(n, ..)| *n).collect();
        bail!("no login import for `{agent}`; known agents: {}", names.join(", "));
    };
    let home = PathBuf::from(host.env("HOME").context("HOME is not set")?);
    let store = agents_dir(host).join(agent).join("login");
    let present: Vec<_> = files.iter().filter(|(from, _)| host.exists(&home.join(from))).collect();
    if present.is_empty() {
        let names: Vec<String> = files.iter().map(|(f, _)| format!("~/{f}")).collect();
        bail!("no {agent} login found in your home directory (looked for {})", names.join(", "));
    }
    host.print(&format!(
        "copying your {agent} login into the store your sandboxes share ({}); a sandbox with `state = {agent}` gets it:\n",
        store.display()
    ));
    for (from, to) in present {
        let fields = fields_of(agent, to);
        let which = fields.map_or_else(|| "the whole file".to_string(), |f| format!("only {}", f.join(", ")));
        host.print(&format!("  ~/{from} -> {} ({which})\n", store.join(to).display()));
        host.copy_private(&home.join(from), &store, Path::new(to), fields)?;
    }
    Ok(0)
}

/// `ai-sandbox report`: the guard's reports for this project, as they were shown.
pub fn report_cmd(host: &mut dyn Host, project: Option<&Path>) -> anyhow::Result<i32> {
    let loc = locate(host, project)?;
    let log = crate::launch::guard::report_log(&super::facts::state_dir(host, &loc.project));
    match host.read_file(&log)? {
        Some(text) if !text.is_empty() => host.print(&text),
        _ => host.print(&format!(
            "no sandbox has changed a protected file of {} (nothing was restored)\n",
            crate::sys::quote::path(&loc.project)
        )),
    }
    Ok(0)
}

/// `ai-sandbox trust [--show]`: approve the project's config as it is now, or show where it
/// stands. An invalid config is not approved (it would not start anyway).
pub fn trust_cmd(host: &mut dyn Host, project: Option<&Path>, show: bool) -> anyhow::Result<i32> {
    let loc = locate(host, project)?;
    let Some(text) = host.read_file(&loc.cfg_path)? else {
        host.print(&format!("there is no {}: nothing to approve\n", loc.display));
        return Ok(0);
    };
    let Approval { path: approved_path, status, .. } = approval(host, &loc.project, Some(&text))?;
    if show {
        match &status {
            approval::Status::Approved => {
                host.print(&format!("{} is approved for {}\n", loc.display, loc.project.display()))
            }
            s => host.print(
                &(approval::explain(s, &text, &loc.display)
                    + "not approved: `ai-sandbox trust` approves it\n"),
            ),
        }
        return Ok(if status == approval::Status::Approved { 0 } else { 1 });
    }
    // The same checks of the config as a launch (flags and environment aside): a config that
    // could not start is never "approved".
    let (cfg, mut problems) = crate::policy::keys::read(&text);
    if let Err(more) = policy::build(loc.project.clone(), &cfg, &Inputs::default()) {
        problems.extend(more);
    }
    if !problems.is_empty() {
        in_line_order(&mut problems);
        return Err(
            Rejected { config_path: loc.display, diagnostics: problems, outcome: NOT_APPROVED }.into()
        );
    }
    if status != approval::Status::Approved {
        host.print(&approval::explain(&status, &text, &loc.display));
    }
    host.write_file(&approved_path, &text)?;
    record_project(host, &loc.project)?;
    host.print(&format!("approved {} for {}\n", loc.display, loc.project.display()));
    Ok(0)
}

/// Notes the project's path in its state dir, for `prune` (the key's hash cannot be reversed).
fn record_project(host: &mut dyn Host, project: &Path) -> anyhow::Result<()> {
    let path = state_dir(host, project).join(crate::cli::prune::PROJECT_RECORD);
    let text = format!("{}\n", project.display());
    if host.read_file(&path)?.as_deref() != Some(text.as_str()) {
        host.write_file(&path, &text)?;
    }
    Ok(())
}

/// `ai-sandbox prune [--yes]` (see `prune`): never a project with a sandbox running.
pub fn prune_cmd(host: &mut dyn Host, yes: bool) -> anyhow::Result<i32> {
    let roots = crate::cli::prune::Roots {
        states: xdg(host, "XDG_STATE_HOME", ".local/state").join("ai-sandbox/projects"),
        homes: xdg(host, "XDG_DATA_HOME", ".local/share").join("ai-sandbox/homes"),
    };
    let running: Vec<PathBuf> = host
        .running(&runtime_dir(host))
        .into_iter()
        .filter_map(|r| r.record.map(|rec| rec.project))
        .collect();
    crate::cli::prune::run(host, &roots, &running, yes)
}

/// `ai-sandbox ps [--json]`: this user's running sandboxes, with the gate's counters.
pub fn ps_cmd(host: &mut dyn Host, json: bool) -> anyhow::Result<i32> {
    /// One running sandbox, as `ps` prints it (a table row, or an object of `--json`).
    #[derive(serde::Serialize)]
    struct Row {
        session: String,
        pid: i32,
        age_seconds: u64,
        /// `-` for a launch whose record is not written yet (or from an older version).
        mode: &'static str,
        project: Option<String>,
        allowed: Option<u64>,
        refused: Option<u64>,
    }
    let runtime = runtime_dir(host);
    let gate = host.gate_sessions(&runtime);
    let rows: Vec<Row> = host
        .running(&runtime)
        .iter()
        .map(|r| {
            let counts = gate.iter().find(|g| g.session == r.session);
            Row {
                session: r.session.clone(),
                pid: r.pid,
                age_seconds: r.age,
                mode: r.record.as_ref().map_or("-", |rec| rec.net.name()),
                project: r.record.as_ref().map(|rec| rec.project.display().to_string()),
                allowed: counts.map(|c| c.allowed),
                refused: counts.map(|c| c.denied),
            }
        })
        .collect();
    if json {
        host.print(&format!("{}\n", serde_json::to_string(&rows)?));
        return Ok(0);
    }
    if rows.is_empty() {
        host.print("no sandbox is running\n");
        return Ok(0);
    }
    let mut out = format!(
        "{:<14} {:>8} {:>7} {:<6} {:>8} {:>8}  PROJECT\n",
        "SESSION", "PID", "AGE", "MODE", "ALLOWED", "REFUSED"
    );
    let n = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for r in &rows {
        out += &format!(
            "{:<14} {:>8} {:>7} {:<6} {:>8} {:>8}  {}\n",
            r.session,
            r.pid,
            crate::live::age(r.age_seconds),
            r.mode,
            n(r.allowed),
            n(r.refused),
            crate::sys::quote::text(r.project.as_deref().unwrap_or("-")),
        );
    }
    host.print(&out);
    Ok(0)
}

/// `ai-sandbox allow ITEM…` / `ai-sandbox deny ITEM…`: each item validated as the config's
/// line would be, added to the project's running sandboxes (see `live`), then (unless
/// `--session-only`) to the config as `allow =` / `deny =` lines; the config stays approved if
/// it was.
pub fn change_cmd(host: &mut dyn Host, args: &crate::cli::ChangeArgs, deny: bool) -> anyhow::Result<i32> {
    let crate::cli::ChangeArgs { items, session_only, project } = args;
    let session_only = *session_only;
    let loc = locate(host, project.as_deref())?;
    let mut inputs = Inputs { net: Some(policy::NetMode::Allow), ..Inputs::default() };
    let (rule_items, entries): (Vec<&String>, Vec<&String>) =
        items.iter().partition(|i| crate::policy::rule::item(i).is_some());
    let mut rules = Vec::new();
    for item in &rule_items {
        if deny {
            return Err(hinted(
                format!("`{item}` is a rule, and a rule only allows"),
                "a host with rules is refused everything they do not name; remove the rule line to refuse more",
            )
            .into());
        }
        let value = crate::policy::rule::item(item).unwrap_or_default();
        rules.extend(crate::policy::rule::parse(value).map_err(|(msg, hint)| hinted(msg, hint))?);
    }
    let entries: Vec<String> = entries.into_iter().cloned().collect();
    if deny {
        inputs.deny = entries
    } else {
        inputs.allow = entries
    }
    let p =
        policy::build(loc.project.clone(), &config::Config::default(), &inputs).map_err(|diagnostics| {
            Rejected { config_path: loc.display.clone(), diagnostics, outcome: NOT_STARTED }
        })?;
    let change = crate::live::Change { allow: p.allow, rules };
    let (key, done) = if deny { ("deny", "denied") } else { ("allow", "allowed") };
    // No config to add the line to: said before anything changes (no live change, no lock).
    if !session_only && host.read_file(&loc.cfg_path)?.is_none() {
        return Err(hinted(
            format!("{} has no config ({} does not exist); nothing was changed", loc.project.display(), loc.display),
            format!(
                "`ai-sandbox init` writes one, then `ai-sandbox {key} {}` adds to it; or `--session-only` changes the running sandbox only",
                items.join(" ")
            ),
        )
        .into());
    }
    let runtime = runtime_dir(host);
    let running = host.live_sessions(&runtime, &loc.project);
    if running.is_empty() && session_only {
        return Err(hinted(
            format!(
                "no sandbox of {} is running: --session-only has nothing to change",
                loc.project.display()
            ),
            "start one, or drop --session-only to add the line to the config only",
        )
        .into());
    }
    for rec in &running {
        host.live_allow(&runtime, rec, &change).with_context(|| {
            format!("changing the running sandbox ({}): {key} {}", rec.display(), change.summary())
        })?;
        let session = rec.parent().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned());
        host.print(&format!(
            "{done} {} in the running sandbox {}\n",
            change.summary(),
            session.unwrap_or_default()
        ));
    }
    if running.is_empty() {
        host.print(&format!("no sandbox of {} is running\n", loc.project.display()));
    }
    if !session_only {
        let state = state_dir(host, &loc.project);
        let _config_lock = host.lock(&state.join("config.lock"))?;
        let old = host.read_file(&loc.cfg_path)?.unwrap_or_default();
        let Approval { path: approved, status, .. } = approval(host, &loc.project, Some(&old))?;
        let was_approved = status == approval::Status::Approved;
        let mut text = old.clone();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        for item in items {
            let line = match crate::policy::rule::item(item) {
                Some(rule) => format!("rule = {rule}"),
                None => format!("{key} = {item}"),
            };
            if !old.lines().any(|l| l.trim() == line) {
                text += &format!("{line}\n");
            }
        }
        if text != old {
            let rel = loc.cfg_path.strip_prefix(&loc.project).unwrap_or(&loc.cfg_path).to_path_buf();
            host.write_trusted(&state, &loc.project, &rel, &text)?;
            record_project(host, &loc.project)?;
            if was_approved {
                host.write_file(&approved, &text)?;
            }
            host.print(&format!(
                "added to {}{}\n",
                loc.display,
                if was_approved {
                    " (approved)"
                } else {
                    "; it is not approved: `ai-sandbox trust` shows and approves it"
                }
            ));
        }
    }
    Ok(0)
}

/// The default command: plan, then print (`--dry-run`) or launch.
pub fn run(host: &mut dyn Host, args: &RunArgs) -> anyhow::Result<i32> {
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
    let mut facts = gather_facts(host, &policy, !args.dry_run)?;
    if !args.dry_run
        && let Some(code) = preflight(host, &policy, &facts)?
    {
        return Ok(code);
    }
    if policy.gate && !args.dry_run {
        // The gate's real port (first free at or above gate_port) goes into the ruleset and
        // the proxy URL; the registration lasts as long as this process.
        (facts.gate_port, facts.gate_ca) = host.register_gate(&policy, &facts)?;
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
        return Ok(0);
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
    host.launch(&plan)
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

const NOT_STARTED: &str = "nothing was started";
const NOT_EXPORTED: &str = "nothing was exported";
const NOT_APPROVED: &str = "nothing was approved";

/// `ai-sandbox export ...`
pub fn export_cmd(host: &mut dyn Host, cmd: &crate::cli::ExportCmd) -> anyhow::Result<i32> {
    let crate::cli::ExportCmd::Kube { policy, namespace, image, gate_image, cilium } = cmd;
    let o = crate::kube::Options {
        namespace: namespace.clone(),
        image: image.clone(),
        gate_image: gate_image.clone(),
        cilium: *cilium,
        placeholders: Vec::new(),
    };
    export_kube(host, policy, o)
}

/// `ai-sandbox export kube`: the approved config (the same validation as a launch) as
/// Kubernetes objects; what has no cluster meaning is refused by line, and nothing is printed.
fn export_kube(host: &mut dyn Host, args: &PolicyArgs, mut o: crate::kube::Options) -> anyhow::Result<i32> {
    let exported = |e: anyhow::Error| match e.downcast::<Rejected>() {
        Ok(r) => Rejected { outcome: NOT_EXPORTED, ..r }.into(),
        Err(e) => e,
    };
    let loaded =
        load_policy(host, &RunArgs { policy: args.clone(), ..RunArgs::default() }).map_err(exported)?;
    if approval(host, &loaded.policy.project, loaded.text.as_deref())?.status.needs_approval() {
        return Err(hinted(
            format!(
                "{} is not approved; an export carries the policy you reviewed, nothing else",
                loaded.display
            ),
            "review and approve it with `ai-sandbox trust`, then export again",
        )
        .into());
    }
    let (cfg, _) = crate::policy::keys::read(loaded.text.as_deref().unwrap_or_default());
    // Made for this export: what the agent's Pod holds instead of each bound secret.
    for s in loaded.policy.secrets.iter().filter(|s| !s.hosts.is_empty()) {
        o.placeholders
            .push((s.name.clone(), format!("{}{}", crate::gate::secrets::PREFIX, host.random_hex(16)?)));
    }
    let text = crate::kube::export(&loaded.policy, &cfg, &o).map_err(|mut diagnostics| {
        in_line_order(&mut diagnostics);
        Rejected { config_path: loaded.display.clone(), diagnostics, outcome: NOT_EXPORTED }
    })?;
    host.print(&text);
    Ok(0)
}

/// `ai-sandbox init`: writes the config from presets; never overwrites without `--force`.
pub fn init(
    host: &mut dyn Host,
    presets: &[String],
    force: bool,
    project: Option<&Path>,
) -> anyhow::Result<i32> {
    let cwd = host.cwd()?;
    let dir = match project {
        Some(p) if p.is_absolute() => p.to_path_buf(),
        Some(p) => cwd.join(p),
        None => cwd,
    };
    let home = PathBuf::from(host.env("HOME").unwrap_or_default());
    project::check(&dir, &home)
        .and_then(|()| project::check_reserved(&host.canonical(&dir), &super::facts::reserved(host)))
        .map_err(|e| hinted(format!("{}; nothing was written", e.message), e.hint))?;
    let path = project::config_path(&dir);
    if !force && host.read_file(&path)?.is_some() {
        return Err(hinted(
            format!("{} already exists; nothing was written", path.display()),
            "edit it, or pass --force to replace it",
        )
        .into());
    }
    let text = crate::config::init::render(presets)?;
    host.write_file(&path, &text)?;
    // Written by ai-sandbox itself at the user's request: approved as it is.
    host.write_file(&crate::plan::session::approved_config(&state_dir(host, &dir)), &text)?;
    record_project(host, &dir)?;
    host.print(&format!("wrote {}\n", path.display()));
    Ok(0)
}
