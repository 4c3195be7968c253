//! gRPC as the gate sees it (pure): a refusal a gRPC client can read (its status in the
//! trailers, with the line to add as the message, instead of an HTTP status gRPC clients only
//! call "unavailable"), and a response's length-prefixed messages, so that each is checked whole
//! for bound values (a protobuf cannot be rewritten in place: a masked value would change its
//! lengths; a message that carries one ends the call instead; docs/adr/0065).

/// A request or response is gRPC by its content type (`application/grpc`, `+proto`, …).
pub(crate) fn is_grpc(content_type: Option<&[u8]>) -> bool {
    content_type.is_some_and(|c| {
        c.len() >= 16
            && c[..16].eq_ignore_ascii_case(b"application/grpc")
            && matches!(c.get(16), None | Some(b'+' | b';'))
    })
}

/// The gRPC status for a refusal's HTTP status (the mapping gRPC itself documents for HTTP
/// errors, with 403 as PERMISSION_DENIED and 421 as well: both are the gate's refusals).
pub(crate) fn status_of(http: u16) -> u8 {
    match http {
        400 => 13,
        401 => 16,
        403 | 421 => 7,
        404 => 12,
        429 | 502..=504 => 14,
        _ => 2,
    }
}

/// A status message as the `grpc-message` trailer carries it: percent-encoded outside
/// printable ASCII (and `%` itself).
pub(crate) fn message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.trim_end().bytes() {
        match b {
            b' '..=b'~' if b != b'%' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The trailers of a call the gate ends: status and message.
pub(crate) fn trailers(http: u16, hint: &str) -> [(&'static str, String); 2] {
    [("grpc-status", status_of(http).to_string()), ("grpc-message", message(hint))]
}

/// Largest message the gate holds whole to check it (gRPC's own default limit is 4 MiB).
pub(crate) const MOST: usize = 16 << 20;

/// One message: its compressed flag, and its bytes as sent (prefix included).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) compressed: bool,
    pub(crate) framed: Vec<u8>,
}

impl Message {
    pub(crate) fn payload(&self) -> &[u8] {
        &self.framed[5..]
    }
}

/// Splits a stream of length-prefixed messages (1 byte flag, 4 bytes big-endian length) into
/// whole messages, however the stream was cut into frames.
#[derive(Default)]
pub(crate) struct Messages {
    held: Vec<u8>,
}

impl Messages {
    pub(crate) fn feed(&mut self, b: &[u8]) -> Result<Vec<Message>, String> {
        self.held.extend_from_slice(b);
        let mut out = Vec::new();
        while self.held.len() >= 5 {
            let flag = self.held[0];
            if flag > 1 {
                return Err(format!("a gRPC message with flag {flag}"));
            }
            let len = u32::from_be_bytes([self.held[1], self.held[2], self.held[3], self.held[4]]) as usize;
            if len > MOST {
                return Err(format!("a gRPC message of {len} bytes (the gate reads at most {MOST})"));
            }
            if self.held.len() < 5 + len {
                break;
            }
            let rest = self.held.split_off(5 + len);
            out.push(Message { compressed: flag == 1, framed: std::mem::replace(&mut self.held, rest) });
        }
        Ok(out)
    }

    /// Whether the stream ended between messages.
    pub(crate) fn whole(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_is_told_by_its_content_type() {
        for yes in ["application/grpc", "application/grpc+proto", "Application/GRPC;charset=x"] {
            assert!(is_grpc(Some(yes.as_bytes())), "{yes}");
        }
        for no in ["application/grpc-web", "application/json", "application/grp", ""] {
            assert!(!is_grpc(Some(no.as_bytes())), "{no}");
        }
        assert!(!is_grpc(None));
    }

    #[test]
    fn refusals_map_to_the_grpc_statuses_a_client_reports() {
        assert_eq!(status_of(403), 7, "PERMISSION_DENIED");
        assert_eq!(status_of(421), 7);
        assert_eq!(status_of(401), 16);
        assert_eq!(status_of(400), 13);
        assert_eq!(status_of(404), 12);
        assert_eq!(status_of(502), 14, "UNAVAILABLE");
        assert_eq!(status_of(429), 14);
        assert_eq!(status_of(500), 2);
        assert_eq!(
            message("refused; add: rule = a.test POST /p.S/M\n"),
            "refused; add: rule = a.test POST /p.S/M",
            "printable text stays as it is (the trailing newline goes)"
        );
        assert_eq!(message("50% – é\tx"), "50%25 %E2%80%93 %C3%A9%09x");
        assert_eq!(trailers(403, "no")[0], ("grpc-status", "7".to_string()));
    }

    fn framed(flag: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![flag];
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn messages_come_out_whole_however_the_stream_was_cut() {
        let stream = [framed(0, b"first"), framed(1, b"zz"), framed(0, b"")].concat();
        for cut in 1..stream.len() {
            let mut m = Messages::default();
            let mut got = m.feed(&stream[..cut]).unwrap();
            got.extend(m.feed(&stream[cut..]).unwrap());
            assert!(m.whole());
            let payloads: Vec<&[u8]> = got.iter().map(|g| g.payload()).collect();
            assert_eq!(payloads, [&b"first"[..], b"zz", b""], "cut at {cut}");
            assert_eq!(got.iter().map(|g| g.compressed).collect::<Vec<_>>(), [false, true, false]);
            assert_eq!(got.iter().flat_map(|g| g.framed.clone()).collect::<Vec<_>>(), stream);
        }
        let mut m = Messages::default();
        assert!(m.feed(&framed(0, b"abc")[..6]).unwrap().is_empty());
        assert!(!m.whole(), "a message cut short is not whole");
        assert!(Messages::default().feed(&framed(2, b"x")).is_err(), "an unknown flag");
        let huge = [&[0u8][..], &((MOST + 1) as u32).to_be_bytes()].concat();
        assert!(Messages::default().feed(&huge).is_err(), "longer than the gate holds");
        let most = [&[0u8][..], &(MOST as u32).to_be_bytes()].concat();
        assert_eq!(Messages::default().feed(&most), Ok(vec![]), "as long as the gate holds: waited for");
    }
}
