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

    /// A stat of `kind` whose inode last changed at `ctime_ns`.
    fn st(kind: Kind, ctime_ns: u64, nlink: u64) -> crate::sys::untrusted::Stat {
        crate::sys::untrusted::Stat {
            kind,
            mode: 0o644,
            ino: 1,
            len: 3,
            uid: 0,
            ctime_ns,
            mtime_ns: ctime_ns,
            nlink,
            rdev: 0,
        }
    }

    /// A change at `path` with nothing else said of it (`Change::new` with a `&str`).
    fn change(
        path: &str,
        what: What,
        new: Option<crate::sys::untrusted::Stat>,
        old: Option<crate::sys::untrusted::Stat>,
    ) -> Change {
        Change::new(path.into(), what, new, old)
    }

    fn item(change: Change) -> Item {
        Item { change, callouts: vec![], conflict: None, renamed_from: None }
    }

    /// The newest ctime of `p` and everything below it.
    fn newest(p: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let m = fs::symlink_metadata(p).unwrap();
        let own = m.ctime() as u64 * 1_000_000_000 + m.ctime_nsec() as u64;
        if !m.is_dir() {
            return own;
        }
        fs::read_dir(p).unwrap().map(|e| newest(&e.unwrap().path())).fold(own, u64::max)
    }

    /// Lets the kernel's coarse clock tick, so that a change after it has a later ctime.
    fn tick() {
        std::thread::sleep(std::time::Duration::from_millis(30));
    }

    #[test]
    fn when_is_the_second_of_the_nanoseconds_in_rfc3339() {
        assert_eq!(when(1_500_000_000_999_999_999), "2017-07-14T02:40:00Z");
        assert_eq!(when(0), "1970-01-01T00:00:00Z");
    }

    /// The host's entry is a conflict when its ctime is after the start (not at it); a file the
    /// sandbox copied up that the host deleted since is one, unless the copy has another name
    /// (the origin mark is the inode's).
    #[test]
    fn a_host_change_after_the_start_is_a_conflict_and_one_at_it_is_not() {
        let t = crate::review::changes::testing::on_disk();
        let project = Tree::open(t.path()).unwrap();
        let at = 1_000;
        let edited = change("f", What::Changed, Some(st(Kind::File, 5, 1)), Some(st(Kind::File, at + 1, 1)));
        assert_eq!(
            conflict(&edited, &project, at).as_deref(),
            Some("a file on the host changed after the session started")
        );
        let same = change("f", What::Changed, Some(st(Kind::File, 5, 1)), Some(st(Kind::File, at, 1)));
        assert_eq!(conflict(&same, &project, at), None, "control: changed at the start, not after");
        let mut gone = change("g", What::Changed, Some(st(Kind::File, 5, 1)), None);
        assert_eq!(conflict(&gone, &project, at), None, "not copied up: the sandbox made it");
        gone.copied_up = true;
        assert_eq!(
            conflict(&gone, &project, at).as_deref(),
            Some("deleted on the host after the session started")
        );
        gone.new = Some(st(Kind::File, 5, 2));
        assert_eq!(conflict(&gone, &project, at), None, "a second name carries the origin mark too");
    }

    /// A deleted directory with repositories below: a host change anywhere in one of them
    /// (the directory itself, a file in it, a file deeper down) is the conflict, named.
    #[test]
    fn a_host_change_in_a_repository_below_a_deleted_directory_is_a_conflict() {
        let t = crate::review::changes::testing::on_disk();
        let root = t.path();
        fs::create_dir_all(root.join("lib/r/.git/objects")).unwrap();
        fs::write(root.join("lib/r/.git/HEAD"), "ref: x\n").unwrap();
        fs::write(root.join("lib/r/.git/objects/o"), "1").unwrap();
        let project = Tree::open(root).unwrap();
        let mut deleted = change("lib", What::Deleted, None, Some(st(Kind::Dir, 0, 1)));
        deleted.below.repos = vec![PathBuf::from("lib/r/.git")];
        let start = newest(root);
        assert_eq!(conflict(&deleted, &project, start), None, "control: nothing after the start");
        // A file deeper down, a file in the repository's directory, an entry added to it: each
        // written after a fresh start, each the one named.
        for (write, named) in [
            ("lib/r/.git/objects/o", "lib/r/.git/objects/o"),
            ("lib/r/.git/HEAD", "lib/r/.git/HEAD"),
            ("lib/r/.git/new", "lib/r/.git"),
        ] {
            let start = newest(root);
            tick();
            fs::write(root.join(write), "changed\n").unwrap();
            assert_eq!(
                conflict(&deleted, &project, start),
                Some(format!("{named} changed on the host after the session started")),
                "{write}"
            );
        }
        let without = change("lib", What::Deleted, None, Some(st(Kind::Dir, 0, 1)));
        assert_eq!(conflict(&without, &project, 0), None, "no repository below: its files are items");
    }

    /// The walk below a directory stops past its depth bound.
    #[test]
    fn the_walk_for_host_changes_stops_at_its_depth_bound() {
        let t = crate::review::changes::testing::on_disk();
        fs::create_dir(t.path().join("d")).unwrap();
        let project = Tree::open(t.path()).unwrap();
        assert!(changed_below(&project, Path::new("d"), 0, 64).is_some());
        assert_eq!(changed_below(&project, Path::new("d"), 0, 65), None);
        // Each level down counts: a change 70 directories below is past the bound, one 60 below
        // is found.
        let deep: PathBuf = std::iter::repeat_n("a", 70).collect();
        fs::create_dir_all(t.path().join("e").join(&deep)).unwrap();
        let start = newest(t.path());
        tick();
        fs::write(t.path().join("e").join(&deep).join("f"), "").unwrap();
        assert_eq!(changed_below(&project, Path::new("e"), start, 0), None, "70 levels down");
        let near: PathBuf = std::iter::repeat_n("a", 60).collect();
        fs::write(t.path().join("e").join(&near).join("g"), "").unwrap();
        assert!(changed_below(&project, Path::new("e"), start, 0).is_some(), "control: 60 levels down");
    }

    /// One line per change with its kind's mark, its call-outs, conflict and other names; git's
    /// internals counted per repository; entries below a deleted directory listed up to the cap
    /// and counted past it.
    #[test]
    fn the_summary_marks_kinds_counts_git_internals_and_caps_what_it_lists_below_a_directory() {
        let mut dir = item(change("d", What::Added, Some(st(Kind::Dir, 0, 1)), None));
        dir.callouts = vec![Callout::WorldWritable, Callout::SetId];
        let link = item(change("l", What::Changed, Some(st(Kind::Link, 0, 1)), Some(st(Kind::File, 0, 1))));
        let mut file =
            item(change("f", What::Changed, Some(st(Kind::File, 0, 1)), Some(st(Kind::File, 0, 1))));
        file.conflict = Some("why".into());
        file.change.same_as = vec!["g".into(), "h i".into()];
        let mut top = item(change("big", What::Deleted, None, Some(st(Kind::Dir, 0, 1))));
        top.change.below.truncated = true;
        let mut items = vec![dir, link, file, top];
        for n in 0..201 {
            let mut c = change(&format!("big/{n:03}"), What::Deleted, None, Some(st(Kind::File, 0, 1)));
            c.part_of = Some("big".into());
            items.push(item(c));
        }
        for p in [".git/index", ".git/HEAD", "sub/.git/index"] {
            items.push(item(change(
                p,
                What::Changed,
                Some(st(Kind::File, 0, 1)),
                Some(st(Kind::File, 0, 1)),
            )));
        }
        let s = summary(&items);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            &lines[..9],
            [
                "  A d/",
                "      ! writable by every user of the machine",
                "      ! set-user-ID or set-group-ID",
                "  M l (link)",
                "  M f",
                "      ! CONFLICT: why",
                "      = the same file as g, 'h i' inside (another name of it): lands as a file of its own",
                "  D big/",
                "      ! deeper than ai-sandbox lists: not everything below is shown",
            ],
            "{s}"
        );
        assert_eq!(lines.iter().filter(|l| l.starts_with("  D big/")).count(), 1 + 200, "{s}");
        assert!(s.contains("  D big/199\n") && !s.contains("big/200\n"), "{s}");
        assert_eq!(
            &lines[lines.len() - 3..],
            [
                "      ... and 1 more entries below big (deleted with it)",
                "  ~ .git: 2 internal files changed (never applied as files; commits arrive as a branch)",
                "  ~ sub/.git: 1 internal files changed (never applied as files; commits arrive as a branch)",
            ],
            "{s}"
        );
        let mut listed = HashMap::new();
        let shown = items.iter().filter(|i| shown_below(&i.change, &mut listed)).count();
        assert_eq!(shown, items.len() - 1, "patches are shown for what the summary lists");
    }

    /// A file at the patch bound with a NUL byte is binary (its content would not be shown);
    /// a deleted file is not, nor one under the bound without a NUL byte.
    #[test]
    fn binary_is_called_out_up_to_the_patch_bound_and_not_for_a_deletion() {
        let t = crate::review::changes::testing::on_disk();
        let mut at_bound = vec![b'a'; PATCH_MAX as usize];
        at_bound[10] = 0;
        fs::write(t.path().join("nul"), &at_bound).unwrap();
        fs::write(t.path().join("text"), "plain\n").unwrap();
        let up = Tree::open(t.path()).unwrap();
        let mut written = st(Kind::File, 0, 1);
        written.len = PATCH_MAX;
        let c = change("nul", What::Added, Some(written), None);
        assert_eq!(with_binary(vec![], &c, &up), [Callout::Binary]);
        let text = change("text", What::Added, Some(st(Kind::File, 0, 1)), None);
        assert_eq!(with_binary(vec![], &text, &up), [], "control: text");
        let gone = change("nul", What::Deleted, None, Some(written));
        assert_eq!(with_binary(vec![Callout::Executable], &gone, &up), [Callout::Executable]);
        assert!(binary(&up, Path::new("missing")), "what cannot be read counts as binary");
    }

    /// A deleted file in a git directory is no rename's source (git's internals are never
    /// applied as files).
    #[test]
    fn a_file_deleted_in_git_internals_is_not_the_source_of_a_rename() {
        let t = crate::review::changes::testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        fs::create_dir_all(proj.join(".git")).unwrap();
        fs::create_dir_all(proj.join("d")).unwrap();
        fs::write(proj.join(".git/packed"), "same bytes\n").unwrap();
        fs::write(proj.join("d/moved"), "other bytes\n").unwrap();
        fs::create_dir_all(up.join(".git")).unwrap();
        fs::create_dir_all(up.join("d")).unwrap();
        crate::review::changes::testing::set_opaque(&up.join(".git"));
        crate::review::changes::testing::set_opaque(&up.join("d"));
        fs::write(up.join("copy"), "same bytes\n").unwrap();
        fs::write(up.join("moved"), "other bytes\n").unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let items = items(crate::review::changes::read(&u, &p).unwrap(), &u, &p, u64::MAX, &[]);
        let from = |name: &str| {
            items.iter().find(|i| i.change.path == Path::new(name)).unwrap().renamed_from.clone()
        };
        assert_eq!(from("copy"), None);
        assert_eq!(from("moved"), Some(PathBuf::from("d/moved")), "control: a moved file");
    }

    /// Only an addition is a rename: a file the sandbox changed to the bytes of a deleted one
    /// stays a change (it was in the project before).
    #[test]
    fn a_changed_file_with_a_deleted_files_bytes_is_a_change_not_a_rename() {
        let t = crate::review::changes::testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        fs::create_dir_all(proj.join("d")).unwrap();
        fs::write(proj.join("kept.txt"), "old bytes\n").unwrap();
        fs::write(proj.join("d/gone.txt"), "new bytes\n").unwrap();
        fs::create_dir_all(up.join("d")).unwrap();
        crate::review::changes::testing::set_opaque(&up.join("d"));
        fs::write(up.join("kept.txt"), "new bytes\n").unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let items = items(crate::review::changes::read(&u, &p).unwrap(), &u, &p, u64::MAX, &[]);
        let s = summary(&items);
        assert!(s.contains("  M kept.txt\n") && s.contains("  D d/gone.txt\n"), "{s}");
        assert!(!s.contains("R "), "{s}");
    }

    /// What a git config the sandbox wrote would make git run is named, as is a hook; a config
    /// that sets nothing of the kind, a deleted one, a file named config under refs/, the hooks
    /// directory itself, and files named so outside a git directory are not.
    #[test]
    fn git_settings_name_what_git_would_run_and_nothing_else() {
        let t = crate::review::changes::testing::on_disk();
        for d in [".git/hooks", ".git/refs", ".git/modules/m", "sub/.git"] {
            fs::create_dir_all(t.path().join(d)).unwrap();
        }
        let bad = "[core]\n\tfsmonitor = touch /tmp/x\n";
        fs::write(t.path().join(".git/config"), bad).unwrap();
        fs::write(t.path().join(".git/modules/m/config"), bad).unwrap();
        fs::write(t.path().join(".git/refs/config"), bad).unwrap();
        fs::write(t.path().join("sub/.git/config.worktree"), "[core]\n\tbare = false\n").unwrap();
        fs::write(t.path().join(".git/hooks/pre-commit"), "#!/bin/sh\n").unwrap();
        fs::create_dir_all(t.path().join("app/hooks")).unwrap();
        fs::write(t.path().join("app/config"), bad).unwrap();
        fs::write(t.path().join("app/hooks/run"), "").unwrap();
        let up = Tree::open(t.path()).unwrap();
        let file = Some(st(Kind::File, 0, 1));
        let items: Vec<Item> = [
            change(".git/config", What::Changed, file, file),
            change(".git/modules/m/config", What::Added, file, None),
            change(".git/refs/config", What::Added, file, None),
            change("sub/.git/config.worktree", What::Added, file, None),
            change(".git/hooks/pre-commit", What::Added, file, None),
            change(".git/hooks", What::Added, Some(st(Kind::Dir, 0, 1)), None),
            change("sub/.git/config", What::Deleted, None, file),
            change("app/config", What::Added, file, None),
            change("app/hooks/run", What::Added, file, None),
        ]
        .into_iter()
        .map(item)
        .collect();
        assert_eq!(
            git_settings(&items, &up),
            "  ! .git/config: sets core.fsmonitor (git on the host would run or trust it; never applied)\n\
             \x20 ! .git/modules/m/config: sets core.fsmonitor (git on the host would run or trust it; never applied)\n\
             \x20 ! .git/hooks/pre-commit: a git hook (never applied)\n"
        );
    }

    /// A change of mode alone is one line; a rename with the same bytes shows nothing; a link
    /// shows its target.
    #[test]
    fn a_mode_change_a_plain_rename_and_a_link_each_have_their_patch() {
        let t = crate::review::changes::testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        fs::create_dir_all(&proj).unwrap();
        fs::create_dir_all(&up).unwrap();
        fs::write(proj.join("run.sh"), "echo\n").unwrap();
        fs::write(proj.join("old"), "bytes\n").unwrap();
        std::os::unix::fs::symlink("somewhere", up.join("l")).unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let mut exe = st(Kind::File, 0, 1);
        exe.mode = 0o755;
        let mut mode = item(change("run.sh", What::Changed, Some(exe), Some(st(Kind::File, 0, 1))));
        fs::write(up.join("run.sh"), "echo\n").unwrap();
        mode.change.new.as_mut().unwrap().len = 5;
        assert_eq!(patch(&mode, &u, &p), "mode 644 -> 755: run.sh\n");
        fs::write(up.join("new"), "bytes\n").unwrap();
        let mut renamed = item(change("new", What::Added, Some(st(Kind::File, 0, 1)), None));
        renamed.renamed_from = Some("old".into());
        assert_eq!(patch(&renamed, &u, &p), "");
        let link = item(change("l", What::Added, Some(st(Kind::Link, 0, 1)), None));
        assert!(patch(&link, &u, &p).contains("+-> somewhere"), "{}", patch(&link, &u, &p));
        let dir = item(change("d", What::Added, Some(st(Kind::Dir, 0, 1)), None));
        assert_eq!(patch(&dir, &u, &p), "", "a directory has no patch");
    }

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
