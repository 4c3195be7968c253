//! A terminated request's body on its way upstream: the frames the gate read ahead (the first,
//! a push's command list) replayed in front of the rest, and every later frame scanned as it
//! streams for the placeholders of secrets bound elsewhere (ADR 0063), trailers included, and
//! counted against a budgeted host's allowance, trailers included (ADR 0074).

use super::budget::Allowance;
use super::response::BoxError;
use super::secrets::{Misuse, Secrets};
use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, Incoming};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// How much of a refused push's pack, or of a body cut for a placeholder, the gate reads (and drops)
/// before it answers.
pub(crate) const DRAIN: usize = 16 << 20;

/// A request body whose first frames the gate has read (to look for placeholders), then the rest.
pub(crate) struct Replay {
    pub(crate) frames: VecDeque<Frame<Bytes>>,
    pub(crate) rest: Option<Incoming>,
}

impl Body for Replay {
    type Data = Bytes;
    type Error = hyper::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(f) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(f)));
        }
        match self.rest.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }
    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(|b| b.is_end_stream())
    }
}

/// How many bytes of the body before a frame are scanned with it: more than the longest
/// spelling of a placeholder the gate looks for (percent-encoded, 3 bytes a character).
pub(crate) const OVERLAP: usize = 256;

/// Called once when a placeholder is found later in a request body (the refusal's log entry).
pub(crate) type OnFound = Box<dyn FnOnce(&Misuse) + Send + Sync>;

/// A request body on its way upstream, scanned as it streams for the placeholders of secrets
/// bound elsewhere (each frame with the last `OVERLAP` bytes before it, so a placeholder split
/// across frames is seen). On one, the frame is not sent and the body ends in an error: the
/// upstream request is cut there (after the client's rest is read and dropped, up to `DRAIN`),
/// and `found` tells `relay` to answer 403.
pub(crate) struct Scanned {
    pub(crate) inner: Replay,
    /// The frames already scanned before the request went upstream.
    pub(crate) skip: usize,
    pub(crate) tail: Vec<u8>,
    pub(crate) secrets: Secrets,
    pub(crate) host: String,
    pub(crate) found: Arc<std::sync::Mutex<Option<Misuse>>>,
    pub(crate) on_found: Option<OnFound>,
    /// After a placeholder: how much of the client's rest was read and dropped.
    pub(crate) drained: Option<usize>,
    /// A budgeted host: each frame is taken from the allowance before it goes (the data frames
    /// only when `count_data`: a declared length was taken whole before the request went), and
    /// the trailers always; a frame it does not cover is not sent, the body ends cut, and `over`
    /// tells `relay` to answer with the budget's refusal.
    pub(crate) budget: Option<Allowance>,
    pub(crate) count_data: bool,
    pub(crate) over: Arc<std::sync::atomic::AtomicBool>,
}

impl Scanned {
    /// A placeholder of a secret bound elsewhere: logged once, and kept for `relay`'s 403.
    fn found(&mut self, m: Misuse) {
        if let Some(log) = self.on_found.take() {
            log(&m);
        }
        *self.found.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
    }
}

impl Body for Scanned {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        const CUT: &str = "a placeholder of a secret bound elsewhere in the request body";
        loop {
            let f = match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(f)) => f,
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None if self.drained.is_some() => return Poll::Ready(Some(Err(CUT.into()))),
                None => return Poll::Ready(None),
            };
            // After a placeholder: the client's rest is read and dropped (so that it reads the
            // 403 instead of a reset), nothing more goes upstream, and the body ends cut.
            if let Some(n) = self.drained.as_mut() {
                *n += f.data_ref().map_or(0, |d| d.len());
                if *n >= DRAIN {
                    return Poll::Ready(Some(Err(CUT.into())));
                }
                continue;
            }
            let counted = match (f.data_ref(), f.trailers_ref()) {
                (Some(d), _) if self.count_data => d.len() as u64,
                (_, Some(t)) => super::view::fields_size(t),
                _ => 0,
            };
            if let Some(a) = self.budget.as_ref().filter(|_| counted > 0)
                && !a.take_all(counted)
            {
                self.over.store(true, std::sync::atomic::Ordering::Release);
                return Poll::Ready(Some(Err("over the host's budget".into())));
            }
            if self.skip > 0 {
                self.skip -= 1;
                return Poll::Ready(Some(Ok(f)));
            }
            if let Some(d) = f.data_ref() {
                // Most frames hold no sign of a placeholder (`may_hold_placeholder`): then no copy
                // but the tail, here and across the seam with the frame before.
                let seam = [self.tail.as_slice(), &d[..d.len().min(OVERLAP)]].concat();
                if !crate::gate::secrets::may_hold_placeholder(&seam)
                    && !crate::gate::secrets::may_hold_placeholder(d)
                {
                    self.tail = match d.len() >= OVERLAP {
                        true => d[d.len() - OVERLAP..].to_vec(),
                        false => seam[seam.len().saturating_sub(OVERLAP)..].to_vec(),
                    };
                    return Poll::Ready(Some(Ok(f)));
                }
                let seen = [self.tail.as_slice(), d].concat();
                if let Some(m) = self.secrets.misuse(&seen, Some(&self.host)) {
                    self.found(m);
                    self.drained = Some(0);
                    continue;
                }
                self.tail = seen[seen.len().saturating_sub(OVERLAP)..].to_vec();
            }
            // A request's trailers (HTTP/2 and chunked bodies have them) are looked at too.
            let misused = f
                .trailers_ref()
                .and_then(|t| t.values().find_map(|v| self.secrets.misuse(v.as_bytes(), Some(&self.host))));
            if let Some(m) = misused {
                self.found(m);
                return Poll::Ready(Some(Err(CUT.into())));
            }
            return Poll::Ready(Some(Ok(f)));
        }
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

/// A request body's frames the gate read before the request goes upstream (replayed in front
/// of the rest: `Replay`), and their bytes.
#[derive(Default)]
pub(crate) struct Ahead {
    pub(crate) frames: VecDeque<Frame<Bytes>>,
    pub(crate) seen: Vec<u8>,
    pub(crate) ended: bool,
}

impl Ahead {
    /// Reads one more frame (or the body's end); `Err` when the body broke off.
    pub(crate) async fn one<B: Body<Data = Bytes> + Unpin>(&mut self, body: &mut B) -> Result<(), ()> {
        match body.frame().await {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    self.seen.extend_from_slice(d);
                }
                self.frames.push_back(f);
            }
            Some(Err(_)) => return Err(()),
            None => self.ended = true,
        }
        Ok(())
    }
}
