//! `ai-sandbox exec [--session ID] [-- CMD…]`: a command beside the agent, in its running
//! sandbox. Through podman's own `exec`, so the command joins the container as its first process
//! did: the same network namespace (the rules, the gate, the refusals and their logs), the same
//! seccomp filter and no-new-privileges, the same user, mounts and environment (the proxy
//! variables included). Nothing is entered by hand.

use super::app::locate;
use super::facts::runtime_dir;
use crate::contract::execd::{EXEC_DIR, Execd};
use crate::host::Host;
use crate::live::Running;
use std::path::Path;

/// Runs the command after it (`$0`, its arguments `$@`) if the sandbox has it; else says so and
/// ends 127. No word of the command is read by the shell as code.
const FOUND_OR_SAID: &[&str] = &[
    "/bin/sh",
    "-c",
    "command -v -- \"$0\" >/dev/null 2>&1 || { printf 'ai-sandbox: exec: `%s` is not a command in the sandbox (its PATH: %s): command not found\\n' \"$0\" \"$PATH\" >&2; exit 127; }; exec \"$0\" \"$@\"",
];

/// A shell: bash where the sandbox has it (the host's /usr), else sh.
const SHELL: &[&str] = &["/bin/sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash || exec sh"];

pub fn exec_cmd(host: &mut dyn Host, args: &crate::cli::ExecArgs) -> anyhow::Result<i32> {
    let Some(command) = args.command.iter().map(|a| a.to_str()).collect::<Option<Vec<&str>>>() else {
        anyhow::bail!(
            "an argument of the command is not UTF-8, which podman exec cannot carry; nothing was run"
        );
    };
    let loc = locate(host, args.project.as_deref())?;
    let running = host.running(&runtime_dir(host));
    let chosen = pick(&running, &loc.project, args.session.as_deref())?;
    let target = chosen.record.as_ref().map(|r| r.container.as_str()).unwrap_or_default();
    let podman = host.which("podman").unwrap_or_else(|| "podman".into());
    let cwd = host.cwd()?;
    // Where the command starts: here when here is inside the project (mounted at the same path).
    let workdir = if cwd.starts_with(&loc.project) { cwd } else { loc.project.clone() };
    let mut argv = vec![podman.display().to_string(), "exec".into(), "-i".into()];
    if host.stdio_is_tty() {
        argv.push("-t".into());
    }
    argv.extend(["--workdir".into(), workdir.display().to_string(), target.into()]);
    let command: Vec<String> =
        if command.is_empty() { SHELL } else { &command }.iter().map(|s| s.to_string()).collect();
    // The host's /usr inside (its /bin/sh): a command the sandbox does not have is said in words
    // and ends 127, as a launch says it, rather than as runc's "exec failed".
    if chosen.record.as_ref().is_some_and(|r| r.host_image) && !args.command.is_empty() {
        argv.extend(FOUND_OR_SAID.iter().map(|s| s.to_string()));
    }
    argv.extend(command.iter().cloned());
    // For `ps`: this pid becomes podman exec's (see `contract::execd`). A record that cannot be
    // written leaves the command unlisted, not unrun.
    let record = Execd { command, container: target.into() };
    if let Some(dir) = chosen.path.parent() {
        let path = dir.join(EXEC_DIR).join(host.own_pid().to_string());
        let _ = host.write_file(&path, &serde_json::to_string(&record)?);
    }
    host.exec(&argv)
}

/// The container of the running sandbox to join: the one of this project, or the one named.
fn pick<'a>(running: &'a [Running], project: &Path, session: Option<&str>) -> anyhow::Result<&'a Running> {
    let shown = crate::sys::quote::path(project);
    let mine: Vec<&Running> =
        running.iter().filter(|r| r.record.as_ref().is_some_and(|rec| rec.project == project)).collect();
    let hint = "`ai-sandbox ps` lists the running sandboxes";
    let chosen = match (session, mine.as_slice()) {
        (Some(id), _) => match crate::sys::ids::named(mine.iter().map(|r| r.session.as_str()), id) {
            crate::sys::ids::Named::One(one) => {
                mine.iter().find(|r| r.session == one).copied().expect("named")
            }
            crate::sys::ids::Named::None => {
                return Err(crate::error::hinted(
                    format!("no running sandbox {id} of {shown}; nothing was run"),
                    hint,
                )
                .into());
            }
            crate::sys::ids::Named::Several(ids) => {
                return Err(crate::error::hinted(
                    format!(
                        "{id} starts the ids of {} running sandboxes of {shown} ({}); nothing was run",
                        ids.len(),
                        ids.join(", ")
                    ),
                    "pass more of the id",
                )
                .into());
            }
        },
        (None, []) => {
            return Err(crate::error::hinted(
                format!("no sandbox of {shown} is running; nothing was run"),
                "start one with `ai-sandbox` (exec joins a running sandbox)",
            )
            .into());
        }
        (None, [one]) => one,
        (None, many) => {
            let ids: Vec<&str> = many.iter().map(|r| r.session.as_str()).collect();
            return Err(crate::error::hinted(
                format!(
                    "{} sandboxes of {shown} are running ({}); nothing was run",
                    many.len(),
                    ids.join(", ")
                ),
                "pass --session ID",
            )
            .into());
        }
    };
    Ok(chosen)
}
