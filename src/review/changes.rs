//! What a review-mode session changed: its upper layer read against the project as it is now.
//!
//! The overlay's upper layer holds only what the sandbox wrote: a file or link it made or
//! changed (copied up whole: rootless overlays have no metacopy), a directory it made or went
//! into, a whiteout (a character device 0/0, made by the kernel as a subordinate id) for each
//! name it removed, and `user.overlay.opaque` on a directory it removed and made again (nothing
//! of the project's below it shows through). Renaming a directory that was in the project is
//! refused by the overlay (EXDEV) and tools copy instead, so a rename is a deletion and an
//! addition here (`diff` shows a file that moved unchanged as a rename).
//!
//! Both trees are read through `sys::untrusted` (never a link followed, a fifo opened, a file
//! read without bound): the upper layer is the sandbox's, and so is every name in it.

use super::links::{Leads, resolve};
use crate::sys::untrusted::{Kind, Stat, Tree};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The xattrs rootless overlays (`userxattr`) set in the upper layer.
const OPAQUE: &str = "user.overlay.opaque";
const ORIGIN: &str = "user.overlay.origin";

/// How deep a deleted directory is listed (a deeper tree is a bomb, not a project).
const DEPTH_MAX: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum What {
    Added,
    /// Content, kind, link target or permission bits differ from the project's.
    Changed,
    Deleted,
}

#[derive(Debug, Clone)]
pub(crate) struct Change {
    /// Relative to the project.
    pub(crate) path: PathBuf,
    pub(crate) what: What,
    /// What the sandbox left (None for a deletion).
    pub(crate) new: Option<Stat>,
    /// What the project has at the path now (None: nothing).
    pub(crate) old: Option<Stat>,
    /// A link's target, as the sandbox made it.
    pub(crate) link: Option<PathBuf>,
    /// Where that link leads, resolved one name at a time through the links of the project with
    /// the layer over it, and through the project's alone; the worse of the two.
    pub(crate) leads: Option<Leads>,
    /// Where the layer-over-project view leads when both views stay inside and differ (`a ->
    /// .cargo` made beside `x -> a/config.toml`): a protected path reached either way is one.
    pub(crate) leads_too: Option<PathBuf>,
    /// The upper layer says this was copied up from the project (`user.overlay.origin`): the
    /// project had it when the sandbox first wrote it.
    pub(crate) copied_up: bool,
    /// Other names the sandbox gave the same file (`ln`), changed or not: each lands as a file
    /// of its own, never as another name of it.
    pub(crate) same_as: Vec<PathBuf>,
    /// A directory of the project that this change deletes or replaces with something else, and
    /// what goes with it: its files below are listed as deletions of their own (`part_of` this
    /// path), the repositories below only named here (their `.git`), never entered.
    pub(crate) below: Below,
    /// This deletion is part of the deletion or replacement of the directory named.
    pub(crate) part_of: Option<PathBuf>,
}

/// What a deleted or replaced directory of the project held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Below {
    /// Entries listed as deletions below it.
    pub(crate) entries: usize,
    /// The git directories (or `.git` files) below it: repositories it deletes.
    pub(crate) repos: Vec<PathBuf>,
    /// Deeper than `DEPTH_MAX`: not all of it is listed.
    pub(crate) truncated: bool,
}

impl Change {
    pub(crate) fn new(path: PathBuf, what: What, new: Option<Stat>, old: Option<Stat>) -> Change {
        Change {
            path,
            what,
            new,
            old,
            link: None,
            leads: None,
            leads_too: None,
            copied_up: false,
            same_as: Vec::new(),
            below: Below::default(),
            part_of: None,
        }
    }

    /// Whether it puts something of another kind where the project has a directory, or a
    /// directory where the project has something else (what it deletes is more than one file).
    pub(crate) fn replaces(&self) -> Option<Kind> {
        let (new, old) = (self.new?, self.old?);
        (self.what == What::Changed
            && new.kind != old.kind
            && (new.kind == Kind::Dir || old.kind == Kind::Dir))
            .then_some(old.kind)
    }
}

/// Every change, parents before children, sorted by path within a directory.
pub(crate) fn read(upper: &Tree, project: &Tree) -> anyhow::Result<Vec<Change>> {
    let mut out = Vec::new();
    let mut unchanged = Vec::new();
    walk(upper, project, Path::new(""), false, &mut out, &mut unchanged)?;
    // Names that share a file: every name of it the layer has, changed or not.
    let shared = |c: &Change| c.new.filter(several_names).map(|n| n.ino);
    let mut names: HashMap<u64, Vec<PathBuf>> = HashMap::new();
    for c in &out {
        if let Some(ino) = shared(c) {
            names.entry(ino).or_default().push(c.path.clone());
        }
    }
    for (ino, p) in unchanged {
        if let Some(v) = names.get_mut(&ino) {
            v.push(p);
        }
    }
    for c in out.iter_mut() {
        if let Some(ino) = shared(c) {
            let all = names.get(&ino).cloned().unwrap_or_default();
            c.same_as = all.into_iter().filter(|p| *p != c.path).collect();
            c.same_as.sort();
        }
    }
    for c in out.iter_mut().filter(|c| c.link.is_some()) {
        let target = c.link.clone().unwrap_or_default();
        let merged = resolve(&c.path, &target, &|p: &Path| merged_link(upper, project, p));
        let host = resolve(&c.path, &target, &|p: &Path| project_link(project, p));
        if let (Leads::Inside(m), Leads::Inside(h)) = (&merged, &host)
            && m != h
        {
            c.leads_too = Some(m.clone());
        }
        c.leads = Some(if merged.is_inside() { host } else { merged });
    }
    Ok(out)
}

/// The target of the link at `rel` in the project as the sandbox saw it: the upper layer over
/// the project (a whiteout, a directory made again or something else in place of a directory
/// above hides the project's).
fn merged_link(upper: &Tree, project: &Tree, rel: &Path) -> Option<PathBuf> {
    let mut hidden = false;
    let above: Vec<&Path> = rel.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()).collect();
    for a in above.into_iter().rev() {
        match upper.stat(a).ok().flatten() {
            Some(st) if st.kind == Kind::Dir => {
                hidden |= upper.xattr(a, OPAQUE).ok().flatten().as_deref() == Some(b"y");
            }
            Some(_) => return None,
            None => {}
        }
    }
    match upper.stat(rel).ok().flatten() {
        Some(st) if st.kind == Kind::Link => upper.readlink(rel).ok(),
        Some(_) => None,
        None if hidden => None,
        None => project_link(project, rel),
    }
}

/// A file with other names (`ln`): those are looked for among the layer's names.
fn several_names(st: &Stat) -> bool {
    st.kind == Kind::File && st.nlink > 1
}

/// The target of the link at `rel` in the project as it is.
pub(crate) fn project_link(project: &Tree, rel: &Path) -> Option<PathBuf> {
    project.stat(rel).ok().flatten().filter(|s| s.kind == Kind::Link).and_then(|_| project.readlink(rel).ok())
}

/// One directory of the upper layer. `hidden`: the project's entries below are not seen inside
/// (an opaque directory, or one that replaced something else), so those not in the upper layer
/// are deletions.
fn walk(
    upper: &Tree,
    project: &Tree,
    dir: &Path,
    hidden: bool,
    out: &mut Vec<Change>,
    unchanged: &mut Vec<(u64, PathBuf)>,
) -> anyhow::Result<()> {
    let names: Vec<(OsString, Kind)> = upper.list(dir)?;
    if hidden && let Ok(theirs) = project.list(dir) {
        for (n, _) in theirs.iter().filter(|(n, _)| !names.iter().any(|(m, _)| m == n)) {
            let rel = dir.join(n);
            let old = project.stat(&rel)?;
            deleted(project, rel, old, out)?;
        }
    }
    for (name, _) in names {
        let rel = dir.join(&name);
        let Some(new) = upper.stat(&rel)? else { continue };
        let old = project.stat(&rel)?;
        if new.kind == Kind::Device && new.rdev == 0 {
            // A whiteout: a deletion of what the project had (nothing, if it is gone there too).
            if old.is_some() {
                deleted(project, rel, old, out)?;
            }
            continue;
        }
        let copied_up = upper.xattr(&rel, ORIGIN).ok().flatten().is_some();
        let link = (new.kind == Kind::Link).then(|| upper.readlink(&rel)).transpose()?;
        if new.kind == Kind::Dir {
            let opaque = upper.xattr(&rel, OPAQUE).ok().flatten().as_deref() == Some(b"y");
            let was_dir = old.is_some_and(|o| o.kind == Kind::Dir);
            if !was_dir || new.mode != old.map_or(0, |o| o.mode) {
                let what = if old.is_some() { What::Changed } else { What::Added };
                out.push(Change { copied_up, ..Change::new(rel.clone(), what, Some(new), old) });
            }
            walk(upper, project, &rel, hidden || opaque || !was_dir, out, unchanged)?;
            continue;
        }
        let what = match old {
            None => What::Added,
            Some(o) if same(upper, project, &rel, &new, &o, link.as_deref())? => {
                if several_names(&new) {
                    unchanged.push((new.ino, rel));
                }
                continue;
            }
            Some(_) => What::Changed,
        };
        let at = out.len();
        out.push(Change { link, copied_up, ..Change::new(rel.clone(), what, Some(new), old) });
        if old.is_some_and(|o| o.kind == Kind::Dir) {
            // A directory replaced by a file or link: everything below it goes with it.
            out[at].below = below(project, &rel, &rel, 0, out)?;
        }
    }
    Ok(())
}

/// A deletion of what the project has at `rel`: a directory with everything below it listed.
fn deleted(project: &Tree, rel: PathBuf, old: Option<Stat>, out: &mut Vec<Change>) -> anyhow::Result<()> {
    let at = out.len();
    let is_dir = old.is_some_and(|o| o.kind == Kind::Dir) && !in_git_dir(&rel);
    out.push(Change::new(rel.clone(), What::Deleted, None, old));
    if is_dir {
        out[at].below = below(project, &rel, &rel, 0, out)?;
    }
    Ok(())
}

/// Lists what the project has below `dir` as deletions that are part of `top`'s; a repository
/// there (a `.git` directory or file) is named, not entered.
fn below(
    project: &Tree,
    dir: &Path,
    top: &Path,
    depth: usize,
    out: &mut Vec<Change>,
) -> anyhow::Result<Below> {
    let mut b = Below::default();
    if depth >= DEPTH_MAX {
        b.truncated = true;
        return Ok(b);
    }
    for (n, k) in project.list(dir)? {
        let rel = dir.join(&n);
        if n == ".git" {
            b.repos.push(rel);
            continue;
        }
        let old = project.stat(&rel)?;
        out.push(Change {
            part_of: Some(top.to_path_buf()),
            ..Change::new(rel.clone(), What::Deleted, None, old)
        });
        b.entries += 1;
        if k == Kind::Dir {
            let inner = below(project, &rel, top, depth + 1, out)?;
            b.entries += inner.entries;
            b.repos.extend(inner.repos);
            b.truncated |= inner.truncated;
        }
    }
    Ok(b)
}

/// Whether the sandbox's entry equals the project's: kind, permission bits, and content or
/// link target (a file copied up and left as it was, a `touch`, is no change).
fn same(
    upper: &Tree,
    project: &Tree,
    rel: &Path,
    new: &Stat,
    old: &Stat,
    link: Option<&Path>,
) -> anyhow::Result<bool> {
    if new.kind != old.kind || (new.kind == Kind::File && (new.mode != old.mode || new.len != old.len)) {
        return Ok(false);
    }
    match new.kind {
        Kind::Link => Ok(link == Some(project.readlink(rel)?.as_path())),
        Kind::File => same_bytes(upper, project, rel, rel),
        _ => Ok(false),
    }
}

/// Whether two regular files hold the same bytes (read in blocks, never whole).
pub(crate) fn same_bytes(a: &Tree, b: &Tree, ra: &Path, rb: &Path) -> anyhow::Result<bool> {
    let (mut fa, sa) = a.open_file(ra)?;
    let (mut fb, sb) = b.open_file(rb)?;
    if sa.len != sb.len {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(fb.read(&mut bb[..1])? == 0);
        }
        if fb.read_exact(&mut bb[..n]).is_err() || ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Whether a path is inside a repository's git directory (`.git/…` at any depth, or `.git`
/// itself): git's internals, which arrive only as a fetched branch (see `git`).
pub(crate) fn in_git_dir(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == ".git")
}

/// What the tests of reading a layer need: a directory on a filesystem that keeps user xattrs,
/// and the overlay's opaque mark set by hand (a whiteout needs CAP_MKNOD, so deletions come
/// from opaque directories).
#[cfg(test)]
pub(crate) mod testing {
    /// A temporary directory in target/: a disk filesystem, which keeps user xattrs.
    pub(crate) fn on_disk() -> tempfile::TempDir {
        let disk = concat!(env!("CARGO_MANIFEST_DIR"), "/target");
        std::fs::create_dir_all(disk).unwrap();
        tempfile::tempdir_in(disk).unwrap()
    }

    /// Marks `p` opaque, as the overlay does a directory removed and made again.
    pub(crate) fn set_opaque(p: &std::path::Path) {
        set_xattr(p, super::OPAQUE, b"y");
    }

    /// Sets the extended attribute `name` of `p` (not followed) to `value`.
    pub(crate) fn set_xattr(p: &std::path::Path, name: &str, value: &[u8]) {
        let set = crate::sys::untrusted::set_xattr(p, name, value);
        set.unwrap_or_else(|e| panic!("user xattrs in target/: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A project and an upper layer written by hand as the overlay would have: edits, additions,
    /// a `touch`, a directory made again (opaque), a second name of an unchanged file.
    #[test]
    fn the_layer_reads_as_additions_changes_and_deletions_against_the_project() {
        let t = testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        for d in ["src", "gone/deep", "keep"] {
            fs::create_dir_all(proj.join(d)).unwrap();
        }
        for (f, c) in
            [("src/a.rs", "a"), ("src/same.rs", "s"), ("gone/x", "x"), ("gone/deep/y", "y"), ("keep/k", "k")]
        {
            fs::write(proj.join(f), c).unwrap();
        }
        fs::create_dir_all(up.join("src")).unwrap();
        fs::write(up.join("src/a.rs"), "a2").unwrap();
        fs::write(up.join("src/same.rs"), "s").unwrap(); // copied up, unchanged
        fs::write(up.join("src/new.rs"), "n").unwrap();
        fs::create_dir_all(up.join("gone")).unwrap();
        fs::write(up.join("gone/fresh"), "f").unwrap();
        fs::create_dir_all(up.join("keep")).unwrap();
        fs::write(up.join("keep/k"), "k").unwrap();
        fs::hard_link(up.join("keep/k"), up.join("keep/k2")).unwrap();
        testing::set_opaque(&up.join("gone"));
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let got: Vec<(String, What)> =
            read(&u, &p).unwrap().iter().map(|c| (c.path.display().to_string(), c.what)).collect();
        // `gone` was made again (opaque): what the project had below it is deleted.
        let want = vec![
            ("gone/deep".to_string(), What::Deleted),
            ("gone/deep/y".to_string(), What::Deleted),
            ("gone/x".to_string(), What::Deleted),
            ("gone/fresh".to_string(), What::Added),
            ("keep/k2".to_string(), What::Added),
            ("src/a.rs".to_string(), What::Changed),
            ("src/new.rs".to_string(), What::Added),
        ];
        assert_eq!(got, want);
        let changes = read(&u, &p).unwrap();
        let k2 = changes.iter().find(|c| c.path == Path::new("keep/k2")).unwrap();
        assert_eq!(k2.same_as, [Path::new("keep/k")], "a second name of an unchanged file");
        assert!(in_git_dir(Path::new("lib/.git/config")) && in_git_dir(Path::new(".git")));
        assert!(!in_git_dir(Path::new("src/.gitignore")));
    }

    /// The sandbox's view of a link (what `diff` resolves a link's way through): the layer's
    /// link; the project's where the layer has nothing there; nothing where the layer has
    /// something else, a file above it, or a directory made again (opaque) above it.
    #[test]
    fn a_link_as_the_sandbox_saw_it_is_the_layer_over_the_project() {
        let t = testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        for d in ["a", "b", "c", "f"] {
            fs::create_dir_all(proj.join(d)).unwrap();
            std::os::unix::fs::symlink("../x", proj.join(d).join("l")).unwrap();
        }
        fs::create_dir_all(up.join("a")).unwrap(); // a directory above, as the overlay copies one up
        fs::create_dir_all(up.join("b")).unwrap();
        std::os::unix::fs::symlink("../y", up.join("b/l")).unwrap();
        fs::create_dir_all(up.join("c")).unwrap();
        testing::set_opaque(&up.join("c"));
        fs::write(up.join("f"), "a file where the directory was").unwrap();
        fs::create_dir_all(up.join("d")).unwrap();
        fs::write(up.join("d/l"), "a file where a link could be").unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let seen = |rel: &str| merged_link(&u, &p, Path::new(rel));
        assert_eq!(seen("a/l"), Some(PathBuf::from("../x")), "the project's, below a plain directory");
        assert_eq!(seen("b/l"), Some(PathBuf::from("../y")), "the layer's own");
        assert_eq!(seen("c/l"), None, "below a directory made again");
        assert_eq!(seen("f/l"), None, "below a file");
        assert_eq!(seen("d/l"), None, "a file");
        assert_eq!(project_link(&p, Path::new("a/l")), Some(PathBuf::from("../x")));
        assert_eq!(project_link(&p, Path::new("a")), None, "a directory is no link");
    }

    /// What a walk of the layer reads besides plain edits: a whiteout (a deletion), a directory
    /// whose mode changed, the origin mark of what was copied up, a plain directory's untouched
    /// entries (not deletions), and a directory replaced by a file (what it held, each a deletion
    /// of its own, counted).
    #[test]
    fn whiteouts_modes_origins_and_what_a_replaced_directory_held_are_read() {
        use std::os::unix::fs::PermissionsExt;
        let t = testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        for d in ["m", "plain", "lib/sub"] {
            fs::create_dir_all(proj.join(d)).unwrap();
        }
        for f in ["w.txt", "m/keep.rs", "plain/untouched.rs", "plain/edited.rs", "lib/a", "lib/sub/b"] {
            fs::write(proj.join(f), "before").unwrap();
        }
        fs::set_permissions(proj.join("m"), fs::Permissions::from_mode(0o755)).unwrap();
        for d in ["m", "plain"] {
            fs::create_dir_all(up.join(d)).unwrap();
        }
        fs::set_permissions(up.join("m"), fs::Permissions::from_mode(0o700)).unwrap();
        testing::set_xattr(&up.join("m"), ORIGIN, b"from the project");
        fs::write(up.join("plain/edited.rs"), "after").unwrap();
        testing::set_xattr(&up.join("plain/edited.rs"), ORIGIN, b"from the project");
        fs::write(up.join("lib"), "a file where the directory was").unwrap();
        // A whiteout: the character device 0/0 (any user may make one since Linux 5.8).
        let dev = nix::sys::stat::makedev(0, 0);
        nix::sys::stat::mknod(
            &up.join("w.txt"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            dev,
        )
        .unwrap();
        nix::sys::stat::mknod(
            &up.join("ghost"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            dev,
        )
        .unwrap();
        // Two names of one link: links land as links, never as "the same file as" each other.
        std::os::unix::fs::symlink("plain", up.join("l1")).unwrap();
        fs::hard_link(up.join("l1"), up.join("l2")).unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let (links, changes): (Vec<Change>, Vec<Change>) =
            read(&u, &p).unwrap().into_iter().partition(|c| c.link.is_some());
        let names: Vec<&Path> = links.iter().map(|l| l.path.as_path()).collect();
        assert_eq!(names, [Path::new("l1"), Path::new("l2")]);
        assert!(links.iter().all(|l| l.same_as.is_empty()), "{links:?}");
        let got: Vec<(String, What, bool, Option<PathBuf>)> = changes
            .iter()
            .map(|c| (c.path.display().to_string(), c.what, c.copied_up, c.part_of.clone()))
            .collect();
        let lib = Some(PathBuf::from("lib"));
        let want = vec![
            ("lib".to_string(), What::Changed, false, None),
            ("lib/a".to_string(), What::Deleted, false, lib.clone()),
            ("lib/sub".to_string(), What::Deleted, false, lib.clone()),
            ("lib/sub/b".to_string(), What::Deleted, false, lib),
            ("m".to_string(), What::Changed, true, None),
            ("plain/edited.rs".to_string(), What::Changed, true, None),
            ("w.txt".to_string(), What::Deleted, false, None),
        ];
        assert_eq!(got, want, "a whiteout where the project has nothing (ghost) is nothing");
        assert_eq!(changes[0].below.entries, 3);
        assert!(!changes[0].below.truncated);
    }

    /// A replaced directory deeper than `DEPTH_MAX` is listed to that depth and said to be cut
    /// there; one level less is listed whole.
    #[test]
    fn what_a_replaced_directory_held_is_listed_to_a_bounded_depth() {
        let t = testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        let nest = |top: &str, levels: usize| {
            let mut d = proj.join(top);
            for _ in 0..levels {
                d = d.join("d");
            }
            fs::create_dir_all(d).unwrap();
        };
        nest("deep", DEPTH_MAX + 1);
        nest("fits", DEPTH_MAX - 1);
        fs::create_dir_all(&up).unwrap();
        fs::write(up.join("deep"), "a file").unwrap();
        fs::write(up.join("fits"), "a file").unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let changes = read(&u, &p).unwrap();
        let top = |name: &str| changes.iter().find(|c| c.path == Path::new(name)).unwrap().below.clone();
        let (deep, fits) = (top("deep"), top("fits"));
        assert!(deep.truncated && deep.entries == DEPTH_MAX, "{deep:?}");
        assert!(!fits.truncated && fits.entries == DEPTH_MAX - 1, "{fits:?}");
    }

    /// What the overlay copied up but the sandbox left as it was is no change; a file with the
    /// same length and other bytes, a mode alone, or a link's target is one.
    #[test]
    fn a_copy_up_with_nothing_changed_is_no_change_and_any_difference_is() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let t = testing::on_disk();
        let (proj, up) = (t.path().join("p"), t.path().join("u"));
        for d in [&proj, &up] {
            fs::create_dir_all(d).unwrap();
            fs::write(d.join("same.txt"), "abc").unwrap();
            fs::write(d.join("mode.sh"), "echo").unwrap();
            symlink("same.txt", d.join("same-link")).unwrap();
        }
        fs::write(proj.join("bytes.txt"), "abc").unwrap();
        fs::write(up.join("bytes.txt"), "xyz").unwrap();
        fs::set_permissions(up.join("mode.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(proj.join("mode.sh"), fs::Permissions::from_mode(0o644)).unwrap();
        symlink("same.txt", proj.join("moved-link")).unwrap();
        symlink("bytes.txt", up.join("moved-link")).unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let got: Vec<(String, What)> =
            read(&u, &p).unwrap().iter().map(|c| (c.path.display().to_string(), c.what)).collect();
        let want: Vec<(String, What)> =
            ["bytes.txt", "mode.sh", "moved-link"].iter().map(|p| (p.to_string(), What::Changed)).collect();
        assert_eq!(got, want);
    }
}
