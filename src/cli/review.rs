//! `ai-sandbox diff`, `apply` and `discard`: what a review-mode session left (see `review`).

use super::Which;
use super::app::locate;
use super::facts::state_dir;
use crate::host::Host;
use crate::review::apply::{self, Verdict};
use crate::review::{self as rv, Waiting, show};
use crate::sys::quote;
use crate::sys::untrusted::Tree;
use anyhow::Context;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A review and what it changed, as `diff` and `apply` read it.
struct Opened {
    w: Waiting,
    upper: Tree,
    project: Tree,
    items: Vec<show::Item>,
}

fn open(host: &mut dyn Host, which: &Which, id: Option<&str>) -> anyhow::Result<Opened> {
    let loc = locate(host, which.project.as_deref())?;
    let w = rv::pick(&state_dir(host, &loc.project), &loc.project, id)?;
    let upper = Tree::open(&w.upper()).with_context(|| format!("opening {}", w.upper().display()))?;
    let project = Tree::open(&w.record.project)
        .with_context(|| format!("opening the project {}", w.record.project.display()))?;
    let changes = crate::review::changes::read(&upper, &project)
        .with_context(|| format!("reading what session {} changed", w.id()))?;
    let items = show::items(changes, &upper, &project, w.record.started_ns, &protected(&w.record.project));
    Ok(Opened { w, upper, project, items })
}

/// The protected paths: the defaults and the project's `protect` lines (its config on the host,
/// never the one the sandbox may have written in its layer).
fn protected(project: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(crate::config::project::config_path(project)).unwrap_or_default();
    let (cfg, _) = crate::policy::keys::read(&text);
    let extra: Vec<String> =
        cfg.all(crate::policy::keys::Name::Protect).map(|(v, _)| v.trim().to_string()).collect();
    crate::plan::protect::candidates(&extra)
}

/// `ai-sandbox diff [SESSION] [--stat]`
pub fn diff_cmd(host: &mut dyn Host, which: &Which, id: Option<&str>, stat: bool) -> anyhow::Result<i32> {
    let o = open(host, which, id)?;
    let mut out = format!(
        "session {} of {} (started {}){}\n",
        o.w.id(),
        quote::path(&o.w.record.project),
        show::when(o.w.record.started_ns),
        if o.w.running { ": STILL RUNNING, the change may grow" } else { "" }
    );
    let done = applied(&o.w);
    let owned: Vec<show::Item> = o.items.iter().filter(|i| !done.contains(&i.change.path)).cloned().collect();
    if owned.is_empty() {
        out += "  no changes left to apply\n";
    }
    out += &show::summary(&owned);
    out += &show::git_settings(&owned, &o.upper);
    let branches = crate::review::git::moved(&o.upper, &o.project, o.w.id(), None);
    for m in &branches.moved {
        let at = if m.repo.as_os_str().is_empty() {
            String::new()
        } else {
            format!(" (in {})", quote::arg(&m.repo))
        };
        let how = if m.arrived { "arrived as" } else { "arrives as" };
        out += &format!(
            "  + commits: the sandbox's {}{at} at {} {how} the branch {}\n",
            quote::text(&m.name),
            &m.oid[..12],
            quote::text(&m.target)
        );
    }
    out += &crate::review::git::Refused::lines(&branches.refused);
    if !stat {
        out += &show::patches(&owned, &o.upper, &o.project);
    }
    out += &format!("apply: ai-sandbox apply {0} [PATH...]   discard: ai-sandbox discard {0}\n", o.w.id());
    host.print(&out);
    Ok(0)
}

/// The paths an earlier `apply` of this review promoted.
fn applied(w: &Waiting) -> HashSet<PathBuf> {
    let bytes = std::fs::read(w.dir.join(crate::contract::review::APPLIED_FILE)).unwrap_or_default();
    bytes.split(|b| *b == 0).filter(|p| !p.is_empty()).map(|p| PathBuf::from(OsStr::from_bytes(p))).collect()
}

/// `ai-sandbox apply [SESSION] [PATH...] [--branch NAME]`
pub fn apply_cmd(
    host: &mut dyn Host,
    which: &Which,
    args: &[PathBuf],
    branch: Option<&str>,
) -> anyhow::Result<i32> {
    // The first argument is the session when a review of this project has that id (prefix).
    let loc = locate(host, which.project.as_deref())?;
    let all = rv::waiting(&state_dir(host, &loc.project));
    let (id, paths) = match args.split_first() {
        Some((first, rest))
            if first.to_str().is_some_and(|f| f.len() >= 4 && all.iter().any(|w| w.id().starts_with(f))) =>
        {
            (first.to_str(), rest.to_vec())
        }
        _ => (None, args.to_vec()),
    };
    crate::sys::timing::mark("apply: start");
    let o = open(host, which, id)?;
    crate::sys::timing::mark("apply: the layer read");
    if o.w.running {
        return Err(crate::error::hinted(
            format!("session {} is still running; its change is not complete", o.w.id()),
            "apply it after the sandbox exits (`ai-sandbox diff` shows it so far)",
        )
        .into());
    }
    // Paths as given, relative to the project (from the working directory when inside it).
    let cwd = host.cwd()?;
    let relative = |p: &PathBuf| {
        let abs = if p.is_absolute() { p.clone() } else { cwd.join(p) };
        abs.strip_prefix(&o.w.record.project).map(Path::to_path_buf).unwrap_or_else(|_| p.clone())
    };
    // A shortened id that is a path too (`apply cafe`, a directory the sandbox may have named
    // so) is not guessed at: taken as the session, it would apply everything.
    if let Some(first) = id.filter(|f| *f != o.w.id()).map(PathBuf::from)
        && (host.exists(&cwd.join(&first)) || apply::unmatched(&o.items, &[relative(&first)]).is_empty())
    {
        return Err(crate::error::hinted(
            format!("nothing was applied: {} is both a shortened session id and a path", quote::arg(&first)),
            format!(
                "for the session, give its whole id (`ai-sandbox apply {} [PATH...]`); for the path, write it as ./{}",
                o.w.id(),
                quote::arg(&first)
            ),
        )
        .into());
    }
    let paths: Vec<PathBuf> = paths.iter().map(relative).collect();
    if paths.iter().any(|p| p.as_os_str().is_empty()) {
        return Err(crate::error::hinted(
            "nothing was applied: the project itself is named, and apply does not take that as naming each called-out path below it",
            format!("`ai-sandbox apply {0}` applies everything but the called-out paths; name those one by one", o.w.id()),
        )
        .into());
    }
    let none = apply::unmatched(&o.items, &paths);
    if !none.is_empty() {
        let list: Vec<String> = none.iter().map(|p| quote::arg(p)).collect();
        return Err(crate::error::hinted(
            format!("nothing was applied: session {} changed nothing at {}", o.w.id(), list.join(", ")),
            format!(
                "`ai-sandbox diff --stat {}` lists what it changed; a path is relative to the project, or to the current directory inside it",
                o.w.id()
            ),
        )
        .into());
    }
    let done = applied(&o.w);
    let mut verdicts = apply::decide(&o.items, &paths, &done);
    apply::links_leaving(&o.items, &mut verdicts, &paths, &|p| {
        crate::review::changes::project_link(&o.project, p)
    });
    let conflicts: Vec<String> = o
        .items
        .iter()
        .zip(&verdicts)
        .filter_map(|(i, v)| match v {
            Verdict::Conflict(why) => Some(format!("  {}: {why}", quote::arg(&i.change.path))),
            _ => None,
        })
        .collect();
    if !conflicts.is_empty() {
        host.eprint(&format!(
            "ai-sandbox: nothing was applied: {} path(s) changed on the host after session {} started:\n{}\n  \
             hint: look at both (`ai-sandbox diff {1}`), then name each path to take the sandbox's version: ai-sandbox apply {1} PATH...\n",
            conflicts.len(),
            o.w.id(),
            conflicts.join("\n")
        ));
        return Ok(1);
    }
    let path = o.w.dir.join(crate::contract::review::APPLIED_FILE);
    let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
    let mut log = std::io::BufWriter::new(file.with_context(|| format!("opening {}", path.display()))?);
    let mut record = |p: &Path| -> anyhow::Result<()> {
        use std::io::Write;
        log.write_all(p.as_os_str().as_bytes())?;
        log.write_all(b"\0")?;
        Ok(())
    };
    let landed = apply::land(&o.items, &verdicts, &o.upper, &o.project, &mut record);
    std::io::Write::flush(&mut log).context("recording the applied paths")?;
    let n = landed?;
    crate::sys::timing::mark("apply: files landed");
    let mut out = format!(
        "ai-sandbox: applied {n} change(s) of session {} to {}\n",
        o.w.id(),
        quote::path(&o.w.record.project)
    );
    let mut left = 0;
    let mut with = 0;
    for (i, v) in o.items.iter().zip(&verdicts) {
        match v {
            Verdict::CalledOut(why) => {
                left += 1;
                let why: Vec<String> = why.iter().map(|c| c.words()).collect();
                out += &format!("  not applied: {} ({})\n", quote::arg(&i.change.path), why.join("; "));
            }
            Verdict::WithDirectory(_) => with += 1,
            _ => {}
        }
    }
    if with > 0 {
        out += &format!("  not applied either: {with} entries below those directories, which go with them\n");
    }
    if left > 0 {
        out += &format!(
            "  hint: read them (`ai-sandbox diff {0}`); name each one you want: ai-sandbox apply {0} PATH...\n",
            o.w.id()
        );
    }
    // Commits arrive with every apply (a fetch again only moves the session's own branches), so
    // an apply of named paths that leaves nothing to apply does not lose them.
    let found = crate::review::git::moved(&o.upper, &o.project, o.w.id(), branch);
    let branches =
        crate::review::git::fetch(&found.moved, &o.upper, &o.w.record.project, &o.w.dir.join("fetch"))
            .context("fetching the sandbox's commits (the applied files stay applied)")?;
    out += &crate::review::git::Refused::lines(&found.refused);
    crate::sys::timing::mark("apply: commits fetched");
    for b in &branches {
        out += &format!("  {b}\n");
    }
    if n > 0 || !branches.is_empty() {
        out +=
            "  your HEAD, branches and index are as they were: `git status` shows the applied files as edits";
        let first = branches.iter().find_map(|b| b.strip_prefix("branch ")?.split_whitespace().next());
        if let Some(b) = first {
            out += &format!(
                ";\n  the sandbox's commits are on {b}: if your branch has not moved since, `git reset {b}` makes them yours with the files as they are now"
            );
        }
        out += "\n";
    }
    let pending =
        o.items.iter().zip(&verdicts).any(|(_, v)| {
            matches!(v, Verdict::CalledOut(_) | Verdict::NotSelected | Verdict::WithDirectory(_))
        });
    if pending {
        out += &format!(
            "  session {0} still waits: ai-sandbox diff {0}; ai-sandbox discard {0} when done\n",
            o.w.id()
        );
    } else {
        rv::discard(&o.w, &host_podman(host))?;
        crate::sys::timing::mark("apply: review removed");
        out += &format!("  nothing is left to apply: the review of session {} is removed\n", o.w.id());
    }
    host.eprint(&out);
    Ok(0)
}

fn host_podman(host: &dyn Host) -> PathBuf {
    host.which("podman").unwrap_or_else(|| PathBuf::from("podman"))
}

/// `ai-sandbox discard [SESSION]`
pub fn discard_cmd(host: &mut dyn Host, which: &Which, id: Option<&str>) -> anyhow::Result<i32> {
    let loc = locate(host, which.project.as_deref())?;
    let w = rv::pick(&state_dir(host, &loc.project), &loc.project, id)?;
    if w.running {
        return Err(crate::error::hinted(
            format!("session {} is still running", w.id()),
            "stop it first (exit its command); then discard",
        )
        .into());
    }
    let applied = applied(&w).len();
    rv::discard(&w, &host_podman(host))?;
    let how = match applied {
        0 => "the project is as it was".to_string(),
        n => format!("the {n} path(s) an earlier apply put in the project stay there"),
    };
    host.eprint(&format!("ai-sandbox: discarded the change of session {} ({how})\n", w.id()));
    Ok(0)
}
