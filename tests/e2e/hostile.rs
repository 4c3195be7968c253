//! The guard on hostile ground, on real podman: what the host does after a session (the file
//! guard's cleanup, `login import`, the reports) never follows a link the agent made, never
//! blocks on its fifo and never prints its bytes raw; a sandbox cannot take the host down with a
//! fork bomb or by filling `/tmp`; a stop in the middle of the check leaves the project "not yet
//! verified" for the next launch. Each refusal beside the same work succeeding where it should.

use crate::harness::*;
use std::path::{Path, PathBuf};

/// Every file under `dir` with its bytes, to show a host directory untouched.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_symlink() {
                out.push((
                    e.path(),
                    std::fs::read_link(e.path()).unwrap().into_os_string().into_encoded_bytes(),
                ));
            } else if t.is_file() {
                out.push((e.path(), std::fs::read(e.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Files of the test user's outside every project (what a hostile link points at).
fn host_files(name: &str) -> PathBuf {
    let d = env().home.join(format!("e2e-hostile-{name}-{}", std::process::id()));
    std::fs::create_dir_all(d.join("other/.git")).unwrap();
    std::fs::create_dir_all(d.join("victim")).unwrap();
    std::fs::write(
        d.join("other/.git/config"),
        "[remote \"o\"]\n\turl = https://tok3n-e2e@example.invalid/x\n",
    )
    .unwrap();
    std::fs::write(d.join("victim/id_ed25519"), "PRIVATE KEY\n").unwrap();
    std::fs::write(d.join("victim/config"), "Host *\n").unwrap();
    std::fs::write(d.join("bashrc"), "# the user's bashrc\n").unwrap();
    for p in [
        "",
        "other",
        "other/.git",
        "other/.git/config",
        "victim",
        "victim/id_ed25519",
        "victim/config",
        "bashrc",
    ] {
        chown_user(&d.join(p));
    }
    d
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_fifo_in_a_new_repository_stalls_nothing_and_the_repository_beside_it_is_still_cleaned() {
    let p = Project::new("fifo");
    let m = marker_dir("fifo");
    let script = format!(
        "set -e; git init -q aa && git -C aa config core.fsmonitor 'touch {m}/aa-ran'; \
         git init -q zz && rm zz/.git/config && mkfifo zz/.git/config; \
         mkdir ww && mkfifo ww/.git; mkdir -p yy/.git && mkfifo yy/.git/commondir; echo planted",
        m = m.display()
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    // The harness's own time limit is 240 s: a launcher blocked on the fifo would end with 124.
    r.ok();
    assert!(r.stdout.contains("planted"), "{}", r.stdout);
    for named in [
        "zz/.git/config: a fifo where git expects a file",
        "ww/.git: a repository pointer made during the session",
        // control: the repository handled after the fifo is cleaned as it always was
        "aa/.git/config: a repository made during the session had settings that make git run programs (core.fsmonitor)",
    ] {
        assert!(r.stderr.contains(named), "the report must say {named}:\n{}", r.stderr);
    }
    assert_eq!(git_at(&p.path("aa"), &["status", "--short"]).code, 0);
    assert!(!m.join("aa-ran").exists(), "the planted fsmonitor ran on the host");
    // The next launch in the project does not block in any cleanup either.
    let again = sandbox(&p, &["--", "echo", "second"], &[]);
    assert_eq!(again.ok().stdout.trim(), "second");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_linked_config_or_hooks_directory_leaves_the_host_files_alone() {
    let host = host_files("links");
    let before = contents(&host);
    let p = Project::new("links");
    let script = format!(
        "set -e; git init -q s1 && rm s1/.git/config && ln -s {h}/other/.git/config s1/.git/config; \
         git init -q s2 && rm s2/.git/config && ln -s {h}/bashrc s2/.git/config; \
         git init -q s5 && rm -rf s5/.git/hooks && ln -s {h}/victim s5/.git/hooks; \
         git init -q s6 && printf '#!/bin/sh\\n' > s6/.git/hooks/post-checkout; \
         git init -q s7 && git -C s7 config url.https://sEcReT-e2e@example.invalid/.insteadOf x; echo planted",
        h = host.display()
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    r.ok();
    assert!(r.stdout.contains("planted"), "{}", r.stdout);
    assert_eq!(contents(&host), before, "a host file was changed, moved or emptied");
    for named in [
        "s1/.git/config: a symbolic link where git expects a file",
        "s2/.git/config: a symbolic link where git expects a file",
        "s5/.git/hooks: a symbolic link where git expects a directory",
        // control: a real hooks directory's hook goes aside as before
        "s6/.git/hooks/post-checkout: a hook in a repository made during the session",
        "url.\"…\".insteadof",
    ] {
        assert!(r.stderr.contains(named), "the report must say {named}:\n{}", r.stderr);
    }
    for secret in ["tok3n-e2e", "sEcReT-e2e", "the user's bashrc"] {
        assert!(!r.stderr.contains(secret) && !r.stdout.contains(secret), "{secret} printed:\n{}", r.stderr);
        let planted =
            contents(&p.dir).into_iter().filter(|(_, b)| String::from_utf8_lossy(b).contains(secret));
        assert_eq!(planted.count(), 0, "{secret}: a host file's bytes came into the project");
    }
    assert!(
        std::fs::symlink_metadata(p.path("s1/.git/config")).is_err(),
        "nothing written in the link's place"
    );
    let _ = std::fs::remove_dir_all(&host);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_link_planted_where_the_login_lives_is_never_followed_by_the_copy_back_the_next_copy_in_or_login_import()
{
    let host = host_files("login");
    let (bashrc, before) = (host.join("bashrc"), std::fs::read(host.join("bashrc")).unwrap());
    // A data dir of this test's own: the store is never reachable from a sandbox any more, so
    // the agent plants its link in the sandbox HOME, where the login is carried in and out.
    let data = env().home.join(format!("e2e-data-login-{}", std::process::id()));
    std::fs::create_dir_all(&data).unwrap();
    chown_user(&data);
    let vars = [("XDG_DATA_HOME", data.to_str().unwrap())];
    let p = Project::new("login");
    p.config("state = claude\n");
    let plant = format!("ln -sf {} \"$CLAUDE_CONFIG_DIR/.claude.json\" && echo planted", bashrc.display());
    let r = sandbox(&p, &["--", "sh", "-c", &plant], &vars);
    r.ok();
    assert!(r.stderr.contains("is a symbolic link, not a file"), "the copy back must say why: {}", r.stderr);
    assert_eq!(std::fs::read(&bashrc).unwrap(), before, "the copy back read or wrote through the link");
    // The user's real login, then the import a user runs on the host.
    let real = env().home.join(".claude.json");
    std::fs::write(&real, "{\"oauthAccount\":\"e2e\",\"mcpServers\":{\"x\":{\"command\":\"sh\"}}}\n")
        .unwrap();
    chown_user(&real);
    let r = sandbox(&p, &["login", "import", "claude"], &vars);
    let _ = std::fs::remove_file(&real);
    r.ok();
    let store = data.join("ai-sandbox/agents/claude/login/.claude.json");
    let copied = std::fs::read_to_string(&store).unwrap();
    assert!(
        copied.contains("\"e2e\"") && !copied.contains("mcpServers"),
        "control: the login imported, only it: {copied}"
    );
    // The next session's copy in replaces the link with the login, never writing through it.
    let r = sandbox(
        &p,
        &[
            "--",
            "sh",
            "-c",
            "test -L \"$CLAUDE_CONFIG_DIR/.claude.json\" && echo link; cat \"$CLAUDE_CONFIG_DIR/.claude.json\"",
        ],
        &vars,
    );
    r.ok();
    assert!(!r.stdout.contains("link") && r.stdout.contains("\"e2e\""), "{}", r.stdout);
    assert_eq!(std::fs::read(&bashrc).unwrap(), before, "the copy in wrote through the planted link");
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_dir_all(&host);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn names_made_of_terminal_escapes_are_reported_escaped() {
    let p = Project::new("escapes");
    let m = marker_dir("escapes");
    assert_eq!(git_at(&p.dir, &["init", "-q"]).code, 0);
    let script = format!(
        "set -e; d=$(printf 'x\\033]0;owned\\007\\033[2K\\033]52;c;cHduZWQ=\\007'); git init -q \"$d\"; \
         git -C \"$d\" config core.fsmonitor 'touch {m}/ran'; echo planted",
        m = m.display()
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    r.ok();
    assert!(r.stdout.contains("planted"), "{}", r.stdout);
    assert!(
        !r.stderr.contains('\u{1b}') && !r.stderr.contains('\u{7}'),
        "a raw escape reached the terminal: {:?}",
        r.stderr
    );
    assert!(
        r.stderr.contains("x\\e]0;owned\\x07\\e[2K\\e]52;c;cHduZWQ=\\x07/.git/config"),
        "control: the folder is named, escaped: {}",
        r.stderr
    );
    let again = sandbox(&p, &["report"], &[]);
    assert!(
        again.ok().stdout.contains("\\e]0;owned"),
        "`ai-sandbox report` shows it again: {}",
        again.stdout
    );
    assert!(!again.stdout.contains('\u{1b}'), "{:?}", again.stdout);
    let dir = std::fs::read_dir(&p.dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with('x'));
    assert_eq!(git_at(&dir.unwrap().path(), &["status", "--short"]).code, 0);
    assert!(!m.join("ran").exists(), "the planted fsmonitor ran");
    // Shown once: the next launch does not repeat it.
    let next = sandbox(&p, &["--", "true"], &[]);
    assert!(!next.ok().stderr.contains("owned"), "{}", next.stderr);
}

/// How many processes run in the pid namespace of `p`'s container (read from the host).
fn processes_in(p: &Project) -> usize {
    let line = containers_of(p).into_iter().next().expect("a running container");
    let pid = line.split_whitespace().nth(1).expect("NAME PID").to_string();
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()))
        .filter(|e| std::fs::read_link(e.path().join("ns/pid")).is_ok_and(|n| n == ns))
        .count()
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_fork_bomb_stops_at_the_process_limit_and_the_host_and_other_sandboxes_still_answer() {
    let p = Project::new("forkbomb");
    p.config("pids = 200\n");
    // control: a build's worth of processes within the limit all run
    let many = "for i in $(seq 100); do sleep 1 & done; wait; echo all-100-ran";
    assert!(sandbox(&p, &["--", "sh", "-c", many], &[]).ok().stdout.contains("all-100-ran"));
    // `ulimit -S -u 400` is a backstop for the host should the sandbox's limit be gone (it
    // cannot raise a hard limit of 200, so it changes nothing when the limit holds).
    let bomb = "ulimit -S -u 400 2>/dev/null; sleep 1000 & s=$!; ( b() { b | b & }; b ) 2>/dev/null; \
                while [ ! -e done ]; do read -t 1 x < /dev/zero 2>/dev/null || :; done; kill $s; echo bomb-over";
    let mut child = spawn_sandbox(&p, &["--", "bash", "-c", bomb]);
    assert!(wait_for(60, || containers_of(&p).len() == 1), "the sandbox did not start");
    // The bomb came near its limit (a fact, not a time); then its count is sampled for 3 s.
    assert!(
        wait_for(30, || processes_in(&p) > 150),
        "the bomb did not run (only {} processes): the limit is not what stopped it",
        processes_in(&p)
    );
    let mut most = 0;
    for _ in 0..10 {
        most = most.max(processes_in(&p));
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    assert!(most > 150, "the bomb did not run (only {most} processes): the limit is not what stopped it");
    assert!(most <= 200 + 2, "{most} processes in the sandbox, past the limit of 200");
    // The host still answers, and so does another sandbox of the same user.
    let ps = std::process::Command::new("ps").args(["-e", "-o", "pid="]).output().unwrap();
    assert!(ps.status.success() && ps.stdout.len() > 10, "ps on the host failed");
    let other = Project::new("forkbomb-other");
    assert_eq!(sandbox(&other, &["--", "echo", "second-ok"], &[]).ok().stdout.trim(), "second-ok");
    assert!(child.is_running(), "the bombed sandbox is still there (it ends when asked)");
    let out = finish(&p, child);
    assert!(out.contains("bomb-over"), "{out}");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn filling_tmp_stops_at_its_size() {
    let p = Project::new("tmpfull");
    p.config("tmp_size = 16m\n");
    // `yes` bounded at 64 MiB: were the limit gone, the test must not fill the host's memory.
    let script = "head -c 1048576 /dev/zero > /tmp/small && echo small-ok; \
                  yes | head -c 64M > /tmp/x; echo yes-rc=$?; echo size=$(du -k /tmp/x | cut -f1)";
    let r = sandbox(&p, &["--", "sh", "-c", script], &[]);
    r.ok();
    assert!(r.stdout.contains("small-ok"), "control: /tmp takes a file within its size: {}", r.stdout);
    assert!(!r.stdout.contains("yes-rc=0"), "{}", r.stdout);
    assert!(r.stderr.contains("No space left on device"), "{}", r.stderr);
    let kib: u64 = r.stdout.split("size=").nth(1).unwrap().trim().parse().unwrap();
    assert!((14 * 1024..=16 * 1024).contains(&kib), "/tmp/x is {kib} KiB, the limit 16 MiB");
}

/// Whether `pid` has podman running as its child (the sandbox is still there).
fn runs_podman(pid: i32) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    let children: Vec<String> = tasks
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    children
        .iter()
        .any(|c| std::fs::read_to_string(format!("/proc/{c}/comm")).is_ok_and(|n| n.trim() == "podman"))
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn sigterm_while_the_guard_checks_ends_the_launcher_and_the_next_launch_verifies() {
    let p = Project::new("sigterm");
    let m = marker_dir("sigterm");
    assert_eq!(git_at(&p.dir, &["init", "-q"]).code, 0);
    // 100,000 files for the guard's walk after the session.
    for d in 0..100 {
        let dir = p.path(&format!("pkg/m{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..1000 {
            std::fs::write(dir.join(format!("f{f}.txt")), "").unwrap();
        }
    }
    let script = format!(
        "git init -q planted && git -C planted config core.fsmonitor 'touch {m}/ran' && \
         echo 'touch {m}/envrc-ran' > .envrc && echo planted",
        m = m.display()
    );
    // A stop can land just before or just after the check: tried until one lands during it.
    let mut landed = None;
    for _ in 0..5 {
        let child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
        let mut pid = None;
        assert!(wait_for(60, || {
            pid = pid_of_launcher(&p);
            pid.is_some_and(runs_podman)
        }));
        let pid = pid.unwrap();
        // podman has exited (the command was short): the launcher is in its check now.
        while runs_podman(pid) {
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        let sent = std::time::Instant::now();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
        let out = child.wait_with_output();
        let took = sent.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if stderr.contains("the project is NOT yet verified") {
            landed = Some((took, out.status.code(), stderr));
            break;
        }
        assert!(stderr.contains("PROTECTED FILES WERE CHANGED"), "a check that finished reports: {stderr}");
    }
    let (took, code, stderr) = landed.expect("no SIGTERM landed during the guard's check in 5 tries");
    assert_eq!(code, Some(128 + 15), "{stderr}");
    assert!(took < std::time::Duration::from_secs(2), "the launcher took {took:?} to end on SIGTERM");
    // The next launch says so and verifies before anything starts.
    let next = sandbox(&p, &["--", "echo", "next-ran"], &[]);
    next.ok();
    assert!(next.stderr.contains("is not yet verified"), "{}", next.stderr);
    assert!(next.stderr.contains(".envrc: created during the session"), "{}", next.stderr);
    assert!(next.stdout.contains("next-ran"), "control: the launch goes on once verified");
    assert!(!p.path(".envrc").exists());
    assert_eq!(git_at(&p.path("planted"), &["status", "--short"]).code, 0);
    assert!(!m.join("ran").exists(), "the planted fsmonitor ran on the host");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_swapped_git_directory_puts_the_users_repository_back() {
    let p = Project::new("swap");
    assert_eq!(git_at(&p.dir, &["init", "-q"]).code, 0);
    assert_eq!(git_at(&p.dir, &["commit", "-q", "--allow-empty", "-m", "the-users-commit"]).code, 0);
    let script = "mv .git .git-moved && mkdir .git && cp -r .git-moved/* .git/ && \
                  git -c user.name=a -c user.email=a@example.invalid commit -q --allow-empty -m sandbox-commit && echo swapped";
    let r = sandbox(&p, &["--", "sh", "-c", script], &[]);
    r.ok();
    assert!(r.stdout.contains("swapped"), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(".git: replaced during the session"), "{}", r.stderr);
    assert!(r.stderr.contains("your repository is back at .git"), "{}", r.stderr);
    assert!(!p.path(".git-moved").exists(), "the user's repository is still at .git-moved");
    let log = git_at(&p.dir, &["log", "--format=%s"]);
    assert!(log.stdout.contains("the-users-commit"), "control: the user's history is there: {}", log.stdout);
    assert!(!log.stdout.contains("sandbox-commit"), "the sandbox's copy is at .git: {}", log.stdout);
}
