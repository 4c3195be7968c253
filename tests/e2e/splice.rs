//! Allowed host ports on pasta's spliced path (ADR 0034): a connection to `100.64.0.1:PORT` is
//! rewritten to the in-sandbox listener pasta forwards to the host's `127.0.0.1:PORT`; the
//! listener itself cannot be reached directly, and a live `deny` still closes the port.

use crate::harness::*;
use std::io::Write;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A host-loopback server that greets and keeps every connection open (so that the sandbox can
/// look at its own end while it lasts).
fn holding_server(greeting: &'static str) -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut s in l.incoming().flatten() {
            h.fetch_add(1, Ordering::SeqCst);
            let _ = s.write_all(greeting.as_bytes());
            held.push(s);
        }
    });
    (port, hits)
}

const HOLD: &str = r#"
import socket, subprocess, sys
s = socket.create_connection(("100.64.0.1", int(sys.argv[1])), timeout=5)
print("banner", s.recv(100).decode().strip())
out = subprocess.run(["ss", "-tnH", "state", "established"], capture_output=True, text=True)
print(out.stdout, out.stderr)
"#;

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn allowed_host_ports_take_the_spliced_path_and_stay_port_scoped() {
    let _g = GATE.read().unwrap();
    let (db, db_hits) = holding_server("DB-STANDIN\n");
    let (web, _) = holding_server("WEB-STANDIN\n");
    let p = Project::new("splice");
    p.config(&format!("allow = 100.64.0.1:{db}\nallow = 100.64.0.1:{web}\n"));
    std::fs::write(p.path("hold.py"), HOLD).unwrap();
    // Listeners are given in host-port order from 61000.
    let (db_ns, web_ns) = if db < web { (61000, 61001) } else { (61001, 61000) };
    let (db_spec, web_spec) = (format!("tcp:100.64.0.1:{db}"), format!("tcp:100.64.0.1:{web}"));
    let script = format!(
        "/usr/bin/python3 hold.py {db}; \
         /usr/bin/python3 probe.py tcp:127.0.0.1:{db_ns} tcp:[::1]:{db_ns} tcp:127.0.0.1:{web_ns} {web_spec}; \
         touch step1; for i in $(seq 600); do [ -e step2 ] && break; sleep 0.1; done; \
         /usr/bin/python3 probe.py {db_spec} {web_spec} | sed 's/^/after /'"
    );
    let child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
    assert!(wait_for(60, || p.path("step1").exists()), "sandbox did not get ready");
    let hits_before_deny = db_hits.load(Ordering::SeqCst);
    let deny = sandbox(&p, &["deny", "--session-only", &format!("100.64.0.1:{db}")], &[]);
    std::fs::write(p.path("step2"), "").unwrap();
    let out = child.wait_with_output();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let all =
        format!("{stdout}\n{}\ndeny: {}{}", String::from_utf8_lossy(&out.stderr), deny.stdout, deny.stderr);
    assert!(out.status.success(), "{all}");
    deny.ok();

    // Positive control: the allowed host port answers through 100.64.0.1.
    assert!(stdout.contains("banner DB-STANDIN"), "{all}");
    // ...and the connection landed on pasta's spliced listener: the sandbox's namespace holds
    // both ends, its own socket to 100.64.0.1:PORT and the listener's 127.0.0.1:NS_PORT one.
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.iter().any(|l| l.contains(&format!("100.64.0.1:{db}"))), "no client socket: {all}");
    assert!(
        lines.iter().any(|l| l.split_whitespace().nth(2) == Some(&format!("127.0.0.1:{db_ns}"))),
        "the connection did not reach the spliced listener 127.0.0.1:{db_ns}: {all}"
    );
    // The listeners are reachable only through the rewrite, by no loopback address.
    for spec in
        [format!("tcp:127.0.0.1:{db_ns}"), format!("tcp:[::1]:{db_ns}"), format!("tcp:127.0.0.1:{web_ns}")]
    {
        assert!(stdout.contains(&format!("{spec} refused")), "{spec} must be refused: {all}");
    }
    assert!(stdout.contains(&format!("{web_spec} open")), "positive control in the same run: {all}");
    assert_eq!(hits_before_deny, 1, "only the held connection reached the host's server: {all}");
    // A live deny closes the spliced port; the other one stays.
    assert!(
        stdout.contains(&format!("after {db_spec} refused")),
        "deny did not close the spliced port: {all}"
    );
    assert!(stdout.contains(&format!("after {web_spec} open")), "positive control after deny: {all}");
    assert_eq!(db_hits.load(Ordering::SeqCst), 1, "a connection reached the denied port: {all}");
}
