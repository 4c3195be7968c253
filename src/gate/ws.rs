//! What goes over a WebSocket to and from a host whose TLS the gate opens, the pure part: the
//! frames read as they stream (RFC 6455: header, mask, payload; fragments; control frames) and
//! the messages' payload handed back unmasked and, with `permessage-deflate` (RFC 7692),
//! inflated, so that `terminate` can look for the placeholders of secrets bound elsewhere in
//! what the server would read, and for the real values of this host's in what the client would. The bytes themselves go on as the client sent them; nothing is
//! re-framed. A stream that is not WebSocket framing is an error (the relay then stops).

use flate2::{Decompress, FlushDecompress};

/// The most one message may inflate to in one piece of input before the stream is refused (a
/// small compressed frame can claim gigabytes).
const MOST_INFLATED: usize = 64 << 20;

#[derive(Debug)]
enum State {
    /// Reading a frame's header (the bytes so far).
    Head(Vec<u8>),
    Payload {
        left: u64,
        mask: Option<[u8; 4]>,
        at: usize,
        compressed: bool,
        fin: bool,
    },
}

/// The client-to-server direction of one WebSocket connection.
#[derive(Debug)]
pub(crate) struct Frames {
    state: State,
    /// `permessage-deflate` was agreed: RSV1 marks a compressed message.
    deflate: bool,
    /// The client resets its compressor after each message (`client_no_context_takeover`).
    reset_each: bool,
    inflater: Decompress,
    /// The message being read is compressed (its first frame said so).
    compressed: bool,
}

impl Frames {
    /// One direction (`client`: what the client sends; else what the server sends), for the
    /// extensions the server agreed to (its `Sec-WebSocket-Extensions`, if any).
    pub(crate) fn new(extensions: Option<&str>, client: bool) -> Frames {
        let ext = extensions.unwrap_or("").to_ascii_lowercase();
        let deflate = ext.split(',').any(|e| e.trim().starts_with("permessage-deflate"));
        let reset = if client { "client_no_context_takeover" } else { "server_no_context_takeover" };
        Frames {
            state: State::Head(Vec::new()),
            deflate,
            reset_each: deflate && ext.contains(reset),
            inflater: Decompress::new(false),
            compressed: false,
        }
    }

    /// The payload bytes `bytes` carries, as the other side will read them (unmasked, inflated).
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            match &mut self.state {
                State::Head(head) => {
                    let need = head_len(head);
                    let take = need.saturating_sub(head.len()).min(bytes.len()).max(1);
                    head.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if head.len() == head_len(head) {
                        let head = std::mem::take(head);
                        self.start(&head, &mut out)?;
                    }
                }
                State::Payload { left, mask, at, compressed, fin } => {
                    let n = (*left).min(bytes.len() as u64) as usize;
                    let mut piece = bytes[..n].to_vec();
                    if let Some(m) = mask {
                        for (i, b) in piece.iter_mut().enumerate() {
                            *b ^= m[(*at + i) % 4];
                        }
                    }
                    bytes = &bytes[n..];
                    *left -= n as u64;
                    *at += n;
                    let (done, compressed, fin) = (*left == 0, *compressed, *fin);
                    self.take(&piece, compressed, done && fin, &mut out)?;
                    if done {
                        self.state = State::Head(Vec::new());
                    }
                }
            }
        }
        Ok(out)
    }

    /// A frame's header is whole: what follows is its payload.
    fn start(&mut self, head: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        let (fin, rsv1, opcode) = (head[0] & 0x80 != 0, head[0] & 0x40 != 0, head[0] & 0x0f);
        let control = opcode >= 8;
        if control && (!fin || rsv1) {
            return Err("a fragmented or compressed control frame".into());
        }
        if !control {
            if opcode != 0 {
                self.compressed = rsv1;
            } else if rsv1 {
                return Err("RSV1 on a continuation frame".into());
            }
            if self.compressed && !self.deflate {
                return Err("a compressed frame without permessage-deflate agreed".into());
            }
        }
        let len7 = u64::from(head[1] & 0x7f);
        let (len, at) = match len7 {
            126 => (u64::from(u16::from_be_bytes([head[2], head[3]])), 4),
            127 => (u64::from_be_bytes(head[2..10].try_into().map_err(|_| "a bad length")?), 10),
            n => (n, 2),
        };
        let mask = (head[1] & 0x80 != 0).then(|| [head[at], head[at + 1], head[at + 2], head[at + 3]]);
        let compressed = !control && self.compressed;
        self.state = State::Payload { left: len, mask, at: 0, compressed, fin: fin && !control };
        if len == 0 {
            self.state = State::Head(Vec::new());
            self.take(&[], compressed, fin && !control, out)?;
        }
        Ok(())
    }

    /// One piece of a message's payload; `end`: the message ends with it.
    fn take(&mut self, piece: &[u8], compressed: bool, end: bool, out: &mut Vec<u8>) -> Result<(), String> {
        if !compressed {
            out.extend_from_slice(piece);
            return Ok(());
        }
        inflate(&mut self.inflater, piece, out)?;
        if end {
            // RFC 7692: the sender removed this empty stored block's tail from the message.
            inflate(&mut self.inflater, &[0, 0, 0xff, 0xff], out)?;
            if self.reset_each {
                self.inflater.reset(false);
            }
        }
        Ok(())
    }
}

/// How long a header is, from what of it is there (2 bytes tell the rest).
fn head_len(head: &[u8]) -> usize {
    if head.len() < 2 {
        return 2;
    }
    let ext = match head[1] & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    2 + ext + if head[1] & 0x80 != 0 { 4 } else { 0 }
}

fn inflate(d: &mut Decompress, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let start = out.len();
    loop {
        out.reserve(input.len() * 4 + 4096);
        let (before_in, before_out) = (d.total_in(), d.total_out());
        d.decompress_vec(input, out, FlushDecompress::Sync)
            .map_err(|e| format!("a message that does not inflate: {e}"))?;
        input = &input[(d.total_in() - before_in) as usize..];
        let produced = d.total_out() - before_out;
        if out.len() - start > MOST_INFLATED {
            return Err("a message that inflates past 64 MiB".into());
        }
        // Done when the input is used and the output had room to spare (nothing pending).
        if (input.is_empty() && out.len() < out.capacity()) || (produced == 0 && d.total_in() == before_in) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A client frame: FIN, RSV1, opcode; masked with `key`.
    fn frame(fin: bool, rsv1: bool, opcode: u8, payload: &[u8], key: [u8; 4]) -> Vec<u8> {
        let mut f = vec![(u8::from(fin) << 7) | (u8::from(rsv1) << 6) | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n < 65536 => {
                f.push(0x80 | 126);
                f.extend((n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend((n as u64).to_be_bytes());
            }
        }
        f.extend(key);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        f
    }

    /// Raw deflate of `text` as permessage-deflate sends it (the empty block's tail removed),
    /// with one compressor across messages (context takeover).
    fn deflate(c: &mut flate2::Compress, text: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len() + 64);
        c.compress_vec(text, &mut out, flate2::FlushCompress::Sync).unwrap();
        assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
        out.truncate(out.len() - 4);
        out
    }

    fn feed_all(f: &mut Frames, bytes: &[u8], step: usize) -> Vec<u8> {
        bytes.chunks(step).flat_map(|c| f.feed(c).unwrap()).collect()
    }

    #[test]
    fn masked_fragmented_messages_and_control_frames_come_out_as_the_server_reads_them() {
        let key = [0x11, 0x22, 0x33, 0x44];
        let mut bytes = frame(false, false, 1, b"hello ", key);
        bytes.extend(frame(true, false, 9, b"ping", key));
        bytes.extend(frame(true, false, 0, b"world", [9, 8, 7, 6]));
        bytes.extend(frame(true, false, 2, &vec![b'x'; 70000], key));
        bytes.extend(frame(true, false, 2, &[], key));
        for step in [1, 3, 7, 4096, bytes.len()] {
            let mut f = Frames::new(None, true);
            let out = feed_all(&mut f, &bytes, step);
            assert_eq!(out.len(), 6 + 4 + 5 + 70000, "step {step}");
            assert!(out.starts_with(b"hello pingworld"), "step {step}");
        }
    }

    #[test]
    fn compressed_messages_are_inflated_with_and_without_context_takeover() {
        let key = [1, 2, 3, 4];
        let text = b"a placeholder: aisb_placeholder_0123456789abcdef0123456789abcdef, twice: aisb_placeholder_0123456789abcdef0123456789abcdef";
        for (agreed, reset) in
            [("permessage-deflate", false), ("permessage-deflate; client_no_context_takeover", true)]
        {
            let mut c = flate2::Compress::new(flate2::Compression::default(), false);
            let mut bytes = Vec::new();
            for _ in 0..3 {
                let packed = deflate(&mut c, text);
                // Split across a first frame (RSV1) and a continuation.
                let cut = packed.len() / 2;
                bytes.extend(frame(false, true, 1, &packed[..cut], key));
                bytes.extend(frame(true, false, 0, &packed[cut..], key));
                if reset {
                    c.reset();
                }
            }
            let mut f = Frames::new(Some(agreed), true);
            let out = feed_all(&mut f, &bytes, 5);
            assert_eq!(out, text.repeat(3), "{agreed}");
        }
        // The server's direction: unmasked frames, its own takeover setting.
        let mut c = flate2::Compress::new(flate2::Compression::default(), false);
        let mut server = Vec::new();
        for _ in 0..2 {
            let packed = deflate(&mut c, text);
            server.extend([0x81 | 0x40, 126]);
            server.extend((packed.len() as u16).to_be_bytes());
            server.extend(&packed);
            c.reset();
        }
        let agreed = "permessage-deflate; server_no_context_takeover";
        assert_eq!(feed_all(&mut Frames::new(Some(agreed), false), &server, 9), text.repeat(2));
        // A compressed frame where deflate was not agreed, RSV1 on a continuation: errors.
        let mut f = Frames::new(None, true);
        assert!(f.feed(&frame(true, true, 1, b"x", key)).is_err());
        let mut f = Frames::new(Some("permessage-deflate"), true);
        f.feed(&frame(false, false, 1, b"x", key)).unwrap();
        assert!(f.feed(&frame(true, true, 0, b"y", key)).is_err());
        assert!(Frames::new(None, true).feed(&frame(false, false, 9, b"p", key)).is_err());
    }

    #[test]
    fn a_bomb_is_refused_not_inflated() {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        for _ in 0..80 {
            e.write_all(&vec![0u8; 1 << 20]).unwrap();
        }
        let packed = e.finish().unwrap();
        let mut f = Frames::new(Some("permessage-deflate"), true);
        let got = f.feed(&frame(true, true, 2, &packed, [0; 4]));
        assert!(got.unwrap_err().contains("64 MiB"));
    }
}
