//! A terminated host's response body on its way back to the sandbox: decoded when the upstream
//! compressed it (only the codings `scrub::accept_encoding` lets it use), and every spelling of
//! a bound value replaced as it streams (`scrub::Scrubber`). The body type and its decoder are
//! here; `terminate` decides which responses get them.

use super::grpc;
use super::scrub::{Coding, Scrubber};
use hyper::body::{Body, Bytes, Frame, Incoming};
use std::pin::Pin;
use std::task::{Context, Poll};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every value of `headers` with the spellings `scrub` knows replaced (a value that would not
/// be a header value after it is emptied: a bound value is never left in place).
pub(crate) fn mask_headers(scrub: &mut Scrubber, headers: &mut hyper::HeaderMap) {
    for v in headers.values_mut() {
        if let Some(masked) = scrub.whole(v.as_bytes()) {
            *v = hyper::header::HeaderValue::from_bytes(&masked)
                .unwrap_or(hyper::header::HeaderValue::from_static(""));
        }
    }
}

/// Told what a response's scrubber replaced, once, at the body's end (the log's entry).
pub(crate) type OnEnd = Box<dyn FnOnce(&Scrubber) + Send + Sync>;

/// What the log says when a response carried bound values back: which, how often.
pub(crate) fn masked_reason(replaced: &[(String, usize)]) -> String {
    let each: Vec<String> = replaced.iter().map(|(s, n)| format!("{s} ({n}x)")).collect();
    format!(
        "masked: the response carried the real value of {}; the agent got the placeholder",
        each.join(", ")
    )
}

/// A response body's decoder, for the codings the gate lets the upstream use (`scrub`).
pub(crate) enum Decoder {
    Gzip(flate2::write::MultiGzDecoder<Vec<u8>>),
    Deflate(flate2::write::ZlibDecoder<Vec<u8>>),
}

impl Decoder {
    pub(crate) fn of(c: Coding) -> Option<Decoder> {
        match c {
            Coding::Identity => None,
            Coding::Gzip => Some(Decoder::Gzip(flate2::write::MultiGzDecoder::new(Vec::new()))),
            Coding::Deflate => Some(Decoder::Deflate(flate2::write::ZlibDecoder::new(Vec::new()))),
        }
    }
    /// The decoded bytes `b` completes (`end`: and what the decoder still holds).
    fn feed(&mut self, b: &[u8], end: bool) -> std::io::Result<Vec<u8>> {
        use std::io::Write;
        match self {
            Decoder::Gzip(d) => {
                d.write_all(b)?;
                if end {
                    d.try_finish()?;
                }
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::Deflate(d) => {
                d.write_all(b)?;
                if end {
                    d.try_finish()?;
                }
                Ok(std::mem::take(d.get_mut()))
            }
        }
    }
}

/// A terminated host's response body on its way to the agent: decoded when the upstream
/// compressed it, and every spelling of a bound value replaced (`scrub`). A body that does not
/// decode ends the response with an error (the client sees it cut), never passes as it was.
pub(crate) struct Scrubbed {
    pub(crate) inner: Incoming,
    pub(crate) scrub: Scrubber,
    pub(crate) decode: Option<Decoder>,
    /// Trailers, sent after what the scrubber held back.
    pub(crate) trailers: Option<Frame<Bytes>>,
    pub(crate) ended: bool,
    /// Told what was replaced, once, at the end.
    pub(crate) on_end: Option<OnEnd>,
}

impl Scrubbed {
    /// Decodes and scrubs `b`; `end`: also what both held back.
    fn take(&mut self, b: &[u8], end: bool) -> Result<Bytes, BoxError> {
        let decoded = match self.decode.as_mut() {
            Some(d) => {
                Bytes::from(d.feed(b, end).map_err(|e| format!("the response body does not decode: {e}"))?)
            }
            None => Bytes::copy_from_slice(b),
        };
        let mut out = self.scrub.push(decoded);
        if end {
            out = [out, self.scrub.finish()].concat().into();
            if let Some(f) = self.on_end.take() {
                f(&self.scrub);
            }
        }
        Ok(out)
    }
}

impl Body for Scrubbed {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(t) = self.trailers.take() {
                return Poll::Ready(Some(Ok(t)));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            let (data, end) = match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) if self.decode.is_none() => {
                        // The common case: no copy when nothing is replaced or held.
                        let out = self.scrub.push(d);
                        if out.is_empty() {
                            continue;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    Ok(d) => (d, false),
                    Err(f) => {
                        let t = f.into_trailers().map(|mut t| {
                            mask_headers(&mut self.scrub, &mut t);
                            t
                        });
                        if let Ok(t) = t {
                            self.trailers = Some(Frame::trailers(t));
                        }
                        self.ended = true;
                        (Bytes::new(), true)
                    }
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    self.ended = true;
                    (Bytes::new(), true)
                }
            };
            match self.take(&data, end) {
                Ok(out) if out.is_empty() => continue,
                Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                Err(e) => {
                    self.ended = true;
                    self.trailers = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}

/// A terminated host's gRPC response on its way to the agent: each length-prefixed message
/// held until whole, decoded when the server compressed it (`grpc-encoding` gzip or deflate),
/// and checked with the bytes before it for a bound value in any spelling `scrub` knows. A
/// message that carries one is not sent: the call ends there with gRPC status 13 and why
/// (`on_found` logs it), since a protobuf cannot have a value replaced in place. Trailers are
/// masked as any response's are.
pub(crate) struct GrpcChecked {
    pub(crate) inner: Incoming,
    pub(crate) scrub: Scrubber,
    pub(crate) messages: grpc::Messages,
    /// The messages' coding (`grpc-encoding`), when it is one the gate reads.
    pub(crate) coding: Result<Coding, String>,
    pub(crate) tail: Vec<u8>,
    pub(crate) ended: bool,
    pub(crate) on_end: Option<OnEnd>,
    /// Told once, when a message carried a bound value (the call was ended).
    pub(crate) on_found: Option<OnEnd>,
}

/// How many bytes before a message are checked with it (a value split across messages).
const SEAM: usize = 16 << 10;

impl GrpcChecked {
    /// The messages `d` completes, as they were sent; `Err`: the call's end, as trailers.
    fn take(&mut self, d: &[u8]) -> Result<Bytes, hyper::HeaderMap> {
        let messages = self.messages.feed(d).map_err(|why| end(13, &format!("ai-sandbox gate: {why}")))?;
        let mut out = Vec::new();
        for m in messages {
            let plain = match (m.compressed, &self.coding) {
                (false, _) => m.payload().to_vec(),
                (true, Ok(Coding::Identity)) => {
                    return Err(end(
                        13,
                        "ai-sandbox gate: a gRPC message flagged compressed with no grpc-encoding, which the gate cannot read",
                    ));
                }
                (true, Ok(c)) => inflate(*c, m.payload())
                    .map_err(|e| end(13, &format!("ai-sandbox gate: a gRPC message does not decode: {e}")))?,
                (true, Err(other)) => {
                    return Err(end(
                        13,
                        &format!(
                            "ai-sandbox gate: a gRPC message compressed as {other}, which the gate cannot read"
                        ),
                    ));
                }
            };
            let seen = [self.tail.as_slice(), &plain].concat();
            if self.scrub.whole(&seen).is_some() {
                let names: Vec<String> = self.scrub.names();
                if let Some(f) = self.on_found.take() {
                    f(&self.scrub);
                }
                return Err(end(
                    13,
                    &format!(
                        "ai-sandbox gate: the response carried the real value of {}; the call was ended",
                        names.join(", ")
                    ),
                ));
            }
            self.tail = seen[seen.len().saturating_sub(SEAM)..].to_vec();
            out.extend_from_slice(&m.framed);
        }
        Ok(out.into())
    }
}

/// The trailers that end a call with a gRPC status.
fn end(status: u8, why: &str) -> hyper::HeaderMap {
    let mut t = hyper::HeaderMap::new();
    t.insert("grpc-status", hyper::header::HeaderValue::from(u16::from(status)));
    if let Ok(v) = hyper::header::HeaderValue::from_str(&grpc::message(why)) {
        t.insert("grpc-message", v);
    }
    t
}

/// One whole compressed message, decoded.
fn inflate(c: Coding, b: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut d = Decoder::of(c).ok_or_else(|| std::io::Error::other("not compressed"))?;
    d.feed(b, true)
}

impl Body for GrpcChecked {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => match self.take(&d) {
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                        Err(trailers) => {
                            self.ended = true;
                            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                        }
                    },
                    Err(f) => {
                        self.ended = true;
                        let mut t = f.into_trailers().unwrap_or_default();
                        mask_headers(&mut self.scrub, &mut t);
                        if !self.messages.whole() {
                            // The held part of a message is never sent: the call is not "OK".
                            t = end(13, "ai-sandbox gate: the server's last gRPC message was cut short");
                        }
                        if let Some(f) = self.on_end.take() {
                            f(&self.scrub);
                        }
                        return Poll::Ready(Some(Ok(Frame::trailers(t))));
                    }
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    self.ended = true;
                    if let Some(f) = self.on_end.take() {
                        f(&self.scrub);
                    }
                    if !self.messages.whole() {
                        return Poll::Ready(Some(Err("the server's last gRPC message was cut short".into())));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}

/// How an MCP endpoint's answer is read (`mcp`).
pub(crate) enum McpAnswer {
    /// One JSON body, held whole (up to `mcp::ANSWER_MOST`) and filtered at its end.
    Json(Vec<u8>),
    /// A server-sent-event stream, filtered event by event.
    Events(super::mcp::Events),
}

/// An MCP endpoint's answer after it was masked (`Scrubbed`): each `tools/list` result shows
/// only the tools the rules allow. What the gate cannot read ends the answer with an error (the
/// client sees it cut), never passes as it was. `on_end` is told how many tools were hidden.
pub(crate) struct McpFiltered<B> {
    pub(crate) inner: B,
    pub(crate) patterns: Vec<String>,
    pub(crate) answer: McpAnswer,
    pub(crate) ended: bool,
    pub(crate) trailers: Option<Frame<Bytes>>,
    pub(crate) on_end: Option<Box<dyn FnOnce(usize) + Send + Sync>>,
    /// What `answer` holds, of the session's bound.
    pub(crate) held: super::state::McpHeld,
}

impl<B> McpFiltered<B> {
    /// What `d` completes; `end`: also what was held.
    fn take(&mut self, d: &[u8], end: bool) -> Result<Vec<u8>, String> {
        let (out, hidden) = match &mut self.answer {
            McpAnswer::Json(held) => {
                held.extend_from_slice(d);
                if held.len() > super::mcp::ANSWER_MOST {
                    return Err(format!("an MCP answer longer than {} MiB", super::mcp::ANSWER_MOST >> 20));
                }
                self.held.set(held.len())?;
                if !end {
                    return Ok(Vec::new());
                }
                super::mcp::filter_json(&std::mem::take(held), &self.patterns)?
            }
            McpAnswer::Events(events) => {
                let mut out = events.push(d, &self.patterns)?;
                self.held.set(events.holding())?;
                if end {
                    out.extend(events.end(&self.patterns)?);
                }
                (out, events.hidden)
            }
        };
        if end && let Some(f) = self.on_end.take() {
            f(hidden);
        }
        Ok(out)
    }
}

impl<B: Body<Data = Bytes, Error = BoxError> + Unpin> Body for McpFiltered<B> {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.ended {
                return Poll::Ready(self.trailers.take().map(Ok));
            }
            let (data, end) = match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => (d, false),
                    Err(f) => {
                        self.trailers = Some(f);
                        (Bytes::new(), true)
                    }
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => (Bytes::new(), true),
            };
            self.ended = end;
            match self.take(&data, end) {
                Ok(out) if out.is_empty() => continue,
                Ok(out) => return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out))))),
                Err(why) => {
                    self.ended = true;
                    self.trailers = None;
                    return Poll::Ready(Some(Err(format!("ai-sandbox gate: {why}").into())));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Coding, Decoder};
    use std::io::Write;

    fn gzip(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn a_compressed_body_fed_in_small_pieces_decodes_whole_and_a_corrupt_one_fails() {
        let text = b"authorization: Bearer sk-real-1\n".repeat(50);
        for (coding, packed) in [
            (Coding::Gzip, gzip(&text)),
            (Coding::Gzip, [gzip(&text[..100]), gzip(&text[100..])].concat()),
            (Coding::Deflate, {
                let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(&text).unwrap();
                e.finish().unwrap()
            }),
        ] {
            let mut d = Decoder::of(coding).unwrap();
            let mut out = Vec::new();
            for piece in packed.chunks(7) {
                out.extend(d.feed(piece, false).unwrap());
            }
            out.extend(d.feed(&[], true).unwrap());
            assert_eq!(out, text, "{coding:?}");
        }
        assert!(Decoder::of(Coding::Identity).is_none());
        let mut bad = Decoder::of(Coding::Gzip).unwrap();
        assert!(bad.feed(b"not gzip at all, not even close", true).is_err());
        // Cut short: the end says so.
        let mut cut = Decoder::of(Coding::Gzip).unwrap();
        let packed = gzip(&text);
        let _ = cut.feed(&packed[..packed.len() / 2], false);
        let end = cut.feed(&[], true);
        assert!(end.is_err(), "a gzip stream cut short ends without an error");
    }
}
