#!/bin/bash
# Protocol-attack benchmark (`make attack-proto`; docs/reliability.md, "The good client's
# p99 under protocol attacks"; never in `make test`): luna-h2 and luna-kv over tap, a
# well-behaved kernel client doing checked requests through every phase, and in phases of
# SECS seconds: REPS repetitions of (baseline, attack) for each HTTP/2 / memcached attack
# (tests/h2/attacks.py, tests/memcached/attack.py, repeated on new connections) at each
# attacker priority, then a last baseline: every attack phase between two baselines of its
# own (testbed/attack/interleave.py). Per phase: good requests, errors, p50/p99/p99.9, p99
# against the neighbouring baselines, the attacker's runs, frames, CPU seconds of the
# attacker / good client / server, the server's defence counter. Per attack: the median
# ratio over REPS, its range, and a verdict (within 2x / not within 2x / inconclusive).
# The driver is tests/bench/attack_bench.py; this script builds, brings the servers up and
# down. Pinning (PIN=1, the default): luna's process stays on CPU 0 (EAL lcore 0, which its
# I/O core and workers inherit), the driver (good client) and every attacker on CPU 1.
#
# Kernel control (ATTACK_PROTO_SERVER=kernel, as `make attack`'s ATTACK_SERVER=kernel): the
# same phases, good client, attackers, pinning and verdicts against kernel-TCP servers in
# the testbed's veth topology (the driver in <prefix>v-k1, the server in <prefix>v-k2):
# Debian's nghttpd (nghttp2-server; --no-tls --echo-upload, a document root with luna-h2's
# `/` and `/big`, so the good client's GET / and POST /echo get the same replies) and
# memcached (-t WORKERS), each on CPU 0 (taskset, PIN=1) as luna's process is. They count
# none of luna's defences: what they answered is reported (docs/reliability.md, "Kernel
# control for the protocol attacks"), and only the good client's errors fail the run.
#
# Usage: sudo r2c/tests/attack_bench.sh [tiny]
#   tiny: one HTTP/2 and one memcached attack, 1 repetition of 1 s phases, normal
#   priority, a debug build: checks the script works end to end (numbers from it mean
#   nothing).
# Knobs (environment): PROTOS ("h2 memcached"), SECS (3), REPS (3), PRIOS ("normal,idle":
#   the attacker at normal priority, then at SCHED_IDLE, which models an attacker on
#   another host; "nice" = nice 19), H2_PHASES / MC_PHASES (comma lists, default: every
#   attack), PIN (1: driver and attackers on CPU 1; 0: unpinned), SPIN (0; 1: a SCHED_IDLE
#   busy loop on the driver's CPU through every phase, so it never idles; docs/reliability.md,
#   "Finding: an idle client CPU"), MIN_SAMPLES (1000 per
#   baseline), SPREAD_MAX (1.5), MODEL (ms), WORKERS (3), MAX_ATTACKS (10000 per phase),
#   PROFILE (release), OUT (a new /tmp/attack-proto.XXXXXX): results go to
#   OUT/{h2,memcached}.{json,md}. ATTACK_PROTO_SERVER (luna; kernel: the control above),
#   ANSWER_WAIT (luna: unset, an HTTP/2 attacker reads until the server closes, a
#   memcached one waits up to 10 s for a reply; kernel: 0.2, so an attack the kernel
#   server neither answers nor closes is still repeated: seconds the attacker reads each
#   answer), LUNA_TESTBED_PREFIX (lab2, at most 9 characters: the topologies' prefixes
#   are it, it + k and it + v).
# Exit status 0 when every phase's good client saw no error and every attack raised its
# defence counter with no attacker failure (latency verdicts never change it). Bounded:
# every phase SECS (+ one attack's wait), servers --secs.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PROTOS=${PROTOS:-"h2 memcached"}
SECS=${SECS:-3}
REPS=${REPS:-3}
PIN=${PIN:-1}
SPIN=${SPIN:-0}
MIN_SAMPLES=${MIN_SAMPLES:-1000}
SPREAD_MAX=${SPREAD_MAX:-1.5}
PRIOS=${PRIOS:-normal,idle}
H2_PHASES=${H2_PHASES:-}
MC_PHASES=${MC_PHASES:-}
MODEL=${MODEL:-ms}
WORKERS=${WORKERS:-3}
MAX_ATTACKS=${MAX_ATTACKS:-10000}
PROFILE=${PROFILE:-release}
SERVER=${ATTACK_PROTO_SERVER:-luna}
case $SERVER in
luna) ANSWER_WAIT=${ANSWER_WAIT:-} ;;
kernel) ANSWER_WAIT=${ANSWER_WAIT:-0.2} ;;
*) echo "ATTACK_PROTO_SERVER=$SERVER: luna or kernel" >&2; exit 2 ;;
esac
if [ "${1:-}" = tiny ]; then
    PROFILE=${PROFILE_TINY:-debug}
    SECS=1 REPS=1 PRIOS=normal H2_PHASES=rapid_reset MC_PHASES=bin_bodylen_underflow
fi
case $PIN in
1) PINCPU=1 SRVPIN=(taskset -c 0) ;;
0) PINCPU=none SRVPIN=() ;;
*) echo "PIN=$PIN: 1 (driver and attackers on CPU 1) or 0" >&2; exit 2 ;;
esac
T=${CARGO_TARGET_DIR:-$ROOT/target}
if [ "$PROFILE" = release ]; then REL=--release; else REL=; fi
cargo build $REL -q -p testbed --bin testbed
if [ "$SERVER" = luna ]; then
    cargo build $REL -q -p r2c --example luna-h2 --example luna-kv
else
    for tool in nghttpd:nghttp2-server memcached:memcached; do
        command -v "${tool%%:*}" >/dev/null || { echo "${tool%%:*} missing: apt-get install ${tool#*:} (make setup)" >&2; exit 1; }
    done
fi
B=$T/$PROFILE
PY=/usr/bin/python3
DRIVER=$ROOT/r2c/tests/bench/attack_bench.py
OUT=${OUT:-$(mktemp -d /tmp/attack-proto.XXXXXX)}
mkdir -p "$OUT"
PFX=${LUNA_TESTBED_PREFIX:-lab2}
[ ${#PFX} -le 9 ] || { echo "LUNA_TESTBED_PREFIX=$PFX: at most 9 characters here" >&2; exit 2; }
KPFX=${PFX}k
VPFX=${PFX}v
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    "$B/testbed" down tap --prefix "$PFX" >/dev/null 2>&1 || true
    "$B/testbed" down veth --prefix "$VPFX" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# A phase's longest wait: SECS, plus one attack's reply wait, plus the attacker's start.
PHASE_MAX=$(( ${SECS%.*} + 25 ))
stop_srv() { # stop_srv STOPFILE PID
    touch "$1"
    for _ in $(seq 600); do kill -0 "$2" 2>/dev/null || return 0; sleep 0.1; done
    kill "$2" 2>/dev/null || true
}
phases_n() { # phases_n LIST DEFAULT_N: how many attacks (for the time bound)
    if [ -n "$1" ]; then tr ',' '\n' <<<"$1" | grep -c . ; else echo "$2"; fi
}
descendants() { # descendants PID: PID and every process below it (the server's re-exec)
    echo "$1"
    for c in $(pgrep -P "$1" || true); do descendants "$c"; done
}
server_pids() { descendants "$1" | paste -sd, -; }
NPRIO=$(tr ',' '\n' <<<"$PRIOS" | grep -c .)
RC=0
COMMON=(--secs "$SECS" --prios "$PRIOS" --max-attacks "$MAX_ATTACKS" --reps "$REPS" --pin-cpu "$PINCPU"
    --min-samples "$MIN_SAMPLES" --spread-max "$SPREAD_MAX" --spin "$SPIN" --server "$SERVER")
[ -n "$ANSWER_WAIT" ] && COMMON+=(--answer-wait "$ANSWER_WAIT")

# The kernel control: nghttpd / memcached in the veth topology's second namespace.
kernel_proto() { # kernel_proto h2|memcached
    local proto=$1 port n phases_arg srv args
    if [ "$proto" = h2 ]; then
        port=8080 n=$(( (2 * REPS * $(phases_n "$H2_PHASES" 9) * NPRIO + 1) * PHASE_MAX + 60 ))
        phases_arg=$H2_PHASES
        # luna-h2's routes as files: `/` (index.html) and `/big` (64 KiB, the same bytes);
        # --echo-upload answers POST /echo with its body, as luna-h2 does.
        mkdir -p "$OUT/htdocs"
        printf 'hello from luna over HTTP/2\n' >"$OUT/htdocs/index.html"
        "$PY" -c 'import sys; sys.stdout.buffer.write(bytes(i % 251 for i in range(64 << 10)))' >"$OUT/htdocs/big"
        timeout "$n" ip netns exec "$SNS" "${SRVPIN[@]}" nghttpd --no-tls --echo-upload -n "$WORKERS" \
            -d "$OUT/htdocs" -a "$SIP" "$port" >"$OUT/nghttpd.out" 2>&1 &
    else
        port=11211 n=$(( (2 * REPS * $(phases_n "$MC_PHASES" 8) * NPRIO + 1) * PHASE_MAX + 60 ))
        phases_arg=$MC_PHASES
        # luna-kv's item cap is memcached's default (1 MiB); 64 MiB of cache is plenty.
        timeout "$n" ip netns exec "$SNS" "${SRVPIN[@]}" memcached -u "$MCUSER" -l "$SIP" -p "$port" \
            -t "$WORKERS" -m 64 -c 4096 >"$OUT/memcached.out" 2>&1 &
    fi
    srv=$!
    PIDS+=("$srv")
    # timeout's child (the server after ip netns exec and taskset exec) must exist before
    # its pid is taken for the CPU figures.
    for _ in $(seq 100); do pgrep -P "$srv" >/dev/null && break; sleep 0.05; done
    # nghttpd has no send / idle timers to wait for: zero_window is repeated like the rest.
    args=("${COMMON[@]}" --server-pids "$(server_pids "$srv")" --timer-wait "$ANSWER_WAIT")
    [ -n "$phases_arg" ] && args+=(--phases "$phases_arg")
    # The driver waits (bounded) until the server accepts connections.
    timeout "$n" ip netns exec "$CNS" "$PY" "$DRIVER" "$proto" "$SIP" "$port" \
        "$([ "$proto" = h2 ] && echo none || echo memcached-stats)" \
        "$OUT/$proto.json" "$OUT/$proto.md" "${args[@]}" | tee "$OUT/$proto.txt" || RC=1
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
}

if [ "$SERVER" = kernel ]; then
    "$B/testbed" up veth --prefix "$VPFX" >"$OUT/up.txt"
    CNS=$VPFX-k1
    SNS=$VPFX-k2
    SIP=$(sed -n "s/^  $SNS: \([0-9.]*\)\/.*/\1/p" "$OUT/up.txt")
    [ -n "$SIP" ] || { cat "$OUT/up.txt"; echo "no veth topology" >&2; exit 1; }
    MCUSER=memcache
    id "$MCUSER" >/dev/null 2>&1 || MCUSER=nobody
    for proto in $PROTOS; do
        case $proto in
        h2 | memcached) kernel_proto "$proto" ;;
        *) echo "unknown protocol $proto (h2, memcached)" >&2; exit 2 ;;
        esac
    done
    echo "results: $OUT (kernel control: nghttpd / memcached, $WORKERS threads, $REPS repetitions of $SECS s phases, attacker priorities $PRIOS, answer wait ${ANSWER_WAIT}s, PIN=$PIN)"
    exit $RC
fi

for proto in $PROTOS; do
    case $proto in
    h2)
        "$B/testbed" up tap --prefix "$PFX" >"$OUT/up.txt"
        NS=$(sed -n 's/^tap: namespace \([^ ]*\).*/\1/p' "$OUT/up.txt")
        IP=$(sed -n 's/^  dpdk: \([0-9.]*\) .*/\1/p' "$OUT/up.txt")
        [ -n "$NS" ] && [ -n "$IP" ] || { cat "$OUT/up.txt"; echo "no tap topology" >&2; exit 1; }
        N=$(( (2 * REPS * $(phases_n "$H2_PHASES" 9) * NPRIO + 1) * PHASE_MAX + 60 ))
        rm -f "$OUT/h2.stop" "$OUT/h2.ready" "$OUT/h2.stats"
        # Short timers so the zero-window slow read is ended within a phase (as the test).
        "$B/examples/luna-h2" --prefix "$PFX" --port 8080 --model "$MODEL" --workers "$WORKERS" \
            --idle-timeout 3 --send-timeout 3 --secs "$N" --stats-file "$OUT/h2.stats" \
            --stop-file "$OUT/h2.stop" --ready-file "$OUT/h2.ready" >"$OUT/h2.out" 2>&1 &
        SRV=$!
        PIDS+=("$SRV")
        for _ in $(seq 600); do [ -e "$OUT/h2.ready" ] && break; sleep 0.1; done
        [ -e "$OUT/h2.ready" ] || { echo "luna-h2 did not start" >&2; cat "$OUT/h2.out" >&2; exit 1; }
        ARGS=("${COMMON[@]}" --server-pids "$(server_pids "$SRV")" --timer-wait 5)
        [ -n "$H2_PHASES" ] && ARGS+=(--phases "$H2_PHASES")
        timeout "$N" ip netns exec "$NS" "$PY" "$DRIVER" h2 "$IP" 8080 "$OUT/h2.stats" \
            "$OUT/h2.json" "$OUT/h2.md" "${ARGS[@]}" | tee "$OUT/h2.txt" || RC=1
        stop_srv "$OUT/h2.stop" "$SRV"
        grep '^OK ' "$OUT/h2.out" | sed 's/^/luna-h2 at exit: /' || { echo "luna-h2: no OK line" >&2; RC=1; }
        "$B/testbed" down tap --prefix "$PFX" >/dev/null 2>&1 || true
        ;;
    memcached)
        N=$(( (2 * REPS * $(phases_n "$MC_PHASES" 8) * NPRIO + 1) * PHASE_MAX + 60 ))
        # luna-kv brings up its own tap topology (prefix $KPFX) and prints it.
        "$B/examples/luna-kv" --prefix "$KPFX" --model "$MODEL" --workers "$WORKERS" \
            --duration "$N" --stats-file "$OUT/memcached.stats" >"$OUT/kv.out" 2>&1 &
        KV=$!
        PIDS+=("$KV")
        for _ in $(seq 600); do grep -q '^stop: touch' "$OUT/kv.out" && break; sleep 0.1; done
        KNS=$(sed -n 's/^kernel clients: ip netns exec \([^ ]*\) .*/\1/p' "$OUT/kv.out")
        KIP=$(sed -n 's/.* -h \([0-9.]*\) -p .*/\1/p' "$OUT/kv.out")
        KSTOP=$(sed -n 's/^stop: touch //p' "$OUT/kv.out")
        [ -n "$KNS" ] || { echo "luna-kv did not start" >&2; cat "$OUT/kv.out" >&2; exit 1; }
        ARGS=("${COMMON[@]}" --server-pids "$(server_pids "$KV")")
        [ -n "$MC_PHASES" ] && ARGS+=(--phases "$MC_PHASES")
        timeout "$N" ip netns exec "$KNS" "$PY" "$DRIVER" memcached "$KIP" 11211 \
            "$OUT/memcached.stats" "$OUT/memcached.json" "$OUT/memcached.md" "${ARGS[@]}" \
            | tee "$OUT/memcached.txt" || RC=1
        stop_srv "$KSTOP" "$KV"
        grep '^OK ' "$OUT/kv.out" | sed 's/^/luna-kv at exit: /' || { echo "luna-kv: no OK line" >&2; RC=1; }
        ;;
    *)
        echo "unknown protocol $proto (h2, memcached)" >&2
        exit 2
        ;;
    esac
done
echo "results: $OUT (model $MODEL, $WORKERS workers, $REPS repetitions of $SECS s phases, attacker priorities $PRIOS, PIN=$PIN, $PROFILE build)"
exit $RC
