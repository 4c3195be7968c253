//! `ai-sandbox apply`: what lands, decided first (pure: `decide`, then `links_leaving` over the
//! project as the apply would leave it), then written into the project (`land`) through a
//! `Tree` of the project, so a link the host has where the change puts a file is replaced,
//! never written through, and nothing is read from the upper layer but regular files, opened
//! without following a link.
//!
//! The rule (docs/adr/0072): what `apply` writes is a new inode whose content is what `diff`
//! showed. A file is copied (or, when it is the user's own with one name, its inode moved out of
//! the finished layer): never linked to another name, so no landed path is a second name of a
//! file the host trusts. A link is made with the target `diff` showed; a directory with the mode
//! it showed.
//!
//! The decision: everything selected lands, except git's internals and special files (never),
//! called-out items that were not named themselves (a directory named above one lifts only what
//! `diff` could not show and a new executable bit), a deleted or replaced directory holding such
//! an item, items already applied, and what is part of a deleted or replaced directory that
//! does not land. If a selected item conflicts (the host changed it
//! after the session started) and was not named, nothing lands.

use super::callout::Callout;
use super::changes::What;
use super::links::{Leads, resolve};
use super::show::Item;
use crate::sys::untrusted::{Kind, Tree};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Land,
    /// Applied by an earlier `apply`.
    Done,
    /// Not among the paths named.
    NotSelected,
    /// Never as files (git's internals, fifos, devices).
    Never,
    /// Called out and not named: the reasons.
    CalledOut(Vec<Callout>),
    /// The host changed it since the session started, and it was not named.
    Conflict(String),
    /// Part of the deletion or replacement of this directory, which does not land.
    WithDirectory(PathBuf),
}

/// Whether `path` is named by one of `paths` (itself, or a directory above it).
fn named(path: &Path, paths: &[PathBuf]) -> bool {
    paths.iter().any(|p| !p.as_os_str().is_empty() && path.starts_with(p))
}

/// Whether `path` is itself one of `paths`: what lifts a call-out. A directory named for the
/// edits below it does not carry a planted hook, link or set-id file with them.
fn named_itself(path: &Path, paths: &[PathBuf]) -> bool {
    paths.iter().any(|p| p == path)
}

/// The named paths with no change at or below them (a typo, or a path of another session): an
/// apply that names one applies nothing, so that it never says "applied 0" to a hopeful user.
pub(crate) fn unmatched<'a>(items: &[Item], paths: &'a [PathBuf]) -> Vec<&'a Path> {
    paths
        .iter()
        .filter(|p| !items.iter().any(|i| named(&i.change.path, std::slice::from_ref(p))))
        .map(PathBuf::as_path)
        .collect()
}

/// One verdict per item.
pub(crate) fn decide(items: &[Item], paths: &[PathBuf], done: &HashSet<PathBuf>) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = items
        .iter()
        .map(|i| {
            let path = &i.change.path;
            let by_name = named(path, paths);
            if done.contains(path) {
                Verdict::Done
            } else if !paths.is_empty() && !by_name {
                Verdict::NotSelected
            } else if i.callouts.iter().any(|c| !c.may_be_named()) {
                Verdict::Never
            } else if i
                .callouts
                .iter()
                .any(|c| !(named_itself(path, paths) || by_name && c.lifted_by_directory()))
            {
                Verdict::CalledOut(i.callouts.clone())
            } else if let Some(why) = i.conflict.as_ref().filter(|_| !by_name) {
                Verdict::Conflict(why.clone())
            } else {
                Verdict::Land
            }
        })
        .collect();
    let at: HashMap<&Path, usize> =
        items.iter().enumerate().map(|(n, i)| (i.change.path.as_path(), n)).collect();
    // A directory whose deletion would take a called-out item below it (one not named itself)
    // does not land either: what `apply` says it did not apply is still there after it.
    let mut held: HashMap<&Path, Vec<PathBuf>> = HashMap::new();
    for (i, v) in items.iter().zip(&out) {
        if let (Some(top), Verdict::CalledOut(_)) = (&i.change.part_of, v) {
            held.entry(top.as_path()).or_default().push(i.change.path.clone());
        }
    }
    for (top, below) in held {
        if let Some(&t) = at.get(top).filter(|t| out[**t] == Verdict::Land) {
            out[t] = Verdict::CalledOut(vec![Callout::Holds(below)]);
        }
    }
    // What lies below a deleted or replaced directory goes with it, unless named itself (items
    // are in order, parents first, so the directory's verdict is already known).
    for n in 0..items.len() {
        let Some(top) = &items[n].change.part_of else { continue };
        let top_lands =
            at.get(top.as_path()).is_none_or(|t| matches!(out[*t], Verdict::Land | Verdict::Done));
        let would = matches!(out[n], Verdict::Land | Verdict::Conflict(_));
        if !top_lands
            && would
            && !paths.iter().any(|p| items[n].change.path.starts_with(p) && !top.starts_with(p))
        {
            out[n] = Verdict::WithDirectory(top.clone());
        }
    }
    // What lies below a path the project has as a file or a link, which a change makes a
    // directory: it cannot land while that change does not (the directory is not there to hold
    // it), named or not. Parents come first, so a chain is settled in one pass.
    for n in 0..items.len() {
        if !matches!(out[n], Verdict::Land | Verdict::Conflict(_)) {
            continue;
        }
        let path = &items[n].change.path;
        let blocked = path.ancestors().skip(1).find_map(|a| {
            let t = *at.get(a)?;
            let not_a_dir = items[t].change.old.as_ref().is_some_and(|o| o.kind != Kind::Dir);
            (not_a_dir && !matches!(out[t], Verdict::Land | Verdict::Done)).then(|| a.to_path_buf())
        });
        if let Some(a) = blocked {
            out[n] = Verdict::WithDirectory(a);
        }
    }
    out
}

/// The links that would land and lead out of the project once the apply is done, called out
/// (unless named). Each is resolved in the project as `verdicts` would leave it: what lands,
/// over what the project has (`link_in_project`: the target of its link at a path). Taking one
/// out can change where another leads, so this runs until nothing more is taken out.
pub(crate) fn links_leaving(
    items: &[Item],
    verdicts: &mut [Verdict],
    paths: &[PathBuf],
    link_in_project: &dyn Fn(&Path) -> Option<PathBuf>,
) {
    loop {
        let landing: HashMap<&Path, &super::changes::Change> = items
            .iter()
            .zip(verdicts.iter())
            .filter(|(_, v)| **v == Verdict::Land)
            .map(|(i, _)| (i.change.path.as_path(), &i.change))
            .collect();
        let after = |p: &Path| -> Option<PathBuf> {
            // Below something that lands as no directory (deleted: nothing new), nothing is.
            let gone = p
                .ancestors()
                .skip(1)
                .any(|a| landing.get(a).is_some_and(|c| c.new.is_none_or(|n| n.kind != Kind::Dir)));
            match landing.get(p) {
                _ if gone => None,
                Some(c) => c.link.clone().filter(|_| c.new.is_some_and(|n| n.kind == Kind::Link)),
                None => link_in_project(p),
            }
        };
        let mut out = Vec::new();
        for (n, i) in items.iter().enumerate() {
            // (A change carries a link's target only when it puts a link there.)
            let (Verdict::Land, Some(t)) = (&verdicts[n], &i.change.link) else { continue };
            if named_itself(&i.change.path, paths) {
                continue;
            }
            match resolve(&i.change.path, t, &after) {
                Leads::Inside(_) => {}
                Leads::Outside => out.push((n, Callout::LinkOut(t.clone()))),
                Leads::Loop => out.push((n, Callout::LinkLoop(t.clone()))),
            }
        }
        if out.is_empty() {
            return;
        }
        for (n, why) in out {
            verdicts[n] = Verdict::CalledOut(vec![why]);
        }
    }
}

/// Writes the items that `verdicts` say land, in order (parents first); each path that landed
/// is passed to `landed` as it does. Stops at the first failure, with the path.
pub(crate) fn land(
    items: &[Item],
    verdicts: &[Verdict],
    upper: &Tree,
    project: &Tree,
    landed: &mut dyn FnMut(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<usize> {
    let mut n = 0;
    for (i, v) in items.iter().zip(verdicts) {
        if *v != Verdict::Land {
            continue;
        }
        let c = &i.change;
        let at = crate::sys::quote::path(&project.path().join(&c.path));
        one(c, upper, project).map_err(|e| anyhow::anyhow!("applying {at}: {e}"))?;
        landed(&c.path)?;
        n += 1;
    }
    Ok(n)
}

fn one(c: &super::changes::Change, upper: &Tree, project: &Tree) -> std::io::Result<()> {
    let rel = c.path.as_path();
    let Some(new) = c.new.filter(|_| c.what != What::Deleted) else {
        return project.remove(rel);
    };
    // What the project has there now, if it is not what the change puts there, goes first (a
    // directory replaced by a file, a file by a link).
    let now = project.stat(rel)?;
    if now.is_some_and(|s| s.kind != new.kind || s.kind == Kind::Link) {
        project.remove(rel)?;
    }
    if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
        project.mkdir_all(parent, 0o755)?;
    }
    match new.kind {
        Kind::Dir => {
            project.mkdir_all(rel, new.mode)?;
            project.chmod(rel, new.mode)
        }
        Kind::Link => project.symlink(c.link.as_deref().unwrap_or(Path::new("")), rel),
        Kind::File => {
            // The user's own file with one name is moved, not copied, when the layer is on the
            // project's filesystem (one rename; nothing left to remove after): the session is
            // over, so nothing else holds it. Anything else is copied: a file the sandbox gave
            // several names lands as one file per name; a move that fails (another filesystem,
            // a directory of the layer made read-only) is a copy, whose error is the one said.
            if new.nlink == 1
                && new.uid == nix::unistd::getuid().as_raw()
                && upper.move_to(rel, project, rel, now.is_some()).is_ok()
            {
                return Ok(());
            }
            let (mut f, st) = upper.open_file(rel)?;
            project.write_from(rel, &mut f, st.mode, Some(st.mtime_ns))
        }
        Kind::Fifo | Kind::Socket | Kind::Device => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::changes::Change;
    use crate::sys::untrusted::Stat;

    fn item(path: &str, callouts: Vec<Callout>, conflict: Option<&str>) -> Item {
        let st = Stat {
            kind: Kind::File,
            mode: 0o644,
            ino: 1,
            len: 1,
            uid: 0,
            ctime_ns: 0,
            mtime_ns: 0,
            nlink: 1,
            rdev: 0,
        };
        Item {
            change: Change::new(path.into(), What::Added, Some(st), None),
            callouts,
            conflict: conflict.map(String::from),
            renamed_from: None,
        }
    }

    #[test]
    fn called_out_and_conflicting_items_land_only_when_named_and_git_internals_never() {
        let items = vec![
            item("src/a.rs", vec![], None),
            item(".envrc", vec![Callout::Protected(".envrc".into())], None),
            item("src/b.rs", vec![], Some("changed on the host")),
            item(".git/hooks/x", vec![Callout::GitInternals], None),
            item("done.txt", vec![], None),
        ];
        let done: HashSet<PathBuf> = [PathBuf::from("done.txt")].into();
        let all = decide(&items, &[], &done);
        assert_eq!(all[0], Verdict::Land);
        assert!(matches!(all[1], Verdict::CalledOut(_)));
        assert!(matches!(all[2], Verdict::Conflict(_)));
        assert_eq!(all[3], Verdict::Never);
        assert_eq!(all[4], Verdict::Done);
        let named = decide(&items, &[".envrc".into(), "src".into(), ".git".into()], &done);
        assert_eq!(named[..4], [Verdict::Land, Verdict::Land, Verdict::Land, Verdict::Never]);
        assert_eq!(named[4], Verdict::Done);
        let one = decide(&items, &["src/a.rs".into()], &done);
        assert_eq!(one[0], Verdict::Land);
        assert_eq!(one[1..4], [Verdict::NotSelected, Verdict::NotSelected, Verdict::NotSelected]);
        // A directory named for its edits does not carry a called-out item below it with them.
        let below = vec![
            item("src/a.rs", vec![], None),
            item("src/.envrc", vec![Callout::Protected(".envrc".into())], None),
        ];
        let v = decide(&below, &["src".into()], &done);
        assert_eq!(v[0], Verdict::Land);
        assert!(matches!(v[1], Verdict::CalledOut(_)), "{v:?}");
        assert_eq!(decide(&below, &["src".into(), "src/.envrc".into()], &done)[1], Verdict::Land);
        // What diff could not show (or a new executable bit) is lifted by naming a directory.
        let shown = vec![item("src/logo.png", vec![Callout::Binary], None)];
        assert!(matches!(decide(&shown, &[], &done)[0], Verdict::CalledOut(_)));
        assert_eq!(decide(&shown, &["src".into()], &done)[0], Verdict::Land);
        // A name that only starts the same is not a directory above it.
        assert_eq!(decide(&items, &["src/a".into()], &done)[0], Verdict::NotSelected);
    }

    #[test]
    fn a_named_path_that_selects_nothing_is_named_back() {
        let items = vec![item("src/a.rs", vec![], None), item("done.txt", vec![], None)];
        let paths: Vec<PathBuf> = ["src".into(), "src/a.rs".into(), "done.txt".into()].into();
        assert!(unmatched(&items, &paths).is_empty());
        let typo: Vec<PathBuf> =
            ["src/a.rs".into(), "src/a".into(), "srcx".into(), "/elsewhere/f".into()].into();
        let none: Vec<&Path> = unmatched(&items, &typo);
        assert_eq!(none, [Path::new("src/a"), Path::new("srcx"), Path::new("/elsewhere/f")]);
    }

    fn stat(kind: Kind) -> Stat {
        Stat { kind, mode: 0o755, ino: 2, len: 0, uid: 0, ctime_ns: 0, mtime_ns: 0, nlink: 1, rdev: 0 }
    }

    #[test]
    fn what_is_below_a_replaced_directory_lands_only_with_it() {
        let mut lib = item("lib", vec![Callout::Replaces { was: Kind::Dir, entries: 1 }], None);
        lib.change.what = What::Changed;
        lib.change.old = Some(stat(Kind::Dir));
        let mut below = item("lib/a.rs", vec![], None);
        below.change = Change::new("lib/a.rs".into(), What::Deleted, None, Some(stat(Kind::File)));
        below.change.part_of = Some("lib".into());
        let items = vec![lib, below, item("other", vec![], None)];
        let none = HashSet::new();
        let v = decide(&items, &[], &none);
        assert!(matches!(v[0], Verdict::CalledOut(_)));
        assert_eq!(v[1], Verdict::WithDirectory("lib".into()), "deleted without its directory");
        assert_eq!(v[2], Verdict::Land);
        assert_eq!(decide(&items, &["lib".into()], &none)[..2], [Verdict::Land, Verdict::Land]);
        // Named itself, a file below is deleted on its own.
        let one = decide(&items, &["lib/a.rs".into()], &none);
        assert_eq!(one[..2], [Verdict::NotSelected, Verdict::Land]);
        // A conflict below a named directory is taken as the sandbox's version with it.
        let mut c = items.clone();
        c[1].conflict = Some("changed on the host".into());
        assert_eq!(decide(&c, &[], &none)[1], Verdict::WithDirectory("lib".into()));
        assert_eq!(decide(&c, &["lib".into()], &none)[1], Verdict::Land);
        // A directory replaced by something that never lands (a fifo): what is below it stays,
        // even named through the directory; named itself, a file below is deleted on its own.
        let mut never = items.clone();
        never[0].callouts = vec![Callout::Special(Kind::Fifo)];
        assert_eq!(
            decide(&never, &["lib".into()], &none)[..2],
            [Verdict::Never, Verdict::WithDirectory("lib".into())]
        );
        assert_eq!(decide(&never, &["lib/a.rs".into()], &none)[1], Verdict::Land);
        // A called-out item below holds the directory back, named or not, until it is named
        // itself: what apply says it left is still there after it.
        let mut held = items.clone();
        held[1].callouts = vec![Callout::Protected(".npmrc".into())];
        let v = decide(&held, &["lib".into()], &none);
        assert_eq!(v[0], Verdict::CalledOut(vec![Callout::Holds(vec!["lib/a.rs".into()])]));
        assert!(matches!(v[1], Verdict::CalledOut(_)), "{v:?}");
        assert!(matches!(decide(&held, &[], &none)[1], Verdict::CalledOut(_)));
        assert_eq!(
            decide(&held, &["lib".into(), "lib/a.rs".into()], &none)[..2],
            [Verdict::Land, Verdict::Land]
        );
        // Applied before: what is below lands now.
        let done: HashSet<PathBuf> = [PathBuf::from("lib")].into();
        assert_eq!(decide(&items, &[], &done)[..2], [Verdict::Done, Verdict::Land]);
    }

    /// Landing on real trees: a link changed to another target, a file in a directory the
    /// project lacks (named alone), the user's own file moved out of the layer, a file with two
    /// names copied (its layer inode stays there).
    #[test]
    fn each_kind_lands_as_diff_showed_it_and_only_a_lone_own_file_is_moved() {
        use std::os::unix::fs::{MetadataExt, symlink};
        let t = tempfile::tempdir().unwrap();
        let (up, proj) = (t.path().join("upper"), t.path().join("proj"));
        std::fs::create_dir_all(up.join("d")).unwrap();
        std::fs::create_dir_all(&proj).unwrap();
        symlink("old", proj.join("l")).unwrap();
        symlink("new", up.join("l")).unwrap();
        std::fs::write(up.join("d/f"), "own\n").unwrap();
        std::fs::write(up.join("g"), "two names\n").unwrap();
        std::fs::hard_link(up.join("g"), up.join("g2")).unwrap();
        let (u, p) = (Tree::open(&up).unwrap(), Tree::open(&proj).unwrap());
        let at = |rel: &str| u.stat(Path::new(rel)).unwrap().unwrap();
        let mut l = item("l", vec![], None);
        l.change = Change::new("l".into(), What::Changed, Some(at("l")), Some(stat(Kind::Link)));
        l.change.link = Some("new".into());
        let mut f = item("d/f", vec![], None);
        f.change = Change::new("d/f".into(), What::Added, Some(at("d/f")), None);
        let mut g = item("g", vec![], None);
        g.change = Change::new("g".into(), What::Added, Some(at("g")), None);
        let items = vec![l, f, g];
        let n =
            land(&items, &[Verdict::Land, Verdict::Land, Verdict::Land], &u, &p, &mut |_| Ok(())).unwrap();
        assert_eq!(n, 3);
        assert_eq!(std::fs::read_link(proj.join("l")).unwrap(), Path::new("new"));
        assert_eq!(std::fs::read_to_string(proj.join("d/f")).unwrap(), "own\n");
        assert!(!up.join("d/f").exists(), "the user's own file with one name is moved");
        assert_eq!(std::fs::read_to_string(proj.join("g")).unwrap(), "two names\n");
        let (a, b) = (std::fs::metadata(up.join("g")).unwrap(), std::fs::metadata(proj.join("g")).unwrap());
        assert_ne!(a.ino(), b.ino(), "a file with two names is copied");
    }

    fn link(path: &str, target: &str) -> Item {
        let mut i = item(path, vec![], None);
        i.change.new = Some(stat(Kind::Link));
        i.change.link = Some(target.into());
        i
    }

    #[test]
    fn a_link_that_would_lead_out_once_applied_is_held_back_however_it_gets_there() {
        // `a/b` -> `..` (the root: inside) and `a/c` -> `b/../victim` (through `a/b`: out).
        let items = vec![link("a/b", ".."), link("a/c", "b/../victim"), link("a/d", "b/x")];
        let none = HashSet::new();
        let mut v = decide(&items, &[], &none);
        links_leaving(&items, &mut v, &[], &|_| None);
        assert_eq!(v[0], Verdict::Land);
        assert_eq!(v[1], Verdict::CalledOut(vec![Callout::LinkOut("b/../victim".into())]));
        assert_eq!(v[2], Verdict::Land, "through the same link, and inside");
        // Named, it lands.
        let named = vec![PathBuf::from("a/c")];
        let mut v = decide(&items, &named, &none);
        links_leaving(&items, &mut v, &named, &|_| None);
        assert_eq!(v[1], Verdict::Land);
        // Without `a/b` landing (held back), the project's own `a/b`, a link out, is what `a/d`
        // goes through.
        let mut held = items.clone();
        held[0].callouts = vec![Callout::Protected("a/b".into())];
        let mut v = decide(&held, &[], &none);
        links_leaving(&held, &mut v, &[], &|p| (p == Path::new("a/b")).then(|| "../..".into()));
        assert_eq!(v[2], Verdict::CalledOut(vec![Callout::LinkOut("b/x".into())]));
        // A directory deleted on the way: the project's link below it is gone with it.
        let mut gone = item("a", vec![], None);
        gone.change = Change::new("a".into(), What::Deleted, None, Some(stat(Kind::Dir)));
        let items = vec![gone, link("z", "a/b/../..")];
        let mut v = decide(&items, &[], &none);
        links_leaving(&items, &mut v, &[], &|p| (p == Path::new("a/b")).then(|| "..".into()));
        assert_eq!(v[1], Verdict::Land, "a/b is deleted: `..` of a/b is a");
        // A file in place of a directory on the way: the project's link below it is gone too.
        let mut file = item("a", vec![], None);
        file.change = Change::new("a".into(), What::Changed, Some(stat(Kind::File)), Some(stat(Kind::Dir)));
        let items = vec![file, link("z", "a/b/../..")];
        let mut v = decide(&items, &[], &none);
        links_leaving(&items, &mut v, &[], &|p| (p == Path::new("a/b")).then(|| "..".into()));
        assert_eq!(v[1], Verdict::Land, "a is a file: a/b is no link");
        // ... and a directory on the way keeps it: through it, the same target leads out.
        let mut dir = item("a", vec![], None);
        dir.change = Change::new("a".into(), What::Changed, Some(stat(Kind::Dir)), Some(stat(Kind::Dir)));
        let items = vec![dir, link("z", "a/b/../..")];
        let mut v = decide(&items, &[], &none);
        links_leaving(&items, &mut v, &[], &|p| (p == Path::new("a/b")).then(|| "..".into()));
        assert!(matches!(&v[1], Verdict::CalledOut(_)), "{v:?}");
        // Taking one out changes another: `x` lands only if it does not lead out through `y`.
        let items = vec![link("y", "/etc"), link("x", "y")];
        let mut v = decide(&items, &[], &none);
        links_leaving(&items, &mut v, &[], &|_| None);
        assert!(matches!(&v[0], Verdict::CalledOut(_)) && matches!(&v[1], Verdict::CalledOut(_)));
    }
}
