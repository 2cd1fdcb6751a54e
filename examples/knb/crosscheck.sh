#!/usr/bin/env bash
# Cross-checks knb's kernel numbers with iperf3 and sockperf on the same veth topology
# (client in <p>-k1 on CPU 0, server in <p>-k2 on CPU 1), then knb itself.
# Usage: examples/knb/crosscheck.sh [seconds]   (root; builds nothing: run
#   `cargo build --release -p knb && cargo build -p testbed` first)
set -euo pipefail
secs=${1:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
tb=$root/target/debug/testbed
knb=$root/target/release/knb
p=lkbx$$
p=${p:0:10}
for t in "$tb" "$knb" /usr/bin/iperf3 /usr/bin/sockperf; do
    [ -x "$t" ] || { echo "missing $t (see the usage line)" >&2; exit 1; }
done
cleanup() { "$tb" down --prefix "$p" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$tb" up veth --prefix "$p" >/dev/null
k1="ip netns exec $p-k1 taskset -c 0"
k2="ip netns exec $p-k2 taskset -c 1"

echo "== iperf3, 4 KiB writes, $secs s"
$k2 iperf3 -s -1 -B 198.18.2.2 >/dev/null &
sleep 0.5
$k1 iperf3 -c 198.18.2.2 -l 4K -t "$secs" -f g | grep -E "sender|receiver"
wait

echo "== sockperf ping-pong, 4 KiB, TCP, $secs s (latency is half the round trip)"
$k2 timeout $((secs + 10)) sockperf sr --tcp -i 198.18.2.2 -p 11111 >/dev/null 2>&1 &
sleep 0.5
$k1 sockperf pp --tcp -i 198.18.2.2 -p 11111 -m 4096 -t "$secs" 2>&1 |
    grep -E "Summary: Latency|percentile 50.000|percentile 99.000|avg-rtt|Total"
kill %1 2>/dev/null || true
wait 2>/dev/null || true
cleanup

echo "== knb rpc --stack kernel, 4 KiB, iodepth 1 (latency is the round trip)"
"$knb" rpc --stack kernel --req-size 4096 --resp-size 4096 --iodepth 1 --duration "$secs" --warmup 1
echo "== knb bulk --stack kernel, 4 KiB writes"
"$knb" bulk --stack kernel --req-size 4096 --duration "$secs" --warmup 1 | tail -1
