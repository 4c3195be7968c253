//! `ai-sandbox learn [RUN FLAGS] -- CMD`: a run whose gate relays and records the hostnames the
//! allowlist does not hold (see `gate::decide::learns`), then the `allow =` lines that would
//! let the same run through, grouped by domain (`policy::learn`), for the user to accept line
//! by line. Nothing reaches the config by itself: without a terminal to ask on, the lines and the
//! command that adds them are printed and nothing is written (docs/adr/0059).

use crate::cli::RunArgs;
use crate::contract::log::Event;
use crate::host::Host;
use crate::policy::learn::{self, Group};

pub fn learn_cmd(host: &mut dyn Host, args: &RunArgs) -> anyhow::Result<i32> {
    let args = RunArgs { learn: true, ..args.clone() };
    let ran = super::app::launch(host, &args)?;
    if args.dry_run {
        return Ok(ran.code);
    }
    let log = host.read_file(&crate::gate::control::log_path(&ran.runtime))?.unwrap_or_default();
    // Only this session's lines are parsed (the log holds every session's decisions).
    let ours = log.lines().filter(|l| l.contains(ran.session.as_str()));
    let events: Vec<Event> = ours
        .filter_map(|l| serde_json::from_str::<Event>(l).ok())
        .filter(|e| e.session == ran.session)
        .collect();
    // A learned line of a rule (an MCP tool no rule allows, relayed) is proposed as that line;
    // its host is in the allowlist already.
    let is_rule = |e: &Event| e.allow.as_deref().is_some_and(|a| crate::policy::rule::item(a).is_some());
    let learned: Vec<&str> = events
        .iter()
        .filter(|e| e.learned && !e.decision.refused() && !is_rule(e))
        .map(|e| e.host.as_str())
        .collect();
    let mut rules: Vec<String> = Vec::new();
    for e in events.iter().filter(|e| e.learned && !e.decision.refused()) {
        // The log is the gate's, but a line in it that a rule does not read as written (a tool
        // name the sandbox chose) is never proposed.
        let readable = |l: &&String| {
            !l.chars().any(char::is_control)
                && crate::policy::rule::item(l).is_some_and(|v| crate::policy::rule::parse(v).is_ok())
        };
        if let Some(line) = e.allow.as_ref().filter(|_| is_rule(e)).filter(readable)
            && !rules.contains(line)
        {
            rules.push(line.clone());
        }
    }
    // Asked for, outside the allowlist, and not reached (a name that does not resolve): said,
    // never proposed (a typo, or a name only another network knows).
    let mut unreached: Vec<String> = Vec::new();
    for e in
        events.iter().filter(|e| e.learned && e.decision.refused() && !learned.contains(&e.host.as_str()))
    {
        let line =
            format!("  {} ({})\n", crate::sys::quote::text(&e.host), crate::sys::quote::text(&e.reason));
        if !unreached.contains(&line) {
            unreached.push(line);
        }
    }
    if !unreached.is_empty() {
        host.eprint(&format!(
            "ai-sandbox: learn: the command asked for these hosts, outside the allowlist, and they could not be reached, so nothing is proposed for them:\n{}",
            unreached.concat()
        ));
    }
    let groups = learn::propose(learned.iter().copied());
    let mut accepted = propose_rules(host, &rules)?;
    if groups.is_empty() {
        if !accepted.is_empty() {
            let loc = super::app::locate(host, args.policy.project.as_deref())?;
            super::change::add_lines(host, &loc, &accepted, "allow")?;
            return Ok(ran.code);
        }
        if !rules.is_empty() {
            return Ok(ran.code);
        }
        if unreached.is_empty() {
            host.eprint(
                "ai-sandbox: learn: nothing outside the allowlist was asked for in this run; nothing to add\n",
            );
        }
        return Ok(ran.code);
    }
    let mut said = format!(
        "ai-sandbox: learn: the command reached these hosts, which the allowlist does not hold:\n{}",
        learn::render(&groups)
    );
    if ran.code != 0 {
        said += &format!(
            "ai-sandbox: learn: the command exited {}: what it would have reached after that is not here\n",
            ran.code
        );
    }
    host.eprint(&said);
    if !host.can_ask() {
        let all: Vec<&str> = groups.iter().flat_map(|g| g.names.iter().map(String::as_str)).collect();
        host.eprint(&format!(
            "ai-sandbox: learn: nothing was written (no terminal to ask on); to add them: ai-sandbox allow {}\n",
            all.join(" ")
        ));
        return Ok(ran.code);
    }
    // Ctrl-C at a question ends the launcher (its signal handling outlives the sandbox): what
    // was not written, and the command that writes it, are said as it goes.
    let all: Vec<&str> = groups.iter().flat_map(|g| g.names.iter().map(String::as_str)).collect();
    crate::sys::process::last_words(Some(format!(
        "learn: interrupted; nothing was written; to add them: ai-sandbox allow {}",
        all.join(" ")
    )));
    for g in &groups {
        accepted.extend(ask(host, g)?);
    }
    crate::sys::process::last_words(None);
    if accepted.is_empty() {
        host.eprint("ai-sandbox: learn: nothing was added\n");
        return Ok(ran.code);
    }
    // Found again as the run found it (the same working directory and --project).
    let loc = super::app::locate(host, args.policy.project.as_deref())?;
    super::change::add_lines(host, &loc, &accepted, "allow")?;
    Ok(ran.code)
}

/// The rule lines a learning run's relayed calls need (MCP tools no rule allows): said, and
/// those the user accepts returned (none without a terminal: the command that adds them is said).
fn propose_rules(host: &mut dyn Host, rules: &[String]) -> anyhow::Result<Vec<String>> {
    if rules.is_empty() {
        return Ok(Vec::new());
    }
    let each: Vec<String> = rules.iter().map(|r| format!("  {}\n", crate::sys::quote::text(r))).collect();
    host.eprint(&format!(
        "ai-sandbox: learn: the command called MCP tools the rules do not allow; these lines would:\n{}",
        each.concat()
    ));
    if !host.can_ask() {
        // Each line as one shell word: its path is the sandbox's request's (a `'` in it must not
        // end the quote in a command the user pastes).
        let quoted: Vec<String> =
            rules.iter().map(|r| crate::sys::quote::arg(std::path::Path::new(r))).collect();
        host.eprint(&format!(
            "ai-sandbox: learn: nothing was written (no terminal to ask on); to add them: ai-sandbox allow {}\n",
            quoted.join(" ")
        ));
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for r in rules {
        if host.confirm(&format!("add `{}`? [y/N] ", crate::sys::quote::text(r)))? {
            out.push(r.clone());
        }
    }
    Ok(out)
}

/// The lines of one group the user accepts: the wildcard first when there is one (then only the
/// names it does not cover), else each name.
fn ask(host: &mut dyn Host, g: &Group) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let names: Vec<&str> = match &g.wildcard {
        Some(w) if host.confirm(&format!("add `allow = {w}` (every name below {})? [y/N] ", g.domain))? => {
            out.push(w.clone());
            g.uncovered()
        }
        _ => g.names.iter().map(String::as_str).collect(),
    };
    for n in names {
        if host.confirm(&format!("add `allow = {n}`? [y/N] "))? {
            out.push(n.to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::FakeHost;

    /// Without a terminal, the lines are said and the command that adds them is one the user can
    /// paste: each line one shell word, whatever the sandbox's path put in it. With one, each is
    /// asked about, shown escaped.
    #[test]
    fn proposed_rule_lines_are_said_pasteable_and_asked_one_by_one() {
        let rules = vec![
            "rule = mcp.test mcp /mcp delete_repository".to_string(),
            "rule = mcp.test mcp /mcp/a'$(touch x)' create".to_string(),
        ];
        let mut h = FakeHost::default();
        assert!(propose_rules(&mut h, &rules).unwrap().is_empty());
        assert!(
            h.stderr.contains(
                "ai-sandbox allow 'rule = mcp.test mcp /mcp delete_repository' 'rule = mcp.test mcp /mcp/a'\\''$(touch x)'\\'' create'\n"
            ),
            "{}",
            h.stderr
        );
        let mut h = FakeHost { tty: true, answers: vec![false, true], ..FakeHost::default() };
        assert_eq!(propose_rules(&mut h, &rules).unwrap(), [rules[1].clone()]);
        assert!(propose_rules(&mut h, &[]).unwrap().is_empty());
    }
}
