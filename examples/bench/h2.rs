//! `bench h2 GATE --streams N --size BYTES --calls M`: HTTP/2 and gRPC through a terminated
//! host. An HTTPS server (hyper; ALPN h2 and http/1.1; a CA made here, on ADDR:8443) serves
//! `GET /big/N` and a gRPC-shaped unary `POST /bench.Svc/Unary` (a framed message back, then
//! `grpc-status: 0` in the trailers). Two gate sessions allow it: a blind tunnel, and one with a
//! secret bound to it (the gate terminates TLS and answers with the server's ALPN choice).
//! Through the terminated host: N downloads of BYTES at once as N streams of one HTTP/2
//! connection, against the same N downloads over N HTTP/1.1 connections, alternated RUNS times
//! (`--runs`); then M unary calls one after the other on one HTTP/2 connection, terminated and
//! through the tunnel, alternated call by call, with the same calls through three bare relays
//! (`floor`: what terminating costs before the gate does anything).
//! Prints `h2 streams h2|h1 MB_PER_S` (the median run) and
//! `h2 unary terminated|tunnel|bare-relay|bare-h2|bare-tls P50 P99` (ms).

use super::{arg, need, pct};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PORT: u16 = 8443;
const PLACEHOLDER: &str = "aisb_placeholder_0000000000000000bench00000000h2h2";
const KEY: &str = "bench-real-key-h2";

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// The server's answers: a download of N bytes, or a unary gRPC call.
async fn answer(req: Request<Incoming>) -> Result<Response<Body>, std::convert::Infallible> {
    let path = req.uri().path().to_string();
    if let Some(n) = path.strip_prefix("/big/").and_then(|n| n.parse::<usize>().ok()) {
        return Ok(Response::new(Full::new(Bytes::from(vec![b'x'; n])).boxed()));
    }
    let _ = req.into_body().collect().await;
    let mut trailers = hyper::HeaderMap::new();
    trailers.insert("grpc-status", hyper::header::HeaderValue::from_static("0"));
    let frames = vec![
        Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"\0\0\0\0\x02ok"))),
        Ok(Frame::trailers(trailers)),
    ];
    let mut r = Response::new(BodyExt::boxed(Frames(frames.into_iter())));
    r.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("application/grpc"));
    Ok(r)
}

/// A few frames as a stream (the unary answer: its message, then its trailers).
struct Frames(std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>);

impl hyper::body::Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.next())
    }
}

async fn serve(listener: TcpListener, cfg: Arc<rustls::ServerConfig>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    while let Ok((tcp, _)) = listener.accept().await {
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let Ok(tls) = acceptor.accept(tcp).await else { return };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let svc = hyper::service::service_fn(answer);
            let io = TokioIo::new(tls);
            if h2 {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(1000)
                    .serve_connection(io, svc)
                    .await;
            } else {
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
            }
        });
    }
}

pub(super) type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS stream to `host` through the gate's CONNECT, offering `alpn`, trusting `roots` (PEM).
async fn open(gate: SocketAddr, token: &str, host: &str, roots: &str, alpn: &[u8]) -> Tls {
    let mut tcp = TcpStream::connect(gate).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let auth = super::b64(&format!("aisb:{token}"));
    let connect = format!(
        "CONNECT {host}:{PORT} HTTP/1.1\r\nHost: {host}:{PORT}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    );
    tcp.write_all(connect.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tcp.read_u8().await.expect("the gate's answer"));
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    tls(tcp, host, roots, alpn).await
}

/// TLS to `host` over `tcp`, offering `alpn`, trusting `roots` (PEM).
pub(super) async fn tls(tcp: TcpStream, host: &str, roots: &str, alpn: &[u8]) -> Tls {
    let mut store = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(roots.as_bytes()) {
        store.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(super::terminate::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn), "the gate answered another version");
    tls
}

fn get(host: &str, path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("https://{host}{path}"))
        .header("authorization", format!("Bearer {PLACEHOLDER}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// The body's length, read to its end.
async fn drain(r: Response<Incoming>) -> usize {
    assert!(r.status().is_success(), "{}", r.status());
    let mut b = r.into_body();
    let mut n = 0;
    while let Some(f) = b.frame().await {
        n += f.unwrap().data_ref().map_or(0, |d| d.len());
    }
    n
}

/// MB/s of downloads that started at `t`, once all of them are whole.
async fn rate(tasks: Vec<tokio::task::JoinHandle<usize>>, expected: usize, t: Instant) -> f64 {
    let mut got = 0;
    for task in tasks {
        got += task.await.unwrap();
    }
    assert_eq!(got, expected, "every download whole");
    got as f64 / t.elapsed().as_secs_f64() / 1e6
}

pub(crate) fn run(args: &[String]) {
    let streams: usize = need(args, "--streams").parse().unwrap();
    let size: usize = need(args, "--size").parse().unwrap();
    let calls: usize = need(args, "--calls").parse().unwrap();
    let runs: usize = arg(args, "--runs").map_or(5, |v| v.parse().unwrap());
    let host = need(args, "--host");
    let addr: IpAddr = need(args, "--addr").parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let (ca_pem, cfg) = super::terminate::server(&host);
        let mut cfg = (*cfg).clone();
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let listener = TcpListener::bind((addr, PORT)).await.expect("bind the bench server on ADDR:8443");
        tokio::spawn(serve(listener, Arc::new(cfg)));
        let mut a = args.to_vec();
        match a.iter().position(|x| x == "--port") {
            Some(i) => a[i + 1] = PORT.to_string(),
            None => a.extend(["--port".into(), PORT.to_string()]),
        }
        let (a2, h2, c2) = (a.clone(), host.clone(), ca_pem.clone());
        let (tunnel, terminated) = tokio::task::spawn_blocking(move || {
            let tunnel = super::terminate::register(&a2, "h2-tunnel", vec![], None, vec![]);
            let bound = ai_sandbox::gate::control::Bound::new("BENCH_KEY", PLACEHOLDER, KEY, &[&h2]);
            let terminated = super::terminate::register(&a2, "h2-terminated", vec![bound], Some(c2), vec![]);
            (tunnel, terminated)
        })
        .await
        .unwrap();
        let gate_ca = terminated.ca.clone().expect("the gate's CA in the reply");
        let gate: SocketAddr = ([127, 0, 0, 1], tunnel.port).into();
        let token = |name: &str| super::terminate::token(name);
        // N downloads: N streams on one HTTP/2 connection, or N HTTP/1.1 connections (MB/s).
        let (mut h2_rates, mut h1_rates) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = Instant::now();
            let tls = open(gate, &token("h2-terminated"), &host, &gate_ca, b"h2").await;
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
            tokio::spawn(conn);
            let tasks: Vec<_> = (0..streams)
                .map(|_| {
                    let (mut s, req) = (sender.clone(), get(&host, &format!("/big/{size}")));
                    tokio::spawn(async move { drain(s.send_request(req).await.unwrap()).await })
                })
                .collect();
            h2_rates.push(rate(tasks, streams * size, t).await);
            let t = Instant::now();
            let tasks: Vec<_> = (0..streams)
                .map(|_| {
                    let (host, gate_ca, tok) = (host.clone(), gate_ca.clone(), token("h2-terminated"));
                    tokio::spawn(async move {
                        let tls = open(gate, &tok, &host, &gate_ca, b"http/1.1").await;
                        let (mut s, conn) =
                            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
                        tokio::spawn(conn);
                        let mut req = get(&host, &format!("/big/{size}"));
                        *req.uri_mut() = format!("/big/{size}").parse().unwrap();
                        req.headers_mut().insert("host", host.parse().unwrap());
                        drain(s.send_request(req).await.unwrap()).await
                    })
                })
                .collect();
            h1_rates.push(rate(tasks, streams * size, t).await);
        }
        println!("h2 streams h2 {:.1}", pct(&mut h2_rates, 0.5));
        println!("h2 streams h1 {:.1}", pct(&mut h1_rates, 0.5));
        // Unary calls, one at a time, on one HTTP/2 connection each way (ms).
        let mut senders = Vec::new();
        for (name, roots) in [("h2-terminated", &gate_ca), ("h2-tunnel", &ca_pem)] {
            let tls = open(gate, &token(name), &host, roots, b"h2").await;
            let (s, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
            tokio::spawn(conn);
            senders.push(s);
        }
        use super::floor::Upstream;
        for kind in [Upstream::Hyper, Upstream::H2, Upstream::Bytes] {
            let (bare, bare_ca) = super::floor::start(kind, &host, (addr, PORT).into(), &ca_pem);
            let tcp = TcpStream::connect(bare).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let tls = tls(tcp, &host, &bare_ca, b"h2").await;
            let (s, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
            tokio::spawn(conn);
            senders.push(s);
        }
        let mut times: Vec<Vec<f64>> = (0..senders.len()).map(|_| Vec::with_capacity(calls)).collect();
        for _ in 0..calls {
            for (i, s) in senders.iter_mut().enumerate() {
                let req = Request::post(format!("https://{host}/bench.Svc/Unary"))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .header("authorization", format!("Bearer {PLACEHOLDER}"))
                    .body(Full::new(Bytes::from_static(b"\0\0\0\0\x05hello")))
                    .unwrap();
                let t = Instant::now();
                let r = s.send_request(req).await.unwrap();
                let body = r.into_body().collect().await.unwrap();
                let status = body.trailers().and_then(|t| t.get("grpc-status")).cloned();
                assert_eq!(status.as_ref().map(|v| v.as_bytes()), Some(&b"0"[..]), "the call's status");
                times[i].push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        for (i, name) in ["terminated", "tunnel", "bare-relay", "bare-h2", "bare-tls"].iter().enumerate() {
            println!("h2 unary {name} {:.3} {:.3}", pct(&mut times[i], 0.5), pct(&mut times[i], 0.99));
        }
        drop((tunnel, terminated));
    });
}
