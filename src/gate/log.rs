//! The gate's decision log: one JSON object per line (never the token), and the human form
//! `ai-sandbox gate logs` prints by default.

use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub time: String,
    pub session: String,
    pub method: String,
    pub host: String,
    pub port: u16,
    /// `allow` or `deny`.
    pub decision: String,
    pub status: u16,
    pub reason: String,
}

/// RFC 3339 UTC time of `secs` since the epoch (civil-from-days, no date crate needed).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

pub fn now() -> String {
    rfc3339(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0))
}

pub fn human(e: &Event) -> String {
    format!(
        "{} {:5} {} session={} {} {}:{} {}",
        e.time, e.decision, e.status, e.session, e.method, e.host, e.port, e.reason
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc_times() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951782400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1795945477), "2026-11-29T09:44:37Z");
    }
}
