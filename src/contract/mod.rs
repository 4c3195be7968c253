//! The contract between our processes: every message and record that one process writes and
//! another reads, each written once, serialised by serde.
//!
//! | type | written by | read by | over |
//! |---|---|---|---|
//! | `SessionPolicy`, `Bound` | launcher, `ai-sandbox allow` | gate | control socket |
//! | `control::Request` / the replies | launcher, `gate`, `watch`, `allow` / gate | the other | control socket |
//! | `watch::Watch`, `watch::Answer` | gate / `ai-sandbox watch` | the other | control socket |
//! | `log::Event` | gate | `logs`, `gate logs`, `watch`, `ps` | the log file, the watch stream |
//! | `keeper::Message` | launcher | keeper | the keeper's stdin |
//! | `Record` | launcher, `allow` | `allow`, `ps` | `live.json` |
//! | `direct::Direct` | launcher | gate (which logs it as an `Event` of the rules' layer) | control socket |
//! | `execd::Execd` | `ai-sandbox exec` | `ps` | `sessions/ID/exec/PID` |
//! | `review::Review` | launcher (review mode) | `diff`, `apply`, `discard`, `ps`, `prune` | `reviews/ID/review.json` |
//!
//! Versioning: a running gate of the previous version serves the next launcher until it idles
//! out (docs/adr/0017), and log lines and live records stay on disk across upgrades. So fields are
//! only added (`#[serde(default)]`), and where an older peer wrote something in words, the one
//! place that reads it (`control::Reply::refusal`, `watch::Watch::read`) says which version did.
//!
//! It sits just above the policy's vocabulary (`policy::allow`, `policy::rule`: the entries every
//! message carries) and below every process (gate, launch, live, cli), so all of them can use it
//! and it uses none of them.

pub mod capability;
pub mod control;
pub mod direct;
pub mod execd;
pub mod keeper;
pub mod live;
pub mod log;
pub mod review;
pub mod session;
pub mod watch;

pub use live::Record;
pub use session::{Bound, LoginRef, SessionPolicy, SessionStatus};
