//! `--cilium`: a CiliumNetworkPolicy (cilium.io/v2) for the gate's own egress. Typed here (the
//! CRD is not in `k8s-openapi`): only the fields we emit.
//!
//! The agent never resolves or dials a name (it has no DNS; names go through the gate), so an
//! FQDN layer belongs on the gate: it may resolve through the cluster DNS and reach only the
//! addresses those allowed names resolved to. `*.suffix` (any name strictly below) becomes
//! `**.suffix`, Cilium's any-depth pattern; a Cilium that only knows `*` reads it as one label,
//! narrower than the gate, never wider.

use super::{GATE, Options};
use crate::policy::Policy;
use crate::policy::allow::{HostPattern, IpNet, Ports};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CiliumNetworkPolicy {
    api_version: &'static str,
    kind: &'static str,
    metadata: ObjectMeta,
    spec: Spec,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    endpoint_selector: Selector,
    egress: Vec<Egress>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Selector {
    match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Egress {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    to_endpoints: Vec<Selector>,
    #[serde(rename = "toFQDNs", skip_serializing_if = "Vec::is_empty")]
    to_fqdns: Vec<Fqdn>,
    #[serde(rename = "toCIDR", skip_serializing_if = "Vec::is_empty")]
    to_cidr: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    to_ports: Vec<PortRule>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum Fqdn {
    #[serde(rename = "matchName")]
    Name(String),
    #[serde(rename = "matchPattern")]
    Pattern(String),
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PortRule {
    ports: Vec<Port>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rules: Option<L7>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Port {
    port: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    end_port: Option<u16>,
    protocol: &'static str,
}

#[derive(Debug, Serialize)]
struct L7 {
    dns: Vec<BTreeMap<&'static str, &'static str>>,
}

pub(crate) fn gate_fqdn(p: &Policy, o: &Options) -> CiliumNetworkPolicy {
    let gate = BTreeMap::from([("app.kubernetes.io/name".to_string(), GATE.to_string())]);
    let kube_dns = BTreeMap::from([
        ("k8s:io.kubernetes.pod.namespace".to_string(), "kube-system".to_string()),
        ("k8s:k8s-app".to_string(), "kube-dns".to_string()),
    ]);
    // DNS through the cluster's resolver, seen by Cilium's DNS proxy: that is how toFQDNs learns
    // the addresses.
    let mut egress = vec![Egress {
        to_endpoints: vec![Selector { match_labels: kube_dns }],
        to_ports: vec![PortRule {
            ports: vec![Port { port: "53".into(), end_port: None, protocol: "ANY" }],
            rules: Some(L7 { dns: vec![BTreeMap::from([("matchPattern", "*")])] }),
        }],
        ..Egress::default()
    }];
    let tcp = |r: &Ports| Port {
        port: r.lo.to_string(),
        end_port: (r.hi != r.lo).then_some(r.hi),
        protocol: "TCP",
    };
    for (h, ports) in &p.allow.hosts {
        let ports: Vec<Port> = match ports {
            Some(r) => vec![tcp(r)],
            None => p.gate_ports.iter().map(|g| tcp(&Ports::one(*g))).collect(),
        };
        let rule = PortRule { ports, rules: None };
        // A pinned name (`resolve =`) is dialled without DNS: its address, not its name.
        let pinned = match h {
            HostPattern::Exact(n) => crate::gate::decide::pinned(&p.resolve, n),
            HostPattern::Suffix(_) => None,
        };
        egress.push(match (pinned, h) {
            (Some(ip), _) => Egress {
                to_cidr: vec![super::cidr(&IpNet::host(ip))],
                to_ports: vec![rule],
                ..Egress::default()
            },
            (None, HostPattern::Exact(n)) => {
                Egress { to_fqdns: vec![Fqdn::Name(n.clone())], to_ports: vec![rule], ..Egress::default() }
            }
            (None, HostPattern::Suffix(s)) => Egress {
                to_fqdns: vec![Fqdn::Pattern(format!("**.{s}"))],
                to_ports: vec![rule],
                ..Egress::default()
            },
        });
    }
    // IP entries the gate relays (on its ports) are dialled by address.
    for (n, r) in &p.allow.nets {
        if !n.contains(std::net::IpAddr::V4(p.gate_addr)) {
            let to_ports = if *r == Ports::ALL {
                Vec::new()
            } else {
                vec![PortRule { ports: vec![tcp(r)], rules: None }]
            };
            egress.push(Egress { to_cidr: vec![super::cidr(n)], to_ports, ..Egress::default() });
        }
    }
    CiliumNetworkPolicy {
        api_version: "cilium.io/v2",
        kind: "CiliumNetworkPolicy",
        metadata: ObjectMeta {
            name: Some(format!("{GATE}-fqdn")),
            namespace: Some(o.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: Spec { endpoint_selector: Selector { match_labels: gate }, egress },
    }
}
