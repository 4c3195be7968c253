//! The guard against what a hostile sandbox leaves: links to the user's files where git reads,
//! fifos where it blocks, names that are terminal escapes. Each case beside its control (the
//! same place holding an ordinary file is cleaned as before), and a property over random trees
//! of all of them: the guard always finishes, changes nothing outside the project and the
//! quarantine, and prints no control character.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::time::{Duration, Instant};

struct Ground {
    _tmp: tempfile::TempDir,
    project: PathBuf,
    outside: PathBuf,
    store: PathBuf,
    quarantine: PathBuf,
}

/// A project with a repository at its root, and a directory of the user's beside it (another
/// repository's config with a token, a `.ssh`-like directory) that nothing may touch.
fn ground() -> Ground {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("p");
    let outside = tmp.path().join("home");
    fs::create_dir_all(project.join(".git/hooks")).unwrap();
    fs::create_dir_all(project.join(".git/objects")).unwrap();
    fs::create_dir_all(project.join(".git/refs")).unwrap();
    fs::write(project.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(project.join(".git/config"), "[core]\n\tbare = false\n").unwrap();
    fs::create_dir_all(outside.join("other/.git")).unwrap();
    fs::create_dir_all(outside.join("victim")).unwrap();
    fs::write(outside.join("other/.git/config"), "[remote \"o\"]\n\turl = https://tok3n@example.invalid/x\n")
        .unwrap();
    fs::write(outside.join("victim/id_ed25519"), "PRIVATE\n").unwrap();
    fs::write(outside.join(".gitconfig"), "[user]\n\tname = Me\n").unwrap();
    let (store, quarantine) = (tmp.path().join("store"), tmp.path().join("quarantine"));
    Ground { project, outside, store, quarantine, _tmp: tmp }
}

/// Every file under `dir` with its bytes (links by their text), to compare before and after.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let (p, t) = (e.path(), e.file_type().unwrap());
            if t.is_dir() {
                stack.push(p.clone());
                out.insert(p, b"<dir>".to_vec());
            } else if t.is_symlink() {
                out.insert(p.clone(), fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes());
            } else {
                out.insert(p.clone(), fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

fn git_init(dir: &Path, config: &str) {
    fs::create_dir_all(dir.join(".git/hooks")).unwrap();
    fs::create_dir_all(dir.join(".git/objects")).unwrap();
    fs::create_dir_all(dir.join(".git/refs")).unwrap();
    fs::write(dir.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(dir.join(".git/config"), config).unwrap();
}

fn mkfifo(p: &Path) {
    nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
}

/// Records, lets `act` be the sandbox, then settles: the report.
fn session(g: &Ground, act: impl FnOnce(&Path, &Path)) -> String {
    let rels = candidates(&[]);
    let protected =
        Protected { mounts: Vec::new(), repos: repos::scan(&g.project).unwrap(), writable: Vec::new() };
    snapshot(&g.project, &rels, &protected, &g.store, "s1", false).unwrap();
    act(&g.project, &g.outside);
    let (r, text) = settle_within(g);
    r.unwrap_or_else(|e| panic!("settle failed: {e}\n{text}"));
    text
}

/// Settles `g`'s record on a thread: its result and what it printed, or a failure if it has not
/// finished within 20 s (it must never block).
fn settle_within(g: &Ground) -> (Result<(), String>, String) {
    let (store, state) = (g.store.clone(), g.quarantine.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let r = settle(&store, &state, &mut out, true).map_err(|e| format!("{e:#}"));
        let _ = tx.send((r, String::from_utf8_lossy(&out).into_owned()));
    });
    rx.recv_timeout(Duration::from_secs(20)).expect("the guard finished")
}

#[test]
fn a_fifo_where_git_reads_is_moved_aside_and_the_next_repository_is_still_cleaned() {
    let g = ground();
    let start = Instant::now();
    let report = session(&g, |p, _| {
        git_init(&p.join("aa"), "[core]\n\tfsmonitor = touch /tmp/pwned\n");
        git_init(&p.join("zz"), "[core]\n");
        fs::remove_file(p.join("zz/.git/config")).unwrap();
        mkfifo(&p.join("zz/.git/config"));
        fs::create_dir_all(p.join("ww")).unwrap();
        mkfifo(&p.join("ww/.git"));
    });
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(report.contains("zz/.git/config: a fifo where git expects a file"), "{report}");
    assert!(report.contains("ww/.git: a repository pointer"), "{report}");
    // control: the repository beside it is cleaned as it always was
    assert!(report.contains("aa/.git/config: a repository made during the session had settings"), "{report}");
    assert!(!fs::read_to_string(g.project.join("aa/.git/config")).unwrap().contains("fsmonitor"));
    assert!(fs::symlink_metadata(g.project.join("zz/.git/config")).is_err());
}

#[test]
fn a_linked_config_is_moved_aside_unread_and_no_host_file_comes_into_the_project() {
    let g = ground();
    let before = contents(&g.outside);
    let report = session(&g, |p, home| {
        git_init(&p.join("s1"), "[core]\n");
        fs::remove_file(p.join("s1/.git/config")).unwrap();
        symlink(home.join("other/.git/config"), p.join("s1/.git/config")).unwrap();
        git_init(&p.join("s2"), "[core]\n");
        fs::remove_file(p.join("s2/.git/config")).unwrap();
        symlink(home.join(".gitconfig"), p.join("s2/.git/config")).unwrap();
        // control: a plain config with a token in a URL subsection is cleaned, the token unsaid
        git_init(&p.join("s3"), "[url \"https://sEcReT@example.invalid/\"]\n\tinsteadOf = x\n");
    });
    assert_eq!(contents(&g.outside), before);
    assert!(report.contains("s1/.git/config: a symbolic link where git expects a file"), "{report}");
    assert!(fs::symlink_metadata(g.project.join("s1/.git/config")).is_err(), "nothing written in its place");
    assert!(!report.contains("tok3n") && !report.contains("sEcReT"), "{report}");
    assert!(report.contains("url.\"…\".insteadof"), "{report}");
    let planted = contents(&g.project);
    assert!(
        !planted.values().any(|b| String::from_utf8_lossy(b).contains("tok3n")),
        "a host file's bytes in the project"
    );
    assert!(!planted.values().any(|b| String::from_utf8_lossy(b).contains("name = Me")));
}

#[test]
fn a_linked_hooks_directory_is_moved_as_a_link_and_its_target_stays_whole() {
    let g = ground();
    let before = contents(&g.outside);
    let report = session(&g, |p, home| {
        git_init(&p.join("s5"), "[core]\n");
        fs::remove_dir_all(p.join("s5/.git/hooks")).unwrap();
        symlink(home.join("victim"), p.join("s5/.git/hooks")).unwrap();
        // control: a real hooks directory's hook goes aside
        git_init(&p.join("s6"), "[core]\n");
        fs::write(p.join("s6/.git/hooks/post-checkout"), "#!/bin/sh\n").unwrap();
    });
    assert_eq!(contents(&g.outside), before);
    assert!(report.contains("s5/.git/hooks: a symbolic link where git expects a directory"), "{report}");
    assert!(report.contains("s6/.git/hooks/post-checkout: a hook"), "{report}");
    assert!(fs::symlink_metadata(g.project.join("s5/.git/hooks")).is_err(), "the link itself went aside");
}

#[test]
fn a_link_planted_over_a_protected_file_is_undone_without_reading_or_writing_through_it() {
    let g = ground();
    let before = contents(&g.outside);
    let report = session(&g, |p, home| {
        fs::remove_file(p.join(".git/config")).unwrap();
        symlink(home.join(".gitconfig"), p.join(".git/config")).unwrap();
        symlink(home.join("victim"), p.join(".vscode")).unwrap();
    });
    assert_eq!(contents(&g.outside), before);
    assert_eq!(fs::read_to_string(g.project.join(".git/config")).unwrap(), "[core]\n\tbare = false\n");
    assert!(
        report.contains(".git/config: changed during the session (a symbolic link now, not read)"),
        "{report}"
    );
    assert!(
        report.contains(".vscode: created during the session (a symbolic link now, not read)"),
        "{report}"
    );
}

#[test]
fn names_with_terminal_escapes_are_reported_escaped() {
    let g = ground();
    let report = session(&g, |p, _| {
        let evil = p.join("x\u{1b}]0;owned\u{7}\u{1b}[2K\u{202e}");
        git_init(&evil, "[core]\n\tfsmonitor = y\n[alias \"\u{1b}[31m\"]\n\tk\u{1b}x = z\n");
        fs::write(p.join(".git/hooks/post-commit\u{1b}[2K"), "#!/bin/sh\n").unwrap();
    });
    assert!(!report.chars().any(|c| c.is_control() && c != '\n'), "{report:?}");
    assert!(!report.contains('\u{202e}'), "{report:?}");
    assert!(report.contains("x\\e]0;owned\\x07\\e[2K\\u{202e}/.git/config"), "{report}");
    assert!(report.contains(".git/hooks/post-commit\\e[2K: created"), "{report}");
}

/// What a hostile session may leave at one place.
#[derive(Debug, Clone)]
enum Thing {
    File(String),
    Dir,
    LinkOut,
    LinkOutDir,
    LinkIn,
    Dangling,
    Loop,
    Fifo,
    Socket,
}

fn thing() -> impl Strategy<Value = Thing> {
    prop_oneof![
        "[ -~\u{1b}\u{7}\n]{0,40}".prop_map(Thing::File),
        Just(Thing::Dir),
        Just(Thing::LinkOut),
        Just(Thing::LinkOutDir),
        Just(Thing::LinkIn),
        Just(Thing::Dangling),
        Just(Thing::Loop),
        Just(Thing::Fifo),
        Just(Thing::Socket),
    ]
}

/// Where the guard reads: the root's protected paths, a new repository's files, pointers.
fn place() -> impl Strategy<Value = String> {
    let fixed = prop::sample::select(vec![
        ".git/config",
        ".git/hooks",
        ".git/hooks/pre-push",
        ".git/commondir",
        ".git/config.worktree",
        ".git",
        ".vscode",
        ".vscode/tasks.json",
        ".envrc",
        "n/.git",
        "n/.git/config",
        "n/.git/hooks",
        "n/.git/hooks/h",
        "n/.git/commondir",
        "n/.git/config.worktree",
        "m/.git",
        "deep/a/b/c/.git/config",
    ]);
    let named = "[a-z\u{1b}\u{7}\n\u{202e}]{1,12}".prop_map(|n| format!("{n}/.git/config"));
    prop_oneof![4 => fixed.prop_map(str::to_string), 1 => named]
}

fn plant(project: &Path, outside: &Path, rel: &str, what: &Thing) {
    let p = project.join(rel);
    // The host's files are not in the sandbox (a link out of the project leads nowhere inside),
    // and the sandbox's links into the project are its own business: nothing is planted
    // through a link.
    let mut above = project.to_path_buf();
    for c in Path::new(rel).parent().into_iter().flat_map(|d| d.components()) {
        above.push(c);
        if fs::symlink_metadata(&above).is_ok_and(|m| m.file_type().is_symlink()) {
            return;
        }
    }
    if let Some(parent) = p.parent() {
        if fs::create_dir_all(parent).is_err() {
            return;
        }
        if parent.file_name().is_some_and(|n| n == ".git") {
            for d in ["objects", "refs"] {
                let _ = fs::create_dir_all(parent.join(d));
            }
            let _ = fs::write(parent.join("HEAD"), "ref: refs/heads/main\n");
        }
    }
    if fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
        let _ = fs::remove_dir_all(&p);
    } else {
        let _ = fs::remove_file(&p);
    }
    let _ = match what {
        Thing::File(s) => fs::write(&p, s),
        Thing::Dir => fs::create_dir_all(&p),
        Thing::LinkOut => symlink(outside.join("other/.git/config"), &p),
        Thing::LinkOutDir => symlink(outside.join("victim"), &p),
        Thing::LinkIn => symlink(project.join(".git"), &p),
        Thing::Dangling => symlink("/nonexistent/x", &p),
        Thing::Loop => symlink(&p, &p),
        Thing::Fifo => {
            nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).map_err(Into::into)
        }
        Thing::Socket => std::os::unix::net::UnixListener::bind(&p).map(drop),
    };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_guard_finishes_touches_nothing_outside_and_prints_no_control_byte(
        before in prop::collection::vec((place(), thing()), 0..4),
        during in prop::collection::vec((place(), thing()), 1..8),
    ) {
        let g = ground();
        for (rel, what) in &before {
            plant(&g.project, &g.outside, rel, what);
        }
        let outside = contents(&g.outside);
        let rels = candidates(&[]);
        let Ok(repos) = repos::scan(&g.project) else { return Ok(()) };
        let protected = Protected { mounts: Vec::new(), repos, writable: vec![g.outside.clone()] };
        // A tree the guard refuses to record (a link it cannot take a copy through) starts no
        // session, which is as safe as settling it.
        if snapshot(&g.project, &rels, &protected, &g.store, "s1", false).is_err() {
            return Ok(());
        }
        for (rel, what) in &during {
            plant(&g.project, &g.outside, rel, what);
        }
        let (r, text) = settle_within(&g);
        let text = match r { Ok(()) => text, Err(e) => format!("{text}{e}") };
        prop_assert_eq!(contents(&g.outside), outside);
        prop_assert!(!text.chars().any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'), "{:?}", text);
        prop_assert!(!text.contains("tok3n"), "{}", text);
    }
}
