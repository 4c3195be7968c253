//! End-to-end tests: the real binary, real rootless podman + pasta + nft, as an unprivileged
//! user. Every negative probe has a positive control in the same test, so "no network at
//! all" can never pass for "blocked". Ignored by a plain `cargo test` (they need root and the
//! machine set-up); `scripts/test` runs them with `--ignored`, and any failure fails CI.

mod agents;
mod aws;
mod budgets;
mod clients;
mod cluster;
mod comes_back;
mod containers;
mod docs;
mod filelayer;
mod gate;
mod gate_limits;
mod h2_front;
mod harness;
mod hostile;
mod isolation;
mod keys;
mod lifecycle;
mod limits;
mod live;
mod logins;
mod mcp;
mod newcomer;
mod offline;
mod protocols;
mod real_agents;
mod review;
mod review_hostile;
mod rules;
mod secrets;
mod selfprotect;
mod splice;
mod ssh;

use harness::*;

fn not_open(result: &str) -> bool {
    result != "open"
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn host_loopback_reaches_the_allowed_port_only() {
    let allowed = Banner::start("POSTGRES-STANDIN\n");
    let sshd = Banner::start("SSH-2.0-OpenSSH_9.2 standin\n");
    let p = Project::new("loopback");
    let allow = format!("100.64.0.1:{}", allowed.port);
    let (a, b) = (format!("tcp:100.64.0.1:{}", allowed.port), format!("tcp:100.64.0.1:{}", sshd.port));
    let mapped = format!("tcp:169.254.1.2:{}", sshd.port);
    let dns_addr = format!("tcp:169.254.1.1:{}", sshd.port);
    let own_lo_allowed = format!("tcp:127.0.0.1:{}", allowed.port);
    let mut args = vec!["--allow", allow.as_str()];
    args.extend(probe_args(&[&a, &b, &mapped, &dns_addr, "tcp:127.0.0.1:22", &own_lo_allowed]));
    let r = sandbox(&p, &args, &[]);
    r.ok();
    assert_eq!(r.probe(&a), "open", "positive control: the allowed host port");
    assert!(allowed.hits.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    for spec in [&b, &mapped, &dns_addr, &"tcp:127.0.0.1:22".to_string(), &own_lo_allowed] {
        assert!(not_open(r.probe(spec)), "{spec} must not connect: {}", r.probe(spec));
    }
    assert_eq!(r.probe(&b), "refused", "refused fast (tcp reset), not left to time out");
    assert_eq!(sshd.hits.load(std::sync::atomic::Ordering::SeqCst), 0, "the sshd stand-in saw a connection");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn ipv6_udp_and_dns_are_dropped_while_allowed_tcp_works() {
    let th = TestHost::new();
    let p = Project::new("v6udp");
    let allow = format!("{}:{}", th.v4, th.port);
    let (t4, t6, u4) = (th.tcp4(), th.tcp6(), th.udp4());
    let dns_host = format!("dns:{}", th.v4);
    let mut args = vec!["--allow", allow.as_str()];
    args.extend(probe_args(&[&t4, &t6, &u4, "dns:169.254.1.1", &dns_host]));
    let r = sandbox(&p, &args, &[]);
    r.ok();
    assert_eq!(r.probe(&t4), "open", "positive control: allowed TCP to the test host");
    assert!(not_open(r.probe(&t6)), "IPv6 to the same host must be dropped");
    assert_eq!(r.probe(&u4), "rejected", "UDP to an allowed host:port must be refused");
    assert_eq!(r.probe("dns:169.254.1.1"), "rejected", "DNS to pasta's resolver with the gate in use");
    assert_eq!(r.probe(&dns_host), "rejected", "DNS to any resolver");
    assert_eq!(th.udp_hits.load(std::sync::atomic::Ordering::SeqCst), 0, "a datagram left the sandbox");

    // Positive controls for the probes themselves: IPv6 when allowed, UDP without policy.
    let allow6 = format!("[{}]:{}", th.v6, th.port);
    let mut args = vec!["--allow", allow6.as_str()];
    args.extend(probe_args(&[&t6]));
    assert_eq!(sandbox(&p, &args, &[]).ok().probe(&t6), "open", "allowed IPv6 works");
    let mut args = vec!["--net", "full"];
    args.extend(probe_args(&[&u4]));
    let full = sandbox(&p, &args, &[]);
    assert_eq!(full.ok().probe(&u4), "reply", "the UDP probe works when no policy applies");
    assert!(full.stderr.contains("NO egress policy"), "--net full says so: {}", full.stderr);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn the_agent_cannot_change_the_rules() {
    let allowed = Banner::start("OK\n");
    let p = Project::new("tamper");
    let allow = format!("100.64.0.1:{}", allowed.port);
    let a = format!("tcp:100.64.0.1:{}", allowed.port);
    let script = format!(
        "nft flush ruleset; echo nft=$?; ip link set eth0 down; echo ip=$?; \
         /usr/bin/python3 probe.py raw {a}; touch ready; {UNTIL_DONE}"
    );
    let child = spawn_sandbox(&p, &["--allow", &allow, "--", "sh", "-c", &script]);
    assert!(wait_for(60, || p.path("ready").exists()), "sandbox did not get ready");
    let cs = containers_of(&p);
    assert_eq!(cs.len(), 1, "{cs:?}");
    let pid = cs[0].split_whitespace().nth(1).unwrap().to_string();
    let listed = std::process::Command::new("nsenter")
        .args([&format!("--net=/proc/{pid}/ns/net"), "/usr/sbin/nft", "list", "ruleset"])
        .output()
        .unwrap();
    let stdout = finish(&p, child);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(stdout.contains("nft=1"), "nft flush must fail inside: {stdout}");
    assert!(stdout.contains("ip=2"), "ip link set must fail inside: {stdout}");
    assert!(stdout.contains("raw eperm"), "raw sockets must be refused: {stdout}");
    assert!(stdout.contains(&format!("{a} open")), "positive control after the attempts: {stdout}");
    assert!(listed.contains("table inet ai_sandbox"), "ruleset gone: {listed}");
    assert!(listed.contains(&format!("100.64.0.1 . {}", allowed.port)), "allow set changed: {listed}");
    assert!(listed.contains("policy drop;"), "{listed}");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_failing_hook_stops_the_container_before_the_command_runs() {
    let p = Project::new("hookfail");
    let failing = env().root.join("bin/failing-nft");
    let r = sandbox(&p, &["--", "touch", "ran"], &[("AISB_NFT", failing.to_str().unwrap())]);
    assert_ne!(r.code, 0, "launch must fail");
    assert!(!p.path("ran").exists(), "the command ran without its ruleset");
    assert!(
        r.stderr.contains("failing-nft: refusing to load"),
        "nft's stderr must reach the user: {}",
        r.stderr
    );
    assert!(containers_of(&p).is_empty(), "a container was left behind");
    assert!(
        !r.stderr.contains("once more"),
        "a refusal of the hook is not the runtime's to retry:\n{}",
        r.stderr
    );
    // Positive control: the same command with the real nft runs.
    sandbox(&p, &["--", "touch", "ran"], &[]).ok();
    assert!(p.path("ran").exists());
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn net_none_has_only_loopback_and_offline_work_runs() {
    let b = Banner::start("X\n");
    let p = Project::new("none");
    let script = format!(
        "ip -o link | cut -d: -f2; printf 'int main(void){{return 0;}}' | gcc -x c - -o /tmp/t && /tmp/t && echo built-and-ran; \
         /usr/bin/python3 probe.py tcp:100.64.0.1:{}",
        b.port
    );
    let r = sandbox(&p, &["--net", "none", "--", "sh", "-c", &script], &[]);
    r.ok();
    let links: Vec<&str> = r.stdout.lines().take_while(|l| !l.contains("built")).map(str::trim).collect();
    assert_eq!(links, ["lo"], "only loopback: {}", r.stdout);
    assert!(r.stdout.contains("built-and-ran"), "offline build+run: {}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains(&format!("tcp:100.64.0.1:{} unreachable", b.port)), "{}", r.stdout);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn publish_binds_host_loopback_only() {
    let p = Project::new("publish");
    let (published, hidden) = (free_port(), free_port());
    let server = format!(
        "import socket, select, os\n\
         ls = []\n\
         for port in ({published}, {hidden}):\n    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n    s.bind(('0.0.0.0', port)); s.listen(8); ls.append(s)\n\
         open('ready', 'w').close()\n\
         while not os.path.exists('done'):\n    r, _, _ = select.select(ls, [], [], 0.2)\n    for s in r:\n        c, _ = s.accept(); c.sendall(b'INSIDE\\n'); c.close()\n"
    );
    std::fs::write(p.path("server.py"), server).unwrap();
    let publish = published.to_string();
    let child = spawn_sandbox(&p, &["--publish", &publish, "--", "/usr/bin/python3", "server.py"]);
    assert!(wait_for(60, || p.path("ready").exists()), "server did not start");
    let ok = wait_for(20, || greet(published).is_some_and(|g| g.contains("INSIDE")));
    let ss = std::process::Command::new("ss").args(["-ltnH"]).output().unwrap();
    let ss = String::from_utf8_lossy(&ss.stdout).to_string();
    let hidden_reply = greet(hidden);
    std::fs::write(p.path("done"), "").unwrap();
    let out = child.wait_with_output();
    assert!(ok, "positive control: the published port answers on 127.0.0.1");
    let binds: Vec<&str> = ss
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter(|a| a.ends_with(&format!(":{published}")))
        .collect();
    assert!(!binds.is_empty(), "nothing listens for {published}: {ss}");
    assert!(binds.iter().all(|a| *a == format!("127.0.0.1:{published}")), "bound beyond loopback: {binds:?}");
    assert!(!hidden_reply.is_some_and(|g| g.contains("INSIDE")), "the unpublished server was reachable");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn sigkill_of_the_launcher_leaves_files_intact_and_nothing_running() {
    let p = Project::new("sigkill");
    let script = format!("echo data > out.txt; touch ready; {UNTIL_DONE}");
    let child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
    assert!(wait_for(60, || p.path("ready").exists()), "sandbox did not start");
    let pid = pid_of_launcher(&p).expect("launcher pid");
    let session = std::fs::read_dir(sessions_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|d| std::fs::read_to_string(d.join("pid")).ok().as_deref() == Some(&pid.to_string()))
        .expect("the launcher's session dir");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = child.wait_with_output();
    assert!(wait_for(60, || containers_of(&p).is_empty()), "container left: {:?}", containers_of(&p));
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(p.path("out.txt")).unwrap();
    assert_eq!(std::fs::read_to_string(p.path("out.txt")).unwrap(), "data\n");
    assert_eq!(meta.uid(), env().uid, "file must be owned by the user");
    assert_eq!(std::fs::metadata(&p.dir).unwrap().uid(), env().uid, "project dir must stay the user's");
    // The orphaned session dir is swept by the next launch.
    sandbox(&p, &["--", "true"], &[]).ok();
    assert!(!session.exists(), "stale session dir {} was not swept", session.display());
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn sigterm_is_forwarded_to_the_command() {
    let p = Project::new("sigterm");
    let script = format!("trap 'echo got-term > term.txt; exit 0' TERM; touch ready; {UNTIL_DONE}");
    let child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
    assert!(wait_for(60, || p.path("ready").exists()));
    let pid = pid_of_launcher(&p).expect("launcher pid");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output();
    assert!(wait_for(10, || p.path("term.txt").exists()), "the command never saw SIGTERM");
    assert_eq!(out.status.code(), Some(0), "the trap's exit code is passed through");
    assert!(wait_for(30, || containers_of(&p).is_empty()));
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn sigint_outside_a_terminal_stops_the_whole_pipeline() {
    let p = Project::new("sigint");
    // Both stages say they run, then wait for `done`, which this test never writes.
    let script = format!("(touch a; {UNTIL_DONE}) | (touch b; {UNTIL_DONE})");
    let mut child = spawn_sandbox(&p, &["--net", "none", "--", "sh", "-c", &script]);
    assert!(wait_for(60, || p.path("a").exists() && p.path("b").exists()), "the pipeline never ran");
    // Control: left alone, it keeps running (its stages wait 60 s for `done`).
    assert!(child.is_running(), "the pipeline ended by itself");
    let pid = pid_of_launcher(&p).expect("launcher pid");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGINT).unwrap();
    // Without a terminal no process group gets Ctrl-C: the launcher's SIGINT must reach every
    // process of the command (catatonit -g), not the shell alone, which waits for its children.
    assert!(wait_for(15, || !child.is_running()), "SIGINT reached the shell only: the pipeline kept running");
    let out = child.wait_with_output();
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_for(30, || containers_of(&p).is_empty()));
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn exit_codes_cmd_from_config_extra_args_and_home() {
    let p = Project::new("misc");
    assert_eq!(sandbox(&p, &["--", "sh", "-c", "exit 42"], &[]).code, 42);
    p.config("cmd = sh -c 'echo from-config HOME=$HOME; touch $HOME/persist; id -u'\n");
    let r = sandbox(&p, &[], &[("AISB_EXTRA_ARGS", "--env FROM_EXTRA=yes")]);
    r.ok();
    assert!(r.stdout.contains(&format!("from-config HOME={}", env().home.display())), "{}", r.stdout);
    assert!(r.stdout.contains(&env().uid.to_string()), "runs as the user: {}", r.stdout);
    assert!(!env().home.join("persist").exists(), "the real HOME must not be written");
    let r = sandbox(
        &p,
        &["--", "sh", "-c", "echo $FROM_EXTRA; ls $HOME/persist"],
        &[("AISB_EXTRA_ARGS", "--env FROM_EXTRA=yes")],
    );
    assert!(r.ok().stdout.contains("yes"), "extra args applied: {}", r.stdout);
    assert!(r.stdout.contains("persist"), "the sandbox HOME persists per project: {}", r.stdout);
    let r = sandbox(&p, &["--", "sh", "-c", "touch /usr/x"], &[]);
    assert_ne!(r.code, 0, "host /usr must be read-only");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn dry_run_argv_run_by_hand_behaves_like_the_launch() {
    let allowed = Banner::start("OK\n");
    let other = Banner::start("NO\n");
    let p = Project::new("dryrun");
    p.config(&format!("allow = 100.64.0.1:{}\n", allowed.port));
    let (a, b) = (format!("tcp:100.64.0.1:{}", allowed.port), format!("tcp:100.64.0.1:{}", other.port));
    let launched = sandbox(&p, &probe_args(&[&a, &b]), &[]);
    launched.ok();
    let mut args = vec!["--dry-run"];
    args.extend(probe_args(&[&a, &b]));
    let dry = sandbox(&p, &args, &[]);
    dry.ok();
    let cmd: Vec<&str> =
        dry.stdout.lines().skip_while(|l| l.starts_with('#')).take_while(|l| !l.is_empty()).collect();
    let argv = shlex::split(&cmd.join("\n").replace(" \\\n", " ")).expect("shell words");
    // Write the session files the plan names: the hook JSON as printed, the ruleset as JSON.
    let hooks_dir =
        std::path::PathBuf::from(&argv[argv.iter().position(|a| a == "--hooks-dir").unwrap() + 1]);
    let hook_file = hooks_dir.join("ai-sandbox.json");
    let marker = format!("# {}", hook_file.display());
    // (The self-check's hook is printed after it with a `<canary>` port, which a launch picks:
    // it is not written here; its mount in the argv is harmless without it.)
    let hook_json: String = dry
        .stdout
        .lines()
        .skip_while(|l| *l != marker)
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let env_file = std::path::PathBuf::from(&argv[argv.iter().position(|a| a == "--env-file").unwrap() + 1]);
    let env_marker = format!("# {} (mode 0600: it holds the session token and secrets)", env_file.display());
    let env_text: String = dry
        .stdout
        .lines()
        .skip_while(|l| *l != env_marker)
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(env_text.contains("HTTPS_PROXY="), "env file not printed:\n{}", dry.stdout);
    // The sandbox's ssh client config, as printed (image = host, see podman::ssh_config).
    let ssh_mount =
        argv.iter().find_map(|a| a.strip_suffix(":/etc/ssh/ssh_config:ro")).map(std::path::PathBuf::from);
    let ssh_text: Option<String> = ssh_mount.as_ref().map(|path| {
        let marker = format!("# {} (mounted at /etc/ssh/ssh_config inside)", path.display());
        dry.stdout
            .lines()
            .skip_while(|l| *l != marker)
            .skip(1)
            .take_while(|l| !l.is_empty())
            .map(|l| format!("{l}\n"))
            .collect()
    });
    let rules = sandbox(&p, &["rules", "--json"], &[]);
    rules.ok();
    let session = hooks_dir.parent().unwrap();
    std::fs::create_dir_all(&hooks_dir).unwrap();
    // The session's root directory, as printed (image = host, see plan::root).
    let root = std::path::PathBuf::from(&argv[argv.iter().position(|a| a == "--rootfs").unwrap() + 1]);
    let root_marker =
        format!("# {} (the root directory, made for this session; read-only inside)", root.display());
    let root_lines: Vec<&str> =
        dry.stdout.lines().skip_while(|l| *l != root_marker).skip(1).take(2).collect();
    let dirs = root_lines[0].strip_prefix("#   directories: ").expect("the root's directories printed");
    let links = root_lines[1].strip_prefix("#   links: ").expect("the root's links printed");
    for d in dirs.split(' ') {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for l in links.split(", ") {
        let (at, to) = l.split_once(" -> ").unwrap();
        std::os::unix::fs::symlink(to, root.join(at)).unwrap();
    }
    let chowned = std::process::Command::new("chown")
        .arg("-hR")
        .arg(format!("{}:", env().user))
        .arg(&root)
        .status()
        .unwrap();
    assert!(chowned.success());
    std::fs::write(&hook_file, hook_json).unwrap();
    std::fs::write(session.join("ruleset.json"), &rules.stdout).unwrap();
    std::fs::write(&env_file, env_text).unwrap();
    if let (Some(path), Some(text)) = (&ssh_mount, &ssh_text) {
        assert!(text.contains("ProxyCommand"), "ssh config not printed:\n{}", dry.stdout);
        std::fs::write(path, text).unwrap();
        chown_user(path);
    }
    for f in
        [session, hooks_dir.as_path(), hook_file.as_path(), &session.join("ruleset.json"), env_file.as_path()]
    {
        chown_user(f);
    }
    let by_hand = {
        let r = user_command(
            &p.dir,
            std::path::Path::new(&argv[0]),
            &argv[1..].iter().map(String::as_str).collect::<Vec<_>>(),
            &[],
        )
        .output()
        .unwrap();
        std::fs::remove_dir_all(session).unwrap();
        r
    };
    let stdout = String::from_utf8_lossy(&by_hand.stdout);
    assert!(by_hand.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&by_hand.stderr));
    assert_eq!(launched.probe(&a), "open");
    assert_eq!(launched.probe(&b), "refused");
    assert_eq!(stdout.trim_end(), launched.stdout.trim_end(), "by hand and launched differ");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn an_allowed_redis_without_a_password_is_warned_about_at_launch() {
    let _redis = Banner::start_on(6379, "+PONG\r\n");
    let _memcached = Banner::start_on(11211, "ERROR\r\n");
    let p = Project::new("redis");
    let r = sandbox(&p, &["--allow", "100.64.0.1:6379", "--allow", "100.64.0.1:11211", "--", "true"], &[]);
    r.ok();
    assert!(
        r.stderr.contains("127.0.0.1:6379, where redis answers without authentication"),
        "no warning for an open redis: {}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("memcached answers"),
        "a memcached that did not answer VERSION is not flagged: {}",
        r.stderr
    );
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_local_image_runs_under_the_same_enforcement_and_fresh_each_run() {
    let allowed = Banner::start("OK\n");
    let other = Banner::start("NO\n");
    let e = env();
    let dir = e.root.join("image");
    std::fs::create_dir_all(&dir).unwrap();
    // A /tmp in the image the user may write (its root is the image's root user's).
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    std::fs::set_permissions(dir.join("tmp"), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let built = std::process::Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(dir.join("probe"))
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/probe.c"))
        .status()
        .unwrap();
    assert!(built.success(), "gcc -static failed");
    let tar = e.root.join("image.tar");
    assert!(
        std::process::Command::new("tar")
            .arg("-C")
            .arg(&dir)
            .arg("-cf")
            .arg(&tar)
            .arg("probe")
            .arg("tmp")
            .status()
            .unwrap()
            .success()
    );
    std::fs::set_permissions(&tar, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let image = "localhost/aisb-e2e-probe:latest";
    as_user("/usr/bin/podman", &["import", tar.to_str().unwrap(), image]).ok();
    let p = Project::new("image");
    p.config(&format!("image = {image}\n"));
    let allow = format!("100.64.0.1:{}", allowed.port);
    let a = sandbox(&p, &["--allow", &allow, "--", "/probe", "100.64.0.1", &allowed.port.to_string()], &[]);
    let b = sandbox(&p, &["--allow", &allow, "--", "/probe", "100.64.0.1", &other.port.to_string()], &[]);
    // A named image's root is the container's own, made fresh from the image for each run: what
    // one run writes to / is gone in the next (the first run's write is the positive control).
    let first = sandbox(&p, &["--", "/probe", "plant", "/tmp/planted"], &[]);
    let second = sandbox(&p, &["--", "/probe", "plant", "/tmp/planted"], &[]);
    // A host with rules: the gate opens its TLS, and the image finds the gate's CA with the host's
    // roots wherever its family's clients look (control: without a terminated host, none is there).
    let bundles = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
        "/etc/ssl/cert.pem",
        "/etc/ssl/ca-bundle.pem",
    ];
    let certs: Vec<&str> = ["--", "/probe", "certs"].into_iter().chain(bundles).collect();
    let plain = sandbox(&p, &certs, &[]);
    let ruled = Project::new("image-ca");
    ruled.config(&format!("image = {image}\nallow = api.rules.test\nrule = api.rules.test GET /v1/**\n"));
    let ca = sandbox(&ruled, &certs, &[]);
    as_user("/usr/bin/podman", &["rmi", image]);
    plain.ok();
    assert!(bundles.iter().all(|b| plain.stdout.contains(&format!("{b} absent"))), "{}", plain.stdout);
    ca.ok();
    let host_roots = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap();
    let want = host_roots.matches("-----BEGIN CERTIFICATE-----").count() + 1;
    for b in bundles {
        assert!(
            ca.stdout.contains(&format!("{b} {want}\n")),
            "{b}: want the host's roots and the gate's CA ({want}):\n{}",
            ca.stdout
        );
    }
    assert_eq!(first.stdout.trim(), "planted", "{}\n{}", first.stdout, first.stderr);
    assert_eq!(second.stdout.trim(), "planted", "a later run saw the first one's file: {}", second.stdout);
    assert_eq!(a.code, 0, "positive control through the image: {}\n{}", a.stdout, a.stderr);
    assert!(a.stdout.contains(&format!("100.64.0.1:{} open", allowed.port)), "{}", a.stdout);
    assert_eq!(b.code, 1, "{}\n{}", b.stdout, b.stderr);
    assert!(b.stdout.contains(&format!("100.64.0.1:{} refused", other.port)), "{}", b.stdout);
}
