//! Logins the gate holds (ADR 0087): the real Claude Code and Codex CLIs, logged in through the
//! store with an access token that has expired, run a turn against the fake model API and its
//! fake token endpoint (tests/e2e/fake_model_api.py, under the real hostnames). The CLI's
//! refresh reaches the token endpoint with the real refresh token (put there by the gate), the
//! new access token reaches the model API, the store gets the new tokens, and the sandbox only
//! ever holds placeholders: its HOME, every process's command line and environment while the
//! agent runs. A placeholder sent where its token does not go is refused (control: the access
//! token's placeholder works on its host), and `ps` says the gate holds the login.

use crate::harness::*;
use crate::real_agents::{API_HOSTS, CODEX_EXEC, ModelApi, agent_path, tool_command};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::path::{Path, PathBuf};

/// One agent's held login, as a test sets it up.
struct Login<'a> {
    agent: &'a str,
    /// The store's files of the login (name, JSON).
    files: Vec<(&'a str, serde_json::Value)>,
    /// What the fake token endpoint answers (`refresh`, `access`, `next`, and `id`).
    tokens: serde_json::Value,
    /// The access token the fake API accepts (the refreshed one).
    access: String,
    /// Every real token of the login, old and new: none may be in the sandbox.
    reals: Vec<String>,
    /// The host the login's token endpoint is on (the allowlist names it).
    auth_host: &'a str,
    /// More lines of the project's config.
    config: &'a str,
    args: Vec<&'a str>,
    /// A shell probe run in a second sandbox of the project: prints what the gate answered.
    probe: String,
    /// What the probe prints when the misuse is refused and the control works.
    probed: Vec<&'a str>,
    /// Part of the log's record of the refused misuse.
    misuse: &'a str,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// A JWT with these claims and a random-looking signature of an RS256 signature's length.
fn jwt(claims: serde_json::Value, seed: &str) -> String {
    let part = |v: &serde_json::Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
    let signature = URL_SAFE_NO_PAD.encode(format!("{seed}-{}", std::process::id()).repeat(16));
    format!("{}.{}.{}", part(&header), part(&claims), &signature[..342.min(signature.len())])
}

/// The project of the agent's preset, pointed at the fake (its hostnames pinned there, its CA
/// the gate's upstream CA), with the login's token endpoint allowed.
fn project(api: &ModelApi, l: &Login) -> Project {
    let p = Project::new(&format!("{}-held", l.agent));
    sandbox(&p, &["init", "--preset", l.agent], &[]).ok();
    let mut text = std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap();
    assert!(text.contains(&format!("\nstate = {}", l.agent)), "the preset carries the login:\n{text}");
    for h in API_HOSTS {
        text += &format!("resolve = {h}={}\n", api.th.v4);
    }
    text += &format!("allow = {}\nupstream_ca = {}\n{}", l.auth_host, api.ca.display(), l.config);
    p.config(&text);
    p
}

/// The flow of the module doc, for one agent.
fn held_login_turn(l: Login) {
    let id = std::process::id();
    let dir = env().root.join(format!("login-tokens-{}-{id}", l.agent));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens.json");
    std::fs::write(&tokens, l.tokens.to_string()).unwrap();
    let vars = [("FAKE_MODEL_TOKENS", tokens.as_os_str())];
    let api = ModelApi::start_with(&format!("{}-login", l.agent), &tool_command(l.agent), &l.access, &vars);
    let p = project(&api, &l);
    // The store of a data dir of this test's own.
    let data = env().home.join(format!("e2e-data-held-{}-{id}", l.agent));
    let store = data.join(format!("ai-sandbox/agents/{}/login", l.agent));
    std::fs::create_dir_all(&store).unwrap();
    for (name, json) in &l.files {
        std::fs::write(store.join(name), json.to_string()).unwrap();
        chown_user(&store.join(name));
    }
    let mut d = store.clone();
    while d != env().home {
        chown_user(&d);
        d = d.parent().unwrap().to_path_buf();
    }
    let data_var = ("XDG_DATA_HOME", data.to_str().unwrap());
    let reals: Vec<&str> = l.reals.iter().map(String::as_str).collect();
    let path = agent_path();
    // Another project's session of the login, started before the refresh: it waits, then runs
    // the probe with the placeholders it was given (ADR 0087: one refresh serves every session).
    let early = project(&api, &l);
    let wait = format!("touch ready; until [ -e go ] || [ -e done ]; do sleep 0.1; done; {}", l.probe);
    let early_run = spawn_sandbox_with_secret_env(&early, &["--", "sh", "-c", &wait], &[data_var]);
    assert!(wait_for(120, || early.path("ready").exists()), "the early session started");
    let child = spawn_sandbox_with_secret_env(&p, &l.args, &[("PATH", &path), data_var]);
    let started = wait_for(120, || p.path("agent-running").exists());
    let leaks = command_lines_containing(&reals);
    let in_environ: Vec<_> = procs_holding("environ", &reals).into_iter().map(|(proc, _)| proc).collect();
    let home = data.join("ai-sandbox/homes");
    let held_home = files_containing(&home, &reals);
    let ps = sandbox(&p, &["ps"], &[data_var]);
    std::fs::write(p.path("done"), "").unwrap();
    let out = child.wait_with_output();
    let all = format!(
        "stdout:\n{}\nstderr:\n{}\nrequests:\n{:#?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        api.requests()
    );
    assert!(started && out.status.success(), "{all}");
    let reqs = api.requests();
    assert!(
        reqs.iter().any(|r| r["api"] == "token" && r["refresh_ok"] == true && r["placeholder"] == false),
        "the token endpoint got the real refresh token:\n{all}"
    );
    assert!(
        reqs.iter().any(|r| r["auth_ok"] == true && r["tool_output"] == true),
        "the model API got the refreshed access token:\n{all}"
    );
    assert!(leaks.is_empty() && in_environ.is_empty(), "a real token in /proc: {leaks:?} {in_environ:?}");
    assert!(held_home.is_empty(), "a real token in the sandbox HOME while it ran: {held_home:?}");
    let said = format!("  login {}: held by the gate\n", l.agent);
    assert!(ps.stdout.contains(&said), "`ps` says who holds the login: {}", ps.stdout);
    assert!(!files_containing(&home, &["aisb_placeholder_"]).is_empty(), "the login holds placeholders");
    assert!(files_containing(&home, &reals).is_empty(), "a real token in the sandbox HOME after it ran");
    let stored: String =
        l.files.iter().map(|(n, _)| std::fs::read_to_string(store.join(n)).unwrap()).collect();
    let (new_access, next) = (l.tokens["access"].as_str().unwrap(), l.tokens["next"].as_str().unwrap());
    assert!(stored.contains(new_access) && stored.contains(next), "the store has the new tokens: {stored}");
    assert!(!stored.contains("aisb_placeholder"), "{stored}");
    // Misuse, beside its control.
    let r = sandbox(&p, &["--", "sh", "-c", &l.probe], &[data_var]);
    r.ok();
    for want in &l.probed {
        assert!(r.stdout.contains(want), "{want} in {}\n{}", r.stdout, r.stderr);
    }
    // An endpoint that echoes the credential it got (the real token, put there by the gate)
    // returns the placeholder to the sandbox.
    let echoed = r.stdout.split("echoed Bearer ").nth(1).unwrap_or_default();
    assert!(echoed.contains("aisb_placeholder_"), "the echo holds the placeholder: {}", r.stdout);
    assert!(!reals.iter().any(|t| r.stdout.contains(t)), "a real token echoed back: {}", r.stdout);
    assert!(
        api.requests().iter().any(|q| q["path"] == "/echo" && q["auth_ok"] == true),
        "the echoing endpoint got the real token"
    );
    // The session started before the refresh sends the refreshed token too: the fake API
    // takes only that one (its control request is answered 200 only with it for Gemini's
    // tokeninfo, and logged with whether it matched for the others).
    let before = api.requests().len();
    std::fs::write(early.path("go"), "").unwrap();
    let early_out = early_run.wait_with_output();
    let early_said = String::from_utf8_lossy(&early_out.stdout).into_owned();
    let later = api.requests().split_off(before);
    assert!(
        early_out.status.success() && later.iter().any(|r| r["auth_ok"] == true),
        "the early session used the refreshed token: {early_said}\n{later:#?}"
    );
    for want in &l.probed {
        assert!(early_said.contains(want), "{want} in the early session's {early_said}");
    }
    let log = gate_log();
    assert!(log.contains(&format!("exfiltration attempt: the placeholder of {}", l.misuse)), "{log}");
    assert!(!reals.iter().any(|t| log.contains(t)), "a token in the gate's log");
    assert!(
        log.contains("login refreshed by the gate: the new tokens are in the store"),
        "the refresh's record"
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn claude_codes_login_stays_with_the_gate_through_a_refresh() {
    let id = std::process::id();
    let (old_access, refresh) =
        (format!("sk-ant-oat01-e2e-old-{id}-a0"), format!("sk-ant-ort01-e2e-{id}-r1"));
    let (access, next) = (format!("sk-ant-oat01-e2e-new-{id}-a1"), format!("sk-ant-ort01-e2e-{id}-r2"));
    let now_ms = now_secs() * 1000;
    let creds = serde_json::json!({"claudeAiOauth": {
        "accessToken": old_access, "refreshToken": refresh, "expiresAt": now_ms - 60_000,
        "scopes": ["user:inference", "user:profile"], "subscriptionType": "max"}});
    let account = serde_json::json!({"hasCompletedOnboarding": true, "oauthAccount": {
        "accountUuid": "e2e", "emailAddress": "e2e@example.invalid", "organizationUuid": "e2e"}});
    // The refresh token's placeholder to the API host (allowed, not where it goes), then the
    // access token's (its host): 403, then 200.
    let probe = "for t in ort01 oat01; do p=$(grep -o \"sk-ant-$t-aisb_placeholder_[0-9a-f]*\" \"$CLAUDE_CONFIG_DIR/.credentials.json\"); \
                 printf '%s=' $t; curl -s -o /dev/null -w '%{http_code} ' -H \"Authorization: Bearer $p\" https://api.anthropic.com/v1/models; done; \
                 curl -s -H \"Authorization: Bearer $p\" https://api.anthropic.com/echo";
    held_login_turn(Login {
        agent: "claude",
        files: vec![(".credentials.json", creds), (".claude.json", account)],
        tokens: serde_json::json!({"refresh": refresh, "access": access, "next": next}),
        access: access.clone(),
        reals: vec![old_access, refresh.clone(), access.clone(), next.clone()],
        auth_host: "platform.claude.com",
        config: "",
        args: vec!["--", "claude", "-p", "Write the file.", "--dangerously-skip-permissions"],
        probe: probe.into(),
        probed: vec!["ort01=403 ", "oat01=200 "],
        misuse: "the claude login's claudeAiOauth.refreshToken",
    });
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn codexs_chatgpt_login_stays_with_the_gate_through_a_refresh() {
    let now = now_secs();
    let auth = serde_json::json!({"chatgpt_plan_type": "pro", "chatgpt_account_id": "acc-e2e",
        "chatgpt_user_id": "user-e2e", "user_id": "user-e2e"});
    let claims = |exp: u64| {
        serde_json::json!({"exp": exp, "iat": now - 7200, "email": "e2e@example.invalid",
            "https://api.openai.com/auth": auth, "https://api.openai.com/profile": {"email": "e2e@example.invalid"}})
    };
    let (old_access, access) = (jwt(claims(now - 60), "access-old"), jwt(claims(now + 36_000), "access-new"));
    let (id_token, new_id) = (jwt(claims(now + 3600), "id-old"), jwt(claims(now + 36_000), "id-new"));
    let id = std::process::id();
    let (refresh, next) = (format!("rt_e2e_{id}_r1"), format!("rt_e2e_{id}_r2"));
    let file = serde_json::json!({"auth_mode": "chatgpt", "OPENAI_API_KEY": null, "last_refresh": "2026-11-01T00:00:00Z",
        "tokens": {"id_token": id_token, "access_token": old_access, "refresh_token": refresh, "account_id": "acc-e2e"}});
    // The id token's placeholder to chatgpt.com (it goes nowhere), then the access token's.
    let probe = "tok() { sed -n \"s/.*\\\"$1\\\": *\\\"\\([^\\\"]*\\)\\\".*/\\1/p\" \"$CODEX_HOME/auth.json\"; }; \
                 for t in id_token access_token; do printf '%s=' $t; curl -s -o /dev/null -w '%{http_code} ' \
                 -H \"Authorization: Bearer $(tok $t)\" https://chatgpt.com/backend-api/codex/models; done; \
                 curl -s -H \"Authorization: Bearer $(tok access_token)\" https://chatgpt.com/echo";
    held_login_turn(Login {
        agent: "codex",
        files: vec![("auth.json", file)],
        tokens: serde_json::json!({"refresh": refresh, "access": access, "next": next, "id": new_id}),
        access: access.clone(),
        reals: vec![
            sig(&old_access),
            refresh.clone(),
            sig(&access),
            next.clone(),
            sig(&id_token),
            sig(&new_id),
        ],
        auth_host: "auth.openai.com",
        config: "",
        args: [&CODEX_EXEC[..], &["Write the file."]].concat(),
        probe: probe.into(),
        probed: vec!["id_token=403 ", "access_token=200 "],
        misuse: "the codex login's tokens.id_token",
    });
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn gemini_clis_google_login_stays_with_the_gate_through_a_refresh() {
    let id = std::process::id();
    // Google's shapes: the refresh token holds slashes, which the gate's form must escape.
    let (old_access, refresh) = (format!("ya29.e2e-old-{id}-a0"), format!("1//0e2e-{id}-r1"));
    let access = format!("ya29.e2e-new-{id}-a1");
    let claims = serde_json::json!({"iss": "https://accounts.google.com", "email": "e2e@example.invalid",
        "exp": now_secs() + 3600});
    let id_token = jwt(claims, "google-id");
    let creds = serde_json::json!({"access_token": old_access, "refresh_token": refresh, "id_token": id_token,
        "scope": "https://www.googleapis.com/auth/cloud-platform", "token_type": "Bearer",
        "expiry_date": now_secs() * 1000 - 60_000});
    let accounts = serde_json::json!({"active": "e2e@example.invalid", "old": []});
    // The refresh token's placeholder to the Code Assist API (allowed, not where it goes), then
    // the access token's to `tokeninfo` (one of its hosts): 403, then 200.
    let probe = "tok() { sed -n \"s/.*\\\"$1\\\": *\\\"\\([^\\\"]*\\)\\\".*/\\1/p\" \"$HOME/.gemini/oauth_creds.json\"; }; \
                 printf 'refresh='; curl -s -o /dev/null -w '%{http_code} ' -X POST -H \"Authorization: Bearer $(tok refresh_token)\" \
                 https://cloudcode-pa.googleapis.com/v1internal:loadCodeAssist; \
                 printf 'access='; curl -s -o /dev/null -w '%{http_code} ' -X POST -H \"Authorization: Bearer $(tok access_token)\" \
                 https://oauth2.googleapis.com/tokeninfo; \
                 curl -s -X POST -H \"Authorization: Bearer $(tok access_token)\" https://cloudcode-pa.googleapis.com/echo";
    held_login_turn(Login {
        agent: "gemini",
        files: vec![("oauth_creds.json", creds), ("google_accounts.json", accounts)],
        tokens: serde_json::json!({"refresh": refresh, "access": access, "next": refresh, "google": true}),
        access: access.clone(),
        reals: vec![old_access, refresh.clone(), access.clone(), sig(&id_token)],
        auth_host: "oauth2.googleapis.com",
        config: "allow = cloudcode-pa.googleapis.com\nenv = GOOGLE_GENAI_USE_GCA=true\nenv = GEMINI_CLI_TRUST_WORKSPACE=true\n",
        args: vec!["--", "gemini", "-p", "Write the file.", "--yolo"],
        probe: probe.into(),
        probed: vec!["refresh=403 ", "access=200 "],
        misuse: "the gemini login's refresh_token",
    });
}

/// A JWT's signature: what the gate holds of it (its claims the CLI reads in the clear).
fn sig(token: &str) -> String {
    token.rsplit('.').next().unwrap().to_string()
}

/// The files below `dir` that hold one of `secrets`.
pub(crate) fn files_containing(dir: &Path, secrets: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for e in entries.flatten() {
        let (path, kind) = (e.path(), e.file_type().unwrap());
        if kind.is_dir() {
            found.extend(files_containing(&path, secrets));
        } else if kind.is_file()
            && let Ok(b) = std::fs::read(&path)
            && secrets.iter().any(|s| b.windows(s.len()).any(|w| w == s.as_bytes()))
        {
            found.push(path);
        }
    }
    found
}

/// A first login inside (ADR 0090): the real `codex login`, its browser played by curl inside
/// the sandbox, exchanges its code at the fake token endpoint through the gate. The store gets
/// the real tokens, the sandbox only placeholders; the next project's sandbox is logged in (a
/// turn works with the tokens the gate captured).
#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn codexs_first_login_inside_is_captured_by_the_gate() {
    let id = std::process::id();
    let now = now_secs();
    let auth = serde_json::json!({"chatgpt_plan_type": "pro", "chatgpt_account_id": "acc-e2e",
        "chatgpt_user_id": "user-e2e", "user_id": "user-e2e"});
    let claims = serde_json::json!({"exp": now + 36_000, "iat": now, "email": "e2e@example.invalid",
        "https://api.openai.com/auth": auth, "https://api.openai.com/profile": {"email": "e2e@example.invalid"}});
    let (access, id_token) = (jwt(claims.clone(), "first-access"), jwt(claims, "first-id"));
    let (refresh, code) = (format!("rt_e2e_{id}_first"), format!("ac_e2e_{id}"));
    let dir = env().root.join(format!("login-first-codex-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens.json");
    let t = serde_json::json!({"code": code, "access": access, "refresh": refresh, "next": refresh, "id": id_token});
    std::fs::write(&tokens, t.to_string()).unwrap();
    let api = ModelApi::start_with(
        "codex-first",
        &tool_command("codex"),
        &access,
        &[("FAKE_MODEL_TOKENS", tokens.as_os_str())],
    );
    let l = Login {
        agent: "codex",
        files: vec![],
        tokens: t.clone(),
        access: access.clone(),
        reals: vec![],
        auth_host: "auth.openai.com",
        config: "",
        args: vec![],
        probe: String::new(),
        probed: vec![],
        misuse: "",
    };
    let p = project(&api, &l);
    let data = env().home.join(format!("e2e-data-first-codex-{id}"));
    std::fs::create_dir_all(&data).unwrap();
    chown_user(&data);
    let data_var = ("XDG_DATA_HOME", data.to_str().unwrap());
    let path = agent_path();
    // `codex login` waits for its browser at localhost:1455 in the sandbox; the "browser" is
    // curl, run there by `ai-sandbox exec`, with the code the fake endpoint knows and the state
    // the CLI put in its URL.
    let mut child =
        spawn_sandbox_with_secret_env(&p, &["--", "codex", "login"], &[("PATH", &path), data_var]);
    let (out, err) = (child.stdout_live(), child.stderr_live());
    let said = || format!("{}{}", out.lock().unwrap(), err.lock().unwrap());
    let url = || {
        said()
            .split_whitespace()
            .find(|w| w.starts_with("https://auth.openai.com/oauth/authorize"))
            .map(str::to_string)
    };
    assert!(wait_for(120, || url().is_some()), "codex login printed its URL: {}", said());
    let url = url().unwrap();
    let state = url.split(['?', '&']).find_map(|kv| kv.strip_prefix("state=")).unwrap().to_string();
    let callback = format!("http://localhost:1455/auth/callback?code={code}&state={state}");
    let browser = sandbox(
        &p,
        &["exec", "--", "curl", "-sL", "-o", "/dev/null", "-w", "%{http_code}", &callback],
        &[data_var],
    );
    let ended = wait_for(60, || !child.is_running());
    if !ended {
        // `codex login` waits for its browser, not for the harness's `done`: end it here.
        sandbox(&p, &["exec", "--", "sh", "-c", "kill -TERM 1"], &[data_var]);
    }
    let all = format!(
        "browser: {} {}\nsaid:\n{}\nrequests:\n{:#?}\nlog:\n{}",
        browser.stdout,
        browser.stderr,
        said(),
        api.requests(),
        gate_log()
    );
    assert!(ended, "codex login ended: {all}");
    let reqs = api.requests();
    assert!(
        reqs.iter()
            .any(|r| r["grant"] == "authorization_code" && r["code_ok"] == true && r["placeholder"] == false),
        "the fake token endpoint got the CLI's code exchange as the CLI sent it: {all}"
    );
    let stored =
        std::fs::read_to_string(data.join("ai-sandbox/agents/codex/login/auth.json")).unwrap_or_default();
    let home = data.join("ai-sandbox/homes");
    let reals = [sig(&access), refresh.clone(), sig(&id_token)];
    let reals: Vec<&str> = reals.iter().map(String::as_str).collect();
    let held = files_containing(&home, &reals);
    assert!(held.is_empty(), "a real token in the sandbox HOME: {held:?}\n{all}");
    assert!(!files_containing(&home, &["aisb_placeholder_"]).is_empty(), "the CLI holds placeholders: {all}");
    assert!(
        stored.contains(&refresh) && stored.contains(&access) && stored.contains(&id_token),
        "the store has the real tokens: {stored}\n{all}"
    );
    assert!(
        !stored.contains("aisb_placeholder_") && stored.contains("\"auth_mode\""),
        "the CLI's file: {stored}"
    );
    assert!(
        gate_log().contains("login made inside, taken by the gate: the new tokens are in the store"),
        "the capture's record"
    );
    // The next project's sandbox is logged in: a turn works with the tokens the gate took.
    let next = project(&api, &l);
    let mut turn = spawn_sandbox_with_secret_env(
        &next,
        &[&CODEX_EXEC[..], &["Write the file."]].concat(),
        &[("PATH", &path), data_var],
    );
    let started = wait_for(120, || next.path("agent-running").exists());
    let in_procs = command_lines_containing(&reals);
    std::fs::write(next.path("done"), "").unwrap();
    let err = turn.stderr_live();
    let ok = wait_for(60, || !turn.is_running());
    let said = format!("{}\nrequests:\n{:#?}", err.lock().unwrap(), api.requests());
    assert!(started && ok, "the next project's turn: {said}");
    assert!(in_procs.is_empty(), "a real token on a command line: {in_procs:?}");
    assert!(
        api.requests().iter().any(|r| r["auth_ok"] == true && r["tool_output"] == true),
        "the model API got the access token the gate took: {said}"
    );
    assert!(files_containing(&home, &reals).is_empty(), "a real token in a sandbox HOME after the turn");
    let _ = std::fs::remove_dir_all(&data);
}
