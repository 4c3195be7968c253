//! Self-protection of the files the host trusts. The project directory is shared with the host,
//! so an agent could plant code the host later runs without showing it in a diff: git hooks,
//! `.git/config` (`core.fsmonitor`, `core.hooksPath`), editor tasks, agent settings and MCP
//! files, `.envrc`, package-manager and toolchain config that runs commands.
//!
//! Two layers. (1) Inside the sandbox every protected path that exists is mounted read-only
//! (`podman` argv). (2) Read-only mounts can be sidestepped (rename `.git` and build another,
//! turn `.git` into a `gitdir:` file, create a protected path that did not exist), so before the
//! session the launcher records every protected path (content, mode, type, link target) in the
//! user's state directory, and after it — or in the keeper if the launcher was killed, or at the
//! next launch if both were — compares and restores: the sandbox's version is moved aside to a
//! quarantine directory, the original put back, and each path is named in a report. Nothing of
//! the user's is deleted.
//!
//! Every repository below the project root is guarded too (`repos`): the ones that exist are
//! recorded and verified like the root's (not mounted: they may be deleted or cloned again
//! inside), the ones a session made lose what would make git run a program.
//!
//! A protected path that was mounted read-only inside cannot have been changed from inside
//! while its directories are the ones recorded (same inodes): a change there is the user's, made
//! on the host during the session, and is kept. Only paths that were absent at launch, or whose
//! directory was replaced, are ambiguous, and are restored with the way back said.
//!
//! What the check reads was made by the sandbox, so it is reached through `sys::untrusted`
//! (never a link followed, a fifo waited on or a file read without bound), and everything it
//! names is printed through `sys::quote` (docs/adr/0052).
//!
//! What it protects (`DEFAULT_PROTECTED`, `candidates`) and what it found before a launch
//! (`Protected`) are facts of the plan, so they live in `plan::protect`; this module reads and
//! writes files (called from `launch` and `keeper`).

pub mod repos;

pub(crate) use crate::plan::protect::{Protected, candidates};

use crate::sys::quote;
use crate::sys::untrusted::{Kind, Tree};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};

/// At most this many bytes of protected files are recorded (hooks and settings are small).
const MAX_BYTES: u64 = 64 << 20;
/// At most this many entries under the protected directories.
const MAX_ENTRIES: usize = 20_000;

/// What a path was before the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Was {
    Missing,
    File {
        mode: u32,
        copy: PathBuf,
    },
    Dir {
        mode: u32,
        /// Its inode (0 in records of older versions): a directory mounted read-only inside
        /// cannot be replaced from inside, so the same inode means its contents changed on the
        /// host.
        #[serde(default)]
        ino: u64,
    },
    Symlink {
        target: PathBuf,
    },
    /// A directory above a protected path (`.git` above `.git/hooks`), recorded without its
    /// contents: it must still be a directory afterwards (not a `gitdir:` file or a link).
    Parent {
        mode: u32,
        ino: u64,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub(crate) project: PathBuf,
    pub(crate) session: String,
    pub(crate) launcher_pid: u32,
    /// Every protected path and everything below the protected directories, parents first.
    pub(crate) entries: Vec<(PathBuf, Was)>,
    /// The protected paths themselves (to notice what was created below them).
    pub(crate) roots: Vec<PathBuf>,
    /// The protected paths that were mounted read-only inside (relative): a change to one of
    /// them, under the recorded directories, came from the host.
    #[serde(default)]
    pub(crate) mounted: Vec<PathBuf>,
    /// Directories outside the project the sandbox can write and the host keeps (its HOME), as
    /// the host sees them: a link into one made during a session is moved aside.
    #[serde(default)]
    pub(crate) writable: Vec<PathBuf>,
    /// The repositories in the project before the session (see `repos`; none in records of
    /// older versions, whose sessions are not checked for new repositories).
    #[serde(default)]
    pub(crate) repos: Option<repos::Repos>,
    /// Protected files that had other names (hard links) and were made files of their own
    /// before the session: a read-only mount covers one name only.
    #[serde(default)]
    pub(crate) separated: Vec<PathBuf>,
}

/// What settling a session did: paths restored or moved aside (the sandbox's doing, or
/// ambiguous), and host edits kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) restored: Vec<String>,
    pub(crate) kept: Vec<String>,
}

/// Not there, for our purposes: missing, or below something that is not a directory (a
/// `.git` file in a worktree or submodule checkout has no `.git/hooks`).
fn absent(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

/// The protected paths, relative to the project, for both the mounts and the record: the
/// candidates; every repository's (see `repos::roots`: a `.git` file decides which repository,
/// hooks and config the host's git uses); each submodule's config and hooks under .git/modules.
fn roots_of(project: &Path, rels: &[String], repos: &repos::Repos, nested: bool) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = rels.iter().map(PathBuf::from).collect();
    roots.extend(repos::roots(project, repos, nested));
    for g in submodule_gitdirs(project) {
        let g = relative(project, &g);
        roots.push(g.join("config"));
        roots.push(g.join("hooks"));
    }
    let mut seen = std::collections::HashSet::new();
    roots.retain(|r| seen.insert(r.clone()));
    roots
}

/// Walks the project for its repositories, then lists the protected paths that exist now and
/// are to be mounted read-only inside the sandbox.
pub(crate) fn existing_mounts(project: &Path, rels: &[String]) -> anyhow::Result<Protected> {
    let repos = repos::scan(project)?;
    let mut out = Vec::new();
    // The root's repository only: one below it may be deleted and cloned again inside (a test
    // suite's fixtures, a tool's checkouts), so it is verified after the session, not mounted.
    for rel in roots_of(project, rels, &repos, false) {
        let p = project.join(rel);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                // Protect the link itself (verified after); a target inside the project is
                // protected too, since the host follows the link.
                let target = fs::canonicalize(&p).ok();
                if let Some(t) = target.filter(|t| t.starts_with(project) && t != project) {
                    out.push(t);
                }
            }
            Ok(m) if m.is_file() || m.is_dir() => out.push(p),
            Ok(_) => {}
            Err(e) if absent(&e) => {}
            Err(e) => return Err(e).with_context(|| format!("checking the protected path {}", p.display())),
        }
    }
    out.retain(|p| p.exists());
    out.sort();
    out.dedup();
    Ok(Protected { mounts: out, repos, writable: Vec::new() })
}

/// The git directories of submodules under `.git/modules` (links not followed).
fn submodule_gitdirs(project: &Path) -> Vec<PathBuf> {
    fn walk(tree: &Tree, dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
        let Ok(entries) = tree.list(dir) else { return };
        for (name, _) in entries.iter().filter(|(_, k)| *k == Kind::Dir) {
            let p = dir.join(name);
            let is_file =
                |n: &str| tree.stat(&p.join(n)).ok().flatten().is_some_and(|s| s.kind == Kind::File);
            if is_file("HEAD") && is_file("config") {
                out.push(p.clone());
            }
            if depth < 4 {
                walk(tree, &p, depth + 1, out);
            }
        }
    }
    let mut out = Vec::new();
    if let Ok(tree) = Tree::open(project) {
        walk(&tree, Path::new(".git/modules"), 0, &mut out);
    }
    out.into_iter().map(|p| project.join(p)).collect()
}

fn relative(project: &Path, p: &Path) -> PathBuf {
    p.strip_prefix(project).map(Path::to_path_buf).unwrap_or_else(|_| p.to_path_buf())
}

/// Records the protected paths (and submodule config and hooks) into `store`, with what was
/// mounted read-only (`protected`, as the plan has it) and the repositories found.
pub(crate) fn snapshot(
    project: &Path,
    rels: &[String],
    protected: &Protected,
    store: &Path,
    session: &str,
    review: bool,
) -> anyhow::Result<Manifest> {
    let files = store.join("files");
    // Copies of protected files can hold credentials (`.npmrc`, a remote URL in `.git/config`).
    std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
        .create(&files)
        .with_context(|| format!("creating {}", files.display()))?;
    let tree = Tree::open(project).with_context(|| format!("opening the project {}", project.display()))?;
    // Review mode: the sandbox writes an overlay's upper layer, never the project, so nothing in
    // it is recorded (a host edit there during the session is the user's, and stays).
    let roots = if review { Vec::new() } else { roots_of(project, rels, &protected.repos, true) };
    let mut m = Manifest {
        project: project.to_path_buf(),
        session: session.to_string(),
        launcher_pid: std::process::id(),
        entries: Vec::new(),
        roots: roots.clone(),
        mounted: protected
            .mounts
            .iter()
            .filter_map(|p| p.strip_prefix(project).ok())
            .map(Path::to_path_buf)
            .collect(),
        repos: (!review).then(|| protected.repos.clone()),
        writable: protected.writable.clone(),
        separated: Vec::new(),
    };
    let mut bytes = 0u64;
    // The directories above the root-level roots are recorded, to tell a renamed and rebuilt
    // `.git` (or a host edit, see `host_made`); those above a repository below the root are
    // not: it may be deleted, and is then left deleted (see `repos::replaced_below`).
    let root_level = if review { Vec::new() } else { roots_of(project, rels, &protected.repos, false) };
    for rel in &roots {
        let ancestors = if root_level.contains(rel) { rel.ancestors().skip(1).collect() } else { Vec::new() };
        for anc in ancestors.into_iter().rev() {
            if anc.as_os_str().is_empty() || m.entries.iter().any(|(p, _)| p == anc) {
                continue;
            }
            match tree.stat(anc) {
                Ok(Some(st)) if st.kind == Kind::Dir => {
                    m.entries.push((anc.to_path_buf(), Was::Parent { mode: st.mode, ino: st.ino }))
                }
                // A parent that is missing, a file or a link: its child is recorded as it is.
                _ => break,
            }
        }
        record(&tree, rel, &files, &mut m.entries, &mut bytes, &mut m.separated)?;
    }
    let text = serde_json::to_string(&m)?;
    fs::write(store.join("manifest.json"), text).with_context(|| format!("writing {}", store.display()))?;
    Ok(m)
}

fn record(
    tree: &Tree,
    rel: &Path,
    files: &Path,
    out: &mut Vec<(PathBuf, Was)>,
    bytes: &mut u64,
    separated: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    if out.len() >= MAX_ENTRIES {
        anyhow::bail!(
            "more than {MAX_ENTRIES} files under the protected paths; nothing was started\n  hint: protect fewer paths"
        );
    }
    let shown = || quote::path(&tree.path().join(rel));
    let st = tree.stat(rel).with_context(|| format!("reading the protected path {}", shown()))?;
    let was = match st {
        None => Was::Missing,
        Some(st) if st.kind == Kind::Link => Was::Symlink { target: tree.readlink(rel)? },
        Some(st) if st.kind == Kind::Dir => {
            out.push((rel.to_path_buf(), Was::Dir { mode: st.mode, ino: st.ino }));
            for (n, _) in tree.list(rel)? {
                record(tree, &rel.join(n), files, out, bytes, separated)?;
            }
            return Ok(());
        }
        Some(st) if st.kind == Kind::File => {
            *bytes += st.len;
            if *bytes > MAX_BYTES {
                anyhow::bail!(
                    "the protected paths hold more than {} MiB ({}); nothing was started\n  hint: protect fewer or smaller paths",
                    MAX_BYTES >> 20,
                    shown()
                );
            }
            let content = tree.read(rel, MAX_BYTES).with_context(|| format!("recording {}", shown()))?;
            if st.nlink > 1 {
                // Another name of the file (a hard link: an earlier review's apply, a tool)
                // would be writable inside where this one is mounted read-only, and its change
                // would look like the host's (`host_made`): a file of its own from now on.
                tree.write_from(rel, &mut &content[..], st.mode, Some(st.mtime_ns))
                    .with_context(|| format!("making {} a file of its own (it has other names)", shown()))?;
                separated.push(rel.to_path_buf());
            }
            let copy = files.join(format!("{}", out.len()));
            fs::write(&copy, content).with_context(|| format!("recording {}", shown()))?;
            Was::File { mode: st.mode, copy }
        }
        // Sockets, fifos, devices: recorded as missing, so anything there afterwards is reported.
        Some(_) => Was::Missing,
    };
    out.push((rel.to_path_buf(), was));
    Ok(())
}

/// What a path is now, compared with what it was (never read through a link, never blocking).
fn unchanged(tree: &Tree, rel: &Path, was: &Was) -> bool {
    let Ok(now) = tree.stat(rel) else { return false };
    match (was, now) {
        (Was::Missing, None) => true,
        (Was::Symlink { target }, Some(st)) if st.kind == Kind::Link => {
            tree.readlink(rel).is_ok_and(|t| &t == target)
        }
        (Was::Dir { mode, .. }, Some(st)) if st.kind == Kind::Dir => st.mode == *mode,
        (Was::File { mode, copy }, Some(st)) if st.kind == Kind::File => {
            st.mode == *mode && tree.read(rel, MAX_BYTES).ok() == fs::read(copy).ok()
        }
        (Was::Parent { .. }, Some(st)) => st.kind == Kind::Dir,
        _ => false,
    }
}

/// Puts a recorded path back (its directories made as needed, none reached through a link).
fn put_back(tree: &Tree, rel: &Path, was: &Was) -> std::io::Result<()> {
    let parent = rel.parent().unwrap_or(Path::new(""));
    match was {
        Was::Missing => Ok(()),
        Was::Dir { mode, .. } | Was::Parent { mode, .. } => {
            tree.mkdir_all(rel, 0o755)?;
            tree.chmod(rel, *mode)
        }
        Was::File { mode, copy } => {
            tree.mkdir_all(parent, 0o755)?;
            tree.write(rel, &fs::read(copy)?, *mode)
        }
        Was::Symlink { target } => {
            tree.mkdir_all(parent, 0o755)?;
            tree.symlink(target, rel)
        }
    }
}

/// Everything under the protected roots now (to find what was created), links not followed.
fn present(tree: &Tree, roots: &[PathBuf]) -> Vec<PathBuf> {
    fn walk(tree: &Tree, rel: &Path, kind: Kind, out: &mut Vec<PathBuf>) {
        out.push(rel.to_path_buf());
        if kind == Kind::Dir && out.len() < MAX_ENTRIES * 2 {
            for (n, k) in tree.list(rel).unwrap_or_default() {
                walk(tree, &rel.join(n), k, out);
            }
        }
    }
    let mut out = Vec::new();
    for r in roots {
        if let Ok(Some(st)) = tree.stat(r) {
            walk(tree, r, st.kind, &mut out);
        }
    }
    out
}

/// Whether a change at `rel` can only have come from the host: `rel` is, or is below, a path
/// that was mounted read-only inside, the directories above that mount are the ones recorded
/// (a `.git` renamed and rebuilt inside is not), and so is the mount itself when `rel` is below
/// it, and (a file) it has no other name. A file mount may have a new inode: editors save by
/// writing a new file and renaming it.
fn host_made(m: &Manifest, tree: &Tree, rel: &Path) -> bool {
    let Some(mount) = m.mounted.iter().find(|mnt| rel.starts_with(mnt)) else { return false };
    // A file with another name may have been written through that name, which the sandbox could
    // reach (the mount covers one name): the sandbox's, as far as anyone can tell.
    if tree.stat(rel).ok().flatten().is_some_and(|st| st.kind == Kind::File && st.nlink > 1) {
        return false;
    }
    let same_dir = |p: &Path| {
        let recorded = m.entries.iter().find(|(e, _)| e == p).map(|(_, w)| w);
        let ino = match recorded {
            Some(Was::Parent { ino, .. }) | Some(Was::Dir { ino, .. }) => *ino,
            _ => return false,
        };
        ino != 0 && tree.stat(p).ok().flatten().is_some_and(|now| now.kind == Kind::Dir && now.ino == ino)
    };
    let above_ok = mount.ancestors().skip(1).take_while(|a| !a.as_os_str().is_empty()).all(same_dir);
    above_ok && (rel == mount || same_dir(mount))
}

/// The root's `.git` swapped during the session (renamed away and another made in its place):
/// the user's directory, found by its inode, goes back to `.git` and the sandbox's aside.
/// Returns the report line, or None when `.git` is the recorded directory (or the original is
/// nowhere to be found: the recorded files are then put back into what is there).
fn swap_back(m: &Manifest, tree: &Tree, quarantine: &Path) -> anyhow::Result<Option<String>> {
    let git = Path::new(".git");
    let Some(Was::Parent { ino, .. }) = m.entries.iter().find(|(p, _)| p == git).map(|(_, w)| w) else {
        return Ok(None);
    };
    let now = tree.stat(git)?;
    if now.is_some_and(|st| st.kind == Kind::Dir && st.ino == *ino) {
        return Ok(None);
    }
    let Some(original) = find_by_inode(tree, *ino) else { return Ok(None) };
    let aside = match now {
        Some(_) => Some(tree.move_out(git, quarantine)?),
        None => None,
    };
    tree.rename(&original, git)?;
    Ok(Some(format!(
        ".git: replaced during the session by another directory, the original moved to {}; your repository is back at .git{}",
        quote::path(&original),
        aside.map(|a| format!(" and the sandbox's is at {}", quote::path(&a))).unwrap_or_default()
    )))
}

/// Compares the project with the manifest and restores every difference the sandbox could have
/// made; keeps what only the host could have (see `host_made`); then takes out of each
/// repository the session made what would run a program (see `repos::settle_new`). Nothing is
/// read through a link or blocks on a fifo (see `sys::untrusted`), and one path that cannot be
/// restored does not stop the others: every failure is said, and the first returned at the end.
pub(crate) fn verify_and_restore(m: &Manifest, quarantine: &Path) -> anyhow::Result<Outcome> {
    let project = &m.project;
    let tree = Tree::open(project).with_context(|| format!("opening the project {}", project.display()))?;
    let mut out = Outcome::default();
    let mut failed: Option<anyhow::Error> = None;
    let mut fail = |out: &mut Outcome, what: &Path, e: anyhow::Error| {
        let what = if what.as_os_str().is_empty() {
            "the repositories made during the session".into()
        } else {
            quote::path(what)
        };
        out.restored.push(format!("{what}: could NOT be restored: {e:#}"));
        failed.get_or_insert(e);
    };
    let shown = |rel: &Path| quote::path(rel);
    let yours =
        |to: &Path| format!("; if you made this change yourself, restore it from {}", quote::path(to));
    let kept = |rel: &Path| {
        format!("{}: changed on the host during the session (it was read-only inside); kept", shown(rel))
    };
    // A repository below the root that the session deleted or made again: nothing of the
    // record goes back into it (one made again is cleaned as new, in 3).
    let replaced = |rel: &Path| m.repos.as_ref().is_some_and(|b| repos::replaced_below(&tree, b, rel));
    // 0. The user's repository back at `.git`, if the session swapped it for another.
    match swap_back(m, &tree, quarantine) {
        Ok(Some(line)) => out.restored.push(line),
        Ok(None) => {}
        Err(e) => fail(&mut out, Path::new(".git"), e),
    }
    // 1. Recorded paths, parents first: whatever differs goes aside and the original comes back.
    for (rel, was) in &m.entries {
        if replaced(rel) {
            continue;
        }
        if unchanged(&tree, rel, was) {
            // A directory above protected paths renamed away and made again (the root's `.git`
            // was put back above): its protected files are checked below; say where it went.
            if let Was::Parent { ino, .. } = was
                && tree.stat(rel).ok().flatten().is_some_and(|now| now.ino != *ino)
            {
                let original = find_by_inode(&tree, *ino);
                out.restored.push(format!(
                    "{}: replaced by another directory during the session (its protected files are checked below){}",
                    shown(rel),
                    original.map(|o| format!("; the original is now at {}", shown(&o))).unwrap_or_default()
                ));
            }
            continue;
        }
        if host_made(m, &tree, rel) {
            out.kept.push(kept(rel));
            continue;
        }
        let now = tree.stat(rel).ok().flatten();
        let both_dirs = matches!(was, Was::Dir { .. }) && now.is_some_and(|n| n.kind == Kind::Dir);
        let restored = (|| -> anyhow::Result<Option<PathBuf>> {
            let to = match now.is_some() && !both_dirs {
                true => Some(tree.move_out(rel, quarantine)?),
                false => None,
            };
            put_back(&tree, rel, was)?;
            Ok(to)
        })();
        let to = match restored {
            Ok(to) => to.unwrap_or_default(),
            Err(e) => {
                fail(&mut out, rel, e);
                continue;
            }
        };
        let what = now.map(|n| n.kind).filter(|k| !matches!(k, Kind::File | Kind::Dir));
        let what = what.map(|k| format!(" ({} now, not read)", k.name())).unwrap_or_default();
        out.restored.push(match (now.is_some(), both_dirs) {
            _ if *was == Was::Missing => {
                format!(
                    "{}: created during the session{what}; moved to {}{}",
                    shown(rel),
                    shown(&to),
                    yours(&to)
                )
            }
            (false, _) => format!("{}: deleted during the session; restored", shown(rel)),
            (true, true) => format!("{}: mode changed during the session; restored", shown(rel)),
            (true, false) => format!(
                "{}: changed during the session{what}; restored (the sandbox's version is at {}{})",
                shown(rel),
                shown(&to),
                yours(&to)
            ),
        });
    }
    // 2. Anything under a protected path (or at one) that was not there before goes aside.
    let known: std::collections::HashSet<&Path> = m.entries.iter().map(|(p, _)| p.as_path()).collect();
    let mut handled: Vec<PathBuf> = Vec::new();
    for rel in present(&tree, &m.roots) {
        if known.contains(rel.as_path()) || handled.iter().any(|d| rel.starts_with(d)) || replaced(&rel) {
            continue;
        }
        if host_made(m, &tree, &rel) {
            out.kept.push(kept(&rel));
        } else {
            match tree.move_out(&rel, quarantine) {
                Err(e) => fail(&mut out, &rel, e.into()),
                Ok(to) => out.restored.push(format!(
                    "{}: created during the session; moved to {}{}",
                    shown(&rel),
                    shown(&to),
                    yours(&to)
                )),
            }
        }
        handled.push(rel);
    }
    // 3. Repositories the session made, anywhere in the project.
    if let Some(before) = &m.repos {
        match repos::settle_new(&tree, before, &m.roots, &m.writable, quarantine) {
            Ok(lines) => out.restored.extend(lines),
            Err(e) => fail(&mut out, Path::new(""), e),
        }
    }
    match failed {
        Some(e) => Err(e.context(out.restored.join("\n"))),
        None => Ok(out),
    }
}

/// A directory at the project's top level (or one below) with this inode: where a renamed
/// `.git` went.
fn find_by_inode(tree: &Tree, ino: u64) -> Option<PathBuf> {
    let dirs = |rel: &Path| -> Vec<PathBuf> {
        let l = tree.list(rel).unwrap_or_default();
        l.into_iter().filter(|(_, k)| *k == Kind::Dir).map(|(n, _)| rel.join(n)).collect()
    };
    let top = dirs(Path::new(""));
    let second = top.iter().flat_map(|d| dirs(d));
    top.iter().cloned().chain(second).find(|p| tree.stat(p).ok().flatten().is_some_and(|s| s.ino == ino))
}

/// The whole check a session costs on a project it left unchanged: the record before (with the
/// repository walk) and the verification after (with the second walk), in `scratch` (for the
/// bench). Fails if anything was found to restore.
pub fn check_unchanged(project: &Path, scratch: &Path) -> anyhow::Result<()> {
    let rels = candidates(&[]);
    let protected = existing_mounts(project, &rels)?;
    let store = scratch.join("record");
    let _ = fs::remove_dir_all(&store);
    let m = snapshot(project, &rels, &protected, &store, "bench", false)?;
    let out = verify_and_restore(&m, &scratch.join("quarantine"))?;
    anyhow::ensure!(
        out.restored.is_empty() && out.kept.is_empty(),
        "the project changed: {:?}",
        out.restored
    );
    Ok(())
}

/// Reads a manifest written by `snapshot`.
pub(crate) fn load(store: &Path) -> anyhow::Result<Manifest> {
    let text = fs::read_to_string(store.join("manifest.json"))
        .with_context(|| format!("reading {}", store.display()))?;
    Ok(serde_json::from_str(&text)?)
}

#[cfg(test)]
mod hostile;
#[cfg(test)]
mod tests;

/// Verifies a session's record and restores what changed, writes the report to `out` and to
/// the project's report log (`ai-sandbox report`), then removes the record. `told`: whether `out`
/// is the user's terminal (the launcher's stderr); if not (the keeper), the report also waits in
/// the project's pending report, shown once at the next launch. Holds the record's lock, so a
/// keeper and a next launch never settle the same record twice.
pub(crate) fn settle(
    store: &Path,
    state_dir: &Path,
    out: &mut dyn std::io::Write,
    told: bool,
) -> anyhow::Result<()> {
    use nix::fcntl::{Flock, FlockArg};
    let Ok(lock_file) = fs::File::open(store) else { return Ok(()) };
    let Ok(_lock) = Flock::lock(lock_file, FlockArg::LockExclusive) else { return Ok(()) };
    let Ok(m) = load(store) else {
        // Removed meanwhile by whoever held the lock before us, or never completed.
        let _ = fs::remove_dir_all(store);
        return Ok(());
    };
    let stamp = crate::gate::log::now().replace(':', "");
    let quarantine = state_dir.join("quarantine").join(format!("{stamp}-{}", m.session));
    let project = quote::path(&m.project);
    let Outcome { restored: lines, kept } = verify_and_restore(&m, &quarantine)
        .with_context(|| format!("restoring the protected paths of {project}"))?;
    if !kept.is_empty() {
        let mut text = format!(
            "ai-sandbox: kept your changes made on the host during the session in {project} (read-only inside, so not the sandbox's):\n"
        );
        for l in &kept {
            text += &format!("  {l}\n");
        }
        let _ = out.write_all(text.as_bytes());
    }
    if !lines.is_empty() {
        let mut text = format!(
            "ai-sandbox: PROTECTED FILES WERE CHANGED during the session in {project} ({}, {stamp}); restored:\n",
            quote::text(&m.session)
        );
        for l in &lines {
            text += &format!("  ! {l}\n");
        }
        let _ = out.write_all(format!("{text}ai-sandbox: `ai-sandbox report` shows this again\n").as_bytes());
        append(&report_log(state_dir), &text)?;
        if !told {
            append(&pending_report(state_dir), &text)?;
        }
    }
    fs::remove_dir_all(store).with_context(|| format!("removing {}", store.display()))?;
    Ok(())
}

fn append(file: &Path, text: &str) -> anyhow::Result<()> {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .with_context(|| format!("writing {}", file.display()))?;
    std::io::Write::write_all(&mut f, text.as_bytes())?;
    Ok(())
}

/// Writes a protected file for the user, on the host, while sessions of the project may be
/// running (`ai-sandbox allow` adds to the config): under every record's lock, the file is
/// written and each record takes the new content as the original, so the check after a session
/// does not take the user's change for the sandbox's and put the old version back.
pub(crate) fn write_trusted(state_dir: &Path, project: &Path, rel: &Path, text: &str) -> anyhow::Result<()> {
    use nix::fcntl::{Flock, FlockArg};
    let mut held = Vec::new();
    if let Ok(records) = fs::read_dir(state_dir.join("guard")) {
        for r in records.flatten() {
            let Ok(f) = fs::File::open(r.path()) else { continue };
            if let Ok(lock) = Flock::lock(f, FlockArg::LockExclusive) {
                held.push((r.path(), lock));
            }
        }
    }
    // The file may have been made (or replaced by a link) inside: written as a new file renamed
    // over the name, never through a link.
    let path = project.join(rel);
    let tree = Tree::open(project).with_context(|| format!("opening {}", project.display()))?;
    let mode = match tree.stat(rel)? {
        Some(st) if st.kind == Kind::File => st.mode,
        _ => 0o644,
    };
    // A config written for a project that had none (`learn`): its directory too, no link followed.
    if let Some(dir) = rel.parent().filter(|d| !d.as_os_str().is_empty()) {
        tree.mkdir_all(dir, 0o755).with_context(|| format!("making {}", quote::path(&project.join(dir))))?;
    }
    tree.write(rel, text.as_bytes(), mode).with_context(|| format!("writing {}", quote::path(&path)))?;
    for (store, _lock) in &held {
        let Ok(mut m) = load(store) else { continue };
        let copy = store.join("files").join(format!("host-{}", m.entries.len()));
        fs::write(&copy, text).with_context(|| format!("recording {}", path.display()))?;
        let was = Was::File { mode, copy };
        match m.entries.iter_mut().find(|(p, _)| p == rel) {
            Some(e) => e.1 = was,
            None => m.entries.push((rel.to_path_buf(), was)),
        }
        fs::write(store.join("manifest.json"), serde_json::to_string(&m)?)
            .with_context(|| format!("writing {}", store.display()))?;
    }
    Ok(())
}

/// Settles the records of earlier sessions whose launcher is dead, and shows (then clears) the
/// reports of restores that happened with no terminal to tell.
pub(crate) fn settle_leftovers(state_dir: &Path, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let pending = pending_report(state_dir);
    if let Ok(text) = fs::read_to_string(&pending) {
        let _ = out.write_all(
            format!("ai-sandbox: since your last session here:\n{text}ai-sandbox: `ai-sandbox report` shows this again\n")
                .as_bytes(),
        );
        let _ = fs::remove_file(&pending);
    }
    let Ok(records) = fs::read_dir(state_dir.join("guard")) else { return Ok(()) };
    for r in records.flatten() {
        let Ok(m) = load(&r.path()) else {
            // No manifest: its launcher died before the session started (the manifest is
            // written last, before podman runs), so there is nothing to verify against.
            let stale = r
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|a| a.as_secs() > 60));
            if stale {
                let _ = fs::remove_dir_all(r.path());
            }
            continue;
        };
        let alive = crate::sys::process::alive(m.launcher_pid as i32);
        if !alive {
            let _ = writeln!(
                out,
                "ai-sandbox: {} is not yet verified: an earlier session's check did not finish (its launcher was stopped); verifying it now",
                quote::path(&m.project)
            );
            settle(&r.path(), state_dir, out, true)?;
        }
    }
    Ok(())
}

/// Reports of restores that happened with no terminal to tell (keeper), shown at the next launch.
pub(crate) fn pending_report(state_dir: &Path) -> PathBuf {
    state_dir.join("restored.txt")
}

/// Every report of the project, oldest first (`ai-sandbox report` prints it).
pub(crate) fn report_log(state_dir: &Path) -> PathBuf {
    state_dir.join("reports.txt")
}
