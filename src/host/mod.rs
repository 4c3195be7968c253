//! The one boundary with the outside world: environment, files, processes, namespaces.
//!
//! The commands talk to the machine only through `Host`: `Os` (what the operating system gives
//! any program) and `Ports` (what ai-sandbox does to the machine for a sandbox). Tests drive the
//! whole pipeline with `FakeHost` (`fake`), which records every side effect as a typed `Effect`
//! and fails any kind a test names (and `--dry-run` is proven to ask for none). `RealHost` does
//! the real thing; launching a Plan lives in `launch`.

mod fake;
pub(crate) mod loopback;

pub use fake::{Effect, FakeHost, Kind};

use crate::error::hinted;
use crate::plan::protect::Protected;
use crate::plan::{Facts, Plan};
use crate::policy::Policy;
use anyhow::Result;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// What the operating system gives every command: the environment, files, the terminal,
/// randomness, programs on PATH. Nothing here knows what a sandbox is.
pub trait Os {
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
    /// `canonical` as a function a pure stage can be handed (`policy::Inputs::resolve`).
    fn resolver(&self) -> fn(&Path) -> PathBuf;
    /// `Ok(None)` when the file does not exist.
    fn read_file(&self, path: &Path) -> anyhow::Result<Option<String>>;
    /// Creates parent directories as needed.
    fn write_file(&mut self, path: &Path, text: &str) -> anyhow::Result<()>;
    fn which(&self, name: &str) -> Option<PathBuf>;
    fn current_exe(&self) -> anyhow::Result<PathBuf>;
    fn uid(&self) -> u32;
    /// This process's id (kept across exec(2): `ai-sandbox exec` records it as podman's).
    fn own_pid(&self) -> u32;
    fn stdio_is_tty(&self) -> bool;
    /// Whether a question can be asked: stdin is a terminal to answer on, and stderr one to show
    /// it (stdout may be a pipe: `ai-sandbox | tee log` still asks).
    fn can_ask(&self) -> bool;
    /// `n` random bytes as lowercase hex.
    fn random_hex(&mut self, n: usize) -> anyhow::Result<String>;
    fn print(&mut self, text: &str);
    fn eprint(&mut self, text: &str);
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
    /// Asks a yes/no question on the terminal; true only for an explicit yes.
    fn confirm(&mut self, question: &str) -> anyhow::Result<bool>;
    /// Bytes free to this user on the filesystem of `dir`, or of its nearest existing ancestor
    /// (None when none can be read).
    fn free_space(&self, dir: &Path) -> Option<u64>;
    /// The user's git identity: `user.name` and `user.email` of their git config (global, as git
    /// reads it for them), when both are set.
    fn git_identity(&self) -> Option<(String, String)>;
    /// A command name as the user's PATH finds it: where, its real path, and the interpreter its
    /// `#!` line names (resolved the same way).
    fn find_program(&self, name: &str) -> Option<crate::plan::agent::Found>;
    /// A secret's value from a file: it must be the user's own and closed to others (mode 0600
    /// or less); one trailing newline is dropped.
    fn read_secret_file(&self, path: &Path) -> anyhow::Result<String>;
    /// An exclusive lock on `path` (created if missing), held until the guard is dropped: two
    /// `ai-sandbox allow` at once both land in the config.
    fn lock(&mut self, path: &Path) -> anyhow::Result<Box<dyn std::any::Any>>;
}

/// Waits for what `Ports::stdin_from_image` started and says how it ended.
pub type ImageFeed = Box<dyn FnOnce() -> anyhow::Result<()>>;

/// What ai-sandbox does to the machine for a sandbox (the domain's ports): the gate, the relays,
/// the launch, the guard, live changes, the private store. Each is one operation the pure stages
/// planned; the real ones live in `launch`, `gate`, `live`, the fakes record them as `Effect`s.
pub trait Ports {
    /// Blocks, in this thread and every thread it starts from now on, the signals the launcher
    /// forwards to podman (`launch::forward_signals` waits for them): called before the first
    /// effect that starts a thread (the gate's lease watcher, the relays).
    fn block_forwarded_signals(&mut self) -> anyhow::Result<()>;
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
    /// Whether podman has `image` locally (`podman image exists`): ai-sandbox never pulls.
    fn image_present(&self, podman: &Path, image: &str) -> anyhow::Result<bool>;
    /// Makes this process's standard input `podman save IMAGE` (a pipe), for a launch that
    /// reads it (`image share`: the image goes into a sandbox through its stdin, never through a
    /// file in a directory the agent writes). The call returned waits for podman and says how it
    /// ended.
    fn stdin_from_image(&mut self, podman: &Path, image: &str) -> anyhow::Result<ImageFeed>;
    /// Executes a Plan (side effects); returns the exit code to pass through.
    fn launch(&mut self, plan: &Plan) -> anyhow::Result<i32>;
    /// Becomes `argv` (a `podman exec` into a running sandbox): its exit code and signals are
    /// the command's own. Returns only when it could not be started.
    fn exec(&mut self, argv: &[String]) -> anyhow::Result<i32>;
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
    /// The protected paths (relative to `project`) that exist now, as absolute paths to mount.
    fn protected_mounts(&self, project: &Path, rels: &[String]) -> Result<Protected>;
    /// Verifies the records of this project's earlier sessions whose check never finished
    /// (see `guard::settle_leftovers`), saying so on stderr.
    fn settle_leftovers(&mut self, state_dir: &Path) -> Result<()>;
    /// Writes a protected file of the project for the user (see `guard::write_trusted`).
    fn write_trusted(&mut self, state: &Path, project: &Path, rel: &Path, text: &str) -> Result<()>;
    /// This user's running sandboxes (their launcher alive), oldest first.
    fn running(&self, runtime: &Path) -> Vec<crate::live::Running>;
    /// The review-mode sessions of every project (`states`: ai-sandbox's projects state dir),
    /// running or waiting for review, oldest first.
    fn reviews(&self, states: &Path) -> Vec<crate::review::Waiting> {
        crate::review::all(states)
    }
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

/// Everything a command may ask of the machine: `Os` and `Ports` (commands take `&mut dyn Host`).
pub trait Host: Os + Ports {}

impl<T: Os + Ports> Host for T {}

/// `path` with its links resolved as far as it exists (the rest appended as given).
fn canonical_on_disk(path: &Path) -> PathBuf {
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

/// This process's umask, read where reading it changes nothing (`/proc/self/status`; 022 if
/// that cannot be read).
fn umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .unwrap_or(0o022)
}

#[derive(Default)]
pub struct RealHost {
    lease: Option<crate::gate::control::Lease>,
    relays: Option<crate::launch::relay::Relays>,
    canary: Option<std::net::TcpListener>,
}

impl Os for RealHost {
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
        crate::sys::runtime::owned_dir(path, self.uid())
    }
    fn canonical(&self, path: &Path) -> PathBuf {
        canonical_on_disk(path)
    }
    fn resolver(&self) -> fn(&Path) -> PathBuf {
        canonical_on_disk
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
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        // A new file renamed over the name: a link there (one a sandbox made) is replaced, never
        // written through, and a reader never sees half a file. Its mode is the file's it
        // replaces, or what a new file gets; set through the open file, never by name.
        use std::os::unix::fs::PermissionsExt;
        let mode = match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_file() => m.permissions().mode() & 0o7777,
            _ => 0o666 & !umask(),
        };
        let mut new =
            tempfile::NamedTempFile::new_in(dir).with_context(|| format!("writing in {}", dir.display()))?;
        std::io::Write::write_all(&mut new, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        new.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
        new.persist(path).with_context(|| format!("writing {}", path.display()))?;
        Ok(())
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
    fn own_pid(&self) -> u32 {
        std::process::id()
    }
    fn stdio_is_tty(&self) -> bool {
        std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
    }
    fn can_ask(&self) -> bool {
        std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
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
        // A review's upper layer and work dir hold what the overlay made as a subordinate id
        // (whiteouts, `work/work`): podman's user namespace removes those.
        let podman = self.which("podman").unwrap_or_else(|| PathBuf::from("podman"));
        crate::launch::remove_tree(dir, &podman)
    }
    fn loader(&self, exe: &Path) -> Option<PathBuf> {
        use std::io::Read;
        // The headers and the interpreter's path lie at the start of the file: the first 64 KiB
        // (reading this 12 MB program whole took ~5 ms of every launch); the whole file only when
        // they are not there.
        let mut head = Vec::new();
        std::fs::File::open(exe).ok()?.take(64 << 10).read_to_end(&mut head).ok()?;
        let interp = match elf_interpreter(&head) {
            Some(i) => i,
            None if head.len() == 64 << 10 => elf_interpreter(&std::fs::read(exe).ok()?)?,
            None => return None,
        };
        std::fs::canonicalize(interp).ok()
    }
    fn free_space(&self, dir: &Path) -> Option<u64> {
        // The directory may not exist yet (a first launch): its nearest ancestor's filesystem.
        let st = dir.ancestors().find_map(|d| nix::sys::statvfs::statvfs(d).ok())?;
        Some(st.blocks_available().saturating_mul(st.fragment_size()))
    }
    fn git_identity(&self) -> Option<(String, String)> {
        let get = |key: &str| {
            let out = std::process::Command::new("git")
                .args(["config", "--global", "--get", key])
                .stdin(std::process::Stdio::null())
                .output()
                .ok()?;
            let v = String::from_utf8(out.stdout).ok()?.trim().to_string();
            (out.status.success() && !v.is_empty()).then_some(v)
        };
        Some((get("user.name")?, get("user.email")?))
    }
    fn confirm(&mut self, question: &str) -> anyhow::Result<bool> {
        use std::io::Write;
        eprint!("{question}");
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        Ok(matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
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

impl Ports for RealHost {
    fn block_forwarded_signals(&mut self) -> anyhow::Result<()> {
        crate::launch::block_forwarded_signals()
    }
    fn register_gate(&mut self, policy: &Policy, facts: &Facts) -> anyhow::Result<(u16, Option<String>)> {
        use crate::gate::control;
        let req = control::Request::Register {
            session: facts.session_id.clone(),
            project: policy.project.display().to_string(),
            token: facts.token.clone(),
            policy: crate::contract::SessionPolicy::of(policy, Some(&facts.state_dir)),
            secrets: facts.bound.clone(),
            upstream_ca: facts.upstream_ca.clone(),
        };
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
    fn stdin_from_image(&mut self, podman: &Path, image: &str) -> anyhow::Result<ImageFeed> {
        let mut child = std::process::Command::new(podman)
            .args(["save", "--", image])
            .env("PODMAN_IGNORE_CGROUPSV1_WARNING", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| {
                hinted(format!("running {} save: {e}", podman.display()), "run `ai-sandbox doctor`")
            })?;
        let out = child.stdout.take().expect("piped");
        if let Err(e) = nix::unistd::dup2_stdin(&out) {
            anyhow::bail!("making podman save the input: {}", std::io::Error::from(e));
        }
        drop(out);
        let (podman, image) = (podman.display().to_string(), image.to_string());
        Ok(Box::new(move || {
            let status = child.wait()?;
            match status.success() {
                true => Ok(()),
                false => Err(hinted(
                    format!(
                        "{podman} save {image} failed ({status}; its error is above): nothing was shared"
                    ),
                    "check the name with `podman images`",
                )
                .into()),
            }
        }))
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
    fn exec(&mut self, argv: &[String]) -> anyhow::Result<i32> {
        use std::os::unix::process::CommandExt;
        // podman's warning on cgroup v1 hosts, every run, is nothing the user can act on here.
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        if std::env::var_os("PODMAN_IGNORE_CGROUPSV1_WARNING").is_none_or(|v| v.is_empty()) {
            cmd.env("PODMAN_IGNORE_CGROUPSV1_WARNING", "1");
        }
        let e = cmd.exec();
        Err(crate::error::hinted(format!("starting {}: {e}", argv[0]), "run `ai-sandbox doctor`").into())
    }
    fn launch(&mut self, plan: &Plan) -> anyhow::Result<i32> {
        crate::launch::run(&mut crate::launch::Real { podman: PathBuf::from(&plan.argv[0]) }, plan)
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

    #[test]
    fn a_file_written_replaces_a_link_at_its_name_and_keeps_the_mode_a_file_there_had() {
        use super::Os;
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let (name, target) = (t.path().join("config"), t.path().join("elsewhere"));
        std::os::unix::fs::symlink(&target, &name).unwrap();
        super::RealHost::default().write_file(&name, "allow = x\n").unwrap();
        assert!(!target.exists(), "written through the link");
        let meta = std::fs::symlink_metadata(&name).unwrap();
        assert!(meta.is_file(), "{meta:?}");
        // A new file's mode, as the kernel gives one made with 0666 under this umask.
        let plain = t.path().join("plain");
        std::fs::File::create(&plain).unwrap();
        let want = std::fs::metadata(&plain).unwrap().permissions().mode() & 0o7777;
        std::fs::remove_file(&plain).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, want);
        assert_eq!(std::fs::read_to_string(&name).unwrap(), "allow = x\n");
        // Control: an ordinary file is replaced with the new text, keeping its own mode.
        std::fs::set_permissions(&name, std::fs::Permissions::from_mode(0o600)).unwrap();
        super::RealHost::default().write_file(&name, "deny = y\n").unwrap();
        assert_eq!(std::fs::read_to_string(&name).unwrap(), "deny = y\n");
        assert_eq!(std::fs::metadata(&name).unwrap().permissions().mode() & 0o7777, 0o600);
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1, "no temporary file left");
    }
}
