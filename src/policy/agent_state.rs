//! `state = AGENT | ~/PATH`: a login that follows the user from project to project, and nothing
//! else (ADR 0056).
//!
//! Logins follow the user: a login made or refreshed in one project's sandbox is the one the
//! next project's sandbox gets. Nothing else does: an agent's settings, hooks, memory files, MCP
//! server lists, plugins, history and transcripts stay in the project's own sandbox HOME, since
//! a hostile project could otherwise plant a hook that another project's agent runs, or read
//! another project's transcripts. So the per-user store holds login files only, filtered field
//! by field where a file mixes the login with settings (Claude Code's `.claude.json`), and it is
//! never mounted: the launcher copies the login into the sandbox HOME before a session and back
//! after it (see `launch::logins`).

use super::Collector;
use super::agents::KNOWN;
use crate::config::Config;
use crate::policy::keys::Name;
use std::path::{Path, PathBuf};

/// An agent whose login the sandbox carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentState {
    /// The store's name (`claude`, `codex`, or `home` for `~/` entries).
    pub(crate) name: String,
    /// The agent's directory relative to HOME (`.claude`; for `~/PATH`, the file's directory).
    pub(crate) dir: String,
    /// A variable the CLI reads to find its directory, and its value relative to HOME.
    pub(crate) var: Option<(&'static str, String)>,
    /// The login files (relative to `dir`), each with the fields that are the login.
    pub(crate) files: Vec<LoginFile>,
}

/// One file of a login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoginFile {
    /// Its name in the agent's directory (and in the store).
    pub(crate) name: String,
    /// The top-level JSON fields that are the login (None: the whole file is).
    pub(crate) fields: Option<&'static [&'static str]>,
}

impl AgentState {
    /// Where the store keeps this login's file `name`.
    pub(crate) fn store_file(&self, agents_dir: &Path, name: &str) -> PathBuf {
        match self.name.as_str() {
            "home" => agents_dir.join("home").join(&self.dir).join(name),
            agent => agents_dir.join(agent).join("login").join(name),
        }
    }
    /// Where versions before ADR 0056 kept it (the whole directory, mounted): read once, when
    /// the store has no login of its own yet.
    /// For `~/DIR/FILE`, the store of a former `state = ~/DIR` line (the presets had those).
    pub(crate) fn legacy_file(&self, agents_dir: &Path, name: &str) -> Option<PathBuf> {
        match self.name.as_str() {
            "home" if self.dir.is_empty() => None,
            "home" => Some(agents_dir.join(self.dir.replace('/', "_")).join(&self.dir).join(name)),
            agent => Some(agents_dir.join(agent).join(&self.dir).join(name)),
        }
    }
    /// The file relative to HOME.
    pub(crate) fn home_file(&self, name: &str) -> PathBuf {
        Path::new(&self.dir).join(name)
    }
}

pub(super) fn states(config: &Config, c: &mut Collector) -> Vec<AgentState> {
    let mut out: Vec<AgentState> = Vec::new();
    for (v, at) in config.all(Name::State) {
        let s = if let Some((name, dir, var, files)) = KNOWN.iter().find(|(n, ..)| *n == v) {
            AgentState {
                name: name.to_string(),
                dir: dir.to_string(),
                var: var.map(|k| (k, dir.to_string())),
                files: files
                    .iter()
                    .map(|(f, fields)| LoginFile { name: f.to_string(), fields: Some(fields) })
                    .collect(),
            }
        } else if let Some(rel) = v.strip_prefix("~/") {
            let bad = rel.is_empty()
                || rel.ends_with('/')
                || rel.split('/').any(|p| p.is_empty() || p == "." || p == "..")
                || rel.contains([':', ',']);
            if bad {
                c.bad(
                    at,
                    format!("`{v}` is not a file under HOME"),
                    "name the login file itself, e.g. `state = ~/.config/gh/hosts.yml` (one file per line)",
                );
                continue;
            }
            let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
            AgentState {
                name: "home".into(),
                dir: dir.to_string(),
                var: None,
                files: vec![LoginFile { name: name.to_string(), fields: None }],
            }
        } else {
            let names: Vec<&str> = KNOWN.iter().map(|(n, ..)| *n).collect();
            c.bad(
                at,
                format!("unknown agent state `{v}`"),
                format!(
                    "known agents: {}; or a login file under HOME, e.g. `state = ~/.config/gh/hosts.yml`",
                    names.join(", ")
                ),
            );
            continue;
        };
        // Two lines that carry one file: a `~/` line's copy (in clear) would overwrite the
        // placeholders of the login the gate holds, or the other way round.
        let files = |s: &AgentState| s.files.iter().map(|f| s.home_file(&f.name)).collect::<Vec<_>>();
        if let Some(other) = out.iter().find(|o| *o != &s && files(o).iter().any(|f| files(&s).contains(f))) {
            let file = files(&s).into_iter().find(|f| files(other).contains(f)).unwrap_or_default();
            c.bad(
                at,
                format!("`state = {v}` carries ~/{}, which another state line carries too", file.display()),
                "keep one of the two lines (`state = AGENT` for an agent whose login the gate holds)",
            );
            continue;
        }
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn where_each_login_file_lives() {
        let claude = AgentState { name: "claude".into(), dir: ".claude".into(), var: None, files: vec![] };
        let a = Path::new("/d/agents");
        assert_eq!(claude.store_file(a, ".claude.json"), Path::new("/d/agents/claude/login/.claude.json"));
        assert_eq!(
            claude.legacy_file(a, ".claude.json").unwrap(),
            Path::new("/d/agents/claude/.claude/.claude.json")
        );
        assert_eq!(claude.home_file(".claude.json"), Path::new(".claude/.claude.json"));
        let gh = AgentState { name: "home".into(), dir: ".config/gh".into(), var: None, files: vec![] };
        assert_eq!(gh.store_file(a, "hosts.yml"), Path::new("/d/agents/home/.config/gh/hosts.yml"));
        assert_eq!(
            gh.legacy_file(a, "hosts.yml").unwrap(),
            Path::new("/d/agents/.config_gh/.config/gh/hosts.yml")
        );
        let top = AgentState { name: "home".into(), dir: String::new(), var: None, files: vec![] };
        assert_eq!(top.legacy_file(a, ".netrc"), None);
        let gemini = AgentState { name: "gemini".into(), dir: ".gemini".into(), var: None, files: vec![] };
        let file = "oauth_creds.json";
        assert_eq!(gemini.store_file(a, file), Path::new("/d/agents/gemini/login/oauth_creds.json"));
    }
}
