//! A review-mode session's directory, before and after podman: made (with its record) just
//! before the sandbox starts, and after it either left for the user's review or, when the
//! sandbox changed nothing in the project, removed. What is in it is read by `review`.

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
    Ok(vec![format!(
        "review mode: the project was not changed; this session's changes wait for your review:\n  \
         ai-sandbox diff {id}      what changed\n  \
         ai-sandbox apply {id}     put it in the project (commits arrive as the branch ai-sandbox/{id})\n  \
         ai-sandbox discard {id}   drop it"
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
