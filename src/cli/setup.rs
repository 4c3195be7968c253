//! The commands that set a project or a user up: `init` (a config from presets), `trust`
//! (approving the config), `login import` (an agent's login into the private store).

use super::app::{Approval, NOT_APPROVED, approval, in_line_order, locate, record_project};
use super::facts::{agents_dir, state_dir};
use crate::config::project;
use crate::error::{Rejected, hinted};
use crate::host::Host;
use crate::policy::approval;
use crate::policy::{self, Inputs};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// `ai-sandbox login import AGENT`: copies an existing login from the real HOME into the store
/// that `state = AGENT` shares with this user's sandboxes, after saying which files.
pub fn login_import(host: &mut dyn Host, agent: &str) -> anyhow::Result<i32> {
    use crate::policy::agents::{KNOWN, fields_of, login_files};
    let Some(files) = login_files(agent) else {
        let names: Vec<&str> = KNOWN.iter().map(|(n, ..)| *n).collect();
        bail!("no login import for `{agent}`; known agents: {}", names.join(", "));
    };
    let home = PathBuf::from(host.env("HOME").context("HOME is not set")?);
    let store = agents_dir(host).join(agent).join("login");
    let present: Vec<_> = files.iter().filter(|(from, _)| host.exists(&home.join(from))).collect();
    if present.is_empty() {
        let names: Vec<String> = files.iter().map(|(f, _)| format!("~/{f}")).collect();
        bail!("no {agent} login found in your home directory (looked for {})", names.join(", "));
    }
    host.print(&format!(
        "copying your {agent} login into the store your sandboxes share ({}); a sandbox with `state = {agent}` gets it:\n",
        store.display()
    ));
    for (from, to) in present {
        let fields = fields_of(agent, to);
        let which = fields.map_or_else(|| "the whole file".to_string(), |f| format!("only {}", f.join(", ")));
        host.print(&format!("  ~/{from} -> {} ({which})\n", store.join(to).display()));
        host.copy_private(&home.join(from), &store, Path::new(to), fields)?;
    }
    Ok(0)
}

/// `ai-sandbox trust [--show]`: approve the project's config as it is now, or show where it
/// stands. An invalid config is not approved (it would not start anyway).
pub fn trust_cmd(host: &mut dyn Host, project: Option<&Path>, show: bool) -> anyhow::Result<i32> {
    let loc = locate(host, project)?;
    let Some(text) = host.read_file(&loc.cfg_path)? else {
        host.print(&format!("there is no {}: nothing to approve\n", loc.display));
        return Ok(0);
    };
    let Approval { path: approved_path, status, .. } = approval(host, &loc.project, Some(&text))?;
    if show {
        match &status {
            approval::Status::Approved => {
                host.print(&format!("{} is approved for {}\n", loc.display, loc.project.display()))
            }
            s => host.print(
                &(approval::explain(s, &text, &loc.display)
                    + "not approved: `ai-sandbox trust` approves it\n"),
            ),
        }
        return Ok(if status == approval::Status::Approved { 0 } else { 1 });
    }
    // The same checks of the config as a launch (flags and environment aside): a config that
    // could not start is never "approved".
    let (cfg, mut problems) = crate::policy::keys::read(&text);
    if let Err(more) = policy::build(loc.project.clone(), &cfg, &Inputs::default()) {
        problems.extend(more);
    }
    if !problems.is_empty() {
        in_line_order(&mut problems);
        return Err(
            Rejected { config_path: loc.display, diagnostics: problems, outcome: NOT_APPROVED }.into()
        );
    }
    if status != approval::Status::Approved {
        host.print(&approval::explain(&status, &text, &loc.display));
    }
    host.write_file(&approved_path, &text)?;
    record_project(host, &loc.project)?;
    host.print(&format!("approved {} for {}\n", loc.display, loc.project.display()));
    Ok(0)
}

/// `ai-sandbox init`: writes the config from presets; never overwrites without `--force`.
pub fn init(
    host: &mut dyn Host,
    presets: &[String],
    force: bool,
    project: Option<&Path>,
) -> anyhow::Result<i32> {
    let cwd = host.cwd()?;
    // The project a launch here would use (a repository's root from inside it), so that the
    // config lands where the next `ai-sandbox` looks for it.
    let dir = match project {
        Some(p) if p.is_absolute() => p.to_path_buf(),
        Some(p) => cwd.join(p),
        None => project::find(&cwd, |p| host.exists(p)),
    };
    let home = PathBuf::from(host.env("HOME").unwrap_or_default());
    project::check(&dir, &home)
        .and_then(|()| project::check_reserved(&host.canonical(&dir), &super::facts::reserved(host)))
        .map_err(|e| hinted(format!("{}; nothing was written", e.message), e.hint))?;
    let path = project::config_path(&dir);
    // A link on the way (a `.ai-sandbox` a sandbox could have made) is not written through.
    let real = host.canonical(&dir);
    for (at, want) in [
        (path.parent().unwrap_or(&dir), real.join(project::CONFIG_DIR)),
        (path.as_path(), real.join(project::CONFIG_DIR).join(project::CONFIG_FILE)),
    ] {
        if host.exists(at) && host.canonical(at) != want {
            return Err(hinted(
                format!("{} leads to {}; nothing was written", at.display(), host.canonical(at).display()),
                "init writes no config through a link (a sandbox can make one); remove the link, then run init again",
            )
            .into());
        }
    }
    // Read even with --force: a dangling link there is an error, not a file to write through.
    if host.read_file(&path)?.is_some() && !force {
        return Err(hinted(
            format!("{} already exists; nothing was written", path.display()),
            "edit it, or pass --force to replace it",
        )
        .into());
    }
    let text = crate::config::init::render(presets)?;
    host.write_file(&path, &text)?;
    // Written by ai-sandbox itself at the user's request: approved as it is.
    host.write_file(&crate::plan::session::approved_config(&state_dir(host, &dir)), &text)?;
    record_project(host, &dir)?;
    let whose = if project.is_none() && dir != cwd {
        format!(
            " (the project of {}: the repository's root; `ai-sandbox init --project .` makes this directory a project of its own)",
            cwd.display()
        )
    } else {
        String::new()
    };
    host.print(&format!("wrote {}{whose}\n", path.display()));
    Ok(0)
}
