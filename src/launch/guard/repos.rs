//! Every repository inside the project is code the host runs, not only the root's: a shell
//! prompt or an editor runs `git status` in whatever folder the user opens, and git reads that
//! folder's repository config (`core.fsmonitor` runs a program), hooks and `.git` pointer file.
//!
//! Before a session the whole project is walked once (`scan`) for git directories (`.git`
//! directories, and directories shaped like a bare repository: git uses those too) and `.git`
//! files or links that point at one. The ones that exist are recorded and verified like the
//! root's (see `guard`; only the root's are also mounted read-only). After the session a second
//! walk finds the repositories the session made, and `settle_new` takes out of each what would
//! make the host's git run a program, keeping its objects, refs and work tree.
//!
//! The walk never follows a symbolic link and never enters a git directory (objects are most of
//! a repository's files and hold nothing git runs). Before a session it refuses a project past
//! `MAX_WALK` entries; after one it has no bound. See docs/adr/0039.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The walk before a launch refuses a project with more files and directories than this
/// (outside git directories), so that a launch's cost stays bounded.
pub(crate) const MAX_WALK: usize = 2_000_000;

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

/// Whether a directory's entry names make it a git directory as git's discovery sees it: a
/// `HEAD` with `objects` and `refs`, or with `commondir` (a worktree's or a linked git dir).
fn looks_like_gitdir(names: &[(std::ffi::OsString, fs::FileType)]) -> bool {
    let has = |n: &str| names.iter().any(|(x, _)| x == n);
    has("HEAD") && ((has("objects") && has("refs")) || has("commondir"))
}

/// Walks the project before a session (bounded by `MAX_WALK`, no links followed, no git
/// directory entered).
pub fn scan(project: &Path) -> anyhow::Result<Repos> {
    walk(project, Some(MAX_WALK))
}

/// The walk; `limit` None after a session, where the check must be complete however many files
/// the session made (a bound there would let it hide a repository behind enough files).
fn walk(project: &Path, limit: Option<usize>) -> anyhow::Result<Repos> {
    let mut out = Repos::default();
    let canon = fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf());
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = project.join(&rel);
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            // After a session, a directory of the user's that the sandbox made unreadable is
            // opened to be checked, and said; otherwise (gone meanwhile, another owner's) git
            // cannot read it either.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && limit.is_none() => {
                match open_up(&dir).and_then(|()| fs::read_dir(&dir)) {
                    Ok(rd) => {
                        out.opened.push(rel.clone());
                        rd
                    }
                    Err(_) => continue,
                }
            }
            Err(_) => continue,
        };
        let mut names = Vec::new();
        for e in rd.flatten() {
            let Ok(t) = e.file_type() else { continue };
            names.push((e.file_name(), t));
        }
        out.walked += names.len();
        if limit.is_some_and(|l| out.walked > l) {
            anyhow::bail!(
                "{} holds more than {MAX_WALK} files and directories outside its git directories; ai-sandbox checks \
                 every repository in the project before and after a session and stops there; nothing was started\n  \
                 hint: run the sandbox on a smaller directory (--project DIR), or move generated trees out of the project",
                project.display()
            );
        }
        if !rel.as_os_str().is_empty() && looks_like_gitdir(&names) {
            out.gitdirs.push((rel, inode(&dir)));
            continue;
        }
        for (name, t) in names {
            let child = rel.join(&name);
            if name == ".git" {
                if t.is_dir() {
                    let ino = inode(&project.join(&child));
                    out.gitdirs.push((child, ino));
                } else {
                    let target = pointer_target(project, &child);
                    out.pointers.push((child, target));
                }
            } else if t.is_dir() {
                stack.push(child);
            } else if t.is_symlink() && leads_out(&canon, &project.join(&child)) {
                out.links_out.push(child);
            }
        }
    }
    out.links_out.sort();
    out.gitdirs.sort();
    out.pointers.sort();
    Ok(out)
}

/// Adds u+rx to a directory this user owns.
fn open_up(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = fs::symlink_metadata(dir)?;
    if !m.is_dir() || m.uid() != nix::unistd::geteuid().as_raw() {
        return Err(std::io::ErrorKind::PermissionDenied.into());
    }
    fs::set_permissions(dir, fs::Permissions::from_mode((m.mode() & 0o7777) | 0o500))
}

/// Which directory this is: its inode, mixed with its birth time where the filesystem keeps one
/// (an inode freed by a deletion is handed to the next directory made, often at once).
fn inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = fs::symlink_metadata(p) else { return 0 };
    let born = m.created().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    m.ino() ^ born.map_or(0, |d| (d.as_nanos() as u64).rotate_left(32))
}

/// Whether a link leads out of the project. Only targets that can leave it lexically (absolute,
/// or with `..`) are resolved: most links in a tree (`node_modules/.bin`) point nearby.
fn leads_out(canon_project: &Path, link: &Path) -> bool {
    let Ok(target) = fs::read_link(link) else { return false };
    if target.is_relative() && !target.components().any(|c| c == Component::ParentDir) {
        return false;
    }
    fs::canonicalize(link).is_ok_and(|t| !t.starts_with(canon_project))
}

/// The paths of a git directory that make git run a program or redirect to one that does.
pub(crate) fn gitdir_paths(gitdir: &Path) -> Vec<PathBuf> {
    ["hooks", "config", "config.worktree", "commondir", "info/attributes"]
        .iter()
        .map(|p| gitdir.join(p))
        .collect()
}

/// Where a `.git` file or link leads, resolved on the host (None when it leads nowhere).
pub(crate) fn pointer_target(project: &Path, pointer: &Path) -> Option<PathBuf> {
    let p = project.join(pointer);
    let meta = fs::symlink_metadata(&p).ok()?;
    let base = p.parent()?.to_path_buf();
    let target = if meta.file_type().is_symlink() {
        base.join(fs::read_link(&p).ok()?)
    } else {
        // `gitdir: PATH`, PATH absolute or relative to the file's directory (git reads one line).
        let text = fs::read(&p).ok()?;
        let text = String::from_utf8_lossy(&text[..text.len().min(4096)]).into_owned();
        let line = text.lines().next()?.strip_prefix("gitdir:")?.trim().to_string();
        base.join(line)
    };
    fs::canonicalize(target).ok()
}

/// The protected roots the repositories add (relative to the project): a git directory's
/// config, hooks and pointers, the `.gitmodules` of its work tree, a pointer file itself and the
/// git directory it leads to when that is inside the project. `nested`: those below the root
/// too (recorded and verified), else only the root's own (also mounted read-only).
pub(crate) fn roots(project: &Path, repos: &Repos, nested: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let at_root = |p: &Path| nested || p == Path::new(".git");
    for (g, _) in repos.gitdirs.iter().filter(|(g, _)| at_root(g)) {
        out.extend(gitdir_paths(g));
        if g.file_name().is_some_and(|n| n == ".git")
            && let Some(work) = g.parent()
        {
            out.push(work.join(".gitmodules"));
        }
    }
    let canon = fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf());
    for (p, target) in repos.pointers.iter().filter(|(p, _)| at_root(p)) {
        out.push(p.clone());
        if let Some(work) = p.parent() {
            out.push(work.join(".gitmodules"));
        }
        if let Some(rel) = target.as_ref().and_then(|t| inside(&canon, t)) {
            out.extend(gitdir_paths(&rel));
        }
    }
    out
}

/// Whether `rel` lies in a repository below the root that existed before the session and is no
/// longer the same (deleted, or made again: another inode). Its recorded files are not put back
/// there: a repository made again is a new one (see `settle_new`), a deleted one runs nothing.
pub(crate) fn replaced_below(project: &Path, before: &Repos, rel: &Path) -> bool {
    let root = Path::new(".git");
    let modules = |p: &Path| p.parent().map(|w| w.join(".gitmodules"));
    let gitdir = before.gitdirs.iter().filter(|(g, _)| g != root).find(|(g, _)| {
        rel.starts_with(g)
            || (g.file_name().is_some_and(|n| n == ".git") && modules(g).as_deref() == Some(rel))
    });
    if let Some((g, ino)) = gitdir {
        return inode(&project.join(g)) != *ino;
    }
    let canon = fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf());
    let pointer = before.pointers.iter().filter(|(p, _)| p != root).find(|(p, t)| {
        rel == p
            || modules(p).as_deref() == Some(rel)
            || t.as_ref().and_then(|t| inside(&canon, t)).is_some_and(|g| rel.starts_with(g))
    });
    pointer.is_some_and(|(p, t)| pointer_target(project, p) != *t)
}

/// Settings kept in the config of a repository made during a session: what a cloned or
/// initialised repository has, none of which makes git run a program. Every other setting —
/// known to run one (`core.fsmonitor`, `core.hooksPath`, `core.sshCommand`, `core.pager`,
/// `core.editor`, `core.gitProxy`, filters, diff and merge drivers, `include.path`,
/// `includeIf`, `alias`, credential helpers, `remote.*.uploadpack`, `hook.*`, ...) or unknown —
/// is moved aside. An allowlist, so a setting git adds tomorrow is held back, not let through.
const KEPT: &[(&str, &[&str])] = &[
    (
        "core",
        &[
            "repositoryformatversion",
            "filemode",
            "bare",
            "logallrefupdates",
            "ignorecase",
            "precomposeunicode",
            "symlinks",
            "autocrlf",
            "eol",
            "safecrlf",
            "sharedrepository",
            "quotepath",
            "checkstat",
            "trustctime",
            "abbrev",
            "sparsecheckout",
            "sparsecheckoutcone",
            // where a submodule's work tree is: no program, and a submodule needs it
            "worktree",
        ],
    ),
    ("extensions", &["*"]),
    (
        "remote",
        &[
            "url",
            "pushurl",
            "fetch",
            "push",
            "tagopt",
            "prune",
            "prunetags",
            "mirror",
            "skipdefaultupdate",
            "skipfetchall",
            "promisor",
            "partialclonefilter",
        ],
    ),
    ("branch", &["remote", "merge", "rebase", "pushremote", "description"]),
    ("submodule", &["url", "active", "branch", "shallow", "ignore"]),
    ("user", &["name", "email"]),
    ("init", &["defaultbranch"]),
    ("pull", &["rebase", "ff"]),
    ("fetch", &["prune"]),
    ("index", &["version"]),
];

fn kept(section: &str, key: &str) -> bool {
    KEPT.iter().any(|(s, keys)| *s == section && keys.iter().any(|k| *k == "*" || *k == key))
}

/// A git config text with only the kept settings, and the names of the settings taken out
/// (`section.key`, or `section.subsection.key`). Lines are judged as git reads them: a section
/// header may carry a setting after it, a value continues over a trailing backslash (not inside a
/// comment), a header it cannot read drops every setting up to the next one it can.
pub(crate) fn sanitize_config(text: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut dropped = Vec::new();
    let mut section: Option<(String, Option<String>)> = Some((String::new(), None));
    // A section header (with the comments after it) is written once a setting under it is kept:
    // a section left empty goes with its settings.
    let mut pending: Option<String> = None;
    let mut lines = text.split_inclusive('\n');
    while let Some(first) = lines.next() {
        let mut logical = first.to_string();
        let mut rest = first.trim_start();
        if let Some(after) = rest.strip_prefix('[') {
            match parse_header(after) {
                Some((name, sub, tail)) => {
                    section = Some((name, sub));
                    let tail = tail.trim_start();
                    if tail.is_empty() || tail.starts_with('#') || tail.starts_with(';') {
                        pending = Some(first.to_string());
                        continue;
                    }
                    // `[core] fsmonitor = x`: the header apart, the setting judged on its own.
                    pending = Some(format!("{}\n", &first[..first.len() - tail.len()]));
                    logical = tail.to_string();
                    rest = tail;
                }
                None => {
                    (section, pending) = (None, None);
                    continue;
                }
            }
        }
        if rest.trim().is_empty() || rest.starts_with('#') || rest.starts_with(';') {
            pending.as_mut().unwrap_or(&mut out).push_str(first);
            continue;
        }
        let mut last = logical.clone();
        while continues(&last) {
            let Some(l) = lines.next() else { break };
            logical.push_str(l);
            last = l.to_string();
        }
        if !logical.ends_with('\n') {
            logical.push('\n');
        }
        let key =
            rest.split(|c: char| c == '=' || c.is_whitespace()).next().unwrap_or("").to_ascii_lowercase();
        match &section {
            Some((s, _)) if kept(s, &key) => {
                out.push_str(&pending.take().unwrap_or_default());
                out.push_str(&logical);
            }
            Some((s, Some(sub))) => dropped.push(format!("{s}.{sub}.{key}")),
            Some((s, None)) => dropped.push(format!("{s}.{key}")),
            None => dropped.push(format!("{key} (under a section header git may read otherwise)")),
        }
    }
    (out, dropped)
}

/// `name "subsection"]` or legacy `name.subsection]` → (lowercased name, subsection, the rest).
fn parse_header(s: &str) -> Option<(String, Option<String>, &str)> {
    let close = s.find(']')?;
    let (inner, tail) = (&s[..close], &s[close + 1..]);
    if let Some((name, sub)) = inner.split_once(char::is_whitespace) {
        let sub = sub.trim().strip_prefix('"')?.strip_suffix('"')?;
        let name = name.trim().to_ascii_lowercase();
        let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        return ok.then(|| (name, Some(sub.replace("\\\"", "\"").replace("\\\\", "\\")), tail));
    }
    let (name, sub) = match inner.split_once('.') {
        Some((n, s)) => (n, Some(s.to_ascii_lowercase())),
        None => (inner, None),
    };
    let name = name.trim().to_ascii_lowercase();
    let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    ok.then_some((name, sub, tail))
}

/// Whether a setting's line goes on to the next: a backslash right before the line's end,
/// outside a comment (inside quotes it still continues, as git reads it).
fn continues(line: &str) -> bool {
    let (mut quoted, mut escaped) = (false, false);
    let chars: Vec<char> = line.trim_end_matches(['\n', '\r']).chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' if i + 1 == chars.len() => return true,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            '#' | ';' if !quoted => return false,
            _ => {}
        }
    }
    false
}

/// Whether a path, resolved, lies inside the project.
fn inside(canon_project: &Path, p: &Path) -> Option<PathBuf> {
    p.strip_prefix(canon_project).ok().filter(|r| !r.as_os_str().is_empty()).map(Path::to_path_buf)
}

/// Lexically clean (no `.`), to compare paths read from files.
fn clean(p: &Path) -> PathBuf {
    p.components().filter(|c| !matches!(c, Component::CurDir)).collect()
}

/// The repositories the session made (not in `before`): each one's config keeps only the kept
/// settings, hooks other than git's `*.sample` files are moved aside, and a pointer (`.git`
/// file or link, `commondir`) that leads outside the project is moved aside. What is moved
/// goes to `quarantine` (same relative path). Returns one report line per thing moved.
pub(crate) fn settle_new(
    project: &Path,
    before: &Repos,
    protected: &[PathBuf],
    writable: &[PathBuf],
    quarantine: &Path,
) -> anyhow::Result<Vec<String>> {
    let now = walk(project, None)?;
    let canon = fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf());
    let mut report: Vec<String> = now
        .opened
        .iter()
        .map(|d| {
            format!(
                "{}: made unreadable during the session; opened (u+rx) to check it for repositories",
                d.display()
            )
        })
        .collect();
    // A link made during the session into a directory the sandbox can write outside the project
    // (its HOME, the agents' stores, as they are on the host): the sandbox could make a
    // repository there that the host's git would find on `cd` through the link.
    let writable: Vec<PathBuf> = writable.iter().filter_map(|w| fs::canonicalize(w).ok()).collect();
    for l in now.links_out.iter().filter(|l| !before.links_out.contains(l)) {
        let Ok(t) = fs::canonicalize(project.join(l)) else { continue };
        if writable.iter().any(|w| t.starts_with(w)) {
            super::move_aside(&project.join(l), &quarantine.join(l))?;
            report.push(format!(
                "{}: a link made during the session into the sandbox's own files outside the project ({}); moved to {}",
                l.display(),
                t.display(),
                quarantine.join(l).display()
            ));
        }
    }
    let mut todo: Vec<PathBuf> =
        now.gitdirs.iter().filter(|g| !before.gitdirs.contains(g)).map(|(g, _)| g.clone()).collect();
    for (p, target) in now.pointers.iter().filter(|p| !before.pointers.contains(p)) {
        match target.as_ref().and_then(|t| inside(&canon, t)) {
            Some(rel) => todo.push(clean(&rel)),
            None => {
                super::move_aside(&project.join(p), &quarantine.join(p))?;
                report.push(format!(
                    "{}: a repository pointer made during the session that leads outside the project; moved to {}",
                    p.display(),
                    quarantine.join(p).display()
                ));
            }
        }
    }
    let mut done: Vec<PathBuf> = Vec::new();
    while let Some(g) = todo.pop() {
        // The root's is the record's to verify, as are git dirs guarded by protected paths (the
        // root's submodules); one below the root counts as new if it is not the same one.
        let existed = before.gitdirs.iter().any(|(b, ino)| *b == g && *ino == inode(&project.join(&g)));
        let nested = before.gitdirs.iter().any(|(b, _)| *b == g);
        let root = g == Path::new(".git") || (!nested && protected.contains(&g.join("config")));
        if done.contains(&g) || existed || root {
            continue;
        }
        done.push(g.clone());
        report.extend(sanitize_gitdir(project, &canon, &g, quarantine, &mut todo)?);
    }
    Ok(report)
}

fn sanitize_gitdir(
    project: &Path,
    canon: &Path,
    g: &Path,
    quarantine: &Path,
    todo: &mut Vec<PathBuf>,
) -> anyhow::Result<Vec<String>> {
    let mut report = Vec::new();
    let dir = project.join(g);
    for name in ["config", "config.worktree"] {
        let (p, rel) = (dir.join(name), g.join(name));
        let Ok(bytes) = fs::read(&p) else { continue };
        let text = String::from_utf8_lossy(&bytes);
        let (clean_text, dropped) = sanitize_config(&text);
        if dropped.is_empty() && clean_text.as_bytes() == bytes.as_slice() {
            continue;
        }
        super::move_aside(&p, &quarantine.join(&rel))?;
        fs::write(&p, clean_text).with_context(|| format!("writing {}", p.display()))?;
        report.push(format!(
            "{}: a repository made during the session had settings that make git run programs ({}); they were taken out, the rest kept; the original is at {}",
            rel.display(),
            dropped.join(", "),
            quarantine.join(&rel).display()
        ));
    }
    if let Ok(rd) = fs::read_dir(dir.join("hooks")) {
        let mut hooks: Vec<_> = rd.flatten().map(|e| e.file_name()).collect();
        hooks.sort();
        for h in hooks.into_iter().filter(|h| !h.to_string_lossy().ends_with(".sample")) {
            let rel = g.join("hooks").join(&h);
            super::move_aside(&project.join(&rel), &quarantine.join(&rel))?;
            report.push(format!(
                "{}: a hook in a repository made during the session; moved to {}",
                rel.display(),
                quarantine.join(&rel).display()
            ));
        }
    }
    if let Ok(text) = fs::read_to_string(dir.join("commondir")) {
        let target = fs::canonicalize(dir.join(text.trim())).ok();
        match target.as_deref().and_then(|t| inside(canon, t)) {
            Some(rel) => todo.push(clean(&rel)),
            None => {
                let rel = g.join("commondir");
                super::move_aside(&project.join(&rel), &quarantine.join(&rel))?;
                report.push(format!(
                    "{}: a repository made during the session shares a git directory outside the project; moved to {}",
                    rel.display(),
                    quarantine.join(&rel).display()
                ));
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests;
