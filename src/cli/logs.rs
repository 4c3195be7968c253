//! `ai-sandbox logs [--denied] [--session ID] [-f] [--json | --format ocsf]`: what was refused
//! (and, without `--denied`, allowed), at both layers, each refusal with the config line that
//! would allow it; as text, JSON lines, or OCSF events (`gate::ocsf`).
//! The gate's decisions come from its log (written before each answer). The rules' refusals of
//! direct connections are in that log too (the launcher hands them to the gate as it reads them,
//! layer `rules`), and, for a running sandbox, are also read from its `refused_*` sets from
//! outside (they hold where, not when), so a refusal the launcher has not handed over yet, or
//! one of a sandbox without the gate, is listed as well; each is said once.

use crate::gate::log::{Event, Follow, Layer, human};
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
            v["layer"] = e.layer.as_str().into();
            return v.to_string();
        }
        Format::Ocsf => return crate::gate::ocsf::event(e).to_string(),
        Format::Text => {}
    }
    let fix = e.fix();
    if e.layer == Layer::Rules {
        // A direct connection the rules refused (`direct_line` prints one read live the same way),
        // with its time as the gate's lines have theirs (when it was read, for a live one).
        return format!(
            "{} rules deny session={} {} {}:{}  → {fix}",
            e.time, e.session, e.method, e.host, e.port
        );
    }
    if e.decision.refused() && !fix.is_empty() { format!("{}  → {fix}", human(e)) } else { human(e) }
}

fn direct_line(session: &str, d: &Direct, config_path: &str, format: Format) -> String {
    match format {
        Format::Json => serde_json::json!({
            "layer": "rules", "session": session, "proto": d.proto, "host": d.addr.to_string(),
            "port": d.port, "decision": "deny", "fix": d.fix(config_path),
        })
        .to_string(),
        // The rules record where, not when: the time is when it was read. Printed as the same
        // refusal is once the launcher has handed it to the gate.
        Format::Ocsf | Format::Text => {
            gate_line(&Event::direct(d, session, "", config_path, crate::gate::log::now()), format)
        }
    }
}

/// One direct refusal of one session (the rules record each destination once).
fn direct_key(session: &str, proto: &str, dest: &str) -> String {
    format!("{session} {proto} {dest}")
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
            if seen.insert(direct_key(&r.session, &d.proto.to_string(), &d.dest())) {
                lines.push((r.session.clone(), d, rec.policy.config_path.clone()));
            }
        }
    }
    lines.into_iter().map(|(s, d, c)| direct_line(&s, &d, &c, format)).collect()
}

/// A session named by the start of its id: the whole id, among the sessions of the gate's log
/// and the running sandboxes (a start that two share is refused, with both).
fn whole_id(runtime: &std::path::Path, scope: &Scope) -> anyhow::Result<Option<Scope>> {
    let Scope::Session(given) = scope else { return Ok(None) };
    let text = std::fs::read_to_string(crate::gate::control::log_path(runtime)).unwrap_or_default();
    let mut ids: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Event>(l).ok())
        .map(|e| e.session)
        .filter(|s| s.starts_with(given.as_str()))
        .collect();
    ids.extend(crate::live::apply::running(runtime).into_iter().map(|r| r.session));
    match crate::sys::ids::named(ids.iter().map(String::as_str), given) {
        crate::sys::ids::Named::One(one) => Ok(Some(Scope::Session(one.to_string()))),
        crate::sys::ids::Named::None => Ok(None),
        crate::sys::ids::Named::Several(all) => Err(crate::error::hinted(
            format!("{given} starts the ids of {} sessions ({})", all.len(), all.join(", ")),
            "pass more of the id",
        )
        .into()),
    }
}

pub fn run(denied: bool, scope: &Scope, follow: bool, format: Format) -> anyhow::Result<i32> {
    let runtime = crate::sys::runtime::runtime_dir();
    let whole = whole_id(&runtime, scope)?;
    let scope = whole.as_ref().unwrap_or(scope);
    let mut known = false;
    let path = crate::gate::control::log_path(&runtime);
    let mut log = Follow::open(&path).ok();
    let mut seen = HashSet::new();
    loop {
        while let Some(line) = log.as_mut().map(Follow::next_line).transpose()?.flatten() {
            let Ok(e) = serde_json::from_str::<Event>(&line) else { continue };
            // A direct refusal the launcher handed to the gate, already read from the running
            // sandbox by this command (or the other way round): said once.
            if e.layer == Layer::Rules
                && !seen.insert(direct_key(&e.session, &e.method, &format!("{}:{}", e.host, e.port)))
            {
                continue;
            }
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
    use crate::gate::log::Decision;

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
            layer: Layer::Gate,
            learned: false,
        };
        assert!(
            gate_line(&e, Format::Text).ends_with("  → add \"allow = later.test\" to /p/c"),
            "{}",
            gate_line(&e, Format::Text)
        );
        let v: serde_json::Value = serde_json::from_str(&gate_line(&e, Format::Json)).unwrap();
        assert_eq!(v["layer"], "gate");
        let allowed = Event { decision: Decision::Allow, hint: String::new(), ..e.clone() };
        assert!(!gate_line(&allowed, Format::Text).contains('→'));
        let d = Direct {
            proto: crate::live::Proto::Tcp,
            addr: "198.51.100.6".parse().unwrap(),
            port: 7000,
            denied_by: None,
            over_budget: None,
        };
        let live = direct_line("s1", &d, "/p/c", Format::Text);
        let (time, rest) = live.split_once(' ').unwrap();
        assert_eq!(
            rest,
            "rules deny session=s1 tcp 198.51.100.6:7000  → add \"allow = 198.51.100.6:7000\" to /p/c"
        );
        assert!(
            time.len() == 20 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
            "a time, as the gate's lines have: {live}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&direct_line("s1", &d, "/p/c", Format::Json)).unwrap();
        assert_eq!((v["layer"].as_str(), v["port"].as_u64()), (Some("rules"), Some(7000)));
        // The same refusal handed to the gate by the launcher and read back from its log: the
        // same line, the same layer, and the same key as the one read from the sandbox.
        let logged = Event::direct(&d, "s1", "/p", "/p/c", "2026-12-02T10:00:00Z".into());
        let same = |l: String| l.split_once(' ').map(|(_, r)| r.to_string()).unwrap_or_default();
        assert_eq!(same(gate_line(&logged, Format::Text)), same(direct_line("s1", &d, "/p/c", Format::Text)));
        assert!(gate_line(&logged, Format::Text).starts_with("2026-12-02T10:00:00Z rules deny"));
        let v: serde_json::Value = serde_json::from_str(&gate_line(&logged, Format::Json)).unwrap();
        assert_eq!((v["layer"].as_str(), v["allow"].as_str()), (Some("rules"), Some("198.51.100.6:7000")));
        assert_eq!(
            direct_key("s1", &logged.method, &format!("{}:{}", logged.host, logged.port)),
            direct_key("s1", &d.proto.to_string(), &d.dest())
        );
        // A line of the gate's own has no layer field (lines of older versions neither).
        assert!(!serde_json::to_string(&e).unwrap().contains("layer"));
        let back: Event = serde_json::from_str(&serde_json::to_string(&logged).unwrap()).unwrap();
        assert_eq!(back, logged);
    }
}
