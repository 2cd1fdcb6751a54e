# source me. Helpers for running a program under luna's shim on the testbed tap topology
# (prefix shimt: namespace shimt-tap, kernel side 198.18.0.1, luna 198.18.0.2).
export LUNA_TESTBED_PREFIX=shimt
WT=${WT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)}
TB=$WT/target/debug/testbed
PRE=$WT/target/release/libluna-preload.so
NS=shimt-tap
CFG=${CFG:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/luna-tap.toml}
cat > $CFG <<TOML
eal = ["--file-prefix", "shimt-tap-dpdk", "--no-pci", "--huge-unlink", "-m", "256", "-l", "0", "--vdev", "net_tap0,iface=shimt-tap,mac=02:00:00:00:00:02", "--no-telemetry"]
[device]
kind = "dpdk"
port = "net_tap0"
[cores]
list = [0]
[net]
ip = "198.18.0.2"
prefix_len = 24
[runtime]
mode = "batch"
idle = "yield"
pin = false
TOML
# run a command under the shim in the namespace
luna() { ip netns exec $NS env LD_PRELOAD=$PRE LUNA_CONFIG=$CFG "$@"; }
# run a command in the namespace on the kernel
kern() { ip netns exec $NS "$@"; }
# wait for the DPDK process's tap and give it the kernel host's MAC and address
host_up() {
  for i in $(seq 1 200); do
    if ip -n $NS link show shimt-tap 2>/dev/null | grep -q 'state UP\|LOWER_UP\|02:00:00:00:00:02'; then break; fi
    sleep 0.05
  done
  for i in $(seq 1 50); do
    ip netns exec $NS sysctl -qw net.ipv6.conf.shimt-tap.disable_ipv6=1 2>/dev/null
    ip -n $NS link set dev shimt-tap address 02:00:00:00:00:01 2>/dev/null || { ip -n $NS link set dev shimt-tap down; ip -n $NS link set dev shimt-tap address 02:00:00:00:00:01; }
    ip -n $NS addr replace 198.18.0.1/24 dev shimt-tap 2>/dev/null
    ip -n $NS link set dev shimt-tap up 2>/dev/null
    sleep 0.1
    ip -n $NS link show shimt-tap 2>/dev/null | grep -q 02:00:00:00:00:01 && return 0
  done
  echo "host_up failed" >&2; return 1
}
# run one program under the shim to its end (at most $1 seconds), configuring the kernel side
# of its tap meanwhile; output in $LOG (default /tmp/lrun.out)
lrun() { local t=$1; shift; local log=${LOG:-/tmp/lrun.out}
  luna timeout $t "$@" > $log 2>&1 & local pid=$!
  host_up >/dev/null 2>&1; wait $pid; local rc=$?; grep -v "^EAL\|qdisc\|eth_dev_tap\|tap_nl" $log; return $rc; }
