//! The launcher's relays for spliced IP entries (ADR 0037): side effects, run by `host`.
//!
//! pasta's spliced path joins only the sandbox's loopback to the host's loopback, so an IP entry
//! reaches it through a relay here: a listener on the host's 127.0.0.1 (port chosen by the
//! kernel) that dials the entry for every connection and moves the bytes with splice(2), as the
//! gate does. The sandbox's rules decide first (the connection was allowed before it was
//! rewritten to pasta's listener), so a relay makes no decision of its own; it only ever dials
//! the one address it was made for.
//!
//! Why in the launcher, not the gate: a relay is one session's, and lives exactly as long as the
//! launch. When the launcher dies by any means, so does the sandbox (the keeper). The listeners
//! are bound before podman starts and held by the launcher's main thread too, so if the relay
//! thread ever stopped, the ports would stay taken (connections would wait unanswered) and no
//! other process could take them and receive the sandbox's traffic (fail closed).

use anyhow::Context;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::time::Duration;
use tokio::net::TcpStream;

/// The running relays: their listeners (held), and their ports in the order of the targets.
pub struct Relays {
    _held: Vec<TcpListener>,
    pub ports: Vec<u16>,
}

/// Binds one listener per target on 127.0.0.1 and serves them on a thread of their own.
pub fn start(targets: &[SocketAddrV4]) -> anyhow::Result<Relays> {
    let mut held = Vec::new();
    let mut served = Vec::new();
    for to in targets {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .with_context(|| format!("binding a relay on 127.0.0.1 for {to}"))?;
        l.set_nonblocking(true)?;
        served.push((l.try_clone()?, *to));
        held.push(l);
    }
    let ports = held.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<Result<_, _>>()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the relays' runtime")?;
    std::thread::Builder::new()
        .name("relay".into())
        .spawn(move || {
            rt.block_on(async move {
                let mut tasks = tokio::task::JoinSet::new();
                for (l, to) in served {
                    match tokio::net::TcpListener::from_std(l) {
                        Ok(l) => {
                            tasks.spawn(serve(l, to));
                        }
                        Err(e) => {
                            eprintln!("ai-sandbox: the relay for {to} cannot serve ({e}); it stays closed")
                        }
                    }
                }
                while tasks.join_next().await.is_some() {}
            })
        })
        .context("starting the relays' thread")?;
    Ok(Relays { _held: held, ports })
}

async fn serve(l: tokio::net::TcpListener, to: SocketAddrV4) {
    loop {
        match l.accept().await {
            Ok((c, _)) => {
                tokio::spawn(relay_one(c, to));
            }
            // Out of descriptors, say: the connection waits in the backlog; try again shortly.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn relay_one(c: TcpStream, to: SocketAddrV4) {
    let _ = c.set_nodelay(true);
    match TcpStream::connect(to).await {
        Ok(u) => {
            let _ = u.set_nodelay(true);
            // No idle limit: a direct connection through the tap path has none either (a
            // database pool may sit idle for hours); the session's end closes them all.
            let _ = crate::gate::splice::relay(&c, &u, None, None).await;
        }
        // Closed with a reset: the sandbox's client sees its connection end at once (trixie's
        // pasta passes it on as an end of stream, measured), never a hang.
        Err(_) => {
            let _ = socket2::SockRef::from(&c).set_linger(Some(Duration::ZERO));
        }
    }
}
