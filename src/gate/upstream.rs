//! A terminated connection's upstream side: TLS to the real server (verified against the host's
//! roots and the session's `upstream_ca`), offering the versions the client offered
//! (`proto::offer`), and one hyper client connection of the version the server chose. HTTP/1.1
//! carries one request at a time (a request takes the connection and puts it back); HTTP/2
//! carries every stream of the client's connection at once.

use super::proto::Proto;
use super::response::BoxError;
use http_body_util::combinators::BoxBody;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::{http1, http2};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

pub(crate) type Out = BoxBody<Bytes, BoxError>;
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// The upstream config with the ALPN list the gate offers for this connection.
pub(crate) fn with_alpn(cfg: &Arc<rustls::ClientConfig>, offer: Vec<Vec<u8>>) -> Arc<rustls::ClientConfig> {
    let mut c = (**cfg).clone();
    c.alpn_protocols = offer;
    Arc::new(c)
}

pub(crate) async fn dial_tls(
    cfg: Arc<rustls::ClientConfig>,
    host: &str,
    tcp: TcpStream,
) -> Result<Tls, String> {
    let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(cfg).connect(name, tcp);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("TLS to {host} failed: {e}")),
        Err(_) => Err(format!("TLS to {host}: no handshake within {} s", HANDSHAKE_TIMEOUT.as_secs())),
    }
}

/// One client connection to the upstream, of the version its TLS chose.
pub(crate) enum Sender {
    H1(http1::SendRequest<Out>),
    H2(http2::SendRequest<Out>),
}

impl Sender {
    pub(crate) async fn handshake(tls: Tls) -> Result<Sender, String> {
        // What the server chose by ALPN (none: HTTP/1.1); nothing offered is assumed here.
        let proto = super::proto::chosen(tls.get_ref().1.alpn_protocol(), &[]);
        let io = TokioIo::new(tls);
        Ok(match proto {
            Proto::H1 => {
                let (s, conn) = http1::handshake(io).await.map_err(|e| e.to_string())?;
                tokio::spawn(conn.with_upgrades());
                Sender::H1(s)
            }
            Proto::H2 => {
                let (s, conn) =
                    http2::handshake(TokioExecutor::new(), io).await.map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                Sender::H2(s)
            }
        })
    }

    pub(crate) fn proto(&self) -> Proto {
        match self {
            Sender::H1(_) => Proto::H1,
            Sender::H2(_) => Proto::H2,
        }
    }

    /// Whether the connection still takes a request (waiting for HTTP/1.1's previous one).
    pub(crate) async fn ready(&mut self) -> bool {
        match self {
            Sender::H1(s) => s.ready().await.is_ok(),
            Sender::H2(s) => s.ready().await.is_ok(),
        }
    }

    /// A connection the server (or a failure) closed.
    pub(crate) fn closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    /// A handle for one request: HTTP/2's is shared (the connection stays for other streams),
    /// HTTP/1.1's is taken.
    pub(crate) fn share(&self) -> Option<Sender> {
        match self {
            Sender::H1(_) => None,
            Sender::H2(s) => Some(Sender::H2(s.clone())),
        }
    }

    pub(crate) async fn send(&mut self, req: Request<Out>) -> Result<Response<Incoming>, hyper::Error> {
        match self {
            Sender::H1(s) => s.send_request(req).await,
            Sender::H2(s) => s.send_request(req).await,
        }
    }
}
