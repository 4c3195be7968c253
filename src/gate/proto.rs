//! Which HTTP version a terminated connection speaks (pure): the gate offers the upstream what
//! the client offered (of `h2` and `http/1.1`), and answers the client's handshake with what
//! the upstream chose, so both sides speak the same version and a gRPC client meets an HTTP/2
//! server (docs/adr/0065). A request then goes upstream in the form its version wants.

use hyper::http::{HeaderValue, header, request::Parts, uri::Uri};

/// The HTTP version of one side of a terminated connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proto {
    H1,
    H2,
}

pub(crate) const H2: &[u8] = b"h2";
pub(crate) const H1: &[u8] = b"http/1.1";

impl Proto {
    pub(crate) fn alpn(self) -> &'static [u8] {
        match self {
            Proto::H1 => H1,
            Proto::H2 => H2,
        }
    }
}

/// What the gate offers the upstream, given the client's ALPN list (`None`: it sent none, so it
/// speaks HTTP/1.1): the versions the gate relays that the client offered, h2 first; HTTP/1.1
/// when the client offered neither (its handshake with the gate then fails: nothing in common).
pub(crate) fn offer(client: Option<&[Vec<u8>]>) -> Vec<Vec<u8>> {
    let offered = |p: &[u8]| client.is_none_or(|c| c.iter().any(|o| o == p));
    let mut out = Vec::new();
    if client.is_some() && offered(H2) {
        out.push(H2.to_vec());
    }
    if offered(H1) || out.is_empty() {
        out.push(H1.to_vec());
    }
    out
}

/// The version both sides speak: the upstream's choice; without one (it chose none, or its TLS
/// failed and every request is answered by the gate) the first the gate offered.
pub(crate) fn chosen(upstream: Option<&[u8]>, offered: &[Vec<u8>]) -> Proto {
    match upstream.or(offered.first().map(|p| p.as_slice())) {
        Some(p) if p == H2 => Proto::H2,
        _ => Proto::H1,
    }
}

/// A checked request (`target` its origin-form path and query) in the form the upstream's
/// version wants: HTTP/2 names the host in the URI (`:authority`) and has no Host header;
/// HTTP/1.1 takes the origin form and one Host header, the connection's host in one spelling
/// (whatever the client wrote: `the_host` checked that it names this host, and a server that
/// routes on a spelling the check let through, or on a second value, must not see it).
pub(crate) fn for_upstream(
    parts: &mut Parts,
    proto: Proto,
    host: &str,
    port: u16,
    target: &str,
) -> Result<(), String> {
    let authority = match port {
        443 => host.to_string(),
        p => format!("{host}:{p}"),
    };
    let bad = |_| "the request target does not parse".to_string();
    match proto {
        Proto::H2 => {
            parts.uri = Uri::builder()
                .scheme("https")
                .authority(authority.as_str())
                .path_and_query(target)
                .build()
                .map_err(bad)?;
            parts.headers.remove(header::HOST);
        }
        Proto::H1 => {
            parts.uri = target.parse().map_err(|_| "the request target does not parse".to_string())?;
            let v = HeaderValue::from_str(&authority).map_err(|_| "the host is not a header value")?;
            parts.headers.insert(header::HOST, v);
        }
    }
    parts.version = match proto {
        Proto::H1 => hyper::Version::HTTP_11,
        Proto::H2 => hyper::Version::HTTP_2,
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(list: &[&[u8]]) -> Vec<Vec<u8>> {
        list.iter().map(|p| p.to_vec()).collect()
    }

    #[test]
    fn the_upstream_is_offered_what_the_client_offered_of_what_the_gate_relays() {
        assert_eq!(offer(None), v(&[H1]), "no ALPN: HTTP/1.1");
        assert_eq!(offer(Some(&v(&[H2, H1]))), v(&[H2, H1]));
        assert_eq!(offer(Some(&v(&[H1, H2]))), v(&[H2, H1]), "h2 first, whatever the client's order");
        assert_eq!(offer(Some(&v(&[b"grpc-exp", H2]))), v(&[H2]), "a gRPC client: h2 only");
        assert_eq!(offer(Some(&v(&[H1]))), v(&[H1]));
        assert_eq!(
            offer(Some(&v(&[b"spdy/3"]))),
            v(&[H1]),
            "nothing in common: HTTP/1.1 (its handshake fails)"
        );
    }

    #[test]
    fn both_sides_speak_the_upstreams_choice() {
        assert_eq!(chosen(Some(H2), &v(&[H2, H1])), Proto::H2);
        assert_eq!(
            chosen(Some(H1), &v(&[H2, H1])),
            Proto::H1,
            "an HTTP/1.1 server: the client gets HTTP/1.1"
        );
        assert_eq!(chosen(None, &v(&[H2])), Proto::H2, "no upstream: what the client can speak");
        assert_eq!(chosen(None, &v(&[H1])), Proto::H1);
    }

    fn parts(uri: &str, host: Option<&str>) -> Parts {
        let mut b = hyper::Request::builder().uri(uri);
        if let Some(h) = host {
            b = b.header("host", h);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_request_takes_the_form_of_the_upstreams_version() {
        let mut p = parts("https://api.test/v1/x?q=1", None);
        for_upstream(&mut p, Proto::H2, "api.test", 443, "/v1/x?q=1").unwrap();
        assert_eq!(p.uri.to_string(), "https://api.test/v1/x?q=1");
        assert_eq!(p.version, hyper::Version::HTTP_2);

        let mut p = parts("/v1/x", Some("api.test:8443"));
        for_upstream(&mut p, Proto::H2, "api.test", 8443, "/v1/x").unwrap();
        assert_eq!(p.uri.to_string(), "https://api.test:8443/v1/x");
        assert!(p.headers.get("host").is_none(), "HTTP/2 names the host in :authority only");

        let mut p = parts("https://api.test/v1/x", None);
        for_upstream(&mut p, Proto::H1, "api.test", 443, "/v1/x").unwrap();
        assert_eq!(p.uri.to_string(), "/v1/x");
        assert_eq!(p.headers["host"], "api.test", "from HTTP/2: the Host header is added");

        // What the client wrote (another spelling, a second value) is replaced by the one.
        let mut p = parts("/v1/x", Some("API.test."));
        p.headers.append("host", HeaderValue::from_static("other.test"));
        for_upstream(&mut p, Proto::H1, "api.test", 8443, "/v1/x").unwrap();
        let hosts: Vec<_> = p.headers.get_all("host").iter().collect();
        assert_eq!(hosts, ["api.test:8443"]);
        assert_eq!(p.version, hyper::Version::HTTP_11);
    }
}
