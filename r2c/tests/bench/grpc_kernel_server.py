#!/usr/bin/python3
"""The Linux-kernel gRPC server of the comparison (r2c/tests/proto_bench.sh): Python
grpcio (Debian python3-grpcio) serving the same `/luna.Echo/Echo` as luna-grpc (raw
bytes, the reply is the request), on the kernel's TCP stack.

Usage: grpc_kernel_server.py ADDR:PORT WORKERS SECS. Serves for SECS seconds at most
(or until SIGTERM), then prints 'GRPC-KERNEL ok calls=N'.
"""
import signal
import sys
import threading
from concurrent import futures

import grpc

addr, workers, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
calls = 0
lock = threading.Lock()


def echo(req, ctx):
    global calls
    with lock:
        calls += 1
    return req


handler = grpc.method_handlers_generic_handler(
    "luna.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
)
server = grpc.server(
    futures.ThreadPoolExecutor(max_workers=workers),
    handlers=[handler],
    maximum_concurrent_rpcs=None,
)
server.add_insecure_port(addr)
server.start()
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: done.set())
print("GRPC-KERNEL listening", addr, flush=True)
done.wait(secs)
server.stop(1).wait()
print(f"GRPC-KERNEL ok calls={calls}", flush=True)
