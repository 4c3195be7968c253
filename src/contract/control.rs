//! The gate's control socket protocol: one JSON line per request (`Request`, tagged by `op`),
//! one JSON line back (`Reply`), then, for `Watch`, the watch stream (`contract::watch`).
//!
//! The reply on the wire is one object for every operation, the form every version wrote: a
//! launcher of the previous version, still running during an upgrade, reads `ok` and `error`
//! from a new gate, and a new launcher reads a gate of the previous version until it idles out
//! (docs/adr/0017). In the code a reply is built only by its operation's constructor
//! (`Reply::registered`, `Reply::status`, `Reply::done`, `Reply::refused`) and read through the
//! typed views (`Registered`, `GateStatus`, `Reply::refusal`), so a refusal is a `Refusal`
//! variant, never a string compared.

use super::session::{Bound, SessionPolicy, SessionStatus};
use serde::{Deserialize, Serialize};

/// The most bytes a request line may hold, its newline not counted: the gate reads no more of a
/// line (and refuses a longer one), and the client does not send a longer one. The largest
/// legitimate requests, measured: a `Refused` with every destination the sandbox's sets record
/// (4,096 per family, each the longest IPv6 address with a deny line) is 885 KB; a registration
/// with the system's CA bundle as `upstream_ca` (220 KB), 1,000 allow entries and eight 4 KiB
/// secrets is 308 KB. 4 MiB leaves the first 4.7 times its size.
pub const REQUEST_MAX: usize = 4 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    Register {
        session: String,
        project: String,
        token: String,
        policy: SessionPolicy,
        /// Secrets bound to hosts: the gate substitutes them (never written anywhere).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        secrets: Vec<Bound>,
        /// Extra roots (PEM) for the servers the gate opens TLS to (`upstream_ca`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upstream_ca: Option<String>,
    },
    /// A live change (`ai-sandbox allow`): the session's whole new policy.
    Update {
        session: String,
        policy: SessionPolicy,
    },
    /// `ai-sandbox watch`: after the reply, the gate sends refusals and questions (JSON lines)
    /// and reads answers (`ask::Answer` lines) until the watcher hangs up.
    Watch,
    Status,
    Stop,
    /// The launcher of `session` read these direct connections from its sandbox's rules: the
    /// gate logs each (as the rules' decision) and shows it to watchers.
    Refused {
        session: String,
        refused: Vec<super::direct::Direct>,
    },
    /// The launcher of `session` (review mode) ended it with a change that waits for review:
    /// the gate tells the watchers (`watch::Watch::Review`). A gate of the previous version
    /// answers a bad request, and the launcher's own exit lines still say it.
    Review {
        session: String,
    },
}

/// Why the gate refused a request. Its `Display` is the `error` text every version wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "why", rename_all = "snake_case")]
pub enum Refusal {
    /// The gate is closing (idle, or `gate stop`): start the next gate and register again.
    Closing,
    /// The connecting process is not this user's, in this user namespace (docs/adr/0055).
    Peer(String),
    /// The session could not be set up in the gate (its bound secrets, the gate's CA).
    Session(String),
    /// An update for a session this gate does not hold.
    NoSession(String),
    /// The request line could not be read.
    BadRequest(String),
    /// A gate of an older version refused in words only (never written by this version).
    Said(String),
}

/// What a gate of the versions before `refusal` answered a closing registration with: read in
/// `Reply::refusal` only, the one place that still compares words.
const CLOSING_SAID: &str = "the gate is closing";

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Closing => f.write_str(CLOSING_SAID),
            Refusal::Peer(why) => write!(f, "refused: {why}"),
            Refusal::Session(why) | Refusal::Said(why) => f.write_str(why),
            Refusal::NoSession(id) => write!(f, "no session {id} in this gate"),
            Refusal::BadRequest(why) => write!(f, "bad request: {why}"),
        }
    }
}

/// The reply as it travels (see the module doc): build it with its operation's constructor, read
/// it through `refusal` and the typed views.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reply {
    ok: bool,
    /// The refusal in words (what a launcher of an older version reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// The refusal as a kind (absent from gates of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refusal: Option<Refusal>,
    #[serde(default)]
    port: u16,
    #[serde(default)]
    pid: u32,
    #[serde(default)]
    sessions: Vec<SessionStatus>,
    /// The gate's CA certificate (PEM), to a registration whose session the gate opens TLS for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca: Option<String>,
    /// To a learning run's registration: this gate learns (a gate of an older version ignores
    /// `learn` and refuses as always, so the launcher needs to hear it said).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    learning: bool,
    /// To a registration with push rules limited by ref: this gate reads a push's refs (one of
    /// an older version ignores the limit and would let every push of the rule through).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    push_refs: bool,
    /// To a registration with budgets: this gate counts what the session sends (one of an older
    /// version ignores them and would let everything through).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    budgets: bool,
    /// To a registration with a budget over a period: this gate keeps the project's count
    /// across sessions (one of an older version would count each session anew).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    periods: bool,
}

/// A registration's reply, and (its flags only) a live change's: what the gate honours of the
/// session's policy, said back because a gate of an older version ignores what it does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The gate's port (the sandbox's proxy).
    pub port: u16,
    /// The gate's CA certificate, when the session has bound secrets or rules.
    pub ca: Option<String>,
    /// The gate will learn for this session (it was registered as a learning run).
    pub learning: bool,
    /// The gate limits this session's pushes by ref (its rules have such a limit).
    pub push_refs: bool,
    /// The gate counts this session's budgets (it has `budget` lines).
    pub budgets: bool,
    /// The gate counts this session's budgets with a period across the project's sessions.
    pub periods: bool,
}

impl Registered {
    /// What this version's gate says back to `policy`: each limit it holds that the policy has.
    pub fn honouring(port: u16, ca: Option<String>, policy: &SessionPolicy) -> Registered {
        Registered {
            port,
            ca,
            learning: policy.learn,
            push_refs: policy.rules.iter().any(|r| !r.refs.is_empty()),
            budgets: !policy.budgets.is_empty(),
            periods: policy.budgets.iter().any(|b| b.period.is_some()),
        }
    }
}

/// A status request's reply.
#[derive(Debug, Clone)]
pub struct GateStatus {
    pub pid: u32,
    pub port: u16,
    pub sessions: Vec<SessionStatus>,
}

impl Reply {
    /// `Update`: done, saying back what the gate honours of the new policy (as a registration
    /// does; a gate of an older version says nothing, which the launcher reads as not honoured).
    pub fn updated(port: u16, pid: u32, policy: &SessionPolicy) -> Reply {
        Reply::registered(pid, Registered::honouring(port, None, policy))
    }
    /// `Watch`, `Stop`: done.
    pub fn done(port: u16, pid: u32) -> Reply {
        Reply { ok: true, port, pid, ..Reply::default() }
    }
    /// `Register`: the session is the gate's until this connection closes.
    pub fn registered(pid: u32, r: Registered) -> Reply {
        let Registered { port, ca, learning, push_refs, budgets, periods } = r;
        Reply { ca, learning, push_refs, budgets, periods, ..Reply::done(port, pid) }
    }
    /// `Status`.
    pub fn status(port: u16, pid: u32, sessions: Vec<SessionStatus>) -> Reply {
        Reply { sessions, ..Reply::done(port, pid) }
    }
    /// Any operation, refused.
    pub fn refused(r: Refusal) -> Reply {
        Reply { ok: false, error: Some(r.to_string()), refusal: Some(r), ..Reply::default() }
    }

    /// Why the gate refused, or `None` when it did what was asked.
    pub fn refusal(&self) -> Option<Refusal> {
        if self.ok {
            return None;
        }
        Some(match (&self.refusal, self.error.as_deref()) {
            (Some(r), _) => r.clone(),
            // A gate of an older version: its words are all there is.
            (None, Some(CLOSING_SAID)) => Refusal::Closing,
            (None, why) => Refusal::Said(why.unwrap_or("(no reason given)").to_string()),
        })
    }

    /// The reply to a registration.
    pub fn as_registered(&self) -> Registered {
        Registered {
            port: self.port,
            ca: self.ca.clone(),
            learning: self.learning,
            push_refs: self.push_refs,
            budgets: self.budgets,
            periods: self.periods,
        }
    }

    /// The reply to a status request.
    pub fn as_status(&self) -> GateStatus {
        GateStatus { pid: self.pid, port: self.port, sessions: self.sessions.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_travels_as_a_kind_and_in_the_words_older_launchers_read() {
        for r in [
            Refusal::Closing,
            Refusal::Peer("pid 7 is another user's".into()),
            Refusal::Session("bad secret".into()),
            Refusal::NoSession("s1".into()),
            Refusal::BadRequest("eof".into()),
        ] {
            let line = serde_json::to_string(&Reply::refused(r.clone())).unwrap();
            let back: Reply = serde_json::from_str(&line).unwrap();
            assert_eq!(back.refusal(), Some(r.clone()), "{line}");
            // What a launcher of the previous version reads: ok false, the words.
            let old: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(
                (old["ok"].as_bool(), old["error"].as_str()),
                (Some(false), Some(r.to_string().as_str()))
            );
        }
        assert_eq!(Refusal::Closing.to_string(), "the gate is closing");
    }

    #[test]
    fn a_gate_of_the_previous_version_is_understood() {
        // Its replies: no `refusal`, the closing said in words.
        let closing: Reply =
            serde_json::from_str(r#"{"ok":false,"error":"the gate is closing","port":0}"#).unwrap();
        assert_eq!(closing.refusal(), Some(Refusal::Closing));
        let other: Reply =
            serde_json::from_str(r#"{"ok":false,"error":"no session s in this gate"}"#).unwrap();
        assert_eq!(other.refusal(), Some(Refusal::Said("no session s in this gate".into())));
        let ok: Reply = serde_json::from_str(r#"{"ok":true,"port":18081,"pid":9,"ca":"PEM"}"#).unwrap();
        assert_eq!(ok.refusal(), None);
        let was = Registered {
            port: 18081,
            ca: Some("PEM".into()),
            learning: false,
            push_refs: false,
            budgets: false,
            periods: false,
        };
        assert_eq!(ok.as_registered(), was);
        assert_eq!((ok.as_status().pid, ok.as_status().port), (9, 18081));
        // This version says what it does of each (learning, push limits, budgets); the previous
        // ones' `ok` above says none (false), and each is said alone.
        let said = |r: Registered| -> Registered {
            serde_json::from_str::<Reply>(&serde_json::to_string(&Reply::registered(2, r)).unwrap())
                .unwrap()
                .as_registered()
        };
        // What this version says of a policy: a push rule counts only with refs.
        let rules = |line: &str| SessionPolicy {
            rules: crate::policy::rule::parse(line).unwrap(),
            ..SessionPolicy::default()
        };
        assert!(Registered::honouring(1, None, &rules("g.test git-push /r.git refs/heads/a/*")).push_refs);
        assert!(!Registered::honouring(1, None, &rules("g.test git-push /r.git")).push_refs);
        for r in [
            Registered { learning: true, ..was.clone() },
            Registered { push_refs: true, ..was.clone() },
            Registered { budgets: true, ..was.clone() },
            Registered { periods: true, ..was.clone() },
        ] {
            assert_eq!(said(r.clone()), r);
        }
    }
}
