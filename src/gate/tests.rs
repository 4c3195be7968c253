//! The gate's pure stages over the threat classes of docs/threat-model.md: smuggling shapes and header
//! abuse, name tricks, IP spellings, ports, SSRF ranges, tokens, and SNI.

use super::decide::{self, SessionPolicy, Target};
use super::request::{self, HeadError, Kind};
use super::tls::{Hello, parse_client_hello};
use crate::policy::allow::{self, Allow, HostPattern, IpNet, Ports};
use base64::Engine;
use std::net::IpAddr;

fn auth(token: &str) -> String {
    format!(
        "Proxy-Authorization: Basic {}\r\n",
        base64::engine::general_purpose::STANDARD.encode(format!("aisb:{token}"))
    )
}

#[test]
fn request_heads_table() {
    use HeadError::*;
    let a = auth("tok");
    let bad = |why: &'static str| Err::<(), HeadError>(Bad(why));
    let cases: Vec<(String, Result<(), HeadError>)> = vec![
        (format!("CONNECT github.com:443 HTTP/1.1\r\nHost: github.com:443\r\n{a}\r\n"), Ok(())),
        (format!("CONNECT [2001:db8::1]:443 HTTP/1.1\r\n{a}\r\n"), Ok(())),
        (format!("GET http://example.com/x?y=1 HTTP/1.1\r\nHost: example.com\r\n{a}\r\n"), Ok(())),
        (format!("POST http://example.com:8080/ HTTP/1.1\r\nHost: example.com:8080\r\nContent-Length: 3\r\n{a}\r\nabc"), Ok(())),
        ("CONNECT github.com:443 HTTP/1.1\nHost: github.com\n\n".into(), bad("bare LF")),
        ("CONNECT github.com:443 HTTP/1.1\r\nHost: github.com\n\r\n".into(), bad("bare LF")),
        ("CONNECT github.com:443 HTTP/1.1\r\nX: a\rb\r\n\r\n".into(), bad("bare CR")),
        ("CONNECT github.com:443 HTTP/1.1\r\nX: a\0b\r\n\r\n".into(), bad("NUL byte in the request head")),
        ("CONNECT github.com:443 HTTP/1.1\r\nX: a\r\n b\r\n\r\n".into(), bad("obs-fold (a header line starting with whitespace)")),
        ("GET http://e.com/ HTTP/1.1\r\nHost: e.com\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx".into(), bad("two Content-Length headers")),
        ("GET http://e.com/ HTTP/1.1\r\nHost: e.com\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n".into(), bad("Content-Length with Transfer-Encoding")),
        ("POST http://e.com/ HTTP/1.1\r\nHost: e.com\r\nTransfer-Encoding: chunked\r\n\r\n".into(), Err(LengthRequired)),
        ("GET http://e.com/ HTTP/1.1\r\nHost: e.com\r\nContent-Length: -1\r\n\r\n".into(), bad("bad Content-Length")),
        ("GET http://e.com/ HTTP/1.1\r\nHost: e.com\r\nContent-Length: 1 2\r\n\r\n".into(), bad("bad Content-Length")),
        // A CONNECT may say its (empty) body is 0 bytes long.
        ("CONNECT a.com:443 HTTP/1.1\r\nContent-Length: 0\r\n\r\n".into(), Ok(())),
        // Nothing after the scheme: not a URI the gate forwards.
        ("GET http:// HTTP/1.1\r\nHost: e.com\r\n\r\n".into(), bad("only http:// URIs are forwarded (use CONNECT for https)")),
        // Digits only (Rust's parser would take `+5`), and at most 15 of them.
        ("GET http://e.com/ HTTP/1.1\r\nHost: e.com\r\nContent-Length: +5\r\n\r\n".into(), bad("bad Content-Length")),
        ("GET http://e.com/ HTTP/1.1\r\nHost: e.com\r\nContent-Length: 1000000000000000\r\n\r\n".into(), bad("bad Content-Length")),
        ("GET http://e.com/ HTTP/1.1\r\nHost: e.com\r\nContent-Length: 100000000000000\r\n\r\n".into(), Ok(())),
        ("GET /index.html HTTP/1.1\r\nHost: e.com\r\n\r\n".into(), bad("origin-form request: this is a proxy, send an absolute URI")),
        ("GET https://e.com/ HTTP/1.1\r\nHost: e.com\r\n\r\n".into(), bad("only http:// URIs are forwarded (use CONNECT for https)")),
        ("GET http://e.com/ HTTP/1.1\r\nHost: other.com\r\n\r\n".into(), bad("Host header does not match the URI")),
        ("GET http://e.com/ HTTP/1.1\r\nHost: e.com:81\r\n\r\n".into(), bad("Host header does not match the URI")),
        ("GET http://e.com/ HTTP/1.1\r\nHost: e.com\r\nHost: e.com\r\n\r\n".into(), bad("two Host headers")),
        ("GET http://e.com/ HTTP/1.1\r\n\r\n".into(), bad("no Host header")),
        ("GET http://user:pw@e.com/ HTTP/1.1\r\nHost: e.com\r\n\r\n".into(), bad("bad authority (empty, or contains userinfo)")),
        ("CONNECT github.com:443 HTTP/1.1\r\nHost: evil.com:443\r\n\r\n".into(), bad("Host header does not match the CONNECT target")),
        ("CONNECT github.com HTTP/1.1\r\n\r\n".into(), bad("CONNECT target needs a port")),
        ("CONNECT github.com:0 HTTP/1.1\r\n\r\n".into(), bad("bad port")),
        ("CONNECT github.com:99999 HTTP/1.1\r\n\r\n".into(), bad("bad port")),
        ("CONNECT github.com:+443 HTTP/1.1\r\n\r\n".into(), bad("bad port")),
        ("CONNECT 2001:db8::1:443 HTTP/1.1\r\n\r\n".into(), bad("IPv6 literals must be in brackets")),
        ("CONNECT github.com:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\n".into(), bad("CONNECT with a body")),
        ("CONNECT github.com:443 HTTP/2.0\r\n\r\n".into(), bad("malformed request head")),
        ("CONNECT github.com:443 HTTP/1.1\r\nBad Header: x\r\n\r\n".into(), bad("malformed request head")),
        (format!("CONNECT a.com:443 HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(65)), Err(TooLarge)),
        (format!("CONNECT a.com:443 HTTP/1.1\r\nX: {}\r\n\r\n", "y".repeat(17000)), Err(TooLarge)),
        ("CONNECT a.com:443 HTTP/1.1\r\nHost: a.com".into(), Err(Incomplete)),
        // A head cut right after a CR waits for the LF (the bare-CR check looks no further).
        ("CONNECT a.com:443 HTTP/1.1\r\nHost: a.com\r".into(), Err(Incomplete)),
        ("CONNECT a.com:443 HTTP/1.1\r".into(), Err(Incomplete)),
        // 16 KiB with no end of head yet: too large now, not read on.
        (format!("CONNECT a.com:443 HTTP/1.1\r\nX: {}", "y".repeat(16 * 1024)), Err(TooLarge)),
        // The head limit is 16 KiB: a 15 KiB header is taken whole.
        (format!("CONNECT a.com:443 HTTP/1.1\r\nX: {}\r\n\r\n", "y".repeat(15 * 1024)), Ok(())),
    ];
    for (input, want) in cases {
        let got = request::parse(input.as_bytes()).map(|_| ());
        assert_eq!(got, want, "input {input:?}");
    }
}

#[test]
fn tokens_come_from_basic_proxy_authorization_only() {
    let parse =
        |h: &str| request::parse(format!("CONNECT a.com:443 HTTP/1.1\r\n{h}\r\n").as_bytes()).unwrap().token;
    assert_eq!(parse(&auth("s3cret")), Some("s3cret".into()));
    assert_eq!(parse("Proxy-Authorization: Bearer s3cret\r\n"), None);
    assert_eq!(parse("Proxy-Authorization: Basic !!!notbase64\r\n"), None);
    assert_eq!(
        parse("Authorization: Basic YWlzYjpzM2NyZXQ=\r\n"),
        None,
        "origin credentials are not proxy credentials"
    );
    assert_eq!(parse(""), None);
}

#[test]
fn forwarded_requests_are_rewritten_to_origin_form() {
    let raw = format!(
        "GET http://Example.com/a/b?q=1#frag HTTP/1.1\r\nHost: example.com\r\n{}Proxy-Connection: keep-alive\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n",
        auth("t")
    );
    let r = request::parse(raw.as_bytes()).unwrap();
    assert_eq!((r.kind, r.host.as_str(), r.port), (Kind::Forward, "Example.com", 80));
    // The view (what rules read) has every header as sent but the session's token.
    let v = r.view("example.com");
    assert_eq!((v.method, v.host, v.target), ("GET", "example.com", "/a/b?q=1"));
    let names: Vec<&str> = v.headers.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["host", "proxy-connection", "connection", "accept"]);
    assert_eq!(v.body, crate::gate::view::Framing::Length(0));
    let up = String::from_utf8(r.upstream_head).unwrap();
    assert_eq!(up, "GET /a/b?q=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    // A query straight after the authority gets its `/`.
    let r = request::parse(b"GET http://e.com?x=1 HTTP/1.1\r\nHost: e.com\r\n\r\n").unwrap();
    assert!(
        r.upstream_head.starts_with(b"GET /?x=1 HTTP/1.1\r\n"),
        "{}",
        String::from_utf8_lossy(&r.upstream_head)
    );
}

/// A 253-character name (four labels of 62 and one of 1) and one character more.
static LONGEST: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{0}.{0}.{0}.{0}.a", "b".repeat(62)));
static TOO_LONG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| format!("{}a", &*LONGEST));

#[test]
fn targets_normalise_to_one_spelling() {
    assert_eq!((LONGEST.len(), TOO_LONG.len()), (253, 254));
    let ip = |s: &str| Ok(Target::Ip(s.parse().unwrap()));
    let name = |s: &str| Ok(Target::Name(s.into()));
    let cases: Vec<(&str, Result<Target, ()>)> = vec![
        ("GitHub.COM.", name("github.com")),
        ("api.github.com", name("api.github.com")),
        ("xn--bcher-kva.example", name("xn--bcher-kva.example")),
        ("127.0.0.1", ip("127.0.0.1")),
        ("127.1", ip("127.0.0.1")),
        ("0x7f.1", ip("127.0.0.1")),
        ("0x7F000001", ip("127.0.0.1")),
        ("017700000001", ip("127.0.0.1")),
        ("2130706433", ip("127.0.0.1")),
        ("0177.0.0.1", ip("127.0.0.1")),
        ("127.0.1", ip("127.0.0.1")),
        ("0251.0376.0251.0376", ip("169.254.169.254")),
        ("::ffff:127.0.0.1", ip("127.0.0.1")),
        ("::ffff:7f00:1", ip("127.0.0.1")),
        ("2001:DB8::1", ip("2001:db8::1")),
        ("1.2.3.256", Err(())),
        // Each part at its bound: 255 is the largest non-final part, the final one fills the rest.
        ("255.0.0.1", ip("255.0.0.1")),
        ("256.0.0.1", Err(())),
        ("1.255.0.1", ip("1.255.0.1")),
        ("1.256.0.1", Err(())),
        ("1.2.65535", ip("1.2.255.255")),
        ("1.2.65536", Err(())),
        ("1.16777215", ip("1.255.255.255")),
        ("1.16777216", Err(())),
        // A part longer than any address needs, even zero-padded, is not an address.
        ("000000000001.2.3.4", ip("1.2.3.4")),
        ("0000000000001.2.3.4", Err(())),
        ("4294967296", Err(())),
        ("1.2.3.4.5", Err(())),
        ("0x", Err(())),
        ("bücher.example", Err(())),
        ("a..b", Err(())),
        // 253 characters is the longest name DNS carries.
        (&*LONGEST, Ok(Target::Name(LONGEST.clone()))),
        (&*TOO_LONG, Err(())),
        ("evil.com%00.github.com", Err(())),
        ("exa mple.com", Err(())),
        ("-lead.example", Err(())),
    ];
    for (input, want) in cases {
        assert_eq!(decide::normalise(input).map_err(|_| ()), want, "input {input:?}");
    }
    // How a target is written back in reasons and hints: IPv6 in brackets (it takes a port).
    let shown = |s: &str| decide::normalise(s).unwrap().to_string();
    assert_eq!(
        (shown("GitHub.com"), shown("2001:db8::1"), shown("10.0.0.1")),
        ("github.com".into(), "[2001:db8::1]".into(), "10.0.0.1".into())
    );
}

fn policy(lines: &[&str]) -> SessionPolicy {
    let mut p = SessionPolicy { config_path: "/p/.ai-sandbox/config".into(), ..SessionPolicy::default() };
    for l in lines {
        match allow::parse(l).unwrap() {
            Allow::Host(h, ports) => p.allow.hosts.push((h, ports)),
            Allow::Net(n, ports) => p.allow.nets.push((n, ports.unwrap_or(Ports::ALL))),
        }
    }
    p
}

#[test]
fn allowlist_matching_table() {
    let p = policy(&["github.com", "*.npmjs.org", "api.example.com:8080", "192.0.2.0/24:443"]);
    let cases: Vec<(&str, u16, bool)> = vec![
        ("github.com", 443, true),
        ("GITHUB.com.", 443, true),
        ("github.com", 80, true),
        ("github.com", 8443, true),
        ("github.com", 22, false),
        ("github.com", 8080, false),
        ("api.github.com", 443, false),
        ("github.com.evil.com", 443, false),
        ("evilgithub.com", 443, false),
        ("registry.npmjs.org", 443, true),
        ("a.b.npmjs.org", 443, true),
        ("npmjs.org", 443, false),
        ("evilnpmjs.org", 443, false),
        ("npmjs.org.evil.com", 443, false),
        ("api.example.com", 8080, true),
        ("api.example.com", 443, false),
        ("192.0.2.7", 443, true),
        ("192.0.2.7", 80, false),
        ("192.0.3.7", 443, false),
        ("3221225991", 443, true),
        // Strictly below the suffix: the empty label before it is no name (normalise never
        // makes one; the matcher refuses it on its own too).
        (".npmjs.org", 443, false),
    ];
    for (host, port, want) in cases {
        let t = decide::normalise(host).unwrap_or_else(|_| Target::Name(host.into()));
        assert_eq!(decide::check_target(&p, &t, port).is_ok(), want, "{host}:{port}");
    }
}

#[test]
fn denials_name_the_config_line_that_would_allow_them() {
    let p = policy(&[]);
    let t = decide::normalise("api.example.com").unwrap();
    let d = decide::check_target(&p, &t, 443).unwrap_err();
    assert_eq!(d.status, 403);
    assert_eq!(d.hint, "blocked by ai-sandbox: add \"allow = api.example.com\" to /p/.ai-sandbox/config");
    // Only the allowlist said no: a watcher may be asked, and the line is a field of its own.
    assert_eq!((d.allow.as_deref(), d.askable), (Some("api.example.com"), true));
    let d = decide::check_target(&p, &t, 22).unwrap_err();
    assert!(d.hint.contains("\"allow = api.example.com:22\""), "{}", d.hint);
}

#[test]
fn an_address_with_a_budget_is_not_relayed_where_its_count_would_miss_it() {
    let mut p = policy(&["198.51.100.7:443", "203.0.113.0/24", "100.64.0.1:5432"]);
    let line = |v: &str| match crate::policy::budget::parse(v).unwrap() {
        crate::policy::budget::Line::Net(b) => b,
        crate::policy::budget::Line::Host(_) => unreachable!(),
    };
    let ip = |s: &str| decide::normalise(s).unwrap();
    // Control: without an address budget the gate relays the entries.
    for (t, port) in [("198.51.100.7", 443), ("203.0.113.9", 22), ("100.64.0.1", 5432)] {
        assert!(decide::check_target(&p, &ip(t), port).is_ok(), "{t}");
    }
    p.net_budgets = vec![line("198.51.100.7 1m"), line("203.0.113.0/24 2m"), line("100.64.0.1 1m")];
    for (t, port) in
        [("198.51.100.7", 443), ("203.0.113.9", 22), ("100.64.0.1", 5432), ("::ffff:198.51.100.7", 443)]
    {
        let d = decide::check_target(&p, &ip(t), port).unwrap_err();
        assert_eq!(d.status, 403, "{t}");
        assert!(d.reason.contains("has an address budget") && d.hint.contains("NO_PROXY"), "{t}: {d:?}");
        assert!(!d.askable, "a watcher cannot let it around its count");
    }
    assert!(decide::check_target(&p, &ip("198.51.100.8"), 443).is_err(), "not allowed anyway");
    assert!(decide::check_target(&p, &ip("example.com"), 443).is_err());
}

#[test]
fn a_learning_run_relays_only_unlisted_hostnames_on_the_gates_ports() {
    let mut p = policy(&["listed.test"]);
    p.allow.deny_hosts.push((HostPattern::Exact("denied.test".into()), None));
    p.rules = crate::policy::rule::parse("ruled.test GET /x").unwrap();
    let learns = |p: &SessionPolicy, host: &str, port: u16| {
        let t = decide::normalise(host).unwrap();
        match decide::check_target(p, &t, port) {
            Ok(()) => None,
            Err(d) => Some(decide::learns(p, &t, port, &d)),
        }
    };
    // Not a learning run: refused, as always.
    assert_eq!(learns(&p, "new.test", 443), Some(false));
    p.learn = true;
    assert_eq!(learns(&p, "listed.test", 443), None, "listed: allowed, not learned");
    assert_eq!(learns(&p, "new.test", 443), Some(true));
    assert_eq!(learns(&p, "new.test", 80), Some(true));
    assert_eq!(learns(&p, "new.test", 22), Some(false), "not a gate port");
    assert_eq!(learns(&p, "denied.test", 443), Some(false), "a deny line wins");
    assert_eq!(learns(&p, "ruled.test", 443), Some(false), "a host with rules is the config's");
    assert_eq!(learns(&p, "198.51.100.7", 443), Some(false), "an address is never learned");
    assert_eq!(learns(&p, "127.0.0.1", 443), Some(false));
}

#[test]
fn address_classes_table() {
    let p = policy(&["10.1.2.3:443", "[fd00:1::/64]:443"]);
    let cases: Vec<(&str, u16, bool)> = vec![
        ("127.0.0.1", 443, false),
        ("127.255.0.9", 443, false),
        ("::1", 443, false),
        ("::ffff:127.0.0.1", 443, false),
        ("169.254.169.254", 80, false),
        ("169.254.1.2", 443, false),
        ("fe80::1", 443, false),
        ("0.0.0.0", 443, false),
        ("0.1.2.3", 443, false),
        ("::", 443, false),
        ("224.0.0.1", 443, false),
        ("255.255.255.255", 443, false),
        ("240.0.0.1", 443, false),
        ("ff02::1", 443, false),
        ("10.0.0.1", 443, false),
        ("10.1.2.3", 443, true),
        ("10.1.2.3", 80, false),
        ("172.16.0.1", 443, false),
        ("172.31.255.255", 443, false),
        ("172.32.0.1", 443, true),
        ("192.168.1.1", 443, false),
        ("100.64.0.1", 443, false),
        ("100.127.255.255", 443, false),
        ("fc00::1", 443, false),
        ("fd00:1::5", 443, true),
        ("64:ff9b::a00:1", 443, false),
        ("198.51.100.7", 443, true),
        ("2001:db8::1", 443, true),
    ];
    for (ip, port, want) in cases {
        let addr: IpAddr = ip.parse().unwrap();
        assert_eq!(decide::check_address(&p, addr, port).is_ok(), want, "{ip}:{port}");
    }
    // Never dialled whatever the allowlist says, even an entry naming the very address.
    // (The parser refuses loopback entries; a policy is built here as if one had got through.)
    let mut wide = policy(&["169.254.169.254:80", "198.51.100.0/24:443"]);
    for a in ["127.0.0.1", "::1"] {
        wide.allow.nets.push((IpNet::host(a.parse().unwrap()), Ports::one(443)));
    }
    let refused = |a: &str, port| decide::check_address(&wide, a.parse().unwrap(), port).unwrap_err();
    // The sandbox itself, as its containers reach it: said as that, with why it came here.
    let own = refused("169.254.1.3", 18081);
    assert!(
        own.hint.contains("169.254.1.3 is the sandbox itself") && own.hint.contains("NO_PROXY"),
        "{}",
        own.hint
    );
    assert!(
        !refused("169.254.1.2", 443).hint.contains("the sandbox itself"),
        "pasta's host alias is another thing"
    );
    let metadata = refused("169.254.169.254", 80);
    assert!(
        metadata.reason.contains("the cloud metadata service, which the gate never dials"),
        "{}",
        metadata.reason
    );
    assert!(!metadata.hint.contains("127.0.0.1:PORT"), "{}", metadata.hint);
    // Loopback says how to reach the host's services instead.
    for a in ["127.0.0.1", "::1"] {
        assert!(
            refused(a, 443).hint.contains("to reach the host's 127.0.0.1:PORT, allow 100.64.0.1:PORT"),
            "{a}"
        );
    }
    assert!(decide::check_address(&wide, "198.51.100.7".parse().unwrap(), 443).is_ok(), "positive control");
}

#[test]
fn tokens_are_compared_in_constant_time_and_exactly() {
    let tokens = ["aaaa1111", "bbbb2222"];
    assert_eq!(decide::authenticate(&tokens, Some("bbbb2222")), Some(1));
    assert_eq!(decide::authenticate(&tokens, Some("aaaa1111")), Some(0));
    assert_eq!(decide::authenticate(&tokens, Some("aaaa111")), None, "a prefix is not the token");
    assert_eq!(decide::authenticate(&tokens, Some("aaaa11111")), None);
    assert_eq!(decide::authenticate(&tokens, Some("")), None);
    assert_eq!(decide::authenticate(&tokens, None), None);
    assert_eq!(decide::authenticate(&[], Some("x")), None);
    assert!(decide::ct_eq(b"abc", b"abc") && !decide::ct_eq(b"abc", b"abd"));
}

/// A minimal TLS 1.2-style ClientHello with optional SNI entries.
fn client_hello(snis: &[&str]) -> Vec<u8> {
    client_hello_padded(snis, 0)
}

/// The same with a padding extension of `pad` bytes (post-quantum key shares make real
/// ClientHellos over 1 KiB).
fn client_hello_padded(snis: &[&str], pad: usize) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend([7u8; 32]);
    body.push(0); // session id
    body.extend([0, 2, 0x13, 0x01]); // one cipher suite
    body.extend([1, 0]); // null compression
    let mut exts = Vec::new();
    for sni in snis {
        let name = sni.as_bytes();
        let mut list = vec![0u8];
        list.extend((name.len() as u16).to_be_bytes());
        list.extend(name);
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend(list);
        exts.extend([0, 0]);
        exts.extend((data.len() as u16).to_be_bytes());
        exts.extend(data);
    }
    exts.extend([0, 0x2b, 0, 3, 2, 3, 4]); // supported_versions
    if pad > 0 {
        exts.extend([0, 0x15]);
        exts.extend((pad as u16).to_be_bytes());
        exts.extend(vec![0u8; pad]);
    }
    body.extend((exts.len() as u16).to_be_bytes());
    body.extend(exts);
    let mut hs = vec![1];
    hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend(body);
    let mut rec = vec![0x16, 3, 1];
    rec.extend((hs.len() as u16).to_be_bytes());
    rec.extend(hs);
    rec
}

#[test]
fn sni_is_read_from_the_client_hello() {
    assert_eq!(parse_client_hello(&client_hello(&["GitHub.com"])), Hello::Sni(Some("github.com".into())));
    assert_eq!(parse_client_hello(&client_hello(&[])), Hello::Sni(None));
    assert!(
        matches!(parse_client_hello(&client_hello(&["a.com", "b.com"])), Hello::NotTls(_)),
        "two SNI are ambiguous"
    );
    let full = client_hello(&["github.com"]);
    assert!(matches!(parse_client_hello(&full[..20]), Hello::NeedMore(n) if n == full.len()));
    assert!(matches!(parse_client_hello(&full[..3]), Hello::NeedMore(5)));
    assert!(matches!(parse_client_hello(b"GET / HTTP/1.1\r\n\r\n"), Hello::NotTls(_)));
    // The same handshake split over two records.
    let hs = &full[5..];
    let (a, b) = hs.split_at(30);
    let mut two = vec![0x16, 3, 1];
    two.extend((a.len() as u16).to_be_bytes());
    two.extend(a);
    two.extend([0x16, 3, 1]);
    two.extend((b.len() as u16).to_be_bytes());
    two.extend(b);
    assert_eq!(parse_client_hello(&two), Hello::Sni(Some("github.com".into())));
    // A large one (4 KB, as with post-quantum key shares) is read whole.
    assert_eq!(
        parse_client_hello(&client_hello_padded(&["github.com"], 4000)),
        Hello::Sni(Some("github.com".into()))
    );
    // A record header alone: the length it announces is what is needed next.
    assert_eq!(parse_client_hello(&[0x16, 3, 1, 0, 10]), Hello::NeedMore(15));
    // A record of length 0, or longer than TLS allows, is not TLS.
    for len in [0u16, 16384 + 257] {
        let rec = [&[0x16, 3, 1][..], &len.to_be_bytes()[..], &vec![1u8; len as usize][..]].concat();
        assert_eq!(parse_client_hello(&rec), Hello::NotTls("bad TLS record length"), "length {len}");
    }
    // A ClientHello may be 64 KiB (header included) and no more: said by its header at once...
    let header = |need: u32| [&[0x16, 3, 1, 0, 4, 1][..], &(need - 4).to_be_bytes()[1..]].concat();
    assert_eq!(parse_client_hello(&header(64 * 1024)), Hello::NeedMore(9 + 5));
    assert_eq!(parse_client_hello(&header(64 * 1024 + 1)), Hello::NotTls("ClientHello too large"));
    // ...and by the records read: 64 KiB of them without the whole hello is the end.
    let records = |total: usize| {
        let mut data = [&[1u8, 0, 0xff, 0xfc][..], &vec![0u8; total - 4 * 5 - 4][..]].concat();
        let mut out = Vec::new();
        while !data.is_empty() {
            let chunk: Vec<u8> = data.drain(..data.len().min(16384)).collect();
            out.extend([0x16, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        assert_eq!(out.len(), total);
        out
    };
    assert_eq!(parse_client_hello(&records(64 * 1024)), Hello::NeedMore(64 * 1024 + 5));
    assert_eq!(parse_client_hello(&records(64 * 1024 + 1)), Hello::NotTls("ClientHello too large"));
    // The largest length TLS allows (2^14 + 256) is a record.
    let rec = [&[0x16, 3, 1][..], &(16384u16 + 256).to_be_bytes()[..]].concat();
    assert_eq!(parse_client_hello(&rec), Hello::NeedMore(5 + 16384 + 256));
}

#[test]
fn pinned_names_and_net_entries_serialise_for_the_control_socket() {
    let mut p = policy(&["allowed.test", "10.0.0.0/8:443"]);
    p.resolve.push(("allowed.test".into(), "198.51.100.6".parse().unwrap()));
    let json = serde_json::to_string(&p).unwrap();
    let back: SessionPolicy = serde_json::from_str(&json).unwrap();
    assert_eq!(back, p);
    assert_eq!(decide::pinned(&back.resolve, "allowed.test"), Some("198.51.100.6".parse().unwrap()));
    assert!(back.allow.nets.iter().any(|(n, _)| *n == IpNet::masked("10.0.0.0".parse().unwrap(), 8)));
}

#[test]
fn a_refusals_hint_is_a_safe_reason_phrase() {
    let hint = "blocked by ai-sandbox: add \"allow = a.test\" to /p/.ai-sandbox/config";
    assert_eq!(decide::reason_phrase(hint), hint);
    assert_eq!(decide::reason_phrase("x\r\nInjected: 1"), "x??Injected: 1");
    assert_eq!(decide::reason_phrase(""), "Forbidden");
    let long = "é".repeat(300);
    let r = decide::reason_phrase(&long);
    assert!(r.len() == 400 && r.chars().all(|c| c == 'é'));
    // Byte 400 inside a character: cut at the boundary before it, never past it.
    let r = decide::reason_phrase(&format!("a{long}"));
    assert_eq!((r.len(), r.chars().last()), (399, Some('é')));
}

#[test]
fn deny_entries_win_over_allow_entries_for_names_and_addresses() {
    let mut p = policy(&["*.github.com", "198.51.100.0/24"]);
    p.allow.deny_hosts.push((allow::HostPattern::Exact("gist.github.com".into()), None));
    p.allow.deny_nets.push((IpNet { addr: "198.51.100.7".parse().unwrap(), len: 32 }, Ports::one(22)));
    let name = |n: &str| Target::Name(n.into());
    assert!(decide::check_target(&p, &name("api.github.com"), 443).is_ok(), "positive control");
    let d = decide::check_target(&p, &name("gist.github.com"), 443).unwrap_err();
    assert!(d.reason.contains("denied by `deny = gist.github.com`"), "{}", d.reason);
    assert_eq!((d.allow.as_deref(), d.askable), (None, false), "a deny line is never asked about");
    assert!(d.hint.contains("refused by \"deny = gist.github.com\""), "{}", d.hint);
    let ip = |a: &str| Target::Ip(a.parse().unwrap());
    assert!(decide::check_target(&p, &ip("198.51.100.7"), 443).is_ok(), "another port of the denied address");
    assert!(decide::check_target(&p, &ip("198.51.100.7"), 22).is_err());
    // A name that resolves into a denied range is refused after the lookup too.
    assert!(decide::check_address(&p, "198.51.100.7".parse().unwrap(), 22).is_err());
    assert!(decide::check_address(&p, "198.51.100.8".parse().unwrap(), 22).is_ok());
}

#[test]
fn an_allowed_host_loopback_port_is_relayed_and_no_other_is() {
    let p = policy(&["100.64.0.1:9090", "198.51.100.7:443"]);
    let t = decide::normalise("100.64.0.1").unwrap();
    assert!(decide::check_target(&p, &t, 9090).is_ok(), "allowed: a client that did not bypass the proxy");
    assert!(decide::host_loopback(&p, "100.64.0.1".parse().unwrap(), 9090));
    assert!(decide::host_loopback(&p, "::ffff:100.64.0.1".parse().unwrap(), 9090), "the mapped spelling");
    let d = decide::check_target(&p, &t, 9091).unwrap_err();
    assert!(d.hint.contains("add \"allow = 100.64.0.1:9091\""), "{}", d.hint);
    // Said as gate_addr (not as any address outside the allowlist), with the line as a field,
    // and not put to a watcher: the host's own services are never asked about.
    assert!(d.reason.contains("is gate_addr, the host's loopback mapping"), "{}", d.reason);
    assert_eq!((d.allow.as_deref(), d.askable), (Some("100.64.0.1:9091"), false));
    assert!(!decide::host_loopback(&p, "100.64.0.1".parse().unwrap(), 9091));
    assert!(!decide::host_loopback(&p, "198.51.100.7".parse().unwrap(), 443), "not the host's loopback");
    assert!(!decide::host_loopback(&p, "127.0.0.1".parse().unwrap(), 9090), "loopback itself never");
    // A deny entry wins here too.
    let mut denied = p.clone();
    denied.allow.deny_nets.push((IpNet::host("100.64.0.1".parse().unwrap()), Ports::one(9090)));
    assert!(decide::check_target(&denied, &t, 9090).unwrap_err().hint.contains("deny = 100.64.0.1:9090"));
}

#[test]
fn a_tls_tunnel_must_name_its_connect_host_and_nothing_else() {
    let name = |n: &str| Target::Name(n.into());
    let ip = Target::Ip("192.0.2.7".parse().unwrap());
    let sni = |s: &str| Hello::Sni(Some(s.into()));
    let cases: Vec<(Hello, Target, Result<(), &str>)> = vec![
        (sni("github.com"), name("github.com"), Ok(())),
        (Hello::Sni(None), ip.clone(), Ok(())),
        // Domain fronting: the tunnel to an allowed host carries TLS for another.
        (
            sni("evil.example"),
            name("github.com"),
            Err("TLS SNI `evil.example` differs from the CONNECT host github.com"),
        ),
        (sni("github.com"), ip.clone(), Err("TLS SNI `github.com` differs from the CONNECT host 192.0.2.7")),
        (Hello::Sni(None), name("github.com"), Err("TLS ClientHello without SNI")),
        (Hello::NotTls("no handshake"), name("github.com"), Err("not TLS on a TLS port: no handshake")),
        (Hello::NeedMore(20000), name("github.com"), Err("ClientHello too large")),
    ];
    for (hello, target, want) in cases {
        let got = decide::sni_verdict(&hello, &target);
        assert_eq!(
            got.as_ref().map_err(String::as_str),
            want.as_ref().map_err(|e| *e),
            "{hello:?} for {target}"
        );
    }
}

#[test]
fn a_missing_token_is_a_challenge_and_a_bad_token_a_refusal() {
    use crate::gate::log::Decision::{Challenge, Deny};
    // No credentials yet: clients retry with them (git, pip), so it is not a refusal.
    let (kind, why) = decide::unauthenticated(false);
    assert_eq!(kind, Challenge);
    assert!(why.contains("no proxy credentials yet"), "{why}");
    // Credentials that do not match are: an old or stolen token.
    let (kind, why) = decide::unauthenticated(true);
    assert_eq!(kind, Deny);
    assert!(why.contains("wrong or expired session token"), "{why}");
}

/// The rules' verdict on a plain request, through the view the parser builds (`Request::view`).
fn check(
    p: &SessionPolicy,
    host: &str,
    method: &str,
    target: &str,
) -> Result<Option<decide::RuleMatch>, decide::Denial> {
    let raw = format!("{method} http://{host}{target} HTTP/1.1\r\nHost: {host}\r\n\r\n");
    decide::check_request(p, &request::parse(raw.as_bytes()).unwrap().view(host))
}

#[test]
fn a_push_limited_by_ref_carries_its_patterns_and_an_unlimited_rule_lifts_the_limit() {
    let mut p = policy(&["git.test"]);
    p.rules =
        crate::policy::rule::parse("git.test git-push /a/r.git refs/heads/agent/* refs/tags/v*").unwrap();
    let push = |p: &SessionPolicy| check(p, "git.test", "POST", "/a/r.git/git-receive-pack");
    let refs = push(&p).unwrap().unwrap().refs;
    assert_eq!(refs, Some(vec!["refs/heads/agent/*".to_string(), "refs/tags/v*".to_string()]));
    // The ref advertisement is not limited (it reads, it does not push).
    let advert = check(&p, "git.test", "GET", "/a/r.git/info/refs?service=git-receive-pack");
    assert_eq!(advert.unwrap().unwrap().refs, None);
    // Two limited rules: their patterns together; an unlimited one for the repository: no limit.
    p.rules.extend(crate::policy::rule::parse("git.test git-push /a/* refs/heads/fix/*").unwrap());
    assert_eq!(push(&p).unwrap().unwrap().refs.map(|r| r.len()), Some(3));
    p.rules.extend(crate::policy::rule::parse("git.test git-push /a/r.git").unwrap());
    assert_eq!(push(&p).unwrap().unwrap().refs, None);
}

#[test]
fn a_host_with_rules_gets_what_they_allow_and_a_refusal_names_the_line() {
    let mut p = policy(&["api.test", "free.test"]);
    p.rules = crate::policy::rule::parse("api.test GET /repos/**").unwrap();
    // No rules for the host: allowed whole, nothing rewritten.
    assert_eq!(check(&p, "free.test", "DELETE", "/anything"), Ok(None));
    // Allowed: the one spelling, the method in capitals, the rule's line.
    let m = check(&p, "api.test", "get", "/repos//a/./b?x=1").unwrap().unwrap();
    assert_eq!(
        m,
        decide::RuleMatch {
            method: "GET".into(),
            target: "/repos/a/b?x=1".into(),
            path: "/repos/a/b".into(),
            rule: "api.test GET /repos/**".into(),
            refs: None,
            tools: None,
        }
    );
    // Refused: 403, askable, the line to add, the path for the log.
    let d = check(&p, "api.test", "POST", "/repos/a?x=1").unwrap_err();
    assert_eq!((d.status, d.askable), (403, true));
    assert_eq!(d.allow.as_deref(), Some("rule = api.test POST /repos/a"));
    assert_eq!(d.path.as_deref(), Some("/repos/a"));
    assert_eq!(d.reason, "POST /repos/a matches no rule for api.test");
    assert_eq!(
        d.hint,
        "blocked by ai-sandbox: add \"rule = api.test POST /repos/a\" to /p/.ai-sandbox/config (api.test has rules, and none allows POST /repos/a)"
    );
    // A `*` in the path, as sent or as %2A: a line would read it as a pattern and allow more
    // than this request, so none is offered and it is not asked about.
    for star in ["/repos/a*", "/x/%2A"] {
        let d = check(&p, "api.test", "POST", star).unwrap_err();
        assert_eq!((d.status, d.askable, d.allow.clone()), (403, false, None), "{star}");
        assert!(d.hint.contains("no line is offered") && d.path.as_deref().unwrap().contains('*'), "{d:?}");
    }
    // A spelling the gate would have to guess about: 400, never asked about.
    let d = check(&p, "api.test", "GET", "/repos/a%2Fb").unwrap_err();
    assert_eq!((d.status, d.askable, d.allow.clone()), (400, false, None));
    assert!(d.reason.contains("encoded slash") && d.hint.contains("does not guess"), "{d:?}");
    // A watcher's "once" for a rule refusal adds that rule to the policy it decides with.
    let once =
        decide::with_once(&p, &Target::Name("api.test".into()), 443, Some("rule = api.test POST /repos/a"));
    assert!(check(&once, "api.test", "POST", "/repos/a").unwrap().is_some());
    let plain = decide::with_once(&p, &Target::Name("api.test".into()), 443, Some("api.test"));
    assert_eq!(plain.rules, p.rules);
}

#[test]
fn a_tunnel_to_a_port_where_requests_cannot_be_read_is_refused_for_a_host_with_rules() {
    let mut p = policy(&["api.test:1-65535", "free.test:1-65535"]);
    p.rules = crate::policy::rule::parse("api.test GET /").unwrap();
    let t = |n: &str| Target::Name(n.into());
    let d = decide::unreadable(&p, &t("api.test"), 22, &[443, 8443]).unwrap_err();
    assert_eq!(d.status, 403);
    assert_eq!(d.reason, "api.test has rules, and a tunnel to port 22 would hide its requests");
    assert!(d.hint.contains("not in a tunnel to port 22"), "{d:?}");
    // Controls: the TLS ports (terminated), a host without rules, an address.
    assert_eq!(decide::unreadable(&p, &t("api.test"), 443, &[443, 8443]), Ok(()));
    assert_eq!(decide::unreadable(&p, &t("api.test"), 8443, &[443, 8443]), Ok(()));
    assert_eq!(decide::unreadable(&p, &t("free.test"), 22, &[443, 8443]), Ok(()));
    assert_eq!(decide::unreadable(&p, &Target::Ip("192.0.2.1".parse().unwrap()), 22, &[443]), Ok(()));
}

#[test]
fn a_path_the_gate_would_guess_about_is_refused_with_what_is_wrong() {
    use crate::policy::url_path::normalise;
    for (target, why) in [
        ("/a\\b", "a backslash in the path"),
        ("/a b", "a character that a URL path cannot hold unencoded"),
        ("/a%2Fb", "an encoded slash or backslash (%2F, %5C)"),
        ("/a%25b", "an encoded percent sign (%25): a double-encoded path"),
        ("/a%0a", "an encoded control character"),
        ("/a%4", "a `%` not followed by two hex digits"),
        ("/..;/x", "a dot segment with parameters (`..;`)"),
        ("/..", "a `..` above the root"),
        ("a", "the request target is not a path (`/...`)"),
        ("/a?b c", "a character that a URL query cannot hold unencoded"),
    ] {
        assert_eq!(normalise(target).map(|n| n.target()), Err(why), "{target}");
    }
}

#[test]
fn a_rules_query_key_is_written_out_and_never_empty() {
    use crate::policy::rule::parse;
    for bad in ["a.test GET /x?=1", "a.test GET /x?%41=1", "a.test GET /x?k*=1", "a.test GET /x?k=%41"] {
        let e = parse(bad).expect_err(bad);
        assert!(e.0.contains("a query is `key=value` pairs"), "{bad}: {}", e.0);
    }
    assert_eq!(
        parse("a.test GET /x?k=1&j").unwrap()[0].query,
        vec![("k".into(), "1".into()), ("j".into(), "".into())]
    );
}

#[test]
fn a_terminated_request_must_name_its_connections_host() {
    use request::names_host;
    let ok =
        |authority: Option<&str>, host: Option<Option<&str>>| names_host(authority, host, "api.test", 443);
    // Case, a trailing dot, the port said or not, space around: the same name.
    for h in ["api.test", "API.Test.", "api.test:443", " api.test ", "api.test.:443"] {
        assert_eq!(ok(None, Some(Some(h))), Ok(()), "{h}");
    }
    // HTTP/2: `:authority` alone.
    assert_eq!(ok(Some("api.test:443"), None), Ok(()));
    assert_eq!(ok(Some("api.test"), Some(Some("api.test"))), Ok(()));
    for h in ["other.test", "other.test:443", "api.test:8443", "api.test.evil", "u@api.test", "api.test:x"] {
        let e = ok(None, Some(Some(h))).unwrap_err();
        assert!(e.contains(&format!("the Host header names {h}")), "{h}: {e}");
    }
    assert!(
        ok(Some("other.test"), Some(Some("api.test"))).unwrap_err().contains("the request names other.test")
    );
    assert!(
        ok(Some("api.test"), Some(Some("other.test"))).unwrap_err().contains("Host header names other.test")
    );
    assert_eq!(ok(None, Some(None)), Err("the Host header is not text".into()));
    assert_eq!(ok(None, None), Err("the request has no Host header".into()));
}

/// A header value the view cannot hold (a control character) is refused, not relayed unread.
#[test]
fn a_forwarded_header_the_view_cannot_hold_is_refused() {
    let ok = request::parse(b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-A: caf\xc3\xa9\r\n\r\n");
    assert!(ok.is_ok(), "{ok:?}");
    let bad = request::parse(b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-A: a\x7fb\r\n\r\n");
    assert!(matches!(bad, Err(request::HeadError::Bad(_))), "{bad:?}");
}
