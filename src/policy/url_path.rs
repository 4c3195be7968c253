//! One spelling per request path (pure), so that a method/path rule (`rule =`) matches what the
//! server will route, whatever the client wrote: percent-encoding decoded and re-encoded one
//! way, `.` and `..` segments resolved, duplicate slashes collapsed. What the gate would have to
//! guess about is refused, never passed: an encoded `/`, `\` or `%` (servers differ on whether
//! they decode it before routing; a second decode could make `%252e%252e` into `..`), a `..`
//! above the root, Tomcat-style `..;x` segments, bytes outside the URL syntax, bad escapes.
//!
//! The gate forwards the canonical form it matched (never the client's spelling), so the rule
//! and the server see the same path. Rule patterns go through the same decoding (`segment`).

/// A request target in its one spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normal {
    /// The path's segments, decoded (no `/` inside; never `.`/`..`; no `%` after decoding, so a
    /// server that decodes twice sees these same bytes). The root is one empty segment.
    pub segments: Vec<Vec<u8>>,
    /// The query as the client sent it (checked for syntax), without the `?`.
    pub query: Option<String>,
}

/// Unreserved characters (RFC 3986): decoded wherever they were encoded.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Characters a path segment may hold literally (RFC 3986 pchar minus `%`): kept as they are.
fn literal(b: u8) -> bool {
    unreserved(b)
        || matches!(
            b,
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':' | b'@'
        )
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// One path segment (between slashes), decoded. `Err` says why the gate will not guess.
pub fn segment(raw: &[u8]) -> Result<Vec<u8>, &'static str> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b == b'%' {
            let (Some(h), Some(l)) =
                (raw.get(i + 1).and_then(|x| hex(*x)), raw.get(i + 2).and_then(|x| hex(*x)))
            else {
                return Err("a `%` not followed by two hex digits");
            };
            let d = h * 16 + l;
            match d {
                b'/' | b'\\' => return Err("an encoded slash or backslash (%2F, %5C)"),
                b'%' => return Err("an encoded percent sign (%25): a double-encoded path"),
                0..=0x1f | 0x7f => return Err("an encoded control character"),
                _ => out.push(d),
            }
            i += 3;
        } else if literal(b) {
            out.push(b);
            i += 1;
        } else if b == b'\\' {
            return Err("a backslash in the path");
        } else {
            return Err("a character that a URL path cannot hold unencoded");
        }
    }
    // `..;x` is `..` to Tomcat and friends: never a name here.
    let before_params = out.split(|b| *b == b';').next().unwrap_or_default();
    if before_params != out.as_slice() && (before_params == b"." || before_params == b"..") {
        return Err("a dot segment with parameters (`..;`)");
    }
    Ok(out)
}

/// The segment as the gate writes it: unreserved and sub-delimiter characters as they are,
/// every other byte `%XX` (uppercase).
fn encode(seg: &[u8], out: &mut String) {
    for &b in seg {
        if literal(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

impl Normal {
    /// The path as the gate forwards it (`/` for the root).
    pub fn path(&self) -> String {
        let mut out = String::new();
        for s in &self.segments {
            out.push('/');
            encode(s, &mut out);
        }
        if out.is_empty() {
            out.push('/');
        }
        out
    }

    /// The request target as the gate forwards it: the path, then the query as sent.
    pub fn target(&self) -> String {
        match &self.query {
            Some(q) => format!("{}?{q}", self.path()),
            None => self.path(),
        }
    }

    /// The query's `key=value` pairs, decoded (`None`: a bad escape, which no rule matches).
    pub fn pairs(&self) -> Option<Vec<(String, String)>> {
        let Some(q) = &self.query else { return Some(Vec::new()) };
        q.split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                Some((decode_query(k)?, decode_query(v)?))
            })
            .collect()
    }
}

/// A query key or value, percent-decoded (`+` stays `+`).
fn decode_query(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(hex(*b.get(i + 1)?)? * 16 + hex(*b.get(i + 2)?)?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Normalises an origin-form request target (`/path?query`).
pub fn normalise(target: &str) -> Result<Normal, &'static str> {
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    if !path.starts_with('/') {
        return Err("the request target is not a path (`/...`)");
    }
    if let Some(q) = query
        && q.bytes().any(|b| !(literal(b) || matches!(b, b'%' | b'/' | b'?')))
    {
        return Err("a character that a URL query cannot hold unencoded");
    }
    let raw: Vec<&str> = path[1..].split('/').collect();
    let last = raw.len() - 1;
    let mut segments: Vec<Vec<u8>> = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let s = segment(r.as_bytes())?;
        match s.as_slice() {
            b"." => {}
            b".." => {
                if segments.pop().is_none() {
                    return Err("a `..` above the root");
                }
            }
            // `//` collapses; a trailing slash is kept (`/a/` is not `/a` to every server).
            b"" if i != last => {}
            _ => segments.push(s),
        }
    }
    // The root is one empty segment, however it was reached (`/`, `/.`, `/a/..`).
    if segments.is_empty() {
        segments.push(Vec::new());
    }
    Ok(Normal { segments, query: query.map(str::to_string) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(t: &str) -> Result<String, &'static str> {
        normalise(t).map(|n| n.target())
    }

    #[test]
    fn every_spelling_of_a_path_has_one_normal_form() {
        for (raw, want) in [
            ("/", "/"),
            ("/a/b", "/a/b"),
            ("/a//b", "/a/b"),
            ("//a///b", "/a/b"),
            ("/a/./b", "/a/b"),
            ("/a/b/../c", "/a/c"),
            ("/a/%2e%2e/c", "/c"),
            ("/a/%2E/c", "/a/c"),
            ("/%61%62c", "/abc"),
            ("/a/b/", "/a/b/"),
            ("/a/b/.", "/a/b"),
            ("/a/b/..", "/a"),
            ("/a%3ab", "/a:b"),
            ("/a%20b", "/a%20b"),
            ("/caf%c3%a9", "/caf%C3%A9"),
            ("/a;v=1/b", "/a;v=1/b"),
            ("/info/refs?service=git-upload-pack", "/info/refs?service=git-upload-pack"),
            ("/a?", "/a?"),
            ("/a/../", "/"),
        ] {
            assert_eq!(n(raw), Ok(want.to_string()), "{raw}");
        }
    }

    #[test]
    fn what_the_gate_would_guess_about_is_refused() {
        for raw in [
            "/a/%2f/b",
            "/a%2Fb",
            "/a%5cb",
            "/a\\b",
            "/a%25b",
            "/%252e%252e/x",
            "/..",
            "/a/../../b",
            "/%2e%2e",
            "/..;/admin",
            "/a/.;x/b",
            "/a%",
            "/a%4",
            "/a%zz",
            "/a%00",
            "/a b",
            "/a\"b",
            "/caf\u{e9}",
            "a/b",
            "*",
            "/a?b c",
            "/a?x#y",
        ] {
            assert!(normalise(raw).is_err(), "{raw} must be refused");
        }
        // Controls: the same shapes without the guess are taken.
        for raw in ["/a/b", "/a%2Cb", "/a%3Bb", "/.a", "/a..b", "/a/...", "/a;x/b"] {
            assert!(normalise(raw).is_ok(), "{raw} must be taken");
        }
    }

    #[test]
    fn query_pairs_are_decoded_and_a_bad_escape_is_no_pair() {
        let q = normalise("/x?service=git%2Dupload-pack&a&b=").unwrap();
        assert_eq!(
            q.pairs().unwrap(),
            vec![
                ("service".into(), "git-upload-pack".into()),
                ("a".into(), "".into()),
                ("b".into(), "".into())
            ]
        );
        assert_eq!(normalise("/x?a=%zz").unwrap().pairs(), None);
        assert_eq!(normalise("/x").unwrap().pairs(), Some(vec![]));
    }
}
