//! `state = AGENT | ~/PATH`: an agent's login and settings, kept in a per-user directory that
//! only sandboxes see (never the real HOME) and shared by all of this user's sandboxes, so a
//! login made in one project works in the next. Known agents name their directory and the
//! variable that points the CLI at it.

use super::Collector;
use crate::config::Config;
use std::path::{Path, PathBuf};

/// A directory under the sandbox HOME backed by the shared agent store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentState {
    /// The store's name (`claude`, `codex`, or the path for `~/` entries).
    pub(crate) name: String,
    /// The directory relative to HOME (`.claude`).
    pub(crate) dir: String,
    /// A variable the CLI reads to find it, and its value relative to HOME.
    pub(crate) var: Option<(&'static str, String)>,
}

impl AgentState {
    /// Its directory in the shared store.
    pub(crate) fn store(&self, agents_dir: &Path) -> PathBuf {
        store_path(agents_dir, &self.name, &self.dir)
    }
}

/// Where an agent's state lives in the store: `AGENTS_DIR/NAME/DIR`.
pub(crate) fn store_path(agents_dir: &Path, name: &str, dir: &str) -> PathBuf {
    agents_dir.join(name).join(dir)
}

/// Known agents: (name, directory under HOME, variable that points the CLI at it). Claude Code
/// keeps `.claude.json` in CLAUDE_CONFIG_DIR when set, so one directory holds its whole login.
pub(crate) const KNOWN: &[(&str, &str, Option<&str>)] =
    &[("claude", ".claude", Some("CLAUDE_CONFIG_DIR")), ("codex", ".codex", Some("CODEX_HOME"))];

/// The files of an existing login in the real HOME, and where each goes in the agent's store
/// (both relative: to HOME, and to the store's directory). Claude Code's `~/.claude.json` lives
/// inside its config directory when CLAUDE_CONFIG_DIR is set.
pub(crate) fn login_files(agent: &str) -> Option<&'static [(&'static str, &'static str)]> {
    match agent {
        "claude" => {
            Some(&[(".claude/.credentials.json", ".credentials.json"), (".claude.json", ".claude.json")])
        }
        "codex" => Some(&[(".codex/auth.json", "auth.json"), (".codex/config.toml", "config.toml")]),
        _ => None,
    }
}

pub(super) fn states(config: &Config, c: &mut Collector) -> Vec<AgentState> {
    let mut out: Vec<AgentState> = Vec::new();
    for (v, at) in config.all("state") {
        let s = if let Some((name, dir, var)) = KNOWN.iter().find(|(n, _, _)| *n == v) {
            AgentState {
                name: name.to_string(),
                dir: dir.to_string(),
                var: var.map(|k| (k, dir.to_string())),
            }
        } else if let Some(rel) = v.strip_prefix("~/") {
            let rel = rel.trim_end_matches('/');
            if rel.is_empty()
                || rel.split('/').any(|p| p.is_empty() || p == "." || p == "..")
                || rel.contains([':', ','])
            {
                c.bad(at, format!("`{v}` is not a directory under HOME"), "write `state = ~/.config/tool`");
                continue;
            }
            AgentState { name: rel.replace('/', "_"), dir: rel.to_string(), var: None }
        } else {
            let names: Vec<&str> = KNOWN.iter().map(|(n, _, _)| *n).collect();
            c.bad(
                at,
                format!("unknown agent state `{v}`"),
                format!(
                    "known agents: {}; or a directory under HOME, e.g. `state = ~/.config/tool`",
                    names.join(", ")
                ),
            );
            continue;
        };
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}
