//! Which changes `diff` calls out and `apply` leaves alone unless named: what the file guard
//! would refuse in a direct session (a path the host runs or trusts, git's internals), and what
//! a reader should see before it lands (a link out of the project, a set-id or new executable
//! bit, a very large file, a fifo or device). Pure: the change's facts in, reasons out.

use super::changes::{Change, What, in_git_dir};
use crate::sys::untrusted::Kind;
use std::path::{Component, Path, PathBuf};

/// A file over this many bytes is called out (a build output or a dump, rarely a source edit).
pub(crate) const LARGE: u64 = 32 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Callout {
    /// Inside a `.git` directory (or a `.git` file): never applied as files; commits arrive as a
    /// branch.
    GitInternals,
    /// A path the host runs or trusts (the protected path it falls under).
    Protected(String),
    /// A link whose target is outside the project.
    LinkOut(PathBuf),
    SetId,
    /// A new file, or one that was not executable, that is.
    Executable,
    Large(u64),
    /// A fifo, socket or device: never applied.
    Special(Kind),
}

impl Callout {
    /// Whether naming the path in `apply` lets it land (git's internals and special files never).
    pub(crate) fn may_be_named(&self) -> bool {
        !matches!(self, Callout::GitInternals | Callout::Special(_))
    }

    pub(crate) fn words(&self) -> String {
        match self {
            Callout::GitInternals => {
                "git's internals: never applied as files (commits arrive as a branch; hooks and config never)"
                    .into()
            }
            Callout::Protected(p) => format!("the host runs or trusts this (protected path {p})"),
            Callout::LinkOut(t) => format!("a link out of the project (to {})", crate::sys::quote::path(t)),
            Callout::SetId => "a set-user-ID or set-group-ID file".into(),
            Callout::Executable => "executable".into(),
            Callout::Large(n) => format!("{n} bytes (over {} MiB)", LARGE >> 20),
            Callout::Special(k) => format!("{}: never applied", k.name()),
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
    if let Some(p) = protected.iter().find(|p| under_at_any_depth(&c.path, Path::new(p.as_str()))) {
        out.push(Callout::Protected(p.clone()));
    }
    let Some(new) = c.new.filter(|_| c.what != What::Deleted) else { return out };
    if let Some(t) = &c.link
        && leaves(&c.path, t)
    {
        out.push(Callout::LinkOut(t.clone()));
    }
    if matches!(new.kind, Kind::Fifo | Kind::Socket | Kind::Device) {
        out.push(Callout::Special(new.kind));
    }
    if new.kind == Kind::File {
        if new.mode & 0o6000 != 0 {
            out.push(Callout::SetId);
        }
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

/// Whether `path` is `p` or below it, with `p` starting at any directory of `path`.
fn under_at_any_depth(path: &Path, p: &Path) -> bool {
    let names: Vec<_> = path.components().collect();
    let want: Vec<_> = p.components().collect();
    (0..names.len()).any(|i| names[i..].starts_with(&want))
}

/// Whether a link at `at` with target `target` leads out of the project: absolute, or with more
/// `..` than `at` has directories above it at some point.
pub(crate) fn leaves(at: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return true;
    }
    let mut depth = at.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::untrusted::Stat;

    fn stat(kind: Kind, mode: u32, len: u64) -> Stat {
        Stat { kind, mode, ino: 1, len, uid: 1000, born: 0, ctime_ns: 0, mtime_ns: 0, nlink: 1, rdev: 0 }
    }
    fn change(path: &str, what: What, new: Option<Stat>, old: Option<Stat>, link: Option<&str>) -> Change {
        Change {
            path: path.into(),
            what,
            new,
            old,
            link: link.map(PathBuf::from),
            copied_up: false,
            link_of: None,
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
        assert_eq!(l("a", "x/../../y"), vec![Callout::LinkOut("x/../../y".into())]);
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
        assert_eq!(f(0o644, LARGE + 1, None), vec![Callout::Large(LARGE + 1)]);
        assert_eq!(f(0o644, LARGE, None), vec![]);
        let fifo = of(&change("q", What::Added, Some(stat(Kind::Fifo, 0o644, 0)), None, None), &p);
        assert_eq!(fifo, vec![Callout::Special(Kind::Fifo)]);
        assert!(!fifo[0].may_be_named() && !Callout::GitInternals.may_be_named());
        assert!(Callout::Executable.may_be_named() && Callout::Protected(".envrc".into()).may_be_named());
    }
}
