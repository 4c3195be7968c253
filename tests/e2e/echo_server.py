#!/usr/bin/env python3
"""The upstream servers of the bound-secret e2e tests, in a test host's namespace: HTTPS on 443
(the certificate given, from a CA made for the test) and plain HTTP on 80, for every name the
test pins there. Each request is logged as one JSON line to ECHO_LOG (listener, method, target,
headers, the body's length and first 4 KiB, the client's port), so a test can say what arrived and what never did.

- /basic.git/...: 401 asking for Basic credentials when none came (git sends them then);
- /git/REPO/...: `git http-backend` over ECHO_GIT_ROOT, for the token in ECHO_GIT_TOKEN_FILE;
- GET /echo-auth: 200 with the request's Authorization header sent back as `X-Echo`;
- GET /ws (WebSocket upgrade; permessage-deflate when offered): each whole message the server
  reads is logged (`ws`: its text) and answered `got N`, or, for `echo-headers`, with the
  upgrade request's headers;
- GET /echo-headers: 200 with every request header in the body, as sent and percent-encoded
  (`?gzip=1`: gzip-compressed whether asked for or not; `?split=N`: chunked in N-byte pieces;
  `?br=1`: claims a br-encoded body);
- GET /sse: a server-sent event stream: `data: one`, then (once /ack has been requested, within
  30 s) `data: two acked`, else `data: two no-ack`: an answer the gate held back until the end
  comes out as `no-ack`;
- GET /trick?kind=...: the request's `Authorization: …` line spelt back in one way the gate must
  read whole: `b64` (base64 of it after `shift` bytes; `url=1` URL-safe), `reason` (in a 401's
  reason phrase), `ce2` (two Content-Encoding fields, `codings=gzip,gzip`), `te-gzip`
  (`Transfer-Encoding: gzip, chunked`), `range` (206 to a Range, 200 whole without one),
  `upgrade` (101 to `to`, default `rtproto`, then the line raw), `grpc` (a gRPC message,
  `compressed=1`: flagged compressed with no grpc-encoding);
- a chunked request's trailers are read and their size logged (`trailers`);
- anything else: 200 `ok HOST`.
Usage: echo_server.py CERT KEY
"""

import base64
import json
import os
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = os.environ["ECHO_LOG"]
LOCK = threading.Lock()
ACK = threading.Event()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, headers=()):
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def handle_any(self):
        import time
        first_at, cut, trailers = None, False, 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                line = self.rfile.readline()
                if not line:
                    cut = True  # the connection ended inside the body
                    break
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    # The trailer section, up to its blank line.
                    while True:
                        t = self.rfile.readline()
                        if t in (b"\r\n", b"\n", b""):
                            break
                        trailers += len(t)
                    break
                body += self.rfile.read(size)
                first_at = first_at or time.time()
                self.rfile.readline()
        else:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            cut = len(body) < n  # the connection ended inside the body
        record = {
            "peer": self.client_address[1],
            "length": len(body),
            "tls": isinstance(self.connection, ssl.SSLSocket),
            "method": self.command,
            "target": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body[:4096].decode("latin-1"),
            "first_chunk_at": first_at,
            "cut": cut,
            "trailers": trailers,
        }
        with LOCK, open(LOG, "a") as f:
            f.write(json.dumps(record) + "\n")
        if cut:
            return
        if self.path.startswith("/git/"):
            self.git(body)
        elif self.path.startswith("/basic.git") and "Authorization" not in self.headers:
            self.reply(401, b"who?\n", [("WWW-Authenticate", 'Basic realm="e2e"')])
        elif self.path == "/echo-auth":
            self.reply(200, b"echoed\n", [("X-Echo", self.headers.get("Authorization", ""))])
        elif self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            self.websocket()
        elif self.path.startswith("/echo-headers"):
            self.echo_headers()
        elif self.path.startswith("/trick"):
            self.trick()
        elif self.path == "/ack":
            ACK.set()
            self.reply(200, b"ack\n")
        elif self.path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.chunk(b"data: one\n\n")
            got = ACK.wait(30)
            self.chunk(b"data: two acked\n\n" if got else b"data: two no-ack\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        else:
            self.reply(200, ("ok %s\n" % self.headers.get("Host", "")).encode())

    def websocket(self):
        import hashlib
        import zlib
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        deflate = "permessage-deflate" in self.headers.get("Sec-WebSocket-Extensions", "")
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        if deflate:
            self.send_header("Sec-WebSocket-Extensions", "permessage-deflate")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        inflater, parts, compressed, count = zlib.decompressobj(-15), [], False, 0
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            fin, rsv1, op, n = head[0] & 0x80, head[0] & 0x40, head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = int.from_bytes(self.rfile.read(2), "big")
            elif n == 127:
                n = int.from_bytes(self.rfile.read(8), "big")
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if op == 8:
                return
            if op >= 8:
                continue
            if op != 0:
                compressed = bool(rsv1)
            parts.append(data)
            if not fin:
                continue
            message = b"".join(parts)
            parts = []
            if compressed:
                message = inflater.decompress(message + b"\0\0\xff\xff")
            count += 1
            with LOCK, open(LOG, "a") as f:
                f.write(json.dumps({"ws": message.decode("latin-1")}) + "\n")
            reply = ("got %d" % count).encode()
            if message == b"echo-headers":
                reply = "".join("%s: %s\n" % kv for kv in self.headers.items()).encode()
            size = bytes([len(reply)]) if len(reply) < 126 else bytes([126]) + len(reply).to_bytes(2, "big")
            self.wfile.write(bytes([0x81]) + size + reply)
            self.wfile.flush()

    def echo_headers(self):
        import gzip
        import urllib.parse
        query = urllib.parse.parse_qs(self.path.partition("?")[2])
        lines = ["%s: %s\nurl: %s\n" % (k, v, urllib.parse.quote(v, safe="")) for k, v in self.headers.items()]
        body = "".join(lines).encode()
        headers = [("Content-Type", "text/plain")]
        if "gzip" in query:
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        if "br" in query:
            headers.append(("Content-Encoding", "br"))
        split = int(query.get("split", ["0"])[0])
        if not split:
            self.reply(200, body, headers[1:])
            return
        self.send_response(200)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(0, len(body), split):
            self.chunk(body[i:i + split])
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def trick(self):
        """A response that spells the request's Authorization header back in a way the gate must
        read whole (see the module doc)."""
        import gzip
        import urllib.parse
        q = {k: v[0] for k, v in urllib.parse.parse_qs(self.path.partition("?")[2]).items()}
        auth = self.headers.get("Authorization", "")
        line = ("Authorization: %s" % auth).encode()
        kind = q.get("kind", "")
        if kind == "b64":
            data = b"x" * int(q.get("shift", "0")) + line
            text = base64.urlsafe_b64encode(data) if q.get("url") else base64.b64encode(data)
            self.reply(200, b"dump: " + text + b"\n")
        elif kind == "reason":
            body = b"bad key\n"
            self.send_response(401, "Bad key " + auth)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif kind == "ce2":
            first, second = q.get("codings", "gzip,gzip").split(",")
            body = line + b"\n"
            for c in (first, second):
                if c == "gzip":
                    body = gzip.compress(body)
            self.send_response(200)
            self.send_header("Content-Encoding", first)
            self.send_header("Content-Encoding", second)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif kind == "te-gzip":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "gzip, chunked")
            self.end_headers()
            self.chunk(gzip.compress(line + b"\n"))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        elif kind == "range":
            # The echo, in the part a Range asks for (206), or whole (200).
            body = line + b"\n"
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes="):
                a, _, b = rng[6:].partition("-")
                a, b = int(a or 0), int(b) if b else len(body) - 1
                part = body[a:b + 1]
                self.send_response(206)
                self.send_header("Content-Range", "bytes %d-%d/%d" % (a, a + len(part) - 1, len(body)))
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                self.wfile.write(part)
            else:
                self.reply(200, body)
        elif kind == "upgrade":
            self.send_response(101)
            self.send_header("Upgrade", q.get("to", "rtproto"))
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.write(line + b"\n")
            self.wfile.flush()
            self.close_connection = True
        elif kind == "grpc":
            # One gRPC message (over HTTP/1.1: the gate reads it by its content type), flagged
            # compressed (`?compressed=1`, its payload gzip) with no grpc-encoding, or plain.
            payload = line
            flag = b"\x00"
            if q.get("compressed"):
                payload, flag = gzip.compress(payload), b"\x01"
            body = flag + len(payload).to_bytes(4, "big") + payload
            self.send_response(200)
            self.send_header("Content-Type", "application/grpc")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.reply(400, b"which trick?\n")

    def git(self, body):
        """`git http-backend` (CGI) for /git/REPO/..., over the repositories in ECHO_GIT_ROOT,
        for Basic credentials whose password is the token in ECHO_GIT_TOKEN_FILE only (an empty file:
        for anyone)."""
        with open(os.environ["ECHO_GIT_TOKEN_FILE"]) as f:
            token = f.read().strip()
        auth = self.headers.get("Authorization", "")
        try:
            creds = base64.b64decode(auth[6:]).decode() if auth.startswith("Basic ") else ""
        except ValueError:
            creds = ""
        if token and creds.partition(":")[2] != token:
            self.reply(401, b"token?\n", [("WWW-Authenticate", 'Basic realm="git"')])
            return
        path, _, query = self.path[len("/git"):].partition("?")
        env = dict(os.environ, GIT_PROJECT_ROOT=os.environ["ECHO_GIT_ROOT"], GIT_HTTP_EXPORT_ALL="1",
                   PATH_INFO=path, QUERY_STRING=query, REQUEST_METHOD=self.command,
                   CONTENT_TYPE=self.headers.get("Content-Type", ""), CONTENT_LENGTH=str(len(body)),
                   REMOTE_USER="e2e", REMOTE_ADDR="127.0.0.1",
                   HTTP_CONTENT_ENCODING=self.headers.get("Content-Encoding", ""),
                   GIT_PROTOCOL=self.headers.get("Git-Protocol", ""))
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            k, _, v = line.partition(": ")
            if k.lower() == "status":
                status = int(v.split()[0])
            elif k:
                headers.append((k, v))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_any


def serve(port, ctx=None):
    srv = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    srv.daemon_threads = True
    if ctx:
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


if __name__ == "__main__":
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[1], sys.argv[2])
    threading.Thread(target=serve, args=(80,), daemon=True).start()
    serve(443, ctx)
