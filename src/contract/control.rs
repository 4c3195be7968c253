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

use super::capability::{Capabilities, Capability};
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
    /// What this gate enforces of a policy (`contract::capability`), by name: a name this
    /// version does not know is one of a newer gate's, and ignored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    enforces: Vec<String>,
    /// The same, as the versions before `enforces` wrote and read it: one flag per capability,
    /// written for a launcher of such a version and read from a gate of one (`legacy_flag`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    learning: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    push_refs: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    budgets: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    periods: bool,
}

/// A registration's reply, and (its capabilities only) a live change's: what the gate enforces,
/// said back because a gate of an older version ignores what it does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The gate's port (the sandbox's proxy).
    pub port: u16,
    /// The gate's CA certificate, when the session has bound secrets or rules.
    pub ca: Option<String>,
    /// What the gate enforces of a policy (`capability::missing` reads it).
    pub enforces: Capabilities,
}

impl Registered {
    /// What this version's gate says: everything this version knows.
    pub fn by_this_gate(port: u16, ca: Option<String>) -> Registered {
        Registered { port, ca, enforces: Capability::ALL.into() }
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
    pub fn updated(port: u16, pid: u32) -> Reply {
        Reply::registered(pid, Registered::by_this_gate(port, None))
    }
    /// `Watch`, `Stop`: done.
    pub fn done(port: u16, pid: u32) -> Reply {
        Reply { ok: true, port, pid, ..Reply::default() }
    }
    /// `Register`: the session is the gate's until this connection closes.
    pub fn registered(pid: u32, r: Registered) -> Reply {
        let Registered { port, ca, enforces } = r;
        let mut reply = Reply { ca, ..Reply::done(port, pid) };
        for c in enforces {
            reply.enforces.push(c.name().to_string());
            if let Some(flag) = reply.legacy_flag(c) {
                *flag = true;
            }
        }
        reply
    }
    /// The flag the versions before `enforces` used for `c`; `None` for a capability added since.
    /// These four are all there will ever be, so a new capability needs nothing here.
    fn legacy_flag(&mut self, c: Capability) -> Option<&mut bool> {
        Some(match c {
            Capability::Learning => &mut self.learning,
            Capability::PushRefs => &mut self.push_refs,
            Capability::Budgets => &mut self.budgets,
            Capability::Periods => &mut self.periods,
            // `Rules` and every capability added since: said by `enforces` alone. A gate of the
            // versions before the set read rules but said nothing of them, so a ruled session
            // needs a gate of this version or later.
            _ => return None,
        })
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
        let named = self.enforces.iter().filter_map(|n| Capability::from_name(n));
        let mut flags = self.clone();
        let flagged = Capability::ALL.into_iter().filter(|&c| flags.legacy_flag(c).is_some_and(|f| *f));
        Registered { port: self.port, ca: self.ca.clone(), enforces: named.chain(flagged).collect() }
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
        let was = Registered { port: 18081, ca: Some("PEM".into()), enforces: Capabilities::new() };
        assert_eq!(ok.as_registered(), was);
        assert_eq!((ok.as_status().pid, ok.as_status().port), (9, 18081));
        // A gate of the version before the set said each capability as a flag of its own (all but
        // `rules`, which it never said: a ruled session is refused such a gate).
        for c in LEGACY {
            let line = format!(r#"{{"ok":true,"port":1,"pid":9,"{}":true}}"#, c.name());
            let old: Reply = serde_json::from_str(&line).unwrap();
            assert_eq!(old.as_registered().enforces, [c].into(), "{line}");
        }
    }

    /// The capabilities the versions before the set said as flags: these four, no other, ever.
    const LEGACY: [Capability; 4] =
        [Capability::Learning, Capability::PushRefs, Capability::Budgets, Capability::Periods];

    /// This gate says every capability it has, by name and (for launchers of the version before
    /// the set) as the old flags; a name of a newer version is read as nothing, not an error.
    #[test]
    fn a_gate_says_what_it_enforces_to_every_version() {
        let line = serde_json::to_string(&Reply::registered(2, Registered::by_this_gate(7, None))).unwrap();
        let back: Reply = serde_json::from_str(&line).unwrap();
        assert_eq!(back.as_registered().enforces, Capability::ALL.into());
        let old: serde_json::Value = serde_json::from_str(&line).unwrap();
        for c in Capability::ALL {
            let flag = LEGACY.contains(&c).then_some(true);
            assert_eq!(old[c.name()].as_bool(), flag, "{line}");
        }
        for c in Capability::ALL {
            let one = Registered { port: 7, ca: None, enforces: [c].into() };
            let line = serde_json::to_string(&Reply::registered(2, one.clone())).unwrap();
            assert_eq!(serde_json::from_str::<Reply>(&line).unwrap().as_registered(), one, "{line}");
        }
        let rules: Reply = serde_json::from_str(r#"{"ok":true,"port":1,"rules":true}"#).unwrap();
        assert!(rules.as_registered().enforces.is_empty(), "no flag was ever written for rules");
        let newer: Reply =
            serde_json::from_str(r#"{"ok":true,"port":1,"enforces":["budgets","a_later_capability"]}"#)
                .unwrap();
        assert_eq!(newer.as_registered().enforces, [Capability::Budgets].into());
    }
}
