//! HTTP/1.1 heads as the gate and its helpers write and read them (pure): the one response
//! writer (the gate's replies, the stand-in that answers for a dead gate) and the head readers
//! built on httparse (the gate's own request parser is `request`; `connect` reads the gate's
//! answer to its CONNECT). One spelling, so a fix to framing lands everywhere at once.

/// The standard reason phrase of the statuses the gate answers with.
pub(crate) fn phrase(status: u16) -> &'static str {
    match status {
        200 => "Connection established",
        400 => "Bad Request",
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        411 => "Length Required",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// A complete plain-text response that closes the connection. `reason` is the status line's
/// phrase: for a refusal, its hint, because the status line is what most clients print of a
/// failed CONNECT (Python, git), never the body.
pub(crate) fn response(status: u16, reason: &str, body: &str) -> String {
    let extra = if status == 407 { "Proxy-Authenticate: Basic realm=\"ai-sandbox\"\r\n" } else { "" };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
        body.len()
    )
}

/// Whether `buf` holds a whole request head (or something that can never become one): reading
/// can stop.
pub(crate) fn request_head_done(buf: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    !matches!(httparse::Request::new(&mut headers).parse(buf), Ok(httparse::Status::Partial))
}

/// A response head read from `buf`: `Ok(None)` while it is incomplete, else the status, the
/// reason phrase, and the head's length (what follows is the body or a tunnel's bytes).
pub(crate) fn response_head(buf: &[u8]) -> Result<Option<(u16, String, usize)>, httparse::Error> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    Ok(match r.parse(buf)? {
        httparse::Status::Partial => None,
        httparse::Status::Complete(n) => Some((r.code.unwrap_or(0), r.reason.unwrap_or("").to_string(), n)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_reads_back_as_what_was_written() {
        let text = response(403, "blocked by ai-sandbox: add \"allow = x.test\"", "why\n");
        let (status, reason, len) = response_head(text.as_bytes()).unwrap().unwrap();
        assert_eq!((status, reason.as_str()), (403, "blocked by ai-sandbox: add \"allow = x.test\""));
        assert_eq!(&text[len..], "why\n");
        assert!(!text.contains("Proxy-Authenticate"));
        assert!(
            response(407, phrase(407), "").contains("Proxy-Authenticate: Basic realm=\"ai-sandbox\"\r\n")
        );
        // Incomplete, then complete; a request head likewise.
        assert_eq!(response_head(&text.as_bytes()[..20]).unwrap(), None);
        assert!(!request_head_done(b"CONNECT a:443 HTTP/1.1\r\nHost: a"));
        assert!(request_head_done(b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n"));
        // Garbage never becomes a head: reading stops too.
        assert!(request_head_done(b"\x00\x01 not http\r\n"));
        assert!(response_head(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
    }

    #[test]
    fn each_status_the_gate_answers_has_its_standard_phrase() {
        for (status, want) in [
            (200, "Connection established"),
            (400, "Bad Request"),
            (403, "Forbidden"),
            (407, "Proxy Authentication Required"),
            (408, "Request Timeout"),
            (411, "Length Required"),
            (431, "Request Header Fields Too Large"),
            (502, "Bad Gateway"),
            (503, "Service Unavailable"),
            (599, "Error"),
        ] {
            assert_eq!(phrase(status), want, "{status}");
        }
    }
}
