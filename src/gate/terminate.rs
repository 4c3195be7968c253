//! TLS termination, only for the hosts a session's secrets are bound to (`secret = NAME for
//! HOST`): the gate answers the CONNECT's TLS with a certificate from its own CA, opens TLS to
//! the real server (verified against the host's roots and the session's `upstream_ca`), and
//! relays HTTP/1.1 between the two, request by request: the placeholders of secrets bound to
//! this host become the real values in the request headers, a placeholder of any other secret
//! is refused (403, logged as an exfiltration attempt), and a real value in the response, in
//! its headers or its body, in any common spelling, goes back to its placeholder (`scrub`,
//! `response`; docs/adr/0061). Every other host stays a blind tunnel (`server::tunnel`).
//!
//! The CA lives in this process's memory only: its key is made when the gate starts terminating
//! and is never written anywhere, so no sandbox, file or other process can hold it. The
//! decisions are in `secrets` (pure); here is the I/O: the certificates, both TLS sides, hyper.

use super::decide::{self, Denial, RuleMatch};
use super::push;
use super::response::{Decoder, Scrubbed, mask_headers, masked_reason};
use super::scrub::{self, Coding, Scrubber};
use super::secrets::{Misuse, Secrets};
use super::state::{Entry, Session, State};
use super::ws;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of a refused push's pack the gate reads (and drops) before it answers.
const DRAIN: usize = 16 << 20;
/// A kept-alive connection with no new request for this long is closed.
const IDLE: Duration = Duration::from_secs(600);

use super::response::BoxError;
type Out = BoxBody<Bytes, BoxError>;

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

/// A request body whose first frames the gate has read (to look for placeholders), then the rest.
struct Replay {
    frames: VecDeque<Frame<Bytes>>,
    rest: Option<Incoming>,
}

impl Body for Replay {
    type Data = Bytes;
    type Error = hyper::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(f) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(f)));
        }
        match self.rest.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }
    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(|b| b.is_end_stream())
    }
}

/// How many bytes of the body before a frame are scanned with it: more than the longest
/// spelling of a placeholder the gate looks for (percent-encoded, 3 bytes a character).
const OVERLAP: usize = 256;

/// Called once when a placeholder is found later in a request body (the refusal's log entry).
type OnFound = Box<dyn FnOnce(&Misuse) + Send + Sync>;

/// A request body on its way upstream, scanned as it streams for the placeholders of secrets
/// bound elsewhere (each frame with the last `OVERLAP` bytes before it, so a placeholder split
/// across frames is seen). On one, the frame is not sent and the body ends in an error: the
/// upstream request is cut there (after the client's rest is read and dropped, up to `DRAIN`),
/// and `found` tells `relay` to answer 403.
struct Scanned {
    inner: Replay,
    /// The frames already scanned before the request went upstream.
    skip: usize,
    tail: Vec<u8>,
    secrets: Secrets,
    host: String,
    found: Arc<std::sync::Mutex<Option<Misuse>>>,
    on_found: Option<OnFound>,
    /// After a placeholder: how much of the client's rest was read and dropped.
    drained: Option<usize>,
}

impl Body for Scanned {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        const CUT: &str = "a placeholder of a secret bound elsewhere in the request body";
        loop {
            let f = match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(f)) => f,
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None if self.drained.is_some() => return Poll::Ready(Some(Err(CUT.into()))),
                None => return Poll::Ready(None),
            };
            // After a placeholder: the client's rest is read and dropped (so that it reads the
            // 403 instead of a reset), nothing more goes upstream, and the body ends cut.
            if let Some(n) = self.drained.as_mut() {
                *n += f.data_ref().map_or(0, |d| d.len());
                if *n >= DRAIN {
                    return Poll::Ready(Some(Err(CUT.into())));
                }
                continue;
            }
            if self.skip > 0 {
                self.skip -= 1;
                return Poll::Ready(Some(Ok(f)));
            }
            if let Some(d) = f.data_ref() {
                // Most frames hold no sign of a placeholder (`may_hold_placeholder`): then no copy
                // but the tail, here and across the seam with the frame before.
                let seam = [self.tail.as_slice(), &d[..d.len().min(OVERLAP)]].concat();
                if !crate::gate::secrets::may_hold_placeholder(&seam)
                    && !crate::gate::secrets::may_hold_placeholder(d)
                {
                    self.tail = match d.len() >= OVERLAP {
                        true => d[d.len() - OVERLAP..].to_vec(),
                        false => seam[seam.len().saturating_sub(OVERLAP)..].to_vec(),
                    };
                    return Poll::Ready(Some(Ok(f)));
                }
                let seen = [self.tail.as_slice(), d].concat();
                if let Some(m) = self.secrets.misuse(&seen, Some(&self.host)) {
                    if let Some(log) = self.on_found.take() {
                        log(&m);
                    }
                    *self.found.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
                    self.drained = Some(0);
                    continue;
                }
                self.tail = seen[seen.len().saturating_sub(OVERLAP)..].to_vec();
            }
            return Poll::Ready(Some(Ok(f)));
        }
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

/// A request body's frames the gate read before the request goes upstream (replayed in front
/// of the rest: `Replay`), and their bytes.
#[derive(Default)]
struct Ahead {
    frames: VecDeque<Frame<Bytes>>,
    seen: Vec<u8>,
    ended: bool,
}

impl Ahead {
    /// Reads one more frame (or the body's end); `Err` when the body broke off.
    async fn one(&mut self, body: &mut Incoming) -> Result<(), ()> {
        match body.frame().await {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    self.seen.extend_from_slice(d);
                }
                self.frames.push_back(f);
            }
            Some(Err(_)) => return Err(()),
            None => self.ended = true,
        }
        Ok(())
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
    upstream: Arc<rustls::ClientConfig>,
    sender: tokio::sync::Mutex<Option<hyper::client::conn::http1::SendRequest<Out>>>,
    /// Why there is no upstream (its TLS failed): every request is answered 502 with it.
    failed: Option<String>,
}

async fn dial_tls(
    cfg: Arc<rustls::ClientConfig>,
    host: &str,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(cfg).connect(name, tcp);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("TLS to {host} failed: {e}")),
        Err(_) => Err(format!("TLS to {host}: no handshake within {} s", HANDSHAKE_TIMEOUT.as_secs())),
    }
}

async fn handshake(
    tls: tokio_rustls::client::TlsStream<TcpStream>,
) -> Result<hyper::client::conn::http1::SendRequest<Out>, String> {
    let (sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn.with_upgrades());
    Ok(sender)
}

/// Relays one CONNECT whose host the session's secrets are bound to. `first` holds the
/// ClientHello already read (and its SNI already checked against the CONNECT's host).
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
    let cfg = ca.server_config(&host).map_err(std::io::Error::other)?;
    let up = first.len() as u64;
    session.up.fetch_add(up, Ordering::Relaxed);
    let replayed = Replayed { head: first, at: 0, inner: client, session: session.clone() };
    let accept = tokio_rustls::TlsAcceptor::from(cfg).accept(replayed);
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept).await {
        Ok(Ok(s)) => s,
        // The client refused the gate's certificate (it does not trust the CA) or hung up.
        _ => return Ok(()),
    };
    let addr = upstream.peer_addr()?;
    let sender = match dial_tls(upstream_cfg.clone(), &host, upstream).await {
        Ok(up) => handshake(up).await,
        Err(e) => Err(e),
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
    let svc = hyper::service::service_fn(move |req| {
        let conn = conn.clone();
        async move { Ok::<_, std::convert::Infallible>(relay(&conn, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(IDLE)
        .serve_connection(TokioIo::new(tls), svc)
        .with_upgrades()
        .await;
    Ok(())
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
    r
}

/// Logs a refusal of one request on a terminated connection and counts it for the session.
fn record(state: &State, session: &Session, host: &str, port: u16, r: &Asked, d: &Denial) {
    session.denied.fetch_add(1, Ordering::Relaxed);
    state.log(Entry {
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
    /// server closed it.
    async fn sender(&self) -> Result<hyper::client::conn::http1::SendRequest<Out>, String> {
        let mut slot = self.sender.lock().await;
        if let Some(mut s) = slot.take()
            && s.ready().await.is_ok()
        {
            return Ok(s);
        }
        let tcp = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(self.addr))
            .await
            .map_err(|_| format!("cannot connect to {}:{}", self.host, self.port))?
            .map_err(|e| format!("cannot connect to {}:{}: {e}", self.host, self.port))?;
        let _ = tcp.set_nodelay(true);
        handshake(dial_tls(self.upstream.clone(), &self.host, tcp).await?).await
    }

    async fn put_back(&self, s: hyper::client::conn::http1::SendRequest<Out>) {
        *self.sender.lock().await = Some(s);
    }
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
            let mut drained = ahead.seen.len();
            while !ahead.ended && drained < DRAIN {
                match body.frame().await {
                    Some(Ok(f)) => drained += f.data_ref().map_or(0, |d| d.len()),
                    _ => break,
                }
            }
            return c.denied_in_band(&asked, &d, report);
        }
    }
    parts.uri = match target.parse() {
        Ok(u) => u,
        Err(_) => return c.refuse(&asked, 400, "the request target does not parse", ""),
    };
    c.session.allowed.fetch_add(1, Ordering::Relaxed);
    c.state.log(Entry {
        path: Some(&logged),
        ..Entry::allowed(&c.session.id, &method, &c.host, c.port, &reason)
    });
    // Only codings the gate can read back come from upstream (`scrub::accept_encoding`).
    if let Some(ae) = parts.headers.get(hyper::header::ACCEPT_ENCODING) {
        let kept = scrub::accept_encoding(ae.to_str().unwrap_or(""));
        if let Ok(v) = hyper::header::HeaderValue::from_str(&kept) {
            parts.headers.insert(hyper::header::ACCEPT_ENCODING, v);
        }
    }
    // Frames after the first (a push's command list read ahead, then the rest as it comes).
    let checked: Vec<u8> =
        ahead.frames.iter().take(first).filter_map(|f| f.data_ref()).flatten().copied().collect();
    let found = Arc::new(std::sync::Mutex::new(None));
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
    };
    let req = Request::from_parts(parts, body.boxed());
    let mut sender = match c.sender().await {
        Ok(s) => s,
        Err(why) => return c.refuse(&asked, 502, &why, &format!("ai-sandbox gate: {why}")),
    };
    let resp = sender.send_request(req).await;
    c.put_back(sender).await;
    // A placeholder later in the body: the request was cut there (logged when it was found).
    if let Some(m) = found.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return refusal(403, &m.hint());
    }
    let mut resp = match resp {
        Ok(r) => r,
        Err(e) => {
            let why = format!("{} did not answer: {e}", c.host);
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
                state.log(Entry {
                    path: Some(&path),
                    ..Entry::allowed(&session, &method, &host, port, &reason)
                });
            }
        }
    };
    let status = resp.status();
    let bodiless = method == "HEAD"
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if bodiless {
        log_masked(&scrub);
    } else {
        let named =
            resp.headers().get(hyper::header::CONTENT_ENCODING).map(|v| v.to_str().unwrap_or("(not text)"));
        let coding = match scrub::coding(named) {
            Ok(coding) => coding,
            Err(other) => {
                let why = format!(
                    "{} answered with a body encoded as {other}, which the gate cannot read to keep bound values out of it",
                    c.host
                );
                return c.refuse(&asked, 502, &why, &format!("ai-sandbox gate: {why}"));
            }
        };
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
        let text = |h| resp.headers().get(h).and_then(|v: &hyper::header::HeaderValue| v.to_str().ok());
        let websocket = text(hyper::header::UPGRADE).is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
        let ext = text(hyper::header::SEC_WEBSOCKET_EXTENSIONS);
        let frames = websocket.then(|| (ws::Frames::new(ext, true), ws::Frames::new(ext, false)));
        let log = {
            let (state, session, host, port) = (c.state.clone(), c.session.clone(), c.host.clone(), c.port);
            move |d: &Denial| {
                record(&state, &session, &host, port, &Asked { method: &method, path: &path }, d)
            }
        };
        let (secrets, host) = (c.secrets.clone(), c.host.clone());
        tokio::spawn(async move {
            if let (Ok(a), Ok(b)) = (client_upgrade.await, server_upgrade.await) {
                let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
                match frames {
                    Some((up, down)) => {
                        let watch = WsWatch { up, down, secrets, host, scrub };
                        if let Some(d) = watch.relay(a, b).await {
                            log(&d);
                        }
                    }
                    None => {
                        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                    }
                }
            }
        });
    }
    resp.map(|b| b.map_err(BoxError::from).boxed())
}

/// A WebSocket through a terminated host, both directions read frame by frame (`ws::Frames`:
/// unmasked, inflated) with the bytes before each piece (a value split across frames or
/// messages is seen): the client's for the placeholders of secrets bound elsewhere, the
/// server's for the real values of this host's secrets in any spelling `scrub` knows (a server
/// that echoes the upgrade request's credentials). One found: the piece is not sent, both
/// connections close, and the refusal is returned for the log. Framing that does not parse
/// closes them too: what cannot be read is not relayed.
struct WsWatch {
    up: ws::Frames,
    down: ws::Frames,
    secrets: Secrets,
    host: String,
    scrub: Scrubber,
}

/// Why a WebSocket direction stopped.
enum Stop {
    Ended,
    Unreadable,
    Refused(Denial),
}

impl WsWatch {
    async fn relay<A, B>(self, a: A, b: B) -> Option<Denial>
    where
        A: AsyncRead + AsyncWrite + Unpin,
        B: AsyncRead + AsyncWrite + Unpin,
    {
        let WsWatch { mut up, mut down, secrets, host, mut scrub } = self;
        let (mut ar, mut aw) = tokio::io::split(a);
        let (mut br, mut bw) = tokio::io::split(b);
        let to_server = pump(&mut ar, &mut bw, &mut up, OVERLAP, |seen| {
            secrets.misuse(seen, Some(&host)).map(|m| Denial {
                status: 403,
                reason: format!(
                    "{} (in a WebSocket message; the connection was closed)",
                    m.reason(&host, false)
                ),
                hint: m.hint(),
                ..Denial::default()
            })
        });
        // The values may be long and spelled three bytes a character: a wider seam.
        let to_client = pump(&mut br, &mut aw, &mut down, 16 << 10, |seen| {
            scrub.whole(seen).map(|_| {
                let names: Vec<String> = scrub.replaced().into_iter().map(|(n, _)| n).collect();
                Denial {
                    status: 502,
                    reason: format!(
                        "a WebSocket message from {host} carried the real value of {}; the connection was closed",
                        names.join(", ")
                    ),
                    ..Denial::default()
                }
            })
        });
        tokio::pin!(to_server, to_client);
        // A side that ended lets the other finish (a close frame, the last answer); a refusal
        // or framing that does not parse ends both (returning drops the connections).
        let (stop, rest) = tokio::select! {
            s = &mut to_server => (s, true),
            s = &mut to_client => (s, false),
        };
        let stop = match stop {
            Stop::Ended if rest => (&mut to_client).await,
            Stop::Ended => (&mut to_server).await,
            other => other,
        };
        match stop {
            Stop::Refused(d) => Some(d),
            Stop::Ended | Stop::Unreadable => None,
        }
    }
}

/// Relays one direction of a WebSocket, each read's payload (with `seam` bytes before it)
/// shown to `bad` before the read goes on.
async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    frames: &mut ws::Frames,
    seam: usize,
    mut bad: impl FnMut(&[u8]) -> Option<Denial>,
) -> Stop
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut buf, mut tail) = (vec![0u8; 16 << 10], Vec::new());
    loop {
        let n = r.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            let _ = w.shutdown().await;
            return Stop::Ended;
        }
        let Ok(plain) = frames.feed(&buf[..n]) else { return Stop::Unreadable };
        let seen = [tail.as_slice(), &plain].concat();
        if let Some(d) = bad(&seen) {
            return Stop::Refused(d);
        }
        tail = seen[seen.len().saturating_sub(seam)..].to_vec();
        if w.write_all(&buf[..n]).await.is_err() {
            return Stop::Ended;
        }
    }
}
