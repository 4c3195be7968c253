//! Command-line definition (clap). Values stay raw strings here; `policy` validates them,
//! so a bad `--allow` is reported the same way as a bad config line.

pub mod app;
mod aws;
pub mod change;
pub mod doctor;
pub mod exec;
pub mod export;
mod facts;
pub mod image;
pub mod learn;
pub mod logs;
pub mod manpage;
pub(crate) mod prune;
pub mod review;
pub mod sessions;
pub mod setup;
pub mod watch;

use crate::policy::NetMode;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

pub(crate) const EXAMPLES: &str = "Examples:
  ai-sandbox                                   run `cmd` from .ai-sandbox/config, or a shell
  ai-sandbox -- npm test                       one command; its exit code is passed through
  ai-sandbox --allow 100.64.0.1:5432 -- psql   reach postgres on the host's 127.0.0.1:5432
  ai-sandbox --net none -- cargo test --offline
  ai-sandbox --publish 8000 -- npm run dev     serve on the host's 127.0.0.1:8000, policy kept
  ai-sandbox --dry-run                         print the podman command and the ruleset";

/// Environment variables ai-sandbox reads: shown by `--help` and in the man page.
pub(crate) const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "AISB_EXTRA_ARGS",
        "extra `podman run` arguments for this run, shell-split, after the config's `extra_args` (the same options are refused unless --net full)",
    ),
    ("AISB_NFT", "the nft program the hook loads the ruleset with (default: nft from PATH or /usr/sbin)"),
    (
        "AISB_SKIP_SELF_CHECK",
        "1: start without the self-check that proves the rules hold before the command runs (for benchmarks; said at every launch)",
    ),
    (
        "AISB_RUNTIME_DIR",
        "ai-sandbox's runtime directory: the gate's socket and log, session files (default: /run/user/UID/ai-sandbox when the login manager made /run/user/UID, else /tmp/ai-sandbox-UID; XDG_RUNTIME_DIR is not read, so every shell of a user finds the same gate)",
    ),
    ("AISB_GATE_IDLE_EXIT", "seconds a gate started now stays up without sessions (default 30)"),
    (
        "AISB_TIMINGS",
        "a file to which a launch appends when each of its phases ended (`PHASE NS`, CLOCK_MONOTONIC): bench/run's start-up breakdown",
    ),
    (
        "XDG_DATA_HOME",
        "where the per-project sandbox HOMEs and the agents' logins live (default ~/.local/share)",
    ),
    ("XDG_STATE_HOME", "where approvals and the file guard's records live (default ~/.local/state)"),
];

/// Files ai-sandbox reads or writes: for the man page.
pub(crate) const FILES: &[(&str, &str)] = &[
    (
        ".ai-sandbox/config",
        "the project's policy: what the sandbox may reach, what it runs (see config.example)",
    ),
    ("/run/user/UID/ai-sandbox/gate.sock", "the gate's control socket (0600, in a 0700 directory)"),
    ("/run/user/UID/ai-sandbox/gate.log", "the gate's decisions, one JSON object per line (`gate logs`)"),
    (
        "/run/user/UID/ai-sandbox/sessions/ID",
        "a running session's ruleset, hook, proxy env file and root directory skeleton (0700)",
    ),
    (
        "$XDG_DATA_HOME/ai-sandbox/homes/PROJECT-HASH",
        "the sandbox HOME of one project (never your real HOME)",
    ),
    (
        "$XDG_STATE_HOME/ai-sandbox/projects/PROJECT-HASH",
        "per project: the approved config, the guard's records of running sessions, the quarantine of restored files, review-mode sessions' changes (reviews/ID)",
    ),
    ("/run/user/UID/ai-sandbox/keeper.log", "what each session's keeper did after its launcher died"),
];

/// Exit statuses: for the man page.
pub const EXIT_STATUS: &[(&str, &str)] = &[
    ("N", "the sandboxed command's own exit status (128+SIGNAL if a signal ended it)"),
    (
        "125",
        "ai-sandbox refused or failed before the command ran: bad config or flags, no podman, a failed hook",
    ),
    ("126, 127", "the command cannot run: not executable (126), not found (127)"),
    ("1", "`gate status` when no gate runs"),
];

fn after_help() -> String {
    let mut s = format!("{EXAMPLES}\n\nEnvironment:\n");
    for (k, v) in ENVIRONMENT {
        s += &format!("  {k:<20} {v}\n");
    }
    s
}

#[derive(Debug, Parser)]
#[command(name = "ai-sandbox", version, about = "Run a coding agent (or any command) in a rootless podman sandbox with egress under your control", after_help = after_help(), args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub sub: Option<Sub>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// The flags that shape the policy (and so the ruleset): shared by a run and `rules`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PolicyArgs {
    /// Network mode: allow (allowlist, default), none (no interface), full (no policy).
    #[arg(long, value_enum)]
    pub(crate) net: Option<NetMode>,
    /// Allow an entry for this run only (host, *.suffix, IP[:port], CIDR[:port]); the config
    /// file is not changed.
    #[arg(long, value_name = "ENTRY", allow_hyphen_values = true)]
    pub(crate) allow: Vec<String>,
    /// Publish a container port on the host's 127.0.0.1 only: PORT or HOSTPORT:CONTAINERPORT.
    #[arg(long, value_name = "PORT[:CPORT]", allow_hyphen_values = true)]
    pub(crate) publish: Vec<String>,
    /// No gate: IP entries only, and DNS to the sandbox resolver is allowed.
    #[arg(long)]
    pub(crate) no_gate: bool,
    /// Project directory (default: nearest parent with .ai-sandbox/, else the git root, else cwd).
    #[arg(long, value_name = "DIR")]
    pub(crate) project: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub(crate) policy: PolicyArgs,
    /// Start an interactive shell instead of `cmd`.
    #[arg(long)]
    pub(crate) shell: bool,
    /// Let the sandbox use your ssh-agent (SSH_AUTH_SOCK) for git over SSH. It can then sign
    /// with every key the agent holds, as you, for as long as it runs: off unless given.
    #[arg(long)]
    pub(crate) ssh_agent: bool,
    /// `host` (the host's /usr, /etc, /opt read-only) or a local image name.
    #[arg(long, value_name = "IMAGE|host")]
    pub(crate) image: Option<String>,
    /// Set a variable in the sandbox: NAME=VALUE, or NAME alone to pass its value from your
    /// environment (for API keys: values go through a private file, never a command line).
    /// Overrides the config's `env` and `secret`.
    #[arg(short = 'e', long = "env", value_name = "NAME[=VALUE]")]
    pub(crate) env: Vec<String>,
    /// Review before it lands: the sandbox writes a copy-on-write layer over the project, never
    /// the project; afterwards `ai-sandbox diff` shows the change, `apply` promotes it and
    /// `discard` drops it (the config's `workspace = review`).
    #[arg(long)]
    pub(crate) review: bool,
    /// Give the sandbox its own rootless podman (DOCKER_HOST points at its Docker-compatible
    /// socket), for test suites that start containers; they stay under the same policy (the
    /// config's `containers = on`).
    #[arg(long)]
    pub(crate) containers: bool,
    /// Print the podman command and the ruleset; start nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The command to run in the sandbox.
    // Bytes, as the kernel passes them: a file name that is not UTF-8 reaches the command as is.
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<std::ffi::OsString>,
    /// A learning run (`ai-sandbox learn`): set by the subcommand, never a flag of a run.
    #[arg(skip)]
    pub(crate) learn: bool,
}

/// `ai-sandbox exec`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExecArgs {
    /// The running sandbox (`ai-sandbox ps`); needed when this project has more than one.
    #[arg(long, value_name = "ID")]
    pub(crate) session: Option<String>,
    /// Project directory (default: nearest parent with .ai-sandbox/, else the git root, else cwd).
    #[arg(long, value_name = "DIR")]
    pub(crate) project: Option<PathBuf>,
    /// The command to run in the sandbox (default: a shell).
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

/// `diff`, `apply` and `discard`: in which project the session's review is.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Which {
    /// Project directory (default: nearest parent with .ai-sandbox/, else the git root, else cwd).
    #[arg(long, value_name = "DIR")]
    pub(crate) project: Option<PathBuf>,
}

/// `ai-sandbox allow` and `ai-sandbox deny`: the same arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ChangeArgs {
    #[arg(required = true, value_name = "ITEM", allow_hyphen_values = true)]
    pub(crate) items: Vec<String>,
    /// Change the running sandboxes only; leave the config as it is.
    #[arg(long)]
    pub(crate) session_only: bool,
    /// Project directory (default: nearest parent with .ai-sandbox/, else the git root, else cwd).
    #[arg(long, value_name = "DIR")]
    pub(crate) project: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum ExportCmd {
    /// Kubernetes manifests for the approved config: the agent Pod, its NetworkPolicy, the gate
    /// (Deployment + Service + ConfigMap, cluster mode) and who may reach it (docs/kubernetes.md).
    Kube {
        #[command(flatten)]
        policy: PolicyArgs,
        /// The namespace of every object.
        #[arg(long, default_value = "ai-sandbox")]
        namespace: String,
        /// The agent's image (else the config's `image =`; `image = host` has no cluster meaning).
        #[arg(long)]
        image: Option<String>,
        /// The image holding this binary, for the gate (docs/kubernetes.md builds one).
        #[arg(long, default_value = concat!("ai-sandbox:", env!("CARGO_PKG_VERSION")))]
        gate_image: String,
        /// Also a CiliumNetworkPolicy limiting the gate's own egress to the allowed names.
        #[arg(long)]
        cilium: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum Sub {
    /// Print the config's policy in another system's terms.
    Export {
        #[command(subcommand)]
        cmd: ExportCmd,
    },
    /// Print the nftables ruleset for the current config.
    Rules {
        #[command(flatten)]
        policy: PolicyArgs,
        /// JSON, as the hook loads it.
        #[arg(long, conflicts_with = "nft")]
        json: bool,
        /// nft text (the default).
        #[arg(long)]
        nft: bool,
    },
    /// Refusals and decisions of your sandboxes, both layers: the gate's decisions (hostnames),
    /// then the direct connections the rules of each running sandbox refused, each refusal with
    /// the config line that would allow it.
    Logs {
        /// Only refusals.
        #[arg(long)]
        denied: bool,
        /// Only this session (see `ai-sandbox ps`).
        #[arg(long, value_name = "ID", conflicts_with = "all")]
        session: Option<String>,
        /// Every project's (default: the project of the working directory).
        #[arg(long)]
        all: bool,
        /// Keep printing the gate's new decisions (and new direct refusals, read every second).
        #[arg(short, long)]
        follow: bool,
        /// One JSON object per line (the same as `--format json`).
        #[arg(long, conflicts_with = "format")]
        json: bool,
        /// text, json, or ocsf: OCSF 1.3.0 events, HTTP Activity for a request the gate read
        /// (method and path) and Network Activity for the rest (docs/networking.md).
        #[arg(long, value_enum, default_value = "text")]
        format: crate::cli::logs::Format,
    },
    /// Show refusals live; with `ask = SECONDS` in a project's config, answer the requests the
    /// gate holds: o(nce), s(ession), a(lways: adds the line to the config), d(eny); q quits.
    Watch,
    /// Running sandboxes: session, launcher pid, age, mode, the gate's allowed/refused counts,
    /// project; below each, its budgets, its MCP tool calls by tool, and its `exec` commands.
    Ps {
        /// One JSON object per sandbox, in an array.
        #[arg(long)]
        json: bool,
    },
    /// Run a command (a shell by default) in this project's running sandbox, beside its command:
    /// the same network policy, refusals and logs, the same seccomp and no-new-privileges; its
    /// exit code is passed through.
    Exec(ExecArgs),
    /// A learning run: CMD (a command you trust: `npm ci`, the test suite) runs in the sandbox
    /// with every hostname it asks the gate for on the gate's ports relayed and recorded instead
    /// of refused (as tunnels: no TLS opened; IP addresses, other ports and deny lines refused as
    /// always); at the end it proposes the `allow =` lines, grouped by domain, and on a terminal
    /// asks line by line which to add. Nothing is added that you did not accept.
    Learn(RunArgs),
    /// What a review-mode session (`--review`, `workspace = review`) changed: each path added,
    /// modified, deleted or renamed, what is called out (paths the host runs or trusts, git's
    /// internals, links out of the project, set-id and new executable bits, large files) and
    /// conflicts with the project as it is now; then a patch per text file.
    Diff {
        /// The session (a prefix of its id; default: the project's only one waiting).
        #[arg(value_name = "SESSION")]
        session: Option<String>,
        /// Only the list, no patches.
        #[arg(long)]
        stat: bool,
        #[command(flatten)]
        which: Which,
    },
    /// Put a review-mode session's change into the project: all of it, or the PATHs named.
    /// Called-out items land only when named; if the host changed a path since the session
    /// started, nothing lands unless that path is named. Commits arrive as the branch
    /// ai-sandbox/SESSION (fetched; your HEAD, branches and index are not touched).
    Apply {
        /// [SESSION] [PATH...]: the session first when there are several.
        #[arg(value_name = "SESSION|PATH")]
        args: Vec<PathBuf>,
        /// The name of the branch the session's commits arrive as (default ai-sandbox/SESSION).
        #[arg(long, value_name = "NAME")]
        branch: Option<String>,
        #[command(flatten)]
        which: Which,
    },
    /// Drop a review-mode session's change (the project is as it was).
    Discard {
        #[arg(value_name = "SESSION")]
        session: Option<String>,
        #[command(flatten)]
        which: Which,
    },
    /// Allow ITEMs (config `allow =` spellings, `'rule = …'`, `'budget = HOST SIZE'`) in this
    /// project's running sandboxes at once, without a restart, and add them to
    /// .ai-sandbox/config (approved, if it was; a budget replaces its host's line).
    Allow(ChangeArgs),
    /// Deny ITEMs (config `deny =` spellings: exceptions that win over allow entries) in this
    /// project's running sandboxes at once, for new connections, and add them to the config.
    Deny(ChangeArgs),
    /// Remove the state ai-sandbox keeps for projects that no longer exist (their sandbox HOME,
    /// approved config, records and quarantine); lists it first, and asks on a terminal.
    Prune {
        /// Remove without asking.
        #[arg(long)]
        yes: bool,
    },
    /// Approve this project's .ai-sandbox/config as it is now (a launch applies only an approved
    /// config; on a terminal it shows the config or the diff and asks).
    Trust {
        /// Show the config or what changed since it was approved, and approve nothing.
        #[arg(long)]
        show: bool,
        /// Project directory (default: nearest parent with .ai-sandbox/, else the git root, else cwd).
        #[arg(long, value_name = "DIR")]
        project: Option<PathBuf>,
    },
    /// What the file guard found and restored after this project's sessions (protected files a
    /// sandbox changed, repositories it made), oldest first: each report is shown once when it
    /// happens; this shows them again.
    Report {
        /// Project directory (default: nearest parent with .ai-sandbox/, else the git root, else cwd).
        #[arg(long, value_name = "DIR")]
        project: Option<PathBuf>,
    },
    /// Inside a sandbox: a raw TCP stream to HOST:PORT through the egress gate (ssh's
    /// ProxyCommand; `allow = HOST:22` lets git over SSH through). GIT_SSH_COMMAND uses it.
    Connect { host: String, port: u16 },
    /// Images for the sandbox's own container engine (`containers = on`).
    Image {
        #[command(subcommand)]
        cmd: ImageCmd,
    },
    /// Agent logins shared by your sandboxes (`state = AGENT` in the config).
    Login {
        #[command(subcommand)]
        cmd: LoginCmd,
    },
    /// Check that this machine can run sandboxes; print the fix for each failed check.
    Doctor,
    /// Write .ai-sandbox/config from presets (claude, codex, gemini, opencode, aider, npm, pypi, cargo, github).
    Init {
        /// A preset to include; repeat for several, or give them as claude,npm.
        #[arg(long = "preset", value_name = "NAME", value_delimiter = ',',
              value_parser = clap::builder::PossibleValuesParser::new(crate::config::init::names()))]
        presets: Vec<String>,
        /// Overwrite an existing config.
        #[arg(long)]
        force: bool,
        /// Project directory (default: the current one).
        #[arg(long, value_name = "DIR")]
        project: Option<PathBuf>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
    /// The egress gate: status, logs, stop.
    Gate {
        #[command(subcommand)]
        cmd: crate::gate::commands::GateCmd,
    },
    /// A session's keeper (started by the launcher, not by hand): removes the container if the
    /// launcher dies.
    #[command(hide = true)]
    Keeper {
        #[arg(long)]
        session_dir: PathBuf,
        /// The guard's record of the session, verified after the container is gone.
        #[arg(long)]
        guard: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long)]
        podman: PathBuf,
    },
    /// Inside a sandbox with `containers = on`: start its container engine's socket, then run
    /// CMD (the launcher runs it, not by hand).
    #[command(hide = true)]
    Engine {
        #[arg(last = true, value_name = "CMD")]
        command: Vec<std::ffi::OsString>,
    },
    /// OCI createRuntime hook (run by podman, not by hand).
    #[command(hide = true)]
    Hook {
        #[arg(long)]
        nft: PathBuf,
        #[arg(long)]
        ruleset: PathBuf,
        /// List the table after loading it: when no self-check canary will prove the rules.
        #[arg(long)]
        confirm: bool,
    },
    /// OCI startContainer hook: proves the rules hold before the command runs (run by podman
    /// inside the sandbox, not by hand).
    #[command(hide = true)]
    SelfCheck {
        /// An address and port no rule allows, where a listener of the launcher's waits; the
        /// sandbox must be refused there.
        #[arg(long)]
        canary: Option<std::net::SocketAddrV4>,
        /// The gate's port on the sandbox's loopback; it must answer.
        #[arg(long)]
        gate_port: Option<u16>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImageCmd {
    /// Give one of your podman's images to this project's sandboxes: it is copied into the store
    /// of their own engine (`containers = on`), which sees no other image of yours and pulls only
    /// from registries the config allows.
    Share {
        /// The image, as `podman images` names it (e.g. docker.io/library/postgres:16).
        image: String,
        /// Project directory (default: nearest parent with .ai-sandbox/, else the git root, else cwd).
        #[arg(long, value_name = "DIR")]
        project: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum LoginCmd {
    /// Copy an existing login (claude, codex, gemini) from your real HOME into the store your
    /// sandboxes share; says which files first.
    Import {
        /// claude, codex or gemini
        agent: String,
    },
}
