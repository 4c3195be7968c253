//! `containers = on`: the sandbox gets its own rootless podman, so a test suite that starts
//! containers (Testcontainers, compose) runs without the host's socket, which would hand it the
//! host. The engine is the host's podman seen through the host's /usr; its containers live in
//! the sandbox's user and network namespaces, so everything they send leaves through the
//! sandbox's nftables rules and gate, and no process of theirs outlives the sandbox's pid 1.
//!
//! What it takes, and nothing more (ADR 0067, measured on podman 5.4 / runc):
//! - one id: the sandbox's /etc/subuid and /etc/subgid are empty, so the inner podman maps the
//!   user alone and never runs the setuid `newuidmap` (no-new-privileges stays); layers with
//!   other owners are squashed to it (`ignore_chown_errors`);
//! - a seccomp profile that is podman's default plus `chroot`, `sethostname`, `setdomainname`
//!   (the kernel still asks for the capability, which only the engine's own user namespace has);
//! - /proc and /sys unmasked (the kernel lets a new procfs or sysfs be mounted only where the
//!   whole of it is visible), and /dev/net/tun for the nested containers' pasta.
//!
//! Its storage is in the project's sandbox HOME (kept between sessions of the project, never
//! seen by another's); its run state, socket included, on the session's /tmp. This module only
//! plans: the files, mounts, options and variables; `launch` writes the files.

use super::session::Facts;
use crate::policy::Policy;
use std::path::PathBuf;

/// Inside: the engine's configuration, read-only (the agent cannot change what the launcher set;
/// what it may change, its own `~/.config/containers`, is read before this and loses to it).
pub(crate) const CONF_DIR: &str = "/run/ai-sandbox/engine";
/// Inside: the engine's run state, its socket among it (`XDG_RUNTIME_DIR`): the session's /tmp,
/// at one path for every session, as podman's database requires of the storage it reopens.
pub(crate) const RUN_DIR: &str = "/tmp/ai-sandbox-engine";
/// The Docker-compatible socket (podman's rootless default under `XDG_RUNTIME_DIR`).
pub(crate) const SOCKET: &str = "/tmp/ai-sandbox-engine/podman/podman.sock";
/// The sandbox's loopback as a nested container reaches it (pasta's `--map-host-loopback`): where
/// the gate is, and other nested containers' published ports.
/// Not `gate_addr`: that stays what it is in the sandbox (the host's loopback, through the
/// sandbox's rules), because a nested container's connection to it is, to the sandbox, pasta's
/// own connection from the sandbox. Link-local, next to pasta's own 169.254.1.1 and .2.
pub(crate) const SANDBOX_LOOPBACK: &str = "169.254.1.3";
/// The host's file of podman's default seccomp profile (containers-common).
pub(crate) const DEFAULT_SECCOMP: &str = "/usr/share/containers/seccomp.json";
/// What the profile adds to podman's default: each still needs a capability, held only inside
/// a user namespace the process made (measured: an image unpacks with `chroot`, a container
/// starts with `sethostname`; without either it fails).
pub(crate) const SYSCALLS: &[&str] = &["chroot", "sethostname", "setdomainname"];

/// A file the launch writes for the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct File {
    pub(crate) path: PathBuf,
    pub(crate) text: String,
    pub(crate) mode: u32,
    /// What a dry run says in place of the text, when the text is not worth reading there.
    pub(crate) said: Option<String>,
}

/// The files the launch writes for the engine.
pub(crate) fn files(p: &Policy, f: &Facts) -> Vec<File> {
    if !p.containers {
        return Vec::new();
    }
    let dir = f.engine_dir();
    let file = |path: PathBuf, text: String, mode, said: Option<String>| File { path, text, mode, said };
    let mut out = vec![
        // It holds the session token (in the nested containers' proxy variables).
        file(dir.join("containers.conf"), containers_conf(p, f), 0o600, None),
        file(dir.join("storage.conf"), storage_conf(f), 0o644, None),
        // Over /etc/subuid and /etc/subgid inside: no range, so one id and no setuid helper.
        file(
            dir.join("subid"),
            String::new(),
            0o644,
            Some("empty: mounted over /etc/subuid and /etc/subgid inside".into()),
        ),
    ];
    if let Some(profile) = &f.engine_seccomp {
        let said = format!(
            "the sandbox's seccomp profile: podman's default, {DEFAULT_SECCOMP}, with {} allowed",
            SYSCALLS.join(", ")
        );
        out.push(file(f.engine_seccomp_file(), profile.clone(), 0o644, Some(said)));
    }
    out
}

/// The read-only mounts: (host, inside).
pub(crate) fn mounts(p: &Policy, f: &Facts) -> Vec<(PathBuf, PathBuf)> {
    if !p.containers {
        return Vec::new();
    }
    let dir = f.engine_dir();
    vec![
        (dir.clone(), PathBuf::from(CONF_DIR)),
        (dir.join("subid"), PathBuf::from("/etc/subuid")),
        (dir.join("subid"), PathBuf::from("/etc/subgid")),
    ]
}

/// podman's options for the outer container.
pub(crate) fn options(p: &Policy, f: &Facts) -> Vec<String> {
    if !p.containers {
        return Vec::new();
    }
    vec![
        "--security-opt".into(),
        format!("seccomp={}", f.engine_seccomp_file().display()),
        "--security-opt".into(),
        "unmask=ALL".into(),
        "--device".into(),
        "/dev/net/tun".into(),
    ]
}

/// The sandbox's variables for the engine (DOCKER_HOST unless the user set it).
pub(crate) fn env(p: &Policy, f: &Facts) -> Vec<(String, String)> {
    if !p.containers {
        return Vec::new();
    }
    let mut v = vec![
        ("CONTAINERS_CONF_OVERRIDE".to_string(), format!("{CONF_DIR}/containers.conf")),
        ("CONTAINERS_STORAGE_CONF".to_string(), format!("{CONF_DIR}/storage.conf")),
        ("XDG_RUNTIME_DIR".to_string(), RUN_DIR.to_string()),
    ];
    if !p.user_sets("DOCKER_HOST") {
        v.push(("DOCKER_HOST".into(), format!("unix://{SOCKET}")));
    }
    // Testcontainers' reaper (Ryuk) would be an image pulled from Docker Hub with the socket
    // mounted into it; its work, removing what a suite left running, is done by the sandbox's
    // end (every container of the engine is in the sandbox's pid namespace).
    if !p.user_sets("TESTCONTAINERS_RYUK_DISABLED") {
        v.push(("TESTCONTAINERS_RYUK_DISABLED".into(), "true".into()));
    }
    if !f.cgroup_v2 {
        // Said once per podman call otherwise; the sandbox's containers use no cgroups of their own.
        v.push(("PODMAN_IGNORE_CGROUPSV1_WARNING".into(), "1".into()));
    }
    v
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            c if c.is_control() => out += &format!("\\u{:04X}", c as u32),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn toml_list(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|s| toml_str(s)).collect();
    format!("[{}]", items.join(", "))
}

/// The inner engine's containers.conf, read after the system's and the user's (podman's
/// `CONTAINERS_CONF_OVERRIDE`): a nested container's loopback is its own, so the gate the
/// sandbox reaches at 127.0.0.1 is `SANDBOX_LOOPBACK` for it, and the proxy variables say so;
/// the CA of terminated hosts is mounted where images look for it.
fn containers_conf(p: &Policy, f: &Facts) -> String {
    // The sandbox's own NO_PROXY (with `gate_addr` when a host port is allowed), and its
    // loopback, reached directly as the sandbox reaches its own.
    let gate = match p.gate {
        true => f.gate_env(SANDBOX_LOOPBACK, &format!("{},{SANDBOX_LOOPBACK}", p.no_proxy.join(","))),
        false => Vec::new(),
    };
    let env: Vec<String> =
        gate.into_iter().chain(super::gate_ca::env(p, f)).map(|(k, v)| format!("{k}={v}")).collect();
    let mut volumes: Vec<String> = Vec::new();
    if f.gate_ca.is_some() {
        use super::gate_ca::{BUNDLE, GATE_CA, OTHER_BUNDLES, SYSTEM_BUNDLE};
        volumes.push(format!("{GATE_CA}:{GATE_CA}:ro"));
        for to in [BUNDLE, SYSTEM_BUNDLE].iter().chain(OTHER_BUNDLES) {
            volumes.push(format!("{BUNDLE}:{to}:ro"));
        }
    }
    let mut text = String::from(
        "# Written by ai-sandbox for the sandbox's own podman (containers = on); read-only inside.\n\
         [containers]\n\
         # The sandbox's proxy variables name its loopback, which a nested container does not share.\n\
         http_proxy = false\n",
    );
    text += &format!("env = {}\n", toml_list(&env));
    if !volumes.is_empty() {
        text += &format!("volumes = {}\n", toml_list(&volumes));
    }
    text += "\n[engine]\nevents_logger = \"file\"\n";
    // With `--net none` too: the sandbox's loopback is where one nested container reaches
    // another's published port, which an offline integration test needs.
    text += &format!(
        "\n[network]\n# In a nested container, {SANDBOX_LOOPBACK} is the sandbox's loopback (the gate, published ports).\npasta_options = {}\n",
        toml_list(&["--map-host-loopback".into(), SANDBOX_LOOPBACK.into()])
    );
    text
}

/// Storage in the project's sandbox HOME (persists between its sessions), run state on the
/// session's /tmp, every layer's files owned by the one id there is.
fn storage_conf(f: &Facts) -> String {
    let graph = format!("{}/.local/share/containers/storage", f.home.display());
    format!(
        "# Written by ai-sandbox for the sandbox's own podman (containers = on); read-only inside.\n\
         [storage]\n\
         driver = \"overlay\"\n\
         graphroot = {}\n\
         runroot = {}\n\n\
         [storage.options.overlay]\n\
         # One id inside: files of other owners in an image are given to it.\n\
         ignore_chown_errors = \"true\"\n",
        toml_str(&graph),
        toml_str(&format!("{RUN_DIR}/containers")),
    )
}

/// podman's default profile with `SYSCALLS` allowed, or why it cannot be read.
pub(crate) fn seccomp_profile(default: &str) -> Result<String, String> {
    let mut v: serde_json::Value =
        serde_json::from_str(default).map_err(|e| format!("{DEFAULT_SECCOMP} is not JSON: {e}"))?;
    let calls = v
        .get_mut("syscalls")
        .and_then(|s| s.as_array_mut())
        .ok_or_else(|| format!("{DEFAULT_SECCOMP} has no `syscalls` list"))?;
    // First, unconditional: the default's own rules for these allow them only with a
    // capability the sandbox does not hold (and refuse them otherwise).
    for rule in calls.iter_mut() {
        if let Some(names) = rule.get_mut("names").and_then(|n| n.as_array_mut()) {
            names.retain(|n| !n.as_str().is_some_and(|n| SYSCALLS.contains(&n)));
        }
    }
    calls.retain(|r| r.get("names").and_then(|n| n.as_array()).is_none_or(|n| !n.is_empty()));
    calls.insert(
        0,
        serde_json::json!({
            "names": SYSCALLS,
            "action": "SCMP_ACT_ALLOW",
            "args": [],
            "comment": "ai-sandbox containers = on: the inner engine's own user namespace holds the capability",
            "includes": {},
            "excludes": {}
        }),
    );
    Ok(serde_json::to_string(&v).expect("json"))
}

#[cfg(test)]
mod addr_tests {
    #[test]
    fn the_nested_sandbox_address_has_one_value() {
        assert_eq!(super::SANDBOX_LOOPBACK, crate::policy::addr::NESTED_SANDBOX_ADDR.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_allows_the_three_calls_once_and_keeps_the_rest() {
        let default = r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[
            {"names":["read","chroot"],"action":"SCMP_ACT_ALLOW","includes":{"caps":["CAP_SYS_CHROOT"]}},
            {"names":["chroot"],"action":"SCMP_ACT_ERRNO","excludes":{"caps":["CAP_SYS_CHROOT"]}},
            {"names":["write"],"action":"SCMP_ACT_ALLOW"}]}"#;
        let out: serde_json::Value = serde_json::from_str(&seccomp_profile(default).unwrap()).unwrap();
        let calls = out["syscalls"].as_array().unwrap();
        assert_eq!(calls[0]["names"], serde_json::json!(["chroot", "sethostname", "setdomainname"]));
        assert_eq!(calls[0]["action"], "SCMP_ACT_ALLOW");
        // The conditional chroot rules are gone (the refusal among them), `read` and `write` stay.
        let names: Vec<&str> =
            calls.iter().flat_map(|r| r["names"].as_array().unwrap()).filter_map(|n| n.as_str()).collect();
        assert_eq!(names, ["chroot", "sethostname", "setdomainname", "read", "write"]);
        assert_eq!(out["defaultAction"], "SCMP_ACT_ERRNO");
        assert!(seccomp_profile("{}").unwrap_err().contains("no `syscalls`"));
        assert!(seccomp_profile("nope").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_str(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(toml_str("x\ny"), "\"x\\u000Ay\"");
        assert_eq!(toml_list(&["a".into(), "b".into()]), r#"["a", "b"]"#);
    }
}
