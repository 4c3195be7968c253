//! What the file guard protects and what it found before a launch: facts the plan turns into
//! read-only mounts, and the guard (`launch::guard`, which reads and writes files) checks after
//! the session. Pure data and one pure function, here so that the plan needs nothing above it.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Paths the host runs or trusts without showing them in a diff, relative to the project.
pub(crate) const DEFAULT_PROTECTED: &[&str] = &[
    ".ai-sandbox",
    // git: hooks and config run code on the host's next git command; commondir would redirect both
    ".git/hooks",
    ".git/config",
    ".git/config.worktree",
    ".git/commondir",
    ".git/info/attributes",
    ".gitmodules",
    // editors and IDEs: tasks, launch configs, settings that run tools
    ".vscode",
    ".idea",
    ".fleet",
    ".zed",
    ".devcontainer",
    // agents: settings with hooks, MCP servers
    ".claude",
    ".mcp.json",
    ".cursor",
    ".codex",
    ".gemini",
    ".continue",
    ".windsurf",
    ".aider.conf.yml",
    // shells and version managers that run what a directory says
    ".envrc",
    ".mise.toml",
    "mise.toml",
    // git hook managers
    ".husky",
    ".pre-commit-config.yaml",
    "lefthook.yml",
    ".lefthook.yml",
    // build tools whose project config runs programs (runners, wrappers, toolchain paths)
    ".cargo/config.toml",
    ".cargo/config",
    "rust-toolchain.toml",
    "rust-toolchain",
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".pnpmfile.cjs",
];

/// The protected paths for a project: the defaults, then `protect` lines, deduplicated.
pub(crate) fn candidates(extra: &[String]) -> Vec<String> {
    let mut out: Vec<String> = DEFAULT_PROTECTED.iter().map(|s| s.to_string()).collect();
    for e in extra {
        if !out.contains(e) {
            out.push(e.clone());
        }
    }
    out
}

/// What the guard found before a launch: the protected paths that exist (mounted read-only
/// inside) and the project's repositories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protected {
    pub(crate) mounts: Vec<PathBuf>,
    pub(crate) repos: Repos,
    /// Where the sandbox can write outside the project, as the host sees it (set by the plan).
    pub(crate) writable: Vec<PathBuf>,
}

/// The repositories of a project, relative to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repos {
    /// Git directories (`X/.git` directories and bare-shaped directories), with which directory
    /// each is (`inode`): one deleted and made again at the same path during a session is new.
    pub(crate) gitdirs: Vec<(PathBuf, u64)>,
    /// `.git` files (`gitdir: PATH`) and `.git` symbolic links, with where they lead (resolved).
    pub(crate) pointers: Vec<(PathBuf, Option<PathBuf>)>,
    /// Symbolic links that lead out of the project (`..` or absolute targets, resolved): a
    /// directory reached through one is where the host's git looks for a repository.
    #[serde(default)]
    pub(crate) links_out: Vec<PathBuf>,
    /// How many entries the walk read (for the bench and the ADR).
    #[serde(default)]
    pub walked: usize,
    /// Directories of the user's that the walk after a session could not read, and opened
    /// (u+rx) to check: a repository the session hid in one would otherwise go unseen.
    #[serde(default)]
    pub(crate) opened: Vec<PathBuf>,
}
