//! The exported objects, built from `k8s-openapi`'s typed structs (never from text templates).

use super::parts::{env, locked_down, mount, runtime_default};
use super::{AGENT, GATE, GATE_PORT, Options, PROJECT_CLAIM, SECRETS, TOKEN_SECRET, cidr, np_ports};
use crate::gate::cluster::{PolicyFile, SessionEntry};
use crate::policy::allow::Ports;
use crate::policy::{Command, NetMode, Policy};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    SecretKeySelector, SecretVolumeSource, Service, ServicePort, ServiceSpec, TCPSocketAction, Volume,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

const POLICY_DIR: &str = "/etc/ai-sandbox";
const TOKEN_DIR: &str = "/var/run/ai-sandbox/token";
const WORKDIR: &str = "/work";
const HOME: &str = "/home/agent";

fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), name.to_string()),
        ("app.kubernetes.io/part-of".to_string(), "ai-sandbox".to_string()),
    ])
}

fn meta(name: &str, o: &Options) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(o.namespace.clone()),
        labels: Some(labels(name)),
        ..ObjectMeta::default()
    }
}

fn selector(name: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([("app.kubernetes.io/name".to_string(), name.to_string())])),
        ..LabelSelector::default()
    }
}

fn pod_security(uid: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        fs_group: Some(uid),
        seccomp_profile: Some(runtime_default()),
        ..PodSecurityContext::default()
    }
}

fn from_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                ..Default::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume { name: name.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() }
}

/// Every object, each with a one-line description.
pub(crate) fn all(p: &Policy, o: &Options, image: &str) -> Vec<(String, serde_json::Value)> {
    let v = |x: serde_json::Result<serde_json::Value>| x.expect("objects serialise");
    let mut out = vec![
        (
            "the agent's Pod: the config's command and environment, secrets by reference".to_string(),
            v(serde_json::to_value(agent_pod(p, o, image))),
        ),
        (
            "what the agent may reach: the gate and the config's IP entries, nothing else".into(),
            v(serde_json::to_value(agent_policy(p, o))),
        ),
    ];
    if p.net == NetMode::Allow && p.gate {
        out.push((
            "the gate's policy: the config's names, pins and denies".into(),
            v(serde_json::to_value(gate_config(p, o))),
        ));
        out.push((
            "the gate: this binary's cluster mode".into(),
            v(serde_json::to_value(gate_deployment(p, o))),
        ));
        out.push(("the gate's address for the agent".into(), v(serde_json::to_value(gate_service(o)))));
        out.push(("who may reach the gate: the agent only".into(), v(serde_json::to_value(gate_ingress(o)))));
        if o.cilium {
            out.push((
                "the gate's own egress, by name: a second layer under the gate (Cilium)".into(),
                v(serde_json::to_value(super::cilium::gate_fqdn(p, o))),
            ));
        }
    }
    out
}

fn agent_pod(p: &Policy, o: &Options, image: &str) -> Pod {
    let mut vars = Vec::new();
    if p.net == NetMode::Allow && p.gate {
        // The token from its Secret; the proxy URL names it through Kubernetes' $(VAR) expansion,
        // so it is in no manifest.
        vars.push(from_secret("AISB_TOKEN", TOKEN_SECRET, "token"));
        let url = format!("http://aisb:$(AISB_TOKEN)@{GATE}.{}.svc:{GATE_PORT}", o.namespace);
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
            vars.push(env(name, &url));
            vars.push(env(&name.to_ascii_lowercase(), &url));
        }
        let no_proxy = p.no_proxy.join(",");
        vars.push(env("NO_PROXY", &no_proxy));
        vars.push(env("no_proxy", &no_proxy));
    }
    vars.push(env("HOME", HOME));
    // Kubernetes expands `$(NAME)` in env values; the user's values are meant literally.
    vars.extend(p.env.iter().map(|(k, val)| env(k, &val.replace("$(", "$$("))));
    vars.extend(super::bound::agent_env(p, o, |n| from_secret(n, SECRETS, n)));
    let (command, interactive) = match &p.command {
        // From the config's `cmd` (an export takes no `--`), so text: the conversion is exact.
        Command::Argv(a) if !a.is_empty() => {
            (Some(a.iter().map(|s| s.to_string_lossy().into_owned()).collect()), false)
        }
        _ => (Some(vec!["/bin/sh".to_string()]), true),
    };
    let container = Container {
        name: "agent".into(),
        image: Some(image.into()),
        command,
        env: Some(vars),
        working_dir: Some(WORKDIR.into()),
        stdin: Some(interactive),
        tty: Some(interactive),
        security_context: Some(locked_down()),
        ports: (!p.publish.is_empty()).then(|| {
            p.publish
                .iter()
                .map(|pb| ContainerPort {
                    container_port: i32::from(pb.container),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect()
        }),
        volume_mounts: Some(
            [mount("project", WORKDIR, false), mount("home", HOME, false), mount("tmp", "/tmp", false)]
                .into_iter()
                .chain(super::bound::agent_mounts(p))
                .collect(),
        ),
        ..Container::default()
    };
    Pod {
        metadata: meta(AGENT, o),
        spec: Some(PodSpec {
            containers: vec![container],
            init_containers: super::bound::agent_init(p, image).map(|c| vec![c]),
            restart_policy: Some("Never".into()),
            // The agent has no business with the cluster's API, nor with other Services' addresses.
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(pod_security(1000)),
            volumes: Some(
                vec![
                    Volume {
                        name: "project".into(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: PROJECT_CLAIM.into(),
                            ..Default::default()
                        }),
                        ..Volume::default()
                    },
                    empty_dir("home"),
                    empty_dir("tmp"),
                ]
                .into_iter()
                .chain(super::bound::agent_volumes(p))
                .collect(),
            ),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn np_port(r: Ports) -> NetworkPolicyPort {
    let (port, end) = np_ports(r).map_or((None, None), |(lo, hi)| (Some(lo), hi));
    NetworkPolicyPort {
        protocol: Some("TCP".into()),
        port: port.map(|p| IntOrString::Int(i32::from(p))),
        end_port: end.map(i32::from),
    }
}

fn agent_policy(p: &Policy, o: &Options) -> NetworkPolicy {
    let mut egress = Vec::new();
    if p.net == NetMode::Allow {
        if p.gate {
            egress.push(NetworkPolicyEgressRule {
                to: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(selector(GATE)),
                    ..Default::default()
                }]),
                ports: Some(vec![np_port(Ports::one(GATE_PORT))]),
            });
        }
        for (n, r) in &p.allow.nets {
            // Whole addresses denied inside an allowed range are carved out of it.
            let except: Vec<String> = p
                .allow
                .deny_nets
                .iter()
                .filter(|(d, dr)| *dr == Ports::ALL && n.contains(d.addr) && d.len > n.len)
                .map(|(d, _)| cidr(d))
                .collect();
            if p.allow
                .deny_nets
                .iter()
                .any(|(d, dr)| *dr == Ports::ALL && d.contains(n.addr) && d.len <= n.len)
            {
                continue;
            }
            egress.push(NetworkPolicyEgressRule {
                to: Some(vec![NetworkPolicyPeer {
                    ip_block: Some(IPBlock { cidr: cidr(n), except: (!except.is_empty()).then_some(except) }),
                    ..Default::default()
                }]),
                ports: np_ports(*r).map(|_| vec![np_port(*r)]),
            });
        }
    }
    let ingress: Vec<NetworkPolicyIngressRule> = p
        .publish
        .iter()
        .map(|pb| NetworkPolicyIngressRule {
            ports: Some(vec![np_port(Ports::one(pb.container))]),
            from: None,
        })
        .collect();
    NetworkPolicy {
        metadata: meta(AGENT, o),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(AGENT)),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            egress: Some(egress),
            ingress: Some(ingress),
        }),
    }
}

pub(super) fn gate_config(p: &Policy, o: &Options) -> ConfigMap {
    let mut policy = crate::contract::SessionPolicy::of(p, None);
    policy.config_path = ".ai-sandbox/config".into();
    // Left out, as the export's output says (`budget`): the cluster's gate would count them
    // from its own start, not a session's, and nothing counts an address there.
    policy.budgets.clear();
    policy.net_budgets.clear();
    // Left out too: the host's loopback mapping (`gate_addr`) has no cluster meaning, and no
    // one watches a cluster's gate to answer (`ask`).
    policy.gate_addr = crate::policy::DEFAULT_GATE_ADDR;
    policy.ask = None;
    let file = PolicyFile {
        sessions: vec![SessionEntry {
            id: "agent".into(),
            project: p
                .project
                .file_name()
                .map_or_else(|| "project".into(), |n| n.to_string_lossy().into_owned()),
            token_file: format!("{TOKEN_DIR}/token").into(),
            policy,
            secrets: super::bound::entries(p, o),
            upstream_ca_file: super::bound::upstream_ca_file(p),
        }],
    };
    ConfigMap {
        metadata: meta(GATE, o),
        data: Some(BTreeMap::from([(
            "policy.json".to_string(),
            serde_json::to_string_pretty(&readable(&file)).expect("policy serialises"),
        )])),
        ..ConfigMap::default()
    }
}

/// The policy file as people read it (rule paths as text: see `contract::session::readable`).
fn readable(file: &PolicyFile) -> serde_json::Value {
    let mut v = serde_json::to_value(file).expect("policy serialises");
    if let Some(sessions) = v.get_mut("sessions").and_then(|s| s.as_array_mut()) {
        for s in sessions {
            if let Some(p) = s.get_mut("policy") {
                crate::contract::session::readable(p);
            }
        }
    }
    v
}

fn gate_deployment(p: &Policy, o: &Options) -> Deployment {
    let listen = format!("0.0.0.0:{GATE_PORT}");
    let policy = format!("{POLICY_DIR}/policy.json");
    let mut args = vec!["gate", "serve", "--listen", &listen, "--policy", &policy, "--drain", "25"];
    if super::bound::terminates(p) {
        args.extend(["--ca", super::bound::CA_DIR]);
    }
    let container = Container {
        name: "gate".into(),
        image: Some(o.gate_image.clone()),
        command: Some(vec!["ai-sandbox".into()]),
        args: Some(args.iter().map(|a| a.to_string()).collect()),
        ports: Some(vec![ContainerPort {
            container_port: i32::from(GATE_PORT),
            name: Some("proxy".into()),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(GATE_PORT)),
                ..Default::default()
            }),
            ..Probe::default()
        }),
        security_context: Some(locked_down()),
        volume_mounts: Some(
            [mount("policy", POLICY_DIR, true), mount("token", TOKEN_DIR, true)]
                .into_iter()
                .chain(super::bound::gate_mounts(p))
                .collect(),
        ),
        ..Container::default()
    };
    let spec = PodSpec {
        containers: vec![container],
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(pod_security(65532)),
        // Longer than --drain, so open connections finish before the kubelet's SIGKILL.
        termination_grace_period_seconds: Some(30),
        volumes: Some(
            vec![
                Volume {
                    name: "policy".into(),
                    config_map: Some(ConfigMapVolumeSource { name: GATE.into(), ..Default::default() }),
                    ..Volume::default()
                },
                Volume {
                    name: "token".into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(TOKEN_SECRET.into()),
                        ..Default::default()
                    }),
                    ..Volume::default()
                },
            ]
            .into_iter()
            .chain(super::bound::gate_volumes(p))
            .collect(),
        ),
        ..PodSpec::default()
    };
    Deployment {
        metadata: meta(GATE, o),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: selector(GATE),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels(GATE)), ..ObjectMeta::default() }),
                spec: Some(spec),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

fn gate_service(o: &Options) -> Service {
    Service {
        metadata: meta(GATE, o),
        spec: Some(ServiceSpec {
            selector: selector(GATE).match_labels,
            ports: Some(vec![ServicePort {
                name: Some("proxy".into()),
                port: i32::from(GATE_PORT),
                target_port: Some(IntOrString::Int(i32::from(GATE_PORT))),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn gate_ingress(o: &Options) -> NetworkPolicy {
    NetworkPolicy {
        metadata: meta(GATE, o),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(GATE)),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(selector(AGENT)),
                    ..Default::default()
                }]),
                ports: Some(vec![np_port(Ports::one(GATE_PORT))]),
            }]),
            egress: None,
        }),
    }
}
