#!/usr/bin/env bash
# Bulk, one flow: instructions per byte of luna-stack and smoltcp 0.14 (luna-stack/examples/
# bulk_pair.rs: one connection streaming 4 KiB writes between two stacks in one process over
# an in-memory wire that copies each frame once), at MTU 1500 and 9000, checksums off (a
# virtual link, as knb runs both on memif) and in software. Counted by callgrind, so
# deterministic: per byte = (Ir(2N) - Ir(N)) / N, which cancels setup, handshake and the end
# of the stream; "stack only" also subtracts the wire's copy (the inclusive count of
# bulk_pair's wire_luna / wire_smoltcp). Compared with docs/bench/bulk-instructions.json,
# the committed record; BENCH_RECORD=1 writes this run into it. A report: it fails only if
# the workload does not build or run. Part of `make bench` (docs/benchmarks-stack.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
record="docs/bench/bulk-instructions.json"
target="${CARGO_TARGET_DIR:-target}"
out="$target/bench"
mkdir -p "$out"
N=${BULK_BYTES:-16777216}

die() { printf 'bulk instructions: %s\n' "$*" >&2; exit 1; }
command -v valgrind >/dev/null || die "valgrind is not installed (testbed/setup.sh installs it)"
command -v callgrind_annotate >/dev/null || die "callgrind_annotate is not installed (valgrind)"

echo "bulk instructions: building luna-stack's bulk_pair example (release)"
cargo build -q --release -p luna-stack --example bulk_pair || die "building bulk_pair failed"
exe="$target/release/examples/bulk_pair"
[[ -x "$exe" ]] || die "no $exe"

results="$out/bulk-instructions.tsv"
: > "$results"
echo "bulk instructions: 16 callgrind runs (2 stacks x 2 MTUs x 2 checksum modes x N, 2N = $N, $((2 * N)) bytes)"
for off in 1 0; do
    for mtu in 1500 9000; do
        for stack in luna smoltcp; do
            for bytes in "$N" "$((2 * N))"; do
                cg="$out/callgrind.bulk.$stack.$mtu.$off.$bytes"
                valgrind --tool=callgrind --callgrind-out-file="$cg" \
                    "$exe" "$stack" "$bytes" "$mtu" "$off" > "$out/bulk.log" 2> "$out/valgrind.log" ||
                    die "callgrind run of $stack $bytes mtu $mtu offload $off failed: $(tail -5 "$out/valgrind.log")"
                ir=$(sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$cg" | head -1)
                wire=$(callgrind_annotate --inclusive=yes "$cg" 2>/dev/null |
                    sed -n 's/^ *\([0-9,]*\) ([^)]*) *[^ ]*bulk_pair::wire_.*/\1/p' | head -1 | tr -d ,)
                frames=$(sed -n 's/.*frames_to_receiver=\([0-9]*\) frames_to_sender=\([0-9]*\).*/\1 \2/p' "$out/bulk.log")
                [[ -n "$ir" && -n "$wire" && -n "$frames" ]] ||
                    die "no count for $stack $bytes mtu $mtu offload $off (see $cg, $out/bulk.log)"
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$stack" "$mtu" "$off" "$bytes" "$ir" "$wire" "$frames" >> "$results"
            done
        done
    done
done

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain -- luna-stack zbuf 2>/dev/null | head -1)
python3 - "$results" "$record" "$commit${dirty:+ (+uncommitted changes)}" \
    "$(valgrind --version)" "${BENCH_RECORD:-0}" "$N" <<'PY'
import datetime, json, os, sys

results, record, commit, valgrind, save, n = sys.argv[1:7]
n = int(n)
runs = {}
for line in open(results):
    stack, mtu, off, nbytes, ir, wire, f_rx, f_tx = line.split()
    runs[(stack, mtu, off, int(nbytes))] = (int(ir), int(wire), int(f_rx), int(f_tx))
now = {}
for (stack, mtu, off, nbytes) in runs:
    if nbytes != n:
        continue
    a, b = runs[(stack, mtu, off, n)], runs[(stack, mtu, off, 2 * n)]
    total = (b[0] - a[0]) / n
    wire = (b[1] - a[1]) / n
    frames = (b[2] - a[2]) + (b[3] - a[3])
    case = f"{stack}/mtu{mtu}/{'offload' if off == '1' else 'swcsum'}"
    now[case] = {
        "per_byte": round(total, 4),
        "per_byte_stack_only": round(total - wire, 4),
        "data_frames_per_mib": round((b[2] - a[2]) * (1 << 20) / n, 1),
        "acks_per_mib": round((b[3] - a[3]) * (1 << 20) / n, 1),
        "per_frame_stack_only": round((total - wire) * n / frames, 1) if frames else None,
    }
old = None
if os.path.exists(record):
    try:
        old = json.load(open(record))
    except ValueError as e:
        print(f"bulk instructions: {record} is not valid JSON ({e}); comparing with nothing")
base = (old or {}).get("cases", {})
print(f"bulk instructions: instructions per byte streamed, this tree ({commit})"
      + (f" vs the record (commit {old.get('commit', '?')}, {old.get('date', '?')})" if old else "; no record yet"))
print(f"  {'case':<26} {'per byte':>9} {'record':>9} {'stack only':>11} {'data frames/MiB':>16} {'ACKs/MiB':>9}")
for case, v in sorted(now.items()):
    b = base.get(case, {}).get("per_byte")
    print(f"  {case:<26} {v['per_byte']:>9.3f} {b if b is not None else '-':>9} "
          f"{v['per_byte_stack_only']:>11.3f} {v['data_frames_per_mib']:>16} {v['acks_per_mib']:>9}")
for mtu in ("1500", "9000"):
    for cs in ("offload", "swcsum"):
        l, s = now.get(f"luna/mtu{mtu}/{cs}"), now.get(f"smoltcp/mtu{mtu}/{cs}")
        if l and s:
            print(f"  luna/smoltcp MTU {mtu} {cs:<7}: {l['per_byte'] / s['per_byte']:.2f}x the "
                  f"instructions per byte ({l['per_byte_stack_only'] / s['per_byte_stack_only']:.2f}x "
                  f"without the wire's copy; goal <= 0.7x)")
doc = {
    "what": "instructions per byte of one bulk flow, 4 KiB writes (callgrind Ir of "
            "luna-stack/examples/bulk_pair, (Ir(2N) - Ir(N)) / N); stack_only subtracts the "
            "wire's frame copy; written by luna-stack/benches/bulk-instructions.sh with "
            "BENCH_RECORD=1",
    "commit": commit,
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "valgrind": valgrind,
    "bytes": [n, 2 * n],
    "cases": now,
}
text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
latest = os.path.join(os.path.dirname(results), "bulk-instructions.json")
open(latest, "w").write(text)
if save == "1":
    os.makedirs(os.path.dirname(record), exist_ok=True)
    open(record, "w").write(text)
    print(f"bulk instructions: recorded in {record} (commit it)")
else:
    print(f"bulk instructions: this run is in {latest}; BENCH_RECORD=1 records it in {record}")
PY
