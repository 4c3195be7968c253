//! Logins the gate holds (ADR 0087, ADR 0089): a `state` agent's tokens (the OAuth access and
//! refresh tokens of Claude Code, Codex and Gemini CLI, and the last two's id tokens) are in the
//! sandbox only as placeholders; the gate swaps them for the real tokens on the login's own hosts
//! (`secrets`), and makes the CLI's refresh itself (a JSON body, or Google's form): the token
//! endpoint's answer goes to the user's login store and to every session of that login, and the
//! CLI gets its placeholders back in place of the new tokens (`terminate::renew`).
//!
//! A token's value lives in a `Cell`, one per store file and place, shared by every session of
//! the login in this gate process (the gate is one process per user), so that one session's
//! refresh is what the next request of any other session sends. Refreshes of one login take
//! turns (`turn`): each is made with the refresh token the last one left, never with one
//! already spent.

use crate::contract::session::{LoginRef, jwt_parts, login_field, set_login_field};
use serde_json::Value;
use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// A held token's value now.
#[derive(Clone)]
pub(crate) struct Cell(Arc<RwLock<String>>);

/// Never prints the value.
impl std::fmt::Debug for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cell(held)")
    }
}

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

/// The cell of `l`'s token, holding what the store holds now: the gate writes each refresh
/// there before it answers, and `login import` writes a new login there, so the store is the
/// newest (a refresh between the launcher's read and this registration is not undone). What the
/// launcher registered stands in when the store cannot be read.
pub(crate) fn cell(l: &LoginRef, registered: &str) -> Cell {
    let stored = std::fs::read(&l.store).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    let now = stored.as_ref().and_then(|v| login_field(v, &l.field)).filter(|v| !v.is_empty());
    // A session with no token yet (a first login) never empties the cell of one that has it.
    let value = now.unwrap_or(registered);
    if value.is_empty() {
        let mut all = cells().lock().unwrap_or_else(|e| e.into_inner());
        return all
            .entry((l.store.clone(), l.field.clone()))
            .or_insert_with(|| Cell(Default::default()))
            .clone();
    }
    set(l, value)
}

/// What the sandbox sees in place of `token`: a held JWT keeps its header and claims in view,
/// with the placeholder where its signature was (`signed.PLACEHOLDER`); any other token is the
/// placeholder alone.
fn shown(l: &LoginRef, token: &str, placeholder: &str) -> String {
    match l.jwt.then(|| jwt_parts(token)).flatten() {
        Some((signed, _)) => format!("{signed}.{placeholder}"),
        None => placeholder.to_string(),
    }
}

fn set(l: &LoginRef, value: &str) -> Cell {
    let mut all = cells().lock().unwrap_or_else(|e| e.into_inner());
    let c = all.entry((l.store.clone(), l.field.clone())).or_insert_with(|| Cell(Default::default()));
    if c.get() != value {
        c.set(value);
    }
    c.clone()
}

/// Whether bytes hold a placeholder, however spelt (`secrets::holds_placeholder`: the caller's,
/// since `secrets` reads this module's cells).
pub(crate) type Spotted<'a> = &'a dyn Fn(&[u8]) -> bool;

/// What a request to a held login's token endpoint may be: anything else there is refused, since
/// its answer would put another account's tokens in the user's store and in every session of
/// the login (an exchange of another refresh token, or of a code in a session that holds a
/// login already).
pub(crate) enum Grant<'a> {
    /// A refresh, with one of this session's `placeholders` as its refresh token.
    Refresh(&'a [&'a str]),
    /// A first login's code exchange (ADR 0090): the session holds the login with no token yet.
    Code,
}

impl Grant<'_> {
    /// The members a CLI's request of this grant holds (a JSON body, or a `form`).
    fn keys(&self, form: bool) -> &'static [&'static str] {
        match (self, form) {
            (Grant::Refresh(_), false) => {
                &["grant_type", "refresh_token", "client_id", "scope", "refresh_reason"]
            }
            // Google's installed app sends its public client secret with it (and no scope: one
            // would narrow the token every session of the login gets).
            (Grant::Refresh(_), true) => &["grant_type", "refresh_token", "client_id", "client_secret"],
            (Grant::Code, false) => {
                &["grant_type", "code", "redirect_uri", "client_id", "code_verifier", "state"]
            }
            (Grant::Code, true) => {
                &["grant_type", "code", "redirect_uri", "client_id", "code_verifier", "client_secret"]
            }
        }
    }

    /// The grant's own members, once the keys are checked: a placeholder (`spotted`, however it
    /// is spelt) only as a refresh's `refresh_token`, the one member the gate puts a real token in.
    fn check(&self, members: &[(&str, &str)], spotted: Spotted) -> Result<(), String> {
        let field = |k: &str| members.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let (grant, token) = match self {
            Grant::Refresh(_) => ("refresh_token", Some("refresh_token")),
            Grant::Code => ("authorization_code", None),
        };
        if let Some((k, _)) = members.iter().find(|(k, v)| Some(*k) != token && spotted(v.as_bytes())) {
            return Err(format!("its {} carries a placeholder", quote_key(k)));
        }
        if field("grant_type") != Some(grant) {
            return Err(match self {
                Grant::Refresh(_) => "it is not a refresh (grant_type refresh_token)".into(),
                Grant::Code => {
                    "it is not a first login's code exchange (grant_type authorization_code)".into()
                }
            });
        }
        match self {
            Grant::Refresh(placeholders) => match field("refresh_token") {
                Some(t) if placeholders.contains(&t) => Ok(()),
                _ => Err("its refresh_token is not this sandbox's placeholder".into()),
            },
            Grant::Code if field("code").is_none_or(str::is_empty) => Err("it has no code".into()),
            Grant::Code => Ok(()),
        }
    }
}

/// A JSON request to a held login's token endpoint, checked before the gate puts a real token
/// in it or takes its answer: a JSON object naming each key once (in any case), only the
/// grant's keys (`Grant::keys`), string values, and the grant's own checks (`Grant::check`).
pub(crate) fn check_grant(body: &[u8], grant: &Grant, spotted: Spotted) -> Result<(), String> {
    let v =
        super::mcp::strict_json(body).map_err(|e| format!("its body is not JSON read one way only: {e}"))?;
    // Only what a CLI's request holds, each a string: a server that read the body another way
    // (a form smuggled into a value) would find nothing else to act on.
    let Value::Object(members) = &v else { return Err("its body is not a JSON object".into()) };
    let keys = grant.keys(false);
    if let Some((k, _)) = members.iter().find(|(k, v)| !keys.contains(&k.as_str()) || !v.is_string()) {
        return Err(format!("its body holds {} (strings in {} only)", quote_key(k), keys.join(", ")));
    }
    let members: Vec<(&str, &str)> =
        members.iter().filter_map(|(k, v)| Some((k.as_str(), v.as_str()?))).collect();
    grant.check(&members, spotted)
}

/// A form request (Google's refresh, a code exchange of Codex or Gemini CLI), checked as
/// `check_grant` checks a JSON one, and read one way only: no `+` and no `%` that is not an
/// escape, each pair `KEY=VALUE` once (a key once in any case), only the grant's keys, each
/// decoding to UTF-8. Its pairs, decoded, to be sent again (`Secrets::substitute_form`).
pub(crate) fn check_grant_form(
    body: &[u8],
    grant: &Grant,
    spotted: Spotted,
) -> Result<Vec<(String, String)>, String> {
    let text =
        std::str::from_utf8(body).map_err(|_| "its body is not a form read one way only".to_string())?;
    if super::percent::read_two_ways(text) {
        return Err(
            "its body holds a `+` or a `%` that is not an escape, which a server may read another way".into(),
        );
    }
    let decode = |s: &str| String::from_utf8(super::percent::decode(s.as_bytes())).ok();
    let keys = grant.keys(true);
    let mut pairs: Vec<(String, String)> = Vec::new();
    for pair in text.split('&') {
        let read = pair.split_once('=').filter(|(_, v)| !v.contains('='));
        let Some((k, v)) = read.and_then(|(k, v)| Some((decode(k)?, decode(v)?))) else {
            return Err(format!("its body holds {} (not KEY=VALUE in UTF-8)", quote_key(pair)));
        };
        if !keys.contains(&k.as_str()) {
            return Err(format!("its body holds {} ({} only)", quote_key(&k), keys.join(", ")));
        }
        if pairs.iter().any(|(seen, _)| seen.eq_ignore_ascii_case(&k)) {
            return Err(format!(
                "its body holds {} twice, which a server may read either way",
                quote_key(&k)
            ));
        }
        pairs.push((k, v));
    }
    let members: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    grant.check(&members, spotted)?;
    Ok(pairs)
}

/// A form's media type.
const FORM: &str = "application/x-www-form-urlencoded";

/// `application/x-www-form-urlencoded`, at most with a UTF-8 charset.
fn form_type(v: &[u8]) -> bool {
    let Ok(t) = std::str::from_utf8(v) else { return false };
    let t = t.trim().to_ascii_lowercase();
    let Some(rest) = t.strip_prefix(FORM) else { return false };
    let rest = rest.trim_start();
    rest.is_empty()
        || rest.strip_prefix(';').is_some_and(|p| {
            let p: String = p.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            p.is_empty() || p == "charset=utf-8" || p == "charset=\"utf-8\""
        })
}

/// The tokens an OAuth token answer carries.
const TOKEN_FIELDS: &[&str] = &["access_token", "refresh_token", "id_token"];

fn quote_key(k: &str) -> String {
    crate::sys::quote::text(&format!("{k:?}"))
}

/// A request to a held login's token endpoint, its head: its login's type said once
/// (`application/json`, or a `form`'s `application/x-www-form-urlencoded`, at most a UTF-8
/// charset), not compressed, no query (a server that read a query or another content type could
/// take another grant than the one checked).
pub(crate) fn check_refresh_head(
    headers: &hyper::HeaderMap,
    query: Option<&str>,
    form: bool,
) -> Result<(), String> {
    let types: Vec<_> = headers.get_all(hyper::header::CONTENT_TYPE).iter().collect();
    let (said, name) = match form {
        false => (types.len() == 1 && super::mcp::json_type(types[0].as_bytes()), "application/json"),
        true => (types.len() == 1 && form_type(types[0].as_bytes()), FORM),
    };
    if !said {
        return Err(format!("it is not said once to be {name}"));
    }
    if headers.contains_key(hyper::header::CONTENT_ENCODING) {
        return Err("its body is encoded".into());
    }
    if query.is_some() {
        return Err("it has a query".into());
    }
    Ok(())
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
/// sessions go on; the next launch reads the store's older login). `first`: a first login's
/// answer, whose store file and places are made (ADR 0090).
pub(crate) fn take_answer<'a>(
    answer: &[u8],
    renewed: impl Iterator<Item = (&'a LoginRef, &'a str)>,
    now_ms: u128,
    first: bool,
) -> Option<(Vec<u8>, Option<String>)> {
    let Ok(Value::Object(mut json)) = serde_json::from_slice::<Value>(answer) else { return None };
    let expires_in = json.get("expires_in").and_then(Value::as_u64);
    let mut stores: HashMap<PathBuf, Vec<(&LoginRef, String)>> = HashMap::new();
    let mut taken = Vec::new();
    for (l, placeholder) in renewed {
        let Some(Value::String(new)) = json.get(&l.answer).cloned() else { continue };
        if new.is_empty() {
            continue;
        }
        json.insert(l.answer.clone(), Value::String(shown(l, &new, placeholder)));
        taken.push(l.answer.clone());
        stores.entry(l.store.clone()).or_default().push((l, new));
    }
    if stores.is_empty() {
        return None;
    }
    // A token of the answer this session holds no placeholder for (the store lacked it at
    // launch) is not the agent's either: the CLI keeps its old one.
    json.retain(|k, _| !TOKEN_FIELDS.contains(&k.as_str()) || taken.contains(k));
    let mut failed = Vec::new();
    for (store, tokens) in &stores {
        for (l, new) in tokens {
            set(l, new);
        }
        if let Err(e) = write_store(store, tokens, expires_in.map(|s| now_ms + u128::from(s) * 1000), first) {
            failed.push(e);
        }
    }
    let rewritten = serde_json::to_vec(&Value::Object(json)).expect("json");
    Some((rewritten, (!failed.is_empty()).then(|| failed.join("; "))))
}

/// The store file with the renewed tokens and expiry in their places (a place the file lacks
/// is not made, but for a `first` login, whose file and places are made: the launcher adds the
/// rest of the CLI's login when the session ends), written whole by rename, mode 0600.
fn write_store(
    store: &std::path::Path,
    tokens: &[(&LoginRef, String)],
    expiry_ms: Option<u128>,
    first: bool,
) -> Result<(), String> {
    let at = store.display();
    let mut v: Value = match std::fs::read(store) {
        Ok(text) => serde_json::from_slice(&text).map_err(|e| format!("reading {at}: {e}"))?,
        Err(e) if first && e.kind() == std::io::ErrorKind::NotFound => Value::Object(Default::default()),
        Err(e) => return Err(format!("reading {at}: {e}")),
    };
    // A first login never writes over a login the store has now (imported meanwhile).
    if first && tokens.iter().any(|(l, _)| login_field(&v, &l.field).is_some_and(|t| !t.is_empty())) {
        return Err(format!("{at} holds a login now; the one made inside is not written over it"));
    }
    let put = |v: &mut Value, field: &[String], to: Value| match first {
        true => make_login_field(v, field, to),
        false => set_login_field(v, field, to),
    };
    for (l, new) in tokens {
        if !put(&mut v, &l.field, Value::String(new.clone())) && first {
            return Err(format!("{at} has no place for {}", l.field.join(".")));
        }
    }
    if let (Some(ms), Some((l, _))) = (expiry_ms, tokens.first())
        && !l.expiry.is_empty()
    {
        put(&mut v, &l.expiry, Value::from(ms as u64));
    }
    let dir = store.parent().ok_or_else(|| format!("{at} has no directory"))?;
    if first {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("making {}: {e}", dir.display()))?;
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".login")
        .tempfile_in(dir)
        .map_err(|e| format!("writing {at}: {e}"))?;
    use std::io::Write;
    tmp.write_all(&serde_json::to_vec_pretty(&v).expect("json")).map_err(|e| format!("writing {at}: {e}"))?;
    tmp.persist(store).map_err(|e| format!("writing {at}: {e}"))?;
    Ok(())
}

/// Sets `field`, making the objects on the way (a first login's store file); `false` when a
/// value on the way is not an object.
fn make_login_field(v: &mut Value, field: &[String], to: Value) -> bool {
    let Some((last, path)) = field.split_last() else { return false };
    let mut at = v;
    for k in path {
        let Value::Object(o) = at else { return false };
        at = o.entry(k.clone()).or_insert_with(|| Value::Object(Default::default()));
    }
    let Value::Object(o) = at else { return false };
    o.insert(last.clone(), to);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Bound;
    use crate::gate::secrets::{Secrets, holds_placeholder};

    const PA: &str = "sk-ant-oat01-aisb_placeholder_aaaa";
    const PR: &str = "sk-ant-ort01-aisb_placeholder_rrrr";
    const ENDPOINT: &str = "platform.claude.com/v1/oauth/token";

    fn login(store: &std::path::Path, field: &str, answer: &str) -> LoginRef {
        LoginRef {
            store: store.to_path_buf(),
            field: vec!["claudeAiOauth".into(), field.into()],
            endpoint: ENDPOINT.into(),
            answer: answer.into(),
            expiry: vec!["claudeAiOauth".into(), "expiresAt".into()],
            refresh: answer == "refresh_token",
            jwt: false,
            form: false,
            code_form: false,
        }
    }

    /// A session of the login in `store`, holding `access` and `refresh`.
    fn session(store: &std::path::Path, access: &str, refresh: &str) -> Secrets {
        let mut a = Bound::new("access", PA, access, &["api.anthropic.com"]);
        a.login = Some(login(store, "accessToken", "access_token"));
        let mut r = Bound::new("refresh", PR, refresh, &["platform.claude.com"]);
        r.login = Some(login(store, "refreshToken", "refresh_token"));
        Secrets::new(vec![a, r])
    }

    fn store(dir: &tempfile::TempDir) -> PathBuf {
        let store = dir.path().join(".credentials.json");
        let login = r#"{"claudeAiOauth":{"accessToken":"A1","refreshToken":"R1","expiresAt":1,"scopes":["user:inference"]},"other":1}"#;
        std::fs::write(&store, login).unwrap();
        store
    }

    #[test]
    fn a_refresh_answer_goes_to_the_store_and_every_session_and_the_cli_reads_placeholders() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let one = session(&store, "A1", "R1");
        let two = session(&store, "A1", "R1");
        let body = format!(r#"{{"grant_type":"refresh_token","refresh_token":"{PR}"}}"#);
        let sent = one.substitute_body(body.as_bytes(), "platform.claude.com").unwrap();
        assert_eq!(sent, br#"{"grant_type":"refresh_token","refresh_token":"R1"}"#);
        assert!(one.renews("platform.claude.com", "/v1/oauth/token"));
        assert!(
            !one.renews("platform.claude.com", "/v1/oauth/token/")
                && !one.renews("api.anthropic.com", "/v1/oauth/token")
        );

        let answer =
            br#"{"access_token":"A2","refresh_token":"R2","expires_in":60,"scope":"user:inference"}"#;
        let before = generation();
        let (rewritten, unstored) = take_answer(answer, one.renewed_at(ENDPOINT), 1_000, false).unwrap();
        assert!(generation() > before, "a changed token is a new generation (the masks are made again)");
        assert_eq!(unstored, None);
        let v: Value = serde_json::from_slice(&rewritten).unwrap();
        assert_eq!((v["access_token"].as_str(), v["refresh_token"].as_str()), (Some(PA), Some(PR)));
        assert_eq!(v["scope"], "user:inference", "the rest of the answer as it came");
        let s: Value = serde_json::from_slice(&std::fs::read(&store).unwrap()).unwrap();
        assert_eq!(s["claudeAiOauth"]["accessToken"], "A2");
        assert_eq!(s["claudeAiOauth"]["refreshToken"], "R2");
        assert_eq!(s["claudeAiOauth"]["expiresAt"], 61_000);
        assert_eq!(s["other"], 1, "the rest of the store as it was");
        // The other session of the login sends the new tokens, and masks them.
        let bearer = format!("Bearer {PA}");
        assert_eq!(two.substitute(bearer.as_bytes(), "api.anthropic.com"), Ok(Some(b"Bearer A2".to_vec())));
        let again = two.substitute_body(body.as_bytes(), "platform.claude.com").unwrap();
        assert_eq!(again, br#"{"grant_type":"refresh_token","refresh_token":"R2"}"#);
        let mut scrub = crate::gate::scrub::Scrubber::new(two.masks("api.anthropic.com"));
        assert_eq!(scrub.whole(b"echo A2").unwrap(), format!("echo {PA}").into_bytes());
        // A token endpoint's answer is masked of every token of the login, whatever its host.
        let mut scrub = crate::gate::scrub::Scrubber::new(two.masks_with_logins("platform.claude.com"));
        assert_eq!(scrub.whole(b"A2 R2").unwrap(), format!("{PA} {PR}").into_bytes());
        let mut only_host = crate::gate::scrub::Scrubber::new(two.masks("platform.claude.com"));
        assert_eq!(only_host.whole(b"A2 R2").unwrap(), format!("A2 {PR}").into_bytes(), "control");
    }

    #[test]
    fn what_is_not_a_token_answer_is_left_and_a_store_that_cannot_be_written_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let s = session(&store, "A1", "R1");
        for answer in
            [&br#"{"error":"invalid_grant"}"#[..], b"not json", br#"{"access_token":""}"#, br#"["A2"]"#]
        {
            assert_eq!(
                take_answer(answer, s.renewed_at(ENDPOINT), 0, false),
                None,
                "{}",
                String::from_utf8_lossy(answer)
            );
        }
        assert_eq!(
            take_answer(br#"{"access_token":"A2"}"#, s.renewed_at("other.test/token"), 0, false),
            None
        );
        std::fs::remove_file(&store).unwrap();
        let (rewritten, unstored) =
            take_answer(br#"{"access_token":"A3"}"#, s.renewed_at(ENDPOINT), 0, false).unwrap();
        assert!(String::from_utf8(rewritten).unwrap().contains(PA));
        assert!(unstored.is_some_and(|e| e.contains("reading")));
        let bearer = format!("Bearer {PA}");
        assert_eq!(
            s.substitute(bearer.as_bytes(), "api.anthropic.com"),
            Ok(Some(b"Bearer A3".to_vec())),
            "the gate's sessions go on"
        );
    }

    #[test]
    fn only_the_refresh_of_this_sessions_placeholder_goes_to_the_token_endpoint() {
        let dir = tempfile::tempdir().unwrap();
        let s = session(&store(&dir), "A1", "R1");
        let mine = s.refresh_placeholders(ENDPOINT);
        assert_eq!(mine, [PR], "the refresh token's placeholder, not the access token's");
        assert!(s.refresh_placeholders("other.test/token").is_empty());
        let ok = format!(r#"{{"grant_type":"refresh_token","refresh_token":"{PR}","client_id":"c"}}"#);
        assert_eq!(check_grant(ok.as_bytes(), &Grant::Refresh(&mine), &holds_placeholder), Ok(()));
        for (body, why) in [
            (r#"{"grant_type":"authorization_code","refresh_token":"x"}"#.to_string(), "not a refresh"),
            (
                r#"{"grant_type":"authorization_code","code":"c","refresh_token":"x"}"#.to_string(),
                "holds \"code\"",
            ),
            (
                format!(
                    r#"{{"grant_type":"refresh_token","refresh_token":"{PR}","x":"&grant_type=refresh_token&refresh_token=theirs"}}"#
                ),
                "holds \"x\"",
            ),
            (
                format!(r#"{{"grant_type":"refresh_token","refresh_token":"{PR}","scope":["a"]}}"#),
                "holds \"scope\"",
            ),
            (format!(r#"["grant_type","refresh_token","{PR}"]"#), "not a JSON object"),
            (
                r#"{"grant_type":"refresh_token","refresh_token":"sk-ant-ort01-attackers-own"}"#.into(),
                "not this sandbox's",
            ),
            (r#"{"grant_type":"refresh_token"}"#.into(), "not this sandbox's"),
            (
                format!(r#"{{"grant_type":"refresh_token","refresh_token":"{PR}","scope":"{PA}"}}"#),
                "\"scope\" carries a placeholder",
            ),
            (
                format!(
                    r#"{{"grant_type":"refresh_token","refresh_token":"{PR}","client_id":"aisb%5Fplaceholder%5Fx"}}"#
                ),
                "\"client_id\" carries a placeholder",
            ),
            (
                format!(r#"{{"grant_type":"refresh_token","refresh_token":"x","refresh_token":"{PR}"}}"#),
                "one way only",
            ),
            (
                format!(r#"{{"grant_type":"refresh_token","Refresh_Token":"x","refresh_token":"{PR}"}}"#),
                "one way only",
            ),
            (format!("grant_type=refresh_token&refresh_token={PR}"), "one way only"),
        ] {
            let e = check_grant(body.as_bytes(), &Grant::Refresh(&mine), &holds_placeholder).unwrap_err();
            assert!(e.contains(why), "{body}: {e}");
        }
        // The head: JSON said once, not encoded, no query.
        let head = |pairs: &[(&str, &str)]| {
            let mut h = hyper::HeaderMap::new();
            for (k, v) in pairs {
                h.append(hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
            }
            h
        };
        assert_eq!(
            check_refresh_head(&head(&[("content-type", "application/json; charset=utf-8")]), None, false),
            Ok(())
        );
        for (h, q, why) in [
            (head(&[("content-type", "application/x-www-form-urlencoded")]), None, "application/json"),
            (head(&[]), None, "application/json"),
            (
                head(&[("content-type", "application/json"), ("content-type", "application/json")]),
                None,
                "once",
            ),
            (head(&[("content-type", "application/json"), ("content-encoding", "gzip")]), None, "encoded"),
            (head(&[("content-type", "application/json")]), Some("grant_type=x"), "query"),
        ] {
            assert!(check_refresh_head(&h, q, false).unwrap_err().contains(why), "{h:?} {q:?}");
        }
        // The refresh token goes in no header, even to its own host; the access token does.
        let bearer = format!("Bearer {PR}");
        assert_eq!(s.substitute(bearer.as_bytes(), "platform.claude.com"), Ok(None));
        let bearer = format!("Bearer {PA}");
        assert_eq!(s.substitute(bearer.as_bytes(), "api.anthropic.com"), Ok(Some(b"Bearer A1".to_vec())));
        let shown = format!("{s:?}");
        assert!(!shown.contains("A1") && !shown.contains("R1") && shown.contains("Cell(held)"), "{shown}");
    }

    #[test]
    fn a_new_session_takes_the_stores_token_over_an_older_one_it_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        // The launcher read A0 before a refresh wrote A1 to the store: A1 stands.
        let late = session(&store, "A0", "R0");
        let bearer = format!("Bearer {PA}");
        assert_eq!(late.substitute(bearer.as_bytes(), "api.anthropic.com"), Ok(Some(b"Bearer A1".to_vec())));
        // Control: with no store to read, what was registered.
        let none = session(&dir.path().join("gone.json"), "A9", "R9");
        assert_eq!(none.substitute(bearer.as_bytes(), "api.anthropic.com"), Ok(Some(b"Bearer A9".to_vec())));
    }

    #[test]
    fn a_jwt_is_held_by_its_signature_and_a_refresh_answers_its_new_claims() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("auth.json");
        std::fs::write(&store, r#"{"tokens":{"access_token":"h.c1.S1","refresh_token":"R1"}}"#).unwrap();
        let jwt = |field: &str, answer: &str| LoginRef {
            store: store.clone(),
            field: vec!["tokens".into(), field.into()],
            endpoint: "auth.openai.com/oauth/token".into(),
            answer: answer.into(),
            expiry: vec![],
            refresh: answer == "refresh_token",
            jwt: answer != "refresh_token",
            form: false,
            code_form: false,
        };
        const SIG: &str = "aisb_placeholder_5151";
        let s = Secrets::new(vec![
            Bound::new("access", SIG, "ignored: the store is read", &["chatgpt.com"])
                .held(jwt("access_token", "access_token")),
            Bound::new("refresh", PR, "R1", &["auth.openai.com"]).held(jwt("refresh_token", "refresh_token")),
        ]);
        // The sandbox's h.c1.PLACEHOLDER becomes the stored token.
        let bearer = format!("Bearer h.c1.{SIG}");
        assert_eq!(s.substitute(bearer.as_bytes(), "chatgpt.com"), Ok(Some(b"Bearer h.c1.S1".to_vec())));
        let answer = br#"{"access_token":"h.c2.S2","refresh_token":"R2","id_token":"x"}"#;
        let (rewritten, unstored) =
            take_answer(answer, s.renewed_at("auth.openai.com/oauth/token"), 0, false).unwrap();
        assert_eq!(unstored, None);
        let v: Value = serde_json::from_slice(&rewritten).unwrap();
        assert_eq!(v["access_token"], format!("h.c2.{SIG}"), "the new claims, the same placeholder");
        assert_eq!(v["refresh_token"], PR);
        assert!(
            v.get("id_token").is_none(),
            "a token this session holds no placeholder for is not passed on"
        );
        let stored: Value = serde_json::from_slice(&std::fs::read(&store).unwrap()).unwrap();
        assert_eq!(stored["tokens"]["access_token"], "h.c2.S2", "the store holds the whole token");
        let bearer = format!("Bearer h.c2.{SIG}");
        assert_eq!(s.substitute(bearer.as_bytes(), "chatgpt.com"), Ok(Some(b"Bearer h.c2.S2".to_vec())));
        // A session that still holds the old claims sends the new token whole (its signature
        // only ever after its own claims).
        let old = format!("Bearer h.c1.{SIG}");
        assert_eq!(s.substitute(old.as_bytes(), "chatgpt.com"), Ok(Some(b"Bearer h.c2.S2".to_vec())));
        let mut scrub = crate::gate::scrub::Scrubber::new(s.masks("chatgpt.com"));
        let echo = scrub.whole(b"got h.c2.S2 and x.y.S2").unwrap();
        assert_eq!(echo, format!("got h.c2.{SIG} and x.y.{SIG}").into_bytes());
        // An answer whose token is not a JWT: held whole, answered as the bare placeholder.
        let (rewritten, _) = take_answer(
            br#"{"access_token":"opaque"}"#,
            s.renewed_at("auth.openai.com/oauth/token"),
            0,
            false,
        )
        .unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&rewritten).unwrap()["access_token"], SIG);
        assert_eq!(s.substitute(SIG.as_bytes(), "chatgpt.com"), Ok(Some(b"opaque".to_vec())));
    }

    #[test]
    fn a_body_is_refused_when_a_placeholder_goes_elsewhere_or_a_value_would_need_escaping() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let s = session(&store, "A1", "R1");
        let body = format!(r#"{{"refresh_token":"{PR}","x":"{PA}"}}"#);
        let e = s.substitute_body(body.as_bytes(), "platform.claude.com").unwrap_err();
        assert!(e.contains("exfiltration attempt") && e.contains("access"), "{e}");
        let odd = session(&dir.path().join("odd.json"), "A1", "R\"1");
        let e = odd.substitute_body(PR.as_bytes(), "platform.claude.com").unwrap_err();
        assert!(e.contains("would have to escape"), "{e}");
        assert_eq!(s.substitute_body(b"plain", "platform.claude.com").unwrap(), b"plain", "control");
    }

    #[test]
    fn a_form_refresh_is_read_one_way_and_sent_again_with_the_real_token_encoded() {
        const PG: &str = "aisb_placeholder_gggg";
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("oauth_creds.json");
        std::fs::write(&store, r#"{"access_token":"ya29.A1","refresh_token":"1//0R1"}"#).unwrap();
        let google = |field: &str, refresh: bool| LoginRef {
            store: store.clone(),
            field: vec![field.into()],
            endpoint: "oauth2.googleapis.com/token".into(),
            answer: field.into(),
            expiry: vec!["expiry_date".into()],
            refresh,
            jwt: false,
            form: true,
            code_form: true,
        };
        let mut a = Bound::new("access", "ya29.aisb_placeholder_aaaa", "ya29.A1", &["oauth2.googleapis.com"]);
        a.login = Some(google("access_token", false));
        let mut r = Bound::new("refresh", PG, "1//0R1", &["oauth2.googleapis.com"]);
        r.login = Some(google("refresh_token", true));
        let mut k = Bound::new("key", "aisb_placeholder_kkkk", "K", &["elsewhere.test"]);
        k.login = None;
        let s = Secrets::new(vec![a, r, k]);
        let refresh = Grant::Refresh(&[]);
        assert!(s.form("oauth2.googleapis.com/token", &refresh) && !s.form(ENDPOINT, &refresh));
        let mine = s.refresh_placeholders("oauth2.googleapis.com/token");
        assert_eq!(mine, [PG]);
        // What google-auth-library sends: the pairs come back decoded, in order.
        let body = format!(
            "refresh_token={PG}&client_id=6-x.apps.googleusercontent.com&client_secret=GOCSPX-s&grant_type=refresh_token"
        );
        let pairs = check_grant_form(body.as_bytes(), &Grant::Refresh(&mine), &holds_placeholder).unwrap();
        assert_eq!(pairs[1], ("client_id".into(), "6-x.apps.googleusercontent.com".into()));
        let sent = s.substitute_form(&pairs, "oauth2.googleapis.com").unwrap();
        assert_eq!(
            String::from_utf8(sent).unwrap(),
            "refresh_token=1%2F%2F0R1&client_id=6-x.apps.googleusercontent.com&client_secret=GOCSPX-s&grant_type=refresh_token",
            "the real token, its slashes escaped"
        );
        // Another secret's placeholder in a value is an exfiltration attempt, even escaped.
        let odd = vec![
            ("refresh_token".to_string(), PG.to_string()),
            ("scope".into(), "aisb_placeholder_kkkk".into()),
        ];
        let e = s.substitute_form(&odd, "oauth2.googleapis.com").unwrap_err();
        assert!(e.contains("exfiltration attempt") && e.contains("key"), "{e}");
        for (body, why) in [
            (format!("grant_type=refresh_token&refresh_token={PG}&code=c"), "holds \"code\""),
            (format!("grant_type=authorization_code&refresh_token={PG}"), "not a refresh"),
            ("grant_type=refresh_token&refresh_token=1%2F%2Ftheirs".to_string(), "not this sandbox's"),
            (format!("grant_type=refresh_token&refresh_token=x&refresh_token={PG}"), "twice"),
            (format!("grant_type=refresh_token&refresh_token={PG}&scope=a+b"), "`+`"),
            (format!("grant_type=refresh_token&refresh_token={PG}&scope=%zz"), "`%`"),
            (format!("grant_type=refresh_token&refresh_token={PG}&"), "not KEY=VALUE"),
            (format!("grant_type=refresh_token&refresh_token={PG}&scope=a=b"), "not KEY=VALUE"),
            (format!("grant_type=refresh_token&refresh_token={PG}&scope=%FF"), "not KEY=VALUE"),
            (format!("Grant_Type=refresh_token&refresh_token={PG}"), "holds \"Grant_Type\""),
            (format!("grant_type=refresh_token&refresh_token={PG}&scope=openid"), "holds \"scope\""),
            (
                format!(
                    "grant_type=refresh_token&refresh_token={PG}&client_secret=ya29.aisb_placeholder_aaaa"
                ),
                "\"client_secret\" carries a placeholder",
            ),
            (
                format!("grant_type=refresh_token&refresh_token={PG}&client_id=AISB_PLACEHOLDER_gggg"),
                "\"client_id\" carries a placeholder",
            ),
            (format!(r#"{{"grant_type":"refresh_token","refresh_token":"{PG}"}}"#), "not KEY=VALUE"),
        ] {
            let e =
                check_grant_form(body.as_bytes(), &Grant::Refresh(&mine), &holds_placeholder).unwrap_err();
            assert!(e.contains(why), "{body}: {e}");
        }
        // The head says a form once; JSON is not one.
        let head = |v: &str| {
            let mut h = hyper::HeaderMap::new();
            h.append(hyper::header::CONTENT_TYPE, v.parse().unwrap());
            h
        };
        for ok in [
            FORM,
            "application/x-www-form-urlencoded;charset=UTF-8",
            "Application/X-WWW-Form-Urlencoded ; charset=\"utf-8\"",
        ] {
            assert_eq!(check_refresh_head(&head(ok), None, true), Ok(()), "{ok}");
        }
        for bad in [
            "application/json",
            "application/x-www-form-urlencoded; charset=latin1",
            "application/x-www-form-urlencodedx",
            "multipart/form-data",
        ] {
            let e = check_refresh_head(&head(bad), None, true).unwrap_err();
            assert!(e.contains("application/x-www-form-urlencoded"), "{bad}: {e}");
        }
        assert!(check_refresh_head(&head(FORM), Some("a=b"), true).unwrap_err().contains("query"));
    }

    #[test]
    fn a_first_login_is_taken_from_its_code_exchange_and_only_while_no_token_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("login/auth.json");
        let held = |field: &str, refresh: bool| LoginRef {
            store: store.clone(),
            field: vec!["tokens".into(), field.into()],
            endpoint: "auth.openai.com/oauth/token".into(),
            answer: field.into(),
            expiry: vec![],
            refresh,
            jwt: field == "id_token",
            form: false,
            code_form: true,
        };
        let session = || {
            Secrets::new(vec![
                Bound::new("refresh", "aisb_placeholder_rr", "", &["auth.openai.com"])
                    .held(held("refresh_token", true)),
                Bound::new("id", "aisb_placeholder_ii", "", &[]).held(held("id_token", false)),
            ])
        };
        let s = session();
        let endpoint = "auth.openai.com/oauth/token";
        assert!(s.first_login(endpoint) && !s.first_login("other.test/token"));
        // Before the login, only the token endpoint's host is opened; its API host once it exists.
        let api = Secrets::new(vec![
            Bound::new("access", "aisb_placeholder_aa", "", &["chatgpt.com"])
                .held(held("access_token", false)),
        ]);
        assert!(s.terminates("auth.openai.com") && !api.terminates("chatgpt.com"));
        assert!(s.form(endpoint, &Grant::Code) && !s.form(endpoint, &Grant::Refresh(&[])));
        // A token with no value yet is neither substituted nor masked, and still refused elsewhere.
        assert_eq!(s.substitute(b"Bearer aisb_placeholder_rr", "auth.openai.com"), Ok(None));
        assert!(s.misuse(b"aisb_placeholder_ii", Some("auth.openai.com")).is_some());
        let code = "grant_type=authorization_code&code=ac_1&redirect_uri=http%3A%2F%2Flocalhost%3A1455%2Fcb&client_id=app&code_verifier=v";
        assert_eq!(
            check_grant_form(code.as_bytes(), &Grant::Code, &holds_placeholder).unwrap()[1],
            ("code".into(), "ac_1".into())
        );
        let json = r#"{"grant_type":"authorization_code","code":"c","redirect_uri":"r","client_id":"i","code_verifier":"v","state":"s"}"#;
        assert_eq!(check_grant(json.as_bytes(), &Grant::Code, &holds_placeholder), Ok(()));
        for (body, why) in [
            ("grant_type=refresh_token&code=c", "not a first login's code exchange"),
            ("grant_type=authorization_code&code=", "has no code"),
            ("grant_type=authorization_code&code=aisb%5Fplaceholder%5Frr", "\"code\" carries a placeholder"),
            ("grant_type=authorization_code&code=c&refresh_token=x", "holds \"refresh_token\""),
        ] {
            let e = check_grant_form(body.as_bytes(), &Grant::Code, &holds_placeholder).unwrap_err();
            assert!(e.contains(why), "{body}: {e}");
        }
        // The answer: the store file made, the CLI given placeholders (a JWT's claims in view).
        let id = "eyJh.eyJj.SIG";
        let answer =
            format!(r#"{{"access_token":"A1","refresh_token":"R1","id_token":"{id}","expires_in":60}}"#);
        let (rewritten, unstored) = take_answer(answer.as_bytes(), s.renewed_at(endpoint), 0, true).unwrap();
        assert_eq!(unstored, None);
        let cli: Value = serde_json::from_slice(&rewritten).unwrap();
        assert_eq!(cli["refresh_token"], "aisb_placeholder_rr");
        assert_eq!(cli["id_token"], "eyJh.eyJj.aisb_placeholder_ii");
        assert!(
            cli.get("access_token").is_none(),
            "a token this session holds no placeholder for is taken out"
        );
        let stored: Value = serde_json::from_slice(&std::fs::read(&store).unwrap()).unwrap();
        assert_eq!(
            (stored["tokens"]["refresh_token"].as_str(), stored["tokens"]["id_token"].as_str()),
            (Some("R1"), Some(id))
        );
        let mode = std::fs::metadata(&store).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
        // Now the login has its tokens: no more code exchange, here or in a new session, whose
        // registration never empties a cell.
        assert!(!s.first_login(endpoint) && !session().first_login(endpoint));
        let answer = r#"{"access_token":"A1","refresh_token":"R1","expires_in":60}"#;
        take_answer(answer.as_bytes(), api.renewed_at(endpoint), 0, false).unwrap();
        assert!(api.terminates("chatgpt.com"), "its API host, once the token is there");
        assert_eq!(
            s.substitute(b"x aisb_placeholder_rr", "auth.openai.com"),
            Ok(None),
            "a refresh token in no header"
        );
        // Control: a refresh answer never makes a store file.
        std::fs::remove_file(&store).unwrap();
        let (_, unstored) = take_answer(answer.as_bytes(), s.renewed_at(endpoint), 0, false).unwrap();
        assert!(unstored.is_some_and(|e| e.contains("reading")) && !store.exists());
        // A first login's answer never writes over a login the store has now (imported).
        std::fs::write(&store, r#"{"tokens":{"refresh_token":"IMPORTED"}}"#).unwrap();
        let (_, unstored) = take_answer(answer.as_bytes(), s.renewed_at(endpoint), 0, true).unwrap();
        assert!(unstored.is_some_and(|e| e.contains("holds a login now")), "refused");
        assert!(std::fs::read_to_string(&store).unwrap().contains("IMPORTED"));
        std::fs::write(&store, r#"{"tokens":"scalar"}"#).unwrap();
        let (_, unstored) = take_answer(answer.as_bytes(), s.renewed_at(endpoint), 0, true).unwrap();
        assert!(
            unstored.is_some_and(|e| e.contains("has no place for tokens.")),
            "said, not taken for written"
        );
    }

    #[test]
    fn a_login_imported_meanwhile_ends_a_first_logins_state_when_the_store_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("auth.json");
        let endpoint = "import.test/token";
        let mut l = LoginRef::new(&store, &["tokens", "refresh_token"], endpoint, "refresh_token", &[], true);
        l.code_form = true;
        let s =
            Secrets::new(vec![Bound::new("refresh", "aisb_placeholder_mm", "", &["import.test"]).held(l)]);
        assert!(s.first_login(endpoint));
        std::fs::write(&store, r#"{"tokens":{"refresh_token":"IMPORTED"}}"#).unwrap();
        assert!(s.first_login(endpoint), "the cells are what the gate read");
        s.reload("other.test/token");
        assert!(s.first_login(endpoint), "another login's store is not this one's");
        s.reload(endpoint);
        assert!(!s.first_login(endpoint), "read again: a login is there");
    }
}
