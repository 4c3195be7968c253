//! Where a launch's time goes, for `bench/run`'s start-up breakdown (never needed in normal
//! use): with `AISB_TIMINGS=FILE`, the launcher appends a `PHASE NS` line to FILE as each phase
//! ends, NS being CLOCK_MONOTONIC in nanoseconds (one clock for every process of the machine:
//! podman starts no time namespace). The OCI hook runs with podman's environment, not ours, so
//! it writes its own marks to `timings` in the session directory when the launcher made that file,
//! and the launcher copies them over when podman is done. Unset, a mark costs one environment
//! lookup per process and nothing else.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The variable that names the file.
pub const VAR: &str = "AISB_TIMINGS";
/// The hook's marks, in the session directory.
pub const HOOK_FILE: &str = "timings";

fn target() -> Option<&'static Path> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| std::env::var_os(VAR).filter(|v| !v.is_empty()).map(PathBuf::from)).as_deref()
}

/// Whether this launch is timed.
pub fn on() -> bool {
    target().is_some()
}

/// Notes that `phase` ended now (when timed).
pub fn mark(phase: &str) {
    if let Some(file) = target() {
        mark_to(file, phase);
    }
}

/// Appends `phase` and now to `file` (one write: lines of several processes do not mix).
pub fn mark_to(file: &Path, phase: &str) {
    let Ok(now) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) else { return };
    let ns = now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64;
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).create(true).open(file) {
        let _ = f.write_all(format!("{phase} {ns}\n").as_bytes());
    }
}

/// Copies the hook's marks (`HOOK_FILE` in `session_dir`) into this launch's file.
pub fn take_hook_marks(session_dir: &Path) {
    let Some(file) = target() else { return };
    if let Ok(text) = std::fs::read_to_string(session_dir.join(HOOK_FILE))
        && let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(file)
    {
        let _ = f.write_all(text.as_bytes());
    }
}
