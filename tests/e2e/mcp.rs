//! MCP tool rules (`rule = HOST mcp PATH TOOL...`): a real MCP server (the official Python SDK's
//! FastMCP over streamable HTTP, tests/e2e/mcp_server.py) on a test host, and the SDK's own
//! client inside the sandbox. The gate lets the allowed tools be called and listed, answers a
//! call of another tool with a JSON-RPC error carrying the line to add before the server sees
//! it (the server's own log says what arrived), and hides the other tools from `tools/list`, in
//! JSON answers and in event streams. Each refusal beside an allowed call.

use crate::harness::*;
use std::process::Child;

/// The MCP test tools' Python (scripts/install-test-tools: mcp, pinned).
const MCP_PYTHON: &str = "/opt/aisb-mcp/bin/python";

/// The MCP server on a test host, answering POSTs as `mode` (`json` or `sse`), over HTTP/2 too
/// when `h2` (else HTTP/1.1 only), and its CA.
struct McpUpstream {
    server: Child,
    log: std::path::PathBuf,
    dir: std::path::PathBuf,
    th: TestHost,
}

impl McpUpstream {
    fn start(mode: &str, h2: bool) -> McpUpstream {
        let th = TestHost::new();
        let dir = env().root.join(format!("mcp-{}", th.ns));
        std::fs::create_dir_all(&dir).unwrap();
        test_ca(&dir, &["mcp.test"]);
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let log = dir.join("messages.jsonl");
        std::fs::write(&log, "").unwrap();
        let (cert, key) = (dir.join("leaf.pem"), dir.join("leaf.key"));
        let server = interpreter_on_443(
            MCP_PYTHON,
            &th.ns,
            &dir,
            "mcp_server.py",
            &[cert.as_os_str(), key.as_os_str(), mode.as_ref(), if h2 { "h2" } else { "h1" }.as_ref()],
            &[("MCP_LOG", log.as_os_str())],
        );
        McpUpstream { server, log, dir, th }
    }

    /// The tools each `tools/call` the server received named, and their first argument.
    fn calls(&self) -> Vec<(String, String)> {
        json_lines(&self.log)
            .iter()
            .filter(|m| m["method"] == "tools/call")
            .map(|m| (m["tool"].as_str().unwrap_or("").into(), m["marker"].as_str().unwrap_or("").into()))
            .collect()
    }
}

impl Drop for McpUpstream {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// The SDK's client inside: each step prints one line. With `MCP_HTTP2=1` it speaks HTTP/2 to
/// the gate (httpx with h2: the gate's ALPN chooses it) and says which versions it was answered
/// in (`versions`).
const CLIENT: &str = r#"
import asyncio, json, os
import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

URL = "https://mcp.test/mcp"
H2 = os.environ.get("MCP_HTTP2") == "1"
versions = set()

async def seen(r):
    versions.add(r.http_version)

def client(headers=None, timeout=None, auth=None):
    # The SDK's own defaults (create_mcp_http_client), with HTTP/2 offered.
    t = timeout or httpx.Timeout(30, read=300)
    return httpx.AsyncClient(http2=H2, headers=headers, timeout=t, auth=auth, follow_redirects=True,
                             event_hooks={"response": [seen]})

async def call(s, name, tool, arg):
    try:
        r = await s.call_tool(tool, arg)
        print(name, "ok", r.content[0].text if r.content else "", flush=True)
    except McpError as e:
        print(name, "refused", e.error.code, e.error.message, flush=True)

TOKEN = os.environ.get("MCP_TOKEN", "")
AUTH = {"authorization": "Bearer " + TOKEN} if TOKEN else {}
print("token", TOKEN[:17], flush=True)

async def main():
    async with streamablehttp_client(URL, headers=AUTH, httpx_client_factory=client) as (r, w, sid):
        async with ClientSession(r, w) as s:
            await s.initialize()
            tools = await s.list_tools()
            print("list", ",".join(sorted(t.name for t in tools.tools)), flush=True)
            await call(s, "search", "search_issues", {"query": "allowed-7c1"})
            await call(s, "create", "create_issue", {"title": "allowed-2b9"})
            await call(s, "delete", "delete_repository", {"name": "refused-5e3"})
            session = sid()
    # A batch with a refused call in it, as raw JSON-RPC: nothing of it reaches the server.
    batch = [
        {"jsonrpc": "2.0", "id": 90, "method": "tools/call", "params": {"name": "search_issues", "arguments": {"query": "batch-4d0"}}},
        {"jsonrpc": "2.0", "id": 91, "method": "tools/call", "params": {"name": "delete_repository", "arguments": {"name": "batch-4d0"}}},
    ]
    headers = {"accept": "application/json, text/event-stream", "mcp-session-id": session or "", **AUTH}
    async with client() as c:
        r = await c.post(URL, json=batch, headers=headers, timeout=20)
    try:
        print("batch", r.status_code, json.dumps([m.get("error", {}).get("code") for m in r.json()]), flush=True)
    except Exception as e:
        print("batch", r.status_code, "unreadable", repr(e), flush=True)
    print("versions", ",".join(sorted(versions)), flush=True)

asyncio.run(main())
"#;

/// The same session against a server that answers with JSON and one that answers with event
/// streams, each with HTTP/1.1 only and with HTTP/2 (the client offers it, the server chooses
/// it, so the gate reads each HTTP/2 stream's messages): the allowed tools listed and called
/// (the server received both calls), the refused one answered with the line and never
/// received, a batch with a refused call refused whole; `ps` counts the calls by tool.
/// The server's token is bound to it (`secret = MCP_TOKEN for mcp.test`, the usual case of a
/// hosted MCP server): the server received the real token, the sandbox held a placeholder.
///
/// Mutation runs (2026-12-05): `mcp::filter` keeping every tool → fails at `list` in json
/// mode; `Events` passing each event unfiltered → fails at `list` in sse mode.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn an_mcp_servers_tools_are_called_and_listed_as_the_rules_allow() {
    for (answers, h2) in [("json", false), ("sse", false), ("json", true), ("sse", true)] {
        let up = McpUpstream::start(answers, h2);
        let version = if h2 { "HTTP/2" } else { "HTTP/1.1" };
        let mode = &format!("{answers} over {version}");
        let p = Project::new(&format!("mcp-{answers}-{}", if h2 { "h2" } else { "h1" }));
        p.config(&format!(
            "allow = mcp.test\nresolve = mcp.test={}\nrule = mcp.test mcp /mcp search_* create_issue\nsecret = MCP_TOKEN for mcp.test\nupstream_ca = {}\n",
            up.th.v4,
            up.dir.join("ca.pem").display()
        ));
        std::fs::write(p.path("client.py"), CLIENT).unwrap();
        chown_user(&p.path("client.py"));
        let token = "mcp-token-real-e2e-58d1f0";
        let script = format!(
            "MCP_HTTP2={} {MCP_PYTHON} client.py > out.txt 2>&1; echo rc=$? >> out.txt; touch ready; {UNTIL_DONE}",
            u8::from(h2)
        );
        let child = spawn_sandbox_with_secret_env(&p, &["--", "sh", "-c", &script], &[("MCP_TOKEN", token)]);
        assert!(wait_for(120, || p.path("ready").exists()), "{mode}: the client did not finish");
        let leaks = command_lines_containing(&[token]);
        // `ps`, while it runs: the calls by tool. The refused batch held an allowed call of
        // search_issues, never sent: it is not counted as allowed.
        let ps = user_stdout(&p, &["ps"], &[]);
        finish(&p, child);
        for want in [
            "  mcp mcp.test create_issue: allowed 1, refused 0\n",
            "  mcp mcp.test delete_repository: allowed 0, refused 2\n",
            "  mcp mcp.test search_issues: allowed 1, refused 0\n",
        ] {
            assert!(ps.contains(want), "{mode}: no `{want}` in ps:\n{ps}");
        }
        assert!(leaks.is_empty(), "the token on a command line: {leaks:?}");
        let out = &std::fs::read_to_string(p.path("out.txt")).unwrap();
        let line = |k: &str| out.lines().find(|l| l.starts_with(&format!("{k} "))).unwrap_or("").to_string();
        let server = std::fs::read_to_string(up.dir.join("server.err")).unwrap_or_default();
        assert!(out.contains("rc=0"), "{mode}: {out}\nserver: {server}");
        assert_eq!(line("token"), "token aisb_placeholder_", "{mode}: the sandbox's token: {out}");
        assert!(!out.contains(token), "{mode}: {out}");
        // Listed: only what the rules allow (the server has three tools).
        assert_eq!(line("list"), "list create_issue,search_issues", "{mode}: {out}");
        // The controls: both allowed calls answered by the server, and received by it.
        assert_eq!(line("search"), "search ok found: allowed-7c1", "{mode}: {out}");
        assert_eq!(line("create"), "create ok created: allowed-2b9", "{mode}: {out}");
        let delete = line("delete");
        assert!(delete.starts_with("delete refused -32001 "), "{mode}: {out}");
        assert!(delete.contains("rule = mcp.test mcp /mcp delete_repository"), "{mode}: {delete}");
        assert_eq!(line("batch"), "batch 200 [-32001, -32001]", "{mode}: {out}");
        assert_eq!(line("versions"), format!("versions {version}"), "{mode}: {out}");
        let auth: Vec<String> =
            json_lines(&up.log).iter().map(|m| m["authorization"].as_str().unwrap_or("").into()).collect();
        assert!(!auth.is_empty() && auth.iter().all(|a| *a == format!("Bearer {token}")), "{mode}: {auth:?}");
        let calls = up.calls();
        let tools: Vec<&str> = calls.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(tools, ["search_issues", "create_issue"], "{mode}: the server received {calls:?}");
        assert!(!calls.iter().any(|(_, m)| m.contains("batch") || m.contains("refused")), "{calls:?}");
        // The log: the refusal with its line, the calls by tool, and the hidden tool.
        let log = gate_log();
        assert!(log.contains("\"allow\":\"rule = mcp.test mcp /mcp delete_repository\""), "{mode}: {log}");
        assert!(log.contains("MCP tools/call search_issues"), "{mode}: {log}");
        assert!(log.contains("MCP tools/list: 1 tool(s)"), "{mode}: {log}");
    }
}

/// A learning run (`ai-sandbox learn`) relays a call of a tool no rule allows, as it relays an
/// unlisted host, and proposes the line that would allow it; without a terminal nothing is
/// written. Control: the allowed calls go as in any run.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn learn_proposes_the_mcp_tool_lines_a_trusted_run_needed() {
    let up = McpUpstream::start("json", false);
    let p = Project::new("mcp-learn");
    let config = format!(
        "allow = mcp.test\nresolve = mcp.test={}\nrule = mcp.test mcp /mcp search_* create_issue\nupstream_ca = {}\n",
        up.th.v4,
        up.dir.join("ca.pem").display()
    );
    p.config(&config);
    std::fs::write(p.path("client.py"), CLIENT).unwrap();
    chown_user(&p.path("client.py"));
    let r = sandbox(&p, &["learn", "--", MCP_PYTHON, "client.py"], &[]);
    let (out, err) = (&r.stdout, &r.stderr);
    assert_eq!(r.code, 0, "{out}\n{err}");
    assert!(out.contains("search ok found: allowed-7c1"), "{out}");
    assert!(out.contains("delete ok deleted: refused-5e3"), "a learning run relays it: {out}");
    assert!(err.contains("these lines would:\n  rule = mcp.test mcp /mcp delete_repository\n"), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    assert!(!err.contains("allow = mcp.test"), "its host is in the allowlist already: {err}");
    let tools: Vec<String> = up.calls().into_iter().map(|(t, _)| t).collect();
    assert!(
        tools.contains(&"delete_repository".to_string()) && tools.contains(&"search_issues".to_string()),
        "{tools:?}"
    );
    let now = std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap();
    assert_eq!(now, config, "learn wrote without asking");
}

/// The real Claude Code CLI (scripts/install-agents), with the server in its project's
/// `.mcp.json`, against the fake model API (tests/e2e/fake_model_api.py), which calls the MCP
/// tool it names when the CLI offers it. The model is offered the allowed tools and not the
/// other (Claude Code listed the server's tools through the gate); its call of an allowed tool
/// reaches the server, and the server's answer comes back to the model. The model API's key and
/// the server's token are bound: the CLI holds placeholders of both.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn claude_code_is_offered_only_the_allowed_mcp_tools_and_its_call_reaches_the_server() {
    let key = "sk-ant-e2e-mcp-4f0c2a";
    let call = r#"mcp__e2e__search_issues {"query": "claude-6a2"}"#;
    let more = [("FAKE_MODEL_MCP_CALL", std::ffi::OsStr::new(call))];
    let api = crate::real_agents::ModelApi::start_with("claude-mcp", "true", key, &more);
    let up = McpUpstream::start("sse", false);
    let p = api.project_bound("claude", "ANTHROPIC_API_KEY", "api.anthropic.com");
    // One file of roots for the gate: the model API's test CA and the MCP server's.
    let roots = up.dir.join("roots.pem");
    let both =
        std::fs::read_to_string(&api.ca).unwrap() + &std::fs::read_to_string(up.dir.join("ca.pem")).unwrap();
    std::fs::write(&roots, both).unwrap();
    let mut config = std::fs::read_to_string(p.path(".ai-sandbox/config")).unwrap();
    let old = format!("upstream_ca = {}\n", api.ca.display());
    assert!(config.contains(&old), "{config}");
    config = config.replace(&old, &format!("upstream_ca = {}\n", roots.display()));
    // The MCP tools offered to the model with the first request, not deferred behind the CLI's
    // tool search (which the fake model does not use).
    config += &format!(
        "allow = mcp.test\nresolve = mcp.test={}\nrule = mcp.test mcp /mcp search_* create_issue\nsecret = MCP_TOKEN for mcp.test\nenv = ENABLE_TOOL_SEARCH=false\n",
        up.th.v4
    );
    p.config(&config);
    let servers = r#"{"mcpServers": {"e2e": {"type": "http", "url": "https://mcp.test/mcp",
        "headers": {"Authorization": "Bearer ${MCP_TOKEN}"}}}}"#;
    std::fs::write(p.path(".mcp.json"), servers).unwrap();
    std::fs::create_dir_all(p.path(".claude")).unwrap();
    std::fs::write(p.path(".claude/settings.json"), r#"{"enableAllProjectMcpServers": true}"#).unwrap();
    for f in [".mcp.json", ".claude", ".claude/settings.json"] {
        chown_user(&p.path(f));
    }
    let token = "mcp-token-real-e2e-claude-91b3";
    let path = crate::real_agents::agent_path();
    let args = ["--", "claude", "-p", "Search the issues.", "--dangerously-skip-permissions"];
    let secrets = [("ANTHROPIC_API_KEY", key), ("MCP_TOKEN", token), ("PATH", &path)];
    let out = spawn_sandbox_with_secret_env(&p, &args, &secrets).wait_with_output();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let reqs = api.requests();
    let server = std::fs::read_to_string(up.dir.join("server.err")).unwrap_or_default();
    let all = format!("stdout:\n{stdout}\nstderr:\n{stderr}\nrequests:\n{reqs:#?}\nserver:\n{server}");
    assert!(out.status.success(), "{all}");
    assert!(stdout.contains("FAKE-MODEL-DONE"), "{all}");
    // Offered: the allowed tools (the control: the CLI did list the server's tools), not the other.
    let offered =
        reqs.iter().find(|r| r["called"] == "mcp__e2e__search_issues").unwrap_or_else(|| panic!("{all}"));
    let tools: Vec<&str> = offered["tools"].as_array().unwrap().iter().filter_map(|t| t.as_str()).collect();
    assert!(tools.contains(&"mcp__e2e__create_issue"), "{tools:?}");
    assert!(!tools.iter().any(|t| t.contains("delete_repository")), "{tools:?}");
    // The call reached the server, with the real token, and its answer reached the model.
    let answered = reqs.iter().filter_map(|r| r["answer"].as_str()).any(|a| a.contains("found: claude-6a2"));
    assert!(answered, "{all}");
    assert_eq!(up.calls(), [("search_issues".to_string(), "claude-6a2".to_string())], "{all}");
    let auth: Vec<String> =
        json_lines(&up.log).iter().map(|m| m["authorization"].as_str().unwrap_or("").into()).collect();
    assert!(!auth.is_empty() && auth.iter().all(|a| *a == format!("Bearer {token}")), "{auth:?}");
    assert!(reqs.iter().any(|r| r["auth_ok"] == true), "{all}");
    let log = gate_log();
    assert!(log.contains("MCP tools/list: 1 tool(s)"), "{log}");
    assert!(!log.contains(token) && !log.contains(key), "a secret in the gate's log");
}
