//! The request phases of one terminated request, in their order, each a function with a typed
//! outcome: the request's host → placeholders where their secret may not go → the host's rules
//! (asked) → a push's refs → the host's budget (asked); then, in `relay`, the placeholders
//! substituted (`upstream_parts`) and the decision's record (`record`). Every decision sees the
//! request as the agent sent it: no rule ever reads a real value. The policy is the
//! one `relay` read for the request.
//!
//! A phase that stops the request says how (`Stop`); `Conn::finish` counts, logs and answers
//! it, the one exit for a refusal before anything goes upstream.

use super::super::budget::Allowance;
use super::super::decide::{self, Denial, RuleMatch};
use super::super::pipeline::{self, Asked, Need};
use super::super::push;
use super::super::request_body::Ahead;
use super::super::scrub::{self, Masks};
use super::super::state::Entry;
use super::{Conn, drain, head_size};
use crate::contract::SessionPolicy;
use hyper::Request;
use hyper::body::Incoming;
use hyper::http::request::Parts;

/// How a phase ends a request before it goes upstream.
pub(super) enum Stop {
    /// Refused: counted, logged and answered with its hint.
    Denied(Box<Denial>),
    /// A refused push, answered in git's own words (`push::report`).
    InBand(Box<(Denial, Vec<u8>)>),
    /// The client broke its body off: answered 400, not a decision.
    Broken,
}

impl From<Denial> for Stop {
    fn from(d: Denial) -> Stop {
        Stop::Denied(Box::new(d))
    }
}

/// A request every phase let through, recorded as allowed, with what goes upstream.
pub(super) struct Admitted {
    pub(super) parts: Parts,
    pub(super) body: Incoming,
    /// The body's frames read before the decision (replayed in front of the rest).
    pub(super) ahead: Ahead,
    /// How many of `ahead`'s frames the phases scanned.
    pub(super) scanned: usize,
    /// The request's origin-form target, as decided (a rule's spelling).
    pub(super) target: String,
    /// The path the log has for it, and why it was allowed.
    pub(super) logged: String,
    pub(super) reason: String,
    pub(super) budget: Option<Allowance>,
    /// The body's declared length (a budget took it whole then).
    pub(super) declared: Option<u64>,
    pub(super) upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// The request phases, in order (see the module doc).
pub(super) async fn admit(
    c: &Conn,
    policy: &SessionPolicy,
    asked: &Asked<'_>,
    mut req: Request<Incoming>,
) -> Result<Admitted, Stop> {
    the_host(c, &req)?;
    unsubstituted(c, &req)?;
    // Origin-form upstream, whatever form the client used (its authority was checked).
    let target = req.uri().path_and_query().map_or_else(|| "/".to_string(), |pq| pq.as_str().to_string());
    let upgrade = req.headers().contains_key(hyper::header::UPGRADE).then(|| hyper::upgrade::on(&mut req));
    // The body's first frame (what a client sends in one go: a whole small body), read before
    // the decision; the rest is scanned as it streams (`Scanned`), so a client that sends its
    // body in pieces and waits for an answer is not held (ADR 0063).
    let (mut parts, mut body) = req.into_parts();
    let mut ahead = Ahead::default();
    ahead.one(&mut body).await.map_err(|()| Stop::Broken)?;
    if let Some(m) = c.secrets.misuse(&ahead.seen, Some(&c.host)) {
        return Err(Stop::from(c.misuse_denial(&m)));
    }
    let scanned = ahead.frames.len();
    let (target, logged, reason, refs) = match rules(c, policy, asked, &target).await? {
        None => (target, asked.path.unwrap_or("/").to_string(), "allowed".to_string(), None),
        Some(m) => {
            parts.method = hyper::Method::from_bytes(m.method.as_bytes())
                .map_err(|_| Stop::from(plain(400, "the method is not a token")))?;
            (m.target, m.path, format!("allowed by rule = {}", m.rule), m.refs)
        }
    };
    if let Some(patterns) = refs {
        pushed_refs(c, policy, &parts, &mut ahead, &mut body, &patterns, &logged).await?;
    }
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    // A budgeted host: the request's target and headers, and its body when its length is
    // declared, are taken whole before anything goes (else the body frame by frame: `Scanned`).
    let wanted = head_size(asked.method, &target, &parts.headers).saturating_add(declared.unwrap_or(0));
    let budget = match pipeline::budget(&c.state, &c.session, policy, asked, Need::Whole(wanted)).await {
        Ok(b) => b,
        Err(d) => {
            // The body is read and dropped here (never sent), so the client reads the refusal.
            drain(&ahead, &mut body).await;
            return Err(Stop::from(d));
        }
    };
    Ok(Admitted { parts, body, ahead, scanned, target, logged, reason, budget, declared, upgrade })
}

/// The last phase before anything goes upstream: the decision's record. Not on disk, not sent.
pub(super) async fn record(c: &Conn, asked: &Asked<'_>, a: &mut Admitted) -> Result<(), Stop> {
    let entry = Entry {
        path: Some(&a.logged),
        ..Entry::allowed(&c.session.id, asked.method, &c.host, c.port, &a.reason)
    };
    if let Err(unlogged) = c.state.log(entry) {
        drain(&a.ahead, &mut a.body).await;
        return Err(Stop::from(unlogged.denial()));
    }
    c.session.allowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

fn plain(status: u16, reason: &str) -> Denial {
    Denial { status, reason: reason.into(), ..Denial::default() }
}

/// The request's target must be this connection's host (`request::names_host`): else a CDN
/// fronting many names could route the real key to another one.
fn the_host(c: &Conn, req: &Request<Incoming>) -> Result<(), Stop> {
    let host_header = req.headers().get(hyper::header::HOST).map(|h| h.to_str().ok());
    let authority = req.uri().authority().map(|a| a.as_str());
    super::super::request::names_host(authority, host_header, &c.host, c.port).map_err(|why| {
        let hint = format!("ai-sandbox gate: {why}; the tunnel was opened to {}", c.host);
        Stop::from(Denial { status: 421, reason: why, hint, ..Denial::default() })
    })
}

/// A placeholder whose secret may not go to this host, in the target or a header: refused
/// before any decision reads the request.
fn unsubstituted(c: &Conn, req: &Request<Incoming>) -> Result<(), Stop> {
    let uri = req.uri().to_string();
    let values = std::iter::once(uri.as_bytes()).chain(req.headers().values().map(|v| v.as_bytes()));
    for v in values {
        if let Some(m) = c.secrets.misuse(v, Some(&c.host)) {
            return Err(Stop::from(c.misuse_denial(&m)));
        }
    }
    Ok(())
}

/// The host's rules, on the request's one spelling (what goes upstream is that spelling); a
/// refusal a watcher may lift is asked (`Conn::ask`).
async fn rules(
    c: &Conn,
    policy: &SessionPolicy,
    asked: &Asked<'_>,
    target: &str,
) -> Result<Option<RuleMatch>, Stop> {
    match decide::check_request(policy, &c.host, asked.method, target) {
        Err(d) if d.askable => c.ask(policy, asked, target, d).await,
        v => v,
    }
    .map_err(Stop::from)
}

/// A push limited by ref: its command list, read (up to `push::MOST`) before anything goes
/// upstream, and each ref it updates checked against `patterns`.
async fn pushed_refs(
    c: &Conn,
    policy: &SessionPolicy,
    parts: &Parts,
    ahead: &mut Ahead,
    body: &mut Incoming,
    patterns: &[String],
    logged: &str,
) -> Result<(), Stop> {
    let coded = parts.headers.get(hyper::header::CONTENT_ENCODING).is_some_and(|v| v != "identity");
    let cmds = loop {
        match push::commands(&ahead.seen) {
            _ if coded => break Err("it is compressed".to_string()),
            Ok(Some(cmds)) => break Ok(cmds),
            Ok(None) if ahead.ended => break Err("the body ended before its command list did".into()),
            Ok(None) if ahead.seen.len() >= push::MOST => {
                break Err("its command list is longer than 64 KiB".into());
            }
            Ok(None) => ahead.one(body).await.map_err(|()| Stop::Broken)?,
            Err(why) => break Err(why),
        }
    };
    let push = cmds.map_err(|why| Stop::from(push::unreadable(&why, logged)))?;
    let Err(r) = push::check(&push.cmds, patterns) else { return Ok(()) };
    let d = push::denial(&r, &c.host, logged, &policy.config_path);
    let Some(report) = push::report(&push, &r, &d.hint) else { return Err(Stop::from(d)) };
    // Read (and drop) what git is still sending, so that it reads the answer instead of a
    // reset; a pack larger than this gets the answer over a connection then closed.
    drain(ahead, body).await;
    Err(Stop::InBand(Box::new((d, report))))
}

/// The request as it goes upstream, after its record: the placeholders of this host's secrets
/// become their values (the masks learn each Basic token sent), whole resources are asked for
/// where a value could come back (`normalise`), and only codings the gate can read back are
/// accepted (`scrub::accept_encoding`, for the body and for gRPC's messages).
pub(super) fn upstream_parts(c: &Conn, parts: &mut Parts, masks: &mut Masks) -> Result<(), Denial> {
    for v in parts.headers.values_mut() {
        let real = c.secrets.substitute(v.as_bytes(), &c.host).map_err(|m| c.misuse_denial(&m))?;
        let Some(real) = real else { continue };
        let mut new = hyper::header::HeaderValue::from_bytes(&real)
            .map_err(|_| plain(400, "a substituted header is not a valid value"))?;
        if let (Some(sent), Some(shown)) = (scrub::basic_token(&real), scrub::basic_token(v.as_bytes())) {
            masks.add(sent, shown, "the Basic credentials");
        }
        new.set_sensitive(true);
        *v = new;
    }
    super::super::normalise::request(&mut parts.headers, !masks.is_empty());
    for name in
        [hyper::header::ACCEPT_ENCODING, hyper::header::HeaderName::from_static("grpc-accept-encoding")]
    {
        if let Some(ae) = parts.headers.get(&name) {
            let kept = scrub::accept_encoding(ae.to_str().unwrap_or(""));
            if let Ok(v) = hyper::header::HeaderValue::from_str(&kept) {
                parts.headers.insert(name, v);
            }
        }
    }
    Ok(())
}
