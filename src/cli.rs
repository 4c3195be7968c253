//! Command-line definition (clap). Values stay raw strings here; `policy` validates them,
//! so a bad `--allow` is reported the same way as a bad config line.

use crate::policy::NetMode;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

const EXAMPLES: &str = "Examples:
  ai-sandbox                                   run `cmd` from .ai-sandbox/config, or a shell
  ai-sandbox -- npm test                       one command; its exit code is passed through
  ai-sandbox --allow 100.64.0.1:5432 -- psql   reach postgres on the host's 127.0.0.1:5432
  ai-sandbox --net none -- cargo test --offline
  ai-sandbox --publish 8000 -- npm run dev     serve on the host's 127.0.0.1:8000, policy kept
  ai-sandbox --dry-run                         print the podman command and the ruleset";

#[derive(Debug, Parser)]
#[command(name = "ai-sandbox", version, about = "Run a coding agent (or any command) in a rootless podman sandbox with egress under your control", after_help = EXAMPLES, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub sub: Option<Sub>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    /// Network mode: allow (allowlist, default), none (no interface), full (no policy).
    #[arg(long, value_enum)]
    pub net: Option<NetMode>,
    /// Add an allow entry (host, *.suffix, IP[:port], CIDR[:port]); adds to the config.
    #[arg(long, value_name = "ENTRY")]
    pub allow: Vec<String>,
    /// Publish a container port on the host's 127.0.0.1 only: PORT or HOSTPORT:CONTAINERPORT.
    #[arg(long, value_name = "PORT[:CPORT]")]
    pub publish: Vec<String>,
    /// No gate: IP entries only, and DNS to the sandbox resolver is allowed.
    #[arg(long)]
    pub no_gate: bool,
    /// Start an interactive shell instead of `cmd`.
    #[arg(long)]
    pub shell: bool,
    /// `host` (the host's /usr, /etc, /opt read-only) or a local image name.
    #[arg(long, value_name = "IMAGE|host")]
    pub image: Option<String>,
    /// Project directory (default: nearest parent with .ai-sandbox/, else the git root, else cwd).
    #[arg(long, value_name = "DIR")]
    pub project: Option<PathBuf>,
    /// Set an environment variable in the sandbox (overrides the config's `env`).
    #[arg(short = 'e', long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Print the podman command and the ruleset; start nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The command to run in the sandbox.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum Sub {
    /// Print the nftables ruleset for the current config.
    Rules {
        #[command(flatten)]
        run: RunArgs,
        /// JSON, as the hook loads it.
        #[arg(long, conflicts_with = "nft")]
        json: bool,
        /// nft text (the default).
        #[arg(long)]
        nft: bool,
    },
    /// Check that this machine can run sandboxes; print the fix for each failed check.
    Doctor,
    /// Write .ai-sandbox/config from presets (claude, codex, aider, npm, pypi, cargo, github).
    Init {
        /// A preset to include; repeat for several.
        #[arg(long = "preset", value_name = "NAME")]
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
        cmd: GateCmd,
    },
    /// A session's keeper (started by the launcher, not by hand): removes the container if the
    /// launcher dies.
    #[command(hide = true)]
    Keeper {
        #[arg(long)]
        session_dir: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long)]
        podman: PathBuf,
    },
    /// OCI createRuntime hook (run by podman, not by hand).
    #[command(hide = true)]
    Hook {
        #[arg(long)]
        nft: PathBuf,
        #[arg(long)]
        ruleset: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum GateCmd {
    /// The running gate: port, sessions, per-session counters.
    Status {
        /// One JSON object (pid, port, sessions with their counters).
        #[arg(long)]
        json: bool,
    },
    /// Every decision the gate made.
    Logs {
        /// Keep printing new decisions.
        #[arg(short, long)]
        follow: bool,
        /// Raw JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Stop the gate (running sandboxes lose egress: fail closed).
    Stop,
    /// Run the gate (started by ai-sandbox itself).
    #[command(hide = true)]
    Serve {
        #[arg(long, default_value_t = crate::policy::DEFAULT_GATE_PORT)]
        port_from: u16,
        /// Exit after this many seconds without sessions.
        #[arg(long, env = "AISB_GATE_IDLE_EXIT", default_value_t = 30)]
        idle_exit: u64,
    },
}
