//! Processes the launcher starts and watches: one place for the fork-time setup that must be
//! async-signal-safe (and so `unsafe`), for waiting on signals, for what a signal that ends the
//! launcher leaves said (`last_words`), and for "is that pid alive". The gate, the keeper and
//! podman are started here; nothing else in the crate calls `pre_exec` or `sigwaitinfo`.

use nix::sys::signal::{SigSet, Signal, kill};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

/// How a child is tied to the launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tie {
    /// Its own session: it outlives the launcher and its terminal (the gate, the keeper).
    Detached,
    /// Sent this signal when the launcher dies, however it dies (podman).
    DiesWithLauncher(Signal),
}

/// Spawns `cmd` with every signal unblocked (the launcher blocks the ones it forwards; a child
/// with SIGTERM blocked would ignore `kill`) and tied as `tie` says.
pub(crate) fn spawn(cmd: &mut Command, tie: Tie) -> std::io::Result<Child> {
    // SAFETY: only async-signal-safe calls (setsid, prctl, sigprocmask) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            match tie {
                Tie::Detached => {
                    nix::unistd::setsid().map_err(std::io::Error::from)?;
                }
                Tie::DiesWithLauncher(sig) => {
                    nix::sys::prctl::set_pdeathsig(Some(sig)).map_err(std::io::Error::from)?;
                }
            }
            SigSet::all().thread_unblock().map_err(std::io::Error::from)
        });
    }
    cmd.spawn()
}

/// Reaps `child` when it exits, so no zombie is left while the launcher runs.
pub(crate) fn reap_later(mut child: Child) {
    std::thread::spawn(move || child.wait());
}

/// Waits for one of the signals in `set` (blocked by the caller): the signal, and whether the
/// kernel sent it (a terminal's Ctrl-C, which reaches the foreground group by itself) rather
/// than a process (`kill`, a supervisor). nix has no sigwaitinfo and signal-hook works with
/// handlers, not a blocked mask the children must not inherit, hence libc here.
pub(crate) fn wait_for_signal(set: &SigSet) -> Option<(Signal, bool)> {
    // SAFETY: siginfo_t is plain data; zeroed is a valid value for an out-parameter.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset; `info` is a properly sized out-parameter.
    let sig = unsafe { libc::sigwaitinfo(set.as_ref(), &mut info) };
    let sig = Signal::try_from(sig).ok()?;
    Some((sig, info.si_code == libc::SI_KERNEL))
}

static LAST_WORDS: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// What to say if a signal ends the launcher from now on (after its sandbox: a question to the
/// user, whose Ctrl-C would otherwise lose what it was about); `None` to say nothing again.
pub(crate) fn last_words(words: Option<String>) {
    *LAST_WORDS.lock().unwrap_or_else(|e| e.into_inner()) = words;
}

/// The words `last_words` left, taken once.
pub(crate) fn take_last_words() -> Option<String> {
    LAST_WORDS.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// Whether process `pid` exists (a pid file's 0 or negative number never counts: kill(2)
/// would take it for a process group).
pub(crate) fn alive(pid: i32) -> bool {
    pid > 0 && kill(Pid::from_raw(pid), None).is_ok()
}
