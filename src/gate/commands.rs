//! `ai-sandbox gate status [--json] | logs [-f] [--json] | stop` (and the hidden `serve`).
//! The log is read straight from its file: the gate writes each decision before answering the
//! client, so everything decided before `gate logs` starts is already there.

use super::control::{self, Request};
use super::log::{Event, Follow, human};
use crate::cli::GateCmd;
use std::time::Duration;

pub fn run(cmd: &GateCmd) -> anyhow::Result<i32> {
    let dir = control::runtime_dir();
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
        GateCmd::Status { json } => match control::ask(&dir, &Request::Status)? {
            None if *json => {
                println!("{}", serde_json::json!({ "running": false }));
                Ok(1)
            }
            None => {
                println!("no gate is running (one starts with the first sandbox that needs it)");
                Ok(1)
            }
            Some(r) if *json => {
                let v = serde_json::json!({
                    "running": true, "pid": r.pid, "port": r.port, "sessions": r.sessions,
                });
                println!("{v}");
                Ok(0)
            }
            Some(r) => {
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
                }
                Ok(0)
            }
        },
        GateCmd::Stop => match control::ask(&dir, &Request::Stop)? {
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
