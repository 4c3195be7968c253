//! Runs a Plan: writes the session files (the root directory among them) and the sandbox HOME,
//! runs podman as a child, forwards signals, passes the exit code through, and tears down.
//!
//! Leftovers are impossible or swept: podman gets SIGTERM if ai-sandbox dies (PR_SET_PDEATHSIG),
//! so a killed launcher still stops its container (`--rm` removes it, and pasta with it); if
//! podman dies too (SIGKILL to the whole process group), the session's keeper — a process in a
//! session of its own, see `keeper` — removes the container; a session directory orphaned by
//! SIGKILL is removed by the keeper or the next launch (its owner pid is dead).
//! The project directory is only ever mounted, never created, deleted or chowned here.

pub mod engine;
pub mod guard;
pub mod hook;
pub mod keeper;
pub(crate) mod logins;
pub(crate) mod refusals;
pub mod relay;
pub(crate) mod review;
#[cfg(test)]
mod tests;

use crate::contract::keeper::Message;
use crate::plan::{GuardSpec, Plan};
use crate::sys::process::{self, Tie};
use anyhow::{Context, bail};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::unistd::Pid;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt, symlink};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Makes a session's root directory (see `plan::root`): the skeleton's directories and links,
/// and the parents of the mount targets that lie in it, all the user's own.
pub(crate) fn make_root(sk: &crate::plan::root::Skeleton) -> anyhow::Result<()> {
    use crate::plan::root::{DIRS, LINKS};
    let mk =
        |rel: &Path| {
            fs::DirBuilder::new().recursive(true).mode(0o755).create(sk.dir.join(rel)).with_context(|| {
                format!("creating the sandbox's root directory {}", sk.dir.join(rel).display())
            })
        };
    mk(Path::new(""))?;
    for d in DIRS.iter().map(Path::new).chain(sk.parents.iter().map(PathBuf::as_path)) {
        mk(d)?;
    }
    for (link, target) in LINKS {
        let at = sk.dir.join(link);
        symlink(target, &at).with_context(|| format!("linking {}", at.display()))?;
    }
    Ok(())
}

/// Removes a session directory. What podman's runtime made in it (the last component of a mount
/// target, a mount target of the user's own `-v` two levels deep) belongs to the container's
/// root user, which the user cannot always remove: then inside podman's user namespace, where
/// that user is root.
pub(crate) fn remove_tree(dir: &Path, podman: &Path) -> anyhow::Result<()> {
    let Err(first) = fs::remove_dir_all(dir) else { return Ok(()) };
    if !dir.exists() {
        return Ok(());
    }
    let unshared = Command::new(podman)
        .args(["unshare", "rm", "-rf", "--one-file-system", "--"])
        .arg(dir)
        .env("PODMAN_IGNORE_CGROUPSV1_WARNING", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    match unshared {
        Ok(o) if o.status.success() && !dir.exists() => Ok(()),
        Ok(o) => bail!(
            "removing {}: {first}; `podman unshare rm -rf` too: {}",
            dir.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => {
            bail!("removing {}: {first}; running {}: {e}", dir.display(), podman.display())
        }
    }
}

/// Removes session directories whose launcher is gone (killed with SIGKILL, say). A dir with
/// no pid in its pid file yet may belong to a launch that is starting right now (the file is
/// made empty, then written: two launches at once met in that window, and one removed the
/// other's session dir): left alone for a minute.
fn sweep_sessions(sessions: &Path, podman: &Path) {
    let Ok(entries) = fs::read_dir(sessions) else {
        return;
    };
    for e in entries.flatten() {
        let pid = fs::read_to_string(e.path().join("pid")).ok().and_then(|p| p.trim().parse::<i32>().ok());
        let stale = match pid {
            Some(p) => !process::alive(p),
            None => e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() > 60)),
        };
        if stale {
            let _ = remove_tree(&e.path(), podman);
        }
    }
}

fn write_session(plan: &Plan) -> anyhow::Result<()> {
    let dir = &plan.session_dir;
    if let Some(sessions) = dir.parent() {
        if let Some(runtime) = sessions.parent() {
            crate::sys::runtime::private_dir(runtime)?;
        }
        crate::sys::runtime::private_dir(sessions)?;
        sweep_sessions(sessions, Path::new(&plan.argv[0]));
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating session dir {}", dir.display()))?;
    // Made by this call: removed again if a file in it cannot be written.
    write_session_files(plan).inspect_err(|_| {
        let _ = remove_tree(dir, Path::new(&plan.argv[0]));
    })
}

fn write_session_files(plan: &Plan) -> anyhow::Result<()> {
    let dir = &plan.session_dir;
    let write = |path: &Path, text: &str| {
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    };
    write(&dir.join(crate::plan::session::PID_FILE), &std::process::id().to_string())?;
    if let Some(root) = &plan.rootfs {
        make_root(root)?;
    }
    if let Some((path, text)) = &plan.env_file {
        use std::io::Write;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
        f.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    }
    write(&plan.live.0, &plan.live.1)?;
    for (path, text) in &plan.trust_files {
        write(path, text)?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o644))?;
    }
    for e in &plan.engine_files {
        if let Some(dir) = e.path.parent().filter(|d| !d.exists()) {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        write(&e.path, &e.text)?;
        fs::set_permissions(&e.path, fs::Permissions::from_mode(e.mode))?;
    }
    if let Some((path, text)) = &plan.ssh_config {
        write(path, text)?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o644))?;
    }
    if let (Some(rs), Some(hook)) = (&plan.ruleset, &plan.hook) {
        write(&hook.ruleset_file, &rs.to_json_string())?;
        fs::create_dir(&hook.hooks_dir).with_context(|| format!("creating {}", hook.hooks_dir.display()))?;
        write(&hook.hook_file, &hook.hook_json)?;
        if let Some(c) = &hook.check {
            write(&c.file, &c.json)?;
            symlink(&c.target, &c.exe).with_context(|| format!("linking {}", c.exe.display()))?;
        }
        if let Some(canary) = &plan.canary {
            write(&dir.join(crate::plan::session::CANARY_FILE), canary)?;
        }
    }
    Ok(())
}

/// Set once podman has exited: from then on a signal ends the launcher instead of going to a
/// podman that is gone (see `forward_signals`).
static PODMAN_ENDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The podman that runs now (0: none yet, between the two tries of `run_podman`, or exited),
/// and whether a signal came to be forwarded (a launch asked to stop is not tried again). One
/// lock: the signal thread sends to the pid while holding it, and the pid is cleared under it
/// before podman is reaped, so a signal never reaches a pid that another process has taken.
static PODMAN: std::sync::Mutex<(u32, bool)> = std::sync::Mutex::new((0, false));

fn podman_state() -> std::sync::MutexGuard<'static, (u32, bool)> {
    PODMAN.lock().unwrap_or_else(|e| e.into_inner())
}
/// Set once the launch is over (the project verified, the session dir removed): a signal then
/// ends the process as it would any program, with nothing to warn about (`learn` asks its
/// questions after this).
static LAUNCH_DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Forwards signals sent to ai-sandbox (by `kill`, a supervisor) to podman, which relays them
/// to the container. Terminal-generated ones (Ctrl-C) already reach podman through the
/// foreground process group, so they are not sent twice. A command may ignore SIGINT: the
/// second one says the third will stop the sandbox, and the third kills the container.
fn forward_signals(set: SigSet, podman: String, container: String) {
    std::thread::spawn(move || {
        let mut interrupts = 0;
        loop {
            let Some((sig, from_kernel)) = process::wait_for_signal(&set) else { continue };
            if LAUNCH_DONE.load(std::sync::atomic::Ordering::SeqCst) {
                if let Some(words) = process::take_last_words() {
                    // (On a terminal `say` starts a line of its own; else after the open question.)
                    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                        eprintln!();
                    }
                    say(&words);
                }
                std::process::exit(128 + sig as i32);
            }
            if PODMAN_ENDED.load(std::sync::atomic::Ordering::SeqCst) {
                // The sandbox is gone and the guard is checking the project: stop now, whatever
                // it is doing. Its record stays, and the next launch here verifies it first.
                say(&format!(
                    "stopped by {sig} while checking the project's protected files: the project is NOT yet verified; \
                     the next `ai-sandbox` in it verifies it before anything starts"
                ));
                std::process::exit(128 + sig as i32);
            }
            podman_state().1 = true;
            if sig == Signal::SIGINT {
                interrupts += 1;
                match interrupts {
                    2 => {
                        say("interrupted twice; once more stops the sandbox (the command may be ignoring it)")
                    }
                    3 => {
                        say("stopping the sandbox");
                        let _ = Command::new(&podman)
                            .args(["kill", "--signal", "KILL", &container])
                            .env("PODMAN_IGNORE_CGROUPSV1_WARNING", "1")
                            .stdin(std::process::Stdio::null())
                            .stdout(std::process::Stdio::null())
                            .stderr(std::process::Stdio::null())
                            .status();
                        continue;
                    }
                    _ => {}
                }
            }
            let state = podman_state();
            if from_kernel || state.0 == 0 {
                continue;
            }
            let _ = kill(Pid::from_raw(state.0 as i32), sig);
        }
    });
}

/// What a launch does to the machine, one typed call each, in the order `run` decides. The
/// real calls are `Real` below; the unit tests drive `run` with a recording fake that can make
/// any call fail, so the order and what each failure leaves behind are tested without podman.
pub(crate) trait Machine {
    /// A directory of the user's own, mode 0700 (the sandbox HOME).
    fn private_dir(&mut self, dir: &Path) -> anyhow::Result<()>;
    /// Carries the logins into the sandbox HOME (after taking back what an unfinished session
    /// refreshed); notices to say.
    fn give_logins(&mut self, l: &crate::plan::Logins) -> anyhow::Result<Vec<String>>;
    /// Carries refreshed logins back to the store; notices to say.
    fn take_logins(&mut self, l: &crate::plan::Logins) -> anyhow::Result<Vec<String>>;
    /// The session directory and its files (pid, env file, live record, hook, ruleset); on
    /// failure, what it made is removed again.
    fn write_session(&mut self, plan: &Plan) -> anyhow::Result<()>;
    /// Verifies earlier sessions whose launcher and keeper both died.
    fn settle_leftovers(&mut self, guard: &GuardSpec) -> anyhow::Result<()>;
    /// Records the protected paths and the repositories before the session; what it had to
    /// change first, in words (a protected file with another name made a file of its own).
    fn snapshot(&mut self, guard: &GuardSpec, container: &str) -> anyhow::Result<Vec<String>>;
    /// Review mode: the session's upper layer and record, just before podman.
    fn open_review(&mut self, r: &crate::plan::ReviewSpec) -> anyhow::Result<()>;
    /// Review mode, after podman: what to say (waiting for review, or nothing changed).
    fn close_review(&mut self, r: &crate::plan::ReviewSpec) -> anyhow::Result<Vec<String>>;
    /// Starts the session's keeper; its pipe, which only this process holds.
    fn start_keeper(&mut self, plan: &Plan) -> anyhow::Result<Box<dyn std::io::Write>>;
    /// Runs podman to the end; its exit status (128+N for a signal).
    fn run_podman(&mut self, plan: &Plan, keeper: &mut dyn std::io::Write) -> anyhow::Result<i32>;
    /// Verifies (and restores) the protected paths after the session.
    fn settle(&mut self, guard: &GuardSpec) -> anyhow::Result<()>;
    fn remove_session_dir(&mut self, dir: &Path) -> anyhow::Result<()>;
    /// A warning to the user (the launch goes on).
    fn warn(&mut self, line: &str);
}

/// Runs a plan: prepare, record, keeper, podman, then always settle and clean up once the
/// session directory exists. An error before podman starts leaves nothing behind but the
/// files that outlive sessions (the HOME); every error is returned once.
pub(crate) fn run(m: &mut dyn Machine, plan: &Plan) -> anyhow::Result<i32> {
    m.private_dir(&plan.sandbox_home)?;
    if let Some(l) = &plan.logins {
        for notice in m.give_logins(l)? {
            m.warn(&notice);
        }
    }
    // A failed write removes what it made of the session dir itself: only it knows whether the
    // dir is its own (the runtime dir may have failed its privacy check).
    m.write_session(plan)?;
    crate::sys::timing::mark("sandbox HOME, logins, session files, root");
    let g = &plan.guard;
    // Earlier sessions of this project whose launcher and keeper both died: verify them first,
    // or this session's record would take their changes for the originals.
    let recorded = m.settle_leftovers(g).and_then(|()| {
        m.snapshot(g, &plan.container).context("recording the protected paths before the session")
    });
    match recorded {
        Ok(notices) => notices.iter().for_each(|n| m.warn(n)),
        Err(e) => {
            let _ = m.remove_session_dir(&plan.session_dir);
            return Err(e);
        }
    }
    crate::sys::timing::mark("guard's record (the project walked)");
    if let Some(r) = &plan.review
        && let Err(e) = m.open_review(r)
    {
        let _ = m.remove_session_dir(&plan.session_dir);
        return Err(e.context("preparing the review layer; nothing was started"));
    }
    let result = m.start_keeper(plan).and_then(|mut keeper| m.run_podman(plan, &mut *keeper));
    // A login refreshed inside is the next project's (a failure is said: the store keeps the
    // older one, and the next launch here tries again).
    if let Some(l) = &plan.logins {
        match m.take_logins(l) {
            Ok(notices) => notices.iter().for_each(|n| m.warn(n)),
            Err(e) => m.warn(&format!("warning: {e:#}; the next launch in this project tries again")),
        }
    }
    // Whatever happened inside, the paths the host trusts are as they were.
    let settled = m.settle(g);
    if let Some(r) = &plan.review {
        match m.close_review(r) {
            Ok(lines) => lines.iter().for_each(|l| m.warn(l)),
            Err(e) => m.warn(&format!("warning: {e:#}; `ai-sandbox diff` lists the session's review")),
        }
    }
    crate::sys::timing::mark("logins back, guard's verification");
    let cleanup = m.remove_session_dir(&plan.session_dir);
    crate::sys::timing::mark("session dir removed");
    if settled.is_ok() {
        LAUNCH_DONE.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    if let Err(e) = settled {
        return Err(e.context(format!(
            "the protected paths could not be verified or restored; the record is kept in {} and the next launch retries",
            g.store.display()
        )));
    }
    match (result, cleanup) {
        (Ok(code), Ok(())) => Ok(code),
        (Ok(code), Err(e)) => {
            m.warn(&format!("warning: {e:#}"));
            Ok(code)
        }
        (Err(e), _) => Err(e),
    }
}

/// The machine itself.
pub(crate) struct Real {
    /// podman, for what only its user namespace can remove (see `remove_session_tree`).
    pub(crate) podman: PathBuf,
}

impl Machine for Real {
    fn private_dir(&mut self, dir: &Path) -> anyhow::Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))
    }
    fn give_logins(&mut self, l: &crate::plan::Logins) -> anyhow::Result<Vec<String>> {
        // A session whose launcher was killed never carried its refresh back: first that.
        let mut notices = logins::take(l).unwrap_or_else(|e| vec![format!("warning: {e:#}")]);
        notices.extend(logins::give(l)?);
        Ok(notices)
    }
    fn take_logins(&mut self, l: &crate::plan::Logins) -> anyhow::Result<Vec<String>> {
        logins::take(l)
    }
    fn write_session(&mut self, plan: &Plan) -> anyhow::Result<()> {
        write_session(plan)
    }
    fn settle_leftovers(&mut self, g: &GuardSpec) -> anyhow::Result<()> {
        crate::launch::guard::settle_leftovers(&g.state_dir, &mut std::io::stderr())
    }
    fn snapshot(&mut self, g: &GuardSpec, container: &str) -> anyhow::Result<Vec<String>> {
        let m = crate::launch::guard::snapshot(
            &g.project,
            &g.paths,
            &g.protected,
            &g.store,
            container,
            g.review,
        )?;
        Ok(m.separated
            .iter()
            .map(|p| {
                format!(
                    "{} had another name in the project or elsewhere (a hard link), which the sandbox could write where this path is read-only: it is now a file of its own (same content and mode; the other names keep theirs)",
                    crate::sys::quote::path(&g.project.join(p))
                )
            })
            .collect())
    }
    fn open_review(&mut self, r: &crate::plan::ReviewSpec) -> anyhow::Result<()> {
        review::open(r)
    }
    fn close_review(&mut self, r: &crate::plan::ReviewSpec) -> anyhow::Result<Vec<String>> {
        review::close(r, &self.podman)
    }
    fn start_keeper(&mut self, plan: &Plan) -> anyhow::Result<Box<dyn std::io::Write>> {
        Ok(Box::new(spawn_keeper(plan)?))
    }
    fn run_podman(&mut self, plan: &Plan, keeper: &mut dyn std::io::Write) -> anyhow::Result<i32> {
        run_podman(plan, keeper)
    }
    fn settle(&mut self, g: &GuardSpec) -> anyhow::Result<()> {
        crate::launch::guard::settle(&g.store, &g.state_dir, &mut std::io::stderr(), true)
    }
    fn remove_session_dir(&mut self, dir: &Path) -> anyhow::Result<()> {
        remove_tree(dir, Path::new(&self.podman))
    }
    fn warn(&mut self, line: &str) {
        eprintln!("ai-sandbox: {line}");
    }
}

/// The signals forwarded to podman. Blocked in the launcher before it starts any thread
/// (threads inherit the mask), so none of them can take the default action and kill the
/// launcher instead of reaching the container.
fn forwarded_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT] {
        set.add(s);
    }
    set
}

pub(crate) fn block_forwarded_signals() -> anyhow::Result<()> {
    forwarded_signals().thread_block().context("blocking signals")
}

/// Starts the session's keeper (see `keeper`): detached in a session of its own, its stdin a
/// pipe that only this process holds, so it learns of the launcher's death by EOF.
fn spawn_keeper(plan: &Plan) -> anyhow::Result<std::process::ChildStdin> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&plan.keeper_log)
        .with_context(|| format!("opening the keeper's log {}", plan.keeper_log.display()))?;
    let mut cmd = Command::new(&plan.self_exe);
    cmd.arg("keeper")
        .arg("--session-dir")
        .arg(&plan.session_dir)
        .arg("--guard")
        .arg(&plan.guard.store)
        .arg("--name")
        .arg(&plan.container)
        .arg("--podman")
        .arg(&plan.argv[0])
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    let mut child = process::spawn(&mut cmd, Tie::Detached)
        .with_context(|| format!("starting the keeper ({})", plan.self_exe.display()))?;
    let stdin = child.stdin.take().context("the keeper's stdin")?;
    process::reap_later(child);
    Ok(stdin)
}

/// One line to the user on the launcher's stderr, which is the sandbox's terminal too: with a
/// terminal, a full-screen agent may have it in raw mode, where only `\r\n` starts a line.
fn say(line: &str) {
    use std::io::{IsTerminal, Write};
    // Hosts, methods and paths in these lines are the sandbox's words: escaped, never raw.
    let line = crate::sys::quote::text(line);
    let mut err = std::io::stderr().lock();
    let _ = if err.is_terminal() {
        write!(err, "\r\nai-sandbox: {line}\r\n")
    } else {
        writeln!(err, "ai-sandbox: {line}")
    };
}

/// Follows this session's refusals (see `refusals`): the gate's decision log from its end at
/// launch, polled every 100 ms, and the rules' records of refused direct connections, read from
/// the sandbox every 500 ms, until the sandbox ends, and once more after: the container's
/// namespaces are held open from the moment it starts (`live_apply::Held`), so what its rules
/// refused in its last moments, or in a command that ended at once, is read too.
struct Refusals {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<crate::launch::refusals::Tally>,
}

impl Refusals {
    fn follow(w: &crate::plan::RefusalWatch) -> Refusals {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, mut tally, w) = (
            stop.clone(),
            crate::launch::refusals::Tally::new(&w.session).with_containers(w.containers),
            w.clone(),
        );
        let mut log = w
            .gate_runtime
            .as_ref()
            .and_then(|rt| crate::gate::log::Follow::open_at_end(&crate::gate::control::log_path(rt)).ok());
        let thread = std::thread::spawn(move || {
            let mut held: Option<crate::live::apply::Held> = None;
            for tick in 0u64.. {
                // Read the stop flag first: after it is set, one more pass takes what the gate
                // wrote before the sandbox ended.
                let last = flag.load(Ordering::SeqCst);
                while let Some(Ok(Some(line))) = log.as_mut().map(crate::gate::log::Follow::next_line) {
                    if let Ok(e) = serde_json::from_str(&line)
                        && let Some(notice) = tally.observe(&e)
                    {
                        say(&notice);
                    }
                }
                if held.is_none() {
                    held = crate::live::apply::Held::open(&w.session_dir);
                }
                // Every half second while it runs, and once more at the end through the held
                // namespaces (the container is gone by then; a quick command's refusals too).
                if let Some(h) = held.as_ref().filter(|_| tick % 5 == 0 || last) {
                    let now = crate::gate::log::now();
                    let mut new = Vec::new();
                    for d in crate::live::apply::refused_held(&w.session_dir, h).unwrap_or_default() {
                        if let Some(notice) = tally.observe_direct(&d, &now, &w.config_path) {
                            say(&notice);
                            new.push(d);
                        }
                    }
                    // To the gate's log and watchers, so `logs` has them after this sandbox is
                    // gone and `watch` shows them now. A gate that cannot take them (one of an
                    // older version) leaves them to this launcher's notices.
                    if let Some(runtime) = w.gate_runtime.as_ref().filter(|_| !new.is_empty()) {
                        let req = crate::contract::control::Request::Refused {
                            session: w.session.clone(),
                            refused: new,
                        };
                        let _ = crate::gate::control::call(runtime, &req);
                    }
                }
                if last {
                    break;
                }
                // Parked, not asleep: `finish` wakes it at once, so the launcher's exit does not
                // wait out the rest of a 100 ms poll (measured: ~50 ms of start-up-to-exit).
                // Every 10 ms until the container's namespaces are held: a command may end soon
                // after it starts.
                let wait = if held.is_none() { 10 } else { 100 };
                std::thread::park_timeout(std::time::Duration::from_millis(wait));
            }
            tally
        });
        Refusals { stop, thread }
    }

    /// Stops following and returns the summary lines.
    fn finish(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.thread().unpark();
        self.thread.join().map(|t| t.summary()).unwrap_or_default()
    }
}

fn run_podman(plan: &Plan, keeper: &mut dyn std::io::Write) -> anyhow::Result<i32> {
    let set = forwarded_signals();
    // Block before spawning so no signal is lost; the child unblocks its own mask.
    block_forwarded_signals()?;
    let mut cmd = Command::new(&plan.argv[0]);
    cmd.args(&plan.argv[1..]);
    // Podman 5 warns on every run about cgroup v1 hosts; the user can do nothing about it here.
    if std::env::var_os("PODMAN_IGNORE_CGROUPSV1_WARNING").is_none() {
        cmd.env("PODMAN_IGNORE_CGROUPSV1_WARNING", "1");
    }
    // From the log's end before the sandbox exists: nothing of this session is missed.
    let refusals = plan.refusals.as_ref().map(Refusals::follow);
    if crate::sys::timing::on() {
        let _ = fs::write(plan.session_dir.join(crate::sys::timing::HOOK_FILE), "");
    }
    crate::sys::timing::mark("keeper, refusal follower");
    let tried = run_podman_once(&mut cmd, plan, keeper, set, None).and_then(|status| {
        let dir = &plan.session_dir;
        let pid_file = dir.join(crate::plan::session::CONTAINER_PID_FILE).exists();
        let hook_ran = dir.join(crate::plan::session::HOOK_RAN_FILE).exists();
        if !runtime_failed_before_start(status.code(), pid_file, hook_ran) {
            return Ok(status);
        }
        run_podman_once(&mut cmd, plan, keeper, set, Some(status))
    });
    let status = match tried {
        Ok(s) => s,
        Err(e) => {
            // The launcher settles and cleans up (`run`): the keeper must not as well.
            let _ = keeper.write_all(Message::Finished.line().as_bytes());
            return Err(e);
        }
    };
    crate::sys::timing::take_hook_marks(&plan.session_dir);
    crate::sys::timing::mark("container started, checked, ran and removed");
    PODMAN_ENDED.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = keeper.write_all(Message::Finished.line().as_bytes());
    if let Some(r) = refusals {
        for line in r.finish() {
            say(&line);
        }
        crate::sys::timing::mark("the rules' refusals read a last time");
    }
    if !status.success() {
        for line in hook_reason(&plan.session_dir) {
            say(&line);
        }
    }
    if let (Some(137), Some(m)) = (status.code(), &plan.memory_limit) {
        say(&format!(
            "the command was killed (SIGKILL, exit 137): memory = {m} is enforced here, and a sandbox \
             that goes past it is killed this way; if it needs more, raise `memory =` in the project's config"
        ));
    }
    match (status.code(), status.signal()) {
        (Some(code), _) => Ok(code),
        (None, Some(sig)) => Ok(128 + sig),
        _ => bail!("podman ended with an unknown status: {status}"),
    }
}

/// Whether podman's runtime failed before the container existed, so that the same launch may be
/// made once more: podman's exit 126 (the runtime's error), no container pid file (podman writes
/// it once the container exists, before its first process runs: measured), and the launch's own
/// `createRuntime` hook never started (a refusal of ours is never retried). runc under load
/// sometimes fails so ("read init-p: connection reset by peer", docs/testing.md), and the same
/// launch a moment later starts. A runtime error that repeats is said twice, then returned.
pub(crate) fn runtime_failed_before_start(code: Option<i32>, pid_file: bool, hook_ran: bool) -> bool {
    code == Some(126) && !pid_file && !hook_ran
}

/// Runs podman once, to its end; the keeper and the signal thread know its pid meanwhile. The
/// signal thread starts once the first podman exists (a signal before that waits, blocked).
/// `first`: the first try's status, for the second try, which is not made (that status is
/// returned) once a signal came to be forwarded or is waiting to be: a launch asked to stop is
/// not started again.
fn run_podman_once(
    cmd: &mut Command,
    plan: &Plan,
    keeper: &mut dyn std::io::Write,
    set: SigSet,
    first: Option<std::process::ExitStatus>,
) -> anyhow::Result<std::process::ExitStatus> {
    static FORWARDING: std::sync::Once = std::sync::Once::new();
    let mut child = {
        let mut state = podman_state();
        if let Some(first) = first {
            if state.1 || process::pending(&set) {
                return Ok(first);
            }
            say("the container runtime failed before the sandbox existed (podman's exit 126, no container; \
                 nothing of the command ran): starting it once more");
        }
        let child = process::spawn(cmd, Tie::DiesWithLauncher(Signal::SIGTERM)).map_err(|e| {
            crate::error::hinted(format!("starting {}: {e}", plan.argv[0]), "run `ai-sandbox doctor`")
        })?;
        state.0 = child.id();
        child
    };
    // If this write fails the keeper is gone; the sandbox still stops with this launcher
    // (PDEATHSIG), and the next launch's keeper sweeps what a double kill could leave.
    let _ = keeper.write_all(Message::Podman(child.id()).line().as_bytes());
    FORWARDING.call_once(|| forward_signals(set, plan.argv[0].clone(), plan.container.clone()));
    crate::sys::timing::mark("podman spawned");
    // Waited for without reaping, the pid cleared, then reaped: until the clear the pid is
    // podman's (a zombie at worst), so the signal thread cannot reach another process by it.
    let exited = nix::sys::wait::waitid(
        nix::sys::wait::Id::Pid(Pid::from_raw(child.id() as i32)),
        nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT,
    );
    podman_state().0 = 0;
    exited.context("waiting for podman")?;
    child.wait().context("waiting for podman")
}

/// What a hook printed when it refused to start the sandbox, as crun keeps it (see
/// `plan::session::HOOKS_STDERR_FILE`): the lines to say (none when the hooks said nothing,
/// as under runc, which puts the reason in podman's own error).
fn hook_reason(session_dir: &Path) -> Vec<String> {
    let file = session_dir.join(crate::plan::session::HOOKS_STDERR_FILE);
    let Ok(tree) = crate::sys::untrusted::Tree::open(session_dir) else { return Vec::new() };
    let Ok(bytes) = tree.read(Path::new(crate::plan::session::HOOKS_STDERR_FILE), 64 << 10) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return Vec::new();
    }
    let mut out = vec![format!("the sandbox was not started; its hook said ({}):", file.display())];
    out.extend(lines.iter().map(|l| format!("  {}", crate::sys::quote::text(l))));
    out
}
