//! The repository walk and the clean-up of repositories a session made, on real directories.

use super::*;

fn gitdir(dir: &Path) {
    fs::create_dir_all(dir.join("objects")).unwrap();
    fs::create_dir_all(dir.join("refs/heads")).unwrap();
    fs::create_dir_all(dir.join("hooks")).unwrap();
    fs::write(dir.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(dir.join("config"), "[core]\n\trepositoryformatversion = 0\n\tbare = false\n").unwrap();
    fs::write(dir.join("hooks/pre-commit.sample"), "#!/bin/sh\n").unwrap();
}

#[test]
fn the_walk_finds_every_kind_of_repository_and_never_enters_one() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    gitdir(&p.join(".git"));
    gitdir(&p.join("vendor/lib/.git"));
    gitdir(&p.join("vendor/lib/.git/modules/inner")); // inside a git dir: not walked
    gitdir(&p.join("bare.git")); // bare-shaped: git uses it when run inside
    fs::create_dir_all(p.join("sub")).unwrap();
    fs::write(p.join("sub/.git"), "gitdir: ../bare.git\n").unwrap();
    fs::create_dir_all(p.join("linked")).unwrap();
    std::os::unix::fs::symlink("../vendor/lib/.git", p.join("linked/.git")).unwrap();
    std::os::unix::fs::symlink("/", p.join("rootlink")).unwrap(); // never followed
    fs::create_dir_all(p.join("src/deep/er")).unwrap();
    fs::write(p.join("src/deep/er/HEAD"), "not a repo: no objects, refs or commondir\n").unwrap();
    let r = scan(p).unwrap();
    let paths = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
    let gitdirs: Vec<PathBuf> = r.gitdirs.iter().map(|(g, _)| g.clone()).collect();
    assert_eq!(gitdirs, paths(&[".git", "bare.git", "vendor/lib/.git"]));
    let pointers: Vec<PathBuf> = r.pointers.iter().map(|(g, _)| g.clone()).collect();
    assert_eq!(pointers, paths(&["linked/.git", "sub/.git"]));
    assert_eq!(r.pointers[1].1, Some(fs::canonicalize(p.join("bare.git")).unwrap()), "where sub/.git leads");
    assert!(
        !super::roots(p, &r, false).iter().any(|x| x.starts_with("vendor")),
        "only the root's are mounted"
    );
    let roots = super::roots(p, &r, true);
    for want in [
        "vendor/lib/.git/config",
        "vendor/lib/.git/hooks",
        "vendor/lib/.gitmodules",
        "bare.git/config",
        "sub/.git",
    ] {
        assert!(roots.contains(&PathBuf::from(want)), "{want} not protected: {roots:?}");
    }
    assert_eq!(
        pointer_target(&Tree::open(p).unwrap(), Path::new("sub/.git")),
        Some(fs::canonicalize(p.join("bare.git")).unwrap())
    );
}

#[test]
fn a_config_keeps_what_a_clone_has_and_loses_whatever_runs_a_program() {
    let text = "[core]\n\trepositoryformatversion = 0\n\tfsmonitor = touch /tmp/x\n\tbare = false\n\
                [remote \"origin\"]\n\turl = https://example.invalid/x.git\n\tuploadpack = evil\n\
                [branch \"main\"]\n\tremote = origin\n[alias]\n\tst = !touch /tmp/y\n\
                [include]\n\tpath = ../../evil.cfg\n[includeIf \"gitdir:/\"]\n\tpath = x\n\
                [filter \"lfs\"]\n\tsmudge = evil\n[core] hooksPath = /tmp/h\n\
                [core]\n\tsshCommand = evil\n\tPager = \"less\" ; a comment \\\n\tabbrev = 7\n\
                [extensions]\n\tobjectFormat = sha256\n[Core]\n\teditor = x\n[core]gitProxy=x\n";
    let (clean, dropped) = sanitize_config(text);
    for bad in [
        "fsmonitor",
        "uploadpack",
        "!touch",
        "evil",
        "hooksPath",
        "sshCommand",
        "Pager",
        "editor",
        "gitProxy",
    ] {
        assert!(!clean.contains(bad), "{bad} survived:\n{clean}");
    }
    for good in [
        "repositoryformatversion = 0",
        "bare = false",
        "url = https://example.invalid/x.git",
        "remote = origin",
        "objectFormat = sha256",
        "abbrev = 7",
    ] {
        assert!(clean.contains(good), "{good} lost:\n{clean}");
    }
    for name in [
        "core.fsmonitor",
        "remote.origin.uploadpack",
        "alias.st",
        "include.path",
        "includeif.gitdir:/.path",
        "filter.lfs.smudge",
        "core.hookspath",
        "core.sshcommand",
        "core.pager",
        "core.editor",
        "core.gitproxy",
    ] {
        assert!(dropped.contains(&name.to_string()), "{name} not reported: {dropped:?}");
    }
}

#[test]
fn a_value_continued_over_a_backslash_goes_with_its_setting() {
    // Kept setting, continued: the next line is its value, not a setting of its own.
    let (clean, dropped) = sanitize_config("[core]\n\tabbrev = 7\\\nfsmonitor\n");
    assert!(dropped.is_empty(), "{dropped:?}");
    assert_eq!(clean, "[core]\n\tabbrev = 7\\\nfsmonitor\n");
    // Dropped setting, continued: both lines go.
    let (clean, _) = sanitize_config("[core]\n\tpager = a\\\n b\n\tbare = true\n");
    assert_eq!(clean, "[core]\n\tbare = true\n");
    // A backslash ending a comment continues nothing: the next line is a setting of its own.
    let (clean, dropped) = sanitize_config("[core]\n\tbare = true # x \\\n\tfsmonitor = evil\n");
    assert_eq!(clean, "[core]\n\tbare = true # x \\\n");
    assert_eq!(dropped, ["core.fsmonitor"]);
    // A section left with nothing goes too, with its comments.
    let (clean, _) = sanitize_config("[alias]\n\t# mine\n\tst = !x\n[core]\n\tbare = true\n");
    assert_eq!(clean, "[core]\n\tbare = true\n");
    // A header git might read otherwise drops what follows it, up to the next readable header.
    let (clean, dropped) = sanitize_config("[core \"x]\n\tbare = true\n[core]\n\tbare = false\n");
    assert_eq!(clean, "[core]\n\tbare = false\n");
    assert_eq!(dropped.len(), 1);
}

#[test]
fn a_repository_made_during_the_session_keeps_its_objects_and_loses_what_runs() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("p");
    gitdir(&p.join(".git"));
    gitdir(&p.join("vendored/.git"));
    fs::write(p.join("vendored/.git/config"), "[core]\n\tpager = mine\n").unwrap();
    let before = scan(&p).unwrap();
    let protected = super::roots(&p, &before, true);
    // The session: a new repository with a planted fsmonitor and hook, a pointer to a git dir
    // made elsewhere in the project, and one leading outside it.
    gitdir(&p.join("new/.git"));
    fs::write(p.join("new/.git/objects/ab"), "object").unwrap();
    fs::write(p.join("new/.git/config"), "[core]\n\tbare = false\n\tfsmonitor = touch /tmp/x\n").unwrap();
    fs::write(p.join("new/.git/hooks/post-commit"), "#!/bin/sh\n").unwrap();
    gitdir(&p.join(".hidden/gd"));
    fs::write(p.join(".hidden/gd/config"), "[core]\n\thooksPath = /tmp/h\n").unwrap();
    fs::remove_file(p.join(".hidden/gd/HEAD")).unwrap(); // not bare-shaped: found by the pointer only
    fs::create_dir_all(p.join("sub")).unwrap();
    fs::write(p.join("sub/.git"), "gitdir: ../.hidden/gd\n").unwrap();
    let outside = t.path().join("outside");
    gitdir(&outside);
    fs::create_dir_all(p.join("out")).unwrap();
    fs::write(p.join("out/.git"), format!("gitdir: {}\n", outside.display())).unwrap();
    let q = t.path().join("q");
    let report = settle_new(&Tree::open(&p).unwrap(), &before, &protected, &[], &q).unwrap();
    assert_eq!(report.len(), 4, "{report:#?}");
    let cfg = fs::read_to_string(p.join("new/.git/config")).unwrap();
    assert_eq!(cfg, "[core]\n\tbare = false\n");
    assert!(
        fs::read_to_string(q.join("new/.git/config")).unwrap().contains("fsmonitor"),
        "the original is kept aside"
    );
    assert!(!p.join("new/.git/hooks/post-commit").exists() && q.join("new/.git/hooks/post-commit").exists());
    assert!(p.join("new/.git/hooks/pre-commit.sample").exists() && p.join("new/.git/objects/ab").exists());
    assert!(!fs::read_to_string(p.join(".hidden/gd/config")).unwrap().contains("hooksPath"));
    assert!(!p.join("out/.git").exists() && q.join("out/.git").exists(), "a pointer outside goes aside");
    assert_eq!(
        fs::read_to_string(p.join("vendored/.git/config")).unwrap(),
        "[core]\n\tpager = mine\n",
        "repositories that existed are the record's to verify, not changed here"
    );
    assert!(
        settle_new(&Tree::open(&p).unwrap(), &before, &protected, &[], &q).unwrap().is_empty(),
        "a second pass finds nothing more"
    );
}

#[test]
fn a_new_repository_sharing_a_git_dir_outside_the_project_loses_the_link() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("p");
    fs::create_dir_all(&p).unwrap();
    let before = scan(&p).unwrap();
    let wt = p.join("wt");
    fs::create_dir_all(&wt).unwrap();
    fs::write(wt.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(wt.join("commondir"), format!("{}\n", t.path().display())).unwrap();
    let q = t.path().join("q");
    let report = settle_new(&Tree::open(&p).unwrap(), &before, &[], &[], &q).unwrap();
    assert!(!wt.join("commondir").exists() && report.len() == 1, "{report:?}");
}

#[test]
fn a_link_made_into_the_sandboxs_own_files_outside_the_project_goes_aside() {
    let t = tempfile::tempdir().unwrap();
    let (p, home) = (t.path().join("p"), t.path().join("sandbox-home"));
    fs::create_dir_all(p.join("node_modules/.bin")).unwrap();
    fs::create_dir_all(p.join("node_modules/x")).unwrap();
    fs::create_dir_all(home.join("evil")).unwrap();
    std::os::unix::fs::symlink("/usr", p.join("usr-before")).unwrap();
    let before = scan(&p).unwrap();
    assert_eq!(before.links_out, [PathBuf::from("usr-before")]);
    std::os::unix::fs::symlink("../x", p.join("node_modules/.bin/x")).unwrap(); // nearby: fine
    std::os::unix::fs::symlink(home.join("evil"), p.join("cd-me")).unwrap();
    std::os::unix::fs::symlink("/usr/share", p.join("share")).unwrap(); // out, not the sandbox's
    let q = t.path().join("q");
    let report = settle_new(&Tree::open(&p).unwrap(), &before, &[], std::slice::from_ref(&home), &q).unwrap();
    assert_eq!(report.len(), 1, "{report:?}");
    assert!(!p.join("cd-me").exists() && q.join("cd-me").symlink_metadata().is_ok());
    assert!(
        p.join("share").exists() && p.join("node_modules/.bin/x").exists() && p.join("usr-before").exists()
    );
}
