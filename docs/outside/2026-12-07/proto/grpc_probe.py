#!/usr/bin/python3
"""grpcio (Debian python3-grpcio 1.51) probes against luna-grpc. Usage: grpc_probe.py HOST:PORT"""
import sys, time, threading, grpc
target = sys.argv[1]
opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.enable_retries", 1)]
ch = grpc.insecure_channel(target, options=opts)
echo = ch.unary_unary("/luna.Echo/Echo")

def t(name, fn):
    t0 = time.time()
    try:
        r = fn()
        out = f"ok {r!r:.80}"
    except grpc.RpcError as e:
        out = f"{e.code()} {e.details()!r:.120}"
    except Exception as e:
        out = f"EXC {e!r:.120}"
    print(f"{name}: {out} ({time.time()-t0:.2f}s)", flush=True)

for n in [256 * 1024 - 5, 256 * 1024, 256 * 1024 + 1, 600_000, (1 << 20) - 5, (1 << 20) - 4, 2 << 20, 8 << 20]:
    m = bytes(n)
    t(f"echo {n} bytes", lambda: len(echo(m, timeout=15)))
t("gzip 1 MiB zeros (compresses to ~1 KB)", lambda: len(echo(bytes(1 << 20), timeout=10, compression=grpc.Compression.Gzip)))
t("gzip 255 KiB", lambda: len(echo(bytes(255 << 10), timeout=10, compression=grpc.Compression.Gzip)))
t("deflate", lambda: len(echo(b"x" * 100, timeout=10, compression=grpc.Compression.Deflate)))
t("deadline 1ms", lambda: echo(bytes(100000), timeout=0.001))
t("metadata 7 KB", lambda: echo(b"m", timeout=5, metadata=[("x-big", "a" * 7000)]))
t("metadata 200 entries", lambda: echo(b"m", timeout=5, metadata=[("x-m%d" % i, "v") for i in range(200)]))
t("binary metadata", lambda: echo(b"m", timeout=5, metadata=[("x-bin", b"\x00\xff\r\n")]))
t("stream-stream on unary method (2 msgs)", lambda: list(ch.stream_stream("/luna.Echo/Echo")(iter([b"a", b"b"]), timeout=5)))
t("stream-unary 0 msgs", lambda: ch.stream_unary("/luna.Echo/Echo")(iter([]), timeout=5))
t("unknown service", lambda: ch.unary_unary("/x.Y/Z")(b"", timeout=5))
t("path without slash", lambda: ch.unary_unary("luna.Echo/Echo")(b"", timeout=5))
# cancelled calls
futs = [echo.future(bytes(200_000), timeout=20) for _ in range(50)]
for f in futs[::2]:
    f.cancel()
ok = sum(1 for f in futs[1::2] if len(f.result()) == 200_000)
print("cancel half of 50 futures: the other 25 ok:", ok, flush=True)
# many concurrent calls on one channel
t0 = time.time()
futs = [echo.future(b"c%d" % i, timeout=30) for i in range(2000)]
ok = sum(1 for i, f in enumerate(futs) if f.result() == b"c%d" % i)
print(f"2000 concurrent calls: {ok} ok ({time.time()-t0:.1f}s)", flush=True)
