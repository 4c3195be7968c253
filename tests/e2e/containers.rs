//! Containers inside the sandbox (`containers = on`): the sandbox's own rootless podman runs a
//! container the test made from busybox, answers on the Docker-compatible socket, and what its
//! containers send leaves through the sandbox's rules and gate. Each refusal beside the same
//! thing allowed.

use crate::harness::*;

/// A busybox image for the engine inside: /bin/busybox and its applets, as a tarball the
/// sandbox imports (`podman import`), made here from the host's static busybox (no registry).
pub(crate) fn busybox_image(p: &Project) {
    let root = p.path("bb-root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("/bin/busybox (busybox-static)");
    for applet in ["sh", "httpd", "wget", "echo", "cat", "sleep", "nc", "ls", "true"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    let tar = std::process::Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(p.path("bb.tar"))
        .arg(".")
        .status()
        .unwrap();
    assert!(tar.success());
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::create_dir_all(p.path("www")).unwrap();
    std::fs::write(p.path("www/index.html"), "NESTED-WEB\n").unwrap();
    chown_user(&p.dir);
}

/// A project with `containers = on`, the busybox image, and `allowed.test` allowed (the test
/// host's address pinned), plus `extra` lines.
fn nested_project(name: &str, th: &TestHost, extra: &str) -> Project {
    let p = Project::new(name);
    busybox_image(&p);
    p.config(&format!("containers = on\nallow = allowed.test\nresolve = allowed.test={}\n{extra}", th.v4));
    p
}

/// The host's loader and libraries, for a host program in a nested container (the image has no
/// libc): `{HOST_LD} /usr/bin/curl …` with `-v /usr:/usr:ro`.
const HOST_LD: &str = "/usr/lib64/ld-linux-x86-64.so.2 --library-path /usr/lib/x86_64-linux-gnu";

/// Imports the image and serves www/ from a nested container on the sandbox's 127.0.0.1:8080.
const SERVE: &str = "podman import -q bb.tar localhost/bb >/dev/null && \
    podman run -d -q --name web -p 8080:80 -v \"$PWD/www:/www:ro\" localhost/bb httpd -f -p 80 -h /www >/dev/null; \
    for i in $(seq 50); do curl -s --noproxy '*' -o /dev/null http://127.0.0.1:8080/ && break; sleep 0.1; done";

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_nested_container_answers_and_what_it_sends_leaves_through_the_sandboxs_policy() {
    let th = TestHost::new();
    let (db, other) = (Banner::start("HOST-DB\n"), Banner::start("HOST-OTHER\n"));
    let p = nested_project("nested", &th, &format!("allow = 100.64.0.1:{}\n", db.port));
    let t = std::process::id();
    let script = format!(
        "set +e; {SERVE}; \
         echo \"web=$(curl -sS --noproxy '*' http://127.0.0.1:8080/)\"; \
         echo \"api=$(curl -sS --noproxy '*' --unix-socket \"${{DOCKER_HOST#unix://}}\" http://d/v1.41/containers/json 2>&1)\"; cat /tmp/ai-sandbox-engine/service.log >&2; \
         echo \"allowed=$(podman run --rm localhost/bb wget -qO- -T 10 http://allowed.test/ 2>&1)\"; \
         echo \"denied=$(podman run --rm localhost/bb wget -qO- -T 10 http://denied.test/ 2>&1)\"; \
         echo \"direct=$(podman run --rm localhost/bb wget -Y off -qO- -T 10 http://{v4}/ 2>&1)\"; \
         echo \"c2c=$(podman run --rm localhost/bb wget -Y off -qO- -T 10 http://169.254.1.3:8080/ 2>&1)\"; \
         echo \"db=$(podman run --rm localhost/bb nc -w 5 100.64.0.1 {db} </dev/null 2>&1)\"; \
         echo \"otherport=$(podman run --rm localhost/bb nc -w 5 100.64.0.1 {other} </dev/null 2>&1)\"; \
         podman run -d -q --name keep-{t} localhost/bb sleep 86{t} >/dev/null; echo left=$?; \
         echo \"alive=$(ps -eo args | grep -c '^sleep 86{t}')\"; \
         tok=${{HTTP_PROXY#http://aisb:}}; echo \"${{tok%@*}}\" > /tmp/tok; \
         echo \"tokenargs=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -cFf /tmp/tok)\"; \
         echo \"tokenenv=$(podman exec keep-{t} sh -c 'echo $HTTP_PROXY' | grep -cFf /tmp/tok)\"",
        v4 = th.v4,
        db = db.port,
        other = other.port
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    r.ok();
    let out = &r.stdout;
    let line = |k: &str| out.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).unwrap_or("").to_string();
    // 100.64.0.1 means in a nested container what it means in the sandbox: the allowed host
    // port answers, another port of the host's loopback is refused and never reached.
    assert_eq!(line("db"), "HOST-DB", "{out}\n{}", r.stderr);
    assert!(!line("otherport").contains("HOST-OTHER"), "{out}");
    assert_eq!(other.hits.load(std::sync::atomic::Ordering::SeqCst), 0, "{out}");
    // Positive controls: the nested server answers on the sandbox's loopback and on the socket
    // DOCKER_HOST names; a nested container reaches an allowed host through the gate and
    // another container's published port.
    assert_eq!(line("web"), "NESTED-WEB", "{out}\n{}", r.stderr);
    assert!(
        line("api").contains("\"Names\":[\"/web\"]"),
        "the Docker API lists the container: {out}\n{}",
        r.stderr
    );
    assert_eq!(line("allowed"), "TESTHOST-HTTP", "{out}\n{}", r.stderr);
    assert_eq!(line("c2c"), "NESTED-WEB", "{out}");
    assert_eq!(line("left"), "0", "{out}");
    assert_eq!(line("alive"), "1", "the container left running runs inside the sandbox: {out}");
    // The session token reaches a nested container's environment (its proxy variables), and no
    // command line of any process in the sandbox, the engine's and the nested ones included.
    assert_eq!(line("tokenenv"), "1", "{out}");
    assert_eq!(line("tokenargs"), "0", "{out}");
    // Refusals: a name not allowed (the gate's 403), the allowed host's address reached around
    // the gate (the sandbox's rules), both said by the launcher.
    assert!(line("denied").contains("403"), "{out}");
    assert!(!line("direct").contains("TESTHOST"), "{out}");
    assert!(r.stderr.contains("denied.test"), "the gate's refusal is said: {}", r.stderr);
    assert!(
        r.stderr.contains(&format!("refused a direct connection to {}:80", th.v4)),
        "the rules' refusal is said: {}",
        r.stderr
    );
    let log = gate_log();
    assert!(
        log.lines().any(|l| l.contains("\"host\":\"denied.test\"") && l.contains("\"decision\":\"deny\""))
    );
    // The allowed request is in the gate's log too, as the sandbox's own would be.
    assert!(
        log.lines().any(|l| l.contains("\"host\":\"allowed.test\"") && l.contains("\"decision\":\"allow\""))
    );
    // Nothing of the inner engine outlives the sandbox: the container left running is gone with
    // it (its sleep, and conmon, which names it), and the host's podman never saw it.
    let marker = format!("86{t}");
    let name = format!("keep-{t}");
    assert!(
        wait_for(10, || command_lines_containing(&[&marker, &name]).is_empty()),
        "a nested container outlived the sandbox: {:?}",
        command_lines_containing(&[&marker, &name])
    );
    assert!(containers_of(&p).is_empty(), "{:?}", containers_of(&p));
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn with_net_none_nested_containers_reach_each_other_and_nothing_leaves() {
    let th = TestHost::new();
    let p = Project::new("nestednone");
    busybox_image(&p);
    p.config("containers = on\nnet = none\n");
    let script = format!(
        "set +e; {SERVE}; \
         echo \"c2c=$(podman run --rm localhost/bb wget -qO- -T 10 http://169.254.1.3:8080/ 2>&1)\"; \
         echo \"out=$(podman run --rm localhost/bb wget -qO- -T 5 http://{v4}/ 2>&1)\"",
        v4 = th.v4
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    r.ok();
    let out = &r.stdout;
    assert!(out.contains("c2c=NESTED-WEB"), "one nested container reaches another: {out}\n{}", r.stderr);
    assert!(out.contains("out=wget: ") && !out.contains("TESTHOST"), "{out}");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn each_project_keeps_its_own_images_and_a_sandbox_without_containers_has_no_engine() {
    let (a, b) = (Project::new("engine-a"), Project::new("engine-b"));
    busybox_image(&a);
    a.config("containers = on\nnet = none\n");
    b.config("containers = on\nnet = none\n");
    let made = sandbox(
        &a,
        &[
            "--",
            "sh",
            "-c",
            "podman import -q bb.tar localhost/only-a >/dev/null && podman create -q --name made-in-a localhost/only-a true >/dev/null && echo made",
        ],
        &[],
    );
    assert!(made.ok().stdout.contains("made"), "{}", made.stderr);
    let list = "podman images --format '{{.Repository}}'; podman ps -a --format '{{.Names}}'";
    // Control: A's next session still has its image and container (its storage persists).
    let again = sandbox(&a, &["--", "sh", "-c", list], &[]);
    assert!(
        again.ok().stdout.contains("localhost/only-a") && again.stdout.contains("made-in-a"),
        "{}",
        again.stdout
    );
    let other = sandbox(&b, &["--", "sh", "-c", list], &[]);
    assert!(
        !other.ok().stdout.contains("only-a") && !other.stdout.contains("made-in-a"),
        "another project's sandbox sees A's: {}",
        other.stdout
    );
    // Without `containers = on`: no socket, no DOCKER_HOST, and podman cannot start a container.
    let plain = Project::new("engine-off");
    busybox_image(&plain);
    plain.config("net = none\n");
    let r = sandbox(
        &plain,
        &[
            "--",
            "sh",
            "-c",
            "echo \"host=${DOCKER_HOST:-none}\"; ls /tmp/ai-sandbox-engine 2>&1; podman import -q bb.tar localhost/x >/dev/null 2>&1 && podman run --rm localhost/x true >/dev/null 2>&1; echo run=$?",
        ],
        &[],
    );
    let out = &r.ok().stdout;
    assert!(out.contains("host=none") && out.contains("No such file"), "{out}");
    assert!(!out.contains("run=0"), "{out}");
}

/// podman 5.4 lost its activated socket when the service started beside another podman making
/// the engine's user namespace ("unexpected fd received from systemd": 12 launches in 20 before
/// the engine made the namespace first, `launch::engine`). Each launch runs `podman info` at once,
/// as an agent might: it works (the control), and the service takes its socket the first time.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn the_engine_takes_its_socket_the_first_time_beside_a_podman_the_command_runs_at_once() {
    let p = Project::new("engine-race");
    p.config("containers = on\nnet = none\n");
    let script = "podman info >/dev/null 2>&1; echo info=$?; \
        curl -sS --noproxy '*' --unix-socket \"${DOCKER_HOST#unix://}\" http://d/_ping; echo; \
        cat /tmp/ai-sandbox-engine/service.log";
    for i in 0..6 {
        let r = sandbox(&p, &["--", "sh", "-c", script], &[]);
        let out = &r.ok().stdout;
        assert!(out.contains("info=0") && out.lines().any(|l| l == "OK"), "launch {i}: {out}");
        assert!(!out.contains("unexpected fd") && !out.contains("starting it again"), "launch {i}: {out}");
    }
}

/// The pinned Testcontainers (scripts/install-test-tools).
const CONTAINERS_VENV: &str = "/opt/aisb-containers/bin";

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn testcontainers_starts_reaches_and_stops_a_container_through_docker_host() {
    let p = Project::new("testcontainers");
    busybox_image(&p);
    p.config("containers = on\nnet = none\n");
    std::fs::write(
        p.path("tc.py"),
        "import os, time, urllib.request\n\
         from testcontainers.core.container import DockerContainer\n\
         c = DockerContainer('localhost/bb').with_command('httpd -f -p 80 -h /www').with_exposed_ports(80)\n\
         c = c.with_volume_mapping(os.getcwd() + '/www', '/www', 'ro')\n\
         with c:\n\
         \x20   url = f'http://{c.get_container_host_ip()}:{c.get_exposed_port(80)}/'\n\
         \x20   opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n\
         \x20   for _ in range(50):\n\
         \x20       try:\n\
         \x20           print('tc=' + opener.open(url, timeout=5).read().decode().strip()); break\n\
         \x20       except OSError as e:\n\
         \x20           err = e; time.sleep(0.1)\n\
         \x20   else:\n\
         \x20       print('tc-error', err)\n\
         \x20   print('id=' + c.get_wrapped_container().id)\n",
    )
    .unwrap();
    chown_user(&p.dir);
    let script = format!(
        "podman import -q bb.tar localhost/bb >/dev/null; {CONTAINERS_VENV}/python tc.py; \
         echo \"after=$(podman ps -a -q --no-trunc | tr '\\n' ' ')\""
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    let out = &r.ok().stdout;
    assert!(out.contains("tc=NESTED-WEB"), "Testcontainers reached its container: {out}\n{}", r.stderr);
    let id = out.lines().find_map(|l| l.strip_prefix("id=")).expect("the container's id");
    let after = out.lines().find_map(|l| l.strip_prefix("after=")).unwrap_or("");
    assert!(id.len() == 64 && !after.contains(id), "the container was stopped and removed: {out}");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn compose_services_reach_each_other_by_name_and_an_allowed_host_through_the_gate() {
    let th = TestHost::new();
    let p = nested_project("compose", &th, "");
    let fetch = |url: &str, proxy: &str| {
        format!(
            "sh -c 'for i in 1 2 3 4 5 6 7 8 9 10; do wget {proxy} -qO- -T 5 {url} && exit 0; sleep 0.3; done; exit 1'"
        )
    };
    std::fs::write(
        p.path("compose.yaml"),
        format!(
            "services:\n  web:\n    image: localhost/bb\n    command: httpd -f -p 80 -h /www\n    volumes: [\"./www:/www:ro\"]\n\
             \x20 client:\n    image: localhost/bb\n    command: {}\n    depends_on: [web]\n\
             \x20 out:\n    image: localhost/bb\n    command: {}\n  refused:\n    image: localhost/bb\n    command: {}\n",
            fetch("http://web/", "-Y off"),
            fetch("http://allowed.test/", ""),
            fetch("http://denied.test/", "")
        ),
    )
    .unwrap();
    chown_user(&p.dir);
    // podman-compose as scripts/install-deps installs it (Debian's, from trixie).
    let c = "podman-compose";
    let script = format!(
        "podman import -q bb.tar localhost/bb >/dev/null; {c} up -d web >/dev/null 2>&1; \
         for s in client out refused; do echo \"$s=$({c} run --rm $s 2>&1 | tail -1)\"; done; \
         {c} down -t 0 >/dev/null 2>&1; echo \"left=$(podman ps -a -q | wc -l)\""
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    let out = &r.ok().stdout;
    assert!(out.contains("client=NESTED-WEB"), "one service reaches another by name: {out}\n{}", r.stderr);
    assert!(out.contains("out=TESTHOST-HTTP"), "a service reaches an allowed host: {out}\n{}", r.stderr);
    let refused = out.lines().find_map(|l| l.strip_prefix("refused=")).unwrap_or("");
    assert!(refused.contains("403") && !refused.contains("TESTHOST"), "{out}");
    assert!(r.stderr.contains("denied.test"), "the refusal is said: {}", r.stderr);
    assert!(out.contains("left=0"), "{out}");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_nested_container_cannot_change_the_sandboxs_rules_or_mount_what_the_sandbox_cannot_see() {
    let th = TestHost::new();
    let p = nested_project("nestedhostile", &th, "");
    let nft = format!("{HOST_LD} /usr/sbin/nft");
    let script = format!(
        "set +e; podman import -q bb.tar localhost/bb >/dev/null; \
         podman run --rm --cap-add NET_ADMIN -v /usr:/usr:ro localhost/bb {nft} add table inet mine >/dev/null 2>&1; echo own=$?; \
         podman run --rm --privileged --network host -v /usr:/usr:ro localhost/bb {nft} flush ruleset >/dev/null 2>&1; echo flush=$?; \
         podman run --rm --privileged --network host -v /usr:/usr:ro localhost/bb {nft} delete table inet ai_sandbox >/dev/null 2>&1; echo delete=$?; \
         echo \"direct=$(podman run --rm --network host localhost/bb wget -Y off -qO- -T 10 http://{v4}/ 2>&1)\"; \
         echo \"allowed=$(curl -sS -m 10 http://allowed.test/)\"; \
         echo \"usrlib=$(podman run --rm -v /usr/lib:/x localhost/bb ls /x 2>&1 | wc -l)\"; \
         echo \"varlib=$(podman run --rm -v /var/lib:/x localhost/bb ls /x 2>&1 | tail -1)\"",
        v4 = th.v4
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    let out = &r.ok().stdout;
    let line = |k: &str| out.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).unwrap_or("").to_string();
    // Control: in its own network namespace a nested container with NET_ADMIN runs nft.
    assert_eq!(line("own"), "0", "{out}\n{}", r.stderr);
    // In the sandbox's, even privileged, it cannot (that namespace belongs to the sandbox's user
    // namespace, in which no process holds a capability): the rules hold after both tries.
    assert_ne!(line("flush"), "0", "{out}");
    assert_ne!(line("delete"), "0", "{out}");
    assert!(!line("direct").contains("TESTHOST"), "{out}");
    assert_eq!(line("allowed"), "TESTHOST-HTTP", "{out}\n{}", r.stderr);
    // Mounts come from what the sandbox sees: its /usr/lib yes, the host's /var/lib (not in the
    // sandbox's root) no.
    assert!(line("usrlib").parse::<u32>().unwrap_or(0) > 10, "{out}");
    assert!(line("varlib").contains("no such file or directory"), "{out}");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn image_share_gives_one_of_the_users_images_to_one_project_and_no_other() {
    let t = std::process::id();
    let (a, b) = (Project::new("share-a"), Project::new("share-b"));
    busybox_image(&a);
    a.config("containers = on\nnet = none\n");
    b.config("containers = on\nnet = none\n");
    let (shared, kept) = (format!("localhost/aisb-shared-{t}"), format!("localhost/aisb-kept-{t}"));
    let tar = a.path("bb.tar").display().to_string();
    for name in [&shared, &kept] {
        as_user("podman", &["import", "-q", &tar, name]).ok();
    }
    let r = sandbox(&a, &["image", "share", &shared], &[]);
    assert!(
        r.ok().stderr.contains(&format!("{shared} is in this project's sandbox engine now")),
        "{}",
        r.stderr
    );
    // A load that worked says nothing of the inner engine's own notes.
    assert!(!r.stderr.contains("level=") && !r.stderr.contains("WARN"), "{}", r.stderr);
    let missing = sandbox(&a, &["image", "share", "localhost/aisb-no-such-image"], &[]);
    assert!(missing.code != 0 && missing.stderr.contains("there is no image"), "{}", missing.stderr);
    let list = "podman images --format '{{.Repository}}'";
    let inside =
        sandbox(&a, &["--", "sh", "-c", &format!("{list}; podman run --rm {shared} echo ran-shared")], &[]);
    let out = &inside.ok().stdout;
    assert!(
        out.contains(&shared) && out.contains("ran-shared"),
        "the shared image runs: {out}\n{}",
        inside.stderr
    );
    assert!(!out.contains(&kept), "an image not shared is seen: {out}");
    let other = sandbox(&b, &["--", "sh", "-c", list], &[]);
    assert!(!other.ok().stdout.contains(&shared), "another project sees the share: {}", other.stdout);
    for name in [&shared, &kept] {
        as_user("podman", &["rmi", "-f", name]).ok();
    }
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn the_engine_pulls_from_an_allowed_registry_through_the_gate_and_is_refused_another() {
    let th = TestHost::new();
    let dir = env().root.join(format!("registry-{}", th.ns));
    std::fs::create_dir_all(&dir).unwrap();
    test_ca(&dir, &["registry.test"]);
    let log = dir.join("requests.log");
    let (cert, key) = (dir.join("leaf.pem"), dir.join("leaf.key"));
    let args: Vec<&std::ffi::OsStr> =
        vec![cert.as_os_str(), key.as_os_str(), "e2e/bb".as_ref(), "1".as_ref(), log.as_os_str()];
    let mut server = python_on_443(&th.ns, &dir, "registry_server.py", &args, &[]);
    let p = Project::new("pull");
    p.config(&format!("containers = on\nallow = registry.test\nresolve = registry.test={}\n", th.v4));
    let script = "set +e; \
        podman pull -q --tls-verify=false registry.test/e2e/bb:1 >/dev/null 2>pull.err; echo pull=$?; \
        echo \"ran=$(podman run --rm registry.test/e2e/bb:1 echo pulled-ok 2>&1)\"; \
        echo \"other=$(podman pull --tls-verify=false --retry 0 registry.other.test/e2e/bb:1 2>&1 | tail -1)\"";
    let r = sandbox(&p, &["--", "sh", "-c", script], &[]);
    let _ = server.kill();
    let _ = server.wait();
    let out = &r.ok().stdout;
    let requests = std::fs::read_to_string(&log).unwrap_or_default();
    // Positive control: the allowed registry served the image, and it runs.
    assert!(out.contains("pull=0") && out.contains("ran=pulled-ok"), "{out}\n{}\n{requests}", r.stderr);
    assert!(requests.contains("GET registry.test /v2/e2e/bb/manifests/1"), "{requests}");
    // Another registry: refused by the gate, with the line to add; nothing reached the server.
    let other = out.lines().find_map(|l| l.strip_prefix("other=")).unwrap_or("");
    // (podman shortens the gate's answer: "blocked by ai-sandbox: add \"allow = registry.other...")
    assert!(other.contains("allow = registry.other"), "{out}");
    assert!(!requests.contains("other.test"), "{requests}");
    // The launcher says it with both ways out: the allow line, or sharing an image from the host.
    let said = r.stderr.lines().find(|l| l.contains("refused registry.other.test")).unwrap_or("");
    assert!(
        said.contains("allow = registry.other.test") && said.contains("ai-sandbox image share IMAGE"),
        "the refusal is said: {}",
        r.stderr
    );
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_nested_container_uses_a_bound_key_through_the_gate_and_trusts_its_ca() {
    let up = crate::keys::Upstream::start("unused");
    let p = Project::new("nestedkeys");
    busybox_image(&p);
    // Both hosts terminated (each has a key of its own), so a placeholder sent to the wrong one
    // is seen and refused.
    let mut config = String::from(
        "containers = on\nsecret = API_KEY for api.bound.test\nsecret = OTHER_KEY for api2.bound.test\n",
    );
    for n in ["api.bound.test", "api2.bound.test"] {
        config += &format!("allow = {n}\nresolve = {n}={}\n", up.th.v4);
    }
    config += &format!("upstream_ca = {}\n", up.dir.join("ca.pem").display());
    p.config(&config);
    let key = "sk-nested-REAL-3e9a41";
    // The host's curl, run by the host's loader (the image has no libc); no -k: it must trust
    // the gate's CA from the variables and the bundle the engine mounts.
    let curl =
        format!("podman run --rm -e API_KEY -v /usr:/usr:ro localhost/bb {HOST_LD} /usr/bin/curl -sS -m 20");
    let script = format!(
        "podman import -q bb.tar localhost/bb >/dev/null; \
         echo \"auth=$({curl} -H \"Authorization: Bearer $API_KEY\" https://api.bound.test/auth 2>&1)\"; \
         echo \"leak=$({curl} -o /dev/null -w '%{{http_code}}' -H \"X-Leak: $API_KEY\" https://api2.bound.test/leak 2>&1)\""
    );
    let r =
        sandbox(&p, &["--", "sh", "-c", &script], &[("API_KEY", key), ("OTHER_KEY", "other-nested-7c1d")]);
    let out = &r.ok().stdout;
    let reqs = up.requests();
    let auth: Vec<_> = reqs.iter().filter(|q| q["target"] == "/auth").collect();
    // Positive control: the bound host answered the nested client, and got the real key.
    assert!(out.contains("auth=ok api.bound.test"), "{out}\n{}", r.stderr);
    assert_eq!(auth[0]["headers"]["authorization"], format!("Bearer {key}"), "{reqs:?}");
    // The placeholder sent to another host: refused by the gate, never at the server.
    assert!(out.contains("leak=403"), "{out}");
    assert!(!reqs.iter().any(|q| q["target"] == "/leak"), "{reqs:?}");
    assert!(!out.contains(key), "{out}");
}
