//! Rules below the hostname (`rule = HOST METHOD PATH`, the git presets): the gate opens TLS
//! for a host with rules and lets through only the requests they allow, in one spelling of the
//! path; what it refuses never reaches the server, whose request log (tests/e2e/echo_server.py
//! on a test host) says what arrived. Every refusal is paired with an allowed request.
//!
//! Mutation run against both (2026-12-01): `decide::check_request` always `Ok(None)` (rules
//! off) → the API test fails at `post` (200, not 403) and the git test at the push (it went
//! through).

use crate::harness::*;
use crate::keys::{Upstream, bare_repo_with_one_commit};

/// Two requests pipelined on one TLS connection through the gate (one write): the first
/// allowed, the second not. Prints `pipe STATUS STATUS`.
const PIPE: &str = r#"
import base64, os, re, socket, ssl, urllib.parse
u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
s = socket.create_connection((u.hostname, u.port), timeout=20)
auth = base64.b64encode(("%s:%s" % (urllib.parse.unquote(u.username or ""), urllib.parse.unquote(u.password or ""))).encode()).decode()
s.sendall(("CONNECT api.rules.test:443 HTTP/1.1\r\nHost: api.rules.test:443\r\nProxy-Authorization: Basic %s\r\n\r\n" % auth).encode())
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
t = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"]).wrap_socket(s, server_hostname="api.rules.test")
t.sendall(b"GET /repos/acme/pipe1 HTTP/1.1\r\nHost: api.rules.test\r\n\r\n"
          b"POST /repos/acme/pipe2 HTTP/1.1\r\nHost: api.rules.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
got = b""
while True:
    try:
        b = t.recv(65536)
    except (OSError, ssl.SSLError) as e:
        print("pipe-error %r" % e)
        break
    if not b:
        break
    got += b
print("pipe " + " ".join(c.decode() for c in re.findall(rb"HTTP/1\.1 (\d{3}) ", got)))
"#;

/// Each probe prints `NAME STATUS`; the sandbox then waits for `go` (the live allow), probes
/// once more, and waits for `done`.
const PROBES: &str = r#"
c() { name=$1; shift; curl -s -m 20 -o /dev/null -w "$name %{http_code}\n" --path-as-is "$@"; }
{
c get -H "X-Private: hdr-e2e-7f3a" "https://api.rules.test/repos/acme/x?q=query-e2e-91c2"
c post -X POST https://api.rules.test/repos/acme/x
c outside https://api.rules.test/repos/other/x
c issue -X POST https://api.rules.test/repos/acme/x/issues
c dotdot https://api.rules.test/repos/acme/%2e%2e/other/x
c dotdot2 https://api.rules.test/repos/acme/../other/x
c slash https://api.rules.test/repos/acme/..%2Fother/x
c slashlower https://api.rules.test/repos/acme/..%2fother/x
c dup https://api.rules.test/repos/acme//dup
c dot https://api.rules.test/repos/acme/./dot
c lead https://api.rules.test//repos/other/x
c lower -X post https://api.rules.test/repos/acme/x
c mixed -X gEt https://api.rules.test/repos/acme/mixed
c abs --request-target https://other.test/repos/acme/abs https://api.rules.test/
c absctl --request-target https://api.rules.test/repos/acme/absctl https://api.rules.test/
c whole --cacert e2e-ca.pem -X POST https://other.test/anything
/usr/bin/python3 pipe.py
} > out 2>&1
touch phase1
while [ ! -e go ]; do sleep 0.1; done
c live -X POST https://api.rules.test/repos/acme/x >> out 2>&1
touch ready
"#;

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_host_with_rules_gets_only_the_methods_and_paths_they_allow_however_spelled() {
    let up = Upstream::start("");
    let p = Project::new("rules-api");
    std::fs::copy(up.dir.join("ca.pem"), p.path("e2e-ca.pem")).unwrap();
    std::fs::write(p.path("pipe.py"), PIPE).unwrap();
    for f in ["e2e-ca.pem", "pipe.py"] {
        chown_user(&p.path(f));
    }
    let ip = &up.th.v4;
    p.config(&format!(
        "allow = api.rules.test\nresolve = api.rules.test={ip}\nallow = other.test\nresolve = other.test={ip}\n\
         rule = api.rules.test GET /repos/acme/**\nrule = api.rules.test POST /repos/acme/*/issues\n\
         upstream_ca = {}\n",
        up.dir.join("ca.pem").display()
    ));
    let mut child = spawn_sandbox(&p, &["--", "sh", "-c", &format!("{PROBES}{UNTIL_DONE}")]);
    let stderr = child.stderr_live();
    let phase1 = wait_for(120, || p.path("phase1").exists());
    assert!(
        phase1,
        "the probes did not finish: {}",
        std::fs::read_to_string(p.path("out")).unwrap_or_default()
    );
    let before = up.requests();
    // Live: the refused POST allowed on the running sandbox (and added to the config).
    let allow = sandbox(&p, &["allow", "rule = api.rules.test POST /repos/acme/x"], &[]);
    std::fs::write(p.path("go"), "").unwrap();
    assert!(wait_for(60, || p.path("ready").exists()), "the live probe did not finish");
    finish(&p, child);
    let out = std::fs::read_to_string(p.path("out")).unwrap();
    let reqs = up.requests();
    let stderr = stderr.lock().unwrap().clone();
    let got = |name: &str| {
        out.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap_or("none").to_string()
    };
    let targets: Vec<String> = before
        .iter()
        .map(|r| format!("{} {}", r["method"].as_str().unwrap(), r["target"].as_str().unwrap()))
        .collect();

    // What the rules allow, and (controls) a host without rules is allowed whole.
    for (name, want) in [("get", "200"), ("issue", "200"), ("whole", "200"), ("absctl", "200")] {
        assert_eq!(got(name), want, "{name}: {out}");
    }
    // Another method, another path: 403 with the line to add.
    for (name, want) in [("post", "403"), ("outside", "403"), ("lower", "403")] {
        assert_eq!(got(name), want, "{name}: {out}");
    }
    // Spellings that would reach a refused path: resolved first (403), or refused as a guess
    // (an encoded slash: 400); an absolute-form URL naming another host: 421.
    for (name, want) in [
        ("dotdot", "403"),
        ("dotdot2", "403"),
        ("lead", "403"),
        ("slash", "400"),
        ("slashlower", "400"),
        ("abs", "421"),
    ] {
        assert_eq!(got(name), want, "{name}: {out}");
    }
    // Allowed spellings reach the server in their one spelling, the method in capitals.
    for name in ["dup", "dot", "mixed"] {
        assert_eq!(got(name), "200", "{name}: {out}");
    }
    for t in ["GET /repos/acme/dup", "GET /repos/acme/dot", "GET /repos/acme/mixed", "GET /repos/acme/absctl"]
    {
        assert!(targets.iter().any(|x| x == t), "{t} did not arrive as such: {targets:?}");
    }
    // Pipelined on one connection: the first is relayed, the second refused and never sent.
    assert!(out.contains("pipe 200 403"), "{out}");
    assert!(targets.iter().any(|x| x == "GET /repos/acme/pipe1"), "{targets:?}");
    // The server never received a refused request, nor any odd spelling.
    for t in &targets {
        let refused = t.contains("/repos/other")
            || t.contains("..")
            || t.contains("//")
            || t.contains("%2")
            || t.contains("pipe2")
            || t.starts_with("POST /repos/acme/x ")
            || t == "POST /repos/acme/x"
            || t.contains("abs ")
            || t.ends_with("/repos/acme/abs");
        assert!(!refused, "{t} reached the server: {targets:?}");
    }
    assert!(targets.iter().any(|x| x == "POST /anything"), "the host without rules got nothing: {targets:?}");
    // Live: after `ai-sandbox allow` the same POST goes through, and the config has the line.
    assert_eq!(allow.code, 0, "{} {}", allow.stdout, allow.stderr);
    assert_eq!(got("live"), "200", "{out}");
    assert_eq!(reqs.iter().filter(|r| r["method"] == "POST" && r["target"] == "/repos/acme/x").count(), 1);
    let config = std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap();
    assert!(config.contains("\nrule = api.rules.test POST /repos/acme/x\n"), "{config}");

    // The log: method and path of each request the gate read, never a header value or a query.
    let log = gate_log();
    assert!(!log.contains("hdr-e2e-7f3a") && !log.contains("query-e2e-91c2"), "{log}");
    let json = user_command(&p.dir, &env().bin, &["logs", "--json"], &[]).output().unwrap();
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&json.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let refused = lines
        .iter()
        .find(|l| l["decision"] == "deny" && l["path"] == "/repos/acme/x" && l["method"] == "POST");
    let refused = refused.unwrap_or_else(|| panic!("no refusal of POST /repos/acme/x: {lines:?}"));
    assert_eq!(refused["allow"], "rule = api.rules.test POST /repos/acme/x", "{refused}");
    let allowed = lines.iter().any(|l| {
        l["decision"] == "allow"
            && l["path"] == "/repos/acme/x"
            && l["reason"] == "allowed by rule = api.rules.test GET /repos/acme/**"
    });
    assert!(allowed, "{lines:?}");
    // The launcher said it with the fix, per method and path.
    assert!(
        stderr.contains(
            "refused api.rules.test:443 POST /repos/acme/x (add \"rule = api.rules.test POST /repos/acme/x\""
        ),
        "{stderr}"
    );
    assert!(stderr.contains("api.rules.test: only the requests the rules allow go through"), "{stderr}");
    // The audit export: an HTTP Activity line for a refused request, a Network Activity line
    // for a tunnel (other.test), each with the fields docs/networking.md lists.
    let ocsf = user_command(&p.dir, &env().bin, &["logs", "--format", "ocsf"], &[]).output().unwrap();
    let ocsf: Vec<serde_json::Value> = String::from_utf8_lossy(&ocsf.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let http = ocsf.iter().find(|e| {
        e["class_uid"] == 4002 && e["http_request"]["url"]["path"] == "/repos/acme/x" && e["action_id"] == 2
    });
    let http = http.unwrap_or_else(|| panic!("no HTTP Activity refusal: {ocsf:?}"));
    assert_eq!((http["activity_id"].as_u64(), http["type_uid"].as_u64()), (Some(6), Some(400206)), "{http}");
    assert_eq!(http["http_response"]["code"], 403, "{http}");
    let net = ocsf.iter().find(|e| e["class_uid"] == 4001 && e["dst_endpoint"]["hostname"] == "other.test");
    let net = net.unwrap_or_else(|| panic!("no Network Activity line: {ocsf:?}"));
    assert_eq!(
        (net["action_id"].as_u64(), net["dst_endpoint"]["port"].as_u64()),
        (Some(1), Some(443)),
        "{net}"
    );
    for e in [http, net] {
        for k in ["category_uid", "severity_id", "time", "status_id", "disposition_id"] {
            assert!(e[k].is_u64(), "{k} in {e}");
        }
        assert_eq!(e["metadata"]["version"], "1.3.0", "{e}");
    }
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn git_fetch_only_refuses_a_push_with_the_fix_in_gits_output_and_git_push_opens_one_repository() {
    let up = Upstream::start("");
    bare_repo_with_one_commit(&up.dir.join("repos/pushable.git"));
    let p = Project::new("rules-git");
    p.config(&format!(
        "allow = git.rules.test\nresolve = git.rules.test={}\nrule = git.rules.test git-fetch\n\
         rule = git.rules.test git-push /git/pushable.git\nupstream_ca = {}\n",
        up.th.v4,
        up.dir.join("ca.pem").display()
    ));
    let commit = "git -c user.name=dev -c user.email=dev@test commit -qm";
    let script = format!(
        "{{ git clone -q https://git.rules.test/git/proj.git c1; echo \"clone rc=$?\"; \
         cd c1 && git fetch -q origin; echo \"fetch rc=$?\"; \
         echo x > f && git add f && {commit} 'refused push' && git push origin HEAD:main 2> ../push-err; \
         echo \"push rc=$?\"; cd ..; \
         git clone -q https://git.rules.test/git/pushable.git c2 && cd c2 && echo y > g && git add g && \
         {commit} 'allowed push' && git push -q origin HEAD:main; echo \"push2 rc=$?\"; cd ..; }} > out 2>&1; \
         touch ready; {UNTIL_DONE}"
    );
    let child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
    assert!(wait_for(120, || p.path("ready").exists()), "the git commands did not finish");
    finish(&p, child);
    let out = std::fs::read_to_string(p.path("out")).unwrap();
    let push_err = std::fs::read_to_string(p.path("push-err")).unwrap_or_default();
    let log = |repo: &str| {
        let o = std::process::Command::new("git")
            .args([
                "--git-dir",
                up.dir.join("repos").join(repo).to_str().unwrap(),
                "log",
                "--format=%s",
                "main",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // Fetching works (the control), pushing to the fetch-only repository does not, and git
    // shows why, with the line that would allow it.
    assert!(out.contains("clone rc=0") && out.contains("fetch rc=0"), "{out}");
    assert!(!out.contains("push rc=0"), "{out}");
    assert!(push_err.contains("rule = git.rules.test git-push /git/proj.git"), "{push_err}");
    assert!(
        push_err.contains("remote: blocked by ai-sandbox: add \"rule = "),
        "git shows the hint: {push_err}"
    );
    assert!(push_err.contains("The requested URL returned error: 403"), "{push_err}");
    assert_eq!(log("proj.git"), "first\n", "the refused push changed the server's repository");
    let receive = up.requests().into_iter().filter(|r| {
        let t = r["target"].as_str().unwrap_or("");
        t.starts_with("/git/proj.git") && t.contains("receive-pack")
    });
    assert_eq!(receive.count(), 0, "a push request reached the server");
    // The repository the push rule names takes the push.
    assert!(out.contains("push2 rc=0"), "{out}");
    assert_eq!(log("pushable.git"), "allowed push\nfirst\n");
}

/// A push limited by ref (`rule = HOST git-push REPO REF...`): the agent's own branch is pushed
/// (the control); `main`, a deletion of the agent's branch and a tag are refused, git shows why
/// (with the line that would allow `main`), and the server's refs stay as they were.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_push_limited_by_ref_updates_the_agents_branches_only() {
    let up = Upstream::start("");
    push_limited_by_ref(&up, "rules-refs", "https://git.rules.test/git/proj.git");
}

/// The same push over HTTP/2 all the way: git (libcurl offers h2) to the gate, the gate to an
/// upstream that takes only h2 (`h2_front`). The check reads the command list from the
/// request's HTTP/2 DATA frames as it does from an HTTP/1.1 body: the agent's branch arrives,
/// the rest is refused in git's own output, and every request the server saw came as HTTP/2.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_push_limited_by_ref_is_checked_over_http2_too() {
    let up = Upstream::start("");
    let seen = crate::h2_front::start(&up.th, &up.dir, "git.rules.test");
    push_limited_by_ref(&up, "rules-refs-h2", "https://git.rules.test:8443/git/proj.git");
    let seen = seen.lines();
    assert!(!seen.is_empty() && seen.iter().all(|l| l.starts_with("HTTP/2.0 ")), "{seen:?}");
    // Only the agent's push reached the server; the refused ones were answered by the gate.
    let pushes = seen.iter().filter(|l| l.ends_with(" /git/proj.git/git-receive-pack")).count();
    assert_eq!(pushes, 1, "{seen:?}");
}

/// Pushes from a clone of `origin` (the agent's branch, main, a deletion, a tag) in a sandbox
/// whose rule limits pushes to `refs/heads/agent/*`, and checks what git said and what the
/// server's refs are after.
fn push_limited_by_ref(up: &Upstream, project: &str, origin: &str) {
    let p = Project::new(project);
    p.config(&format!(
        "allow = git.rules.test\nresolve = git.rules.test={}\nrule = git.rules.test git-fetch\n\
         rule = git.rules.test git-push /git/proj.git refs/heads/agent/*\nupstream_ca = {}\n",
        up.th.v4,
        up.dir.join("ca.pem").display()
    ));
    let commit = "git -c user.name=dev -c user.email=dev@test commit -qm";
    let script = format!(
        "{{ git clone -q {origin} c && cd c && echo x > f && git add f && {commit} 'agent work'; \
         git push -q origin HEAD:refs/heads/agent/x 2> ../e-agent; echo \"agent rc=$?\"; \
         git push -q origin HEAD:main 2> ../e-main; echo \"main rc=$?\"; \
         git push -q origin --delete agent/x 2> ../e-delete; echo \"delete rc=$?\"; \
         git tag v1 && git push -q origin v1 2> ../e-tag; echo \"tag rc=$?\"; }} > out 2>&1"
    );
    sandbox(&p, &["--", "sh", "-c", &script], &[]).ok();
    let out = std::fs::read_to_string(p.path("out")).unwrap();
    let err = |f: &str| std::fs::read_to_string(p.path(f)).unwrap_or_default();
    let refs = || {
        let o = std::process::Command::new("git")
            .args([
                "--git-dir",
                up.dir.join("repos/proj.git").to_str().unwrap(),
                "for-each-ref",
                "--format=%(refname) %(subject)",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let server = refs();
    // The control: the agent's branch arrived.
    assert!(out.contains("agent rc=0"), "{out}\n{}", err("e-agent"));
    assert!(server.contains("refs/heads/agent/x agent work"), "{server}");
    // main: refused, with the line that would allow it in git's own output; main unchanged.
    assert!(!out.contains("main rc=0"), "{out}");
    assert!(
        err("e-main").contains("rule = git.rules.test git-push /git/proj.git refs/heads/main"),
        "{}",
        err("e-main")
    );
    assert!(server.contains("refs/heads/main first"), "{server}");
    // A deletion, even of the agent's own branch: refused, and the branch is still there.
    assert!(!out.contains("delete rc=0"), "{out}");
    assert!(err("e-delete").contains("never delete"), "{}", err("e-delete"));
    // A tag: no pattern names tags.
    assert!(!out.contains("tag rc=0"), "{out}");
    assert!(err("e-tag").contains("refs/tags/v1"), "{}", err("e-tag"));
    assert!(!server.contains("refs/tags/"), "{server}");
    // In git's own words: the reason as a `remote:` line and the ref rejected.
    assert!(
        err("e-main").contains("remote: blocked by ai-sandbox: this push updates refs/heads/main"),
        "{}",
        err("e-main")
    );
    assert!(err("e-main").contains("[remote rejected]"), "{}", err("e-main"));
    let log = gate_log();
    assert!(log.contains("the push updates refs/heads/main, which no push rule"), "{log}");
    assert!(log.contains("the push deletes refs/heads/agent/x"), "{log}");
}
