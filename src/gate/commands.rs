//! `ai-sandbox gate status [--json] | logs [-f] [--json] | stop` (and the hidden `serve`).
//! The log is read straight from its file: the gate writes each decision before answering the
//! client, so everything decided before `gate logs` starts is already there.

use super::control::{self, Request};
use super::log::{Event, Follow, human};
use clap::Subcommand;
use std::path::PathBuf;
use std::time::Duration;

pub fn run(cmd: &GateCmd) -> anyhow::Result<i32> {
    let dir = crate::sys::runtime::runtime_dir();
    match cmd {
        GateCmd::Serve { listen: Some(addr), policy: Some(policy), drain, ca, .. } => {
            super::cluster::serve(*addr, policy, Duration::from_secs(*drain), ca.as_deref())
        }
        GateCmd::Ca { dir } => {
            super::cluster::make_ca(dir)?;
            println!(
                "a CA for a cluster-mode gate: {}/ca.pem (give it to the agent: a ConfigMap) and {}/ca.key \
                 (the gate's only: a Secret); docs/kubernetes.md",
                dir.display(),
                dir.display()
            );
            Ok(0)
        }
        GateCmd::Serve { port_from, idle_exit, runtime_dir, .. } => super::server::serve(
            runtime_dir.clone().unwrap_or(dir),
            *port_from,
            Duration::from_secs(*idle_exit),
        ),
        GateCmd::Status { json } => match control::call(&dir, &Request::Status)? {
            None if *json => {
                println!("{}", serde_json::json!({ "running": false }));
                Ok(1)
            }
            None => {
                println!("no gate is running (one starts with the first sandbox that needs it)");
                Ok(1)
            }
            Some(r) if *json => {
                let r = r.as_status();
                let v = serde_json::json!({
                    "running": true, "pid": r.pid, "port": r.port, "sessions": r.sessions,
                });
                println!("{v}");
                Ok(0)
            }
            Some(r) => {
                let r = r.as_status();
                println!(
                    "gate pid {} listening on 127.0.0.1:{}; {} session(s)",
                    r.pid,
                    r.port,
                    r.sessions.len()
                );
                for s in r.sessions {
                    println!(
                        "  session {}  project {}  since {}  allowed {}  denied {}  active {}  up {} B  down {} B",
                        s.session,
                        s.project,
                        s.started,
                        s.allowed,
                        s.denied,
                        s.active,
                        s.bytes_up,
                        s.bytes_down
                    );
                    for b in &s.budgets {
                        println!("    budget {}: sent {}", crate::sys::quote::text(&b.key), b.against());
                    }
                    for m in &s.mcp {
                        println!("    {}", m.line());
                    }
                }
                Ok(0)
            }
        },
        GateCmd::Stop => match control::call(&dir, &Request::Stop)? {
            None => {
                println!("no gate is running");
                Ok(0)
            }
            Some(_) => {
                println!(
                    "gate stopped; running sandboxes reach no hostname now (their IP entries and allowed host ports still work: those never go through the gate)"
                );
                Ok(0)
            }
        },
        GateCmd::Logs { follow, json } => {
            let path = control::log_path(&dir);
            let Ok(mut log) = Follow::open(&path) else {
                println!("no gate log yet ({})", path.display());
                return Ok(0);
            };
            loop {
                let Some(line) = log.next_line()? else {
                    if !follow {
                        return Ok(0);
                    }
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                };
                if *json {
                    print!("{line}");
                } else {
                    match serde_json::from_str::<Event>(&line) {
                        // What the sandbox named (a host, a path) is escaped, never raw.
                        Ok(e) => println!("{}", crate::sys::quote::text(&human(&e))),
                        Err(_) => println!("{}", crate::sys::quote::text(line.trim_end_matches('\n'))),
                    }
                }
            }
        }
    }
}

/// `ai-sandbox gate …`: its arguments are the gate's own, so they live beside what runs them.
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
    /// Run the gate. Started by ai-sandbox itself on this machine; with --listen and --policy,
    /// the cluster mode: the sessions of a policy file, JSON log lines on stdout, SIGTERM
    /// drains (docs/kubernetes.md).
    Serve {
        #[arg(long, default_value_t = crate::policy::DEFAULT_GATE_PORT)]
        port_from: u16,
        /// Exit after this many seconds without sessions.
        #[arg(long, env = "AISB_GATE_IDLE_EXIT", default_value_t = 30)]
        idle_exit: u64,
        /// The runtime directory to serve (the launcher passes the one it registers in).
        #[arg(long)]
        runtime_dir: Option<PathBuf>,
        /// Cluster mode: listen here (ADDR:PORT) for the sessions of --policy.
        #[arg(long, requires = "policy", conflicts_with_all = ["runtime_dir"])]
        listen: Option<std::net::SocketAddr>,
        /// Cluster mode: the policy file (`ai-sandbox export kube` writes it into a ConfigMap).
        #[arg(long, requires = "listen")]
        policy: Option<PathBuf>,
        /// Cluster mode: on SIGTERM, how long open connections may finish before the gate exits.
        #[arg(long, default_value_t = 30)]
        drain: u64,
        /// Cluster mode: the CA (DIR/ca.pem, DIR/ca.key) for hosts that bound secrets go to.
        #[arg(long, requires = "listen")]
        ca: Option<PathBuf>,
    },
    /// Make a CA for a cluster-mode gate's bound secrets: DIR/ca.pem (for the agent's Pod) and
    /// DIR/ca.key (mode 0600, for the gate's Pod only). Never overwrites.
    Ca { dir: PathBuf },
}
