//! Orchestration: CLI → project → config → policy → facts → plan → print or launch.
//! Talks to the machine only through `Host`.

use crate::cli::{PolicyArgs, RunArgs};
use crate::error::{Diagnostic, Origin, Rejected, hinted};
use crate::host::Host;
use crate::plan::{self, Facts, Plan};
use crate::policy::{self, Inputs, Policy};
use crate::{config, project};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// Placeholder shown by `--dry-run` where a launch puts the per-session gate token.
const TOKEN_PLACEHOLDER: &str = "SESSION-TOKEN";

/// Resolves the project and builds the policy, reporting every problem at once.
fn load_policy(host: &dyn Host, args: &RunArgs) -> anyhow::Result<Policy> {
    let cwd = host.cwd()?;
    let project = match &args.policy.project {
        Some(p) if p.is_absolute() => p.clone(),
        Some(p) => cwd.join(p),
        None => project::find(&cwd, |p| host.exists(p)),
    };
    let home = PathBuf::from(host.env("HOME").unwrap_or_default());
    if args.policy.project.is_none() && project == home && host.exists(&home.join(project::CONFIG_DIR)) {
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
    let cfg_path = project.join(project::CONFIG_DIR).join(project::CONFIG_FILE);
    let display = match cfg_path.strip_prefix(&cwd) {
        Ok(rel) => rel.display().to_string(),
        Err(_) => cfg_path.display().to_string(),
    };
    let file = host.read_file(&cfg_path)?;
    let text = file.clone().unwrap_or_default();
    let reject = |diagnostics: Vec<Diagnostic>| Rejected { config_path: display.clone(), diagnostics };
    let (cfg, mut problems) = config::parse(&text);
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
    };
    match policy::build(project, &cfg, &inputs) {
        Ok(mut p) if problems.is_empty() => {
            // Said when it matters: the allowlist applies and nothing at all was allowed.
            if cfg.entries.is_empty() && p.net == policy::NetMode::Allow && args.policy.allow.is_empty() {
                let what = if file.is_none() { "there is no" } else { "nothing is set in" };
                p.notices.push(format!(
                    "{what} {display}: nothing is allowed beyond --allow flags (`ai-sandbox init` writes a config)"
                ));
            }
            Ok(p)
        }
        Ok(_) => Err(reject(problems).into()),
        Err(more) => {
            problems.extend(more);
            // Config-line problems first, in line order; then flags and environment.
            problems.sort_by_key(|d| match d.origin {
                Origin::Config(l) => (0, l),
                _ => (1, 0),
            });
            Err(reject(problems).into())
        }
    }
}

/// FNV-1a, to name per-project directories stably without a crypto dependency.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
}

fn xdg(host: &dyn Host, var: &str, fallback: &str) -> PathBuf {
    match host.env(var) {
        Some(v) if Path::new(&v).is_absolute() => PathBuf::from(v),
        _ => PathBuf::from(host.env("HOME").unwrap_or_default()).join(fallback),
    }
}

/// Observes what the plan needs from this machine. `launching` picks a real token.
pub fn gather_facts(host: &mut dyn Host, p: &Policy, launching: bool) -> anyhow::Result<Facts> {
    let home = PathBuf::from(host.env("HOME").context("HOME is not set")?);
    let session_id = host.random_hex(6)?;
    let runtime = crate::gate::control::runtime_dir_for(
        host.env("AISB_RUNTIME_DIR").as_deref(),
        host.env("XDG_RUNTIME_DIR").as_deref(),
        host.uid(),
    );
    let name = p.project.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let nft = match host.env("AISB_NFT") {
        Some(v) => PathBuf::from(v),
        None => host.which("nft").unwrap_or_else(|| PathBuf::from("/usr/sbin/nft")),
    };
    Ok(Facts {
        podman: host.which("podman").unwrap_or_else(|| PathBuf::from("podman")),
        nft,
        self_exe: host.current_exe().context("finding this program's path (it is also the OCI hook)")?,
        session_dir: runtime.join("sessions").join(&session_id),
        runtime_dir: runtime,
        session_id,
        sandbox_home: xdg(host, "XDG_DATA_HOME", ".local/share")
            .join("ai-sandbox/homes")
            .join(format!("{name}-{:016x}", fnv(&p.project.display().to_string()))),
        rootfs: xdg(host, "XDG_CACHE_HOME", ".cache").join("ai-sandbox/rootfs-v1"),
        home,
        host_dirs: ["/usr", "/etc", "/opt"].iter().map(PathBuf::from).filter(|d| host.exists(d)).collect(),
        tty: host.stdio_is_tty(),
        token: if launching { host.random_hex(16)? } else { TOKEN_PLACEHOLDER.into() },
        gate_port: p.gate_port,
    })
}

/// The default command: plan, then print (`--dry-run`) or launch.
pub fn run(host: &mut dyn Host, args: &RunArgs) -> anyhow::Result<i32> {
    let policy = load_policy(host, args)?;
    if !args.dry_run && host.uid() == 0 {
        return Err(hinted(
            "ai-sandbox runs rootless and refuses to start as root (podman cannot use pasta as root)",
            "run it as a regular user; from a root shell: scripts/as-user ai-sandbox ...",
        )
        .into());
    }
    let mut facts = gather_facts(host, &policy, !args.dry_run)?;
    if policy.gate && !args.dry_run {
        // The gate's real port (first free at or above gate_port) goes into the ruleset and
        // the proxy URL; the registration lasts as long as this process.
        facts.gate_port = host.register_gate(&policy, &facts)?;
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
    for c in crate::loopback::applicable(&policy) {
        let reply = host.probe_loopback(c.port, c.ask);
        if let Some(w) = crate::loopback::warning(c, policy.gate_addr, &reply) {
            host.eprint(&format!("ai-sandbox: {w}\n"));
        }
    }
    host.launch(&plan)
}

/// `ai-sandbox rules [--json|--nft]`
pub fn rules(host: &mut dyn Host, args: &PolicyArgs, json: bool) -> anyhow::Result<i32> {
    let policy = load_policy(host, &RunArgs { policy: args.clone(), ..RunArgs::default() })?;
    match crate::ruleset::build(&policy, policy.gate_port) {
        Some(rs) if json => host.print(&(rs.to_json_string() + "\n")),
        Some(rs) => host.print(&rs.to_text()),
        None => bail!("--net {} applies no nftables ruleset", policy.net.name()),
    }
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
    project::check(&dir, &home).map_err(|e| hinted(format!("{}; nothing was written", e.message), e.hint))?;
    let path = dir.join(project::CONFIG_DIR).join(project::CONFIG_FILE);
    if !force && host.read_file(&path)?.is_some() {
        return Err(hinted(
            format!("{} already exists; nothing was written", path.display()),
            "edit it, or pass --force to replace it",
        )
        .into());
    }
    let text = crate::init::render(presets)?;
    host.write_file(&path, &text)?;
    host.print(&format!("wrote {}\n", path.display()));
    Ok(0)
}
