#!/usr/bin/env python3
"""A fake model API for the real-agent e2e tests, served over TLS in a test host's namespace.

It speaks just enough of two APIs for a real agent CLI to finish one turn with one tool call:
- Anthropic Messages (`POST /v1/messages`, JSON or SSE): Claude Code;
- OpenAI Responses (`POST /v1/responses` over SSE, and the same over a WebSocket upgrade of
  `GET /v1/responses`): Codex;
- Gemini (`POST /v1beta/models/MODEL:streamGenerateContent?alt=sse`, `:generateContent`,
  `:countTokens`, the key in `x-goog-api-key`): Gemini CLI; with a Google login, the Code Assist
  API (`POST /v1internal:METHOD`, each answer in `{"response": ...}`) and `tokeninfo`;
- OpenAI Chat Completions (`POST /v1/chat/completions`, JSON or SSE): aider, which has no shell
  tool: its reply is the text in FAKE_MODEL_CHAT (an edit, in aider's own format), and, when
  FAKE_MODEL_HOLD names a file, the streamed reply waits (up to 60 s) for that file before it
  ends, so the test can look at the running agent.
The first request that offers a shell tool gets a call of that tool running the command in
FAKE_MODEL_COMMAND (opencode's `bash` as Claude Code's `Bash`); the request that carries the
tool's output gets a final text reply "FAKE-MODEL-DONE". With FAKE_MODEL_MCP_CALL ("TOOL
JSON-ARGUMENTS", Anthropic Messages only) the call is of that tool instead (an MCP server's, as
the agent names it), and the tool's output is logged (`answer`). Anything else gets a short text reply
(titles, warm-ups) or a 404.

Every request is logged as one JSON line to the file named by FAKE_MODEL_LOG, with whether its
credential matched the key in the file FAKE_MODEL_KEY_FILE (the key never goes on a command
line: the test scans /proc for it). Usage: fake_model_api.py CERT KEY PORT
"""

import base64
import hashlib
import json
import os
import socket
import ssl
import struct
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMAND = os.environ["FAKE_MODEL_COMMAND"]
LOG = os.environ["FAKE_MODEL_LOG"]
with open(os.environ["FAKE_MODEL_KEY_FILE"]) as f:
    KEY = f.read().strip()
LOCK = threading.Lock()
CHAT = os.environ.get("FAKE_MODEL_CHAT", "FAKE-MODEL-DONE")
HOLD = os.environ.get("FAKE_MODEL_HOLD")
MCP_CALL = os.environ.get("FAKE_MODEL_MCP_CALL", "")
# A login's token endpoint (FAKE_MODEL_TOKENS: a file of {"refresh", "access", "next"}): a
# refresh with the refresh token "refresh" is answered with "access" and "next" (a JSON body, or
# Google's form; with "google": true, Google's answer, which has no new refresh token).
TOKENS = os.environ.get("FAKE_MODEL_TOKENS")
SHELL_TOOLS = ("Bash", "bash", "shell", "shell_command", "exec_command", "local_shell", "run_shell_command")


def log(**fields):
    with LOCK, open(LOG, "a") as f:
        f.write(json.dumps(fields) + "\n")


def shell_call(name):
    """The arguments of a call of the named shell tool, in that tool's own shape."""
    if name in ("Bash", "bash"):
        return {"command": COMMAND, "description": "write the file the test asked for"}
    if name == "shell":
        return {"command": ["bash", "-lc", COMMAND]}
    if name == "exec_command":
        return {"cmd": COMMAND}
    if name == "run_shell_command":
        return {"command": COMMAND, "description": "write the file the test asked for"}
    return {"command": COMMAND}


def tool_names(tools, items=()):
    """Names of the tools a request offers: top-level `tools`, and (Codex) namespaces of tools
    sent as an `additional_tools` input item."""
    out = []
    for t in tools or []:
        if "functionDeclarations" in t:  # Gemini
            out += [f.get("name", "?") for f in t["functionDeclarations"]]
        elif t.get("type") == "namespace":
            out += tool_names(t.get("tools"))
        else:
            out.append(t.get("name") or t.get("type") or (t.get("function") or {}).get("name") or "?")
    for it in items if isinstance(items, list) else ():
        if isinstance(it, dict) and it.get("type") == "additional_tools":
            out += tool_names(it.get("tools"))
    return out


def tool_output(messages):
    """What the tool results in an Anthropic request say, as one JSON text (None: none)."""
    results = [b for m in messages or [] if isinstance(m.get("content"), list) for b in m["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    return json.dumps([r.get("content") for r in results])[:600] if results else None


def has_tool_output(items):
    text = json.dumps(items)
    return '"tool_result"' in text or '"function_call_output"' in text or '"custom_tool_call_output"' in text


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def credential_ok(self):
        auth = self.headers.get("Authorization", "")
        return (self.headers.get("x-api-key") == KEY or auth == "Bearer " + KEY
                or self.headers.get("x-goog-api-key") == KEY)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
            return {k: v[0] for k, v in urllib.parse.parse_qs(raw.decode(), keep_blank_values=True).items()}
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {}

    def send(self, code, obj, ctype="application/json"):
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def sse(self, events):
        # Chunked, not close-delimited: rustls (Codex) refuses a body ended by a TCP close
        # without TLS close_notify, which Python's ssl module does not send.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for ev in events:
            data = f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def echo(self):
        # An endpoint that answers with the request's credential: the gate must mask it.
        log(method=self.command, path="/echo", auth_ok=self.credential_ok())
        self.send(200, ("echoed " + self.headers.get("Authorization", "")).encode(), "text/plain")

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/echo":
            return self.echo()
        if path.endswith("/responses") and self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        log(method="GET", path=path, auth_ok=self.credential_ok())
        if path == "/backend-api/wham/accounts/check":
            # Codex's workspace routing with a ChatGPT login: the account of the request's
            # ChatGPT-Account-Id, served here.
            account = self.headers.get("chatgpt-account-id", "")
            return self.send(200, {"accounts": [{"id": account, "workspace_backend_origin": "https://chatgpt.com",
                                                 "account_routing_override": "NO_CONSTRAINT"}]})
        if path.endswith("/models"):
            return self.send(200, {"object": "list", "data": [], "models": []})
        self.send(404, {"error": {"message": "not here", "type": "not_found_error"}})

    def do_HEAD(self):
        log(method="HEAD", path=self.path, auth_ok=self.credential_ok())
        self.send(200, b"")

    def do_POST(self):
        path = self.path.split("?")[0]
        req = self.body()
        if path == "/echo":
            return self.echo()
        if path.endswith("/v1/messages"):
            return self.anthropic(req)
        if path.endswith("/v1/messages/count_tokens"):
            log(method="POST", path=path, auth_ok=self.credential_ok())
            return self.send(200, {"input_tokens": 10})
        if path.endswith("/responses"):
            events = self.openai_events(req, "sse")
            return self.sse(events)
        if "/models/" in path and ":" in path:
            return self.gemini(path, req)
        if path.startswith("/v1internal:"):
            return self.code_assist(path, req)
        if path == "/tokeninfo":
            ok = self.credential_ok()
            log(method="POST", path=path, api="tokeninfo", auth_ok=ok)
            if not ok:
                return self.send(400, {"error": "invalid_token", "error_description": "Invalid Value"})
            return self.send(200, {"azp": "e2e", "aud": "e2e", "scope": "https://www.googleapis.com/auth/cloud-platform",
                                   "expires_in": 3500, "access_type": "offline"})
        if path.endswith("/chat/completions"):
            return self.chat(req)
        if path in ("/v1/oauth/token", "/oauth/token", "/token") and TOKENS:
            return self.token(req)
        log(method="POST", path=path, auth_ok=self.credential_ok())
        self.send(404, {"error": {"message": "not here", "type": "not_found_error"}})

    # --- A login's token endpoint ---------------------------------------------------------------
    def token(self, req):
        with open(TOKENS) as f:
            t = json.load(f)
        grant = req.get("grant_type")
        if grant == "authorization_code" and "code" in t:
            # A first login's code exchange ("code" in the file): the login's tokens.
            ok = req.get("code") == t["code"]
            log(method="POST", path=self.path, api="token", grant=grant, code_ok=ok,
                placeholder="aisb_placeholder_" in json.dumps(req))
            if not ok:
                return self.send(400, {"error": "invalid_grant", "error_description": "code unknown"})
            return self.send(200, {"token_type": "Bearer", "access_token": t["access"], "refresh_token": t["refresh"],
                                   "id_token": t["id"], "expires_in": 3600})
        if grant != "refresh_token":
            log(method="POST", path=self.path, api="token", grant=grant, body=sorted(req))
            return self.send(400, {"error": "unsupported_grant_type"})
        sent = str(req.get("refresh_token", ""))
        ok = req.get("grant_type") == "refresh_token" and sent == t["refresh"]
        log(method="POST", path=self.path, api="token", refresh_ok=ok,
            placeholder="aisb_placeholder_" in sent)
        if not ok:
            return self.send(400, {"error": "invalid_grant", "error_description": "refresh token unknown"})
        answer = {"token_type": "Bearer", "access_token": t["access"], "refresh_token": t["next"],
                  "expires_in": 28800, "scope": "user:inference user:profile"}
        if t.get("google"):
            answer = {"access_token": t["access"], "expires_in": 3599, "token_type": "Bearer",
                      "scope": "https://www.googleapis.com/auth/cloud-platform"}
        if "id" in t:
            answer["id_token"] = t["id"]
        self.send(200, answer)

    # --- Anthropic Messages -------------------------------------------------------------------
    def anthropic(self, req):
        tools = tool_names(req.get("tools"))
        done = has_tool_output(req.get("messages"))
        mcp_tool, _, mcp_args = MCP_CALL.partition(" ")
        wanted = (mcp_tool,) if MCP_CALL else ("Bash", "bash")
        call = None if done else next((t for t in tools if t in wanted), None)
        log(method="POST", path="/v1/messages", api="anthropic", auth_ok=self.credential_ok(),
            stream=bool(req.get("stream")), tools=tools, tool_output=done, called=call,
            answer=tool_output(req.get("messages")))
        if not self.credential_ok():
            return self.send(401, {"type": "error", "error": {"type": "authentication_error",
                                                              "message": "invalid x-api-key"}})
        text = "FAKE-MODEL-DONE" if done else "ok"
        args = json.loads(mcp_args) if MCP_CALL else shell_call(call)
        block = ({"type": "tool_use", "id": "toolu_e2e1", "name": call, "input": args}
                 if call else {"type": "text", "text": text})
        stop = "tool_use" if call else "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 5}
        msg = {"id": "msg_e2e", "type": "message", "role": "assistant", "model": req.get("model", "m"),
               "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not req.get("stream"):
            return self.send(200, msg)
        start = dict(msg, content=[], stop_reason=None)
        if call:
            first = dict(block, input={})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            first = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": text}
        self.sse([
            {"type": "message_start", "message": start},
            {"type": "content_block_start", "index": 0, "content_block": first},
            {"type": "content_block_delta", "index": 0, "delta": delta},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
             "usage": {"output_tokens": 5}},
            {"type": "message_stop"},
        ])

    # --- OpenAI Chat Completions (aider) -------------------------------------------------------
    def chat(self, req):
        stream = bool(req.get("stream"))
        log(method="POST", path="/v1/chat/completions", api="openai-chat", auth_ok=self.credential_ok(),
            stream=stream, model=req.get("model"))
        if not self.credential_ok():
            return self.send(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                             "code": "invalid_api_key"}})
        base = {"id": "chatcmpl-e2e", "created": 1, "model": req.get("model", "m")}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not stream:
            return self.send(200, dict(base, object="chat.completion", usage=usage, choices=[
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": CHAT}}]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def delta(d, finish=None):
            return dict(base, object="chat.completion.chunk",
                        choices=[{"index": 0, "delta": d, "finish_reason": finish}])

        chunk(delta({"role": "assistant", "content": ""}))
        if HOLD:
            for _ in range(600):
                if os.path.exists(HOLD):
                    break
                threading.Event().wait(0.1)
        chunk(delta({"content": CHAT}))
        chunk(delta({}, "stop"))
        chunk(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # --- OpenAI Responses ---------------------------------------------------------------------
    def openai_events(self, req, transport):
        tools = tool_names(req.get("tools"), req.get("input"))
        done = has_tool_output(req.get("input"))
        call = None if done else next((t for t in SHELL_TOOLS + ("exec",) if t in tools), None)
        warmup = req.get("generate") is False
        log(method="POST", path="/v1/responses", api="openai", transport=transport,
            auth_ok=self.credential_ok(), tools=tools, tool_output=done, called=call, warmup=warmup)
        rid = "resp_e2e_" + transport
        usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
        if not self.credential_ok():
            return [{"type": "response.failed", "response": {"id": rid, "error": {
                "code": "invalid_api_key", "message": "Incorrect API key provided"}}}]
        if warmup:
            return [{"type": "response.created", "response": {"id": rid}},
                    {"type": "response.completed", "response": {"id": rid, "usage": usage, "output": []}}]
        if call == "exec":
            # Codex's code mode: one JavaScript tool that calls the nested shell tool.
            js = "await tools.exec_command(%s);" % json.dumps({"cmd": COMMAND})
            item = {"type": "custom_tool_call", "id": "ctc_e2e", "call_id": "call_e2e", "name": "exec",
                    "input": js, "status": "completed"}
        elif call:
            item = {"type": "function_call", "id": "fc_e2e", "call_id": "call_e2e", "name": call,
                    "arguments": json.dumps(shell_call(call))}
        else:
            text = "FAKE-MODEL-DONE" if done else "ok"
            item = {"type": "message", "role": "assistant", "id": "msg_e2e", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        events = [{"type": "response.created", "response": {"id": rid}}]
        if not call:
            events.append({"type": "response.output_item.added", "output_index": 0,
                           "item": dict(item, status="in_progress", content=[])})
            events.append({"type": "response.output_text.delta", "item_id": "msg_e2e", "output_index": 0,
                           "content_index": 0, "delta": item["content"][0]["text"]})
        events += [
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": {"id": rid, "usage": usage, "output": [item]}},
        ]
        return events

    # --- Code Assist (Gemini CLI with a Google login) -------------------------------------------
    def code_assist(self, path, req):
        method = path.split(":", 1)[1]
        if method in ("generateContent", "streamGenerateContent", "countTokens"):
            inner = dict(req.get("request") or {})
            return self.gemini(f"/v1internal/models/{req.get('model', 'e2e')}:{method}", inner, wrap=True)
        log(method="POST", path=path, api="code_assist", auth_ok=self.credential_ok())
        if not self.credential_ok():
            return self.send(401, {"error": {"code": 401, "status": "UNAUTHENTICATED", "message": "not this token"}})
        if method == "loadCodeAssist":
            tier = {"id": "standard-tier", "name": "e2e", "userDefinedCloudaicompanionProject": False}
            return self.send(200, {"currentTier": tier, "allowedTiers": [dict(tier, isDefault=True)],
                                   "cloudaicompanionProject": "e2e-project"})
        if method == "onboardUser":
            return self.send(200, {"done": True, "response": {"cloudaicompanionProject": {"id": "e2e-project"}}})
        self.send(200, {})

    # --- Gemini ---------------------------------------------------------------------------------
    def gemini(self, path, req, wrap=False):
        method = path.rsplit(":", 1)[1]
        tools = tool_names(req.get("tools"))
        parts = [p for c in req.get("contents") or [] for p in c.get("parts") or []]
        done = any(isinstance(p, dict) and "functionResponse" in p for p in parts)
        call = None if done else next((t for t in tools if t == "run_shell_command"), None)
        answer = next((json.dumps(p["functionResponse"])[:600] for p in parts if "functionResponse" in p), None)
        log(method="POST", path=path, api="gemini", stream=method == "streamGenerateContent",
            auth_ok=self.credential_ok(), tools=tools, tool_output=done, called=call, answer=answer)
        if not self.credential_ok():
            return self.send(400, {"error": {"code": 400, "status": "INVALID_ARGUMENT",
                                             "message": "API key not valid. Please pass a valid API key."}})
        if method == "countTokens":
            return self.send(200, {"totalTokens": 10})
        if call:
            part = {"functionCall": {"name": call, "args": shell_call(call)}}
        elif (req.get("generationConfig") or {}).get("responseMimeType") == "application/json":
            # The CLI's own questions (which model, who speaks next): a plain JSON answer.
            part = {"text": json.dumps({"reasoning": "e2e", "next_speaker": "user", "model_choice": "flash",
                                        "complexity_reasoning": "e2e", "complexity_score": 1})}
        else:
            part = {"text": "FAKE-MODEL-DONE" if done else "ok"}
        resp = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
                "modelVersion": path.split("/models/")[1].split(":")[0]}
        if wrap:
            # Code Assist wraps each answer: {"response": GenerateContentResponse}.
            resp = {"response": resp, "traceId": "e2e"}
        if method != "streamGenerateContent":
            return self.send(200, resp)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        data = f"data: {json.dumps(resp)}\r\n\r\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        self.wfile.flush()

    def websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode())
                                  .digest()).decode()
        log(method="GET", path="/v1/responses", upgrade="websocket", auth_ok=self.credential_ok())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while True:
            frame = ws_read(self.rfile)
            if frame is None:
                return
            op, data = frame
            if op == 8:
                ws_write(self.wfile, 8, data[:2])
                return
            if op == 9:
                ws_write(self.wfile, 10, data)
                continue
            if op != 1:
                continue
            try:
                msg = json.loads(data)
            except ValueError:
                continue
            if msg.get("type") != "response.create":
                continue
            if os.environ.get("FAKE_MODEL_DUMP"):
                with open(os.environ["FAKE_MODEL_DUMP"], "a") as f:
                    f.write(json.dumps(msg) + "\n")
            for ev in self.openai_events(msg, "websocket"):
                ws_write(self.wfile, 1, json.dumps(ev).encode())


def ws_read(r):
    head = r.read(2)
    if len(head) < 2:
        return None
    op, n = head[0] & 0x0F, head[1] & 0x7F
    if n == 126:
        n = struct.unpack(">H", r.read(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", r.read(8))[0]
    mask = r.read(4) if head[1] & 0x80 else b"\0\0\0\0"
    data = bytearray(r.read(n))
    for i in range(len(data)):
        data[i] ^= mask[i % 4]
    return op, bytes(data)


def ws_write(w, op, data):
    n = len(data)
    if n < 126:
        head = struct.pack(">BB", 0x80 | op, n)
    elif n < 65536:
        head = struct.pack(">BBH", 0x80 | op, 126, n)
    else:
        head = struct.pack(">BBQ", 0x80 | op, 127, n)
    w.write(head + data)
    w.flush()


class Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def main():
    cert, key, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    srv = Server(("::", port), Handler)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
