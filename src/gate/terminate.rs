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

use super::decide::{self, Denial, RuleMatch};
use super::grpc;
use super::normalise;
use super::proto::{self, Proto};
use super::push;
use super::request_body::{Ahead, DRAIN, OVERLAP, Replay, Scanned};
use super::response::{Decoder, GrpcChecked, Scrubbed, mask_headers, masked_reason};
use super::scrub::{self, Coding, Scrubber};
use super::secrets::{Misuse, Secrets};
use super::state::{Entry, Session, State};
use super::ws;
use super::ws_relay::WsWatch;
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
    host: String,
    port: u16,
    addr: std::net::SocketAddr,
    /// The upstream config with this connection's ALPN offer (a new connection offers the same).
    upstream: Arc<rustls::ClientConfig>,
    sender: tokio::sync::Mutex<Option<Sender>>,
    /// Why there is no upstream (its TLS failed): every request is answered 502 with it.
    failed: Option<String>,
}

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
    let conn = Arc::new(Conn {
        state,
        session,
        secrets,
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
fn record(state: &State, session: &Session, host: &str, port: u16, r: &Asked, d: &Denial) {
    session.denied.fetch_add(1, Ordering::Relaxed);
    state.note(Entry {
        hint: &d.hint,
        allow: d.allow.as_deref(),
        path: Some(d.path.as_deref().unwrap_or(r.path)),
        ..Entry::denied(&session.id, r.method, host, port, d.status, &d.reason)
    });
}

/// What the log says of one request: its method and path (never the query).
struct Asked<'a> {
    method: &'a str,
    path: &'a str,
}

impl Conn {
    fn refuse(&self, r: &Asked, status: u16, reason: &str, hint: &str) -> Response<Out> {
        self.denied(r, &Denial { status, reason: reason.into(), hint: hint.into(), ..Denial::default() })
    }

    fn denied(&self, r: &Asked, d: &Denial) -> Response<Out> {
        self.record(r, d);
        refusal(d.status, &d.hint)
    }

    fn record(&self, r: &Asked, d: &Denial) {
        record(&self.state, &self.session, &self.host, self.port, r, d);
    }

    /// A refused push answered in git's own words (`push::report`): logged as the refusal it
    /// is, sent as the receive-pack result git reads, so that git prints the reason.
    fn denied_in_band(&self, r: &Asked, d: &Denial, report: Vec<u8>) -> Response<Out> {
        self.record(r, d);
        let mut resp = Response::new(full(report));
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/x-git-receive-pack-result"),
        );
        resp.headers_mut()
            .insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-cache"));
        resp
    }

    fn misuse(&self, r: &Asked, m: &Misuse) -> Response<Out> {
        self.refuse(r, 403, &m.reason(&self.host, false), &m.hint())
    }

    /// With `ask = SECONDS` and a watcher attached: holds a request the rules refuse and asks
    /// (as `server::ask` does for the allowlist); the rules' verdict after the answer.
    async fn ask(&self, r: &Asked<'_>, target: &str, d: Denial) -> Result<Option<RuleMatch>, Denial> {
        use super::ask::{Question, Verdict};
        let policy = self.session.policy();
        let Some(secs) = policy.ask.filter(|_| self.state.asks.watched()) else { return Err(d) };
        let q = Question {
            ask: 0,
            session: self.session.id.clone(),
            project: self.session.project.clone(),
            method: r.method.to_string(),
            host: self.host.clone(),
            port: self.port,
            seconds: secs,
            allow: d.allow.clone(),
            path: Some(r.path.to_string()),
        };
        match self.state.asks.ask(q, Duration::from_secs(u64::from(secs))).await {
            Verdict::Once => {
                let normal = crate::policy::url_path::normalise(target).map_err(|_| d.clone())?;
                Ok(Some(RuleMatch {
                    method: r.method.to_ascii_uppercase(),
                    target: normal.target(),
                    path: normal.path(),
                    rule: "(this request, let through once by a watcher)".into(),
                    refs: None,
                }))
            }
            Verdict::Allowed => decide::check_request(&self.session.policy(), &self.host, r.method, target),
            Verdict::Deny => Err(d),
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
async fn drain(ahead: &Ahead, body: &mut Incoming) {
    let mut drained = ahead.seen.len();
    while !ahead.ended && drained < DRAIN {
        match body.frame().await {
            Some(Ok(f)) => drained += f.data_ref().map_or(0, |d| d.len()),
            _ => break,
        }
    }
}

/// What a request's head counts against a budget: its method, target and headers as HTTP/1.1
/// would write them (HTTP/2 compresses them; the count stays the same for both).
fn head_size(method: &str, target: &str, headers: &hyper::HeaderMap) -> u64 {
    (method.len() + target.len() + " HTTP/1.1\r\n\r\n".len() + 1) as u64 + super::budget::fields_size(headers)
}

/// The request's target must be this connection's host: the Host header, and an absolute-form
/// URI's authority. Else a CDN fronting many names could route the real key to another one.
fn same_host(req: &Request<Incoming>, host: &str, port: u16) -> Result<(), String> {
    let ok = |a: &str| {
        let a = a.trim();
        a.eq_ignore_ascii_case(host)
            || a.rsplit_once(':').is_some_and(|(h, p)| h.eq_ignore_ascii_case(host) && p == port.to_string())
    };
    if let Some(a) = req.uri().authority()
        && !ok(a.as_str())
    {
        return Err(format!("the request names {a}, not {host}"));
    }
    match req.headers().get(hyper::header::HOST).map(|h| h.to_str()) {
        Some(Ok(h)) if ok(h) => Ok(()),
        // HTTP/2 names the host in `:authority` (the URI's, checked above) alone.
        None if req.uri().authority().is_some() => Ok(()),
        Some(Ok(h)) => Err(format!("the Host header names {h}, not {host}")),
        Some(Err(_)) => Err("the Host header is not text".into()),
        None => Err("the request has no Host header".into()),
    }
}

/// One request through a terminated connection.
async fn relay(c: &Conn, mut req: Request<Incoming>) -> Response<Out> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let asked = Asked { method: &method, path: &path };
    if let Some(why) = &c.failed {
        let mut r = c.refuse(&asked, 502, why, &format!("ai-sandbox gate: {why}"));
        r.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
        return r;
    }
    if let Err(why) = same_host(&req, &c.host, c.port) {
        return c.refuse(
            &asked,
            421,
            &why,
            &format!("ai-sandbox gate: {why}; the tunnel was opened to {}", c.host),
        );
    }
    if let Some(m) = c.secrets.misuse(req.uri().to_string().as_bytes(), Some(&c.host)) {
        return c.misuse(&asked, &m);
    }
    // What a response must not carry back: the host's values, and this request's Basic tokens.
    let mut masks = c.secrets.masks(&c.host);
    for v in req.headers_mut().values_mut() {
        match c.secrets.substitute(v.as_bytes(), &c.host) {
            Err(m) => return c.misuse(&asked, &m),
            Ok(Some(real)) => match hyper::header::HeaderValue::from_bytes(&real) {
                Ok(mut new) => {
                    if let (Some(sent), Some(shown)) =
                        (scrub::basic_token(&real), scrub::basic_token(v.as_bytes()))
                    {
                        masks.add(sent, shown, "the Basic credentials");
                    }
                    new.set_sensitive(true);
                    *v = new;
                }
                Err(_) => return c.refuse(&asked, 400, "a substituted header is not a valid value", ""),
            },
            Ok(None) => {}
        }
    }
    // A host with a bound secret sends whole resources: no part the agent chose comes back
    // unmasked for lack of the rest (`normalise`).
    normalise::request(req.headers_mut(), !masks.is_empty());
    // Origin-form upstream, whatever form the client used (its authority was checked above).
    let target = req.uri().path_and_query().map_or_else(|| "/".to_string(), |pq| pq.as_str().to_string());
    let client_upgrade =
        req.headers().contains_key(hyper::header::UPGRADE).then(|| hyper::upgrade::on(&mut req));
    // The body's first frame (what a client sends in one go: a whole small body), read before
    // anything goes upstream; the rest is scanned as it streams (`Scanned`), so a client that
    // sends its body in pieces and waits for an answer is not held (ADR 0063).
    let (parts, mut body) = req.into_parts();
    let mut ahead = Ahead::default();
    if ahead.one(&mut body).await.is_err() {
        return refusal(400, "ai-sandbox gate: the request body ended abruptly");
    }
    if let Some(m) = c.secrets.misuse(&ahead.seen, Some(&c.host)) {
        return c.misuse(&asked, &m);
    }
    let first = ahead.frames.len();
    // The host's rules, on the request's one spelling; what goes upstream is that spelling.
    let verdict = match decide::check_request(&c.session.policy(), &c.host, &method, &target) {
        Err(d) if d.askable => c.ask(&asked, &target, d).await,
        v => v,
    };
    let mut parts = parts;
    let (target, logged, reason, refs) = match verdict {
        Err(d) => return c.denied(&asked, &d),
        Ok(None) => (target, path.clone(), "allowed".to_string(), None),
        Ok(Some(m)) => {
            match hyper::Method::from_bytes(m.method.as_bytes()) {
                Ok(upper) => parts.method = upper,
                Err(_) => return c.refuse(&asked, 400, "the method is not a token", ""),
            }
            (m.target, m.path, format!("allowed by rule = {}", m.rule), m.refs)
        }
    };
    // A push limited by ref: its command list, read before anything goes upstream.
    if let Some(patterns) = refs {
        let coded = parts.headers.get(hyper::header::CONTENT_ENCODING).is_some_and(|v| v != "identity");
        let cmds = loop {
            match push::commands(&ahead.seen) {
                _ if coded => break Err("it is compressed".to_string()),
                Ok(Some(cmds)) => break Ok(cmds),
                Ok(None) if ahead.ended => break Err("the body ended before its command list did".into()),
                Ok(None) if ahead.seen.len() >= push::MOST => {
                    break Err("its command list is longer than 64 KiB".into());
                }
                Ok(None) => {
                    if ahead.one(&mut body).await.is_err() {
                        return refusal(400, "ai-sandbox gate: the request body ended abruptly");
                    }
                }
                Err(why) => break Err(why),
            }
        };
        let push = match cmds {
            Ok(p) => p,
            Err(why) => return c.denied(&asked, &push::unreadable(&why, &logged)),
        };
        if let Err(r) = push::check(&push.cmds, &patterns) {
            let d = push::denial(&r, &c.host, &logged, &c.session.policy().config_path);
            let Some(report) = push::report(&push, &r, &d.hint) else { return c.denied(&asked, &d) };
            // Read (and drop) what git is still sending, so that it reads the answer instead of
            // a reset; a pack larger than this gets the answer over a connection then closed.
            drain(&ahead, &mut body).await;
            return c.denied_in_band(&asked, &d, report);
        }
    }
    // A budgeted host: the request's target and headers, and its body when its length is
    // declared, are taken whole before anything goes (else the body frame by frame: `Scanned`).
    let budget = c.session.allowance(&c.host);
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if let Some(a) = &budget {
        let wanted = head_size(&method, &target, &parts.headers).saturating_add(declared.unwrap_or(0));
        if !a.take_all(wanted) {
            // The body is read and dropped here (never sent), so the client reads the refusal.
            drain(&ahead, &mut body).await;
            return c.denied(&asked, &a.denial_of(&c.session.policy().config_path, wanted));
        }
    }
    // Not on disk: not sent.
    let allowed =
        Entry { path: Some(&logged), ..Entry::allowed(&c.session.id, &method, &c.host, c.port, &reason) };
    if let Err(unlogged) = c.state.log(allowed) {
        drain(&ahead, &mut body).await;
        return c.denied(&asked, &unlogged.denial());
    }
    c.session.allowed.fetch_add(1, Ordering::Relaxed);
    // Only codings the gate can read back come from upstream (`scrub::accept_encoding`), for
    // the body and for gRPC's messages.
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
    // Frames after the first (a push's command list read ahead, then the rest as it comes).
    let checked: Vec<u8> =
        ahead.frames.iter().take(first).filter_map(|f| f.data_ref()).flatten().copied().collect();
    let found = Arc::new(std::sync::Mutex::new(None));
    let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let body = Scanned {
        inner: Replay { frames: ahead.frames, rest: (!ahead.ended).then_some(body) },
        skip: first,
        tail: checked[checked.len().saturating_sub(OVERLAP)..].to_vec(),
        secrets: c.secrets.clone(),
        host: c.host.clone(),
        found: found.clone(),
        on_found: Some(Box::new({
            let (state, session, host, port) = (c.state.clone(), c.session.clone(), c.host.clone(), c.port);
            let (method, path) = (method.clone(), path.clone());
            move |m: &Misuse| {
                let d = Denial {
                    status: 403,
                    reason: m.reason(&host, false),
                    hint: m.hint(),
                    ..Denial::default()
                };
                record(&state, &session, &host, port, &Asked { method: &method, path: &path }, &d);
            }
        })),
        drained: None,
        budget: budget.clone(),
        count_data: declared.is_none(),
        over: over.clone(),
    };
    let mut sender = match c.sender().await {
        Ok(s) => s,
        Err(why) => return c.refuse(&asked, 502, &why, &format!("ai-sandbox gate: {why}")),
    };
    if let Err(why) = proto::for_upstream(&mut parts, sender.proto(), &c.host, c.port, &target) {
        return c.refuse(&asked, 400, &why, "");
    }
    let resp = sender.send(Request::from_parts(parts, body.boxed())).await;
    c.put_back(sender).await;
    // A placeholder later in the body: the request was cut there (logged when it was found).
    if let Some(m) = found.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return refusal(403, &m.hint());
    }
    // The body went past the host's budget: cut there, nothing past it sent.
    if let Some(a) = budget.filter(|_| over.load(Ordering::Acquire)) {
        return c.denied(&asked, &a.denial(&c.session.policy().config_path));
    }
    let mut resp = match resp {
        Ok(r) => r,
        Err(e) => {
            let why = format!("{} did not answer: {e}", c.host);
            return c.refuse(&asked, 502, &why, &format!("ai-sandbox gate: {why}"));
        }
    };
    // The status's own reason phrase, never the server's (it could carry a value past the
    // masks); then what the gate cannot read is refused, never passed as it came.
    resp.extensions_mut().remove::<hyper::ext::ReasonPhrase>();
    let status = resp.status();
    let bodiless = method == "HEAD"
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let coding = match normalise::response(status.as_u16(), resp.headers(), bodiless) {
        Ok(coding) => coding,
        Err(why) => {
            let why = format!("{} {why}", c.host);
            return c.refuse(&asked, 502, &why, &format!("ai-sandbox gate: {why}"));
        }
    };
    let mut scrub = Scrubber::new(masks);
    mask_headers(&mut scrub, resp.headers_mut());
    let log_masked = {
        let (state, session, host, port) = (c.state.clone(), c.session.id.clone(), c.host.clone(), c.port);
        let (method, path) = (method.clone(), logged.clone());
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
            let (state, session, host, port) = (c.state.clone(), c.session.clone(), c.host.clone(), c.port);
            let (method, path) = (method.clone(), logged.clone());
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
                record(&state, &session, &host, port, &Asked { method: &method, path: &path }, &d);
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
        return resp.map(|inner| {
            Scrubbed {
                inner,
                scrub,
                decode: Decoder::of(coding),
                trailers: None,
                ended: false,
                on_end: Some(Box::new(log_masked)),
            }
            .boxed()
        });
    }
    if status == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let server_upgrade = hyper::upgrade::on(&mut resp);
        // A WebSocket (`normalise` refused any other protocol): its frames are read both ways.
        let ext = resp.headers().get(hyper::header::SEC_WEBSOCKET_EXTENSIONS).and_then(|v| v.to_str().ok());
        let (up, down) = (ws::Frames::new(ext, true), ws::Frames::new(ext, false));
        let log = {
            let (state, session, host, port) = (c.state.clone(), c.session.clone(), c.host.clone(), c.port);
            move |d: &Denial| {
                record(&state, &session, &host, port, &Asked { method: &method, path: &path }, d)
            }
        };
        let (secrets, host) = (c.secrets.clone(), c.host.clone());
        let budget = c.session.allowance(&c.host).map(|a| (a, c.session.policy().config_path.clone()));
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
    resp.map(|b| b.map_err(BoxError::from).boxed())
}
