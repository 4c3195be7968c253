//! One sandbox session: the host facts a launch is planned against, and the layout of its
//! private session directory (`/run/user/UID/ai-sandbox/sessions/ID`, 0700), in one place
//! for the planner (which names the files), the launcher (which writes them) and the keeper
//! (which cleans up after a launcher that was killed).

use std::path::PathBuf;

/// The proxy variables' env file (holds the session token: mode 0600, never on argv).
const ENV_FILE: &str = "proxy.env";
/// The OCI hook's JSON, in the hooks dir podman reads.
const HOOK_FILE: &str = "ai-sandbox.json";
/// The ruleset the hook loads.
const RULESET_FILE: &str = "ruleset.json";
/// The self-check's hook JSON (stage startContainer), beside the ruleset's.
const CHECK_FILE: &str = "ai-sandbox-check.json";
/// The self-check's never-allowed destination (`ADDR:PORT`): its refusal is the check's, not the
/// agent's, and is left out of what the rules' refused sets report.
pub(crate) const CANARY_FILE: &str = "canary";
/// What the running sandbox allows (see `live`), for `ai-sandbox allow`.
pub(crate) const LIVE_FILE: &str = "live.json";
/// The container's first process, as podman writes it (`--pidfile`): its namespaces are where
/// a live change or a read of the refusal records goes.
pub(crate) const CONTAINER_PID_FILE: &str = "container.pid";
/// Where crun writes what the hooks (the ruleset's loader, the self-check) printed
/// (`run.oci.hooks.stderr`): crun says only a hook's exit code, runc its stderr too, so the
/// launcher prints this file's reason when the sandbox did not start.
pub(crate) const HOOKS_STDERR_FILE: &str = "hooks.stderr";
/// Made by the `createRuntime` hook as it starts: the launch's own refusal (the ruleset not
/// loaded) is never taken for the runtime's failure, which the launcher retries once.
pub(crate) const HOOK_RAN_FILE: &str = "hook.ran";
/// The launcher's pid: a session dir whose launcher is dead is stale.
pub(crate) const PID_FILE: &str = "pid";
/// Label podman puts on every sandbox container: the session id.
pub(crate) const SESSION_LABEL: &str = "ai-sandbox.session";
/// Label podman puts on every sandbox container: its session directory (wherever the runtime
/// dir is), by which any keeper can tell whether the session is over.
pub(crate) const SESSION_DIR_LABEL: &str = "ai-sandbox.session-dir";
/// Label podman puts on every sandbox container: the project directory.
pub(crate) const PROJECT_LABEL: &str = "ai-sandbox.project";

/// Host state the plan depends on, gathered by `host` (or fixed in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub(crate) podman: PathBuf,
    pub(crate) nft: PathBuf,
    /// This binary (absolute): it is also the OCI hook and the keeper.
    pub(crate) self_exe: PathBuf,
    pub(crate) session_id: String,
    /// ai-sandbox's per-user runtime dir: the gate's socket and log, `sessions/`.
    pub(crate) runtime_dir: PathBuf,
    pub(crate) session_dir: PathBuf,
    /// `image = host`: catatonit (podman's init) as the host's /usr has it, run as the sandbox's
    /// pid 1 with `-g` (see `podman::CATATONIT`); None: podman's `--init`.
    pub(crate) init: Option<PathBuf>,
    /// Whether the host has /etc/ssh/ssh_config (replaced inside, see `podman::ssh_config`).
    pub(crate) host_ssh_config: bool,
    /// Where the command starts: the working directory when it is inside the project (as git,
    /// direnv and devcontainers do), else the project.
    pub(crate) workdir: PathBuf,
    /// The user's real HOME path (where the sandbox home is mounted).
    pub(crate) home: PathBuf,
    /// The persistent, per-project sandbox HOME on the host.
    pub(crate) sandbox_home: PathBuf,
    /// Host directories mounted read-only for `image = host` (those that exist).
    pub(crate) host_dirs: Vec<PathBuf>,
    pub(crate) tty: bool,
    pub(crate) token: String,
    pub gate_port: u16,
    /// The launcher's relays for spliced IP entries: each destination and the host-loopback
    /// port its relay listens on (empty in a dry run: they are chosen when the launch binds them).
    pub(crate) relays: Vec<(std::net::SocketAddrV4, u16)>,
    /// This project's directory in the user's state dir (outside every project): the approved
    /// config, the guard's records, the quarantine.
    pub(crate) state_dir: PathBuf,
    /// Protected paths that exist now (mounted read-only inside), and the project's
    /// repositories (see `guard::repos`).
    pub(crate) protected: crate::plan::protect::Protected,
    /// Secret values by name, read at launch (a dry run holds placeholders); only ever written
    /// to the private env file.
    pub(crate) secrets: Vec<(String, String)>,
    /// Secrets the user listed that have no value (said at launch).
    pub(crate) missing_secrets: Vec<String>,
    /// Where `secret = aws` read the AWS credentials the gate signs with (a dry run: where it
    /// would).
    pub(crate) aws_from: Option<String>,
    /// Secrets bound to hosts, each with its per-session placeholder (which `secrets` holds
    /// under the same name); the values go to the gate only, at registration.
    pub(crate) bound: Vec<crate::gate::secrets::Bound>,
    /// The login tokens the gate holds (ADR 0087): each store file's token places and the
    /// placeholders the sandbox's copy gets there.
    pub(crate) held: Vec<HeldGiven>,
    /// The `upstream_ca` file's text, read at launch (for the gate).
    pub(crate) upstream_ca: Option<String>,
    /// The gate's CA certificate, once the gate is terminating TLS for this session: the
    /// sandbox trusts it (see `podman::trust_env`).
    pub(crate) gate_ca: Option<String>,
    /// The host's system bundle (read at launch when a secret is bound), which the sandbox's
    /// bundle starts with (see `trust`).
    pub(crate) system_roots: Option<String>,
    /// The per-user store of agent state shared by sandboxes (`$XDG_DATA_HOME/ai-sandbox/agents`).
    pub(crate) agents_dir: PathBuf,
    /// How to run the command when it is installed outside what the sandbox sees (see `agent`).
    pub(crate) launchable: crate::plan::agent::Launchable,
    /// The user's ssh-agent socket, with `--ssh-agent`.
    pub(crate) ssh_agent: Option<PathBuf>,
    /// The hook's proof that the rules hold (see `hook::self_check`): where it probes.
    pub(crate) probe: Probe,
    /// Whether the host runs cgroup v2 (rootless podman enforces `--memory` and
    /// `--pids-limit` there only).
    pub(crate) cgroup_v2: bool,
    /// cgroup v2 with the pids controller delegated where podman makes the sandbox's cgroup:
    /// `pids` is then `--pids-limit` alone (ADR 0081). Without it podman drops the limit with a
    /// warning, and `--ulimit nproc` is what holds.
    pub(crate) pids_cgroup: bool,
    /// The host has no IPv4 default route (an offline laptop; a network without a way out): given
    /// an interface with an address, pasta would copy the address and no route, and the sandbox
    /// could not reach the gate's address. Read from `/proc/net/route` (see `podman::offline`).
    pub(crate) offline: bool,
    /// Who commits made inside are authored by (name, email): the host's git config's, the
    /// config's `git_identity` line's, or none.
    pub(crate) git_identity: Option<(String, String)>,
    /// This program's dynamic loader on the host (see `Host::loader`): the self-check runs
    /// through it, with its directory mounted, so it runs inside any image.
    pub(crate) loader: Option<PathBuf>,
    /// `containers = on`: the inner engine's seccomp profile (see `engine::seccomp_profile`),
    /// made from the host's default at launch.
    pub(crate) engine_seccomp: Option<String>,
}

/// The never-allowed destination the hook's self-check must find refused: a listener of the
/// launcher's on the host's 127.0.0.1, reached (were the rules not in force) at `gate_addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// A dry run: the port is chosen when the launch binds the listener.
    AtLaunch,
    Canary(u16),
    /// Every port of the host's loopback is allowed: nothing is left to be refused there, so
    /// the hook confirms the table only (said at launch).
    EveryPortAllowed,
    /// `AISB_SKIP_SELF_CHECK=1` (benchmarks; said at launch).
    Skipped,
}

impl Facts {
    /// The gate's URL with this session's token, as a client reaches it at `host`: 127.0.0.1 in
    /// the sandbox, the sandbox's loopback's address in a container of its own engine (`engine`).
    pub(crate) fn gate_url(&self, host: &str) -> String {
        format!("http://aisb:{}@{host}:{}", self.token, self.gate_port)
    }
    /// The variables that point clients at the gate reached at `host`: the `*_proxy` family in
    /// both cases (curl reads only lowercase `http_proxy`; others only uppercase), then Node's
    /// built-in fetch (Node 24 and later read the proxy variables only with it) and gRPC.
    pub(crate) fn gate_env(&self, host: &str, no_proxy: &str) -> Vec<(String, String)> {
        let url = self.gate_url(host);
        let mut out = Vec::new();
        for (name, value) in
            [("HTTP_PROXY", url.as_str()), ("HTTPS_PROXY", &url), ("ALL_PROXY", &url), ("NO_PROXY", no_proxy)]
        {
            out.push((name.to_string(), value.to_string()));
            out.push((name.to_ascii_lowercase(), value.to_string()));
        }
        out.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
        out.push(("grpc_proxy".into(), url));
        out
    }
    pub(crate) fn hooks_dir(&self) -> PathBuf {
        self.session_dir.join("hooks")
    }
    pub(crate) fn hook_file(&self) -> PathBuf {
        self.hooks_dir().join(HOOK_FILE)
    }
    pub(crate) fn check_file(&self) -> PathBuf {
        self.hooks_dir().join(CHECK_FILE)
    }
    /// The self-check hook's program, at one path on both sides: podman skips, without a word,
    /// a hook whose path does not exist on the host, and runs it at that path inside. On the
    /// host a link to the loader (or this program, when static); inside, the same file mounted.
    pub(crate) fn check_exe(&self) -> PathBuf {
        self.session_dir.join("self-check")
    }
    /// What `check_exe` is on the host.
    pub(crate) fn check_exe_target(&self) -> PathBuf {
        self.loader.clone().unwrap_or_else(|| self.self_exe.clone())
    }
    /// This session's review (upper layer, work dir, record) in review mode.
    pub(crate) fn review_dir(&self) -> PathBuf {
        crate::contract::review::dir(&self.state_dir, &self.session_id)
    }
    /// The session's root directory for `image = host` (see `root`).
    pub(crate) fn root_dir(&self) -> PathBuf {
        self.session_dir.join("root")
    }
    pub(crate) fn ruleset_file(&self) -> PathBuf {
        self.session_dir.join(RULESET_FILE)
    }
    pub(crate) fn live_file(&self) -> PathBuf {
        self.session_dir.join(LIVE_FILE)
    }
    pub(crate) fn env_file(&self) -> PathBuf {
        self.session_dir.join(ENV_FILE)
    }
    /// The gate's CA alone (`NODE_EXTRA_CA_CERTS` reads one extra file).
    pub(crate) fn gate_ca_file(&self) -> PathBuf {
        self.session_dir.join("gate-ca.pem")
    }
    /// The host's roots and the gate's CA, for everything else that reads a bundle.
    pub(crate) fn ca_bundle_file(&self) -> PathBuf {
        self.session_dir.join("ca-bundle.pem")
    }
    /// The inner engine's configuration (see `engine`), mounted read-only inside.
    pub(crate) fn engine_dir(&self) -> PathBuf {
        self.session_dir.join("engine")
    }
    /// The outer container's seccomp profile with `containers = on` (read by podman on the host).
    pub(crate) fn engine_seccomp_file(&self) -> PathBuf {
        self.session_dir.join("engine-seccomp.json")
    }
    /// The sandbox's /etc/ssh/ssh_config (see `podman::ssh_config`).
    pub(crate) fn ssh_config_file(&self) -> PathBuf {
        self.session_dir.join("ssh_config")
    }
    /// What every keeper of this runtime dir reports, beside the session directories.
    pub(crate) fn keeper_log(&self) -> PathBuf {
        self.runtime_dir.join("keeper.log")
    }
    /// The container's name (podman's `--name`).
    pub(crate) fn container_name(&self) -> String {
        container_name(&self.session_id)
    }
}

/// Where the user approved this project's config.
pub(crate) fn approved_config(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("approved-config")
}

/// The guard's record of one session.
pub(crate) fn guard_store(state_dir: &std::path::Path, session_id: &str) -> PathBuf {
    state_dir.join("guard").join(session_id)
}

/// The nft the hook and live changes run: `AISB_NFT` when set, else `nft` on PATH, else
/// /usr/sbin/nft.
pub(crate) fn nft_program(aisb_nft: Option<String>, on_path: impl FnOnce() -> Option<PathBuf>) -> PathBuf {
    aisb_nft.map(PathBuf::from).or_else(on_path).unwrap_or_else(|| PathBuf::from("/usr/sbin/nft"))
}

pub(crate) fn container_name(session_id: &str) -> String {
    format!("aisb-{session_id}")
}

/// A login token the gate holds, as the sandbox's copy of the login gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldGiven {
    pub(crate) store: PathBuf,
    pub(crate) field: Vec<String>,
    pub(crate) placeholder: String,
}
