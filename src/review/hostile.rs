//! Review mode on hostile ground: random upper layers (links of every kind, through other links
//! and out; hard links to protected and ordinary files; a file or link where the project has a
//! directory; world-writable and set-id modes; escape bytes in names; fifos; directories made
//! again over a nested repository) read by `diff` and landed by a plain `apply`. Whatever the
//! layer, every change to the project is one `diff` listed and `apply` decided to land, nothing
//! outside the project changes, no landed name is a second name of a file, no link `apply`
//! made leads out of the project, git's internals never land, and nothing raw is printed.

use super::apply::{self, Verdict};
use super::changes::{self, testing};
use super::links::{Leads, resolve};
use super::show;
use crate::sys::untrusted::Tree;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

struct Ground {
    _tmp: tempfile::TempDir,
    project: PathBuf,
    upper: PathBuf,
    outside: PathBuf,
}

/// A project with a repository at its root and one below (`lib`), a directory of files, and a
/// directory of the user's beside it that nothing may touch.
fn ground() -> Ground {
    let tmp = testing::on_disk();
    let (project, upper, outside) = (tmp.path().join("p"), tmp.path().join("u"), tmp.path().join("home"));
    for d in [
        "p/.git/objects",
        "p/.git/refs/heads",
        "p/lib/.git/refs/heads",
        "p/lib/src",
        "p/d/e",
        "u",
        "home/victim",
    ] {
        fs::create_dir_all(tmp.path().join(d)).unwrap();
    }
    for (f, t) in [
        ("p/.git/config", "[core]\n\tbare = false\n"),
        ("p/.git/HEAD", "ref: refs/heads/main\n"),
        ("p/lib/.git/config", "[core]\n"),
        ("p/lib/.git/HEAD", "ref: refs/heads/main\n"),
        ("p/lib/src/x.rs", "x\n"),
        ("p/a.txt", "a\n"),
        ("p/d/c.txt", "c\n"),
        ("p/d/e/f.txt", "f\n"),
        ("home/victim/id_ed25519", "PRIVATE\n"),
    ] {
        fs::write(tmp.path().join(f), t).unwrap();
    }
    Ground { project, upper, outside, _tmp: tmp }
}

/// Every entry under `dir` with what it is: bytes, a link's text, or a directory; and its inode.
fn contents(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u64, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let (p, m) = (e.path(), fs::symlink_metadata(e.path()).unwrap());
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            let bytes = if m.is_dir() {
                stack.push(p.clone());
                b"<dir>".to_vec()
            } else if m.file_type().is_symlink() {
                fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes()
            } else if m.is_file() {
                fs::read(&p).unwrap_or_default()
            } else {
                b"<special>".to_vec()
            };
            out.insert(rel, (bytes, m.ino(), m.mode()));
        }
    }
    out
}

/// What a hostile session may leave at one place of its layer.
#[derive(Debug, Clone)]
enum Thing {
    File(String, u32),
    /// Another name of the project's file at this path (copied up first, as the overlay does).
    HardLinkTo(&'static str),
    Link(&'static str),
    /// A directory made again: nothing of the project's below it shows through.
    DirAgain,
    Dir(u32),
    Fifo,
    /// A whiteout: the project's entry deleted (needs CAP_MKNOD; skipped without it).
    Whiteout,
}

fn thing() -> impl Strategy<Value = Thing> {
    let mode = prop::sample::select(vec![0o644u32, 0o755, 0o666, 0o4755, 0o2644]);
    let dmode = prop::sample::select(vec![0o755u32, 0o777, 0o2755, 0o1777]);
    prop_oneof![
        ("[ -~\u{1b}]{0,12}", mode).prop_map(|(t, m)| Thing::File(t, m)),
        prop::sample::select(vec![".git/config", "lib/.git/config", "a.txt", "d/c.txt"])
            .prop_map(Thing::HardLinkTo),
        prop::sample::select(vec![
            "..",
            "../..",
            "/etc",
            "b/../victim",
            "x/../../y",
            "a.txt",
            "../a.txt",
            ".git/config",
            "lib/../..",
            "l1",
            "l1/..",
            "l2/../..",
            "d/../../d",
        ])
        .prop_map(Thing::Link),
        Just(Thing::DirAgain),
        dmode.prop_map(Thing::Dir),
        Just(Thing::Fifo),
        Just(Thing::Whiteout),
    ]
}

/// Where: the project's files and directories (a nested repository's among them), new names,
/// names with escape bytes and spaces.
fn place() -> impl Strategy<Value = String> {
    let fixed = prop::sample::select(vec![
        "a.txt",
        "d",
        "d/c.txt",
        "d/e",
        "d/e/f.txt",
        "lib",
        "lib/src",
        "lib/.git",
        "n",
        "n/m",
        "l1",
        "l2",
        "b",
        "x",
        "a/b",
        "a/c",
        ".envrc",
        ".git/config",
        "d/l",
    ]);
    let named = "[a-z \u{1b}\n\u{202e}]{1,8}";
    prop_oneof![5 => fixed.prop_map(str::to_string), 1 => named]
}

/// Makes `thing` at `rel` in the layer as the overlay would have, from the project below.
fn plant(g: &Ground, rel: &str, thing: &Thing) {
    let at = g.upper.join(rel);
    let mut above = g.upper.clone();
    for c in Path::new(rel).parent().into_iter().flat_map(|d| d.components()) {
        above.push(c);
        match fs::symlink_metadata(&above) {
            Ok(m) if !m.is_dir() => return,
            Ok(_) => {}
            Err(_) => {
                if fs::create_dir(&above).is_err() {
                    return;
                }
            }
        }
    }
    match fs::symlink_metadata(&at) {
        Ok(m) if m.is_dir() => {
            let _ = fs::remove_dir_all(&at);
        }
        Ok(_) => {
            let _ = fs::remove_file(&at);
        }
        Err(_) => {}
    }
    let _ = match thing {
        Thing::File(t, mode) => {
            fs::write(&at, t).and_then(|()| fs::set_permissions(&at, fs::Permissions::from_mode(*mode)))
        }
        Thing::HardLinkTo(target) => {
            let up = g.upper.join(target);
            if !up.exists() {
                if let Some(parent) = up.parent() {
                    let _ = fs::create_dir_all(parent);
                }
                let _ = fs::copy(g.project.join(target), &up);
            }
            fs::hard_link(&up, &at)
        }
        Thing::Link(t) => symlink(t, &at),
        Thing::DirAgain => fs::create_dir(&at).map(|()| testing::set_opaque(&at)),
        Thing::Dir(mode) => {
            fs::create_dir(&at).and_then(|()| fs::set_permissions(&at, fs::Permissions::from_mode(*mode)))
        }
        Thing::Fifo => {
            nix::unistd::mkfifo(&at, nix::sys::stat::Mode::from_bits_truncate(0o644)).map_err(Into::into)
        }
        Thing::Whiteout => nix::sys::stat::mknod(
            &at,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            0,
        )
        .map_err(Into::into),
    };
}

/// What `diff` and a plain `apply` do with the layer: the text printed, the verdicts, and the
/// paths that landed.
fn review(g: &Ground) -> (String, Vec<show::Item>, Vec<Verdict>) {
    let (u, p) = (Tree::open(&g.upper).unwrap(), Tree::open(&g.project).unwrap());
    let changes = changes::read(&u, &p).unwrap();
    let items = show::items(changes, &u, &p, u64::MAX, &crate::plan::protect::candidates(&[]));
    let mut text = show::summary(&items) + &show::git_settings(&items, &u) + &show::patches(&items, &u, &p);
    let branches = super::git::moved(&u, &p, "id", None);
    text += &super::git::Refused::lines(&branches.refused);
    let mut verdicts = apply::decide(&items, &[], &HashSet::new());
    apply::links_leaving(&items, &mut verdicts, &[], &|r| changes::project_link(&p, r));
    let mut said = Vec::new();
    let n = apply::land(&items, &verdicts, &u, &p, &mut |l| {
        said.push(l.to_path_buf());
        Ok(())
    })
    .unwrap();
    let landing: Vec<PathBuf> = items
        .iter()
        .zip(&verdicts)
        .filter(|(_, v)| **v == Verdict::Land)
        .map(|(i, _)| i.change.path.clone())
        .collect();
    assert_eq!(
        (n, &said),
        (landing.len(), &landing),
        "apply counts and records each path it lands, in order"
    );
    (text, items, verdicts)
}

/// Where a link of the project leads now, read off the disk.
fn leads(project: &Path, rel: &Path, target: &Path) -> Leads {
    resolve(rel, target, &|p: &Path| {
        fs::symlink_metadata(project.join(p)).ok().filter(|m| m.file_type().is_symlink())?;
        fs::read_link(project.join(p)).ok()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn apply_lands_only_what_diff_listed_and_nothing_leads_out_or_is_linked(
        layer in prop::collection::vec((place(), thing()), 1..10),
    ) {
        let g = ground();
        for (rel, what) in &layer {
            plant(&g, rel, what);
        }
        let (before, outside) = (contents(&g.project), contents(&g.outside));
        let layer_had = contents(&g.upper);
        let (text, items, verdicts) = review(&g);
        let after = contents(&g.project);
        // Nothing raw printed.
        prop_assert!(
            !text.chars().any(|c| (c.is_control() && c != '\n' && c != '\t') || c == '\u{202e}'),
            "{:?}", text
        );
        // Nothing outside changes.
        prop_assert_eq!(contents(&g.outside), outside);
        // Every change to the project is an item that landed (or lies below one that did).
        let landed: Vec<&Path> = items
            .iter()
            .zip(&verdicts)
            .filter(|(_, v)| **v == Verdict::Land)
            .map(|(i, _)| i.change.path.as_path())
            .collect();
        let changed = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k).map(|b| (&b.0, b.2)) != after.get(*k).map(|a| (&a.0, a.2)));
        for k in changed {
            // A directory made only to hold what landed below it, with the plain mode.
            let holder = !before.contains_key(k)
                && after.get(k).is_some_and(|a| a.2 & 0o7777 == 0o755 && a.0 == b"<dir>")
                && landed.iter().any(|l| l.starts_with(k));
            prop_assert!(
                holder || landed.iter().any(|l| k.starts_with(l)),
                "{} changed, and no item that landed names it: {:?}\n{}", k.display(), landed, text
            );
        }
        // What landed is what `diff` showed: each file with the layer's bytes and mode, each
        // link with its target, each directory a directory, each deletion gone (and below a
        // deleted or replaced directory, nothing of the project's is left).
        for (i, _) in items.iter().zip(&verdicts).filter(|(_, v)| **v == Verdict::Land) {
            let c = &i.change;
            let now = after.get(&c.path);
            let gone_later = items.iter().zip(&verdicts).any(|(j, v)| {
                *v == Verdict::Land && c.path.starts_with(&j.change.path) && j.change.path != c.path
                    && j.change.new.is_none_or(|n| n.kind != crate::sys::untrusted::Kind::Dir)
            });
            match c.new.map(|n| n.kind) {
                _ if gone_later => {}
                None => prop_assert!(now.is_none(), "{} deleted, yet there", c.path.display()),
                Some(crate::sys::untrusted::Kind::Dir) => {
                    prop_assert!(now.is_some_and(|n| n.0 == b"<dir>"), "{} is no directory", c.path.display())
                }
                Some(crate::sys::untrusted::Kind::File | crate::sys::untrusted::Kind::Link) => {
                    let shown = layer_had.get(&c.path).map(|l| (&l.0, l.2));
                    prop_assert_eq!(now.map(|n| (&n.0, n.2)), shown, "{} as diff showed", c.path.display());
                }
                Some(_) => {}
            }
        }
        // git's internals never land.
        for g_file in [".git/config", ".git/HEAD", "lib/.git/config", "lib/.git/HEAD"] {
            let p = PathBuf::from(g_file);
            if let (Some(b), Some(a)) = (before.get(&p), after.get(&p)) {
                prop_assert_eq!(&b.0, &a.0, "{}", g_file);
            }
        }
        // No two names of one file that were not so before the apply.
        let mut names: BTreeMap<u64, Vec<&PathBuf>> = BTreeMap::new();
        for (k, (_, ino, mode)) in &after {
            if mode & 0o170000 == 0o100000 {
                names.entry(*ino).or_default().push(k);
            }
        }
        for same in names.values().filter(|v| v.len() > 1) {
            let were: HashSet<u64> = same.iter().filter_map(|k| before.get(*k).map(|b| b.1)).collect();
            prop_assert!(
                same.iter().all(|k| before.contains_key(*k)) && were.len() == 1,
                "apply made {:?} names of one file", same
            );
        }
        // No link that apply made or changed leads out (or loops).
        for (k, (bytes, _, mode)) in &after {
            if mode & 0o170000 != 0o120000 || before.get(k).is_some_and(|b| &b.0 == bytes) {
                continue;
            }
            let target = PathBuf::from(std::ffi::OsStr::from_bytes(bytes));
            prop_assert!(
                matches!(leads(&g.project, k, &target), Leads::Inside(_)),
                "{} -> {} leads out of the project\n{}", k.display(), target.display(), text
            );
        }
    }
}
