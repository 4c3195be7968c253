//! `memory = SIZE` and `pids = N` on the platform the suite runs on. Rootless podman gets a
//! cgroup of its own only on cgroup v2 (delegated by the user's systemd manager): there the plan
//! passes `--memory` and `--pids-limit`, and the kernel enforces them. On cgroup v1 ("hybrid",
//! cgroupfs) a rootless container has no cgroup of its own: the plan passes neither, the launch
//! says memory is not enforced, and the process limit holds through `--ulimit nproc` alone.
//! Each test asserts what is true where it runs (scripts/test runs it on this machine kind,
//! cgroup v1; scripts/test-vm matrix on both), so neither platform is skipped.

use crate::harness::*;

fn cgroup_v2() -> bool {
    std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// A Python command that holds MIB MiB of touched memory, then says so.
fn hold(mib: u32) -> String {
    format!("x = b'x' * ({mib} << 20); print('held {mib} MiB', flush=True)")
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn memory_past_its_limit_is_killed_where_cgroup_v2_enforces_it_and_said_unenforced_elsewhere() {
    let p = Project::new("memory");
    p.config("memory = 64m\n");
    // Control: a process well under the limit runs, on every platform.
    let small = sandbox(&p, &["--", "/usr/bin/python3", "-c", &hold(16)], &[]);
    small.ok();
    assert!(small.stdout.contains("held 16 MiB"), "{}\n{}", small.stdout, small.stderr);
    // Bounded at 256 MiB: were the limit gone, the test must not take the machine's memory.
    let big = sandbox(&p, &["--", "/usr/bin/python3", "-c", &hold(256)], &[]);
    if cgroup_v2() {
        assert!(!big.stdout.contains("held"), "256 MiB were held under memory = 64m: {}", big.stdout);
        assert_eq!(big.code, 137, "killed (SIGKILL, 128+9) and passed through; stderr:\n{}", big.stderr);
        // What the user needs to know: it was the sandbox's memory limit, not a crash.
        assert!(
            big.stderr.contains("memory") && big.stderr.contains("64m"),
            "the launch must say the command was killed at its memory limit (memory = 64m); stderr:\n{}",
            big.stderr
        );
        assert!(
            !small.stderr.contains("not enforced"),
            "cgroup v2 enforces memory; the launch said otherwise:\n{}",
            small.stderr
        );
    } else {
        big.ok();
        assert!(big.stdout.contains("held 256 MiB"), "{}", big.stdout);
        assert!(
            big.stderr.contains("memory = 64m: not enforced on this host"),
            "cgroup v1: the launch says the limit does not hold; stderr:\n{}",
            big.stderr
        );
    }
}

/// Forks up to N children that wait, counts how many it got and why it stopped, then reads the
/// pids controller's files of its own cgroup (a cgroup namespace of its own on v2).
const FORKS: &str = r#"
import os, sys, time
kids, err = [], "none"
try:
    for _ in range(int(sys.argv[1])):
        pid = os.fork()
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    err = e.strerror
print(f"forked={len(kids)} error={err}")
for name in ("pids.max", "pids.events"):
    try:
        print(name + "=" + open("/sys/fs/cgroup/" + name).read().strip().replace("\n", ",").replace(" ", ":"))
    except OSError:
        print(name + "=absent")
for k in kids:
    os.kill(k, 9)
for k in kids:
    os.waitpid(k, 0)
"#;

fn field<'a>(out: &'a str, name: &str) -> &'a str {
    out.split(|c: char| c.is_whitespace())
        .find_map(|w| w.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {name}= in:\n{out}"))
}

/// Holds N children that sleep until the file `done` appears (the harness writes it when the
/// `Running` is dropped), after writing the file `held`.
const HOLD: &str = r#"
import os, sys, time
kids = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        while not os.path.exists("done"):
            time.sleep(0.2)
        os._exit(0)
    kids.append(pid)
open("held", "w").write(str(len(kids)))
for k in kids:
    os.waitpid(k, 0)
"#;

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn pids_is_the_cgroups_limit_on_cgroup_v2_and_the_process_limit_on_v1_and_counts_one_sandbox_only() {
    let p = Project::new("pids");
    p.config("pids = 32\n");
    std::fs::write(p.path("forks.py"), FORKS).unwrap();
    chown_user(&p.path("forks.py"));
    let v2 = cgroup_v2();
    // The plan: the cgroup's limit where a rootless container has a cgroup (v2), else nproc.
    let dry = sandbox(&p, &["--dry-run", "--", "true"], &[]);
    dry.ok();
    // The podman command, printed one shell-quoted argument per line, as its argv.
    let cmd: Vec<&str> =
        dry.stdout.lines().skip_while(|l| l.starts_with('#')).take_while(|l| !l.is_empty()).collect();
    let argv = shlex::split(&cmd.join("\n").replace(" \\\n", " ")).expect("shell words");
    let has = |a: &str, b: &str| argv.windows(2).any(|w| w[0] == a && w[1] == b);
    assert_eq!(has("--pids-limit", "32"), v2, "--pids-limit on cgroup v2:\n{}", dry.stdout);
    assert_eq!(has("--ulimit", "nproc=32:32"), !v2, "nproc on cgroup v1 only:\n{}", dry.stdout);

    // Another sandbox of the same user holds 60 processes the whole time: the limit counts the
    // sandbox's own processes, not the user's (under crun, nproc counted podman's, conmon's and
    // every other sandbox's too: 2 children here).
    let other = Project::new("pids-other");
    std::fs::write(other.path("hold.py"), HOLD).unwrap();
    chown_user(&other.path("hold.py"));
    let holder = spawn_sandbox(&other, &["--", "/usr/bin/python3", "hold.py", "60"]);
    assert!(
        wait_for(60, || std::fs::read_to_string(other.path("held")).is_ok_and(|n| n == "60")),
        "the other sandbox did not come to hold 60 processes"
    );
    let r = sandbox(&p, &["--", "/usr/bin/python3", "forks.py", "80"], &[]);
    r.ok();
    drop(holder);
    let forked: usize = field(&r.stdout, "forked").parse().unwrap();
    // Control: most of the 32 were had (python and the runtime's init take some); the rest refused.
    assert!((25..=31).contains(&forked), "{forked} children under pids = 32:\n{}", r.stdout);
    assert!(r.stdout.contains("error=Resource temporarily unavailable"), "{}", r.stdout);
    if v2 {
        // The cgroup refused them: its own count, nothing else of the user's.
        assert_eq!(field(&r.stdout, "pids.max"), "32", "{}", r.stdout);
        let events = field(&r.stdout, "pids.events");
        let refused: u64 = events.strip_prefix("max:").and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(refused > 0, "the pids controller refused none: {events}");
    } else {
        // No cgroup of the sandbox's own on v1: the process limit alone refused them.
        assert_ne!(field(&r.stdout, "pids.max"), "32", "{}", r.stdout);
    }
}
