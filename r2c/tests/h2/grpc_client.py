"""A Python grpcio unary client against luna-grpc (generic methods, raw-bytes messages).

Usage: grpc_client.py HOST:PORT. Prints 'GRPC-CLIENT ok calls=N' when every reply and
every status is as expected; exits 1 with the first mismatch otherwise.
"""
import sys

import grpc

target = sys.argv[1]
calls = 0


def check(what, got, want):
    if got != want:
        print(f"GRPC-CLIENT mismatch {what}: got {got!r:.200} want {want!r:.200}")
        sys.exit(1)


def status(what, fn, arg, code, details=None):
    global calls
    calls += 1
    try:
        fn(arg, timeout=10)
    except grpc.RpcError as e:
        check(what + " code", e.code(), code)
        if details is not None:
            check(what + " details", e.details(), details)
        return
    print(f"GRPC-CLIENT mismatch {what}: no error")
    sys.exit(1)


with grpc.insecure_channel(target) as ch:
    echo = ch.unary_unary("/luna.Echo/Echo")
    put = ch.unary_unary("/luna.Kv/Put")
    get = ch.unary_unary("/luna.Kv/Get")
    # Message sizes around the DATA frame size and the flow-control windows: message
    # boundaries have nothing to do with DATA frame boundaries.
    for n in [0, 1, 5, 16379, 16384, 16389, 65535, 70000, 200000]:
        m = bytes((i * 7 + n) & 0xFF for i in range(n))
        check(f"echo {n}", echo(m, timeout=10), m)
        calls += 1
    # Many calls in flight on one channel (one HTTP/2 connection, many streams).
    futs = [(i, echo.future(b"call-%d" % i, timeout=20)) for i in range(200)]
    for i, f in futs:
        check(f"future {i}", f.result(), b"call-%d" % i)
        calls += 1
    for i in range(50):
        put(b"key-%d\x00value-%d" % (i, i), timeout=10)
        calls += 1
    for i in range(50):
        check(f"get {i}", get(b"key-%d" % i, timeout=10), b"value-%d" % i)
        calls += 1
    # gzip-compressed requests (grpc-encoding: gzip): decompressed by the server.
    for n in [1000, 70000]:
        m = bytes((i % 13) for i in range(n))
        check(f"gzip echo {n}", echo(m, timeout=10, compression=grpc.Compression.Gzip), m)
        calls += 1
    status("missing key", get, b"nope", grpc.StatusCode.NOT_FOUND, "no such key")
    status("bad put", put, b"no-separator", grpc.StatusCode.INVALID_ARGUMENT)
    status("unknown method", ch.unary_unary("/luna.Nope/Nope"), b"", grpc.StatusCode.UNIMPLEMENTED)

print(f"GRPC-CLIENT ok calls={calls}")
