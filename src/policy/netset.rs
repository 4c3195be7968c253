//! Turns IP/CIDR allow entries into pairwise-disjoint (prefix, port range) boxes.
//!
//! nftables refuses overlapping elements in a concatenated interval set (`File exists`), and
//! users do write overlapping lines (`10.0.0.0/8` and `10.1.2.3:5432`). Prefixes either nest
//! or are disjoint, so for each elementary port interval the covering prefixes reduce to the
//! outermost ones; adjacent intervals with the same prefixes are merged back. The result
//! allows exactly the union of what was written, as one set element per box.

use super::allow::{IpNet, Ports};
use std::collections::BTreeSet;

/// One set element: every TCP port in `ports` to every address in `net`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Box2 {
    pub(crate) net: IpNet,
    pub(crate) ports: Ports,
}

/// Disjoint boxes covering exactly the union of `entries`, sorted.
pub(crate) fn disjoint(entries: &[(IpNet, Ports)]) -> Vec<Box2> {
    // Elementary interval boundaries: every lo and every hi+1.
    let mut cuts: BTreeSet<u32> = BTreeSet::new();
    for (_, p) in entries {
        cuts.insert(u32::from(p.lo));
        cuts.insert(u32::from(p.hi) + 1);
    }
    let cuts: Vec<u32> = cuts.into_iter().collect();
    // For each elementary port interval, the outermost prefixes covering it. Within one
    // interval those prefixes are pairwise disjoint.
    let mut pieces: Vec<Box2> = Vec::new();
    for w in cuts.windows(2) {
        let (lo, hi) = (w[0], w[1] - 1);
        let mut nets: Vec<IpNet> = entries
            .iter()
            .filter(|(_, p)| u32::from(p.lo) <= lo && hi <= u32::from(p.hi))
            .map(|(n, _)| *n)
            .collect();
        // In address order, wider first: a prefix is inside another exactly when it is inside
        // the last outermost one kept (outermost prefixes are disjoint and come in order), so one
        // sweep finds them, not a comparison of every pair (10,000 entries: seconds).
        nets.sort_unstable();
        nets.dedup();
        let mut outer: Option<IpNet> = None;
        for n in nets {
            if outer.is_some_and(|o| o.contains_net(&n)) {
                continue;
            }
            outer = Some(n);
            pieces.push(Box2 { net: n, ports: Ports { lo: lo as u16, hi: hi as u16 } });
        }
    }
    // Coalesce port-adjacent pieces of the same prefix. Where a prefix is outermost nothing
    // else overlaps it, so the merged box stays disjoint from every other box.
    pieces.sort();
    pieces.dedup();
    let mut out: Vec<Box2> = Vec::new();
    for b in pieces {
        match out.last_mut() {
            Some(prev) if prev.net == b.net && u32::from(prev.ports.hi) + 1 == u32::from(b.ports.lo) => {
                prev.ports.hi = b.ports.hi;
            }
            _ => out.push(b),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn net(s: &str) -> IpNet {
        match s.split_once('/') {
            Some((a, l)) => IpNet::masked(a.parse().unwrap(), l.parse().unwrap()),
            None => IpNet::host(s.parse().unwrap()),
        }
    }

    #[test]
    fn nested_entries_collapse_to_the_outer_one() {
        let got = disjoint(&[(net("10.0.0.0/8"), Ports::ALL), (net("10.1.2.3"), Ports::one(5432))]);
        assert_eq!(got, vec![Box2 { net: net("10.0.0.0/8"), ports: Ports::ALL }]);
    }

    #[test]
    fn partial_overlap_is_split_into_disjoint_boxes() {
        let got = disjoint(&[
            (net("10.0.0.0/8"), Ports { lo: 1, hi: 100 }),
            (net("10.1.2.3"), Ports { lo: 50, hi: 200 }),
        ]);
        let want = vec![
            Box2 { net: net("10.0.0.0/8"), ports: Ports { lo: 1, hi: 100 } },
            Box2 { net: net("10.1.2.3"), ports: Ports { lo: 101, hi: 200 } },
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn nesting_chains_and_both_families_keep_only_the_outermost() {
        let all = |s: &str| (net(s), Ports::ALL);
        let got = disjoint(&[
            all("10.1.2.3"),
            all("2001:db8::1"),
            all("10.0.0.0/8"),
            all("192.0.2.0/24"),
            all("10.1.0.0/16"),
            all("2001:db8::/32"),
            all("11.0.0.1"),
            all("10.0.0.0/8"),
        ]);
        let nets: Vec<String> = got.iter().map(|b| b.net.to_string()).collect();
        assert_eq!(nets, ["10.0.0.0/8", "11.0.0.1", "192.0.2.0/24", "2001:db8::/32"]);
    }

    fn covered(boxes: &[Box2], ip: IpAddr, port: u16) -> usize {
        boxes.iter().filter(|b| b.net.contains(ip) && b.ports.contains(&Ports::one(port))).count()
    }

    #[test]
    fn unrelated_entries_do_not_fragment_a_prefix() {
        let got = disjoint(&[
            (net("10.0.0.0/8"), Ports::ALL),
            (net("100.64.0.1"), Ports::one(5432)),
            (net("192.0.2.0/24"), Ports::one(443)),
        ]);
        assert_eq!(got.len(), 3, "{got:?}");
    }

    proptest! {
        /// Every (address, port) is covered by the output exactly as often as "at least once
        /// by the input": the union is preserved and the boxes never overlap.
        #[test]
        fn union_preserved_and_disjoint(
            raw in prop::collection::vec((0u32..64, 24u8..=32, 1u16..40, 0u16..40), 1..12),
            probes in prop::collection::vec((0u32..64, 1u16..90), 64),
        ) {
            let base = u32::from(Ipv4Addr::new(10, 0, 0, 0));
            let entries: Vec<(IpNet, Ports)> = raw.iter().map(|(a, len, lo, span)| {
                (IpNet::masked(IpAddr::V4(Ipv4Addr::from(base + a)), *len), Ports { lo: *lo, hi: lo + span })
            }).collect();
            let boxes = disjoint(&entries);
            for (a, port) in probes {
                let ip = IpAddr::V4(Ipv4Addr::from(base + a));
                let want = entries.iter().any(|(n, p)| n.contains(ip) && p.contains(&Ports::one(port)));
                prop_assert_eq!(covered(&boxes, ip, port), usize::from(want));
            }
        }
    }
}
