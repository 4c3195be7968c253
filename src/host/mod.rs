//! The one boundary with the outside world: environment, files, processes, namespaces.
//!
//! `app` talks to the machine only through `Host`, so tests drive the whole pipeline with
//! `FakeHost`, which records every side effect it is asked for (and `--dry-run` is proven to
//! ask for none). `RealHost` does the real thing; launching a Plan lives in `launch`.

pub(crate) mod loopback;

use crate::error::hinted;
use crate::plan::protect::Protected;
use crate::plan::{Facts, Plan};
use crate::policy::Policy;
use anyhow::Result;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

pub trait Host {
    fn env(&self, key: &str) -> Option<String>;
    /// Set, but not UTF-8 (`env` says None for it): said as such, never taken for unset.
    fn env_not_text(&self, _key: &str) -> bool {
        false
    }
    fn cwd(&self) -> anyhow::Result<PathBuf>;
    fn exists(&self, path: &Path) -> bool;
    /// Whether `path` is a directory (not a link) owned by this user.
    fn owned_dir(&self, path: &Path) -> bool;
    /// `path` with its links resolved as far as it exists (the rest appended as given).
    fn canonical(&self, path: &Path) -> PathBuf;
    /// `Ok(None)` when the file does not exist.
    fn read_file(&self, path: &Path) -> anyhow::Result<Option<String>>;
    /// Creates parent directories as needed.
    fn write_file(&mut self, path: &Path, text: &str) -> anyhow::Result<()>;
    fn which(&self, name: &str) -> Option<PathBuf>;
    fn current_exe(&self) -> anyhow::Result<PathBuf>;
    fn uid(&self) -> u32;
    fn stdio_is_tty(&self) -> bool;
    /// `n` random bytes as lowercase hex.
    fn random_hex(&mut self, n: usize) -> anyhow::Result<String>;
    fn print(&mut self, text: &str);
    fn eprint(&mut self, text: &str);
    /// Registers the session with the user's gate (starting one if needed) for the life of
    /// this process; returns the gate's port.
    fn register_gate(&mut self, policy: &Policy, facts: &Facts) -> anyhow::Result<(u16, Option<String>)>;
    /// Binds a relay on the host's loopback for each of `targets` and serves them for the life
    /// of this process (see `relay`); returns their ports, in order.
    fn start_relays(&mut self, targets: &[std::net::SocketAddrV4]) -> anyhow::Result<Vec<u16>>;
    /// Binds a listener on the host's 127.0.0.1 at a free port that `allowed` says no rule
    /// allows, held for the life of this process (the self-check's canary); None when every
    /// port tried is allowed.
    fn bind_canary(&mut self, allowed: &dyn Fn(u16) -> bool) -> anyhow::Result<Option<u16>>;
    /// Sends `ask` to the host's 127.0.0.1:`port` and returns what came back within a short
    /// time (empty when nothing listens or nothing answers).
    fn probe_loopback(&mut self, port: u16, ask: &[u8]) -> Vec<u8>;
    /// The dynamic loader this program runs with (its ELF interpreter, resolved), which the
    /// self-check hook runs it through inside any image; None for a static program.
    fn loader(&self, exe: &Path) -> Option<PathBuf>;
    /// Whether the host's 127.0.0.1:`port` is taken (for `--publish`): None when free, else who
    /// has it, as far as this user can see.
    fn port_taken(&self, port: u16) -> Option<String>;
    /// Whether `path` is a file this user may execute (None: nothing there).
    fn executable(&self, path: &Path) -> Option<bool>;
    /// Whether `path` is a directory (links followed).
    fn is_dir(&self, path: &Path) -> bool;
    /// The entries of a directory (none when it does not exist).
    fn list_dir(&self, dir: &Path) -> anyhow::Result<Vec<PathBuf>>;
    /// Removes a directory and everything below it.
    fn remove_tree(&mut self, dir: &Path) -> anyhow::Result<()>;
    /// Whether podman has `image` locally (`podman image exists`): ai-sandbox never pulls.
    fn image_present(&self, podman: &Path, image: &str) -> anyhow::Result<bool>;
    /// Executes a Plan (side effects); returns the exit code to pass through.
    fn launch(&mut self, plan: &Plan) -> anyhow::Result<i32>;
    /// Asks a yes/no question on the terminal; true only for an explicit yes.
    fn confirm(&mut self, question: &str) -> anyhow::Result<bool>;
    /// A command name as the user's PATH finds it: where, its real path, and the interpreter its
    /// `#!` line names (resolved the same way).
    fn find_program(&self, name: &str) -> Option<crate::plan::agent::Found>;
    /// Copies a file of the user's into `store` at `rel`, readable only by the user (0600,
    /// directories 0700): credentials; with `fields`, only those of its JSON object (see
    /// `launch::logins`). Nothing in the store is followed: a link at `rel` is replaced, a
    /// linked directory on the way refused.
    fn copy_private(
        &mut self,
        from: &Path,
        store: &Path,
        rel: &Path,
        fields: Option<&[&str]>,
    ) -> anyhow::Result<()>;
    /// A secret's value from a file: it must be the user's own and closed to others (mode 0600
    /// or less); one trailing newline is dropped.
    fn read_secret_file(&self, path: &Path) -> anyhow::Result<String>;
    /// The protected paths (relative to `project`) that exist now, as absolute paths to mount.
    fn protected_mounts(&self, project: &Path, rels: &[String]) -> Result<Protected>;
    /// Verifies the records of this project's earlier sessions whose check never finished
    /// (see `guard::settle_leftovers`), saying so on stderr.
    fn settle_leftovers(&mut self, state_dir: &Path) -> Result<()>;
    /// An exclusive lock on `path` (created if missing), held until the guard is dropped: two
    /// `ai-sandbox allow` at once both land in the config.
    fn lock(&mut self, path: &Path) -> anyhow::Result<Box<dyn std::any::Any>>;
    /// Writes a protected file of the project for the user (see `guard::write_trusted`).
    fn write_trusted(&mut self, state: &Path, project: &Path, rel: &Path, text: &str) -> Result<()>;
    /// This user's running sandboxes (their launcher alive), oldest first.
    fn running(&self, runtime: &Path) -> Vec<crate::live::Running>;
    /// The gate's sessions with their counters (none when no gate runs).
    fn gate_sessions(&self, runtime: &Path) -> Vec<crate::gate::control::SessionStatus>;
    /// The port the running gate listens on (none when no gate runs).
    fn gate_port(&self, runtime: &Path) -> Option<u16>;
    /// The live records (see `live`) of `project`'s running sandboxes (their launcher alive).
    fn live_sessions(&self, runtime: &Path, project: &Path) -> Vec<PathBuf>;
    /// Adds `change` to one running sandbox, at both layers, under its record's lock: the
    /// nftables sets in its network namespace (entered from outside, as the hook does), then
    /// the gate's session policy; on a failure of the second the first is put back.
    fn live_allow(
        &mut self,
        runtime: &Path,
        record: &Path,
        change: &crate::live::Change,
    ) -> anyhow::Result<()>;
}

#[derive(Default)]
pub struct RealHost {
    lease: Option<crate::gate::control::Lease>,
    relays: Option<crate::launch::relay::Relays>,
    canary: Option<std::net::TcpListener>,
}

impl Host for RealHost {
    fn env(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
    fn env_not_text(&self, key: &str) -> bool {
        matches!(std::env::var(key), Err(std::env::VarError::NotUnicode(_)))
    }
    fn cwd(&self) -> anyhow::Result<PathBuf> {
        Ok(std::env::current_dir()?)
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn owned_dir(&self, path: &Path) -> bool {
        crate::gate::control::owned_dir(path, self.uid())
    }
    fn canonical(&self, path: &Path) -> PathBuf {
        let mut rest = Vec::new();
        let mut at = path;
        loop {
            if let Ok(real) = at.canonicalize() {
                return rest.iter().rev().fold(real, |p, c| p.join(c));
            }
            match (at.parent(), at.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    at = parent;
                }
                _ => return path.to_path_buf(),
            }
        }
    }
    fn read_file(&self, path: &Path) -> anyhow::Result<Option<String>> {
        // Never blocks: a fifo (or socket, device) where a file is expected is an error, not a
        // read that waits for a writer.
        let read = || -> std::io::Result<Vec<u8>> {
            use std::io::Read;
            use std::os::unix::fs::OpenOptionsExt;
            let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
            if !f.metadata()?.is_file() {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file"));
            }
            let mut out = Vec::new();
            f.take(64 << 20).read_to_end(&mut out)?;
            Ok(out)
        };
        match read() {
            Ok(b) => Ok(Some(String::from_utf8(b).map_err(|_| {
                hinted(format!("{}: not valid UTF-8", path.display()), "save the file as UTF-8")
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match std::fs::read_link(path) {
                // A dangling symbolic link is not "no file": say where it points.
                Ok(target) => Err(hinted(
                    format!(
                        "{} is a symbolic link to {}, which does not exist",
                        path.display(),
                        target.display()
                    ),
                    "fix or remove the link",
                )
                .into()),
                Err(_) => Ok(None),
            },
            Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        }
    }
    fn write_file(&mut self, path: &Path, text: &str) -> anyhow::Result<()> {
        use anyhow::Context;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }
    fn which(&self, name: &str) -> Option<PathBuf> {
        // sbin is often missing from a user's PATH, and nft lives there.
        let path = format!("{}:/usr/local/sbin:/usr/sbin:/sbin", std::env::var("PATH").unwrap_or_default());
        which::which_in(name, Some(path), "/").ok()
    }
    fn current_exe(&self) -> anyhow::Result<PathBuf> {
        Ok(std::env::current_exe()?.canonicalize()?)
    }
    fn uid(&self) -> u32 {
        nix::unistd::getuid().as_raw()
    }
    fn stdio_is_tty(&self) -> bool {
        std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
    }
    fn random_hex(&mut self, n: usize) -> anyhow::Result<String> {
        let mut buf = vec![0u8; n];
        getrandom::fill(&mut buf).map_err(|e| anyhow::anyhow!("the system's random source failed: {e}"))?;
        Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
    }
    fn print(&mut self, text: &str) {
        print!("{text}");
    }
    fn eprint(&mut self, text: &str) {
        eprint!("{text}");
    }
    fn register_gate(&mut self, policy: &Policy, facts: &Facts) -> anyhow::Result<(u16, Option<String>)> {
        use crate::gate::control;
        let req = control::Request::Register {
            session: facts.session_id.clone(),
            project: policy.project.display().to_string(),
            token: facts.token.clone(),
            policy: crate::contract::SessionPolicy::of(policy),
            secrets: facts.bound.clone(),
            upstream_ca: facts.upstream_ca.clone(),
        };
        crate::launch::block_forwarded_signals()?;
        let mut lease = control::register(&facts.runtime_dir, &facts.self_exe, policy.gate_port, &req)?;
        lease.watch(|| {
            eprintln!(
                "\nai-sandbox: the egress gate stopped; this sandbox has no egress now (fail closed: its port \
                 stays held by this launcher, which refuses every request). Restart the sandbox to start a new gate."
            )
        })?;
        let (port, ca) = (lease.port, lease.ca.take());
        self.lease = Some(lease);
        Ok((port, ca))
    }
    fn start_relays(&mut self, targets: &[std::net::SocketAddrV4]) -> anyhow::Result<Vec<u16>> {
        // The relays' thread must not take the signals the launcher forwards to podman.
        crate::launch::block_forwarded_signals()?;
        let relays = crate::launch::relay::start(targets)?;
        let ports = relays.ports.clone();
        self.relays = Some(relays);
        Ok(ports)
    }
    fn bind_canary(&mut self, allowed: &dyn Fn(u16) -> bool) -> anyhow::Result<Option<u16>> {
        use anyhow::Context;
        // Never accepted from: a connection the rules let through completes in the backlog.
        for _ in 0..64 {
            let l =
                std::net::TcpListener::bind(("127.0.0.1", 0)).context("binding the self-check's listener")?;
            let port = l.local_addr()?.port();
            if !allowed(port) {
                self.canary = Some(l);
                return Ok(Some(port));
            }
        }
        Ok(None)
    }
    fn probe_loopback(&mut self, port: u16, ask: &[u8]) -> Vec<u8> {
        use std::io::{Read, Write};
        let t = std::time::Duration::from_millis(300);
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), t) else {
            return Vec::new();
        };
        let _ = s.set_read_timeout(Some(t));
        let _ = s.write_all(ask);
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        buf[..n].to_vec()
    }
    fn port_taken(&self, port: u16) -> Option<String> {
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Some(listener_of(port)),
            _ => None,
        }
    }
    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }
    fn executable(&self, path: &Path) -> Option<bool> {
        let meta = std::fs::metadata(path).ok()?;
        Some(meta.is_file() && nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok())
    }
    fn list_dir(&self, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
        match std::fs::read_dir(dir) {
            Ok(rd) => Ok(rd.flatten().map(|e| e.path()).collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(anyhow::anyhow!("reading {}: {e}", dir.display())),
        }
    }
    fn remove_tree(&mut self, dir: &Path) -> anyhow::Result<()> {
        // A sandbox HOME can hold read-only directories (Go's module cache, say).
        // What podman's runtime made there belongs to another id: chmod's complaint is not the
        // user's business (the removal's own error is, and is returned).
        let _ = std::process::Command::new("chmod")
            .args(["-R", "u+w", "--"])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status();
        std::fs::remove_dir_all(dir).map_err(|e| anyhow::anyhow!("removing {}: {e}", dir.display()))
    }
    fn loader(&self, exe: &Path) -> Option<PathBuf> {
        let bytes = std::fs::read(exe).ok()?;
        std::fs::canonicalize(elf_interpreter(&bytes)?).ok()
    }
    fn image_present(&self, podman: &Path, image: &str) -> anyhow::Result<bool> {
        let out = std::process::Command::new(podman)
            .args(["image", "exists", "--", image])
            .env("PODMAN_IGNORE_CGROUPSV1_WARNING", "1")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| {
                hinted(format!("running {} image exists: {e}", podman.display()), "run `ai-sandbox doctor`")
            })?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(hinted(
                format!(
                    "{} image exists {image} failed ({}): {}",
                    podman.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim_end()
                ),
                "run `ai-sandbox doctor`",
            )
            .into()),
        }
    }
    fn launch(&mut self, plan: &Plan) -> anyhow::Result<i32> {
        crate::launch::run(&mut crate::launch::Real { podman: PathBuf::from(&plan.argv[0]) }, plan)
    }
    fn confirm(&mut self, question: &str) -> anyhow::Result<bool> {
        use std::io::Write;
        eprint!("{question}");
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        Ok(matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
    }
    fn protected_mounts(&self, project: &Path, rels: &[String]) -> Result<Protected> {
        crate::launch::guard::existing_mounts(project, rels)
    }
    fn settle_leftovers(&mut self, state_dir: &Path) -> Result<()> {
        crate::launch::guard::settle_leftovers(state_dir, &mut std::io::stderr())
    }
    fn live_sessions(&self, runtime: &Path, project: &Path) -> Vec<PathBuf> {
        crate::live::apply::sessions(runtime, project)
    }
    fn lock(&mut self, path: &Path) -> anyhow::Result<Box<dyn std::any::Any>> {
        use anyhow::Context;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        let lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .with_context(|| format!("locking {}", path.display()))?;
        Ok(Box::new(lock))
    }
    fn running(&self, runtime: &Path) -> Vec<crate::live::Running> {
        crate::live::apply::running(runtime)
    }
    fn gate_port(&self, runtime: &Path) -> Option<u16> {
        match crate::gate::control::call(runtime, &crate::gate::control::Request::Status) {
            Ok(Some(r)) => Some(r.as_status().port),
            _ => None,
        }
    }
    fn gate_sessions(&self, runtime: &Path) -> Vec<crate::gate::control::SessionStatus> {
        match crate::gate::control::call(runtime, &crate::gate::control::Request::Status) {
            Ok(Some(r)) => r.as_status().sessions,
            _ => Vec::new(),
        }
    }
    fn write_trusted(&mut self, state_dir: &Path, project: &Path, rel: &Path, text: &str) -> Result<()> {
        crate::launch::guard::write_trusted(state_dir, project, rel, text)
    }
    fn live_allow(
        &mut self,
        runtime: &Path,
        record: &Path,
        change: &crate::live::Change,
    ) -> anyhow::Result<()> {
        crate::live::apply::allow(runtime, record, change)
    }
    fn copy_private(
        &mut self,
        from: &Path,
        store: &Path,
        rel: &Path,
        fields: Option<&[&str]>,
    ) -> anyhow::Result<()> {
        use anyhow::Context;
        // The user's own file (a dotfile manager's link is the user's choice), but only a
        // regular file, and not without bound.
        let meta = std::fs::metadata(from).with_context(|| format!("reading {}", from.display()))?;
        if !meta.is_file() || meta.len() > 16 << 20 {
            anyhow::bail!("{} is not a regular file of at most 16 MiB; nothing was copied", from.display());
        }
        let bytes = std::fs::read(from).with_context(|| format!("reading {}", from.display()))?;
        let Some(bytes) = crate::launch::logins::login_part(&bytes, fields) else {
            anyhow::bail!(
                "{} holds no login (none of {}); nothing was copied",
                from.display(),
                fields.unwrap_or_default().join(", ")
            );
        };
        crate::launch::logins::write_private(store, rel, &bytes)
    }
    fn find_program(&self, name: &str) -> Option<crate::plan::agent::Found> {
        use std::io::Read;
        let resolve = |n: &str| {
            let path = which::which(n).ok()?;
            let target = path.canonicalize().ok()?;
            Some((path, target))
        };
        let (path, target) = resolve(name)?;
        let mut head = [0u8; 256];
        let n = std::fs::File::open(&target).and_then(|mut f| f.read(&mut head)).unwrap_or(0);
        let first = String::from_utf8_lossy(&head[..n]).lines().next().unwrap_or("").to_string();
        let interpreter = first.strip_prefix("#!").and_then(|line| {
            let mut words = line.split_whitespace();
            let prog = words.next()?;
            // `#!/usr/bin/env [-S] NAME`: NAME from PATH, as env would find it.
            let named = if prog.ends_with("/env") { words.find(|w| !w.starts_with('-')) } else { None };
            match named {
                Some(n) => resolve(n),
                None => Some((PathBuf::from(prog), Path::new(prog).canonicalize().ok()?)),
            }
        });
        Some(crate::plan::agent::Found { path, target, interpreter })
    }
    fn read_secret_file(&self, path: &Path) -> anyhow::Result<String> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)
            .map_err(|e| anyhow::anyhow!("reading the secret file {}: {e}", path.display()))?;
        if meta.uid() != self.uid() || meta.mode() & 0o077 != 0 {
            return Err(hinted(
                format!(
                    "the secret file {} is readable by others (mode {:o}) or not yours",
                    path.display(),
                    meta.mode() & 0o777
                ),
                format!("chmod 600 {}", path.display()),
            )
            .into());
        }
        let text = std::fs::read_to_string(path)?;
        Ok(text.strip_suffix('\n').unwrap_or(&text).to_string())
    }
}

/// Who listens on TCP `port` (from /proc/net/tcp{,6} and this user's processes' sockets).
fn listener_of(port: u16) -> String {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit(':').next()?;
            (u16::from_str_radix(local_port, 16).ok()? == port && *f.get(3)? == "0A")
                .then(|| f.get(9).map(|s| s.to_string()))?
        })
        .collect();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        for fd in std::fs::read_dir(e.path().join("fd")).into_iter().flatten().flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else { continue };
            let link = link.to_string_lossy();
            if inodes.iter().any(|i| link == format!("socket:[{i}]")) {
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                return format!("by pid {pid} ({})", comm.trim());
            }
        }
    }
    "by a process of another user".to_string()
}

/// The `PT_INTERP` path of a 64-bit little-endian ELF program (None for anything else).
pub(crate) fn elf_interpreter(elf: &[u8]) -> Option<PathBuf> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| usize::try_from(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?)).ok();
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(0x20)?, usize::from(u16_at(0x36)?), usize::from(u16_at(0x38)?));
    (0..phnum).map(|i| phoff + i * phentsize).find(|&h| u32_at(h) == Some(3)).and_then(|h| {
        let (off, len) = (u64_at(h + 8)?, u64_at(h + 32)?);
        let raw = elf.get(off..off.checked_add(len)?)?;
        let path = raw.split(|b| *b == 0).next()?;
        Some(PathBuf::from(std::str::from_utf8(path).ok()?))
    })
}

/// A host for tests: answers from fixed data and records what it was asked to do.
#[derive(Debug, Default)]
pub struct FakeHost {
    pub vars: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub files: Vec<(PathBuf, String)>,
    pub uid: u32,
    pub tty: bool,
    pub stdout: String,
    pub stderr: String,
    /// Every side effect requested, in order.
    pub effects: Vec<String>,
    pub exit_code: i32,
    /// Replies of host loopback services, by port.
    pub loopback: Vec<(u16, Vec<u8>)>,
    /// Answers to `confirm`, in order (none left: no).
    pub answers: Vec<bool>,
    /// Programs on PATH that are not in /usr/bin (every other name is).
    pub programs: Vec<(String, crate::plan::agent::Found)>,
    /// Live records of running sandboxes (`live_sessions` returns them all).
    pub live: Vec<PathBuf>,
    /// What `running` returns.
    pub running: Vec<crate::live::Running>,
    /// Images podman does not have (every other name is present).
    pub missing_images: Vec<String>,
    /// The plans it was asked to launch.
    pub launched: Vec<Plan>,
    /// Host loopback ports something else listens on.
    pub taken_ports: Vec<u16>,
    /// Variables set to a value that is not UTF-8 (`env` says None for them).
    pub not_text: Vec<String>,
    /// The port of a running gate (`gate_port`), none by default.
    pub gate_listening: Option<u16>,
}

impl FakeHost {
    /// A program on PATH at `path` (its own target, no interpreter).
    pub fn install(&mut self, name: &str, path: &str) {
        let p = PathBuf::from(path);
        self.programs
            .push((name.into(), crate::plan::agent::Found { path: p.clone(), target: p, interpreter: None }));
    }
}

impl Host for FakeHost {
    fn env_not_text(&self, key: &str) -> bool {
        self.not_text.iter().any(|k| k == key)
    }
    fn env(&self, key: &str) -> Option<String> {
        self.vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }
    fn cwd(&self) -> anyhow::Result<PathBuf> {
        Ok(self.cwd.clone())
    }
    fn exists(&self, path: &Path) -> bool {
        self.files.iter().any(|(p, _)| p.starts_with(path))
            || ["/usr", "/etc", "/opt"].iter().any(|d| path == Path::new(d))
    }
    fn read_file(&self, path: &Path) -> anyhow::Result<Option<String>> {
        Ok(self.files.iter().find(|(p, _)| p == path).map(|(_, t)| t.clone()))
    }
    fn write_file(&mut self, path: &Path, text: &str) -> anyhow::Result<()> {
        self.effects.push(format!("write {}", path.display()));
        self.files.retain(|(p, _)| p != path);
        self.files.push((path.to_path_buf(), text.to_string()));
        Ok(())
    }
    fn canonical(&self, path: &Path) -> PathBuf {
        path.to_path_buf()
    }
    fn owned_dir(&self, path: &Path) -> bool {
        // The runtime dirs the fake's variables name are this user's.
        self.vars.iter().any(|(k, v)| k == "XDG_RUNTIME_DIR" && Path::new(v) == path)
    }
    fn which(&self, name: &str) -> Option<PathBuf> {
        Some(PathBuf::from(match name {
            "nft" => "/usr/sbin/nft".to_string(),
            n => format!("/usr/bin/{n}"),
        }))
    }
    fn current_exe(&self) -> anyhow::Result<PathBuf> {
        Ok(PathBuf::from("/usr/local/bin/ai-sandbox"))
    }
    fn uid(&self) -> u32 {
        self.uid
    }
    fn stdio_is_tty(&self) -> bool {
        self.tty
    }
    fn random_hex(&mut self, n: usize) -> anyhow::Result<String> {
        Ok("ab".repeat(n))
    }
    fn print(&mut self, text: &str) {
        self.stdout += text;
    }
    fn eprint(&mut self, text: &str) {
        self.stderr += text;
    }
    fn live_sessions(&self, _runtime: &Path, _project: &Path) -> Vec<PathBuf> {
        self.live.clone()
    }
    fn executable(&self, path: &Path) -> Option<bool> {
        if self.is_dir(path) {
            return Some(false);
        }
        self.files.iter().find(|(p, _)| p == path).map(|(_, text)| text.starts_with("#!"))
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.files.iter().any(|(p, _)| p != path && p.starts_with(path))
    }
    fn port_taken(&self, port: u16) -> Option<String> {
        self.taken_ports.contains(&port).then(|| "by pid 4242 (python3)".to_string())
    }
    fn list_dir(&self, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
        let mut out: Vec<PathBuf> = self
            .files
            .iter()
            .filter_map(|(p, _)| p.strip_prefix(dir).ok()?.components().next().map(|c| dir.join(c)))
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }
    fn remove_tree(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.effects.push(format!("remove {}", dir.display()));
        self.files.retain(|(p, _)| !p.starts_with(dir));
        Ok(())
    }
    fn loader(&self, _exe: &Path) -> Option<PathBuf> {
        Some(PathBuf::from("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"))
    }
    fn image_present(&self, _podman: &Path, image: &str) -> anyhow::Result<bool> {
        Ok(!self.missing_images.iter().any(|m| m == image))
    }
    fn lock(&mut self, path: &Path) -> anyhow::Result<Box<dyn std::any::Any>> {
        self.effects.push(format!("lock {}", path.display()));
        Ok(Box::new(()))
    }
    fn running(&self, _runtime: &Path) -> Vec<crate::live::Running> {
        self.running.clone()
    }
    fn gate_sessions(&self, _runtime: &Path) -> Vec<crate::gate::control::SessionStatus> {
        Vec::new()
    }
    fn gate_port(&self, _runtime: &Path) -> Option<u16> {
        self.gate_listening
    }
    fn write_trusted(&mut self, _: &Path, project: &Path, rel: &Path, text: &str) -> Result<()> {
        self.write_file(&project.join(rel), text)
    }
    fn live_allow(
        &mut self,
        _runtime: &Path,
        record: &Path,
        change: &crate::live::Change,
    ) -> anyhow::Result<()> {
        self.effects.push(format!("live allow {} in {}", change.summary(), record.display()));
        Ok(())
    }
    fn register_gate(&mut self, policy: &Policy, facts: &Facts) -> anyhow::Result<(u16, Option<String>)> {
        self.effects.push(format!("register gate from port {}", policy.gate_port));
        let ca = (!facts.bound.is_empty()).then(|| "-----BEGIN CERTIFICATE-----\nFAKE\n".to_string());
        Ok((policy.gate_port + 1, ca))
    }
    fn start_relays(&mut self, targets: &[std::net::SocketAddrV4]) -> anyhow::Result<Vec<u16>> {
        let ports: Vec<u16> = (40000..).take(targets.len()).collect();
        for (to, port) in targets.iter().zip(&ports) {
            self.effects.push(format!("relay 127.0.0.1:{port} to {to}"));
        }
        Ok(ports)
    }
    fn bind_canary(&mut self, allowed: &dyn Fn(u16) -> bool) -> anyhow::Result<Option<u16>> {
        let port = (45000..45064).find(|p| !allowed(*p));
        self.effects.push(format!("canary 127.0.0.1:{}", port.map_or("-".into(), |p| p.to_string())));
        Ok(port)
    }
    fn probe_loopback(&mut self, port: u16, _ask: &[u8]) -> Vec<u8> {
        self.effects.push(format!("probe 127.0.0.1:{port}"));
        self.loopback.iter().find(|(p, _)| *p == port).map(|(_, r)| r.clone()).unwrap_or_default()
    }
    fn launch(&mut self, plan: &Plan) -> anyhow::Result<i32> {
        self.effects.push(format!("launch {}", plan.argv.join(" ")));
        self.launched.push(plan.clone());
        Ok(self.exit_code)
    }
    fn confirm(&mut self, question: &str) -> anyhow::Result<bool> {
        self.stderr += question;
        Ok(if self.answers.is_empty() { false } else { self.answers.remove(0) })
    }
    fn copy_private(
        &mut self,
        from: &Path,
        store: &Path,
        rel: &Path,
        fields: Option<&[&str]>,
    ) -> anyhow::Result<()> {
        let to = store.join(rel);
        let text = self.read_file(from)?.ok_or_else(|| anyhow::anyhow!("{} not found", from.display()))?;
        let text = crate::launch::logins::login_part(text.as_bytes(), fields)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .ok_or_else(|| anyhow::anyhow!("{} holds no login", from.display()))?;
        self.effects.push(format!("copy {} -> {}", from.display(), to.display()));
        self.files.push((to.to_path_buf(), text));
        Ok(())
    }
    fn find_program(&self, name: &str) -> Option<crate::plan::agent::Found> {
        if let Some((_, f)) = self.programs.iter().find(|(n, _)| n == name) {
            return Some(f.clone());
        }
        if name.starts_with("nosuch") {
            return None;
        }
        let p = PathBuf::from(format!("/usr/bin/{name}"));
        Some(crate::plan::agent::Found { path: p.clone(), target: p, interpreter: None })
    }
    fn read_secret_file(&self, path: &Path) -> anyhow::Result<String> {
        self.files
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, t)| t.trim_end_matches('\n').to_string())
            .ok_or_else(|| anyhow::anyhow!("reading the secret file {}: not found", path.display()))
    }
    fn protected_mounts(&self, project: &Path, rels: &[String]) -> Result<Protected> {
        let mounts = rels
            .iter()
            .map(|r| project.join(r))
            .filter(|p| self.files.iter().any(|(f, _)| f.starts_with(p)))
            .collect();
        Ok(crate::plan::protect::Protected { mounts, ..Default::default() })
    }
    fn settle_leftovers(&mut self, _state_dir: &Path) -> Result<()> {
        // A fake holds no guard records: nothing to settle, so no effect (the e2e suite proves
        // the real one runs before the config is read).
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_loader_of_this_test_program_is_read_from_its_elf_header() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let interp = super::elf_interpreter(&me).expect("a dynamically linked test binary");
        assert!(interp.is_absolute() && interp.to_string_lossy().contains("ld-linux"), "{interp:?}");
        assert_eq!(super::elf_interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(super::elf_interpreter(&me[..64]), None, "a truncated header is no answer");
    }
}
