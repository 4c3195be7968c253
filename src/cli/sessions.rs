//! The commands about sessions and what they left: `ps` (running sandboxes with the gate's
//! counters), `report` (the guard's reports again), `prune` (state of projects that are gone).

use super::app::locate;
use super::facts::{runtime_dir, xdg};
use crate::host::Host;
use std::path::{Path, PathBuf};

/// `ai-sandbox report`: the guard's reports for this project, as they were shown.
pub fn report_cmd(host: &mut dyn Host, project: Option<&Path>) -> anyhow::Result<i32> {
    let loc = locate(host, project)?;
    let log = crate::launch::guard::report_log(&super::facts::state_dir(host, &loc.project));
    match host.read_file(&log)? {
        Some(text) if !text.is_empty() => host.print(&text),
        _ => host.print(&format!(
            "no sandbox has changed a protected file of {} (nothing was restored)\n",
            crate::sys::quote::path(&loc.project)
        )),
    }
    Ok(0)
}

/// `ai-sandbox prune [--yes]` (see `prune`): never a project with a sandbox running.
pub fn prune_cmd(host: &mut dyn Host, yes: bool) -> anyhow::Result<i32> {
    let roots = crate::cli::prune::Roots {
        states: xdg(host, "XDG_STATE_HOME", ".local/state").join("ai-sandbox/projects"),
        homes: xdg(host, "XDG_DATA_HOME", ".local/share").join("ai-sandbox/homes"),
    };
    let running: Vec<PathBuf> = host
        .running(&runtime_dir(host))
        .into_iter()
        .filter_map(|r| r.record.map(|rec| rec.project))
        .collect();
    crate::cli::prune::run(host, &roots, &running, yes)
}

/// `ai-sandbox ps [--json]`: this user's running sandboxes, with the gate's counters.
pub fn ps_cmd(host: &mut dyn Host, json: bool) -> anyhow::Result<i32> {
    /// One running sandbox, as `ps` prints it (a table row, or an object of `--json`).
    #[derive(serde::Serialize)]
    struct Row {
        session: String,
        /// The launcher's (none for a review waiting: its session is over).
        pid: Option<i32>,
        age_seconds: u64,
        /// `-` for a launch whose record is not written yet (or from an older version); `learn`
        /// for a learning run (its hostnames are relayed and recorded, not refused).
        mode: &'static str,
        project: Option<String>,
        allowed: Option<u64>,
        refused: Option<u64>,
        /// Commands `ai-sandbox exec` runs in it.
        execs: Vec<crate::live::Exec>,
        /// Review mode: `running` (the session writes its layer), `waiting` (over; its change
        /// waits for `diff` / `apply` / `discard`); absent in direct mode.
        #[serde(skip_serializing_if = "Option::is_none")]
        review: Option<&'static str>,
        /// What it sent to each budgeted host, against the budget (`budget =` lines).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        budgets: Vec<crate::contract::session::BudgetUse>,
        /// MCP tool calls by host and tool, as its `mcp` rules decided them.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        mcp: Vec<crate::contract::session::McpUse>,
        /// Its `state` lines' logins, and who holds each (the gate, or the agent in clear).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        logins: Vec<String>,
    }
    let runtime = runtime_dir(host);
    let gate = host.gate_sessions(&runtime);
    let reviews = host.reviews(&xdg(host, "XDG_STATE_HOME", ".local/state").join("ai-sandbox/projects"));
    let mut rows: Vec<Row> = host
        .running(&runtime)
        .iter()
        .map(|r| {
            let counts = gate.iter().find(|g| g.session == r.session);
            Row {
                session: r.session.clone(),
                pid: Some(r.pid),
                age_seconds: r.age,
                mode: r
                    .record
                    .as_ref()
                    .map_or("-", |rec| if rec.policy.learn { "learn" } else { rec.net.name() }),
                project: r.record.as_ref().map(|rec| rec.project.display().to_string()),
                allowed: counts.map(|c| c.allowed),
                refused: counts.map(|c| c.denied),
                execs: r.execs.clone(),
                review: reviews.iter().any(|w| w.id() == r.session).then_some("running"),
                budgets: counts
                    .map(|c| c.budgets.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .chain(r.net_budgets.iter().cloned())
                    .collect(),
                mcp: counts.map(|c| c.mcp.clone()).unwrap_or_default(),
                logins: r.record.as_ref().map(|rec| rec.logins.clone()).unwrap_or_default(),
            }
        })
        .collect();
    let now = crate::launch::review::now_ns();
    rows.extend(reviews.iter().filter(|w| !w.running).map(|w| Row {
        session: w.id().to_string(),
        pid: None,
        age_seconds: now.saturating_sub(w.record.started_ns) / 1_000_000_000,
        mode: "review",
        project: Some(w.record.project.display().to_string()),
        allowed: None,
        refused: None,
        execs: Vec::new(),
        review: Some("waiting"),
        budgets: Vec::new(),
        mcp: Vec::new(),
        logins: Vec::new(),
    }));
    if json {
        host.print(&format!("{}\n", serde_json::to_string(&rows)?));
        return Ok(0);
    }
    let mut out = String::new();
    if rows.iter().all(|r| r.review == Some("waiting")) {
        out += "no sandbox is running\n";
    } else {
        out += &format!(
            "{:<14} {:>8} {:>7} {:<6} {:>8} {:>8}  PROJECT\n",
            "SESSION", "PID", "AGE", "MODE", "ALLOWED", "REFUSED"
        );
    }
    let n = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for r in &rows {
        if r.review == Some("waiting") {
            continue;
        }
        out += &format!(
            "{:<14} {:>8} {:>7} {:<6} {:>8} {:>8}  {}\n",
            r.session,
            r.pid.map_or("-".to_string(), |p| p.to_string()),
            crate::live::age(r.age_seconds),
            // A review session writes its own layer: that is its mode, whatever its network's.
            if r.review.is_some() { "review" } else { r.mode },
            n(r.allowed),
            n(r.refused),
            crate::sys::quote::text(r.project.as_deref().unwrap_or("-")),
        );
        for b in &r.budgets {
            out += &format!("  budget {}: sent {}\n", crate::sys::quote::text(&b.key), b.against());
        }
        for m in &r.mcp {
            out += &format!("  {}\n", m.line());
        }
        for l in &r.logins {
            out += &format!("  login {}\n", crate::sys::quote::text(l));
        }
        for x in &r.execs {
            out += &format!(
                "  exec {:>12} {:>7}  {}\n",
                x.pid,
                crate::live::age(x.age),
                crate::sys::quote::text(&x.command.join(" "))
            );
        }
    }
    let waiting: Vec<&Row> = rows.iter().filter(|r| r.review == Some("waiting")).collect();
    if !waiting.is_empty() {
        out += "waiting for review (ai-sandbox diff / apply / discard SESSION, in the project):\n";
        for r in waiting {
            out += &format!(
                "{:<14} {:>8} {:>7} {:<6} {:>8} {:>8}  {}\n",
                r.session,
                "-",
                crate::live::age(r.age_seconds),
                r.mode,
                "-",
                "-",
                crate::sys::quote::text(r.project.as_deref().unwrap_or("-")),
            );
        }
    }
    host.print(&out);
    Ok(0)
}
