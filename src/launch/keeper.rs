//! The keeper: a small process per session, started by the launcher in a session of its own
//! (setsid), so that the sandbox stops whatever ends the launcher — SIGKILL of the launcher's
//! whole process group (a closed terminal, a CI job timeout, an OOM kill) takes podman with it
//! but leaves the container running under conmon, and only something outside that group can
//! stop it.
//!
//! Protocol on its stdin (a pipe whose write end only the launcher holds, close-on-exec):
//! `podman PID` once podman runs, then `ok` when the launcher has seen podman exit. EOF
//! without `ok` means the launcher died: the keeper removes the container (`podman rm -f`,
//! repeated until it is gone and the podman the launcher started has exited, since a podman
//! that outlived the launcher may still be creating it), then the session directory.
//!
//! At start it also sweeps containers left by sessions whose launcher and keeper both died
//! (killed together, a reboot of the user session): a container labelled with a session whose
//! directory is gone or whose launcher is dead is removed. This runs off the launch's critical
//! path (the keeper is detached), so it costs the launch nothing.

use crate::contract::keeper::Message;
use crate::plan::session::{PID_FILE, SESSION_DIR_LABEL};
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the keeper keeps trying to remove a container after its launcher died.
const STOP_DEADLINE: Duration = Duration::from_secs(60);

fn podman(podman: &Path, args: &[&str]) -> Option<std::process::Output> {
    Command::new(podman)
        .args(args)
        .env("PODMAN_IGNORE_CGROUPSV1_WARNING", "1")
        .stdin(Stdio::null())
        .output()
        .ok()
}

fn exists(pm: &Path, name: &str) -> bool {
    // `container exists` exits 0 when it exists, 1 when not; anything else: assume it does.
    podman(pm, &["container", "exists", name]).is_none_or(|o| o.status.code() != Some(1))
}

/// Whether the session whose directory is `dir` is over (the dir is gone, or its launcher is
/// dead).
fn session_over(dir: &Path) -> bool {
    if !dir.exists() {
        return true;
    }
    match std::fs::read_to_string(dir.join(PID_FILE)) {
        Ok(pid) => !pid.trim().parse().is_ok_and(crate::sys::process::alive),
        // No pid file: a launch that is starting, or a session dir written by hand. Not ours.
        Err(_) => false,
    }
}

/// Removes the containers of sessions that are over, each judged by its own session
/// directory (labelled on the container), whichever runtime dir it lives in.
pub(crate) fn sweep(pm: &Path) {
    let filter = format!("label={SESSION_DIR_LABEL}");
    let format = format!("{{{{.Names}}}}\t{{{{index .Labels \"{SESSION_DIR_LABEL}\"}}}}");
    let Some(out) = podman(pm, &["ps", "-a", "--filter", &filter, "--format", &format]) else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((name, dir)) = line.split_once('\t') else { continue };
        let dir = Path::new(dir);
        let plausible = dir.is_absolute() && !dir.components().any(|c| c == std::path::Component::ParentDir);
        if plausible && session_over(dir) {
            eprintln!("keeper: removing {name}, left by session {} whose launcher is gone", dir.display());
            let _ = podman(pm, &["rm", "-f", "-t", "0", name]);
        }
    }
}

/// `ai-sandbox keeper` (hidden): see the module doc.
pub fn run(session_dir: &Path, guard: &Path, name: &str, pm: &Path) -> anyhow::Result<i32> {
    sweep(pm);
    let mut podman_pid = 0;
    let mut finished = false;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match Message::read(&line) {
            Some(Message::Podman(pid)) => podman_pid = i32::try_from(pid).unwrap_or(0),
            Some(Message::Finished) => finished = true,
            None => {}
        }
    }
    if finished {
        return Ok(0);
    }
    let end = Instant::now() + STOP_DEADLINE;
    let gone = loop {
        let _ = podman(pm, &["rm", "-f", "-t", "0", name]);
        let gone = !exists(pm, name);
        if (gone && !crate::sys::process::alive(podman_pid)) || Instant::now() > end {
            break gone;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    if gone {
        let _ = crate::launch::remove_tree(session_dir, pm);
        // The project's protected paths, with no terminal to tell: the report waits for the
        // next launch (and is in this log).
        if let Some(state_dir) = guard.parent().and_then(Path::parent) {
            let mut report = Vec::new();
            if let Err(e) = crate::launch::guard::settle(guard, state_dir, &mut report, false) {
                eprintln!("keeper: verifying the protected paths failed: {e:#}");
            }
            eprint!("{}", String::from_utf8_lossy(&report));
        }
    }
    eprintln!(
        "keeper: launcher of {name} died; container {}",
        if gone { "removed" } else { "could NOT be removed" }
    );
    Ok(if gone { 0 } else { 1 })
}
