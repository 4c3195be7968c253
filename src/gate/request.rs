//! Strict parsing of one proxy request head (pure).
//!
//! Anything a front end and a back end could read differently is refused before it can be
//! relayed: bare LF, NUL, obs-fold, two Content-Length, Content-Length with Transfer-Encoding,
//! duplicate Host, a Host header that disagrees with the target, origin-form requests, userinfo
//! in the URI. Forwarded (absolute-form) requests are one per connection, their body bounded
//! by Content-Length, and rewritten to origin-form with `Connection: close`.

use base64::Engine;

pub(crate) const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `CONNECT host:port`: a tunnel.
    Connect,
    /// `GET http://host/path`: forwarded as one request.
    Forward,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub(crate) kind: Kind,
    pub(crate) method: String,
    /// The target host as written (IPv6 without brackets), not yet normalised.
    pub host: String,
    pub port: u16,
    /// The password of `Proxy-Authorization: Basic` (the session token), if any.
    pub token: Option<String>,
    /// Bytes of the head, including the final CRLFCRLF.
    pub head_len: usize,
    /// Forward only: the origin-form head to send upstream.
    pub(crate) upstream_head: Vec<u8>,
    /// Forward only: the origin-form target (`/path?query`) as the client wrote it.
    pub(crate) path: String,
    /// Forward only: request body length (Content-Length, else 0).
    pub(crate) body_len: u64,
    /// Forward only: the header fields as sent, but `Proxy-Authorization` (what `view` shows).
    pub(crate) headers: hyper::HeaderMap,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadError {
    /// More bytes are needed.
    Incomplete,
    /// The head exceeds MAX_HEAD or MAX_HEADERS (431).
    TooLarge,
    /// Malformed or ambiguous (400), with the reason.
    Bad(&'static str),
    /// A body framing the gate does not relay (411).
    LengthRequired,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Splits `host:port` (or `[v6]:port`); `default` applies when the port is absent.
fn split_authority(auth: &str, default: Option<u16>) -> Result<(String, u16), HeadError> {
    if auth.is_empty() || auth.contains('@') {
        return Err(HeadError::Bad("bad authority (empty, or contains userinfo)"));
    }
    let (host, port) = if let Some(rest) = auth.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or(HeadError::Bad("unterminated IPv6 literal"))?;
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or(HeadError::Bad("bad authority"))?)),
        }
    } else {
        match auth.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return Err(HeadError::Bad("IPv6 literals must be in brackets")),
            None => (auth, None),
        }
    };
    let port = match port {
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            p.parse::<u16>().ok().filter(|p| *p > 0).ok_or(HeadError::Bad("bad port"))?
        }
        Some(_) => return Err(HeadError::Bad("bad port")),
        None => default.ok_or(HeadError::Bad("CONNECT target needs a port"))?,
    };
    if host.is_empty() {
        return Err(HeadError::Bad("empty host"));
    }
    Ok((host.to_string(), port))
}

/// Two spellings of one hostname: case and trailing dots aside. The plain path's parser and
/// `names_host` (a terminated request) compare names with it.
pub(crate) fn same_host(a: &str, b: &str) -> bool {
    let norm = |s: &str| s.trim_end_matches('.').to_ascii_lowercase();
    norm(a) == norm(b)
}

/// Whether a request on a terminated connection names the connection's `host` (and `port`,
/// where it says a port): an absolute-form URI's authority, and the Host header (`None`: absent;
/// `Some(None)`: not text). HTTP/2 names the host in `:authority` (the URI's) alone. Else a CDN
/// fronting many names could route the real key to another one.
pub(crate) fn names_host(
    authority: Option<&str>,
    host_header: Option<Option<&str>>,
    host: &str,
    port: u16,
) -> Result<(), String> {
    let ok =
        |a: &str| split_authority(a.trim(), Some(port)).is_ok_and(|(h, p)| same_host(&h, host) && p == port);
    if let Some(a) = authority
        && !ok(a)
    {
        return Err(format!("the request names {a}, not {host}"));
    }
    match host_header {
        Some(Some(h)) if ok(h) => Ok(()),
        None if authority.is_some() => Ok(()),
        Some(Some(h)) => Err(format!("the Host header names {h}, not {host}")),
        Some(None) => Err("the Host header is not text".into()),
        None => Err("the request has no Host header".into()),
    }
}

fn token_of(value: &[u8]) -> Option<String> {
    let v = std::str::from_utf8(value).ok()?.trim();
    let (scheme, b64) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok()?;
    let text = String::from_utf8(raw).ok()?;
    Some(text.split_once(':')?.1.to_string())
}

const HOP_BY_HOP: &[&str] = &[
    "proxy-authorization",
    "proxy-connection",
    "proxy-authenticate",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
];

impl Request {
    /// The request as the decisions below the hostname read it (`gate::view`), for `host`, its
    /// name as the gate normalised it.
    pub(crate) fn view<'a>(&'a self, host: &'a str) -> super::view::View<'a> {
        super::view::View {
            method: &self.method,
            host,
            target: &self.path,
            headers: &self.headers,
            body: super::view::Framing::Length(self.body_len),
        }
    }

    /// A forward request sent with another method spelling and target (the rules' normal form).
    pub(crate) fn retargeted(&self, method: &str, target: &str) -> Request {
        let line_end = self.upstream_head.windows(2).position(|w| w == b"\r\n").unwrap_or(0);
        let mut head = format!("{method} {target} HTTP/1.1").into_bytes();
        head.extend_from_slice(&self.upstream_head[line_end..]);
        Request { method: method.to_string(), path: target.to_string(), upstream_head: head, ..self.clone() }
    }
}

pub fn parse(buf: &[u8]) -> Result<Request, HeadError> {
    // Framing checks run over everything received so far, so a head that another parser
    // would end at a bare LF is refused at once rather than waited on.
    let end = find(buf, b"\r\n\r\n").map(|e| e + 4);
    let scan = &buf[..end.unwrap_or(buf.len()).min(buf.len())];
    for (i, b) in scan.iter().enumerate() {
        match *b {
            0 => return Err(HeadError::Bad("NUL byte in the request head")),
            b'\n' if i == 0 || scan[i - 1] != b'\r' => return Err(HeadError::Bad("bare LF")),
            b'\r' if i + 1 < scan.len() && scan[i + 1] != b'\n' => return Err(HeadError::Bad("bare CR")),
            b'\n' if i + 1 < scan.len() && matches!(scan[i + 1], b' ' | b'\t') => {
                return Err(HeadError::Bad("obs-fold (a header line starting with whitespace)"));
            }
            _ => {}
        }
    }
    let end = match end {
        Some(e) if e <= MAX_HEAD => e,
        Some(_) => return Err(HeadError::TooLarge),
        None if buf.len() >= MAX_HEAD => return Err(HeadError::TooLarge),
        None => return Err(HeadError::Incomplete),
    };
    let head = &buf[..end];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == end => {}
        Ok(_) => return Err(HeadError::Bad("malformed request head")),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => return Err(HeadError::Bad("malformed request head")),
    }
    let method = req.method.ok_or(HeadError::Bad("no method"))?.to_string();
    let target = req.path.ok_or(HeadError::Bad("no target"))?;
    if !matches!(req.version, Some(0) | Some(1)) {
        return Err(HeadError::Bad("unsupported HTTP version"));
    }
    let mut cl: Option<u64> = None;
    let (mut n_cl, mut te, mut host_hdr, mut token) = (0, false, None::<&str>, None);
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        match name.as_str() {
            "content-length" => {
                n_cl += 1;
                let v =
                    std::str::from_utf8(h.value).map_err(|_| HeadError::Bad("bad Content-Length"))?.trim();
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) || v.len() > 15 {
                    return Err(HeadError::Bad("bad Content-Length"));
                }
                cl = Some(v.parse().map_err(|_| HeadError::Bad("bad Content-Length"))?);
            }
            "transfer-encoding" => te = true,
            "host" => {
                if host_hdr.is_some() {
                    return Err(HeadError::Bad("two Host headers"));
                }
                host_hdr = Some(std::str::from_utf8(h.value).map_err(|_| HeadError::Bad("bad Host"))?.trim());
            }
            "proxy-authorization" => token = token_of(h.value),
            _ => {}
        }
    }
    if n_cl > 1 {
        return Err(HeadError::Bad("two Content-Length headers"));
    }
    if te && n_cl > 0 {
        return Err(HeadError::Bad("Content-Length with Transfer-Encoding"));
    }

    if method == "CONNECT" {
        if te || cl.is_some_and(|n| n > 0) {
            return Err(HeadError::Bad("CONNECT with a body"));
        }
        let (host, port) = split_authority(target, None)?;
        if let Some(h) = host_hdr {
            let (hh, hp) = split_authority(h, Some(port))?;
            if !same_host(&hh, &host) || hp != port {
                return Err(HeadError::Bad("Host header does not match the CONNECT target"));
            }
        }
        return Ok(Request {
            kind: Kind::Connect,
            method,
            host,
            port,
            token,
            head_len: end,
            upstream_head: Vec::new(),
            path: String::new(),
            body_len: 0,
            headers: hyper::HeaderMap::new(),
        });
    }

    if target.starts_with('/') || target == "*" {
        return Err(HeadError::Bad("origin-form request: this is a proxy, send an absolute URI"));
    }
    let rest = if target.len() > 7 && target[..7].eq_ignore_ascii_case("http://") {
        &target[7..]
    } else {
        return Err(HeadError::Bad("only http:// URIs are forwarded (use CONNECT for https)"));
    };
    let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = (&rest[..split], &rest[split..]);
    let (host, port) = split_authority(authority, Some(80))?;
    let hh = host_hdr.ok_or(HeadError::Bad("no Host header"))?;
    let (hhost, hport) = split_authority(hh, Some(80))?;
    if !same_host(&hhost, &host) || hport != port {
        return Err(HeadError::Bad("Host header does not match the URI"));
    }
    if te {
        return Err(HeadError::LengthRequired);
    }
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('/') => p.split('#').next().unwrap_or("/").to_string(),
        p => format!("/{}", p.split('#').next().unwrap_or("")),
    };
    let mut up = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    let mut headers = hyper::HeaderMap::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if name != "proxy-authorization" {
            let bad = || HeadError::Bad("a header field the gate cannot read");
            let k = hyper::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
            headers.append(k, hyper::header::HeaderValue::from_bytes(h.value).map_err(|_| bad())?);
        }
        if HOP_BY_HOP.contains(&name.as_str()) {
            continue;
        }
        up.extend_from_slice(h.name.as_bytes());
        up.extend_from_slice(b": ");
        up.extend_from_slice(h.value);
        up.extend_from_slice(b"\r\n");
    }
    up.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Request {
        kind: Kind::Forward,
        method,
        host,
        port,
        token,
        head_len: end,
        upstream_head: up,
        path,
        body_len: cl.unwrap_or(0),
        headers,
    })
}
