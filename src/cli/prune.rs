//! `ai-sandbox prune`: the per-project state ai-sandbox keeps outside every project (the
//! sandbox HOME, the approved config, the guard's records and quarantine, review-mode changes
//! that were never applied) for projects that no longer exist. It accumulates: every project directory gets its own `NAME-HASH`.
//!
//! Each launch, `trust` and `init` record the project's path in its state dir (`project`); the
//! hash cannot be reversed, so state made before that record existed is listed as unknown and
//! kept. Nothing of a running sandbox is touched; on a terminal the list is shown and asked
//! about, otherwise only `--yes` removes.

use crate::host::Host;
use std::path::{Path, PathBuf};

/// The file in a project's state dir that names the project.
pub(crate) const PROJECT_RECORD: &str = "project";

/// Where a project's directories live, by its key (`NAME-HASH`).
pub(crate) struct Roots {
    pub(crate) states: PathBuf,
    pub(crate) homes: PathBuf,
}

/// What prune found: gone projects with their directories, and keys with no record.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) gone: Vec<(String, Vec<PathBuf>)>,
    pub(crate) unknown: Vec<PathBuf>,
    /// Projects whose directory above is missing too (kept: a drive may be unmounted).
    pub(crate) unreachable: Vec<(String, PathBuf)>,
}

/// Sorts every key under the roots (pure over the host's answers).
pub(crate) fn find(host: &dyn Host, roots: &Roots, running: &[PathBuf]) -> anyhow::Result<Found> {
    let mut found = Found::default();
    let key_of = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let states = host.list_dir(&roots.states)?;
    let mut known: Vec<String> = Vec::new();
    for state in &states {
        let Some(key) = key_of(state) else { continue };
        let Some(project) = host.read_file(&state.join(PROJECT_RECORD))? else {
            found.unknown.push(state.clone());
            continue;
        };
        known.push(key.clone());
        let project = PathBuf::from(project.trim_end_matches('\n'));
        if host.exists(&project) || running.contains(&project) {
            continue;
        }
        // Its parent gone too: more likely a drive not mounted now than a deleted project.
        if !project.parent().is_some_and(|d| host.exists(d)) {
            found.unreachable.push((project.display().to_string(), state.clone()));
            continue;
        }
        let mut dirs = vec![state.clone()];
        let home = roots.homes.join(&key);
        if host.exists(&home) {
            dirs.push(home);
        }
        // Changes that waited for review go with it (there is no project to apply them to).
        let reviews = host.list_dir(&state.join(crate::contract::review::REVIEWS_DIR))?.len();
        let shown = match reviews {
            0 => project.display().to_string(),
            n => format!("{} ({n} session change(s) that waited for review)", project.display()),
        };
        found.gone.push((shown, dirs));
    }
    for home in host.list_dir(&roots.homes)? {
        if key_of(&home).is_some_and(|k| !known.contains(&k)) {
            found.unknown.push(home);
        }
    }
    found.gone.sort();
    found.unknown.sort();
    Ok(found)
}

/// The listing shown before anything is removed.
pub(crate) fn describe(f: &Found) -> String {
    let mut out = String::new();
    if f.gone.is_empty() {
        out += "nothing to prune: every project ai-sandbox keeps state for still exists\n";
    } else {
        out += "state of projects that no longer exist (their sandbox HOME, approved config, records and quarantine):\n";
        for (project, dirs) in &f.gone {
            out += &format!("  {project} (gone)\n");
            for d in dirs {
                out += &format!("    {}\n", d.display());
            }
        }
    }
    if !f.unreachable.is_empty() {
        out += "kept: the directory above these projects is missing too (a drive not mounted?); remove by hand if they are gone:\n";
        for (project, state) in &f.unreachable {
            out += &format!("    {project} ({})\n", state.display());
        }
    }
    if !f.unknown.is_empty() {
        out += "kept: no record of which project these belong to (made by an older version); remove them by hand if you know:\n";
        for d in &f.unknown {
            out += &format!("    {}\n", d.display());
        }
    }
    out
}

/// `ai-sandbox prune [--yes]`.
pub(crate) fn run(host: &mut dyn Host, roots: &Roots, running: &[PathBuf], yes: bool) -> anyhow::Result<i32> {
    let found = find(host, roots, running)?;
    host.print(&describe(&found));
    if found.gone.is_empty() {
        return Ok(0);
    }
    let go = yes || (host.can_ask() && host.confirm("Remove them? [y/N] ")?);
    if !go {
        host.print("nothing was removed (`ai-sandbox prune --yes` removes them)\n");
        return Ok(0);
    }
    for d in found.gone.iter().flat_map(|(_, dirs)| dirs) {
        host.remove_tree(d)?;
    }
    host.print(&format!("removed the state of {} project(s)\n", found.gone.len()));
    Ok(0)
}
