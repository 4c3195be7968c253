//! `ai-sandbox gate status [--json] | logs [-f] [--json] | stop` (and the hidden `serve`).
//! The log is read straight from its file: the gate writes each decision before answering the
//! client, so everything decided before `gate logs` starts is already there.

use super::control::{self, Request};
use super::log::{Event, human};
use crate::cli::GateCmd;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::time::Duration;

pub fn run(cmd: &GateCmd) -> anyhow::Result<i32> {
    let dir = control::runtime_dir();
    match cmd {
        GateCmd::Serve { port_from, idle_exit, runtime_dir } => super::server::serve(
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
                println!("gate stopped; running sandboxes have no egress now");
                Ok(0)
            }
        },
        GateCmd::Logs { follow, json } => {
            let path = control::log_path(&dir);
            let file = match std::fs::File::open(&path) {
                Ok(f) => f,
                Err(_) => {
                    println!("no gate log yet ({})", path.display());
                    return Ok(0);
                }
            };
            let mut reader = BufReader::new(file);
            let mut line = String::new();
            loop {
                line.clear();
                let n = reader.read_line(&mut line)?;
                if n == 0 || !line.ends_with('\n') {
                    if !follow {
                        return Ok(0);
                    }
                    // Partial line: rewind to its start and wait for the rest.
                    reader.seek(SeekFrom::Current(-(n as i64)))?;
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
                if *json {
                    print!("{line}");
                } else {
                    match serde_json::from_str::<Event>(&line) {
                        Ok(e) => println!("{}", human(&e)),
                        Err(_) => print!("{line}"),
                    }
                }
            }
        }
    }
}
