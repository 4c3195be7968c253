"""An MCP server over TLS on :443 for the e2e suite: the official Python SDK's FastMCP, streamable
HTTP at /mcp, answering POSTs with JSON (`json`) or with event streams (`sse`). Every JSON-RPC
message it receives is appended to $MCP_LOG as a JSON line: {"method", "tool", "marker",
"authorization"}.

  search_issues(query)     answers "found: " + query
  create_issue(title)      answers "created: " + title
  delete_repository(name)  answers "deleted: " + name (the tests' rules never allow it)

Usage: mcp_server.py CERT KEY json|sse [h2]   (h2: served by hypercorn, offering HTTP/2 and
HTTP/1.1; else by uvicorn, HTTP/1.1 only)
"""
import json, os, sys

import uvicorn
from mcp.server.fastmcp import FastMCP

LOG = os.environ["MCP_LOG"]
cert, key, mode = sys.argv[1:4]
h2 = sys.argv[4:] == ["h2"]

# host 0.0.0.0: no DNS-rebinding check (it allows localhost names only, and the gate forwards
# the test host's name).
mcp = FastMCP("e2e", host="0.0.0.0", json_response=(mode == "json"))


@mcp.tool()
def search_issues(query: str) -> str:
    return "found: " + query


@mcp.tool()
def create_issue(title: str) -> str:
    return "created: " + title


@mcp.tool()
def delete_repository(name: str) -> str:
    return "deleted: " + name


def log(body, headers):
    try:
        v = json.loads(body)
    except ValueError:
        v = {"unreadable": body.decode(errors="replace")}
    auth = headers.get(b"authorization", b"").decode()
    with open(LOG, "a") as f:
        for m in v if isinstance(v, list) else [v]:
            params = m.get("params") or {}
            args = params.get("arguments") or {}
            f.write(json.dumps({
                "method": m.get("method"),
                "tool": params.get("name"),
                "marker": next(iter(args.values()), None) if isinstance(args, dict) else None,
                "authorization": auth,
            }) + "\n")


class Logged:
    """Logs each POST body it passes to the app."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        body = bytearray()

        async def recv():
            m = await receive()
            if m["type"] == "http.request":
                body.extend(m.get("body", b""))
                if not m.get("more_body"):
                    log(bytes(body), dict(scope["headers"]))
            return m

        return await self.app(scope, recv, send)


app = Logged(mcp.streamable_http_app())
if h2:
    import asyncio
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = ["0.0.0.0:443"]
    config.certfile, config.keyfile = cert, key
    config.alpn_protocols = ["h2", "http/1.1"]
    asyncio.run(serve(app, config))
else:
    uvicorn.run(app, host="0.0.0.0", port=443, ssl_certfile=cert, ssl_keyfile=key, log_level="warning")
