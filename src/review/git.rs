//! Commits made inside a review session arrive as branches, fetched into the host's repository
//! from a scratch repository this program makes, never by copying git's files and never by
//! running anything of the agent's repository (its config, hooks, filters, fsmonitor: the class
//! of CVE-2024-32004, a repository that runs code when the host's git reads it).
//!
//! The scratch repository is `git init --bare` (the user's own git, its config ours), holding
//! only the objects the sandbox wrote (regular files under `.git/objects`, read through
//! `sys::untrusted`; its `info/alternates` is not taken) with the host repository's objects as
//! its alternate, and one ref per branch the sandbox moved. The host's git fetches from it with
//! `transfer.fsckObjects` on, so a malformed object is refused. Branch names: the branch HEAD was
//! on becomes `ai-sandbox/ID`, any other moved branch `ai-sandbox/ID-NAME`; the host's own
//! branches, HEAD, index and work tree are not touched.

use crate::sys::untrusted::{Kind, Tree};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A branch the sandbox moved, in one repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Moved {
    /// The repository's directory, relative to the project ("" for the project's own).
    pub(crate) repo: PathBuf,
    /// Its name inside (`main`), or `HEAD` for a detached head.
    pub(crate) name: String,
    pub(crate) oid: String,
    /// The branch it becomes on the host.
    pub(crate) target: String,
}

/// At most this many bytes of objects are taken from the upper layer (a repository repacked
/// whole inside is as large as the project's history).
const OBJECTS_MAX: u64 = 8 << 30;

fn oid(text: &str) -> Option<String> {
    let t = text.trim();
    (matches!(t.len(), 40 | 64) && t.bytes().all(|b| b.is_ascii_hexdigit())).then(|| t.to_ascii_lowercase())
}

/// The repositories whose git directory the sandbox wrote and the project has (a repository the
/// sandbox made arrives as files, which `apply` never takes: its `.git` is called out).
fn repos(upper: &Tree, project: &Tree, dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(names) = upper.list(dir) else { return };
    for (n, k) in names {
        let p = dir.join(&n);
        if k != Kind::Dir {
            continue;
        }
        if n == ".git" {
            if project.stat(&p).ok().flatten().is_some_and(|s| s.kind == Kind::Dir) {
                out.push(dir.to_path_buf());
            }
        } else if depth < 32 {
            repos(upper, project, &p, depth + 1, out);
        }
    }
}

/// The branches of a repository as the upper layer has them over the project's (`host`, read
/// once by the caller): the layer's packed refs if it wrote that file, then its loose refs.
fn heads(upper: &Tree, project: &Tree, git: &Path, host: &[(String, String)]) -> Vec<(String, String)> {
    let mut out = match upper.read(&git.join("packed-refs"), 16 << 20) {
        Ok(packed) => {
            let mut out = packed_heads(&packed);
            loose(project, &git.join("refs/heads"), "", 0, &mut out);
            out
        }
        Err(_) => host.to_vec(),
    };
    loose(upper, &git.join("refs/heads"), "", 0, &mut out);
    out
}

/// The branches a `packed-refs` file names.
fn packed_heads(bytes: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in String::from_utf8_lossy(bytes).lines() {
        if let Some((o, r)) = line.split_once(' ')
            && let (Some(o), Some(name)) = (oid(o), r.strip_prefix("refs/heads/"))
        {
            out.push((name.to_string(), o));
        }
    }
    out
}

fn loose(tree: &Tree, dir: &Path, prefix: &str, depth: usize, out: &mut Vec<(String, String)>) {
    let Ok(names) = tree.list(dir) else { return };
    for (n, k) in names {
        let Some(n) = n.to_str() else { continue };
        let name = format!("{prefix}{n}");
        match k {
            Kind::Dir if depth < 16 => loose(tree, &dir.join(n), &format!("{name}/"), depth + 1, out),
            Kind::File => {
                if let Some(o) =
                    tree.read(&dir.join(n), 128).ok().and_then(|b| oid(&String::from_utf8_lossy(&b)))
                {
                    out.retain(|(x, _)| *x != name);
                    out.push((name, o));
                }
            }
            _ => {}
        }
    }
}

/// What HEAD names: a branch, or a commit (detached).
fn head(upper: &Tree, project: &Tree, git: &Path) -> Option<Result<String, String>> {
    let b = upper.read(&git.join("HEAD"), 4096).or_else(|_| project.read(&git.join("HEAD"), 4096)).ok()?;
    let t = String::from_utf8_lossy(&b).trim().to_string();
    match t.strip_prefix("ref: refs/heads/") {
        Some(name) => Some(Ok(name.to_string())),
        None => oid(&t).map(Err),
    }
}

/// Every branch the sandbox moved (its tip is not the host's branch of that name now), named
/// for the host. `name`: the name given for the branch HEAD was on (default `ai-sandbox/ID`).
pub(crate) fn moved(upper: &Tree, project: &Tree, id: &str, name: Option<&str>) -> Vec<Moved> {
    let mut found = Vec::new();
    repos(upper, project, Path::new(""), 0, &mut found);
    let main = name.map(String::from).unwrap_or_else(|| format!("ai-sandbox/{id}"));
    let mut out = Vec::new();
    for repo in found {
        let git = repo.join(".git");
        let mut host = packed_heads(&project.read(&git.join("packed-refs"), 16 << 20).unwrap_or_default());
        loose(project, &git.join("refs/heads"), "", 0, &mut host);
        let on = head(upper, project, &git);
        let suffix = |n: &str| {
            if repo.as_os_str().is_empty() {
                n.to_string()
            } else {
                format!("{n}-{}", repo.display().to_string().replace('/', "-"))
            }
        };
        for (b, o) in heads(upper, project, &git, &host) {
            if host.iter().any(|(n, h)| *n == b && *h == o) || b.starts_with("ai-sandbox/") {
                continue;
            }
            let target = match &on {
                Some(Ok(h)) if *h == b => suffix(&main),
                _ => suffix(&format!("ai-sandbox/{id}-{b}")),
            };
            out.push(Moved { repo: repo.clone(), name: b, oid: o, target });
        }
        if let Some(Err(o)) = on
            && !out.iter().any(|m| m.repo == repo && m.oid == o)
            && !host.iter().any(|(_, h)| *h == o)
        {
            out.push(Moved { repo: repo.clone(), name: "HEAD".into(), oid: o, target: suffix(&main) });
        }
    }
    out
}

/// Fetches `moved` (all of one repository each time) into the host's repositories, through a
/// scratch repository in `scratch` (removed after). The lines to say.
pub(crate) fn fetch(
    moved: &[Moved],
    upper: &Tree,
    project: &Path,
    scratch: &Path,
) -> anyhow::Result<Vec<String>> {
    let mut said = Vec::new();
    let mut repos: Vec<&PathBuf> = moved.iter().map(|m| &m.repo).collect();
    repos.dedup();
    for repo in repos {
        let _ = std::fs::remove_dir_all(scratch);
        let result = fetch_one(moved.iter().filter(|m| &m.repo == repo), upper, project, repo, scratch);
        let _ = std::fs::remove_dir_all(scratch);
        said.extend(result?);
    }
    Ok(said)
}

fn fetch_one<'a>(
    moved: impl Iterator<Item = &'a Moved>,
    upper: &Tree,
    project: &Path,
    repo: &Path,
    scratch: &Path,
) -> anyhow::Result<Vec<String>> {
    let host_repo = project.join(repo);
    git(&["init", "-q", "--bare"], Some(scratch), None)?;
    let objects = repo.join(".git/objects");
    let mut bytes = 0u64;
    copy_objects(upper, &objects, &scratch.join("objects"), 0, &mut bytes)?;
    std::fs::create_dir_all(scratch.join("objects/info"))?;
    let alt = host_repo.join(".git/objects");
    std::fs::write(scratch.join("objects/info/alternates"), format!("{}\n", alt.display()))?;
    let mut specs = Vec::new();
    let moved: Vec<&Moved> = moved.collect();
    for (n, m) in moved.iter().enumerate() {
        let r = scratch.join(format!("refs/heads/aisb-{n}"));
        std::fs::write(&r, format!("{}\n", m.oid))?;
        specs.push(format!("+refs/heads/aisb-{n}:refs/heads/{}", m.target));
    }
    let mut args =
        vec!["-c", "transfer.fsckObjects=true", "fetch", "-q", "--no-tags", "--no-write-fetch-head"];
    let s = scratch.display().to_string();
    args.push(&s);
    args.extend(specs.iter().map(String::as_str));
    git(&args, None, Some(&host_repo))?;
    let at = if repo.as_os_str().is_empty() { String::new() } else { format!(" in {}", repo.display()) };
    Ok(moved
        .iter()
        .map(|m| {
            let subject =
                git_out(&["log", "-1", "--format=%h %s", &format!("refs/heads/{}", m.target)], &host_repo)
                    .unwrap_or_default();
            format!("branch {}{at} <- the sandbox's {} ({})", m.target, m.name, subject.trim())
        })
        .collect())
}

/// Copies the regular files below `from` (in the upper layer) to `to`, skipping `info/`.
fn copy_objects(upper: &Tree, from: &Path, to: &Path, depth: usize, bytes: &mut u64) -> anyhow::Result<()> {
    let Ok(names) = upper.list(from) else { return Ok(()) };
    std::fs::create_dir_all(to)?;
    for (n, k) in names {
        let p = from.join(&n);
        match k {
            Kind::Dir if n != "info" && depth < 3 => copy_objects(upper, &p, &to.join(&n), depth + 1, bytes)?,
            Kind::File => {
                let Ok((mut f, st)) = upper.open_file(&p) else { continue };
                *bytes += st.len;
                if *bytes > OBJECTS_MAX {
                    bail!("the sandbox's git objects are over {} GiB; not fetched", OBJECTS_MAX >> 30);
                }
                let mut out = std::fs::File::create(to.join(&n))?;
                std::io::copy(&mut f, &mut out)?;
            }
            _ => {}
        }
    }
    Ok(())
}

fn git(args: &[&str], init_at: Option<&Path>, dir: Option<&Path>) -> anyhow::Result<()> {
    let mut cmd = Command::new("git");
    if let Some(d) = dir {
        cmd.arg("-C").arg(d);
    }
    cmd.args(args);
    if let Some(d) = init_at {
        cmd.arg(d);
    }
    let out = cmd.stdin(std::process::Stdio::null()).output().context("running git")?;
    if !out.status.success() {
        bail!("git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn git_out(args: &[&str], dir: &Path) -> Option<String> {
    let out =
        Command::new("git").arg("-C").arg(dir).args(args).stdin(std::process::Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_packed_refs_are_read_strictly() {
        let a = "a".repeat(40);
        assert_eq!(oid(&format!("{}\n", a.to_uppercase())), Some(a.clone()));
        assert_eq!(oid(&"b".repeat(64)), Some("b".repeat(64)), "sha256 repositories");
        assert_eq!(oid(&"a".repeat(39)), None);
        assert_eq!(oid(&format!("{}g", "a".repeat(39))), None);
        let text = format!(
            "# pack-refs with: peeled fully-peeled sorted\n{a} refs/heads/main\n{a} refs/tags/v1\n^{a}\nzz refs/heads/bad\n{a} refs/heads/agent/x\n"
        );
        assert_eq!(
            packed_heads(text.as_bytes()),
            vec![("main".to_string(), a.clone()), ("agent/x".to_string(), a.clone())]
        );
    }
}
