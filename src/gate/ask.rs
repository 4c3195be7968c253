//! Ask instead of refuse (opt-in: `ask = SECONDS` in the config). While a watcher
//! (`ai-sandbox watch`, on the control socket) is attached, the gate holds a request the
//! allowlist refuses for up to that long and asks the watcher; an answer lets it through (this
//! request only, or after the watcher widened the policy with a live allow) or refuses it as
//! before. With no watcher attached, nothing is held, ever. Only allowlist refusals are asked
//! about: never-dialled addresses, `deny =` lines, bad tokens and SNI mismatches are refused as
//! always. Watchers also receive every refusal as it is logged, so `watch` shows them live.
//!
//! A watcher that stops reading (a paused terminal, a hostile peer on the control socket) is
//! let go once `WATCH_QUEUE` messages wait for it: a sandbox that makes refusals as fast as it
//! can must not grow the gate's memory. Its held questions are refused when their time is up,
//! as with no watcher.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

pub(crate) use crate::contract::watch::{Answer, Question, Verdict, Watch};

/// Messages that may wait for one watcher; one more and it is let go.
pub(crate) const WATCH_QUEUE: usize = 1024;

#[derive(Default)]
pub(crate) struct Asks {
    next: AtomicU64,
    watchers: Mutex<Vec<(u64, mpsc::Sender<String>)>>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Verdict>>>,
}

impl Asks {
    pub(crate) fn watched(&self) -> bool {
        !self.watchers.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    pub(crate) fn add_watcher(&self) -> (u64, mpsc::Receiver<String>) {
        let (tx, rx) = mpsc::channel(WATCH_QUEUE);
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        self.watchers.lock().unwrap_or_else(|e| e.into_inner()).push((id, tx));
        (id, rx)
    }

    pub(crate) fn remove_watcher(&self, id: u64) {
        self.watchers.lock().unwrap_or_else(|e| e.into_inner()).retain(|(w, _)| *w != id);
    }

    /// Sends one line to every watcher. A watcher that is gone is dropped, and so is one with
    /// `WATCH_QUEUE` lines unread: its receiver gets what waits, then its end.
    pub(crate) fn broadcast(&self, line: &str) {
        self.watchers.lock().unwrap_or_else(|e| e.into_inner()).retain(|(id, tx)| {
            match tx.try_send(line.to_string()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    eprintln!("gate: watcher {id} left {WATCH_QUEUE} messages unread; let it go");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// Asks the watchers and waits for the first answer, at most `wait`; no answer is `Deny`.
    pub async fn ask(&self, mut q: Question, wait: Duration) -> Verdict {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        q.ask = id;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        self.broadcast(&Watch::Ask(q).line());
        let verdict = match tokio::time::timeout(wait, rx).await {
            Ok(Ok(v)) => v,
            _ => Verdict::Deny,
        };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        verdict
    }

    /// Delivers an answer; false when the question is no longer held (answered or timed out).
    pub(crate) fn answer(&self, a: &Answer) -> bool {
        match self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&a.ask) {
            Some(tx) => tx.send(a.verdict).is_ok(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> Question {
        Question::example()
    }

    #[tokio::test]
    async fn a_question_is_answered_by_a_watcher_or_refused_when_time_runs_out() {
        let asks = std::sync::Arc::new(Asks::default());
        assert!(!asks.watched());
        let (_, mut rx) = asks.add_watcher();
        assert!(asks.watched());
        let a = asks.clone();
        let held = tokio::spawn(async move { a.ask(q(), Duration::from_secs(10)).await });
        let line = rx.recv().await.unwrap();
        let asked: Question = serde_json::from_str(&line).unwrap();
        assert!(asks.answer(&Answer { ask: asked.ask, verdict: Verdict::Once }));
        assert_eq!(held.await.unwrap(), Verdict::Once);
        assert!(!asks.answer(&Answer { ask: asked.ask, verdict: Verdict::Once }), "answered once only");
        // Nobody answers: refused when the time is up.
        assert_eq!(asks.ask(q(), Duration::from_millis(50)).await, Verdict::Deny);
    }

    /// A watcher that reads nothing is let go when its queue is full, and gets what waited; one
    /// that reads stays.
    #[test]
    fn a_watcher_that_stops_reading_is_let_go_and_one_that_reads_stays() {
        let asks = Asks::default();
        let (_, mut stalled) = asks.add_watcher();
        let (_, mut reading) = asks.add_watcher();
        for i in 0..WATCH_QUEUE {
            asks.broadcast(&format!("m{i}"));
            assert_eq!(reading.try_recv().unwrap(), format!("m{i}"));
        }
        assert_eq!(asks.watchers.lock().unwrap().len(), 2, "a full queue is not yet one too many");
        asks.broadcast("one more");
        assert_eq!(reading.try_recv().unwrap(), "one more");
        assert_eq!(asks.watchers.lock().unwrap().len(), 1);
        assert!(asks.watched());
        let waited = std::iter::from_fn(|| stalled.try_recv().ok()).count();
        assert_eq!(waited, WATCH_QUEUE);
        assert!(matches!(stalled.try_recv(), Err(mpsc::error::TryRecvError::Disconnected)));
    }
}
