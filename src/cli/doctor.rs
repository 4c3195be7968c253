//! `ai-sandbox doctor`: can this machine run sandboxes? Each check that fails prints the
//! command that fixes it (the same steps `scripts/install-deps` performs).

use std::path::PathBuf;
use std::process::Command;

struct Check {
    name: &'static str,
    result: Result<String, String>,
    fix: String,
}

fn output(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    } else {
        Err(format!("`{cmd} {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// How to run `cmd` as a regular user from a root shell, with what podman needs (the login
/// manager's runtime dir); said with the user's name when there is one to suggest.
pub(crate) fn as_user_hint(cmd: &str) -> String {
    format!(
        "runuser -l USER -c '{cmd}' (in ai-sandbox's source tree, scripts/as-user {cmd} does this with the environment podman needs)"
    )
}

/// The first subordinate id range start (a multiple of 65536, at least 100000) past every range
/// in these /etc/subuid and /etc/subgid texts, so the suggested line overlaps none.
pub(crate) fn free_subid_start(texts: &[&str]) -> u64 {
    let end = texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| {
            let mut f = l.split(':').skip(1);
            Some(f.next()?.trim().parse::<u64>().ok()? + f.next()?.trim().parse::<u64>().ok()?)
        })
        .max()
        .unwrap_or(0);
    end.max(100_000).div_ceil(65_536) * 65_536
}

fn user_name() -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::getuid()).ok().flatten().map(|u| u.name)
}

fn has_subids(file: &str) -> Result<String, String> {
    let name = user_name().unwrap_or_default();
    let uid = nix::unistd::getuid().to_string();
    let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
    text.lines()
        .find(|l| l.split(':').next().is_some_and(|u| u == name || u == uid))
        .map(|l| l.to_string())
        .ok_or_else(|| format!("no entry for {name} in {file}"))
}

pub fn run() -> anyhow::Result<i32> {
    let mut checks = vec![Check {
        name: "not running as root",
        result: if nix::unistd::getuid().is_root() {
            Err("you are root; rootless podman cannot use pasta as root".into())
        } else {
            Ok("uid ok".into())
        },
        fix: format!("run as a regular user; from a root shell: {}", as_user_hint("ai-sandbox doctor")),
    }];
    checks.push(Check {
        name: "podman >= 5",
        result: output("podman", &["version", "--format", "{{.Client.Version}}"]).and_then(|v| {
            let v = v.trim().to_string();
            match v.split('.').next().and_then(|m| m.parse::<u32>().ok()) {
                Some(m) if m >= 5 => Ok(format!("podman {v}")),
                _ => Err(format!("podman {v} is too old")),
            }
        }),
        fix: "sudo scripts/install-deps   (podman 5 from Debian trixie)".into(),
    });
    checks.push(Check {
        name: "pasta with --map-host-loopback",
        result: output("pasta", &["--help"]).and_then(|h| {
            if h.contains("--map-host-loopback") {
                Ok("pasta ok".into())
            } else {
                Err("this pasta lacks --map-host-loopback (needs passt >= 2024-08)".into())
            }
        }),
        fix: "sudo scripts/install-deps   (passt from Debian trixie)".into(),
    });
    let nft = ["/usr/sbin/nft", "/sbin/nft"].into_iter().map(PathBuf::from).find(|p| p.exists());
    checks.push(Check {
        name: "nft",
        result: nft
            .map(|p| format!("{}", p.display()))
            .ok_or_else(|| "nft not found in /usr/sbin or /sbin".into()),
        fix: "sudo apt-get install -y nftables".into(),
    });
    checks.push(Check {
        name: "/dev/net/tun usable",
        result: std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .map(|_| "ok".into())
            .map_err(|e| format!("/dev/net/tun: {e}")),
        fix: "sudo chmod 666 /dev/net/tun".into(),
    });
    let taken: Vec<String> =
        ["/etc/subuid", "/etc/subgid"].iter().filter_map(|f| std::fs::read_to_string(f).ok()).collect();
    let start = free_subid_start(&taken.iter().map(String::as_str).collect::<Vec<_>>());
    for file in ["/etc/subuid", "/etc/subgid"] {
        checks.push(Check {
            name: if file.ends_with("uid") { "subordinate uids" } else { "subordinate gids" },
            result: has_subids(file),
            fix: format!("echo \"$USER:{start}:65536\" | sudo tee -a /etc/subuid /etc/subgid   (a range no entry there uses)"),
        });
    }
    if checks.iter().all(|c| c.result.is_ok()) {
        checks.push(Check {
            name: "OCI runtime starts a container",
            result: runtime_works(),
            fix: "on cgroup v1 hosts: printf '[engine]\\nruntime = \"runc\"\\n' >> ~/.config/containers/containers.conf".into(),
        });
    }
    let mut failed = 0;
    for c in &checks {
        match &c.result {
            Ok(detail) => println!("ok    {:32} {}", c.name, detail.lines().next().unwrap_or("")),
            Err(why) => {
                failed += 1;
                println!("FAIL  {:32} {why}\n      fix: {}", c.name, c.fix);
            }
        }
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

fn runtime_works() -> Result<String, String> {
    // A root directory like a session's (see `plan::root`), in a directory of its own.
    let tmp = tempfile::tempdir().map_err(|e| format!("making a temporary directory: {e}"))?;
    let argv: Vec<String> = ["-v", "/usr:/usr:ro"].iter().map(|s| s.to_string()).collect();
    let root = crate::plan::root::skeleton(tmp.path().join("root"), &argv);
    crate::launch::make_root(&root).map_err(|e| format!("{e:#}"))?;
    let dir = root.dir.display().to_string();
    let ran = output(
        "podman",
        &[
            "run",
            "--rm",
            "--network",
            "none",
            "--read-only",
            "-v",
            "/usr:/usr:ro",
            "--rootfs",
            &dir,
            "/bin/true",
        ],
    );
    let _ = crate::launch::remove_tree(tmp.path(), std::path::Path::new("podman"));
    ran.map(|_| "podman run --read-only --rootfs ... /bin/true works".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_suggested_subordinate_range_overlaps_none_in_use() {
        assert_eq!(super::free_subid_start(&[]), 131_072);
        assert_eq!(super::free_subid_start(&["aisb:100000:65536\n", "aisb:100000:65536\n"]), 196_608);
        assert_eq!(super::free_subid_start(&["a:100000:65536\nb:165536:65536\n# c\nbad\n", ""]), 262_144);
        assert_eq!(super::free_subid_start(&["a:1000000:65536\n"]), 1_114_112);
    }
}
