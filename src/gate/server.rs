//! The gate process: lifecycle (one per user, idle exit, hand-over to the next gate, SIGTERM)
//! and the proxy connections' I/O: limits, timeouts, dialing, relaying. Every decision is made
//! by the pure functions in `decide` (and `request`, `tls`); sessions and the log are `state`;
//! the control protocol is `control`.

use super::control;
use super::decide::{self, Denial, RuleMatch, SessionPolicy, Target};
use super::http;
use super::log::Log;
use super::pipeline::{self, Asked, Need};
use super::request::{self, HeadError, Kind, MAX_HEAD};
use super::state::{Entry, Session, State};
use super::tls::{Hello, MAX_HELLO, parse_client_hello};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener};

const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Concurrent connections per session; past it, 503.
pub const SESSION_CAP: usize = 2048;
const TLS_PORTS: [u16; 2] = [443, 8443];
/// How long a starting gate waits for an exiting one to release the per-user lock.
const HANDOVER_WAIT: Duration = Duration::from_secs(10);

/// Takes the per-user gate lock. A gate is started only when none answers on the control
/// socket, so a held lock means the holder is exiting (it removes its socket first): wait for
/// it rather than leave, so the launcher that started us is served without a retry.
fn take_lock(dir: &Path) -> anyhow::Result<Option<nix::fcntl::Flock<std::fs::File>>> {
    use nix::fcntl::{Flock, FlockArg};
    let end = Instant::now() + HANDOVER_WAIT;
    let mut file = std::fs::File::create(dir.join("gate.lock"))?;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(guard) => return Ok(Some(guard)),
            Err((f, _)) if Instant::now() < end => {
                file = f;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return Ok(None),
        }
    }
}

pub(crate) fn serve(dir: PathBuf, port_from: u16, idle_exit: Duration) -> anyhow::Result<i32> {
    crate::sys::runtime::private_dir(&dir)?;
    // One gate per user. The guard is held until this function returns.
    let Some(_lock) = take_lock(&dir)? else {
        return Ok(0);
    };
    raise_fd_limit();
    // Whoever started it, SIGTERM and SIGINT must reach the handler (an inherited mask would
    // leave the gate deaf to `kill`).
    nix::sys::signal::SigSet::all().thread_unblock()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run(dir, port_from, idle_exit))
}

pub(super) fn raise_fd_limit() {
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
    use std::os::unix::fs::MetadataExt;
    use tokio::signal::unix::{SignalKind, signal};
    let sock = control::socket_path(&dir);
    let _ = std::fs::remove_file(&sock);
    let ctl = UnixListener::bind(&sock)?;
    std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    // Which socket file is ours: at exit the path may belong to a later gate (the runtime dir
    // was removed and made again while this one ran), whose socket must not be taken away.
    let ours = std::fs::metadata(&sock).map(|m| (m.dev(), m.ino()))?;
    let listener = bind_from(port_from).await?;
    let log = Log::open(&control::log_path(&dir))?;
    let dup = listener.as_fd().try_clone_to_owned()?;
    let state = Arc::new(State::new(listener.local_addr()?.port(), dup, log));
    let st = state.clone();
    tokio::spawn(async move {
        loop {
            match ctl.accept().await {
                Ok((s, _)) => {
                    tokio::spawn(control::serve_conn(st.clone(), s));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    let st = state.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if st.close_if_idle(idle_exit) {
                st.stop.notify_one();
            }
        }
    });
    // The counts of budgets with a period reach their files once a second.
    let st = state.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let s = st.clone();
            let _ = tokio::task::spawn_blocking(move || s.periods.merge_all()).await;
        }
    });
    let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    loop {
        tokio::select! {
            _ = state.stop.notified() => break,
            _ = term.recv() => { state.close(); break }
            _ = int.recv() => { state.close(); break }
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
    state.periods.merge_all();
    // Closed: no registration is accepted any more. Remove the socket so the next launcher
    // starts the next gate, which takes the lock as soon as this process returns. Only our own.
    if std::fs::metadata(&sock).is_ok_and(|m| (m.dev(), m.ino()) == ours) {
        let _ = std::fs::remove_file(&sock);
    }
    Ok(0)
}

async fn respond(s: &mut TcpStream, status: u16, body: &str) {
    respond_with(s, status, http::phrase(status), body).await
}

/// A reply whose reason phrase is `reason`: for a refusal, its hint, because the status line is
/// what most clients print of a failed CONNECT (Python, git), never the body.
async fn respond_with(s: &mut TcpStream, status: u16, reason: &str, body: &str) {
    let _ = s.write_all(http::response(status, reason, body).as_bytes()).await;
    let _ = s.shutdown().await;
    linger(s).await;
}

/// What the client still sends after the answer, read and dropped until it closes (at most
/// 8 MiB or 2 s): a socket closed with bytes unread resets the connection, and a client still
/// sending a refused upload then reads "connection reset" instead of the refusal.
async fn linger(s: &mut TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 << 10];
    let mut left: usize = 8 << 20;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        while left > 0 {
            match s.read(&mut buf).await {
                Ok(n) if n > 0 => left = left.saturating_sub(n),
                _ => break,
            }
        }
    })
    .await;
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

fn head_error(e: HeadError) -> (u16, &'static str) {
    match e {
        HeadError::TooLarge => (431, "request head too large"),
        HeadError::LengthRequired => (411, "chunked request bodies are not relayed; send Content-Length"),
        HeadError::Bad(why) => (400, why),
        HeadError::Incomplete => (400, "incomplete request"),
    }
}

/// One client connection: its request head, then the phases in order: who is asking
/// (`authenticate`) → what it may do (`admit`: placeholders, the policy read once, asked; the
/// budget, asked) → `dial` → the decision's record → the relay (`tunnel`, `forward`). A refusal
/// before the relay leaves through `refuse`, which counts, logs and answers.
pub(super) async fn proxy_conn(state: Arc<State>, mut client: TcpStream) {
    let mut buf = Vec::with_capacity(4096);
    let nobody = |status, reason| Entry::denied("-", "-", "-", 0, status, reason);
    let req = match tokio::time::timeout(HEADER_TIMEOUT, read_head(&mut client, &mut buf)).await {
        Err(_) => {
            state.note(nobody(408, "request head not received within the header timeout"));
            return respond(&mut client, 408, "ai-sandbox gate: request head timeout\n").await;
        }
        Ok(Err(e)) => {
            let (status, why) = head_error(e);
            state.note(nobody(status, why));
            return respond(&mut client, status, &format!("ai-sandbox gate: {why}\n")).await;
        }
        Ok(Ok(r)) => r,
    };
    let session = match authenticate(&state, &req) {
        Ok(s) => s,
        Err((status, body)) => return respond(&mut client, status, body).await,
    };
    let _active = Active(session.clone());
    let admitted = admit(&state, &session, &req, &buf).await;
    // Only the bytes after the head are kept; the head buffer is freed now.
    let leftover = buf[req.head_len..].to_vec();
    drop(buf);
    let Admitted { policy, target, rule, learned, budget } = match admitted {
        Ok(a) => a,
        Err(stop) => return refuse(&state, &session, &req, &mut client, stop, leftover.len()).await,
    };
    // Dialled only now: a host whose budget is spent gets no connection at all.
    let upstream = match dial(&policy, &req, &target).await {
        Ok(up) => up,
        Err(d) => {
            return refuse(&state, &session, &req, &mut client, Stop { d, learned, drain: false }, 0).await;
        }
    };
    let result = match req.kind {
        Kind::Connect => {
            let t = tunnel(
                &state,
                &session,
                &req,
                (&policy, &target, learned, budget.as_ref()),
                client,
                upstream,
                leftover,
            );
            match (t.await, &budget) {
                (Err(e), Some(a)) if super::budget::is_over(&e) => {
                    refused(&state, &session, &req, &a.denial(&policy.config_path), false);
                    Err(e)
                }
                (t, _) => t,
            }
        }
        Kind::Forward => {
            let host = target.to_string();
            let logged = match &rule {
                Some(m) => {
                    let reason = format!("allowed by rule = {}", m.rule);
                    let path = Some(m.path.as_str());
                    state.log(Entry { path, ..allowed(&req, &session.id, &host, &reason) })
                }
                None => state.log(relayed(&req, &session.id, &host, "allowed", learned)),
            };
            // Not on disk: not sent (the upstream connection closes unused).
            if let Err(unlogged) = logged {
                let stop = Stop { d: unlogged.denial(), learned, drain: false };
                return refuse(&state, &session, &req, &mut client, stop, 0).await;
            }
            session.allowed.fetch_add(1, Ordering::Relaxed);
            match rule {
                Some(m) => forward(&req.retargeted(&m.method, &m.target), client, upstream, leftover).await,
                None => forward(&req, client, upstream, leftover).await,
            }
        }
    };
    if let Ok((up, down)) = result {
        session.up.fetch_add(up, Ordering::Relaxed);
        session.down.fetch_add(down, Ordering::Relaxed);
    }
}

/// The session whose token the request carries, under its cap of connections at once; else
/// the answer (logged).
fn authenticate(state: &State, req: &request::Request) -> Result<Arc<Session>, (u16, &'static str)> {
    let denied =
        |session, status, reason| Entry::denied(session, &req.method, &req.host, req.port, status, reason);
    let Some(session) = state.authenticate(req.token.as_deref()) else {
        let (kind, why) = decide::unauthenticated(req.token.is_some());
        state.note(Entry { kind, ..denied("-", 407, why) });
        return Err((407, "ai-sandbox gate: proxy authentication required\n"));
    };
    if session.active.fetch_add(1, Ordering::SeqCst) >= SESSION_CAP {
        session.active.fetch_sub(1, Ordering::SeqCst);
        state.note(denied(&session.id, 503, "session connection cap reached"));
        return Err((503, "ai-sandbox gate: too many concurrent connections for this session\n"));
    }
    Ok(session)
}

/// What `admit` let through: the policy it was decided under, and what the relay needs.
struct Admitted {
    policy: Arc<SessionPolicy>,
    target: Target,
    rule: Option<RuleMatch>,
    /// Relayed only because the session is a learning run.
    learned: bool,
    budget: Option<super::budget::Allowance>,
}

/// A refusal before anything was relayed.
struct Stop {
    d: Denial,
    /// Of a learning run's unlisted host (which `learn` says it could not reach).
    learned: bool,
    /// A forwarded body is read and dropped first (never sent), so the client reads the answer.
    drain: bool,
}

/// The phases before the dial. A placeholder in a proxy request's head (CONNECT or plain HTTP)
/// or in the first KiB of a plain request's body: nothing is ever substituted there, so it is
/// going where its secret may not. Then the policy, read once for the request (`decide`, a
/// refusal asked), and the host's budget (`pipeline::budget`, asked too).
async fn admit(
    state: &State,
    session: &Session,
    req: &request::Request,
    buf: &[u8],
) -> Result<Admitted, Stop> {
    let scan = req.head_len + (buf.len() - req.head_len).min(super::secrets::BODY_SCAN);
    if let Some(m) = session.secrets.misuse(&buf[..scan], None) {
        let d = Denial {
            status: 403,
            reason: m.reason(&req.host, req.kind == Kind::Forward),
            hint: m.hint(),
            ..Denial::default()
        };
        return Err(Stop { d, learned: false, drain: false });
    }
    let mut policy = session.policy();
    let mut outcome = decide(&policy, req);
    if let Err(d) = &outcome
        && d.askable
        && let Some(asked) = ask(state, session, &policy, req, d).await
    {
        policy = asked;
        outcome = decide(&policy, req);
    }
    let Decided { target, rule, learned } = outcome.map_err(|d| Stop { d, learned: false, drain: false })?;
    // A budgeted host (a name: an address is counted by the sandbox's rules): nothing more once
    // it is spent (a forwarded request's whole length is known, so it goes whole or not at all).
    let need = match req.kind {
        Kind::Connect => Need::Open,
        Kind::Forward => Need::Whole((req.upstream_head.len() as u64).saturating_add(req.body_len)),
    };
    let budget = match &target {
        Target::Name(n) => {
            let asked = Asked { method: &req.method, host: n, port: req.port, path: None };
            pipeline::budget(state, session, &policy, &asked, need).await.map_err(|d| Stop {
                d,
                learned: false,
                drain: true,
            })?
        }
        _ => None,
    };
    Ok(Admitted { policy, target, rule, learned, budget })
}

/// Counts and logs a refusal (with the line that would lift it on offer).
fn refused(state: &State, session: &Session, req: &request::Request, d: &Denial, learned: bool) {
    session.denied.fetch_add(1, Ordering::Relaxed);
    state.note(Entry {
        hint: &d.hint,
        allow: d.allow.as_deref(),
        path: d.path.as_deref(),
        learned,
        ..Entry::denied(&session.id, &req.method, &req.host, req.port, d.status, &d.reason)
    });
}

/// The one exit for a request refused before the relay: counted, logged, answered with the
/// hint as the reason phrase and body. `buffered`: how much of a forwarded body was read already.
async fn refuse(
    state: &State,
    session: &Session,
    req: &request::Request,
    client: &mut TcpStream,
    stop: Stop,
    buffered: usize,
) {
    let Stop { d, learned, drain } = stop;
    refused(state, session, req, &d, learned);
    if drain && req.kind == Kind::Forward {
        let rest = req.body_len.saturating_sub(buffered as u64).min(super::request_body::DRAIN as u64);
        let _ = tokio::io::copy(&mut (&mut *client).take(rest), &mut tokio::io::sink()).await;
    }
    respond_with(client, d.status, &decide::reason_phrase(&d.hint), &format!("{}\n", d.hint)).await;
}

/// With `ask = SECONDS` and a watcher attached: holds the refused request and asks; returns the
/// policy to decide with again when the watcher lets it through (see `pipeline::ask`).
async fn ask(
    state: &State,
    s: &Session,
    policy: &SessionPolicy,
    req: &request::Request,
    d: &Denial,
) -> Option<Arc<SessionPolicy>> {
    let asked = Asked { method: &req.method, host: &req.host, port: req.port, path: None };
    match pipeline::ask(state, s, policy, &asked, d).await? {
        super::ask::Verdict::Once => {
            let target = decide::normalise(&req.host).ok()?;
            Some(Arc::new(decide::with_once(policy, &target, req.port, d.allow.as_deref())))
        }
        super::ask::Verdict::Allowed => Some(s.policy()),
        super::ask::Verdict::Deny => None,
    }
}

/// The reason logged for what a learning run relayed.
const LEARNED: &str =
    "learned: not in the allowlist, relayed because this is a learning run (ai-sandbox learn)";

/// A relayed request, as the log has it.
fn allowed<'a>(req: &'a request::Request, session: &'a str, host: &'a str, reason: &'a str) -> Entry<'a> {
    Entry::allowed(session, &req.method, host, req.port, reason)
}

/// A relayed request with no rule of its own: `reason`, or, for what a learning run relayed
/// (`decide::learns`), marked learned with why.
fn relayed<'a>(
    req: &'a request::Request,
    session: &'a str,
    host: &'a str,
    reason: &'a str,
    learned: bool,
) -> Entry<'a> {
    match learned {
        true => Entry { learned, ..allowed(req, session, host, LEARNED) },
        false => allowed(req, session, host, reason),
    }
}

/// A destination the policy allows, not yet dialled (the address checks come with the dial).
struct Decided {
    target: Target,
    /// The rule that let a plain HTTP request through (a host with rules).
    rule: Option<decide::RuleMatch>,
    /// Relayed only because the session is a learning run (`decide::learns`): logged as learned,
    /// tunnelled, never terminated.
    learned: bool,
}

/// What the policy says of a request, before anything is dialled: normalise → allowlist (with
/// the never-classes of IP literals; a learning run's unlisted hostname goes on as learned) →
/// rules. Then a spent budget is refused, and only then `dial` resolves, checks the address
/// classes and connects. Every refusal comes from `decide`.
fn decide(policy: &SessionPolicy, req: &request::Request) -> Result<Decided, Denial> {
    let target = decide::normalise(&req.host)?;
    let learned = match decide::check_target(policy, &target, req.port) {
        Ok(()) => false,
        Err(d) if decide::learns(policy, &target, req.port, &d) => true,
        Err(d) => return Err(d),
    };
    let rule = match (&target, req.kind) {
        (_, Kind::Connect) => decide::unreadable(policy, &target, req.port, &TLS_PORTS).map(|()| None)?,
        (Target::Name(n), Kind::Forward) => match decide::check_request(policy, &req.view(n))? {
            // The gate reads a push's command list where it opens TLS; plain HTTP is relayed.
            Some(m) if m.refs.is_some() => {
                return Err(super::push::unreadable(
                    "it is plain HTTP, which the gate relays unread",
                    &m.path,
                ));
            }
            // An MCP endpoint's messages and answers likewise: on a host with MCP rules, every
            // path (a server may route `/mcp/` or `/MCP` to its endpoint too).
            Some(m) if crate::policy::rule::host_mcp_tools(&policy.rules, n).is_some() => {
                let why = format!("{n} has MCP rules, and plain HTTP ({}) is relayed unread", m.path);
                let hint = format!("blocked by ai-sandbox: {why}; the gate reads MCP over HTTPS (443, 8443)");
                return Err(Denial { status: 403, reason: why, hint, ..Denial::default() });
            }
            m => m,
        },
        (Target::Ip(_), Kind::Forward) => None,
    };
    Ok(Decided { target, rule, learned })
}

/// Opens the connection a decided request goes to: the address checks (each resolved address
/// as the policy allows it), then exactly the addresses checked.
async fn dial(policy: &SessionPolicy, req: &request::Request, target: &Target) -> Result<TcpStream, Denial> {
    let d = |status, reason: String, hint: &str| Denial {
        status,
        reason,
        hint: hint.to_string(),
        allow: None,
        askable: false,
        path: None,
    };
    let addrs: Vec<IpAddr> = match target {
        // gate_addr on an allowed port is the host's loopback (checked in `check_target`).
        Target::Ip(ip) if decide::host_loopback(policy, *ip, req.port) => {
            let local = SocketAddr::from(([127, 0, 0, 1], req.port));
            return match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(local)).await {
                Ok(Ok(up)) => {
                    let _ = up.set_nodelay(true);
                    Ok(up)
                }
                _ => Err(d(
                    502,
                    format!("cannot connect to {target}:{} (the host's 127.0.0.1:{})", req.port, req.port),
                    "ai-sandbox gate: nothing accepts connections on that port of the host's loopback",
                )),
            };
        }
        Target::Ip(ip) => vec![*ip],
        Target::Name(n) => match decide::pinned(&policy.resolve, n) {
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
        match decide::check_address(policy, ip, req.port) {
            Ok(()) => ok.push(crate::policy::allow::canonical(ip)),
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
            return Ok(up);
        }
    }
    Err(d(
        502,
        format!("cannot connect to {target}:{}", req.port),
        "ai-sandbox gate: the destination did not accept the connection",
    ))
}

/// Reads until a complete ClientHello (or a reason there is none) within the header timeout.
async fn read_hello(client: &mut TcpStream, first: &mut Vec<u8>) -> Hello {
    let read = async {
        let mut chunk = vec![0u8; 4096];
        loop {
            match parse_client_hello(first) {
                Hello::NeedMore(n) if n <= MAX_HELLO + 5 => {}
                other => return other,
            }
            let n = client.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return Hello::NotTls("closed before a complete ClientHello");
            }
            first.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(HEADER_TIMEOUT, read)
        .await
        .unwrap_or(Hello::NotTls("no ClientHello within the header timeout"))
}

/// CONNECT: on a TLS port, 200 and then the SNI verdict before a byte goes upstream; on any
/// other port the decision is final already. Either way the tunnel is counted and logged once,
/// as allowed or denied, before the client can see anything that depends on it.
async fn tunnel(
    state: &Arc<State>,
    s: &Arc<Session>,
    req: &request::Request,
    (policy, target, learned, budget): (&SessionPolicy, &Target, bool, Option<&super::budget::Allowance>),
    mut client: TcpStream,
    mut upstream: TcpStream,
    mut first: Vec<u8>,
) -> std::io::Result<(u64, u64)> {
    let host = target.to_string();
    let allow = |reason| state.log(relayed(req, &s.id, &host, reason, learned));
    let deny =
        |status, reason: &str| state.note(Entry::denied(&s.id, &req.method, &host, req.port, status, reason));
    const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";
    if TLS_PORTS.contains(&req.port) {
        client.write_all(ESTABLISHED).await?;
        let hello = read_hello(&mut client, &mut first).await;
        if let Err(why) = decide::sni_verdict(&hello, target) {
            s.denied.fetch_add(1, Ordering::Relaxed);
            deny(403, &why);
            return Ok((0, 0));
        }
        // Not on disk: not relayed (the client has its 200, and gets the connection closed).
        if let Err(unlogged) = allow("allowed") {
            let d = unlogged.denial();
            s.denied.fetch_add(1, Ordering::Relaxed);
            deny(d.status, &d.reason);
            return Ok((0, 0));
        }
        s.allowed.fetch_add(1, Ordering::Relaxed);
        if let Target::Name(n) = target
            && !learned
            && (s.secrets.terminates(n) || crate::policy::rule::ruled(&policy.rules, n))
        {
            let up = match s.upstream() {
                Ok(up) => up,
                Err(why) => {
                    state.note(Entry {
                        hint: &why,
                        ..Entry::denied(&s.id, &req.method, &host, req.port, 502, &why)
                    });
                    return Ok((0, 0));
                }
            };
            let (state, s) = (state.clone(), s.clone());
            // Boxed: its future (TLS and hyper's connection) is large, and held inline it would
            // make every blind tunnel's future as large (bench/run's tunnels held at once).
            Box::pin(super::terminate::serve(state, s, n.clone(), req.port, up, client, first, upstream))
                .await?;
            return Ok((0, 0));
        }
    } else {
        if let Err(unlogged) = allow("allowed") {
            let d = unlogged.denial();
            s.denied.fetch_add(1, Ordering::Relaxed);
            deny(d.status, &d.reason);
            respond(&mut client, d.status, &format!("{}\n", d.hint)).await;
            return Ok((0, 0));
        }
        s.allowed.fetch_add(1, Ordering::Relaxed);
        client.write_all(ESTABLISHED).await?;
    }
    // What the client sent with or after its CONNECT (its ClientHello) counts as well.
    let allowed = budget.map_or(first.len(), |a| a.take(first.len() as u64) as usize);
    upstream.write_all(&first[..allowed]).await?;
    if allowed < first.len() {
        return Err(super::budget::over());
    }
    super::splice::relay(&client, &upstream, Some(IDLE_TIMEOUT), budget)
        .await
        .map(|(a, b)| (a + first.len() as u64, b))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::allow::{Allow, Ports};
    use base64::Engine;

    /// Plain HTTP is relayed unread, so a rule that needs the body read refuses it: a push
    /// limited by ref, and anything to a host with MCP rules; a plain rule lets its request
    /// through where neither is.
    #[test]
    fn plain_http_to_an_endpoint_whose_rule_reads_the_body_is_refused() {
        let mut policy = SessionPolicy::default();
        policy.allow.hosts.push((crate::policy::allow::HostPattern::Exact("api.test".into()), None));
        policy.rules = crate::policy::rule::parse("api.test mcp /mcp search_*").unwrap();
        policy.rules.extend(crate::policy::rule::parse("api.test git-push /r.git refs/heads/a/*").unwrap());
        policy.rules.extend(crate::policy::rule::parse("api.test GET /ok").unwrap());
        let at = |method: &str, path: &str| {
            let raw = format!("{method} http://api.test{path} HTTP/1.1\r\nHost: api.test\r\n\r\n");
            decide(&policy, &request::parse(raw.as_bytes()).unwrap())
        };
        let d = at("POST", "/mcp").err().expect("an MCP endpoint over plain HTTP");
        assert!(d.reason.contains("has MCP rules") && d.hint.contains("HTTPS"), "{d:?}");
        assert!(at("GET", "/ok").is_err(), "another path of a host with MCP rules over plain HTTP");
        let mut no_mcp = policy.clone();
        no_mcp.rules.retain(|r| r.tools.is_empty());
        let at = |method: &str, path: &str| {
            let raw = format!("{method} http://api.test{path} HTTP/1.1\r\nHost: api.test\r\n\r\n");
            decide(&no_mcp, &request::parse(raw.as_bytes()).unwrap())
        };
        assert!(at("POST", "/r.git/git-receive-pack").is_err(), "a limited push over plain HTTP");
        assert!(at("GET", "/ok").is_ok_and(|d| d.rule.is_some()));
    }

    /// One client connection through `proxy_conn`, with the decision log `log`: a request to
    /// the host's loopback port of a listener the test holds. Returns the gate's answer, what
    /// the listener received, and the session's counts (allowed, denied).
    async fn through(log: Log, connect: bool) -> (String, Vec<u8>, (u64, u64)) {
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = upstream.local_addr().unwrap().port();
        let sock = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let state = Arc::new(State::new(0, std::os::fd::OwnedFd::from(sock), log));
        let mut policy = SessionPolicy::default();
        match crate::policy::allow::parse(&format!("100.64.0.1:{port}")).unwrap() {
            Allow::Net(n, ports) => policy.allow.nets.push((n, ports.unwrap_or(Ports::ALL))),
            other => panic!("{other:?}"),
        }
        let session = Arc::new(Session::new("s1".into(), "/p".into(), "t".repeat(32), policy));
        assert!(state.register(session.clone()));
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("aisb:{}", "t".repeat(32)));
        let head = if connect {
            format!("CONNECT 100.64.0.1:{port} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\nhello")
        } else {
            format!(
                "GET http://100.64.0.1:{port}/x HTTP/1.1\r\nHost: 100.64.0.1:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
            )
        };
        let gate = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = gate.local_addr().unwrap();
        let served = tokio::spawn({
            let state = state.clone();
            async move { proxy_conn(state, gate.accept().await.unwrap().0).await }
        });
        let received = tokio::spawn(async move {
            let (mut s, _) = upstream.accept().await.unwrap();
            let mut got = vec![0u8; 256];
            let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut got))
                .await
                .map_or(0, |r| r.unwrap_or(0));
            got.truncate(n);
            if !connect && n > 0 {
                let _ =
                    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").await;
            }
            got
        });
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut answer)).await;
        drop(client);
        served.await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), received)
            .await
            .map(|r| r.unwrap())
            .unwrap_or_default();
        let counts = (session.allowed.load(Ordering::Relaxed), session.denied.load(Ordering::Relaxed));
        (String::from_utf8_lossy(&answer).into_owned(), got, counts)
    }

    /// No decision without its record: when the log cannot be written (a full disk), an allowed
    /// request is refused and nothing reaches its destination; with a log that works, the same
    /// request goes through (the control).
    #[tokio::test]
    async fn a_request_whose_decision_cannot_be_logged_is_refused_and_never_sent() {
        for connect in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("gate.log");
            let (answer, got, counts) = through(Log::open(&path).unwrap(), connect).await;
            let sent = if connect { "hello" } else { "GET /x HTTP/1.1" };
            assert!(String::from_utf8_lossy(&got).starts_with(sent), "connect={connect}: {got:?} {answer}");
            assert!(answer.starts_with("HTTP/1.1 200"), "connect={connect}: {answer}");
            assert_eq!(counts, (1, 0));
            assert!(std::fs::read_to_string(&path).unwrap().contains(r#""decision":"allow""#));

            let (answer, got, counts) = through(Log::open(Path::new("/dev/full")).unwrap(), connect).await;
            assert!(got.is_empty(), "connect={connect}: sent without its record: {got:?}");
            assert!(answer.starts_with("HTTP/1.1 503"), "connect={connect}: {answer}");
            assert!(answer.contains("could not be recorded"), "{answer}");
            assert_eq!(counts, (0, 1), "counted as the refusal it is");
        }
    }

    /// Every connection's future is allocated whole when it is spawned, whatever path it takes:
    /// a large state held inline (the terminated path's TLS and hyper connection was 10 KiB of
    /// a 13 KiB future) is paid by each of thousands of blind tunnels (bench/run's "tunnels held
    /// at once" row). Boxed where it is large, the whole future stays small.
    #[tokio::test]
    async fn a_connections_future_stays_small() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(State::for_test(dir.path()));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let size = std::mem::size_of_val(&proxy_conn(state, c));
        assert!(size <= 4096, "proxy_conn's future is {size} bytes");
    }
}
