//! Review mode on real podman: the sandbox writes a copy-on-write layer, the project stays as it
//! was until `apply`, which brings exactly the change (commits as a branch), leaves what the
//! host runs or trusts unless named, refuses host-changed paths, and keeps two sessions apart.
//! Each refusal is paired with what does land.

use crate::harness::*;
use std::path::{Path, PathBuf};

/// The review directories of `p` (their record names the project), oldest first.
pub(crate) fn reviews_of(p: &Project) -> Vec<PathBuf> {
    let states = env().home.join(".local/state/ai-sandbox/projects");
    let mut out: Vec<(u64, PathBuf)> = Vec::new();
    for proj in std::fs::read_dir(&states).into_iter().flatten().flatten() {
        for r in std::fs::read_dir(proj.path().join("reviews")).into_iter().flatten().flatten() {
            let Ok(text) = std::fs::read_to_string(r.path().join("review.json")) else { continue };
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            if v["project"].as_str() == p.dir.to_str() {
                out.push((v["started_ns"].as_u64().unwrap(), r.path()));
            }
        }
    }
    out.sort();
    out.into_iter().map(|(_, d)| d).collect()
}

/// The session id the launcher's exit lines name (`... the branch ai-sandbox/ID`).
pub(crate) fn session_in(stderr: &str) -> String {
    const AT: &str = "branch ai-sandbox/";
    let at = stderr.find(AT).unwrap_or_else(|| panic!("no review line in:\n{stderr}"));
    stderr[at + AT.len()..].chars().take_while(|c| c.is_ascii_hexdigit()).collect()
}

/// Waits for `release` below: a file the host writes in the sandbox's HOME (a plain bind mount).
/// A file the host adds to the project during a review session need not show inside: the
/// overlay keeps what it looked up, `done` included, so UNTIL_DONE would wait for ever.
pub(crate) const UNTIL_RELEASED: &str =
    "for i in $(seq 600); do [ -e \"$HOME/released\" ] && exit 0; sleep 0.1; done; exit 9";

pub(crate) fn release(p: &Project) {
    // The sandbox HOME of this project, as a dry run mounts it (`-v …/homes/NAME-HASH:HOME`).
    let dry = sandbox(p, &["--dry-run", "--net", "none", "--", "true"], &[]);
    let home = dry
        .ok()
        .stdout
        .lines()
        .find_map(|l| {
            l.trim().trim_end_matches(" \\").split_once(":").filter(|(h, _)| h.contains("/ai-sandbox/homes/"))
        })
        .map(|(h, _)| PathBuf::from(h.trim_matches('\'')))
        .unwrap_or_else(|| panic!("no sandbox HOME in the dry run:\n{}", dry.stdout));
    std::fs::write(home.join("released"), "").unwrap();
}

pub(crate) fn write_as_user(p: &Path, text: &str) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap();
        chown_user(d);
    }
    std::fs::write(p, text).unwrap();
    chown_user(p);
}

pub(crate) fn read(p: &Project, rel: &str) -> String {
    std::fs::read_to_string(p.path(rel)).unwrap_or_else(|e| format!("<{e}>"))
}

/// A repository with a few committed files, as the test user made it.
pub(crate) fn repo(name: &str) -> Project {
    let p = Project::new(name);
    for (f, t) in
        [("a.txt", "a\n"), ("b.txt", "b\n"), ("d/c.txt", "c\n"), ("keep", "k\n"), ("edited.txt", "e\n")]
    {
        write_as_user(&p.path(f), t);
    }
    git_at(&p.dir, &["init", "-q", "-b", "main"]).ok();
    git_at(&p.dir, &["add", "-A"]).ok();
    git_at(&p.dir, &["commit", "-q", "-m", "start"]).ok();
    p
}

pub(crate) fn head(p: &Project) -> String {
    git_at(&p.dir, &["rev-parse", "HEAD"]).ok().stdout.trim().to_string()
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn review_mode_leaves_the_project_alone_until_apply_brings_exactly_the_change() {
    let p = repo("review");
    let start = head(&p);
    // Positive control: in direct mode an edit is on the host while the session still runs.
    let direct = spawn_sandbox(
        &p,
        &["--net", "none", "--", "sh", "-c", &format!("echo direct > direct.txt; {UNTIL_DONE}")],
    );
    assert!(
        wait_for(60, || p.path("direct.txt").exists()),
        "direct mode: the edit is not on the host during the session"
    );
    finish(&p, direct);
    std::fs::remove_file(p.path("direct.txt")).unwrap();
    std::fs::remove_file(p.path("done")).unwrap();
    // Review mode: edits, an addition, a deletion, a directory renamed, a hard link, a link,
    // and a commit; then it waits, so the host is looked at during the session.
    let script = format!(
        "set -e; echo changed >> a.txt; rm b.txt; echo new > n.txt; mv d d2; ln keep keep2; ln -s a.txt lnk; \
         git add -A; git -c user.name=agent -c user.email=agent@example.invalid commit -q -m 'agent work'; \
         echo edits-done > marker; {UNTIL_RELEASED}"
    );
    let mut s = spawn_sandbox(&p, &["--net", "none", "--review", "--", "sh", "-c", &script]);
    let err = s.stderr_live();
    assert!(
        wait_for(60, || reviews_of(&p).first().is_some_and(|d| d.join("upper/marker").exists())),
        "the session never finished its edits: {}",
        err.lock().unwrap()
    );
    let unchanged = |when: &str| {
        assert_eq!(read(&p, "a.txt"), "a\n", "{when}: a.txt changed on the host");
        assert!(
            p.path("b.txt").exists() && p.path("d/c.txt").exists(),
            "{when}: a deletion reached the host"
        );
        assert!(!p.path("n.txt").exists() && !p.path("d2").exists() && !p.path("marker").exists(), "{when}");
        assert_eq!(head(&p), start, "{when}: the commit reached the host's repository");
    };
    unchanged("during the session");
    // `ps --json` marks the running session as a review (its project's name says "review" too,
    // so the text would prove nothing).
    let running_id = reviews_of(&p)[0].file_name().unwrap().to_str().unwrap().to_string();
    let ps = sandbox(&p, &["ps", "--json"], &[]);
    let rows: serde_json::Value = serde_json::from_str(&ps.ok().stdout).unwrap();
    let row = rows.as_array().unwrap().iter().find(|r| r["session"] == running_id.as_str());
    assert_eq!(row.map(|r| r["review"].clone()), Some(serde_json::json!("running")), "ps: {}", ps.stdout);
    // The text says its mode is review, not its network's.
    let text = sandbox(&p, &["ps"], &[]).ok().stdout.clone();
    let line = text.lines().find(|l| l.starts_with(&running_id)).unwrap_or_default().to_string();
    assert!(line.split_whitespace().nth(3) == Some("review"), "ps: {text}");
    release(&p);
    let out = s.wait_with_output();
    let stderr = err.lock().unwrap().clone();
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("wait for your review"), "{stderr}");
    unchanged("after the session");
    let id = session_in(&stderr);
    let ps = sandbox(&p, &["ps"], &[]);
    assert!(ps.ok().stdout.contains("waiting for review") && ps.stdout.contains(&id), "{}", ps.stdout);

    let d = sandbox(&p, &["diff", &id], &[]);
    let text = &d.ok().stdout;
    for line in [
        "  M a.txt",
        "  D b.txt",
        "  A n.txt",
        "  D d/",
        "  R d/c.txt -> d2/c.txt",
        "  A keep2\n      = the same file as keep inside",
        "  A lnk (link)",
        "+changed",
        "arrives as the branch ai-sandbox/",
    ] {
        assert!(text.contains(line), "diff lacks {line:?}:\n{text}");
    }
    assert!(!text.contains("marker") || text.contains("A marker"), "{text}");

    let a = sandbox(&p, &["apply", &id], &[]);
    a.ok();
    assert_eq!(read(&p, "a.txt"), "a\nchanged\n");
    assert!(!p.path("b.txt").exists() && !p.path("d").exists(), "the deletions landed");
    assert_eq!(read(&p, "n.txt"), "new\n");
    assert_eq!(read(&p, "d2/c.txt"), "c\n");
    use std::os::unix::fs::MetadataExt;
    let (k, k2) = (std::fs::metadata(p.path("keep")).unwrap(), std::fs::metadata(p.path("keep2")).unwrap());
    assert_eq!(read(&p, "keep2"), "k\n");
    assert_ne!(k.ino(), k2.ino(), "a second name lands as a file of its own (ADR 0072)");
    assert_eq!(std::fs::read_link(p.path("lnk")).unwrap(), PathBuf::from("a.txt"));
    // git: HEAD where it was; the commit on its own branch; the files as edits.
    assert_eq!(head(&p), start, "apply moved the user's HEAD");
    let branch = format!("ai-sandbox/{id}");
    let log = git_at(&p.dir, &["log", "-1", "--format=%s", &branch]);
    assert_eq!(log.ok().stdout.trim(), "agent work", "{}", a.stderr);
    let status = git_at(&p.dir, &["status", "--short"]).ok().stdout.clone();
    assert!(status.contains(" M a.txt") && status.contains("n.txt"), "{status}");
    assert!(a.stderr.contains("nothing is left to apply"), "{}", a.stderr);
    assert!(reviews_of(&p).is_empty(), "the applied review is still there");
    let again = sandbox(&p, &["diff"], &[]);
    assert_ne!(again.code, 0);
    assert!(again.stderr.contains("no session"), "{}", again.stderr);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn what_the_host_runs_is_called_out_and_lands_only_when_named() {
    let p = repo("review-callout");
    let lib = p.path("lib");
    std::fs::create_dir_all(&lib).unwrap();
    chown_user(&lib);
    write_as_user(&lib.join("x.txt"), "x\n");
    git_at(&lib, &["init", "-q", "-b", "main"]).ok();
    git_at(&lib, &["add", "-A"]).ok();
    git_at(&lib, &["commit", "-q", "-m", "lib"]).ok();
    let marks = marker_dir("review-callout");
    let script = format!(
        "printf '#!/bin/sh\\ntouch {m}/hook\\n' > .git/hooks/post-commit; chmod +x .git/hooks/post-commit; \
         git -C lib config core.fsmonitor 'touch {m}/fsmonitor'; \
         echo 'touch {m}/envrc' > .envrc; mkdir -p tools; printf '#!/bin/sh\\n' > tools/run.sh; chmod +x tools/run.sh; \
         echo plain > src.txt",
        m = marks.display()
    );
    let r = sandbox(&p, &["--net", "none", "--review", "--", "sh", "-c", &script], &[]);
    r.ok();
    let id = session_in(&r.stderr);
    let d = sandbox(&p, &["diff", "--stat", &id], &[]);
    let text = &d.ok().stdout;
    for want in [
        ".envrc",
        "the host runs or trusts",
        ".git/hooks/post-commit: a git hook",
        "core.fsmonitor",
        "tools/run.sh",
        "executable",
        "A src.txt",
    ] {
        assert!(text.contains(want), "diff lacks {want:?}:\n{text}");
    }
    let a = sandbox(&p, &["apply", &id], &[]);
    a.ok();
    assert_eq!(read(&p, "src.txt"), "plain\n", "positive control: the plain file landed");
    assert!(
        !p.path(".envrc").exists() && !p.path("tools/run.sh").exists(),
        "a called-out file landed unnamed"
    );
    assert!(!p.path(".git/hooks/post-commit").exists(), "the hook landed");
    assert!(!read(&p, "lib/.git/config").contains("fsmonitor"), "the nested repository's fsmonitor landed");
    assert!(a.stderr.contains("not applied: .envrc") && a.stderr.contains("still waits"), "{}", a.stderr);
    // The host's git in both repositories runs nothing the agent planted.
    git_at(&p.dir, &["commit", "-q", "--allow-empty", "-m", "host"]).ok();
    git_at(&lib, &["status"]).ok();
    assert!(std::fs::read_dir(&marks).unwrap().next().is_none(), "planted code ran on the host");
    // A name that selects nothing (a typo) applies nothing, and says so.
    let typo = sandbox(&p, &["apply", &id, ".envrc", "envrc"], &[]);
    assert_ne!(typo.code, 0, "{}", typo.stderr);
    assert!(typo.stderr.contains("changed nothing at envrc"), "{}", typo.stderr);
    assert!(!p.path(".envrc").exists(), "an apply with a name that selects nothing landed the rest");
    // Named, a called-out file lands; git's internals never do.
    let named = sandbox(&p, &["apply", &id, ".envrc", ".git/hooks"], &[]);
    named.ok();
    assert!(read(&p, ".envrc").contains("envrc"), "{}", named.stderr);
    assert!(!p.path(".git/hooks/post-commit").exists(), "naming git's internals landed a hook");
    // discard leaves nothing behind, the whiteouts and the overlay's work dir included.
    let dir = reviews_of(&p).pop().expect("the review waits");
    sandbox(&p, &["discard", &id], &[]).ok();
    assert!(!dir.exists(), "discard left {}", dir.display());
    assert!(!p.path("tools/run.sh").exists());
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn host_edits_are_conflicts_and_two_reviews_keep_their_own_changes() {
    let p = repo("review-two");
    let one = format!(
        "echo one > shared.txt; echo one > one.txt; echo sandbox > edited.txt; echo x > marker1; {UNTIL_RELEASED}"
    );
    let two = format!("echo two > shared.txt; echo two > two.txt; echo x > marker2; {UNTIL_RELEASED}");
    let mut s1 = spawn_sandbox(&p, &["--net", "none", "--review", "--", "sh", "-c", &one]);
    let e1 = s1.stderr_live();
    let mut s2 = spawn_sandbox(&p, &["--net", "none", "--review", "--", "sh", "-c", &two]);
    let e2 = s2.stderr_live();
    assert!(
        wait_for(60, || {
            let r = reviews_of(&p);
            r.len() == 2
                && r.iter().any(|d| d.join("upper/marker1").exists())
                && r.iter().any(|d| d.join("upper/marker2").exists())
        }),
        "both sessions never wrote: {}\n{}",
        e1.lock().unwrap(),
        e2.lock().unwrap()
    );
    // The user edits a file on the host while the sessions run.
    std::thread::sleep(std::time::Duration::from_millis(20));
    write_as_user(&p.path("edited.txt"), "host\n");
    release(&p);
    assert!(s1.wait_with_output().status.success() && s2.wait_with_output().status.success());
    let (id1, id2) = (session_in(&e1.lock().unwrap()), session_in(&e2.lock().unwrap()));
    assert_ne!(id1, id2);
    let d1 = sandbox(&p, &["diff", "--stat", &id1], &[]).ok().stdout.clone();
    let d2 = sandbox(&p, &["diff", "--stat", &id2], &[]).ok().stdout.clone();
    assert!(d1.contains("A one.txt") && !d1.contains("two.txt"), "{d1}");
    assert!(d2.contains("A two.txt") && !d2.contains("one.txt"), "{d2}");
    assert!(d1.contains("CONFLICT"), "{d1}");
    // The host's edit is a conflict: nothing lands.
    let a = sandbox(&p, &["apply", &id1], &[]);
    assert_eq!(a.code, 1, "{}", a.stderr);
    assert!(a.stderr.contains("nothing was applied") && a.stderr.contains("edited.txt"), "{}", a.stderr);
    assert!(
        !p.path("one.txt").exists() && read(&p, "edited.txt") == "host\n",
        "a conflicting apply changed the project"
    );
    // Named, the sandbox's version is taken.
    sandbox(&p, &["apply", &id1, "edited.txt", "shared.txt", "one.txt", "marker1"], &[]).ok();
    assert_eq!(
        (read(&p, "edited.txt"), read(&p, "shared.txt"), read(&p, "one.txt")),
        ("sandbox\n".into(), "one\n".into(), "one\n".into())
    );
    // The second session changed shared.txt too: applying it after the first reports that file.
    let b = sandbox(&p, &["apply", &id2], &[]);
    assert_eq!(b.code, 1, "{}", b.stderr);
    assert!(b.stderr.contains("shared.txt") && !b.stderr.contains("two.txt:"), "{}", b.stderr);
    assert_eq!(read(&p, "shared.txt"), "one\n");
    sandbox(&p, &["apply", &id2, "two.txt"], &[]).ok();
    assert_eq!(read(&p, "two.txt"), "two\n", "positive control: its own file lands");
    sandbox(&p, &["discard", &id2], &[]).ok();
    assert!(reviews_of(&p).is_empty(), "{:?}", reviews_of(&p));
}

/// `ai-sandbox watch` in another terminal is told when a review session ends with a change, with
/// the commands that take it; a review session that changed nothing (run beside it, the control
/// that watch heard both ends) is not announced.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn watch_announces_a_review_that_waits_with_its_commands() {
    use std::io::Write;
    let p = repo("review-watch");
    // With the gate (the default `--net allow`), which tells its watchers.
    let changed = format!("echo w > w.txt; {UNTIL_RELEASED}");
    let mut s1 = spawn_sandbox(&p, &["--review", "--", "sh", "-c", &changed]);
    let e1 = s1.stderr_live();
    let mut s2 = spawn_sandbox(&p, &["--review", "--", "sh", "-c", UNTIL_RELEASED]);
    let e2 = s2.stderr_live();
    assert!(
        wait_for(60, || {
            let r = reviews_of(&p);
            r.len() == 2 && r.iter().any(|d| d.join("upper/w.txt").exists())
        }),
        "the sessions never started: {}\n{}",
        e1.lock().unwrap(),
        e2.lock().unwrap()
    );
    let (mut watch, seen) = spawn_watch(&p);
    let has = |s: &str| seen.lock().unwrap().contains(s);
    assert!(wait_for(20, || has("watching")), "watch did not start: {}", seen.lock().unwrap());
    release(&p);
    assert!(s1.wait_with_output().status.success() && s2.wait_with_output().status.success());
    let (out1, out2) = (e1.lock().unwrap().clone(), e2.lock().unwrap().clone());
    assert!(out2.contains("changed nothing"), "{out2}");
    let id = session_in(&out1);
    let announced = wait_for(20, || has(&format!("ai-sandbox apply {id} ")));
    let _ = watch.stdin.take().unwrap().write_all(b"q\n");
    let _ = watch.wait();
    let text = seen.lock().unwrap().clone();
    assert!(announced, "watch did not announce the review: {text}");
    assert!(text.contains(&format!("session {id} of ")) && text.contains("waits for your review"), "{text}");
    assert!(
        text.contains(&format!("ai-sandbox diff {id} "))
            && text.contains(&format!("ai-sandbox discard {id} "))
    );
    assert_eq!(
        text.matches("waits for your review").count(),
        1,
        "the unchanged session was announced: {text}"
    );
    sandbox(&p, &["discard", &id], &[]).ok();
}
