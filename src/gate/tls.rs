//! Reads the server name (SNI) from a TLS ClientHello (pure), so the gate can require that a
//! tunnel opened for `CONNECT a.example:443` really talks TLS to `a.example`.

/// What the bytes so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// At least this many bytes in total are needed.
    NeedMore(usize),
    /// A complete ClientHello, with its SNI host name if it has one (lowercased).
    Sni(Option<String>),
    /// Not a TLS ClientHello.
    NotTls(&'static str),
}

/// Largest ClientHello accepted (several records are reassembled up to this size).
pub(crate) const MAX_HELLO: usize = 64 * 1024;

pub fn parse_client_hello(buf: &[u8]) -> Hello {
    // Reassemble handshake bytes from consecutive handshake records.
    let mut hs: Vec<u8> = Vec::new();
    let mut pos = 0;
    loop {
        if buf.len() < pos + 5 {
            return Hello::NeedMore(pos + 5);
        }
        if buf[pos] != 0x16 {
            return Hello::NotTls("not a TLS handshake record");
        }
        if buf[pos + 1] != 3 {
            return Hello::NotTls("unknown TLS record version");
        }
        let len = u16::from_be_bytes([buf[pos + 3], buf[pos + 4]]) as usize;
        if len == 0 || len > 16384 + 256 {
            return Hello::NotTls("bad TLS record length");
        }
        if buf.len() < pos + 5 + len {
            return Hello::NeedMore(pos + 5 + len);
        }
        hs.extend_from_slice(&buf[pos + 5..pos + 5 + len]);
        pos += 5 + len;
        if hs.len() >= 4 {
            if hs[0] != 1 {
                return Hello::NotTls("first handshake message is not a ClientHello");
            }
            let need = 4 + (u32::from_be_bytes([0, hs[1], hs[2], hs[3]]) as usize);
            if need > MAX_HELLO {
                return Hello::NotTls("ClientHello too large");
            }
            if hs.len() >= need {
                return match sni(&hs[4..need]) {
                    Some(r) => Hello::Sni(r),
                    None => Hello::NotTls("malformed ClientHello"),
                };
            }
        }
        if pos > MAX_HELLO {
            return Hello::NotTls("ClientHello too large");
        }
    }
}

struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| b[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    }
}

/// `Some(Some(name))`, `Some(None)` (no SNI), or `None` (malformed).
fn sni(body: &[u8]) -> Option<Option<String>> {
    let mut c = Cur(body);
    c.take(2 + 32)?; // client_version, random
    let n = c.u8()?;
    c.take(n)?; // session id
    let n = c.u16()?;
    c.take(n)?; // cipher suites
    let n = c.u8()?;
    c.take(n)?; // compression methods
    if c.0.is_empty() {
        return Some(None);
    }
    let n = c.u16()?;
    let mut ext = Cur(c.take(n)?);
    let mut found = None;
    while !ext.0.is_empty() {
        let ty = ext.u16()?;
        let len = ext.u16()?;
        let data = ext.take(len)?;
        if ty == 0 {
            if found.is_some() {
                return None; // two SNI extensions: ambiguous
            }
            let mut d = Cur(data);
            let list = d.u16()?;
            let mut l = Cur(d.take(list)?);
            while !l.0.is_empty() {
                let kind = l.u8()?;
                let n = l.u16()?;
                let name = l.take(n)?;
                if kind == 0 {
                    if found.is_some() {
                        return None;
                    }
                    let s = std::str::from_utf8(name).ok()?;
                    found = Some(s.trim_end_matches('.').to_ascii_lowercase());
                }
            }
        }
    }
    Some(found)
}
