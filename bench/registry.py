#!/usr/bin/python3
"""The bench's package registries and git server, over HTTPS, generated at start (stdlib only).

  registry.py DATA_DIR CERT KEY ADDR:PORT NAME

serves, for the real-workload rows of bench/run (run in the bench's own network namespace):
  /npm/...        an npm registry: NPM_COUNT packages, 20 direct dependencies of the bench
                  project (npm/package.json), each with 9 of its own (tarballs generated here)
  /pypi/simple/   a PEP 503 index of WHEEL_COUNT pure-Python wheels (pypi/requirements.txt)
  /git/NAME.git   git's smart HTTP (`git http-backend`): big.git (~GIT_MB MB that does not
                  compress), and any other NAME.git that exists under DATA_DIR/git (push targets)
Every file is generated from a fixed seed, so runs are comparable.
"""
import base64, hashlib, http.server, io, json, os, random, socketserver, ssl, subprocess, sys, tarfile, threading, zipfile

NPM_COUNT, WHEEL_COUNT, GIT_MB = 200, 50, 100
data, cert, key, listen, name = sys.argv[1:6]
base = f"https://{name}"
rng = random.Random(13)


def blob(n):
    return rng.randbytes(n)


def npm_name(i):
    return f"bench-pkg-{i:03d}"


def make_npm():
    os.makedirs(f"{data}/npm/tarballs", exist_ok=True)
    packuments = {}
    for i in range(NPM_COUNT):
        deps = {npm_name(j): "^1.0.0" for j in range(20 + i * 9, 20 + i * 9 + 9)} if i < 20 else {}
        meta = {"name": npm_name(i), "version": "1.0.0", "main": "index.js", "dependencies": deps}
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as t:
            for path, body in [("package/package.json", json.dumps(meta).encode()),
                               ("package/index.js", b"module.exports = 1;\n"),
                               ("package/data.bin", blob(16 * 1024))]:
                info = tarfile.TarInfo(path)
                info.size, info.mtime, info.mode = len(body), 0, 0o644
                t.addfile(info, io.BytesIO(body))
        tgz = buf.getvalue()
        fname = f"{npm_name(i)}-1.0.0.tgz"
        open(f"{data}/npm/tarballs/{fname}", "wb").write(tgz)
        dist = {"tarball": f"{base}/npm/{npm_name(i)}/-/{fname}", "shasum": hashlib.sha1(tgz).hexdigest(),
                "integrity": "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()}
        packuments[npm_name(i)] = json.dumps({"name": npm_name(i), "dist-tags": {"latest": "1.0.0"},
                                              "versions": {"1.0.0": dict(meta, dist=dist)}}).encode()
    project = {"name": "bench-project", "version": "1.0.0", "private": True,
               "dependencies": {npm_name(i): "^1.0.0" for i in range(20)}}
    open(f"{data}/npm/package.json", "w").write(json.dumps(project, indent=1))
    return packuments


def make_wheels():
    os.makedirs(f"{data}/pypi/files", exist_ok=True)
    index = {}
    for i in range(WHEEL_COUNT):
        mod, dist = f"bench_wheel_{i:02d}", f"bench-wheel-{i:02d}"
        files = {f"{mod}/__init__.py": b"VALUE = 1\n", f"{mod}/data.bin": blob(48 * 1024),
                 f"{mod}-1.0.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0.0\n".encode(),
                 f"{mod}-1.0.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
        record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n"
                         for p, b in files.items()) + f"{mod}-1.0.0.dist-info/RECORD,,\n"
        files[f"{mod}-1.0.0.dist-info/RECORD"] = record.encode()
        fname = f"{mod}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(f"{data}/pypi/files/{fname}", "w") as z:
            for p, b in files.items():
                z.writestr(zipfile.ZipInfo(p, (1980, 1, 1, 0, 0, 0)), b)
        digest = hashlib.sha256(open(f"{data}/pypi/files/{fname}", "rb").read()).hexdigest()
        index[dist] = f'<a href="/pypi/files/{fname}#sha256={digest}">{fname}</a>'.encode()
    open(f"{data}/pypi/requirements.txt", "w").write("".join(f"bench-wheel-{i:02d}\n" for i in range(WHEEL_COUNT)))
    return index


def make_git():
    repo = f"{data}/git/big.git"
    if os.path.isdir(repo):
        return
    work = f"{data}/git/big-work"
    os.makedirs(work)
    for i in range(GIT_MB // 2):
        open(f"{work}/file{i:02d}.bin", "wb").write(blob(2 << 20))
    env = dict(os.environ, GIT_AUTHOR_DATE="2026-01-01T00:00:00Z", GIT_COMMITTER_DATE="2026-01-01T00:00:00Z")
    run = lambda *a: subprocess.run(a, check=True, env=env, stdout=subprocess.DEVNULL)
    run("git", "-C", work, "init", "-q", "-b", "main")
    run("git", "-C", work, "add", ".")
    run("git", "-C", work, "-c", "user.name=bench", "-c", "user.email=bench@bench.test", "commit", "-q", "-m", "big")
    run("git", "clone", "-q", "--bare", work, repo)
    # One pack, as a real server has: upload-pack then sends it as it is instead of compressing
    # 100 MB of loose objects on every clone.
    run("git", "-C", repo, "repack", "-a", "-d", "-q")
    subprocess.run(["rm", "-rf", work], check=True)


packuments, wheels = make_npm(), make_wheels()
make_git()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # As production registries do. With Nagle on, every response (headers, then body: two TLS
    # records) waited for the client's delayed ACK, ~40 ms per request with or without a
    # sandbox, and the workload rows measured that stall more than anything else.
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def send(self, code, body, ctype="application/octet-stream"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0]
        parts = path.strip("/").split("/")
        if parts[0] == "npm" and len(parts) == 2 and parts[1] in packuments:
            return self.send(200, packuments[parts[1]], "application/json")
        if parts[0] == "npm" and len(parts) == 4 and parts[2] == "-":
            return self.file(f"{data}/npm/tarballs/{parts[3]}")
        if parts[:2] == ["pypi", "simple"]:
            if len(parts) == 2:
                return self.send(200, b"".join(f'<a href="{d}/">{d}</a>\n'.encode() for d in wheels), "text/html")
            if parts[2] in wheels:
                return self.send(200, b"<html><body>" + wheels[parts[2]] + b"</body></html>", "text/html")
        if parts[:2] == ["pypi", "files"] and len(parts) == 3:
            return self.file(f"{data}/pypi/files/{parts[2]}")
        if parts[0] == "git":
            return self.git()
        self.send(404, b"not here\n", "text/plain")

    do_POST = do_GET

    def file(self, path):
        if "/.." in path or not os.path.isfile(path):
            return self.send(404, b"no such file\n", "text/plain")
        self.send(200, open(path, "rb").read())

    def git(self):
        """`git http-backend` as a CGI; pushes need Content-Length (bench clients set a large
        http.postBuffer, so git never sends chunked bodies)."""
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {"GIT_PROJECT_ROOT": f"{data}/git", "GIT_HTTP_EXPORT_ALL": "1", "REMOTE_USER": "bench",
               "PATH_INFO": path[len("/git"):], "QUERY_STRING": query, "REQUEST_METHOD": self.command,
               "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(length),
               "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        if self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        proc = subprocess.Popen(["git", "http-backend"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        feeder = threading.Thread(target=lambda: (proc.stdin.write(body), proc.stdin.close()))
        feeder.start()
        status, headers = 200, []
        for line in iter(proc.stdout.readline, b""):
            line = line.decode("latin-1").strip()
            if not line:
                break
            k, _, v = line.partition(":")
            if k.lower() == "status":
                status = int(v.split()[0])
            else:
                headers.append((k, v.strip()))
        # Streamed (packs are ~100 MB), chunked.
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while chunk := proc.stdout.read1(1 << 20):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")
        feeder.join()
        proc.wait()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 256


host, port = listen.rsplit(":", 1)
srv = Server((host, int(port)), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
# The handshake happens in each connection's thread, not in the accept loop.
srv.socket = ctx.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)
print("ready", flush=True)
srv.serve_forever()
