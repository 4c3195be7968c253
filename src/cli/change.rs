//! `ai-sandbox allow|deny ITEM… [--session]`: a line added to the config (approved as the user's
//! own words) and, for a running sandbox, the live change of `live`.

use super::app::{Approval, NOT_STARTED, approval, locate, record_project};
use super::facts::{runtime_dir, state_dir};
use crate::config;
use crate::error::{Rejected, hinted};
use crate::host::Host;
use crate::policy::approval;
use crate::policy::{self, Inputs};
use anyhow::Context;

/// `ai-sandbox allow ITEM…` / `ai-sandbox deny ITEM…`: each item validated as the config's
/// line would be, added to the project's running sandboxes (see `live`), then (unless
/// `--session-only`) to the config as `allow =` / `deny =` lines; the config stays approved if
/// it was.
/// Which of the two commands: what the items become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `allow = ITEM` lines, and a live widening.
    Allow,
    /// `deny = ITEM` lines, and a live narrowing.
    Deny,
}

pub fn change_cmd(host: &mut dyn Host, args: &crate::cli::ChangeArgs, verb: Verb) -> anyhow::Result<i32> {
    let deny = verb == Verb::Deny;
    let crate::cli::ChangeArgs { items, session_only, project } = args;
    let session_only = *session_only;
    let loc = locate(host, project.as_deref())?;
    let mut inputs = Inputs { net: Some(policy::NetMode::Allow), ..Inputs::default() };
    let (budget_items, items_left): (Vec<&String>, Vec<&String>) =
        items.iter().partition(|i| crate::policy::budget::item(i).is_some());
    let (mut budgets, mut net_budgets) = (Vec::new(), Vec::new());
    for item in &budget_items {
        if deny {
            return Err(hinted(
                format!("`{item}` is a budget, which `ai-sandbox allow` sets"),
                format!("`ai-sandbox allow '{item}'` sets it (lower it there to send less)"),
            )
            .into());
        }
        let value = crate::policy::budget::item(item).unwrap_or_default();
        match crate::policy::budget::parse(value).map_err(|(msg, hint)| hinted(msg, hint))? {
            crate::policy::budget::Line::Host(b) => budgets.push(b),
            crate::policy::budget::Line::Net(b) => net_budgets.push(b),
        }
    }
    let (rule_items, entries): (Vec<&String>, Vec<&String>) =
        items_left.into_iter().partition(|i| crate::policy::rule::item(i).is_some());
    let mut rules = Vec::new();
    for item in &rule_items {
        if deny {
            return Err(hinted(
                format!("`{item}` is a rule, and a rule only allows"),
                "a host with rules is refused everything they do not name; remove the rule line to refuse more",
            )
            .into());
        }
        let value = crate::policy::rule::item(item).unwrap_or_default();
        rules.extend(crate::policy::rule::parse(value).map_err(|(msg, hint)| hinted(msg, hint))?);
    }
    let entries: Vec<String> = entries.into_iter().cloned().collect();
    // A deny line wins over allow lines. One that names an item exactly is taken back (the
    // user said to allow it); a wider one stays, and nothing changes until the user narrows it.
    let (retracted, entries) = match verb {
        Verb::Allow => {
            let text = host.read_file(&loc.cfg_path)?.unwrap_or_default();
            denied_by(&text, &entries, &loc.display)?
        }
        Verb::Deny => (Vec::new(), entries),
    };
    match verb {
        Verb::Allow => inputs.allow = entries,
        Verb::Deny => inputs.deny = entries,
    }
    let p =
        policy::build(loc.project.clone(), &config::Config::default(), &inputs).map_err(|diagnostics| {
            Rejected { config_path: loc.display.clone(), diagnostics, outcome: NOT_STARTED }
        })?;
    let change = crate::live::Change { allow: p.allow, rules, budgets, net_budgets };
    let (key, done) = match verb {
        Verb::Allow => ("allow", "allowed"),
        Verb::Deny => ("deny", "denied"),
    };
    // No config to add the line to: said before anything changes (no live change, no lock).
    if !session_only && host.read_file(&loc.cfg_path)?.is_none() {
        return Err(hinted(
            format!("{} has no config ({} does not exist); nothing was changed", loc.project.display(), loc.display),
            format!(
                "`ai-sandbox init` writes one, then `ai-sandbox {key} {}` adds to it; or `--session-only` changes the running sandbox only",
                items.join(" ")
            ),
        )
        .into());
    }
    let runtime = runtime_dir(host);
    let running = host.live_sessions(&runtime, &loc.project);
    if running.is_empty() && session_only {
        return Err(hinted(
            format!(
                "no sandbox of {} is running: --session-only has nothing to change",
                loc.project.display()
            ),
            "start one, or drop --session-only to add the line to the config only",
        )
        .into());
    }
    for rec in &running {
        host.live_allow(&runtime, rec, &change).with_context(|| {
            format!("changing the running sandbox ({}): {key} {}", rec.display(), change.summary())
        })?;
        let session = rec.parent().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned());
        host.print(&format!(
            "{done} {} in the running sandbox {}\n",
            change.summary(),
            session.unwrap_or_default()
        ));
    }
    if running.is_empty() {
        host.print(&format!("no sandbox of {} is running\n", loc.project.display()));
    }
    for r in &retracted {
        host.print(&format!(
            "took back `deny = {r}`{}: the next sandbox reaches {r}; a running one keeps refusing it until it restarts (a deny is not taken back live)\n",
            if session_only { " (not in the config: --session-only)" } else { " in the config" }
        ));
    }
    if !session_only {
        add_lines(host, &loc, items, key)?;
    }
    Ok(0)
}

/// The allow items a deny line of the config `text` refuses: those it names exactly (returned
/// first, to take the line back) and the rest (returned second, to allow); an item a wider deny
/// line refuses is an error that names the line, and nothing changes.
fn denied_by(text: &str, items: &[String], display: &str) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let (cfg, _) = crate::policy::keys::read(text);
    let denies: Vec<(usize, String, crate::policy::allow::Allow)> = cfg
        .entries
        .iter()
        .filter(|e| e.key == "deny")
        .filter_map(|e| {
            Some((e.line, e.value.trim().to_string(), crate::policy::allow::parse(e.value.trim()).ok()?))
        })
        .collect();
    let (mut exact, mut rest) = (Vec::new(), Vec::new());
    for item in items {
        let Ok(a) = crate::policy::allow::parse(item) else {
            rest.push(item.clone());
            continue;
        };
        let hits: Vec<&(usize, String, crate::policy::allow::Allow)> =
            denies.iter().filter(|(_, _, d)| d.refuses(&a)).collect();
        match hits.as_slice() {
            [] => rest.push(item.clone()),
            all if all.iter().all(|(_, _, d)| *d == a) => exact.push(item.clone()),
            all => {
                let (line, deny, _) = all.iter().find(|(_, _, d)| *d != a).expect("a wider one");
                return Err(hinted(
                    format!("{item} stays refused by `deny = {deny}` ({display}:{line}): a deny line wins over allow lines; nothing was changed"),
                    format!("narrow or remove that line, then `ai-sandbox allow {item}`"),
                )
                .into());
            }
        }
    }
    Ok((exact, rest))
}

/// Adds `KEY = ITEM` lines (`rule = ...` for a rule item) to the project's config, each once,
/// under the config lock, through the guard's trusted write; the config stays approved if it was.
/// A project without a config gets one holding these lines, approved: every line in it is one
/// the user chose (`learn`; `allow` and `deny` refuse before, with their hint).
pub(super) fn add_lines(
    host: &mut dyn Host,
    loc: &super::app::Located,
    items: &[String],
    key: &str,
) -> anyhow::Result<()> {
    let state = state_dir(host, &loc.project);
    let _config_lock = host.lock(&state.join("config.lock"))?;
    let existing = host.read_file(&loc.cfg_path)?;
    let old = existing.clone().unwrap_or_default();
    let Approval { path: approved, status, .. } = approval(host, &loc.project, existing.as_deref())?;
    let was_approved = status == approval::Status::Approved || existing.is_none();
    let mut text = old.clone();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    for item in items {
        // A budget replaces the config's line for its host (it is the one line for it).
        if let Some(b) = crate::policy::budget::item(item).and_then(|v| crate::policy::budget::parse(v).ok())
        {
            text = with_budget(&text, &b);
            continue;
        }
        let line = match crate::policy::rule::item(item) {
            Some(rule) => format!("rule = {rule}"),
            None => format!("{key} = {item}"),
        };
        if key == "allow" {
            text = without_deny(&text, item);
        }
        if !text.lines().any(|l| l.trim() == line) {
            text += &format!("{line}\n");
        }
    }
    if text != old {
        let rel = loc.cfg_path.strip_prefix(&loc.project).unwrap_or(&loc.cfg_path).to_path_buf();
        host.write_trusted(&state, &loc.project, &rel, &text)?;
        record_project(host, &loc.project)?;
        if was_approved {
            host.write_file(&approved, &text)?;
        }
        let what = if existing.is_none() { "wrote" } else { "added to" };
        host.print(&format!(
            "{what} {}{}\n",
            loc.display,
            if was_approved {
                " (approved)"
            } else {
                "; it is not approved: `ai-sandbox trust` shows and approves it"
            }
        ));
    }
    Ok(())
}

/// The config text without the `deny` lines that name `item` exactly (a comment after one goes
/// with it).
fn without_deny(text: &str, item: &str) -> String {
    let named = |l: &str| {
        let v = l.split_once(" #").map_or(l, |(v, _)| v);
        let (cfg, _) = crate::policy::keys::read(v);
        cfg.entries.first().is_some_and(|e| {
            e.key == "deny"
                && crate::policy::allow::parse(e.value.trim()).ok() == crate::policy::allow::parse(item).ok()
        })
    };
    text.lines().filter(|l| !named(l.trim())).map(|l| format!("{l}\n")).collect()
}

/// The config text with `budget = b`: the line for the same host or network replaced (a comment
/// after it goes with it; the policy allows one line for each), else added at the end.
fn with_budget(text: &str, b: &crate::policy::budget::Line) -> String {
    let line = format!("budget = {b}");
    let same = |l: &str| {
        let v = l.split_once(" #").map_or(l, |(v, _)| v);
        crate::policy::budget::item(v)
            .and_then(|v| crate::policy::budget::parse(v).ok())
            .is_some_and(|x| x.same_target(b))
    };
    let mut out = String::new();
    let mut replaced = false;
    for l in text.lines() {
        if !replaced && same(l.trim()) {
            out += &format!("{line}\n");
            replaced = true;
        } else {
            out += &format!("{l}\n");
        }
    }
    if !replaced {
        out += &format!("{line}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_budget_item_replaces_its_hosts_line_in_the_config_and_keeps_every_other_line() {
        let b = crate::policy::budget::parse("a.test 2m").unwrap();
        let text = "allow = a.test\nbudget = a.test 1m   # first\nbudget = * 5m\n# budget = a.test 9m\n";
        assert_eq!(
            super::with_budget(text, &b),
            "allow = a.test\nbudget = a.test 2m\nbudget = * 5m\n# budget = a.test 9m\n"
        );
        assert_eq!(super::with_budget("allow = a.test\n", &b), "allow = a.test\nbudget = a.test 2m\n");
        let net = crate::policy::budget::parse("192.0.2.0/24 3m").unwrap();
        let text = "allow = 192.0.2.0/24:22\nbudget = 192.0.2.0/24 1m\nbudget = 192.0.2.7 1m\n";
        assert_eq!(
            super::with_budget(text, &net),
            "allow = 192.0.2.0/24:22\nbudget = 192.0.2.0/24 3m\nbudget = 192.0.2.7 1m\n",
            "an address line is replaced by the line for the same network only"
        );
    }
}
