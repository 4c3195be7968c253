//! Percent-encoding, read one way only: the gate decodes what a client sent (to find a
//! placeholder however it is spelt, to check a signature or a form) and encodes what it sends
//! again. Shared by `secrets`, `sigv4` and `login`, which each need the same reading of an
//! escape: kept apart so that none of them imports another for it.

/// Whether a query or form reads two ways: a `+` is a space to some readers and itself to
/// others, and a `%` not before two hex digits is kept by some and refused by others.
pub(crate) fn read_two_ways(raw: &str) -> bool {
    let b = raw.as_bytes();
    let bad_escape = (0..b.len())
        .any(|i| b[i] == b'%' && !(b.len() > i + 2 && b[i + 1..i + 3].iter().all(u8::is_ascii_hexdigit)));
    raw.contains('+') || bad_escape
}

/// Each `%XX` as its byte; anything else, a stray `%` included, as it is.
pub(crate) fn decode(b: &[u8]) -> Vec<u8> {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], b.get(i + 1).and_then(|c| hex(*c)), b.get(i + 2).and_then(|c| hex(*c))) {
            (b'%', Some(h), Some(l)) => {
                out.push(h << 4 | l);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Every byte but `A-Za-z0-9-_.~` (and `/` when `slash`) as `%XX` (AWS's URI encoding, and the
/// strictest form encoding: what any reader reads one way).
pub(crate) fn encode(s: impl AsRef<[u8]>, slash: bool) -> String {
    let mut out = String::with_capacity(s.as_ref().len());
    for &b in s.as_ref() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (slash && b == b'/') {
            out.push(b as char);
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_escape_is_decoded_and_a_stray_percent_kept() {
        assert_eq!(decode(b"a%2Fb%2f%41"), b"a/b/A");
        assert_eq!(decode(b"100%"), b"100%");
        assert_eq!(decode(b"%4"), b"%4");
        assert_eq!(decode(b"%zz%41"), b"%zzA");
        assert_eq!(decode(b"+"), b"+", "a plus is not a space here");
    }

    #[test]
    fn only_unreserved_bytes_stay_as_they_are() {
        assert_eq!(encode("a b/%3A~", true), "a%20b/%253A~");
        assert_eq!(encode("a/b", false), "a%2Fb");
        assert_eq!(encode("IQo/b+c=", false), "IQo%2Fb%2Bc%3D");
        assert_eq!(encode("AZaz09-_.~", false), "AZaz09-_.~");
        assert_eq!(encode([0xffu8, 0x0a], false), "%FF%0A");
    }

    #[test]
    fn a_plus_or_a_percent_that_is_no_escape_reads_two_ways() {
        for two in ["a+b", "a%", "a%2", "a%zz", "%g1"] {
            assert!(read_two_ways(two), "{two}");
        }
        for one in ["", "a%2Fb", "a%2fb", "abc", "a%41%42"] {
            assert!(!read_two_ways(one), "{one}");
        }
    }
}
