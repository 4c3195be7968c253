//! Processes the launcher starts and watches: one place for the fork-time setup that must be
//! async-signal-safe (and so `unsafe`), for waiting on signals and asking which are pending, for
//! a signal's disposition (SIGPIPE's default for a command that prints), for what a signal that
//! ends the launcher leaves said (`last_words`), and for "is that pid alive". The gate, the
//! keeper, podman and the sandbox's container engine are started here; nothing else in the crate
//! calls `pre_exec`, `sigwaitinfo` or `sigpending` (the crate root denies `unsafe` outside
//! `sys`, so the compiler refuses them elsewhere).

use nix::sys::signal::{SigSet, Signal, kill};
use nix::unistd::Pid;
use std::os::fd::{AsRawFd, BorrowedFd};
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

/// Spawns `cmd` with `listening` as its descriptor 3, inherited through exec, and in a process
/// group of its own: systemd's socket activation (`LISTEN_FDS=1` names descriptor 3), for the
/// sandbox's container engine (`launch::engine`). `listening` is borrowed for the call, so it is
/// open when the child is forked.
pub(crate) fn spawn_with_fd3(cmd: &mut Command, listening: BorrowedFd<'_>) -> std::io::Result<Child> {
    let fd = listening.as_raw_fd();
    // SAFETY: only async-signal-safe calls (dup2, fcntl, setpgid) between fork and exec, on
    // descriptors open in the child (`fd` is borrowed across the spawn; 3 is the one made here).
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                // dup2 onto itself would leave close-on-exec set (std opens every descriptor so).
                if libc::fcntl(3, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setpgid(0, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
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

/// Whether one of `set` is pending for this process: blocked in every thread and not yet taken
/// by the signal thread (a Ctrl-C that reached podman as the terminal's, say). nix has no
/// `sigpending`, hence libc here.
pub(crate) fn pending(set: &SigSet) -> bool {
    let mut p = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigpending fills the set it is given; it is read only once that succeeded.
    if unsafe { libc::sigpending(p.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: filled by sigpending above.
    let p = unsafe { p.assume_init() };
    // SAFETY: a filled set and a valid signal number.
    set.iter().any(|s| unsafe { libc::sigismember(&p, s as i32) } == 1)
}

/// Gives SIGPIPE its default disposition back (std ignores it before `main`): a write to a pipe
/// whose reader went away then ends the process quietly. `main` decides for which commands.
pub fn default_sigpipe() {
    // SAFETY: SIG_DFL installs no handler of ours, so no code runs in a signal context; signal(2)
    // only sets this process's disposition of SIGPIPE.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The child has the socket as its descriptor 3 (though the parent's copy is close-on-exec,
    /// at 3 or at another number) and leads a process group of its own.
    #[test]
    fn spawn_with_fd3_hands_the_socket_over_as_3_in_a_group_of_its_own() {
        use std::os::fd::{AsFd, FromRawFd, OwnedFd};
        let dir = tempfile::tempdir().unwrap();
        let listener = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        let ours = std::fs::read_link(format!("/proc/self/fd/{}", listener.as_raw_fd())).unwrap();
        // The listener's own number (3 when the test runs with few descriptors open: then its
        // close-on-exec flag is cleared), and a copy far from 3 (then it is duplicated onto 3).
        let far = nix::fcntl::fcntl(&listener, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(100)).unwrap();
        // SAFETY: fcntl has just made this descriptor for this test, which alone holds it.
        let far = unsafe { OwnedFd::from_raw_fd(far) };
        for fd in [listener.as_fd(), far.as_fd()] {
            let mut cmd = Command::new("/bin/sh");
            // pid, process group (stat's 5th field; the command `sh` has no space), what 3 is.
            cmd.args(["-c", "echo $$; cut -d' ' -f5 /proc/$$/stat; readlink /proc/$$/fd/3"])
                .stdout(std::process::Stdio::piped());
            let out = spawn_with_fd3(&mut cmd, fd).unwrap().wait_with_output().unwrap();
            let text = String::from_utf8(out.stdout).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 3, "fd {}: {text}", fd.as_raw_fd());
            assert_eq!(lines[0], lines[1], "its own process group: {text}");
            assert_eq!(lines[2], ours.to_str().unwrap(), "3 is the listening socket");
        }
        // The control: a plain spawn does not get the socket as 3 (it may get something else
        // there: another test thread's descriptor opened without close-on-exec at that moment).
        let plain = Command::new("/bin/sh").args(["-c", "readlink /proc/$$/fd/3"]).output().unwrap();
        let three = String::from_utf8_lossy(&plain.stdout);
        assert_ne!(three.trim(), ours.to_str().unwrap(), "{plain:?}");
    }
}
