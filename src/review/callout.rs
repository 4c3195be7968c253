//! Which changes `diff` calls out and `apply` leaves alone unless named: what the file guard
//! would refuse in a direct session (a path the host runs or trusts, git's internals), and what
//! a reader should see before it lands (a link out of the project, however it gets there; a
//! set-id, world-writable or new executable bit; a very large file; a fifo or device; a
//! directory replaced by something else or deleted with a repository in it). Pure: the
//! change's facts in, reasons out (where a link leads is `links`'s to say).

use super::changes::{Change, What, in_git_dir};
use super::links::Leads;
use crate::sys::untrusted::Kind;
use std::path::{Path, PathBuf};

/// A file over this many bytes is called out: `diff` does not show its content (a build output
/// or a dump, rarely a source edit).
pub(crate) const LARGE: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Callout {
    /// Inside a `.git` directory (or a `.git` file): never applied as files; commits arrive as a
    /// branch.
    GitInternals,
    /// A path the host runs or trusts (the protected path it falls under).
    Protected(String),
    /// A link that leads out of the project (its target as written).
    LinkOut(PathBuf),
    /// A link that leads to itself through links (the kernel refuses it: ELOOP).
    LinkLoop(PathBuf),
    /// A link to a path the host runs or trusts (the path it leads to, the protected path).
    LinkToProtected(PathBuf, String),
    /// A set-user-ID or set-group-ID file, or a directory that gained either bit.
    SetId,
    /// A file or directory that others may write (and did not before).
    WorldWritable,
    /// A new file, or one that was not executable, that is.
    Executable,
    /// Over `LARGE`: its content is not shown.
    Large(u64),
    /// A NUL byte in its first 8 KiB: its content is not shown (`show::binary`).
    Binary,
    /// A fifo, socket or device: never applied.
    Special(Kind),
    /// Something of another kind in place of a directory of the project (everything below it is
    /// deleted), or a directory in place of a file or link.
    Replaces { was: Kind, entries: usize },
    /// Deletes repositories (their `.git`), and with them their commits.
    DeletesRepositories(Vec<PathBuf>),
    /// A directory whose deletion would take these called-out items below it (decided by
    /// `apply`: they land only when named themselves, and the directory with them).
    Holds(Vec<PathBuf>),
}

impl Callout {
    /// Whether naming the path in `apply` lets it land (git's internals and special files never).
    pub(crate) fn may_be_named(&self) -> bool {
        !matches!(self, Callout::GitInternals | Callout::Special(_))
    }

    /// Whether naming a directory above the item lifts it (what `diff` could not show, or a new
    /// executable bit). Every other call-out is lifted only by naming the item itself: a
    /// directory named for the edits below it does not carry a planted hook or link with them.
    pub(crate) fn lifted_by_directory(&self) -> bool {
        matches!(self, Callout::Executable | Callout::Large(_) | Callout::Binary)
    }

    pub(crate) fn words(&self) -> String {
        use crate::sys::quote;
        match self {
            Callout::GitInternals => {
                "git's internals: never applied as files (commits arrive as a branch; hooks and config never)"
                    .into()
            }
            Callout::Protected(p) => format!("the host runs or trusts this (protected path {p})"),
            Callout::LinkOut(t) => format!("a link out of the project (to {})", quote::path(t)),
            Callout::LinkLoop(t) => format!("a link that leads back to itself (to {})", quote::path(t)),
            Callout::LinkToProtected(to, p) => {
                format!("a link to {}, which the host runs or trusts (protected path {p})", quote::path(to))
            }
            Callout::SetId => "set-user-ID or set-group-ID".into(),
            Callout::WorldWritable => "writable by every user of the machine".into(),
            Callout::Executable => "executable".into(),
            Callout::Large(n) => format!("{n} bytes: over {} MiB, its content is not shown", LARGE >> 20),
            Callout::Binary => "binary (a NUL byte in its first 8 KiB): its content is not shown".into(),
            Callout::Special(k) => format!("{}: never applied", k.name()),
            Callout::Replaces { was: Kind::Dir, entries } => {
                format!("replaces a directory: deletes it and the {entries} entries below it (listed)")
            }
            Callout::Replaces { was, .. } => format!("a directory in place of {}", was.name()),
            Callout::DeletesRepositories(r) => {
                let r: Vec<String> = r.iter().map(|p| quote::path(p)).collect();
                format!("deletes the repository {} with its commits", r.join(", "))
            }
            Callout::Holds(below) => {
                let b: Vec<String> = below.iter().map(|p| quote::arg(p)).collect();
                format!("would delete what is called out below it ({}): name those too", b.join(" "))
            }
        }
    }
}

/// Why `c` is called out (none: it lands with a plain `apply`). `protected`: the protected paths
/// (the defaults and `protect` lines), each matched at any depth (a nested project's
/// `.ai-sandbox/config`, a subdirectory's `.envrc` are run or trusted there too).
pub(crate) fn of(c: &Change, protected: &[String]) -> Vec<Callout> {
    let mut out = Vec::new();
    if in_git_dir(&c.path) {
        out.push(Callout::GitInternals);
    }
    if let Some(p) = protected_at(&c.path, protected) {
        out.push(Callout::Protected(p));
    }
    if !c.below.repos.is_empty() {
        out.push(Callout::DeletesRepositories(c.below.repos.clone()));
    }
    let Some(new) = c.new.filter(|_| c.what != What::Deleted) else { return out };
    if let Some(was) = c.replaces() {
        out.push(Callout::Replaces { was, entries: c.below.entries });
    }
    if let (Some(t), Some(leads)) = (&c.link, &c.leads) {
        match leads {
            Leads::Outside => out.push(Callout::LinkOut(t.clone())),
            Leads::Loop => out.push(Callout::LinkLoop(t.clone())),
            Leads::Inside(to) => {
                if let Some((to, p)) = std::iter::once(to)
                    .chain(c.leads_too.as_ref())
                    .find_map(|to| protected_at(to, protected).map(|p| (to, p)))
                {
                    out.push(Callout::LinkToProtected(to.clone(), p));
                }
            }
        }
    }
    if matches!(new.kind, Kind::Fifo | Kind::Socket | Kind::Device) {
        out.push(Callout::Special(new.kind));
    }
    let had = |bits: u32| c.old.is_some_and(|o| o.kind == new.kind && o.mode & bits == bits);
    if matches!(new.kind, Kind::File | Kind::Dir) {
        let set_id = new.mode & 0o6000;
        if set_id != 0 && (new.kind == Kind::File || !had(set_id)) {
            out.push(Callout::SetId);
        }
        if new.mode & 0o002 != 0 && !had(0o002) {
            out.push(Callout::WorldWritable);
        }
    }
    if new.kind == Kind::File {
        let was_exec = c.old.is_some_and(|o| o.kind == Kind::File && o.mode & 0o111 != 0);
        if new.mode & 0o111 != 0 && !was_exec {
            out.push(Callout::Executable);
        }
        if new.len > LARGE {
            out.push(Callout::Large(new.len));
        }
    }
    out
}

/// The protected path `path` is, or is below, matched at any depth.
fn protected_at(path: &Path, protected: &[String]) -> Option<String> {
    protected.iter().find(|p| under_at_any_depth(path, Path::new(p.as_str()))).cloned()
}

/// Whether `path` is `p` or below it, with `p` starting at any directory of `path`.
fn under_at_any_depth(path: &Path, p: &Path) -> bool {
    let names: Vec<_> = path.components().collect();
    let want: Vec<_> = p.components().collect();
    (0..names.len()).any(|i| names[i..].starts_with(&want))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::changes::Below;
    use crate::review::links::resolve;
    use crate::sys::untrusted::Stat;

    pub(crate) fn stat(kind: Kind, mode: u32, len: u64) -> Stat {
        Stat { kind, mode, ino: 1, len, uid: 1000, ctime_ns: 0, mtime_ns: 0, nlink: 1, rdev: 0 }
    }
    fn change(path: &str, what: What, new: Option<Stat>, old: Option<Stat>, link: Option<&str>) -> Change {
        let leads = link.map(|t| resolve(Path::new(path), Path::new(t), &|_| None));
        Change {
            path: path.into(),
            what,
            new,
            old,
            link: link.map(PathBuf::from),
            leads,
            leads_too: None,
            copied_up: false,
            same_as: Vec::new(),
            below: Below::default(),
            part_of: None,
        }
    }
    fn protected() -> Vec<String> {
        crate::plan::protect::candidates(&["secrets/x".into()])
    }

    #[test]
    fn host_run_paths_are_called_out_at_any_depth_and_plain_sources_are_not() {
        let file = Some(stat(Kind::File, 0o644, 10));
        let at = |p: &str| of(&change(p, What::Added, file, None, None), &protected());
        assert_eq!(at("src/main.rs"), vec![]);
        assert_eq!(at(".envrc"), vec![Callout::Protected(".envrc".into())]);
        assert_eq!(at("sub/dir/.envrc"), vec![Callout::Protected(".envrc".into())]);
        assert_eq!(at("nested/.ai-sandbox/config"), vec![Callout::Protected(".ai-sandbox".into())]);
        assert_eq!(at("secrets/x"), vec![Callout::Protected("secrets/x".into())]);
        assert_eq!(at("envrc"), vec![], "a name that only ends the same is not it");
        assert_eq!(
            at("lib/.git/hooks/pre-commit"),
            vec![Callout::GitInternals, Callout::Protected(".git/hooks".into())]
        );
        assert_eq!(at(".git/objects/ab/cd"), vec![Callout::GitInternals]);
        // A deletion of a protected path is called out too (it stops the host trusting it).
        assert_eq!(of(&change(".envrc", What::Deleted, None, file, None), &protected()).len(), 1);
    }

    #[test]
    fn links_out_set_id_new_executables_large_and_special_files_are_called_out() {
        let p = protected();
        let link = Some(stat(Kind::Link, 0o777, 3));
        let l = |at: &str, t: &str| of(&change(at, What::Added, link, None, Some(t)), &p);
        assert_eq!(l("a", "/etc/passwd"), vec![Callout::LinkOut("/etc/passwd".into())]);
        assert_eq!(l("a/b", "../../x"), vec![Callout::LinkOut("../../x".into())]);
        assert_eq!(l("a/b", "../x"), vec![], "stays in the project");
        assert_eq!(l("a/b", "c/../../x"), vec![]);
        assert_eq!(l("a/b", "./c/./../x"), vec![]);
        assert_eq!(l("a", "x/../../y"), vec![Callout::LinkOut("x/../../y".into())]);
        assert_eq!(
            l("a/b", "../.git/config"),
            vec![Callout::LinkToProtected(".git/config".into(), ".git/config".into())]
        );
        assert_eq!(l("a", ".envrc"), vec![Callout::LinkToProtected(".envrc".into(), ".envrc".into())]);
        let f = |mode, len, old: Option<Stat>| {
            of(
                &change(
                    "bin/run",
                    if old.is_some() { What::Changed } else { What::Added },
                    Some(stat(Kind::File, mode, len)),
                    old,
                    None,
                ),
                &p,
            )
        };
        assert_eq!(f(0o755, 1, None), vec![Callout::Executable]);
        assert_eq!(f(0o755, 1, Some(stat(Kind::File, 0o755, 1))), vec![], "was executable already");
        assert_eq!(f(0o744, 1, Some(stat(Kind::File, 0o644, 1))), vec![Callout::Executable]);
        assert_eq!(f(0o4755, 1, Some(stat(Kind::File, 0o755, 1))), vec![Callout::SetId]);
        assert_eq!(f(0o2644, 1, None), vec![Callout::SetId]);
        assert_eq!(
            f(0o2644, 1, Some(stat(Kind::File, 0o2644, 1))),
            vec![Callout::SetId],
            "a set-id file, always"
        );
        assert_eq!(f(0o646, 1, None), vec![Callout::WorldWritable]);
        assert_eq!(f(0o666, 1, Some(stat(Kind::File, 0o666, 1))), vec![], "others could write it before");
        assert_eq!(f(0o644, LARGE + 1, None), vec![Callout::Large(LARGE + 1)]);
        assert_eq!(f(0o644, LARGE, None), vec![]);
        let fifo = of(&change("q", What::Added, Some(stat(Kind::Fifo, 0o644, 0)), None, None), &p);
        assert_eq!(fifo, vec![Callout::Special(Kind::Fifo)]);
        assert!(!fifo[0].may_be_named() && !Callout::GitInternals.may_be_named());
        assert!(Callout::Executable.may_be_named() && Callout::Protected(".envrc".into()).may_be_named());
        // What a directory named above it lifts: what diff could not show, a new executable bit.
        assert!(Callout::Binary.lifted_by_directory() && Callout::Large(1).lifted_by_directory());
        assert!(Callout::Executable.lifted_by_directory());
        for c in [
            Callout::Protected(".envrc".into()),
            Callout::LinkOut("/".into()),
            Callout::SetId,
            Callout::WorldWritable,
            Callout::Holds(vec![]),
        ] {
            assert!(!c.lifted_by_directory(), "{c:?}");
        }
        // Directories: a mode others may write, or a set-group-ID bit, that they did not have.
        let d = |mode, old: Option<Stat>| {
            let what = if old.is_some() { What::Changed } else { What::Added };
            of(&change("share", what, Some(stat(Kind::Dir, mode, 0)), old, None), &p)
        };
        assert_eq!(d(0o755, None), vec![]);
        assert_eq!(d(0o777, None), vec![Callout::WorldWritable]);
        assert_eq!(d(0o2755, Some(stat(Kind::Dir, 0o755, 0))), vec![Callout::SetId]);
        assert_eq!(d(0o2777, Some(stat(Kind::Dir, 0o2777, 0))), vec![], "as the project had it");
    }

    #[test]
    fn a_replaced_or_deleted_directory_is_called_out_for_what_it_takes_with_it() {
        let p = protected();
        let mut c = change(
            "lib",
            What::Changed,
            Some(stat(Kind::File, 0o644, 2)),
            Some(stat(Kind::Dir, 0o755, 0)),
            None,
        );
        c.below = Below { entries: 3, repos: vec!["lib/.git".into()], truncated: false };
        let got = of(&c, &p);
        assert_eq!(
            got,
            vec![
                Callout::DeletesRepositories(vec!["lib/.git".into()]),
                Callout::Replaces { was: Kind::Dir, entries: 3 }
            ]
        );
        assert!(got[1].words().contains("3 entries below"), "{}", got[1].words());
        let d = change(
            "x",
            What::Changed,
            Some(stat(Kind::Dir, 0o755, 0)),
            Some(stat(Kind::File, 0o644, 1)),
            None,
        );
        assert_eq!(of(&d, &p), vec![Callout::Replaces { was: Kind::File, entries: 0 }]);
        let mut gone = change("lib2", What::Deleted, None, Some(stat(Kind::Dir, 0o755, 0)), None);
        assert_eq!(of(&gone, &p), vec![], "a deleted folder with no repository: its files are listed");
        gone.below.repos = vec!["lib2/.git".into(), "lib2/sub/.git".into()];
        let w = of(&gone, &p);
        assert_eq!(w[0].words(), "deletes the repository lib2/.git, lib2/sub/.git with its commits");
        // A file replacing a file, or a link replacing a file, deletes nothing more.
        let f = change(
            "a",
            What::Changed,
            Some(stat(Kind::Link, 0o777, 1)),
            Some(stat(Kind::File, 0o644, 1)),
            Some("b"),
        );
        assert_eq!(of(&f, &p), vec![]);
    }
}
