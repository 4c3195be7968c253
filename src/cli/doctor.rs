//! `ai-sandbox doctor`: can this machine run sandboxes? Each check that fails prints the
//! command that fixes it (the same steps `scripts/install-deps` performs). Then what the
//! platform means for a sandbox (`platform`, pure): the cgroup version and the controllers
//! delegated to the user (what `memory =` and the process limit can hold), the OCI runtime and
//! cgroup manager podman uses, systemd's linger and the login's runtime directory, and a host
//! with no default route.

use std::path::PathBuf;
use std::process::Command;

struct Check {
    name: &'static str,
    result: Result<String, String>,
    fix: String,
}

/// What podman says of the platform (`podman info`), and what the host says around it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Platform {
    /// `v1` or `v2`.
    pub(crate) cgroup: String,
    /// The controllers delegated to this user (cgroup v2).
    pub(crate) controllers: Vec<String>,
    pub(crate) manager: String,
    pub(crate) runtime: String,
    /// systemd runs as PID 1 (`/run/systemd/system` exists).
    pub(crate) systemd: bool,
    /// systemd keeps this user's processes after logout (None: not known).
    pub(crate) linger: Option<bool>,
    /// XDG_RUNTIME_DIR, and whether it is a directory of this user's, mode 0700.
    pub(crate) runtime_dir: Option<(String, bool)>,
    /// `/proc/net/route` (None: not read).
    pub(crate) routes: Option<String>,
}

/// What each fact of the platform means for a sandbox: (name, Ok(meaning) or Err(problem), fix).
pub(crate) fn platform(p: &Platform) -> Vec<(&'static str, Result<String, String>, String)> {
    let mut out = Vec::new();
    let has = |c: &str| p.controllers.iter().any(|x| x == c);
    let cgroup = match p.cgroup.as_str() {
        "v2" if has("memory") && has("pids") => Ok(format!(
            "cgroup v2, {} delegated: `memory =` and the process limit are enforced by podman",
            p.controllers.join(" ")
        )),
        "v2" => Err(format!(
            "cgroup v2, but only [{}] delegated to you: `memory =` or `--pids-limit` cannot be enforced",
            p.controllers.join(" ")
        )),
        v => Ok(format!(
            "cgroup {v}: `memory =` is not enforced (rootless podman limits memory on cgroup v2 only); the process limit holds through ulimit nproc"
        )),
    };
    out.push((
        "cgroups",
        cgroup,
        "systemd: sudo systemctl edit user@.service with [Service] Delegate=memory pids cpu, then log in again".into(),
    ));
    let runtime = match (p.runtime.as_str(), p.cgroup.as_str()) {
        ("crun", "v1") => Err("crun on cgroup v1: crun refuses hybrid hosts".into()),
        ("", _) => Err("podman names no OCI runtime".into()),
        (r, _) => Ok(format!("{r}, cgroup manager {}", if p.manager.is_empty() { "?" } else { &p.manager })),
    };
    out.push((
        "OCI runtime",
        runtime,
        "on cgroup v1 hosts: printf '[engine]\\nruntime = \"runc\"\\n' >> ~/.config/containers/containers.conf".into(),
    ));
    if p.manager == "systemd" {
        let session = match &p.runtime_dir {
            Some((d, true)) => {
                Ok(format!("{d} (the systemd cgroup manager talks to your user's systemd through it)"))
            }
            Some((d, false)) => Err(format!("{d} is not a directory of yours with mode 0700")),
            None => {
                Err("XDG_RUNTIME_DIR is not set: the systemd cgroup manager needs a login session".into())
            }
        };
        out.push((
            "login session",
            session,
            format!(
                "log in as the user (ssh, a desktop), or from root: {}",
                as_user_hint("ai-sandbox doctor")
            ),
        ));
    }
    if p.systemd {
        let linger = match p.linger {
            Some(true) => Ok("on: sandboxes and the gate keep running after you log out".into()),
            Some(false) => Ok("off: logging out ends your sandboxes and the gate (systemd stops your processes); fine on a desktop".into()),
            None => Ok("unknown".into()),
        };
        out.push(("systemd linger", linger, "sudo loginctl enable-linger $USER".into()));
    }
    if let Some(routes) = &p.routes {
        let route = match crate::plan::podman::offline(Some(routes)) {
            true => {
                "none (offline): the sandbox takes pasta's local addresses (169.254.2.1), so the gate and host ports (100.64.0.1:PORT) work; nothing beyond this machine is reachable anyway"
            }
            false => "present",
        };
        out.push(("IPv4 default route", Ok(route.into()), String::new()));
    }
    out
}

/// The platform as this machine has it.
fn read_platform() -> Platform {
    let info: serde_json::Value = output("podman", &["info", "--format", "json"])
        .ok()
        .and_then(|t| serde_json::from_str(t.trim_start_matches(|c| c != '{')).ok())
        .unwrap_or_default();
    let h = &info["host"];
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let user = user_name().unwrap_or_default();
    let dir = std::env::var("XDG_RUNTIME_DIR").ok();
    let mine = |d: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(d).is_ok_and(|m| {
            m.is_dir() && m.uid() == nix::unistd::getuid().as_raw() && m.mode() & 0o777 == 0o700
        })
    };
    Platform {
        cgroup: text(&h["cgroupVersion"]),
        controllers: h["cgroupControllers"]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c.as_str().map(String::from)).collect())
            .unwrap_or_default(),
        manager: text(&h["cgroupManager"]),
        runtime: text(&h["ociRuntime"]["name"]),
        systemd: std::path::Path::new("/run/systemd/system").exists(),
        linger: std::path::Path::new("/var/lib/systemd/linger")
            .exists()
            .then(|| std::path::Path::new("/var/lib/systemd/linger").join(&user).exists()),
        runtime_dir: dir.map(|d| (d.clone(), mine(&d))),
        routes: std::fs::read_to_string("/proc/net/route").ok(),
    }
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
    subids_of(&text, &name, &uid).map_err(|e| format!("{e} in {file}"))
}

/// This user's line of an /etc/subuid or /etc/subgid text, refused when there is none or when its
/// range overlaps another user's (the two users' containers would share ids, and could reach
/// each other's files).
pub(crate) fn subids_of(text: &str, name: &str, uid: &str) -> Result<String, String> {
    let range = |l: &str| -> Option<(String, u64, u64)> {
        let mut f = l.split(':');
        let who = f.next()?.trim().to_string();
        Some((who, f.next()?.trim().parse().ok()?, f.next()?.trim().parse().ok()?))
    };
    let mine = |who: &str| who == name || who == uid;
    let line = text
        .lines()
        .find(|l| l.split(':').next().is_some_and(mine))
        .ok_or_else(|| format!("no entry for {name}"))?;
    let Some((_, start, count)) = range(line) else {
        return Err(format!("`{line}` is not USER:START:COUNT"));
    };
    let other =
        text.lines().filter_map(range).find(|(who, s, c)| !mine(who) && *s < start + count && start < s + c);
    match other {
        Some((who, s, c)) => {
            Err(format!("{line} overlaps {who}'s range {s}:{c}: both users' containers would share ids"))
        }
        None => Ok(line.to_string()),
    }
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
            fix: format!(
                "give $USER a range no entry uses: sudo sed -i \"/^$USER:/d\" /etc/subuid /etc/subgid && echo \"$USER:{start}:65536\" | sudo tee -a /etc/subuid /etc/subgid && podman system migrate"
            ),
        });
    }
    if checks.iter().all(|c| c.result.is_ok()) {
        for (name, result, fix) in platform(&read_platform()) {
            checks.push(Check { name, result, fix });
        }
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
    use super::*;

    #[test]
    fn a_subordinate_range_that_overlaps_another_users_is_refused() {
        let text = "alice:100000:65536\nbob:165536:65536\n";
        assert_eq!(subids_of(text, "bob", "1001"), Ok("bob:165536:65536".into()));
        let bad = "alice:100000:65536\nbob:150000:65536\n";
        let e = subids_of(bad, "bob", "1001").unwrap_err();
        assert!(e.contains("overlaps alice's range 100000:65536"), "{e}");
        assert!(subids_of(bad, "carol", "1002").unwrap_err().contains("no entry for carol"));
        assert_eq!(subids_of("1001:200000:65536\n", "bob", "1001"), Ok("1001:200000:65536".into()), "by uid");
        // The edges: a range that ends where another begins does not overlap.
        assert!(subids_of("a:100000:65536\nb:165536:1\n", "b", "9").is_ok());
        assert!(subids_of("a:100000:65536\nb:165535:1\n", "b", "9").is_err());
    }

    fn names(p: &Platform) -> Vec<(&'static str, bool)> {
        platform(p).iter().map(|(n, r, _)| (*n, r.is_ok())).collect()
    }

    #[test]
    fn each_platform_fact_says_what_it_means_for_a_sandbox() {
        let v1 = Platform {
            cgroup: "v1".into(),
            manager: "cgroupfs".into(),
            runtime: "runc".into(),
            ..Default::default()
        };
        assert_eq!(names(&v1), [("cgroups", true), ("OCI runtime", true)]);
        assert!(platform(&v1)[0].1.as_ref().unwrap().contains("`memory =` is not enforced"));
        let crun_v1 = Platform { runtime: "crun".into(), ..v1.clone() };
        assert_eq!(names(&crun_v1)[1], ("OCI runtime", false));
        let v2 = Platform {
            cgroup: "v2".into(),
            controllers: ["cpu", "memory", "pids"].map(String::from).to_vec(),
            manager: "systemd".into(),
            runtime: "crun".into(),
            systemd: true,
            linger: Some(true),
            runtime_dir: Some(("/run/user/1000".into(), true)),
            routes: Some("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\neth0\t00000000\t0102A8C0\t0003\t0\t0\t0\t00000000\n".into()),
        };
        assert_eq!(
            names(&v2),
            [
                ("cgroups", true),
                ("OCI runtime", true),
                ("login session", true),
                ("systemd linger", true),
                ("IPv4 default route", true)
            ]
        );
        assert!(platform(&v2)[0].1.as_ref().unwrap().contains("enforced by podman"));
        assert_eq!(platform(&v2)[4].1, Ok("present".into()));
        let undelegated = Platform { controllers: vec!["cpu".into()], ..v2.clone() };
        assert!(platform(&undelegated)[0].1.as_ref().unwrap_err().contains("cannot be enforced"));
        let no_session = Platform { runtime_dir: None, ..v2.clone() };
        assert_eq!(names(&no_session)[2], ("login session", false));
        let not_mine = Platform { runtime_dir: Some(("/tmp".into(), false)), ..v2.clone() };
        assert_eq!(names(&not_mine)[2], ("login session", false));
        let offline = Platform {
            routes: Some(
                "Iface\tDestination\tGateway\nwlan0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n".into(),
            ),
            ..v2.clone()
        };
        assert!(platform(&offline)[4].1.as_ref().unwrap().starts_with("none (offline)"));
        let no_linger = Platform { linger: Some(false), ..v2 };
        assert!(platform(&no_linger)[3].1.as_ref().unwrap().starts_with("off: logging out ends"));
    }

    #[test]
    fn the_suggested_subordinate_range_overlaps_none_in_use() {
        assert_eq!(super::free_subid_start(&[]), 131_072);
        assert_eq!(super::free_subid_start(&["aisb:100000:65536\n", "aisb:100000:65536\n"]), 196_608);
        assert_eq!(super::free_subid_start(&["a:100000:65536\nb:165536:65536\n# c\nbad\n", ""]), 262_144);
        assert_eq!(super::free_subid_start(&["a:1000000:65536\n"]), 1_114_112);
    }
}
