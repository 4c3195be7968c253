//! What comes back from a host whose TLS the gate opens: the gate put the real values of the
//! session's bound secrets into the request, and a server that echoes its request (an
//! httpbin-style `/headers`, an error page quoting the Authorization header, a debug endpoint)
//! would hand them to the agent. Pure: which spellings of each value to look for (`Masks`), and
//! a stream replacer (`Scrubber`) that `terminate` runs over every response header and body
//! (after `normalise` has made the response one the gate can read: one coding it decodes, no
//! transfer coding but chunked, a canonical reason phrase; ADR 0074).
//!
//! Spellings: the value as sent; percent-encoded (upper- and lower-case hex); base64 at each of
//! the three alignments a value can have inside a longer encoded string (preceded by 0, 1 or 2
//! bytes), in the standard and the URL-safe alphabet, each as the characters that encode the
//! value's bits alone (the one or two characters at each end, which mix the value's first or
//! last bits with the bytes around it, are not part of the spelling: at most 4 bits of the
//! value at each end, and padding, are left as they are); and the exact `Basic` credential
//! tokens of this request (base64 of `user:value`, with their padding). Each becomes the
//! placeholder in the same spelling (at the same alignment), so the agent reads back what it
//! sent. All spellings are found in one pass (Aho–Corasick, leftmost-longest).
//!
//! Streaming: a chunk's tail that could begin a spelling is held until the next chunk (so a
//! value split across chunks is still caught) and nothing else is: a stream whose chunks end
//! anywhere else (a server-sent event's blank line) is not delayed.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use hyper::body::Bytes;
use std::sync::{Arc, OnceLock};

/// One spelling of a bound value, and what the agent sees in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mask {
    real: Vec<u8>,
    shown: Vec<u8>,
    /// Which secret (for the log), by name.
    secret: String,
}

/// The spellings to mask in one response, and their automaton (made once, on first use). A
/// clone shares both until a spelling is added to it: a connection makes its host's masks once
/// and each of its requests clones them, so the automaton (tens of microseconds to build) is
/// not built again per request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Masks {
    list: Arc<Vec<Mask>>,
    found: Arc<OnceLock<Option<AhoCorasick>>>,
}

/// `b` with each byte outside RFC 3986's unreserved set as `%XX` (`upper` or lower hex).
fn percent(b: &[u8], upper: bool) -> Vec<u8> {
    percent_keeping(b, upper, b"")
}

/// `percent`, with the bytes of `keep` left as they are (Python's `quote` keeps `/`).
fn percent_keeping(b: &[u8], upper: bool, keep: &[u8]) -> Vec<u8> {
    let hex: &[u8; 16] = if upper { b"0123456789ABCDEF" } else { b"0123456789abcdef" };
    let mut out = Vec::with_capacity(b.len() * 3);
    for &c in b {
        if c.is_ascii_alphanumeric() || b"-._~".contains(&c) || keep.contains(&c) {
            out.push(c);
        } else {
            out.extend_from_slice(&[b'%', hex[usize::from(c >> 4)], hex[usize::from(c & 15)]]);
        }
    }
    out
}

/// `b` with a `\` before each byte of `which` (`"` and `\` for a JSON string; bound values hold
/// no control byte, which JSON would write as `\u00XX`).
fn backslashed(b: &[u8], which: &[u8]) -> Vec<u8> {
    b.iter().flat_map(|&c| if which.contains(&c) { vec![b'\\', c] } else { vec![c] }).collect()
}

/// The base64 characters (`url`: the URL-safe alphabet) that encode `b`'s bits alone when `b`
/// starts `shift` bytes (0, 1 or 2) into a group of three: those of `shift` zero bytes and `b`,
/// less the characters that hold a bit of the bytes before it or after it.
pub(crate) fn b64_core(b: &[u8], shift: usize, url: bool) -> Vec<u8> {
    let data = [&[0u8; 2][..shift], b].concat();
    let text = if url { URL_SAFE_NO_PAD.encode(&data) } else { STANDARD_NO_PAD.encode(&data) };
    // Character i holds bits [6i, 6i + 6): it is the value's alone when they lie in
    // [8 * shift, 8 * (shift + len)).
    let first = (8 * shift).div_ceil(6);
    let end = 8 * (shift + b.len()) / 6;
    text.as_bytes().get(first..end).map(<[u8]>::to_vec).unwrap_or_default()
}

impl Masks {
    /// The spellings of each `(secret, value, placeholder)` bound to the response's host.
    pub(crate) fn new<'a>(bound: impl IntoIterator<Item = (&'a str, &'a [u8], &'a [u8])>) -> Masks {
        let mut m = Masks::default();
        for (secret, value, placeholder) in bound {
            m.add(value, placeholder, secret);
            for upper in [true, false] {
                m.add(&percent(value, upper), &percent(placeholder, upper), secret);
                m.add(&percent_keeping(value, upper, b"/"), &percent(placeholder, upper), secret);
            }
            // In a JSON string: `\` and `"` escaped, and `/` as `\/` too (PHP's default).
            let json = backslashed(value, b"\\\"");
            m.add(&json, placeholder, secret);
            m.add(&backslashed(&json, b"/"), placeholder, secret);
            for url in [false, true] {
                for shift in 0..3 {
                    m.add(&b64_core(value, shift, url), &b64_core(placeholder, shift, url), secret);
                }
            }
        }
        m
    }

    /// One more spelling (a spelling already listed, or an empty one, is not added twice).
    pub(crate) fn add(&mut self, real: &[u8], shown: &[u8], secret: &str) {
        if !real.is_empty() && !self.list.iter().any(|m| m.real == real) {
            let mask = Mask { real: real.to_vec(), shown: shown.to_vec(), secret: secret.into() };
            Arc::make_mut(&mut self.list).push(mask);
            self.found = Arc::default();
        }
    }

    fn automaton(&self) -> Option<&AhoCorasick> {
        self.found
            .get_or_init(|| {
                (!self.list.is_empty()).then(|| {
                    AhoCorasick::builder()
                        .match_kind(MatchKind::LeftmostLongest)
                        .build(self.list.iter().map(|m| &m.real))
                        .expect("spellings of bounded length")
                })
            })
            .as_ref()
    }

    /// No spelling to look for (the host has no bound secret).
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn longest(&self) -> usize {
        self.list.iter().map(|m| m.real.len()).max().unwrap_or(0)
    }

    /// The earliest spelling in `hay` (the longest when two start at one place).
    fn first(&self, hay: &[u8]) -> Option<(usize, usize)> {
        let m = self.automaton()?.find(hay)?;
        Some((m.start(), m.pattern().as_usize()))
    }

    /// How many bytes at the end of `b` could begin a spelling (held for the next chunk).
    fn could_begin(&self, b: &[u8]) -> usize {
        let most = self.longest().saturating_sub(1).min(b.len());
        (1..=most)
            .rev()
            .find(|&n| self.list.iter().any(|m| m.real.starts_with(&b[b.len() - n..])))
            .unwrap_or(0)
    }
}

/// Masks one response's byte stream, chunk by chunk; counts what it replaced, per secret.
#[derive(Debug)]
pub(crate) struct Scrubber {
    masks: Masks,
    carry: Vec<u8>,
    counts: Vec<usize>,
}

impl Scrubber {
    pub(crate) fn new(masks: Masks) -> Scrubber {
        let n = masks.list.len();
        Scrubber { masks, carry: Vec::new(), counts: vec![0; n] }
    }

    /// The bytes of `chunk` (after what an earlier chunk held back) that may go on now.
    pub(crate) fn push(&mut self, chunk: Bytes) -> Bytes {
        if self.carry.is_empty() && self.masks.first(&chunk).is_none() && self.masks.could_begin(&chunk) == 0
        {
            return chunk;
        }
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(&chunk);
        let (mut out, rest) = self.replace(&buf);
        let hold = self.masks.could_begin(&buf[rest..]);
        out.extend_from_slice(&buf[rest..buf.len() - hold]);
        self.carry = buf[buf.len() - hold..].to_vec();
        Bytes::from(out)
    }

    /// What is held back, at the stream's end.
    pub(crate) fn finish(&mut self) -> Bytes {
        let buf = std::mem::take(&mut self.carry);
        let (mut out, rest) = self.replace(&buf);
        out.extend_from_slice(&buf[rest..]);
        Bytes::from(out)
    }

    /// A whole value (a header): `None` when it holds no spelling.
    pub(crate) fn whole(&mut self, value: &[u8]) -> Option<Vec<u8>> {
        let (mut out, rest) = self.replace(value);
        if rest == 0 {
            return None;
        }
        out.extend_from_slice(&value[rest..]);
        Some(out)
    }

    /// `buf` up to just after its last spelling, with each replaced; and where that is.
    fn replace(&mut self, buf: &[u8]) -> (Vec<u8>, usize) {
        let mut out = Vec::with_capacity(buf.len());
        let mut at = 0;
        while let Some((i, k)) = self.masks.first(&buf[at..]) {
            let m = &self.masks.list[k];
            out.extend_from_slice(&buf[at..at + i]);
            out.extend_from_slice(&m.shown);
            at += i + m.real.len();
            self.counts[k] += 1;
        }
        (out, at)
    }

    /// The secrets whose values were replaced, each with how many times (for the log).
    pub(crate) fn replaced(&self) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = Vec::new();
        for (m, &n) in self.masks.list.iter().zip(&self.counts).filter(|(_, n)| **n > 0) {
            match out.iter_mut().find(|(s, _)| *s == m.secret) {
                Some((_, total)) => *total += n,
                None => out.push((m.secret.clone(), n)),
            }
        }
        out
    }

    /// The names of the secrets whose values were found (for a refusal that names them).
    pub(crate) fn names(&self) -> Vec<String> {
        self.replaced().into_iter().map(|(n, _)| n).collect()
    }
}

/// The base64 token of a `Basic` credential value (any case, leading spaces), with its padding:
/// the echo of the token the gate sent becomes the token the client sent, padding and all.
pub(crate) fn basic_token(value: &[u8]) -> Option<&[u8]> {
    let v = value.trim_ascii_start();
    if v.len() < 6 || !v[..6].eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let token = v[6..].trim_ascii_start();
    let end = token.iter().position(|c| c.is_ascii_whitespace() || *c == b',').unwrap_or(token.len());
    (end > 0).then(|| &token[..end])
}

/// The client's `Accept-Encoding` as the gate passes it on: only the codings the gate can read
/// back (gzip, deflate, identity), so that it can look into every body; `identity` when none is
/// left. `*` (any) becomes the two it reads.
pub(crate) fn accept_encoding(value: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    for part in value.split(',') {
        let coding = part.split(';').next().unwrap_or("").trim();
        let take: &[&str] = match coding.to_ascii_lowercase().as_str() {
            "gzip" | "x-gzip" => &["gzip"],
            "deflate" => &["deflate"],
            "*" => &["gzip", "deflate"],
            _ => &[],
        };
        for t in take {
            if !kept.contains(t) {
                kept.push(t);
            }
        }
    }
    if kept.is_empty() { "identity".into() } else { kept.join(", ") }
}

/// How a response body is encoded, as far as the gate can read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coding {
    Identity,
    Gzip,
    Deflate,
}

/// The coding a `Content-Encoding` value names; `Err` with the coding the gate cannot read.
pub(crate) fn coding(value: Option<&str>) -> Result<Coding, String> {
    let v = value.unwrap_or("").trim().to_ascii_lowercase();
    match v.as_str() {
        "" | "identity" => Ok(Coding::Identity),
        "gzip" | "x-gzip" => Ok(Coding::Gzip),
        "deflate" => Ok(Coding::Deflate),
        _ => Err(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PH: &[u8] = b"aisb_placeholder_0123456789abcdef0123456789abcdef";

    fn masks() -> Masks {
        Masks::new([("API_KEY", b"sk-real/1+x".as_slice(), PH)])
    }

    fn run(chunks: &[&[u8]]) -> (Vec<u8>, Vec<(String, usize)>) {
        let mut s = Scrubber::new(masks());
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&s.push(Bytes::copy_from_slice(c)));
        }
        out.extend_from_slice(&s.finish());
        (out, s.replaced())
    }

    #[test]
    fn a_host_with_no_bound_secret_has_nothing_to_mask() {
        let mut m = Masks::default();
        assert!(m.is_empty(), "what decides whether a request's Range is kept");
        m.add(b"", b"", "EMPTY");
        assert!(m.is_empty(), "an empty value is no spelling");
        m.add(b"sk-1", PH, "API_KEY");
        assert!(!m.is_empty());
        assert!(!masks().is_empty());
    }

    #[test]
    fn every_spelling_of_the_value_comes_back_as_the_placeholder_in_that_spelling() {
        let b64 = STANDARD_NO_PAD.encode("sk-real/1+x");
        let body = format!("a sk-real/1+x b sk-real%2F1%2Bx c sk-real%2f1%2bx d {b64}= e");
        let (out, counts) = run(&[body.as_bytes()]);
        let ph = std::str::from_utf8(PH).unwrap();
        let want = format!("a {ph} b {ph} c {ph} d {}= e", STANDARD_NO_PAD.encode(PH));
        assert_eq!(String::from_utf8(out).unwrap(), want);
        assert_eq!(counts, [("API_KEY".to_string(), 4)]);
    }

    /// What a server echoing the value in JSON (PHP's `\/` too) or in a URL path (Python's
    /// `quote`, which keeps `/`) writes is masked as well.
    #[test]
    fn json_and_path_quoting_of_the_value_come_back_as_the_placeholder() {
        let value: &[u8] = br#"k/e"y\1+z"#;
        let m = Masks::new([("API_KEY", value, PH)]);
        let json = serde_json::to_string(std::str::from_utf8(value).unwrap()).unwrap();
        let php = json.replace('/', r"\/");
        let bodies = [
            json.trim_matches('"').to_string(),
            php.trim_matches('"').to_string(),
            r"k/e%22y%5C1%2Bz".to_string(),
            r"k/e%22y%5c1%2bz".to_string(),
        ];
        for b in &bodies {
            let mut s = Scrubber::new(m.clone());
            let body = format!("[{b}] and k/e-y (not it)");
            let mut out = s.push(Bytes::copy_from_slice(body.as_bytes())).to_vec();
            out.extend_from_slice(&s.finish());
            let ph = std::str::from_utf8(PH).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), format!("[{ph}] and k/e-y (not it)"), "{b}");
        }
    }

    #[test]
    fn a_value_split_across_chunks_is_caught_and_other_chunks_are_not_held() {
        // Split at every point of the value.
        let body = b"{\"auth\": \"sk-real/1+x\"}\n\n";
        for cut in 1..body.len() {
            let (out, counts) = run(&[&body[..cut], &body[cut..]]);
            assert!(!out.windows(11).any(|w| w == b"sk-real/1+x"), "cut at {cut}");
            assert_eq!(counts, [("API_KEY".to_string(), 1)], "cut at {cut}");
        }
        // A chunk that ends where no spelling begins goes on whole and at once.
        let mut s = Scrubber::new(masks());
        assert_eq!(&s.push(Bytes::from_static(b"data: {}\n\n"))[..], b"data: {}\n\n");
        // One that ends with a spelling's start holds just that start.
        assert_eq!(&s.push(Bytes::from_static(b"data: sk-re"))[..], b"data: ");
        assert_eq!(&s.push(Bytes::from_static(b"ally"))[..], b"sk-really");
        assert_eq!(&s.finish()[..], b"");
        assert!(s.replaced().is_empty() && s.names().is_empty());
        // The names of what was found, once each however many times.
        let mut s = Scrubber::new(masks());
        s.push(Bytes::from_static(b"sk-real/1+x and sk-real/1+x"));
        s.finish();
        assert_eq!(s.names(), ["API_KEY"]);
        // What is held at the end is not lost.
        let (out, _) = run(&[b"tail sk-real/"]);
        assert_eq!(out, b"tail sk-real/");
    }

    proptest::proptest! {
        /// However a body is cut into chunks, what comes out is what masking it whole gives,
        /// and it holds no spelling of the value.
        #[test]
        fn chunking_never_changes_the_result(
            before in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            after in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            cuts in proptest::collection::vec(0usize..120, 0..8),
        ) {
            let value = b"sk-real/1+x".as_slice();
            let body = [before.as_slice(), value, b"%2f", &after, &percent(value, true), &before].concat();
            let whole = {
                let mut s = Scrubber::new(masks());
                let mut out = s.push(Bytes::copy_from_slice(&body)).to_vec();
                out.extend_from_slice(&s.finish());
                out
            };
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
            cuts.sort();
            let mut pieces = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([body.len()]) {
                pieces.push(&body[at..c]);
                at = c;
            }
            let (out, _) = run(&pieces);
            proptest::prop_assert_eq!(&out, &whole);
            proptest::prop_assert!(memchr::memmem::find(&out, value).is_none());
            proptest::prop_assert!(memchr::memmem::find(&out, &percent(value, true)).is_none());
        }
    }

    /// Each decoding of `text` the masker claims to cover, as bytes: as it is; percent-decoded;
    /// and base64 in both alphabets from each of the four character offsets (a value at any
    /// alignment in a longer encoded string is whole in one of them).
    fn decodings(text: &[u8]) -> Vec<Vec<u8>> {
        use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
        let lenient = GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true);
        let engines = [
            GeneralPurpose::new(&base64::alphabet::STANDARD, lenient),
            GeneralPurpose::new(&base64::alphabet::URL_SAFE, lenient),
        ];
        let mut out = vec![text.to_vec(), crate::gate::percent::decode(text)];
        for (e, extra) in engines.iter().zip([b"+/", b"-_"]) {
            let inside = |c: &u8| c.is_ascii_alphanumeric() || extra.contains(c);
            // Each run of the alphabet's characters, from each of its first four characters.
            for run in text.split(|c| !inside(c)) {
                for off in 0..4.min(run.len()) {
                    out.push(run[off..].chunks(4).flat_map(|g| e.decode(g).unwrap_or_default()).collect());
                }
            }
        }
        out
    }

    proptest::proptest! {
        /// Random values at random places inside every encoding the masker covers, the result cut
        /// into random chunks: no decoding of what comes out holds the value.
        #[test]
        fn no_covered_spelling_of_any_value_survives_however_it_is_aligned_or_split(
            value in proptest::collection::vec(proptest::num::u8::ANY, 8..40),
            before in proptest::collection::vec(proptest::num::u8::ANY, 0..5),
            after in proptest::collection::vec(proptest::num::u8::ANY, 0..5),
            form in 0usize..7,
            // (No `%` around the encoding: it would join the first escape and change what the
            // body as sent decodes to, which the control below checks.)
            prefix in "[ -$&-~]{0,12}",
            suffix in "[ -$&-~]{0,12}",
            cuts in proptest::collection::vec(0usize..300, 0..6),
        ) {
            use base64::engine::general_purpose::{STANDARD, URL_SAFE};
            let inner = [before.as_slice(), &value, &after].concat();
            let encoded: Vec<u8> = match form {
                0 => inner.clone(),
                1 => percent(&inner, true),
                2 => percent(&inner, false),
                3 => STANDARD.encode(&inner).into_bytes(),
                4 => STANDARD_NO_PAD.encode(&inner).into_bytes(),
                5 => URL_SAFE.encode(&inner).into_bytes(),
                _ => URL_SAFE_NO_PAD.encode(&inner).into_bytes(),
            };
            let body = [prefix.as_bytes(), &encoded, suffix.as_bytes()].concat();
            let mut s = Scrubber::new(Masks::new([("K", value.as_slice(), PH)]));
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
            cuts.sort();
            let (mut out, mut at) = (Vec::new(), 0);
            for c in cuts.into_iter().chain([body.len()]) {
                out.extend_from_slice(&s.push(Bytes::copy_from_slice(&body[at..c])));
                at = c;
            }
            out.extend_from_slice(&s.finish());
            for d in decodings(&out) {
                proptest::prop_assert!(memchr::memmem::find(&d, &value).is_none(), "form {}: {:?}", form, String::from_utf8_lossy(&out));
            }
            // Control: the same decodings of the body as sent hold it (the probe is real).
            proptest::prop_assert!(decodings(&body).iter().any(|d| memchr::memmem::find(d, &value).is_some()));
        }
    }

    #[test]
    fn base64_at_each_alignment_and_in_both_alphabets_comes_back_as_the_placeholder() {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE};
        let key = b"sk-real/1+x??>>".as_slice();
        for pad in 0..3 {
            let line = [&b"Bearer "[..pad * 3], key].concat();
            for (url, text) in [(false, STANDARD.encode(&line)), (true, URL_SAFE.encode(&line))] {
                let mut s = Scrubber::new(Masks::new([("API_KEY", key, PH)]));
                let out = s.whole(text.as_bytes()).unwrap_or_else(|| panic!("not found: {pad} {url} {text}"));
                assert!(
                    memchr::memmem::find(&out, &b64_core(PH, (line.len() - key.len()) % 3, url)).is_some(),
                    "{}",
                    String::from_utf8_lossy(&out)
                );
            }
        }
        // The characters that hold only the value's bits, at each alignment.
        assert_eq!(b64_core(b"abc", 0, false), b"YWJj");
        assert_eq!(b64_core(b"abcd", 0, false), b"YWJjZ", "the sixth character mixes in what follows");
        assert_eq!(
            b64_core(b"abc", 1, false),
            b"FiY",
            "the first two mix in the byte before, the last in the next"
        );
        assert_eq!(
            b64_core(b"abc", 2, false),
            b"hYm",
            "the first three mix in the two before, the last in the next"
        );
        assert_eq!(b64_core(&[0xfb, 0xff, 0xbf], 0, true), b"-_-_");
        assert_eq!(b64_core(&[0xfb, 0xff, 0xbf], 0, false), b"+/+/");
        assert!(b64_core(b"a", 1, false).is_empty(), "too short to hold a character of its own");
    }

    /// A connection's requests clone its masks: the automaton is built once and shared; a
    /// spelling one request adds (its Basic token) is masked in its answer, not in the others'.
    #[test]
    fn a_clone_shares_the_automaton_and_keeps_its_own_added_spellings() {
        let m = masks();
        let (c, mut added) = (m.clone(), m.clone());
        assert!(std::ptr::eq(c.automaton().unwrap(), m.automaton().unwrap()), "built again");
        added.add(b"tok-real", b"tok-shown", "API_KEY");
        assert!(!std::ptr::eq(added.automaton().unwrap(), m.automaton().unwrap()));
        let echo = b"a tok-real and sk-real/1+x";
        let shown = [b"a tok-shown and ".as_slice(), PH].concat();
        assert_eq!(Scrubber::new(added).whole(echo), Some(shown));
        let only_value = [b"a tok-real and ".as_slice(), PH].concat();
        assert_eq!(Scrubber::new(m).whole(echo), Some(only_value.clone()));
        assert_eq!(Scrubber::new(c).whole(echo), Some(only_value));
    }

    #[test]
    fn a_request_s_basic_token_is_masked_and_a_header_value_is_masked_whole() {
        let mut m = masks();
        let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        let (real, shown) =
            (b64(b"me:sk-real/1+x"), b64(b"me:aisb_placeholder_0123456789abcdef0123456789abcdef"));
        // The two pad differently: the echo gets the client's token, padding and all.
        assert!(real.ends_with("=") && !real.ends_with("==") && shown.ends_with("=="));
        let (sent, client) = (format!("Basic {real}"), format!("basic {shown}"));
        m.add(basic_token(sent.as_bytes()).unwrap(), basic_token(client.as_bytes()).unwrap(), "API_KEY");
        // Neither an empty spelling (it would match everywhere) nor one listed twice is added.
        let n = m.list.len();
        m.add(b"", b"x", "API_KEY");
        m.add(real.as_bytes(), b"other", "API_KEY");
        assert_eq!(m.list.len(), n);
        let mut s = Scrubber::new(m);
        let echoed = format!("{{\"Authorization\": \"Basic {real}\"}}");
        assert_eq!(
            s.whole(echoed.as_bytes()),
            Some(format!("{{\"Authorization\": \"Basic {shown}\"}}").into_bytes())
        );
        assert_eq!(s.whole(b"nothing here"), None);
        assert_eq!(s.replaced(), [("API_KEY".to_string(), 1)]);
    }

    #[test]
    fn a_basic_token_is_the_credentials_with_padding_without_the_scheme() {
        assert_eq!(basic_token(b"  basic  bWU6eA== "), Some(b"bWU6eA==".as_slice()));
        assert_eq!(basic_token(b"Basic bWU6eA, other"), Some(b"bWU6eA".as_slice()));
        assert_eq!(basic_token(b"Bearer x"), None);
        assert_eq!(basic_token(b"Basic "), None);
        assert_eq!(basic_token(b"Bas"), None);
    }

    #[test]
    fn accept_encoding_keeps_only_what_the_gate_reads_back() {
        assert_eq!(accept_encoding("gzip, deflate, br, zstd"), "gzip, deflate");
        assert_eq!(accept_encoding("br;q=1.0, gzip;q=0.5"), "gzip");
        assert_eq!(accept_encoding("*"), "gzip, deflate");
        assert_eq!(accept_encoding("br"), "identity");
        assert_eq!(accept_encoding("X-GZIP, gzip"), "gzip");
        assert_eq!(coding(Some(" GZIP ")), Ok(Coding::Gzip));
        assert_eq!(coding(None), Ok(Coding::Identity));
        assert_eq!(coding(Some("deflate")), Ok(Coding::Deflate));
        assert_eq!(coding(Some("br")), Err("br".into()));
    }
}
