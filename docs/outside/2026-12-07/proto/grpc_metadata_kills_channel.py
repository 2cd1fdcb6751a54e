#!/usr/bin/python3
"""One gRPC call with 130 small metadata entries (about 1.5 KB, far below the 16 KiB
MAX_HEADER_LIST_SIZE luna advertises and grpcio's 8 KiB default) gets GOAWAY
ENHANCE_YOUR_CALM for the whole connection, so every other call in flight on the same
channel fails with UNAVAILABLE. Usage: grpc_metadata_kills_channel.py HOST:PORT"""
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
echo = ch.unary_unary("/luna.Echo/Echo")
echo(b"warm", timeout=5)
for n in (120, 130):
    others = [echo.future(bytes(200_000), timeout=10) for _ in range(40)]
    try:
        echo(b"m", timeout=5, metadata=[("x-m%d" % i, "v") for i in range(n)])
        r = "ok"
    except grpc.RpcError as e:
        r = f"{e.code()} {e.details()}"
    failed = 0
    for f in others:
        try:
            f.result()
        except grpc.RpcError as e:
            failed += 1
            last = e.code()
    print(f"call with {n} metadata entries: {r}; other concurrent calls failed: {failed}/40")
