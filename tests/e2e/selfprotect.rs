//! Self-protection on real podman: the sandbox cannot widen its own policy (the config applies
//! only as approved), nor plant code the host later runs (protected paths read-only inside,
//! verified and restored after the session, also when the launcher is killed). Each refusal is
//! paired with the same work succeeding where it should (approved config applies, ordinary files
//! and commits land).

use crate::harness::*;

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn an_edit_of_the_config_applies_only_after_trust() {
    let (a, b) = (Banner::start("A\n"), Banner::start("B\n"));
    let p = Project::new("trust");
    p.config(&format!("allow = 100.64.0.1:{}\n", a.port));
    let (pa, pb) = (format!("tcp:100.64.0.1:{}", a.port), format!("tcp:100.64.0.1:{}", b.port));
    // Inside: the agent tries to add B to its own config: in place, by replacing the file, and by
    // replacing the directory (a mount point: it cannot be renamed or removed).
    let widen = format!("allow = 100.64.0.1:{}", b.port);
    let script = format!(
        "echo '{widen}' >> .ai-sandbox/config; echo append-rc=$?; \
         cp .ai-sandbox/config /tmp/c && echo '{widen}' >> /tmp/c && mv /tmp/c .ai-sandbox/config; echo replace-rc=$?; \
         mv .ai-sandbox .aisb-old; echo rename-rc=$?; rm -rf .ai-sandbox; echo remove-rc=$?; \
         echo ordinary > notes.txt && echo ordinary-ok; \
         /usr/bin/python3 probe.py {pa} {pb}"
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    r.ok();
    for attempt in ["append-rc=0", "replace-rc=0", "rename-rc=0", "remove-rc=0"] {
        assert!(!r.stdout.contains(attempt), "the config could be changed inside ({attempt}): {}", r.stdout);
    }
    assert!(r.stdout.contains("ordinary-ok"), "positive control: ordinary files are writable: {}", r.stdout);
    assert_eq!(r.probe(&pa), "open", "positive control: the approved entry applies");
    assert_ne!(r.probe(&pb), "open", "an entry the agent added applied in the same session");
    let cfg = std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap();
    assert!(!cfg.contains(&widen), "the agent's edit survived the session: {cfg}");
    // A changed config (the agent's edit reaching the host some other way, a pulled commit):
    // the next launch without a terminal starts nothing and says what changed.
    p.config_unapproved(&format!("allow = 100.64.0.1:{}\n{widen}\n", a.port));
    let mut args = vec!["--", "sh", "-c", "touch ran; /usr/bin/python3 probe.py \"$@\"", "sh"];
    args.extend([pa.as_str(), pb.as_str()]);
    let r = sandbox(&p, &args, &[]);
    assert_eq!(r.code, 125, "{}\n{}", r.stdout, r.stderr);
    assert!(!p.path("ran").exists(), "the command ran under an unapproved config");
    assert!(r.stderr.contains(&format!("+{widen}")) && r.stderr.contains("ai-sandbox trust"), "{}", r.stderr);
    assert!(r.stderr.contains("nothing was started"), "{}", r.stderr);
    // After `ai-sandbox trust`, it applies.
    let t = sandbox(&p, &["trust"], &[]);
    assert!(t.ok().stdout.contains("approved"), "{}", t.stdout);
    let r = sandbox(&p, &args, &[]);
    r.ok();
    assert_eq!(r.probe(&pb), "open", "the approved change applies");
    assert_eq!(r.probe(&pa), "open");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_cloned_config_nobody_approved_starts_nothing() {
    let p = Project::new("cloned");
    p.config_unapproved("extra_args = -v /etc:/hostetc:ro\n");
    let r = sandbox(&p, &["--", "touch", "ran"], &[]);
    assert_eq!(r.code, 125);
    assert!(!p.path("ran").exists(), "an unapproved config started a sandbox");
    assert!(r.stderr.contains("has not been approved for this project"), "{}", r.stderr);
    assert!(
        r.stderr.contains("mounts a host path (/etc:/hostetc:ro)"),
        "widening lines called out: {}",
        r.stderr
    );
    let show = sandbox(&p, &["trust", "--show"], &[]);
    assert_eq!(show.code, 1, "--show approves nothing");
    assert!(show.stdout.contains("mounts a host path"), "{}", show.stdout);
    let dry = sandbox(&p, &["--dry-run"], &[]);
    assert!(dry.ok().stdout.contains("is not approved"), "dry runs still work and say so");
    sandbox(&p, &["trust"], &[]).ok();
    sandbox(&p, &["--", "touch", "ran"], &[]).ok();
    assert!(p.path("ran").exists(), "positive control: the approved config starts");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn hooks_and_git_config_planted_inside_never_run_on_the_host() {
    let p = Project::new("githooks");
    let m = marker_dir("githooks");
    let (hook_m, fsmon_m, hp_m) = (m.join("hook-ran"), m.join("fsmonitor-ran"), m.join("hookspath-ran"));
    assert_eq!(git_at(&p.dir, &["init", "-q"]).code, 0);
    std::fs::write(p.path("README"), "hi\n").unwrap();
    chown_user(&p.path("README"));
    assert_eq!(git_at(&p.dir, &["add", "README"]).code, 0);
    assert_eq!(git_at(&p.dir, &["commit", "-qm", "host"]).code, 0, "setup commit");
    let script = format!(
        "set +e; G='git -c user.name=agent -c user.email=a@example.invalid'; \
         printf '#!/bin/sh\\ntouch {hook}\\n' > .git/hooks/post-commit; echo hook-rc=$?; \
         git config core.fsmonitor 'touch {fsmon}'; echo config-rc=$?; git config core.hooksPath .evilhooks; echo hookspath-rc=$?; \
         echo work > work.txt && $G add work.txt && $G commit -qm inside && echo committed-inside; \
         mv .git .git-real && cp -a .git-real .git && \
         printf '#!/bin/sh\\ntouch {hook}\\n' > .git/hooks/post-commit && chmod +x .git/hooks/post-commit && \
         git config -f .git/config core.fsmonitor 'touch {fsmon}' && git config -f .git/config core.hooksPath .evilhooks && \
         mkdir -p .evilhooks && printf '#!/bin/sh\\ntouch {hp}\\n' > .evilhooks/post-commit && chmod +x .evilhooks/post-commit && \
         printf 'echo envrc\\n' > .envrc && echo sidestepped",
        hook = hook_m.display(),
        fsmon = fsmon_m.display(),
        hp = hp_m.display()
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    r.ok();
    assert!(
        !r.stdout.contains("hook-rc=0") && !r.stdout.contains("config-rc=0"),
        "writable inside: {}",
        r.stdout
    );
    assert!(
        r.stdout.contains("committed-inside"),
        "positive control: git add/commit inside: {}\n{}",
        r.stdout,
        r.stderr
    );
    assert!(r.stdout.contains("sidestepped"), "{}", r.stdout);
    // The rebuilt .git (with the planted hook and config) goes aside whole and the user's
    // repository comes back from .git-real.
    for named in [
        ".envrc",
        ".git: replaced during the session",
        "moved to .git-real",
        "your repository is back at .git",
    ] {
        assert!(r.stderr.contains(named), "the report must name {named}:\n{}", r.stderr);
    }
    assert!(!p.path(".git-real").exists(), "the user's repository is still at .git-real");
    // The host's next git commands: nothing the sandbox wrote runs.
    let st = git_at(&p.dir, &["status", "--short"]);
    assert_eq!(st.code, 0, "{}", st.stderr);
    let c = git_at(&p.dir, &["commit", "--allow-empty", "-qm", "after"]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    assert!(!hook_m.exists() && !fsmon_m.exists() && !hp_m.exists(), "code planted inside ran on the host");
    let log = git_at(&p.dir, &["log", "--format=%s"]);
    assert!(
        log.stdout.contains("inside") && log.stdout.contains("after"),
        "the work done inside is kept: {}",
        log.stdout
    );
    assert!(p.path("work.txt").exists(), "ordinary files written inside stay");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_killed_launchers_keeper_restores_and_the_next_launch_reports_it() {
    let p = Project::new("guardkill");
    let script = format!("printf 'echo planted\\n' > .envrc; touch ready; {UNTIL_DONE}");
    let child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
    assert!(wait_for(60, || p.path("ready").exists()), "sandbox did not start");
    assert!(p.path(".envrc").exists(), "control: the sandbox could create it");
    let launcher = pid_of_launcher(&p).expect("launcher");
    let group = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(launcher))).unwrap();
    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = child.wait_with_output();
    assert!(wait_for(20, || !p.path(".envrc").exists()), "the keeper did not undo the planted .envrc");
    let r = sandbox(&p, &["--", "true"], &[]);
    r.ok();
    assert!(
        r.stderr.contains("since your last session here")
            && r.stderr.contains(".envrc: created during the session"),
        "{}",
        r.stderr
    );
    let again = sandbox(&p, &["--", "true"], &[]);
    assert!(!again.stderr.contains("since your last session"), "reported once: {}", again.stderr);
}
