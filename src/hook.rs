//! The OCI `createRuntime` hook: podman runs this binary (`ai-sandbox hook ...`) after the
//! container's namespaces exist and before its first process starts. It enters the
//! container's network namespace and loads the ruleset with the host's nft.
//!
//! It runs as uid 0 of podman's rootless user namespace, which owns that network namespace,
//! so it may change the rules while the container itself never holds CAP_NET_ADMIN. Any
//! failure exits non-zero, and podman then refuses to start the container (fail closed).

use crate::ruleset::TABLE;
use anyhow::{Context, bail};
use nix::sched::{CloneFlags, setns};
use std::io::Read;
use std::path::Path;
use std::process::Command;

/// Reads the OCI state JSON from stdin and returns the container's pid.
fn state_pid(state: &str) -> anyhow::Result<u32> {
    let v: serde_json::Value = serde_json::from_str(state).context("the OCI state on stdin is not JSON")?;
    let pid = v.get("pid").and_then(|p| p.as_u64()).context("the OCI state has no `pid`")?;
    u32::try_from(pid).ok().filter(|p| *p > 0).context("the OCI state has an invalid `pid`")
}

pub fn run(nft: &Path, ruleset: &Path) -> anyhow::Result<i32> {
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
    // Confirm the table is there before letting the container run.
    let check = Command::new(nft).args(["list", "table", "inet", TABLE]).output()?;
    if !check.status.success() {
        bail!(
            "the ruleset was loaded but `nft list table inet {TABLE}` failed: {}",
            String::from_utf8_lossy(&check.stderr).trim_end()
        );
    }
    Ok(0)
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
