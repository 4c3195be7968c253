//! An HTTP/2 front for a test host's HTTP/1.1 server: TLS on `[::]:8443` in the host's network
//! namespace, offering only `h2` by ALPN, passing each request on to the server on 443 (TLS,
//! HTTP/1.1) and its answer back. It notes the version every request arrived in, so a test can
//! show that a client (git, whose libcurl speaks HTTP/2) went through the gate as HTTP/2 all the
//! way: the gate offers an upstream only what its client offered, and this front takes nothing
//! but h2. hyper and rustls, as the gate uses, so no server package is needed.

use crate::harness::TestHost;
use http_body_util::{BodyExt, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::Path;
use std::sync::{Arc, Mutex};

pub(crate) const PORT: u16 = 8443;

/// What the front saw: one `VERSION METHOD PATH` line per request.
#[derive(Clone, Default)]
pub(crate) struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    pub(crate) fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Starts the front on `th`, with `dir`'s leaf certificate (as the 443 server's) and its CA to
/// verify that server by `name`. Runs until the test process ends.
pub(crate) fn start(th: &TestHost, dir: &Path, name: &str) -> Seen {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(dir.join("leaf.pem")).unwrap().map(Result::unwrap).collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("leaf.key")).unwrap();
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    server.alpn_protocols = vec![b"h2".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    let (server, client) = (Arc::new(server), Arc::new(client));
    let (ns, backend, name) = (format!("/run/netns/{}", th.ns), th.v4.clone(), name.to_string());
    let seen = Seen::default();
    let noted = seen.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // This thread lives in the test host's namespace; its sockets stay there.
        let f = std::fs::File::open(&ns).unwrap();
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let listener = std::net::TcpListener::bind(("::", PORT)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            tx.send(()).unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(server);
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, client, backend, name, noted) =
                    (acceptor.clone(), client.clone(), backend.clone(), name.clone(), noted.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (client, backend, name, noted) =
                            (client.clone(), backend.clone(), name.clone(), noted.clone());
                        async move {
                            let line = format!("{:?} {} {}", req.version(), req.method(), req.uri().path());
                            noted.0.lock().unwrap().push(line);
                            pass_on(req, client, &backend, &name).await
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
    });
    rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the HTTP/2 front did not start");
    seen
}

/// One request to the HTTP/1.1 server on `backend:443` (a connection of its own), its answer
/// back without the headers HTTP/2 has no place for.
async fn pass_on(
    req: Request<Incoming>,
    client: Arc<rustls::ClientConfig>,
    backend: &str,
    name: &str,
) -> Result<Response<Body>, hyper::Error> {
    let tcp = tokio::net::TcpStream::connect((backend, 443)).await.unwrap();
    let server_name = ServerName::try_from(name.to_string()).unwrap();
    let tls = tokio_rustls::TlsConnector::from(client).connect(server_name, tcp).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let (mut parts, body) = req.into_parts();
    parts.version = hyper::Version::HTTP_11;
    parts.uri = parts.uri.path_and_query().map_or("/", |p| p.as_str()).parse().unwrap();
    parts.headers.insert(hyper::header::HOST, name.parse().unwrap());
    let resp = send.send_request(Request::from_parts(parts, body.boxed())).await?;
    let (mut parts, body) = resp.into_parts();
    for h in ["connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection"] {
        parts.headers.remove(h);
    }
    parts.version = hyper::Version::HTTP_2;
    Ok(Response::from_parts(parts, body.boxed()))
}
