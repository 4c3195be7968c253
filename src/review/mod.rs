//! Review before it lands (`workspace = review`, `--review`): the sandbox worked on a
//! copy-on-write overlay of the project, whose upper layer is kept per session in the project's
//! state directory (`contract::review`). This module reads that layer against the project as it
//! is now (`changes`), says what a reader must look at (`callout`), shows it (`show`), promotes
//! it (`apply`, with git's commits as a fetched branch: `git`) and drops it (`discard`).
//!
//! Everything in the upper layer was made by the sandbox, so it is read as `launch::guard`
//! reads a direct session's files: through `sys::untrusted`, never a link followed or a fifo
//! opened, and no program of the agent's repository is run on the host (docs/adr/0060).

pub(crate) mod apply;
pub(crate) mod callout;
pub(crate) mod changes;
pub(crate) mod git;
#[cfg(test)]
mod hostile;
pub(crate) mod links;
pub(crate) mod show;

use crate::contract::review::{self, Review};
use anyhow::Context;
use std::path::{Path, PathBuf};

/// One review waiting in a project's state directory.
#[derive(Debug, Clone)]
pub struct Waiting {
    pub(crate) dir: PathBuf,
    pub(crate) record: Review,
    /// Its launcher still runs: the session is not over, so nothing of it can be applied yet.
    pub(crate) running: bool,
}

impl Waiting {
    pub(crate) fn upper(&self) -> PathBuf {
        self.dir.join(review::UPPER_DIR)
    }
    pub(crate) fn id(&self) -> &str {
        &self.record.session
    }
}

/// The reviews in `state_dir`, oldest first (a directory without a readable record is skipped:
/// a launch that is making it right now).
pub(crate) fn waiting(state_dir: &Path) -> Vec<Waiting> {
    let Ok(entries) = std::fs::read_dir(state_dir.join(review::REVIEWS_DIR)) else { return Vec::new() };
    let mut out: Vec<Waiting> = entries
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path().join(review::RECORD_FILE)).ok()?;
            let record: Review = serde_json::from_str(&text).ok()?;
            let running = record.launcher_pid != 0
                && crate::sys::process::alive(record.launcher_pid as i32)
                && launcher_is_ours(record.launcher_pid);
            Some(Waiting { dir: e.path(), record, running })
        })
        .collect();
    out.sort_by_key(|w| w.record.started_ns);
    out
}

/// The reviews of every project under `states` (ai-sandbox's projects state dir), oldest first.
pub(crate) fn all(states: &Path) -> Vec<Waiting> {
    let Ok(entries) = std::fs::read_dir(states) else { return Vec::new() };
    let mut out: Vec<Waiting> = entries.flatten().flat_map(|e| waiting(&e.path())).collect();
    out.sort_by_key(|w| w.record.started_ns);
    out
}

/// A live pid is the session's launcher only while it is this program (pids are reused).
fn launcher_is_ours(pid: u32) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let me = std::env::current_exe().ok();
    match (exe, me) {
        (Some(a), Some(b)) => a.file_name() == b.file_name(),
        _ => false,
    }
}

/// The review `id` names (a prefix does), or the only one waiting when `id` is None.
pub(crate) fn pick(state_dir: &Path, project: &Path, id: Option<&str>) -> anyhow::Result<Waiting> {
    let all = waiting(state_dir);
    let listed = || {
        all.iter()
            .map(|w| format!("  {} (started {})", w.id(), show::when(w.record.started_ns)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let found: Vec<&Waiting> = match id {
        Some(id) => match crate::sys::ids::named(all.iter().map(Waiting::id), id) {
            crate::sys::ids::Named::One(one) => all.iter().filter(|w| w.id() == one).collect(),
            crate::sys::ids::Named::None => Vec::new(),
            crate::sys::ids::Named::Several(ids) => all.iter().filter(|w| ids.contains(&w.id())).collect(),
        },
        None => all.iter().collect(),
    };
    match (found.as_slice(), id) {
        ([one], _) => Ok((*one).clone()),
        ([], None) => Err(crate::error::hinted(
            format!("no session of {} waits for review", project.display()),
            "run the sandbox with --review (or `workspace = review` in .ai-sandbox/config) first",
        )
        .into()),
        ([], Some(id)) => Err(crate::error::hinted(
            format!("no session {id} waits for review in {}", project.display()),
            if all.is_empty() {
                "`ai-sandbox ps` lists the reviews that wait".to_string()
            } else {
                format!("these do:\n{}", listed())
            },
        )
        .into()),
        (_, _) => Err(crate::error::hinted(
            format!("{} sessions of {} wait for review; say which", found.len(), project.display()),
            format!("name one:\n{}", listed()),
        )
        .into()),
    }
}

/// Removes a review: its record, upper layer and work directory (what the overlay made there as
/// a subordinate id goes through `podman unshare`).
pub(crate) fn discard(w: &Waiting, podman: &Path) -> anyhow::Result<()> {
    crate::launch::review::remove(&w.dir, podman).with_context(|| format!("removing the review {}", w.id()))
}
