#!/usr/bin/python3
"""gRPC status for an oversized request depends on its size: up to 1 MiB - 5 bytes the
server answers RESOURCE_EXHAUSTED (its 256 KiB message limit), above that the HTTP/2 layer
resets the stream with REFUSED_STREAM (max_body) and the client sees UNAVAILABLE, the code
gRPC retry policies treat as transient (and REFUSED_STREAM tells the client that the
request was not processed and may be retried). Usage: grpc_big_message_status.py HOST:PORT"""
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1], options=[("grpc.max_send_message_length", 64 << 20)])
echo = ch.unary_unary("/luna.Echo/Echo")
for n in [300_000, (1 << 20) - 5, (1 << 20) - 4, 4 << 20]:
    try:
        echo(bytes(n), timeout=10); r = "ok"
    except grpc.RpcError as e:
        r = f"{e.code()} {e.details()!r}"
    print(f"{n} bytes: {r}")
