#!/usr/bin/env bash
# The attack suite's hostile segments: instructions per segment of luna-stack
# (luna-stack/examples/syn_flood.rs; docs/reliability.md, "Where the flood's cost goes").
# Counted by callgrind in the example's measured function only (stack_work: receive,
# application reads, every frame the stack sends), so deterministic: per segment =
# (Ir(2N) - Ir(N)) / N. Also the share of SipHash (isn::tuple_hash, inclusive) and of the
# neighbour learning (Stack::nb_update, inclusive) per segment. A report: it fails only if
# the workload does not build or run.
set -euo pipefail
cd "$(dirname "$0")/../.."
target="${CARGO_TARGET_DIR:-target}"
out="$target/bench"
mkdir -p "$out"
N=${SYN_FLOOD_N:-2000}
KINDS=${SYN_FLOOD_KINDS:-syn syn_nocookie stray_ack oow_rst data}

die() { printf 'syn flood instructions: %s\n' "$*" >&2; exit 1; }
command -v valgrind >/dev/null || die "valgrind is not installed (testbed/setup.sh installs it)"
command -v callgrind_annotate >/dev/null || die "callgrind_annotate is not installed (valgrind)"

echo "syn flood instructions: building luna-stack's syn_flood example (release)"
cargo build -q --release -p luna-stack --example syn_flood || die "building syn_flood failed"
exe="$target/release/examples/syn_flood"
[[ -x "$exe" ]] || die "no $exe"

# inclusive Ir of the first function whose name matches $2 in callgrind file $1 (0 if none)
incl() {
    callgrind_annotate --inclusive=yes "$1" 2>/dev/null |
        sed -n "s/^ *\([0-9,]*\) ([^)]*) *[^ ]*:$2 \[.*/\1/p" | head -1 | tr -d , | sed 's/^$/0/'
}

printf '%-14s %10s %10s %10s %12s  %s\n' kind "Ir/seg" "siphash" "nb_update" "frames out" "counters (2N run)"
for kind in $KINDS; do
    declare -A ir=() sip=() nb=()
    for n in "$N" "$((2 * N))"; do
        cg="$out/callgrind.synflood.$kind.$n"
        valgrind --tool=callgrind --toggle-collect='syn_flood::stack_work' \
            --callgrind-out-file="$cg" "$exe" "$kind" "$n" > "$out/synflood.$kind.$n.log" \
            2> "$out/valgrind.log" ||
            die "callgrind run of $kind $n failed: $(tail -5 "$out/valgrind.log")"
        ir[$n]=$(sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$cg" | head -1)
        sip[$n]=$(incl "$cg" 'luna_stack::tcp::isn::tuple_hash')
        nb[$n]=$(incl "$cg" 'luna_stack::stack::Stack<R>::nb_update')
        [[ -n "${ir[$n]}" ]] || die "no count for $kind $n (see $cg)"
    done
    m=$((2 * N))
    sent=$(sed -n 's/.* sent=\([0-9]*\).*/\1/p' "$out/synflood.$kind.$m.log")
    awk -v k="$kind" -v a="${ir[$N]}" -v b="${ir[$m]}" -v sa="${sip[$N]}" -v sb="${sip[$m]}" \
        -v na="${nb[$N]}" -v nb="${nb[$m]}" -v n="$N" -v s="$sent" -v c="$(cut -d' ' -f4- "$out/synflood.$kind.$m.log" | head -1)" \
        'BEGIN { printf "%-14s %10.0f %10.0f %10.0f %12s  %s\n", k, (b-a)/n, (sb-sa)/n, (nb-na)/n, s, c }'
    unset ir sip nb
done
echo "syn flood instructions: Ir/seg = (Ir(2N) - Ir(N)) / N, N = $N, stack_work only; siphash and nb_update inclusive, per segment"
