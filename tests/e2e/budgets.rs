//! Byte budgets (`budget = HOST BYTES`): what a session may send to an allowed host through the
//! gate. Past it the gate sends nothing more: a tunnel is cut at the budget's last byte, a
//! request whose length is known is refused whole before anything goes, and a spent host's next
//! CONNECT is refused; `ps` shows each count against its budget (docs/adr/0066). Upstream: the
//! echo server on a test host, which logs each request's body length and whether it was cut.

use crate::harness::*;
use crate::keys::Upstream;

const SCRIPT: &str = r#"
head -c 921600 /dev/zero | tr '\0' a > a; head -c 204800 /dev/zero | tr '\0' b > b
head -c 61440 /dev/zero | tr '\0' c > c; head -c 153600 /dev/zero | tr '\0' d > d
{
curl --cacert e2e-ca.pem -sS -o /dev/null -w 'first %{http_code}\n' --data-binary @a https://other.test/up1
curl --cacert e2e-ca.pem -sS -o /dev/null -w 'second %{http_code}\n' --data-binary @b https://other.test/up2 2>&1
curl --cacert e2e-ca.pem -sS -o /dev/null -w 'third %{http_connect}\n' https://other.test/up3 2>&1
curl --cacert e2e-ca.pem -sS -o /dev/null -w 'free %{http_code}\n' --data-binary @b https://api2.bound.test/free
curl -sS -o /dev/null -w 'small %{http_code}\n' -H "Authorization: Bearer $API_KEY" --data-binary @c https://api.bound.test/small
curl -sS -o /dev/null -w 'big %{http_code}\n' -H "Authorization: Bearer $API_KEY" --data-binary @d https://api.bound.test/big
} > out 2>&1
touch ready
for i in $(seq 600); do [ -e go ] && break; sleep 0.1; done
curl --cacert e2e-ca.pem -sS -o /dev/null -w 'fourth %{http_code}\n' --data-binary @b https://other.test/up4 >> out 2>&1
touch ready2
"#;

/// A budget of 1 MiB on a blind tunnel's host: 900 KiB go through, the next 200 KiB are cut at
/// the budget (the server received no byte past it), and the host's next CONNECT is refused; a
/// host without a budget takes the same 200 KiB (the control). On a terminated host with a
/// budget of 100 KiB: a 60 KiB body goes (with the real key: the control), a 150 KiB body is
/// refused before anything of it is sent. `ps` shows both counts; the gate logs the refusals.
/// Raised while the sandbox runs (`ai-sandbox allow 'budget = …'`), the spent host takes the
/// next 200 KiB, and the count goes on from what was sent.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_budget_lets_its_bytes_through_and_not_one_more() {
    let up = Upstream::start("");
    let p = Project::new("budgets");
    up.ca_into(&p);
    let mut config = String::new();
    for n in ["other.test", "api2.bound.test", "api.bound.test"] {
        config += &format!("allow = {n}\nresolve = {n}={}\n", up.th.v4);
    }
    config += "secret = API_KEY for api.bound.test\n";
    config += "budget = other.test 1m\nbudget = api.bound.test 100k\n";
    config += &format!("upstream_ca = {}\n", up.dir.join("ca.pem").display());
    p.config(&config);
    let key = "sk-budget-REAL-90d2c1";
    let script = format!("{SCRIPT}{UNTIL_DONE}");
    let child = spawn_sandbox_with_secret_env(&p, &["--", "sh", "-c", &script], &[("API_KEY", key)]);
    assert!(wait_for(120, || p.path("ready").exists()), "the uploads did not finish");
    let ps = user_stdout(&p, &["ps"], &[]);
    // Raised while it runs: what was sent stays counted, the next 200 KiB fit in the new 2 MiB.
    let raise = user_command(&p.dir, &env().bin, &["allow", "--session-only", "budget = other.test 2m"], &[])
        .output()
        .unwrap();
    let raised = String::from_utf8_lossy(&raise.stdout).into_owned();
    assert!(raise.status.success(), "{raised}{}", String::from_utf8_lossy(&raise.stderr));
    std::fs::write(p.path("go"), "").unwrap();
    assert!(wait_for(60, || p.path("ready2").exists()), "the upload after the raise did not finish");
    let ps2 = user_stdout(&p, &["ps"], &[]);
    std::fs::write(p.path("done"), "").unwrap();
    let ended = child.wait_with_output();
    let stderr = String::from_utf8_lossy(&ended.stderr).into_owned();
    assert!(ended.status.success(), "{stderr}");
    let out = std::fs::read_to_string(p.path("out")).unwrap_or_default();
    let reqs = up.requests();
    let at = |t: &str| reqs.iter().find(|r| r["target"] == t).cloned();
    let length = |t: &str| at(t).and_then(|r| r["length"].as_u64());
    // 900 KiB under the budget: whole.
    assert!(out.contains("first 200"), "{out}");
    assert_eq!(length("/up1"), Some(921600), "{reqs:?}");
    // The next 200 KiB: cut at the budget; what the server got of it, with the first, is within it.
    assert!(!out.contains("second 200"), "{out}");
    let second = at("/up2");
    assert!(second.as_ref().is_none_or(|r| r["cut"] == true), "the server got the second whole: {second:?}");
    let got = 921600 + length("/up2").unwrap_or(0);
    assert!(got <= 1 << 20, "the server received {got} bytes, past the budget");
    // Spent: the next CONNECT is refused.
    assert!(out.contains("third 403"), "{out}");
    assert!(at("/up3").is_none(), "{reqs:?}");
    // The control: a host without a budget takes the same 200 KiB.
    assert!(out.contains("free 200"), "{out}");
    assert_eq!(length("/free"), Some(204800), "{reqs:?}");
    // A terminated host: 60 KiB of 100 KiB go (with the real key); 150 KiB more are refused whole.
    assert!(out.contains("small 200"), "{out}");
    assert_eq!(length("/small"), Some(61440), "{reqs:?}");
    assert_eq!(at("/small").unwrap()["headers"]["authorization"], format!("Bearer {key}"));
    assert!(out.contains("big 403"), "{out}");
    assert!(at("/big").is_none(), "the refused body reached the server: {reqs:?}");
    // Raised live: the next upload goes whole, counted on top of what was sent.
    assert!(raised.contains("allowed budget = other.test 2m in the running sandbox"), "{raised}");
    assert!(out.contains("fourth 200"), "{out}");
    assert_eq!(length("/up4"), Some(204800), "{reqs:?}");
    assert!(ps2.contains("budget other.test: sent 1.2m of 2m"), "{ps2}");
    // `ps` shows each count against its budget.
    assert!(ps.contains("budget other.test: sent 1m of 1m (100%)"), "{ps}");
    assert!(ps.contains("budget api.bound.test: sent 6"), "{ps}");
    let log = gate_log();
    assert!(log.contains("over budget: other.test was sent 1m of 1m (budget = other.test 1m)"), "{log}");
    // The 150 KiB body did not fit in what was left: said as that, with a raise that fits it.
    assert!(
        log.contains("to api.bound.test is more than the") && log.contains("over budget: a request of"),
        "{log}"
    );
    assert!(log.contains("budget = other.test 2m"), "the line to raise it: {log}");
    // The launcher says it as it happens and in its summary at exit.
    let summary = stderr.split("refused during this run").nth(1).unwrap_or_default();
    assert!(summary.contains("has had its budget of 1m"), "{stderr}");
}

/// `ask = SECONDS` with a watcher: a connection to a spent host is held and asked about, with
/// the raised line on offer; `s` raises the budget for the running sandbox (the config stays)
/// and the held upload goes through whole. Before the answer, the host had received exactly its
/// budget of the first upload (the control that the budget was spent, not the network gone).
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_watcher_raises_a_spent_budget_for_a_held_connection() {
    use std::io::Write;
    // Alone: a watcher sees every session's held requests, and another ask test's would answer
    // this one's (or this one's, that one's).
    gate_alone();
    let up = Upstream::start("");
    let p = Project::new("budget-ask");
    up.ca_into(&p);
    let config = format!(
        "allow = other.test\nresolve = other.test={}\nbudget = other.test 100k\nask = 60\n",
        up.th.v4
    );
    p.config(&config);
    // A first run starts the gate (it stays a while after), for the watcher to attach to.
    sandbox(&p, &["--", "true"], &[]).ok();
    let (mut watch, seen) = spawn_watch(&p);
    let has = |s: &str| seen.lock().unwrap().contains(s);
    assert!(wait_for(20, || has("watching")), "watch did not start: {}", seen.lock().unwrap());
    let script = "head -c 153600 /dev/zero | tr '\\0' a > a; head -c 51200 /dev/zero | tr '\\0' b > b; \
        c='curl --cacert e2e-ca.pem -sS -o /dev/null -m 90'; \
        echo first=$($c -w '%{http_code}' --data-binary @a https://other.test/a1 2>/dev/null); \
        echo second=$($c -w '%{http_code}' --data-binary @b https://other.test/a2 2>&1)";
    let child = spawn_sandbox(&p, &["--", "sh", "-c", script]);
    let mut keys = watch.stdin.take().unwrap();
    let asked = wait_for(60, || has("ASK") && has("other.test:443"));
    keys.write_all(b"s\n").unwrap();
    let (stdout, all) = end_with_watch(child, keys, watch, &seen);
    assert!(asked, "the spent host's connection was not asked about: {all}");
    let reqs = up.requests();
    let length = |t: &str| reqs.iter().find(|r| r["target"] == t).and_then(|r| r["length"].as_u64());
    // The first upload was cut at the budget; the held one went whole after the raise.
    assert!(!stdout.contains("first=200"), "{all}");
    assert!(length("/a1").is_none_or(|n| n < 153600), "{reqs:?}");
    assert!(stdout.contains("second=200"), "{all}");
    assert_eq!(length("/a2"), Some(51200), "{reqs:?}");
    assert!(has("allowed budget = other.test 200k in the running sandbox"), "{all}");
    assert_eq!(std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap(), config, "s leaves the config");
}

/// The same on a host whose TLS the gate opens (it has a rule): a request whose declared length
/// does not fit is held and asked about as a tunnel is (pipeline::budget, one phase for both
/// paths), never sent before the answer; `s` raises the budget and the held upload goes whole.
/// The control: a small request before it went at once, unasked.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_watcher_raises_a_spent_budget_for_a_held_request_on_a_terminated_host() {
    use std::io::Write;
    gate_alone();
    let up = Upstream::start("");
    let p = Project::new("budget-ask-term");
    // The sandbox trusts the gate's CA (it opens the host's TLS), the gate the test server's.
    let config = format!(
        "allow = other.test\nresolve = other.test={}\nrule = other.test POST /*\nbudget = other.test 100k\nask = 60\nupstream_ca = {}\n",
        up.th.v4,
        up.dir.join("ca.pem").display()
    );
    p.config(&config);
    sandbox(&p, &["--", "true"], &[]).ok();
    let (mut watch, seen) = spawn_watch(&p);
    let has = |s: &str| seen.lock().unwrap().contains(s);
    assert!(wait_for(20, || has("watching")), "watch did not start: {}", seen.lock().unwrap());
    let script = "head -c 10240 /dev/zero | tr '\\0' s > s; head -c 153600 /dev/zero | tr '\\0' a > a; \
        c='curl -sS -o /dev/null -m 90'; \
        echo small=$($c -w '%{http_code}' --data-binary @s https://other.test/t0 2>&1); \
        echo big=$($c -w '%{http_code}' --data-binary @a https://other.test/t1 2>&1)";
    let child = spawn_sandbox(&p, &["--", "sh", "-c", script]);
    let mut keys = watch.stdin.take().unwrap();
    let asked = wait_for(60, || has("ASK") && has("other.test:443"));
    // Held: the upstream has the small request and nothing of the big one.
    let before: Vec<String> = up.requests().iter().map(|r| r["target"].to_string()).collect();
    // Written only when asked (a watcher that ended is said by the assertions below).
    if asked {
        keys.write_all(b"s\n").unwrap();
    }
    let (stdout, all) = end_with_watch(child, keys, watch, &seen);
    assert!(asked, "the request over budget was not asked about: {all}");
    assert_eq!(before, ["\"/t0\""], "before the answer: {all}");
    let reqs = up.requests();
    let length = |t: &str| reqs.iter().find(|r| r["target"] == t).and_then(|r| r["length"].as_u64());
    assert!(stdout.contains("small=200") && stdout.contains("big=200"), "{all}");
    assert_eq!((length("/t0"), length("/t1")), (Some(10240), Some(153600)), "{reqs:?}");
    assert!(has("allowed budget = other.test"), "{all}");
    assert_eq!(std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap(), config, "s leaves the config");
}

const DIRECT: &str = r#"
head -c 921600 /dev/zero | tr '\0' a > a; head -c 204800 /dev/zero | tr '\0' b > b
c() { curl --noproxy '*' --cacert e2e-ca.pem -sS -o /dev/null -m 20 "$@"; }
{
c --resolve other.test:443:$UP -w 'first %{http_code}\n' --data-binary @a https://other.test/d1
c --resolve other.test:443:$UP -w 'second %{http_code}\n' --data-binary @b https://other.test/d2 2>&1
c --resolve other.test:443:$UP -w 'third %{http_code}\n' https://other.test/d3 2>&1
c --resolve other.test:443:$FREE -w 'free %{http_code}\n' --data-binary @b https://other.test/free 2>&1
} > out 2>&1
touch ready
for i in $(seq 600); do [ -e go ] && break; sleep 0.1; done
c --resolve other.test:443:$UP -w 'fourth %{http_code}\n' --data-binary @b https://other.test/d4 >> out 2>&1
touch ready2
"#;

/// `budget = ADDRESS SIZE` on an IP entry, which the gate never sees: the sandbox's rules count
/// it (an nftables quota). 900 KiB go to the address; the next 200 KiB are cut (the server got
/// nothing past the budget, IP and TLS overhead included) and the next connection is reset at
/// once; another address without a budget takes the same 200 KiB (the control). `ps` shows the
/// count; the launcher says the refusal with the line to raise, and so does the gate's log;
/// raised live, the next 200 KiB go whole.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn an_address_budget_is_counted_by_the_rules_and_cut_there() {
    let (up, free) = (Upstream::start(""), Upstream::start(""));
    let p = Project::new("budget-addr");
    let mut ca = std::fs::read(up.dir.join("ca.pem")).unwrap();
    ca.extend(std::fs::read(free.dir.join("ca.pem")).unwrap());
    std::fs::write(p.path("e2e-ca.pem"), ca).unwrap();
    chown_user(&p.path("e2e-ca.pem"));
    let (addr, other) = (up.th.v4.clone(), free.th.v4.clone());
    p.config(&format!("allow = {addr}:443\nallow = {other}:443\nbudget = {addr} 1m\n"));
    let script = format!("UP={addr} FREE={other}\n{DIRECT}{UNTIL_DONE}");
    let mut child = spawn_sandbox(&p, &["--", "sh", "-c", &script]);
    let stderr_live = child.stderr_live();
    assert!(wait_for(120, || p.path("ready").exists()), "the uploads did not finish");
    let ps = user_stdout(&p, &["ps"], &[]);
    let said = wait_for(5, || stderr_live.lock().unwrap().contains("over budget"));
    let raise = format!("budget = {addr} 2m");
    let raised =
        user_command(&p.dir, &env().bin, &["allow", "--session-only", &raise], &[]).output().unwrap();
    let raised_out = String::from_utf8_lossy(&raised.stdout).into_owned();
    assert!(raised.status.success(), "{raised_out}{}", String::from_utf8_lossy(&raised.stderr));
    std::fs::write(p.path("go"), "").unwrap();
    assert!(wait_for(60, || p.path("ready2").exists()), "the upload after the raise did not finish");
    let ps2 = user_stdout(&p, &["ps"], &[]);
    std::fs::write(p.path("done"), "").unwrap();
    let ended = child.wait_with_output();
    // The launcher's summary is its last word: read once it is there.
    wait_for(5, || stderr_live.lock().unwrap().contains("refused during this run"));
    let stderr = stderr_live.lock().unwrap().clone();
    assert!(ended.status.success(), "{stderr}");
    let out = std::fs::read_to_string(p.path("out")).unwrap_or_default();
    // The cut connection's server side ends with the sandbox at the latest (pasta held it).
    assert!(wait_for(20, || up.requests().iter().any(|r| r["target"] == "/d2")), "{:?}", up.requests());
    let reqs = up.requests();
    let at = |t: &str| reqs.iter().find(|r| r["target"] == t).cloned();
    let length = |t: &str| at(t).and_then(|r| r["length"].as_u64());
    // Under the budget: whole.
    assert!(out.contains("first 200"), "{out}");
    assert_eq!(length("/d1"), Some(921600), "{reqs:?}");
    // Past it: cut, and what the server got of both stays within the budget.
    assert!(!out.contains("second 200"), "{out}");
    assert_eq!(at("/d2").map(|r| r["cut"].clone()), Some(serde_json::Value::Bool(true)), "{reqs:?}");
    let got = 921600 + length("/d2").unwrap_or(0);
    assert!(got <= 1 << 20, "the server received {got} bytes, past the budget");
    // Past it, the connection is reset: curl says so as a failure to receive or, when it was
    // still sending (seen once under load, 1 in 3 whole-suite runs), to send.
    assert!(out.contains("Connection reset by peer\nsecond 000"), "cut by a reset: {out}");
    // Spent: the next connection is reset at once, never reaching the server.
    assert!(out.contains("Couldn't connect to server\nthird 000"), "{out}");
    assert!(at("/d3").is_none(), "{reqs:?}");
    // The control: an address without a budget takes the same 200 KiB.
    assert!(out.contains("free 200"), "{out}");
    let free_reqs = free.requests();
    assert!(free_reqs.iter().any(|r| r["target"] == "/free" && r["length"] == 204800), "{free_reqs:?}");
    // Raised live: the next upload goes whole; the count went on from what was sent.
    assert!(
        raised_out.contains(&format!("allowed budget = {addr} 2m in the running sandbox")),
        "{raised_out}"
    );
    assert!(out.contains("fourth 200"), "{out}");
    assert_eq!(length("/d4"), Some(204800), "{reqs:?}");
    assert!(ps.contains(&format!("budget {addr}: sent 1m of 1m (100%)")), "{ps}");
    assert!(ps2.contains(&format!("budget {addr}: sent 1.")) && ps2.contains("m of 2m"), "{ps2}");
    // Said at once and at exit, with the line to raise it; in the gate's log as the rules' refusal.
    assert!(said, "{stderr}");
    let line = format!("ai-sandbox allow 'budget = {addr} 2m'");
    assert!(stderr.contains(&format!("over budget: {addr} was sent its budget of 1m")), "{stderr}");
    assert!(stderr.contains(&line), "{stderr}");
    let summary = stderr.split("refused during this run").nth(1).unwrap_or_default();
    assert!(summary.contains("over budget"), "{stderr}");
    let log = gate_log();
    assert!(log.contains(&line), "{log}");
}

/// `budget = HOST SIZE/day`: one count for every session of the project in the day, kept in the
/// project's state directory, so ending a sandbox and starting the next does not give the budget
/// anew, and neither does the gate's exit (its own runtime dir, idle exit after 1 s: the second
/// session is the next gate's). 900 KiB go in the first session; in the second, 200 KiB more
/// are cut at the budget (the server got no byte past 1 MiB over both) and the host's next
/// CONNECT is refused; another host without a line takes the same 200 KiB (the control). `ps`
/// shows the day's count; the launcher and the gate's log say it with the day's raised line.
/// Raised live (`ai-sandbox allow 'budget = other.test 2m/day'`), the next 200 KiB go whole,
/// counted on top of the day's.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_budget_over_a_day_is_the_projects_across_sessions_and_gates() {
    let up = Upstream::start("");
    let p = Project::new("budget-day");
    up.ca_into(&p);
    let mut config = String::new();
    for n in ["other.test", "api2.bound.test"] {
        config += &format!("allow = {n}\nresolve = {n}={}\n", up.th.v4);
    }
    p.config(&(config + "budget = other.test 1m/day\n"));
    let rt = private_runtime("day-runtime");
    let vars = [("AISB_RUNTIME_DIR", rt.as_str()), ("AISB_GATE_IDLE_EXIT", "1")];
    let curl = "curl --cacert e2e-ca.pem -sS -o /dev/null";
    let first = format!(
        "head -c 921600 /dev/zero | tr '\\0' a > a; {curl} -w 'first %{{http_code}}\\n' --data-binary @a https://other.test/day1"
    );
    let one = sandbox(&p, &["--", "sh", "-c", &first], &vars);
    assert!(one.stdout.contains("first 200"), "{}{}", one.stdout, one.stderr);
    let gate = gate_pid_of(&p, &vars).expect("the first session's gate") as i32;
    assert!(wait_for(20, || exited(gate)), "the idle gate did not exit");
    // On file, in the project's state directory (out of the sandbox's reach).
    let states = env().home.join(".local/state/ai-sandbox/projects");
    let on_file: Vec<String> = std::fs::read_dir(&states)
        .unwrap()
        .flatten()
        .filter_map(|d| std::fs::read_to_string(d.path().join("budgets.json")).ok())
        .filter(|t| t.contains("\"other.test\""))
        .collect();
    assert!(on_file.iter().any(|t| t.contains("\"day\"")), "{on_file:?}");
    let second = format!(
        "head -c 204800 /dev/zero | tr '\\0' b > b\n{{\n\
         {curl} -w 'second %{{http_code}}\\n' --data-binary @b https://other.test/day2 2>&1\n\
         {curl} -w 'third %{{http_connect}}\\n' https://other.test/day3 2>&1\n\
         {curl} -w 'free %{{http_code}}\\n' --data-binary @b https://api2.bound.test/dayfree 2>&1\n\
         }} > out\ntouch ready\n\
         for i in $(seq 600); do [ -e go ] && break; sleep 0.1; done\n\
         {curl} -w 'fourth %{{http_code}}\\n' --data-binary @b https://other.test/day4 >> out 2>&1\n\
         touch ready2\n{UNTIL_DONE}"
    );
    let child = spawn_sandbox_with_secret_env(&p, &["--", "sh", "-c", &second], &vars);
    assert!(wait_for(60, || p.path("ready").exists()), "the second session's uploads did not finish");
    let ps = user_stdout(&p, &["ps"], &vars);
    let log = user_stdout(&p, &["gate", "logs", "--json"], &vars);
    // Raised for the day while it runs: the next 200 KiB go, counted on top of the day's 1 MiB.
    let raised = user_stdout(&p, &["allow", "--session-only", "budget = other.test 2m/day"], &vars);
    std::fs::write(p.path("go"), "").unwrap();
    assert!(wait_for(60, || p.path("ready2").exists()), "the upload after the raise did not finish");
    let ps2 = user_stdout(&p, &["ps"], &vars);
    std::fs::write(p.path("done"), "").unwrap();
    let ended = child.wait_with_output();
    let stderr = String::from_utf8_lossy(&ended.stderr).into_owned();
    assert!(ended.status.success(), "{stderr}");
    let out = std::fs::read_to_string(p.path("out")).unwrap_or_default();
    let reqs = up.requests();
    let at = |t: &str| reqs.iter().find(|r| r["target"] == t).cloned();
    let length = |t: &str| at(t).and_then(|r| r["length"].as_u64());
    assert_eq!(length("/day1"), Some(921600), "{reqs:?}");
    // The second session had what the first left of the day's budget, and not one byte more.
    assert!(!out.contains("second 200"), "{out}");
    let got = 921600 + length("/day2").unwrap_or(0);
    assert!(got <= 1 << 20, "the server received {got} bytes, past the day's budget");
    assert!(out.contains("third 403"), "{out}");
    assert!(at("/day3").is_none(), "{reqs:?}");
    // The control: a host without a budget takes the same 200 KiB in the same session.
    assert!(out.contains("free 200"), "{out}");
    assert_eq!(length("/dayfree"), Some(204800), "{reqs:?}");
    assert!(ps.contains("budget other.test: sent 1m of 1m today (100%)"), "{ps}");
    assert!(
        log.contains("over budget: other.test was sent 1m of 1m today (budget = other.test 1m/day)"),
        "{log}"
    );
    assert!(log.contains("budget = other.test 2m/day"), "the line to raise it: {log}");
    assert!(stderr.contains("today from the project's sessions"), "{stderr}");
    assert!(raised.contains("allowed budget = other.test 2m/day in the running sandbox"), "{raised}");
    assert!(out.contains("fourth 200"), "{out}");
    assert_eq!(length("/day4"), Some(204800), "{reqs:?}");
    assert!(ps2.contains("budget other.test: sent 1.2m of 2m today"), "{ps2}");
    if let Some(pid) = gate_pid_of(&p, &vars) {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
    }
}
