"""A gRPC server over TLS on :443 for the e2e suite (grpcio, generic handlers: no generated
code, messages are raw bytes). Each call's metadata is appended to $GRPC_LOG as a JSON line.

  /e2e.Echo/Unary   answers b"unary:" + the request
  /e2e.Echo/Chat    a bidirectional stream: each message answered b"chat:" + it
  /e2e.Echo/Leak    answers with the call's authorization metadata (an echo of the key)
  /e2e.Echo/Secret  answers b"secret" (the tests' rules never allow it)

Usage: grpc_server.py CERT KEY
"""
import json, os, sys, threading
from concurrent import futures

import grpc

LOG = os.environ["GRPC_LOG"]
lock = threading.Lock()


def log(method, context, **extra):
    md = {k: v for k, v in context.invocation_metadata() if not k.endswith("-bin")}
    with lock, open(LOG, "a") as f:
        f.write(json.dumps({"method": method, "metadata": md, **extra}) + "\n")


def unary(req, context):
    log("Unary", context, length=len(req))
    return b"unary:" + req


def chat(requests, context):
    n = 0
    for r in requests:
        n += 1
        yield b"chat:" + r
    log("Chat", context, messages=n)


def leak(req, context):
    log("Leak", context)
    auth = dict(context.invocation_metadata()).get("authorization", "")
    return b"your key: " + auth.encode()


def secret(req, context):
    log("Secret", context)
    return b"secret"


handlers = {
    "Unary": grpc.unary_unary_rpc_method_handler(unary),
    "Chat": grpc.stream_stream_rpc_method_handler(chat),
    "Leak": grpc.unary_unary_rpc_method_handler(leak),
    "Secret": grpc.unary_unary_rpc_method_handler(secret),
}
cert, key = (open(p, "rb").read() for p in sys.argv[1:3])
server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("e2e.Echo", handlers),))
server.add_secure_port("[::]:443", grpc.ssl_server_credentials([(key, cert)]))
server.start()
server.wait_for_termination()
