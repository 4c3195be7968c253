//! The gate process: a control socket for sessions and a proxy listener on 127.0.0.1 only
//! (the first free port at or above `--port-from`). Pure decisions live in `request`,
//! `decide` and `tls`; this file does I/O: limits, timeouts, dialing, relaying, logging.

use super::control::{self, Reply, Request as Ctl, SessionStatus};
use super::decide::{self, Denial, SessionPolicy, Target};
use super::log::{self, Event};
use super::request::{self, HeadError, Kind, MAX_HEAD};
use super::tls::{Hello, MAX_HELLO, parse_client_hello};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener};

pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Concurrent connections per session; past it, 503.
pub const SESSION_CAP: usize = 2048;
pub const TLS_PORTS: [u16; 2] = [443, 8443];
pub const LOG_FLUSH: Duration = Duration::from_millis(100);

struct Session {
    id: String,
    project: String,
    token: String,
    policy: SessionPolicy,
    started: String,
    allowed: AtomicU64,
    denied: AtomicU64,
    active: AtomicUsize,
    up: AtomicU64,
    down: AtomicU64,
}

struct State {
    port: u16,
    sessions: RwLock<Vec<Arc<Session>>>,
    /// Decision lines, flushed to the log file by a writer thread every LOG_FLUSH: no file I/O
    /// and no thread wake-up on the connection path.
    log: Arc<Mutex<String>>,
    /// When the session count last changed (for idle exit).
    changed: Mutex<Instant>,
    stop: tokio::sync::Notify,
}

impl State {
    fn log(&self, session: &str, method: &str, host: &str, port: u16, status: u16, reason: &str) {
        let e = Event {
            time: log::now(),
            session: session.to_string(),
            method: method.to_string(),
            host: host.to_string(),
            port,
            decision: if status == 200 { "allow" } else { "deny" }.into(),
            status,
            reason: reason.to_string(),
        };
        if let Ok(line) = serde_json::to_string(&e)
            && let Ok(mut buf) = self.log.lock()
        {
            buf.push_str(&line);
            buf.push('\n');
        }
    }
}

pub fn serve(port_from: u16, idle_exit: Duration) -> anyhow::Result<i32> {
    let dir = control::runtime_dir();
    control::private_dir(&dir)?;
    // One gate per user: whoever holds the lock serves; a second starter leaves quietly.
    let lock = std::fs::File::create(dir.join("gate.lock"))?;
    // The guard is held until this function returns: the lock lives as long as the gate.
    let Ok(_lock) = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock) else {
        return Ok(0);
    };
    raise_fd_limit();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run(dir, port_from, idle_exit))
}

fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

async fn bind_from(port_from: u16) -> anyhow::Result<TcpListener> {
    for port in port_from..=port_from.saturating_add(200) {
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)).await {
            return Ok(l);
        }
    }
    anyhow::bail!("no free port on 127.0.0.1 from {port_from} to {}", port_from.saturating_add(200))
}

async fn run(dir: PathBuf, port_from: u16, idle_exit: Duration) -> anyhow::Result<i32> {
    let sock = control::socket_path(&dir);
    let _ = std::fs::remove_file(&sock);
    let ctl = UnixListener::bind(&sock)?;
    std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let listener = bind_from(port_from).await?;
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(control::log_path(&dir))?;
    let log = Arc::new(Mutex::new(String::new()));
    let pending = log.clone();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(LOG_FLUSH);
            let batch = std::mem::take(&mut *pending.lock().unwrap());
            if !batch.is_empty() {
                let _ = file.write_all(batch.as_bytes());
            }
        }
    });
    let state = Arc::new(State {
        port: listener.local_addr()?.port(),
        sessions: RwLock::new(Vec::new()),
        log,
        changed: Mutex::new(Instant::now()),
        stop: tokio::sync::Notify::new(),
    });
    let st = state.clone();
    tokio::spawn(async move {
        loop {
            match ctl.accept().await {
                Ok((s, _)) => {
                    tokio::spawn(control_conn(st.clone(), s));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    let st = state.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let empty = st.sessions.read().map(|s| s.is_empty()).unwrap_or(false);
            let since = st.changed.lock().map(|c| c.elapsed()).unwrap_or_default();
            if empty && since >= idle_exit {
                st.stop.notify_one();
            }
        }
    });
    loop {
        tokio::select! {
            _ = state.stop.notified() => break,
            r = listener.accept() => match r {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    tokio::spawn(proxy_conn(state.clone(), s));
                }
                // EMFILE/ENFILE and friends: back off and keep serving (fd exhaustion survived).
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
        }
    }
    let _ = std::fs::remove_file(&sock);
    std::thread::sleep(LOG_FLUSH * 2);
    Ok(0)
}

async fn control_conn(state: Arc<State>, s: tokio::net::UnixStream) {
    let (rd, mut wr) = s.into_split();
    let mut rd = tokio::io::BufReader::new(rd);
    let mut line = String::new();
    if rd.read_line(&mut line).await.unwrap_or(0) == 0 {
        return;
    }
    async fn send(wr: &mut tokio::net::unix::OwnedWriteHalf, r: Reply) {
        let _ = wr.write_all((serde_json::to_string(&r).unwrap_or_default() + "\n").as_bytes()).await;
    }
    let ok = Reply { ok: true, port: state.port, pid: std::process::id(), ..Reply::default() };
    match serde_json::from_str::<Ctl>(&line) {
        Ok(Ctl::Register { session, project, token, policy }) => {
            let s = Arc::new(Session {
                id: session,
                project,
                token,
                policy,
                started: log::now(),
                allowed: AtomicU64::new(0),
                denied: AtomicU64::new(0),
                active: AtomicUsize::new(0),
                up: AtomicU64::new(0),
                down: AtomicU64::new(0),
            });
            if let Ok(mut all) = state.sessions.write() {
                all.push(s.clone());
            }
            *state.changed.lock().unwrap() = Instant::now();
            send(&mut wr, ok).await;
            // The session lives as long as this connection.
            let mut sink = Vec::new();
            let _ = rd.read_to_end(&mut sink).await;
            if let Ok(mut all) = state.sessions.write() {
                all.retain(|x| !Arc::ptr_eq(x, &s));
            }
            *state.changed.lock().unwrap() = Instant::now();
        }
        Ok(Ctl::Status) => {
            let sessions = state
                .sessions
                .read()
                .map(|all| {
                    all.iter()
                        .map(|s| SessionStatus {
                            session: s.id.clone(),
                            project: s.project.clone(),
                            started: s.started.clone(),
                            allowed: s.allowed.load(Ordering::Relaxed),
                            denied: s.denied.load(Ordering::Relaxed),
                            active: s.active.load(Ordering::Relaxed) as u64,
                            bytes_up: s.up.load(Ordering::Relaxed),
                            bytes_down: s.down.load(Ordering::Relaxed),
                        })
                        .collect()
                })
                .unwrap_or_default();
            send(&mut wr, Reply { sessions, ..ok }).await;
        }
        Ok(Ctl::Stop) => {
            send(&mut wr, ok).await;
            state.stop.notify_one();
        }
        Err(e) => send(&mut wr, Reply { error: Some(format!("bad request: {e}")), ..Reply::default() }).await,
    }
}

fn phrase(status: u16) -> &'static str {
    match status {
        200 => "Connection established",
        400 => "Bad Request",
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        411 => "Length Required",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

async fn respond(s: &mut TcpStream, status: u16, body: &str) {
    let extra = if status == 407 { "Proxy-Authenticate: Basic realm=\"ai-sandbox\"\r\n" } else { "" };
    let msg = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
        phrase(status),
        body.len()
    );
    let _ = s.write_all(msg.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// Decrements a session's active count when a connection ends.
struct Active(Arc<Session>);
impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn read_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> Result<request::Request, HeadError> {
    // On the heap, not in the future's state: a long-lived tunnel's task must stay small.
    let mut chunk = vec![0u8; 4096];
    loop {
        match request::parse(buf) {
            Err(HeadError::Incomplete) => {}
            other => return other,
        }
        let n = s.read(&mut chunk).await.map_err(|_| HeadError::Bad("read error"))?;
        if n == 0 {
            return Err(HeadError::Bad("connection closed mid-request"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_HEAD + 4096 {
            return Err(HeadError::TooLarge);
        }
    }
}

async fn proxy_conn(state: Arc<State>, mut client: TcpStream) {
    let mut buf = Vec::with_capacity(4096);
    let req = match tokio::time::timeout(HEADER_TIMEOUT, read_head(&mut client, &mut buf)).await {
        Err(_) => {
            state.log("-", "-", "-", 0, 408, "request head not received within the header timeout");
            return respond(&mut client, 408, "ai-sandbox gate: request head timeout\n").await;
        }
        Ok(Err(e)) => {
            let (status, why) = match e {
                HeadError::TooLarge => (431, "request head too large"),
                HeadError::LengthRequired => {
                    (411, "chunked request bodies are not relayed; send Content-Length")
                }
                HeadError::Bad(why) => (400, why),
                HeadError::Incomplete => (400, "incomplete request"),
            };
            state.log("-", "-", "-", 0, status, why);
            return respond(&mut client, status, &format!("ai-sandbox gate: {why}\n")).await;
        }
        Ok(Ok(r)) => r,
    };
    // 1. authenticate
    let session = {
        let all = state.sessions.read().map(|a| a.clone()).unwrap_or_default();
        let tokens: Vec<&str> = all.iter().map(|s| s.token.as_str()).collect();
        decide::authenticate(&tokens, req.token.as_deref()).map(|i| all[i].clone())
    };
    let Some(session) = session else {
        state.log("-", &req.method, &req.host, req.port, 407, "missing or wrong session token");
        return respond(&mut client, 407, "ai-sandbox gate: proxy authentication required\n").await;
    };
    if session.active.fetch_add(1, Ordering::SeqCst) >= SESSION_CAP {
        session.active.fetch_sub(1, Ordering::SeqCst);
        state.log(&session.id, &req.method, &req.host, req.port, 503, "session connection cap reached");
        return respond(
            &mut client,
            503,
            "ai-sandbox gate: too many concurrent connections for this session\n",
        )
        .await;
    }
    let _active = Active(session.clone());
    match decide_and_dial(&state, &session, &req).await {
        Err(d) => {
            session.denied.fetch_add(1, Ordering::Relaxed);
            state.log(&session.id, &req.method, &req.host, req.port, d.status, &d.reason);
            respond(&mut client, d.status, &format!("{}\n", d.hint)).await;
        }
        Ok((target, upstream)) => {
            session.allowed.fetch_add(1, Ordering::Relaxed);
            let host = target.to_string();
            state.log(&session.id, &req.method, &host, req.port, 200, "allowed");
            // Only the bytes after the head are kept; the head buffer is freed now.
            let leftover = buf[req.head_len..].to_vec();
            drop(buf);
            let result = match req.kind {
                Kind::Connect => tunnel(&state, &session, &req, &target, client, upstream, leftover).await,
                Kind::Forward => forward(&req, client, upstream, leftover).await,
            };
            if let Ok((up, down)) = result {
                session.up.fetch_add(up, Ordering::Relaxed);
                session.down.fetch_add(down, Ordering::Relaxed);
            }
        }
    }
}

/// Normalise → allowlist → resolve → address classes → dial.
async fn decide_and_dial(
    state: &State,
    s: &Session,
    req: &request::Request,
) -> Result<(Target, TcpStream), Denial> {
    let target = decide::normalise(&req.host)?;
    let d = |status, reason: String, hint: &str| Denial { status, reason, hint: hint.to_string() };
    if let Target::Ip(ip) = &target
        && (*ip == IpAddr::V4(s.policy.gate_addr) || (ip.is_loopback() && req.port == state.port))
    {
        return Err(d(
            403,
            format!("{ip}:{} is the gate or the host loopback mapping", req.port),
            "blocked by ai-sandbox: the gate does not relay to itself or to gate_addr; allowed gate_addr ports are reached directly",
        ));
    }
    decide::check_target(&s.policy, &target, req.port)?;
    let addrs: Vec<IpAddr> = match &target {
        Target::Ip(ip) => vec![*ip],
        Target::Name(n) => match decide::pinned(&s.policy, n) {
            Some(ip) => vec![ip],
            None => match tokio::time::timeout(DIAL_TIMEOUT, tokio::net::lookup_host((n.as_str(), req.port)))
                .await
            {
                Ok(Ok(it)) => it.map(|a| a.ip()).collect(),
                _ => {
                    return Err(d(
                        502,
                        format!("cannot resolve {n}"),
                        "ai-sandbox gate: the name does not resolve on the host",
                    ));
                }
            },
        },
    };
    let mut first_denial = None;
    let mut ok: Vec<IpAddr> = Vec::new();
    for ip in addrs {
        match decide::check_address(&s.policy, ip, req.port) {
            Ok(()) => ok.push(decide::canonical(ip)),
            Err(e) => {
                first_denial.get_or_insert(e);
            }
        }
    }
    if ok.is_empty() {
        return Err(
            first_denial.unwrap_or_else(|| d(502, "no address".into(), "ai-sandbox gate: no address"))
        );
    }
    for ip in ok {
        // Dial exactly the validated address: no second lookup.
        if let Ok(Ok(up)) =
            tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(SocketAddr::new(ip, req.port))).await
        {
            let _ = up.set_nodelay(true);
            return Ok((target, up));
        }
    }
    Err(d(
        502,
        format!("cannot connect to {target}:{}", req.port),
        "ai-sandbox gate: the destination did not accept the connection",
    ))
}

async fn tunnel(
    state: &State,
    s: &Session,
    req: &request::Request,
    target: &Target,
    mut client: TcpStream,
    mut upstream: TcpStream,
    mut first: Vec<u8>,
) -> std::io::Result<(u64, u64)> {
    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
    if TLS_PORTS.contains(&req.port) {
        let hello = tokio::time::timeout(HEADER_TIMEOUT, async {
            let mut chunk = vec![0u8; 4096];
            loop {
                match parse_client_hello(&first) {
                    Hello::NeedMore(n) if n <= MAX_HELLO + 5 => {}
                    other => return other,
                }
                let n = client.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    return Hello::NotTls("closed before a complete ClientHello");
                }
                first.extend_from_slice(&chunk[..n]);
            }
        })
        .await
        .unwrap_or(Hello::NotTls("no ClientHello within the header timeout"));
        let refusal = match (&hello, target) {
            (Hello::Sni(Some(sni)), Target::Name(n)) if sni == n => None,
            (Hello::Sni(None), Target::Ip(_)) => None,
            (Hello::Sni(Some(sni)), _) => {
                Some(format!("TLS SNI `{sni}` differs from the CONNECT host {target}"))
            }
            (Hello::Sni(None), _) => Some("TLS ClientHello without SNI".to_string()),
            (Hello::NotTls(why), _) => Some(format!("not TLS on a TLS port: {why}")),
            (Hello::NeedMore(_), _) => Some("ClientHello too large".to_string()),
        };
        if let Some(why) = refusal {
            s.denied.fetch_add(1, Ordering::Relaxed);
            state.log(&s.id, &req.method, &target.to_string(), req.port, 403, &why);
            return Ok((0, 0));
        }
    }
    upstream.write_all(&first).await?;
    super::splice::relay(&client, &upstream, IDLE_TIMEOUT).await.map(|(a, b)| (a + first.len() as u64, b))
}

async fn forward(
    req: &request::Request,
    mut client: TcpStream,
    mut upstream: TcpStream,
    leftover: Vec<u8>,
) -> std::io::Result<(u64, u64)> {
    upstream.write_all(&req.upstream_head).await?;
    let in_buf = (leftover.len() as u64).min(req.body_len) as usize;
    upstream.write_all(&leftover[..in_buf]).await?;
    let rest = req.body_len - in_buf as u64;
    let sent = tokio::io::copy(&mut (&mut client).take(rest), &mut upstream).await?;
    if sent < rest {
        return Ok((in_buf as u64 + sent, 0));
    }
    // One request per connection: anything else the client sends is not relayed.
    let down = super::splice::copy(&upstream, &client, IDLE_TIMEOUT).await?;
    Ok((req.upstream_head.len() as u64 + req.body_len, down))
}
