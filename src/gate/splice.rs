//! Zero-copy relaying with splice(2): socket → pipe → socket, so tunnel bytes never enter
//! user space. Readiness comes from tokio (`readable`/`writable` + `try_io`, which clears
//! readiness on EAGAIN), so thousands of tunnels share the gate's one runtime thread.
//!
//! Each direction drains its pipe completely before reading more, so an EAGAIN on the way in
//! always means "source not readable" and on the way out "destination not writable". A pipe
//! lives only while data comes in bulk (created when a plain read fills its buffer, dropped at
//! the first burst smaller than that), so thousands of quiet tunnels hold two sockets each, not
//! six fds and two pipe buffers; if no pipe can be had (fd limit), the burst is copied instead.

use super::budget::Allowance;
use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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

/// Whether `src` has a byte to read (1), is at its end (0), or would block; nothing is consumed.
fn peek(src: &TcpStream) -> io::Result<usize> {
    let mut b = [0u8; 1];
    Ok(nix::sys::socket::recv(src.as_fd().as_raw_fd(), &mut b, nix::sys::socket::MsgFlags::MSG_PEEK)?)
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

/// Moves one burst (until `src` would block) through a pipe; `Ok(None)` at EOF. With a budget,
/// each splice in moves at most what the allowance gives (the rest given back after it); with
/// nothing left, the burst ends in `budget::over()` and nothing more is read.
async fn burst(
    src: &TcpStream,
    dst: &TcpStream,
    p: &Pipe,
    activity: &Activity,
    budget: Option<&Allowance>,
) -> io::Result<Option<u64>> {
    let mut moved = 0u64;
    loop {
        let want = match budget {
            Some(a) => match a.take(CHUNK as u64) {
                // Spent: over only if the client has more to send.
                0 => {
                    return match src.try_io(Interest::READABLE, || peek(src)) {
                        Ok(0) if moved == 0 => Ok(None),
                        Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
                        Ok(0) | Err(_) => Ok(Some(moved)),
                        Ok(_) => Err(super::budget::over()),
                    };
                }
                n => n as usize,
            },
            None => CHUNK,
        };
        let r = src.try_io(Interest::READABLE, || splice(src, &p.w, want));
        if let Some(a) = budget {
            a.give_back((want - *r.as_ref().unwrap_or(&0)) as u64);
        }
        let n = match r {
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
/// With a budget, no byte past it is written: the part of a read it covers goes, and the
/// direction ends in `budget::over()`.
async fn one_way(
    src: &TcpStream,
    dst: &TcpStream,
    activity: &Activity,
    budget: Option<&Allowance>,
) -> io::Result<u64> {
    let mut total = 0u64;
    // Kept from one bulk burst to the next (setting up a 1 MiB pipe per burst showed in uploads,
    // whose bursts are short); dropped at the first small burst, so a quiet tunnel holds none.
    let mut bulk: Option<Pipe> = None;
    loop {
        src.readable().await?;
        if let Some(p) = &bulk {
            match burst(src, dst, p, activity, budget).await? {
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
        let allowed = budget.map_or(n, |a| a.take(n as u64) as usize);
        write_all(dst, &buf[..allowed]).await?;
        activity.touch();
        total += allowed as u64;
        if allowed < n {
            return Err(super::budget::over());
        }
        if n < PROBE {
            continue;
        }
        // Bulk: splice the rest of this burst; without a pipe (fd limit) keep copying.
        if let Ok(p) = pipe() {
            match burst(src, dst, &p, activity, budget).await? {
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
/// Returns (client → upstream, upstream → client) byte counts. `budget`: what the client may
/// still send; past it, the relay ends in `budget::over()` (both directions stop).
pub(crate) async fn relay(
    client: &TcpStream,
    upstream: &TcpStream,
    idle: Option<Duration>,
    budget: Option<&Allowance>,
) -> io::Result<(u64, u64)> {
    let act = Activity::new();
    tokio::select! {
        r = async { tokio::try_join!(one_way(client, upstream, &act, budget), one_way(upstream, client, &act, None)) } => r,
        _ = idle_expired(&act, idle) => Ok((0, 0)),
    }
}

/// One direction only (a forwarded request's response), with the same idle limit.
pub(crate) async fn copy(src: &TcpStream, dst: &TcpStream, idle: Duration) -> io::Result<u64> {
    let act = Activity::new();
    tokio::select! {
        r = one_way(src, dst, &act, None) => r,
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
        let relay = tokio::spawn(async move { relay(&client_end, &upstream_end, None, None).await });
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

    /// A budget in the middle of a bulk burst (the splice path) and of a small write (the copy
    /// path): exactly the budget arrives, the relay ends over budget, and the count is full.
    #[tokio::test]
    async fn a_budget_lets_exactly_its_bytes_through_then_ends_the_relay() {
        for (limit, pieces) in
            [(3_500_000u64, vec![4 << 20]), (100, vec![60, 60]), (2 << 20, vec![1 << 20, 1 << 20])]
        {
            let budgets = [crate::policy::budget::host_line(&format!("up.test {limit}"))];
            let spent = crate::gate::budget::Spent::default();
            let allowance = spent.allowance(&budgets, "up.test", None, 0).unwrap();
            let (mut client, client_end) = pair().await;
            let (upstream_end, mut server) = pair().await;
            let a = allowance.clone();
            let relay = tokio::spawn(async move { relay(&client_end, &upstream_end, None, Some(&a)).await });
            let total: usize = pieces.iter().sum();
            let writer = tokio::spawn(async move {
                for n in pieces {
                    if client.write_all(&vec![b'x'; n]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let _ = client.shutdown().await;
            });
            let mut got = Vec::new();
            let _ = server.read_to_end(&mut got).await;
            let _ = server.shutdown().await;
            let _ = writer.await;
            let end = relay.await.unwrap();
            if total as u64 > limit {
                assert!(end.as_ref().is_err_and(crate::gate::budget::is_over), "{limit}: {end:?}");
            } else {
                assert!(end.is_ok(), "{limit}: exactly the budget is not over it: {end:?}");
            }
            assert_eq!(got.len() as u64, limit.min(total as u64), "{limit}: what arrived");
            assert_eq!(allowance.left(), 0, "{limit}: the count");
        }
    }
}
