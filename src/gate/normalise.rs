//! What comes back from a terminated host is made one spelling before it is masked (ADR 0074):
//! masking is only as good as the gate's reading of the response, so a response the gate cannot
//! read whole is refused (502, with why), never passed as it came. Pure: the response's head in,
//! the one coding to decode (or why not) out; and the request headers that would let the agent
//! choose how the response is cut.
//!
//! - **Codings**: exactly one `Content-Encoding` field with one coding the gate decodes
//!   (identity, gzip, deflate). Two fields (`gzip` then `gzip`; `identity` then `gzip`) or two
//!   codings in one would leave a layer unread, and a coding the gate does not know could not be
//!   read at all.
//! - **Transfer codings**: `chunked` only (hyper reads it). `gzip, chunked` would pass the gzip
//!   unread.
//! - **Upgrades**: a `101` to anything but WebSocket (whose frames the gate reads, `ws_relay`)
//!   would carry both directions unread, and, on a host with rules, the next request on that
//!   stream to the server unchecked.
//! - **Ranges**: `Range` and `If-Range` are removed from requests to a host with a bound secret,
//!   so the server sends the whole resource, masked as one stream: the agent cannot have a value
//!   sent in two halves it chose, each unmasked.
//! - **The reason phrase** is the canonical one for the status (`terminate` drops the server's:
//!   `HTTP/1.1 401 Bad key <value>` must not carry the value past the masks).

use super::scrub::{self, Coding};
use hyper::HeaderMap;
use hyper::header::{CONTENT_ENCODING, IF_RANGE, RANGE, TRANSFER_ENCODING, UPGRADE};

/// The coding of a terminated host's response body, or why the gate cannot read it. `bodiless`:
/// a response with no body (to HEAD, 1xx, 204, 304), whose codings say nothing.
pub(crate) fn response(status: u16, headers: &HeaderMap, bodiless: bool) -> Result<Coding, String> {
    if status == 101 {
        let to = headers.get(UPGRADE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        return match to.as_deref().map(str::trim) {
            Some(p) if p.eq_ignore_ascii_case("websocket") => Ok(Coding::Identity),
            Some(p) => Err(format!(
                "switched to {}, a protocol the gate cannot read (only WebSocket is relayed on a host it opens)",
                crate::sys::quote::text(p)
            )),
            None => Err("switched protocols without naming one".into()),
        };
    }
    if bodiless {
        return Ok(Coding::Identity);
    }
    for te in headers.get_all(TRANSFER_ENCODING) {
        let te = String::from_utf8_lossy(te.as_bytes());
        if let Some(other) = te.split(',').map(str::trim).find(|c| !c.eq_ignore_ascii_case("chunked")) {
            return Err(format!(
                "sent its body with the transfer coding {}, which the gate does not read",
                crate::sys::quote::text(other)
            ));
        }
    }
    let fields: Vec<String> = headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    let codings: Vec<&str> =
        fields.iter().flat_map(|f| f.split(',')).map(str::trim).filter(|c| !c.is_empty()).collect();
    match (fields.len(), codings.as_slice()) {
        (0, _) => Ok(Coding::Identity),
        (1, [one]) => scrub::coding(Some(one)).map_err(|other| {
            format!("encoded its body as {}, which the gate cannot read", crate::sys::quote::text(&other))
        }),
        (n, all) => Err(format!(
            "encoded its body in {} ({}), which the gate does not undo layer by layer",
            if n > 1 { format!("{n} Content-Encoding fields") } else { "several codings".to_string() },
            crate::sys::quote::text(&all.join(", "))
        )),
    }
}

/// The request headers a host with a bound secret does not get: those that ask for a part of
/// the resource (the whole is sent, and masked as one stream). What was removed, for the log.
pub(crate) fn request(headers: &mut HeaderMap, bound: bool) -> Vec<&'static str> {
    if !bound {
        return Vec::new();
    }
    let mut removed = Vec::new();
    for (name, shown) in [(RANGE, "Range"), (IF_RANGE, "If-Range")] {
        if headers.remove(name).is_some() {
            removed.push(shown);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn one_coding_the_gate_reads_passes_and_anything_else_is_refused_with_why() {
        let ok = |h: &[(&str, &str)]| response(200, &headers(h), false);
        assert_eq!(ok(&[]), Ok(Coding::Identity));
        assert_eq!(ok(&[("content-encoding", "GZIP")]), Ok(Coding::Gzip));
        assert_eq!(ok(&[("content-encoding", "deflate")]), Ok(Coding::Deflate));
        assert_eq!(ok(&[("content-encoding", "identity")]), Ok(Coding::Identity));
        assert_eq!(ok(&[("transfer-encoding", "chunked"), ("content-encoding", "gzip")]), Ok(Coding::Gzip));
        let two = ok(&[("content-encoding", "gzip"), ("content-encoding", "gzip")]).unwrap_err();
        assert!(two.contains("2 Content-Encoding fields (gzip, gzip)"), "{two}");
        let first_identity =
            ok(&[("content-encoding", "identity"), ("content-encoding", "gzip")]).unwrap_err();
        assert!(first_identity.contains("2 Content-Encoding fields"), "{first_identity}");
        assert!(ok(&[("content-encoding", "gzip, gzip")]).unwrap_err().contains("several codings"));
        assert!(ok(&[("content-encoding", "br")]).unwrap_err().contains("as br"));
        let te = ok(&[("transfer-encoding", "gzip, chunked")]).unwrap_err();
        assert!(te.contains("transfer coding gzip"), "{te}");
        assert!(ok(&[("transfer-encoding", "chunked"), ("transfer-encoding", "x")]).is_err());
        // No body: codings say nothing.
        assert_eq!(response(304, &headers(&[("content-encoding", "br")]), true), Ok(Coding::Identity));
    }

    #[test]
    fn an_upgrade_passes_only_to_websocket() {
        let up = |p: Option<&str>| {
            let h = p.map(|p| headers(&[("upgrade", p)])).unwrap_or_default();
            response(101, &h, true)
        };
        assert_eq!(up(Some("websocket")), Ok(Coding::Identity));
        assert_eq!(up(Some(" WebSocket ")), Ok(Coding::Identity));
        assert!(up(Some("rtproto")).unwrap_err().contains("switched to rtproto"));
        assert!(up(Some("h2c")).is_err());
        assert!(up(None).unwrap_err().contains("without naming one"));
    }

    #[test]
    fn a_host_with_a_bound_secret_gets_no_range() {
        let mut h = headers(&[("range", "bytes=0-16"), ("if-range", "\"e\""), ("accept", "*/*")]);
        assert!(request(&mut h, false).is_empty() && h.contains_key(RANGE), "no bound secret: as sent");
        assert_eq!(request(&mut h, true), ["Range", "If-Range"]);
        assert!(!h.contains_key(RANGE) && !h.contains_key(IF_RANGE) && h.contains_key("accept"));
        assert!(request(&mut h, true).is_empty());
    }
}
