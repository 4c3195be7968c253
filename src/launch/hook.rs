//! The OCI `createRuntime` hook: podman runs this binary (`ai-sandbox hook ...`) after the
//! container's namespaces exist and before its first process starts. It enters the
//! container's network namespace and loads the ruleset with the host's nft.
//!
//! It runs as uid 0 of podman's rootless user namespace, which owns that network namespace,
//! so it may change the rules while the container itself never holds CAP_NET_ADMIN. Any
//! failure exits non-zero, and podman then refuses to start the container (fail closed).
//!
//! Loading is not proof: a wrapper that exits 0, an nft that loads nothing, a namespace that is
//! not the container's. So a second hook proves the rules hold from inside, once the network is
//! up and before the command exists (`self_check`; ADR 0040).

use crate::plan::ruleset::TABLE;
use anyhow::{Context, bail};
use nix::sched::{CloneFlags, setns};
use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Reads the OCI state JSON from stdin and returns the container's pid.
fn state_pid(state: &str) -> anyhow::Result<u32> {
    let v: serde_json::Value = serde_json::from_str(state).context("the OCI state on stdin is not JSON")?;
    let pid = v.get("pid").and_then(|p| p.as_u64()).context("the OCI state has no `pid`")?;
    u32::try_from(pid).ok().filter(|p| *p > 0).context("the OCI state has an invalid `pid`")
}

/// What the self-check proves before the container's command runs (see `self_check`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SelfCheck {
    /// An address and port no rule allows, where a listener of the launcher's waits: with the
    /// rules in force the connection is refused (and recorded in the refused set); without
    /// them, pasta carries it to the listener and it connects.
    pub canary: Option<SocketAddrV4>,
    /// The gate's port on the sandbox's loopback: the gate must answer there.
    pub gate_port: Option<u16>,
}

/// How long each probe may take (both answer at once when all is well: a reset made by the
/// rules in the sandbox's namespace, a 407 from the gate on the host's loopback).
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Loads the ruleset into the container's network namespace (an OCI createRuntime hook). With
/// `confirm`, then lists the table: the plan asks for it when no self-check canary will prove the
/// rules (self-check skipped, or every port of the host's loopback allowed). Otherwise nft's own
/// success (one atomic transaction) and the canary's refusal before the command exists are the
/// proof, and the second nft process (4-9 ms of every launch) is not run.
pub fn run(nft: &Path, ruleset: &Path, confirm: bool) -> anyhow::Result<i32> {
    // Said first, before anything can fail: a refusal of ours is not the runtime's failure (the
    // launcher retries only a launch whose hook never started; ADR 0082).
    let ran = ruleset.with_file_name(crate::plan::session::HOOK_RAN_FILE);
    std::fs::File::create(&ran)
        .with_context(|| format!("marking the hook as started ({})", ran.display()))?;
    // Timed only when the launcher made the file (see `sys::timing`).
    let timings = ruleset.with_file_name(crate::sys::timing::HOOK_FILE);
    let timed = timings.exists();
    if timed {
        crate::sys::timing::mark_to(&timings, "podman, runc, pasta up to the hook");
    }
    let mut state = String::new();
    std::io::stdin().read_to_string(&mut state).context("reading the OCI state from stdin")?;
    let pid = state_pid(&state)?;
    let ns_path = format!("/proc/{pid}/ns/net");
    let ns = std::fs::File::open(&ns_path).with_context(|| format!("opening {ns_path}"))?;
    setns(&ns, CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("entering the network namespace {ns_path}"))?;
    let out = Command::new(nft)
        .arg("-j")
        .arg("-f")
        .arg(ruleset)
        .output()
        .with_context(|| format!("running {}", nft.display()))?;
    if !out.status.success() {
        bail!(
            "{} -j -f {} failed ({}); the container was not started:\n{}",
            nft.display(),
            ruleset.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    if timed {
        crate::sys::timing::mark_to(&timings, "hook: nft -j -f (the ruleset loaded)");
    }
    if !confirm {
        return Ok(0);
    }
    // Confirm the table is there before letting the container run.
    let check = Command::new(nft).args(["list", "table", "inet", TABLE]).output()?;
    if !check.status.success() {
        bail!(
            "the ruleset was loaded but `nft list table inet {TABLE}` failed: {}",
            String::from_utf8_lossy(&check.stderr).trim_end()
        );
    }
    if timed {
        crate::sys::timing::mark_to(&timings, "hook: nft list table (the ruleset confirmed)");
    }
    Ok(0)
}

/// The sandbox's first act (`ai-sandbox self-check`, an OCI `startContainer` hook: inside the
/// container, as its user, after pasta has set up its network and before its command exists):
/// a never-allowed destination where a listener of the launcher's waits must be refused at once
/// (a connection there means the rules are not in force; a refusal with a listener behind it can
/// only be the rules'), and the gate must answer. Any doubt fails, and the command never runs.
pub fn self_check(check: &SelfCheck) -> anyhow::Result<i32> {
    let failed = |what: String| anyhow::anyhow!("self-check failed: {what}; the command was not started");
    if let Some(canary) = check.canary {
        match TcpStream::connect_timeout(&SocketAddr::V4(canary), PROBE_TIMEOUT) {
            Ok(_) => {
                return Err(failed(format!(
                    "the sandbox reached {canary}, which no rule allows: the ruleset is not in force"
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            Err(e) => {
                return Err(failed(format!(
                    "connecting to {canary} (which no rule allows) failed with `{e}`, not with the rules' refusal"
                )));
            }
        }
    }
    if let Some(port) = check.gate_port {
        let answer = gate_answer(port).map_err(|e| {
            failed(format!("the gate did not answer at 127.0.0.1:{port} inside the sandbox ({e})"))
        })?;
        if !answer.starts_with(b"HTTP/1.1 407") {
            return Err(failed(format!(
                "what answered at 127.0.0.1:{port} inside the sandbox is not the gate (it said {:?})",
                String::from_utf8_lossy(&answer[..answer.len().min(60)])
            )));
        }
    }
    Ok(0)
}

/// Asks the gate for nothing (no credentials): it answers 407, logged as a challenge.
fn gate_answer(port: u16) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), PROBE_TIMEOUT)?;
    s.set_read_timeout(Some(PROBE_TIMEOUT))?;
    s.write_all(b"CONNECT self-check.ai-sandbox.invalid:443 HTTP/1.1\r\nHost: self-check.ai-sandbox.invalid:443\r\n\r\n")?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf)?;
    Ok(buf[..n].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pid_from_oci_state() {
        assert_eq!(
            state_pid(r#"{"ociVersion":"1.0.2","id":"x","status":"creating","pid":4242,"bundle":"/b"}"#)
                .unwrap(),
            4242
        );
        assert!(state_pid(r#"{"pid":0}"#).is_err());
        assert!(state_pid(r#"{"id":"x"}"#).is_err());
        assert!(state_pid("not json").is_err());
    }
}
