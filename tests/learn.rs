//! `ai-sandbox learn` through FakeHost: what the gate's log says the run learned becomes a
//! proposal, and only the lines the user accepts reach the config (the e2e test in
//! tests/e2e/newcomer.rs runs it against a real gate and test hosts).

use ai_sandbox::cli::{Cli, Sub};
use ai_sandbox::host::{Effect, FakeHost};
use clap::Parser;

mod support;
use support::host;

const CONFIG: &str = "/home/dev/app/.ai-sandbox/config";
const GATE_LOG: &str = "/run/user/1000/ai-sandbox/gate.log";
/// FakeHost's session id (its random bytes are all 0xab).
const SESSION: &str = "abababababab";

fn event(session: &str, host: &str, decision: &str, learned: bool) -> String {
    let mut e = serde_json::json!({
        "time": "2026-12-02T10:00:00Z", "session": session, "method": "CONNECT", "host": host,
        "port": 443, "decision": decision, "status": 200, "reason": "r",
    });
    if learned {
        e["learned"] = true.into();
    }
    e.to_string()
}

/// A host whose gate log holds what this session learned, and what it must not propose.
fn learned_host() -> FakeHost {
    let mut h = host("allow = listed.test\n", &[]);
    let lines = [
        event(SESSION, "a.learn.test", "allow", true),
        event(SESSION, "b.learn.test", "allow", true),
        event(SESSION, "a.learn.test", "allow", true),
        event(SESSION, "solo.test", "allow", true),
        // Allowed by the config, refused, and another session's learned host: none proposed.
        event(SESSION, "listed.test", "allow", false),
        event(SESSION, "refused.test", "deny", false),
        event("otherxsession", "other.test", "allow", true),
    ];
    h.files.push((GATE_LOG.into(), lines.join("\n") + "\n"));
    h
}

fn learn(h: &mut FakeHost, args: &[&str]) -> anyhow::Result<i32> {
    let cli = Cli::try_parse_from(["ai-sandbox", "learn"].iter().chain(args)).unwrap();
    let Some(Sub::Learn(a)) = &cli.sub else { panic!("{:?}", cli.sub) };
    ai_sandbox::cli::learn::learn_cmd(h, a)
}

fn config(h: &FakeHost) -> String {
    h.files.iter().find(|(p, _)| p.to_str() == Some(CONFIG)).map(|(_, t)| t.clone()).unwrap_or_default()
}

#[test]
fn without_a_terminal_the_proposal_is_printed_and_nothing_is_written() {
    let mut h = learned_host();
    h.exit_code = 3;
    assert_eq!(learn(&mut h, &["--", "npm", "ci"]).unwrap(), 3, "the command's exit code");
    assert!(h.effects.iter().any(|e| matches!(e, Effect::Launch(_))), "{:?}", h.effects);
    let err = &h.stderr;
    assert!(err.contains("LEARNING RUN"), "said before it starts: {err}");
    assert!(
        err.contains("  learn.test:\n    allow = a.learn.test\n    allow = b.learn.test\n    (or, for every name below learn.test: allow = *.learn.test)\n"),
        "{err}"
    );
    assert!(err.contains("  solo.test:\n    allow = solo.test\n"), "{err}");
    for not in ["listed.test", "refused.test", "other.test"] {
        assert!(!err.contains(&format!("allow = {not}")), "{not} proposed: {err}");
    }
    assert!(err.contains("the command exited 3"), "{err}");
    assert!(
        err.contains("nothing was written (no terminal to ask on); to add them: ai-sandbox allow a.learn.test b.learn.test solo.test"),
        "{err}"
    );
    assert_eq!(config(&h), "allow = listed.test\n", "the config is as it was");
    assert!(!h.effects.iter().any(|e| matches!(e, Effect::Write(p) if p.to_str() == Some(CONFIG))));
}

#[test]
fn on_a_terminal_only_the_accepted_lines_are_added_and_the_config_stays_approved() {
    let mut h = learned_host();
    h.tty = true;
    // The wildcard: no; a.learn.test: yes; b.learn.test: no; solo.test: yes.
    h.answers = vec![false, true, false, true];
    assert_eq!(learn(&mut h, &["--", "npm", "ci"]).unwrap(), 0);
    assert!(
        h.stderr.contains("add `allow = *.learn.test` (every name below learn.test)? [y/N] "),
        "{}",
        h.stderr
    );
    assert_eq!(config(&h), "allow = listed.test\nallow = a.learn.test\nallow = solo.test\n");
    assert!(h.stdout.contains("added to .ai-sandbox/config (approved)"), "{}", h.stdout);
    // Approved: the next launch starts without asking.
    let mut next = h;
    next.tty = false;
    next.stderr.clear();
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    assert_eq!(ai_sandbox::cli::app::run(&mut next, &cli.run).unwrap(), 0, "{}", next.stderr);

    // The wildcard accepted: the names it covers are not asked about again.
    let mut w = learned_host();
    w.tty = true;
    w.answers = vec![true, false];
    learn(&mut w, &["--", "npm", "ci"]).unwrap();
    assert_eq!(config(&w), "allow = listed.test\nallow = *.learn.test\n");
    assert_eq!(w.stderr.matches("? [y/N] ").count(), 2, "wildcard and solo.test: {}", w.stderr);
}

#[test]
fn a_project_without_a_config_gets_one_of_the_accepted_lines() {
    let mut h = learned_host();
    h.files.retain(|(p, _)| p.to_str() != Some(CONFIG));
    h.tty = true;
    h.answers = vec![false, false, false, true];
    learn(&mut h, &["--", "npm", "ci"]).unwrap();
    assert!(!h.stderr.contains("ai-sandbox init"), "no config is no problem for learn: {}", h.stderr);
    assert_eq!(config(&h), "allow = solo.test\n");
    assert!(h.stdout.contains("wrote .ai-sandbox/config (approved)"), "{}", h.stdout);
}

#[test]
fn a_run_that_learned_nothing_says_so_and_a_learning_run_needs_the_gate() {
    let mut h = host("allow = listed.test\n", &[]);
    assert_eq!(learn(&mut h, &["--", "true"]).unwrap(), 0);
    assert!(h.stderr.contains("nothing outside the allowlist was asked for in this run"), "{}", h.stderr);
    for flags in [&["--net", "none"][..], &["--net", "full"], &["--no-gate"]] {
        let mut h = host("", &[]);
        let args: Vec<&str> = flags.iter().copied().chain(["--", "true"]).collect();
        let err = format!("{:#}", learn(&mut h, &args).unwrap_err());
        assert!(err.contains("a learning run records the hostnames") && err.contains("has no gate"), "{err}");
        assert!(h.effects.is_empty(), "nothing started: {:?}", h.effects);
    }
    // A dry run shows the notice and starts nothing.
    let mut d = host("", &[]);
    assert_eq!(learn(&mut d, &["--dry-run", "--", "true"]).unwrap(), 0);
    assert!(d.stdout.contains("LEARNING RUN"), "{}", d.stdout);
    assert!(d.effects.is_empty(), "{:?}", d.effects);
}
