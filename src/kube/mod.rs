//! `ai-sandbox export kube`: the project's policy as Kubernetes objects (pure: policy + config
//! lines + options → documents; the command prints them).
//!
//! Why a translation and not a second policy format: the config a team reviewed locally must
//! mean the same in a cluster, so the export takes the same approved config and the same
//! validation as a launch, and refuses — by line, with what to use instead — anything that has
//! no cluster meaning (the host's loopback, `net = full`, `extra_args`, agent state on this
//! machine). Nothing is half-exported: one refusal and nothing is printed.
//!
//! The objects are typed (`k8s-openapi`, built against Kubernetes 1.33 and validated in the
//! tests against the schemas of 1.33 to 1.37, ADR 0036): the agent Pod, a NetworkPolicy for
//! it (egress only to the gate and to the config's IP entries), the gate as a Deployment +
//! Service running this binary's cluster mode (`gate serve --listen --policy`, its policy in a
//! ConfigMap, its token from a Secret the user creates), a NetworkPolicy letting only the agent
//! reach the gate, and with `--cilium` a CiliumNetworkPolicy limiting the gate's own egress to
//! the allowed names (`toFQDNs`), a second layer under the gate.

mod bound;
mod cilium;
mod objects;
mod parts;

use crate::config::Config;
use crate::error::{Diagnostic, Origin};
use crate::policy::allow::{self, IpNet, Ports};
use crate::policy::keys::{self, Export, ExportCx, Name};
use crate::policy::{NetMode, Policy};
use std::net::IpAddr;

/// What the command line chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) namespace: String,
    /// The agent's image (`--image`, else the config's `image =`).
    pub(crate) image: Option<String>,
    /// The image holding this binary, for the gate.
    pub(crate) gate_image: String,
    pub(crate) cilium: bool,
    /// The placeholder of each bound secret (by name), made for this export: the agent's Pod
    /// holds it, the gate's policy maps it to the value it reads from the Secret.
    pub(crate) placeholders: Vec<(String, String)>,
}

impl Options {
    fn placeholder(&self, name: &str) -> String {
        let found = self.placeholders.iter().find(|(n, _)| n == name);
        found.map_or_else(|| format!("{}{name}", crate::gate::secrets::PREFIX), |(_, p)| p.clone())
    }
}

/// Fixed names, so that the docs and the objects agree.
pub(crate) const GATE: &str = "ai-sandbox-gate";
pub(crate) const AGENT: &str = "ai-sandbox-agent";
/// The Secret holding the session token (key `token`), created by the user.
pub(crate) const TOKEN_SECRET: &str = "ai-sandbox-token";
/// The Secret holding the config's `secret =` values (one key per name), created by the user.
pub(crate) const SECRETS: &str = "ai-sandbox-secrets";
/// The gate's CA for bound secrets' hosts: a Secret (keys `ca.pem`, `ca.key`) for the gate
/// only, and a ConfigMap (key `ca.pem`) for the agent, both made from `ai-sandbox gate ca DIR`.
pub(crate) const GATE_CA: &str = "ai-sandbox-gate-ca";
/// The config's `upstream_ca` for the gate (a ConfigMap, key `ca.pem`), created by the user
/// from the same file.
pub(crate) const UPSTREAM_CA: &str = "ai-sandbox-upstream-ca";
/// The PersistentVolumeClaim holding the project, created by the user.
pub(crate) const PROJECT_CLAIM: &str = "ai-sandbox-project";
pub(crate) const GATE_PORT: u16 = 3128;

/// The manifests, as one multi-document YAML stream (each document is JSON, which is YAML).
pub(crate) fn export(p: &Policy, cfg: &Config, o: &Options) -> Result<String, Vec<Diagnostic>> {
    let image = check(p, cfg, o)?;
    let docs = objects::all(p, o, &image);
    let mut out = format!(
        "# ai-sandbox export kube: {} ({} objects). Apply with `kubectl apply -f`; first create\n\
         # the Secrets and the claim this references (docs/kubernetes.md).\n",
        p.project.display(),
        docs.len()
    );
    if let Some(file) = &p.upstream_ca {
        // Pasteable: `~/` as `"$HOME"/` (a shell expands no tilde after `=`), the rest quoted.
        let q = |s: &str| crate::plan::quote(s.as_ref());
        let file = file.strip_prefix("~/").map_or_else(|| q(file), |rest| format!("\"$HOME\"/{}", q(rest)));
        out += &format!(
            "# The gate's extra roots (upstream_ca) go in a ConfigMap too: kubectl -n {} create configmap {UPSTREAM_CA} --from-file=ca.pem={file}\n",
            q(&o.namespace)
        );
    }
    // Lines with no cluster meaning are said, never dropped in silence.
    for e in &cfg.entries {
        if let Some(keys::Key { export: keys::Exports { kube: Export::LeftOut(why) }, .. }) =
            keys::get(&e.key)
        {
            out += &format!("# left out: `{} = {}` (line {}): {why}\n", e.key, e.value, e.line);
        }
    }
    for (what, doc) in docs {
        out +=
            &format!("---\n# {what}\n{}\n", serde_json::to_string_pretty(&doc).expect("objects serialise"));
    }
    Ok(out)
}

/// Every reason the config cannot be exported, by line; else the agent's image.
fn check(p: &Policy, cfg: &Config, o: &Options) -> Result<String, Vec<Diagnostic>> {
    let mut bad = Vec::new();
    let mut say = |at: Origin, msg: String, hint: &str| bad.push(Diagnostic::new(at, msg).hint(hint));
    // Each line by its key's export verdict (`policy::keys`), in line order.
    let cx = ExportCx { gate_addr: IpAddr::V4(p.gate_addr), allowed: p.allow.nets.clone() };
    for e in &cfg.entries {
        let Some(key) = keys::get(&e.key) else { continue };
        let at = Origin::Config(e.line);
        match key.export.kube {
            Export::Carried | Export::LeftOut(_) => {}
            Export::Checked(check) => {
                if let Some((why, instead)) = check(&e.value, &cx) {
                    say(at, why, instead);
                }
            }
            Export::Refused(why, instead) => say(at, format!("`{} = {}` {why}", e.key, e.value), instead),
        }
    }
    // `--allow` flags are checked after the lines.
    let host = cx.gate_addr;
    let from_lines = cfg
        .all(Name::Allow)
        .any(|(v, _)| matches!(allow::parse(v), Ok(allow::Allow::Net(n, _)) if n.contains(host)));
    if !from_lines && p.allow.nets.iter().any(|(n, _)| n.contains(host)) {
        say(
            Origin::Flag("--allow"),
            format!("an --allow reaches this machine's loopback ({host}), which a cluster does not have"),
            "reach the service by its cluster address instead, or drop the flag",
        );
    }
    if p.net == NetMode::Allow && !p.gate {
        say(
            Origin::Flag("--no-gate"),
            "an export keeps the gate: without it a cluster has nothing to enforce hostnames with".into(),
            "export without --no-gate",
        );
    }
    if p.net == NetMode::Full {
        let at = cfg.one(Name::Net).map_or(Origin::Flag("--net"), |(_, at)| at);
        say(
            at,
            "`net = full` applies no policy; an export would have nothing to enforce".into(),
            "use `net = allow` (the default)",
        );
    }
    let image = match (&o.image, &p.image) {
        (Some(i), _) => Some(i.clone()),
        (None, crate::policy::Image::Named(i)) => Some(i.clone()),
        (None, crate::policy::Image::Host) => None,
    };
    if image.is_none() {
        let at = cfg.one(Name::Image).map_or(Origin::Flag("--image"), |(_, at)| at);
        say(
            at,
            "`image = host` (the default) is this machine's /usr; a cluster runs an image".into(),
            "pass `--image IMAGE` (the image your agent runs in), or set `image = IMAGE`",
        );
    }
    if bad.is_empty() { Ok(image.unwrap_or_default()) } else { Err(bad) }
}

/// The NetworkPolicy ports of an entry (`None`: every port).
fn np_ports(r: Ports) -> Option<(u16, Option<u16>)> {
    (r != Ports::ALL).then_some((r.lo, (r.hi != r.lo).then_some(r.hi)))
}

/// CIDR text of an IP entry (`10.0.0.0/8`, `192.0.2.7/32`).
fn cidr(n: &IpNet) -> String {
    format!("{}/{}", n.addr, n.len)
}

#[cfg(test)]
mod tests;
