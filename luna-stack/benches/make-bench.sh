#!/usr/bin/env bash
# `make bench`: luna-stack's per-segment cost (luna-stack/benches/stack.rs: established RX
# and TX at 64 B / 1460 B / 4 KiB, luna and smoltcp side by side), compared with the last
# recorded run. A report, never a test: it does not fail on a number.
#
# 1. Instructions per segment, counted by callgrind (deterministic: the same binary on the
#    same input counts the same): each case runs COUNT_SEGMENTS segments in counting mode
#    (LUNA_BENCH_COUNT) with collection switched on only inside the `counted_region_*`
#    functions (no setup, no frame building). Compared with docs/bench/stack-instructions.json,
#    the committed record. BENCH_RECORD=1 writes this run into that record (commit it).
# 2. Bulk, one flow: instructions per byte, luna and smoltcp at MTU 1500 and 9000
#    (luna-stack/benches/bulk-instructions.sh, record docs/bench/bulk-instructions.json).
#    BENCH_BULK=0 skips it.
# 3. Wall clock (indicative, noisy on a shared machine): criterion with
#    `--save-baseline make-bench`, which prints the change against the previous `make bench`
#    on this machine (target/criterion). BENCH_WALL=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/../.."
record="docs/bench/stack-instructions.json"
target="${CARGO_TARGET_DIR:-target}"
out="$target/bench"
mkdir -p "$out"

die() { printf 'make bench: %s\n' "$*" >&2; exit 1; }
command -v valgrind >/dev/null || die "valgrind is not installed (apt-get install valgrind; testbed/setup.sh installs it)"

echo "make bench: building luna-stack's stack benchmark (release)"
exe=$(cargo bench -q -p luna-stack --bench stack --no-run --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "stack" \
            and m.get("executable"):
        print(m["executable"])
') || die "building the benchmark failed"
[[ -x "$exe" ]] || die "no benchmark executable found (cargo bench --no-run said: $exe)"

echo "make bench: counting instructions per segment with callgrind (12 cases)"
results="$out/stack-instructions.tsv"
: > "$results"
for dir in rx tx; do
    for stack in luna smoltcp; do
        for size in 64 1460 4096; do
            case="$dir/$stack/$size"
            cg="$out/callgrind.$dir.$stack.$size"
            LUNA_BENCH_COUNT="$case" valgrind --tool=callgrind --collect-atstart=no \
                --toggle-collect='*counted_region_*' --callgrind-out-file="$cg" \
                "$exe" > "$out/count.log" 2> "$out/valgrind.log" ||
                die "callgrind run of $case failed: $(tail -5 "$out/valgrind.log")"
            segs=$(sed -n 's/^counted \([0-9]*\) segments.*/\1/p' "$out/count.log")
            ir=$(sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$cg" | head -1)
            [[ -n "$segs" && -n "$ir" && "$ir" -gt 0 ]] ||
                die "no instruction count for $case (see $cg, $out/valgrind.log)"
            printf '%s\t%s\t%s\n' "$case" "$segs" "$ir" >> "$results"
        done
    done
done

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain -- luna-stack zbuf 2>/dev/null | head -1)
python3 - "$results" "$record" "$commit${dirty:+ (+uncommitted changes)}" \
    "$(valgrind --version)" "${BENCH_RECORD:-0}" <<'EOF'
import datetime, json, os, sys

results, record, commit, valgrind, save = sys.argv[1:6]
now = {}
for line in open(results):
    case, segs, ir = line.split()
    now[case] = round(int(ir) / int(segs), 1)
old = None
if os.path.exists(record):
    try:
        old = json.load(open(record))
    except ValueError as e:
        print(f"make bench: {record} is not valid JSON ({e}); comparing with nothing")
base = (old or {}).get("instructions_per_segment", {})
if old:
    print(f"make bench: instructions per segment, this tree ({commit}) vs the record "
          f"(commit {old.get('commit', '?')}, {old.get('date', '?')})")
else:
    print(f"make bench: instructions per segment, this tree ({commit}); no record yet")
print(f"  {'case':<18} {'record':>10} {'now':>10} {'change':>8}")
for case, v in now.items():
    b = base.get(case)
    ch = f"{(v / b - 1) * 100:+.1f}%" if b else "new"
    print(f"  {case:<18} {b if b is not None else '-':>10} {v:>10} {ch:>8}")
for case in sorted(set(base) - set(now)):
    print(f"  {case:<18} {base[case]:>10} {'-':>10} {'gone':>8}")
for d in ("rx", "tx"):
    for size in ("64", "1460", "4096"):
        l, s = now.get(f"{d}/luna/{size}"), now.get(f"{d}/smoltcp/{size}")
        if l and s:
            print(f"  luna/smoltcp {d} {size:>4} B: {l / s:.2f}x the instructions")
doc = {
    "what": "instructions per segment (callgrind Ir inside the counted_region_* functions of "
            "luna-stack/benches/stack.rs, LUNA_BENCH_COUNT mode); written by make bench "
            "with BENCH_RECORD=1",
    "commit": commit,
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "valgrind": valgrind,
    "instructions_per_segment": now,
}
text = json.dumps(doc, indent=2) + "\n"
latest = os.path.join(os.path.dirname(results), "stack-instructions.json")
open(latest, "w").write(text)
if save == "1":
    os.makedirs(os.path.dirname(record), exist_ok=True)
    open(record, "w").write(text)
    print(f"make bench: recorded in {record} (commit it)")
else:
    print(f"make bench: this run is in {latest}; BENCH_RECORD=1 make bench records it in {record}")
EOF

if [[ "${BENCH_BULK:-1}" != "0" ]]; then
    echo
    bash luna-stack/benches/bulk-instructions.sh
fi

if [[ "${BENCH_WALL:-1}" != "0" ]]; then
    echo
    echo "make bench: wall clock (criterion; indicative only — the change is against the last"
    echo "  make bench on this machine, and a loaded machine moves it by more than most changes)"
    cargo bench -q -p luna-stack --bench stack -- --warm-up-time 1 --measurement-time 3 \
        --save-baseline make-bench
fi
