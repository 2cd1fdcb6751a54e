#!/bin/bash
# Instructions (and, with CACHE_SIM=1, simulated cache misses) per RPC of one side of a
# knb run over memif, counted by callgrind: that side runs under valgrind, the other
# natively. A report, not a test (docs/benchmarks.md, "Flat transmit copy on memif by
# default"). Root, hugepages (make setup), valgrind; release build of knb first:
#
#   cargo build --release -p knb
#   examples/knb/callgrind-rpc.sh [luna|smoltcp] [server|client] [seconds] [iodepth]
#
# Environment: KNB (binary, default target/release/knb), KNB_ARGS (more knb options for
# both sides), REQ_SIZE and RESP_SIZE (default 4096), OUT (callgrind file, default
# /tmp/knb-callgrind.<stack>.<side>), CONNS (connections, default 1), CACHE_SIM=1 (CACHE_ARGS: more cache-sim options, e.g.
# --I1=65536,8,64 for a larger instruction cache), MTU (the memif link's IP MTU, default
# 1500; its buffers sized for one frame, as knb's --mtu does), and knb's own
# (KNB_LUNA_TX_COPY_MAX...).
# The measured side's EAL runs with --no-huge (valgrind cannot map hugepages the way
# DPDK does); per RPC = the poll thread's inclusive count / the RPCs of the whole run.
set -euo pipefail
stack=${1:-luna}
side=${2:-server}
secs=${3:-6}
depth=${4:-1}
case $stack in luna | smoltcp) ;; *) echo "stack: luna or smoltcp, not $stack" >&2; exit 2 ;; esac
case $side in server | client) ;; *) echo "side: server or client, not $side" >&2; exit 2 ;; esac
mtu=${MTU:-1500}
conns=${CONNS:-1}
[[ $secs =~ ^[0-9]+$ && $depth =~ ^[0-9]+$ && $mtu =~ ^[0-9]+$ && $conns =~ ^[1-9][0-9]*$ ]] || { echo "seconds, iodepth, MTU and CONNS: whole numbers" >&2; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
K=${KNB:-$root/target/release/knb}
OUT=${OUT:-/tmp/knb-callgrind.$stack.$side}
[ -x "$K" ] || { echo "no $K: cargo build --release -p knb" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }
TB=$root/target/release/testbed
[ -x "$TB" ] || cargo build --release -p testbed --manifest-path "$root/Cargo.toml" >&2
PREFIX=kcg$$
NS=$PREFIX-memif
DIR=/run/luna-testbed/$PREFIX
S=$DIR/memif.sock
work=$(mktemp -d)
cleanup() {
    exec 3>&- 2>/dev/null || true
    [ -n "${SP:-}" ] && kill "$SP" 2>/dev/null || true
    LUNA_TESTBED_PREFIX=$PREFIX "$TB" down >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
LUNA_TESTBED_PREFIX=$PREFIX "$TB" up memif >/dev/null
rm -f "$S" "$S".quiet-*

vg="valgrind --tool=callgrind --callgrind-out-file=$OUT --dump-instr=${DUMP_INSTR:-no}"
[ "${CACHE_SIM:-0}" = 1 ] && vg="$vg --cache-sim=yes ${CACHE_ARGS:-}"
spre="" cpre=""
smem="--eal-arg=--huge-unlink --eal-arg=-m --eal-arg=256"
cmem="--eal-arg=--huge-unlink --eal-arg=-m --eal-arg=256 --eal-arg=--in-memory"
if [ "$side" = server ]; then
    spre=$vg
    smem="--eal-arg=--no-huge --eal-arg=-m --eal-arg=512"
else
    cpre=$vg
    cmem="--eal-arg=--no-huge --eal-arg=-m --eal-arg=512"
fi
common="--stack=$stack --port=7700 --req-size=${REQ_SIZE:-4096} --resp-size=${RESP_SIZE:-4096} --iodepth=$depth --connections=$conns --threads=1 --mode=rpc --child --duration=$secs --warmup=1 --prefix-len=24 --eal-arg=--no-pci --eal-arg=--no-telemetry"
[ "$mtu" != 1500 ] && common="$common --mtu=$mtu"
# KNB_ARGS: more options for both sides, e.g. a message-mode server and an open-loop
# client: "--server-model=ms --workers=20 --service=fixed:1000ns --service-mode=timer
# --rate=3000" (with REQ_SIZE/RESP_SIZE for the message sizes).
common="$common ${KNB_ARGS:-}"
# One memif buffer per frame (knb's workload::memif_bsize), and rings of 2 MiB of buffers
# (workload::memif_rsize): the link knb itself sets up.
b=2048
while [ "$b" -lt $((mtu + 14 + 128)) ]; do b=$((b * 2)); done
r=4
while [ $((b << r)) -lt $((2 << 20)) ] && [ "$r" -lt 14 ]; do r=$((r + 1)); done
bsize=",bsize=$b,rsize=${KNB_MEMIF_RSIZE:-$r}"
vdev() { echo "--eal-arg=--vdev --eal-arg=net_memif0,role=$1,id=0,socket=$S,socket-abstract=no,mac=02:00:00:00:03:0$2$bsize"; }

mkfifo "$work/stdin"
# shellcheck disable=SC2086
ip netns exec "$NS" $spre "$K" server $common --ip=198.18.3.1 --cpus=1 --lifetime=$((secs + 600)) \
    --eal-arg=--file-prefix --eal-arg=$PREFIX-s --eal-arg=-l --eal-arg=1 $smem $(vdev server 1) \
    <"$work/stdin" >"$work/server.out" 2>&1 &
SP=$!
exec 3>"$work/stdin"
for _ in $(seq 1 900); do grep -q KNB_READY "$work/server.out" && break; sleep 0.2; done
spid=$(grep -o '"pid":[0-9]*' "$work/server.out" | head -1 | cut -d: -f2)
[ -n "$spid" ] || { cat "$work/server.out" >&2; echo "the server did not start" >&2; exit 1; }
# shellcheck disable=SC2086
ip netns exec "$NS" $cpre "$K" client $common --ip=198.18.3.2 --cpus=0 --server-ip=198.18.3.1 --server-pid="$spid" \
    --eal-arg=--file-prefix --eal-arg=$PREFIX-c --eal-arg=-l --eal-arg=0 $cmem $(vdev client 2) \
    >"$work/client.out" 2>&1 || { tail -5 "$work/client.out" >&2; exit 1; }
# A server that already finished (the measured client is slow to exit) has closed the
# pipe: the write then kills only the subshell.
(echo KNB_STOP >&3) 2>/dev/null || true
exec 3>&-
wait "$SP" || true
SP=
rpcs=$(grep -o '"requests":[0-9]*' "$work/server.out" | head -1 | cut -d: -f2)
[ -n "$rpcs" ] && [ "$rpcs" -gt 0 ] || { echo "no RPCs served" >&2; exit 1; }
echo "$stack $side: $rpcs RPCs in ${secs}s + 1s warm-up under callgrind ($OUT)"
# The main functions of the poll loop, per RPC (and the process's threads together, idle
# polling included). Like for like: luna's whole poll thread (`thread_start`) against
# smoltcp's serve or run_client closure (its whole loop, application included); smoltcp's
# `Lane::poll` leaves knb's application out. `push_msg` is the byte-mode application's
# 4 KiB memset (smoltcp only; valgrind counts `rep stosb` per byte), to subtract. callgrind_annotate splits a function's inclusive count over the
# files its inlined code came from; the largest of its lines is the function's total.
callgrind_annotate --inclusive=yes "$OUT" 2>/dev/null | python3 -c '
import re, sys
rpcs = int(sys.argv[1])
names = ["Thread>::new::thread_start", "Smoltcp as knb::backend::Backend>::serve::{{closure}}",
         "Smoltcp as knb::backend::Backend>::run_client::{{closure}}", "knb::proto::push_msg",
         "InlineMode<A>::dispatch", "ServerApp::serve",
         "ClientApp::pump", "smoltcp::Lane::poll", "CoreLoop<D>::transmit",
         "CoreLoop<D>::drain_stack_tx", "Stack<R>>::handle_frame", "Stack<R>>::handle_frames", "Device>::rx_burst"]
best, events = {}, None
for line in sys.stdin:
    if line.startswith("Events shown:"):
        events = line.split(":", 1)[1].split()
        continue
    line = re.sub(r"\( *[0-9.]+%\)", "", line)
    m = re.match(r"\s*((?:[0-9,]+\s+)+)(\S.*)$", line)
    if not m:
        continue
    counts = [int(c.replace(",", "")) for c in m.group(1).split()]
    func = re.sub(r" \[.*\]$", "", m.group(2))
    for n in names:
        if func.endswith(n) and counts[0] > best.get(n, [0])[0]:
            best[n] = counts
print("per RPC: " + " ".join("%10s" % e for e in events or ["Ir"]))
for n in names:
    if n in best:
        print("         " + " ".join("%10.0f" % (c / rpcs) for c in best[n]) + "  " + n)
' "$rpcs"
