//! Shared e2e machinery. The suite runs as root (CI's shell) and drops to an unprivileged
//! user (AISB_E2E_USER, default `aisb`, made by scripts/install-deps) for every ai-sandbox
//! and podman call, exactly like a user would run them. Root is used only for what a test
//! host needs: network namespaces with veth pairs, and looking into a container from outside.
//!
//! Nothing here skips: a missing prerequisite is a panic naming the fix.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub struct Env {
    pub user: String,
    pub uid: u32,
    pub home: PathBuf,
    /// A directory the test user can read: the binary, probe.py, fixtures, projects.
    pub root: PathBuf,
    pub bin: PathBuf,
    pub probe: PathBuf,
}

static ENV: OnceLock<Env> = OnceLock::new();
static COUNTER: AtomicUsize = AtomicUsize::new(0);
/// Test hosts, counted apart from projects: each takes one of 60 address blocks, and a name and
/// directories of its own, which must not come round again within a run (they did, once projects
/// and test hosts shared one counter past 60: a later test host found an earlier one's files).
static HOSTS: AtomicUsize = AtomicUsize::new(0);
/// The gate is one per user and shared by parallel tests; the test that kills it takes this
/// exclusively (`gate_alone`), and so does a test whose watcher answers held requests while
/// another such test could be asked. Every other test holds it shared from its first `Project`
/// on (`Project::new` takes it): no test has to remember to.
static GATE: std::sync::RwLock<()> = std::sync::RwLock::new(());

enum Held {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>),
}

thread_local! {
    /// This test's hold on `GATE`, released when its thread ends (each test runs on a thread of
    /// its own). Held once per thread: a second read of a RwLock with a writer waiting deadlocks.
    static HELD: std::cell::RefCell<Option<Held>> = const { std::cell::RefCell::new(None) };
}

/// Takes the shared gate for this test alone, until it ends. Before the test's first `Project`.
pub fn gate_alone() {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        assert!(
            h.is_none(),
            "gate_alone() comes before the test's first Project (which holds the gate shared)"
        );
        *h = Some(Held::Alone(GATE.write().unwrap_or_else(|e| e.into_inner())));
    });
}

/// Holds the shared gate shared for the rest of this test, unless it already holds it.
fn hold_gate() {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if h.is_none() {
            *h = Some(Held::Shared(GATE.read().unwrap_or_else(|e| e.into_inner())));
        }
    });
}

pub fn env() -> &'static Env {
    ENV.get_or_init(|| {
        assert!(
            nix::unistd::getuid().is_root(),
            "the e2e suite runs as root and drops to the test user for podman; run scripts/test"
        );
        let user = std::env::var("AISB_E2E_USER").unwrap_or_else(|_| "aisb".into());
        let pw = nix::unistd::User::from_name(&user)
            .unwrap()
            .unwrap_or_else(|| panic!("test user {user} does not exist: run scripts/install-deps"));
        let root = PathBuf::from(format!("/var/tmp/aisb-e2e-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::create_dir_all(root.join("projects")).unwrap();
        let bin = root.join("bin/ai-sandbox");
        std::fs::copy(env!("CARGO_BIN_EXE_ai-sandbox"), &bin).unwrap();
        let probe = root.join("bin/probe.py");
        std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/probe.py"), &probe).unwrap();
        let answer = root.join("bin/answer.py");
        std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/answer.py"), &answer).unwrap();
        let failing = root.join("bin/failing-nft");
        std::fs::write(
            &failing,
            "#!/bin/sh\necho 'failing-nft: refusing to load (test double)' >&2\nexit 3\n",
        )
        .unwrap();
        for p in [&root, &root.join("bin"), &root.join("projects"), &bin, &probe, &answer, &failing] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        clear_earlier_runs(&user);
        let run_dir = PathBuf::from(format!("/run/user/{}", pw.uid));
        if !run_dir.exists() {
            std::fs::create_dir_all(&run_dir).unwrap();
            std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
            nix::unistd::chown(&run_dir, Some(pw.uid), Some(pw.gid)).unwrap();
        }
        Env { user, uid: pw.uid.as_raw(), home: pw.dir, root, bin, probe }
    })
}

/// What an earlier run (finished, or killed mid-way) left that would make this one test the
/// wrong thing or fail: the test user's gates, and other runs' test hosts.
fn clear_earlier_runs(user: &str) {
    // A gate left by an earlier run serves this run's launchers unless stopped (it speaks
    // the same protocol), so a changed gate would go untested: found when a change to the
    // gate made no test fail until the old gate was gone.
    let _ = Command::new("pkill").args(["-KILL", "-u", user, "-f", "ai-sandbox gate serve"]).status();
    let gone = wait_for(10, || {
        !Command::new("pgrep").args(["-u", user, "-f", "ai-sandbox gate serve"]).status().unwrap().success()
    });
    assert!(gone, "a gate of {user} from an earlier run did not stop");
    // Test hosts of a run that was killed (their namespaces, servers and veths outlive it):
    // their veths hold the addresses this run's test hosts take, and the gate would reach
    // the dead ones (found: every CONNECT of the first test answered 502).
    let out = |args: &[&str]| {
        let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // (This run's own, made before this first call to `env`, are kept: see `TestHost::new`.)
    let tag = run_tag();
    for ns in out(&["ip", "netns", "list"]).lines().filter_map(|l| l.split_whitespace().next()) {
        if ns.starts_with(HOST_NS) && !ns.starts_with(&format!("{HOST_NS}{tag}-")) {
            for pid in out(&["ip", "netns", "pids", ns]).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
    for link in out(&["ip", "-o", "link", "show"]).lines().filter_map(|l| l.split(": ").nth(1)) {
        let name = link.split('@').next().unwrap_or(link);
        if name.starts_with(HOST_VETH) && !name.starts_with(&format!("{HOST_VETH}{tag}x")) {
            let _ = Command::new("ip").args(["link", "del", name]).status();
        }
    }
}

/// A project directory owned by the test user.
pub struct Project {
    pub dir: PathBuf,
}

impl Project {
    pub fn new(name: &str) -> Project {
        hold_gate();
        let e = env();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = e.root.join("projects").join(format!("{name}-{n}"));
        std::fs::create_dir_all(dir.join(".ai-sandbox")).unwrap();
        // The probe must be inside the project: nothing else of this host is mounted.
        std::fs::copy(&e.probe, dir.join("probe.py")).unwrap();
        for p in [&dir, &dir.join(".ai-sandbox"), &dir.join("probe.py")] {
            chown_user(p);
        }
        Project { dir }
    }
    /// Writes the config and approves it as the user would (`ai-sandbox trust`).
    pub fn config(&self, text: &str) -> &Self {
        self.config_unapproved(text);
        let r = user_command(&self.dir, &env().bin, &["trust"], &[]).output().unwrap();
        assert!(r.status.success(), "ai-sandbox trust failed: {}", String::from_utf8_lossy(&r.stderr));
        self
    }
    /// Writes the config without approving it (a cloned repository, an agent's edit).
    pub fn config_unapproved(&self, text: &str) -> &Self {
        let f = self.dir.join(".ai-sandbox/config");
        std::fs::write(&f, text).unwrap();
        chown_user(&f);
        self
    }
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }
}

pub fn chown_user(p: &Path) {
    let pw = nix::unistd::User::from_name(&env().user).unwrap().unwrap();
    nix::unistd::chown(p, Some(pw.uid), Some(pw.gid)).unwrap();
}

/// How many times longer than on this machine kind a command may take: `AISB_E2E_TIME_SCALE`,
/// default 1. The VM stages run the suite under QEMU's TCG, where a launch is 10-20x slower
/// (scripts/vm-jobs/matrix sets it; found: a nested container test ran past 240 s there).
pub fn time_scale() -> u64 {
    std::env::var("AISB_E2E_TIME_SCALE").ok().and_then(|v| v.parse().ok()).filter(|n| *n >= 1).unwrap_or(1)
}

/// `runuser -u USER -- env -i ... PROGRAM ARGS` in `dir`, with a clean user environment; killed
/// after 240 s (times `time_scale`).
pub fn user_command(dir: &Path, program: &Path, args: &[&str], vars: &[(&str, &str)]) -> Command {
    let e = env();
    let mut c = Command::new("timeout");
    let limit = (240 * time_scale()).to_string();
    c.args(["--kill-after=10", &limit, "runuser", "-u", &e.user, "--", "env", "-i"]);
    // This build's ai-sandbox first: commands from the docs call it by name.
    c.arg(format!("PATH={}:/usr/local/bin:/usr/bin:/bin:/usr/sbin", e.root.join("bin").display()));
    c.arg(format!("HOME={}", e.home.display()));
    c.arg(format!("USER={}", e.user));
    c.arg(format!("XDG_RUNTIME_DIR=/run/user/{}", e.uid));
    c.arg("PODMAN_IGNORE_CGROUPSV1_WARNING=1");
    for (k, v) in vars {
        c.arg(format!("{k}={v}"));
    }
    c.arg(program).args(args).current_dir(dir).stdin(Stdio::null());
    c
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Runs `c` to the end.
    pub fn of(mut c: Command) -> Run {
        Run::from(c.output().unwrap())
    }
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
    /// The result word the probe printed for `spec`.
    pub fn probe(&self, spec: &str) -> &str {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(spec).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| {
                panic!("no probe result for {spec}; stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
            })
    }
    pub fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "exit {}; stdout:\n{}\nstderr:\n{}", self.code, self.stdout, self.stderr);
        self
    }
}

/// Runs `ai-sandbox ARGS` as the test user in the project.
pub fn sandbox(p: &Project, args: &[&str], vars: &[(&str, &str)]) -> Run {
    Run::from(user_command(&p.dir, &env().bin, args, vars).output().unwrap())
}

/// What an `ai-sandbox` command run as the test user in `p` printed on stdout (`ps`, `gate logs`).
pub fn user_stdout(p: &Project, args: &[&str], vars: &[(&str, &str)]) -> String {
    let out = user_command(&p.dir, &env().bin, args, vars).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A sandbox running in the background. Its command must end when the project's `done` file
/// appears (see UNTIL_DONE); dropping this (also when a test panics) writes that file and
/// waits, so a failed test never leaves a sandbox behind.
pub struct Running {
    child: Option<Child>,
    done: PathBuf,
}

impl Running {
    pub fn wait_with_output(mut self) -> Output {
        self.child.take().unwrap().wait_with_output().unwrap()
    }
    /// Collects stderr as it comes, for what the launcher says while the sandbox runs (the
    /// Output of `wait_with_output` then has none).
    pub fn stderr_live(&mut self) -> Arc<std::sync::Mutex<String>> {
        collect(self.child.as_mut().unwrap().stderr.take().unwrap())
    }
    /// Collects stdout as it comes (the Output of `wait_with_output` then has none).
    pub fn stdout_live(&mut self) -> Arc<std::sync::Mutex<String>> {
        collect(self.child.as_mut().unwrap().stdout.take().unwrap())
    }
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().is_ok_and(|s| s.is_none())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = std::fs::write(&self.done, "");
            if !wait_for(30, || c.try_wait().is_ok_and(|s| s.is_some())) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

pub fn spawn_sandbox(p: &Project, args: &[&str]) -> Running {
    let child = user_command(&p.dir, &env().bin, args, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Running { child: Some(child), done: p.path("done") }
}

/// `spawn_sandbox` with variables for the launcher that must appear on no command line (the
/// harness's own `env -i K=V` would put them there): they go through a 0600 file that a
/// shell sources before it execs ai-sandbox.
pub fn spawn_sandbox_with_secret_env(p: &Project, args: &[&str], secret_vars: &[(&str, &str)]) -> Running {
    let file = p.dir.with_extension(format!("env-{}", COUNTER.fetch_add(1, Ordering::SeqCst)));
    let text: String = secret_vars.iter().map(|(k, v)| format!("{k}='{v}'\n")).collect();
    std::fs::write(&file, text).unwrap();
    chown_user(&file);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let script = format!("set -a; . '{}'; set +a; exec \"$0\" \"$@\"", file.display());
    let mut all = vec!["-c", script.as_str(), env().bin.to_str().unwrap()];
    all.extend_from_slice(args);
    let child = user_command(&p.dir, Path::new("/bin/sh"), &all, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Running { child: Some(child), done: p.path("done") }
}

/// `ai-sandbox watch` in the project, its input a pipe (keys), its output collected as it comes.
/// Waits for a sandbox run to end, then ends its watcher (`q`): the run's stdout, and the
/// stdout, stderr and what the watcher showed together (for assertion messages).
pub fn end_with_watch(
    run: Running,
    mut keys: std::process::ChildStdin,
    mut watch: Child,
    seen: &Arc<std::sync::Mutex<String>>,
) -> (String, String) {
    let out = run.wait_with_output();
    let _ = std::io::Write::write_all(&mut keys, b"q\n");
    drop(keys);
    let _ = watch.wait();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let all = format!("{stdout}\n{}\nwatch:\n{}", String::from_utf8_lossy(&out.stderr), seen.lock().unwrap());
    (stdout, all)
}

pub fn spawn_watch(p: &Project) -> (Child, Arc<std::sync::Mutex<String>>) {
    let mut w = user_command(&p.dir, &env().bin, &["watch"], &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = collect(w.stdout.take().unwrap());
    (w, seen)
}

/// Everything `r` yields, as it comes, in a string another thread can look at (the reader holds
/// the other reference until the end: `Arc::strong_count == 1` means all is there).
pub fn collect(mut r: impl Read + Send + 'static) -> Arc<std::sync::Mutex<String>> {
    let text = Arc::new(std::sync::Mutex::new(String::new()));
    let sink = text.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    text
}

/// Runs any program as the test user (podman ps, say).
pub fn as_user(program: &str, args: &[&str]) -> Run {
    let dir = env().home.clone();
    Run::from(user_command(&dir, Path::new(program), args, &[]).output().unwrap())
}

/// `-- python3 probe.py SPEC...` arguments for a sandbox run in the project.
pub fn probe_args<'a>(specs: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--", "/usr/bin/python3", "probe.py"];
    v.extend_from_slice(specs);
    v
}

/// A TCP server on the host's 127.0.0.1 that greets every connection (a stand-in for sshd,
/// postgres...). Counts connections.
pub struct Banner {
    pub port: u16,
    pub hits: Arc<AtomicUsize>,
}

impl Banner {
    pub fn start(greeting: &'static str) -> Banner {
        Self::start_on(0, greeting)
    }

    /// On a fixed port (the docs name real ports, e.g. 5432).
    pub fn start_on(port: u16, greeting: &'static str) -> Banner {
        let l = TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| panic!("127.0.0.1:{port}: {e}"));
        let port = l.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                h.fetch_add(1, Ordering::SeqCst);
                // A lingering close: what the client sent is read (and dropped) before the socket
                // closes. Closed with an unread request, the kernel answers with a reset, which
                // can overtake the greeting on its way through pasta (`direct=000`, "Recv
                // failure: Connection reset by peer", 1 in 15 runs of a newcomer test).
                std::thread::spawn(move || {
                    let _ = s.write_all(greeting.as_bytes());
                    let _ = s.shutdown(std::net::Shutdown::Write);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut sink = [0u8; 4096];
                    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
                });
            }
        });
        Banner { port, hits }
    }
}

/// A host in its own network namespace, reached over a veth pair from the root namespace:
/// TCP greeter and UDP echo on the same port, IPv4 and IPv6. Each instance has its own /30
/// (and /64) so tests can run in parallel. Removed on drop.
pub struct TestHost {
    pub ns: String,
    veth: String,
    /// The address of the host's side of the veth pair.
    host4: String,
    tls: Option<Child>,
    sshd: Option<Child>,
    pub v4: String,
    pub v6: String,
    pub port: u16,
    pub udp_hits: Arc<AtomicUsize>,
}

/// Test hosts' names: namespace `aisbe2e-TAG-N`, host-side veth `aisbhTAGxN` (TAG: `run_tag`),
/// by which `clear_earlier_runs` tells this run's from those an earlier run left.
pub(crate) const HOST_NS: &str = "aisbe2e-";
const HOST_VETH: &str = "aisbh";

/// This run's part of its test hosts' names (short: a veth's name has at most 15 bytes).
pub(crate) fn run_tag() -> u32 {
    std::process::id() % 10000
}

fn sh(args: &[&str]) {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// Reads one HTTP/1 request from `s`: its head, then a `Content-Length` body (bounded, with a
/// read timeout: a test host never hangs on a client).
fn read_request(s: &mut std::net::TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let (mut got, mut buf) = (Vec::new(), [0u8; 16 << 10]);
    let end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut buf) {
            Ok(n) if n > 0 && got.len() < 1 << 20 => got.extend_from_slice(&buf[..n]),
            _ => return,
        }
    };
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut left = len.min(64 << 20).saturating_sub(got.len() - end);
    while left > 0 {
        match s.read(&mut buf[..left.min(16 << 10)]) {
            Ok(n) if n > 0 => left -= n,
            _ => return,
        }
    }
}

impl TestHost {
    pub fn new() -> TestHost {
        let n = HOSTS.fetch_add(1, Ordering::SeqCst);
        assert!(n < 120, "more than 120 test hosts in one run: give TestHost more address blocks");
        let n = n + 1;
        // A /30 each, in documentation blocks: 60 in 198.51.100.0/24 (its top is cluster.rs's
        // and the bench's), then 60 in 203.0.113.0/24.
        let (net, k) = if n <= 60 { ("198.51.100", n) } else { ("203.0.113", n - 60) };
        let tag = run_tag();
        let ns = format!("{HOST_NS}{tag}-{n}");
        let (veth, peer) = (format!("{HOST_VETH}{tag}x{n}"), format!("aisbn{tag}x{n}"));
        let (h4, v4) = (format!("{net}.{}", 4 * k + 1), format!("{net}.{}", 4 * k + 2));
        let (h6, v6) = (format!("fd99:a15b:0:{n}::1"), format!("fd99:a15b:0:{n}::2"));
        sh(&["ip", "netns", "add", &ns]);
        sh(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer, "netns", &ns]);
        sh(&["ip", "addr", "add", &format!("{h4}/30"), "dev", &veth]);
        sh(&["ip", "-6", "addr", "add", &format!("{h6}/64"), "dev", &veth, "nodad"]);
        sh(&["ip", "link", "set", &veth, "up"]);
        sh(&["ip", "-n", &ns, "addr", "add", &format!("{v4}/30"), "dev", &peer]);
        sh(&["ip", "-n", &ns, "-6", "addr", "add", &format!("{v6}/64"), "dev", &peer, "nodad"]);
        sh(&["ip", "-n", &ns, "link", "set", &peer, "up"]);
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        let (tx, rx) = std::sync::mpsc::channel();
        let udp_hits = Arc::new(AtomicUsize::new(0));
        let hits = udp_hits.clone();
        let ns_path = format!("/run/netns/{ns}");
        std::thread::spawn(move || {
            // This thread lives in the test host's namespace; its sockets stay there.
            let f = std::fs::File::open(&ns_path).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let tcp = TcpListener::bind("[::]:0").unwrap();
            let port = tcp.local_addr().unwrap().port();
            let udp = UdpSocket::bind(format!("[::]:{port}")).unwrap();
            // HTTP on 80 and a TCP echo on 7000, for the gate's tests.
            let http = TcpListener::bind("[::]:80").unwrap();
            let echo = TcpListener::bind("[::]:7000").unwrap();
            tx.send(port).unwrap();
            std::thread::spawn(move || {
                for mut s in http.incoming().flatten() {
                    std::thread::spawn(move || {
                        // The whole request, its body too: closing with bytes unread resets the
                        // connection, and the client may see that instead of the answer.
                        read_request(&mut s);
                        let body = "TESTHOST-HTTP\n";
                        let _ = write!(s, "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                    });
                }
            });
            std::thread::spawn(move || {
                for s in echo.incoming().flatten() {
                    std::thread::spawn(move || {
                        let mut r = s.try_clone().unwrap();
                        let mut w = s;
                        let _ = std::io::copy(&mut r, &mut w);
                    });
                }
            });
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while let Ok((n, from)) = udp.recv_from(&mut buf) {
                    hits.fetch_add(1, Ordering::SeqCst);
                    let _ = udp.send_to(&buf[..n], from);
                }
            });
            for mut s in tcp.incoming().flatten() {
                let _ = s.write_all(b"TESTHOST\n");
            }
        });
        let port = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        TestHost { ns, veth, host4: h4, tls: None, sshd: None, v4, v6, port, udp_hits }
    }

    /// Adds a TLS server on 443 (self-signed, `openssl s_server -www`).
    pub fn with_tls(mut self) -> TestHost {
        let dir = env().root.join(format!("tls-{}", self.ns));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        sh(&[
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=allowed.test",
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ]);
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, "openssl", "s_server", "-quiet", "-accept", "443", "-www"])
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.tls = Some(child);
        assert!(self.listening(10, 443), "s_server did not start");
        self
    }
    /// Adds an sshd on port 22 (key auth for the test user with `authorized_key`; every login
    /// runs `echo ssh-through-the-gate-works`). Runs only inside this host's namespace.
    pub fn with_sshd(mut self, authorized_key: &Path) -> TestHost {
        let dir = env().root.join(format!("sshd-{}", self.ns));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all("/run/sshd").unwrap();
        let key = dir.join("host_ed25519");
        sh(&["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key.to_str().unwrap()]);
        let auth = dir.join("authorized_keys");
        std::fs::copy(authorized_key, &auth).unwrap();
        let cfg = dir.join("sshd_config");
        std::fs::write(
            &cfg,
            format!(
                "Port 22\nListenAddress 0.0.0.0\nHostKey {}\nPidFile none\nUsePAM yes\nStrictModes no\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
                 AuthorizedKeysFile {}\nAllowUsers {}\nForceCommand echo ssh-through-the-gate-works\n",
                key.display(),
                auth.display(),
                env().user
            ),
        )
        .unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, "/usr/sbin/sshd", "-D", "-e", "-f"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("sshd.log")).unwrap())
            .spawn()
            .unwrap();
        self.sshd = Some(child);
        assert!(self.listening(10, 22), "sshd did not start in the test namespace");
        self
    }
    /// Whether something listens on TCP `port` in this host's namespace within `secs`.
    fn listening(&self, secs: u64, port: u16) -> bool {
        let filter = format!("sport = :{port}");
        wait_for(secs, || {
            Command::new("ip")
                .args(["netns", "exec", &self.ns, "ss", "-ltnH", &filter])
                .output()
                .is_ok_and(|o| !o.stdout.is_empty())
        })
    }
    pub fn tcp4(&self) -> String {
        format!("tcp:{}:{}", self.v4, self.port)
    }
    pub fn tcp6(&self) -> String {
        format!("tcp:[{}]:{}", self.v6, self.port)
    }
    pub fn udp4(&self) -> String {
        format!("udp:{}:{}", self.v4, self.port)
    }
}

impl TestHost {
    /// Moves the host's side of the veth pair (with its address) into the network namespace
    /// `ns`: the test host is then on a link of that namespace instead of the machine's.
    pub fn link_into(&self, ns: &str) {
        sh(&["ip", "link", "set", &self.veth, "netns", ns]);
        sh(&["ip", "-n", ns, "addr", "add", &format!("{}/30", self.host4), "dev", &self.veth]);
        sh(&["ip", "-n", ns, "link", "set", &self.veth, "up"]);
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        for mut c in [self.tls.take(), self.sshd.take()].into_iter().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // (A veth moved into another namespace, `link_into`, is gone with that namespace.)
        let _ = Command::new("ip").args(["link", "del", &self.veth]).stderr(Stdio::null()).status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// Polls `f` until it returns true or `secs` pass (times `time_scale`: every bound a test waits
/// out is one for this machine kind; under QEMU's TCG a fixed 60 s for a sandbox to start ran
/// out on a loaded machine).
pub fn wait_for(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs * time_scale());
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

/// Containers of the test user that belong to `project` (by the label ai-sandbox sets).
pub fn containers_of(p: &Project) -> Vec<String> {
    let filter = format!("label=ai-sandbox.project={}", p.dir.display());
    let r = as_user("/usr/bin/podman", &["ps", "-a", "--filter", &filter, "--format", "{{.Names}} {{.Pid}}"]);
    assert_eq!(r.code, 0, "podman ps failed: {}", r.stderr);
    r.stdout.lines().map(str::to_string).collect()
}

/// Reads a connection's greeting from the host side.
pub fn greet(port: u16) -> Option<String> {
    let mut s =
        std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(3)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    Some(buf)
}

/// The gate's decision log of the test user, read the way a user reads it (`gate logs --json`).
pub fn gate_log() -> String {
    let r = as_user(env().bin.to_str().unwrap(), &["gate", "logs", "--json"]);
    assert_eq!(r.code, 0, "gate logs failed: {}", r.stderr);
    r.stdout
}

/// Shell tail for a long-running sandbox: wait until the test writes `done` (at most 60 s).
pub const UNTIL_DONE: &str = "for i in $(seq 600); do [ -e done ] && exit 0; sleep 0.1; done; exit 9";

/// Tells a sandbox started with UNTIL_DONE to finish, waits, requires success; its stdout.
pub fn finish(p: &Project, child: Running) -> String {
    std::fs::write(p.path("done"), "").unwrap();
    let out = child.wait_with_output();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The pid of the ai-sandbox launcher running in `p` (by its exe and working directory).
pub fn pid_of_launcher(p: &Project) -> Option<i32> {
    let bin = env().bin.clone();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let exe = std::fs::read_link(e.path().join("exe")).ok()?;
        let cwd = std::fs::read_link(e.path().join("cwd")).ok()?;
        (exe == bin && cwd == p.dir).then_some(pid)
    })
}

/// Every process's command line on this machine that contains one of `secrets` (any local user
/// can read them in /proc).
pub fn command_lines_containing(secrets: &[&str]) -> Vec<String> {
    procs_holding("cmdline", secrets)
        .into_iter()
        .map(|(proc, cmd)| {
            format!("{}: {}", proc.display(), String::from_utf8_lossy(&cmd).replace('\0', " "))
        })
        .collect()
}

/// Every process's `/proc/PID/FILE` (its `cmdline`, its `environ`) that contains one of
/// `secrets`, once for each secret it holds: the process's directory and the file's bytes.
pub fn procs_holding(file: &str, secrets: &[&str]) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(bytes) = std::fs::read(e.path().join(file)) else { continue };
        for s in secrets {
            if bytes.windows(s.len()).any(|w| w == s.as_bytes()) {
                found.push((e.path(), bytes.clone()));
            }
        }
    }
    found
}

/// The test user's session directories.
pub fn sessions_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/run/user/{}/ai-sandbox/sessions", env().uid))
}

/// `git -c user.name=dev -c user.email=… ARGS` as the test user in `dir`: the host's git, as a
/// prompt or an editor runs it there.
pub fn git_at(dir: &Path, args: &[&str]) -> Run {
    let mut all = vec!["-c", "user.name=dev", "-c", "user.email=dev@example.invalid"];
    all.extend_from_slice(args);
    Run::from(user_command(dir, Path::new("/usr/bin/git"), &all, &[]).output().unwrap())
}

/// A directory outside every project that anyone may write (what planted code would touch).
pub fn marker_dir(name: &str) -> PathBuf {
    let d = env().root.join(format!("markers-{name}"));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

fn run_ok(cmd: &mut Command) {
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// A CA made for one test, and a server certificate it signs for `names`, in `dir`: ca.pem,
/// ca.key, leaf.pem, leaf.key (openssl, P-256, valid one day).
pub fn test_ca(dir: &Path, names: &[&str]) {
    let f = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    run_ok(Command::new("openssl").args(["req", "-x509"]).args(ec).args([
        "-days",
        "1",
        "-subj",
        "/CN=ai-sandbox e2e CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
        "-keyout",
        &f("ca.key"),
        "-out",
        &f("ca.pem"),
    ]));
    run_ok(Command::new("openssl").arg("req").args(ec).args([
        "-subj",
        &format!("/CN={}", names[0]),
        "-keyout",
        &f("leaf.key"),
        "-out",
        &f("leaf.csr"),
    ]));
    let sans: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
    std::fs::write(
        dir.join("ext"),
        format!(
            "subjectAltName={}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
            sans.join(",")
        ),
    )
    .unwrap();
    run_ok(Command::new("openssl").args(["x509", "-req", "-days", "1", "-CAcreateserial"]).args([
        "-in",
        &f("leaf.csr"),
        "-CA",
        &f("ca.pem"),
        "-CAkey",
        &f("ca.key"),
        "-extfile",
        &f("ext"),
        "-out",
        &f("leaf.pem"),
    ]));
}

/// `python3 tests/e2e/SCRIPT` with `args` in the network namespace `ns`, `vars` in its
/// environment and its stderr in DIR/server.err; returns once it listens on 443.
pub fn python_on_443(ns: &str, dir: &Path, script: &str, args: &[&OsStr], vars: &[(&str, &OsStr)]) -> Child {
    interpreter_on_443("python3", ns, dir, script, args, vars)
}

/// The gRPC test tools' Python (scripts/install-test-tools: grpcio, pinned).
pub const GRPC_PYTHON: &str = "/opt/aisb-grpc/bin/python";

/// `python_on_443` with another interpreter (a venv's: `GRPC_PYTHON`).
pub fn interpreter_on_443(
    python: &str,
    ns: &str,
    dir: &Path,
    script: &str,
    args: &[&OsStr],
    vars: &[(&str, &OsStr)],
) -> Child {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, python])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e").join(script))
        .args(args)
        .envs(vars.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("server.err")).unwrap());
    let server = cmd.spawn().unwrap();
    let up = wait_for(20, || {
        Command::new("ip")
            .args(["netns", "exec", ns, "ss", "-ltnH", "sport = :443"])
            .output()
            .is_ok_and(|o| !o.stdout.is_empty())
    });
    assert!(up, "{script} did not start: {}", std::fs::read_to_string(dir.join("server.err")).unwrap());
    server
}

/// A JSON-lines file (a test server's request log), one value per line.
pub fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A runtime dir of the test user's own (AISB_RUNTIME_DIR): a gate and sessions apart from the
/// shared ones.
pub fn private_runtime(name: &str) -> String {
    let rt = env().root.join(name);
    std::fs::create_dir_all(&rt).unwrap();
    std::fs::set_permissions(&rt, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    chown_user(&rt);
    rt.display().to_string()
}

/// The pid of the gate `ai-sandbox gate status` reports with these variables.
pub fn gate_pid_of(p: &Project, vars: &[(&str, &str)]) -> Option<i64> {
    let r = user_command(&p.dir, &env().bin, &["gate", "status", "--json"], vars).output().unwrap();
    serde_json::from_slice::<serde_json::Value>(&r.stdout).unwrap_or_default()["pid"].as_i64()
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
pub fn exited(pid: i32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}
