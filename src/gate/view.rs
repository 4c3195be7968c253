//! One request as the agent sent it, whichever way it came: a forwarded plain-HTTP request
//! (`request::Request::view`) or a request on a terminated connection, HTTP/1.1 or an HTTP/2
//! stream (`terminate::admit`). Every decision below the hostname (`decide::check_request`)
//! reads this view, so a rule that reads more of a request (a header, the body's framing) is
//! written once for both paths. It borrows from the request: building it copies nothing.
//!
//! The placeholders of secrets are still in it (nothing is substituted yet), and the plain
//! path leaves out `Proxy-Authorization` (the session's token, the gate's alone). It holds what
//! a decision reads and no more: one that needs the port or the HTTP version adds it here and
//! where the two paths build a view (`Request::view`, `admit`).

use hyper::HeaderMap;

/// How the request's body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// A declared length (`Content-Length`; 0 for a plain request that declares none).
    Length(u64),
    /// No length known beforehand: chunked HTTP/1.1, or an HTTP/2 stream without one.
    Streamed,
}

impl Framing {
    /// The framing `headers` declare: a readable `Content-Length`, else streamed.
    pub(crate) fn of(headers: &HeaderMap) -> Framing {
        headers
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .map_or(Framing::Streamed, Framing::Length)
    }

    /// The declared length, if any.
    pub(crate) fn declared(self) -> Option<u64> {
        match self {
            Framing::Length(n) => Some(n),
            Framing::Streamed => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a> {
    /// As sent (a rule compares it uppercased).
    pub(crate) method: &'a str,
    /// The host the request is for, as the gate decided it (normalised).
    pub(crate) host: &'a str,
    /// The origin-form target, path and query, as sent.
    pub(crate) target: &'a str,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) body: Framing,
}

impl View<'_> {
    /// What the head counts against a budget: its request line and each header as HTTP/1.1 would
    /// write them (`fields_size`); HTTP/2 compresses them, and the count stays the same.
    pub(crate) fn head_size(&self) -> u64 {
        let line = self.method.len() + 1 + self.target.len() + " HTTP/1.1\r\n\r\n".len();
        line as u64 + fields_size(self.headers)
    }
}

/// What header fields count against a budget: each as an HTTP/1.1 line (`name: value\r\n`): a
/// request's head (`View::head_size`) and its trailers (`request_body::Scanned`).
pub(crate) fn fields_size(headers: &HeaderMap) -> u64 {
    headers.iter().map(|(k, v)| (k.as_str().len() + v.len() + 4) as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, hyper::header::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn a_view_counts_its_head_as_http1_lines() {
        let h = headers(&[("host", "a.test"), ("x-k", "v")]);
        let v = View {
            method: "GET",
            host: "a.test",
            target: "/p/q?x=1&y=?",
            headers: &h,
            body: Framing::Length(0),
        };
        let written = "GET /p/q?x=1&y=? HTTP/1.1\r\nhost: a.test\r\nx-k: v\r\n\r\n";
        assert_eq!(v.head_size(), written.len() as u64);
    }

    #[test]
    fn framing_is_the_declared_length_or_streamed() {
        assert_eq!(Framing::of(&headers(&[("content-length", " 12 ")])), Framing::Length(12));
        assert_eq!(Framing::of(&headers(&[("content-length", "x")])), Framing::Streamed);
        assert_eq!(Framing::of(&headers(&[])), Framing::Streamed);
        assert_eq!(Framing::Length(3).declared(), Some(3));
        assert_eq!(Framing::Streamed.declared(), None);
    }

    #[test]
    fn a_header_field_counts_as_its_http_1_1_line() {
        let mut h = hyper::HeaderMap::new();
        assert_eq!(fields_size(&h), 0);
        h.insert("x-a", "bc".parse().unwrap());
        assert_eq!(fields_size(&h), "x-a: bc\r\n".len() as u64);
        h.append("x-a", "defg".parse().unwrap());
        h.insert("host", "h.test".parse().unwrap());
        assert_eq!(
            fields_size(&h),
            ("x-a: bc\r\n".len() + "x-a: defg\r\n".len() + "host: h.test\r\n".len()) as u64
        );
    }
}
