//! The floors for a call through a terminated host (`bench h2`'s rows "bare-relay" and
//! "bare-h2"): relays that open TLS and HTTP/2 on both sides and pass each stream on with
//! nothing else (no CONNECT, no checks, no log), on one thread as the gate runs. What the gate
//! costs above them is its own work; what they cost above the blind tunnel is the price of
//! terminating at all with hyper and rustls (docs/adr/0070).
//!
//! `Upstream::Hyper` sends upstream with hyper's client, as the gate does: a request's HEADERS
//! leave in one write and its DATA in the next (hyper waits for the stream's send capacity,
//! which h2 gives only once the stream is open). `Upstream::H2` sends with the h2 crate's
//! client, queuing the DATA at once, so both leave in one write. `Upstream::Bytes` reads no
//! HTTP/2 at all: it opens TLS on both sides and copies the decrypted bytes through, the frames
//! as the client and server wrote them. That is the least any relay that terminates TLS can do,
//! so it is the floor of every design, one that relays frame by frame included.

use super::h2::tls;
use http_body_util::BodyExt;
use hyper::Request;
use hyper::body::{Bytes, Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Copy)]
pub(super) enum Upstream {
    Hyper,
    H2,
    Bytes,
}

/// Starts a bare relay to `upstream` (TLS to `host`, trusting `upstream_ca`) on 127.0.0.1.
/// Returns its address and the CA of its own certificate for `host`.
pub(super) fn start(
    kind: Upstream,
    host: &str,
    upstream: SocketAddr,
    upstream_ca: &str,
) -> (SocketAddr, String) {
    let (ca, mut cfg) = super::terminate::server(host);
    Arc::make_mut(&mut cfg).alpn_protocols = vec![b"h2".to_vec()];
    let (host, upstream_ca) = (host.to_string(), upstream_ca.to_string());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                let client = TokioIo::new(acceptor.accept(tcp).await.unwrap());
                let up = TcpStream::connect(upstream).await.unwrap();
                up.set_nodelay(true).unwrap();
                let mut up = tls(up, &host, &upstream_ca, b"h2").await;
                let server = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                match kind {
                    Upstream::Hyper => {
                        let (sender, conn) =
                            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(up))
                                .await
                                .unwrap();
                        tokio::spawn(conn);
                        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                            let mut s = sender.clone();
                            async move { s.send_request(req).await }
                        });
                        tokio::spawn(server.serve_connection(client, svc));
                    }
                    Upstream::Bytes => {
                        tokio::spawn(async move {
                            let mut client = client.into_inner();
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                        });
                    }
                    Upstream::H2 => {
                        let (sender, conn) = h2::client::handshake(up).await.unwrap();
                        tokio::spawn(conn);
                        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                            let s = sender.clone();
                            async move { Ok::<_, h2::Error>(pass_on(s, req).await?.map(Recv)) }
                        });
                        tokio::spawn(server.serve_connection(client, svc));
                    }
                }
            }
        });
    });
    (rx.recv().unwrap(), ca)
}

/// One request through the h2 crate's client: its head, then each frame of its body as it
/// comes (the last with END_STREAM), queued without waiting for capacity.
async fn pass_on(
    s: h2::client::SendRequest<Bytes>,
    req: Request<Incoming>,
) -> Result<hyper::Response<h2::RecvStream>, h2::Error> {
    let mut s = s.ready().await?;
    let (parts, mut body) = req.into_parts();
    let (resp, mut out) = s.send_request(Request::from_parts(parts, ()), false)?;
    while let Some(f) = body.frame().await {
        match f.expect("the client's body").into_data() {
            Ok(d) => out.send_data(d, hyper::body::Body::is_end_stream(&body))?,
            Err(f) => {
                if let Ok(t) = f.into_trailers() {
                    out.send_trailers(t)?;
                }
            }
        }
    }
    resp.await
}

/// An h2 response body as a hyper body: its data (capacity released), then its trailers.
struct Recv(h2::RecvStream);

impl hyper::body::Body for Recv {
    type Data = Bytes;
    type Error = h2::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        match self.0.poll_data(cx) {
            Poll::Ready(Some(Ok(d))) => {
                let _ = self.0.flow_control().release_capacity(d.len());
                return Poll::Ready(Some(Ok(Frame::data(d))));
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => {}
            Poll::Pending => return Poll::Pending,
        }
        match self.0.poll_trailers(cx) {
            Poll::Ready(Ok(t)) => Poll::Ready(t.map(|t| Ok(Frame::trailers(t)))),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Pending => Poll::Pending,
        }
    }
}
