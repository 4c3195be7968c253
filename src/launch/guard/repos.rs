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

use crate::sys::quote;
use crate::sys::untrusted::{Kind, Tree, entries};
use anyhow::Context;

use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

/// At most this many bytes of a git config, `.git` file or `commondir` are read (git's own are
/// a few KiB): a larger one made during a session is moved aside whole, unread.
const MAX_READ: u64 = 1 << 20;

/// The walk before a launch refuses a project with more files and directories than this
/// (outside git directories), so that a launch's cost stays bounded.
pub(crate) const MAX_WALK: usize = 2_000_000;

pub use crate::plan::protect::Repos;

/// Whether a directory's entry names make it a git directory as git's discovery sees it: a
/// `HEAD` with `objects` and `refs`, or with `commondir` (a worktree's or a linked git dir).
fn looks_like_gitdir(names: &[(std::ffi::OsString, Kind)]) -> bool {
    let has = |n: &str| names.iter().any(|(x, _)| x == n);
    has("HEAD") && ((has("objects") && has("refs")) || has("commondir"))
}

/// Walks the project before a session (bounded by `MAX_WALK`, no links followed, no git
/// directory entered).
pub fn scan(project: &Path) -> anyhow::Result<Repos> {
    let tree = Tree::open(project).with_context(|| format!("opening the project {}", project.display()))?;
    walk(&tree, Some(MAX_WALK))
}

/// The walk; `limit` None after a session, where the check must be complete however many files
/// the session made (a bound there would let it hide a repository behind enough files).
fn walk(tree: &Tree, limit: Option<usize>) -> anyhow::Result<Repos> {
    let project = tree.path();
    let mut out = Repos::default();
    let canon = fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf());
    // Each directory is opened from its parent's descriptor, held (shared) while its children
    // wait on the stack: one `openat` per directory, as a listing by path costs.
    let mut stack: Vec<(PathBuf, Option<Rc<OwnedFd>>)> = vec![(PathBuf::new(), None)];
    while let Some((rel, parent)) = stack.pop() {
        let opened = tree.open_dir(parent.as_deref(), &rel).and_then(|fd| Ok((entries(&fd)?, fd)));
        let (names, fd) = match opened {
            Ok(done) => done,
            // After a session, a directory of the user's that the sandbox made unreadable is
            // opened to be checked, and said; otherwise (gone meanwhile, another owner's) git
            // cannot read it either.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && limit.is_none() => {
                let reopened = open_up(tree, &rel)
                    .and_then(|()| tree.open_dir(None, &rel))
                    .and_then(|fd| Ok((entries(&fd)?, fd)));
                match reopened {
                    Ok(done) => {
                        out.opened.push(rel.clone());
                        done
                    }
                    Err(_) => continue,
                }
            }
            Err(_) => continue,
        };
        let fd = Rc::new(fd);
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
            let ino = inode(tree, &rel);
            out.gitdirs.push((rel, ino));
            continue;
        }
        for (name, t) in names {
            let child = rel.join(&name);
            if name == ".git" {
                if t == Kind::Dir {
                    let ino = inode(tree, &child);
                    out.gitdirs.push((child, ino));
                } else {
                    let target = pointer_target(tree, &child);
                    out.pointers.push((child, target));
                }
            } else if t == Kind::Dir {
                stack.push((child, Some(fd.clone())));
            } else if t == Kind::Link && leads_out(&canon, tree, &child) {
                out.links_out.push(child);
            }
        }
    }
    out.links_out.sort();
    out.gitdirs.sort();
    out.pointers.sort();
    Ok(out)
}

/// Adds u+rx to a directory this user owns (not through a link).
fn open_up(tree: &Tree, rel: &Path) -> std::io::Result<()> {
    match tree.stat(rel)? {
        Some(st) if st.kind == Kind::Dir && st.uid == nix::unistd::geteuid().as_raw() => {
            tree.chmod(rel, st.mode | 0o500)
        }
        _ => Err(std::io::ErrorKind::PermissionDenied.into()),
    }
}

/// Which directory this is: its inode, mixed with its birth time where the filesystem keeps one
/// (an inode freed by a deletion is handed to the next directory made, often at once).
fn inode(tree: &Tree, rel: &Path) -> u64 {
    let Ok(Some(st)) = tree.stat(rel) else { return 0 };
    st.ino ^ tree.born(rel).rotate_left(32)
}

/// Whether a link leads out of the project. Only targets that can leave it lexically (absolute,
/// or with `..`) are resolved (a stat, nothing opened): most links in a tree
/// (`node_modules/.bin`) point nearby.
fn leads_out(canon_project: &Path, tree: &Tree, link: &Path) -> bool {
    let Ok(target) = tree.readlink(link) else { return false };
    if target.is_relative() && !target.components().any(|c| c == Component::ParentDir) {
        return false;
    }
    fs::canonicalize(tree.path().join(link)).is_ok_and(|t| !t.starts_with(canon_project))
}

/// The paths of a git directory that make git run a program or redirect to one that does.
pub(crate) fn gitdir_paths(gitdir: &Path) -> Vec<PathBuf> {
    ["hooks", "config", "config.worktree", "commondir", "info/attributes"]
        .iter()
        .map(|p| gitdir.join(p))
        .collect()
}

/// Where a `.git` file or link leads, resolved on the host (None when it leads nowhere, or is
/// neither a regular file nor a link: a fifo is never opened).
pub(crate) fn pointer_target(tree: &Tree, pointer: &Path) -> Option<PathBuf> {
    let p = tree.path().join(pointer);
    let st = tree.stat(pointer).ok()??;
    let base = p.parent()?.to_path_buf();
    let target = if st.kind == Kind::Link {
        base.join(tree.readlink(pointer).ok()?)
    } else {
        // `gitdir: PATH`, PATH absolute or relative to the file's directory (git reads one line).
        let text = tree.read(pointer, MAX_READ).ok()?;
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
pub(crate) fn replaced_below(tree: &Tree, before: &Repos, rel: &Path) -> bool {
    let project = tree.path();
    let root = Path::new(".git");
    let modules = |p: &Path| p.parent().map(|w| w.join(".gitmodules"));
    let gitdir = before.gitdirs.iter().filter(|(g, _)| g != root).find(|(g, _)| {
        rel.starts_with(g)
            || (g.file_name().is_some_and(|n| n == ".git") && modules(g).as_deref() == Some(rel))
    });
    if let Some((g, ino)) = gitdir {
        return inode(tree, g) != *ino;
    }
    let canon = fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf());
    let pointer = before.pointers.iter().filter(|(p, _)| p != root).find(|(p, t)| {
        rel == p
            || modules(p).as_deref() == Some(rel)
            || t.as_ref().and_then(|t| inside(&canon, t)).is_some_and(|g| rel.starts_with(g))
    });
    pointer.is_some_and(|(p, t)| pointer_target(tree, p) != *t)
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
            Some((s, Some(sub))) => {
                dropped.push(format!("{s}.{}.{}", shown_subsection(sub), quote::text(&key)))
            }
            Some((s, None)) => dropped.push(format!("{s}.{}", quote::text(&key))),
            None => {
                dropped.push(format!("{} (under a section header git may read otherwise)", quote::text(&key)))
            }
        }
    }
    (out, dropped)
}

/// A subsection as a report names it: a URL's (`url."https://TOKEN@host/".insteadOf`,
/// `http."…".extraHeader`, `credential."…".helper`) may carry a secret, so only a plain name
/// is printed.
fn shown_subsection(sub: &str) -> String {
    let plain = sub.chars().all(|c| c.is_ascii_alphanumeric() || "._/:-".contains(c));
    if plain && !sub.is_empty() { sub.to_string() } else { "\"…\"".to_string() }
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
/// file or link, `commondir`) that leads outside the project is moved aside. A link, fifo,
/// socket or device where git reads a file (or a hooks directory) is itself moved aside, never
/// read or listed through. What is moved goes to `quarantine` (same relative path). Returns one
/// report line per thing moved.
pub(crate) fn settle_new(
    tree: &Tree,
    before: &Repos,
    protected: &[PathBuf],
    writable: &[PathBuf],
    quarantine: &Path,
) -> anyhow::Result<Vec<String>> {
    let project = tree.path();
    let now = walk(tree, None)?;
    let canon = fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf());
    let mut report: Vec<String> = now
        .opened
        .iter()
        .map(|d| {
            format!(
                "{}: made unreadable during the session; opened (u+rx) to check it for repositories",
                quote::path(d)
            )
        })
        .collect();
    // A link made during the session into a directory the sandbox can write outside the project
    // (its HOME, as it is on the host): the sandbox could make a repository there that the
    // host's git would find on `cd` through the link.
    let writable: Vec<PathBuf> = writable.iter().filter_map(|w| fs::canonicalize(w).ok()).collect();
    for l in now.links_out.iter().filter(|l| !before.links_out.contains(l)) {
        let Ok(t) = fs::canonicalize(project.join(l)) else { continue };
        if writable.iter().any(|w| t.starts_with(w)) {
            let to = tree.move_out(l, quarantine)?;
            report.push(format!(
                "{}: a link made during the session into the sandbox's own files outside the project ({}); moved to {}",
                quote::path(l),
                quote::path(&t),
                quote::path(&to)
            ));
        }
    }
    let mut todo: Vec<PathBuf> =
        now.gitdirs.iter().filter(|g| !before.gitdirs.contains(g)).map(|(g, _)| g.clone()).collect();
    for (p, target) in now.pointers.iter().filter(|p| !before.pointers.contains(p)) {
        match target.as_ref().and_then(|t| inside(&canon, t)) {
            Some(rel) => todo.push(clean(&rel)),
            None => {
                let to = tree.move_out(p, quarantine)?;
                report.push(format!(
                    "{}: a repository pointer made during the session that leads outside the project (or is not a file or link); moved to {}",
                    quote::path(p),
                    quote::path(&to)
                ));
            }
        }
    }
    let mut done: Vec<PathBuf> = Vec::new();
    while let Some(g) = todo.pop() {
        // The root's is the record's to verify, as are git dirs guarded by protected paths (the
        // root's submodules); one below the root counts as new if it is not the same one.
        let existed = before.gitdirs.iter().any(|(b, ino)| *b == g && *ino == inode(tree, &g));
        let nested = before.gitdirs.iter().any(|(b, _)| *b == g);
        let root = g == Path::new(".git") || (!nested && protected.contains(&g.join("config")));
        if done.contains(&g) || existed || root {
            continue;
        }
        done.push(g.clone());
        report.extend(sanitize_gitdir(tree, &canon, &g, quarantine, &mut todo)?);
    }
    Ok(report)
}

/// Moves `rel` aside when it is not what git expects there (`want`): the line that says so.
fn not_what_git_reads(
    tree: &Tree,
    rel: &Path,
    want: Kind,
    quarantine: &Path,
) -> anyhow::Result<Option<String>> {
    let Some(st) = tree.stat(rel)? else { return Ok(None) };
    if st.kind == want {
        return Ok(None);
    }
    let to = tree.move_out(rel, quarantine)?;
    Ok(Some(format!(
        "{}: {} where git expects {} in a repository made during the session; moved to {} (not read)",
        quote::path(rel),
        st.kind.name(),
        want.name(),
        quote::path(&to)
    )))
}

fn sanitize_gitdir(
    tree: &Tree,
    canon: &Path,
    g: &Path,
    quarantine: &Path,
    todo: &mut Vec<PathBuf>,
) -> anyhow::Result<Vec<String>> {
    let mut report = Vec::new();
    for name in ["config", "config.worktree"] {
        let rel = g.join(name);
        if let Some(line) = not_what_git_reads(tree, &rel, Kind::File, quarantine)? {
            report.push(line);
            continue;
        }
        let Some(st) = tree.stat(&rel)? else { continue };
        let bytes = match tree.read(&rel, MAX_READ) {
            Ok(b) => b,
            Err(e) => {
                let to = tree.move_out(&rel, quarantine)?;
                report.push(format!("{}: {e}; moved to {} (not read)", quote::path(&rel), quote::path(&to)));
                continue;
            }
        };
        let text = String::from_utf8_lossy(&bytes);
        let (clean_text, dropped) = sanitize_config(&text);
        if dropped.is_empty() && clean_text.as_bytes() == bytes.as_slice() {
            continue;
        }
        let to = tree.move_out(&rel, quarantine)?;
        tree.write(&rel, clean_text.as_bytes(), st.mode)
            .with_context(|| format!("writing {}", quote::path(&tree.path().join(&rel))))?;
        report.push(format!(
            "{}: a repository made during the session had settings that make git run programs ({}); they were taken out, the rest kept; the original is at {}",
            quote::path(&rel),
            dropped.iter().map(|d| quote::text(d)).collect::<Vec<_>>().join(", "),
            quote::path(&to)
        ));
    }
    let hooks = g.join("hooks");
    if let Some(line) = not_what_git_reads(tree, &hooks, Kind::Dir, quarantine)? {
        report.push(line);
    } else if let Ok(entries) = tree.list(&hooks) {
        for (h, _) in entries.into_iter().filter(|(h, _)| !h.to_string_lossy().ends_with(".sample")) {
            let rel = hooks.join(&h);
            let to = tree.move_out(&rel, quarantine)?;
            report.push(format!(
                "{}: a hook in a repository made during the session; moved to {}",
                quote::path(&rel),
                quote::path(&to)
            ));
        }
    }
    let commondir = g.join("commondir");
    if let Some(line) = not_what_git_reads(tree, &commondir, Kind::File, quarantine)? {
        report.push(line);
    } else if let Ok(text) = tree.read(&commondir, MAX_READ) {
        let text = String::from_utf8_lossy(&text);
        let target = fs::canonicalize(tree.path().join(g).join(text.trim())).ok();
        match target.as_deref().and_then(|t| inside(canon, t)) {
            Some(rel) => todo.push(clean(&rel)),
            None => {
                let to = tree.move_out(&commondir, quarantine)?;
                report.push(format!(
                    "{}: a repository made during the session shares a git directory outside the project; moved to {}",
                    quote::path(&commondir),
                    quote::path(&to)
                ));
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests;
