//! What common clients show of a refusal by the gate, now that the hint is also the reason
//! phrase of the 403 (`HTTP/1.1 403 blocked by ai-sandbox: add "allow = …" to …`). The table in
//! docs/networking.md is this test's: a client that starts (or stops) printing the hint fails it
//! until the table says so. Positive control: the same run reaches an allowed host.

use crate::harness::*;

/// (client, command run inside, whether its output shows the hint)
const CLIENTS: &[(&str, &str, bool)] = &[
    ("curl", "curl -sS https://refused.test/", false),
    ("wget", "wget -q -O /dev/null https://refused.test/", false),
    ("git", "git ls-remote https://refused.test/repo.git", false),
    (
        "python urllib",
        "/usr/bin/python3 -c \"import urllib.request; urllib.request.urlopen('https://refused.test/')\"",
        true,
    ),
    (
        "pip",
        "/usr/bin/python3 -m pip download --no-deps -d /tmp/x --index-url https://refused.test/simple nothing",
        true,
    ),
    ("npm", "npm view nothing --registry https://refused.test/ --fetch-retries 0", true),
];

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn which_clients_show_the_gates_hint_for_a_refused_https_host() {
    let th = TestHost::new().with_tls();
    let p = Project::new("clients");
    p.config(&format!(
        "allow = allowed.test\nresolve = allowed.test={v4}\nresolve = refused.test={v4}\n",
        v4 = th.v4
    ));
    let mut script = String::from(
        "curl -sSk https://allowed.test/ | head -c 200 | grep -q . && echo positive-control-ok; ",
    );
    for (i, (_, cmd, _)) in CLIENTS.iter().enumerate() {
        script += &format!("echo '=== {i}'; {cmd} 2>&1; echo \"rc=$?\"; ");
    }
    let r = sandbox(&p, &["--", "sh", "-c", &script], &[]);
    r.ok();
    assert!(r.stdout.contains("positive-control-ok"), "the allowed host was not reached:\n{}", r.stdout);
    let hint = "blocked by ai-sandbox: add \"allow = refused.test\"";
    let mut table = Vec::new();
    for (i, (name, _, shows)) in CLIENTS.iter().enumerate() {
        let out =
            r.stdout.split(&format!("=== {i}\n")).nth(1).unwrap_or("").split("=== ").next().unwrap_or("");
        assert!(!out.contains("rc=0\n"), "{name} succeeded against a refused host:\n{out}");
        table.push(format!("{name}: shows the hint: {}", out.contains(hint)));
        assert_eq!(out.contains(hint), *shows, "{name} (expected to show the hint: {shows}):\n{out}");
    }
    println!("{}", table.join("\n"));
}
