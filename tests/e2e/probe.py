#!/usr/bin/python3
"""Network probes run INSIDE the sandbox by the e2e tests (the host's /usr/bin/python3,
visible through image = host). One line per probe: `SPEC RESULT`.

  tcp:HOST:PORT   open | refused | unreachable | timeout | error:...
  udp:HOST:PORT   reply | rejected | timeout | error:...    (sends one datagram, waits for an echo)
  dns:HOST        answer | rejected | timeout | error:...   (one A query for example.invalid)
  raw             eperm | opened | error:...                (raw ICMP socket)
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

for spec in sys.argv[1:]:
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
