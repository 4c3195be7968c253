//! TLS termination, only for the hosts a session's secrets are bound to (`secret = NAME for
//! HOST`) or that have rules: the gate answers the CONNECT's TLS with a certificate from its own
//! CA, opens TLS to the real server (verified against the host's roots and the session's
//! `upstream_ca`), and relays HTTP/1.1 or HTTP/2 between the two (the version the upstream chose
//! of the client's offer: `proto`, `upstream`; ADR 0065), request by request or stream by
//! stream: the placeholders of secrets bound to this host become the real values in the request
//! headers, a placeholder of any other secret is refused (403, logged as an exfiltration
//! attempt), and a real value in the response, in its headers or its body, in any common
//! spelling, goes back to its placeholder (`scrub`, `response`; ADR 0061; a gRPC message that
//! carries one ends the call: `grpc`). A host's budget is taken per request (`budget`). Request
//! bodies are in `request_body`, WebSockets in `ws_relay`. Every other host stays a blind tunnel
//! (`server::tunnel`).
//!
//! The CA lives in this process's memory only: its key is made when the gate starts terminating
//! and is never written anywhere, so no sandbox, file or other process can hold it. The
//! decisions are in `secrets` (pure); here is the I/O: the certificates, both TLS sides, hyper.

use super::decide::{self, Denial, RuleMatch, SessionPolicy};
use super::grpc;
use super::pipeline::{self, Asked};
use super::proto::{self, Proto};
use super::request_body::{Ahead, DRAIN};
use super::scrub::Masks;
use super::secrets::{Misuse, Secrets};
use super::state::{Entry, Session, State};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A kept-alive connection with no new request for this long is closed.
const IDLE: Duration = Duration::from_secs(600);

use super::response::BoxError;
use super::upstream::{HANDSHAKE_TIMEOUT, Out, Sender, dial_tls, with_alpn};
use super::view::View;

/// The client's stream with the bytes the gate already read (the ClientHello) put back in front.
/// It also counts the bytes each way into the session's counters (`gate status`), as a tunnel's
/// relay does: here they are the TLS bytes between the client and the gate.
struct Replayed {
    head: Vec<u8>,
    at: usize,
    inner: TcpStream,
    session: Arc<Session>,
}

impl AsyncRead for Replayed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let n = buf.remaining().min(self.head.len() - self.at);
            buf.put_slice(&self.head[self.at..self.at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        self.session.up.fetch_add(n, Ordering::Relaxed);
        r
    }
}

impl AsyncWrite for Replayed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, b);
        if let Poll::Ready(Ok(n)) = r {
            self.session.down.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One terminated connection's context, shared by its requests.
struct Conn {
    state: Arc<State>,
    session: Arc<Session>,
    secrets: Secrets,
    /// What a response must not carry back: the spellings of the host's values (each request
    /// clones them and adds its own Basic tokens), made again when a held login's token changes
    /// (the `login` generation they were made at).
    masks: std::sync::Mutex<(u64, Masks)>,
    host: String,
    port: u16,
    addr: std::net::SocketAddr,
    /// The upstream config with this connection's ALPN offer (a new connection offers the same).
    upstream: Arc<rustls::ClientConfig>,
    sender: tokio::sync::Mutex<Option<Sender>>,
    /// Why there is no upstream (its TLS failed): every request is answered 502 with it.
    failed: Option<String>,
}

mod admit;
mod answer;
mod renew;
mod sign;

use admit::Stop;

/// Relays one CONNECT whose host the session's secrets are bound to. `first` holds the
/// ClientHello already read (and its SNI already checked against the CONNECT's host). The
/// upstream's TLS is made before the client's handshake ends, so that the client is answered
/// with the HTTP version the upstream chose of those it offered (`proto`; ADR 0065).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    state: Arc<State>,
    session: Arc<Session>,
    host: String,
    port: u16,
    upstream_cfg: Arc<rustls::ClientConfig>,
    client: TcpStream,
    first: Vec<u8>,
    upstream: TcpStream,
) -> std::io::Result<()> {
    let ca = state.ca().map_err(std::io::Error::other)?;
    let up = first.len() as u64;
    session.up.fetch_add(up, Ordering::Relaxed);
    let replayed = Replayed { head: first, at: 0, inner: client, session: session.clone() };
    let lazy = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), replayed);
    let start = match tokio::time::timeout(HANDSHAKE_TIMEOUT, lazy).await {
        Ok(Ok(s)) => s,
        _ => return Ok(()),
    };
    let offered: Option<Vec<Vec<u8>>> = start.client_hello().alpn().map(|a| a.map(|p| p.to_vec()).collect());
    let offer = proto::offer(offered.as_deref());
    let upstream_cfg = with_alpn(&upstream_cfg, offer.clone());
    let addr = upstream.peer_addr()?;
    let sender = match dial_tls(upstream_cfg.clone(), &host, upstream).await {
        Ok(up) => Sender::handshake(up).await,
        Err(e) => Err(e),
    };
    let version = proto::chosen(sender.as_ref().ok().map(|s| s.proto().alpn()), &offer);
    let cfg = ca.server_config(&host, version).map_err(std::io::Error::other)?;
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, start.into_stream(cfg)).await {
        Ok(Ok(s)) => s,
        // The client refused the gate's certificate (it does not trust the CA) or hung up.
        _ => return Ok(()),
    };
    // Never a silent pass: without an upstream, each request gets a 502 with the reason (read
    // first, so the client is not reset before it reads the answer), and so does the log.
    let (sender, failed) = match sender {
        Ok(s) => (Some(s), None),
        Err(why) => (None, Some(why)),
    };
    let secrets = session.secrets.clone();
    let masks = std::sync::Mutex::new((super::login::generation(), secrets.masks(&host)));
    let conn = Arc::new(Conn {
        state,
        session,
        secrets,
        masks,
        host,
        port,
        addr,
        upstream: upstream_cfg,
        sender: tokio::sync::Mutex::new(sender),
        failed,
    });
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let conn = conn.clone();
        async move {
            let grpc = grpc::is_grpc(req.headers().get(hyper::header::CONTENT_TYPE).map(|v| v.as_bytes()));
            let resp = relay(&conn, req).await;
            Ok::<_, std::convert::Infallible>(if grpc { grpc_refusal(resp) } else { resp })
        }
    });
    let io = TokioIo::new(tls);
    let _ = match version {
        Proto::H1 => {
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(IDLE)
                .serve_connection(io, svc)
                .with_upgrades()
                .await
        }
        Proto::H2 => {
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(IDLE / 4))
                .serve_connection(io, svc)
                .await
        }
    };
    Ok(())
}

/// The gate's own answer to a gRPC call (a refusal, an upstream that failed) in the form gRPC
/// clients read: HTTP 200 with the status and the hint in the trailers. An upstream's answers
/// pass as they are.
fn grpc_refusal(resp: Response<Out>) -> Response<Out> {
    let Some(Refused { status, hint }) = resp.extensions().get::<Refused>().cloned() else { return resp };
    let mut trailers = hyper::HeaderMap::new();
    for (name, value) in grpc::trailers(status, &hint) {
        if let Ok(v) = hyper::header::HeaderValue::from_str(&value) {
            trailers.insert(name, v);
        }
    }
    let mut r = Response::new(TrailersOnly(Some(trailers)).boxed());
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/grpc"));
    r
}

/// A body of trailers alone (a gRPC call the gate ends).
pub(crate) struct TrailersOnly(pub(crate) Option<hyper::HeaderMap>);

impl Body for TrailersOnly {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.0.take().map(|t| Ok(Frame::trailers(t))))
    }
    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }
}

/// Marks a response the gate wrote itself, a refusal (`grpc_refusal` reads it).
#[derive(Clone)]
struct Refused {
    status: u16,
    hint: String,
}

fn full(body: impl Into<Bytes>) -> Out {
    Full::new(body.into()).map_err(|never| match never {}).boxed()
}

/// A refusal the gate writes itself: the hint as the reason phrase (what clients print) and body.
fn refusal(status: u16, hint: &str) -> Response<Out> {
    let mut r = Response::new(full(format!("{hint}\n")));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
    if let Ok(p) = hyper::ext::ReasonPhrase::try_from(super::decide::reason_phrase(hint)) {
        r.extensions_mut().insert(p);
    }
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    r.extensions_mut().insert(Refused { status, hint: hint.to_string() });
    r
}

/// Logs a refusal of one request on a terminated connection and counts it for the session.
fn record(state: &State, session: &Session, r: &Asked, d: &Denial) {
    session.denied.fetch_add(1, Ordering::Relaxed);
    state.note(Entry {
        hint: &d.hint,
        allow: d.allow.as_deref(),
        path: d.path.as_deref().or(r.path),
        ..Entry::denied(&session.id, r.method, r.host, r.port, d.status, &d.reason)
    });
}

impl Conn {
    /// The host's masks now (see `masks`).
    fn masks(&self) -> Masks {
        let mut m = self.masks.lock().unwrap_or_else(|e| e.into_inner());
        let now = super::login::generation();
        if m.0 != now {
            *m = (now, self.secrets.masks(&self.host));
        }
        m.1.clone()
    }

    /// The one exit for a request a phase stopped before anything went upstream: counted,
    /// logged and answered (`admit::Stop`).
    fn finish(&self, r: &Asked, stop: Stop) -> Response<Out> {
        match stop {
            Stop::Denied(d) => self.denied(r, &d),
            Stop::InBand(answer) => {
                let (d, body, content_type) = *answer;
                self.denied_in_band(r, &d, body, content_type)
            }
            Stop::Broken => refusal(400, "ai-sandbox gate: the request body ended abruptly"),
        }
    }

    fn refuse(&self, r: &Asked, status: u16, reason: &str, hint: &str) -> Response<Out> {
        self.denied(r, &Denial { status, reason: reason.into(), hint: hint.into(), ..Denial::default() })
    }

    fn denied(&self, r: &Asked, d: &Denial) -> Response<Out> {
        record(&self.state, &self.session, r, d);
        refusal(d.status, &d.hint)
    }

    /// A refusal answered in the protocol's own words (a push's receive-pack result, an MCP
    /// call's JSON-RPC errors): logged as the refusal it is, sent as what the client reads, so
    /// that it shows the reason.
    fn denied_in_band(
        &self,
        r: &Asked,
        d: &Denial,
        body: Vec<u8>,
        content_type: &'static str,
    ) -> Response<Out> {
        record(&self.state, &self.session, r, d);
        let mut resp = Response::new(full(body));
        resp.headers_mut()
            .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
        resp.headers_mut()
            .insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-cache"));
        resp
    }

    fn misuse_denial(&self, m: &Misuse) -> Denial {
        Denial { status: 403, reason: m.reason(&self.host, false), hint: m.hint(), ..Denial::default() }
    }

    /// With `ask = SECONDS` and a watcher attached: holds a request the rules refuse and asks
    /// (`pipeline::ask`); the rules' verdict after the answer.
    async fn ask(
        &self,
        policy: &SessionPolicy,
        r: &Asked<'_>,
        view: &View<'_>,
        d: Denial,
    ) -> Result<Option<RuleMatch>, Denial> {
        use super::ask::Verdict;
        match pipeline::ask(&self.state, &self.session, policy, r, &d).await {
            Some(Verdict::Once) => {
                let normal = crate::policy::url_path::normalise(view.target).map_err(|_| d.clone())?;
                Ok(Some(RuleMatch {
                    method: r.method.to_ascii_uppercase(),
                    target: normal.target(),
                    path: normal.path(),
                    rule: "(this request, let through once by a watcher)".into(),
                    refs: None,
                    // A host with MCP rules: what goes once is still read as MCP (a path its
                    // server may route to the endpoint, `/mcp/` or `/MCP`, is no way around).
                    tools: crate::policy::rule::host_mcp_tools(&policy.rules, &self.host),
                }))
            }
            // The watcher changed the policy: the request is decided again under the new one.
            Some(Verdict::Allowed) => decide::check_request(&self.session.policy(), view),
            Some(Verdict::Deny) | None => Err(d),
        }
    }

    /// The kept-alive upstream connection, or a new one to the same checked address when the
    /// server closed it. HTTP/1.1's is taken for the request (and put back after it); HTTP/2's
    /// is shared by the client's streams.
    async fn sender(&self) -> Result<Sender, String> {
        let mut slot = self.sender.lock().await;
        if let Some(open) = slot.as_ref().filter(|s| !s.closed()).and_then(Sender::share) {
            drop(slot);
            let mut s = open;
            if s.ready().await {
                return Ok(s);
            }
            slot = self.sender.lock().await;
            if let Some(other) = slot.as_ref().filter(|s| !s.closed()).and_then(Sender::share) {
                return Ok(other);
            }
        } else if let Some(mut s) = slot.take()
            && s.ready().await
        {
            return Ok(s);
        }
        let tcp = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(self.addr))
            .await
            .map_err(|_| format!("cannot connect to {}:{}", self.host, self.port))?
            .map_err(|e| format!("cannot connect to {}:{}: {e}", self.host, self.port))?;
        let _ = tcp.set_nodelay(true);
        let s = Sender::handshake(dial_tls(self.upstream.clone(), &self.host, tcp).await?).await?;
        *slot = s.share();
        Ok(s)
    }

    /// An HTTP/1.1 connection back to the slot after its request (HTTP/2's never left it).
    async fn put_back(&self, s: Sender) {
        if s.share().is_none() {
            *self.sender.lock().await = Some(s);
        }
    }
}

/// Reads (and drops) the rest of a refused request's body, up to `DRAIN`, so that the client
/// reads the answer instead of a reset.
async fn drain<B: Body<Data = Bytes> + Unpin>(ahead: &Ahead, body: &mut B) {
    let mut drained = ahead.seen.len();
    while !ahead.ended && drained < DRAIN {
        match body.frame().await {
            Some(Ok(f)) => drained += f.data_ref().map_or(0, |d| d.len()),
            _ => break,
        }
    }
}

/// One request through a terminated connection: the request phases under the policy read
/// once for it (`admit`), the placeholders substituted (an AWS signature made again: `sign`)
/// and the decision recorded, then upstream and the response phases (`answer`).
async fn relay(c: &Conn, req: Request<Incoming>) -> Response<Out> {
    let policy = c.session.policy();
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let asked = Asked { method: &method, host: &c.host, port: c.port, path: Some(&path) };
    if let Some(why) = &c.failed {
        let mut r = c.refuse(&asked, 502, why, &format!("ai-sandbox gate: {why}"));
        r.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
        return r;
    }
    // What an AWS signature covers, as the client sent it (`sign`).
    let sent = sign::AsSent::of(c, &req);
    let mut admitted = match admit::admit(c, &policy, &asked, req).await {
        Ok(a) => a,
        Err(stop) => return c.finish(&asked, stop),
    };
    // What a response must not carry back: the host's values, and this request's Basic tokens.
    // A held login's token that changed between the masks and the substitution (a refresh just
    // then) could go out unmasked: the request is refused, to be sent again.
    let generation = super::login::generation();
    let mut masks = c.masks();
    let sendable = match admit::upstream_parts(c, &mut admitted.parts, &mut masks) {
        Ok(()) if super::login::generation() != generation => Err(Stop::from(Denial {
            status: 503,
            reason: "a held login's token changed while the request was made ready".into(),
            hint: "ai-sandbox gate: a login's token was refreshed just now; send the request again".into(),
            ..Denial::default()
        })),
        Ok(()) => match sign::resign(c, sent.as_ref(), &mut admitted, &mut masks).await {
            Ok(()) => admit::record(c, &asked, &mut admitted).await,
            Err(d) => Err(Stop::from(d)),
        },
        Err(d) => Err(Stop::from(d)),
    };
    if let Err(stop) = sendable {
        // Refused after the budget phase took its share: nothing of it went.
        if let Some(a) = &admitted.budget {
            a.give_back(admitted.taken);
        }
        return c.finish(&asked, stop);
    }
    if method == "POST" && c.secrets.renews(&c.host, &path) {
        return renew::renew(c, &asked, admitted).await;
    }
    answer::exchange(c, &policy, &asked, admitted, masks).await
}
