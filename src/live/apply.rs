//! Applying a live change to a running sandbox (side effects; the decisions are in `live`).
//!
//! The nftables sets are changed (and the refusal records read) from outside: `nsenter` joins the
//! container's user namespace, which this user owns, and its network namespace, by the pid podman
//! wrote to the session directory; one `nft -f` transaction flushes and refills the allow and deny sets.
//! (Measured: 7 ms, against about 80 ms through `podman inspect` and `podman unshare`.) The
//! sandbox itself still holds no capability.

use crate::gate::control::{self, Request};
use crate::live::{Change, Record, Running, merged};
use anyhow::{Context, bail};
use std::fs;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Every sandbox of this user whose launcher is alive, oldest first.
pub(crate) fn running(runtime: &Path) -> Vec<Running> {
    let Ok(entries) = fs::read_dir(runtime.join("sessions")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let pid_file = e.path().join(crate::plan::session::PID_FILE);
        let Some(pid) = fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse::<i32>().ok()) else {
            continue;
        };
        if !crate::sys::process::alive(pid) {
            continue;
        }
        let age = fs::metadata(&pid_file)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .map_or(0, |d| d.as_secs());
        let path = e.path().join(crate::plan::session::LIVE_FILE);
        let record = read_locked(&path).and_then(|t| serde_json::from_str::<Record>(&t).ok());
        let session = e.file_name().to_string_lossy().into_owned();
        let execs = execs(&e.path());
        // Counted inside the sandbox, by its rules: read there (an nft run, ~7 ms, only for a
        // sandbox with such lines).
        let net_budgets = match record.as_ref().map(|r| &r.policy.net_budgets) {
            Some(budgets) if !budgets.is_empty() => nft_in(&e.path(), &QUOTAS, None)
                .map(|json| crate::live::net_budget_use(budgets, &json))
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        out.push(Running { session, pid, age, record, path, execs, net_budgets });
    }
    out.sort_by(|a, b| b.age.cmp(&a.age).then(a.session.cmp(&b.session)));
    out
}

/// The commands `ai-sandbox exec` runs in the sandbox of `session_dir`, oldest first: each record
/// whose pid is still the `podman exec` into its container (its command line names the container;
/// a record of an exec that ended, or a pid taken since by another process, is not listed).
fn execs(session_dir: &Path) -> Vec<crate::live::Exec> {
    use crate::contract::execd::{EXEC_DIR, Execd};
    let Ok(entries) = fs::read_dir(session_dir.join(EXEC_DIR)) else { return Vec::new() };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Some(rec) =
            fs::read_to_string(e.path()).ok().and_then(|t| serde_json::from_str::<Execd>(&t).ok())
        else {
            continue;
        };
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !cmdline.split(|b| *b == 0).any(|arg| arg == rec.container.as_bytes()) {
            continue;
        }
        let age = e.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        out.push(crate::live::Exec { pid, age: age.map_or(0, |d| d.as_secs()), command: rec.command });
    }
    out.sort_by(|a, b| b.age.cmp(&a.age).then(a.pid.cmp(&b.pid)));
    out
}

/// The live records of `project`'s running sandboxes that have an allowlist (`--net allow`).
pub(crate) fn sessions(runtime: &Path, project: &Path) -> Vec<PathBuf> {
    running(runtime)
        .into_iter()
        .filter(|r| {
            r.record
                .as_ref()
                .is_some_and(|rec| rec.project == project && rec.net == crate::policy::NetMode::Allow)
        })
        .map(|r| r.path)
        .collect()
}

/// The container's first process, from the pidfile podman wrote in the session directory.
fn container_pid(session_dir: &Path) -> anyhow::Result<u32> {
    let path = session_dir.join(crate::plan::session::CONTAINER_PID_FILE);
    let text = fs::read_to_string(&path)
        .with_context(|| format!("the sandbox has not started yet (no {})", path.display()))?;
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .with_context(|| format!("{} holds no pid", path.display()))
}

/// Runs nft with `args` in the sandbox's network namespace: joined from outside, through the
/// container's user namespace, which this user owns (so nft has CAP_NET_ADMIN there, and the
/// sandbox's own processes, which dropped every capability, still have none).
fn nft_in(session_dir: &Path, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    let pid = container_pid(session_dir)?;
    nft_at(&["-t", &pid.to_string(), "-U", "-n", "--"], args, stdin)
}

/// The sandbox's user and network namespaces, held open by this process: they outlive the
/// container, so what its rules recorded can still be read once its command has exited (a
/// command that ends within the launcher's polling interval).
pub(crate) struct Held {
    user: fs::File,
    net: fs::File,
}

impl Held {
    /// Opens the namespaces of the session's container, once its pid file is there.
    pub(crate) fn open(session_dir: &Path) -> Option<Held> {
        let pid = container_pid(session_dir).ok()?;
        let open = |ns: &str| fs::File::open(format!("/proc/{pid}/ns/{ns}")).ok();
        Some(Held { user: open("user")?, net: open("net")? })
    }
}

/// `refused`, through namespaces held open (see `Held`).
pub(crate) fn refused_held(session_dir: &Path, held: &Held) -> anyhow::Result<Vec<crate::live::Direct>> {
    use std::os::fd::AsRawFd;
    let me = std::process::id();
    let user = format!("--user=/proc/{me}/fd/{}", held.user.as_raw_fd());
    let net = format!("--net=/proc/{me}/fd/{}", held.net.as_raw_fd());
    refused_with(session_dir, |args| nft_at(&[&user, &net, "--"], args, None))
}

fn nft_at(enter: &[&str], args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    let mut child = Command::new("nsenter")
        .args(enter)
        .arg(crate::plan::session::nft_program(std::env::var("AISB_NFT").ok(), || which::which("nft").ok()))
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nsenter nft")?;
    if let Some(text) = stdin {
        child.stdin.take().context("nft's stdin")?.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft in the sandbox's network namespace failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Loads `script` into the sandbox's network namespace in one transaction.
fn nft_script(session_dir: &Path, script: &str) -> anyhow::Result<()> {
    nft_in(session_dir, &["-f", "-"], Some(script)).map(|_| ())
}

/// `nft` arguments that list the sandbox's quotas (its `budget = ADDRESS` lines).
const QUOTAS: [&str; 6] = ["-j", "list", "quotas", "table", "inet", crate::plan::ruleset::TABLE];

/// What the rules of a running sandbox have refused so far (see `ruleset::REFUSED_V4`).
pub(crate) fn refused(session_dir: &Path) -> anyhow::Result<Vec<crate::live::Direct>> {
    refused_with(session_dir, |args| nft_in(session_dir, args, None))
}

fn refused_with(
    session_dir: &Path,
    nft: impl Fn(&[&str]) -> anyhow::Result<String> + Sync,
) -> anyhow::Result<Vec<crate::live::Direct>> {
    let mut out = Vec::new();
    let record = read_locked(&session_dir.join(crate::plan::session::LIVE_FILE))
        .and_then(|text| serde_json::from_str::<Record>(&text).ok());
    let budgets = record.as_ref().map_or(&[][..], |r| &r.policy.net_budgets[..]);
    // Both sets (and the quotas, when there are any) at once, each its own nft: the launcher
    // waits for this last read before it says its summary and exits (one after the other was
    // ~10 ms of every launch).
    let table = crate::plan::ruleset::TABLE;
    let mut reads: Vec<Vec<&str>> = [crate::plan::ruleset::REFUSED_V4, crate::plan::ruleset::REFUSED_V6]
        .iter()
        .map(|set| vec!["-j", "list", "set", "inet", table, set])
        .collect();
    if !budgets.is_empty() {
        reads.push(QUOTAS.to_vec());
    }
    let mut lists: Vec<anyhow::Result<String>> = std::thread::scope(|s| {
        let nft = &nft;
        let running: Vec<_> = reads.iter().map(|args| s.spawn(move || nft(args))).collect();
        running
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("reading a set failed"))))
            .collect()
    });
    let quotas = if budgets.is_empty() { None } else { lists.pop() };
    for json in lists {
        out.extend(crate::live::parse_refused(&json?));
    }
    // Which were refused by a deny entry (as the sandbox's live record has them now), and which
    // past a spent budget. A quota listing that fails leaves the refusals said, just not marked
    // as over budget (the sets' own reads above decide whether anything is said at all).
    let spent: Vec<&crate::policy::budget::NetBudget> = match quotas {
        Some(Ok(json)) => {
            let used = crate::live::net_budget_use(budgets, &json);
            budgets
                .iter()
                .filter(|b| used.iter().any(|u| u.key == b.net.to_string() && u.sent >= b.bytes))
                .collect()
        }
        Some(Err(_)) | None => Vec::new(),
    };
    if let Some(record) = &record {
        for d in out.iter_mut().filter(|d| d.proto == crate::live::Proto::Tcp) {
            d.denied_by = crate::gate::decide::deny_net(&record.policy, d.addr, d.port);
            d.over_budget = spent.iter().find(|b| b.net.contains(d.addr)).map(|b| (*b).clone());
        }
    }
    // The self-check's own probe, refused before the command started: not the agent's.
    let canary = fs::read_to_string(session_dir.join(crate::plan::session::CANARY_FILE)).unwrap_or_default();
    out.retain(|d| {
        !(d.proto == crate::live::Proto::Tcp && format!("{}:{}", d.addr, d.port) == canary.trim())
    });
    Ok(out)
}

/// Sends the session's new policy to the gate. A gate that does not say back a limit the change
/// adds (one of an older version, which would hold the change without it) gets the old policy
/// back, and the change is refused.
fn gate_update(runtime: &Path, old: &Record, new: &Record) -> anyhow::Result<()> {
    let update = |r: &Record| Request::Update { session: r.session.clone(), policy: r.policy.clone() };
    let reply = match control::call(runtime, &update(new))? {
        Some(reply) => reply,
        None => bail!("the gate is not running"),
    };
    if let Some(why) = reply.refusal() {
        bail!("the gate refused the change: {why}");
    }
    let Some(what) = control::unheld_change(&old.policy, &new.policy, &reply.as_registered()) else {
        return Ok(());
    };
    let restored = match control::call(runtime, &update(old)) {
        Ok(Some(r)) => match r.refusal() {
            None => String::new(),
            Some(why) => format!(" (and it refused the policy before the change back: {why})"),
        },
        Ok(None) => " (and it stopped before the policy before the change could go back)".into(),
        Err(e) => format!(" (and giving it back the policy before the change failed: {e:#})"),
    };
    Err(crate::error::hinted(
        format!("the running egress gate is of an older version of ai-sandbox and {what}{restored}"),
        "put the line in the config and start the sandbox again once your other sandboxes have ended (the old gate exits when idle)".to_string(),
    )
    .into())
}

/// A session's record, read under a shared lock: `allow` rewrites it in place under its
/// exclusive one, and a reader between its truncation and its write would see no record (a
/// second `allow` at the same moment said no sandbox was running: seen in the e2e suite).
fn read_locked(path: &Path) -> Option<String> {
    let file = fs::File::open(path).ok()?;
    let mut file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockShared).ok()?;
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    Some(text)
}

/// See `Host::live_allow`.
pub(crate) fn allow(runtime: &Path, record: &Path, change: &Change) -> anyhow::Result<()> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(record)
        .with_context(|| format!("opening {}", record.display()))?;
    let mut file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .with_context(|| format!("locking {}", record.display()))?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let old: Record = serde_json::from_str(&text).with_context(|| format!("reading {}", record.display()))?;
    let new = merged(&old, change).map_err(anyhow::Error::msg)?;
    if new == old {
        return Ok(());
    }
    let session_dir = record.parent().context("the record has no session directory")?;
    // The sets and the quotas' sizes, in one transaction.
    let rules = |r: &Record| {
        crate::plan::ruleset::set_script(&r.policy.allow.nets, &r.policy.allow.deny_nets)
            + &crate::plan::ruleset::quota_script(&r.policy.net_budgets)
    };
    nft_script(session_dir, &rules(&new))?;
    if new.gate
        && let Err(e) = gate_update(runtime, &old, &new)
    {
        // Put the rules back as they were: a change lands at both layers or at neither.
        let undo = nft_script(session_dir, &rules(&old));
        return Err(e.context(match undo {
            Ok(()) => "nothing was changed".to_string(),
            Err(u) => format!("and restoring the sandbox's rules failed too: {u:#}"),
        }));
    }
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(serde_json::to_string(&new)?.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate on `dir`'s control socket that answers each request with `answer(request)`;
    /// returns the requests it read once `n` have come.
    fn fake_gate(
        dir: &Path,
        n: usize,
        answer: fn(&Request) -> crate::contract::control::Reply,
    ) -> std::thread::JoinHandle<Vec<Request>> {
        use std::io::BufRead;
        let listener = std::os::unix::net::UnixListener::bind(control::socket_path(dir)).unwrap();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            for s in listener.incoming().take(n) {
                let mut s = s.unwrap();
                let mut line = String::new();
                std::io::BufReader::new(&s).read_line(&mut line).unwrap();
                let req: Request = serde_json::from_str(&line).unwrap();
                s.write_all(format!("{}\n", serde_json::to_string(&answer(&req)).unwrap()).as_bytes())
                    .unwrap();
                got.push(req);
            }
            got
        })
    }

    /// A live change that adds a limit the gate does not say it holds (an older gate's plain
    /// `ok`) is refused, and the gate gets the policy before the change back; a gate that says
    /// it holds the limit takes the change once.
    #[test]
    fn a_change_an_older_gate_would_hold_without_its_limit_is_refused_and_undone() {
        use crate::contract::control::Reply;
        let record = |budget: &str| Record {
            session: "s1".into(),
            container: "aisb-s1".into(),
            project: "/p".into(),
            net: crate::policy::NetMode::Allow,
            gate: true,
            tls: false,
            host_image: true,
            logins: Vec::new(),
            policy: crate::contract::SessionPolicy {
                budgets: vec![crate::policy::budget::host_line(budget)],
                ..crate::contract::SessionPolicy::default()
            },
        };
        let (old, new) = (record("a.test 1m"), record("a.test 1m/day"));
        fn policy(r: &Request) -> crate::contract::SessionPolicy {
            match r {
                Request::Update { policy, .. } => policy.clone(),
                other => panic!("{other:?}"),
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let older =
            fake_gate(dir.path(), 2, |_| serde_json::from_str(r#"{"ok":true,"port":1,"pid":2}"#).unwrap());
        let e = format!("{:#}", gate_update(dir.path(), &old, &new).unwrap_err());
        assert!(e.contains("older version") && e.contains("over a period"), "{e}");
        assert!(!e.contains("(and"), "the old policy went back: {e}");
        let sent: Vec<_> = older.join().unwrap().iter().map(policy).collect();
        assert_eq!(sent, [new.policy.clone(), old.policy.clone()], "the change, then the policy before it");
        // The control: this version's gate says it holds the period.
        let dir = tempfile::tempdir().unwrap();
        let current = fake_gate(dir.path(), 1, |_| Reply::updated(1, 2));
        gate_update(dir.path(), &old, &new).unwrap();
        assert_eq!(
            current.join().unwrap().iter().map(policy).collect::<Vec<_>>(),
            std::slice::from_ref(&new.policy)
        );
    }

    /// The launcher's read of a sandbox's refusals, with `nft` answering from fixed listings:
    /// a refusal to a spent network is marked over budget; a quota listing that fails leaves the
    /// refusals said, unmarked.
    #[test]
    fn refusals_are_read_with_the_quotas_and_said_even_when_the_quotas_do_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let budget = match crate::policy::budget::parse("10.0.0.0/24 1m") {
            Ok(crate::policy::budget::Line::Net(b)) => b,
            other => panic!("{other:?}"),
        };
        let record = Record {
            session: "s1".into(),
            container: "aisb-s1".into(),
            project: "/p".into(),
            net: crate::policy::NetMode::Allow,
            gate: false,
            tls: false,
            host_image: true,
            logins: Vec::new(),
            policy: crate::contract::SessionPolicy {
                net_budgets: vec![budget],
                ..crate::contract::SessionPolicy::default()
            },
        };
        let live = dir.path().join(crate::plan::session::LIVE_FILE);
        fs::write(&live, serde_json::to_string(&record).unwrap()).unwrap();
        let v4 = r#"{"nftables": [{"set": {"family": "inet", "name": "refused_v4", "table": "aisb", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 1, "elem": [{"concat": ["10.0.0.7", "tcp", 443]}, {"concat": ["192.0.2.1", "tcp", 80]}]}}]}"#;
        let v6 = r#"{"nftables": [{"set": {"family": "inet", "name": "refused_v6", "table": "aisb", "type": ["ipv6_addr", "inet_proto", "inet_service"], "handle": 2}}]}"#;
        let spent = r#"{"nftables": [{"quota": {"family": "inet", "name": "budget_0", "table": "aisb", "bytes": 1048576, "used": 1048576, "inv": true}}]}"#;
        let read = |quotas: Result<&'static str, &'static str>| {
            refused_with(dir.path(), |args| match args.get(2).copied() {
                Some("set") if args.contains(&crate::plan::ruleset::REFUSED_V4) => Ok(v4.to_string()),
                Some("set") => Ok(v6.to_string()),
                _ => quotas.map(str::to_string).map_err(|e| anyhow::anyhow!(e)),
            })
            .unwrap()
        };
        let over = |out: &[crate::live::Direct]| -> Vec<(String, bool)> {
            out.iter().map(|d| (d.addr.to_string(), d.over_budget.is_some())).collect()
        };
        assert_eq!(over(&read(Ok(spent))), [("10.0.0.7".to_string(), true), ("192.0.2.1".into(), false)]);
        assert_eq!(
            over(&read(Err("nft: quotas not listed"))),
            [("10.0.0.7".to_string(), false), ("192.0.2.1".into(), false)],
            "said, unmarked"
        );
    }
}
