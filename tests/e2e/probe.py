#!/usr/bin/python3
"""Network probes run INSIDE the sandbox by the e2e tests (the host's /usr/bin/python3,
visible through image = host). One line per probe: `SPEC RESULT`.

  tcp:HOST:PORT   open | refused | unreachable | timeout | error:...
  udp:HOST:PORT   reply | rejected | timeout | error:...    (sends one datagram, waits for an echo)
  dns:HOST        answer | rejected | timeout | error:...   (one A query for example.invalid)
  raw             eperm | opened | error:...                (raw ICMP socket)
  sni:HOST:PORT:SNI   tls-ok | closed | http-NNN | error:... (CONNECT via $HTTPS_PROXY, then TLS with SNI)
  tunnels:HOST:PORT:N all-N | partial-K | error:...       (N CONNECT tunnels open at once, each echoed)
  token:HOST:PORT:TOKEN http-NNN                           (CONNECT with the given proxy token)
IPv6 hosts are written in brackets: tcp:[fd99::2]:80.
"""
import errno, socket, sys

TIMEOUT = 3.0

def split(spec):
    kind, rest = spec.split(":", 1)
    if rest.startswith("["):
        host, port = rest[1:].split("]:", 1) if "]:" in rest else (rest[1:-1], "0")
        return kind, host, int(port), socket.AF_INET6
    host, _, port = rest.partition(":")
    return kind, host, int(port or 0), socket.AF_INET

def tcp(host, port, fam):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    try:
        s.connect((host, port))
        return "open"
    except socket.timeout:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM):
            return "unreachable"
        return "error:%s" % e
    finally:
        s.close()

def udp(host, port, fam, payload=b"ping"):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.settimeout(TIMEOUT)
    try:
        s.connect((host, port))
        s.send(payload)
        s.recv(512)
        return "reply"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        if e.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM):
            return "rejected"
        return "error:%s" % e
    finally:
        s.close()

DNS_QUERY = bytes.fromhex("abcd01000001000000000000") + b"\x07example\x07invalid\x00\x00\x01\x00\x01"

def raw():
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
        return "opened"
    except PermissionError:
        return "eperm"
    except OSError as e:
        return "error:%s" % e

import base64, os, ssl, urllib.parse

def proxy():
    u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
    return u.hostname, u.port, u.password

def connect(host, port, token):
    ph, pp, _ = proxy()
    s = socket.create_connection((ph, pp), timeout=10)
    cred = base64.b64encode(("aisb:%s" % token).encode()).decode()
    s.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\nProxy-Authorization: Basic %s\r\n\r\n"
               % (host, port, host, port, cred)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    return s, int(head.split(b" ")[1]) if head else 0

def sni(host, port, name):
    s, status = connect(host, port, proxy()[2])
    if status != 200:
        return "http-%d" % status
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        t = ctx.wrap_socket(s, server_hostname=name)
        t.close()
        return "tls-ok"
    except (ssl.SSLError, OSError):
        return "closed"

def tunnels(host, port, n):
    socks = []
    for _ in range(n):
        s, status = connect(host, port, proxy()[2])
        if status != 200:
            return "error:http-%d after %d" % (status, len(socks))
        socks.append(s)
    ok = 0
    for i, s in enumerate(socks):
        msg = ("tunnel-%d\n" % i).encode()
        s.sendall(msg)
        got = b""
        while len(got) < len(msg):
            c = s.recv(64)
            if not c:
                break
            got += c
        ok += got == msg
    for s in socks:
        s.close()
    return "all-%d" % n if ok == n else "partial-%d" % ok

for spec in sys.argv[1:]:
    if spec.startswith(("sni:", "tunnels:", "token:")):
        kind, host, port, arg = spec.split(":", 3)
        try:
            if kind == "sni":
                res = sni(host, int(port), arg)
            elif kind == "tunnels":
                res = tunnels(host, int(port), int(arg))
            else:
                res = "http-%d" % connect(host, int(port), arg)[1]
        except OSError as e:
            res = "error:%s" % e
        print(spec, res, flush=True)
        continue
    if spec == "raw":
        res = raw()
    else:
        kind, host, port, fam = split(spec)
        if kind == "tcp":
            res = tcp(host, port, fam)
        elif kind == "udp":
            res = udp(host, port, fam)
        elif kind == "dns":
            res = udp(host, 53, fam, DNS_QUERY).replace("reply", "answer")
        else:
            res = "error:unknown probe"
    print(spec, res, flush=True)
