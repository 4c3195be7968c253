//! The real agent CLIs (Claude Code, Codex, Gemini CLI and opencode from npm, pinned in
//! scripts/install-agents, in the test user's own npm prefix; aider from PyPI in a venv of its
//! own) run inside a sandbox made from their `ai-sandbox init` preset,
//! against a fake model API served over TLS in a test namespace under the real API hostnames
//! (the config's `resolve =` pins them there: nothing leaves the machine). Each test checks:
//! the reply arrives; the agent's shell tool writes a project file as the user; the API key
//! arrives (the fake API checks it) and is on no command line while the agent runs; with the
//! API host refused, the launcher says so while the agent is still retrying, and again in its
//! summary at the end.

use crate::harness::*;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Child;
use std::sync::Mutex;

/// A fake model API (tests/e2e/fake_model_api.py) on a test host's port 443, with a
/// certificate for the real API hostnames from a CA made for this test.
pub(crate) struct ModelApi {
    server: Child,
    log: PathBuf,
    pub(crate) ca: PathBuf,
    pub(crate) th: TestHost,
}

/// The API hostnames the fake serves (its certificate names them; each project pins them to it).
pub(crate) const API_HOSTS: [&str; 8] = [
    "api.anthropic.com",
    "api.openai.com",
    "chatgpt.com",
    "generativelanguage.googleapis.com",
    "platform.claude.com",
    "auth.openai.com",
    "cloudcode-pa.googleapis.com",
    "oauth2.googleapis.com",
];

impl ModelApi {
    /// `command`: what the fake model asks the agent's shell tool to run; `key`: the API key it
    /// accepts (passed in a file, never on its command line).
    fn start(name: &str, command: &str, key: &str) -> ModelApi {
        ModelApi::start_with(name, command, key, &[])
    }

    /// `start`, with more of the fake's variables (`FAKE_MODEL_CHAT`, `FAKE_MODEL_HOLD`).
    pub(crate) fn start_with(
        name: &str,
        command: &str,
        key: &str,
        more: &[(&str, &std::ffi::OsStr)],
    ) -> ModelApi {
        let th = TestHost::new();
        let dir = env().root.join(format!("model-api-{name}-{}", th.ns));
        std::fs::create_dir_all(&dir).unwrap();
        test_ca(&dir, &API_HOSTS);
        std::fs::write(dir.join("key"), key).unwrap();
        let log = dir.join("requests.jsonl");
        std::fs::write(&log, "").unwrap();
        let (cert, key, key_file) = (dir.join("leaf.pem"), dir.join("leaf.key"), dir.join("key"));
        let args = [cert.as_os_str(), key.as_os_str(), "443".as_ref()];
        let mut vars = vec![
            ("FAKE_MODEL_COMMAND", command.as_ref()),
            ("FAKE_MODEL_LOG", log.as_os_str()),
            ("FAKE_MODEL_KEY_FILE", key_file.as_os_str()),
        ];
        vars.extend_from_slice(more);
        let server = python_on_443(&th.ns, &dir, "fake_model_api.py", &args, &vars);
        ModelApi { server, log, ca: dir.join("ca.pem"), th }
    }

    /// The requests it has seen, one JSON object each.
    pub(crate) fn requests(&self) -> Vec<serde_json::Value> {
        json_lines(&self.log)
    }

    /// A project whose config is the agent's preset plus the lines that point it at this fake:
    /// the API hostnames pinned to the test host, and the test CA (copied into the project).
    fn project(&self, preset: &str, ca_var: &str, drop_line: Option<&str>) -> Project {
        let p = Project::new(preset);
        let r = sandbox(&p, &["init", "--preset", preset], &[]);
        r.ok();
        let mut text = std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap();
        if let Some(line) = drop_line {
            assert!(text.contains(&format!("{line}\n")), "the preset has no `{line}`:\n{text}");
            text = text.replace(&format!("{line}\n"), "");
        }
        std::fs::copy(&self.ca, p.path("e2e-ca.pem")).unwrap();
        chown_user(&p.path("e2e-ca.pem"));
        for host in API_HOSTS {
            text += &format!("resolve = {host}={}\n", self.th.v4);
        }
        text += &format!("env = {ca_var}={}\n", p.path("e2e-ca.pem").display());
        p.config(&text);
        p
    }
}

impl Drop for ModelApi {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

impl ModelApi {
    /// The agent's preset with its key bound to the API host (the preset's `secret = NAME for
    /// HOST` line uncommented): the
    /// sandbox holds a placeholder, the gate trusts the test CA upstream (`upstream_ca`, a file
    /// outside the project) and the agent trusts the gate's CA (set up by the sandbox).
    pub(crate) fn project_bound(&self, preset: &str, secret: &str, host: &str) -> Project {
        let p = Project::new(&format!("{preset}-bound"));
        sandbox(&p, &["init", "--preset", preset], &[]).ok();
        let mut text = std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap();
        for h in API_HOSTS {
            text += &format!("resolve = {h}={}\n", self.th.v4);
        }
        // The preset's own line, uncommented, as a user would.
        let line = format!("secret = {secret} for {host} ");
        assert!(text.contains(&format!("# {line}")), "the preset has no `# {line}`:\n{text}");
        text = text.replace(&format!("# {line}"), &line);
        text += &format!("upstream_ca = {}\n", self.ca.display());
        p.config(&text);
        p
    }
}

/// What the fake model has the agent run when its key is bound: `tool_command`, after writing
/// what the agent's environment holds under the key's name.
fn bound_tool_command(agent: &str, secret: &str) -> String {
    format!("printenv {secret} > env-seen.txt; {}", tool_command(agent))
}

/// The key arrived at the fake API (checked by `one_turn`); the agent's environment held only
/// the placeholder; the gate terminated the API host and nothing else.
fn held_only_a_placeholder(p: &Project, key: &str) {
    let seen = std::fs::read_to_string(p.path("env-seen.txt")).unwrap();
    assert!(seen.starts_with("aisb_placeholder_") && !seen.contains(key), "the agent's env held: {seen}");
}

/// `codex exec` as the tests run it in a sandbox (its prompt follows).
pub(crate) const CODEX_EXEC: [&str; 5] =
    ["--", "codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"];

/// Where scripts/install-agents puts aider (a venv of its own, readable by the test user).
const AIDER_BIN: &str = "/opt/aisb-aider/bin";

/// PATH with the test user's npm prefix and aider's venv, where scripts/install-agents put the CLIs.
pub(crate) fn agent_path() -> String {
    let bin = env().home.join(".npm-global/bin");
    let aider = std::path::Path::new(AIDER_BIN).join("aider");
    for agent in ["claude", "codex", "gemini", "opencode"].map(|a| bin.join(a)).into_iter().chain([aider]) {
        assert!(agent.exists(), "{} missing: run scripts/install-agents", agent.display());
    }
    format!("{}:{}:{AIDER_BIN}:/usr/local/bin:/usr/bin:/bin", env().root.join("bin").display(), bin.display())
}

/// What the fake model has the agent run: write a file in the project, say so, then wait for
/// the test (which meanwhile scans every command line for the key) to write `done`. No command
/// substitution: Gemini CLI's shell tool refuses any `$(…)`.
pub(crate) fn tool_command(agent: &str) -> String {
    format!(
        "echo written-by-{agent} > agent-wrote.txt && touch agent-running && \
         timeout 60 sh -c 'until [ -e done ]; do sleep 0.1; done'"
    )
}

/// Runs the agent with its key to the end of its turn; checks the reply, the file its shell
/// tool wrote, the key's path (the fake API saw it; no command line did), and the gate's log.
fn one_turn(api: &ModelApi, p: &Project, agent: &str, args: &[&str], key: (&str, &str)) -> String {
    let running = || p.path("agent-running").exists();
    let all = turn(api, p, agent, args, key, &running, &|| std::fs::write(p.path("done"), "").unwrap());
    let reqs = api.requests();
    assert!(
        reqs.iter().any(|r| r["auth_ok"] == true && r["called"].is_string()),
        "the fake API got the key with the request it answered with a tool call:\n{all}"
    );
    assert!(reqs.iter().any(|r| r["auth_ok"] == true && r["tool_output"] == true), "{all}");
    all
}

/// One turn of the agent: started, it is `running` until the test scans every command line for
/// the key and then lets it `go` on; it ends well, with the model's final reply on stdout and
/// `agent-wrote.txt` written by the agent as the user; the key is not in the gate's log.
fn turn(
    api: &ModelApi,
    p: &Project,
    agent: &str,
    args: &[&str],
    key: (&str, &str),
    running: &dyn Fn() -> bool,
    go: &dyn Fn(),
) -> String {
    let path = agent_path();
    let child = spawn_sandbox_with_secret_env(p, args, &[key, ("PATH", &path)]);
    let started = wait_for(120, running);
    let leaks = command_lines_containing(&[key.1]);
    go();
    let out = child.wait_with_output();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let all = format!("stdout:\n{stdout}\nstderr:\n{stderr}\nrequests:\n{:#?}", api.requests());
    assert!(started, "the agent never got as far as its tool or its model's reply:\n{all}");
    assert!(out.status.success(), "{all}");
    assert!(leaks.is_empty(), "the API key on a command line: {leaks:?}");
    assert!(stdout.contains("FAKE-MODEL-DONE"), "the model's final reply:\n{all}");
    let wrote = p.path("agent-wrote.txt");
    assert_eq!(std::fs::read_to_string(&wrote).unwrap(), format!("written-by-{agent}\n"), "{all}");
    assert_eq!(std::fs::metadata(&wrote).unwrap().uid(), env().uid, "written as the user");
    assert!(!gate_log().contains(key.1), "the key in the gate's log");
    all
}

/// With the API host refused: the launcher's notice appears while the agent still runs (it
/// retries), with the line that would allow it; SIGTERM ends the sandbox, whose summary
/// counts the refusals. No model request reached the fake API.
fn refused(api: &ModelApi, p: &Project, args: &[&str], key: (&str, &str), host: &str) {
    let before = api.requests().len();
    let path = agent_path();
    let mut child = spawn_sandbox_with_secret_env(p, args, &[key, ("PATH", &path)]);
    let err = child.stderr_live();
    let notice = format!(
        "ai-sandbox: refused {host}:443 (add \"allow = {host}\" to {}",
        p.path(".ai-sandbox/config").display()
    );
    let said = wait_for(120, || err.lock().unwrap().contains(&notice));
    let live = child.is_running();
    let pid = pid_of_launcher(p);
    if let Some(pid) = pid {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
    }
    let _ = child.wait_with_output();
    let err = err_text(&err);
    assert!(said, "no notice of the refusal: {err}");
    assert!(live && pid.is_some(), "the notice came only after the sandbox ended: {err}");
    let summary = err
        .split("ai-sandbox: refused during this run")
        .nth(1)
        .unwrap_or_else(|| panic!("no summary: {err}"));
    // "once" or "N times": the test stops the sandbox as soon as the first notice is out.
    let counted = summary.contains("once, first at") || summary.contains("times, first at");
    assert!(summary.contains(&format!("{host}:443")) && counted, "{err}");
    let model_calls =
        api.requests()[before..].iter().filter(|r| r["api"].is_string() || r["upgrade"].is_string()).count();
    assert_eq!(model_calls, 0, "a request reached the refused API");
}

/// All of stderr, once its reader has seen the end (it holds the other reference until then).
fn err_text(err: &std::sync::Arc<Mutex<String>>) -> String {
    wait_for(10, || std::sync::Arc::strong_count(err) == 1);
    err.lock().unwrap().clone()
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn claude_code_works_through_the_gate_and_a_refused_api_is_said_at_once() {
    let key = format!("sk-ant-e2e-{}-7c1d0e", std::process::id());
    let api = ModelApi::start("claude", &tool_command("claude"), &key);
    let p = api.project("claude", "NODE_EXTRA_CA_CERTS", None);
    let args = [
        "-e",
        "ANTHROPIC_API_KEY",
        "--",
        "claude",
        "-p",
        "Write the file.",
        "--dangerously-skip-permissions",
    ];
    let all = one_turn(&api, &p, "claude", &args, ("ANTHROPIC_API_KEY", &key));
    assert!(
        api.requests()
            .iter()
            .any(|r| r["api"] == "anthropic" && r["stream"] == true && r["called"] == "Bash"),
        "Claude Code streamed its Messages request and got the Bash call:\n{all}"
    );

    let q = api.project("claude", "NODE_EXTRA_CA_CERTS", Some("allow = api.anthropic.com"));
    refused(&api, &q, &args, ("ANTHROPIC_API_KEY", &key), "api.anthropic.com");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn codex_works_over_websocket_and_sse_and_a_refused_api_is_said_at_once() {
    let key = format!("sk-e2e-codex-{}-4b9a21", std::process::id());
    let api = ModelApi::start("codex", &tool_command("codex"), &key);
    let exec = CODEX_EXEC;
    let prompt = "Write the file.";
    // Codex's default transport: the Responses API over a WebSocket.
    let p = api.project("codex", "CODEX_CA_CERTIFICATE", None);
    let mut args = vec!["-e", "CODEX_API_KEY"];
    args.extend(exec);
    args.push(prompt);
    let all = one_turn(&api, &p, "codex", &args, ("CODEX_API_KEY", &key));
    let ws = |r: &serde_json::Value| r["transport"] == "websocket" && r["called"].is_string();
    assert!(api.requests().iter().any(ws), "the tool call went over the WebSocket:\n{all}");

    // The same over HTTPS with SSE (a provider without WebSockets, as a proxy-only network has).
    let before = api.requests().len();
    let p = api.project("codex", "CODEX_CA_CERTIFICATE", None);
    let provider = "model_providers.e2e={name=\"e2e\",base_url=\"https://api.openai.com/v1\",env_key=\"CODEX_API_KEY\",wire_api=\"responses\",supports_websockets=false}";
    let mut sse_args = args[..args.len() - 1].to_vec();
    sse_args.extend(["-c", provider, "-c", "model_provider=e2e", prompt]);
    let all = one_turn(&api, &p, "codex", &sse_args, ("CODEX_API_KEY", &key));
    let sse = |r: &serde_json::Value| r["transport"] == "sse" && r["called"].is_string();
    assert!(api.requests()[before..].iter().any(sse), "the tool call went over SSE:\n{all}");
    assert!(!api.requests()[before..].iter().any(|r| r["upgrade"] == "websocket"), "{all}");

    // Refused: Codex retries "Reconnecting… waiting for network" for ever; the launcher says why.
    let q = api.project("codex", "CODEX_CA_CERTIFICATE", Some("allow = api.openai.com"));
    refused(&api, &q, &args, ("CODEX_API_KEY", &key), "api.openai.com");
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn claude_code_with_a_bound_key_never_holds_it() {
    let key = format!("sk-ant-e2e-{}-b0a11d", std::process::id());
    let api = ModelApi::start("claude-bound", &bound_tool_command("claude", "ANTHROPIC_API_KEY"), &key);
    let p = api.project_bound("claude", "ANTHROPIC_API_KEY", "api.anthropic.com");
    let args = ["--", "claude", "-p", "Write the file.", "--dangerously-skip-permissions"];
    let all = one_turn(&api, &p, "claude", &args, ("ANTHROPIC_API_KEY", &key));
    held_only_a_placeholder(&p, &key);
    assert!(
        api.requests().iter().any(|r| r["api"] == "anthropic" && r["stream"] == true && r["auth_ok"] == true),
        "Claude Code's streamed request arrived with the real key:\n{all}"
    );
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn codex_with_a_bound_key_never_holds_it() {
    let key = format!("sk-e2e-codex-{}-b0a11d", std::process::id());
    let api = ModelApi::start("codex-bound", &bound_tool_command("codex", "CODEX_API_KEY"), &key);
    let p = api.project_bound("codex", "CODEX_API_KEY", "api.openai.com");
    let args = [&CODEX_EXEC[..], &["Write the file."]].concat();
    let all = one_turn(&api, &p, "codex", &args, ("CODEX_API_KEY", &key));
    held_only_a_placeholder(&p, &key);
    let ws = |r: &serde_json::Value| r["transport"] == "websocket" && r["called"].is_string();
    assert!(
        api.requests().iter().any(ws),
        "the tool call went over the WebSocket, through the gate's relay:\n{all}"
    );
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn gemini_cli_with_a_bound_key_never_holds_it() {
    let key = format!("AIza-e2e-gemini-{}-b0a11d", std::process::id());
    let api = ModelApi::start("gemini-bound", &bound_tool_command("gemini", "GEMINI_API_KEY"), &key);
    let p = api.project_bound("gemini", "GEMINI_API_KEY", "generativelanguage.googleapis.com");
    // `gemini -p` runs only in a folder it trusts: the preset's commented line, taken as a user would.
    let cfg = std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap();
    let trust = "env = GEMINI_CLI_TRUST_WORKSPACE=true";
    assert!(cfg.contains(&format!("# {trust}")), "{cfg}");
    p.config(&cfg.replace(&format!("# {trust}"), trust));
    let args = ["--", "gemini", "-p", "Write the file.", "--yolo"];
    let all = one_turn(&api, &p, "gemini", &args, ("GEMINI_API_KEY", &key));
    held_only_a_placeholder(&p, &key);
    assert!(
        api.requests().iter().any(|r| r["api"] == "gemini" && r["stream"] == true && r["auth_ok"] == true),
        "Gemini CLI's streamed request arrived with the real key:\n{all}"
    );
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn opencode_with_a_bound_key_never_holds_it() {
    let key = format!("sk-ant-e2e-{}-0c0de1", std::process::id());
    let api = ModelApi::start("opencode-bound", &bound_tool_command("opencode", "ANTHROPIC_API_KEY"), &key);
    let p = api.project_bound("opencode", "ANTHROPIC_API_KEY", "api.anthropic.com");
    let args = ["--", "opencode", "run", "--model", "anthropic/claude-sonnet-4-5", "Write the file."];
    let all = one_turn(&api, &p, "opencode", &args, ("ANTHROPIC_API_KEY", &key));
    held_only_a_placeholder(&p, &key);
    assert!(
        api.requests()
            .iter()
            .any(|r| r["api"] == "anthropic" && r["called"] == "bash" && r["auth_ok"] == true),
        "opencode's request arrived with the real key and got the bash call:\n{all}"
    );
}

/// aider's model does not call tools: the fake model's reply is an edit in aider's `whole`
/// format, which aider applies as the user; the streamed reply is held until the test has scanned the command
/// lines (aider is mid-request then). Its environment is read by the sandbox's command before
/// aider starts.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps and scripts/install-agents; run by scripts/test"]
fn aider_with_a_bound_key_never_holds_it() {
    let key = format!("sk-e2e-aider-{}-a1d3r0", std::process::id());
    let hold = env().root.join(format!("aider-hold-{}", std::process::id()));
    let _ = std::fs::remove_file(&hold);
    let reply = "agent-wrote.txt\n```\nwritten-by-aider\n```\n\nFAKE-MODEL-DONE\n";
    let more = [("FAKE_MODEL_CHAT", reply.as_ref()), ("FAKE_MODEL_HOLD", hold.as_os_str())];
    let api = ModelApi::start_with("aider-bound", "true", &key, &more);
    let p = api.project_bound("aider", "OPENAI_API_KEY", "api.openai.com");
    let aider = "printenv OPENAI_API_KEY > env-seen.txt; exec /opt/aisb-aider/bin/aider --model gpt-4o --edit-format whole \
        --yes-always --no-git --analytics-disable --no-show-model-warnings --message 'Write the file.'";
    let asked = || api.requests().iter().any(|r| r["api"] == "openai-chat");
    let all = turn(&api, &p, "aider", &["--", "sh", "-c", aider], ("OPENAI_API_KEY", &key), &asked, &|| {
        std::fs::write(&hold, "").unwrap()
    });
    held_only_a_placeholder(&p, &key);
    assert!(
        api.requests()
            .iter()
            .any(|r| r["api"] == "openai-chat" && r["stream"] == true && r["auth_ok"] == true),
        "aider's streamed request arrived with the real key:\n{all}"
    );
}
