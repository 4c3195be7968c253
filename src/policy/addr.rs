//! Address classes, in one table: which addresses are special (the cloud metadata service,
//! loopback, link-local, private, NAT64, ...). The gate refuses to dial the `never` classes and
//! dials the others only when an IP entry allows them; `trust` calls out an allow entry that
//! reaches any of them. One table, so the two cannot drift apart.

use super::allow::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Where the host's loopback appears inside the sandbox unless `gate_addr` moves it.
pub const DEFAULT_GATE_ADDR: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 1);
/// The sandbox's own loopback as a container of its engine reaches it (`containers = on`: the
/// gate and published ports there; `plan::engine::SANDBOX_LOOPBACK` is its text).
pub const NESTED_SANDBOX_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Metadata,
    Loopback,
    LinkLocal,
    Unspecified,
    Reserved,
    Private,
    /// 100.64.0.0/10: carrier-grade NAT space, and where the host's loopback is mapped.
    Shared,
    UniqueLocal,
    Nat64,
}

impl Class {
    /// How the class is named in refusals and call-outs.
    pub(crate) fn words(self) -> &'static str {
        match self {
            Class::Metadata => "the cloud metadata service",
            Class::Loopback => "loopback",
            Class::LinkLocal => "link-local",
            Class::Unspecified => "unspecified",
            Class::Reserved => "multicast/broadcast/reserved",
            Class::Private => "a private network",
            Class::Shared => "shared address space (carrier-grade NAT, the host's loopback mapping)",
            Class::UniqueLocal => "an IPv6 unique-local network",
            Class::Nat64 => "NAT64 (an IPv4 address of any kind, behind an IPv6 prefix)",
        }
    }
    /// Classes the gate never dials, whatever the allowlist says.
    pub(crate) fn never(self) -> bool {
        matches!(
            self,
            Class::Metadata | Class::Loopback | Class::LinkLocal | Class::Unspecified | Class::Reserved
        )
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> (IpAddr, u8) {
    (IpAddr::V4(Ipv4Addr::new(a, b, c, d)), len)
}
const fn v6(s: [u16; 8], len: u8) -> (IpAddr, u8) {
    (IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])), len)
}

/// Most specific first: the metadata addresses lie inside link-local and unique-local space.
const RANGES: &[((IpAddr, u8), Class)] = &[
    (v4(169, 254, 169, 254, 32), Class::Metadata),
    (v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128), Class::Metadata),
    (v4(127, 0, 0, 0, 8), Class::Loopback),
    (v6([0, 0, 0, 0, 0, 0, 0, 1], 128), Class::Loopback),
    (v4(169, 254, 0, 0, 16), Class::LinkLocal),
    (v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), Class::LinkLocal),
    (v4(0, 0, 0, 0, 8), Class::Unspecified),
    (v6([0; 8], 128), Class::Unspecified),
    (v4(224, 0, 0, 0, 4), Class::Reserved),
    (v4(240, 0, 0, 0, 4), Class::Reserved),
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), Class::Reserved),
    (v4(10, 0, 0, 0, 8), Class::Private),
    (v4(172, 16, 0, 0, 12), Class::Private),
    (v4(192, 168, 0, 0, 16), Class::Private),
    (v4(100, 64, 0, 0, 10), Class::Shared),
    (v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), Class::UniqueLocal),
    (v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96), Class::Nat64),
];

fn ranges() -> impl Iterator<Item = (IpNet, Class)> {
    RANGES.iter().map(|((a, l), c)| (IpNet::masked(*a, *l), *c))
}

/// The class of one address (IPv4-mapped IPv6 as its IPv4), or None for an ordinary one.
pub(crate) fn classify(ip: IpAddr) -> Option<Class> {
    let ip = super::allow::canonical(ip);
    ranges().find(|(n, _)| n.contains(ip)).map(|(_, c)| c)
}

/// Every class a network reaches some address of, in table order, each once.
pub(crate) fn reached_by(net: &IpNet) -> Vec<Class> {
    let mut out = Vec::new();
    for (r, c) in ranges() {
        if r.overlaps(net) && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_has_its_most_specific_class() {
        let c = |s: &str| classify(s.parse().unwrap());
        assert_eq!(c("169.254.169.254"), Some(Class::Metadata));
        assert_eq!(c("169.254.1.2"), Some(Class::LinkLocal));
        assert_eq!(c("::ffff:127.0.0.1"), Some(Class::Loopback), "IPv4-mapped is its IPv4");
        assert_eq!(c("fd00:ec2::254"), Some(Class::Metadata));
        assert_eq!(c("fd12::1"), Some(Class::UniqueLocal));
        assert_eq!(c("64:ff9b::a00:1"), Some(Class::Nat64));
        assert_eq!(c("100.64.0.1"), Some(Class::Shared));
        assert_eq!(c("255.255.255.255"), Some(Class::Reserved));
        assert_eq!(c("172.31.255.255"), Some(Class::Private));
        assert_eq!(c("172.32.0.0"), None);
        assert_eq!(c("198.51.100.7"), None);
        assert_eq!(c("2001:db8::1"), None);
    }

    #[test]
    fn a_network_reaches_every_class_it_overlaps() {
        let n = |s: &str, l: u8| IpNet::masked(s.parse().unwrap(), l);
        assert_eq!(reached_by(&n("169.254.0.0", 16)), [Class::Metadata, Class::LinkLocal]);
        assert_eq!(reached_by(&n("10.1.0.0", 16)), [Class::Private]);
        assert!(reached_by(&n("0.0.0.0", 0)).len() >= 6);
        assert!(reached_by(&n("198.51.100.0", 24)).is_empty());
        assert_eq!(reached_by(&n("::", 0)).len(), 7, "every IPv6 class");
    }
}
