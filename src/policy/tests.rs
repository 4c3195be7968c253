//! Unit tests of policy building: allow-entry normalisation, env and NO_PROXY composition,
//! and the extra_args guard.

use super::allow::{self, Allow, HostPattern, IpNet, Ports};
use super::*;

fn host(s: &str) -> Allow {
    Allow::Host(HostPattern::Exact(s.into()), None)
}
fn net(s: &str, ports: Option<Ports>) -> Allow {
    let (a, l) = s.split_once('/').unwrap_or((s, ""));
    let addr: IpAddr = a.parse().unwrap();
    let len = if l.is_empty() { IpNet::max_len(&addr) } else { l.parse().unwrap() };
    Allow::Net(IpNet::masked(addr, len), ports)
}

#[test]
fn allow_entries_normalise_to_one_spelling() {
    let cases: Vec<(&str, Allow)> = vec![
        ("github.com", host("github.com")),
        ("GitHub.COM.", host("github.com")),
        (
            "api.example.com:8443",
            Allow::Host(HostPattern::Exact("api.example.com".into()), Some(Ports::one(8443))),
        ),
        ("*.npmjs.org", Allow::Host(HostPattern::Suffix("npmjs.org".into()), None)),
        ("*.NPMJS.org.", Allow::Host(HostPattern::Suffix("npmjs.org".into()), None)),
        ("*.eu.api.example.com", Allow::Host(HostPattern::Suffix("eu.api.example.com".into()), None)),
        ("xn--bcher-kva.example", host("xn--bcher-kva.example")),
        ("100.64.0.1:5432", net("100.64.0.1", Some(Ports::one(5432)))),
        ("10.0.0.0/8", net("10.0.0.0/8", None)),
        ("10.0.0.0/8:8000-8100", net("10.0.0.0/8", Some(Ports { lo: 8000, hi: 8100 }))),
        // A range of one port is that port.
        ("10.0.0.0/8:80-80", net("10.0.0.0/8", Some(Ports::one(80)))),
        ("2001:db8::1", net("2001:db8::1", None)),
        ("[2001:db8::1]:443", net("2001:db8::1", Some(Ports::one(443)))),
        // Not ambiguous: a one-digit last group, eight groups, a prefix; the bracketed address.
        ("2001:db8::1:4", net("2001:db8::1:4", None)),
        ("2001:db8:0:0:0:0:1:443", net("2001:db8::1:443", None)),
        ("[2001:db8::1:443]", net("2001:db8::1:443", None)),
        ("[2001:db8::/32]:443", net("2001:db8::/32", Some(Ports::one(443)))),
        ("2001:DB8::/32", net("2001:db8::/32", None)),
        ("::ffff:192.0.2.7", net("192.0.2.7", None)),
        ("[::ffff:192.0.2.0/120]:22", net("192.0.2.0/24", Some(Ports::one(22)))),
    ];
    for (input, want) in cases {
        assert_eq!(allow::parse(input), Ok(want), "input {input:?}");
    }
}

#[test]
fn a_name_may_be_as_long_as_dns_carries_and_no_longer() {
    let longest = format!("{0}.{0}.{0}.{0}.a", "b".repeat(62));
    assert_eq!(longest.len(), 253);
    assert_eq!(allow::parse(&longest), Ok(host(&longest)));
    // Underscores appear in real names (`_dmarc`, service records): allowed in a label.
    assert_eq!(allow::parse("_acme.example.com"), Ok(host("_acme.example.com")));
    let b = allow::parse(&format!("{longest}a")).unwrap_err();
    assert!(b.reason.contains("name longer than 253 characters"), "{}", b.reason);
}

#[test]
fn allow_entries_that_must_be_refused() {
    // (input, a word the reason or hint must contain)
    let cases = [
        ("*", "every host"),
        ("*.com", "public suffix"),
        ("*.co.uk", "public suffix"),
        ("*.github.io", "public suffix"),
        ("foo.*.com", "only start"),
        ("*github.com", "may only start"),
        ("http://x.com/a", "URL"),
        ("a..b", "not a valid DNS label"),
        ("github.com/x", "paths"),
        ("user@github.com", "user information"),
        ("1.2.3.4/33", "out of range"),
        ("1.2.3.4/24", "did you mean `1.2.3.0/24`"),
        ("0.0.0.0/0", "every address"),
        ("::/0", "every address"),
        ("127.0.0.1:22", "loopback"),
        ("::1", "loopback"),
        ("localhost", "localhost"),
        ("0x7f.1", "unusual spelling"),
        ("2130706433", "unusual spelling"),
        ("017700000001", "unusual spelling"),
        ("1.2.3.256", "out of range"),
        ("example.123", "numeric last label"),
        ("host:0", "out of range"),
        ("host.com:65536", "out of range"),
        ("host.com:99999", "out of range"),
        ("host.com:http", "`http` is not a port number"),
        ("100.64.0.1:-1", "ports cannot be negative (`-1`)"),
        ("host.com:", "the port is missing"),
        ("1.2.3.4:8000-", "is missing its end"),
        ("1.2.3.4:-", "`-` is not a port number"),
        ("1.2.3.4:--5", "is missing its start"),
        ("a!b.example.com", "`a!b` is not a valid DNS label"),
        ("api.localhost", "localhost inside the sandbox is the sandbox itself"),
        ("localhost", "localhost inside the sandbox is the sandbox itself"),
        ("\"github.com\"", "without quotes: `allow = github.com`"),
        ("'github.com'", "without quotes: `allow = github.com`"),
        ("a.com,b.com", "one entry per line: `allow = a.com`, `allow = b.com`"),
        ("github.com#comment", "a comment needs whitespace before `#`"),
        ("[\"a.com\", \"b.com\"]", "TOML-style list"),
        ("['a.com','b.com']", "TOML-style list"),
        ("[a.com, b.com]", "TOML-style list"),
        // A quote at one end only is no quoting: the name itself is wrong.
        ("github.com\"", "not a valid DNS label"),
        ("\"github.com", "not a valid DNS label"),
        ("git\u{7}hub.com", "contains whitespace or a control character"),
        ("git hub.com", "contains whitespace or a control character"),
        ("host.com:90-80", "backwards"),
        ("bücher.example", "punycode"),
        ("-bad.example.com", "not a valid DNS label"),
        ("intranet", "single-label"),
        ("[2001:db8::1", "missing `]`"),
        ("2001:db8::1:443", "did you mean `[2001:db8::1]:443`?"),
        ("0.0.0.0", "unspecified"),
    ];
    for (input, word) in cases {
        let b = allow::parse(input).expect_err(input);
        let text = format!("{} / {}", b.reason, b.hint);
        assert!(text.contains(word), "{input:?}: expected {word:?} in {text:?}");
    }
}

fn policy(cfg: &str, inputs: Inputs) -> Result<Policy, Vec<crate::error::Diagnostic>> {
    let (cfg, errs) = crate::policy::keys::read(cfg);
    assert!(errs.is_empty(), "{errs:?}");
    build(PathBuf::from("/w/p"), &cfg, &inputs)
}

#[test]
fn no_proxy_is_composed_once_with_user_values_and_gate_addr() {
    let p = policy(
        "env = NO_PROXY=internal.example, 127.0.0.1\nallow = 100.64.0.1:5432\n",
        Inputs { env: vec!["no_proxy=other.example".into()], ..Inputs::default() },
    )
    .unwrap();
    assert_eq!(
        p.no_proxy,
        ["localhost", "127.0.0.1", "::1", "internal.example", "other.example", "100.64.0.1"]
    );
    assert!(p.env.is_empty(), "NO_PROXY lines are merged, not passed twice: {:?}", p.env);

    // The gate never relays gate_addr, on any port: `100.64.0.1:443` (or 8443, 80) alone must
    // put it in NO_PROXY too, or clients send it to the gate, which refuses it.
    for port in [80, 443, 8443] {
        let p = policy(&format!("allow = 100.64.0.1:{port}\n"), Inputs::default()).unwrap();
        assert_eq!(p.no_proxy, ["localhost", "127.0.0.1", "::1", "100.64.0.1"], "port {port}");
    }
    // Positive control: an entry that does not reach gate_addr leaves it out.
    let p = policy("allow = 198.51.100.7:443\n", Inputs::default()).unwrap();
    assert_eq!(p.no_proxy, ["localhost", "127.0.0.1", "::1"]);
    // An address budget is counted on the direct path only: its address or network too.
    let p = policy(
        "allow = 198.51.100.7:443\nallow = 203.0.113.0/24\nbudget = 198.51.100.7 1m\nbudget = 203.0.113.0/24 2m\n",
        Inputs::default(),
    )
    .unwrap();
    assert_eq!(p.no_proxy, ["localhost", "127.0.0.1", "::1", "198.51.100.7", "203.0.113.0/24"]);
}

#[test]
fn one_function_says_what_the_gate_relays() {
    use crate::policy::allow::{IpNet, Ports};
    let gate_addr: std::net::Ipv4Addr = "100.64.0.1".parse().unwrap();
    let nets = vec![
        (IpNet::host("100.64.0.1".parse().unwrap()), Ports::one(443)),
        (IpNet::masked("198.51.100.0".parse().unwrap(), 24), Ports { lo: 80, hi: 443 }),
    ];
    let relays = |ip: &str, port| gate_relays(&nets, gate_addr, ip.parse().unwrap(), port);
    assert!(!relays("100.64.0.1", 443), "gate_addr is reached directly, never relayed");
    assert!(relays("198.51.100.9", 443) && relays("198.51.100.9", 80));
    assert!(!relays("198.51.100.9", 444), "a port outside the entry");
    assert!(relays("::ffff:198.51.100.9", 443), "the mapped spelling is the same address");
    assert!(!relays("127.0.0.1", 443) && !relays("192.0.2.1", 443));
    assert!(reached_directly(&nets, gate_addr, "100.64.0.1".parse().unwrap()));
    assert!(!reached_directly(&nets, gate_addr, "198.51.100.9".parse().unwrap()));
}

#[test]
fn proxy_variables_belong_to_the_gate() {
    let errs = policy("env = HTTPS_PROXY=http://elsewhere:3128\n", Inputs::default()).unwrap_err();
    assert_eq!(errs[0].origin, Origin::Config(1));
    assert!(errs[0].message.contains("set by ai-sandbox"));
    // Without the gate they are ordinary variables.
    let p = policy(
        "env = HTTPS_PROXY=http://elsewhere:3128\n",
        Inputs { net: Some(NetMode::Full), ..Inputs::default() },
    )
    .unwrap();
    assert_eq!(p.env, [("HTTPS_PROXY".to_string(), "http://elsewhere:3128".to_string())]);
}

#[test]
fn cli_env_overrides_config_but_duplicates_in_one_place_are_errors() {
    let p = policy("env = A=1\n", Inputs { env: vec!["A=2".into()], ..Inputs::default() }).unwrap();
    assert_eq!(p.env, [("A".to_string(), "2".to_string())]);
    let errs = policy("env = A=1\nenv = A=3\n", Inputs::default()).unwrap_err();
    assert!(errs[0].message.contains("already set on line 1"), "{errs:?}");
}

#[test]
fn extra_args_that_undo_the_sandbox_are_refused_unless_net_full() {
    for bad in [
        "--network=host",
        "--cap-add NET_ADMIN",
        "--privileged",
        "-p 8000:8000",
        "--runtime crun",
        "--security-opt seccomp=unconfined",
        // A short cluster, as podman reads it: `-i -p 8080:80`, `-d -P`.
        "-ip 8080:80",
        "-itp8080:80",
        "-dP",
    ] {
        let errs = policy("", Inputs { extra_args_env: Some(bad.into()), ..Inputs::default() }).unwrap_err();
        assert_eq!(errs[0].origin, Origin::Env("AISB_EXTRA_ARGS"), "{bad}");
    }
    let ok = policy("extra_args = -v /data:/data:ro --memory 2g\n", Inputs::default()).unwrap();
    assert_eq!(ok.extra_args, ["-v", "/data:/data:ro", "--memory", "2g"]);
    let full = policy(
        "",
        Inputs { net: Some(NetMode::Full), extra_args_env: Some("-p 8000:8000".into()), ..Inputs::default() },
    )
    .unwrap();
    assert_eq!(full.extra_args, ["-p", "8000:8000"]);
    // A cluster whose value-taking flag comes first keeps the rest as its value: `-ep` sets the
    // variable `p`, it publishes nothing.
    assert!(policy("", Inputs { extra_args_env: Some("-ep -it".into()), ..Inputs::default() }).is_ok());
}

#[test]
fn an_extra_argument_that_mounts_the_home_directory_read_write_is_refused() {
    let with_home = |args: &str| {
        policy(
            &format!("extra_args = {args}\n"),
            Inputs { home: Some("/home/u".into()), ..Inputs::default() },
        )
    };
    for bad in [
        "-v /home/u:/realhome",
        "--volume=/home/u:/h:rw",
        "-v /home:/homes",
        "-v /:/host",
        "-itv /home/u:/h",
        "-v/home/u:/h",
        "--mount type=bind,src=/home/u,dst=/h",
        "--mount=type=bind,source=/home,target=/h",
        "-v /home/u/..:/h",
        "-v /usr/..:/host",
        "-v /home/u/./:/h",
        "--mount type=glob,src=/home/u/.*,dst=/h",
    ] {
        let errs = with_home(bad).unwrap_err();
        assert!(
            errs[0].message.contains("read-write") && errs[0].message.contains("your home directory"),
            "{bad}: {errs:?}"
        );
        assert_eq!(errs[0].origin, Origin::Config(1), "{bad}");
    }
    // Below /proc: any directory of the host.
    let errs = with_home("-v /proc/self/root/home/u:/h").unwrap_err();
    assert!(errs[0].message.contains("below /proc"), "{errs:?}");
    // Read-only, or a directory below HOME: as given.
    for ok in [
        "-v /home/u:/h:ro",
        "--mount type=bind,src=/home/u,dst=/h,readonly",
        "-v /home/u/data:/data",
        "-v /home/u/data/../build:/b",
        "--mount type=glob,src=/home/u/src/*.rs,dst=/s",
        "-v /data:/data",
        "-e V=/home/u:/x",
        "-p8080:80 -v /srv:/srv",
    ]
    .iter()
    .filter(|a| !a.starts_with("-p"))
    {
        assert!(with_home(ok).is_ok(), "{ok}");
    }
}

#[test]
fn a_mount_of_the_home_directory_through_a_link_is_refused_as_the_kernel_reads_it() {
    // Fedora's atomic desktops: /home leads to /var/home, and HOME is /var/home/u.
    let silverblue = |p: &std::path::Path| match p.strip_prefix("/home") {
        Ok(rest) => std::path::Path::new("/var/home").join(rest),
        Err(_) => p.to_path_buf(),
    };
    let on = |home: &str, args: &str| {
        policy(
            &format!("extra_args = {args}\n"),
            Inputs { home: Some(home.into()), resolve: Some(silverblue), ..Inputs::default() },
        )
    };
    for (home, bad) in
        [("/var/home/u", "-v /home/u:/h"), ("/var/home/u", "-v /home:/h"), ("/home/u", "-v /var/home/u:/h")]
    {
        let errs = on(home, bad).unwrap_err();
        assert!(errs[0].message.contains("your home directory"), "{home} {bad}: {errs:?}");
    }
    // Control: a directory below HOME under either name, and read-only, as given.
    for ok in ["-v /home/u/src:/s", "-v /var/home/u/src:/s", "-v /home/u:/h:ro"] {
        assert!(on("/var/home/u", ok).is_ok(), "{ok}");
    }
}

#[test]
fn hostnames_need_the_gate_and_flags_must_fit_the_mode() {
    let errs = policy("allow = github.com\n", Inputs { no_gate: true, ..Inputs::default() }).unwrap_err();
    assert!(errs[0].message.contains("--no-gate"));
    let errs =
        policy("", Inputs { net: Some(NetMode::None), publish: vec!["8000".into()], ..Inputs::default() })
            .unwrap_err();
    assert!(errs[0].message.contains("--net none"));
    let errs =
        policy("", Inputs { net: Some(NetMode::Full), allow: vec!["1.2.3.4".into()], ..Inputs::default() })
            .unwrap_err();
    assert!(errs[0].message.contains("no effect"));
}

#[test]
fn cli_flags_win_over_config_and_entries_are_deduplicated() {
    let p = policy(
        "net = none\nallow = 10.0.0.1\nallow = 10.0.0.1\n",
        Inputs { net: Some(NetMode::Allow), allow: vec!["10.0.0.1".into()], ..Inputs::default() },
    )
    .unwrap();
    assert_eq!(p.net, NetMode::Allow);
    assert_eq!(p.allow.nets.len(), 1);
}

#[test]
fn a_host_loopback_entry_needs_an_explicit_port() {
    for (line, refused) in [
        ("allow = 100.64.0.1", true),
        ("allow = 100.64.0.0/10", true),
        ("allow = 100.64.0.0/24", true),
        ("allow = 100.64.0.1:5432", false),
        ("allow = 100.64.0.1:1-65535", false),
        ("allow = 100.64.0.0/10:443", false),
        ("allow = 198.51.100.7", false),
    ] {
        let got = policy(&format!("{line}\n"), Inputs::default());
        assert_eq!(got.is_err(), refused, "{line}: {got:?}");
        if let Err(e) = got {
            assert!(e[0].message.contains("every port of the host's loopback"), "{e:?}");
            assert!(e[0].hint.as_deref().unwrap().contains(":1-65535`"), "says how to mean all ports: {e:?}");
        }
    }
    // The same for a custom gate_addr, and through --allow.
    let got = policy("gate_addr = 100.80.0.1\nallow = 100.80.0.1\n", Inputs::default());
    assert!(got.is_err());
    let got = policy("", Inputs { allow: vec!["100.64.0.1".into()], ..Inputs::default() });
    assert!(got.unwrap_err()[0].origin == Origin::Flag("--allow"));
}

#[test]
fn a_bound_secrets_hosts_must_be_allowed_and_need_the_gate() {
    let ok = policy("allow = api.example.com\nsecret = K for api.example.com\n", Inputs::default()).unwrap();
    assert_eq!(ok.secrets[0].hosts, ["api.example.com"]);
    // A wildcard allow covers it; a port other than 443 does not; a deny takes it away.
    assert!(policy("allow = *.example.com\nsecret = K for api.example.com\n", Inputs::default()).is_ok());
    for (cfg, says) in [
        ("secret = K for api.example.com\n", "allow = api.example.com"),
        ("allow = api.example.com:80\nsecret = K for api.example.com\n", "not let through on 443"),
        (
            "allow = *.example.com\ndeny = api.example.com\nsecret = K for api.example.com\n",
            "not let through",
        ),
    ] {
        let errs = policy(cfg, Inputs::default()).unwrap_err();
        let e = errs.iter().find(|e| e.message.contains("K is bound")).expect(cfg);
        let text = format!("{} {}", e.message, e.hint.as_deref().unwrap_or_default());
        assert!(text.contains(says), "{cfg}: {text}");
        assert!(matches!(e.origin, Origin::Config(_)), "{cfg}: the line is named");
    }
    // With no gate there is nobody to put the value in: refused, with the unbound spelling.
    let full = Inputs { net: Some(NetMode::Full), ..Inputs::default() };
    let errs = policy("allow = api.example.com\nsecret = K for api.example.com\n", full).unwrap_err();
    assert!(errs[0].message.contains("--net full has no gate"), "{errs:?}");
    assert!(errs[0].hint.as_deref().unwrap_or_default().contains("`secret = K`"));
    // --net none reaches nothing: the placeholder is harmless there, and the config still runs.
    let none = Inputs { net: Some(NetMode::None), ..Inputs::default() };
    assert!(policy("allow = api.example.com\nsecret = K for api.example.com\n", none).is_ok());
}

#[test]
fn upstream_ca_is_a_file_outside_the_project() {
    let p = policy("upstream_ca = ~/.config/ca.pem\n", Inputs::default()).unwrap();
    assert_eq!(p.upstream_ca.as_deref(), Some("~/.config/ca.pem"));
    for (v, says) in [("ca.pem", "not an absolute path"), ("/w/p/certs/ca.pem", "inside the project")] {
        let errs = policy(&format!("upstream_ca = {v}\n"), Inputs::default()).unwrap_err();
        assert!(errs[0].message.contains(says), "{v}: {errs:?}");
    }
}

#[test]
fn a_budget_needs_its_host_allowed_and_the_gate_and_one_line_per_host() {
    let ok = policy(
        "allow = a.test\nallow = *.b.test\nbudget = a.test 1m\nbudget = *.b.test 2m\nbudget = * 5m\n",
        Inputs::default(),
    )
    .unwrap();
    let shown: Vec<String> = ok.budgets.iter().map(|b| b.to_string()).collect();
    assert_eq!(shown, ["a.test 1m", "*.b.test 2m", "* 5m"]);
    assert!(!ok.terminates(), "a budget alone opens no TLS");
    let errs = policy("allow = a.test\nbudget = c.test 1m\n", Inputs::default()).unwrap_err();
    assert_eq!(errs[0].origin, crate::error::Origin::Config(2));
    assert!(errs[0].message.contains("c.test is not allowed"), "{:?}", errs[0]);
    assert_eq!(
        errs[0].hint.as_deref(),
        Some("add `allow = c.test` (a budget caps what an allowed host is sent)")
    );
    let errs =
        policy("allow = a.test\nbudget = a.test 1m\nbudget = a.test 2m\n", Inputs::default()).unwrap_err();
    assert_eq!(errs[0].origin, crate::error::Origin::Config(3));
    assert!(errs[0].message.contains("a second budget for a.test"), "{:?}", errs[0]);
    let daily =
        policy("allow = a.test\nbudget = a.test 1m/day\nbudget = * 5m/week\n", Inputs::default()).unwrap();
    let shown: Vec<String> = daily.budgets.iter().map(|b| b.to_string()).collect();
    assert_eq!(shown, ["a.test 1m/day", "* 5m/week"]);
    let errs = policy("allow = a.test\nbudget = a.test 1m/month\n", Inputs::default()).unwrap_err();
    assert!(errs[0].message.contains("`/month` is not a period"), "{:?}", errs[0]);
    assert!(errs[0].hint.as_deref().unwrap_or("").contains("`1m/day`"), "{:?}", errs[0]);
    let errs = policy("allow = 192.0.2.1\nbudget = 192.0.2.1 1m/day\n", Inputs::default()).unwrap_err();
    assert!(errs[0].message.contains("a period is counted by the gate, for names only"), "{:?}", errs[0]);
    let no_gate = Inputs { no_gate: true, ..Inputs::default() };
    let errs = policy("allow = 192.0.2.1\nbudget = * 1m\n", no_gate).unwrap_err();
    assert!(errs[0].message.contains("--no-gate leaves no gate"), "{:?}", errs[0]);
    // Nothing to count with no policy, or no egress; a bad line is still an error.
    for net in [NetMode::Full, NetMode::None] {
        let p = policy("budget = a.test 1m\n", Inputs { net: Some(net), ..Inputs::default() }).unwrap();
        assert!(p.budgets.is_empty(), "{net:?}");
        assert!(policy("budget = a.test x\n", Inputs { net: Some(net), ..Inputs::default() }).is_err());
    }
}

#[test]
fn an_address_budget_needs_an_ip_entry_and_no_overlap_and_counts_without_the_gate() {
    let cfg = "allow = 192.0.2.0/24:443\nallow = 198.51.100.7:22\nbudget = 192.0.2.10 1m\nbudget = 198.51.100.0/24 2m\n";
    let no_gate = Inputs { no_gate: true, ..Inputs::default() };
    let ok = policy(cfg, no_gate.clone()).unwrap();
    let shown: Vec<String> = ok.net_budgets.iter().map(|b| b.to_string()).collect();
    assert_eq!(shown, ["192.0.2.10 1m", "198.51.100.0/24 2m"], "the rules count them: no gate needed");
    assert!(ok.budgets.is_empty() && ok.notices.is_empty(), "{:?}", ok.notices);
    let errs = policy("allow = 192.0.2.1:443\nbudget = 203.0.113.5 1m\n", Inputs::default()).unwrap_err();
    assert_eq!(errs[0].origin, crate::error::Origin::Config(2));
    assert!(errs[0].message.contains("no IP entry reaches 203.0.113.5"), "{:?}", errs[0]);
    assert_eq!(
        errs[0].hint.as_deref(),
        Some("add `allow = 203.0.113.5:PORT` (a budget caps what an allowed address is sent)")
    );
    let errs =
        policy("allow = 192.0.2.0/24:443\nbudget = 192.0.2.0/24 1m\nbudget = 192.0.2.10 1m\n", no_gate)
            .unwrap_err();
    assert_eq!(errs[0].origin, crate::error::Origin::Config(3));
    assert!(
        errs[0].message.contains("shares addresses with the budget line for 192.0.2.0/24"),
        "{:?}",
        errs[0]
    );
    // `*` counts hostnames: the IP entries without a line of their own are named.
    let p = policy(
        "allow = a.test\nallow = 192.0.2.0/24:443\nallow = 198.51.100.7:22\nallow = 198.51.100.7:80\nbudget = * 5m\nbudget = 192.0.2.0/24 1m\n",
        Inputs::default(),
    )
    .unwrap();
    assert_eq!(
        p.notices,
        [
            "`budget = * 5m` counts hostnames (the gate counts them); the IP entries 198.51.100.7 are not counted: give each a line of its own (`budget = 198.51.100.7 5m`)"
        ]
    );
    let daily =
        policy("allow = a.test\nallow = 198.51.100.7:22\nbudget = * 5m/day\n", Inputs::default()).unwrap();
    assert!(
        daily.notices[0].ends_with("(`budget = 198.51.100.7 5m`, for each session)"),
        "{:?}",
        daily.notices
    );
    for net in [NetMode::Full, NetMode::None] {
        let p = policy("budget = 192.0.2.1 1m\n", Inputs { net: Some(net), ..Inputs::default() }).unwrap();
        assert!(p.net_budgets.is_empty(), "{net:?}");
    }
}

#[test]
fn a_rule_needs_its_host_allowed_and_the_gate_and_makes_the_sandbox_trust_the_gates_ca() {
    let ok = policy("allow = api.test\nrule = api.test GET /x\n", Inputs::default()).unwrap();
    assert_eq!(ok.rules.len(), 1);
    assert!(ok.terminates(), "a host with rules is terminated");
    let wild = policy("allow = *.api.test\nrule = *.api.test GET /x\n", Inputs::default()).unwrap();
    assert_eq!(wild.rules.len(), 1);
    // Not allowed: the line says so, with the allow line to add.
    let errs = policy("allow = api.test\nrule = other.test GET /x\n", Inputs::default()).unwrap_err();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].origin, crate::error::Origin::Config(2));
    assert!(errs[0].message.contains("other.test is not allowed"), "{:?}", errs[0]);
    assert_eq!(
        errs[0].hint.as_deref(),
        Some("add `allow = other.test` (a rule narrows what an allowed host may be asked)")
    );
    let errs = policy("allow = api.test\nrule = *.api.test GET /x\n", Inputs::default()).unwrap_err();
    assert!(errs[0].message.contains("*.api.test is not allowed"), "{:?}", errs[0]);
    // No gate to read requests.
    // `--net full` is no policy: the rule lines are skipped and said, not an error (the quick
    // start's config must preview with it); a bad rule line is still an error.
    let full = || Inputs { net: Some(NetMode::Full), ..Inputs::default() };
    let p = policy("allow = api.test\nrule = api.test GET /x\nrule = api.test git-fetch\n", full()).unwrap();
    assert!(p.rules.is_empty() && !p.terminates());
    assert!(
        p.notices
            .iter()
            .any(|n| n == "--net full: the config's 2 rule lines do not apply (no gate reads requests)"),
        "{:?}",
        p.notices
    );
    assert!(policy("rule = api.test GET no-slash\n", full()).is_err(), "a bad rule line is still an error");
    let quiet = policy("allow = api.test\n", full()).unwrap();
    assert!(!quiet.notices.iter().any(|n| n.contains("rule")), "{:?}", quiet.notices);
    let no_gate = Inputs { no_gate: true, ..Inputs::default() };
    let errs = policy("rule = api.test GET /x\n", no_gate).unwrap_err();
    assert!(errs[0].message.contains("--no-gate leaves no gate"), "{:?}", errs[0]);
    // `--net none`: nothing is reachable, the rule is kept and harmless; nothing is terminated.
    let none =
        policy("rule = api.test GET /x\n", Inputs { net: Some(NetMode::None), ..Inputs::default() }).unwrap();
    assert!(!none.terminates());
    // Without rules or bound secrets, nothing is terminated.
    assert!(!policy("allow = api.test\n", Inputs::default()).unwrap().terminates());
}

#[test]
fn containers_is_on_or_off_and_needs_the_hosts_image() {
    assert!(policy("containers = on\n", Inputs::default()).unwrap().containers);
    assert!(!policy("containers = off\n", Inputs::default()).unwrap().containers);
    assert!(!policy("", Inputs::default()).unwrap().containers);
    assert!(policy("", Inputs { containers: true, ..Inputs::default() }).unwrap().containers);
    let bad = policy("containers = yes\n", Inputs::default()).unwrap_err();
    assert!(bad[0].message.contains("unknown containers value `yes`"), "{bad:?}");
    let named =
        policy("image = localhost/dev\n", Inputs { containers: true, ..Inputs::default() }).unwrap_err();
    assert!(named[0].message.contains("needs `image = host`"), "{named:?}");
    assert!(matches!(named[0].origin, crate::error::Origin::Flag("--containers")), "{named:?}");
}
