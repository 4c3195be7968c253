//! AWS Signature Version 4, the pure part (`secret = aws for HOST`, ADR 0088). An AWS client
//! signs each request with its secret key, which never travels: so the gate cannot put the real
//! key into a request as it does a bound token. The sandbox's client signs with per-session
//! placeholder credentials instead; for a request to a bound host the gate checks that it was
//! signed with them (`verify`: the signature of the request as the client sent it, so the gate
//! re-signs only what the sandbox's own client signed) and signs it again with the user's real
//! credentials (`resign`), which stay with the gate.
//!
//! The canonical request is AWS's, in the form of the scope's service (never one the client
//! picks: a form the service reads otherwise gets an answer that spells the request out, real
//! token included): the method; the path, as sent for S3's family (and then only one in AWS's
//! encoding already), with its dot segments removed and encoded once more for every other
//! service; the query decoded and encoded again in AWS's strict form and sorted (a `+` or a
//! stray `%` refused); the signed headers (values trimmed, runs of spaces made one); and the
//! payload's hash (the client's `x-amz-content-sha256`, else the body's SHA-256, or
//! `UNSIGNED-PAYLOAD` in a presigned S3 URL). A body signed chunk by chunk
//! (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD`) is refused: each chunk's signature chains on the one
//! before, from the secret key (say so, not pass it half-signed). A signature is signed again
//! only when it is of the last 15 minutes (`SKEW`), so that a real one is never good for long.

use super::percent::encode;
use ring::{digest, hmac};
use subtle::ConstantTimeEq;

pub(crate) const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// The payload hash a presigned URL signs in S3's form.
const UNSIGNED: &str = "UNSIGNED-PAYLOAD";

/// A presigned URL's parameters, as AWS spells them.
const QUERY_AUTH: [&str; 7] = [
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
    "X-Amz-Security-Token",
];

/// One set of AWS credentials (real, or the sandbox's placeholders).
#[derive(Clone, Copy)]
pub(crate) struct Creds<'a> {
    pub(crate) key_id: &'a str,
    pub(crate) secret: &'a str,
    pub(crate) token: Option<&'a str>,
}

/// Where the signature travels: the `Authorization` header, or a presigned URL's query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    Header,
    Query,
}

/// A request's signature as the client made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Signature {
    pub(crate) form: Form,
    pub(crate) key_id: String,
    /// `DATE/REGION/SERVICE/aws4_request`.
    pub(crate) scope: String,
    pub(crate) amz_date: String,
    /// The signed headers' names, lowercase and sorted.
    pub(crate) signed: Vec<String>,
    pub(crate) hex: String,
}

/// A request as the signer reads it.
pub(crate) struct Head<'a> {
    pub(crate) method: &'a str,
    /// The path as sent (percent-encoded).
    pub(crate) path: &'a str,
    pub(crate) query: Option<&'a str>,
    pub(crate) headers: &'a hyper::HeaderMap,
    /// The `Host` header's value, or the request's authority (HTTP/2).
    pub(crate) host: &'a str,
}

/// How the client made its canonical request, found by `verify` and kept by `resign`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Variant {
    normalised: bool,
    pub(crate) payload: String,
}

/// The signature a request carries (`Ok(None)`: it carries none in SigV4's form).
pub(crate) fn parse(head: &Head) -> Result<Option<Signature>, String> {
    let auth = head.headers.get_all(hyper::header::AUTHORIZATION).iter().collect::<Vec<_>>();
    let in_query = pairs(head.query).iter().any(|(k, _)| k.eq_ignore_ascii_case(b"X-Amz-Signature"));
    let header = match auth.as_slice() {
        [] => None,
        [one] => Some(one.to_str().map_err(|_| "its Authorization header is not text".to_string())?),
        _ => return Err("it carries two Authorization headers".into()),
    };
    match (header.filter(|h| h.starts_with("AWS4-")), in_query) {
        (None, false) => Ok(None),
        (Some(_), true) => Err("it is signed twice, in its header and in its query".into()),
        (Some(h), false) => from_header(h).map(Some),
        (None, true) => from_query(head.query).map(Some),
    }
}

fn from_header(h: &str) -> Result<Signature, String> {
    let rest = h
        .strip_prefix(ALGORITHM)
        .and_then(|r| r.strip_prefix(' '))
        .ok_or_else(|| format!("its signature is not {ALGORITHM} (SigV4a and others are not re-signed)"))?;
    let (mut credential, mut signed, mut hex) = (None, None, None);
    for part in rest.split(',').map(str::trim) {
        let slot = match part.split_once('=') {
            Some(("Credential", v)) => (&mut credential, v),
            Some(("SignedHeaders", v)) => (&mut signed, v),
            Some(("Signature", v)) => (&mut hex, v),
            _ => return Err(format!("its Authorization header has `{part}`, which SigV4 does not")),
        };
        if slot.0.replace(slot.1).is_some() {
            return Err("its Authorization header names a part twice".into());
        }
    }
    let missing = || "its Authorization header lacks Credential, SignedHeaders or Signature".to_string();
    let amz_date = String::new();
    signature(
        Form::Header,
        credential.ok_or_else(missing)?,
        signed.ok_or_else(missing)?,
        hex.ok_or_else(missing)?,
        amz_date,
    )
}

fn from_query(query: Option<&str>) -> Result<Signature, String> {
    let all = pairs(query);
    let one = |name: &str| -> Result<String, String> {
        let mut found = all.iter().filter(|(k, _)| k == name.as_bytes());
        match (found.next(), found.next()) {
            (Some((_, v)), None) => {
                String::from_utf8(v.clone()).map_err(|_| format!("its presigned URL's {name} is not text"))
            }
            _ => Err(format!("its presigned URL has no single {name}")),
        }
    };
    if one("X-Amz-Algorithm")? != ALGORITHM {
        return Err(format!("its presigned URL is not signed with {ALGORITHM}"));
    }
    let (credential, signed, hex) =
        (one("X-Amz-Credential")?, one("X-Amz-SignedHeaders")?, one("X-Amz-Signature")?);
    signature(Form::Query, &credential, &signed, &hex, one("X-Amz-Date")?)
}

fn signature(
    form: Form,
    credential: &str,
    signed: &str,
    hex: &str,
    amz_date: String,
) -> Result<Signature, String> {
    let (key_id, scope) = credential.split_once('/').ok_or("its credential has no scope")?;
    let parts: Vec<&str> = scope.split('/').collect();
    let scoped = matches!(parts.as_slice(), [date, region, service, "aws4_request"]
        if date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit()) && !region.is_empty() && !service.is_empty());
    if !scoped || key_id.is_empty() {
        return Err(format!("its credential scope `{scope}` is not DATE/REGION/SERVICE/aws4_request"));
    }
    let names: Vec<String> = signed.split(';').map(String::from).collect();
    let sorted = names.windows(2).all(|w| w[0] < w[1]);
    let plain = names.iter().all(|n| {
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    });
    if !sorted || !plain || !names.iter().any(|n| n == "host") {
        return Err(format!("its signed headers `{signed}` are not lowercase names, sorted, with host"));
    }
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err("its signature is not 64 lowercase hex digits".into());
    }
    Ok(Signature {
        form,
        key_id: key_id.into(),
        scope: scope.into(),
        amz_date,
        signed: names,
        hex: hex.into(),
    })
}

/// The payload hashes the client may have signed: its own `x-amz-content-sha256`, else the
/// body's (`hash`, which the header form needs), or S3's unsigned payload in a presigned URL
/// (tried first: a presigned upload then streams).
fn payloads(head: &Head, sig: &Signature, hash: Option<&str>) -> Result<Vec<String>, String> {
    if let Some(v) = head.headers.get("x-amz-content-sha256") {
        let v = v.to_str().map_err(|_| "its x-amz-content-sha256 is not text")?;
        if v.starts_with("STREAMING-") && v != "STREAMING-UNSIGNED-PAYLOAD-TRAILER" {
            return Err(format!(
                "its body is signed chunk by chunk ({v}), which the gate does not sign again; configure the client to send \
                 an unsigned or hashed payload"
            ));
        }
        return Ok(vec![v.to_string()]);
    }
    match (sig.form, hash) {
        (Form::Query, _) if is_s3(sig) => Ok(vec![UNSIGNED.into()]),
        (_, Some(h)) => Ok(vec![h.to_string()]),
        (_, None) => Err("its body is needed for its hash".into()),
    }
}

/// Whether the body's hash must be read before the signature can be checked (not for a
/// presigned S3 URL, whose payload is unsigned: a presigned upload streams).
pub(crate) fn needs_body(head: &Head, sig: &Signature) -> bool {
    let unsigned = sig.form == Form::Query && is_s3(sig);
    !(head.headers.contains_key("x-amz-content-sha256") || unsigned)
}

/// The SHA-256 of a body, as the canonical request names it.
pub(crate) fn body_hash(digest: digest::Digest) -> String {
    hex(digest.as_ref())
}

/// How old a signature's date may be by the gate's clock (AWS's own window for a signed
/// request), and how far ahead (the sandbox shares the host's clock): a real signature is never
/// good for long; a presigned URL's expiry is cut to end within the window as well.
pub(crate) const SKEW: u64 = 15 * 60;
const AHEAD: u64 = 60;

/// How the client made the signature `sig` of `head` with the placeholder `secret`, `now`
/// being the gate's clock (seconds since the epoch); `Err` when no canonical request of it
/// matches, or when it is one the gate would not sign again.
pub(crate) fn verify(
    head: &Head,
    sig: &Signature,
    secret: &str,
    hash: Option<&str>,
    now: u64,
) -> Result<Variant, String> {
    for name in ["host", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token", "authorization"] {
        if head.headers.get_all(name).iter().count() > 1 {
            return Err(format!("it carries {name} twice, which a service may read either way"));
        }
    }
    let headers = canonical_headers(head, &sig.signed, |_, v| Ok(v.to_string()))?;
    let amz_date = amz_date(head, sig)?;
    let at = seconds(&amz_date).ok_or_else(|| format!("its date `{amz_date}` is not a date"))?;
    if at.saturating_add(SKEW) < now || at > now.saturating_add(AHEAD) {
        return Err(format!(
            "its date {amz_date} is not of the last 15 minutes by the gate's clock (the sandbox shares it)"
        ));
    }
    let query = canonical_query(head.query, sig.form)?;
    // The service's own form, never the client's choice: S3 signs the path as it is sent (only
    // one in AWS's encoding already: S3 would read another spelling and say why with the real
    // token) and a presigned URL's payload unsigned; every other service the path encoded once
    // more and the body's hash.
    let s3 = is_s3(sig);
    if s3 && !canonical_path(head.path) {
        return Err(
            "its path is not in AWS's encoding (S3 signs it as it is sent: letters, digits, -_.~/ and %XX)"
                .into(),
        );
    }
    for payload in payloads(head, sig, hash)? {
        let v = Variant { normalised: !s3, payload };
        let cr = canonical(head, &v, &query, &headers, &sig.signed.join(";"));
        let mine = sign(secret, &sig.scope, &amz_date, &cr);
        if bool::from(mine.as_bytes().ct_eq(sig.hex.as_bytes())) {
            return Ok(v);
        }
    }
    Err("its signature was not made with this session's AWS placeholder credentials".into())
}

/// The services that sign the path as it is sent (S3's family), by the scope's service.
fn is_s3(sig: &Signature) -> bool {
    let service = sig.scope.split('/').nth(2).unwrap_or("");
    matches!(service, "s3" | "s3express" | "s3-outposts" | "s3-object-lambda")
}

/// Whether `path` is in AWS's URI encoding already: unreserved bytes, `/`, and `%XX` with
/// uppercase hex digits.
fn canonical_path(path: &str) -> bool {
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            c if c.is_ascii_alphanumeric() || b"-_.~/".contains(&c) => i += 1,
            b'%' if b.len() > i + 2
                && b[i + 1..i + 3].iter().all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h)) =>
            {
                i += 3
            }
            _ => return false,
        }
    }
    true
}

/// `YYYYMMDDTHHMMSSZ` as seconds since the epoch.
fn seconds(d: &str) -> Option<u64> {
    let digits =
        |r: std::ops::Range<usize>| d.get(r.clone()).filter(|p| p.bytes().all(|b| b.is_ascii_digit()));
    let n = |r: std::ops::Range<usize>| digits(r)?.parse::<u64>().ok();
    let (y, m, day) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (h, min, sec) = (n(9..11)?, n(11..13)?, n(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || sec > 60 || y < 1970 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm, for years from 1970).
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era_day = 365 * y + y / 4 - y / 100 + y / 400 + (153 * m + 2) / 5 + day - 1;
    let days = era_day - 719_468;
    Some(days * 86_400 + h * 3600 + min * 60 + sec)
}

/// The request signed again, with `real` in place of the placeholders (`placeholder`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resigned {
    /// The new `Authorization`, and the session token header's new value (when it had one).
    Header { authorization: String, token: Option<String>, hex: String },
    /// The new query, the new signature last.
    Query { query: String, hex: String },
}

/// `head` (as it goes upstream) signed with `real`, the way `v` says the client signed it:
/// the key id and the session token the placeholders stood for, the signed headers that are
/// still there.
pub(crate) fn resign(
    head: &Head,
    sig: &Signature,
    v: &Variant,
    real: Creds,
    placeholder: Creds,
    now: u64,
) -> Result<Resigned, String> {
    let amz_date = amz_date(head, sig)?;
    // The path as it goes (a rule's spelling, perhaps): S3 reads it as it is sent.
    if !v.normalised && !canonical_path(head.path) {
        return Err("its path as it goes upstream is not in AWS's encoding".into());
    }
    let token_for = |sent: &str| match (placeholder.token, real.token) {
        (Some(p), Some(t)) if sent == p => Ok(t.to_string()),
        _ => Err("its session token is not this session's placeholder".to_string()),
    };
    match sig.form {
        Form::Header => {
            let names: Vec<String> = sig
                .signed
                .iter()
                .filter(|n| *n == "host" || head.headers.contains_key(n.as_str()))
                .cloned()
                .collect();
            let mut token = None;
            let headers = canonical_headers(head, &names, |name, value| {
                if name != "x-amz-security-token" {
                    return Ok(value.to_string());
                }
                let t = token_for(value)?;
                token = Some(t.clone());
                Ok(t)
            })?;
            let query = canonical_query(head.query, Form::Header)?;
            let list = names.join(";");
            let hex = sign(real.secret, &sig.scope, &amz_date, &canonical(head, v, &query, &headers, &list));
            let authorization = format!(
                "{ALGORITHM} Credential={}/{}, SignedHeaders={list}, Signature={hex}",
                real.key_id, sig.scope
            );
            Ok(Resigned::Header { authorization, token, hex })
        }
        Form::Query => {
            if sig.signed.iter().any(|n| n != "host" && !head.headers.contains_key(n.as_str())) {
                return Err("a header its presigned URL signs is not in the request".into());
            }
            // The query's auth parameters exactly as AWS spells them, each once: no other
            // spelling a service might read instead of the one the gate rewrote.
            let all = pairs(head.query);
            for name in QUERY_AUTH {
                let same = |k: &[u8]| k.eq_ignore_ascii_case(name.as_bytes());
                if all.iter().filter(|(k, _)| same(k)).count() > 1
                    || all.iter().any(|(k, _)| same(k) && k != name.as_bytes())
                {
                    return Err(format!("its query spells {name} twice or otherwise"));
                }
            }
            // The URL ends within the window, whatever was asked.
            let left = seconds(&amz_date).map_or(0, |at| (at + SKEW).saturating_sub(now));
            let mut kept = Vec::new();
            for (k, val) in all {
                let val = match k.as_slice() {
                    b"X-Amz-Signature" => continue,
                    b"X-Amz-Credential" => format!("{}/{}", real.key_id, sig.scope).into_bytes(),
                    b"X-Amz-Security-Token" => token_for(&String::from_utf8_lossy(&val))?.into_bytes(),
                    // A real presigned URL is good for AWS's window at most, whatever was asked.
                    b"X-Amz-Expires" => {
                        let asked = String::from_utf8_lossy(&val)
                            .parse::<u64>()
                            .map_err(|_| "its X-Amz-Expires is not a number")?;
                        asked.min(left).to_string().into_bytes()
                    }
                    _ => val,
                };
                kept.push(format!("{}={}", encode(&k, false), encode(&val, false)));
            }
            let query = kept.join("&");
            let headers = canonical_headers(head, &sig.signed, |_, v| Ok(v.to_string()))?;
            let cq = canonical_query(Some(&query), Form::Header)?;
            let hex = sign(
                real.secret,
                &sig.scope,
                &amz_date,
                &canonical(head, v, &cq, &headers, &sig.signed.join(";")),
            );
            Ok(Resigned::Query { query: format!("{query}&X-Amz-Signature={hex}"), hex })
        }
    }
}

fn amz_date(head: &Head, sig: &Signature) -> Result<String, String> {
    let d = match sig.form {
        Form::Query => sig.amz_date.clone(),
        Form::Header => match head.headers.get("x-amz-date") {
            Some(v) => v.to_str().map_err(|_| "its x-amz-date is not text")?.to_string(),
            None => return Err("it has no x-amz-date header (a Date header is not read)".into()),
        },
    };
    let ok = d.len() == 16
        && d.as_bytes()[8] == b'T'
        && d.ends_with('Z')
        && d.starts_with(sig.scope.get(..8).unwrap_or("-"));
    if !ok {
        return Err(format!("its date `{d}` is not YYYYMMDDTHHMMSSZ of its scope's day"));
    }
    Ok(d)
}

fn canonical(head: &Head, v: &Variant, query: &str, headers: &str, signed: &str) -> String {
    let path = match v.normalised {
        false if head.path.is_empty() => "/".to_string(),
        false => head.path.to_string(),
        true => encode(remove_dot_segments(head.path), true),
    };
    format!("{}\n{path}\n{query}\n{headers}\n{signed}\n{}", head.method, v.payload)
}

/// `name:value\n` for each signed header (`value` may change one: the session token).
fn canonical_headers(
    head: &Head,
    names: &[String],
    mut value: impl FnMut(&str, &str) -> Result<String, String>,
) -> Result<String, String> {
    let mut out = String::new();
    for name in names {
        let joined = if name == "host" {
            head.host.to_string()
        } else {
            let mut all = Vec::new();
            for v in head.headers.get_all(name.as_str()) {
                let text = v.to_str().map_err(|_| format!("its signed header {name} is not text"))?;
                all.push(text.split_ascii_whitespace().collect::<Vec<_>>().join(" "));
            }
            if all.is_empty() {
                return Err(format!("its signed header {name} is not in the request"));
            }
            all.join(",")
        };
        out += &format!("{name}:{}\n", value(name, &joined)?);
    }
    Ok(out)
}

/// The query's pairs, decoded (a key without `=` has an empty value).
fn pairs(query: Option<&str>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let decode = |s: &str| super::percent::decode(s.as_bytes());
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn canonical_query(query: Option<&str>, form: Form) -> Result<String, String> {
    // A `+` is a space to some readers and itself to others; a `%` not before two hex digits is
    // read differently too: neither is signed as the service would read it.
    if super::percent::read_two_ways(query.unwrap_or("")) {
        return Err(
            "its query holds a `+` or a `%` that is not an escape, which a service may read another way"
                .into(),
        );
    }
    let mut all: Vec<(String, String)> = pairs(query)
        .into_iter()
        .filter(|(k, _)| !(form == Form::Query && k == b"X-Amz-Signature"))
        .map(|(k, v)| (encode(&k, false), encode(&v, false)))
        .collect();
    all.sort();
    Ok(all.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&"))
}

/// RFC 3986's dot segments removed, and empty segments (AWS's canonical path, as botocore and
/// the services make it for every service but S3).
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let last = if path.ends_with('/') && !out.is_empty() { "/" } else { "" };
    format!("/{}{last}", out.join("/"))
}

fn sign(secret: &str, scope: &str, amz_date: &str, canonical: &str) -> String {
    let mac = |key: &[u8], data: &str| hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes());
    let mut key = mac(format!("AWS4{secret}").as_bytes(), scope.split('/').next().unwrap_or(""));
    for part in scope.split('/').skip(1) {
        key = mac(key.as_ref(), part);
    }
    let hashed = hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref());
    hex(mac(key.as_ref(), &format!("{ALGORITHM}\n{amz_date}\n{scope}\n{hashed}")).as_ref())
}

/// `s`'s bytes as spaced hex (`41 4b 49 41`): how S3's `SignatureDoesNotMatch` spells the
/// canonical request it read (`CanonicalRequestBytes`), credentials and all.
pub(crate) fn spaced_hex(s: &str, upper: bool) -> String {
    let each = s.bytes().map(|b| if upper { format!("{b:02X}") } else { format!("{b:02x}") });
    each.collect::<Vec<_>>().join(" ")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests;
