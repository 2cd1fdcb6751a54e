#!/usr/bin/env bash
# `make demo`: `knb compare` of 4 KiB RPCs at iodepth 1 and 16 — luna (r2c over memif)
# vs the kernel (veth) vs smoltcp (memif) vs the raw memif link — one core per side,
# stacks alternated round by round, medians and ratios printed.
#
# Bounded: DEMO_ROUNDS rounds (default 3) of DEMO_DURATION measured seconds (default 2)
# per stack, about a minute per iodepth. knb builds and tears down its topologies under
# the testbed prefix $LUNA_TESTBED_PREFIX (default luna); the trap removes anything left
# on any exit. Arguments go to both `knb compare` runs.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${LUNA_TESTBED_PREFIX:-luna}"
rounds="${DEMO_ROUNDS:-3}"
duration="${DEMO_DURATION:-2}"
out="${DEMO_OUT:-target/demo}"

die() { printf 'make demo: %s\n' "$*" >&2; exit 1; }

[[ "$(id -u)" -eq 0 ]] || die "must run as root (DPDK, hugepages, namespaces). Fix: sudo make demo"
[[ "$rounds" =~ ^[1-9][0-9]?$ ]] || die "DEMO_ROUNDS=$rounds: give 1..99"
[[ "$duration" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "DEMO_DURATION=$duration: give seconds, e.g. 2"

echo "make demo: building knb (release) and testbed"
cargo build -q --release -p knb || die "building knb failed (see above)"
cargo build -q -p testbed || die "building testbed failed (see above)"
knb=target/release/knb
testbed=target/debug/testbed
mkdir -p "$out"

cleanup() { "$testbed" down --prefix "$prefix" >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup # leftovers of an interrupted demo

for depth in 1 16; do
    echo
    echo "make demo: knb compare, 4 KiB RPCs, iodepth $depth, $rounds rounds of ${duration}s (luna, kernel, smoltcp, raw)"
    # A hang guard only: a round takes seconds.
    timeout --kill-after=10 $((rounds * 60 + 60)) \
        "$knb" compare --stacks luna,kernel,smoltcp --rounds "$rounds" \
        --req-size 4096 --resp-size 4096 --iodepth "$depth" \
        --duration "$duration" --warmup 0.5 --prefix "$prefix" \
        --json "$out/compare-d$depth.json" "$@" \
        || die "knb compare (iodepth $depth) failed; see above"
done

echo
echo "make demo: summary (median of per-round ratios over clean rounds; JSON in $out/compare-d{1,16}.json)"
for depth in 1 16; do
    json="$out/compare-d$depth.json"
    printf '  iodepth %-3s' "$depth"
    # knb compare leaves rounds where a busy-polling side was starved of CPU (or the host
    # stole time) out of the ratios, and says so in "verdict" when too few were clean.
    verdict=$(grep -o '"verdict": *"[^"]*"' "$json" | sed 's/^"verdict": *"//; s/"$//')
    if [[ "$verdict" != "ok" ]]; then
        printf 'the machine was too busy to measure: %s (starved sides in "too_busy" of %s)\n' \
            "${verdict#too busy to measure }" "$json"
        printf '              ratios that could be measured: '
    fi
    # Top-level ratios, then the same over the rounds where both stacks ran with the two
    # CPUs near (knb compare's by_host_link: the host's placement of the two vCPUs is
    # what makes this machine flip between two speeds; docs/benchmarks.md).
    python3 - "$json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
keys = sorted(k for k in d if k.startswith("luna_vs_"))
print(" ".join(f"{k}={d[k]:.3f}" for k in keys if d[k] is not None))
near = {k: v.get("near", {}) for k, v in d.get("by_host_link", {}).items()}
f = [f"{k}={near[k]['value']:.3f} ({near[k]['rounds']} rounds)" for k in keys
     if near.get(k, {}).get("value") is not None]
print("              CPUs near: " + (" ".join(f) if f else
      "fewer than two rounds where both ran with the CPUs near (KNB_DEMO_ARGS='--wait-near 30' waits for them)"))
PY
done
