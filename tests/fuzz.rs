//! Fuzz targets for the parsers that read untrusted text: the config, allow entries, the gate's
//! request heads and TLS ClientHellos. cargo-fuzz needs a nightly
//! toolchain, which these machines cannot fetch, so these are proptest properties run for a
//! bounded number of cases in CI (`PROPTEST_CASES`, default below); none may panic.

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
    let names: Vec<String> = ai_sandbox::policy::keys::KEYS.iter().map(|k| k.name.to_string()).collect();
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
        let (cfg, errs) = policy::keys::read(&text);
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
}

/// A TLS record carrying a ClientHello with `sni` (none: no server_name extension).
fn client_hello(sni: Option<&str>) -> Vec<u8> {
    let mut ext = Vec::new();
    if let Some(name) = sni {
        let n = name.as_bytes();
        let list_len = (n.len() + 3) as u16;
        ext.extend_from_slice(&[0, 0]); // server_name
        ext.extend_from_slice(&(list_len + 2).to_be_bytes());
        ext.extend_from_slice(&list_len.to_be_bytes());
        ext.push(0); // host_name
        ext.extend_from_slice(&(n.len() as u16).to_be_bytes());
        ext.extend_from_slice(n);
    }
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
    body.extend_from_slice(&[1, 0]); // null compression
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// The gate reads the SNI from bytes the sandbox sends: any bytes, never a panic; "need
    /// more" always asks for more than it has (no loop on a stuck read).
    #[test]
    fn client_hello_parser_never_panics_and_always_makes_progress(
        buf in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..600),
            (prop::collection::vec(any::<u8>(), 0..200))
                .prop_map(|tail| [&[0x16u8, 3, 1][..], &tail].concat()),
        ]
    ) {
        use ai_sandbox::gate::tls::{Hello, parse_client_hello};
        if let Hello::NeedMore(n) = parse_client_hello(&buf) {
            prop_assert!(n > buf.len(), "needs {} with {} bytes", n, buf.len());
        }
    }

    /// A well-formed ClientHello gives its name (lowercased) only once complete: every strict
    /// prefix is "need more", never a name or a refusal; and a flipped byte never panics.
    #[test]
    fn client_hello_sni_is_read_whole_or_not_at_all(
        name in "[a-zA-Z0-9-]{1,20}(\\.[a-zA-Z0-9-]{1,20}){0,3}",
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        use ai_sandbox::gate::tls::{Hello, parse_client_hello};
        let rec = client_hello(Some(&name));
        prop_assert_eq!(parse_client_hello(&rec), Hello::Sni(Some(name.to_ascii_lowercase())));
        for cut in 0..rec.len() {
            prop_assert!(matches!(parse_client_hello(&rec[..cut]), Hello::NeedMore(_)), "prefix {}", cut);
        }
        prop_assert_eq!(parse_client_hello(&client_hello(None)), Hello::Sni(None));
        let mut bad = rec.clone();
        bad[flip.index(rec.len())] ^= 1 << bit;
        let _ = parse_client_hello(&bad);
    }

    /// A CONNECT the way clients write it parses to its own target and token.
    #[test]
    fn a_connect_head_parses_to_its_target(
        host in "[a-z0-9-]{1,20}(\\.[a-z0-9-]{1,12}){0,3}",
        port in 1u16..,
        token in "[0-9a-f]{32}",
    ) {
        use base64::Engine;
        let cred = base64::engine::general_purpose::STANDARD.encode(format!("aisb:{token}"));
        let head = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\nProxy-Authorization: Basic {cred}\r\n\r\n");
        let r = ai_sandbox::gate::request::parse(head.as_bytes()).unwrap();
        prop_assert_eq!((r.host.as_str(), r.port, r.token.as_deref(), r.head_len), (host.as_str(), port, Some(token.as_str()), head.len()));
    }
}

/// Request targets biased toward what path matching must not be fooled by: dots, slashes,
/// escapes (of dots, slashes, percent signs), semicolons, queries.
fn target_like() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "/", "//", ".", "..", "%2e", "%2E", "%2f", "%2F", "%25", "%5c", "%41", "%20", "%c3%a9", ";", "..;",
        "a", "b", "acme", "x.git", "?", "&", "=", "*", "%", "%zz", "~", "-", "@", ":",
    ]);
    prop_oneof![
        prop::collection::vec(piece, 0..14).prop_map(|v| format!("/{}", v.concat())),
        "/[a-z0-9./%;?&=_~-]{0,30}",
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// The path normaliser: a fixed point on its own output; what it accepts holds no `%` once
    /// decoded, so a server that decodes again sees the same bytes; and a rule matches the
    /// output exactly as it matches the input.
    #[test]
    fn path_normal_forms_are_fixed_points_and_a_second_decode_changes_nothing(t in target_like()) {
        use ai_sandbox::policy::{rule, url_path};
        let Ok(n) = url_path::normalise(&t) else { return Ok(()) };
        let again = url_path::normalise(&n.target());
        prop_assert_eq!(again.as_ref(), Ok(&n), "{} -> {}", t, n.target());
        for s in &n.segments {
            prop_assert!(!s.contains(&b'%') && !s.contains(&b'/'), "{} -> {:?}", t, n.segments);
            prop_assert!(s.as_slice() != b"." && s.as_slice() != b"..", "{}", t);
        }
        for pattern in ["/a/**", "/acme/*", "/**/x.git/**", "/a/b", "/*"] {
            let r = rule::parse(&format!("h.test GET {pattern}")).unwrap();
            let m = |x: &url_path::Normal| rule::allowing(&r, "h.test", "GET", x).is_some();
            prop_assert_eq!(m(&n), m(again.as_ref().unwrap()), "{} / {}", pattern, t);
        }
    }
}
