//! Carries the logins of `state` lines (see `policy::agent_state`) into a sandbox HOME before the
//! session and back to the per-user store after it (ADR 0056).
//!
//! Copies, never a mount: agents rewrite their credential file by write-and-rename, which a
//! single-file bind mount refuses (EBUSY), and a mounted store is live-shared between two running
//! sandboxes. The sandbox HOME is written by the agent, so it is read and written through
//! `sys::untrusted::Tree` (no link followed, regular files only, bounded), and only the login
//! fields of a file ever reach the store.
//!
//! Which login wins: the store takes a sandbox's login only when it differs from what that
//! session was given (recorded by digest, never the value). A session that did not refresh never
//! overwrites a newer login with its older copy; of two sessions that both refreshed, the one
//! that ends last wins (the other's refresh token may then be spent, and its agent asks to log in
//! again). A session whose launcher was killed is taken back at the project's next launch,
//! before anything is given.

use crate::plan::{LoginCopy, Logins};
use crate::sys::quote;
use crate::sys::untrusted::Tree;
use anyhow::{Context, bail};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// A login file is small; anything larger is not one.
pub(crate) const CAP: u64 = 1 << 20;

/// The login in a file's bytes: the whole file, or the object of its login fields (None when
/// the file has none of them). Text that is not a JSON object has no fields.
pub(crate) fn login_part(bytes: &[u8], fields: Option<&[&str]>) -> Option<Vec<u8>> {
    login_part_said(bytes, fields).map(|(part, _)| part)
}

/// A string in a login field is at most this long (a JWT is a few KiB).
const STRING_MAX: usize = 16 << 10;
/// An object or array in a login field has at most this many members.
const MEMBERS_MAX: usize = 64;
/// A login field is at most this large, as JSON.
const FIELD_MAX: usize = 64 << 10;

/// `login_part`, and what was dropped from the login fields, in words. A login field keeps only
/// what agents' CLIs write there: a string, number, boolean or null; or an object whose members
/// are those or arrays of them (an account, a token set, its scopes). Anything else (an object
/// inside a member: `oauthAccount.mcpServers.x.command`), an oversized value, or a field past
/// `FIELD_MAX` is dropped, so that nothing but a login crosses to other projects' sandboxes.
pub(crate) fn login_part_said(bytes: &[u8], fields: Option<&[&str]>) -> Option<(Vec<u8>, Vec<String>)> {
    let Some(fields) = fields else { return Some((bytes.to_vec(), Vec::new())) };
    let Ok(Value::Object(all)) = serde_json::from_slice::<Value>(bytes) else { return None };
    let mut dropped = Vec::new();
    let part: Map<String, Value> = all
        .into_iter()
        .filter(|(k, _)| fields.contains(&k.as_str()))
        .filter_map(|(k, v)| shaped(&k, v, &mut dropped).map(|v| (k, v)))
        .collect();
    (!part.is_empty()).then(|| (serde_json::to_vec_pretty(&Value::Object(part)).expect("json"), dropped))
}

fn scalar(v: &Value) -> bool {
    match v {
        Value::String(s) => s.len() <= STRING_MAX,
        Value::Number(_) | Value::Bool(_) | Value::Null => true,
        Value::Array(_) | Value::Object(_) => false,
    }
}

/// A member of a login field: a scalar, or an array of at most `MEMBERS_MAX` scalars.
fn member(v: &Value) -> bool {
    match v {
        Value::Array(a) => a.len() <= MEMBERS_MAX && a.iter().all(scalar),
        v => scalar(v),
    }
}

/// The value of the login field `field` as a login holds it (see `login_part_said`).
fn shaped(field: &str, v: Value, dropped: &mut Vec<String>) -> Option<Value> {
    let name = quote::text(field);
    let kept = match v {
        Value::Object(m) if m.len() <= MEMBERS_MAX => {
            let mut out = Map::new();
            for (k, v) in m {
                if member(&v) {
                    out.insert(k, v);
                } else {
                    dropped.push(format!("{name}.{} (not a value a login holds)", quote::text(&k)));
                }
            }
            Value::Object(out)
        }
        Value::Object(_) => {
            dropped.push(format!("{name} (more than {MEMBERS_MAX} members)"));
            return None;
        }
        v if member(&v) => v,
        _ => {
            dropped.push(format!("{name} (not a value a login holds)"));
            return None;
        }
    };
    if serde_json::to_vec(&kept).map_or(usize::MAX, |b| b.len()) > FIELD_MAX {
        dropped.push(format!("{name} (over {} KiB)", FIELD_MAX >> 10));
        return None;
    }
    Some(kept)
}

/// `existing` (the sandbox HOME's file) with its login fields replaced by `part`'s; what is not
/// a JSON object is replaced whole.
pub(crate) fn merged(existing: Option<&[u8]>, part: &[u8], fields: Option<&[&str]>) -> Vec<u8> {
    let Some(fields) = fields else { return part.to_vec() };
    let mut out = match existing.map(serde_json::from_slice::<Value>) {
        Some(Ok(Value::Object(m))) => m,
        _ => Map::new(),
    };
    out.retain(|k, _| !fields.contains(&k.as_str()));
    if let Ok(Value::Object(p)) = serde_json::from_slice::<Value>(part) {
        out.extend(p);
    }
    serde_json::to_vec_pretty(&Value::Object(out)).expect("json")
}

/// A digest of a login (the record holds these, never a value).
pub(crate) fn digest(part: &[u8]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    part.hash(&mut h);
    format!("{:016x}", h.finish())
}

type Record = BTreeMap<String, String>;

/// The record of a file the session was given nothing for.
const NONE: &str = "none";

fn read_record(path: &Path) -> Record {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

fn key(c: &LoginCopy) -> String {
    c.home_rel.display().to_string()
}

/// The file at `rel` of the sandbox HOME, if it is a regular file (a link, a directory, a fifo
/// there is the sandbox's and is not read).
fn read_home(home: &Tree, rel: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    match home.stat(rel)? {
        None => Ok(None),
        Some(st) if st.kind == crate::sys::untrusted::Kind::File => Ok(Some(home.read(rel, CAP)?)),
        Some(st) => bail!("{} is {}, not a file", quote::path(&home.path().join(rel)), st.kind.name()),
    }
}

/// Reads a store file (the user's own directory; no sandbox reaches it).
fn read_store(path: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        Ok(m) if m.is_file() && m.len() <= CAP => {
            Ok(Some(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?))
        }
        Ok(_) => bail!("{} is not a login file (a regular file of at most 1 MiB)", path.display()),
    }
}

/// Writes `bytes` as `rel` below the store directory `store` (made 0700 if missing): a file of
/// mode 0600 put in place by rename, its directories 0700. Below `store` nothing is followed: a
/// link at `rel` is replaced, a linked directory on the way refused. `login import` writes
/// through this too.
pub(crate) fn write_private(store: &Path, rel: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let to = quote::path(&store.join(rel));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(store)
        .with_context(|| format!("creating {}", store.display()))?;
    let tree = Tree::open(store).with_context(|| format!("opening {}", store.display()))?;
    if let Some(dir) = rel.parent() {
        tree.mkdir_all(dir, 0o700)
            .with_context(|| format!("making the directory of {to} (a link there is refused)"))?;
    }
    tree.write(rel, bytes, 0o600).with_context(|| format!("writing {to}"))
}

/// Writes a store file (see `write_private`).
pub(crate) fn write_store(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().context("a store file has a directory")?;
    let name = path.file_name().context("a store file has a name")?;
    write_private(dir, Path::new(name), bytes)
}

/// Back to the store: each login the sandbox HOME holds that differs from what its last
/// session was given. Returns what went back, in words.
pub(crate) fn take(l: &Logins) -> anyhow::Result<Vec<String>> {
    let given = read_record(&l.record);
    if given.is_empty() || !l.home.exists() {
        return Ok(Vec::new());
    }
    let home = Tree::open(&l.home).with_context(|| format!("opening {}", l.home.display()))?;
    let mut out = Vec::new();
    let mut now = given.clone();
    for c in &l.files {
        // A file this session was given nothing for is recorded as NONE: a login made inside
        // goes back too.
        let Some(was) = given.get(&key(c)) else { continue };
        let bytes = read_home(&home, &c.home_rel)
            .with_context(|| format!("the {} login was not carried back", c.state))?;
        let Some((part, dropped)) = bytes.as_deref().and_then(|b| login_part_said(b, c.fields)) else {
            continue;
        };
        if !dropped.is_empty() {
            out.push(format!(
                "the {} login in this sandbox ({}) held what a login does not; not carried to your other projects: {}",
                c.state,
                quote::path(&c.home_rel),
                dropped.join(", ")
            ));
        }
        let held = digest(&part);
        if held == *was {
            continue;
        }
        // A login the gate holds (ADR 0087) is never taken back: the gate wrote any refresh to
        // the store itself, a placeholder never becomes the store's, and a login the agent put
        // in its place could be another account's.
        let placeholder = memchr::memmem::find(&part, crate::gate::secrets::PREFIX.as_bytes()).is_some();
        // But a first login made inside, which the gate took (ADR 0090): the CLI's file, with
        // the tokens the gate wrote to the store in its placeholders' places. (A session given
        // no login whose file holds no placeholder made it in clear: taken as ever, below.)
        let first = *was == NONE;
        // Placeholders were given (a held login's, or a first login's to come).
        let handed = !c.held.is_empty();
        if first && placeholder && handed {
            let store = read_store(&c.store)?;
            match first_login(&part, &c.held, store.as_deref()) {
                Ok(real) => {
                    write_store(&c.store, &merged(store.as_deref(), &real, c.fields))?;
                    now.insert(key(c), held);
                    out.push(format!(
                        "the {} login made in this sandbox ({}), whose tokens the gate took, is now your other projects' login",
                        c.state,
                        c.home_rel.display()
                    ));
                }
                Err(why) => out.push(format!(
                    "the {} login in this sandbox ({}) is not carried to your other projects: {why}",
                    c.state,
                    quote::path(&c.home_rel)
                )),
            }
            continue;
        }
        if !first && handed && !placeholder {
            out.push(format!(
                "the {} login in this sandbox ({}) was replaced by one without the gate's placeholders; the gate holds \
                 your login, so this one is not carried to your other projects (to change the login, log in on the host \
                 and run `ai-sandbox login import {}`)",
                c.state,
                quote::path(&c.home_rel),
                c.state
            ));
        }
        if (!first && handed) || placeholder {
            continue;
        }
        let store = read_store(&c.store)?;
        write_store(&c.store, &merged(store.as_deref(), &part, c.fields))?;
        // What the HOME holds is now the store's: taken once, never again.
        now.insert(key(c), held);
        out.push(format!(
            "the {} login refreshed in this sandbox ({}) is now your other projects' login",
            c.state,
            c.home_rel.display()
        ));
    }
    if now != given {
        std::fs::write(&l.record, serde_json::to_vec(&now).expect("json"))
            .with_context(|| format!("writing {}", l.record.display()))?;
    }
    Ok(out)
}

/// Into the sandbox HOME: each login of the store (or, once, of the store's layout before ADR
/// 0056) merged into the HOME's file; what was given is recorded. Returns notices.
pub(crate) fn give(l: &Logins) -> anyhow::Result<Vec<String>> {
    let home = Tree::open(&l.home).with_context(|| format!("opening {}", l.home.display()))?;
    let mut record = Record::new();
    let mut notices = Vec::new();
    for c in &l.files {
        let mut from = read_store(&c.store)?;
        if from.is_none()
            && let Some(old) = &c.legacy
            && let Some(bytes) = read_store(old)?
        {
            // The store of older versions held the agent's whole directory, mounted into every
            // project: only the login comes along.
            if let Some(part) = login_part(&bytes, c.fields) {
                write_store(&c.store, &part)?;
                notices.push(format!(
                    "your {} login now lives in {} (its login fields only); the rest of {} (settings, hooks, \
                     history, transcripts) is no longer mounted into any sandbox and stays there until you move or delete it",
                    c.state,
                    c.store.display(),
                    old.parent().map_or_else(String::new, |d| d.display().to_string())
                ));
                from = Some(part);
            }
        }
        if home.stat(&c.home_rel)?.is_some_and(|st| st.kind == crate::sys::untrusted::Kind::Dir) {
            bail!(
                "`state = {}`: {} is a directory; a state line carries one login file (name the file, e.g. \
                 `state = ~/.config/gh/hosts.yml`), since a directory's settings would follow you into every project",
                c.state,
                quote::path(&l.home.join(&c.home_rel))
            );
        }
        record.insert(key(c), NONE.to_string());
        // The agent's directory exists even with no login yet (its variable points there).
        if let Some(dir) = c.home_rel.parent().filter(|d| !d.as_os_str().is_empty()) {
            home.mkdir_all(dir, 0o700).with_context(|| {
                format!("making {} (a link there is refused)", quote::path(&l.home.join(dir)))
            })?;
        }
        let Some(store) = from else { continue };
        let Some(part) = login_part(&store, c.fields) else { continue };
        let part = with_placeholders(&part, &c.held);
        // Whatever else the sandbox left there (a link, a fifo) is replaced, never followed.
        let existing = read_home(&home, &c.home_rel).ok().flatten();
        home.write(&c.home_rel, &merged(existing.as_deref(), &part, c.fields), 0o600)
            .with_context(|| format!("writing {}", quote::path(&l.home.join(&c.home_rel))))?;
        record.insert(key(c), digest(&part));
    }
    let text = serde_json::to_vec(&record).expect("json");
    if let Some(dir) = l.record.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&l.record, text).with_context(|| format!("writing {}", l.record.display()))?;
    Ok(notices)
}

/// A first login's file as the CLI wrote it (`part`), with each of the session's placeholders
/// (`held`: a token's place, and its placeholder, a JWT's signature's) replaced by the token the
/// gate took into the `store`. Refused when a held place holds anything else (a token the agent chose, `null`),
/// when a token the gate took is not in its place (the merge would drop it), when the gate took
/// no token for a placeholder, or when a placeholder is left.
fn first_login(part: &[u8], held: &[(Vec<String>, String)], store: Option<&[u8]>) -> Result<Vec<u8>, String> {
    use crate::contract::session::{jwt_parts, login_field, set_login_field};
    let mut v: Value = serde_json::from_slice(part).map_err(|_| "it is not JSON".to_string())?;
    let store: Value = store.and_then(|b| serde_json::from_slice(b).ok()).unwrap_or(Value::Null);
    let at = |v: &Value, field: &[String]| field.iter().try_fold(v, |v, k| v.get(k)).cloned();
    for (field, placeholder) in held {
        let name = field.join(".");
        let real = login_field(&store, field).filter(|r| !r.is_empty());
        let now = match (at(&v, field), real) {
            (None, None) => continue,
            (None, Some(_)) => return Err(format!("its {name} is gone, though the gate took it")),
            (Some(Value::String(now)), _) => now,
            (Some(_), _) => return Err(format!("its {name} is not the placeholder the gate gave")),
        };
        let mine = now == *placeholder || jwt_parts(&now).is_some_and(|(_, sig)| sig == placeholder);
        if !mine {
            return Err(format!("its {name} is not the placeholder the gate gave"));
        }
        let Some(real) = real else {
            return Err(format!("the gate took no token for its {name}"));
        };
        set_login_field(&mut v, field, Value::String(real.to_string()));
    }
    let real = serde_json::to_vec_pretty(&v).expect("json");
    if memchr::memmem::find(&real, crate::gate::secrets::PREFIX.as_bytes()).is_some() {
        return Err("it holds a placeholder the gate did not give for a token".into());
    }
    Ok(real)
}

/// `part` (a login's JSON) with each held token replaced by its placeholder (ADR 0087); a place
/// the login lacks stays absent.
fn with_placeholders(part: &[u8], held: &[(Vec<String>, String)]) -> Vec<u8> {
    if held.is_empty() {
        return part.to_vec();
    }
    let Ok(mut v) = serde_json::from_slice::<Value>(part) else { return part.to_vec() };
    for (field, placeholder) in held {
        crate::contract::session::set_login_field(&mut v, field, Value::String(placeholder.clone()));
    }
    serde_json::to_vec_pretty(&v).expect("json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const FIELDS: &[&str] = &["oauthAccount", "userID"];

    #[test]
    fn only_the_login_fields_are_taken_and_a_merge_keeps_the_rest() {
        let hostile = br#"{"userID":"u1","oauthAccount":{"email":"a@b"},"mcpServers":{"x":{"command":"sh"}},"projects":{}}"#;
        let part = login_part(hostile, Some(FIELDS)).unwrap();
        let v: Value = serde_json::from_slice(&part).unwrap();
        let mut keys = v.as_object().unwrap().keys().collect::<Vec<_>>();
        keys.sort();
        assert_eq!(keys, ["oauthAccount", "userID"]);
        assert_eq!(login_part(b"not json", Some(FIELDS)), None);
        assert_eq!(login_part(br#"{"theme":"dark"}"#, Some(FIELDS)), None, "no login field: no login");
        assert_eq!(login_part(b"raw", None).unwrap(), b"raw", "a whole file is its own login");

        let project = br#"{"userID":"old","theme":"dark","mcpServers":{"mine":{}}}"#;
        let m: Value = serde_json::from_slice(&merged(Some(project), &part, Some(FIELDS))).unwrap();
        assert_eq!(m["userID"], "u1");
        assert_eq!(m["theme"], "dark", "the project's own settings stay");
        assert!(m["mcpServers"].get("x").is_none() && m["mcpServers"].get("mine").is_some());
        let fresh: Value = serde_json::from_slice(&merged(Some(b"[1]"), &part, Some(FIELDS))).unwrap();
        assert_eq!(fresh["userID"], "u1");
    }

    #[test]
    fn a_login_field_keeps_only_what_a_login_holds() {
        let hostile = br#"{"oauthAccount":{"email":"a@b","n":1,"ok":true,"none":null,"scopes":["a","b"],
            "mcpServers":{"x":{"command":"sh -c evil"}},"deep":[{"command":"sh"}]},
            "userID":{"x":{"y":1}},"primaryApiKey":"sk-1","hasCompletedOnboarding":true}"#;
        let (part, dropped) = login_part_said(hostile, Some(FIELDS_ALL)).unwrap();
        let v: Value = serde_json::from_slice(&part).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"oauthAccount":{"email":"a@b","n":1,"ok":true,"none":null,"scopes":["a","b"]},
                "userID":{},"primaryApiKey":"sk-1","hasCompletedOnboarding":true})
        );
        assert_eq!(
            dropped,
            [
                "oauthAccount.mcpServers (not a value a login holds)",
                "oauthAccount.deep (not a value a login holds)",
                "userID.x (not a value a login holds)"
            ]
        );
        // Sizes: a string past the cap, an object with too many members, a field too large.
        let long = format!(r#"{{"userID":"{}"}}"#, "x".repeat(STRING_MAX + 1));
        assert_eq!(login_part_said(long.as_bytes(), Some(FIELDS_ALL)), None, "nothing left: no login");
        let at_cap = format!(r#"{{"userID":"{}"}}"#, "x".repeat(STRING_MAX));
        assert!(login_part(at_cap.as_bytes(), Some(FIELDS_ALL)).is_some());
        let many: Map<String, Value> = (0..=MEMBERS_MAX).map(|n| (format!("k{n}"), Value::from(n))).collect();
        let text = serde_json::to_vec(&serde_json::json!({"oauthAccount": many, "userID": "u"})).unwrap();
        let (_, d) = login_part_said(&text, Some(FIELDS_ALL)).unwrap();
        assert_eq!(d, [format!("oauthAccount (more than {MEMBERS_MAX} members)")]);
        let big: Map<String, Value> =
            (0..8).map(|n| (format!("k{n}"), Value::from("y".repeat(STRING_MAX)))).collect();
        let text = serde_json::to_vec(&serde_json::json!({"oauthAccount": big, "userID": "u"})).unwrap();
        let (_, d) = login_part_said(&text, Some(FIELDS_ALL)).unwrap();
        assert_eq!(d, [format!("oauthAccount (over {} KiB)", FIELD_MAX >> 10)]);
        // A field of exactly the cap is kept; one byte more is not.
        let mut exact: Map<String, Value> =
            (0..4).map(|n| (format!("k{n}"), Value::from("y".repeat(STRING_MAX)))).collect();
        exact.insert("k3".into(), Value::from(""));
        let short = FIELD_MAX - serde_json::to_vec(&exact).unwrap().len();
        for (pad, kept) in [(short, true), (short + 1, false)] {
            exact.insert("k3".into(), Value::from("z".repeat(pad)));
            let text =
                serde_json::to_vec(&serde_json::json!({"oauthAccount": exact, "userID": "u"})).unwrap();
            let (_, d) = login_part_said(&text, Some(FIELDS_ALL)).unwrap();
            assert_eq!(d.is_empty(), kept, "{pad}: {d:?}");
        }
        // An escape in a member's name is said escaped.
        let esc = br#"{"userID":"u","oauthAccount":{"\u001b[2Kx":{}}}"#;
        assert_eq!(
            login_part_said(esc, Some(FIELDS_ALL)).unwrap().1,
            ["oauthAccount.\\e[2Kx (not a value a login holds)"]
        );
    }

    const FIELDS_ALL: &[&str] = &["oauthAccount", "userID", "primaryApiKey", "hasCompletedOnboarding"];

    #[test]
    fn what_a_login_does_not_hold_stays_in_its_sandbox_and_is_said() {
        let tmp = tempfile::tempdir().unwrap();
        let l = logins(tmp.path());
        std::fs::create_dir_all(&l.home).unwrap();
        write_store(&l.files[0].store, br#"{"userID":"u1"}"#).unwrap();
        give(&l).unwrap();
        let inside = l.home.join(".claude/.claude.json");
        std::fs::write(
            &inside,
            br#"{"userID":"u2","oauthAccount":{"e":"a","mcpServers":{"x":{"command":"sh"}}}}"#,
        )
        .unwrap();
        let said = take(&l).unwrap();
        assert!(said.iter().any(|s| s.contains("oauthAccount.mcpServers")), "{said:?}");
        let store = std::fs::read_to_string(&l.files[0].store).unwrap();
        assert!(
            store.contains("u2") && !store.contains("mcpServers") && !store.contains("command"),
            "{store}"
        );
    }

    fn logins(tmp: &Path) -> Logins {
        Logins {
            home: tmp.join("home"),
            record: tmp.join("state/logins-given"),
            files: vec![LoginCopy {
                state: "claude".into(),
                store: tmp.join("agents/claude/login/.claude.json"),
                legacy: Some(tmp.join("agents/claude/.claude/.claude.json")),
                home_rel: PathBuf::from(".claude/.claude.json"),
                fields: Some(FIELDS),
                held: Vec::new(),
            }],
        }
    }

    #[test]
    fn a_login_goes_in_and_comes_back_only_when_refreshed() {
        let tmp = tempfile::tempdir().unwrap();
        let l = logins(tmp.path());
        std::fs::create_dir_all(&l.home).unwrap();
        write_store(&l.files[0].store, br#"{"userID":"u1"}"#).unwrap();
        assert!(give(&l).unwrap().is_empty());
        let inside = l.home.join(".claude/.claude.json");
        assert!(std::fs::read_to_string(&inside).unwrap().contains("u1"));
        // Unchanged: nothing goes back, even when the store moved on meanwhile.
        write_store(&l.files[0].store, br#"{"userID":"u2"}"#).unwrap();
        assert!(take(&l).unwrap().is_empty());
        assert!(std::fs::read_to_string(&l.files[0].store).unwrap().contains("u2"));
        // Refreshed inside (and a hook planted beside it): the login goes back, the hook not.
        std::fs::write(&inside, br#"{"userID":"u3","hooks":{"SessionStart":"sh evil"}}"#).unwrap();
        assert_eq!(take(&l).unwrap().len(), 1);
        let store = std::fs::read_to_string(&l.files[0].store).unwrap();
        assert!(store.contains("u3") && !store.contains("evil"), "{store}");
        // Taken once: another project's newer login is not overwritten by this HOME's again.
        write_store(&l.files[0].store, br#"{"userID":"u4"}"#).unwrap();
        assert!(take(&l).unwrap().is_empty());
        assert!(std::fs::read_to_string(&l.files[0].store).unwrap().contains("u4"));
    }

    #[test]
    fn a_first_login_made_inside_reaches_the_store_and_a_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let l = logins(tmp.path());
        std::fs::create_dir_all(&l.home).unwrap();
        give(&l).unwrap();
        assert!(!l.files[0].store.exists(), "nothing to give");
        std::fs::create_dir_all(l.home.join(".claude")).unwrap();
        std::fs::write(l.home.join(".claude/.claude.json"), br#"{"userID":"new"}"#).unwrap();
        assert_eq!(take(&l).unwrap().len(), 1);
        assert!(std::fs::read_to_string(&l.files[0].store).unwrap().contains("new"));

        let other = tempfile::tempdir().unwrap();
        let l = logins(other.path());
        std::fs::create_dir_all(l.home.join(".claude/.claude.json")).unwrap();
        let e = format!("{:#}", give(&l).unwrap_err());
        assert!(e.contains("is a directory; a state line carries one login file"), "{e}");
    }

    #[test]
    fn a_held_token_is_given_as_its_placeholder_and_never_taken_back() {
        let tmp = tempfile::tempdir().unwrap();
        let mut l = logins(tmp.path());
        let field = vec!["claudeAiOauth".to_string(), "accessToken".to_string()];
        l.files[0] = LoginCopy {
            state: "claude".into(),
            store: tmp.path().join("agents/claude/login/.credentials.json"),
            legacy: None,
            home_rel: PathBuf::from(".claude/.credentials.json"),
            fields: Some(&["claudeAiOauth"]),
            held: vec![(field, "sk-ant-oat01-aisb_placeholder_ab".into())],
        };
        std::fs::create_dir_all(&l.home).unwrap();
        write_store(&l.files[0].store, br#"{"claudeAiOauth":{"accessToken":"REAL","expiresAt":1}}"#).unwrap();
        give(&l).unwrap();
        let inside = l.home.join(".claude/.credentials.json");
        let given = std::fs::read_to_string(&inside).unwrap();
        assert!(given.contains("sk-ant-oat01-aisb_placeholder_ab") && !given.contains("REAL"), "{given}");
        // The CLI rewrote its file (a refresh the gate made): nothing goes back.
        std::fs::write(
            &inside,
            br#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-aisb_placeholder_ab","expiresAt":2}}"#,
        )
        .unwrap();
        assert!(take(&l).unwrap().is_empty());
        let store = std::fs::read_to_string(&l.files[0].store).unwrap();
        assert!(store.contains("REAL") && !store.contains("placeholder"), "{store}");
        // A login the agent put in its place (another account's, perhaps) does not go back either,
        // and is said.
        std::fs::write(&inside, br#"{"claudeAiOauth":{"accessToken":"NEW","expiresAt":3}}"#).unwrap();
        let said = take(&l).unwrap();
        assert!(
            said.len() == 1 && said[0].contains("replaced by one without the gate's placeholders"),
            "{said:?}"
        );
        assert!(std::fs::read_to_string(&l.files[0].store).unwrap().contains("REAL"));
        // Control: with no token held (the store had no login), a login made inside goes back.
        l.files[0].held.clear();
        assert_eq!(take(&l).unwrap().len(), 1);
        assert!(std::fs::read_to_string(&l.files[0].store).unwrap().contains("NEW"));
    }

    #[test]
    fn a_first_login_the_gate_took_goes_back_with_its_real_tokens_and_nothing_else_does() {
        let tmp = tempfile::tempdir().unwrap();
        let mut l = logins(tmp.path());
        let (access, id) = (
            vec!["tokens".to_string(), "access_token".to_string()],
            vec!["tokens".to_string(), "id_token".to_string()],
        );
        l.files[0] = LoginCopy {
            state: "codex".into(),
            store: tmp.path().join("agents/codex/login/auth.json"),
            legacy: None,
            home_rel: PathBuf::from(".codex/auth.json"),
            fields: Some(&["tokens", "auth_mode", "OPENAI_API_KEY"]),
            held: vec![(access, "aisb_placeholder_aa".into()), (id, "aisb_placeholder_ii".into())],
        };
        std::fs::create_dir_all(&l.home).unwrap();
        // No login in the store at launch: nothing given, the record says so.
        give(&l).unwrap();
        let inside = l.home.join(".codex/auth.json");
        let cli = br#"{"auth_mode":"chatgpt","tokens":{"access_token":"aisb_placeholder_aa","id_token":"h.c.aisb_placeholder_ii","account_id":"acc"}}"#;
        std::fs::write(&inside, cli).unwrap();
        // The gate took no token (its answer failed): nothing goes back, and it is said.
        let said = take(&l).unwrap();
        assert!(
            said.len() == 1 && said[0].contains("the gate took no token for its tokens.access_token"),
            "{said:?}"
        );
        assert!(!l.files[0].store.exists());
        // The gate took them: the CLI's file goes back with them in its placeholders' places.
        write_store(&l.files[0].store, br#"{"tokens":{"access_token":"A.B.REAL","id_token":"H.C.ID"}}"#)
            .unwrap();
        let said = take(&l).unwrap();
        assert!(said.len() == 1 && said[0].contains("whose tokens the gate took"), "{said:?}");
        let store: Value = serde_json::from_slice(&std::fs::read(&l.files[0].store).unwrap()).unwrap();
        assert_eq!(store["tokens"]["access_token"], "A.B.REAL");
        assert_eq!(
            store["tokens"]["id_token"], "H.C.ID",
            "a JWT whole, whatever claims the sandbox's copy shows"
        );
        assert_eq!(
            (store["auth_mode"].as_str(), store["tokens"]["account_id"].as_str()),
            (Some("chatgpt"), Some("acc"))
        );
        assert!(take(&l).unwrap().is_empty(), "taken once");
        // Control: a login made in clear in a session given none (the CLI's exchange did not
        // pass the gate) goes back as ever.
        std::fs::remove_file(&l.record).unwrap();
        std::fs::remove_file(&l.files[0].store).unwrap();
        give(&l).unwrap();
        std::fs::write(&inside, br#"{"OPENAI_API_KEY":"sk-clear","tokens":{"account_id":"k"}}"#).unwrap();
        let said = take(&l).unwrap();
        assert!(said.len() == 1 && said[0].contains("refreshed in this sandbox"), "{said:?}");
        assert!(std::fs::read_to_string(&l.files[0].store).unwrap().contains("sk-clear"));
        // A token the agent chose in a held place, or a placeholder left elsewhere: not taken.
        for (text, why) in [
            (
                r#"{"tokens":{"access_token":"theirs","id_token":"h.c.aisb_placeholder_ii"},"auth_mode":"x"}"#,
                "is not the placeholder the gate gave",
            ),
            (
                r#"{"tokens":{"access_token":null,"id_token":"h.c.aisb_placeholder_ii"},"auth_mode":"x"}"#,
                "is not the placeholder the gate gave",
            ),
            (
                r#"{"tokens":{"id_token":"h.c.aisb_placeholder_ii"},"auth_mode":"x"}"#,
                "is gone, though the gate took it",
            ),
            (
                r#"{"tokens":{"access_token":"aisb_placeholder_aa","id_token":"h.c.aisb_placeholder_ii","account_id":"aisb_placeholder_zz"},"auth_mode":"y"}"#,
                "holds a placeholder the gate did not give",
            ),
        ] {
            std::fs::remove_file(&l.record).unwrap();
            std::fs::remove_file(&l.files[0].store).unwrap();
            give(&l).unwrap();
            write_store(&l.files[0].store, br#"{"tokens":{"access_token":"A.B.REAL","id_token":"H.C.ID"}}"#)
                .unwrap();
            std::fs::write(&inside, text).unwrap();
            let said = take(&l).unwrap();
            assert!(said.len() == 1 && said[0].contains(why), "{text}: {said:?}");
            let store = std::fs::read_to_string(&l.files[0].store).unwrap();
            assert!(
                !store.contains("theirs") && !store.contains("placeholder") && !store.contains("auth_mode"),
                "{store}"
            );
        }
    }

    #[test]
    fn each_file_of_a_login_is_recorded_and_taken_on_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let mut l = logins(tmp.path());
        l.files.push(LoginCopy {
            state: "claude".into(),
            store: tmp.path().join("agents/claude/login/.credentials.json"),
            legacy: None,
            home_rel: PathBuf::from(".claude/.credentials.json"),
            fields: Some(&["claudeAiOauth"]),
            held: Vec::new(),
        });
        std::fs::create_dir_all(&l.home).unwrap();
        write_store(&l.files[0].store, br#"{"userID":"u1"}"#).unwrap();
        write_store(&l.files[1].store, br#"{"claudeAiOauth":{"t":"a"}}"#).unwrap();
        give(&l).unwrap();
        // Only the tokens are refreshed inside: they go back, the account file is not touched.
        std::fs::write(l.home.join(".claude/.credentials.json"), br#"{"claudeAiOauth":{"t":"b"}}"#).unwrap();
        write_store(&l.files[0].store, br#"{"userID":"other"}"#).unwrap();
        assert_eq!(take(&l).unwrap().len(), 1);
        assert!(std::fs::read_to_string(&l.files[1].store).unwrap().contains("\"b\""));
        assert!(std::fs::read_to_string(&l.files[0].store).unwrap().contains("other"));
    }

    #[test]
    fn a_home_gone_or_a_store_that_is_not_a_file_is_said_not_guessed() {
        let tmp = tempfile::tempdir().unwrap();
        let l = logins(tmp.path());
        std::fs::create_dir_all(&l.home).unwrap();
        write_store(&l.files[0].store, br#"{"userID":"u1"}"#).unwrap();
        give(&l).unwrap();
        std::fs::remove_dir_all(&l.home).unwrap();
        assert!(take(&l).unwrap().is_empty(), "no HOME (removed by prune): nothing to take");
        std::fs::create_dir_all(&l.home).unwrap();
        std::fs::remove_file(&l.files[0].store).unwrap();
        std::fs::create_dir_all(&l.files[0].store).unwrap();
        let e = format!("{:#}", give(&l).unwrap_err());
        assert!(e.contains("is not a login file"), "{e}");
        // A store that cannot be read (a file where its directory should be) is an error, not
        // "no login".
        let mut l = logins(tmp.path());
        std::fs::write(tmp.path().join("plain"), "").unwrap();
        l.files[0].store = tmp.path().join("plain/.claude.json");
        assert!(format!("{:#}", give(&l).unwrap_err()).contains("reading"), "not taken for absent");
    }

    #[test]
    fn the_store_is_written_private_and_never_through_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("store");
        write_private(&store, Path::new("a/login.json"), b"{}").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            (mode(&store), mode(&store.join("a")), mode(&store.join("a/login.json"))),
            (0o700, 0o700, 0o600)
        );
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, store.join("l")).unwrap();
        assert!(
            write_private(&store, Path::new("l/x.json"), b"{}").is_err(),
            "a linked directory on the way"
        );
        assert!(!elsewhere.join("x.json").exists());
        std::os::unix::fs::symlink(tmp.path().join("target"), store.join("f.json")).unwrap();
        write_private(&store, Path::new("f.json"), b"{}").unwrap();
        assert!(
            std::fs::symlink_metadata(store.join("f.json")).unwrap().is_file()
                && !tmp.path().join("target").exists()
        );
    }

    #[test]
    fn a_link_in_the_sandbox_home_is_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let l = logins(tmp.path());
        std::fs::create_dir_all(l.home.join(".claude")).unwrap();
        let secret = tmp.path().join("elsewhere");
        std::fs::write(&secret, br#"{"userID":"not-yours"}"#).unwrap();
        std::os::unix::fs::symlink(&secret, l.home.join(".claude/.claude.json")).unwrap();
        write_store(&l.files[0].store, br#"{"userID":"u1"}"#).unwrap();
        give(&l).unwrap();
        assert!(std::fs::read_to_string(&secret).unwrap().contains("not-yours"), "not written through");
        let inside = l.home.join(".claude/.claude.json");
        assert!(std::fs::symlink_metadata(&inside).unwrap().is_file(), "the link is replaced by the login");
        // A link made during the session is not read back either.
        std::fs::remove_file(&inside).unwrap();
        std::os::unix::fs::symlink(&secret, &inside).unwrap();
        let e = format!("{:#}", take(&l).unwrap_err());
        assert!(e.contains("is a symbolic link, not a file") && e.contains("not carried back"), "{e}");
        assert!(std::fs::read_to_string(&l.files[0].store).unwrap().contains("u1"));
    }

    #[test]
    fn the_old_store_gives_its_login_once_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let l = logins(tmp.path());
        std::fs::create_dir_all(&l.home).unwrap();
        let old = l.files[0].legacy.clone().unwrap();
        std::fs::create_dir_all(old.parent().unwrap()).unwrap();
        std::fs::write(&old, br#"{"userID":"u1","mcpServers":{"x":{"command":"sh"}}}"#).unwrap();
        let notices = give(&l).unwrap();
        assert!(notices[0].contains("no longer mounted"), "{notices:?}");
        let store = std::fs::read_to_string(&l.files[0].store).unwrap();
        assert!(store.contains("u1") && !store.contains("mcpServers"), "{store}");
        assert!(give(&l).unwrap().is_empty(), "said once");
        assert!(old.exists(), "the old directory is left where it is");
    }
}
