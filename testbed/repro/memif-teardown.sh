#!/usr/bin/env bash
# Reproduces DPDK 22.11 net_memif's teardown race (issue 13, docs/benchmarks.md
# "Teardown SIGSEGV"; dpdk-sys now closes with the interrupt thread held, so a fixed
# tree passes): memif handles the peer's disconnect in a control-channel callback on
# the EAL interrupt thread; a rte_eth_dev_close of the same port on another thread while
# that callback runs frees the device under it (memif_disconnect then dereferences a NULL
# dev_private: SIGSEGV). The race window is normally microseconds; this widens it by
# preloading memif-teardown-delay.so, which makes the interrupt thread's recvmsg sleep
# once the link's client has announced it stopped polling (r2c's quiescence marker).
#
# usage: testbed/repro/memif-teardown.sh [RUNS] [DELAY_US] [knb args...]
#   RUNS      knb rpc runs (default 10)
#   DELAY_US  interrupt-thread delay (default 50000)
#   env STACK=smoltcp runs the smoltcp stack (default luna), KNB=path another knb binary
#   (e.g. an older tree's, for a before/after), KEEP=1 keeps the work directory
# Needs root and hugepages (as knb); builds nothing but the preload library: build knb
# first (cargo build -p knb). Prints each failed run's child status lines and a summary
# with the number of delays injected (one per run where the window was widened).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
runs=${1:-10}
delay=${2:-50000}
shift $(( $# > 2 ? 2 : $# ))
knb=${KNB:-$root/target/debug/knb}
work=$(mktemp -d /tmp/memif-teardown.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
gcc -shared -fPIC -O1 -o "$work/delay.so" "$here/memif-teardown-delay.c" -ldl || exit 2
args=(rpc --stack "${STACK:-luna}" --duration 1 --warmup 0.3 --verify --memif-zero-copy
      --iodepth 4 --connections 2 --req-size 3000 --resp-size 4096 "$@")
fails=0; segv=0
for i in $(seq 1 "$runs"); do
    out="$work/run.$i"
    LD_PRELOAD="$work/delay.so" ZCSEGV_DELAY_US="$delay" ZCSEGV_LOG="$work/delays" timeout 180 \
        "$knb" "${args[@]}" --json "$work/r.json" >"$out" 2>&1
    rc=$?
    if [ "$rc" != 0 ]; then
        fails=$((fails + 1))
        grep -q SIGSEGV "$out" && segv=$((segv + 1))
        echo "run $i: exit $rc"
        grep -E "signal|error:|did not" "$out" | sed 's/^/    /'
    fi
done
delays=$(cat "$work/delays" 2>/dev/null | wc -l)
echo "memif-teardown: $fails of $runs runs failed ($segv with a SIGSEGV), delay ${delay} us" \
     "injected $delays times"
[ "$fails" = 0 ]
