//! A command `ai-sandbox exec` runs in a running sandbox, as `ps` lists it. `exec` writes it to
//! `sessions/ID/exec/PID` just before it becomes `podman exec` (exec(2): the same pid), and `ps`
//! reads it while that pid is still the `podman exec` into this sandbox's container.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Execd {
    /// The command as given (or the default shell's).
    pub command: Vec<String>,
    /// The container it was started in: `ps` lists the pid only while its command line names it.
    pub container: String,
}

/// The directory of a session's exec records, in its session directory.
pub const EXEC_DIR: &str = "exec";
