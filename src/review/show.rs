//! `ai-sandbox diff`: a review as a reader takes it in. First one line per change (`A`dded,
//! `M`odified, `D`eleted, `R`enamed: a deleted file whose bytes reappear under a new name), each
//! called-out item with why, and what git would receive as a branch; then a patch for each text
//! file, a size line for a binary. Paths are quoted as the guard quotes them (`sys::quote`): a
//! name the sandbox chose cannot draw a fake line.

use super::callout::{self, Callout};
use super::changes::{Change, What, in_git_dir, same_bytes};
use crate::sys::quote;
use crate::sys::untrusted::{Kind, Tree};
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Patches are shown for text files up to this size (each side).
const PATCH_MAX: u64 = super::callout::LARGE;

/// A change with what a reader needs to decide on it.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub(crate) change: Change,
    pub(crate) callouts: Vec<Callout>,
    /// Why it conflicts with the project as it is now (the host changed it since the start).
    pub(crate) conflict: Option<String>,
    /// For an addition: the deleted path it is a rename of (same bytes).
    pub(crate) renamed_from: Option<PathBuf>,
}

pub(crate) fn when(ns: u64) -> String {
    crate::gate::log::rfc3339(ns / 1_000_000_000)
}

/// Why the project's entry at a changed path conflicts, if it does: changed on the host after the
/// session started (its ctime, which no program sets), or gone although the sandbox found it; for
/// a directory deleted or replaced with repositories below it, a change in one of them (the
/// files below are items of their own, each with its own conflict).
pub(crate) fn conflict(c: &Change, project: &Tree, started_ns: u64) -> Option<String> {
    match c.old {
        Some(o) if o.ctime_ns > started_ns => {
            Some(format!("{} on the host changed after the session started", o.kind.name()))
        }
        Some(_) if !c.below.repos.is_empty() => {
            c.below.repos.iter().find_map(|r| changed_below(project, r, started_ns, 0))
        }
        // The origin mark is the inode's: a second name the sandbox linked to a project file
        // carries it too, so only a file with one name says the project had it.
        None if c.copied_up && c.new.is_some_and(|n| n.nlink == 1) => {
            Some("deleted on the host after the session started".into())
        }
        _ => None,
    }
}

/// A host change below a directory (bounded walk, links not followed).
fn changed_below(project: &Tree, dir: &Path, started_ns: u64, depth: usize) -> Option<String> {
    if depth > 64 {
        return None;
    }
    if project.stat(dir).ok()??.ctime_ns > started_ns {
        return Some(format!("{} changed on the host after the session started", quote::path(dir)));
    }
    for (n, _) in project.list(dir).ok()? {
        let p = dir.join(n);
        let st = project.stat(&p).ok()??;
        if st.ctime_ns > started_ns {
            return Some(format!("{} changed on the host after the session started", quote::path(&p)));
        }
        if st.kind == Kind::Dir
            && let Some(why) = changed_below(project, &p, started_ns, depth + 1)
        {
            return Some(why);
        }
    }
    None
}

/// A rename is looked for among at most this many deleted files of the same size per addition.
const RENAME_TRIES: usize = 16;

/// The items of a review, with call-outs, conflicts and renames.
pub(crate) fn items(
    changes: Vec<Change>,
    upper: &Tree,
    project: &Tree,
    started_ns: u64,
    protected: &[String],
) -> Vec<Item> {
    let mut items: Vec<Item> = changes
        .into_iter()
        .map(|c| Item {
            callouts: with_binary(callout::of(&c, protected), &c, upper),
            conflict: conflict(&c, project, started_ns),
            renamed_from: None,
            change: c,
        })
        .collect();
    // Renames: an added file with the bytes of a deleted one of the same size. Each deleted file
    // is the source of one rename at most, and an empty file of none (any two empty files hold
    // the same bytes).
    let mut deleted: HashMap<u64, Vec<PathBuf>> = HashMap::new();
    for i in items.iter().filter(|i| i.change.what == What::Deleted && !in_git_dir(&i.change.path)) {
        if let Some(o) = i.change.old.filter(|o| o.kind == Kind::File && o.len > 0) {
            deleted.entry(o.len).or_default().push(i.change.path.clone());
        }
    }
    for i in items.iter_mut().filter(|i| {
        i.change.what == What::Added && i.change.new.is_some_and(|n| n.kind == Kind::File && n.len > 0)
    }) {
        let Some(same_size) = deleted.get_mut(&i.change.new.map_or(0, |n| n.len)) else { continue };
        let found = same_size
            .iter()
            .take(RENAME_TRIES)
            .position(|d| same_bytes(upper, project, &i.change.path, d).unwrap_or(false));
        i.renamed_from = found.map(|n| same_size.remove(n));
    }
    items
}

/// `callouts` and, for a file the change writes whose content `patch` would not show for a
/// NUL byte, `Binary` (what is over `LARGE` is called out as such already).
fn with_binary(mut callouts: Vec<Callout>, c: &Change, upper: &Tree) -> Vec<Callout> {
    let written = c.new.filter(|n| c.what != What::Deleted && n.kind == Kind::File && n.len > 0);
    if written.is_some_and(|n| n.len <= PATCH_MAX) && binary(upper, &c.path) {
        callouts.push(Callout::Binary);
    }
    callouts
}

/// Whether the layer's file at `rel` holds a NUL byte in its first 8 KiB, as `patch` reads it;
/// one that cannot be read counts (its content could not be shown either).
fn binary(upper: &Tree, rel: &Path) -> bool {
    let Ok((f, _)) = upper.open_file(rel) else { return true };
    let mut head = Vec::with_capacity(8192);
    f.take(8192).read_to_end(&mut head).is_err() || head.contains(&0)
}

/// `b` as text, each byte that is not part of UTF-8 written `\xNN` (a Latin-1 comment or one
/// stray byte does not hide a file's content behind "binary").
fn as_text(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap_or_else(|e| {
        let mut out = String::new();
        for chunk in e.as_bytes().utf8_chunks() {
            out.push_str(chunk.valid());
            for x in chunk.invalid() {
                out.push_str(&format!("\\x{x:02x}"));
            }
        }
        out
    })
}

/// At most this many entries below one deleted or replaced directory are listed by name (and
/// shown as patches); the rest are counted.
const LISTED_BELOW: usize = 200;

/// The summary lines (one per change, git's internals summed up in one line per repository).
/// Paths are printed as a shell reads them back (`quote::arg`), so that each can be pasted
/// into `apply`.
pub(crate) fn summary(items: &[Item]) -> String {
    let mut out = String::new();
    let renamed: HashSet<&PathBuf> = items.iter().filter_map(|i| i.renamed_from.as_ref()).collect();
    let mut git = std::collections::BTreeMap::<PathBuf, usize>::new();
    let mut listed: HashMap<&Path, usize> = HashMap::new();
    let mut unlisted = std::collections::BTreeMap::<&Path, usize>::new();
    for i in items {
        let c = &i.change;
        if in_git_dir(&c.path) {
            let repo: PathBuf = c.path.components().take_while(|x| x.as_os_str() != ".git").collect();
            *git.entry(repo).or_default() += 1;
            continue;
        }
        if !shown_below(c, &mut listed) {
            *unlisted.entry(c.part_of.as_deref().unwrap_or(Path::new(""))).or_default() += 1;
            continue;
        }
        let (letter, shown) = match (&i.renamed_from, c.what) {
            (Some(from), _) => ("R", format!("{} -> {}", quote::arg(from), quote::arg(&c.path))),
            (None, What::Deleted) if renamed.contains(&c.path) => continue,
            (None, What::Added) => ("A", quote::arg(&c.path)),
            (None, What::Changed) => ("M", quote::arg(&c.path)),
            (None, What::Deleted) => ("D", quote::arg(&c.path)),
        };
        let kind = match c.new.or(c.old).map(|s| s.kind) {
            Some(Kind::Dir) => "/",
            Some(Kind::Link) => " (link)",
            _ => "",
        };
        out += &format!("  {letter} {shown}{kind}\n");
        for k in &i.callouts {
            out += &format!("      ! {}\n", k.words());
        }
        if let Some(why) = &i.conflict {
            out += &format!("      ! CONFLICT: {why}\n");
        }
        if !c.same_as.is_empty() {
            let names: Vec<String> = c.same_as.iter().map(|p| quote::arg(p)).collect();
            out += &format!(
                "      = the same file as {} inside (another name of it): lands as a file of its own\n",
                names.join(", ")
            );
        }
        if c.below.truncated {
            out += "      ! deeper than ai-sandbox lists: not everything below is shown\n";
        }
    }
    for (top, n) in unlisted {
        out += &format!("      ... and {n} more entries below {} (deleted with it)\n", quote::arg(top));
    }
    for (repo, n) in git {
        let at = if repo.as_os_str().is_empty() {
            ".git".to_string()
        } else {
            format!("{}/.git", quote::path(&repo))
        };
        out += &format!(
            "  ~ {at}: {n} internal files changed (never applied as files; commits arrive as a branch)\n"
        );
    }
    out
}

/// Whether an item is shown (by name, as a patch): those below a deleted or replaced directory
/// up to `LISTED_BELOW` of it.
fn shown_below<'a>(c: &'a Change, listed: &mut HashMap<&'a Path, usize>) -> bool {
    let Some(top) = c.part_of.as_deref() else { return true };
    let n = listed.entry(top).or_default();
    *n += 1;
    *n <= LISTED_BELOW
}

/// The settings a git config the sandbox wrote sets that make git run a program or trust
/// something (those the guard's sanitizer takes out), one line each: never applied, said so
/// that a reader knows what the agent tried.
pub(crate) fn git_settings(items: &[Item], upper: &Tree) -> String {
    let mut out = String::new();
    for i in items.iter().filter(|i| in_git_dir(&i.change.path) && i.change.what != What::Deleted) {
        if i.change.path.components().any(|c| c.as_os_str() == "hooks")
            && i.change.new.is_some_and(|n| n.kind != Kind::Dir)
        {
            out += &format!("  ! {}: a git hook (never applied)\n", quote::path(&i.change.path));
            continue;
        }
        let name = i.change.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let parent =
            i.change.path.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or("");
        // `.git/config`, `.git/config.worktree`, and a submodule's config under `.git/modules`.
        if !matches!(name, "config" | "config.worktree") || parent == "refs" {
            continue;
        }
        let Ok(bytes) = upper.read(&i.change.path, 1 << 20) else { continue };
        let (_, dropped) = crate::launch::guard::repos::sanitize_config(&String::from_utf8_lossy(&bytes));
        if !dropped.is_empty() {
            out += &format!(
                "  ! {}: sets {} (git on the host would run or trust it; never applied)\n",
                quote::path(&i.change.path),
                dropped.iter().map(|d| quote::text(d)).collect::<Vec<_>>().join(", ")
            );
        }
    }
    out
}

/// The patches of the items, as `summary` lists them (those below a deleted or replaced
/// directory up to `LISTED_BELOW` of it).
pub(crate) fn patches(items: &[Item], upper: &Tree, project: &Tree) -> String {
    let mut listed = HashMap::new();
    items.iter().filter(|i| shown_below(&i.change, &mut listed)).map(|i| patch(i, upper, project)).collect()
}

/// The patch of one item: unified diff for text, a size line for the rest.
fn patch(i: &Item, upper: &Tree, project: &Tree) -> String {
    let c = &i.change;
    if in_git_dir(&c.path) || c.new.or(c.old).is_some_and(|s| s.kind == Kind::Dir) {
        return String::new();
    }
    let name = quote::path(&c.path);
    let text = |t: &Tree, p: &Path, is: Option<crate::sys::untrusted::Stat>| -> Option<Option<String>> {
        match is {
            None => Some(Some(String::new())),
            Some(s) if s.kind == Kind::Link => Some(Some(format!("-> {}\n", t.readlink(p).ok()?.display()))),
            Some(s) if s.kind == Kind::File && s.len <= PATCH_MAX => {
                let b = t.read(p, PATCH_MAX).ok()?;
                Some((!b[..b.len().min(8192)].contains(&0)).then(|| as_text(b)))
            }
            Some(_) => Some(None),
        }
    };
    let new = if c.what == What::Deleted { Some(Some(String::new())) } else { text(upper, &c.path, c.new) };
    let from = i.renamed_from.as_deref().unwrap_or(&c.path);
    let old = if i.renamed_from.is_some() {
        text(project, from, project.stat(from).ok().flatten())
    } else {
        text(project, &c.path, c.old)
    };
    match (old, new) {
        (Some(Some(a)), Some(Some(b))) if a == b => match i.renamed_from {
            Some(_) => String::new(),
            None => format!(
                "mode {:o} -> {:o}: {name}\n",
                c.old.map_or(0, |s| s.mode),
                c.new.map_or(0, |s| s.mode)
            ),
        },
        // The sandbox wrote these bytes: each line is printed escaped (no terminal control
        // sequence, bidi override or carriage return reaches the terminal).
        (Some(Some(a)), Some(Some(b))) => similar::TextDiff::from_lines(&a, &b)
            .unified_diff()
            .context_radius(3)
            .header(&format!("a/{}", quote::path(from)), &format!("b/{name}"))
            .to_string()
            .lines()
            .map(|l| quote::line(l) + "\n")
            .collect(),
        _ => format!(
            "binary or large: {name}: {} -> {} bytes\n",
            c.old.map_or(0, |s| s.len),
            if c.what == What::Deleted { 0 } else { c.new.map_or(0, |s| s.len) }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// The deletions come from an opaque directory (see `changes::testing`).
    #[test]
    fn a_moved_file_is_one_rename_and_copies_and_empty_files_are_not_renames() {
        let t = crate::review::changes::testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        fs::create_dir_all(proj.join("d")).unwrap();
        fs::write(proj.join("d/moved.txt"), "same bytes\n").unwrap();
        fs::write(proj.join("d/empty"), "").unwrap();
        fs::create_dir_all(up.join("d")).unwrap();
        crate::review::changes::testing::set_opaque(&up.join("d"));
        fs::write(up.join("a.txt"), "same bytes\n").unwrap();
        fs::write(up.join("b.txt"), "same bytes\n").unwrap();
        fs::write(up.join("new-empty"), "").unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let items = items(crate::review::changes::read(&u, &p).unwrap(), &u, &p, u64::MAX, &[]);
        let from = |name: &str| {
            items.iter().find(|i| i.change.path == Path::new(name)).unwrap().renamed_from.clone()
        };
        assert_eq!(from("a.txt"), Some(PathBuf::from("d/moved.txt")));
        assert_eq!(from("b.txt"), None, "a second copy is an addition");
        assert_eq!(from("new-empty"), None);
        let s = summary(&items);
        assert!(
            s.contains("R d/moved.txt -> a.txt") && s.contains("A b.txt") && s.contains("D d/empty"),
            "{s}"
        );
        assert!(!s.contains("D d/moved.txt"), "{s}");
    }

    /// A link that reaches a protected path through another link the layer made is called out,
    /// as the direct link is.
    #[test]
    fn a_link_to_a_protected_path_through_a_link_is_called_out() {
        let t = crate::review::changes::testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        fs::create_dir_all(proj.join(".cargo")).unwrap();
        fs::write(proj.join(".cargo/config.toml"), "").unwrap();
        fs::create_dir_all(&up).unwrap();
        std::os::unix::fs::symlink(".cargo", up.join("a")).unwrap();
        std::os::unix::fs::symlink("a/config.toml", up.join("x")).unwrap();
        std::os::unix::fs::symlink(".cargo/config.toml", up.join("direct")).unwrap();
        std::os::unix::fs::symlink("plain.txt", up.join("control")).unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let protected = [".cargo/config.toml".to_string()];
        let items = items(crate::review::changes::read(&u, &p).unwrap(), &u, &p, u64::MAX, &protected);
        let of =
            |name: &str| items.iter().find(|i| i.change.path == Path::new(name)).unwrap().callouts.clone();
        let to = |c: Vec<Callout>| c.iter().any(|c| matches!(c, Callout::LinkToProtected(..)));
        assert!(to(of("direct")), "{:?}", of("direct"));
        assert!(to(of("x")), "through a/: {:?}", of("x"));
        assert_eq!(of("control"), [], "control: a link to a plain file");
    }

    /// What `diff` cannot show is called out; a stray byte in text does not hide the text.
    #[test]
    fn content_diff_cannot_show_is_called_out_and_odd_bytes_in_text_are_shown_escaped() {
        let t = crate::review::changes::testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        fs::create_dir_all(&proj).unwrap();
        fs::create_dir_all(&up).unwrap();
        fs::write(proj.join("conftest.py"), "x = 1\n").unwrap();
        fs::write(up.join("conftest.py"), b"# caf\xe9\nimport os; os.system('id')\n").unwrap();
        fs::write(up.join("blob.bin"), b"\x7fELF\0\0run me").unwrap();
        fs::write(up.join("big.json"), vec![b' '; (callout::LARGE + 1) as usize]).unwrap();
        fs::write(up.join("plain.txt"), "hello\n").unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let items = items(crate::review::changes::read(&u, &p).unwrap(), &u, &p, u64::MAX, &[]);
        let of = |name: &str| items.iter().find(|i| i.change.path == Path::new(name)).unwrap();
        assert_eq!(of("blob.bin").callouts, [Callout::Binary]);
        assert_eq!(of("big.json").callouts, [Callout::Large(callout::LARGE + 1)]);
        assert_eq!(of("conftest.py").callouts, [], "text with a Latin-1 byte is shown, not called out");
        assert_eq!(of("plain.txt").callouts, [], "control");
        let shown = patches(&items, &u, &p);
        assert!(shown.contains("+# caf\\xe9\n+import os; os.system('id')"), "{shown}");
        assert!(shown.contains("binary or large: blob.bin"), "{shown}");
        assert!(shown.contains("+hello"), "{shown}");
    }
}
