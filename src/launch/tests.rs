//! The launch's order of effects, and what each failure leaves behind, through a recording
//! `Machine` that can make any call fail. The real calls are proven by the e2e suite.

use super::{Machine, run};
use crate::plan::{GuardSpec, Plan};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    PrivateDir(PathBuf),
    GiveLogins,
    TakeLogins,
    WriteSession,
    SettleLeftovers,
    Snapshot,
    OpenReview,
    CloseReview,
    StartKeeper,
    Podman,
    Settle,
    RemoveSessionDir,
    Warn(String),
}

/// Records every call; `fail` names the one that fails (with "boom").
struct Fake {
    calls: Vec<Call>,
    fail: Option<&'static str>,
    exit: i32,
}

impl Fake {
    fn new(fail: Option<&'static str>) -> Fake {
        Fake { calls: Vec::new(), fail, exit: 7 }
    }
    fn call(&mut self, c: Call, name: &str) -> anyhow::Result<()> {
        self.calls.push(c);
        match self.fail {
            Some(f) if f == name => anyhow::bail!("{name}: boom"),
            _ => Ok(()),
        }
    }
    fn names(&self) -> Vec<&'static str> {
        self.calls
            .iter()
            .map(|c| match c {
                Call::PrivateDir(_) => "private_dir",
                Call::GiveLogins => "give_logins",
                Call::TakeLogins => "take_logins",
                Call::WriteSession => "write_session",
                Call::SettleLeftovers => "settle_leftovers",
                Call::Snapshot => "snapshot",
                Call::OpenReview => "open_review",
                Call::CloseReview => "close_review",
                Call::StartKeeper => "keeper",
                Call::Podman => "podman",
                Call::Settle => "settle",
                Call::RemoveSessionDir => "remove_session_dir",
                Call::Warn(_) => "warn",
            })
            .collect()
    }
}

impl Machine for Fake {
    fn private_dir(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.call(Call::PrivateDir(dir.into()), "private_dir")
    }
    fn give_logins(&mut self, _: &crate::plan::Logins) -> anyhow::Result<Vec<String>> {
        self.call(Call::GiveLogins, "give_logins").map(|()| Vec::new())
    }
    fn take_logins(&mut self, _: &crate::plan::Logins) -> anyhow::Result<Vec<String>> {
        self.call(Call::TakeLogins, "take_logins").map(|()| Vec::new())
    }
    fn write_session(&mut self, _: &Plan) -> anyhow::Result<()> {
        self.call(Call::WriteSession, "write_session")
    }
    fn settle_leftovers(&mut self, _: &GuardSpec) -> anyhow::Result<()> {
        self.call(Call::SettleLeftovers, "settle_leftovers")
    }
    fn snapshot(&mut self, _: &GuardSpec, _: &str) -> anyhow::Result<Vec<String>> {
        self.call(Call::Snapshot, "snapshot").map(|()| Vec::new())
    }
    fn open_review(&mut self, _: &crate::plan::ReviewSpec) -> anyhow::Result<()> {
        self.call(Call::OpenReview, "open_review")
    }
    fn close_review(&mut self, _: &crate::plan::ReviewSpec) -> anyhow::Result<Vec<String>> {
        self.call(Call::CloseReview, "close_review").map(|()| vec!["waiting for review".into()])
    }
    fn start_keeper(&mut self, _: &Plan) -> anyhow::Result<Box<dyn std::io::Write>> {
        self.call(Call::StartKeeper, "keeper")?;
        Ok(Box::new(std::io::sink()))
    }
    fn run_podman(&mut self, _: &Plan, _: &mut dyn std::io::Write) -> anyhow::Result<i32> {
        self.call(Call::Podman, "podman")?;
        Ok(self.exit)
    }
    fn settle(&mut self, _: &GuardSpec) -> anyhow::Result<()> {
        self.call(Call::Settle, "settle")
    }
    fn remove_session_dir(&mut self, _: &Path) -> anyhow::Result<()> {
        self.call(Call::RemoveSessionDir, "remove_session_dir")
    }
    fn warn(&mut self, line: &str) {
        self.calls.push(Call::Warn(line.into()));
    }
}

/// A real plan, as `ai-sandbox -- true` builds it (image = host, an agent state store).
fn plan() -> Plan {
    let mut h = crate::host::FakeHost {
        cwd: PathBuf::from("/home/dev/app"),
        uid: 1000,
        vars: vec![("HOME".into(), "/home/dev".into()), ("XDG_RUNTIME_DIR".into(), "/run/user/1000".into())],
        ..Default::default()
    };
    let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    crate::cli::app::run(&mut h, &cli.run).unwrap();
    h.launched.pop().expect("a plan")
}

/// Every call of a launch that goes well, in order.
const ALL: [&str; 8] = [
    "private_dir",
    "write_session",
    "settle_leftovers",
    "snapshot",
    "keeper",
    "podman",
    "settle",
    "remove_session_dir",
];

#[test]
fn a_launch_prepares_records_starts_the_keeper_then_podman_and_always_settles() {
    let p = plan();
    let mut m = Fake::new(None);
    assert_eq!(run(&mut m, &p).unwrap(), 7, "podman's status is the launch's");
    assert_eq!(m.names(), ALL);
    assert_eq!(m.calls[0], Call::PrivateDir(p.sandbox_home.clone()), "the sandbox HOME first");
}

#[test]
fn each_failure_leaves_nothing_half_started_and_is_said_once() {
    let p = plan();
    // (failing call, the clean-up after it): every call up to the failing one is made, then
    // only the clean-up the state calls for; podman never runs without a record and a keeper.
    let cases: &[(&str, &[&str])] = &[
        ("private_dir", &[]),
        // A failed write undoes its own part (only it knows whether the dir is its own).
        ("write_session", &[]),
        ("settle_leftovers", &["remove_session_dir"]),
        ("snapshot", &["remove_session_dir"]),
        // The keeper will not start: no podman; what was recorded is settled, the dir removed.
        ("keeper", &["settle", "remove_session_dir"]),
        // podman missing or failing to start: settled and removed the same way.
        ("podman", &["settle", "remove_session_dir"]),
    ];
    for (fail, cleanup) in cases {
        let upto = ALL.iter().position(|c| c == fail).unwrap();
        let want: Vec<&str> = ALL[..=upto].iter().chain(cleanup.iter()).copied().collect();
        let mut m = Fake::new(Some(fail));
        let err = run(&mut m, &p).unwrap_err();
        assert_eq!(m.names(), want, "when {fail} fails");
        let text = format!("{err:#}");
        assert_eq!(text.matches("boom").count(), 1, "said once: {text}");
        assert!(!m.calls.iter().any(|c| matches!(c, Call::Warn(_))), "{fail}: also warned: {:?}", m.calls);
    }
    // The guard cannot settle: the launch fails with where the record is kept, after podman.
    let mut m = Fake::new(Some("settle"));
    let err = format!("{:#}", run(&mut m, &p).unwrap_err());
    assert!(err.contains("could not be verified or restored") && err.contains("boom"), "{err}");
    assert_eq!(m.names(), ALL);
    // Removing the session dir fails after a good run: a warning, and the command's status.
    let mut m = Fake::new(Some("remove_session_dir"));
    assert_eq!(run(&mut m, &p).unwrap(), 7);
    assert!(matches!(m.calls.last(), Some(Call::Warn(w)) if w.contains("boom")), "{:?}", m.calls);
}

/// Review mode: the upper layer is made after the record and before the keeper, and closed
/// (said) after the guard; a failure to make it starts nothing and removes the session dir.
#[test]
fn review_mode_opens_its_layer_before_podman_and_says_what_waits_after() {
    let mut h = crate::host::FakeHost {
        cwd: PathBuf::from("/home/dev/app"),
        uid: 1000,
        vars: vec![("HOME".into(), "/home/dev".into()), ("XDG_RUNTIME_DIR".into(), "/run/user/1000".into())],
        ..Default::default()
    };
    let cli =
        <crate::cli::Cli as clap::Parser>::try_parse_from(["ai-sandbox", "--review", "--", "true"]).unwrap();
    crate::cli::app::run(&mut h, &cli.run).unwrap();
    let p = h.launched.pop().expect("a plan");
    assert!(p.review.is_some() && p.guard.review && p.guard.paths.is_empty(), "{:?}", p.guard);
    let mut m = Fake::new(None);
    assert_eq!(run(&mut m, &p).unwrap(), 7);
    let names: Vec<&str> = m.names().into_iter().filter(|n| *n != "warn").collect();
    assert_eq!(
        names,
        [
            "private_dir",
            "write_session",
            "settle_leftovers",
            "snapshot",
            "open_review",
            "keeper",
            "podman",
            "settle",
            "close_review",
            "remove_session_dir"
        ]
    );
    assert!(m.calls.contains(&Call::Warn("waiting for review".into())), "{:?}", m.calls);
    let mut m = Fake::new(Some("open_review"));
    let err = format!("{:#}", run(&mut m, &p).unwrap_err());
    assert!(err.contains("nothing was started") && err.contains("boom"), "{err}");
    assert_eq!(m.names().last(), Some(&"remove_session_dir"));
    assert!(!m.names().contains(&"podman"));
    // Direct mode (the default) has no review step at all.
    let mut m = Fake::new(None);
    run(&mut m, &plan()).unwrap();
    assert!(!m.names().contains(&"open_review") && !m.names().contains(&"close_review"));
}

/// The sweep of session dirs another launcher left: a dir whose pid file is still empty (its
/// launcher is writing it) is kept, as is one of a live launcher; a dead launcher's goes, and so
/// does one with no pid after a minute.
#[test]
fn the_sweep_keeps_a_session_being_made_and_removes_a_dead_launchers() {
    let t = tempfile::tempdir().unwrap();
    let s = t.path();
    let mk = |name: &str, pid: Option<&str>| {
        std::fs::create_dir(s.join(name)).unwrap();
        if let Some(p) = pid {
            std::fs::write(s.join(name).join("pid"), p).unwrap();
        }
    };
    mk("starting", Some(""));
    mk("live", Some(&std::process::id().to_string()));
    // A pid no process has (above the kernel's pid_max).
    mk("dead", Some("99999999"));
    mk("old", None);
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    std::fs::File::open(s.join("old")).unwrap().set_modified(old).unwrap();
    super::sweep_sessions(s, Path::new("/nonexistent/podman"));
    let left: Vec<String> = {
        let mut v: Vec<String> =
            std::fs::read_dir(s).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    };
    assert_eq!(left, ["live", "starting"]);
}

/// crun keeps a refusing hook's reason in a file (runc says it in podman's error): the launcher
/// says it, escaped, and says nothing when the hooks printed nothing.
#[test]
fn a_hooks_reason_kept_by_crun_is_said() {
    let dir = tempfile::tempdir().unwrap();
    assert!(super::hook_reason(dir.path()).is_empty(), "no file: nothing to say");
    let file = dir.path().join(crate::plan::session::HOOKS_STDERR_FILE);
    std::fs::write(&file, "\n").unwrap();
    assert!(super::hook_reason(dir.path()).is_empty(), "the hooks said nothing");
    std::fs::write(&file, "Error: self-check failed: connecting to 100.64.0.1:4 failed \x1b[2K\n").unwrap();
    let said = super::hook_reason(dir.path());
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(said[0].starts_with("the sandbox was not started; its hook said"));
    assert_eq!(said[1], "  Error: self-check failed: connecting to 100.64.0.1:4 failed \\e[2K");
}

/// Only the runtime's own failure before the container existed is tried again: not a command's
/// exit 126 (its pid file exists), not a refusal of the launch's hook, not another exit code.
#[test]
fn only_a_runtime_failure_before_the_container_existed_is_tried_again() {
    use super::runtime_failed_before_start as again;
    assert!(again(Some(126), false, false));
    assert!(!again(Some(126), true, false), "the container existed: its command may have run");
    assert!(!again(Some(126), false, true), "the hook refused it");
    assert!(!again(Some(125), false, false), "podman's own error");
    assert!(!again(Some(127), false, false));
    assert!(!again(None, false, false), "podman killed by a signal");
}
