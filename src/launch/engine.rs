//! `ai-sandbox engine -- CMD`: the sandbox's first step with `containers = on` (see
//! `plan::engine`), run inside it: it binds the Docker-compatible socket itself, hands it to
//! `podman system service` (socket activation), and becomes the command. A client that connects
//! at once waits in the socket's queue while the service starts, so nothing polls for it and the
//! command starts no later than it would. The service runs in its own process group (a Ctrl-C
//! meant for the agent leaves it running) and in the sandbox's pid namespace, so it ends with it.

use crate::plan::engine::{RUN_DIR, SOCKET};
use anyhow::Context;
use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The service's output, beside its socket (the agent's terminal is the command's).
const SERVICE_LOG: &str = "service.log";

pub fn run(command: &[OsString]) -> anyhow::Result<i32> {
    let Some((program, args)) = command.split_first() else {
        anyhow::bail!("engine: no command given (ai-sandbox runs `engine -- CMD` inside the sandbox)");
    };
    if let Err(e) = start_service() {
        eprintln!(
            "ai-sandbox: the sandbox's container engine did not start ({e:#}); DOCKER_HOST will not answer \
             (podman itself may still work)"
        );
    }
    let err = Command::new(program).args(args).exec();
    eprintln!("ai-sandbox: {}: {err}", Path::new(program).display());
    Ok(if err.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 })
}

fn start_service() -> anyhow::Result<()> {
    let socket = Path::new(SOCKET);
    let dir = socket.parent().expect("the socket has a directory");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let _ = std::fs::remove_file(socket);
    let listener =
        std::os::unix::net::UnixListener::bind(socket).with_context(|| format!("binding {SOCKET}"))?;
    let log = std::fs::File::create(Path::new(RUN_DIR).join(SERVICE_LOG))
        .with_context(|| format!("creating {RUN_DIR}/{SERVICE_LOG}"))?;
    let fd = listener.as_raw_fd();
    let mut service = Command::new("/bin/sh");
    // systemd's socket activation: LISTEN_PID must be the service's own pid, which the shell
    // knows as `$$` and keeps through `exec`.
    service
        .args(["-c", "LISTEN_PID=$$ LISTEN_FDS=1 exec podman system service --time=0"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: only async-signal-safe calls (dup2, fcntl, setpgid) between fork and exec.
    unsafe {
        service.pre_exec(move || {
            if fd == 3 {
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
    service.spawn().context("starting `podman system service`")?;
    Ok(())
}
