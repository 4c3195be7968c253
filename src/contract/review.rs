//! A session in review mode, as its launcher leaves it for `diff`, `apply`, `discard`, `ps` and
//! `prune`: `reviews/ID/review.json` in the project's state directory, beside the session's
//! upper layer (`upper/`, what the sandbox wrote) and the overlay's `work/`.
//!
//! The record is written by the launcher before podman starts, so `started` is earlier than
//! anything the sandbox did: a host file changed after it (its ctime) is a conflict at `apply`.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Review {
    pub session: String,
    pub project: PathBuf,
    /// When the session started, in nanoseconds since the epoch (the clock ctime uses).
    pub started_ns: u64,
    /// The launcher's pid: while it runs, the session is not yet waiting for review.
    pub launcher_pid: u32,
}

/// Where a project's reviews are, in its state directory.
pub const REVIEWS_DIR: &str = "reviews";
/// The record, the upper layer and the overlay's work directory of one review.
pub const RECORD_FILE: &str = "review.json";
pub const UPPER_DIR: &str = "upper";
pub const WORK_DIR: &str = "work";
/// The paths `apply` promoted already, NUL-separated, appended as they land.
pub const APPLIED_FILE: &str = "applied";

/// The directory of session `id`'s review in the project state directory `state_dir`.
pub fn dir(state_dir: &Path, id: &str) -> PathBuf {
    state_dir.join(REVIEWS_DIR).join(id)
}
