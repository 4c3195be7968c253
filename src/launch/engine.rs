//! `ai-sandbox engine -- CMD`: the sandbox's first step with `containers = on` (see
//! `plan::engine`), run inside it: it binds the Docker-compatible socket itself, hands it to
//! `podman system service` (socket activation), and becomes the command. A client that connects
//! at once waits in the socket's queue while the service starts, so nothing polls for it and the
//! command starts no later than it would. The service runs in its own process group (a Ctrl-C
//! meant for the agent leaves it running) and in the sandbox's pid namespace, so it ends with it.

use crate::plan::engine::{RUN_DIR, SOCKET};
use anyhow::Context;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The service's output, beside its socket (the agent's terminal is the command's).
const SERVICE_LOG: &str = "service.log";

/// The service under a shell that holds the socket (fd 3) and starts it again if it ends: podman
/// 5.4 sometimes fails to take an activated socket when another podman is making its user
/// namespace at the same moment ("unexpected fd received from systemd"; measured: 3 starts in 10
/// beside a concurrent `podman info`), and a second start joins the namespace that one made.
/// systemd's socket activation wants LISTEN_PID to be the service's own pid: the inner shell's
/// `$$`, kept through `exec`. Connections made meanwhile wait in the socket's queue.
const SUPERVISE: &str = "n=0; while [ $n -lt 5 ]; do \
    sh -c 'LISTEN_PID=$$ LISTEN_FDS=1 exec podman system service --time=0'; \
    n=$((n+1)); sleep 0.2; done";

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
    let mut service = Command::new("/bin/sh");
    service.args(["-c", SUPERVISE]).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    crate::sys::process::spawn_with_fd3(&mut service, listener.as_fd())
        .context("starting `podman system service`")?;
    Ok(())
}
