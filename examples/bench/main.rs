//! Measurements for `bench/run` (issue: benchmarks). Not a test: it prints figures, each next to
//! its baseline from the same run. Built by every `cargo test`, so it cannot rot.
//!
//!   bench serve ADDR                      load server: `D<u64>` streams that many bytes,
//!                                         `E` echoes, `GET ` answers HTTP with ?bytes=N zeros,
//!                                         `PUT` drops a Content-Length body (uploads)
//!   bench relay   GATE --target A --tinyproxy A --bytes N
//!   bench connect GATE --target A --count N
//!   bench tunnels GATE --count N
//!   bench rules --nft PATH
//!   bench cluster-policy --host NAME --port P --addr IP --token-file F   (prints a policy file)
//!   bench plain-relay --target A          the launcher's relay (splice(2), no decisions) on
//!                                         127.0.0.1: prints its port, serves until killed; the
//!                                         floor for anything relayed on the way to the host
//!   bench walk DIR RUNS                   the guard's repository walk of DIR beside a bare
//!                                         listing of the same tree (median ms)
//!   bench terminate GATE --count N        requests to a bound secret's host (the gate opens TLS)
//!                                         beside the same over a blind tunnel (see `terminate`)
//!   bench h2 GATE --streams N --size B --calls M [--runs R]
//!                                         HTTP/2 through a terminated host: N downloads as
//!                                         streams of one connection beside N HTTP/1.1
//!                                         connections; M gRPC-shaped unary calls beside the
//!                                         same through a blind tunnel (see `h2`)
//!   bench budget GATE --target A --bytes N [--runs R]   uploads through a tunnel whose
//!                                         host has a budget beside the same without one
//!                                         (Gbit/s, and the gate's CPU ns per MiB)
//!   bench h2 also prints two floors: the same unary calls through bare relays (see `floor`)
//!   bench push-check                      the gate's check of a push limited by ref (reading
//!                                         git's command list, matching each ref), for 1 and
//!                                         600 refs: median microseconds
//! where GATE is `--gate-exe PATH --host NAME --port P --addr IP`: the sessions' allowlist
//! (NAME:P pinned to IP), registered with the user's gate like a launcher does; relay and
//! connect take `--proxy ADDR --token-file F` instead to measure a cluster-mode gate.

mod floor;
mod h2;
mod terminate;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}
fn need(args: &[String], name: &str) -> String {
    arg(args, name).unwrap_or_else(|| panic!("missing {name}"))
}

fn serve(addr: &str) {
    let l = TcpListener::bind(addr).expect("bind");
    for s in l.incoming().flatten() {
        std::thread::spawn(move || {
            let _ = s.set_nodelay(true);
            let _ = handle(s);
        });
    }
}

fn handle(mut s: TcpStream) -> std::io::Result<()> {
    let mut first = [0u8; 1];
    s.read_exact(&mut first)?;
    let zeros = vec![0u8; 256 * 1024];
    let stream = |s: &mut TcpStream, mut n: u64| -> std::io::Result<()> {
        while n > 0 {
            let k = n.min(zeros.len() as u64) as usize;
            s.write_all(&zeros[..k])?;
            n -= k as u64;
        }
        Ok(())
    };
    match first[0] {
        b'D' => {
            let mut len = [0u8; 8];
            s.read_exact(&mut len)?;
            stream(&mut s, u64::from_be_bytes(len))
        }
        b'E' => {
            s.write_all(&first)?;
            let mut r = s.try_clone()?;
            std::io::copy(&mut r, &mut s).map(|_| ())
        }
        b'G' => {
            let mut head = vec![b'G'];
            let mut r = BufReader::new(s.try_clone()?);
            loop {
                let mut line = String::new();
                if r.read_line(&mut line)? == 0 || line == "\r\n" {
                    break;
                }
                head.extend_from_slice(line.as_bytes());
            }
            let text = String::from_utf8_lossy(&head);
            let n: u64 = text
                .split("bytes=")
                .nth(1)
                .and_then(|v| v.split([' ', '&']).next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n")?;
            stream(&mut s, n)
        }
        b'P' => {
            // An upload (`PUT` with Content-Length): read and drop the body, then answer.
            let mut r = BufReader::new(s.try_clone()?);
            let mut len = 0u64;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line)? == 0 || line == "\r\n" {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    if k.eq_ignore_ascii_case("expect") {
                        s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
                    }
                }
            }
            let got = std::io::copy(&mut r.take(len), &mut std::io::sink())?;
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\nX-Received: {got}\r\n\r\n"
            )
        }
        _ => Ok(()),
    }
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Opens a stream to `target` directly (`proxy` None) or through an HTTP CONNECT proxy.
fn open(proxy: Option<(SocketAddr, Option<&str>)>, target: &str) -> TcpStream {
    match proxy {
        None => {
            let s = TcpStream::connect(target).expect("direct connect");
            s.set_nodelay(true).unwrap();
            s
        }
        Some((p, token)) => {
            let mut s = TcpStream::connect(p).expect("proxy connect");
            s.set_nodelay(true).unwrap();
            let auth = token
                .map(|t| format!("Proxy-Authorization: Basic {}\r\n", b64(&format!("aisb:{t}"))))
                .unwrap_or_default();
            write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n").unwrap();
            // The far end sends nothing before we do, so reading whole chunks cannot
            // swallow tunnel bytes.
            let mut head = Vec::new();
            let mut b = [0u8; 512];
            while !head.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut b).expect("proxy reply");
                assert!(n > 0, "proxy closed");
                head.extend_from_slice(&b[..n]);
            }
            assert!(
                head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200"),
                "{}",
                String::from_utf8_lossy(&head)
            );
            s
        }
    }
}

/// The session policy of every bench session: HOST:PORT, the name pinned to ADDR.
fn session_policy(args: &[String]) -> ai_sandbox::contract::SessionPolicy {
    use ai_sandbox::policy::allow::{Allowlist, HostPattern, Ports};
    let host = need(args, "--host");
    ai_sandbox::contract::SessionPolicy {
        allow: Allowlist {
            hosts: vec![(
                HostPattern::Exact(host.clone()),
                Some(Ports::one(need(args, "--port").parse().unwrap())),
            )],
            ..Allowlist::default()
        },
        resolve: vec![(host, need(args, "--addr").parse().unwrap())],
        config_path: "bench".into(),
        ..Default::default()
    }
}

/// Registers `n` gate sessions allowing HOST:PORT pinned to ADDR (starting the gate with
/// `--gate-exe` if none runs); the leases keep them registered while the measurement runs.
fn sessions(args: &[String], n: usize) -> (Vec<ai_sandbox::gate::control::Lease>, Vec<String>, u16) {
    sessions_with(args, &vec![session_policy(args); n])
}

/// One session per policy, as `sessions` registers them.
fn sessions_with(
    args: &[String],
    policies: &[ai_sandbox::contract::SessionPolicy],
) -> (Vec<ai_sandbox::gate::control::Lease>, Vec<String>, u16) {
    use ai_sandbox::gate::control;
    let exe = std::path::PathBuf::from(need(args, "--gate-exe"));
    let dir = ai_sandbox::sys::runtime::runtime_dir();
    let mut leases = Vec::new();
    let mut tokens = Vec::new();
    for (i, policy) in policies.iter().enumerate() {
        let token = format!("{:032x}", (std::process::id() as u128) << 64 | i as u128 | 0xbe7c_0000);
        let req = control::Request::Register {
            session: format!("bench-{i}"),
            project: "bench".into(),
            token: token.clone(),
            policy: policy.clone(),
            secrets: vec![],
            upstream_ca: None,
        };
        leases.push(control::register(&dir, &exe, 18181, &req).expect("register with the gate"));
        tokens.push(token);
    }
    let gate_port = leases[0].port;
    (leases, tokens, gate_port)
}

/// The gate to measure: with `--proxy ADDR --token-file F`, a gate already serving (cluster
/// mode); else one session registered with the user's local gate (kept while the lease lives).
fn gate_for(args: &[String]) -> (Vec<ai_sandbox::gate::control::Lease>, String, SocketAddr) {
    match arg(args, "--proxy") {
        Some(addr) => {
            let token = std::fs::read_to_string(need(args, "--token-file")).unwrap().trim().to_string();
            (Vec::new(), token, addr.parse().unwrap())
        }
        None => {
            let (leases, tokens, port) = sessions(args, 1);
            (leases, tokens[0].clone(), ([127, 0, 0, 1], port).into())
        }
    }
}

/// A cluster-mode policy file with one session (the bench's), its token in `--token-file`.
fn cluster_policy(args: &[String]) {
    use ai_sandbox::gate::cluster::{PolicyFile, SessionEntry};
    let entry = SessionEntry {
        id: "bench".into(),
        project: "bench".into(),
        token_file: need(args, "--token-file").into(),
        policy: session_policy(args),
        secrets: vec![],
        upstream_ca_file: None,
    };
    println!("{}", serde_json::to_string(&PolicyFile { sessions: vec![entry] }).unwrap());
}

pub(crate) fn gate_pid() -> String {
    let dir = ai_sandbox::sys::runtime::runtime_dir();
    let r = ai_sandbox::gate::control::call(&dir, &ai_sandbox::gate::control::Request::Status)
        .unwrap()
        .expect("gate running");
    r.as_status().pid.to_string()
}

fn relay(args: &[String]) {
    let bytes: u64 = need(args, "--bytes").parse().unwrap();
    let target = need(args, "--target");
    let (_leases, token, gate) = gate_for(args);
    let tiny: SocketAddr = need(args, "--tinyproxy").parse().unwrap();
    let host = need(args, "--host");
    let port = target.rsplit(':').next().unwrap();
    let named = format!("{host}:{port}");
    let run = |name: &str, proxy: Option<(SocketAddr, Option<&str>)>, t: &str| -> f64 {
        let mut s = open(proxy, t);
        let start = Instant::now();
        s.write_all(b"D").unwrap();
        s.write_all(&bytes.to_be_bytes()).unwrap();
        let mut buf = vec![0u8; 256 * 1024];
        let mut got = 0u64;
        while got < bytes {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "{name}: stream ended at {got} bytes");
            got += n as u64;
        }
        bytes as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
    };
    // Three interleaved rounds; the median of each path (single streams are noisy here).
    let mut g: [Vec<f64>; 3] = Default::default();
    for _ in 0..3 {
        g[0].push(run("direct", None, &target));
        g[1].push(run("gate", Some((gate, Some(&token))), &named));
        g[2].push(run("tinyproxy", Some((tiny, None)), &target));
    }
    for (name, v) in ["direct", "gate", "tinyproxy"].iter().zip(g.iter_mut()) {
        println!("relay {name} {:.2}", pct(v, 0.5));
    }
}

/// `bench budget GATE --target A --bytes N [--runs R]`: uploads of N bytes through a tunnel of
/// a session whose host has a budget (larger than everything sent) and of one without,
/// alternated R times (5 unless said), each first in every other round: the median Gbit/s of
/// each, and the median of the gate's CPU time per MiB. The budget's cost is the ratio.
fn budget(args: &[String]) {
    let bytes: u64 = need(args, "--bytes").parse().unwrap();
    let runs: usize = arg(args, "--runs").map_or(5, |v| v.parse().unwrap());
    let target = need(args, "--target");
    let host = need(args, "--host");
    let Ok(ai_sandbox::policy::budget::Line::Host(line)) =
        ai_sandbox::policy::budget::parse(&format!("{host} {}", bytes * 100))
    else {
        panic!("--host {host}: not a host for a budget line")
    };
    let budgeted = ai_sandbox::contract::SessionPolicy { budgets: vec![line], ..session_policy(args) };
    let (_leases, tokens, port) = sessions_with(args, &[session_policy(args), budgeted]);
    let gate: SocketAddr = ([127, 0, 0, 1], port).into();
    let named = format!("{host}:{}", target.rsplit(':').next().unwrap());
    let chunk = vec![b'u'; 1 << 20];
    let run = |token: &str| -> f64 {
        let mut s = open(Some((gate, Some(token))), &named);
        let start = Instant::now();
        write!(s, "PUT /up HTTP/1.1\r\nContent-Length: {bytes}\r\n\r\n").unwrap();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            s.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
        let mut reply = String::new();
        BufReader::new(&mut s).read_line(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "the upload's answer: {reply}");
        bytes as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
    };
    // The gate's own CPU time over each upload (all its threads, in ns): what the budget's
    // accounting adds, without the wall clock's noise from where the kernel runs whom.
    let pid = gate_pid();
    let cpu_ns = || -> u64 {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the gate's threads");
        let on_cpu = |t: std::fs::DirEntry| {
            let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            s.split_whitespace().next()?.parse::<u64>().ok()
        };
        tasks.flatten().filter_map(on_cpu).sum()
    };
    let (mut g, mut cpu): ([Vec<f64>; 2], [Vec<f64>; 2]) = Default::default();
    for r in 0..runs {
        // Each goes first in every other round, so that neither has the warmer start.
        for i in [r % 2, 1 - r % 2] {
            let before = cpu_ns();
            g[i].push(run(&tokens[i]));
            cpu[i].push((cpu_ns() - before) as f64 / (bytes as f64 / (1 << 20) as f64));
        }
    }
    for (i, name) in ["plain", "budgeted"].iter().enumerate() {
        println!("budget {name} {:.2}", pct(&mut g[i], 0.5));
        println!("budget-cpu {name} {:.0}", pct(&mut cpu[i], 0.5));
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn connect(args: &[String]) {
    let count: usize = need(args, "--count").parse().unwrap();
    let target = need(args, "--target");
    let (_leases, token, gate) = gate_for(args);
    let named = format!("{}:{}", need(args, "--host"), target.rsplit(':').next().unwrap());
    let measure = |name: &str, proxy: Option<(SocketAddr, Option<&str>)>, t: &str| {
        let mut v: Vec<f64> = (0..count)
            .map(|_| {
                let start = Instant::now();
                let mut s = open(proxy, t);
                s.write_all(b"E").unwrap();
                let mut b = [0u8; 1];
                s.read_exact(&mut b).unwrap();
                start.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        println!("connect {name} {:.3} {:.3}", pct(&mut v, 0.5), pct(&mut v, 0.99));
    };
    measure("direct", None, &target);
    measure("gate", Some((gate, Some(&token))), &named);
}

pub(crate) fn rss_kib(pid: &str, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn tunnels(args: &[String]) {
    let count: usize = need(args, "--count").parse().unwrap();
    // The per-session cap is 2,048 connections: spread the tunnels over enough sessions.
    let (_leases, tokens, gport) = sessions(args, count.div_ceil(2000));
    let gate: SocketAddr = ([127, 0, 0, 1], gport).into();
    let target = format!("{}:{}", need(args, "--host"), need(args, "--port"));
    let pid = gate_pid();
    let idle = rss_kib(&pid, "VmRSS:");
    let start = Instant::now();
    let mut held: Vec<TcpStream> =
        (0..count).map(|i| open(Some((gate, Some(&tokens[i % tokens.len()]))), &target)).collect();
    let mut ok = 0;
    for s in held.iter_mut() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"E").unwrap();
        let mut b = [0u8; 1];
        if s.read_exact(&mut b).is_ok() && b[0] == b'E' {
            ok += 1;
        }
    }
    let peak = rss_kib(&pid, "VmHWM:");
    drop(held);
    println!("tunnels {ok} {count} {:.2} {} {}", start.elapsed().as_secs_f64(), idle, peak);
}

fn rules(args: &[String]) {
    use ai_sandbox::policy::{self, Inputs};
    let nft = need(args, "--nft");
    let load = |n: usize| -> (f64, usize, usize) {
        let cfg: String =
            (0..n).map(|i| format!("allow = 10.{}.{}.{}:443\n", i >> 16, (i >> 8) & 255, i & 255)).collect();
        let (cfg, _) = ai_sandbox::policy::keys::read(&cfg);
        let p = policy::build("/bench".into(), &cfg, &Inputs::default()).unwrap();
        let rs = ai_sandbox::plan::ruleset::build(&p, p.gate_port).unwrap();
        let json = rs.to_json_string();
        let mut best = f64::MAX;
        for _ in 0..5 {
            let mut c = std::process::Command::new("unshare")
                .args(["-rn", &nft, "-j", "-f", "-"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let start = Instant::now();
            c.stdin.take().unwrap().write_all(json.as_bytes()).unwrap();
            assert!(c.wait().unwrap().success());
            best = best.min(start.elapsed().as_secs_f64() * 1e3);
        }
        // Filter rules must not grow with the entries; the rewrites of spliced destinations
        // (one per spliced port, at most splice::MAX, plus the source rewrite) are counted apart.
        let nat = rs.nat_output.len() + rs.nat_postrouting.len();
        (best, rs.rule_count() - nat, nat)
    };
    for n in [0, 10, 100, 1000, 10_000] {
        let (ms, filter, nat) = load(n);
        println!("rules {n} {ms:.1} {filter} {nat}");
    }
}

fn plain_relay(args: &[String]) {
    let target = need(args, "--target").parse().expect("--target IP:PORT");
    let relays = ai_sandbox::launch::relay::start(&[target]).expect("starting the relay");
    println!("{}", relays.ports[0]);
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::park();
    }
}

/// `walk DIR RUNS`: the guard's repository walk of DIR (as before and after every session),
/// and its whole check of a session that changed nothing (the record before, the verification
/// after: what a stop during the check interrupts), median ms of RUNS, beside a bare listing of
/// the same tree (read_dir only, no decisions).
fn walk(args: &[String]) {
    let dir = std::path::PathBuf::from(&args[1]);
    let runs: usize = args[2].parse().expect("RUNS");
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    fn bare(d: &std::path::Path) -> usize {
        let mut n = 0;
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            n += 1;
            if e.file_type().is_ok_and(|t| t.is_dir()) && e.file_name() != ".git" {
                n += bare(&e.path());
            }
        }
        n
    }
    let (mut scan, mut list, mut check, mut entries) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let store = tempfile::tempdir().expect("a temporary directory");
    for _ in 0..runs {
        let t = Instant::now();
        ai_sandbox::launch::guard::check_unchanged(&dir, store.path()).expect("check");
        check.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        entries = ai_sandbox::launch::guard::repos::scan(&dir).expect("walk").walked;
        scan.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        std::hint::black_box(bare(&dir));
        list.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!("walk {entries} {:.2} {:.2} {:.2}", med(scan), med(list), med(check));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1]),
        Some("relay") => relay(&args),
        Some("connect") => connect(&args),
        Some("tunnels") => tunnels(&args),
        Some("rules") => rules(&args),
        Some("cluster-policy") => cluster_policy(&args),
        Some("plain-relay") => plain_relay(&args),
        Some("walk") => walk(&args),
        Some("terminate") => terminate::run(&args),
        Some("h2") => h2::run(&args),
        Some("budget") => budget(&args),
        Some("push-check") => push_check(),
        _ => eprintln!("usage: see the module doc of examples/bench/main.rs"),
    }
}

/// The work a push limited by ref adds at the gate: the command list read and each ref matched
/// (`gate::push`), for a push of 1 ref and of 600 (past the 64 KiB the gate reads), median of 1,001.
fn push_check() {
    let patterns = vec!["refs/heads/agent/*".to_string(), "refs/tags/v*".to_string()];
    for refs in [1usize, 600] {
        let mut body = String::new();
        for i in 0..refs {
            let caps = if i == 0 { "\0report-status side-band-64k agent=git/2.39" } else { "" };
            let line = format!("{} {} refs/heads/agent/branch-{i}{caps}\n", "1".repeat(40), "2".repeat(40));
            body += &format!("{:04x}{line}", line.len() + 4);
        }
        body += "0000PACK";
        let mut us = Vec::new();
        for _ in 0..1001 {
            let t = Instant::now();
            let push = ai_sandbox::gate::push::commands(body.as_bytes()).unwrap().unwrap();
            assert!(ai_sandbox::gate::push::check(&push.cmds, &patterns).is_ok());
            us.push(t.elapsed().as_secs_f64() * 1e6);
        }
        us.sort_by(|a, b| a.total_cmp(b));
        println!("push-check {refs} {:.2}", us[us.len() / 2]);
    }
}
