//! Review mode on hostile ground: what an agent makes in its layer reaches the host only as
//! `diff` showed it, and `apply` never loses the user's data. Each attack beside its control
//! (the same kind of change, made plainly, lands).

use crate::harness::*;
use crate::review::{read, repo, reviews_of, session_in, write_as_user};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A review session that runs `script`, and its id.
fn review(p: &Project, script: &str) -> String {
    let r = sandbox(p, &["--net", "none", "--review", "--", "sh", "-c", script], &[]);
    r.ok();
    session_in(&r.stderr)
}

/// A second name of `.git/config` made in review mode lands as a file of its own: the next
/// direct session writes that name, and the host's git runs nothing. A second name left by an
/// older version (made here by hand) is broken at launch, said in words, and the same write does
/// not reach the config either.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_hard_link_to_the_git_config_never_becomes_a_way_to_run_code_on_the_host() {
    let p = repo("rv-hardlink");
    let marks = marker_dir("rv-hardlink");
    let id = review(&p, "ln .git/config notes && echo plain > plain.txt");
    let d = sandbox(&p, &["diff", &id], &[]);
    let text = &d.ok().stdout;
    assert!(text.contains("  A notes\n") && text.contains("the same file as .git/config"), "{text}");
    sandbox(&p, &["apply", &id], &[]).ok();
    assert_eq!(read(&p, "plain.txt"), "plain\n", "control: the plain file landed");
    let ino = |rel: &str| std::fs::metadata(p.path(rel)).unwrap().ino();
    assert_ne!(ino("notes"), ino(".git/config"), "apply made notes a second name of .git/config");
    assert_eq!(std::fs::metadata(p.path(".git/config")).unwrap().nlink(), 1);
    let plant = format!("printf '[core]\\n\\tfsmonitor = touch {}/fsmonitor\\n' >> notes", marks.display());
    sandbox(&p, &["--net", "none", "--", "sh", "-c", &plant], &[]).ok();
    git_at(&p.dir, &["status"]).ok();
    git_at(&p.dir, &["commit", "-q", "--allow-empty", "-m", "host"]).ok();
    assert!(std::fs::read_dir(&marks).unwrap().next().is_none(), "planted code ran on the host");
    assert!(!read(&p, ".git/config").contains("fsmonitor"));
    // An older version's apply left a hard link: the launch makes the config a file of its own.
    std::fs::remove_file(p.path("notes")).unwrap();
    std::fs::hard_link(p.path(".git/config"), p.path("notes")).unwrap();
    let r = sandbox(&p, &["--net", "none", "--", "sh", "-c", &plant], &[]);
    r.ok();
    assert!(
        r.stderr.contains(".git/config had another name") && r.stderr.contains("a file of its own"),
        "{}",
        r.stderr
    );
    assert!(
        !read(&p, ".git/config").contains("fsmonitor"),
        "the write through the second name reached the config"
    );
    assert!(!r.stderr.contains("changed on the host during the session"), "{}", r.stderr);
    git_at(&p.dir, &["status"]).ok();
    assert!(std::fs::read_dir(&marks).unwrap().next().is_none(), "planted code ran on the host");
}

/// Names, refs and subjects with terminal escapes are printed escaped by diff and apply;
/// paths with spaces are printed so that they can be pasted into apply.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn escapes_in_names_refs_and_subjects_never_reach_the_terminal_raw() {
    let p = repo("rv-escapes");
    // A branch whose commit's subject holds escapes, and a loose ref named with them (git itself
    // refuses such a name, so the agent writes the file).
    let script = "set -e; printf x > \"$(printf 'e\\033[2Kvil')\"; echo ok > 'my notes.txt'; \
        git checkout -q -b feature; echo s > s.txt; git add s.txt; \
        git -c user.name=a -c user.email=a@example.invalid commit -q -m \"$(printf 'subj\\033]0;owned\\007')\"; \
        cp .git/refs/heads/feature \".git/refs/heads/$(printf 'br\\033[1A')\"; git checkout -q main";
    let id = review(&p, script);
    let d = sandbox(&p, &["diff", "--stat", &id], &[]);
    let text = &d.ok().stdout;
    assert!(!text.contains('\u{1b}') && !text.contains('\u{7}'), "raw escape in diff: {text:?}");
    assert!(text.contains("A $'e\\e[2Kvil'"), "{text}");
    assert!(text.contains("A 'my notes.txt'"), "control: a plain name with a space, pasteable: {text}");
    assert!(text.contains("branch br\\e[1A: not a valid branch name"), "{text}");
    assert!(text.contains("the sandbox's feature at"), "control: the plain branch arrives: {text}");
    let a = sandbox(&p, &["apply", &id], &[]);
    a.ok();
    assert!(
        !a.stderr.contains('\u{1b}') && !a.stderr.contains('\u{7}'),
        "raw escape in apply: {:?}",
        a.stderr
    );
    assert!(a.stderr.contains("subj\\e]0;owned\\x07"), "the subject is shown, escaped: {}", a.stderr);
    assert_eq!(read(&p, "my notes.txt"), "ok\n");
}

/// A link that leaves the project through another link is called out and does not land with a
/// plain apply; a link that stays inside lands.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_link_through_a_link_is_called_out_and_held_back() {
    let p = repo("rv-links");
    let id = review(&p, "mkdir a && ln -s .. a/b && ln -s b/../victim a/c && ln -s ../a.txt a/ok");
    let d = sandbox(&p, &["diff", "--stat", &id], &[]);
    let text = &d.ok().stdout;
    assert!(text.contains("A a/c (link)\n      ! a link out of the project (to b/../victim)"), "{text}");
    let a = sandbox(&p, &["apply", &id], &[]);
    a.ok();
    assert!(std::fs::symlink_metadata(p.path("a/c")).is_err(), "the link out landed: {}", a.stderr);
    assert!(a.stderr.contains("not applied: a/c"), "{}", a.stderr);
    assert_eq!(read(&p, "a/ok"), "a\n", "control: the link inside landed");
    assert_eq!(std::fs::read_link(p.path("a/b")).unwrap(), Path::new(".."));
}

/// A file in place of a folder, and a folder deleted with a repository in it, are called out
/// with what they delete and land only when named; a host edit below is a conflict; a plain
/// folder's deletion (the control) lands.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn what_a_type_change_or_a_deleted_repository_takes_with_it_is_shown_and_kept() {
    let p = repo("rv-types");
    for lib in ["lib", "lib2"] {
        std::fs::create_dir_all(p.path(lib)).unwrap();
        chown_user(&p.path(lib));
        write_as_user(&p.path(&format!("{lib}/src/x.rs")), "x\n");
        git_at(&p.path(lib), &["init", "-q", "-b", "main"]).ok();
        git_at(&p.path(lib), &["add", "-A"]).ok();
        git_at(&p.path(lib), &["commit", "-q", "-m", "nested"]).ok();
    }
    let id = review(&p, "rm -rf lib && echo x > lib && rm -rf lib2 d");
    write_as_user(&p.path("lib/src/x.rs"), "host edit\n");
    let d = sandbox(&p, &["diff", "--stat", &id], &[]);
    let text = &d.ok().stdout;
    for want in [
        "  M lib\n",
        "replaces a directory",
        "deletes the repository lib/.git with its commits",
        "  D lib/src/x.rs\n      ! CONFLICT",
        "  D lib2/\n",
        "deletes the repository lib2/.git with its commits",
        "  D d/c.txt",
    ] {
        assert!(text.contains(want), "diff lacks {want:?}:\n{text}");
    }
    let a = sandbox(&p, &["apply", &id], &[]);
    a.ok();
    assert!(!p.path("d").exists(), "control: the plain folder's deletion landed: {}", a.stderr);
    assert_eq!(read(&p, "lib/src/x.rs"), "host edit\n", "the folder under the file was deleted");
    assert!(p.path("lib/.git").is_dir() && p.path("lib2/.git").is_dir(), "a repository was deleted");
    assert!(a.stderr.contains("not applied: lib ") && a.stderr.contains("not applied: lib2"), "{}", a.stderr);
    // Named, it lands: what was called out is what happens.
    sandbox(&p, &["apply", &id, "lib2"], &[]).ok();
    assert!(!p.path("lib2").exists());
    assert!(p.path("lib/.git").is_dir());
}

/// World-writable and set-group-ID folders and files are called out; a plain file lands.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn world_writable_and_set_group_id_modes_are_called_out() {
    let p = repo("rv-modes");
    let id = review(
        &p,
        "mkdir open sg && chmod 777 open && chmod 2755 sg && echo w > ww && chmod 666 ww && echo p > plain",
    );
    let d = sandbox(&p, &["diff", "--stat", &id], &[]);
    let text = &d.ok().stdout;
    for want in [
        "  A open/\n      ! writable by every user",
        "  A sg/\n      ! set-user-ID or set-group-ID",
        "  A ww\n      ! writable by every user",
    ] {
        assert!(text.contains(want), "diff lacks {want:?}:\n{text}");
    }
    sandbox(&p, &["apply", &id], &[]).ok();
    assert_eq!(read(&p, "plain"), "p\n", "control");
    assert!(!p.path("open").exists() && !p.path("sg").exists() && !p.path("ww").exists());
}

/// A ref name git would refuse, written into the layer's packed-refs, is named and skipped; the
/// other branch arrives.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn one_bad_ref_is_named_and_the_others_arrive() {
    let p = repo("rv-refs");
    let script = "set -e; git checkout -q -b good; echo g > g.txt; git add g.txt; \
        git -c user.name=a -c user.email=a@example.invalid commit -q -m good; \
        printf '%s refs/heads/bad..name\\n' \"$(git rev-parse HEAD)\" >> .git/packed-refs; git checkout -q main";
    let id = review(&p, script);
    let d = sandbox(&p, &["diff", "--stat", &id], &[]);
    let text = &d.ok().stdout;
    assert!(text.contains("branch bad..name: not a valid branch name"), "{text}");
    assert!(text.contains(&format!("arrives as the branch ai-sandbox/{id}-good")), "{text}");
    let a = sandbox(&p, &["apply", &id], &[]);
    a.ok();
    let log = git_at(&p.dir, &["log", "-1", "--format=%s", &format!("ai-sandbox/{id}-good")]);
    assert_eq!(log.ok().stdout.trim(), "good", "{}", a.stderr);
    assert!(a.stderr.contains("bad..name") && a.stderr.contains("does not arrive"), "{}", a.stderr);
}

/// What a directory named for its edits carries: what `diff` could not show (binary) comes with
/// it, a planted `.envrc` below it does not (named itself, it does); a stray Latin-1 byte does
/// not hide a file's text behind "binary"; and a deleted directory that holds a called-out file
/// stays until that file is named too (apply never says "not applied" of what it deleted).
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_named_directory_carries_what_could_not_be_shown_but_never_a_planted_hook() {
    let p = repo("rv-named-dir");
    std::fs::create_dir_all(p.path("pkg")).unwrap();
    write_as_user(&p.path("pkg/.npmrc"), "registry=https://registry.npmjs.org/\n");
    write_as_user(&p.path("pkg/index.js"), "x\n");
    git_at(&p.dir, &["add", "-A"]).ok();
    git_at(&p.dir, &["commit", "-qm", "pkg"]).ok();
    let id = review(
        &p,
        "mkdir -p src && echo 'fn main() {}' > src/a.rs && echo 'echo planted' > src/.envrc && \
         printf 'ELF\\000\\000bin' > src/tool.bin && printf '# caf\\351\\nimport os\\n' > src/conftest.py && \
         rm -rf pkg",
    );
    let d = sandbox(&p, &["diff", &id], &[]);
    let text = &d.ok().stdout;
    assert!(text.contains("binary (a NUL byte in its first 8 KiB)"), "{text}");
    assert!(text.contains("+# caf\\xe9"), "the text with a Latin-1 byte is shown: {text}");
    let a = sandbox(&p, &["apply", &id, "src", "pkg"], &[]);
    a.ok();
    assert_eq!(read(&p, "src/a.rs"), "fn main() {}\n", "control: the named directory's edit landed");
    assert!(p.path("src/tool.bin").exists(), "what diff could not show comes with its directory");
    assert!(p.path("src/conftest.py").exists());
    assert!(!p.path("src/.envrc").exists(), "a planted .envrc came with its directory: {}", a.stderr);
    assert!(a.stderr.contains("not applied: src/.envrc"), "{}", a.stderr);
    assert!(p.path("pkg/.npmrc").exists(), "deleted with its directory though called out: {}", a.stderr);
    assert!(a.stderr.contains("would delete what is called out below it"), "{}", a.stderr);
    // Named itself, each lands.
    sandbox(&p, &["apply", &id, "src/.envrc", "pkg", "pkg/.npmrc"], &[]).ok();
    assert_eq!(read(&p, "src/.envrc"), "echo planted\n");
    assert!(!p.path("pkg").exists());
}

/// A shortened session id that is also a path (a directory the sandbox named as its id begins)
/// is not guessed at: taken as the session, `apply cafe` would apply everything. The whole id
/// and `./NAME` each mean one thing.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_shortened_id_that_is_also_a_path_applies_nothing_until_said_which() {
    let p = repo("rv-ambiguous");
    let id = review(&p, "echo one > one.txt");
    let short = &id[..4];
    // Made in the layer as the sandbox would (it can read its id in its mounts).
    let upper = reviews_of(&p)[0].join("upper");
    write_as_user(&upper.join(short).join("f.txt"), "x\n");
    let a = sandbox(&p, &["apply", short], &[]);
    assert_ne!(a.code, 0, "{}", a.stdout);
    assert!(a.stderr.contains("is both a shortened session id and a path"), "{}", a.stderr);
    assert!(!p.path("one.txt").exists() && !p.path(short).exists(), "something was applied");
    // A directory of the host's own named as the id begins is a path too.
    let longer = &id[..5];
    std::fs::create_dir_all(p.path(longer)).unwrap();
    let a = sandbox(&p, &["apply", longer], &[]);
    assert!(a.stderr.contains("is both a shortened session id and a path"), "{}", a.stderr);
    assert!(!p.path("one.txt").exists(), "something was applied");
    // The path alone, as ./NAME: only it lands.
    sandbox(&p, &["apply", &format!("./{short}")], &[]).ok();
    assert_eq!(read(&p, &format!("{short}/f.txt")), "x\n");
    assert!(!p.path("one.txt").exists(), "./NAME applied the whole session");
    // The whole id: the rest.
    sandbox(&p, &["apply", &id], &[]).ok();
    assert_eq!(read(&p, "one.txt"), "one\n");
}
