//! The upstream half of one terminated request, after its record: the body as it streams
//! (scanned for placeholders, counted against the budget: `Scanned`), the upstream connection,
//! and the response phases: the gate's own reason phrase → what the gate cannot read refused
//! (`normalise`) → the real values masked in headers and body (`scrub`, `response`), a gRPC
//! call's messages (`grpc`), a WebSocket's frames (`ws_relay`).

use super::super::decide::Denial;
use super::super::grpc;
use super::super::mcp;
use super::super::normalise;
use super::super::pipeline::Asked;
use super::super::proto;
use super::super::request_body::{OVERLAP, Replay, Scanned};
use super::super::response::{
    BoxError, Decoder, GrpcChecked, McpAnswer, McpFiltered, Scrubbed, mask_headers, masked_reason,
};
use super::super::scrub::{self, Coding, Masks, Scrubber};
use super::super::secrets::Misuse;
use super::super::state::{Entry, McpHeld};
use super::super::ws;
use super::super::ws_relay::WsWatch;
use super::admit::Admitted;
use super::{Conn, record, refusal};
use crate::contract::SessionPolicy;
use http_body_util::BodyExt;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Sends an admitted request upstream and answers with what comes back, masked.
pub(super) async fn exchange(
    c: &Conn,
    policy: &SessionPolicy,
    asked: &Asked<'_>,
    a: Admitted,
    masks: Masks,
) -> Response<Out> {
    let Admitted {
        mut parts,
        body,
        ahead,
        scanned,
        target,
        logged,
        budget,
        declared,
        upgrade,
        tools,
        held,
        ..
    } = a;
    // Frames after those the phases scanned are scanned as they stream.
    let checked: Vec<u8> =
        ahead.frames.iter().take(scanned).filter_map(|f| f.data_ref()).flatten().copied().collect();
    let found = Arc::new(std::sync::Mutex::new(None));
    let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let body = Scanned {
        inner: Replay { frames: ahead.frames, rest: (!ahead.ended).then_some(body) },
        skip: scanned,
        tail: checked[checked.len().saturating_sub(OVERLAP)..].to_vec(),
        secrets: c.secrets.clone(),
        host: c.host.clone(),
        found: found.clone(),
        on_found: Some(Box::new({
            let (state, session) = (c.state.clone(), c.session.clone());
            let (method, path, host, port) = owned(asked);
            move |m: &Misuse| {
                let d = Denial {
                    status: 403,
                    reason: m.reason(&host, false),
                    hint: m.hint(),
                    ..Denial::default()
                };
                let r = Asked { method: &method, host: &host, port, path: Some(&path) };
                record(&state, &session, &r, &d);
            }
        })),
        drained: None,
        budget: budget.clone(),
        count_data: declared.is_none(),
        over: over.clone(),
    };
    let mut sender = match c.sender().await {
        Ok(s) => s,
        Err(why) => return c.refuse(asked, 502, &why, &format!("ai-sandbox gate: {why}")),
    };
    if let Err(why) = proto::for_upstream(&mut parts, sender.proto(), &c.host, c.port, &target) {
        return c.refuse(asked, 400, &why, "");
    }
    let resp = sender.send(Request::from_parts(parts, body.boxed())).await;
    drop(held);
    c.put_back(sender).await;
    // A placeholder later in the body: the request was cut there (logged when it was found).
    if let Some(m) = found.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return refusal(403, &m.hint());
    }
    // The body went past the host's budget: cut there, nothing past it sent.
    if let Some(a) = budget.filter(|_| over.load(Ordering::Acquire)) {
        return c.denied(asked, &a.denial(&policy.config_path));
    }
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            let why = format!("{} did not answer: {e}", c.host);
            return c.refuse(asked, 502, &why, &format!("ai-sandbox gate: {why}"));
        }
    };
    filter(c, policy, asked, &logged, resp, masks, upgrade, tools)
}

type Out = super::super::upstream::Out;

/// What a closure that outlives the request needs of `asked`.
fn owned(asked: &Asked<'_>) -> (String, String, String, u16) {
    (asked.method.to_string(), asked.path.unwrap_or("/").to_string(), asked.host.to_string(), asked.port)
}

/// The response phases (see the module doc). `logged`: the path the request's record has;
/// `tools`: an MCP endpoint's allowed tools (its answers filtered to them, after the masks).
#[allow(clippy::too_many_arguments)]
fn filter(
    c: &Conn,
    policy: &SessionPolicy,
    asked: &Asked<'_>,
    logged: &str,
    mut resp: Response<hyper::body::Incoming>,
    masks: Masks,
    upgrade: Option<hyper::upgrade::OnUpgrade>,
    tools: Option<Vec<String>>,
) -> Response<Out> {
    // The status's own reason phrase, never the server's (it could carry a value past the
    // masks); then what the gate cannot read is refused, never passed as it came.
    resp.extensions_mut().remove::<hyper::ext::ReasonPhrase>();
    let status = resp.status();
    let bodiless = asked.method == "HEAD"
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let coding = match normalise::response(status.as_u16(), resp.headers(), bodiless) {
        Ok(coding) => coding,
        Err(why) => {
            let why = format!("{} {why}", c.host);
            return c.refuse(asked, 502, &why, &format!("ai-sandbox gate: {why}"));
        }
    };
    let mut scrub = Scrubber::new(masks);
    mask_headers(&mut scrub, resp.headers_mut());
    let as_logged = Asked { path: Some(logged), ..*asked };
    let log_masked = {
        let (state, session) = (c.state.clone(), c.session.id.clone());
        let (method, path, host, port) = owned(&as_logged);
        move |s: &Scrubber| {
            let replaced = s.replaced();
            if !replaced.is_empty() {
                let reason = masked_reason(&replaced);
                state.note(Entry {
                    path: Some(&path),
                    ..Entry::allowed(&session, &method, &host, port, &reason)
                });
            }
        }
    };
    let grpc_reply = grpc::is_grpc(resp.headers().get(hyper::header::CONTENT_TYPE).map(|v| v.as_bytes()));
    if bodiless {
        log_masked(&scrub);
    } else if grpc_reply {
        let named = resp.headers().get("grpc-encoding").map(|v| v.to_str().unwrap_or("(not text)"));
        let coding = scrub::coding(named);
        let on_found = {
            let (state, session) = (c.state.clone(), c.session.clone());
            let (method, path, host, port) = owned(&as_logged);
            move |s: &Scrubber| {
                let names: Vec<String> = s.names();
                let d = Denial {
                    status: 502,
                    reason: format!(
                        "a gRPC message from {host} carried the real value of {}; the call was ended",
                        names.join(", ")
                    ),
                    ..Denial::default()
                };
                record(
                    &state,
                    &session,
                    &Asked { method: &method, host: &host, port, path: Some(&path) },
                    &d,
                );
            }
        };
        return resp.map(|inner| {
            GrpcChecked {
                inner,
                scrub,
                messages: grpc::Messages::default(),
                coding,
                tail: Vec::new(),
                ended: false,
                on_end: Some(Box::new(log_masked)),
                on_found: Some(Box::new(on_found)),
            }
            .boxed()
        });
    } else {
        // The length changes with each replacement (and decoding): the body goes chunked.
        resp.headers_mut().remove(hyper::header::CONTENT_LENGTH);
        if coding != Coding::Identity {
            resp.headers_mut().remove(hyper::header::CONTENT_ENCODING);
        }
        let mcp = match tools.map(|t| mcp_answer(resp.status(), resp.headers()).map(|a| a.map(|a| (t, a)))) {
            Some(Err(why)) => {
                let why = format!("{} {logged} sent {why}", c.host);
                return c.refuse(asked, 502, &why, &format!("ai-sandbox gate: {why}"));
            }
            Some(Ok(m)) => m,
            None => None,
        };
        let scrubbed = move |inner| Scrubbed {
            inner,
            scrub,
            decode: Decoder::of(coding),
            trailers: None,
            ended: false,
            on_end: Some(Box::new(log_masked)),
        };
        let Some((patterns, answer)) = mcp else { return resp.map(|inner| scrubbed(inner).boxed()) };
        let on_end = hidden_note(c, &as_logged);
        return resp.map(|inner| {
            McpFiltered {
                inner: scrubbed(inner),
                patterns,
                answer,
                ended: false,
                trailers: None,
                on_end: Some(Box::new(on_end)),
                held: McpHeld::new(&c.session),
            }
            .boxed()
        });
    }
    if status == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = upgrade
    {
        websocket(c, policy, asked, &mut resp, client_upgrade, scrub);
    }
    resp.map(|b| b.map_err(BoxError::from).boxed())
}

/// How an MCP endpoint's answer is read: a JSON body (or an untyped one) or an event stream; an
/// error page passes as it is (a client reads no tools from it); any other successful answer
/// cannot be read.
fn mcp_answer(status: StatusCode, headers: &hyper::HeaderMap) -> Result<Option<McpAnswer>, String> {
    let kind = headers.get(hyper::header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("(not text)"));
    let media = kind.map(|k| mcp::media_type(k).0);
    match media.as_deref() {
        // No type: read as JSON (an empty body, as a DELETE's, passes).
        Some("application/json") | None => Ok(Some(McpAnswer::Json(Vec::new()))),
        Some("text/event-stream") => Ok(Some(McpAnswer::Events(Default::default()))),
        _ if !status.is_success() || status == StatusCode::ACCEPTED => Ok(None),
        _ => Err(format!(
            "an answer of type {}, which the gate cannot read on an MCP endpoint",
            kind.unwrap_or("(none)")
        )),
    }
}

/// The log's note of how many tools an MCP answer hid (none: no note).
fn hidden_note(c: &Conn, asked: &Asked<'_>) -> impl FnOnce(usize) + Send + Sync + 'static {
    let (state, session) = (c.state.clone(), c.session.id.clone());
    let (method, path, host, port) = owned(asked);
    move |hidden: usize| {
        if hidden > 0 {
            let reason =
                format!("MCP tools/list: {hidden} tool(s) the rules do not allow hidden from the answer");
            state
                .note(Entry { path: Some(&path), ..Entry::allowed(&session, &method, &host, port, &reason) });
        }
    }
}

/// A WebSocket (`normalise` refused any other protocol): its frames are read both ways.
fn websocket(
    c: &Conn,
    policy: &SessionPolicy,
    asked: &Asked<'_>,
    resp: &mut Response<hyper::body::Incoming>,
    client_upgrade: hyper::upgrade::OnUpgrade,
    scrub: Scrubber,
) {
    let server_upgrade = hyper::upgrade::on(&mut *resp);
    let ext = resp.headers().get(hyper::header::SEC_WEBSOCKET_EXTENSIONS).and_then(|v| v.to_str().ok());
    let (up, down) = (ws::Frames::new(ext, true), ws::Frames::new(ext, false));
    let log = {
        let (state, session) = (c.state.clone(), c.session.clone());
        let (method, path, host, port) = owned(asked);
        move |d: &Denial| {
            record(&state, &session, &Asked { method: &method, host: &host, port, path: Some(&path) }, d)
        }
    };
    let (secrets, host) = (c.secrets.clone(), c.host.clone());
    let budget = c.session.allowance(policy, &c.host).map(|a| (a, policy.config_path.clone()));
    tokio::spawn(async move {
        if let (Ok(a), Ok(b)) = (client_upgrade.await, server_upgrade.await) {
            let (a, b) = (TokioIo::new(a), TokioIo::new(b));
            let watch = WsWatch { up, down, secrets, host, scrub, budget };
            if let Some(d) = watch.relay(a, b).await {
                log(&d);
            }
        }
    });
}
