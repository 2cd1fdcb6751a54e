#!/usr/bin/env bash
# The attack suite's hostile segments: instructions per segment of luna-stack
# (luna-stack/examples/syn_flood.rs; docs/reliability.md, "Where the flood's cost goes").
# Counted by callgrind in the example's measured function only (stack_work: receive,
# application reads, every frame the stack sends), so deterministic: per segment =
# (Ir(2N) - Ir(N)) / N. Then the heaviest luna-stack functions (inclusive, as callgrind
# attributes them after inlining) of the 2N `syn` run. A report: it fails only if the
# workload does not build or run.
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

printf '%-14s %10s %12s  %s\n' kind "Ir/seg" "frames out" "counters (2N run)"
for kind in $KINDS; do
    declare -A ir=()
    for n in "$N" "$((2 * N))"; do
        cg="$out/callgrind.synflood.$kind.$n"
        valgrind --tool=callgrind --toggle-collect='syn_flood::stack_work' \
            --callgrind-out-file="$cg" "$exe" "$kind" "$n" > "$out/synflood.$kind.$n.log" \
            2> "$out/valgrind.log" ||
            die "callgrind run of $kind $n failed: $(tail -5 "$out/valgrind.log")"
        ir[$n]=$(sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$cg" | head -1)
        [[ -n "${ir[$n]}" ]] || die "no count for $kind $n (see $cg)"
    done
    m=$((2 * N))
    sent=$(sed -n 's/.* sent=\([0-9]*\).*/\1/p' "$out/synflood.$kind.$m.log")
    awk -v k="$kind" -v a="${ir[$N]}" -v b="${ir[$m]}" -v n="$N" -v s="$sent" \
        -v c="$(cut -d' ' -f4- "$out/synflood.$kind.$m.log" | head -1)" \
        'BEGIN { printf "%-14s %10.0f %12s  %s\n", k, (b-a)/n, s, c }'
    unset ir
done
echo "syn flood instructions: Ir/seg = (Ir(2N) - Ir(N)) / N, N = $N, stack_work only"
cg="$out/callgrind.synflood.syn.$((2 * N))"
if [[ -f "$cg" ]]; then
    echo "syn flood instructions: heaviest luna-stack functions of the $((2 * N))-SYN run (inclusive Ir / SYN, setup included):"
    callgrind_annotate --inclusive=yes "$cg" 2>/dev/null |
        sed -n 's/^ *\([0-9,]*\) ([^)]*) *[^ ]*:\(luna_stack::[^ ]*\).*/\1 \2/p' |
        awk -v n="$((2 * N))" '!seen[$2]++ { gsub(",", "", $1); printf "  %7.0f  %s\n", $1 / n, $2 }' |
        head -14
fi
