//! The file layer, round two, on real podman: every repository in the project is host-trusted
//! code (one the session makes loses what would run a program on the host; one that existed is
//! read-only inside like the root's, and keeps its commits), an edit the user makes on the host
//! during a session is kept, `--image` never pulls, and the sandbox proves its rules hold before
//! its command runs. Each refusal is paired with the same work succeeding where it should.

use crate::harness::*;

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn repositories_made_or_planted_below_the_root_run_nothing_on_the_host() {
    let p = Project::new("nested");
    let m = marker_dir("nested");
    let mark = |n: &str| m.join(n);
    // Before the session: the root repository and a vendored one inside it, each with a commit.
    assert_eq!(git_at(&p.dir, &["init", "-q"]).code, 0);
    std::fs::create_dir_all(p.path("vendor/lib")).unwrap();
    chown_user(&p.path("vendor"));
    chown_user(&p.path("vendor/lib"));
    let lib = p.path("vendor/lib");
    assert_eq!(git_at(&lib, &["init", "-q"]).code, 0);
    assert_eq!(git_at(&lib, &["commit", "-q", "--allow-empty", "-m", "vendored"]).code, 0);
    // One a tool or a test suite deletes inside: it may (it is not mounted read-only).
    std::fs::create_dir_all(p.path("scratch")).unwrap();
    chown_user(&p.path("scratch"));
    assert_eq!(git_at(&p.path("scratch"), &["init", "-q"]).code, 0);
    // The control: the same planted setting in a repository the host made itself runs on the
    // host's `git status` (so a marker that stays absent below means something).
    std::fs::create_dir_all(p.path("control")).unwrap();
    chown_user(&p.path("control"));
    assert_eq!(git_at(&p.path("control"), &["init", "-q"]).code, 0);
    let fsmon = format!("touch {}", mark("control-ran").display());
    assert_eq!(git_at(&p.path("control"), &["config", "core.fsmonitor", &fsmon]).code, 0);
    let script = format!(
        "set +e; G='git -c user.name=agent -c user.email=a@example.invalid'; \
         git init -q sub && echo kept > sub/file && $G -C sub add file && $G -C sub commit -qm inside-sub && echo sub-committed; \
         git -C sub config core.fsmonitor 'touch {m1}' && git -C sub config core.hooksPath .h && \
         git -C sub config alias.st '!touch {m3}' && mkdir -p sub/.h && printf '#!/bin/sh\\ntouch {m4}\\n' > sub/.h/post-commit && \
         printf '#!/bin/sh\\ntouch {m4}\\n' > sub/.git/hooks/post-commit && chmod +x sub/.h/post-commit sub/.git/hooks/post-commit && echo planted; \
         mkdir -p .hidden && git init -q --separate-git-dir=.hidden/gd sub2 && git -C sub2 config core.fsmonitor 'touch {m2}' && echo sub2-made; \
         git -C vendor/lib config core.fsmonitor 'touch {m5}'; echo vendored-config-rc=$?; \
         $G -C vendor/lib commit -q --allow-empty -m inside-vendored && echo vendored-committed; \
         rm -rf scratch && echo scratch-deleted; \
         mkdir -p hidden && git init -q hidden/x && git -C hidden/x config core.fsmonitor 'touch {m6}' && chmod 000 hidden && echo hidden-made",
        m1 = mark("sub-fsmonitor").display(),
        m2 = mark("sub2-fsmonitor").display(),
        m3 = mark("sub-alias").display(),
        m4 = mark("sub-hook").display(),
        m5 = mark("vendored-fsmonitor").display(),
        m6 = mark("hidden-fsmonitor").display(),
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    r.ok();
    for done in
        ["sub-committed", "planted", "sub2-made", "vendored-committed", "scratch-deleted", "hidden-made"]
    {
        assert!(r.stdout.contains(done), "positive control {done}: {}\n{}", r.stdout, r.stderr);
    }
    assert!(!p.path("scratch").exists(), "a repository deleted inside is left deleted:\n{}", r.stderr);
    // The host's git in each folder, as a prompt or an editor would run it.
    for dir in ["sub", "sub2", "vendor/lib", "control", "hidden/x"] {
        let st = git_at(&p.path(dir), &["status", "--short"]);
        assert_eq!(st.code, 0, "git status in {dir}: {}", st.stderr);
    }
    assert_eq!(git_at(&p.path("sub"), &["commit", "-q", "--allow-empty", "-m", "host"]).code, 0);
    assert!(mark("control-ran").exists(), "control: a host-made repository's fsmonitor runs");
    for planted in ["sub-fsmonitor", "sub2-fsmonitor", "sub-hook", "vendored-fsmonitor", "hidden-fsmonitor"] {
        assert!(!mark(planted).exists(), "{planted}: code planted inside ran on the host");
    }
    for named in [
        "sub/.git/config",
        "core.fsmonitor",
        "alias.st",
        "sub/.git/hooks/post-commit",
        ".hidden/gd/config",
        "vendor/lib/.git/config: changed during the session; restored",
        "hidden: made unreadable during the session; opened",
        "hidden/x/.git/config",
    ] {
        assert!(r.stderr.contains(named), "the report must name {named}:\n{}", r.stderr);
    }
    let cfg = std::fs::read_to_string(p.path("sub/.git/config")).unwrap();
    assert!(!cfg.contains("fsmonitor") && !cfg.contains("alias") && !cfg.contains("hooksPath"), "{cfg}");
    // The work is kept: the new repository's commit and file, the vendored one's commits.
    let log = git_at(&p.path("sub"), &["log", "--format=%s"]);
    assert!(log.stdout.contains("inside-sub") && log.stdout.contains("host"), "{}", log.stdout);
    assert_eq!(std::fs::read_to_string(p.path("sub/file")).unwrap(), "kept\n");
    let log = git_at(&lib, &["log", "--format=%s"]);
    assert!(log.stdout.contains("inside-vendored") && log.stdout.contains("vendored"), "{}", log.stdout);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_host_edit_of_the_config_during_a_session_is_kept_and_needs_approval() {
    let (a, b) = (Banner::start("A\n"), Banner::start("B\n"));
    let p = Project::new("hostedit");
    p.config(&format!("allow = 100.64.0.1:{}\n", a.port));
    let script = format!("touch ready; {UNTIL_DONE}");
    let child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
    assert!(wait_for(60, || p.path("ready").exists()), "sandbox did not start");
    // The user edits the config in an editor on the host: a new file renamed over the old one.
    let edited = format!("allow = 100.64.0.1:{}\nallow = 100.64.0.1:{}\n", a.port, b.port);
    let tmp = p.path(".ai-sandbox/.config.swp");
    std::fs::write(&tmp, &edited).unwrap();
    chown_user(&tmp);
    std::fs::rename(&tmp, p.path(".ai-sandbox/config")).unwrap();
    std::fs::write(p.path("done"), "").unwrap();
    let out = child.wait_with_output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap(),
        edited,
        "the edit was reverted:\n{stderr}"
    );
    assert!(
        stderr.contains("kept your changes made on the host") && stderr.contains(".ai-sandbox/config"),
        "{stderr}"
    );
    assert!(!stderr.contains("PROTECTED FILES WERE CHANGED"), "{stderr}");
    // It needs approval like any change, then applies.
    let (pa, pb) = (format!("tcp:100.64.0.1:{}", a.port), format!("tcp:100.64.0.1:{}", b.port));
    let r = sandbox(&p, &probe_args(&[&pa, &pb]), &[]);
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(
        r.stderr.contains("not approved") && r.stderr.contains(&format!("+allow = 100.64.0.1:{}", b.port)),
        "{}",
        r.stderr
    );
    sandbox(&p, &["trust"], &[]).ok();
    let r = sandbox(&p, &probe_args(&[&pa, &pb]), &[]);
    r.ok();
    assert_eq!((r.probe(&pa), r.probe(&pb)), ("open", "open"), "the approved edit applies");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn an_image_that_is_not_here_is_never_pulled() {
    let p = Project::new("nopull");
    let image = "localhost/aisb-e2e-nosuch:1";
    let before = as_user("/usr/bin/podman", &["images", "-q"]).stdout;
    let r = sandbox(&p, &["--image", image, "--", "touch", "ran"], &[]);
    assert_eq!(r.code, 125, "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("never pulls") && r.stderr.contains(&format!("podman pull {image}")),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("Trying to pull") && !p.path("ran").exists(), "{}", r.stderr);
    assert_eq!(as_user("/usr/bin/podman", &["images", "-q"]).stdout, before, "no image was fetched");
    assert!(containers_of(&p).is_empty());
    // Positive control: the same run on the host's own tools starts.
    sandbox(&p, &["--", "touch", "ran"], &[]).ok();
    assert!(p.path("ran").exists());
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn the_command_never_runs_unless_the_sandbox_proves_its_rules_hold() {
    let p = Project::new("selfcheck");
    p.config("allow = example.com\n");
    // The mutation: an nft that says it loaded the ruleset and loaded nothing.
    let fake = env().root.join("bin/nft-loads-nothing");
    std::fs::write(&fake, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let r = sandbox(&p, &["--", "touch", "ran"], &[("AISB_NFT", fake.to_str().unwrap())]);
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(!p.path("ran").exists(), "the command ran with no rules in force");
    assert!(
        r.stderr.contains("self-check failed") && r.stderr.contains("the ruleset is not in force"),
        "{}",
        r.stderr
    );
    assert!(containers_of(&p).is_empty());
    // Positive control: with the real nft, the check passes and the command runs; what the
    // check probed is not reported as a refusal of the agent's.
    let r = sandbox(&p, &["--", "touch", "ran"], &[]);
    r.ok();
    assert!(p.path("ran").exists());
    assert!(!r.stderr.contains("refused"), "the self-check's probe was reported: {}", r.stderr);
    // And the dry run says what it checks.
    let dry = sandbox(&p, &["--dry-run"], &[]);
    assert!(dry.ok().stdout.contains("# self-check: before the command exists"), "{}", dry.stdout);
}
