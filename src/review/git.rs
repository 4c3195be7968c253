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

use crate::sys::quote;
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
    /// The host has that branch at this commit already (an earlier `apply` fetched it).
    pub(crate) arrived: bool,
}

/// A ref of the sandbox's that does not arrive, and why (its name as the layer has it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) repo: PathBuf,
    pub(crate) name: Vec<u8>,
    pub(crate) why: String,
}

/// At most this many refused branches are named one by one; the rest are counted.
const REFUSED_LISTED: usize = 20;

impl Refused {
    /// The lines `diff` and `apply` print for the refused branches.
    pub(crate) fn lines(all: &[Refused]) -> String {
        let mut out = String::new();
        for r in all.iter().take(REFUSED_LISTED) {
            let at = if r.repo.as_os_str().is_empty() {
                String::new()
            } else {
                format!(" (in {})", quote::arg(&r.repo))
            };
            out += &format!(
                "  ! the sandbox's branch {}{at}: {}; it does not arrive\n",
                quote::bytes(&r.name),
                r.why
            );
        }
        if all.len() > REFUSED_LISTED {
            out += &format!("  ! ... and {} more branches that do not arrive\n", all.len() - REFUSED_LISTED);
        }
        out
    }
}

/// The branches of a review: those that arrive, and those refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Branches {
    pub(crate) moved: Vec<Moved>,
    pub(crate) refused: Vec<Refused>,
}

/// At most this many bytes of objects are taken from the upper layer (a repository repacked
/// whole inside is as large as the project's history).
const OBJECTS_MAX: u64 = 8 << 30;

fn oid(text: &str) -> Option<String> {
    let t = text.trim();
    (matches!(t.len(), 40 | 64) && t.bytes().all(|b| b.is_ascii_hexdigit())).then(|| t.to_ascii_lowercase())
}

/// Whether `refs/heads/NAME` is a ref name by git's rules (git-check-ref-format(1)): no
/// component empty, starting with `.` or ending with `.lock`; no `..`, `@{`, control character,
/// space, `~ ^ : ? * [ \\`; not ending with `/` or `.`. The test holds it to git's own
/// `git check-ref-format` over a corpus of names.
pub(crate) fn valid_branch(name: &str) -> bool {
    let bad_char = |c: char| c.is_ascii_control() || " ~^:?*[\\".contains(c);
    !name.is_empty()
        && !name.contains("..")
        && !name.contains("@{")
        && !name.chars().any(bad_char)
        && !name.ends_with('.')
        && name.split('/').all(|c| !c.is_empty() && !c.starts_with('.') && !c.ends_with(".lock"))
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

/// Branches read from a repository: (name, commit), and the names refused with why.
#[derive(Default)]
struct Heads {
    found: Vec<(String, String)>,
    refused: Vec<(Vec<u8>, String)>,
}

impl Heads {
    /// A branch named by the bytes `name` at `text`: kept if both are what git would take.
    fn take(&mut self, name: &[u8], text: &[u8]) {
        let at = std::str::from_utf8(text).ok().and_then(oid);
        let why = match (std::str::from_utf8(name).ok().filter(|n| valid_branch(n)), at) {
            (Some(n), Some(o)) => {
                self.found.retain(|(x, _)| x != n);
                self.found.push((n.to_string(), o));
                return;
            }
            (None, _) => "not a valid branch name (git check-ref-format)",
            (Some(_), None) => "it does not name a commit",
        };
        self.refused.push((name.to_vec(), why.into()));
    }
}

/// The branches of a repository as the upper layer has them over the project's (`host`, read
/// once by the caller): the layer's packed refs if it wrote that file, then its loose refs.
fn heads(upper: &Tree, project: &Tree, git: &Path, host: &[(String, String)]) -> Heads {
    let mut out = match upper.read(&git.join("packed-refs"), 16 << 20) {
        Ok(packed) => {
            let mut out = packed_heads(&packed);
            loose(project, &git.join("refs/heads"), b"", 0, &mut out);
            out
        }
        Err(_) => Heads { found: host.to_vec(), refused: Vec::new() },
    };
    loose(upper, &git.join("refs/heads"), b"", 0, &mut out);
    out
}

/// The branches a `packed-refs` file names (other refs, its header and peeled lines skipped).
fn packed_heads(bytes: &[u8]) -> Heads {
    let mut out = Heads::default();
    for line in bytes.split(|b| *b == b'\n') {
        let Some(sp) = line.iter().position(|b| *b == b' ') else { continue };
        let (o, r) = (&line[..sp], &line[sp + 1..]);
        if line.starts_with(b"#") || line.starts_with(b"^") {
            continue;
        }
        if let Some(name) = r.strip_prefix(b"refs/heads/") {
            out.take(name, o);
        }
    }
    out
}

fn loose(tree: &Tree, dir: &Path, prefix: &[u8], depth: usize, out: &mut Heads) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(names) = tree.list(dir) else { return };
    for (n, k) in names {
        let name = [prefix, n.as_bytes()].concat();
        match k {
            Kind::Dir if depth < 16 => {
                loose(tree, &dir.join(&n), &[&name[..], b"/"].concat(), depth + 1, out)
            }
            Kind::File => {
                let text = tree.read(&dir.join(&n), 128).unwrap_or_default();
                out.take(&name, &text);
            }
            _ => out.refused.push((name, format!("{} where a branch is a file", k.name()))),
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
/// for the host, and the refs that cannot arrive. `name`: the name given for the branch HEAD was
/// on (default `ai-sandbox/ID`).
pub(crate) fn moved(upper: &Tree, project: &Tree, id: &str, name: Option<&str>) -> Branches {
    let mut found = Vec::new();
    repos(upper, project, Path::new(""), 0, &mut found);
    let main = name.map(String::from).unwrap_or_else(|| format!("ai-sandbox/{id}"));
    let mut out = Branches::default();
    for repo in found {
        let git = repo.join(".git");
        let mut host = packed_heads(&project.read(&git.join("packed-refs"), 16 << 20).unwrap_or_default());
        loose(project, &git.join("refs/heads"), b"", 0, &mut host);
        let host = host.found;
        let on = head(upper, project, &git);
        let suffix = |n: &str| {
            if repo.as_os_str().is_empty() {
                n.to_string()
            } else {
                format!("{n}-{}", repo.to_string_lossy().replace('/', "-"))
            }
        };
        let push = |out: &mut Branches, mut m: Moved| {
            if valid_branch(&m.target) {
                m.arrived = host.iter().any(|(n, h)| *n == m.target && *h == m.oid);
                out.moved.push(m);
            } else {
                let why = format!(
                    "the branch it would become here, {}, is not a valid branch name",
                    quote::text(&m.target)
                );
                out.refused.push(Refused { repo: m.repo, name: m.name.into_bytes(), why });
            }
        };
        let Heads { found: heads, refused } = heads(upper, project, &git, &host);
        for (name, why) in refused {
            out.refused.push(Refused { repo: repo.clone(), name, why });
        }
        for (b, o) in heads {
            if host.iter().any(|(n, h)| *n == b && *h == o) || b.starts_with("ai-sandbox/") {
                continue;
            }
            let target = match &on {
                Some(Ok(h)) if *h == b => suffix(&main),
                _ => suffix(&format!("ai-sandbox/{id}-{b}")),
            };
            push(&mut out, Moved { repo: repo.clone(), name: b, oid: o, target, arrived: false });
        }
        if let Some(Err(o)) = on
            && !out.moved.iter().any(|m| m.repo == repo && m.oid == o)
            && !host.iter().any(|(_, h)| *h == o)
        {
            let m = Moved {
                repo: repo.clone(),
                name: "HEAD".into(),
                oid: o,
                target: suffix(&main),
                arrived: false,
            };
            push(&mut out, m);
        }
    }
    out
}

/// Fetches `moved` (all of one repository each time) into the host's repositories, through a
/// scratch repository in `scratch` (removed after). The lines to say; a branch that git would
/// not fetch is said, and the others still arrive.
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
    let moved: Vec<&Moved> = moved.collect();
    let mut specs = Vec::new();
    for (n, m) in moved.iter().enumerate() {
        let r = scratch.join(format!("refs/heads/aisb-{n}"));
        std::fs::write(&r, format!("{}\n", m.oid))?;
        specs.push(format!("+refs/heads/aisb-{n}:refs/heads/{}", m.target));
    }
    let s = scratch.display().to_string();
    let fetch = |specs: &[String]| {
        let mut args =
            vec!["-c", "transfer.fsckObjects=true", "fetch", "-q", "--no-tags", "--no-write-fetch-head", &s];
        args.extend(specs.iter().map(String::as_str));
        git(&args, None, Some(&host_repo))
    };
    let at = if repo.as_os_str().is_empty() { String::new() } else { format!(" in {}", quote::arg(repo)) };
    let arrived = |m: &Moved| {
        let subject =
            git_out(&["log", "-1", "--format=%h %s", &format!("refs/heads/{}", m.target)], &host_repo)
                .unwrap_or_default();
        format!(
            "branch {}{at} <- the sandbox's {} ({})",
            quote::text(&m.target),
            quote::text(&m.name),
            quote::text(subject.trim())
        )
    };
    if fetch(&specs).is_ok() {
        return Ok(moved.iter().map(|m| arrived(m)).collect());
    }
    // One bad branch (an object missing or malformed) fails the whole fetch: each on its own,
    // so that the others arrive and the bad one is named.
    Ok(moved
        .iter()
        .zip(&specs)
        .map(|(m, spec)| match fetch(std::slice::from_ref(spec)) {
            Ok(()) => arrived(m),
            Err(e) => format!(
                "! the sandbox's {}{at} did not arrive: {}",
                quote::text(&m.name),
                e.to_string().lines().next().unwrap_or_default()
            ),
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
        // git names what it refused, and those names are the sandbox's: printed escaped.
        let why: Vec<String> = String::from_utf8_lossy(&out.stderr).trim().lines().map(quote::text).collect();
        bail!("git {} failed: {}", quote::text(args.first().copied().unwrap_or_default()), why.join("; "));
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
            "# pack-refs with: peeled fully-peeled sorted\n{a} refs/heads/main\n{a} refs/tags/v1\n^{a}\nzz refs/heads/bad\n{a} refs/heads/agent/x\n{a} refs/heads/\x1b[2Kx\n"
        );
        let bytes = [text.as_bytes(), a.as_bytes(), b" refs/heads/\xff\n"].concat();
        let h = packed_heads(&bytes);
        assert_eq!(h.found, vec![("main".to_string(), a.clone()), ("agent/x".to_string(), a.clone())]);
        let refused: Vec<(&[u8], &str)> = h.refused.iter().map(|(n, w)| (n.as_slice(), w.as_str())).collect();
        assert_eq!(
            refused,
            [
                (&b"bad"[..], "it does not name a commit"),
                (b"\x1b[2Kx", "not a valid branch name (git check-ref-format)"),
                (b"\xff", "not a valid branch name (git check-ref-format)"),
            ]
        );
        let lines =
            Refused::lines(&[Refused { repo: "lib".into(), name: b"\x1b[2Kx".to_vec(), why: "w".into() }]);
        assert_eq!(lines, "  ! the sandbox's branch \\e[2Kx (in lib): w; it does not arrive\n");
        let many: Vec<Refused> = (0..25)
            .map(|n| Refused { repo: "".into(), name: format!("b{n}").into_bytes(), why: "w".into() })
            .collect();
        let l = Refused::lines(&many);
        assert_eq!(l.lines().count(), REFUSED_LISTED + 1);
        assert!(l.ends_with("... and 5 more branches that do not arrive\n"), "{l}");
    }

    /// The names git itself refuses or takes, against `git check-ref-format`.
    #[test]
    fn branch_names_are_valid_exactly_when_git_says_so() {
        let names = [
            "main",
            "agent/x",
            "a.b",
            "x-y_z",
            "ünï",
            "a/b/c",
            "@",
            "a@b",
            "a@{b",
            "..",
            "a..b",
            ".a",
            "a/.b",
            "a.",
            "a/",
            "/a",
            "a//b",
            "a.lock",
            "a/b.lock/c",
            "a b",
            "a~1",
            "a^",
            "a:b",
            "a?",
            "a*",
            "a[b",
            "a\\b",
            "a\x1b[2K",
            "a\tb",
            "a\x7f",
            "",
            "-a",
            "a-",
            "HEAD",
            "a/-b",
            "@/a",
            "a.lock.b",
            "lock",
            ".lock",
        ];
        for n in names {
            let git = Command::new("git")
                .args(["check-ref-format", &format!("refs/heads/{n}")])
                .output()
                .expect("git")
                .status
                .success();
            assert_eq!(valid_branch(n), git, "{n:?}: git says {git}");
        }
    }
}
