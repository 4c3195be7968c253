//! A host with no default route (an offline laptop on a network without a way out): the
//! launcher, pasta and the gate run in a network namespace of the test's with an address on a
//! link to one test host and no default route. The sandbox starts, the self-check proves the
//! rules, the allowed host port and the gate work, and what is not allowed is refused.

use crate::harness::*;
use std::io::Write;
use std::net::TcpListener;
use std::process::Command;

/// A network namespace standing for the offline machine (removed on drop, and by the next run's
/// clean-up if this one is killed: its name has the test hosts' prefix).
struct Machine {
    ns: String,
}

impl Machine {
    fn new() -> Machine {
        let ns = format!("{HOST_NS}{}-offline", run_tag());
        let ok =
            |args: &[&str]| assert!(Command::new("ip").args(args).status().unwrap().success(), "ip {args:?}");
        let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        ok(&["netns", "add", &ns]);
        ok(&["-n", &ns, "link", "set", "lo", "up"]);
        Machine { ns }
    }

    /// A TCP server on the machine's own 127.0.0.1 that greets each connection: its port.
    fn listen(&self, greeting: &'static str) -> u16 {
        let (tx, rx) = std::sync::mpsc::channel();
        let path = format!("/run/netns/{}", self.ns);
        std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            tx.send(l.local_addr().unwrap().port()).unwrap();
            for mut s in l.incoming().flatten() {
                let _ = s.write_all(greeting.as_bytes());
            }
        });
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap()
    }

    /// `ai-sandbox ARGS` as the test user in `p`, run on this machine (its network namespace).
    fn sandbox(&self, p: &Project, args: &[&str], vars: &[(&str, &str)]) -> Run {
        let inner = user_command(&p.dir, &env().bin, args, vars);
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.ns)).arg(inner.get_program()).args(inner.get_args());
        c.current_dir(&p.dir).stdin(std::process::Stdio::null());
        Run::of(c)
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_host_with_no_default_route_runs_sandboxes_with_their_rules_and_gate() {
    let th = TestHost::new();
    let m = Machine::new();
    th.link_into(&m.ns);
    let routes = Command::new("ip").args(["-n", &m.ns, "route"]).output().unwrap();
    let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
    assert!(!routes.contains("default") && routes.contains(&th.v4[..th.v4.rfind('.').unwrap()]), "{routes}");
    let (allowed, other) = (m.listen("ALLOWED-PORT\n"), m.listen("OTHER-PORT\n"));
    let p = Project::new("offline");
    p.config(&format!("allow = 100.64.0.1:{allowed}\nallow = lan.test\nresolve = lan.test={}\n", th.v4));
    // A runtime directory of its own: a gate started here listens in this machine's namespace.
    let rt = private_runtime("offline-runtime");
    let vars = [("AISB_RUNTIME_DIR", rt.as_str()), ("AISB_GATE_IDLE_EXIT", "1")];
    let (a, b) = (format!("tcp:100.64.0.1:{allowed}"), format!("tcp:100.64.0.1:{other}"));
    let direct = format!("tcp:{}:80", th.v4);
    let r = m.sandbox(&p, &probe_args(&[&a, &b, &direct]), &vars);
    r.ok();
    assert_eq!(r.probe(&a), "open", "the allowed host port: {}", r.stderr);
    assert_eq!(r.probe(&b), "refused", "a host port not allowed");
    assert_ne!(r.probe(&direct), "open", "the LAN host directly (only lan.test through the gate is allowed)");
    // The gate: an allowed name on the LAN answers through it; a name not allowed is refused.
    let curl = "curl -sS -o /dev/null -w 'lan %{http_code}\\n' http://lan.test/; \
                curl -sS -o /dev/null -w 'other %{http_code}\\n' http://other.test/ 2>&1; true";
    let g = m.sandbox(&p, &["--", "sh", "-c", curl], &vars);
    g.ok();
    assert!(g.stdout.contains("lan 200"), "the gate on an offline host: {}{}", g.stdout, g.stderr);
    assert!(g.stdout.contains("other 403"), "{}{}", g.stdout, g.stderr);
    // doctor says what the machine is.
    let d = m.sandbox(&p, &["doctor"], &vars);
    assert!(d.stdout.contains("IPv4 default route") && d.stdout.contains("none (offline)"), "{}", d.stdout);
}
