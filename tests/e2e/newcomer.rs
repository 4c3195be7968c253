//! A newcomer's first hour, on real podman: what the man page's exit-status table promises is
//! what a launch returns, and the command starts where the user is.

use crate::harness::*;
use std::path::Path;

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn every_exit_status_the_man_page_lists_is_what_a_launch_returns() {
    let p = Project::new("exitcodes");
    std::fs::write(p.path("plain.sh"), "echo hi\n").unwrap();
    chown_user(&p.path("plain.sh"));
    let table: Vec<&str> = ai_sandbox::cli::EXIT_STATUS.iter().map(|(k, _)| *k).collect();
    let cases: &[(&str, &[&str], i32)] = &[
        ("N", &["--", "sh", "-c", "exit 7"], 7),
        ("N", &["--", "sh", "-c", "kill -TERM $$"], 128 + 15),
        ("125", &["--allow", "bad entry", "--", "true"], 125),
        ("126, 127", &["--", "./plain.sh"], 126),
        ("126, 127", &["--", "nosuchcmd"], 127),
    ];
    for (row, args, want) in cases {
        assert!(table.contains(row), "the man page's table has no row {row}: {table:?}");
        let r = sandbox(&p, args, &[]);
        assert_eq!(r.code, *want, "{args:?}: {}\n{}", r.stdout, r.stderr);
    }
    // Positive control: a command that runs exits 0, and prints.
    let r = sandbox(&p, &["--", "echo", "ran"], &[]);
    assert_eq!((r.code, r.stdout.trim()), (0, "ran"), "{}", r.stderr);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn the_command_runs_in_the_directory_it_was_started_from() {
    let p = Project::new("workdir");
    let deep = p.path("sub/deep");
    std::fs::create_dir_all(&deep).unwrap();
    chown_user(&p.path("sub"));
    chown_user(&deep);
    let o = user_command(&deep, &env().bin, &["--", "pwd"], &[]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), deep.to_str().unwrap());
    // The project is still the one found from there (its config applies), not the subfolder.
    let o =
        user_command(&deep, &env().bin, &["--", "ls", "-a", p.dir.to_str().unwrap()], &[]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(".ai-sandbox"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_command_that_ends_at_once_still_has_its_direct_refusals_summed_up() {
    let (allowed, other) = (Banner::start("OK\n"), Banner::start("NO\n"));
    let p = Project::new("quickrefusal");
    let allow = format!("100.64.0.1:{}", allowed.port);
    let (a, b) = (format!("tcp:100.64.0.1:{}", allowed.port), format!("tcp:100.64.0.1:{}", other.port));
    // The probe connects and exits at once: no half-second poll of the rules happens in between.
    let mut args = vec!["--allow", allow.as_str()];
    args.extend(probe_args(&[&a, &b]));
    for round in 0..3 {
        let r = sandbox(&p, &args, &[]);
        r.ok();
        assert_eq!(r.probe(&a), "open", "positive control");
        assert_ne!(r.probe(&b), "open");
        let item = format!("100.64.0.1:{}", other.port);
        assert!(
            r.stderr.contains(&format!("refused a direct connection to {item}"))
                && r.stderr.contains("refused during this run"),
            "round {round}: the refusal was not said:\n{}",
            r.stderr
        );
        assert!(!r.stderr.contains(&format!("refused a direct connection to {allow}")), "{}", r.stderr);
    }
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_host_port_allowed_on_a_running_sandbox_works_for_clients_that_use_the_proxy_too() {
    let web = Banner::start("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n");
    let p = Project::new("liveloopback");
    p.config("allow = example.test\n");
    let url = format!("http://100.64.0.1:{}/", web.port);
    let code = "curl -s -o /dev/null -m 10 -w '%{http_code}'";
    // curl follows HTTP_PROXY, fixed at launch without 100.64.0.1 in NO_PROXY.
    let script = format!(
        "echo before=$({code} {url}); touch step1; for i in $(seq 600); do [ -e step2 ] && break; sleep 0.1; done; \
         echo proxied=$({code} {url}); echo direct=$({code} -S --noproxy '*' {url} 2>&1)"
    );
    let child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
    assert!(wait_for(60, || p.path("step1").exists()), "sandbox did not start");
    let item = format!("100.64.0.1:{}", web.port);
    let allow = sandbox(&p, &["allow", &item], &[]);
    std::fs::write(p.path("step2"), "").unwrap();
    let out = child.wait_with_output();
    let all = format!(
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        allow.stderr
    );
    allow.ok();
    assert!(all.contains("before=403"), "refused before the allow (the gate's 403): {all}");
    assert!(all.contains("proxied=200"), "through the proxy after the allow: {all}");
    // (curl's own error, when there is one, follows the code: it failed 2 of about 10 CI runs
    // with `direct=000`, never alone; the error tells a timeout from a refusal.)
    assert!(all.contains("direct=200"), "positive control: directly after the allow: {all}");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn publishing_a_busy_host_port_says_so_before_anything_starts() {
    let busy = Banner::start("busy\n");
    let p = Project::new("busyport");
    let port = busy.port.to_string();
    let r = sandbox(&p, &["--publish", &port, "--", "touch", "ran"], &[]);
    assert_eq!(r.code, 125, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(&format!("host port {port} is in use (by ")), "{}", r.stderr);
    assert!(!r.stderr.contains("Failed to bind") && !p.path("ran").exists(), "{}", r.stderr);
    // Positive control: a free port publishes.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let r = sandbox(&p, &["--publish", &free, "--", "touch", "ran"], &[]);
    r.ok();
    assert!(p.path("ran").exists());
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_command_that_ignores_interrupts_is_stopped_at_the_third() {
    let p = Project::new("ctrlc");
    // Each interrupt the command ignores is counted in `ints` (a trap runs between `wait`s).
    let script = "trap 'echo >> ints' INT; touch ready; for i in $(seq 1200); do sleep 0.1 & wait $!; done";
    let mut child = spawn_sandbox(&p, &["--", "sh", "-c", script]);
    let err = child.stderr_live();
    assert!(wait_for(60, || p.path("ready").exists()), "sandbox did not start");
    let launcher = nix::unistd::Pid::from_raw(pid_of_launcher(&p).expect("launcher"));
    let int = || nix::sys::signal::kill(launcher, nix::sys::signal::Signal::SIGINT).unwrap();
    let ints = || std::fs::read_to_string(p.path("ints")).map_or(0, |s| s.lines().count());
    int();
    assert!(wait_for(10, || ints() == 1), "the first interrupt did not reach the command");
    assert!(child.is_running(), "control: the command ignores one interrupt and runs on");
    int();
    assert!(
        wait_for(10, || err.lock().unwrap().contains("once more stops the sandbox")),
        "{}",
        err.lock().unwrap()
    );
    assert!(child.is_running(), "still running after the second");
    int();
    assert!(wait_for(20, || !child.is_running()), "the third interrupt did not stop it");
    let out = child.wait_with_output();
    wait_for(10, || std::sync::Arc::strong_count(&err) == 1);
    assert!(err.lock().unwrap().contains("stopping the sandbox"), "{}", err.lock().unwrap());
    assert_ne!(out.status.code(), Some(0));
    assert!(wait_for(20, || containers_of(&p).is_empty()), "a container was left");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn logs_show_this_projects_refusals_unless_asked_for_all_and_an_unknown_session_is_an_error() {
    let (a, b) = (Project::new("logsa"), Project::new("logsb"));
    for (p, name) in [(&a, "refused-a.test"), (&b, "refused-b.test")] {
        p.config("allow = example.test\n");
        let url = format!("http://{name}/");
        let r = sandbox(p, &["--", "curl", "-s", "-o", "/dev/null", "-m", "10", &url], &[]);
        assert!(r.stderr.contains(&format!("refused {name}:80")), "{}", r.stderr);
    }
    let mine = sandbox(&a, &["logs", "--denied"], &[]);
    assert!(mine.ok().stdout.contains("refused-a.test"), "this project's refusal: {}", mine.stdout);
    assert!(!mine.stdout.contains("refused-b.test"), "another project's refusal shown: {}", mine.stdout);
    let all = sandbox(&a, &["logs", "--denied", "--all"], &[]);
    assert!(
        all.ok().stdout.contains("refused-a.test") && all.stdout.contains("refused-b.test"),
        "{}",
        all.stdout
    );
    let nope = sandbox(&a, &["logs", "--session", "nope"], &[]);
    assert_eq!(nope.code, 125, "{}", nope.stdout);
    assert!(nope.stderr.contains("no session nope"), "{}", nope.stderr);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_file_name_that_is_not_utf8_reaches_the_command_as_its_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let p = Project::new("bytes");
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
    std::fs::write(p.dir.join(name), "latin-1 name\n").unwrap();
    chown_user(&p.dir.join(name));
    let o =
        user_command(&p.dir, &env().bin, &["--net", "none", "--", "cat"], &[]).arg(name).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "latin-1 name\n", "{err}");
    // Negative, with its control above: a name that differs in that one byte is not that file.
    let o = user_command(&p.dir, &env().bin, &["--net", "none", "--", "cat"], &[])
        .arg(std::ffi::OsStr::from_bytes(b"caf\xe8.txt"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_project_whose_path_holds_a_colon_and_a_comma_runs_with_its_protected_paths_read_only() {
    let p = Project::new("odd:name,here");
    std::fs::create_dir_all(p.path(".git/hooks")).unwrap();
    for d in [".git", ".git/hooks"] {
        chown_user(&p.path(d));
    }
    p.config("allow = example.com\n");
    let script = "echo made > made.txt && cat made.txt; touch .git/hooks/planted 2>/dev/null || echo hooks-read-only; pwd";
    let r = sandbox(&p, &["--", "sh", "-c", script], &[]);
    r.ok();
    // Positive control: the project is mounted at its own path and writable; the hooks are not.
    assert!(r.stdout.contains("made\nhooks-read-only\n"), "{}", r.stdout);
    assert!(r.stdout.contains(&p.dir.display().to_string()), "{}", r.stdout);
    assert!(p.path("made.txt").exists() && !p.path(".git/hooks/planted").exists());
    // Its dry run is a command a shell takes as it is (one argument per line, quoted).
    let dry = sandbox(&p, &["--dry-run", "--", "true"], &[]);
    assert!(dry.ok().stdout.contains("type=bind,"), "{}", dry.stdout);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_command_in_bin_under_home_or_a_privileged_port_is_said_before_anything_starts() {
    let e = env();
    let bin = e.home.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    chown_user(&bin);
    let tool = bin.join(format!("e2e-tool-{}", std::process::id()));
    std::fs::write(&tool, "#!/bin/sh\necho tool-ran\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    chown_user(&tool);
    let p = Project::new("homebin");
    let name = tool.file_name().unwrap().to_str().unwrap().to_string();
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display());
    let r = Run::of(user_command(&p.dir, &e.bin, &["--", &name], &[("PATH", &path)]));
    let _ = std::fs::remove_file(&tool);
    assert_eq!(r.code, 127, "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("command not found inside. To make it available") && !r.stdout.contains("tool-ran"),
        "{}",
        r.stderr
    );
    assert!(containers_of(&p).is_empty(), "a container was started");
    let r = sandbox(&p, &["--publish", "80", "--", "true"], &[]);
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(r.stderr.contains("host port 80 is below 1024"), "{}", r.stderr);
    // Control: a port from 1024 up publishes.
    sandbox(&p, &["--publish", "18642", "--", "true"], &[]).ok();
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn learn_proposes_exactly_the_hosts_the_command_reached_and_adds_only_what_is_accepted() {
    let th = TestHost::new();
    let p = Project::new("learn");
    let v4 = &th.v4;
    p.config(&format!(
        "allow = listed.test\nresolve = listed.test={v4}\nresolve = a.learn.test={v4}\n\
         resolve = b.learn.test={v4}\nresolve = unreached.test={v4}\n"
    ));
    let code = "curl -s -o /dev/null -w '%{http_code}'";
    let reach = |names: &[&str]| -> String {
        names.iter().map(|n| format!("echo {n}=$({code} http://{n}/); ")).collect()
    };
    // The learned names, the listed one (positive control), and what a learning run still
    // refuses: a port that is not the gate's, an address.
    let script = format!(
        "{}echo off-port=$({code} http://a.learn.test:7000/); echo address=$({code} http://{v4}/)",
        reach(&["a.learn.test", "b.learn.test", "listed.test"])
    );
    let r = sandbox(&p, &["learn", "--", "sh", "-c", &script], &[]);
    let all = format!("{}\n{}", r.stdout, r.stderr);
    r.ok();
    for want in ["a.learn.test=200", "b.learn.test=200", "listed.test=200", "off-port=403", "address=403"] {
        assert!(r.stdout.contains(want), "{want}: {all}");
    }
    assert!(r.stderr.contains("LEARNING RUN"), "said loudly: {all}");
    assert!(r.stderr.contains("learned a.learn.test:80 (relayed"), "said as it happens: {all}");
    let proposal = r.stderr.split("which the allowlist does not hold:").nth(1).unwrap_or_default();
    assert!(
        proposal.starts_with(
            "\n  learn.test:\n    allow = a.learn.test\n    allow = b.learn.test\n    (or, for every name below learn.test: allow = *.learn.test)\n"
        ),
        "{all}"
    );
    for not in ["listed.test", "unreached.test", v4.as_str()] {
        assert!(!proposal.contains(&format!("allow = {not}")), "{not} proposed: {all}");
    }
    assert!(proposal.contains("nothing was written (no terminal to ask on)"), "{all}");
    // What a plain run (not learning) answers for each name.
    let plain = |names: &[&str]| {
        let r = sandbox(&p, &["--", "sh", "-c", &reach(names)], &[]);
        r.ok();
        r.stdout
    };
    // Nothing was written: the next run refuses the learned names; the listed one still works.
    let next = plain(&["a.learn.test", "listed.test"]);
    assert!(next.contains("a.learn.test=403\nlisted.test=200"), "{next}");

    // A learning run on a terminal reaching `names`, each (question, answer) typed when asked.
    let on_terminal = |qa: &[(&str, &str)], names: &[&str]| {
        let e = env();
        let (answer, bin, script) = (e.root.join("bin/answer.py"), e.bin.display().to_string(), reach(names));
        let mut args: Vec<&str> = vec![answer.to_str().unwrap()];
        args.extend(qa.iter().flat_map(|(q, a)| [*q, *a]));
        args.extend(["--", &bin, "learn", "--", "sh", "-c", &script]);
        Run::of(user_command(&p.dir, Path::new("/usr/bin/python3"), &args, &[]))
    };
    // On a terminal: the wildcard declined, a.learn.test accepted, b.learn.test declined.
    let qa = [
        ("*.learn.test` (every name below learn.test)? [y/N] ", "n"),
        ("`allow = a.learn.test`? [y/N] ", "y"),
        ("`allow = b.learn.test`? [y/N] ", "n"),
    ];
    let t = on_terminal(&qa, &["a.learn.test", "b.learn.test"]);
    assert_eq!(t.code, 0, "{}\n{}", t.stdout, t.stderr);
    assert!(t.stdout.contains("added to .ai-sandbox/config (approved)"), "{}", t.stdout);
    let cfg = std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap();
    assert!(cfg.ends_with(&format!("resolve = unreached.test={v4}\nallow = a.learn.test\n")), "{cfg}");
    // The accepted line holds, the declined one does not.
    let after = plain(&["a.learn.test", "b.learn.test"]);
    assert!(after.contains("a.learn.test=200\nb.learn.test=403"), "{after}");
    // Ctrl-C at a question ends it as it ends any program: 130, nothing added, and no word of an
    // unverified project (the launch was over and checked before the first question).
    let c = on_terminal(&[("`allow = b.learn.test`? [y/N] ", "\x03")], &["b.learn.test"]);
    assert_eq!(c.code, 130, "{}\n{}", c.stdout, c.stderr);
    assert!(!c.stdout.contains("NOT yet verified") && !c.stdout.contains("added to"), "{}", c.stdout);
    assert_eq!(std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap(), cfg, "nothing added");
    // ... and the proposal is not lost: what was not written, and the command that writes it.
    assert!(
        c.stdout.contains("interrupted; nothing was written; to add them: ai-sandbox allow b.learn.test"),
        "{}",
        c.stdout
    );
    // A name that does not resolve is said as not reached, never as "nothing was asked for".
    let u = sandbox(&p, &["learn", "--", "sh", "-c", &format!("{code} http://nosuch.invalid/; true")], &[]);
    let said = format!("{}{}", u.stdout, u.stderr);
    assert!(
        said.contains("could not be reached") && said.contains("nosuch.invalid (cannot resolve"),
        "{said}"
    );
    assert!(!said.contains("nothing outside the allowlist was asked for"), "{said}");
    assert!(!said.contains("allow = nosuch.invalid"), "proposed: {said}");
}

/// An agent's first commit works: the user's git identity (user.name and user.email of their
/// git config, nothing else of it) authors commits inside; `git_identity = off` leaves the
/// sandbox without one (git's own refusal, the control that the identity came from the host).
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn the_first_commit_inside_is_authored_by_the_users_git_identity() {
    let p = Project::new("git-identity");
    let gitconfig = p.path("host.gitconfig");
    std::fs::write(
        &gitconfig,
        "[user]\n\tname = Dev One\n\temail = dev@example.com\n[alias]\n\tpwn = !touch /tmp/x\n",
    )
    .unwrap();
    chown_user(&gitconfig);
    let vars = [("GIT_CONFIG_GLOBAL", gitconfig.to_str().unwrap())];
    let script = "git init -q inner && cd inner && git commit -q --allow-empty -m first && git log -1 --format='%an <%ae>' \
                  && (git config --get alias.pwn || echo no-alias)";
    let r = sandbox(&p, &["--net", "none", "--", "sh", "-c", script], &vars);
    r.ok();
    assert!(r.stdout.contains("Dev One <dev@example.com>"), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("no-alias"), "nothing else of the host's git config crosses: {}", r.stdout);
    assert!(
        r.stderr.contains("git commits inside are authored by Dev One <dev@example.com>"),
        "{}",
        r.stderr
    );
    p.config("git_identity = off\n");
    let off = sandbox(
        &p,
        &["--net", "none", "--", "sh", "-c", "cd inner && git commit -q --allow-empty -m second"],
        &vars,
    );
    assert_ne!(off.code, 0, "{}", off.stderr);
    assert!(
        off.stderr.contains("Author identity unknown") || off.stderr.contains("tell me who you are"),
        "{}",
        off.stderr
    );
}
