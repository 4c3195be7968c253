//! What comes back, round 2 (ADR 0074): an upstream that spells the real key back in a way a
//! list of spellings misses (base64 at another alignment or alphabet, a reason phrase, two
//! codings, a transfer coding, halves the agent asked for, a switch to another protocol, a gRPC
//! message flagged compressed with no encoding) gives the agent the placeholder or a clear
//! refusal, never the key; and budgets count a request's trailers and every address line on the
//! one path it can take. Each case beside its control (the same request without the trick is
//! answered and masked), with the server's own log showing it was sent the real value.

use crate::harness::*;
use crate::keys::Upstream;

fn bound(name: &str) -> (Upstream, Project) {
    let up = Upstream::start("");
    let p = Project::new(name);
    up.ca_into(&p);
    let mut config = format!("allow = api.bound.test\nresolve = api.bound.test={}\n", up.th.v4);
    config += "secret = ECHO_KEY for api.bound.test\n";
    config += &format!("upstream_ca = {}\n", up.dir.join("ca.pem").display());
    p.config(&config);
    (up, p)
}

/// Every decoding of `text` the masker covers, and base64 from each of the first four
/// characters of each run of either alphabet.
fn decodings(text: &[u8]) -> Vec<Vec<u8>> {
    use base64::Engine;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let lenient = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    let mut out = vec![text.to_vec()];
    for (alphabet, extra) in [(&base64::alphabet::STANDARD, b"+/"), (&base64::alphabet::URL_SAFE, b"-_")] {
        let e = GeneralPurpose::new(alphabet, lenient);
        for run in text.split(|c| !(c.is_ascii_alphanumeric() || extra.contains(c))) {
            for off in 0..4.min(run.len()) {
                out.push(run[off..].chunks(4).flat_map(|g| e.decode(g).unwrap_or_default()).collect());
            }
        }
    }
    out
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn no_spelling_split_coding_or_protocol_hands_the_agent_the_real_key() {
    let (up, p) = bound("comes-back");
    let key = "sk/e2e+ROUND2=7f3a9c1b";
    let script = r#"
u=https://api.bound.test/trick
b="Authorization: Bearer $ECHO_KEY"
for s in 0 1 2; do
  curl -sS -H "$b" "$u?kind=b64&shift=$s" > b64-$s.txt
  curl -sS -H "$b" "$u?kind=b64&shift=$s&url=1" > b64u-$s.txt
done
curl -sS -D reason-head.txt -o reason.txt -H "$b" "$u?kind=reason"
curl -sS -o ce2.txt -w 'ce2 %{http_code}\n' -H "$b" "$u?kind=ce2&codings=gzip,gzip" >> codes.txt
curl -sS -o ce2i.txt -w 'ce2i %{http_code}\n' -H "$b" "$u?kind=ce2&codings=identity,gzip" >> codes.txt
curl -sS -o te.txt -w 'te %{http_code}\n' -H "$b" "$u?kind=te-gzip" >> codes.txt
curl -sS -r 0-16 -H "$b" "$u?kind=range" > r1.txt
curl -sS -r 17- -H "$b" "$u?kind=range" > r2.txt
curl -sS -o up.txt -w 'upgrade %{http_code}\n' -H "$b" -H 'Connection: Upgrade' -H 'Upgrade: rtproto' "$u?kind=upgrade" >> codes.txt
curl -sS --http1.1 -H "$b" -H 'content-type: application/grpc' "$u?kind=grpc&compressed=1" > grpc-c.bin
curl -sS --http1.1 -H 'content-type: application/grpc' "$u?kind=grpc" > grpc-p.bin
curl -sS -H "$b" https://api.bound.test/echo-headers > plain.txt
true
"#;
    let out = spawn_sandbox_with_secret_env(&p, &["--", "sh", "-c", script], &[("ECHO_KEY", key)])
        .wait_with_output();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The server was sent the real key with every trick (so each spelt it back).
    let reqs = up.requests();
    let tricks: Vec<_> =
        reqs.iter().filter(|r| r["target"].as_str().unwrap_or("").starts_with("/trick")).collect();
    assert_eq!(tricks.len(), 15, "{reqs:?}");
    for t in tricks.iter().filter(|t| t["headers"]["authorization"].is_string()) {
        assert_eq!(t["headers"]["authorization"], format!("Bearer {key}"), "{t}");
    }
    let read = |f: &str| std::fs::read(p.path(f)).unwrap_or_default();
    let holds_key = |b: &[u8]| decodings(b).iter().any(|d| memchr::memmem::find(d, key.as_bytes()).is_some());
    // Control: the plain echo comes back masked, as before.
    let plain = String::from_utf8_lossy(&read("plain.txt")).into_owned();
    assert!(plain.contains("authorization: Bearer aisb_placeholder_") && !plain.contains(key), "{plain}");
    // base64 at each alignment, both alphabets: the placeholder, never the key.
    for f in ["b64-0.txt", "b64-1.txt", "b64-2.txt", "b64u-0.txt", "b64u-1.txt", "b64u-2.txt"] {
        let b = read(f);
        assert!(b.starts_with(b"dump: "), "{f}: {}", String::from_utf8_lossy(&b));
        assert!(!holds_key(&b), "{f} decodes to the key: {}", String::from_utf8_lossy(&b));
        // (The character before the value's own, which mixes its first bits with the byte
        // before, is left as it is: the first letter of the placeholder may decode changed.)
        let shown = decodings(&b).iter().any(|d| memchr::memmem::find(d, b"sb_placeholder_").is_some());
        assert!(shown, "{f}: the placeholder is what decodes there: {}", String::from_utf8_lossy(&b));
    }
    // The reason phrase is the status's own.
    let head = String::from_utf8_lossy(&read("reason-head.txt")).into_owned();
    assert!(head.contains("HTTP/1.1 401 Unauthorized\r\n") && !head.contains(key), "{head}");
    // Two codings, a transfer coding, an upgrade to another protocol: refused, never passed.
    let codes = String::from_utf8_lossy(&read("codes.txt")).into_owned();
    for want in ["ce2 502", "ce2i 502", "te 502", "upgrade 502"] {
        assert!(codes.contains(want), "{want}: {codes}");
    }
    for f in ["ce2.txt", "ce2i.txt", "te.txt", "up.txt"] {
        assert!(!holds_key(&read(f)), "{f}");
    }
    // Halves the agent chose: the server was never asked for a part (the gate took the Range
    // out), and what came back, whole and masked twice, never holds the key.
    let ranges: Vec<_> = tricks.iter().filter(|t| t["target"] == "/trick?kind=range").collect();
    assert_eq!(ranges.len(), 2);
    assert!(ranges.iter().all(|r| r["headers"].get("range").is_none()), "{ranges:?}");
    let both = [read("r1.txt"), read("r2.txt")].concat();
    assert!(!holds_key(&both), "{}", String::from_utf8_lossy(&both));
    assert!(String::from_utf8_lossy(&read("r1.txt")).contains("aisb_placeholder_"), "whole, masked");
    // A gRPC message flagged compressed with no grpc-encoding ends the call; a plain one passes.
    assert!(read("grpc-c.bin").is_empty(), "{:?}", read("grpc-c.bin"));
    let plain_grpc = read("grpc-p.bin");
    assert!(plain_grpc.first() == Some(&0) && plain_grpc.ends_with(b"Authorization: "), "{plain_grpc:?}");
    let log = gate_log();
    for why in ["2 Content-Encoding fields", "transfer coding gzip", "switched to rtproto"] {
        assert!(log.contains(why), "{why}: {log}");
    }
    assert!(!log.contains(key), "the key in the gate's log");
}

/// A request's trailers count against its host's budget, on HTTP/1.1 (chunked) as on HTTP/2:
/// empty-bodied POSTs with 4,000-byte trailers to a host with 64 KiB stop where the budget
/// does. Control: the same requests with 4,000-byte bodies stop at the same place.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn trailers_are_counted_like_bodies() {
    let (up, p) = bound("trailers");
    let mut config = std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap();
    config += "allow = other.test\nresolve = other.test=";
    config += &format!("{}\nbudget = api.bound.test 64k\nbudget = other.test 64k\n", up.th.v4);
    p.config(&config);
    // A raw client through the gate: CONNECT, TLS (trusting the gate's CA and the test's), then
    // one request per connection: chunked with trailers, or a body of the same size.
    let client = r#"
import base64, os, socket, ssl, sys, urllib.parse
proxy = urllib.parse.urlparse(os.environ["HTTPS_PROXY"])
ctx = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE"))
ctx.load_verify_locations("e2e-ca.pem")
host, kind = sys.argv[1], sys.argv[2]
pad = b"a" * 4000
codes = []
for i in range(40):
    s = socket.create_connection((proxy.hostname, proxy.port))
    token = base64.b64encode(("%s:%s" % (proxy.username, proxy.password)).encode()).decode()
    s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\nProxy-Authorization: Basic %s\r\n\r\n" % (host, host, token)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        got = s.recv(4096)
        if not got:
            break
        head += got
    if not head.startswith(b"HTTP/1.1 200"):
        codes.append(head[9:12].decode() or "cut")
        continue
    t = ctx.wrap_socket(s, server_hostname=host)
    if kind == "trailers":
        req = b"POST /t%d HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\nTrailer: X-Pad\r\n\r\n0\r\nX-Pad: %s\r\n\r\n" % (i, host.encode(), pad)
    else:
        req = b"POST /b%d HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s" % (i, host.encode(), len(pad), pad)
    try:
        t.sendall(req)
        codes.append(t.recv(4096)[9:12].decode() or "cut")
    except OSError:
        codes.append("cut")
    t.close()
print(kind, " ".join(codes))
"#;
    std::fs::write(p.path("client.py"), client).unwrap();
    chown_user(&p.path("client.py"));
    let script = "python3 client.py api.bound.test trailers; python3 client.py other.test body";
    let r = spawn_sandbox_with_secret_env(&p, &["--", "sh", "-c", script], &[("ECHO_KEY", "sk-t-1")])
        .wait_with_output();
    let stdout = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(r.status.success(), "{stdout}{}", String::from_utf8_lossy(&r.stderr));
    let line = |k: &str| stdout.lines().find(|l| l.starts_with(k)).unwrap_or_default().to_string();
    let (t, b) = (line("trailers"), line("body"));
    let ok = |l: &str| l.split_whitespace().filter(|c| *c == "200").count();
    // Each request costs a little over 4,000 bytes: about 15 fit in 64 KiB, then refusals.
    assert!((10..=16).contains(&ok(&t)), "trailers: {t}");
    assert!((10..=16).contains(&ok(&b)), "control, bodies: {b}");
    assert!(t.contains("403") && b.contains("403"), "{t} / {b}");
    // What the server got of the trailers stays within the budget.
    let got: u64 = up
        .requests()
        .iter()
        .filter(|r| r["target"].as_str().unwrap_or("").starts_with("/t"))
        .map(|r| r["trailers"].as_u64().unwrap_or(0))
        .sum();
    assert!((10 * 4000..=64 << 10).contains(&got), "the server got {got} bytes of trailers");
}

/// An address budget is one count whichever way a client goes: the address is in NO_PROXY, so a
/// client that honours it connects directly, where the rules count; the gate refuses to relay it
/// (it would go around the count). Control: the direct upload within the budget is whole, and
/// past it the rules cut it.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn an_address_budget_holds_whichever_way_the_client_goes() {
    let up = Upstream::start("");
    let p = Project::new("addr-budget-path");
    let ip = up.th.v4.clone();
    p.config(&format!("allow = {ip}:80\nbudget = {ip} 100k\n"));
    let script = format!(
        "head -c 61440 /dev/zero > a; echo \"np=$NO_PROXY\"; \
         curl -sS -o /dev/null -w 'direct %{{http_code}}\\n' --data-binary @a http://{ip}/d1; \
         curl -sS -o /dev/null -w 'proxied %{{http_code}}\\n' --proxy \"$HTTP_PROXY\" --noproxy '' --data-binary @a http://{ip}/p1; \
         curl -sS -o /dev/null -w 'direct2 %{{http_code}}\\n' --max-time 20 --data-binary @a http://{ip}/d2 2>&1; true"
    );
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    r.ok();
    assert!(r.stdout.contains(&format!("np=localhost,127.0.0.1,::1,{ip}")), "{}", r.stdout);
    assert!(r.stdout.contains("direct 200"), "control: within the budget, direct: {}", r.stdout);
    assert!(r.stdout.contains("proxied 403"), "the gate relayed a budgeted address: {}", r.stdout);
    assert!(!r.stdout.contains("direct2 200"), "past the budget: {}", r.stdout);
    let reqs = up.requests();
    assert!(reqs.iter().all(|q| q["target"] != "/p1"), "the proxied upload reached the server: {reqs:?}");
    let log = gate_log();
    assert!(log.contains("has an address budget"), "{log}");
}
