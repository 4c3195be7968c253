//! Unit tests of the export's checks and object shapes (the manifests themselves are
//! snapshot-tested and schema-validated in tests/kube.rs).

use super::*;

fn opts(image: Option<&str>) -> Options {
    Options {
        namespace: "ns".into(),
        image: image.map(String::from),
        gate_image: "ai-sandbox:test".into(),
        cilium: true,
        placeholders: vec![],
    }
}

fn export_of(cfg: &str, image: Option<&str>) -> Result<String, Vec<Diagnostic>> {
    let p = crate::policy::from_text(cfg);
    let (c, _) = crate::policy::keys::read(cfg);
    export(&p, &c, &opts(image))
}

#[test]
fn what_has_no_cluster_meaning_is_refused_by_line_and_nothing_is_printed() {
    let cfg = "allow = github.com\nallow = 100.64.0.1:5432\nextra_args = --memory=2g\nstate = claude\nallow = 10.0.0.0/8:443\ndeny = 10.1.2.3:443\n";
    let errs = export_of(cfg, Some("img")).unwrap_err();
    let lines: Vec<Origin> = errs.iter().map(|d| d.origin.clone()).collect();
    assert_eq!(
        lines,
        [Origin::Config(2), Origin::Config(3), Origin::Config(4), Origin::Config(6)],
        "{errs:?}"
    );
    assert!(
        errs[0].message.contains("loopback")
            && errs[0].hint.as_deref().unwrap_or_default().contains("ClusterIP")
    );
    // A login: what the export does with it (nothing), and why.
    assert!(errs[2].message.contains("the export carries no login to the cluster"), "{errs:?}");
    assert!(errs[2].hint.as_deref().unwrap_or_default().contains("secret = NAME for HOST"), "{errs:?}");
    // Positive control: the same config without those lines exports.
    let ok = export_of("allow = github.com\nallow = 10.0.0.0/8:443\ndeny = 10.1.2.3\n", Some("img")).unwrap();
    assert!(ok.contains("\"kind\": \"NetworkPolicy\"") && ok.contains("\"10.1.2.3/32\""), "{ok}");
}

#[test]
fn aws_credentials_are_not_exported_and_a_bound_key_is() {
    let cfg = "allow = s3.us-east-1.amazonaws.com\nsecret = aws for s3.us-east-1.amazonaws.com\n";
    let errs = export_of(cfg, Some("img")).unwrap_err();
    assert_eq!(errs.iter().map(|d| d.origin.clone()).collect::<Vec<_>>(), [Origin::Config(2)], "{errs:?}");
    assert!(errs[0].message.contains("the export carries no AWS credentials to the cluster"), "{errs:?}");
    assert!(errs[0].hint.as_deref().unwrap_or_default().contains("IAM role"), "{errs:?}");
    // Control: a key bound to the same host exports.
    let bound = "allow = s3.us-east-1.amazonaws.com\nsecret = K for s3.us-east-1.amazonaws.com\n";
    assert!(export_of(bound, Some("img")).is_ok());
}

#[test]
fn image_host_needs_an_image() {
    let errs = export_of("allow = github.com\n", None).unwrap_err();
    assert_eq!(errs[0].origin, Origin::Flag("--image"));
    assert!(export_of("image = docker.io/library/node:22\nallow = github.com\n", None).is_ok());
}

#[test]
fn secrets_and_the_token_are_references_never_values() {
    let out = export_of("allow = github.com\nsecret = ANTHROPIC_API_KEY\n", Some("img")).unwrap();
    assert!(out.contains("\"secretKeyRef\"") && out.contains("\"ai-sandbox-secrets\""), "{out}");
    assert!(out.contains("http://aisb:$(AISB_TOKEN)@ai-sandbox-gate.ns.svc:3128"), "{out}");
    assert!(out.contains("\"toFQDNs\"") && out.contains("\"matchName\": \"github.com\""), "{out}");
}

#[test]
fn an_allow_flag_to_the_host_loopback_is_refused_too() {
    let inputs = crate::policy::Inputs { allow: vec!["100.64.0.1:5432".into()], ..Default::default() };
    let (c, _) = crate::policy::keys::read("allow = github.com\n");
    let p = crate::policy::build("/p".into(), &c, &inputs).unwrap();
    let errs = export(&p, &c, &opts(Some("img"))).unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].origin, Origin::Flag("--allow"));
}

#[test]
fn user_env_values_stay_literal_under_kubernetes_expansion() {
    let out = export_of("allow = github.com\nenv = PS1=$(whoami)> \n", Some("img")).unwrap();
    assert!(out.contains("\"value\": \"$$(whoami)>\""), "{out}");
    assert!(out.contains("http://aisb:$(AISB_TOKEN)@"), "ours still expands: {out}");
}

#[test]
fn lines_with_no_cluster_meaning_are_said_to_be_left_out_never_dropped_in_silence() {
    let cfg = "allow = github.com\nask = 30\nprotect = scripts/deploy.sh\n";
    let out = export_of(cfg, Some("img")).unwrap();
    assert!(
        out.contains("# left out: `ask = 30` (line 2): no one watches a cluster's gate to answer"),
        "{out}"
    );
    assert!(out.contains("# left out: `protect = scripts/deploy.sh` (line 3)"), "{out}");
    // Control: a line the export carries is not listed as left out.
    assert!(!out.contains("left out: `allow"), "{out}");
}

/// The exported objects, as JSON values.
fn objects(out: &str) -> Vec<serde_json::Value> {
    out.split("\n---\n")
        .filter_map(|d| serde_json::from_str(d.trim_start_matches(|c| c != '{')).ok())
        .collect()
}

#[test]
fn a_bound_secret_is_a_placeholder_in_the_agent_pod_and_a_mounted_value_in_the_gates() {
    let mut o = opts(Some("img"));
    o.placeholders = vec![("K".into(), "aisb_placeholder_0123".into())];
    let p = crate::policy::from_text("allow = api.example.com\nsecret = K for api.example.com\nsecret = U\n");
    let (c, _) = crate::policy::keys::read("");
    let out = export(&p, &c, &o).unwrap();
    let docs = objects(&out);
    let kind = |k: &str| docs.iter().find(|d| d["kind"] == k).unwrap_or_else(|| panic!("no {k}: {out}"));
    let agent = kind("Pod").to_string();
    // The agent: K's placeholder as a literal and no reference to K's value; U unbound, by reference.
    assert!(agent.contains(r#"{"name":"K","value":"aisb_placeholder_0123"}"#), "{agent}");
    assert!(!agent.contains(r#""key":"K""#), "the agent's Pod references K's value: {agent}");
    assert!(agent.contains(r#""key":"U""#), "{agent}");
    assert!(agent.contains("SSL_CERT_FILE") && agent.contains("ai-sandbox-gate-ca"), "{agent}");
    // The gate: the value mounted from the Secret, the CA, and the policy mapping them.
    let gate = kind("Deployment").to_string();
    assert!(gate.contains(r#""--ca""#) && gate.contains(r#""secretName":"ai-sandbox-gate-ca""#), "{gate}");
    assert!(gate.contains(r#""items":[{"key":"K","path":"K"}]"#), "only the bound key is mounted: {gate}");
    let policy = kind("ConfigMap")["data"]["policy.json"].as_str().unwrap().to_string();
    assert!(
        policy.contains("aisb_placeholder_0123") && policy.contains("/var/run/ai-sandbox/secrets/K"),
        "{policy}"
    );
    // Control: with no bound secret, none of it.
    let p = crate::policy::from_text("allow = api.example.com\nsecret = K\n");
    let out = export(&p, &c, &o).unwrap();
    assert!(!out.contains("aisb_placeholder_") && !out.contains("--ca") && !out.contains("gate-ca"), "{out}");
}

#[test]
fn rules_go_to_the_cluster_gate_with_the_ca_both_pods_need_and_no_secret() {
    let o = opts(Some("img"));
    let p = crate::policy::from_text(
        "allow = github.com\nrule = github.com git-fetch /acme/*\nrule = github.com git-push /acme/r refs/heads/agent/*\nrule = github.com mcp /mcp search_*\n",
    );
    let (c, _) = crate::policy::keys::read("");
    let out = export(&p, &c, &o).unwrap();
    let docs = objects(&out);
    let kind = |k: &str| docs.iter().find(|d| d["kind"] == k).unwrap_or_else(|| panic!("no {k}: {out}"));
    // The gate's policy carries the rules, as the gate matches them; a push's ref limit and an
    // MCP endpoint's tools too.
    let policy: serde_json::Value =
        serde_json::from_str(kind("ConfigMap")["data"]["policy.json"].as_str().unwrap()).unwrap();
    let rules = &policy["sessions"][0]["policy"]["rules"];
    assert_eq!(rules.as_array().map(Vec::len), Some(7), "{policy}");
    assert_eq!(rules[0]["line"], "github.com git-fetch /acme/*", "{policy}");
    assert_eq!(rules[3]["refs"], serde_json::json!(["refs/heads/agent/*"]), "{policy}");
    let back: crate::policy::rule::Rule = serde_json::from_value(rules[3].clone()).unwrap();
    assert_eq!(back.refs, ["refs/heads/agent/*"]);
    // An MCP rule's tools too (each of its three methods).
    let mcp: crate::policy::rule::Rule = serde_json::from_value(rules[4].clone()).unwrap();
    assert_eq!((mcp.method.as_deref(), mcp.tools.as_slice()), (Some("POST"), &["search_*".to_string()][..]));
    // The gate opens TLS: its CA mounted there, trusted in the agent's Pod; no secret anywhere.
    let gate = kind("Deployment").to_string();
    assert!(gate.contains(r#""--ca""#) && gate.contains(r#""secretName":"ai-sandbox-gate-ca""#), "{gate}");
    assert!(!gate.contains(r#""name":"secrets""#), "{gate}");
    let agent = kind("Pod").to_string();
    assert!(agent.contains("SSL_CERT_FILE") && agent.contains("ai-sandbox-gate-ca"), "{agent}");
}

#[test]
fn upstream_ca_goes_to_the_gates_pod_only_as_a_configmap_the_output_says_how_to_make() {
    let o = opts(Some("img"));
    let cfg = "allow = api.example.com\nsecret = K for api.example.com\nupstream_ca = /etc/corp/ca.pem\n";
    let p = crate::policy::from_text(cfg);
    let (c, _) = crate::policy::keys::read(cfg);
    let out = export(&p, &c, &o).unwrap();
    assert!(
        out.contains(
            "kubectl -n ns create configmap ai-sandbox-upstream-ca --from-file=ca.pem=/etc/corp/ca.pem"
        ),
        "{out}"
    );
    assert!(!out.contains("left out: `upstream_ca"), "{out}");
    let docs = objects(&out);
    let kind = |k: &str| docs.iter().find(|d| d["kind"] == k).unwrap_or_else(|| panic!("no {k}: {out}"));
    let policy: serde_json::Value =
        serde_json::from_str(kind("ConfigMap")["data"]["policy.json"].as_str().unwrap()).unwrap();
    assert_eq!(
        policy["sessions"][0]["upstream_ca_file"], "/var/run/ai-sandbox/upstream-ca/ca.pem",
        "{policy}"
    );
    let gate = kind("Deployment").to_string();
    assert!(gate.contains(r#""configMap":{"name":"ai-sandbox-upstream-ca"}"#), "{gate}");
    assert!(gate.contains(r#""mountPath":"/var/run/ai-sandbox/upstream-ca""#), "{gate}");
    assert!(!kind("Pod").to_string().contains("upstream-ca"), "the agent's Pod needs none of it");
    // Control: without the line, none of it.
    let cfg = "allow = api.example.com\nsecret = K for api.example.com\n";
    let out = export(&crate::policy::from_text(cfg), &crate::policy::keys::read(cfg).0, &o).unwrap();
    assert!(!out.contains("upstream") && out.contains("ai-sandbox-gate-ca"), "{out}");
    // A `~/` path is printed as the shell would need it, after `=` where no tilde expands.
    let cfg = "allow = api.example.com\nupstream_ca = ~/my certs/ca.pem\n";
    let out = export(&crate::policy::from_text(cfg), &crate::policy::keys::read(cfg).0, &o).unwrap();
    assert!(out.contains(r#"--from-file=ca.pem="$HOME"/'my certs/ca.pem'"#), "{out}");
}

#[test]
fn each_key_does_in_the_export_what_its_row_says() {
    use crate::policy::keys::{Export, KEYS};
    // The host the rule example names, so that every example is valid on its own line 2.
    let base = "allow = api.github.com\n";
    let plain = export_of(base, Some("img")).unwrap();
    let objects = |s: &str| s.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
    for k in KEYS {
        let line = format!("{} = {}", k.name, k.example);
        let cfg = format!("{base}{line}\n");
        // `--image` wins over an `image` line, as a flag does: the line is tried without it.
        let flag = (k.name != crate::policy::keys::Name::Image).then_some("img");
        let got = export_of(&cfg, flag);
        match k.export.kube {
            // Carried: the line changes the objects (a key marked carried that the export does
            // not read would leave them as they were).
            Export::Carried | Export::Checked(_) => {
                let out = got.unwrap_or_else(|e| panic!("`{line}` is carried, yet refused: {e:?}"));
                assert!(
                    objects(&out) != objects(&plain),
                    "`{line}` is marked carried, yet the objects do not change"
                );
            }
            Export::LeftOut(why) => {
                let out = got.unwrap_or_else(|e| panic!("`{line}` is left out, yet refused: {e:?}"));
                assert!(out.contains(&format!("# left out: `{line}` (line 2): {why}")), "{out}");
                // Said to be left out, and so it is: the objects are those of the config without it.
                assert!(
                    objects(&out) == objects(&plain),
                    "`{line}` is said to be left out, yet the objects change"
                );
            }
            Export::Refused(..) => {
                let errs = got.expect_err(&line);
                assert!(errs.iter().any(|d| d.origin == Origin::Config(2)), "`{line}`: {errs:?}");
            }
        }
    }
}

#[test]
fn rule_paths_are_exported_as_text_and_the_cluster_gate_reads_them_back() {
    let cfg = "allow = api.github.com\nrule = api.github.com GET /repos/acme/**\n";
    let p = crate::policy::from_text(cfg);
    let cm = objects::gate_config(&p, &opts(Some("img")));
    let text = &cm.data.as_ref().unwrap()["policy.json"];
    assert!(text.contains("\"repos\",\n") && text.contains("\"**\""), "{text}");
    assert!(!text.contains("114,"), "no byte arrays: {text}");
    let file: crate::gate::cluster::PolicyFile = serde_json::from_str(text).unwrap();
    assert_eq!(file.sessions[0].policy.rules, p.rules, "the gate reads the same rules");
}
