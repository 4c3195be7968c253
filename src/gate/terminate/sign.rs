//! A request to a host `secret = aws` is bound to, signed again by the gate (ADR 0088): after
//! every request phase let it through and before its record, a request that the sandbox's client
//! signed with the placeholder key id is checked against the placeholder secret (the request as
//! the client sent it, `AsSent`) and signed with the real credentials as it goes upstream. Its
//! body is read whole first when the signature covers the body's hash (the client sent no
//! `x-amz-content-sha256`, and it is not a presigned S3 URL): at most `MAX`. A request signed
//! with another key id goes as it is. The pure part is `sigv4`.

use super::super::decide::Denial;
use super::super::percent::encode;
use super::super::scrub::Masks;
use super::super::sigv4::{self, Head, Resigned};
use super::super::state::McpHeld;
use super::Conn;
use super::admit::Admitted;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, HOST, HeaderValue};

/// A signed body larger than this is refused (the gate holds it whole to hash it).
const MAX: usize = 16 << 20;

/// The request as the client sent it (what its signature covers), before any phase changed it.
pub(super) struct AsSent {
    method: String,
    path: String,
    query: Option<String>,
    headers: hyper::HeaderMap,
    host: String,
}

impl AsSent {
    /// `None` when no AWS credentials are bound to the connection's host.
    pub(super) fn of<B>(c: &Conn, req: &hyper::Request<B>) -> Option<AsSent> {
        c.secrets.aws(&c.host)?;
        let host = match req.headers().get(HOST) {
            Some(h) => h.to_str().unwrap_or("").to_string(),
            None => req.uri().authority().map_or_else(String::new, |a| a.to_string()),
        };
        Some(AsSent {
            method: req.method().as_str().to_string(),
            path: req.uri().path().to_string(),
            query: req.uri().query().map(String::from),
            headers: req.headers().clone(),
            host,
        })
    }

    fn head(&self) -> Head<'_> {
        Head {
            method: &self.method,
            path: &self.path,
            query: self.query.as_deref(),
            headers: &self.headers,
            host: &self.host,
        }
    }
}

pub(super) async fn resign(
    c: &Conn,
    sent: Option<&AsSent>,
    a: &mut Admitted<Incoming>,
    masks: &mut Masks,
) -> Result<(), Denial> {
    let (Some(sent), Some(held)) = (sent, c.secrets.aws(&c.host)) else { return Ok(()) };
    let creds = |of: for<'a> fn((&'a str, &'a str)) -> &'a str| sigv4::Creds {
        key_id: of(held.key_id),
        secret: of(held.secret),
        token: held.token.map(of),
    };
    let (placeholder, real) = (creds(|p| p.0), creds(|p| p.1));
    let refused = |status: u16, why: String| {
        let reason = format!("a request to {} signed for AWS is refused: {why}", c.host);
        Denial { status, hint: format!("ai-sandbox gate: {reason}"), reason, ..Denial::default() }
    };
    let head = sent.head();
    let sig = match sigv4::parse(&head) {
        Ok(Some(sig)) if sig.key_id == placeholder.key_id => sig,
        // Not signed, or with a key the gate does not hold: it goes as it is.
        Ok(_) => return Ok(()),
        Err(why) => return Err(refused(400, why)),
    };
    // The body's hash, when the signature covers it: the body read whole first (not for a
    // presigned S3 URL, whose payload is unsigned: a presigned upload streams).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let hash = match sigv4::needs_body(&head, &sig) {
        true => Some(whole(c, a).await.map_err(|(status, why)| refused(status, why))?),
        false => None,
    };
    let v = sigv4::verify(&head, &sig, placeholder.secret, hash.as_deref(), now)
        .map_err(|why| refused(403, why))?;
    // As it goes upstream: its path and query now, and the authority `proto::for_upstream` sends.
    let (path, query) = match a.target.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (a.target.clone(), None),
    };
    let host = match c.port {
        443 => c.host.clone(),
        p => format!("{}:{p}", c.host),
    };
    let method = a.parts.method.as_str().to_string();
    let up = Head {
        method: &method,
        path: &path,
        query: query.as_deref(),
        headers: &a.parts.headers,
        host: &host,
    };
    let signed = sigv4::resign(&up, &sig, &v, real, placeholder, now).map_err(|why| refused(403, why))?;
    let value = |s: &str| {
        let mut v = HeaderValue::from_str(s)
            .map_err(|_| refused(400, "a signed value is not a header value".into()))?;
        v.set_sensitive(true);
        Ok::<_, Denial>(v)
    };
    let hex = match signed {
        Resigned::Header { authorization, token, hex } => {
            a.parts.headers.insert(AUTHORIZATION, value(&authorization)?);
            if let Some(t) = token {
                a.parts.headers.insert("x-amz-security-token", value(&t)?);
            }
            hex
        }
        Resigned::Query { query, hex } => {
            a.target = format!("{path}?{query}");
            hex
        }
    };
    // A server that echoes the request does not hand the agent a signature of the real key,
    // nor (S3's answer to a signature it reads otherwise) the canonical request's bytes.
    masks.add(hex.as_bytes(), sig.hex.as_bytes(), "the AWS signature");
    // As sent in a header, and as a query parameter (AWS-encoded), in either case of hex.
    let pairs = [(real.key_id, placeholder.key_id)].into_iter().chain(real.token.zip(placeholder.token));
    let spelled =
        pairs.flat_map(|(v, p)| [(v.to_string(), p.to_string()), (encode(v, false), encode(p, false))]);
    for ((value, shown), upper) in spelled.flat_map(|p| [(p.clone(), false), (p, true)]) {
        let (value, shown) = (sigv4::spaced_hex(&value, upper), sigv4::spaced_hex(&shown, upper));
        masks.add(value.as_bytes(), shown.as_bytes(), "the AWS credentials");
    }
    a.reason = format!("{}; signed by the gate with your AWS credentials", a.reason);
    Ok(())
}

/// The body's hash, the body read whole (it stays in the request's frames, to stream and be
/// counted as any). What a sandbox's signed bodies and MCP messages hold at once is bounded
/// together (`McpHeld`: the agent chooses how many it sends at once), from the read until the
/// request is sent (`Admitted::held`).
async fn whole(c: &Conn, a: &mut Admitted<Incoming>) -> Result<String, (u16, String)> {
    let mut held = McpHeld::new(&c.session);
    loop {
        if a.ahead.seen.len() > MAX {
            let why = format!("its body is over {} MiB, and the gate hashes a signed body whole", MAX >> 20);
            return Err((413, why));
        }
        // Its frames and their bytes (`seen`).
        held.set(a.ahead.seen.len().saturating_mul(2)).map_err(|_| {
            let why = format!(
                "the bodies the gate holds for this sandbox at once would pass {} MiB; send it again when its other \
                 requests are answered",
                McpHeld::MOST >> 20
            );
            (503, why)
        })?;
        if a.ahead.ended {
            break;
        }
        a.ahead.one(&mut a.body).await.map_err(|()| (400, "its body broke off".to_string()))?;
    }
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    for data in a.ahead.frames.iter().filter_map(|f| f.data_ref()) {
        hash.update(data);
    }
    a.held = Some(held);
    Ok(sigv4::body_hash(hash.finish()))
}
