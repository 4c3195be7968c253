#!/usr/bin/env python3
"""A container registry of one image, for the e2e test of pulls by a sandbox's own engine
(`containers = on`): HTTPS on 443 (the certificate given), the registry API's read side only
(GET /v2/, manifests and blobs of NAME:TAG), serving a busybox image it builds at start from the
host's static /bin/busybox. Every request is appended to LOG as `METHOD HOST PATH`, so a test can
tell a pull that arrived from one that never did.
Usage: registry_server.py CERT KEY NAME TAG LOG
"""

import gzip
import hashlib
import io
import json
import os
import socket
import ssl
import sys
import tarfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

cert, key, name, tag, log = sys.argv[1:6]


def layer():
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        t.add("/bin/busybox", arcname="bin/busybox")
        for applet in ("sh", "echo", "cat"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(link)
    data = raw.getvalue()
    return data, gzip.compress(data, mtime=0)


def digest(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


tar, tgz = layer()
config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/sh"]},
                     "rootfs": {"type": "layers", "diff_ids": [digest(tar)]}}).encode()
manifest = json.dumps({
    "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(tgz), "size": len(tgz)}],
}).encode()
blobs = {digest(config): config, digest(tgz): tgz}


class Registry(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, code, body=b"", kind="application/json", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        with open(log, "a") as f:
            f.write(f"{self.command} {self.headers.get('Host')} {self.path}\n")
        p = self.path.split("?")[0]
        if p in ("/v2/", "/v2"):
            return self.answer(200, b"{}")
        if p in (f"/v2/{name}/manifests/{tag}", f"/v2/{name}/manifests/{digest(manifest)}"):
            return self.answer(200, manifest, "application/vnd.oci.image.manifest.v1+json",
                               [("Docker-Content-Digest", digest(manifest))])
        prefix = f"/v2/{name}/blobs/"
        if p.startswith(prefix) and p[len(prefix):] in blobs:
            return self.answer(200, blobs[p[len(prefix):]], "application/octet-stream",
                               [("Docker-Content-Digest", p[len(prefix):])])
        return self.answer(404, b'{"errors":[{"code":"NAME_UNKNOWN","message":"unknown"}]}')

    do_HEAD = do_GET

    def log_message(self, *a):
        pass


class Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


server = Server(("::", 443), Registry)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
server.serve_forever()
