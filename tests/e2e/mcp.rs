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

/// The MCP server on a test host, answering POSTs as `mode` (`json` or `sse`), and its CA.
struct McpUpstream {
    server: Child,
    log: std::path::PathBuf,
    dir: std::path::PathBuf,
    th: TestHost,
}

impl McpUpstream {
    fn start(mode: &str) -> McpUpstream {
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
            &[cert.as_os_str(), key.as_os_str(), std::ffi::OsStr::new(mode)],
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

/// The SDK's client inside: each step prints one line.
const CLIENT: &str = r#"
import asyncio, json, os
import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

URL = "https://mcp.test/mcp"

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
    async with streamablehttp_client(URL, headers=AUTH) as (r, w, sid):
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
    r = httpx.post(URL, json=batch, headers=headers, timeout=20)
    try:
        print("batch", r.status_code, json.dumps([m.get("error", {}).get("code") for m in r.json()]), flush=True)
    except Exception as e:
        print("batch", r.status_code, "unreadable", repr(e), flush=True)

asyncio.run(main())
"#;

/// The same session against a server that answers with JSON and one that answers with event
/// streams: the allowed tools listed and called (the server received both calls), the refused
/// one answered with the line and never received, a batch with a refused call refused whole.
/// The server's token is bound to it (`secret = MCP_TOKEN for mcp.test`, the usual case of a
/// hosted MCP server): the server received the real token, the sandbox held a placeholder.
///
/// Mutation runs (2026-12-05): `mcp::filter` keeping every tool → fails at `list` in json
/// mode; `Events` passing each event unfiltered → fails at `list` in sse mode.
#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn an_mcp_servers_tools_are_called_and_listed_as_the_rules_allow() {
    for mode in ["json", "sse"] {
        let up = McpUpstream::start(mode);
        let p = Project::new(&format!("mcp-{mode}"));
        p.config(&format!(
            "allow = mcp.test\nresolve = mcp.test={}\nrule = mcp.test mcp /mcp search_* create_issue\nsecret = MCP_TOKEN for mcp.test\nupstream_ca = {}\n",
            up.th.v4,
            up.dir.join("ca.pem").display()
        ));
        std::fs::write(p.path("client.py"), CLIENT).unwrap();
        chown_user(&p.path("client.py"));
        let token = "mcp-token-real-e2e-58d1f0";
        let script = format!(
            "{MCP_PYTHON} client.py > out.txt 2>&1; echo rc=$? >> out.txt; touch ready; {UNTIL_DONE}"
        );
        let child = spawn_sandbox_with_secret_env(&p, &["--", "sh", "-c", &script], &[("MCP_TOKEN", token)]);
        assert!(wait_for(120, || p.path("ready").exists()), "{mode}: the client did not finish");
        let leaks = command_lines_containing(&[token]);
        finish(&p, child);
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
    let up = McpUpstream::start("json");
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
