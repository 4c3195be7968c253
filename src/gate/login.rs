//! Logins the gate holds (ADR 0087): a `state` agent's tokens (Claude Code's OAuth access and
//! refresh tokens) are in the sandbox only as placeholders; the gate swaps them for the real
//! tokens on the login's own hosts (`secrets`), and makes the CLI's refresh itself: the token
//! endpoint's answer goes to the user's login store and to every session of that login, and the
//! CLI gets its placeholders back in place of the new tokens (`terminate::renew`).
//!
//! A token's value lives in a `Cell`, one per store file and place, shared by every session of
//! the login in this gate process (the gate is one process per user), so that one session's
//! refresh is what the next request of any other session sends. Refreshes of one login take
//! turns (`turn`): each is made with the refresh token the last one left, never with one
//! already spent.

use crate::contract::session::{LoginRef, set_login_field};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// A held token's value now.
#[derive(Debug, Clone)]
pub(crate) struct Cell(Arc<RwLock<String>>);

impl Cell {
    pub(crate) fn get(&self) -> String {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    fn set(&self, v: &str) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = v.to_string();
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}

type Key = (PathBuf, Vec<String>);

fn cells() -> &'static Mutex<HashMap<Key, Cell>> {
    static CELLS: OnceLock<Mutex<HashMap<Key, Cell>>> = OnceLock::new();
    CELLS.get_or_init(Default::default)
}

/// Bumped at each change of a held token: a connection's masks are made again after one.
static GENERATION: AtomicU64 = AtomicU64::new(0);

pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// The cell of `l`'s token, holding `registered`: what the launcher read from the store just
/// now is the newest value (the gate writes a refresh to the store before it answers).
pub(crate) fn cell(l: &LoginRef, registered: &str) -> Cell {
    let mut all = cells().lock().unwrap_or_else(|e| e.into_inner());
    let c = all.entry((l.store.clone(), l.field.clone())).or_insert_with(|| Cell(Default::default()));
    if c.get() != registered {
        c.set(registered);
    }
    c.clone()
}

/// The turn of one login's refresh: held from before its refresh token is put in the request
/// until the answer's tokens are stored.
pub(crate) fn turn(endpoint: &str) -> Arc<tokio::sync::Mutex<()>> {
    static TURNS: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    let mut all = TURNS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    all.entry(endpoint.to_string()).or_default().clone()
}

/// A token endpoint's answer, taken in: each held token it renews is stored (in its cell and
/// its store file) and replaced by the placeholder the session keeps for it. `None`: not a
/// token answer (no held token in it). With the rewritten answer, why the store could not be
/// written, if it could not (the cells hold the new tokens all the same, so this gate's
/// sessions go on; the next launch reads the store's older login).
pub(crate) fn take_answer<'a>(
    answer: &[u8],
    renewed: impl Iterator<Item = (&'a LoginRef, &'a str)>,
    now_ms: u128,
) -> Option<(Vec<u8>, Option<String>)> {
    let Ok(Value::Object(mut json)) = serde_json::from_slice::<Value>(answer) else { return None };
    let expires_in = json.get("expires_in").and_then(Value::as_u64);
    let mut stores: HashMap<PathBuf, Vec<(&LoginRef, String)>> = HashMap::new();
    for (l, placeholder) in renewed {
        let Some(Value::String(new)) = json.get(&l.answer).cloned() else { continue };
        if new.is_empty() {
            continue;
        }
        json.insert(l.answer.clone(), Value::String(placeholder.to_string()));
        stores.entry(l.store.clone()).or_default().push((l, new));
    }
    if stores.is_empty() {
        return None;
    }
    let mut failed = Vec::new();
    for (store, tokens) in &stores {
        for (l, new) in tokens {
            cell(l, new);
        }
        if let Err(e) = write_store(store, tokens, expires_in.map(|s| now_ms + u128::from(s) * 1000)) {
            failed.push(e);
        }
    }
    let rewritten = serde_json::to_vec(&Value::Object(json)).expect("json");
    Some((rewritten, (!failed.is_empty()).then(|| failed.join("; "))))
}

/// The store file with the renewed tokens and expiry in their places (a place the file lacks
/// is not made), written whole by rename, mode 0600.
fn write_store(
    store: &std::path::Path,
    tokens: &[(&LoginRef, String)],
    expiry_ms: Option<u128>,
) -> Result<(), String> {
    let at = store.display();
    let text = std::fs::read(store).map_err(|e| format!("reading {at}: {e}"))?;
    let mut v: Value = serde_json::from_slice(&text).map_err(|e| format!("reading {at}: {e}"))?;
    for (l, new) in tokens {
        set_login_field(&mut v, &l.field, Value::String(new.clone()));
    }
    if let (Some(ms), Some((l, _))) = (expiry_ms, tokens.first()) {
        set_login_field(&mut v, &l.expiry, Value::from(ms as u64));
    }
    let dir = store.parent().ok_or_else(|| format!("{at} has no directory"))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".login")
        .tempfile_in(dir)
        .map_err(|e| format!("writing {at}: {e}"))?;
    use std::io::Write;
    tmp.write_all(&serde_json::to_vec_pretty(&v).expect("json")).map_err(|e| format!("writing {at}: {e}"))?;
    tmp.persist(store).map_err(|e| format!("writing {at}: {e}"))?;
    Ok(())
}
