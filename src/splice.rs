//! Allowed host-loopback ports (`allow = 100.64.0.1:5432`) on pasta's spliced path.
//!
//! Through `100.64.0.1` every byte the sandbox sends crosses pasta's tap path, which uploads at
//! a small fraction of what the spliced path does on the machines we measured (docs/performance.md).
//! So each allowed host port also gets a spliced forward: pasta listens on the sandbox's
//! `127.0.0.1:NS_PORT` (`-T NS_PORT:PORT`) and connects to the host's `127.0.0.1:PORT`, and the
//! ruleset rewrites new connections to `100.64.0.1:PORT` to that listener (DNAT), with the
//! source rewritten to `127.0.0.1` (SNAT: pasta splices only loopback peers). Users keep
//! writing `100.64.0.1:PORT`; the output chain still decides on that address before any
//! rewriting, and direct connections to the listeners are refused (ADR 0034).
//!
//! The in-sandbox listeners take ports from `NS_BASE` up: above Linux's default ephemeral
//! range (32768-60999), so no outgoing connection and few servers collide with them.

use crate::policy::Policy;
use crate::policy::allow::Ports;
use std::net::IpAddr;

/// The first in-sandbox listener port.
pub const NS_BASE: u16 = 61000;
/// At most this many host ports are spliced (one pasta listener and one rule each); more
/// allowed ports keep working through the tap path.
pub const MAX: usize = 32;

/// One spliced host port: the sandbox's `127.0.0.1:ns` forwards to the host's `127.0.0.1:host`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Splice {
    pub host: u16,
    pub ns: u16,
}

/// The spliced host ports of a policy, in port order: every port an allow entry opens on the
/// host-loopback address and no deny entry closes, the first `MAX` of them.
pub fn splices(p: &Policy) -> Vec<Splice> {
    host_ports(p).into_iter().take(MAX).zip(NS_BASE..).map(|(host, ns)| Splice { host, ns }).collect()
}

/// Allowed host-loopback ports beyond `MAX`: they reach the host through the tap path.
pub fn unspliced(p: &Policy) -> usize {
    host_ports(p).len().saturating_sub(MAX)
}

/// The in-sandbox listener ports, as one range (`None` when nothing is spliced).
pub fn listener_range(s: &[Splice]) -> Option<Ports> {
    Some(Ports { lo: s.first()?.ns, hi: s.last()?.ns })
}

/// Whether every port of `r` on the host loopback is spliced.
pub fn covers(s: &[Splice], r: Ports) -> bool {
    usize::from(r.hi - r.lo) < MAX && (r.lo..=r.hi).all(|port| s.iter().any(|x| x.host == port))
}

fn host_ports(p: &Policy) -> Vec<u16> {
    let host = IpAddr::V4(p.gate_addr);
    // Ranges wider than MAX (a whole-host entry) are left to the tap path: splicing the first
    // few ports of `100.64.0.1` (every port) would be arbitrary.
    let mut ports: Vec<u16> = p
        .nets
        .iter()
        .filter(|(n, r)| n.contains(host) && usize::from(r.hi - r.lo) < MAX)
        .flat_map(|(_, r)| r.lo..=r.hi)
        .filter(|port| !crate::policy::allow::reaches(&p.deny_nets, host, *port))
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::from_text as policy_of;

    #[test]
    fn each_allowed_host_port_gets_a_listener_from_ns_base() {
        let p = policy_of("allow = 100.64.0.1:6379\nallow = 100.64.0.1:5432\nallow = 192.0.2.7:5432\n");
        assert_eq!(splices(&p), [Splice { host: 5432, ns: 61000 }, Splice { host: 6379, ns: 61001 }]);
        assert_eq!(listener_range(&splices(&p)), Some(Ports { lo: 61000, hi: 61001 }));
        assert!(covers(&splices(&p), Ports::one(6379)) && !covers(&splices(&p), Ports::one(22)));
        assert!(!covers(&splices(&p), Ports { lo: 5432, hi: 6379 }), "a range with unspliced ports");
    }

    #[test]
    fn denied_ports_wide_ranges_and_other_addresses_are_not_spliced() {
        let p = policy_of(
            "allow = 100.64.0.1:3000-3002\ndeny = 100.64.0.1:3001\nallow = 100.64.0.1:1-65535\nallow = 10.0.0.0/8:80\n",
        );
        let hosts: Vec<u16> = splices(&p).iter().map(|s| s.host).collect();
        assert_eq!(hosts, [3000, 3002], "the whole-host entry and the denied port stay on the tap path");
        assert_eq!(listener_range(&[]), None);
    }

    #[test]
    fn past_max_the_rest_take_the_tap_path() {
        let cfg: String = (0..40).map(|i| format!("allow = 100.64.0.1:{}\n", 8000 + i)).collect();
        let p = policy_of(&cfg);
        let s = splices(&p);
        assert_eq!(s.len(), MAX);
        assert_eq!(s.last(), Some(&Splice { host: 8000 + MAX as u16 - 1, ns: NS_BASE + MAX as u16 - 1 }));
        assert_eq!(unspliced(&p), 40 - MAX);
    }
}
