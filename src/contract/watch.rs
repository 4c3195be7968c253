//! The watch stream: after a `Watch` request's reply, the gate sends one JSON line per message
//! (`Watch`, tagged by `kind`) for as long as the watcher stays, and reads the watcher's
//! `Answer` lines. A gate of the previous version sent the two kinds untagged (a watcher had to
//! try each); `Watch::read` is the one place that still reads that form.

use super::log::Event;
use serde::{Deserialize, Serialize};

/// The most bytes an answer line from a watcher may hold, its newline not counted: the longest
/// `Answer` is 48 (`{"ask":18446744073709551615,"verdict":"allowed"}`), so 4 KiB leaves room
/// for fields to come. The gate hangs up on a watcher that sends a longer line.
pub const ANSWER_MAX: usize = 4 << 10;

/// A watcher's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Let this request through, and nothing else.
    Once,
    /// The watcher changed the session's policy (a live allow); decide again with it.
    Allowed,
    /// Refuse, as without a watcher.
    Deny,
}

/// What a watcher is asked (one JSON line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Question {
    pub(crate) ask: u64,
    pub(crate) session: String,
    pub(crate) project: String,
    pub(crate) method: String,
    pub(crate) host: String,
    pub(crate) port: u16,
    /// How long the request is held.
    pub(crate) seconds: u32,
    /// The `allow =` value that would let it through (what `a` and `s` add).
    #[serde(default)]
    pub(crate) allow: Option<String>,
    /// The request's path, when the gate read the request (a host with rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) path: Option<String>,
}

/// A watcher's answer to question `ask` (one JSON line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub(crate) ask: u64,
    pub(crate) verdict: Verdict,
}

#[cfg(test)]
impl Question {
    /// A held CONNECT to a.test:443 for tests: change what a test is about with `..`.
    pub(crate) fn example() -> Question {
        Question {
            ask: 0,
            session: "s".into(),
            project: "/p".into(),
            method: "CONNECT".into(),
            host: "a.test".into(),
            port: 443,
            seconds: 5,
            allow: None,
            path: None,
        }
    }
}

/// One message of the stream. A new kind is a compile error in every reader's match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Watch {
    /// A request held for the watcher's answer (`ask = SECONDS`).
    Ask(Question),
    /// A refusal, as the gate logged it.
    Refused(Event),
    /// A review-mode session ended and its change waits for the user's review.
    Review(Ended),
}

/// A review-mode session that ended with a change to review (`diff`, `apply`, `discard`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    pub(crate) session: String,
    pub(crate) project: String,
}

impl Watch {
    /// The line the gate sends.
    pub fn line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// One line from the gate, of this version or the previous one; `None` for a line that is
    /// neither (skipped: a newer gate's kind this watcher does not know).
    pub fn read(line: &str) -> Option<Watch> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        if v.get("kind").is_some() {
            return serde_json::from_value(v).ok();
        }
        // The previous version: a question has `ask`, a refusal `decision`.
        if v.get("ask").is_some() {
            serde_json::from_value(v).ok().map(Watch::Ask)
        } else {
            serde_json::from_value(v).ok().map(Watch::Refused)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> Question {
        Question { ask: 3, allow: Some("a.test".into()), ..Question::example() }
    }

    fn ev() -> Event {
        serde_json::from_str(r#"{"time":"t","session":"s","method":"CONNECT","host":"x.test","port":443,"decision":"deny","status":403,"reason":"r"}"#).unwrap()
    }

    #[test]
    fn each_message_says_its_kind_and_reads_back_as_itself() {
        let ended = Ended { session: "s".into(), project: "/p".into() };
        for m in [Watch::Ask(q()), Watch::Refused(ev()), Watch::Review(ended)] {
            let line = m.line();
            assert!(line.starts_with(r#"{"kind":""#), "{line}");
            assert_eq!(Watch::read(&line), Some(m));
        }
        // An unknown kind (a newer gate's) is skipped, not taken for another.
        assert_eq!(Watch::read(r#"{"kind":"later","ask":1}"#), None);
    }

    #[test]
    fn the_untagged_lines_of_the_previous_version_are_read() {
        let old_q = serde_json::to_string(&q()).unwrap();
        let old_e = serde_json::to_string(&ev()).unwrap();
        assert_eq!(Watch::read(&old_q), Some(Watch::Ask(q())));
        assert_eq!(Watch::read(&old_e), Some(Watch::Refused(ev())));
        assert_eq!(Watch::read("not json"), None);
    }
}
