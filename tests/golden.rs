//! Golden round-trip with REAL nft and no root: load the generated ruleset into a fresh
//! `unshare -rn` namespace, list it back, and compare with `rules/base.nft` (reviewed) and
//! the snapshots. The JSON the hook loads and the text `--dry-run` prints are both loaded,
//! and must list identically. Needs `unshare` and `nft` (installed by scripts/install-deps).

use ai_sandbox::plan::ruleset::{self, Ruleset};
use ai_sandbox::policy::{self, Inputs, NetMode};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn nft_path() -> String {
    ["/usr/sbin/nft", "/sbin/nft"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("nft is not installed: run scripts/install-deps")
        .to_string()
}

/// Loads `input` with `nft [-j] -f -` in a new user+network namespace; returns `nft list ruleset`.
fn load_and_list(input: &str, json: bool) -> String {
    let nft = nft_path();
    let script = format!("{nft} {} -f - && {nft} list ruleset", if json { "-j" } else { "" });
    let mut child = Command::new("unshare")
        .args(["-rn", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft refused the ruleset:\n{}\n--- input ---\n{input}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn ruleset_for(cfg: &str, inputs: Inputs) -> Ruleset {
    let (cfg, errs) = policy::keys::read(cfg);
    assert!(errs.is_empty(), "{errs:?}");
    let p = policy::build(PathBuf::from("/w/p"), &cfg, &inputs).expect("policy");
    ruleset::build(&p, p.gate_port).expect("allow mode has a ruleset")
}

/// Loads both forms and checks they agree; returns the listing.
fn round_trip(rs: &Ruleset) -> String {
    let from_json = load_and_list(&rs.to_json_string(), true);
    let from_text = load_and_list(&rs.to_text(), false);
    assert_eq!(from_json, from_text, "the printed nft text and the JSON the hook loads differ");
    from_json
}

#[test]
fn base_ruleset_matches_the_reviewed_file() {
    let listed = round_trip(&ruleset_for("", Inputs::default()));
    let reviewed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/rules/base.nft")).unwrap();
    assert_eq!(listed, reviewed, "generated base ruleset differs from rules/base.nft");
}

#[test]
fn design_example_with_publish_round_trips() {
    let cfg = "allow = github.com\nallow = 100.64.0.1:5432\nallow = 10.0.0.0/8\nallow = 10.1.2.3:5432\n\
               allow = 192.0.2.0/24:8000-8100\nallow = 192.0.2.7:8050-9000\nallow = [2001:db8::/32]:443\n";
    let rs =
        ruleset_for(cfg, Inputs { publish: vec!["8000".into(), "8080:3000".into()], ..Inputs::default() });
    insta::assert_snapshot!(round_trip(&rs));
}

#[test]
fn no_gate_ruleset_round_trips() {
    let rs = ruleset_for("allow = 192.0.2.10:443\n", Inputs { no_gate: true, ..Inputs::default() });
    insta::assert_snapshot!(round_trip(&rs));
}

#[test]
fn address_budgets_are_quotas_whose_rules_come_before_established_connections() {
    let cfg = "allow = 192.0.2.0/24:443\nallow = 198.51.100.7:5432\nallow = [2001:db8::/32]:443\n\
               budget = 192.0.2.0/24 1m\nbudget = 198.51.100.7 6g\nbudget = 2001:db8::1 900k\n";
    let rs = ruleset_for(cfg, Inputs::default());
    let listed = round_trip(&rs);
    // Over 4 GiB: the size is not cut to 32 bits on the way (6g = 6442450944 bytes).
    assert!(listed.contains("quota budget_1 {\n\t\tover 6144 mbytes\n\t}"), "{listed}");
    let at = |needle: &str| listed.find(needle).unwrap_or_else(|| panic!("{needle} missing:\n{listed}"));
    let budget = at("ip daddr 192.0.2.0/24 tcp flags ! rst quota name \"budget_0\" add @refused_v4");
    assert!(at("oif \"lo\" accept") < budget, "a reset sent back to the sandbox is not counted");
    assert!(at("tcp dport 18081 accept") < budget, "the gate's traffic is not counted");
    assert!(budget < at("ct state established,related accept"), "every packet counts, not the first");
    assert!(listed.contains("ip6 daddr 2001:db8::1 tcp flags ! rst quota name \"budget_2\""), "{listed}");
    insta::assert_snapshot!(listed);
}

#[test]
fn ten_thousand_entries_load_as_set_elements_with_a_constant_rule_count() {
    let small = ruleset_for("allow = 10.0.0.1:443\n", Inputs::default());
    let cfg: String = (0..10_000u32)
        .map(|i| format!("allow = 10.{}.{}.{}:443\n", i >> 16, (i >> 8) & 255, i & 255))
        .collect();
    let big = ruleset_for(&cfg, Inputs::default());
    let filter = |rs: &ai_sandbox::plan::ruleset::Ruleset| rs.output.len() + rs.input.len();
    assert_eq!(filter(&big), filter(&small), "entries must be set elements, not rules");
    // Only the spliced destinations have rules of their own, and at most splice::MAX of them.
    assert_eq!((small.nat_output.len(), big.nat_output.len()), (1, ai_sandbox::policy::forwards::MAX));
    assert_eq!(big.sets[0].elements.len(), 10_000);
    let listed = load_and_list(&big.to_json_string(), true);
    assert!(listed.contains("10.0.39.15 . 443"), "last element missing from the loaded set");
    assert_eq!(
        listed.matches(" accept\n").count(),
        filter(&small) - 7,
        "accept rules (all but the splice guard, the two deny rejects, the two records and the two rejects)"
    );
}

#[test]
fn other_modes_have_no_ruleset() {
    for net in [NetMode::None, NetMode::Full] {
        let (cfg, _) = policy::keys::read("");
        let p = policy::build(PathBuf::from("/w/p"), &cfg, &Inputs { net: Some(net), ..Inputs::default() })
            .unwrap();
        assert!(ruleset::build(&p, p.gate_port).is_none());
    }
}
