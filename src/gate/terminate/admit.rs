//! The request phases of one terminated request, in their order, each a function with a typed
//! outcome: the request's host → placeholders where their secret may not go → the host's rules
//! (asked) → a push's refs → the host's budget (asked); then, in `relay`, the placeholders
//! substituted (`upstream_parts`) and the decision's record (`record`). Every decision sees the
//! request as the agent sent it: no rule ever reads a real value. The policy is the
//! one `relay` read for the request.
//!
//! A phase that stops the request says how (`Stop`); `Conn::finish` counts, logs and answers
//! it, the one exit for a refusal before anything goes upstream.

use super::super::ask::Verdict;
use super::super::budget::Allowance;
use super::super::decide::{self, Denial, RuleMatch};
use super::super::mcp;
use super::super::pipeline::{self, Asked, Need};
use super::super::push;
use super::super::request_body::Ahead;
use super::super::scrub::{self, Masks};
use super::super::state::{Entry, McpHeld};
use super::super::view::{Framing, View};
use super::{Conn, drain};
use crate::contract::SessionPolicy;
use hyper::Request;
use hyper::body::{Body, Bytes, Incoming};
use hyper::http::request::Parts;

/// How a phase ends a request before it goes upstream.
pub(super) enum Stop {
    /// Refused: counted, logged and answered with its hint.
    Denied(Box<Denial>),
    /// Refused, answered in the protocol's own words with that body and content type: a push
    /// (`push::report`), an MCP call (`mcp::Calls::refusal`).
    InBand(Box<(Denial, Vec<u8>, &'static str)>),
    /// The client broke its body off: answered 400, not a decision.
    Broken,
}

impl From<Denial> for Stop {
    fn from(d: Denial) -> Stop {
        Stop::Denied(Box::new(d))
    }
}

/// A request every phase let through, with what goes upstream. `B`: its body (hyper's
/// `Incoming` from a client; any body in the tests).
pub(super) struct Admitted<B = Incoming> {
    pub(super) parts: Parts,
    pub(super) body: B,
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
    /// What the budget phase took of `budget` (given back if the request is refused after it).
    pub(super) taken: u64,
    /// The body's declared length (a budget took it whole then).
    pub(super) declared: Option<u64>,
    pub(super) upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// An MCP endpoint's allowed tools: its answers are filtered to them (`mcp`).
    pub(super) tools: Option<Vec<String>>,
    /// A learning run's call of a tool no rule allows, relayed: the line that would allow it
    /// (the record marks it learned; `ai-sandbox learn` proposes it).
    pub(super) learned: Option<String>,
    /// What the body read whole holds of the sandbox's bytes held at once, until it is sent
    /// (an AWS-signed body: `sign`).
    pub(super) held: Option<McpHeld>,
}

/// The request phases, in order (see the module doc).
pub(super) async fn admit<B: Body<Data = Bytes> + Unpin>(
    c: &Conn,
    policy: &SessionPolicy,
    asked: &Asked<'_>,
    mut req: Request<B>,
) -> Result<Admitted<B>, Stop> {
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
    let view = View {
        method: parts.method.as_str(),
        host: &c.host,
        target: &target,
        headers: &parts.headers,
        body: Framing::of(&parts.headers),
    };
    // A budgeted host: the request's target and headers, and its body when its length is
    // declared, are taken whole before anything goes (else the body frame by frame: `Scanned`),
    // counted as the agent sent them.
    let declared = view.body.declared();
    let wanted = view.head_size().saturating_add(declared.unwrap_or(0));
    let (target, logged, mut reason, refs, tools) = match rules(c, policy, asked, &view).await? {
        None => (target, asked.path.unwrap_or("/").to_string(), "allowed".to_string(), None, None),
        Some(m) => {
            parts.method = hyper::Method::from_bytes(m.method.as_bytes())
                .map_err(|_| Stop::from(plain(400, "the method is not a token")))?;
            (m.target, m.path, format!("allowed by rule = {}", m.rule), m.refs, m.tools)
        }
    };
    if let Some(patterns) = refs {
        pushed_refs(c, policy, &parts, &mut ahead, &mut body, &patterns, &logged).await?;
    }
    let mut learned = None;
    if let Some(patterns) = &tools {
        let called = mcp_calls(c, policy, asked, &parts, &mut ahead, &mut body, patterns, &logged).await?;
        for tool in &called.tools {
            c.session.mcp.add(&c.host, tool, true);
        }
        if !called.tools.is_empty() {
            reason = format!("{reason}; MCP tools/call {}", called.tools.join(", "));
        }
        if let Some(line) = called.learned {
            reason = format!(
                "learned: {line} is not in the config; relayed because this is a learning run ({reason})"
            );
            learned = Some(line);
        }
    }
    let budget = match pipeline::budget(&c.state, &c.session, policy, asked, Need::Whole(wanted)).await {
        Ok(b) => b,
        Err(d) => {
            // The body is read and dropped here (never sent), so the client reads the refusal.
            drain(&ahead, &mut body).await;
            return Err(Stop::from(d));
        }
    };
    let taken = if budget.is_some() { wanted } else { 0 };
    Ok(Admitted {
        parts,
        body,
        ahead,
        scanned,
        target,
        logged,
        reason,
        budget,
        taken,
        declared,
        upgrade,
        tools,
        learned,
        held: None,
    })
}

/// The last phase before anything goes upstream: the decision's record. Not on disk, not sent.
pub(super) async fn record<B: Body<Data = Bytes> + Unpin>(
    c: &Conn,
    asked: &Asked<'_>,
    a: &mut Admitted<B>,
) -> Result<(), Stop> {
    let entry = Entry {
        path: Some(&a.logged),
        learned: a.learned.is_some(),
        allow: a.learned.as_deref(),
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
fn the_host<B>(c: &Conn, req: &Request<B>) -> Result<(), Stop> {
    // Two Host headers: a server could route on either (the upstream gets one, in one spelling,
    // anyway: `proto::for_upstream`).
    if req.headers().get_all(hyper::header::HOST).iter().nth(1).is_some() {
        let why = "the request has two Host headers".to_string();
        let hint = format!("ai-sandbox gate: {why}");
        return Err(Stop::from(Denial { status: 400, reason: why, hint, ..Denial::default() }));
    }
    let host_header = req.headers().get(hyper::header::HOST).map(|h| h.to_str().ok());
    let authority = req.uri().authority().map(|a| a.as_str());
    super::super::request::names_host(authority, host_header, &c.host, c.port).map_err(|why| {
        let hint = format!("ai-sandbox gate: {why}; the tunnel was opened to {}", c.host);
        Stop::from(Denial { status: 421, reason: why, hint, ..Denial::default() })
    })
}

/// A placeholder whose secret may not go to this host, in the target or a header: refused
/// before any decision reads the request.
fn unsubstituted<B>(c: &Conn, req: &Request<B>) -> Result<(), Stop> {
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
    view: &View<'_>,
) -> Result<Option<RuleMatch>, Stop> {
    match decide::check_request(policy, view) {
        Err(d) if d.askable => c.ask(policy, asked, view, d).await,
        v => v,
    }
    .map_err(Stop::from)
}

/// A push limited by ref: its command list, read (up to `push::MOST`) before anything goes
/// upstream, and each ref it updates checked against `patterns`.
async fn pushed_refs<B: Body<Data = Bytes> + Unpin>(
    c: &Conn,
    policy: &SessionPolicy,
    parts: &Parts,
    ahead: &mut Ahead,
    body: &mut B,
    patterns: &[String],
    logged: &str,
) -> Result<(), Stop> {
    let coded = coded(&parts.headers);
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
    Err(Stop::InBand(Box::new((d, report, "application/x-git-receive-pack-result"))))
}

/// Whether any `Content-Encoding` field of `headers` names a coding (not `identity`).
fn coded(headers: &hyper::HeaderMap) -> bool {
    headers.get_all(hyper::header::CONTENT_ENCODING).iter().any(|v| v != "identity")
}

/// What an MCP message called: its tools (for the log), and in a learning run the line that
/// would allow the one no rule allows (it was relayed).
struct Called {
    tools: Vec<String>,
    learned: Option<String>,
}

/// An MCP endpoint's message (`rule = HOST mcp PATH TOOL...`): its whole body, up to
/// `mcp::BODY_MOST`, read before anything goes upstream, and each `tools/call` checked against
/// `patterns`. A refusal is asked of a watcher, then answered as JSON-RPC errors the client reads
/// (the line to add in the refused call's); a learning run relays the call instead, as it does
/// an unlisted host, and `learn` proposes the line. What cannot be read is refused.
#[allow(clippy::too_many_arguments)]
async fn mcp_calls<B: Body<Data = Bytes> + Unpin>(
    c: &Conn,
    policy: &SessionPolicy,
    asked: &Asked<'_>,
    parts: &Parts,
    ahead: &mut Ahead,
    body: &mut B,
    patterns: &[String],
    logged: &str,
) -> Result<Called, Stop> {
    let unreadable = |why: &str| {
        let reason = format!("an MCP message to {} {logged} that the gate cannot read: {why}", c.host);
        Stop::from(Denial {
            status: 400,
            hint: format!("blocked by ai-sandbox: {reason}"),
            reason,
            ..Denial::default()
        })
    };
    // What would let a server read the request otherwise than the gate: another protocol (a
    // WebSocket's frames are not read as messages), another method than the one sent.
    if parts.headers.contains_key(hyper::header::UPGRADE) {
        return Err(unreadable("it asks to switch protocols"));
    }
    for h in ["x-http-method-override", "x-method-override", "x-http-method"] {
        if parts.headers.contains_key(h) {
            return Err(unreadable(&format!("it carries {h}")));
        }
    }
    match parts.method.as_str() {
        "POST" => {}
        // The server's stream and the session's end: no message, so no body.
        "GET" | "DELETE" if ahead.ended && ahead.seen.is_empty() => {
            return Ok(Called { tools: Vec::new(), learned: None });
        }
        "GET" | "DELETE" => return Err(unreadable(&format!("a {} with a body", parts.method))),
        m => return Err(unreadable(&format!("{m} is not a method of MCP's streamable HTTP"))),
    }
    if coded(&parts.headers) {
        return Err(unreadable("it is compressed"));
    }
    let types: Vec<_> = parts.headers.get_all(hyper::header::CONTENT_TYPE).iter().collect();
    if !matches!(types[..], [t] if mcp::json_type(t.as_bytes())) {
        return Err(unreadable("it is not application/json in UTF-8 (one Content-Type, no other parameter)"));
    }
    let mut held = McpHeld::new(&c.session);
    loop {
        if ahead.seen.len() > mcp::BODY_MOST {
            return Err(unreadable("it is longer than 1 MiB"));
        }
        // Its frames and their bytes: each kept until the request goes.
        held.set(ahead.seen.len().saturating_mul(2)).map_err(|why| {
            let reason = format!("an MCP message to {} {logged}: {why}", c.host);
            Stop::from(Denial {
                status: 503,
                hint: format!(
                    "blocked by ai-sandbox: {reason}; send it again when its other MCP messages are answered"
                ),
                reason,
                ..Denial::default()
            })
        })?;
        if ahead.ended {
            break;
        }
        ahead.one(body).await.map_err(|()| Stop::Broken)?;
    }
    let calls = mcp::read(&ahead.seen).map_err(|why| unreadable(&why))?;
    let tools = calls.tools().into_iter().map(str::to_string).collect();
    let Some(tool) = calls.refused(patterns) else { return Ok(Called { tools, learned: None }) };
    let shown = crate::sys::quote::text(tool);
    let reason = format!("MCP tools/call {shown} matches no rule for {} {logged}", c.host);
    // A name a rule line would read as more than itself (a space, a `*`, a line break), or a
    // path with a `*` (a pattern in the line), is refused with no line to add: never offered to a
    // watcher, never learned.
    if !crate::policy::rule::is_tool_name(tool) || !crate::policy::rule::line_can_name(logged) {
        c.session.mcp.add(&c.host, tool, false);
        let hint = format!(
            "blocked by ai-sandbox: {reason}, and no rule line can name the tool {shown} at that path"
        );
        return Err(Stop::from(Denial {
            status: 403,
            reason,
            hint,
            path: Some(logged.to_string()),
            ..Denial::default()
        }));
    }
    let line = format!("rule = {} mcp {logged} {tool}", c.host);
    if policy.learn {
        return Ok(Called { tools, learned: Some(line) });
    }
    let called = Called { tools, learned: None };
    let d = Denial {
        status: 403,
        reason,
        hint: format!(
            "blocked by ai-sandbox: add \"{line}\" to {} (the MCP rules of {} {logged} do not allow the tool {tool})",
            policy.config_path, c.host
        ),
        allow: Some(line),
        askable: true,
        path: Some(logged.to_string()),
    };
    match pipeline::ask(&c.state, &c.session, policy, asked, &d).await {
        // Once: this tool, in this body. Another refused tool in the same batch stays refused.
        Some(Verdict::Once) => {
            if calls.refused_besides(patterns, tool).is_none() {
                return Ok(called);
            }
        }
        // The watcher's live change: the call is decided again under the policy it made.
        Some(Verdict::Allowed) => {
            let now = c.session.policy();
            let normal = crate::policy::url_path::normalise(logged).map_err(|_| Stop::from(d.clone()))?;
            if crate::policy::rule::mcp_tools(&now.rules, &c.host, &normal)
                .is_some_and(|p| calls.refused(&p).is_none())
            {
                return Ok(called);
            }
        }
        Some(Verdict::Deny) | None => {}
    }
    c.session.mcp.add(&c.host, tool, false);
    match calls.refusal(tool, &d.hint) {
        Some(answer) => Err(Stop::InBand(Box::new((d, answer, "application/json")))),
        None => Err(Stop::from(d)),
    }
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

#[cfg(test)]
mod tests {
    use super::super::super::log::Log;
    use super::super::super::secrets::Secrets;
    use super::super::super::state::{Session, State};
    use super::*;
    use crate::contract::session::Bound;
    use http_body_util::Full;
    use std::sync::Arc;

    const KEY: &str = "aisb_placeholder_0123456789abcdef";
    const OTHER: &str = "aisb_placeholder_fedcba9876543210";

    /// A terminated connection to `api.test:443` of a session with `policy`, a key bound to
    /// it and another bound elsewhere, logging to `log`. Nothing is dialled: no phase here may.
    fn conn(policy: SessionPolicy, log: Log) -> Conn {
        let sock = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let state = Arc::new(State::new(0, std::os::fd::OwnedFd::from(sock), log));
        let bound = vec![
            Bound::new("KEY", KEY, "real-key", &["api.test"]),
            Bound::new("OTHER", OTHER, "real-other", &["else.test"]),
        ];
        let session = Arc::new(Session::new("s1".into(), "/p".into(), "t".into(), policy));
        assert!(state.register(session.clone()));
        let secrets = Secrets::new(bound);
        Conn {
            state,
            session,
            masks: std::sync::Mutex::new((0, secrets.masks("api.test"))),
            secrets,
            host: "api.test".into(),
            port: 443,
            // Unroutable by construction: a phase that dialled would fail the test, not reach out.
            addr: "127.0.0.1:9".parse().unwrap(),
            upstream: super::super::super::ca::upstream_config(None).unwrap(),
            sender: tokio::sync::Mutex::new(None),
            failed: None,
        }
    }

    fn log_in(dir: &tempfile::TempDir) -> Log {
        Log::open(&dir.path().join("gate.log")).unwrap()
    }

    fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Request<Full<Bytes>> {
        let mut b = Request::builder().method(method).uri(path).header("host", "api.test");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Full::new(Bytes::from(body.to_string()))).unwrap()
    }

    fn ruled(lines: &str) -> SessionPolicy {
        SessionPolicy { rules: crate::policy::rule::parse(lines).unwrap(), ..SessionPolicy::default() }
    }

    async fn run(c: &Conn, req: Request<Full<Bytes>>) -> Result<Admitted<Full<Bytes>>, Stop> {
        let policy = c.session.policy();
        let (method, path) = (req.method().to_string(), req.uri().path().to_string());
        let asked = Asked { method: &method, host: &c.host, port: c.port, path: Some(&path) };
        admit(c, &policy, &asked, req).await
    }

    fn denied(r: Result<Admitted<Full<Bytes>>, Stop>) -> Denial {
        match r {
            Err(Stop::Denied(d)) => *d,
            Err(Stop::InBand(_)) => panic!("answered in band"),
            Err(Stop::Broken) => panic!("broken"),
            Ok(a) => panic!("admitted {}", a.target),
        }
    }

    /// The rules decide on the request as the agent sent it: after every phase the headers
    /// still hold the placeholder, and only `upstream_parts` (after the decisions) puts the
    /// value in. A refused request stops before any of that.
    #[tokio::test]
    async fn the_decisions_see_placeholders_and_only_what_goes_upstream_holds_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let c = conn(ruled("api.test GET /v1/*"), log_in(&dir));
        let auth = format!("Bearer {KEY}");
        let mut a = run(&c, request("GET", "/v1/x", &[("authorization", &auth)], ""))
            .await
            .unwrap_or_else(|_| panic!("refused"));
        assert_eq!(a.parts.headers["authorization"], auth.as_str(), "no phase substitutes");
        assert_eq!((a.target.as_str(), a.reason.as_str()), ("/v1/x", "allowed by rule = api.test GET /v1/*"));
        let mut masks = c.secrets.masks(&c.host);
        upstream_parts(&c, &mut a.parts, &mut masks).unwrap();
        assert_eq!(a.parts.headers["authorization"], "Bearer real-key");
        // The control's twin, refused by the rules: stopped with the line to add.
        let d = denied(run(&c, request("POST", "/v1/x", &[("authorization", &auth)], "")).await);
        assert_eq!(d.status, 403);
        assert!(d.hint.contains("rule = api.test POST /v1/x"), "{}", d.hint);
    }

    /// A placeholder of a secret bound to another host is refused before the rules are read,
    /// in the target, in a header, and in the body's first frame; the host's own goes on.
    #[tokio::test]
    async fn a_placeholder_bound_elsewhere_stops_the_request_before_any_decision() {
        let dir = tempfile::tempdir().unwrap();
        // The rules would refuse all three: a stop by the rules would say so instead.
        let c = conn(ruled("api.test GET /only"), log_in(&dir));
        for req in [
            request("POST", &format!("/x?k={OTHER}"), &[], ""),
            request("POST", "/x", &[("x-key", OTHER)], ""),
            request("POST", "/x", &[], &format!("{{\"k\":\"{OTHER}\"}}")),
        ] {
            let d = denied(run(&c, req).await);
            assert!(d.reason.contains("OTHER"), "{d:?}");
            assert_eq!(d.status, 403);
        }
        let c = conn(SessionPolicy::default(), log_in(&dir));
        assert!(
            run(&c, request("POST", "/x", &[("x-key", KEY)], "")).await.is_ok(),
            "the host's own placeholder"
        );
    }

    /// The host a request names must be the connection's: a CDN's other name is refused (421),
    /// and so is a second Host header (400).
    #[tokio::test]
    async fn a_request_for_another_host_on_the_connection_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let c = conn(SessionPolicy::default(), log_in(&dir));
        let mut req = request("GET", "/", &[], "");
        req.headers_mut().insert("host", "other.test".parse().unwrap());
        let d = denied(run(&c, req).await);
        assert_eq!((d.status, d.reason.as_str()), (421, "the Host header names other.test, not api.test"));
        assert_eq!(
            d.hint,
            "ai-sandbox gate: the Host header names other.test, not api.test; the tunnel was opened to api.test"
        );
        let mut two = request("GET", "/", &[], "");
        two.headers_mut().append("host", "other.test".parse().unwrap());
        let d = denied(run(&c, two).await);
        assert_eq!((d.status, d.reason.as_str()), (400, "the request has two Host headers"));
        assert_eq!(d.hint, "ai-sandbox gate: the request has two Host headers");
        assert!(run(&c, request("GET", "/", &[], "")).await.is_ok());
    }

    /// A budget takes the head and the declared body whole, or refuses (no watcher: not asked).
    #[tokio::test]
    async fn a_request_over_its_hosts_budget_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let policy = SessionPolicy {
            budgets: vec![crate::policy::budget::host_line("api.test 1k")],
            ..SessionPolicy::default()
        };
        let c = conn(policy, log_in(&dir));
        let small = request("POST", "/up", &[("content-length", "100")], &"x".repeat(100));
        let a = run(&c, small).await.unwrap_or_else(|_| panic!("refused"));
        assert!(a.budget.as_ref().is_some_and(|b| b.left() < 1024 - 100), "taken with its head");
        let big = request("POST", "/up", &[("content-length", "2000")], &"x".repeat(2000));
        let d = denied(run(&c, big).await);
        assert!(d.hint.contains("budget = api.test"), "{}", d.hint);
    }

    /// No decision without its record: a log that cannot be written (a full disk) refuses the
    /// request the phases admitted; one that can lets it go, counted.
    #[tokio::test]
    async fn an_admitted_request_whose_record_fails_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (log, written) in
            [(log_in(&dir), true), (Log::open(std::path::Path::new("/dev/full")).unwrap(), false)]
        {
            let c = conn(SessionPolicy::default(), log);
            let asked = Asked { method: "GET", host: "api.test", port: 443, path: Some("/") };
            let mut a = run(&c, request("GET", "/", &[], "")).await.unwrap_or_else(|_| panic!("refused"));
            let r = record(&c, &asked, &mut a).await;
            let allowed = c.session.allowed.load(std::sync::atomic::Ordering::Relaxed);
            match r {
                Ok(()) => {
                    assert!(written && allowed == 1);
                    let line = std::fs::read_to_string(dir.path().join("gate.log")).unwrap();
                    assert!(
                        line.contains(r#""path":"/""#) && line.contains(r#""decision":"allow""#),
                        "{line}"
                    );
                }
                Err(Stop::Denied(d)) => assert!(!written && d.status == 503 && allowed == 0, "{d:?}"),
                Err(_) => panic!("not a refusal"),
            }
        }
    }

    /// A learning run relays a call of a tool no rule allows, and its record says so: learned,
    /// with the line `learn` proposes. Control: an allowed call's record is neither.
    #[tokio::test]
    async fn a_learning_runs_relayed_mcp_call_is_recorded_learned_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let c = conn(SessionPolicy { learn: true, ..ruled("api.test mcp /mcp search_*") }, log_in(&dir));
        let json = [("content-type", "application/json")];
        let call = |tool: &str| {
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}"}}}}"#)
        };
        let asked = Asked { method: "POST", host: "api.test", port: 443, path: Some("/mcp") };
        let lines = || std::fs::read_to_string(dir.path().join("gate.log")).unwrap();
        let mut a = run(&c, request("POST", "/mcp", &json, &call("search_x")))
            .await
            .unwrap_or_else(|_| panic!("refused"));
        record(&c, &asked, &mut a).await.unwrap_or_else(|_| panic!("not recorded"));
        assert!(!lines().contains("learned") && !lines().contains(r#""allow":"#), "{}", lines());
        let mut a = run(&c, request("POST", "/mcp", &json, &call("delete_x")))
            .await
            .unwrap_or_else(|_| panic!("refused"));
        record(&c, &asked, &mut a).await.unwrap_or_else(|_| panic!("not recorded"));
        let last = lines().lines().last().unwrap().to_string();
        assert!(last.contains(r#""learned":true"#), "{last}");
        assert!(last.contains(r#""allow":"rule = api.test mcp /mcp delete_x""#), "{last}");
    }

    /// A host with a bound value is asked for whole resources (a part could split a value the
    /// masks must find whole); a terminated host without one gets the request as it was.
    #[tokio::test]
    async fn a_range_goes_only_where_no_value_is_bound() {
        let dir = tempfile::tempdir().unwrap();
        for bound in [true, false] {
            let mut c = conn(SessionPolicy::default(), log_in(&dir));
            if !bound {
                c.secrets = Secrets::new(vec![]);
            }
            let mut a = run(&c, request("GET", "/", &[("range", "bytes=0-9")], ""))
                .await
                .unwrap_or_else(|_| panic!("refused"));
            let mut masks = c.secrets.masks(&c.host);
            upstream_parts(&c, &mut a.parts, &mut masks).unwrap();
            assert_eq!(a.parts.headers.contains_key("range"), !bound, "bound: {bound}");
        }
    }

    /// A bound value that cannot be a header value (a line break in it) is refused when it
    /// would be put in, not sent broken.
    #[tokio::test]
    async fn a_value_that_cannot_go_in_a_header_is_refused_with_why() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = conn(SessionPolicy::default(), log_in(&dir));
        c.secrets = Secrets::new(vec![Bound::new("KEY", KEY, "real\nkey", &["api.test"])]);
        let auth = format!("Bearer {KEY}");
        let mut a = run(&c, request("GET", "/", &[("authorization", &auth)], ""))
            .await
            .unwrap_or_else(|_| panic!("refused"));
        let mut masks = c.secrets.masks(&c.host);
        let d = upstream_parts(&c, &mut a.parts, &mut masks).unwrap_err();
        assert_eq!((d.status, d.reason.as_str()), (400, "a substituted header is not a valid value"));
    }

    /// An MCP endpoint: a call of an allowed tool goes (the log's reason names it), one of a tool
    /// no rule allows is answered with JSON-RPC errors carrying the line (nothing dialled), and
    /// a body the gate cannot read is refused; `tools/list` and a GET stream go.
    #[tokio::test]
    async fn an_mcp_call_is_decided_by_its_tool_and_what_cannot_be_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let c = conn(ruled("api.test mcp /mcp search_*"), log_in(&dir));
        let json = [("content-type", "application/json")];
        let call = |tool: &str| {
            format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}"}}}}"#)
        };
        let a = run(&c, request("POST", "/mcp", &json, &call("search_issues")))
            .await
            .unwrap_or_else(|_| panic!("refused"));
        assert!(a.reason.ends_with("MCP tools/call search_issues"), "{}", a.reason);
        assert_eq!(a.tools, Some(vec!["search_*".to_string()]));
        let Err(Stop::InBand(answer)) =
            run(&c, request("POST", "/mcp", &json, &call("delete_repository"))).await
        else {
            panic!("not answered in band")
        };
        let (d, body, kind) = *answer;
        assert_eq!((d.status, d.askable, kind), (403, true, "application/json"));
        assert_eq!(d.allow.as_deref(), Some("rule = api.test mcp /mcp delete_repository"));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((v["id"].as_i64(), v["error"]["code"].as_i64()), (Some(7), Some(mcp::REFUSED)));
        assert!(
            v["error"]["message"].as_str().unwrap().contains("rule = api.test mcp /mcp delete_repository")
        );
        let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        assert!(run(&c, request("POST", "/mcp", &json, list)).await.is_ok());
        assert!(run(&c, request("GET", "/mcp", &[("accept", "text/event-stream")], "")).await.is_ok());
        // A name a rule line would read as more than itself: refused, with no line to add. So is
        // a call at a path with a `*`, which a line would read as a pattern (a lenient server's
        // path below the endpoint, allowed by another rule). Control: a name of 128 bytes.
        let d = denied(run(&c, request("POST", "/mcp", &json, &call("x *"))).await);
        assert_eq!((d.status, d.allow.clone(), d.askable), (403, None, false), "{d:?}");
        assert_eq!(d.reason, "MCP tools/call x * matches no rule for api.test /mcp");
        assert_eq!(
            d.hint,
            "blocked by ai-sandbox: MCP tools/call x * matches no rule for api.test /mcp, and no rule line can name the tool x * at that path"
        );
        assert_eq!(d.path.as_deref(), Some("/mcp"));
        let mut below = ruled("api.test mcp /mcp search_*");
        below.rules.extend(crate::policy::rule::parse("api.test POST /mcp/**").unwrap());
        let b = conn(below, log_in(&dir));
        let d = denied(run(&b, request("POST", "/mcp/a%2A", &json, &call("delete_x"))).await);
        assert_eq!((d.status, d.allow.clone(), d.askable), (403, None, false), "{d:?}");
        let Err(Stop::InBand(answer)) = run(&b, request("POST", "/mcp/a", &json, &call("delete_x"))).await
        else {
            panic!("not answered in band")
        };
        assert_eq!(answer.0.allow.as_deref(), Some("rule = api.test mcp /mcp/a delete_x"));
        // A body of 1 MiB exactly is read; one byte more is refused (below).
        let base = r#"{"jsonrpc":"2.0","id":1,"method":"x","pad":""}"#;
        let most =
            base.replace(r#""pad":"""#, &format!(r#""pad":"{}""#, "a".repeat(mcp::BODY_MOST - base.len())));
        assert_eq!(most.len(), mcp::BODY_MOST);
        assert!(run(&c, request("POST", "/mcp", &json, &most)).await.is_ok());
        let long = format!("search_{}", "s".repeat(121));
        assert!(run(&c, request("POST", "/mcp", &json, &call(&long))).await.is_ok());
        // Ways a server could read the request otherwise: refused before anything is read.
        for (method, headers, body) in [
            ("GET", &[("accept", "text/event-stream")][..], call("delete_repository")),
            ("DELETE", &[][..], "x".to_string()),
            ("PUT", &json[..], list.to_string()),
            ("GET", &[("upgrade", "websocket"), ("connection", "upgrade")][..], String::new()),
            (
                "POST",
                &[("content-type", "application/json"), ("x-http-method-override", "GET")][..],
                list.to_string(),
            ),
            (
                "POST",
                &[
                    ("content-type", "application/json"),
                    ("content-encoding", "identity"),
                    ("content-encoding", "gzip"),
                ][..],
                list.to_string(),
            ),
        ] {
            // With a rule that allows anything else on the host: the MCP rule still governs.
            let mut wide = ruled("api.test mcp /mcp search_*");
            wide.rules.extend(crate::policy::rule::parse("api.test * /**").unwrap());
            let c = conn(wide, log_in(&dir));
            let d = denied(run(&c, request(method, "/mcp", headers, &body)).await);
            assert_eq!(d.status, 400, "{method} {headers:?}: {d:?}");
        }
        // A charset a server would decode otherwise, a parameter, two types: refused. Controls:
        // UTF-8 named in its usual spellings.
        for t in [
            "application/json; charset=utf-8",
            "Application/JSON;charset=\"UTF-8\"",
            "application/json;charset=utf8",
        ] {
            assert!(run(&c, request("POST", "/mcp", &[("content-type", t)], list)).await.is_ok(), "{t}");
        }
        for (headers, body) in [
            (&[("content-type", "application/json; charset=utf-7")][..], list.to_string()),
            (&[("content-type", "application/json; charset=utf-8; x=y")][..], list.to_string()),
            (
                &[("content-type", "application/json"), ("content-type", "application/json")][..],
                list.to_string(),
            ),
            (&[][..], list.to_string()),
            (&[("content-type", "text/plain")][..], list.to_string()),
            (&json[..], "not json".to_string()),
            (&json[..], call(&"s".repeat(129))),
            (&[("content-type", "application/json"), ("content-encoding", "gzip")][..], list.to_string()),
            (
                &json[..],
                format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\",\"pad\":\"{}\"}}",
                    "a".repeat(mcp::BODY_MOST + 1)
                ),
            ),
        ] {
            let d = denied(run(&c, request("POST", "/mcp", headers, &body)).await);
            assert_eq!(d.status, 400, "{d:?}");
            assert!(d.reason.contains("cannot read"), "{d:?}");
            assert_eq!(d.hint, format!("blocked by ai-sandbox: {}", d.reason));
        }
    }

    /// With a watcher attached, a refusal the rules would lift is asked (and "once" lets it
    /// go); one no rule could lift (a path the gate would have to guess about) is not asked.
    #[tokio::test]
    async fn a_rule_refusal_is_asked_and_a_refusal_no_line_lifts_is_not() {
        use super::super::super::ask::{Answer, Watch};
        let dir = tempfile::tempdir().unwrap();
        let c = Arc::new(conn(SessionPolicy { ask: Some(30), ..ruled("api.test GET /v1/*") }, log_in(&dir)));
        let (_, mut watcher) = c.state.asks.add_watcher();
        let held = {
            let c = c.clone();
            tokio::spawn(async move { run(&c, request("POST", "/v1/x", &[], "")).await.is_ok() })
        };
        let line =
            tokio::time::timeout(std::time::Duration::from_secs(10), watcher.recv()).await.unwrap().unwrap();
        let Some(Watch::Ask(q)) = Watch::read(&line) else { panic!("not a question: {line}") };
        assert_eq!(q.allow.as_deref(), Some("rule = api.test POST /v1/x"));
        assert!(
            c.state.asks.answer(&Answer { ask: q.ask, verdict: super::super::super::ask::Verdict::Once })
        );
        assert!(held.await.unwrap(), "let through once");
        let d = denied(run(&c, request("GET", "/v1/a%2Fb", &[], "")).await);
        assert_eq!(d.status, 400);
        assert!(watcher.try_recv().is_err(), "a refusal no line lifts was asked about");
    }

    /// A push limited by ref: its command list read before anything goes, each ref checked; a
    /// compressed one is refused as unreadable; an allowed one goes.
    #[tokio::test]
    async fn a_push_limited_by_ref_is_read_and_checked_before_it_goes() {
        let dir = tempfile::tempdir().unwrap();
        let c = conn(ruled("api.test git-push /r.git refs/heads/agent/*"), log_in(&dir));
        let pkt = |r: &str| {
            let line = format!("{} {} {r}\0report-status\n", "0".repeat(40), "1".repeat(40));
            format!("{:04x}{line}0000", line.len() + 4)
        };
        let c = &c;
        let push = |r: &str, extra: &[(&'static str, &'static str)]| {
            let mut h = vec![("content-type", "application/x-git-receive-pack-request")];
            h.extend_from_slice(extra);
            let body = pkt(r);
            async move { run(c, request("POST", "/r.git/git-receive-pack", &h, &body)).await }
        };
        assert!(push("refs/heads/agent/x", &[]).await.is_ok(), "an allowed ref");
        match push("refs/heads/main", &[]).await {
            Err(Stop::InBand(answer)) => {
                let (d, report, kind) = *answer;
                assert_eq!((d.status, kind), (403, "application/x-git-receive-pack-result"));
                assert!(String::from_utf8_lossy(&report).contains("ng refs/heads/main"));
            }
            _ => panic!("a push of refs/heads/main went"),
        }
        let d = denied(push("refs/heads/agent/x", &[("content-encoding", "gzip")]).await);
        assert!(d.reason.contains("it is compressed"), "{d:?}");
        assert!(push("refs/heads/agent/x", &[("content-encoding", "identity")]).await.is_ok());
    }

    /// A body in frames, as a client sends it in pieces.
    struct Pieces(std::collections::VecDeque<Bytes>);

    impl Body for Pieces {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(hyper::body::Frame::data(b))))
        }
    }

    /// A sandbox's MCP messages held at once are bounded: past `McpHeld::MOST` a call is
    /// refused 503 with what to do; with room again, the same call goes.
    #[tokio::test]
    async fn an_mcp_call_past_the_sandboxs_held_bytes_is_refused_until_there_is_room() {
        let dir = tempfile::tempdir().unwrap();
        let c = conn(ruled("api.test mcp /mcp search_*"), log_in(&dir));
        let json = [("content-type", "application/json")];
        let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search_x"}}"#;
        let mut others = McpHeld::new(&c.session);
        others.set(McpHeld::MOST - call.len()).unwrap();
        let d = denied(run(&c, request("POST", "/mcp", &json, call)).await);
        assert_eq!(d.status, 503);
        assert_eq!(
            d.reason,
            "an MCP message to api.test /mcp: the sandbox's MCP messages the gate holds at once would pass 64 MiB"
        );
        assert_eq!(
            d.hint,
            format!(
                "blocked by ai-sandbox: {}; send it again when its other MCP messages are answered",
                d.reason
            )
        );
        drop(others);
        assert!(run(&c, request("POST", "/mcp", &json, call)).await.is_ok(), "refused with room");
    }

    /// A GET or DELETE on an MCP endpoint carries no message: with no body it goes; a body
    /// whose first frame is empty and whose next holds a byte is refused as a body, not taken
    /// for none (nor is a first frame with the byte). Control: a POST's call in pieces goes.
    #[tokio::test]
    async fn an_mcp_get_whose_body_begins_with_an_empty_frame_is_a_get_with_a_body() {
        let dir = tempfile::tempdir().unwrap();
        let c = conn(ruled("api.test mcp /mcp search_*"), log_in(&dir));
        let policy = c.session.policy();
        let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search_x"}}"#;
        let (head, tail) = call.split_at(9);
        let cases = [
            ("GET", vec![], None),
            ("DELETE", vec![], None),
            ("GET", vec!["", "x"], Some("a GET with a body")),
            ("DELETE", vec!["", "x"], Some("a DELETE with a body")),
            ("GET", vec!["x"], Some("a GET with a body")),
            ("POST", vec![head, tail], None),
        ];
        for (method, pieces, refused) in cases {
            let asked = Asked { method, host: "api.test", port: 443, path: Some("/mcp") };
            let body = Pieces(pieces.into_iter().map(|p| Bytes::from(p.to_string())).collect());
            let mut req = Request::builder().method(method).uri("/mcp").header("host", "api.test");
            if method == "POST" {
                req = req.header("content-type", "application/json");
            }
            match (admit(&c, &policy, &asked, req.body(body).unwrap()).await, refused) {
                (Ok(_), None) => {}
                (Err(Stop::Denied(d)), Some(why)) => assert!(d.reason.contains(why), "{method}: {d:?}"),
                (Ok(_), Some(why)) => panic!("{method} went, though {why}"),
                (Err(_), _) => panic!("{method} was not decided as it should be"),
            }
        }
    }

    /// A push's command list that comes in two frames is read to its end before the refs are
    /// checked (the first frame alone is not a list); one that ends before its list does, and
    /// one longer than the gate reads, are refused as unreadable.
    #[tokio::test]
    async fn a_push_whose_command_list_comes_in_pieces_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let c = conn(ruled("api.test git-push /r.git refs/heads/agent/*"), log_in(&dir));
        let line = format!("{} {} refs/heads/agent/x\0report-status\n", "0".repeat(40), "1".repeat(40));
        let list = format!("{:04x}{line}0000", line.len() + 4);
        let (a, b) = list.split_at(30);
        let policy = c.session.policy();
        let asked =
            Asked { method: "POST", host: "api.test", port: 443, path: Some("/r.git/git-receive-pack") };
        // Commands and no flush past the most the gate reads: refused as too long.
        let long =
            std::iter::repeat_n(list[..list.len() - 4].to_string(), push::MOST / 80 + 1).collect::<String>();
        let cases = [
            (vec![a.to_string(), b.to_string()], None),
            (vec![a.to_string()], Some("the body ended before its command list did")),
            (vec![long.clone(), long], Some("longer than 64 KiB")),
        ];
        for (pieces, refused) in cases {
            let body = Pieces(pieces.into_iter().map(Bytes::from).collect());
            let req = Request::builder()
                .method("POST")
                .uri("/r.git/git-receive-pack")
                .header("host", "api.test")
                .body(body)
                .unwrap();
            match (admit(&c, &policy, &asked, req).await, refused) {
                (Ok(_), None) => {}
                (Err(Stop::Denied(d)), Some(why)) => assert!(d.reason.contains(why), "{d:?}"),
                (Ok(_), Some(why)) => panic!("went, though {why}"),
                (Err(_), None) => panic!("the whole list was refused"),
                (Err(_), Some(why)) => panic!("not refused as {why}"),
            }
        }
    }
}
