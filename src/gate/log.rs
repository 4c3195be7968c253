//! The gate's decision log: one JSON object per line (never the token), and the human form
//! `ai-sandbox gate logs` prints by default.
//!
//! Each line is appended with one write(2) on an O_APPEND file *before* the client is answered,
//! so a decision is on disk by the time anyone could ask about it, and nothing is held in a
//! buffer that a SIGTERM or SIGKILL of the gate could lose. (The log lives in the per-user
//! runtime dir, a tmpfs: the write costs a few microseconds, measured in bench/run's CONNECT
//! figures.)

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// The open decision log.
pub(crate) struct Log(Mutex<File>);

impl Log {
    pub(crate) fn open(path: &Path) -> std::io::Result<Log> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
        Ok(Log(Mutex::new(f)))
    }

    /// The log on standard output (cluster mode: what cluster log collectors read).
    pub(crate) fn stdout() -> std::io::Result<Log> {
        use std::os::fd::AsFd;
        let fd = std::io::stdout().as_fd().try_clone_to_owned()?;
        Ok(Log(Mutex::new(File::from(fd))))
    }

    /// Appends one event as a JSON line (a single write). An error means the event is not on
    /// disk: the caller decides what that makes of the decision (`State::log`). A lock poisoned
    /// by a panicking writer is taken anyway: the file is still the file, and losing every later
    /// record to one panic would be worse than a torn line.
    pub(crate) fn write(&self, e: &Event) -> std::io::Result<()> {
        let mut line = serde_json::to_string(e).map_err(std::io::Error::other)?;
        line.push('\n');
        let mut f = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f.write_all(line.as_bytes())
    }
}

pub(crate) use crate::contract::log::{Decision, Event, Layer};

/// RFC 3339 UTC time of `secs` since the epoch (civil-from-days, no date crate needed).
pub(crate) fn rfc3339(secs: u64) -> String {
    let (y, m, d) = civil((secs / 86400) as i64);
    let rem = secs % 86400;
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's method).
pub(crate) fn civil(z: i64) -> (i32, u8, u8) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    ((yoe + era * 400 + i64::from(m <= 2)) as i32, m, d)
}

pub(crate) fn now() -> String {
    rfc3339(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0))
}

/// Reads the decision log a whole line at a time: a line the gate is writing right now is left
/// for the next call (the gate writes each line with one write, so this is rare, not never).
pub(crate) struct Follow {
    reader: std::io::BufReader<File>,
}

impl Follow {
    pub(crate) fn open(path: &Path) -> std::io::Result<Follow> {
        Ok(Follow { reader: std::io::BufReader::new(File::open(path)?) })
    }

    /// From the log's end: only what is decided from now on.
    pub(crate) fn open_at_end(path: &Path) -> std::io::Result<Follow> {
        use std::io::Seek;
        let mut f = Self::open(path)?;
        f.reader.seek(std::io::SeekFrom::End(0))?;
        Ok(f)
    }

    /// The next complete line, or `None` when there is none yet.
    pub(crate) fn next_line(&mut self) -> std::io::Result<Option<String>> {
        use std::io::{BufRead, Seek, SeekFrom};
        let mut line = String::new();
        let n = self.reader.read_line(&mut line)?;
        if n == 0 || !line.ends_with('\n') {
            self.reader.seek(SeekFrom::Current(-(n as i64)))?;
            return Ok(None);
        }
        Ok(Some(line))
    }
}

pub(crate) fn human(e: &Event) -> String {
    format!(
        "{} {:5} {} session={} {} {}:{}{} {}",
        e.time,
        e.decision,
        e.status,
        e.session,
        e.method,
        e.host,
        e.port,
        e.path.as_deref().unwrap_or(""),
        e.reason
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> Event {
        Event {
            time: now(),
            session: "s1".into(),
            project: "/p".into(),
            method: "CONNECT".into(),
            host: "a.test".into(),
            port: 443,
            decision: Decision::Allow,
            status: 200,
            reason: "allowed".into(),
            hint: String::new(),
            allow: None,
            path: None,
            layer: Layer::Gate,
            learned: false,
        }
    }

    /// A write that fails says so (a full disk: `/dev/full`); one that works is one line.
    #[test]
    fn a_failed_write_is_an_error_and_a_poisoned_lock_still_writes() {
        let full = Log::open(Path::new("/dev/full")).unwrap();
        assert!(full.write(&event()).is_err(), "a full disk must not pass as written");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.log");
        let log = std::sync::Arc::new(Log::open(&path).unwrap());
        log.write(&event()).unwrap();
        let held = log.clone();
        let _ = std::thread::spawn(move || {
            let _guard = held.0.lock().unwrap();
            panic!("a writer panics holding the lock");
        })
        .join();
        assert!(log.0.is_poisoned());
        log.write(&event()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.lines().all(|l| serde_json::from_str::<Event>(l).is_ok()), "{text}");
    }

    #[test]
    fn formats_utc_times() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951782400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1795945477), "2026-11-29T09:44:37Z");
    }

    #[test]
    fn civil_dates_are_right_at_their_edges() {
        assert_eq!(super::civil(0), (1970, 1, 1));
        assert_eq!(super::civil(59), (1970, 3, 1));
        assert_eq!(super::civil(11_016), (2000, 2, 29));
        assert_eq!(super::civil(20_788), (2026, 12, 1));
        assert_eq!(super::civil(-1), (1969, 12, 31));
    }
}
