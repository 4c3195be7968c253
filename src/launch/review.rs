//! A review-mode session's directory, before and after podman: made (with its record) just
//! before the sandbox starts, and after it either left for the user's review or, when the
//! sandbox changed nothing in the project, removed. What is in it is read by `review`.

use crate::contract::control::Request;
use crate::contract::review::{self, Review};
use crate::plan::ReviewSpec;
use anyhow::Context;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// Makes `reviews/ID/{upper,work}` (0700: the upper layer may hold anything of the project's)
/// and the record, whose `started_ns` is taken now: before anything of the sandbox runs.
pub(crate) fn open(spec: &ReviewSpec) -> anyhow::Result<()> {
    for d in [review::UPPER_DIR, review::WORK_DIR] {
        let p = spec.dir.join(d);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&p)
            .with_context(|| format!("creating {}", p.display()))?;
    }
    let record = Review {
        session: spec.session.clone(),
        project: spec.project.clone(),
        started_ns: now_ns(),
        launcher_pid: std::process::id(),
    };
    let path = spec.dir.join(review::RECORD_FILE);
    fs::write(&path, serde_json::to_string(&record)?).with_context(|| format!("writing {}", path.display()))
}

/// After the session: the lines to say. An empty upper layer (nothing written) is removed with
/// the rest of the review; anything else waits for `diff`, `apply` or `discard`.
pub(crate) fn close(spec: &ReviewSpec, podman: &Path) -> anyhow::Result<Vec<String>> {
    let upper = spec.dir.join(review::UPPER_DIR);
    let empty =
        fs::read_dir(&upper).with_context(|| format!("reading {}", upper.display()))?.next().is_none();
    let id = &spec.session;
    if empty {
        remove(&spec.dir, podman)?;
        return Ok(vec![format!("review mode: the session changed nothing in the project ({id})")]);
    }
    // To whoever watches (`ai-sandbox watch` in another terminal). A gate that cannot take it
    // (the previous version's) leaves it to the lines below.
    if let Some(runtime) = &spec.gate_runtime {
        let _ = crate::gate::control::call(runtime, &Request::Review { session: id.clone() });
    }
    let here = std::env::current_dir().ok();
    Ok(vec![format!(
        "review mode: the project was not changed; this session's changes wait for your review:\n{}",
        commands(id, &spec.project, here.as_deref())
    )])
}

/// Removes a review's directory. The overlay leaves `work/work` owned by the subordinate root,
/// mode 000: empty after the session, so removing the name needs only the parent (the user's);
/// what else the kernel made as that id (a whiteout in a directory of its own) goes through
/// podman's user namespace (`remove_tree`), which costs a podman start.
pub(crate) fn remove(dir: &Path, podman: &Path) -> anyhow::Result<()> {
    let _ = fs::remove_dir(dir.join(review::WORK_DIR).join("work"));
    super::remove_tree(dir, podman)
}

pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The commands that take a waiting review, one per line with what each does, as the user can
/// type them: with `--project P` unless `here` (the current directory) lies in the project.
pub(crate) fn commands(id: &str, project: &Path, here: Option<&Path>) -> String {
    let at = match here {
        Some(h) if h.starts_with(project) => String::new(),
        _ => format!(" --project {}", shell_word(&project.to_string_lossy())),
    };
    let lines = [
        (format!("ai-sandbox diff{at} {id}"), "what changed".to_string()),
        (
            format!("ai-sandbox apply{at} {id}"),
            format!("put it in the project (commits arrive as the branch ai-sandbox/{id})"),
        ),
        (format!("ai-sandbox discard{at} {id}"), "drop it".to_string()),
    ];
    let width = lines.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    lines.iter().map(|(c, what)| format!("  {c:width$}   {what}")).collect::<Vec<_>>().join("\n")
}

/// A word a POSIX shell reads back as `s`: as it is when it holds only characters no shell
/// treats specially, else single-quoted (a quote in it as `'"'"'`: no backslash, which
/// `quote::text` would double). Control characters stay escaped (`quote::text`): a
/// name that holds one is shown, never written to the terminal raw.
fn shell_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+=:@,%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return s.to_string();
    }
    crate::sys::quote::text(&format!("'{}'", s.replace('\'', r#"'"'"'"#)))
}

#[cfg(test)]
mod tests {
    use super::commands;
    use std::path::Path;

    #[test]
    fn the_commands_name_the_project_only_when_typed_outside_it() {
        let p = Path::new("/home/u/proj");
        let inside = commands("ab12", p, Some(Path::new("/home/u/proj/src")));
        assert!(inside.contains("  ai-sandbox diff ab12 "), "{inside}");
        assert!(
            inside.contains("ai-sandbox apply ab12 ") && inside.contains("branch ai-sandbox/ab12"),
            "{inside}"
        );
        assert!(!inside.contains("--project"), "{inside}");
        // A sibling whose name starts the same is not inside.
        let out = commands("ab12", p, Some(Path::new("/home/u/proj2")));
        assert!(out.contains("ai-sandbox discard --project /home/u/proj ab12 "), "{out}");
        assert!(commands("ab12", p, None).contains("--project /home/u/proj ab12"));
        // Each description starts in one column.
        let lines: Vec<&str> = out.lines().collect();
        let at = [lines[0].find("what changed"), lines[1].find("put it in"), lines[2].find("drop it")];
        assert!(at[0].is_some() && at.iter().all(|c| *c == at[0]), "{out}");
    }

    #[test]
    fn a_project_path_is_one_shell_word_and_never_raw_control_characters() {
        let w = |s: &str| super::shell_word(s);
        assert_eq!(w("/a/b-c_d.e"), "/a/b-c_d.e");
        assert_eq!(w("/my proj"), "'/my proj'");
        assert_eq!(w("/it's"), r#"'/it'"'"'s'"#);
        assert_eq!(w("/$(x)`y`;z"), "'/$(x)`y`;z'");
        assert_eq!(w("/a\u{1b}]0;t"), "'/a\\e]0;t'");
        assert_eq!(w(""), "''");
    }
}
