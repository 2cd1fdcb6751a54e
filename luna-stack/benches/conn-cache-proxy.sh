#!/usr/bin/env bash
# Issue 13's deterministic proxies for the per-RPC cost and the 5,000-connection cost
# (docs/benchmarks.md, "5,000 connections: a deterministic cache-miss proxy"): rpc_pair under
# cachegrind with fixed caches (I1/D1 32 KiB 8-way, LL 512 KiB 8-way), per RPC =
# (X(20,000 RPCs) - X(10,000)) / 10,000, both stacks together:
#   1 connection with checksum offload (the instructions-per-RPC workload), and
#   16 and 5,000 connections without offload (instructions, D1 and LL misses).
# Valid on a busy machine (counts, not times). Takes a few minutes (six valgrind runs,
# two at a time). Output files in $CARGO_TARGET_DIR/bench/cache-proxy/.
# RPC_PAIR=<path> measures that rpc_pair binary instead of building one (before/after
# comparisons: keep a copy of the "before" binary), CACHE_PROXY_OUT=<dir> writes there.
set -euo pipefail
cd "$(dirname "$0")/../.."
target="${CARGO_TARGET_DIR:-target}"
out="${CACHE_PROXY_OUT:-$target/bench/cache-proxy}"
mkdir -p "$out"
command -v valgrind >/dev/null || { echo "valgrind is not installed (testbed/setup.sh installs it)" >&2; exit 1; }
if [ -n "${RPC_PAIR:-}" ]; then
    bin=$RPC_PAIR
else
    cargo build -q --release -p luna-stack --example rpc_pair
    bin="$target/release/examples/rpc_pair"
fi
run() { # name, then rpc_pair's arguments
    local name=$1
    shift
    valgrind --tool=cachegrind --cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 \
        --LL=524288,8,64 --cachegrind-out-file="$out/cg.$name" "$bin" "$@" \
        > "$out/out.$name" 2> "$out/err.$name" ||
        { echo "rpc_pair $* failed under cachegrind: $(tail -3 "$out/err.$name")" >&2; return 1; }
}
for pair in "1 1" "16 0" "5000 0"; do
    set -- $pair
    run "$1.10000" 10000 "$1" 1500 "$2" slab &
    p1=$!
    run "$1.20000" 20000 "$1" 1500 "$2" slab &
    p2=$!
    wait "$p1"
    wait "$p2"
done
python3 - "$out" <<'PY'
import sys
d = sys.argv[1]
def totals(name):
    events = None
    for line in open(f"{d}/cg.{name}"):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            return dict(zip(events, map(int, line.split()[1:])))
    sys.exit(f"no summary in {d}/cg.{name}")
print("per RPC (both stacks)   Ir      D1 misses r + w    LL misses r + w")
for conns, label in (("1", "1 conn, offload"), ("16", "16 conns"), ("5000", "5,000 conns")):
    a, b = totals(conns + ".10000"), totals(conns + ".20000")
    p = {e: (b[e] - a[e]) / 10000 for e in a}
    print(f"{label:<20} {p['Ir']:8.0f}   {p['D1mr']:6.1f} + {p['D1mw']:5.1f}     "
          f"{p['DLmr']:6.1f} + {p['DLmw']:5.1f}")
PY
