//! The stand-in for a dead gate: the launcher holds a duplicate of the gate's listening socket
//! (passed at registration), and if the gate dies it answers every connection on that port with
//! a refusal, so the port can never be someone else's and nothing hangs. Fail closed, at once.

use crate::gate::http;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::time::Duration;

/// Answers on the dead gate's listening socket: every request is refused at once (fail closed,
/// and fast, rather than a hang or someone else's answer).
pub(super) fn stand_in(listener: OwnedFd) {
    let l = std::net::TcpListener::from(listener);
    // The O_NONBLOCK flag belongs to the gate's (shared) open file; the gate is gone.
    let _ = l.set_nonblocking(false);
    for c in l.incoming().flatten() {
        std::thread::spawn(move || refuse_one(c));
    }
}

/// Reads the request head (so closing does not reset the connection before the client reads
/// the answer), answers 503, half-closes, and drains briefly.
fn refuse_one(mut c: std::net::TcpStream) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !http::request_head_done(&head) && head.len() < 64 * 1024 {
        match c.read(&mut buf) {
            Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let body =
        "blocked by ai-sandbox: the egress gate stopped; this sandbox has no egress until it is restarted\n";
    let _ = c.write_all(http::response(503, "ai-sandbox gate stopped", body).as_bytes());
    let _ = c.shutdown(std::net::Shutdown::Write);
    let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
    while matches!(c.read(&mut buf), Ok(n) if n > 0) {}
}
