//! The gate in cluster mode (`gate serve --listen --policy`), as a cluster runs it: in a network
//! namespace of its own (the gate's pod), reached over a veth from another (the agent's pod),
//! with the token from a file. Its upstream is a server on the gate namespace's own non-loopback
//! address (what the gate may dial); its loopback stands in for what it must not (SSRF).

use crate::harness::*;
use ai_sandbox::contract::SessionPolicy;
use ai_sandbox::gate::cluster::{PolicyFile, SessionEntry};
use ai_sandbox::policy::allow::{Allowlist, HostPattern};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

const GATE_IP: &str = "198.51.100.245";
const POD_IP: &str = "198.51.100.246";
const TOKEN: &str = "e2e-cluster-token-5b0f3c9d1a";

/// Two namespaces joined by a veth pair; removed on drop.
struct Pods(String, String);

impl Pods {
    /// `tag` names the pair (tests run in parallel).
    fn new(tag: &str) -> Pods {
        // The harness's first call removes earlier runs' namespaces by their prefix, ours too:
        // it is made first (a test run alone failed here: its namespace was gone).
        env();
        let pods = Pods(format!("aisbe2e-{tag}gate"), format!("aisbe2e-{tag}pod"));
        let ip = |args: &[&str]| {
            let st = Command::new("ip").args(args).status().unwrap();
            assert!(st.success(), "ip {args:?}");
        };
        for ns in [&pods.0, &pods.1] {
            // A namespace left by an interrupted run (usually none: quietly).
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        ip(&["-n", &pods.0, "link", "add", "cg0", "type", "veth", "peer", "name", "cp0", "netns", &pods.1]);
        ip(&["-n", &pods.0, "addr", "add", &format!("{GATE_IP}/30"), "dev", "cg0"]);
        ip(&["-n", &pods.1, "addr", "add", &format!("{POD_IP}/30"), "dev", "cp0"]);
        ip(&["-n", &pods.0, "link", "set", "cg0", "up"]);
        ip(&["-n", &pods.1, "link", "set", "cp0", "up"]);
        pods
    }

    /// A command in the agent's namespace, as the test user.
    fn in_pod(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.1, "runuser", "-u", &env().user, "--"]).args(args);
        c
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        for ns in [&self.0, &self.1] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn policy() -> SessionPolicy {
    SessionPolicy {
        allow: Allowlist {
            hosts: vec![(HostPattern::Exact("allowed.test".into()), None)],
            ..Allowlist::default()
        },
        gate_ports: vec![8080],
        resolve: vec![
            ("allowed.test".into(), GATE_IP.parse().unwrap()),
            ("refused.test".into(), GATE_IP.parse().unwrap()),
        ],
        ..SessionPolicy::default()
    }
}

/// curl in the agent's namespace through the gate; the proxy URL (with the token, when given)
/// only in the environment, never on a command line. Prints `CODE BODY`.
fn curl(pods: &Pods, token: Option<&str>, args: &[&str]) -> String {
    let proxy = match token {
        Some(t) => format!("http://agent:{t}@{GATE_IP}:3128"),
        None => format!("http://{GATE_IP}:3128"),
    };
    let mut all = vec!["curl", "-s", "-m", "10", "-w", " %{http_code}"];
    all.extend_from_slice(args);
    // runuser keeps the environment it is given (HOME and the like aside).
    let out = pods.in_pod(&all).env("http_proxy", &proxy).env("https_proxy", &proxy).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn cluster_gate_serves_a_pod_with_the_token_logs_json_and_drains_on_sigterm() {
    let pods = Pods::new("c");
    let p = Project::new("cluster");
    let uid = nix::unistd::Uid::from_raw(env().uid);
    let token_file = p.path("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    std::os::unix::fs::chown(&token_file, Some(uid.as_raw()), None).unwrap();
    let entry = SessionEntry {
        id: "agent".into(),
        project: "/work".into(),
        token_file,
        policy: policy(),
        secrets: vec![],
        upstream_ca_file: None,
    };
    let policy_file = p.path("policy.json");
    std::fs::write(&policy_file, serde_json::to_string(&PolicyFile { sessions: vec![entry] }).unwrap())
        .unwrap();

    // The upstream, on the gate namespace's own address, and a loopback-only one beside it.
    let upstream = "import http.server as h\n\
        class H(h.BaseHTTPRequestHandler):\n\
        \x20   def do_GET(self):\n\
        \x20       b = b'upstream-ok'; self.send_response(200); self.send_header('Content-Length', str(len(b))); self.end_headers(); self.wfile.write(b)\n\
        \x20   def log_message(self, *a): pass\n\
        import sys; h.ThreadingHTTPServer((sys.argv[1], 8080), H).serve_forever()\n";
    let mut servers = Vec::new();
    for addr in [GATE_IP, "127.0.0.1"] {
        servers.push(
            Command::new("ip")
                .args(["netns", "exec", &pods.0, "python3", "-c", upstream, addr])
                .spawn()
                .unwrap(),
        );
    }
    let mut gate = Command::new("ip")
        .args(["netns", "exec", &pods.0, "runuser", "-u", &env().user, "--"])
        .arg(&env().bin)
        .args(["gate", "serve", "--listen", &format!("{GATE_IP}:3128"), "--policy"])
        .arg(&policy_file)
        .args(["--drain", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut gate_err = BufReader::new(gate.stderr.take().unwrap());
    let mut first = String::new();
    gate_err.read_line(&mut first).unwrap();
    assert!(first.contains("listening on 198.51.100.245:3128 for 1 session"), "{first}");
    let ok = wait_for(10, || curl(&pods, Some(TOKEN), &["http://allowed.test:8080/"]) == "upstream-ok 200");

    let allowed = curl(&pods, Some(TOKEN), &["http://allowed.test:8080/"]);
    let refused = curl(&pods, Some(TOKEN), &["-i", "http://refused.test:8080/"]);
    let ssrf = curl(&pods, Some(TOKEN), &["-i", "http://127.0.0.1:8080/"]);
    let no_token = curl(&pods, None, &["http://allowed.test:8080/"]);
    let tunnelled = curl(&pods, Some(TOKEN), &["-p", "http://allowed.test:8080/"]);

    // SIGTERM with a tunnel open: new connections are refused, the open one finishes.
    // The client reads the token from its stdin (never its command line) and waits for `flag`.
    let script = "import base64, os, socket, sys, time\n\
        tok = sys.stdin.readline().strip()\n\
        s = socket.create_connection((sys.argv[1], 3128))\n\
        cred = base64.b64encode(('agent:' + tok).encode()).decode()\n\
        s.sendall(('CONNECT allowed.test:8080 HTTP/1.1\\r\\nHost: allowed.test:8080\\r\\nProxy-Authorization: Basic ' + cred + '\\r\\n\\r\\n').encode())\n\
        print(s.recv(200).split(b'\\r\\n')[0].decode(), flush=True)\n\
        while not os.path.exists(sys.argv[2]): time.sleep(0.05)\n\
        s.sendall(b'GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\nConnection: close\\r\\n\\r\\n')\n\
        data = b''\n\
        while (c := s.recv(4096)): data += c\n\
        print('after-sigterm', data.split(b'\\r\\n')[0].decode(), data.endswith(b'upstream-ok'), flush=True)\n";
    let flag = p.path("go");
    let mut held = pods
        .in_pod(&["python3", "-c", script, GATE_IP])
        .arg(&flag)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    held.stdin.take().unwrap().write_all(format!("{TOKEN}\n").as_bytes()).unwrap();
    let mut held_out = BufReader::new(held.stdout.take().unwrap());
    let mut established = String::new();
    held_out.read_line(&mut established).unwrap();
    // While the gate serves and a client holds a tunnel: the token is on no command line.
    let leaks = command_lines_containing(&[TOKEN]);
    nix::sys::signal::kill(gate_pid(&pods), nix::sys::signal::Signal::SIGTERM).unwrap();
    // The gate says when it has stopped accepting (or ends, and the read returns nothing).
    let mut closing = String::new();
    gate_err.read_line(&mut closing).unwrap();
    assert!(closing.contains("no longer accepting"), "{closing}");
    let after_term = curl(&pods, Some(TOKEN), &["http://allowed.test:8080/"]);
    std::fs::write(&flag, "").unwrap();
    let mut rest = String::new();
    held_out.read_to_string(&mut rest).unwrap();
    held.wait().unwrap();
    let exited = wait_for(20, || gate.try_wait().unwrap().is_some());
    let mut log = String::new();
    gate.stdout.take().unwrap().read_to_string(&mut log).unwrap();
    let mut err_rest = String::new();
    let _ = gate_err.read_to_string(&mut err_rest);
    for mut s in servers {
        let _ = s.kill();
        let _ = s.wait();
    }
    let all = format!(
        "allowed={allowed}\nrefused={refused}\nssrf={ssrf}\nno_token={no_token}\ntunnel={tunnelled}\n\
         established={established}after_term={after_term}\n{rest}\nstdout:\n{log}\nstderr:\n{err_rest}"
    );

    assert!(ok, "the gate never served the pod: {all}");
    assert_eq!(allowed, "upstream-ok 200", "positive control, forward: {all}");
    assert_eq!(tunnelled, "upstream-ok 200", "positive control, CONNECT: {all}");
    assert!(
        refused.ends_with(" 403") && refused.contains("allow = refused.test"),
        "refused name, with the hint: {all}"
    );
    assert!(ssrf.ends_with(" 403") && !ssrf.contains("upstream-ok"), "loopback of the gate's pod: {all}");
    assert!(no_token.ends_with(" 407"), "no token: {all}");
    // JSON lines on stdout, one per decision, none with the token.
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let has =
        |decision: &str, host: &str| events.iter().any(|e| e["decision"] == decision && e["host"] == host);
    assert!(has("allow", "allowed.test") && has("deny", "refused.test") && has("deny", "127.0.0.1"), "{all}");
    assert!(has("challenge", "allowed.test"), "the 407 is logged: {all}");
    assert!(events.iter().all(|e| e["session"] == "agent" || e["session"] == "-"), "{all}");
    assert!(!log.contains(TOKEN) && !err_rest.contains(TOKEN), "the token was logged: {all}");
    assert!(leaks.is_empty(), "the token is on a command line: {leaks:?}");
    // SIGTERM: the open tunnel finished, nothing new was accepted, the gate said so and exited 0.
    assert!(established.starts_with("HTTP/1.1 200"), "{all}");
    assert!(rest.contains("after-sigterm HTTP/1.0 200 OK True"), "the open tunnel was cut: {all}");
    assert_eq!(after_term, "000", "a new connection was accepted after SIGTERM: {all}");
    assert!(exited, "the gate did not exit after draining: {all}");
    assert!(gate.wait().unwrap().success(), "{all}");
    assert!(err_rest.contains("stopped; every connection finished"), "{all}");
}

/// The gate's own pid (under `ip netns exec` and `runuser`).
fn gate_pid(pods: &Pods) -> nix::unistd::Pid {
    let out = Command::new("ip").args(["netns", "pids", &pods.0]).output().unwrap();
    let pids = String::from_utf8_lossy(&out.stdout).to_string();
    let pid = pids
        .split_whitespace()
        .find(|p| {
            // The binary itself, not the runuser that started it (which would SIGKILL it).
            let bin = env().bin.display().to_string();
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with(&format!("{bin}\0gate\0serve")))
        })
        .unwrap_or_else(|| panic!("no gate among {pids}"));
    nix::unistd::Pid::from_raw(pid.parse().unwrap())
}

/// A cluster-mode gate with a bound secret: the CA from `gate ca DIR` (what the export's Secret
/// holds), the value from a file (a mounted Secret); the pod holds only the placeholder and
/// trusts the CA's certificate; the upstream (HTTPS, a test CA as `upstream_ca_file`) receives
/// the real value. Without the CA the gate refuses to start, and says how to make one.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn cluster_gate_puts_a_bound_secret_in_with_the_ca_it_was_given() {
    use ai_sandbox::gate::cluster::SecretEntry;
    let pods = Pods::new("k");
    let p = Project::new("cluster-keys");
    let uid = env().uid;
    let own = |f: &std::path::Path| std::os::unix::fs::chown(f, Some(uid), None).unwrap();
    let up = p.path("upstream");
    std::fs::create_dir_all(&up).unwrap();
    test_ca(&up, &["api.bound.test"]);
    let log = up.join("requests.jsonl");
    std::fs::write(&log, "").unwrap();
    let (cert, key) = (up.join("leaf.pem"), up.join("leaf.key"));
    let mut server = python_on_443(
        &pods.0,
        &up,
        "echo_server.py",
        &[cert.as_os_str(), key.as_os_str()],
        &[("ECHO_LOG", log.as_os_str())],
    );
    // The CA, made as a user would for the export's Secret.
    let ca_dir = p.path("gate-ca");
    let made =
        user_command(&p.dir, &env().bin, &["gate", "ca", ca_dir.to_str().unwrap()], &[]).output().unwrap();
    assert!(made.status.success(), "gate ca: {}", String::from_utf8_lossy(&made.stderr));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(ca_dir.join("ca.key")).unwrap().permissions().mode() & 0o777, 0o600);
    let again =
        user_command(&p.dir, &env().bin, &["gate", "ca", ca_dir.to_str().unwrap()], &[]).output().unwrap();
    assert!(!again.status.success(), "an existing CA was overwritten");

    let (token_file, value_file) = (p.path("token"), p.path("K"));
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let real = "sk-cluster-REAL-9d2e41";
    std::fs::write(&value_file, format!("{real}\n")).unwrap();
    for f in [&token_file, &value_file] {
        own(f);
    }
    let placeholder = "aisb_placeholder_c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1";
    let mut policy = policy();
    policy.allow.hosts = vec![(HostPattern::Exact("api.bound.test".into()), None)];
    policy.gate_ports = vec![443];
    policy.resolve = vec![("api.bound.test".into(), GATE_IP.parse().unwrap())];
    let entry = SessionEntry {
        id: "agent".into(),
        project: "/work".into(),
        token_file,
        policy,
        secrets: vec![SecretEntry {
            name: "K".into(),
            placeholder: placeholder.into(),
            value_file,
            hosts: vec!["api.bound.test".into()],
        }],
        upstream_ca_file: Some(up.join("ca.pem")),
    };
    let policy_file = p.path("policy.json");
    std::fs::write(&policy_file, serde_json::to_string(&PolicyFile { sessions: vec![entry] }).unwrap())
        .unwrap();
    let serve = |ca: Option<&std::path::Path>| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &pods.0, "runuser", "-u", &env().user, "--"])
            .arg(&env().bin)
            .args(["gate", "serve", "--listen", &format!("{GATE_IP}:3128"), "--policy"])
            .arg(&policy_file);
        if let Some(dir) = ca {
            c.arg("--ca").arg(dir);
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    // No CA: refused at start, with the way to make one.
    let without = serve(None).output().unwrap();
    let said = String::from_utf8_lossy(&without.stderr);
    assert!(!without.status.success() && said.contains("ai-sandbox gate ca DIR"), "{said}");

    let mut gate = serve(Some(&ca_dir)).spawn().unwrap();
    let mut gate_err = BufReader::new(gate.stderr.take().unwrap());
    let mut first = String::new();
    gate_err.read_line(&mut first).unwrap();
    assert!(first.contains("listening on"), "{first}");
    let url = "https://api.bound.test/cluster";
    let ca = ca_dir.join("ca.pem");
    let with_placeholder = format!("Authorization: Bearer {placeholder}");
    let ok = curl(&pods, Some(TOKEN), &["--cacert", ca.to_str().unwrap(), "-H", &with_placeholder, url]);
    // Control: the pod's client refuses the gate's certificate without the gate's CA.
    let untrusted = curl(&pods, Some(TOKEN), &["--cacert", up.join("ca.pem").to_str().unwrap(), url]);
    let _ = nix::sys::signal::kill(gate_pid(&pods), nix::sys::signal::Signal::SIGTERM);
    let _ = gate.wait();
    let _ = server.kill();
    let _ = server.wait();
    let reqs = json_lines(&log);
    assert_eq!(ok, "ok api.bound.test\n 200", "{reqs:?}");
    assert_eq!(
        reqs[0]["headers"]["authorization"],
        format!("Bearer {real}"),
        "the real value arrived: {reqs:?}"
    );
    assert!(untrusted.ends_with("000") && reqs.len() == 1, "{untrusted}: {reqs:?}");
}
