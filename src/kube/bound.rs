//! Bound secrets and hosts with rules in the exported objects (ADR 0050, 0051): the agent's Pod
//! holds each bound secret's placeholder (a literal, made for this export) and never a
//! reference to its value; the gate's Pod mounts the values (the same `ai-sandbox-secrets`
//! Secret, only the bound keys). Where the gate opens TLS (a bound secret's host, a host with
//! rules) it mounts the CA (`ai-sandbox-gate-ca`, a Secret made from `ai-sandbox gate ca DIR`);
//! the agent's Pod mounts the CA certificate (a ConfigMap of the same name) and trusts it
//! through a bundle an init container writes: its image's roots, then the gate's CA. The
//! config's `upstream_ca` (more roots for the servers the gate opens TLS to) is a ConfigMap
//! the gate's Pod mounts, as the local gate reads the file.

use super::parts::{env, locked_down, mount};
use super::{GATE_CA, Options, SECRETS, UPSTREAM_CA};
use crate::gate::cluster::SecretEntry;
use crate::plan::gate_ca::VARS;
use crate::policy::Policy;
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, KeyToPath, SecretVolumeSource, Volume,
    VolumeMount,
};

/// In the gate's Pod: the bound values, and the CA (certificate and key).
const VALUES_DIR: &str = "/var/run/ai-sandbox/secrets";
pub(super) const CA_DIR: &str = "/var/run/ai-sandbox/ca";
const UPSTREAM_CA_DIR: &str = "/var/run/ai-sandbox/upstream-ca";
/// In the agent's Pod: the CA certificate, and the bundle the init container writes.
const AGENT_CA_DIR: &str = "/etc/ai-sandbox/gate-ca";
const BUNDLE_DIR: &str = "/etc/ai-sandbox/trust";
/// Where Debian-family images keep their roots (the bundle starts with them).
const IMAGE_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

fn names(p: &Policy) -> Vec<&str> {
    p.secrets.iter().filter(|s| !s.hosts.is_empty()).map(|s| s.name.as_str()).collect()
}

pub(super) fn any(p: &Policy) -> bool {
    !names(p).is_empty()
}

/// Whether the gate opens TLS for some host (then both Pods need the CA).
pub(super) fn terminates(p: &Policy) -> bool {
    any(p) || !p.rules.is_empty()
}

/// The gate policy's entries: placeholder, where the value is mounted, the hosts.
pub(super) fn entries(p: &Policy, o: &Options) -> Vec<SecretEntry> {
    p.secrets
        .iter()
        .filter(|s| !s.hosts.is_empty())
        .map(|s| SecretEntry {
            name: s.name.clone(),
            placeholder: o.placeholder(&s.name),
            value_file: format!("{VALUES_DIR}/{}", s.name).into(),
            hosts: s.hosts.clone(),
        })
        .collect()
}

/// Where the gate's Pod reads the config's `upstream_ca` (the file's name there is fixed).
pub(super) fn upstream_ca_file(p: &Policy) -> Option<std::path::PathBuf> {
    p.upstream_ca.as_ref().map(|_| format!("{UPSTREAM_CA_DIR}/ca.pem").into())
}

pub(super) fn gate_volumes(p: &Policy) -> Vec<Volume> {
    let mut out = Vec::new();
    if any(p) {
        let items = names(p)
            .iter()
            .map(|n| KeyToPath { key: n.to_string(), path: n.to_string(), mode: None })
            .collect();
        out.push(Volume {
            name: "secrets".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(SECRETS.into()),
                items: Some(items),
                ..Default::default()
            }),
            ..Volume::default()
        });
    }
    if terminates(p) {
        out.push(Volume {
            name: "ca".into(),
            secret: Some(SecretVolumeSource { secret_name: Some(GATE_CA.into()), ..Default::default() }),
            ..Volume::default()
        });
    }
    if p.upstream_ca.is_some() {
        out.push(Volume {
            name: "upstream-ca".into(),
            config_map: Some(ConfigMapVolumeSource { name: UPSTREAM_CA.into(), ..Default::default() }),
            ..Volume::default()
        });
    }
    out
}

pub(super) fn gate_mounts(p: &Policy) -> Vec<VolumeMount> {
    let mut out = Vec::new();
    if any(p) {
        out.push(mount("secrets", VALUES_DIR, true));
    }
    if terminates(p) {
        out.push(mount("ca", CA_DIR, true));
    }
    if p.upstream_ca.is_some() {
        out.push(mount("upstream-ca", UPSTREAM_CA_DIR, true));
    }
    out
}

/// The agent's variables for its secrets: a bound one's placeholder, an unbound one's value by
/// reference; and, when any is bound, the trust variables.
pub(super) fn agent_env(p: &Policy, o: &Options, from_secret: impl Fn(&str) -> EnvVar) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = p
        .secrets
        .iter()
        .map(
            |s| if s.hosts.is_empty() { from_secret(&s.name) } else { env(&s.name, &o.placeholder(&s.name)) },
        )
        .collect();
    if terminates(p) {
        for v in VARS.iter().filter(|v| !p.user_sets(v)) {
            let file = if *v == "NODE_EXTRA_CA_CERTS" {
                format!("{AGENT_CA_DIR}/ca.pem")
            } else {
                format!("{BUNDLE_DIR}/bundle.pem")
            };
            out.push(env(v, &file));
        }
    }
    out
}

pub(super) fn agent_volumes(p: &Policy) -> Vec<Volume> {
    if !terminates(p) {
        return Vec::new();
    }
    vec![
        Volume {
            name: "gate-ca".into(),
            config_map: Some(ConfigMapVolumeSource { name: GATE_CA.into(), ..Default::default() }),
            ..Volume::default()
        },
        Volume {
            name: "trust".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
    ]
}

pub(super) fn agent_mounts(p: &Policy) -> Vec<VolumeMount> {
    if !terminates(p) {
        return Vec::new();
    }
    vec![mount("gate-ca", AGENT_CA_DIR, true), mount("trust", BUNDLE_DIR, true)]
}

/// Writes the bundle before the agent starts: the image's roots, then the gate's CA. An image
/// without Debian's bundle fails here, visibly, rather than running with no roots.
pub(super) fn agent_init(p: &Policy, image: &str) -> Option<Container> {
    terminates(p).then(|| Container {
        name: "trust".into(),
        image: Some(image.into()),
        command: Some(vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("cat {IMAGE_ROOTS} {AGENT_CA_DIR}/ca.pem > {BUNDLE_DIR}/bundle.pem"),
        ]),
        security_context: Some(locked_down()),
        volume_mounts: Some(vec![mount("gate-ca", AGENT_CA_DIR, true), mount("trust", BUNDLE_DIR, false)]),
        ..Container::default()
    })
}
