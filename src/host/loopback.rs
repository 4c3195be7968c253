//! Host services that trust every loopback connection. Allowing `100.64.0.1:6379` hands the
//! sandbox the host's redis; if that redis has no password, the agent can read and write it
//! (and redis/docker can be turned into code execution on the host). At launch ai-sandbox asks
//! each such allowed port one harmless question and warns when it answers without auth.
//!
//! Which ports to ask and how to read the answers is pure; `Host::probe_loopback` does the I/O.

use crate::policy::Policy;
use std::net::IpAddr;

pub(crate) struct Check {
    pub(crate) port: u16,
    pub(crate) service: &'static str,
    /// What is sent (a read-only request).
    pub(crate) ask: &'static [u8],
    /// The reply prefix that means "answered without authentication".
    pub(crate) open_reply: &'static [u8],
    pub(crate) fix: &'static str,
}

const CHECKS: &[Check] = &[
    Check {
        port: 6379,
        service: "redis",
        ask: b"PING\r\n",
        open_reply: b"+PONG",
        fix: "set `requirepass` (or ACLs) in redis.conf, or remove the allow line",
    },
    Check {
        port: 11211,
        service: "memcached",
        ask: b"version\r\n",
        open_reply: b"VERSION ",
        fix: "memcached has no authentication on TCP: use SASL or a unix socket, or remove the allow line",
    },
    Check {
        port: 2375,
        service: "the Docker API (no TLS)",
        ask: b"GET /_ping HTTP/1.0\r\n\r\n",
        open_reply: b"HTTP/1.0 200",
        fix: "an unauthenticated Docker API is root on the host: disable tcp://…:2375, or remove the allow line",
    },
];

/// The checks that apply: allowed entries reaching the host loopback (gate_addr) on the port.
pub(crate) fn applicable(p: &Policy) -> Vec<&'static Check> {
    CHECKS
        .iter()
        .filter(|c| crate::policy::allow::reaches(&p.allow.nets, IpAddr::V4(p.gate_addr), c.port))
        .collect()
}

/// The warning for a reply, if the service answered without authentication.
pub(crate) fn warning(c: &Check, gate_addr: std::net::Ipv4Addr, reply: &[u8]) -> Option<String> {
    reply.starts_with(c.open_reply).then(|| {
        format!(
            "warning: {gate_addr}:{port} is the host's 127.0.0.1:{port}, where {} answers without authentication: \
             anything in the sandbox can use it.\n  fix: {}",
            c.service,
            c.fix,
            port = c.port
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::from_text as policy;

    #[test]
    fn only_allowed_host_loopback_ports_are_checked() {
        let ports = |cfg: &str| applicable(&policy(cfg)).iter().map(|c| c.port).collect::<Vec<_>>();
        assert_eq!(ports("allow = 100.64.0.1:6379\n"), [6379]);
        assert_eq!(ports("allow = 100.64.0.1:5432\n"), Vec::<u16>::new());
        assert_eq!(
            ports("allow = 100.64.0.1:1-65535\n"),
            [6379, 11211, 2375],
            "all ports allowed: all checks"
        );
        assert_eq!(ports("allow = 192.0.2.10:6379\n"), Vec::<u16>::new(), "not the host loopback");
    }

    #[test]
    fn replies_are_read_strictly() {
        let redis = &CHECKS[0];
        let gw = "100.64.0.1".parse().unwrap();
        assert!(warning(redis, gw, b"+PONG\r\n").unwrap().contains("requirepass"));
        assert!(warning(redis, gw, b"-NOAUTH Authentication required.\r\n").is_none());
        assert!(warning(redis, gw, b"").is_none());
        assert!(warning(&CHECKS[2], gw, b"HTTP/1.0 200 OK\r\n\r\nOK").unwrap().contains("root on the host"));
    }
}
