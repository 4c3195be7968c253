//! What a launch observes of this machine before planning (`Facts`): paths (the runtime, state
//! and data dirs, the project's key), the working directory, the secrets' values and their
//! placeholders, the `upstream_ca` file, the ssh-agent socket, how the command is found. Apart
//! from `app` (the orchestration) so each reads in one sitting; only through `Host`.

use crate::error::hinted;
use crate::host::Host;
use crate::plan::Facts;
use crate::policy::Policy;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// Placeholder shown by `--dry-run` where a launch puts the per-session gate token.
const TOKEN_PLACEHOLDER: &str = "SESSION-TOKEN";

/// FNV-1a, to name per-project directories stably without a crypto dependency.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
}

/// `NAME-HASH` of a project directory: stable, readable, unique per path.
fn project_key(project: &Path) -> String {
    let name = project.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name}-{:016x}", fnv(&project.display().to_string()))
}

/// Whether the pids controller is delegated where rootless podman makes a sandbox's cgroup: the
/// user's systemd manager (`user@UID.service`), or where there is none this process's own cgroup
/// (`/proc/self/cgroup`'s v2 line). False on cgroup v1 (no `cgroup.controllers` there).
fn pids_cgroup(host: &dyn Host) -> anyhow::Result<bool> {
    let uid = host.uid();
    let manager = PathBuf::from(format!("/sys/fs/cgroup/user.slice/user-{uid}.slice/user@{uid}.service"));
    let own = host.read_file(Path::new("/proc/self/cgroup"))?.and_then(|t| {
        t.lines().find_map(|l| {
            l.strip_prefix("0::").map(|p| Path::new("/sys/fs/cgroup").join(p.trim_start_matches('/')))
        })
    });
    let dir = if host.exists(&manager.join("cgroup.controllers")) { Some(manager) } else { own };
    let Some(dir) = dir else { return Ok(false) };
    Ok(host
        .read_file(&dir.join("cgroup.controllers"))?
        .is_some_and(|c| c.split_whitespace().any(|x| x == "pids")))
}

/// ai-sandbox's per-user runtime dir (the gate, the sessions), as this user's environment says.
pub(super) fn runtime_dir(host: &dyn Host) -> PathBuf {
    let uid = host.uid();
    let run = crate::sys::runtime::login_run(uid);
    crate::sys::runtime::runtime_dir_for(
        host.env("AISB_RUNTIME_DIR").as_deref(),
        host.owned_dir(&run).then_some(&*run),
        uid,
    )
}

/// The per-user store of agent state shared by sandboxes.
pub(super) fn agents_dir(host: &dyn Host) -> PathBuf {
    xdg(host, "XDG_DATA_HOME", ".local/share").join("ai-sandbox/agents")
}

/// This project's directory in the user's state dir (`$XDG_STATE_HOME/ai-sandbox/projects/KEY`).
pub(super) fn state_dir(host: &dyn Host, project: &Path) -> PathBuf {
    xdg(host, "XDG_STATE_HOME", ".local/state").join("ai-sandbox/projects").join(project_key(project))
}

/// The directories no project may be, hold or lie in (see `project::check_reserved`): each as
/// the environment names it and as the host resolves it (a `~/.config` that is a link to a
/// dotfiles checkout is refused under both names).
pub(super) fn reserved(host: &dyn Host) -> Vec<crate::config::project::Reserved> {
    use crate::config::project::Reserved;
    let login_run = crate::sys::runtime::login_run(host.uid());
    let (config, data) =
        (xdg(host, "XDG_CONFIG_HOME", ".config"), xdg(host, "XDG_DATA_HOME", ".local/share"));
    let named = [
        (runtime_dir(host), "ai-sandbox's runtime directory (the gate's control socket, the sessions)"),
        (
            xdg(host, "XDG_STATE_HOME", ".local/state").join("ai-sandbox"),
            "ai-sandbox's state (the approved configs, the file guard's records)",
        ),
        (data.join("ai-sandbox"), "ai-sandbox's data (every project's sandbox HOME, the agents' logins)"),
        (xdg(host, "XDG_CACHE_HOME", ".cache").join("ai-sandbox"), "ai-sandbox's cache"),
        (config.join("ai-sandbox"), "ai-sandbox's configuration"),
        (config.join("containers"), "podman's configuration (it names the runtime the host runs)"),
        (data.join("containers"), "podman's storage (your images and containers)"),
        (login_run.join("containers"), "podman's runtime state"),
        (login_run.join("libpod"), "podman's runtime state"),
        (config.join("systemd"), "your systemd user units (the host runs them)"),
        (data.join("systemd"), "your systemd user units (the host runs them)"),
        (config.join("environment.d"), "your login environment (the host reads it at login)"),
        (config.join("autostart"), "your desktop's autostart entries (the host runs them at login)"),
        (config.join("git"), "git's global configuration (every git command of yours reads it)"),
    ];
    let mut out = Vec::new();
    for (path, what) in named {
        let resolved = host.canonical(&path);
        if resolved != path {
            out.push(Reserved { path: resolved, what });
        }
        out.push(Reserved { path, what });
    }
    out
}

pub(super) fn xdg(host: &dyn Host, var: &str, fallback: &str) -> PathBuf {
    match host.env(var) {
        Some(v) if Path::new(&v).is_absolute() => PathBuf::from(v),
        _ => PathBuf::from(host.env("HOME").unwrap_or_default()).join(fallback),
    }
}

/// What the facts are gathered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// A launch: a real token, the secrets' values, the gate's CA and the system roots read.
    Launch,
    /// `--dry-run`: placeholders where a launch would read or make a secret.
    DryRun,
}

/// Observes what the plan needs from this machine.
pub fn gather_facts(host: &mut dyn Host, p: &Policy, intent: Intent) -> anyhow::Result<Facts> {
    let launching = intent == Intent::Launch;
    let home = PathBuf::from(host.env("HOME").context("HOME is not set")?);
    let Resolved { values: secrets, missing: missing_secrets, mut bound, aws_from } =
        resolve_secrets(host, p, &home, launching)?;
    let agents_dir = agents_dir(host);
    let held = match launching {
        true => held_logins(host, p, &agents_dir, &mut bound)?,
        false => Vec::new(),
    };
    let upstream_ca = match (&p.upstream_ca, launching) {
        (Some(f), true) => Some(read_upstream_ca(host, f, &home)?),
        _ => None,
    };
    let session_id = host.random_hex(6)?;
    let runtime = runtime_dir(host);
    let host_dirs: Vec<PathBuf> =
        ["/usr", "/etc", "/opt"].iter().map(PathBuf::from).filter(|d| host.exists(d)).collect();
    let launchable = launchable(host, p, &host_dirs, &home);
    let state_dir = state_dir(host, &p.project);
    if p.workspace == crate::policy::Workspace::Review {
        overlay_paths(&p.project, &state_dir)?;
    }
    let nft = crate::plan::session::nft_program(host.env("AISB_NFT"), || host.which("nft"));
    Ok(Facts {
        podman: host.which("podman").unwrap_or_else(|| PathBuf::from("podman")),
        nft,
        self_exe: host.current_exe().context("finding this program's path (it is also the OCI hook)")?,
        session_dir: runtime.join("sessions").join(&session_id),
        runtime_dir: runtime,
        session_id,
        sandbox_home: xdg(host, "XDG_DATA_HOME", ".local/share")
            .join("ai-sandbox/homes")
            .join(project_key(&p.project)),
        home,
        launchable,
        host_dirs,
        tty: host.stdio_is_tty(),
        token: if launching { host.random_hex(16)? } else { TOKEN_PLACEHOLDER.into() },
        gate_port: p.gate_port,
        relays: Vec::new(),
        agents_dir,
        secrets,
        missing_secrets,
        aws_from,
        bound,
        held,
        upstream_ca,
        // Set from the gate's reply at launch; a dry run shows where it would go.
        gate_ca: (!launching && p.terminates())
            .then(|| "<the gate's CA certificate, made by the gate>\n".into()),
        system_roots: match launching && p.terminates() {
            true => host.read_file(Path::new(crate::plan::gate_ca::SYSTEM_BUNDLE))?,
            false => None,
        },
        state_dir,
        // Review mode mounts nothing of the project read-only (nothing the sandbox writes lands
        // there), so the project is not walked.
        protected: match p.workspace {
            crate::policy::Workspace::Review => crate::plan::protect::Protected::default(),
            crate::policy::Workspace::Direct => {
                host.protected_mounts(&p.project, &crate::plan::protect::candidates(&p.protect))?
            }
        },
        ssh_agent: ssh_agent_socket(host, p)?,
        loader: host.current_exe().ok().and_then(|exe| host.loader(&exe)),
        host_ssh_config: host.exists(Path::new(crate::plan::podman::SSH_CONFIG)),
        init: (p.image == crate::policy::Image::Host)
            .then(|| crate::plan::podman::CATATONIT.iter().map(PathBuf::from).find(|c| host.exists(c)))
            .flatten(),
        cgroup_v2: host.exists(Path::new("/sys/fs/cgroup/cgroup.controllers")),
        pids_cgroup: pids_cgroup(host)?,
        offline: crate::plan::podman::offline(host.read_file(Path::new("/proc/net/route"))?.as_deref()),
        git_identity: match &p.git_identity {
            crate::policy::GitIdentity::Host => host.git_identity(),
            crate::policy::GitIdentity::Off => None,
            crate::policy::GitIdentity::Given { name, email } => Some((name.clone(), email.clone())),
        },
        engine_seccomp: engine_seccomp(host, p)?,
        workdir: workdir(host, p)?,
        probe: if host.env("AISB_SKIP_SELF_CHECK").as_deref() == Some("1") {
            crate::plan::session::Probe::Skipped
        } else {
            crate::plan::session::Probe::AtLaunch
        },
    })
}

/// `containers = on`: the outer container's seccomp profile, made from podman's default (see
/// `plan::engine`). Without the default nothing starts: a profile of ours alone would drift from
/// what podman refuses on this machine.
fn engine_seccomp(host: &dyn Host, p: &Policy) -> anyhow::Result<Option<String>> {
    use crate::plan::engine::{DEFAULT_SECCOMP, seccomp_profile};
    if !p.containers {
        return Ok(None);
    }
    let hint = "install containers-common (scripts/install-deps does), or run without `containers = on` / --containers";
    let Some(default) = host.read_file(Path::new(DEFAULT_SECCOMP))? else {
        return Err(hinted(
            format!("containers = on: podman's default seccomp profile is not at {DEFAULT_SECCOMP}; nothing was started"),
            hint,
        )
        .into());
    };
    match seccomp_profile(&default) {
        Ok(profile) => Ok(Some(profile)),
        Err(e) => Err(hinted(format!("containers = on: {e}; nothing was started"), hint).into()),
    }
}

/// podman's `-v SRC:DST:O,upperdir=U,workdir=W` splits at `:` and `,`, and has no quoting: a
/// project or state directory with either cannot be the overlay's.
fn overlay_paths(project: &Path, state_dir: &Path) -> anyhow::Result<()> {
    for (what, p) in [("project directory", project), ("state directory", state_dir)] {
        if p.to_str().is_none_or(|t| t.contains([':', ','])) {
            return Err(hinted(
                format!(
                    "review mode: the {what} {} holds a `:` or `,` (or is not UTF-8), which podman's overlay mount cannot take; nothing was started",
                    p.display()
                ),
                "rename the directory, or run without --review / `workspace = review`",
            )
            .into());
        }
    }
    Ok(())
}

/// Where the command starts: the working directory when it is in the project, else the project.
/// podman carries it as text (config.json), so a name that is not UTF-8 is refused, not mangled.
fn workdir(host: &dyn Host, p: &Policy) -> anyhow::Result<PathBuf> {
    let dir = host.cwd().ok().filter(|c| c.starts_with(&p.project)).unwrap_or_else(|| p.project.clone());
    if dir.to_str().is_none() {
        return Err(hinted(
            format!("the working directory's path is not UTF-8 ({})", dir.display()),
            "run from a directory with a UTF-8 name (the command starts where you are, and podman takes that path as text)",
        )
        .into());
    }
    Ok(dir)
}

/// The ssh-agent socket `--ssh-agent` passes in: SSH_AUTH_SOCK, which must name one.
fn ssh_agent_socket(host: &dyn Host, p: &Policy) -> anyhow::Result<Option<PathBuf>> {
    if !p.ssh_agent {
        return Ok(None);
    }
    let hint = "start one and add a key (`eval \"$(ssh-agent)\"; ssh-add`), or run without --ssh-agent";
    let Some(sock) = host.env("SSH_AUTH_SOCK").filter(|s| !s.is_empty()) else {
        return Err(hinted(
            "--ssh-agent: SSH_AUTH_SOCK is not set, so there is no ssh-agent to pass in",
            hint,
        )
        .into());
    };
    let sock = PathBuf::from(sock);
    if !sock.is_absolute() || !host.exists(&sock) {
        return Err(
            hinted(format!("--ssh-agent: SSH_AUTH_SOCK={} does not exist", sock.display()), hint).into()
        );
    }
    Ok(Some(sock))
}

/// How the command runs when it is installed where the sandbox does not look (`image = host`
/// and a bare command name only: an image brings its own programs).
fn launchable(
    host: &dyn Host,
    p: &Policy,
    host_dirs: &[PathBuf],
    home: &Path,
) -> crate::plan::agent::Launchable {
    let crate::policy::Command::Argv(argv) = &p.command else { return Default::default() };
    let Some(name) = argv[0].to_str() else { return Default::default() };
    if p.image != crate::policy::Image::Host || name.contains('/') {
        return Default::default();
    }
    let visible: Vec<PathBuf> = host_dirs.iter().cloned().chain([p.project.clone()]).collect();
    let mut l = crate::plan::agent::plan(name, host.find_program(name).as_ref(), &visible, home);
    // A directory an install usually has (a script's `lib`) that this one lacks is not mounted:
    // podman refuses to mount what does not exist.
    l.mounts.retain(|m| host.exists(m));
    l
}

/// What a launch passes for the `secret` lines.
struct Resolved {
    /// By name: the value (unbound) or the placeholder (bound), for the sandbox's environment.
    values: Vec<(String, String)>,
    /// The names that have no value.
    missing: Vec<String>,
    /// The bound ones, with their values, for the gate.
    bound: Vec<crate::gate::secrets::Bound>,
    /// Where `secret = aws` read (or would read) its credentials.
    aws_from: Option<String>,
}

/// `upstream_ca = FILE`, read at launch: PEM text (the gate parses it).
fn read_upstream_ca(host: &dyn Host, f: &str, home: &Path) -> anyhow::Result<String> {
    let path = match f.strip_prefix("~/") {
        Some(rest) => home.join(rest),
        None => PathBuf::from(f),
    };
    match host.read_file(&path)? {
        Some(t) if t.contains("-----BEGIN CERTIFICATE-----") => Ok(t),
        Some(_) => Err(hinted(
            format!("upstream_ca {} holds no PEM certificate", path.display()),
            "point it at a PEM file (-----BEGIN CERTIFICATE-----)",
        )
        .into()),
        None => Err(hinted(
            format!("upstream_ca {} does not exist", path.display()),
            "fix the path or remove the line",
        )
        .into()),
    }
}

/// Secret values, read only for a launch (a dry run shows where each would come from).
fn resolve_secrets(
    host: &mut dyn Host,
    p: &Policy,
    home: &Path,
    launching: bool,
) -> anyhow::Result<Resolved> {
    use crate::policy::env::SecretSource;
    use crate::policy::secret::AwsPart;
    let (mut values, mut missing, mut bound) = (Vec::new(), Vec::new(), Vec::new());
    // `secret = aws`: one read for its three variables.
    let (mut aws, mut aws_from): (Option<super::aws::AwsCreds>, _) = (None, None);
    for s in &p.secrets {
        let value = match (&s.from, launching) {
            (SecretSource::Aws { profile, part }, false) => {
                let said = super::aws::said(host, home, profile.as_deref());
                aws_from = Some(said.clone());
                Some(format!("<{} from {said}>", part.var()))
            }
            (SecretSource::Aws { profile, part }, true) => {
                if aws.is_none() {
                    let read = super::aws::read(host, home, profile.as_deref())?;
                    aws_from = Some(read.from.clone());
                    aws = Some(read);
                }
                match aws.as_ref().and_then(|c| c.part(*part)) {
                    Some(v) => Some(v.to_string()),
                    // No session token: long-term keys sign without one.
                    None => continue,
                }
            }
            (SecretSource::Env, false) => Some(format!("<secret from ${}>", s.name)),
            (SecretSource::File(f), false) => Some(format!("<secret from {f}>")),
            (SecretSource::Env, true) => host.env(&s.name),
            (SecretSource::File(f), true) => {
                let path = match f.strip_prefix("~/") {
                    Some(rest) => home.join(rest),
                    None => PathBuf::from(f),
                };
                Some(host.read_secret_file(&path)?)
            }
        };
        match value {
            Some(v) if v.contains('\n') => {
                bail!("the secret {} contains a newline; an environment variable cannot carry it", s.name)
            }
            Some(v) if s.hosts.is_empty() => values.push((s.name.clone(), v)),
            Some(v) => {
                // Per session and random: what the sandbox holds is worth nothing elsewhere.
                let placeholder = match launching {
                    true => format!("{}{}", crate::gate::secrets::PREFIX, host.random_hex(16)?),
                    false if matches!(s.from, SecretSource::Aws { .. }) => {
                        format!(
                            "<placeholder made at launch; the gate signs with {v} for {}>",
                            s.hosts.join(", ")
                        )
                    }
                    false => format!(
                        "<placeholder made at launch; the gate sends {v} only to {}>",
                        s.hosts.join(", ")
                    ),
                };
                values.push((s.name.clone(), placeholder.clone()));
                let b = crate::gate::secrets::Bound::new(&s.name, &placeholder, &v, &[]);
                let hosts = s.hosts.clone();
                bound.push(match &s.from {
                    // The secret key signs, in the gate: it is sent nowhere.
                    SecretSource::Aws { part: AwsPart::SecretKey, .. } => b.signs(AwsPart::SecretKey),
                    SecretSource::Aws { part, .. } => crate::gate::secrets::Bound { hosts, ..b.signs(*part) },
                    _ => crate::gate::secrets::Bound { hosts, ..b },
                });
            }
            None if host.env_not_text(&s.name) => {
                return Err(hinted(
                    format!("the value of {} in your environment is not UTF-8 text", s.name),
                    "set it to text (an API key or token is); the sandbox's variables go through a text file",
                )
                .into());
            }
            None => missing.push(s.name.clone()),
        }
    }
    Ok(Resolved { values, missing, bound, aws_from })
}

/// The tokens of the logins the gate holds (ADR 0087), read from the store at launch: each is
/// bound to its hosts for the gate, and the sandbox's copy of the login gets its placeholder. A
/// token the store lacks is not held, unless the store has no token of the login at all: then
/// each token the token endpoint issues is bound with no value yet, so that the gate takes a
/// first login made inside (its code exchange's answer) and the agent gets placeholders (ADR
/// 0090).
fn held_logins(
    host: &mut dyn Host,
    p: &Policy,
    agents_dir: &Path,
    bound: &mut Vec<crate::gate::secrets::Bound>,
) -> anyhow::Result<Vec<crate::plan::session::HeldGiven>> {
    use crate::contract::session::{LoginRef, login_field};
    let mut given = Vec::new();
    if !p.gate {
        return Ok(given);
    }
    for s in &p.agent_state {
        let Some(login) = crate::policy::agents::held(&s.name) else { continue };
        // Each login file read once, for all of its tokens (`None`: absent, or not JSON).
        let mut files: std::collections::BTreeMap<&str, Option<serde_json::Value>> = Default::default();
        for t in login.tokens {
            let store = s.store_file(agents_dir, t.file);
            if !files.contains_key(t.file) {
                // A login still in the layout before ADR 0056 is moved to the store as it is given.
                let legacy = s.legacy_file(agents_dir, t.file);
                let text = match host.read_file(&store)? {
                    Some(t) => Some(t),
                    None => legacy.map(|l| host.read_file(&l)).transpose()?.flatten(),
                };
                files.insert(t.file, text.and_then(|t| serde_json::from_str(&t).ok()));
            }
        }
        let first = !login.tokens.iter().any(|t| {
            files[t.file].as_ref().and_then(|json| login_field(json, t.field)).is_some_and(|v| !v.is_empty())
        });
        for t in login.tokens {
            let store = s.store_file(agents_dir, t.file);
            let real =
                files[t.file].as_ref().and_then(|json| login_field(json, t.field)).filter(|v| !v.is_empty());
            let real = match (real, first && t.answer.is_some()) {
                (Some(real), _) => real,
                // A first login's token: its placeholder, and its value when the gate takes it.
                (None, true) => "",
                (None, false) => continue,
            };
            // A JWT is held by its signature (its claims stay readable); anything else whole.
            let jwt = t.jwt.then(|| crate::contract::session::jwt_parts(real)).flatten();
            let shown_len = jwt.map_or(real.len(), |(_, signature)| signature.len());
            let is_jwt = jwt.is_some() || (real.is_empty() && t.jwt);
            let held = held_placeholder(host, if is_jwt { "" } else { t.prefix }, shown_len)?;
            let placeholder = match jwt {
                Some((signed, _)) => format!("{signed}.{held}"),
                None => held.clone(),
            };
            let field: Vec<String> = t.field.iter().map(|f| f.to_string()).collect();
            bound.push(crate::gate::secrets::Bound {
                name: format!("the {} login's {}", s.name, field.join(".")),
                placeholder: held,
                value: real.to_string(),
                hosts: t.hosts.iter().map(|h| h.to_string()).collect(),
                aws: None,
                login: t.answer.map(|answer| LoginRef {
                    store: store.clone(),
                    field: field.clone(),
                    endpoint: login.endpoint.into(),
                    answer: answer.into(),
                    expiry: login.expiry.iter().map(|f| f.to_string()).collect(),
                    refresh: t.refresh,
                    jwt: is_jwt,
                    form: login.form,
                    code_form: login.code_form,
                }),
            });
            given.push(crate::plan::session::HeldGiven { store, field, placeholder });
        }
    }
    Ok(given)
}

/// A placeholder of a login token's shape: its prefix, the gate's mark, then random hex up to
/// the real token's length (at least 32 hex digits), so that a CLI's check of the prefix or its
/// length class passes, and a user who sees it knows what it is.
fn held_placeholder(host: &mut dyn Host, prefix: &str, len: usize) -> anyhow::Result<String> {
    let head = format!("{prefix}{}", crate::gate::secrets::PREFIX);
    let mut digits = len.saturating_sub(head.len()).max(32);
    // A length base64url can decode (as a JWT's signature must be: never 1 more than a multiple of 4).
    if (head.len() + digits) % 4 == 1 {
        digits += 1;
    }
    let hex = host.random_hex(digits.div_ceil(2))?;
    Ok(format!("{head}{}", &hex[..digits]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::FakeHost;

    #[test]
    fn a_held_tokens_placeholder_has_its_prefix_its_length_and_a_length_base64url_reads() {
        let mut h = FakeHost::default();
        let p = held_placeholder(&mut h, "sk-ant-oat01-", 108).unwrap();
        assert!(p.starts_with("sk-ant-oat01-aisb_placeholder_") && p.len() == 108, "{p}");
        // Short tokens still get 32 random digits; no length is 1 more than a multiple of 4.
        let p = held_placeholder(&mut h, "", 10).unwrap();
        assert_eq!(p.len(), "aisb_placeholder_".len() + 32 + 1, "{p}");
        for len in 40..60 {
            assert_ne!(held_placeholder(&mut h, "", len).unwrap().len() % 4, 1, "{len}");
        }
    }

    /// A script in `~/.local/bin` is mounted with its install's `lib` only when there is one
    /// (podman refuses a mount of what does not exist: `statfs ~/.local/lib`).
    #[test]
    fn an_agents_install_dirs_are_mounted_only_where_they_exist() {
        let mut h = FakeHost { cwd: "/home/u/p".into(), ..FakeHost::default() };
        h.vars.push(("HOME".into(), "/home/u".into()));
        let script = PathBuf::from("/home/u/.local/bin/agent");
        h.programs.push((
            "agent".into(),
            crate::plan::agent::Found {
                path: script.clone(),
                target: script.clone(),
                interpreter: Some(("/usr/bin/node".into(), "/usr/bin/node".into())),
            },
        ));
        h.files.push((script, "#!/usr/bin/env node\n".into()));
        let (cfg, _) = crate::policy::keys::read("cmd = agent\n");
        let p = crate::policy::build("/home/u/p".into(), &cfg, &crate::policy::Inputs::default()).unwrap();
        let l = launchable(&h, &p, &[PathBuf::from("/usr")], Path::new("/home/u"));
        assert_eq!(l.mounts, [PathBuf::from("/home/u/.local/bin")], "{l:?}");
        h.files.push(("/home/u/.local/lib/node_modules/x".into(), String::new()));
        let l = launchable(&h, &p, &[PathBuf::from("/usr")], Path::new("/home/u"));
        assert_eq!(
            l.mounts,
            [PathBuf::from("/home/u/.local/bin"), PathBuf::from("/home/u/.local/lib")],
            "{l:?}"
        );
    }

    /// The pids controller counts where podman makes the cgroup: the user's systemd manager's,
    /// else this process's own; absent (cgroup v1, not delegated), `nproc` is what holds.
    #[test]
    fn the_pids_cgroup_is_used_only_where_the_controller_is_delegated() {
        let manager = "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/cgroup.controllers";
        let own = "/sys/fs/cgroup/user.slice/session-3.scope/cgroup.controllers";
        let with = |files: &[(&str, &str)]| {
            let h = FakeHost {
                uid: 1000,
                files: files.iter().map(|(p, t)| (PathBuf::from(p), t.to_string())).collect(),
                ..FakeHost::default()
            };
            pids_cgroup(&h).unwrap()
        };
        let self_cgroup = ("/proc/self/cgroup", "0::/user.slice/session-3.scope\n");
        assert!(with(&[(manager, "cpu memory pids\n"), self_cgroup, (own, "cpu\n")]));
        assert!(
            !with(&[(manager, "cpu memory\n"), self_cgroup, (own, "cpu pids\n")]),
            "the manager's, where it is"
        );
        assert!(with(&[self_cgroup, (own, "cpu pids\n")]), "no manager: this process's own");
        assert!(!with(&[self_cgroup, (own, "cpu pidsx\n")]), "a whole word");
        assert!(!with(&[("/proc/self/cgroup", "1:name=systemd:/user.slice\n")]), "cgroup v1");
    }
}
