//! E2E for the egress gate: real sandbox, test servers (HTTP, HTTPS with a self-signed
//! certificate, TCP echo) in a network namespace the test creates, names pinned with `resolve`.

use crate::harness::*;

fn gate_config(th: &TestHost, extra: &str) -> String {
    format!(
        "allow = allowed.test\nresolve = allowed.test={v4}\nallow = loop.test\nresolve = loop.test=127.0.0.1\n\
         allow = echo.test:7000\nresolve = echo.test={v4}\n{extra}",
        v4 = th.v4
    )
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn gate_relays_allowed_names_and_refuses_the_rest() {
    let th = TestHost::new().with_tls();
    let p = Project::new("gate");
    p.config(&gate_config(&th, ""));
    let script = "set +e; \
        echo \"http=$(curl -sS -m 10 http://allowed.test/)\"; \
        curl -sS -k -m 10 -o /dev/null https://allowed.test/; echo \"https-rc=$?\"; \
        echo \"denied=$(curl -sS -m 10 -w ' %{http_code}' http://denied.test/)\"; \
        echo \"loop=$(curl -sS -m 10 -w ' %{http_code}' http://loop.test/)\"; \
        echo \"port=$(curl -sS -m 10 -w ' %{http_code}' http://allowed.test:8080/)\"; \
        /usr/bin/python3 probe.py sni:allowed.test:443:allowed.test sni:allowed.test:443:evil.test \
            token:allowed.test:80:wrong-token token:allowed.test:80:";
    let r = sandbox(&p, &["--", "sh", "-c", script], &[]);
    r.ok();
    let out = &r.stdout;
    let cfg = p.path(".ai-sandbox/config").display().to_string();
    assert!(out.contains("http=TESTHOST-HTTP"), "positive control over HTTP: {out}\n{}", r.stderr);
    assert!(out.contains("https-rc=0"), "positive control over HTTPS: {out}");
    assert!(
        out.contains(&format!("denied=blocked by ai-sandbox: add \"allow = denied.test\" to {cfg}\n 403")),
        "{out}"
    );
    let looped = out.lines().skip_while(|l| !l.starts_with("loop=")).take(2).collect::<Vec<_>>();
    assert!(
        looped[0]
            .starts_with("loop=blocked by ai-sandbox: loopback addresses are not reachable through the gate")
            && looped[1] == " 403",
        "{out}"
    );
    assert!(out.contains("add \"allow = allowed.test:8080\""), "ports outside the gate's set: {out}");
    assert_eq!(r.probe("sni:allowed.test:443:allowed.test"), "tls-ok");
    assert_eq!(r.probe("sni:allowed.test:443:evil.test"), "closed", "SNI differing from the CONNECT host");
    assert_eq!(r.probe("token:allowed.test:80:wrong-token"), "http-407");
    assert_eq!(r.probe("token:allowed.test:80:"), "http-407");
    let log = gate_log();
    let has = |host: &str, reason: &str| {
        log.lines().any(|l| {
            l.contains(&format!("\"host\":\"{host}\""))
                && l.contains("\"decision\":\"deny\"")
                && l.contains(reason)
        })
    };
    assert!(has("denied.test", "is not in the allowlist"), "no log line for the denial");
    assert!(has("loop.test", "loopback"));
    assert!(has("allowed.test", "TLS SNI `evil.test` differs"));
    assert!(!log.contains("wrong-token"), "tokens must never be logged");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_finished_sessions_token_is_refused() {
    let th = TestHost::new();
    let p = Project::new("stale");
    p.config(&gate_config(&th, ""));
    let first = sandbox(&p, &["--", "sh", "-c", "echo \"$HTTPS_PROXY\""], &[]);
    let url = first.ok().stdout.trim().to_string();
    let old = url.split(['@', ':']).nth(2).expect("token in the proxy URL").to_string();
    assert_eq!(old.len(), 32, "{url}");
    let spec = format!("token:allowed.test:80:{old}");
    let script =
        format!("echo \"http=$(curl -sS -m 10 http://allowed.test/)\"; /usr/bin/python3 probe.py {spec}");
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    r.ok();
    assert!(
        r.stdout.contains("http=TESTHOST-HTTP"),
        "positive control with this session's token: {}",
        r.stdout
    );
    assert_eq!(r.probe(&spec), "http-407", "the previous session's token still worked");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn five_hundred_concurrent_tunnels_complete_and_status_shows_the_session() {
    let th = TestHost::new();
    let p = Project::new("tunnels");
    p.config(&gate_config(&th, ""));
    let script = format!(
        "echo \"$HTTPS_PROXY\" > proxy-url; /usr/bin/python3 probe.py tunnels:echo.test:7000:500; touch ready; {UNTIL_DONE}"
    );
    let child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
    assert!(wait_for(120, || p.path("ready").exists()), "tunnels did not finish");
    let status = as_user(env().bin.to_str().unwrap(), &["gate", "status"]);
    // While the sandbox runs, no process on the host shows its token on a command line.
    let url = std::fs::read_to_string(p.path("proxy-url")).unwrap();
    let token = url.trim().split(['@', ':']).nth(2).unwrap().to_string();
    assert_eq!(token.len(), 32, "{url}");
    let leaks: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok().map(|c| (e.path(), c)))
        .filter(|(_, c)| c.windows(token.len()).any(|w| w == token.as_bytes()))
        .map(|(p, c)| format!("{}: {}", p.display(), String::from_utf8_lossy(&c).replace('\0', " ")))
        .collect();
    assert!(leaks.is_empty(), "the session token is visible in ps: {leaks:?}");
    let stdout = finish(&p, child);
    assert!(stdout.contains("tunnels:echo.test:7000:500 all-500"), "{stdout}");
    assert_eq!(status.code, 0, "{}", status.stderr);
    let line = status
        .stdout
        .lines()
        .find(|l| l.contains(&p.dir.display().to_string()))
        .unwrap_or_else(|| panic!("session missing from status:\n{}", status.stdout));
    let allowed: u64 =
        line.split("allowed ").nth(1).and_then(|s| s.split_whitespace().next()).unwrap().parse().unwrap();
    assert!(allowed >= 500, "{line}");
}

/// A squatter run as another local user (`nobody`): tries to take the dead gate's port on
/// 127.0.0.1 and on the wildcard address, records whether it could, and counts every
/// connection it gets, answering each with a page the sandbox must never see.
const SQUATTER: &str = r#"
import socket, sys, os, threading
port, out = int(sys.argv[1]), sys.argv[2]
bound, errors = [], []
for addr in ("127.0.0.1", "0.0.0.0"):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    except OSError:
        pass
    try:
        s.bind((addr, port)); s.listen(16); bound.append(s)
    except OSError as e:
        errors.append("%s: %s" % (addr, e))
open(out + ".bind", "w").write("bound %d %s\n" % (len(bound), "; ".join(errors)))
hits = 0
def serve(s):
    global hits
    while True:
        c, _ = s.accept(); hits += 1
        open(out + ".hits", "w").write("%d\n" % hits)
        c.recv(4096); c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nSQUATTER\n"); c.close()
for s in bound:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
import time
while not os.path.exists(out + ".stop"):
    time.sleep(0.1)
"#;

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn killing_the_gate_leaves_the_sandbox_without_egress_even_if_another_user_takes_its_port() {
    gate_alone();
    let th = TestHost::new();
    let p = Project::new("gatekill");
    p.config(&gate_config(&th, &format!("allow = {}:{}\n", th.v4, th.port)));
    let direct = th.tcp4();
    let script = format!(
        "echo \"before=$(curl -sS -m 10 http://allowed.test/)\"; touch ready; \
         for i in $(seq 600); do [ -e done ] && break; sleep 0.1; done; \
         echo \"after=$(curl -sS -m 10 -w ' %{{http_code}}' http://allowed.test/ 2>&1)\"; \
         curl -sS -k -m 10 -o /dev/null https://allowed.test/ 2>/dev/null; echo \"https-rc=$?\"; \
         /usr/bin/python3 probe.py tcp:{}:80 {direct}",
        th.v4
    );
    let child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
    assert!(wait_for(60, || p.path("ready").exists()), "sandbox did not start");
    let status = as_user(env().bin.to_str().unwrap(), &["gate", "status", "--json"]);
    let v: serde_json::Value =
        serde_json::from_str(&status.stdout).unwrap_or_else(|e| panic!("{e}: {}", status.stdout));
    let (pid, port) = (v["pid"].as_i64().unwrap() as i32, v["port"].as_u64().unwrap());
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    assert!(wait_for(10, || !std::path::Path::new(&format!("/proc/{pid}")).exists()), "gate still alive");
    // Another local user tries to take the port the sandbox's ruleset and proxy URL point at.
    let dir = env().root.join(format!("squatter-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(dir.join("squat.py"), SQUATTER).unwrap();
    let out = dir.join("result");
    let mut squatter = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--", "/usr/bin/python3"])
        .arg(dir.join("squat.py"))
        .arg(port.to_string())
        .arg(&out)
        .spawn()
        .unwrap();
    let bind_file = out.with_extension("bind");
    assert!(wait_for(10, || bind_file.exists()), "the squatter did not start");
    std::fs::write(p.path("done"), "").unwrap();
    let res = child.wait_with_output();
    std::fs::write(out.with_extension("stop"), "").unwrap();
    let _ = squatter.wait();
    let stdout = String::from_utf8_lossy(&res.stdout);
    let stderr = String::from_utf8_lossy(&res.stderr);
    let hits = std::fs::read_to_string(out.with_extension("hits")).unwrap_or_else(|_| "0".into());
    let bound = std::fs::read_to_string(&bind_file).unwrap();
    assert!(stdout.contains("before=TESTHOST-HTTP"), "positive control before the kill: {stdout}\n{stderr}");
    assert!(!stdout.contains("SQUATTER"), "the squatter answered the sandbox: {stdout}");
    assert_eq!(hits.trim(), "0", "a sandbox connection reached the squatter ({bound})");
    assert!(bound.starts_with("bound 0 "), "the dead gate's port could be taken by another user: {bound}");
    assert!(
        stdout.contains("after=blocked by ai-sandbox: the egress gate stopped") && stdout.contains(" 503"),
        "the launcher answers on the dead gate's port, at once: {stdout}"
    );
    assert!(!stdout.contains("https-rc=0"), "HTTPS through the dead gate: {stdout}");
    assert!(stdout.contains(&format!("tcp:{}:80 refused", th.v4)), "no direct path opened: {stdout}");
    assert!(
        stdout.contains(&format!("{direct} open")),
        "the allowed IP entry still works (netfilter, not the gate): {stdout}"
    );
    assert!(stderr.contains("egress gate stopped"), "the launcher must say so: {stderr}");
}
