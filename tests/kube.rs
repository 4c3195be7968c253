//! `ai-sandbox export kube`: snapshots of the manifests for the configs the dry-run snapshots
//! use (and an agent's own), driven through `FakeHost` like tests/plan.rs; and every exported
//! document validated against the Kubernetes schemas of 1.33 to 1.37 with the offline validator
//! `kubernetes-validate` (installed by scripts/install-test-tools; missing is a failure).

mod support;

use ai_sandbox::cli::{Cli, Sub};
use ai_sandbox::host::FakeHost;
use clap::Parser;
use support::{DESIGN_CONFIG, host};

const AGENT_CONFIG: &str = "\
allow = api.anthropic.com
allow = *.npmjs.org
allow = [2001:db8::/32]:443
allow = 10.0.0.0/8:5432-5433
deny = 10.9.0.0/16
resolve = registry.internal=10.2.3.4
allow = registry.internal:8443
secret = ANTHROPIC_API_KEY
env = CI=1
publish = 3000
cmd = claude -p 'fix the tests'
";

/// The export's output, or its error as the user sees it.
fn export(h: &mut FakeHost, args: &[&str]) -> Result<String, String> {
    let cli = Cli::try_parse_from(["ai-sandbox", "export", "kube"].iter().chain(args)).unwrap();
    let Some(Sub::Export { cmd }) = &cli.sub else { panic!("not an export") };
    match ai_sandbox::cli::export::export_cmd(h, cmd) {
        Ok(0) => {
            assert!(h.effects.is_empty(), "an export caused side effects: {:?}", h.effects);
            Ok(h.stdout.clone())
        }
        Ok(code) => Err(format!("exit {code}")),
        Err(e) => {
            assert!(h.stdout.is_empty(), "half an export was printed: {}", h.stdout);
            Err(format!("{e:#}"))
        }
    }
}

/// Every exported case: (name, config, arguments).
const CASES: &[(&str, &str, &[&str])] = &[
    ("design_config", DESIGN_CONFIG, &["--image", "node:22"]),
    ("net_none", "allow = github.com\n", &["--net", "none", "--image", "rust:1"]),
    ("two_published_ports", "publish = 8000\n", &["--publish", "8080:3000", "--image", "node:22"]),
    (
        "user_no_proxy_is_merged",
        "env = NO_PROXY=internal.example,10.1.2.3\nallow = 10.1.2.3:8080\n",
        &["--image", "img"],
    ),
    (
        "agent_with_cilium",
        AGENT_CONFIG,
        &["--image", "ghcr.io/example/agent:1", "--namespace", "agents", "--cilium"],
    ),
    ("image_host_needs_an_image", "allow = github.com\n", &[]),
    ("no_gate", "allow = github.com\n", &["--no-gate", "--image", "img"]),
    (
        "bound_secret",
        "allow = api.anthropic.com\nsecret = ANTHROPIC_API_KEY for api.anthropic.com\nsecret = OTHER\nupstream_ca = /etc/corp/ca.pem\n",
        &["--image", "node:22"],
    ),
    (
        "rules",
        "allow = api.github.com\nrule = api.github.com GET /repos/acme/**\nrule = api.github.com git-fetch /acme/*.git\n",
        &["--image", "node:22"],
    ),
];

#[test]
fn exports_match_their_snapshots() {
    for (name, cfg, args) in CASES {
        let out = export(&mut host(cfg, &[]), args);
        let text = match &out {
            Ok(t) => t.clone(),
            Err(e) => format!("REFUSED:\n{e}"),
        };
        insta::assert_snapshot!(*name, text);
    }
}

#[test]
fn refusals_name_each_line_with_what_to_use_instead() {
    let e = export(&mut host(DESIGN_CONFIG, &[]), &["--image", "node:22"]).unwrap_err();
    for want in [".ai-sandbox/config:4: `allow = 100.64.0.1:5432`", ".ai-sandbox/config:7: `extra_args = "] {
        assert!(e.contains(want), "missing {want}: {e}");
    }
    assert!(e.contains("ClusterIP"), "{e}");
    // In line order, whichever check found each.
    let e = export(
        &mut host("extra_args = -v /data:/data\nallow = 100.64.0.1:5432\npublish = 8000\n", &[]),
        &["--image", "img"],
    )
    .unwrap_err();
    let lines: Vec<usize> = e
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".ai-sandbox/config:")?.split(':').next()?.parse().ok())
        .collect();
    let mut sorted = lines.clone();
    sorted.sort();
    assert!(lines.len() >= 2 && lines == sorted, "out of line order: {lines:?}\n{e}");
    // An unapproved config is not exported at all.
    let mut h = host("allow = github.com\n", &[]);
    h.files.retain(|(p, _)| !p.to_string_lossy().contains("/.local/state/"));
    h.files.push((
        "/home/dev/app/.ai-sandbox/config".into(),
        "allow = github.com\nallow = evil.example\n".into(),
    ));
    let e = export(&mut h, &["--image", "img"]).unwrap_err();
    assert!(e.contains("not approved"), "{e}");
}

#[test]
fn every_exported_document_is_valid_for_kubernetes_1_33_to_1_37() {
    let kv = "/opt/aisb-kv/bin/kubernetes-validate";
    assert!(std::path::Path::new(kv).exists(), "{kv} is missing: run scripts/install-test-tools");
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (name, cfg, args) in CASES {
        if let Ok(text) = export(&mut host(cfg, &[]), args) {
            let path = dir.path().join(format!("{name}.yaml"));
            std::fs::write(&path, text).unwrap();
            files.push(path);
        }
    }
    assert_eq!(files.len(), 6, "the exportable cases");
    for version in ["1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"] {
        let out =
            std::process::Command::new(kv).args(["--strict", "-k", version]).args(&files).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kubernetes-validate {version}:\n{text}");
        let is_pass = |l: &&str| l.starts_with("INFO") && l.contains(" passed ");
        let passed = text.lines().filter(is_pass).count();
        // Every document but the Cilium CRD (which the validator has no schema for) passed.
        let cilium = text.lines().filter(|l| l.contains("CiliumNetworkPolicy")).count();
        let other: Vec<&str> =
            text.lines().filter(|l| !is_pass(l) && !l.contains("CiliumNetworkPolicy")).collect();
        assert!(other.is_empty() && cilium == 1, "{version}: unexpected output:\n{text}");
        assert_eq!(passed, 2 + 6 + 6 + 6 + 6 + 6, "{version}: every document of every file:\n{text}");
    }
}
