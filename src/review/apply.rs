//! `ai-sandbox apply`: what lands, decided first (pure: `decide`), then written into the project
//! (`land`) through a `Tree` of the project, so a link the host has where the change puts a file
//! is replaced, never written through, and nothing is read from the upper layer but regular
//! files, opened without following a link.
//!
//! The decision: everything selected lands, except git's internals and special files (never),
//! called-out items that were not named, and items already applied. If a selected item
//! conflicts (the host changed it after the session started) and was not named, nothing lands.

use super::callout::Callout;
use super::changes::What;
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
}

/// Whether `path` is named by one of `paths` (itself, or a directory above it).
fn named(path: &Path, paths: &[PathBuf]) -> bool {
    paths.iter().any(|p| !p.as_os_str().is_empty() && path.starts_with(p))
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
    items
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
            } else if !i.callouts.is_empty() && !by_name {
                Verdict::CalledOut(i.callouts.clone())
            } else if let Some(why) = i.conflict.as_ref().filter(|_| !by_name) {
                Verdict::Conflict(why.clone())
            } else {
                Verdict::Land
            }
        })
        .collect()
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
    // Hard links the sandbox made: the second name is linked to the first one written here.
    let mut linked: HashMap<u64, PathBuf> = HashMap::new();
    let mut n = 0;
    for (i, v) in items.iter().zip(verdicts) {
        if *v != Verdict::Land {
            continue;
        }
        let c = &i.change;
        let at = crate::sys::quote::path(&project.path().join(&c.path));
        one(c, upper, project, &mut linked).map_err(|e| anyhow::anyhow!("applying {at}: {e}"))?;
        landed(&c.path)?;
        n += 1;
    }
    Ok(n)
}

fn one(
    c: &super::changes::Change,
    upper: &Tree,
    project: &Tree,
    linked: &mut HashMap<u64, PathBuf>,
) -> std::io::Result<()> {
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
            if new.nlink > 1
                && let Some(first) = linked.get(&new.ino).or(c.link_of.as_ref())
                && project.stat(first)?.is_some_and(|s| s.kind == Kind::File)
            {
                return project.hard_link(first, rel);
            }
            // The user's own file with one name is moved, not copied, when the layer is on the
            // project's filesystem (one rename; nothing left to remove after): the session is
            // over, so nothing else holds it. Anything else is copied.
            if new.nlink == 1 && new.uid == nix::unistd::getuid().as_raw() {
                match upper.move_to(rel, project, rel, now.is_some()) {
                    Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {}
                    moved => return moved,
                }
            }
            let (mut f, st) = upper.open_file(rel)?;
            project.write_from(rel, &mut f, st.mode, Some(st.mtime_ns))?;
            linked.insert(new.ino, rel.to_path_buf());
            Ok(())
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
            born: 0,
            ctime_ns: 0,
            mtime_ns: 0,
            nlink: 1,
            rdev: 0,
        };
        Item {
            change: Change {
                path: path.into(),
                what: What::Added,
                new: Some(st),
                old: None,
                link: None,
                copied_up: false,
                link_of: None,
            },
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
}
