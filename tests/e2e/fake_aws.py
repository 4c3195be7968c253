#!/usr/bin/env python3
"""A fake AWS endpoint for the e2e tests of SigV4 signing, served over TLS in a test host's namespace.

The sandbox's gate re-signs AWS requests with the real credentials (the agent only ever holds
placeholders). A signature that only our own code checks proves nothing, so this endpoint VERIFIES
every request's SigV4 signature with botocore's signer, an implementation independent of ours:
the header form (`Authorization: AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…`) and
the presigned form (`X-Amz-Algorithm`, `X-Amz-Credential`, … in the query). The access key id and
the session token must be the real ones; the signature is recomputed from the request as
received (method, raw path, raw query, the signed headers' values, the body) with botocore's
`canonical_request`, `string_to_sign` and `signature`, for the region and service in the scope.

A request that fails is answered 403 with an AWS-style error, SignatureDoesNotMatch (XML; JSON for
bedrock, whose protocol is rest-json, so that boto3 reads the code). One that passes is answered
by its service: bedrock (`POST /model/MODEL/invoke`), s3 (`PUT`/`GET /BUCKET/KEY`, held in memory,
aws-chunked uploads decoded) and sts (`GetCallerIdentity`); anything else gets a 404.

Every request is logged as one JSON line to the file named by FAKE_AWS_LOG: method, path, query,
host, service, auth ("header", "query" or "none"), key_id, sig_ok, why (when not ok), body_len,
payload_hash (the x-amz-content-sha256 header as received) and signed_headers ("a;b;c"). The
real credentials are read from the JSON file FAKE_AWS_CREDS_FILE ({"key_id", "secret", "token"}),
never from a command line (the test scans /proc for them), and never logged. Runs under
/opt/aisb-aws/bin/python (scripts/install-test-tools: boto3 and botocore, pinned).
Usage: fake_aws.py CERT KEY PORT
"""

import hashlib
import hmac
import json
import os
import re
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials

LOG = os.environ["FAKE_AWS_LOG"]
with open(os.environ["FAKE_AWS_CREDS_FILE"]) as f:
    CREDS = json.load(f)
LOCK = threading.Lock()
OBJECTS = {}  # "BUCKET/KEY" -> bytes
AUTH_RE = re.compile(
    r"AWS4-HMAC-SHA256 Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),\s*Signature=([0-9a-f]+)$")


def log(**fields):
    with LOCK, open(LOG, "a") as f:
        f.write(json.dumps(fields) + "\n")


def read_chunked(rfile):
    """An HTTP/1.1 chunked body, de-chunked (trailers dropped)."""
    out = b""
    while True:
        size = int(rfile.readline().split(b";")[0].strip(), 16)
        if size == 0:
            while rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return out
        out += rfile.read(size)
        rfile.readline()


def aws_chunked(body):
    """The payload of an aws-chunked body (`SIZE[;chunk-signature=…]\\r\\nDATA\\r\\n…0\\r\\nTRAILERS`)."""
    out, i = b"", 0
    while True:
        j = body.index(b"\r\n", i)
        size = int(body[i:j].split(b";")[0], 16)
        if size == 0:
            return out
        out += body[j + 2:j + 2 + size]
        i = j + 2 + size + 2


def verify(method, raw_path, raw_query, headers, body, info):
    """(auth, key_id, service, why): why is "" when the signature is botocore's own; the names of
    the signed headers go in info["signed_headers"]."""
    auth_header = headers.get("Authorization", "")
    pairs = [p for p in raw_query.split("&") if p] if raw_query else []
    query = {k: v[0] for k, v in parse_qs(raw_query, keep_blank_values=True).items()}
    if auth_header.startswith("AWS4-HMAC-SHA256 "):
        auth, m = "header", AUTH_RE.match(auth_header.strip())
        if not m:
            return auth, "", "", "malformed Authorization header"
        credential, signed, sig = m.groups()
        timestamp, token = headers.get("X-Amz-Date", ""), headers.get("X-Amz-Security-Token")
        canon_query = raw_query
    elif "X-Amz-Algorithm" in query:
        auth = "query"
        if query["X-Amz-Algorithm"] != "AWS4-HMAC-SHA256":
            return auth, "", "", "unknown X-Amz-Algorithm"
        credential, signed = query.get("X-Amz-Credential", ""), query.get("X-Amz-SignedHeaders", "")
        sig, timestamp = query.get("X-Amz-Signature", ""), query.get("X-Amz-Date", "")
        token = query.get("X-Amz-Security-Token")
        # The canonical query string is every parameter but the signature itself.
        canon_query = "&".join(p for p in pairs if p.split("=", 1)[0] != "X-Amz-Signature")
    elif "AWSAccessKeyId" in query or auth_header.startswith("AWS "):
        return "none", "", "", "a SigV2 signature, not SigV4"
    else:
        return "none", "", "", "no signature"
    info["signed_headers"] = signed
    scope = credential.split("/")
    if len(scope) != 5 or scope[4] != "aws4_request":
        return auth, "", "", "malformed credential scope"
    key_id, date, region, service = scope[:4]
    if key_id != CREDS["key_id"]:
        return auth, key_id, service, "unknown access key id"
    if CREDS.get("token") and token != CREDS["token"]:
        return auth, key_id, service, "missing or wrong security token"
    if not re.fullmatch(r"\d{8}T\d{6}Z", timestamp) or timestamp[:8] != date:
        return auth, key_id, service, "X-Amz-Date missing or not the scope's date"
    names = signed.split(";")
    if "host" not in names:
        return auth, key_id, service, "host is not signed"
    # Only the signed headers, with their values as received (every value of a repeated one).
    to_sign = HTTPHeaders()
    for name in names:
        values = headers.get_all(name)
        if not values:
            return auth, key_id, service, f"signed header {name} absent"
        for v in values:
            to_sign[name] = v
    host = headers["Host"]
    url = f"https://{host}{raw_path}" + (f"?{canon_query}" if canon_query else "")
    request = AWSRequest(method=method, url=url, data=body)
    request.headers = to_sign
    request.context["timestamp"] = timestamp
    creds = Credentials(CREDS["key_id"], CREDS["secret"], CREDS.get("token"))
    cls = {("header", True): S3SigV4Auth, ("header", False): SigV4Auth,
           ("query", True): S3SigV4QueryAuth, ("query", False): SigV4QueryAuth}[(auth, service == "s3")]
    signer = cls(creds, service, region)
    # botocore leaves out of headers_to_sign a few names (user-agent, expect, …) and adds host;
    # the verifier signs exactly what the request says it signed, canonicalised by botocore.
    signer.headers_to_sign = lambda _request: to_sign
    payload_hash = headers.get("X-Amz-Content-SHA256")
    if re.fullmatch(r"[0-9a-f]{64}", payload_hash or "") and payload_hash != hashlib.sha256(body).hexdigest():
        return auth, key_id, service, "x-amz-content-sha256 is not the body's hash"
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, sig):
        return auth, key_id, service, "signature does not match"
    return auth, key_id, service, ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, code, data=b"", ctype="application/xml", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amz-request-id", "FAKE")
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def error(self, code, name, message, s3, rest_json=False):
        if rest_json:  # bedrock's protocol: its errors are JSON, the code in x-amzn-ErrorType
            data = json.dumps({"message": message}).encode()
            return self.send(code, data, "application/json", [("x-amzn-ErrorType", name)])
        inner = f"<Error><Code>{name}</Code><Message>{escape(message)}</Message></Error>"
        xml = inner if s3 else f"<ErrorResponse>{inner}<RequestId>FAKE</RequestId></ErrorResponse>"
        self.send(code, xml.encode(), "text/xml")

    def handle_any(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = read_chunked(self.rfile)
        else:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
        raw_path, _, raw_query = self.path.partition("?")
        host = self.headers.get("Host", "")
        info = {"signed_headers": ""}
        auth, key_id, service, why = verify(self.command, raw_path, raw_query, self.headers, body, info)
        service = service or host.split(".")[0].replace("-runtime", "")
        entry = dict(method=self.command, path=raw_path, query=raw_query, host=host, service=service,
                     auth=auth, key_id=key_id, sig_ok=not why, body_len=len(body),
                     payload_hash=self.headers.get("X-Amz-Content-SHA256"), **info)
        if why:
            entry["why"] = why
        log(**entry)
        if why:
            return self.error(403, "SignatureDoesNotMatch", why, service == "s3", service == "bedrock")
        if "aws-chunked" in self.headers.get("Content-Encoding", ""):
            body = aws_chunked(body)
        parts = raw_path.split("/")
        if (service == "bedrock" and self.command == "POST" and len(parts) == 4
                and parts[1] == "model" and parts[3] == "invoke"):
            reply = {"id": "fake", "content": [{"type": "text", "text": "FAKE-BEDROCK-DONE"}],
                     "model_seen": unquote(parts[2])}
            return self.send(200, json.dumps(reply).encode(), "application/json")
        if service == "s3" and len(parts) >= 3 and parts[1] and parts[2]:
            key = unquote(raw_path[1:])
            if self.command == "PUT":
                with LOCK:
                    OBJECTS[key] = body
                return self.send(200, extra=[("ETag", '"%s"' % hashlib.md5(body).hexdigest())])
            if self.command in ("GET", "HEAD"):
                with LOCK:
                    data = OBJECTS.get(key)
                if data is None:
                    return self.error(404, "NoSuchKey", "The specified key does not exist.", True)
                return self.send(200, data, "application/octet-stream",
                                 [("ETag", '"%s"' % hashlib.md5(data).hexdigest())])
        form = parse_qs(body.decode(errors="replace"))
        if service == "sts" and self.command == "POST" and form.get("Action") == ["GetCallerIdentity"]:
            xml = ('<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
                   "<GetCallerIdentityResult><Arn>arn:aws:iam::123456789012:user/e2e</Arn>"
                   "<UserId>AIDAE2E</UserId><Account>123456789012</Account></GetCallerIdentityResult>"
                   "<ResponseMetadata><RequestId>FAKE</RequestId></ResponseMetadata>"
                   "</GetCallerIdentityResponse>")
            return self.send(200, xml.encode(), "text/xml")
        self.error(404, "NotFound", "the fake AWS endpoint has no such operation", service == "s3")

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_any


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
