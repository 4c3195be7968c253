//! Zero-copy relaying with splice(2): socket → pipe → socket, so tunnel bytes never enter
//! user space. Readiness comes from tokio (`readable`/`writable` + `try_io`, which clears
//! readiness on EAGAIN), so thousands of tunnels share the gate's one runtime thread.
//!
//! Each direction drains its pipe completely before reading more, so an EAGAIN on the way in
//! always means "source not readable" and on the way out "destination not writable". A pipe
//! lives only while data comes in bulk (created when a plain read fills its buffer, dropped at
//! the first burst smaller than that), so thousands of quiet tunnels hold two sockets each, not
//! six fds and two pipe buffers; if no pipe can be had (fd limit), the burst is copied instead.

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::Interest;
use tokio::net::TcpStream;

const PIPE_SIZE: i32 = 1 << 20;
const CHUNK: usize = 1 << 20;

struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
}

fn pipe() -> io::Result<Pipe> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
    // A larger pipe means fewer round trips; the default (64 KiB) still works if refused.
    let _ = fcntl(&w, FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
    Ok(Pipe { r, w })
}

fn splice(from: impl AsFd, to: impl AsFd, len: usize) -> io::Result<usize> {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    Ok(nix::fcntl::splice(from, None, to, None, len, flags)?)
}

/// Writes all of `buf` to `dst` (userspace fallback path).
async fn write_all(dst: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        dst.writable().await?;
        match dst.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Moves one burst (until `src` would block) through a pipe; `Ok(None)` at EOF.
async fn burst(src: &TcpStream, dst: &TcpStream, p: &Pipe, activity: &Activity) -> io::Result<Option<u64>> {
    let mut moved = 0u64;
    loop {
        let n = match src.try_io(Interest::READABLE, || splice(src, &p.w, CHUNK)) {
            Ok(0) => return if moved == 0 { Ok(None) } else { Ok(Some(moved)) },
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Some(moved)),
            Err(e) => return Err(e),
        };
        let mut pending = n;
        while pending > 0 {
            dst.writable().await?;
            match dst.try_io(Interest::WRITABLE, || splice(&p.r, dst, pending)) {
                Ok(m) => pending -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        activity.touch();
        moved += n as u64;
    }
}

/// Bursts start with a plain read of up to this many bytes; a read that fills it means bulk
/// data, and the rest of the burst goes through a pipe. Small messages (handshakes, RPCs)
/// then cost one read and one write instead of pipe set-up and two splices.
const PROBE: usize = 16 * 1024;

/// Moves bytes `src` → `dst` until EOF on `src`, then half-closes `dst`. Returns bytes moved.
async fn one_way(src: &TcpStream, dst: &TcpStream, activity: &Activity) -> io::Result<u64> {
    let mut total = 0u64;
    // Kept from one bulk burst to the next (setting up a 1 MiB pipe per burst showed in uploads,
    // whose bursts are short); dropped at the first small burst, so a quiet tunnel holds none.
    let mut bulk: Option<Pipe> = None;
    loop {
        src.readable().await?;
        if let Some(p) = &bulk {
            match burst(src, dst, p, activity).await? {
                None => break,
                Some(m) => {
                    total += m;
                    if m < PROBE as u64 {
                        bulk = None;
                    }
                }
            }
            continue;
        }
        // Allocated per read and dropped after it: an idle tunnel holds no buffer.
        let mut buf = Vec::with_capacity(PROBE);
        let n = match src.try_read_buf(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        write_all(dst, &buf[..n]).await?;
        activity.touch();
        total += n as u64;
        if n < PROBE {
            continue;
        }
        // Bulk: splice the rest of this burst; without a pipe (fd limit) keep copying.
        if let Ok(p) = pipe() {
            match burst(src, dst, &p, activity).await? {
                None => break,
                Some(m) => total += m,
            }
            bulk = Some(p);
        }
    }
    let _ = socket2::SockRef::from(dst).shutdown(std::net::Shutdown::Write);
    Ok(total)
}

/// Last time any byte moved, for the idle watchdog.
struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity { epoch: Instant::now(), last_ms: AtomicU64::new(0) })
    }
    fn touch(&self) {
        self.last_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn quiet_for(&self) -> Duration {
        Duration::from_millis(self.epoch.elapsed().as_millis() as u64 - self.last_ms.load(Ordering::Relaxed))
    }
}

/// Resolves once nothing has moved for `idle` (never without a limit).
async fn idle_expired(act: &Activity, idle: Option<Duration>) {
    let Some(idle) = idle else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(idle / 4).await;
        if act.quiet_for() >= idle {
            return;
        }
    }
}

/// Relays both directions until both have ended, or until nothing moved for `idle` (if any).
/// Returns (client → upstream, upstream → client) byte counts.
pub(crate) async fn relay(
    client: &TcpStream,
    upstream: &TcpStream,
    idle: Option<Duration>,
) -> io::Result<(u64, u64)> {
    let act = Activity::new();
    tokio::select! {
        r = async { tokio::try_join!(one_way(client, upstream, &act), one_way(upstream, client, &act)) } => r,
        _ = idle_expired(&act, idle) => Ok((0, 0)),
    }
}

/// One direction only (a forwarded request's response), with the same idle limit.
pub(crate) async fn copy(src: &TcpStream, dst: &TcpStream, idle: Duration) -> io::Result<u64> {
    let act = Activity::new();
    tokio::select! {
        r = one_way(src, dst, &act) => r,
        _ = idle_expired(&act, Some(idle)) => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (a, l.accept().await.unwrap().0)
    }

    /// Bulk, then a small message (the kept pipe is dropped), a pause, bulk again (a new pipe),
    /// and a reply the other way: every byte arrives, in order, and both ends see the close.
    #[tokio::test]
    async fn bulk_and_small_bursts_arrive_intact_both_ways() {
        let (mut client, client_end) = pair().await;
        let (upstream_end, mut server) = pair().await;
        let relay = tokio::spawn(async move { relay(&client_end, &upstream_end, None).await });
        let big: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
        let sent = [&big[..], b"small", &big[..1000], &big[..]].concat();
        let writer = {
            let big = big.clone();
            tokio::spawn(async move {
                client.write_all(&big).await.unwrap();
                client.write_all(b"small").await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
                client.write_all(&big[..1000]).await.unwrap();
                client.write_all(&big).await.unwrap();
                client.shutdown().await.unwrap();
                let mut back = Vec::new();
                client.read_to_end(&mut back).await.unwrap();
                back
            })
        };
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert!(got == sent, "{} bytes arrived of {}, or out of order", got.len(), sent.len());
        server.write_all(b"reply").await.unwrap();
        server.shutdown().await.unwrap();
        assert_eq!(writer.await.unwrap(), b"reply");
        assert_eq!(relay.await.unwrap().unwrap(), (sent.len() as u64, 5));
    }
}
