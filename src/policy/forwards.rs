//! Direct TCP destinations on pasta's spliced path: allowed host-loopback ports
//! (`allow = 100.64.0.1:5432`, ADR 0034) and single-address IP entries (`allow =
//! 203.0.113.7:5432`, ADR 0037).
//!
//! Every byte the sandbox sends through pasta's tap path crawls on the machines we measured
//! (uploads at a small fraction of the spliced path's rate, docs/performance.md). pasta's spliced
//! path is fast, but it only joins the sandbox's loopback to the host's loopback. So each such
//! destination gets a spliced forward: pasta listens on the sandbox's `127.0.0.1:NS_PORT`
//! (`-T NS_PORT:HOST_PORT`) and connects to the host's `127.0.0.1:HOST_PORT`, and the ruleset
//! rewrites new connections to the destination to that listener (DNAT), with the source
//! rewritten to `127.0.0.1` (SNAT: pasta splices only loopback peers). For a host port, HOST_PORT
//! is the port itself; for an IP entry it is a relay the launcher holds on the host's loopback,
//! which dials the entry (`relay`). Users keep writing the address they mean; the output chain
//! still decides on it before any rewriting, and direct connections to the listeners are refused.
//!
//! The in-sandbox listeners take ports from `NS_BASE` up: above Linux's default ephemeral
//! range (32768-60999), so no outgoing connection and few servers collide with them.

use crate::policy::Policy;
use crate::policy::allow::Ports;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

/// The first in-sandbox listener port.
pub(crate) const NS_BASE: u16 = 61000;
/// At most this many destinations are spliced (one pasta listener and one rule each), host
/// ports first; the rest keep working through the tap path.
pub const MAX: usize = 32;

/// One spliced destination: the sandbox's connections to `to` go to its `127.0.0.1:ns`, which
/// pasta forwards to the host's loopback: to `to`'s port for a host port, to a relay of the
/// launcher's that dials `to` when `relayed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Splice {
    pub(crate) to: SocketAddrV4,
    pub(crate) ns: u16,
    pub(crate) relayed: bool,
}

/// The spliced destinations of a policy: every host-loopback port an allow entry opens and no
/// deny entry closes, in port order, then every relayable IP entry's ports (see `relayable`),
/// in address and port order; the first `MAX` of them.
pub(crate) fn splices(p: &Policy) -> Vec<Splice> {
    let host = host_ports(p);
    let relayed = relay_targets(p, MAX.saturating_sub(host.len()));
    let host = host.into_iter().map(|port| (SocketAddrV4::new(p.gate_addr, port), false));
    host.chain(relayed.into_iter().map(|to| (to, true)))
        .take(MAX)
        .zip(NS_BASE..)
        .map(|((to, relayed), ns)| Splice { to, ns, relayed })
        .collect()
}

/// The destinations the launcher relays, in the order their forwards are given.
pub(crate) fn relays(s: &[Splice]) -> Vec<SocketAddrV4> {
    s.iter().filter(|x| x.relayed).map(|x| x.to).collect()
}

/// The in-sandbox listener ports, as one range (`None` when nothing is spliced).
pub(crate) fn listener_range(s: &[Splice]) -> Option<Ports> {
    Some(Ports { lo: s.first()?.ns, hi: s.last()?.ns })
}

/// Whether every port of `r` on `addr` is spliced.
pub(crate) fn covers(s: &[Splice], addr: Ipv4Addr, r: Ports) -> bool {
    usize::from(r.hi - r.lo) < MAX
        && (r.lo..=r.hi).all(|port| s.iter().any(|x| x.to == SocketAddrV4::new(addr, port)))
}

/// Whether the launcher may relay connections to `ip` from the host: a unicast address outside
/// the sandbox's own world. Not loopback (the sandbox's own), not link-local (pasta's resolver
/// and host alias live there, 169.254.1.1 and .2), not `gate_addr` (a host port, spliced
/// directly), not unspecified, broadcast or multicast.
pub(crate) fn relayable(ip: Ipv4Addr, gate_addr: Ipv4Addr) -> bool {
    !(ip == gate_addr
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast())
}

/// Ranges wider than MAX (a whole-host entry) are left to the tap path: splicing the first few
/// ports of every port would be arbitrary.
fn narrow(r: &Ports) -> bool {
    usize::from(r.hi - r.lo) < MAX
}

/// The ports of `ranges` on `ip` that no deny entry closes, in port order.
fn open_ports(p: &Policy, ip: Ipv4Addr, ranges: impl Iterator<Item = Ports>) -> Vec<SocketAddrV4> {
    let mut out: Vec<SocketAddrV4> = ranges
        .flat_map(|r| r.lo..=r.hi)
        .filter(|port| !crate::policy::allow::reaches(&p.allow.deny_nets, IpAddr::V4(ip), *port))
        .map(|port| SocketAddrV4::new(ip, port))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn host_ports(p: &Policy) -> Vec<u16> {
    let host = p.gate_addr;
    let ranges =
        p.allow.nets.iter().filter(|(n, r)| n.contains(IpAddr::V4(host)) && narrow(r)).map(|(_, r)| *r);
    open_ports(p, host, ranges).into_iter().map(|a| a.port()).collect()
}

/// The first `want` ports of single-address IPv4 entries, in address and port order (a wider
/// network has no one address to relay to; IPv6 entries stay on the tap path). One sort of the
/// entries, then only as many addresses as it takes: a config of 10,000 addresses costs
/// milliseconds, not one pass over every entry per address.
fn relay_targets(p: &Policy, want: usize) -> Vec<SocketAddrV4> {
    let mut entries: Vec<(Ipv4Addr, Ports)> = p
        .allow
        .nets
        .iter()
        .filter_map(|(n, r)| match n.addr {
            IpAddr::V4(a) if n.len == 32 && relayable(a, p.gate_addr) && narrow(r) => Some((a, *r)),
            _ => None,
        })
        .collect();
    entries.sort_unstable();
    let mut out = Vec::new();
    for same in entries.chunk_by(|x, y| x.0 == y.0) {
        if out.len() >= want {
            break;
        }
        out.extend(open_ports(p, same[0].0, same.iter().map(|(_, r)| *r)));
    }
    out.truncate(want);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::from_text as policy_of;

    fn host(port: u16, ns: u16) -> Splice {
        Splice { to: SocketAddrV4::new(Ipv4Addr::new(100, 64, 0, 1), port), ns, relayed: false }
    }

    #[test]
    fn each_allowed_host_port_gets_a_listener_from_ns_base() {
        let p = policy_of("allow = 100.64.0.1:6379\nallow = 100.64.0.1:5432\n");
        assert_eq!(splices(&p), [host(5432, 61000), host(6379, 61001)]);
        assert_eq!(listener_range(&splices(&p)), Some(Ports { lo: 61000, hi: 61001 }));
        let gate = p.gate_addr;
        assert!(covers(&splices(&p), gate, Ports::one(6379)) && !covers(&splices(&p), gate, Ports::one(22)));
        assert!(!covers(&splices(&p), gate, Ports { lo: 5432, hi: 6379 }), "a range with unspliced ports");
        assert!(relays(&splices(&p)).is_empty());
    }

    #[test]
    fn single_address_entries_are_relayed_after_the_host_ports() {
        let p = policy_of(
            "allow = 203.0.113.9:443\nallow = 100.64.0.1:5432\nallow = 192.0.2.7:5432-5433\nallow = 192.0.2.7:80\n",
        );
        let s = splices(&p);
        let to: Vec<String> = s.iter().map(|x| format!("{} {} {}", x.to, x.ns, x.relayed)).collect();
        assert_eq!(
            to,
            [
                "100.64.0.1:5432 61000 false",
                "192.0.2.7:80 61001 true",
                "192.0.2.7:5432 61002 true",
                "192.0.2.7:5433 61003 true",
                "203.0.113.9:443 61004 true"
            ]
        );
        assert_eq!(relays(&s).len(), 4);
        let seven = Ipv4Addr::new(192, 0, 2, 7);
        assert!(covers(&s, seven, Ports { lo: 5432, hi: 5433 }) && !covers(&s, seven, Ports::one(22)));
    }

    #[test]
    fn networks_denied_ports_wide_ranges_ipv6_and_the_sandboxes_own_addresses_are_not_spliced() {
        let p = policy_of(
            "allow = 100.64.0.1:3000-3002\ndeny = 100.64.0.1:3001\nallow = 100.64.0.1:1-65535\n\
             allow = 10.0.0.0/8:80\nallow = 192.0.2.7:1-1000\nallow = 192.0.2.8:22\ndeny = 192.0.2.8\n\
             allow = [2001:db8::1]:443\nallow = 169.254.1.2:80\n",
        );
        let to: Vec<String> = splices(&p).iter().map(|s| s.to.to_string()).collect();
        assert_eq!(to, ["100.64.0.1:3000", "100.64.0.1:3002"], "everything else stays on the tap path");
        assert_eq!(listener_range(&[]), None);
        let gate = p.gate_addr;
        for ip in [
            gate,
            Ipv4Addr::LOCALHOST,
            Ipv4Addr::new(169, 254, 1, 1),
            Ipv4Addr::BROADCAST,
            Ipv4Addr::UNSPECIFIED,
        ] {
            assert!(!relayable(ip, gate), "{ip}");
        }
        assert!(
            !relayable(Ipv4Addr::new(224, 0, 0, 251), gate) && relayable(Ipv4Addr::new(192, 0, 2, 7), gate)
        );
    }

    #[test]
    fn past_max_the_rest_take_the_tap_path() {
        let cfg: String = (0..40).map(|i| format!("allow = 100.64.0.1:{}\n", 8000 + i)).collect();
        let p = policy_of(&(cfg + "allow = 192.0.2.7:443\n"));
        let s = splices(&p);
        assert_eq!(s.len(), MAX);
        assert_eq!(s.last(), Some(&host(8000 + MAX as u16 - 1, NS_BASE + MAX as u16 - 1)));
        assert!(relays(&s).is_empty(), "host ports come first");
        // Without host ports, the first MAX entry ports in address order, whatever the config's.
        let cfg: String = (0..40).rev().map(|i| format!("allow = 192.0.2.{}:{}\n", 10 + i, 443)).collect();
        let s = splices(&policy_of(&(cfg + "allow = 192.0.2.10:80\n")));
        let to: Vec<String> = s.iter().map(|x| x.to.to_string()).collect();
        assert_eq!(to.len(), MAX);
        assert_eq!(to[..3], ["192.0.2.10:80", "192.0.2.10:443", "192.0.2.11:443"]);
        assert_eq!(to[MAX - 1], "192.0.2.40:443");
    }
}
