//! The gate's shared state: the registered sessions (token, policy, counters), the decision
//! log, and the `closing` flag that lets an idle gate exit without losing a registration that
//! arrives at the same moment (the late launcher is told to retry and starts the next gate).

use super::decide::{self, SessionPolicy};
use super::log::{self, Event, Log};
use serde::{Deserialize, Serialize};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

pub struct Session {
    pub id: String,
    pub project: String,
    pub token: String,
    /// Replaced whole by a live change (`ai-sandbox allow`); each connection reads it once.
    policy: RwLock<Arc<SessionPolicy>>,
    pub started: String,
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub active: AtomicUsize,
    pub up: AtomicU64,
    pub down: AtomicU64,
}

impl Session {
    pub fn new(id: String, project: String, token: String, policy: SessionPolicy) -> Session {
        Session {
            id,
            project,
            token,
            policy: RwLock::new(Arc::new(policy)),
            started: log::now(),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
        }
    }
}

impl Session {
    pub fn policy(&self) -> Arc<SessionPolicy> {
        self.policy.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn set_policy(&self, p: SessionPolicy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(p);
    }
}

/// One session as `gate status` shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionStatus {
    pub session: String,
    pub project: String,
    pub started: String,
    pub allowed: u64,
    pub denied: u64,
    pub active: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

struct Registry {
    all: Vec<Arc<Session>>,
    /// When the session count last changed (for idle exit).
    changed: Instant,
    /// Set once, when the gate decides to exit: no registration is accepted after it.
    closing: bool,
}

pub struct State {
    pub port: u16,
    /// A duplicate of the listening socket. Each launcher receives it when it registers and
    /// holds it for the sandbox's life, so the port stays bound to this socket even if the
    /// gate dies: nobody else (another local user included) can take it over.
    pub listener: OwnedFd,
    registry: RwLock<Registry>,
    log: Log,
    pub stop: tokio::sync::Notify,
    /// Watchers and the requests held for them (`ask = SECONDS`).
    pub asks: super::ask::Asks,
}

impl State {
    pub fn new(port: u16, listener: OwnedFd, log: Log) -> State {
        State {
            port,
            listener,
            registry: RwLock::new(Registry { all: Vec::new(), changed: Instant::now(), closing: false }),
            log,
            stop: tokio::sync::Notify::new(),
            asks: Default::default(),
        }
    }

    /// Adds a session; `false` when the gate is closing (the launcher retries with a new gate).
    pub fn register(&self, s: Arc<Session>) -> bool {
        let mut r = self.registry.write().unwrap_or_else(|e| e.into_inner());
        if r.closing {
            return false;
        }
        r.all.push(s);
        r.changed = Instant::now();
        true
    }

    /// A registered session by id.
    pub fn session(&self, id: &str) -> Option<Arc<Session>> {
        let r = self.registry.read().unwrap_or_else(|e| e.into_inner());
        r.all.iter().find(|s| s.id == id).cloned()
    }

    pub fn unregister(&self, s: &Arc<Session>) {
        let mut r = self.registry.write().unwrap_or_else(|e| e.into_inner());
        r.all.retain(|x| !Arc::ptr_eq(x, s));
        r.changed = Instant::now();
    }

    /// The session whose token was presented (every token compared in constant time).
    pub fn authenticate(&self, presented: Option<&str>) -> Option<Arc<Session>> {
        let r = self.registry.read().unwrap_or_else(|e| e.into_inner());
        let tokens: Vec<&str> = r.all.iter().map(|s| s.token.as_str()).collect();
        decide::authenticate(&tokens, presented).map(|i| r.all[i].clone())
    }

    /// True, and closed for good, when no session has existed for `idle`.
    pub fn close_if_idle(&self, idle: Duration) -> bool {
        let mut r = self.registry.write().unwrap_or_else(|e| e.into_inner());
        if r.closing || (r.all.is_empty() && r.changed.elapsed() >= idle) {
            r.closing = true;
        }
        r.closing
    }

    /// Closes now (stop command, SIGTERM): registrations from here on are told to retry.
    pub fn close(&self) {
        self.registry.write().unwrap_or_else(|e| e.into_inner()).closing = true;
        self.stop.notify_one();
    }

    pub fn status(&self) -> Vec<SessionStatus> {
        let r = self.registry.read().unwrap_or_else(|e| e.into_inner());
        r.all
            .iter()
            .map(|s| SessionStatus {
                session: s.id.clone(),
                project: s.project.clone(),
                started: s.started.clone(),
                allowed: s.allowed.load(Ordering::Relaxed),
                denied: s.denied.load(Ordering::Relaxed),
                active: s.active.load(Ordering::Relaxed) as u64,
                bytes_up: s.up.load(Ordering::Relaxed),
                bytes_down: s.down.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Records one decision (before the client is answered).
    pub fn log(&self, d: Decision<'_>) {
        let e = Event {
            time: log::now(),
            session: d.session.to_string(),
            project: self.session(d.session).map(|s| s.project.clone()).unwrap_or_default(),
            method: d.method.to_string(),
            host: d.host.to_string(),
            port: d.port,
            decision: decide::verdict(d.status, d.presented_token),
            status: d.status,
            reason: d.reason.to_string(),
            hint: d.hint.to_string(),
            allow: d.allow.map(str::to_string),
        };
        self.log.write(&e);
        // Watchers see refusals as they are decided.
        if e.decision == log::Decision::Deny && self.asks.watched() {
            self.asks.broadcast(&serde_json::to_string(&e).unwrap_or_default());
        }
    }
}

/// One decision as the connection code sees it.
pub struct Decision<'a> {
    pub session: &'a str,
    pub method: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub status: u16,
    /// Whether the client presented proxy credentials (a 407 without them is a challenge).
    pub presented_token: bool,
    pub reason: &'a str,
    /// What would allow it (the refusal's hint), or empty.
    pub hint: &'a str,
    /// The `allow =` value that would lift it, when one would.
    pub allow: Option<&'a str>,
}
