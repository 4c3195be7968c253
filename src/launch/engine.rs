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

/// The service under a shell that holds the socket (fd 3). First `podman unshare true` makes the
/// engine's user namespace (and its pause process), so that the service joins one that exists:
/// podman 5.4 loses an activated socket when it starts beside another podman that is making that
/// namespace at the same moment. Found by reading podman's `pkg/rootless`: the podman that loses
/// the race to write pause.pid has already closed its inherited descriptors 3.. (meant for the
/// child it made), then joins the winner's namespace through a second child that it tells
/// LISTEN_FDS=1 without a descriptor 3: "unexpected fd received from systemd" (5 launches in 10
/// beside a `podman info`; docs/testing.md). A `podman` the agent runs meanwhile races the
/// `unshare` instead, which holds no socket. The shell still starts the service again if it ends
/// (said in the log): a failure with another cause then gets a second chance, in words.
/// systemd's socket activation wants LISTEN_PID to be the service's own pid: the inner shell's
/// `$$`, kept through `exec`. Connections made meanwhile wait in the socket's queue.
const SUPERVISE: &str = "podman unshare true 3<&- || echo 'ai-sandbox: podman unshare true failed'; \
    n=0; while [ $n -lt 5 ]; do \
    sh -c 'LISTEN_PID=$$ LISTEN_FDS=1 exec podman system service --time=0'; \
    echo \"ai-sandbox: podman system service ended (status $?); starting it again\"; \
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
