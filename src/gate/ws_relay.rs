//! A WebSocket through a terminated host, read both ways as it is relayed (`ws::Frames` does
//! the framing, pure; here the I/O; ADR 0064).

use super::budget::Allowance;
use super::decide::Denial;
use super::request_body::OVERLAP;
use super::scrub::Scrubber;
use super::secrets::Secrets;
use super::ws;
use tokio::io::{AsyncRead, AsyncWrite};

/// A WebSocket through a terminated host, both directions read frame by frame (`ws::Frames`:
/// unmasked, inflated) with the bytes before each piece (a value split across frames or
/// messages is seen): the client's for the placeholders of secrets bound elsewhere, the
/// server's for the real values of this host's secrets in any spelling `scrub` knows (a server
/// that echoes the upgrade request's credentials). One found: the piece is not sent, both
/// connections close, and the refusal is returned for the log. Framing that does not parse
/// closes them too: what cannot be read is not relayed.
pub(crate) struct WsWatch {
    pub(crate) up: ws::Frames,
    pub(crate) down: ws::Frames,
    pub(crate) secrets: Secrets,
    pub(crate) host: String,
    pub(crate) scrub: Scrubber,
    /// A budgeted host: what the client may still send, and the config to name when it is spent.
    pub(crate) budget: Option<(Allowance, String)>,
}

/// Why a WebSocket direction stopped.
enum Stop {
    Ended,
    Unreadable,
    Refused(Denial),
}

impl WsWatch {
    pub(crate) async fn relay<A, B>(self, a: A, b: B) -> Option<Denial>
    where
        A: AsyncRead + AsyncWrite + Unpin,
        B: AsyncRead + AsyncWrite + Unpin,
    {
        let WsWatch { mut up, mut down, secrets, host, mut scrub, budget } = self;
        let (mut ar, mut aw) = tokio::io::split(a);
        let (mut br, mut bw) = tokio::io::split(b);
        let budget = budget.as_ref().map(|(a, config)| (a, config.as_str()));
        let to_server = pump(&mut ar, &mut bw, &mut up, (OVERLAP, budget), |seen| {
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
        let to_client = pump(&mut br, &mut aw, &mut down, (16 << 10, None), |seen| {
            scrub.whole(seen).map(|_| {
                let names: Vec<String> = scrub.names();
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
/// shown to `bad` before the read goes on; with a budget, a read it does not cover whole is
/// not sent and ends the relay with the budget's refusal.
async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    frames: &mut ws::Frames,
    (seam, budget): (usize, Option<(&Allowance, &str)>),
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
        if let Some((a, config)) = budget
            && !a.take_all(n as u64)
        {
            let d = a.denial(config);
            return Stop::Refused(Denial {
                reason: format!("{} (a WebSocket; the connection was closed)", d.reason),
                ..d
            });
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return Stop::Ended;
        }
    }
}
