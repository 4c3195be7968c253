//! The decision log as OCSF events (pure): `ai-sandbox logs --format ocsf` writes one JSON
//! object per line, the schema security teams' pipelines ingest (OCSF 1.3.0). A request the gate
//! read (a host with rules or a bound secret: it has a path) is an HTTP Activity (4002); every
//! other decision, a tunnel, a forward, a refusal before any request was read, is a Network
//! Activity (4001). Never a header value, a query or a body: the log holds none.

use super::log::{Decision, Event};
use serde_json::{Value, json};

pub(crate) const VERSION: &str = "1.3.0";
const NETWORK_ACTIVITY: u64 = 4001;
const HTTP_ACTIVITY: u64 = 4002;

/// Milliseconds since the epoch of an RFC 3339 UTC time as the log writes it (`...Z`).
fn millis(time: &str) -> u64 {
    let n = |a: usize, b: usize| time.get(a..b).and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
    let (y, m, d) = (n(0, 4), n(5, 7), n(8, 10));
    // Days from civil (Howard Hinnant's algorithm), the inverse of `log::rfc3339`.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = days * 86400 + n(11, 13) * 3600 + n(14, 16) * 60 + n(17, 19);
    u64::try_from(secs).unwrap_or(0) * 1000
}

/// HTTP Activity's activity_id for a method (99: other).
fn http_activity(method: &str) -> u64 {
    match method {
        "CONNECT" => 1,
        "DELETE" => 2,
        "GET" => 3,
        "HEAD" => 4,
        "OPTIONS" => 5,
        "POST" => 6,
        "PUT" => 7,
        "TRACE" => 8,
        "PATCH" => 9,
        _ => 99,
    }
}

/// One decision as an OCSF event.
pub(crate) fn event(e: &Event) -> Value {
    // OCSF has allowed and refused; a challenge (a 407 the client answers with its token) was not
    // relayed, so it is a refusal there.
    let allowed = match e.decision {
        Decision::Allow => true,
        Decision::Deny | Decision::Challenge => false,
    };
    let (class, activity) = match &e.path {
        Some(_) => (HTTP_ACTIVITY, http_activity(&e.method)),
        // Open (relayed) or Refuse.
        None => (NETWORK_ACTIVITY, if allowed { 1 } else { 5 }),
    };
    // An IPv6 target is logged as a destination spells it (`[fd00::1]`): an address all the same.
    let bare = e.host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(&e.host);
    let dst = match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => json!({ "ip": ip.to_string(), "port": e.port }),
        Err(_) => json!({ "hostname": e.host, "port": e.port }),
    };
    let mut v = json!({
        "category_uid": 4,
        "class_uid": class,
        "activity_id": activity,
        "type_uid": class * 100 + activity,
        "time": millis(&e.time),
        // Informational; a refusal is Low (something the policy stopped).
        "severity_id": if allowed { 1 } else { 2 },
        "action_id": if allowed { 1 } else { 2 },
        "disposition_id": if allowed { 1 } else { 2 },
        "status_id": if allowed { 1 } else { 2 },
        "status_code": e.status.to_string(),
        "status_detail": e.reason,
        "message": if e.hint.is_empty() { e.reason.as_str() } else { e.fix() },
        "metadata": {
            "version": VERSION,
            "product": { "name": "ai-sandbox", "vendor_name": "ai-sandbox", "version": env!("CARGO_PKG_VERSION") },
            "log_name": "gate",
        },
        "src_endpoint": { "uid": e.session, "name": e.project },
        "dst_endpoint": dst,
        "unmapped": { "decision": e.decision.as_str(), "allow": e.allow },
    });
    if let Some(path) = &e.path {
        v["http_request"] = json!({
            "http_method": e.method,
            "url": { "hostname": e.host, "port": e.port, "path": path, "scheme": if e.port == 80 { "http" } else { "https" } },
        });
        v["http_response"] = json!({ "code": e.status });
    } else {
        v["connection_info"] = json!({ "protocol_name": "tcp", "direction_id": 2 });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(path: Option<&str>, decision: Decision) -> Event {
        Event {
            time: "2026-11-29T09:44:37Z".into(),
            session: "s1".into(),
            project: "/p".into(),
            method: "POST".into(),
            host: "api.test".into(),
            port: 443,
            decision,
            status: if decision == Decision::Allow { 200 } else { 403 },
            reason: "POST /x matches no rule for api.test".into(),
            hint: "blocked by ai-sandbox: add \"rule = api.test POST /x\" to /p/c".into(),
            allow: Some("rule = api.test POST /x".into()),
            path: path.map(str::to_string),
            layer: crate::gate::log::Layer::Gate,
            learned: false,
        }
    }

    /// The fields each class requires in OCSF 1.3.0 (base event and class), and what we add.
    const BASE: &[&str] = &[
        "category_uid",
        "class_uid",
        "activity_id",
        "type_uid",
        "time",
        "severity_id",
        "metadata",
        "action_id",
        "disposition_id",
        "status_id",
        "src_endpoint",
        "dst_endpoint",
    ];

    #[test]
    fn a_read_request_is_http_activity_and_anything_else_network_activity() {
        let http = event(&ev(Some("/x"), Decision::Deny));
        for k in BASE.iter().chain(&["http_request", "http_response"]) {
            assert!(!http[k].is_null(), "{k} missing: {http}");
        }
        assert_eq!((http["class_uid"].as_u64(), http["activity_id"].as_u64()), (Some(4002), Some(6)));
        assert_eq!(http["type_uid"], 400206);
        assert_eq!(http["http_request"]["http_method"], "POST");
        assert_eq!(http["http_request"]["url"]["path"], "/x");
        assert_eq!(http["http_response"]["code"], 403);
        assert_eq!((http["action_id"].as_u64(), http["disposition_id"].as_u64()), (Some(2), Some(2)));
        assert_eq!(http["message"], "add \"rule = api.test POST /x\" to /p/c");
        assert_eq!(http["time"], 1795945477000u64, "the log's RFC 3339 time in milliseconds");
        assert_eq!(http["metadata"]["version"], VERSION);

        let net = event(&Event { method: "CONNECT".into(), ..ev(None, Decision::Allow) });
        for k in BASE.iter().chain(&["connection_info"]) {
            assert!(!net[k].is_null(), "{k} missing: {net}");
        }
        assert_eq!((net["class_uid"].as_u64(), net["activity_id"].as_u64()), (Some(4001), Some(1)));
        assert_eq!(net["type_uid"], 400101);
        assert_eq!((net["action_id"].as_u64(), net["severity_id"].as_u64()), (Some(1), Some(1)));
        assert_eq!(net["dst_endpoint"], json!({ "hostname": "api.test", "port": 443 }));
        assert!(net.get("http_request").is_none());
        let refused = event(&ev(None, Decision::Deny));
        assert_eq!((refused["activity_id"].as_u64(), refused["type_uid"].as_u64()), (Some(5), Some(400105)));
        let ip = event(&Event { host: "10.0.0.1".into(), ..ev(None, Decision::Deny) });
        assert_eq!(ip["dst_endpoint"], json!({ "ip": "10.0.0.1", "port": 443 }));
        let v6 = event(&Event { host: "[fd00::1]".into(), ..ev(None, Decision::Deny) });
        assert_eq!(v6["dst_endpoint"], json!({ "ip": "fd00::1", "port": 443 }));
        assert_eq!(millis("1970-01-01T00:00:00Z"), 0);
        assert_eq!(millis("2000-02-29T00:00:00Z"), 951782400000);
    }
}
