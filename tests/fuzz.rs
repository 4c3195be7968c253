//! Fuzz targets for the config parser and the allow-entry parser. cargo-fuzz needs a nightly
//! toolchain, which these machines cannot fetch, so these are proptest properties run for a
//! bounded number of cases in CI (`PROPTEST_CASES`, default below); none may panic.

use ai_sandbox::config;
use ai_sandbox::policy::allow::{self, Allow};
use ai_sandbox::policy::{self, Inputs};
use proptest::prelude::*;
use std::path::PathBuf;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
}

/// Strings biased toward the characters that matter to the parsers.
fn entry_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9.:/*\\[\\]@_%-]{0,40}",
        "[0-9a-fx.:/]{0,30}",
        any::<String>(),
        "(\\*\\.)?([a-z0-9-]{1,8}\\.){1,3}[a-z]{2,4}(:[0-9]{1,6})?",
        "\\[?[0-9a-f:]{2,20}(/[0-9]{1,3})?\\]?(:[0-9-]{1,11})?",
    ]
}

fn config_like() -> impl Strategy<Value = String> {
    let names: Vec<String> = config::KEYS.iter().map(|(k, _, _)| k.to_string()).collect();
    let key = prop_oneof![prop::sample::select(names), "[a-z_]{1,8}"];
    let tail = prop::sample::select(vec!["", " # c", "\r"]);
    let line = (key, "[ \t]{0,2}=?[ \t]{0,2}", entry_like(), tail)
        .prop_map(|(k, eq, v, tail)| format!("{k}{eq}{v}{tail}"));
    prop_oneof![prop::collection::vec(line, 0..12).prop_map(|l| l.join("\n")), any::<String>(),]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn allow_parser_never_panics_and_normal_forms_are_fixed_points(s in entry_like()) {
        if let Ok(a) = allow::parse(&s) {
            // What we accept, printed back in its normal form, parses to the same entry.
            let printed = match &a {
                Allow::Host(h, None) => h.to_string(),
                Allow::Host(h, Some(p)) => format!("{h}:{p}"),
                Allow::Net(n, None) => n.to_string(),
                Allow::Net(n, Some(p)) if n.is_v4() => format!("{n}:{p}"),
                Allow::Net(n, Some(p)) => format!("[{n}]:{p}"),
            };
            prop_assert_eq!(allow::parse(&printed), Ok(a), "{} -> {}", s, printed);
        }
    }

    #[test]
    fn config_and_policy_never_panic(text in config_like()) {
        let (cfg, errs) = config::parse(&text);
        for e in &errs {
            prop_assert!(matches!(e.origin, ai_sandbox::error::Origin::Config(l) if l >= 1));
        }
        if let Ok(p) = policy::build(PathBuf::from("/w/p"), &cfg, &Inputs::default())
            && let Some(rs) = ai_sandbox::plan::ruleset::build(&p, p.gate_port)
        {
            prop_assert!(rs.to_text().starts_with("table inet ai_sandbox "), "text form");
            prop_assert!(rs.to_json_string().contains("\"policy\": \"drop\""), "json form");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// The gate's request parser never panics, and anything it accepts has a sane target.
    #[test]
    fn gate_request_parser_never_panics(
        line in prop_oneof![
            "(CONNECT|GET|POST|connect) [ -~]{0,40} HTTP/1\\.[01]",
            any::<String>(),
        ],
        headers in prop::collection::vec("[A-Za-z-]{1,12}:[ -~\t]{0,30}", 0..6),
        sep in prop::sample::select(vec!["\r\n", "\n", "\r", "\r\n "]),
        body in any::<Vec<u8>>(),
    ) {
        let mut raw = line.into_bytes();
        for h in &headers {
            raw.extend_from_slice(sep.as_bytes());
            raw.extend_from_slice(h.as_bytes());
        }
        raw.extend_from_slice(b"\r\n\r\n");
        raw.extend_from_slice(&body);
        if let Ok(r) = ai_sandbox::gate::request::parse(&raw) {
            prop_assert!(r.port > 0 && !r.host.is_empty() && r.head_len <= raw.len());
            let _ = ai_sandbox::gate::decide::normalise(&r.host);
        }
    }

    #[test]
    fn sni_parser_never_panics(mut bytes in any::<Vec<u8>>(), tls in any::<bool>()) {
        if tls && bytes.len() > 5 {
            bytes[0] = 0x16;
            bytes[1] = 3;
        }
        let _ = ai_sandbox::gate::tls::parse_client_hello(&bytes);
    }
}
