//! `bench terminate GATE --count N`: what opening TLS for a bound secret's host costs, and what
//! a host's rules add. An HTTPS server (a CA made here, on ADDR:8443) answers small requests;
//! three gate sessions allow it: one as a blind tunnel, one with a secret bound to it (the gate
//! terminates TLS, substitutes the placeholder, and verifies the server with the bench CA as
//! `upstream_ca`), and one with the same secret and 1,000 rules for the host, the last of which
//! allows the request. Over each, one sample of each path in turn: a new connection (CONNECT,
//! the TLS handshake and one request's answer), N requests kept alive on one connection, and a
//! streamed response (its first event, the last one 20 ms later); then BYTES down and up on
//! that connection (tunnel and terminated), and the gate's RSS with HELD terminated connections
//! open.
//! A fifth holds a login (ADR 0087): its first request on a new connection, and its refresh
//! (made by the gate at the server's token endpoint, and stored) beside a POST of the same size,
//! counting the server's token requests (`terminate refresh N UPSTREAM P50 P99 POST_P50
//! POST_P99`).
//! Two more sessions POST an MCP tools/call (JSON-RPC) to a path with a plain rule and one with
//! an MCP rule that reads it (`rule = HOST mcp PATH TOOL`).
//! Prints `terminate setup|request tunnel|terminated|ruled P50 P99` (ms), `terminate mcp
//! pathrule|mcprule P50 P99` (ms), `terminate transfer
//! tunnel|terminated DOWN UP` and `terminate websocket tunnel|terminated DOWN UP` (MB/s), `terminate event tunnel|terminated FIRST_P50 FIRST_P99
//! END_P50` (ms from the request's write) and `terminate held N IDLE_KIB RSS_KIB`.

use super::{arg, need, pct, session_policy};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

const PORT: u16 = 8443;
const PLACEHOLDER: &str = "aisb_placeholder_0000000000000000bench000000000000";
const KEY: &str = "bench-real-key";
/// The held login's placeholders (its access token's, its refresh token's).
const LOGIN_ACCESS: &str = "sk-ant-oat01-aisb_placeholder_00000000bench0000login00000000";
const LOGIN_REFRESH: &str = "sk-ant-ort01-aisb_placeholder_00000000bench0000login00000000";
/// The token requests the bench server has answered (a refresh through the gate is one each).
static REFRESHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// The server's pause between a streamed response's first event and its last.
const EVENT_GAP: std::time::Duration = std::time::Duration::from_millis(20);

pub(super) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA and a server config for `host` signed by it: (the CA's PEM, the config).
pub(super) fn server(host: &str) -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![host.to_string()]).unwrap().signed_by(&key, &issuer).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    (ca_pem, Arc::new(cfg))
}

/// Reads until the bytes read so far end with `end` (`None`: the stream ended first).
fn read_until(s: &mut impl Read, got: &mut Vec<u8>, end: &[u8]) -> Option<()> {
    let mut b = [0u8; 1];
    while !got.ends_with(end) {
        if s.read(&mut b).ok()? == 0 {
            return None;
        }
        got.push(b[0]);
    }
    Some(())
}

/// Reads one HTTP head (to the blank line) and, with `body`, the body after it.
fn read_message(s: &mut impl Read, body: bool) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    read_until(s, &mut got, b"\r\n\r\n")?;
    if body {
        read_body(s, &got, &mut std::io::sink())?;
    }
    Some(got)
}

/// Reads the body after `head` into `out`, as its head frames it (chunked, or Content-Length:
/// the gate sends a terminated host's bodies chunked, since masking can change their length);
/// the body's length.
fn read_body(s: &mut impl Read, head: &[u8], out: &mut impl Write) -> Option<u64> {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    if text.contains("transfer-encoding: chunked") {
        let mut total = 0;
        loop {
            let mut line = Vec::new();
            read_until(s, &mut line, b"\r\n")?;
            let size = String::from_utf8_lossy(&line);
            let n = u64::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut end = Vec::new();
            if n == 0 {
                read_until(s, &mut end, b"\r\n")?;
                return Some(total);
            }
            total += std::io::copy(&mut s.by_ref().take(n), out).ok()?;
            read_until(s, &mut end, b"\r\n")?;
        }
    }
    let n = text.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok());
    std::io::copy(&mut s.by_ref().take(n.unwrap_or(0)), out).ok()
}

/// One WebSocket frame header (binary, final; masked with a zero key from the client).
fn ws_header(len: usize, masked: bool) -> Vec<u8> {
    let mut h = vec![0x82];
    let m = if masked { 0x80 } else { 0 };
    match len {
        0..=125 => h.push(m | len as u8),
        126..=65535 => {
            h.push(m | 126);
            h.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            h.push(m | 127);
            h.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    if masked {
        h.extend_from_slice(&[0, 0, 0, 0]);
    }
    h
}

/// The WebSocket frame size of the bench's messages.
const WS_FRAME: usize = 64 << 10;

/// N bytes down as unmasked frames of `WS_FRAME`.
fn ws_down(s: &mut impl Write, n: u64) -> bool {
    let payload = vec![b'w'; WS_FRAME];
    let mut left = n as usize;
    while left > 0 {
        let k = left.min(WS_FRAME);
        if s.write_all(&ws_header(k, false)).is_err() || s.write_all(&payload[..k]).is_err() {
            return false;
        }
        left -= k;
    }
    s.flush().is_ok()
}

/// Reads the client's frames (payloads dropped) until its close frame, then closes too.
fn ws_up(s: &mut (impl Read + Write)) -> bool {
    let mut frame = || -> Option<u8> {
        let mut h = [0u8; 2];
        s.read_exact(&mut h).ok()?;
        let len = match h[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                s.read_exact(&mut b).ok()?;
                u64::from(u16::from_be_bytes(b))
            }
            127 => {
                let mut b = [0u8; 8];
                s.read_exact(&mut b).ok()?;
                u64::from_be_bytes(b)
            }
            n => u64::from(n),
        };
        let mask = if h[1] & 0x80 != 0 { 4 } else { 0 };
        std::io::copy(&mut Read::by_ref(s).take(len + mask), &mut std::io::sink()).ok()?;
        Some(h[0] & 0x0f)
    };
    loop {
        match frame() {
            Some(8) => break,
            Some(_) => {}
            None => return false,
        }
    }
    s.write_all(&[0x88, 0]).is_ok() && s.flush().is_ok()
}

/// A server-sent event as one chunk of a chunked body.
fn chunk(s: &mut impl Write, data: &str) -> bool {
    write!(s, "{:x}\r\n{data}\r\n", data.len()).is_ok() && s.flush().is_ok()
}

/// `GET /big/N`: N bytes; `PUT /up/N`: reads N bytes; `GET /events`: an event stream, its first
/// event at once and the last EVENT_GAP later; anything else: `ok`.
fn serve(listener: TcpListener, cfg: Arc<rustls::ServerConfig>) {
    for tcp in listener.incoming().flatten() {
        let cfg = cfg.clone();
        std::thread::spawn(move || {
            let _ = tcp.set_nodelay(true);
            let mut s = rustls::StreamOwned::new(rustls::ServerConnection::new(cfg).unwrap(), tcp);
            while let Some(head) = read_message(&mut s, false) {
                let head = String::from_utf8_lossy(&head);
                let n = |p: &str| head.split_whitespace().nth(1)?.strip_prefix(p)?.parse::<u64>().ok();
                let ok = if head.starts_with("GET /ws/") {
                    // A WebSocket: N bytes of unmasked binary frames down, then the client's
                    // frames read (not parsed) until it sends its close frame's 2 bytes.
                    let n = n("/ws/").unwrap_or(0);
                    let _ = s.write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: bench\r\n\r\n",
                    );
                    ws_down(&mut s, n) && ws_up(&mut s)
                } else if head.starts_with("GET /events ") {
                    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                        .is_ok()
                        && chunk(&mut s, "data: first\n\n")
                        && {
                            std::thread::sleep(EVENT_GAP);
                            chunk(&mut s, "data: last\n\n")
                        }
                        && s.write_all(b"0\r\n\r\n").is_ok()
                } else if let Some(n) = n("/mcp/") {
                    // An MCP tools/call's answer, after its body of N bytes.
                    let _ = std::io::copy(&mut (&mut s).take(n), &mut std::io::sink());
                    let body =
                        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}"#;
                    write!(s, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).is_ok()
                } else if head.starts_with("POST /oauth/token ") {
                    // A held login's refresh: counted; answered with the next tokens when the
                    // gate put a real refresh token (never a placeholder) in the body.
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<u64>())
                        })
                        .and_then(Result::ok)
                        .unwrap_or(0);
                    let mut body = Vec::new();
                    let _ = (&mut s).take(len).read_to_end(&mut body);
                    let body = String::from_utf8_lossy(&body);
                    let real = body.contains("bench-refresh-") && !body.contains("aisb_placeholder");
                    let n = REFRESHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    let answer = match real {
                        true => format!(
                            r#"{{"access_token":"bench-access-{n}","refresh_token":"bench-refresh-{n}","expires_in":3600}}"#
                        ),
                        false => r#"{"error":"invalid_grant"}"#.to_string(),
                    };
                    let status = if real { "200 OK" } else { "400 Bad Request" };
                    write!(s, "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}", answer.len()).is_ok()
                } else if let Some(n) = n("/big/") {
                    write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n").is_ok()
                        && std::io::copy(&mut std::io::repeat(b'x').take(n), &mut s).is_ok()
                } else {
                    if let Some(n) = n("/up/") {
                        let _ = std::io::copy(&mut (&mut s).take(n), &mut std::io::sink());
                    }
                    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").is_ok()
                };
                if !ok {
                    break;
                }
            }
        });
    }
}

pub(super) fn register(
    args: &[String],
    name: &str,
    secrets: Vec<ai_sandbox::gate::control::Bound>,
    ca: Option<String>,
    rules: Vec<ai_sandbox::policy::rule::Rule>,
) -> ai_sandbox::gate::control::Lease {
    use ai_sandbox::gate::control;
    let req = control::Request::Register {
        session: format!("bench-{name}"),
        project: "bench".into(),
        token: token(name),
        policy: ai_sandbox::gate::decide::SessionPolicy { rules, ..session_policy(args) },
        secrets,
        upstream_ca: ca,
    };
    let exe = std::path::PathBuf::from(need(args, "--gate-exe"));
    control::register(&ai_sandbox::sys::runtime::runtime_dir(), &exe, 18181, &req)
        .expect("register with the gate")
}

/// The token of the session `register` made for `name`.
pub(super) fn token(name: &str) -> String {
    // Each name its own (not its length: "ruled" and "login" would share one).
    let n = name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    format!("{:032x}", (std::process::id() as u128) << 64 | u128::from(n))
}

/// A TLS stream to `host` through the gate's CONNECT, trusting `roots` (PEM).
fn open(
    gate: SocketAddr,
    token: &str,
    host: &str,
    roots: &str,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut tcp = TcpStream::connect(gate).unwrap();
    tcp.set_nodelay(true).unwrap();
    let auth = super::b64(&format!("aisb:{token}"));
    write!(
        tcp,
        "CONNECT {host}:{PORT} HTTP/1.1\r\nHost: {host}:{PORT}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    )
    .unwrap();
    let head = read_message(&mut tcp, false).expect("the gate's answer");
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    let mut store = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(roots.as_bytes()) {
        store.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), host.to_string().try_into().unwrap()).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).expect("TLS through the gate");
    }
    s
}

pub(crate) fn run(args: &[String]) {
    let count: usize = need(args, "--count").parse().unwrap();
    let bytes: u64 = arg(args, "--bytes").map_or(64 << 20, |v| v.parse().unwrap());
    let held: usize = arg(args, "--held").map_or(1000, |v| v.parse().unwrap());
    let host = need(args, "--host");
    let addr: IpAddr = need(args, "--addr").parse().unwrap();
    let (ca_pem, cfg) = server(&host);
    let listener = TcpListener::bind((addr, PORT)).expect("bind the bench server on ADDR:8443");
    std::thread::spawn(move || serve(listener, cfg));
    let mut a = args.to_vec();
    match a.iter().position(|x| x == "--port") {
        Some(i) => a[i + 1] = PORT.to_string(),
        None => a.extend(["--port".into(), PORT.to_string()]),
    }
    let tunnel = register(&a, "tunnel", vec![], None, vec![]);
    let bound = || ai_sandbox::gate::control::Bound::new("BENCH_KEY", PLACEHOLDER, KEY, &[&host]);
    let terminated = register(&a, "terminated", vec![bound()], Some(ca_pem.clone()), vec![]);
    // The same host with 1,000 rules, the one that allows the request last (every rule is tried).
    let mut rules = Vec::new();
    for i in 0..999 {
        rules.extend(ai_sandbox::policy::rule::parse(&format!("{host} GET /api/v{i}/items/*")).unwrap());
    }
    rules.extend(ai_sandbox::policy::rule::parse(&format!("{host} GET /")).unwrap());
    let ruled = register(&a, "ruled", vec![bound()], Some(ca_pem.clone()), rules);
    // An MCP tools/call under a plain rule for its path, and under an MCP rule that reads it.
    let rule = |line: &str| ai_sandbox::policy::rule::parse(&format!("{host} {line}")).unwrap();
    let pathrule = register(&a, "pathrule", vec![bound()], Some(ca_pem.clone()), rule("POST /mcp/*"));
    let mcprule = register(&a, "mcprule", vec![bound()], Some(ca_pem.clone()), rule("mcp /mcp/* search_*"));
    // A login the gate holds (ADR 0087): its access token bound to the host, its refresh token
    // renewed at HOST/oauth/token, both in a store file of the bench's own.
    let store = std::env::temp_dir().join(format!("aisb-bench-login-{}.json", std::process::id()));
    let tokens = r#"{"claudeAiOauth":{"accessToken":"bench-access-0","refreshToken":"bench-refresh-0","expiresAt":0}}"#;
    std::fs::write(&store, tokens).unwrap();
    let endpoint = format!("{host}/oauth/token");
    let held_token = |field: &str, answer: &str, refresh: bool| {
        let expiry = ["claudeAiOauth", "expiresAt"];
        ai_sandbox::contract::LoginRef::new(
            &store,
            &["claudeAiOauth", field],
            &endpoint,
            answer,
            &expiry,
            refresh,
        )
    };
    let login_bound = vec![
        ai_sandbox::gate::control::Bound::new("login access", LOGIN_ACCESS, "bench-access-0", &[&host])
            .held(held_token("accessToken", "access_token", false)),
        ai_sandbox::gate::control::Bound::new("login refresh", LOGIN_REFRESH, "bench-refresh-0", &[&host])
            .held(held_token("refreshToken", "refresh_token", true)),
    ];
    let login = register(&a, "login", login_bound, Some(ca_pem.clone()), vec![]);
    let gate_ca = terminated.ca.clone().expect("the gate's CA in the reply");
    let gate: SocketAddr = ([127, 0, 0, 1], tunnel.port).into();
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n");
    let login_request =
        format!("GET / HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {LOGIN_ACCESS}\r\n\r\n");
    let request_of = |name: &str| if name == "login" { &login_request } else { &request };
    // Each path's samples are taken in turn (tunnel, terminated, ruled, tunnel, ...), so what
    // the machine does meanwhile falls on all of them alike.
    let paths = [("tunnel", &ca_pem), ("terminated", &gate_ca), ("ruled", &gate_ca), ("login", &gate_ca)];
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let samples =
        |paths: usize, n: usize| -> Vec<Vec<f64>> { (0..paths).map(|_| Vec::with_capacity(n)).collect() };
    let setups = arg(args, "--setups").map_or(count.min(200), |v| v.parse().unwrap());
    let mut setup = samples(paths.len(), setups);
    for _ in 0..setups {
        for (i, (name, roots)) in paths.iter().enumerate() {
            let t = Instant::now();
            let mut s = open(gate, &token(name), &host, roots);
            s.write_all(request_of(name).as_bytes()).unwrap();
            read_message(&mut s, true).expect("an answer");
            setup[i].push(ms(t));
            drop(s);
        }
    }
    let mut conns: Vec<_> =
        paths.iter().map(|(name, roots)| open(gate, &token(name), &host, roots)).collect();
    let mut req = samples(paths.len(), count);
    for _ in 0..count {
        for (i, s) in conns.iter_mut().enumerate() {
            let t = Instant::now();
            s.write_all(request_of(paths[i].0).as_bytes()).unwrap();
            read_message(s, true).expect("an answer");
            req[i].push(ms(t));
        }
    }
    // A held login's refresh on its kept-alive connection (the gate makes it upstream, stores
    // the new tokens, answers placeholders), beside a POST of the same size on the bound key's.
    let refresh = format!(r#"{{"grant_type":"refresh_token","refresh_token":"{LOGIN_REFRESH}"}}"#);
    let posts = [
        format!(
            "POST /oauth/token HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{refresh}",
            refresh.len()
        ),
        format!(
            "POST /up/{n} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {n}\r\n\r\n{refresh}",
            n = refresh.len()
        ),
    ];
    let refreshes = count.min(200);
    let before = REFRESHES.load(std::sync::atomic::Ordering::Relaxed);
    // One after the other, not in turn: a refresh changes a held token, after which every
    // terminated connection makes its masks again (the POSTs would pay for the refreshes).
    let mut renew = samples(2, refreshes);
    for (i, conn) in [(1, 1), (0, 3)] {
        for _ in 0..refreshes {
            let t = Instant::now();
            conns[conn].write_all(posts[i].as_bytes()).unwrap();
            let head = read_message(&mut conns[conn], false).expect("an answer");
            let mut body = Vec::new();
            read_body(&mut conns[conn], &head, &mut body).expect("its body");
            renew[i].push(ms(t));
            if i == 0 {
                let (head, body) = (String::from_utf8_lossy(&head), String::from_utf8_lossy(&body));
                assert!(head.starts_with("HTTP/1.1 200") && body.contains(LOGIN_ACCESS), "{head}{body}");
                assert!(!body.contains("bench-access") && !body.contains("bench-refresh"), "{body}");
            }
        }
    }
    let upstream = REFRESHES.load(std::sync::atomic::Ordering::Relaxed) - before;
    let stored = std::fs::read_to_string(&store).unwrap();
    assert!(stored.contains(&format!("bench-refresh-{upstream}\"")), "the last refresh is stored: {stored}");
    let (r50, r99, p50, p99) = (
        pct(&mut renew[0], 0.5),
        pct(&mut renew[0], 0.99),
        pct(&mut renew[1], 0.5),
        pct(&mut renew[1], 0.99),
    );
    println!("terminate refresh {refreshes} {upstream} {r50:.3} {r99:.3} {p50:.3} {p99:.3}");
    let _ = std::fs::remove_file(&store);
    // A tools/call on a kept-alive connection of each, in turn.
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_issues","arguments":{"query":"bench"}}}"#;
    let post = format!(
        "POST /mcp/{n} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {PLACEHOLDER}\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n{call}",
        n = call.len()
    );
    let mcp_paths = ["pathrule", "mcprule"];
    let mut mcp_conns: Vec<_> =
        mcp_paths.iter().map(|name| open(gate, &token(name), &host, &gate_ca)).collect();
    let mut mcp = samples(mcp_paths.len(), count);
    for _ in 0..count {
        for (i, s) in mcp_conns.iter_mut().enumerate() {
            let t = Instant::now();
            s.write_all(post.as_bytes()).unwrap();
            read_message(s, true).expect("a tools/call's answer");
            mcp[i].push(ms(t));
        }
    }
    for (i, name) in mcp_paths.iter().enumerate() {
        println!("terminate mcp {name} {:.3} {:.3}", pct(&mut mcp[i], 0.5), pct(&mut mcp[i], 0.99));
    }
    drop(mcp_conns);
    // A streamed response: when its first event arrives, and its end (EVENT_GAP later).
    let events = count.min(100);
    let (mut first, mut last) = (samples(2, events), samples(2, events));
    for _ in 0..events {
        for (i, s) in conns.iter_mut().take(2).enumerate() {
            let t = Instant::now();
            write!(s, "GET /events HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
            let mut got = Vec::new();
            read_until(s, &mut got, b"data: first\n\n").expect("the first event");
            first[i].push(ms(t));
            read_until(s, &mut got, b"\r\n0\r\n\r\n").expect("the stream's end");
            last[i].push(ms(t));
        }
    }
    for (i, (name, _)) in paths.iter().enumerate() {
        println!("terminate setup {name} {:.3} {:.3}", pct(&mut setup[i], 0.5), pct(&mut setup[i], 0.99));
        println!("terminate request {name} {:.3} {:.3}", pct(&mut req[i], 0.5), pct(&mut req[i], 0.99));
        if i < 2 {
            let (p50, p99, end) = (pct(&mut first[i], 0.5), pct(&mut first[i], 0.99), pct(&mut last[i], 0.5));
            println!("terminate event {name} {p50:.3} {p99:.3} {end:.3}");
        }
    }
    // BYTES down, then up, on the tunnel's and the terminated connection (MB/s).
    for (s, (name, _)) in conns.iter_mut().zip(paths).take(2) {
        let t = Instant::now();
        write!(s, "GET /big/{bytes} HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
        let head = read_message(s, false).expect("the download's head");
        let got = read_body(s, &head, &mut std::io::sink()).expect("the download");
        assert_eq!(got, bytes, "the whole download");
        let down = bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
        let t = Instant::now();
        write!(s, "PUT /up/{bytes} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {bytes}\r\n\r\n").unwrap();
        std::io::copy(&mut std::io::repeat(b'y').take(bytes), s).unwrap();
        read_message(s, true).expect("the upload's answer");
        let up = bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
        println!("terminate transfer {name} {down:.1} {up:.1}");
    }
    // A WebSocket on a new connection of each: BYTES down in frames, then BYTES up (MB/s); the
    // gate reads every frame both ways on the terminated one (ADR 0064).
    for (name, roots) in paths.iter().take(2) {
        let mut s = open(gate, &token(name), &host, roots);
        let t = Instant::now();
        write!(s, "GET /ws/{bytes} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: YmVuY2hiZW5jaGJlbmNoYg==\r\nSec-WebSocket-Version: 13\r\n\r\n").unwrap();
        let head = read_message(&mut s, false).expect("the upgrade's answer");
        assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
        let frames = bytes.div_ceil(WS_FRAME as u64);
        let framed = bytes + frames * ws_header(WS_FRAME, false).len() as u64;
        std::io::copy(&mut (&mut s).take(framed), &mut std::io::sink()).unwrap();
        let down = bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
        let t = Instant::now();
        let payload = vec![b'u'; WS_FRAME];
        let mut left = bytes as usize;
        while left > 0 {
            let k = left.min(WS_FRAME);
            s.write_all(&ws_header(k, true)).unwrap();
            s.write_all(&payload[..k]).unwrap();
            left -= k;
        }
        s.write_all(&[0x88, 0x80, 0, 0, 0, 0]).unwrap();
        let mut end = [0u8; 2];
        s.read_exact(&mut end).expect("the server's close");
        let up = bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
        println!("terminate websocket {name} {down:.1} {up:.1}");
    }
    drop(conns);
    // The gate's memory with HELD terminated connections open, each kept alive after a request.
    let pid = super::gate_pid();
    let idle = super::rss_kib(&pid, "VmRSS:");
    let held: Vec<_> = (0..held)
        .map(|_| {
            let mut s = open(gate, &token("terminated"), &host, &gate_ca);
            s.write_all(request.as_bytes()).unwrap();
            read_message(&mut s, true).expect("an answer");
            s
        })
        .collect();
    let rss = super::rss_kib(&pid, "VmRSS:");
    println!("terminate held {} {idle} {rss}", held.len());
    drop(held);
    drop((tunnel, terminated, ruled, pathrule, mcprule, login));
}
