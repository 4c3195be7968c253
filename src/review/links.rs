//! Where a link leads, resolved as the kernel resolves it: one name at a time, each link met on
//! the way replaced by its target, `..` taken from where the walk is (not from the text). Pure:
//! the links on the way come from a lookup the caller gives (the layer over the project, the
//! project alone, the project as an apply will leave it), so `diff`'s call-outs and `apply`'s
//! last check resolve the same way (docs/adr/0072).

use std::path::{Component, Path, PathBuf};

/// Where a link leads, resolved as the kernel resolves it: one name at a time, each link met on
/// the way replaced by its target, `..` taken from where the walk is (not from the text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Leads {
    /// To this path in the project (which need not exist).
    Inside(PathBuf),
    Outside,
    Loop,
}

impl Leads {
    pub(crate) fn is_inside(&self) -> bool {
        matches!(self, Leads::Inside(_))
    }
}

/// The kernel's limit on links followed in one resolution (`MAXSYMLINKS`).
const HOPS_MAX: usize = 40;

/// Resolves the link at `at` with `target` in a project whose links `link_at` gives (the
/// target of the link at a path relative to the project, None where there is none).
pub(crate) fn resolve(at: &Path, target: &Path, link_at: &dyn Fn(&Path) -> Option<PathBuf>) -> Leads {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    /// Puts a link's text before what is left to walk; false for an absolute one.
    fn prepend(todo: &mut VecDeque<OsString>, t: &Path) -> bool {
        for c in t.components().rev() {
            match c {
                Component::Normal(n) => todo.push_front(n.to_os_string()),
                Component::ParentDir => todo.push_front("..".into()),
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => return false,
            }
        }
        true
    }
    let mut here: Vec<OsString> =
        at.parent().map(|p| p.iter().map(OsString::from).collect()).unwrap_or_default();
    let mut todo = VecDeque::new();
    if !prepend(&mut todo, target) {
        return Leads::Outside;
    }
    let mut hops = 0;
    while let Some(n) = todo.pop_front() {
        if n == ".." {
            if here.pop().is_none() {
                return Leads::Outside;
            }
            continue;
        }
        here.push(n);
        let Some(t) = link_at(&here.iter().collect::<PathBuf>()) else { continue };
        hops += 1;
        if hops > HOPS_MAX {
            return Leads::Loop;
        }
        here.pop();
        if !prepend(&mut todo, &t) {
            return Leads::Outside;
        }
    }
    Leads::Inside(here.iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_resolved_through_the_links_on_its_way() {
        let links: std::collections::HashMap<PathBuf, PathBuf> = [
            ("a/b", ".."),
            ("up", "../.."),
            ("d/self", "self"),
            ("d/x", "y"),
            ("d/y", "x"),
            ("in", "src"),
            ("abs", "/tmp"),
        ]
        .into_iter()
        .map(|(a, b)| (PathBuf::from(a), PathBuf::from(b)))
        .collect();
        let at = |p: &Path| links.get(p).cloned();
        let r = |at_: &str, t: &str| resolve(Path::new(at_), Path::new(t), &at);
        // `b` is `..` of `a`: the project's root; one more `..` leaves (the text alone stays in).
        assert_eq!(r("a/c", "b/../victim"), Leads::Outside);
        assert_eq!(r("a/c", "b/victim"), Leads::Inside("victim".into()));
        assert_eq!(r("z", "up/x"), Leads::Outside, "through a link at the root that climbs");
        assert_eq!(r("z", "abs/x"), Leads::Outside, "through an absolute link");
        assert_eq!(r("z", "in/../src/main.rs"), Leads::Inside("src/main.rs".into()));
        assert_eq!(r("d/l", "self"), Leads::Loop);
        assert_eq!(r("d/l", "x"), Leads::Loop);
        assert_eq!(r("z", "./."), Leads::Inside("".into()));
        assert_eq!(r("z", ".."), Leads::Outside);
        assert_eq!(r("z", "/"), Leads::Outside);
        assert!(
            Leads::Inside("x".into()).is_inside() && !Leads::Outside.is_inside() && !Leads::Loop.is_inside()
        );
    }

    /// A chain of links is followed for `HOPS_MAX` of them (as the kernel follows 40), one
    /// more is a loop.
    #[test]
    fn a_chain_of_links_is_followed_to_the_bound_and_no_further() {
        // c0 -> c1 -> ... -> cN, and cN is no link.
        let chain = |n: usize| {
            move |p: &Path| {
                let i: usize = p.to_str()?.strip_prefix('c')?.parse().ok()?;
                (i < n).then(|| PathBuf::from(format!("c{}", i + 1)))
            }
        };
        let at = chain(HOPS_MAX);
        assert_eq!(
            resolve(Path::new("z"), Path::new("c0"), &at),
            Leads::Inside(format!("c{HOPS_MAX}").into())
        );
        let at = chain(HOPS_MAX + 1);
        assert_eq!(resolve(Path::new("z"), Path::new("c0"), &at), Leads::Loop);
    }
}
