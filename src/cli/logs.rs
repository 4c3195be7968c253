//! `ai-sandbox logs [--denied] [--session ID] [-f] [--json | --format ocsf]`: what was refused
//! (and, without `--denied`, allowed), at both layers, each refusal with the config line that
//! would allow it; as text, JSON lines, or OCSF events (`gate::ocsf`).
//! The gate's decisions come from its log (written before each answer); the rules' refusals of
//! direct connections from each running sandbox's `refused_*` sets, read from outside (they
//! hold where, not when: they are listed after the gate's decisions, and only while the sandbox
//! runs).

use crate::gate::log::{Decision, Event, Follow, human};
use crate::live::Direct;
use std::collections::HashSet;
use std::time::Duration;

/// How `logs` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
    /// OCSF 1.3.0 events (Network Activity, HTTP Activity).
    Ocsf,
}

/// One gate decision as `logs` prints it: the human line, and for a refusal its fix.
fn gate_line(e: &Event, format: Format) -> String {
    match format {
        Format::Json => {
            let mut v = serde_json::to_value(e).unwrap_or_default();
            v["layer"] = "gate".into();
            return v.to_string();
        }
        Format::Ocsf => return crate::gate::ocsf::event(e).to_string(),
        Format::Text => {}
    }
    let fix = e.fix();
    if e.decision.refused() && !fix.is_empty() { format!("{}  → {fix}", human(e)) } else { human(e) }
}

fn direct_line(session: &str, d: &Direct, config_path: &str, format: Format) -> String {
    match format {
        Format::Json => {
            return serde_json::json!({
                "layer": "rules", "session": session, "proto": d.proto, "host": d.addr.to_string(),
                "port": d.port, "decision": "deny", "fix": d.fix(config_path),
            })
            .to_string();
        }
        Format::Ocsf => {
            // The rules record where, not when: the time is when it was read.
            let e = Event {
                time: crate::gate::log::now(),
                session: session.to_string(),
                project: String::new(),
                method: d.proto.to_string(),
                host: d.addr.to_string(),
                port: d.port,
                decision: Decision::Deny,
                status: 0,
                reason: "a direct connection the sandbox's nftables rules refused".into(),
                hint: d.fix(config_path),
                allow: None,
                path: None,
            };
            return crate::gate::ocsf::event(&e).to_string();
        }
        Format::Text => {}
    }
    format!("rules deny session={session} {} {}  → {}", d.proto, d.dest(), d.fix(config_path))
}

/// Which decisions `logs` shows: one session, one project's (the default: the project of the
/// working directory), or every project's (`--all`).
pub enum Scope {
    Session(String),
    Project(std::path::PathBuf),
    All,
}

impl Scope {
    fn wants(&self, session: &str, project: &str) -> bool {
        match self {
            Scope::Session(s) => s == session,
            Scope::Project(p) => std::path::Path::new(project) == p,
            Scope::All => true,
        }
    }
}

/// The direct refusals of running sandboxes not printed yet.
fn new_direct(
    runtime: &std::path::Path,
    scope: &Scope,
    seen: &mut HashSet<String>,
    format: Format,
) -> Vec<String> {
    let mut lines = Vec::new();
    for r in crate::live::apply::running(runtime) {
        let Some(rec) = &r.record else { continue };
        if !scope.wants(&r.session, &rec.project.to_string_lossy())
            || rec.net != crate::policy::NetMode::Allow
        {
            continue;
        }
        let Some(dir) = r.path.parent() else { continue };
        for d in crate::live::apply::refused(dir).unwrap_or_default() {
            if seen.insert(format!("{} {} {}", r.session, d.proto, d.dest())) {
                lines.push((r.session.clone(), d, rec.policy.config_path.clone()));
            }
        }
    }
    lines.into_iter().map(|(s, d, c)| direct_line(&s, &d, &c, format)).collect()
}

pub fn run(denied: bool, scope: &Scope, follow: bool, format: Format) -> anyhow::Result<i32> {
    let runtime = crate::gate::control::runtime_dir();
    let mut known = false;
    let path = crate::gate::control::log_path(&runtime);
    let mut log = Follow::open(&path).ok();
    let mut seen = HashSet::new();
    loop {
        while let Some(line) = log.as_mut().map(Follow::next_line).transpose()?.flatten() {
            let Ok(e) = serde_json::from_str::<Event>(&line) else { continue };
            if scope.wants(&e.session, &e.project) {
                known = true;
                if !denied || e.decision.refused() {
                    println!("{}", shown(gate_line(&e, format), format));
                }
            }
        }
        for l in new_direct(&runtime, scope, &mut seen, format) {
            println!("{}", shown(l, format));
        }
        if let Scope::Session(s) = scope
            && !known
            && !crate::live::apply::running(&runtime).iter().any(|r| r.session == *s)
        {
            return Err(crate::error::hinted(
                format!("no session {s} in the gate's log or among the running sandboxes"),
                "`ai-sandbox ps` lists the running ones; `ai-sandbox logs --all` shows every session's decisions",
            )
            .into());
        }
        if !follow {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_secs(1));
        if log.is_none() {
            log = Follow::open(&path).ok();
        }
    }
}

/// A line as it is printed: in text, what the sandbox named (a host, a method, a path) is
/// escaped (see `sys::quote`); JSON escapes control characters itself.
fn shown(line: String, format: Format) -> String {
    match format {
        Format::Text => crate::sys::quote::text(&line),
        Format::Json | Format::Ocsf => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_printed_with_its_fix_at_both_layers() {
        let e = Event {
            time: "2026-11-29T16:30:00Z".into(),
            session: "s1".into(),
            project: "/p".into(),
            method: "GET".into(),
            host: "later.test".into(),
            port: 80,
            decision: Decision::Deny,
            status: 403,
            reason: "later.test:80 is not in the allowlist".into(),
            hint: "blocked by ai-sandbox: add \"allow = later.test\" to /p/c".into(),
            allow: Some("later.test".into()),
            path: None,
        };
        assert!(
            gate_line(&e, Format::Text).ends_with("  → add \"allow = later.test\" to /p/c"),
            "{}",
            gate_line(&e, Format::Text)
        );
        let v: serde_json::Value = serde_json::from_str(&gate_line(&e, Format::Json)).unwrap();
        assert_eq!(v["layer"], "gate");
        let allowed = Event { decision: Decision::Allow, hint: String::new(), ..e };
        assert!(!gate_line(&allowed, Format::Text).contains('→'));
        let d = Direct {
            proto: crate::live::Proto::Tcp,
            addr: "198.51.100.6".parse().unwrap(),
            port: 7000,
            denied_by: None,
        };
        assert_eq!(
            direct_line("s1", &d, "/p/c", Format::Text),
            "rules deny session=s1 tcp 198.51.100.6:7000  → add \"allow = 198.51.100.6:7000\" to /p/c"
        );
        let v: serde_json::Value =
            serde_json::from_str(&direct_line("s1", &d, "/p/c", Format::Json)).unwrap();
        assert_eq!((v["layer"].as_str(), v["port"].as_u64()), (Some("rules"), Some(7000)));
    }
}
