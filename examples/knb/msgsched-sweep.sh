#!/usr/bin/env bash
# `make msgsched-sweep`: issue 9's real-stack measurement in one command. For every service
# mean and connection count it runs, back to back with the same workload, knb's SLO sweep
# of luna's message mode (CP, CS, MS on msgsched; virtual workers in the I/O core) and of
# the Linux-kernel baselines (TCP-CP, TCP-CS, worker pool over veth, real threads that
# sleep their service time), each with the simulator's ideal MS, then prints one table:
# throughput under the SLO of every model, as a fraction of the ideal, and MS-on-luna
# against each kernel baseline. Writes $SWEEP_OUT/summary.csv (and every sweep's
# fig-slo.{json,csv,svg} under $SWEEP_OUT/<stack>-<mean>-c<conns>/).
# Root (testbed namespaces, hugepages). Run it on a quiet machine: a point whose client fell
# behind its schedule is flagged CLIENT-BEHIND and never passes (docs/msgsched.md).
#
# Knobs (environment): SWEEP_OUT (/tmp/msgsched-sweep), SWEEP_MEANS (100us 20us),
# SWEEP_CONNS (20 5000), SWEEP_LOADS (0.1,...,0.9), SWEEP_WORKERS (20), SWEEP_SLO (10x),
# SWEEP_DURATION (2 s per point), SWEEP_WARMUP (0.5 s), SWEEP_KERNEL_MODE (sleep),
# SWEEP_HICCUPS (5: seconds of `knb hiccups` before each stack's sweep, 0 to skip; its
# one line says how calm the machine was, and goes to <sweep>.hiccups.json too).
# A quick end-to-end check of the script itself:
#   SWEEP_MEANS=100us SWEEP_CONNS=20 SWEEP_LOADS=0.1,0.5 SWEEP_DURATION=0.3 SWEEP_WARMUP=0.1 \
#     make msgsched-sweep
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${SWEEP_OUT:-/tmp/msgsched-sweep}
means=${SWEEP_MEANS:-100us 20us}
conns=${SWEEP_CONNS:-20 5000}
loads=${SWEEP_LOADS:-0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9}
workers=${SWEEP_WORKERS:-20}
slo=${SWEEP_SLO:-10x}
dur=${SWEEP_DURATION:-2}
warm=${SWEEP_WARMUP:-0.5}
kmode=${SWEEP_KERNEL_MODE:-sleep}
hiccups=${SWEEP_HICCUPS:-5}
cpus=$(seq -s, 0 $(($(nproc) - 1)))
mkdir -p "$out"
start=$(date +%s)
echo "msgsched-sweep: building knb (release)"
cargo build -q --release -p knb
knb="${CARGO_TARGET_DIR:-target}/release/knb"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
rc=0
for mean in $means; do
    for c in $conns; do
        for stack in luna kernel; do
            if [[ $stack == luna ]]; then
                models=cp,cs,ms mode=timer
            else
                models=cp,cs,pool mode=$kmode
            fi
            dir="$out/$stack-$mean-c$c"
            mkdir -p "$dir"
            echo "msgsched-sweep: $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg): $stack $mean $c connections"
            if [[ $hiccups != 0 ]]; then
                "$knb" hiccups --cpus "$cpus" --seconds "$hiccups" --json "$dir.hiccups.json" |
                    grep '^hiccups:' | sed 's/^/msgsched-sweep: /' || true
            fi
            "$knb" sweep --figure slo --slo-stack "$stack" --slo "$slo" --ideal --models "$models" \
                --workers "$workers" --service "bimodal:$mean" --service-mode "$mode" \
                --connections "$c" --loads "$loads" --duration "$dur" --warmup "$warm" \
                --out-dir "$dir" >"$dir.out" 2>"$dir.err" || {
                echo "msgsched-sweep: $stack $mean $c FAILED (exit $?), see $dir.err" >&2
                rc=1
            }
            grep -E '^(throughput under SLO|ideal MS)' "$dir.out" || true
        done
    done
done
echo "msgsched-sweep: $(($(date +%s) - start)) s in all (build included); commit $commit;" \
    "load average now $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$out" "$means" "$conns" <<'EOF'
import csv, json, os, sys
out, means, conns = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rows = []
def load(stack, mean, c):
    p = os.path.join(out, f"{stack}-{mean}-c{c}", "fig-slo.json")
    return json.load(open(p)) if os.path.exists(p) else None
print()
print("throughput under SLO (fraction of capacity; in brackets: of the simulator's ideal MS;")
print("* = a client-behind point stopped the scan, the server was not judged past it)")
hdr = ["mean", "conns", "slo_us", "ideal_ms", "luna_cp", "luna_cs", "luna_ms",
       "kernel_cp", "kernel_cs", "kernel_pool", "ms/kernel_cp", "ms/kernel_cs", "ms/kernel_pool"]
print(" ".join(f"{h:>13}" for h in hdr))
for mean in means:
    for c in conns:
        L, K = load("luna", mean, c), load("kernel", mean, c)
        if L is None and K is None:
            continue
        ref = L or K
        r = {"mean": mean, "conns": c, "slo_us": ref["slo_us"], "ideal_ms": ref["ideal_ms"]["load"]}
        cells = {}
        for stack, d, models in (("luna", L, ("cp", "cs", "ms")), ("kernel", K, ("cp", "cs", "pool"))):
            for m in models:
                v = d and d["models"].get(m)
                k = f"{stack}_{m}"
                if not v:
                    r[k] = None; cells[k] = "-"; continue
                r[k] = v["throughput_under_slo_load"]
                r[k + "_of_ideal"] = v["fraction_of_ideal_ms"]
                r[k + "_client_behind"] = v["client_behind_offered_loads"]
                star = "*" if v["first_failing_reason"] == "client behind its schedule" else ""
                cells[k] = f"{r[k]:.3f}({v['fraction_of_ideal_ms']:.2f}){star}"
        ms = r.get("luna_ms")
        for m in ("cp", "cs", "pool"):
            kv = r.get(f"kernel_{m}")
            k = f"ms/kernel_{m}"
            if ms is None or kv is None:
                r[k] = None; cells[k] = "-"
            elif kv == 0:
                r[k] = None; cells[k] = "inf" if ms > 0 else "-"
            else:
                r[k] = ms / kv; cells[k] = f"{ms / kv:.2f}"
        line = [mean, c, f"{r['slo_us']:.0f}", f"{r['ideal_ms']:.3f}"] + [cells[h] for h in hdr[4:]]
        print(" ".join(f"{x:>13}" for x in line))
        rows.append(r)
keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in hdr, hdr.index(k) if k in hdr else 0, k))
with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    for r in rows:
        w.writerow({k: (";".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()})
print(f"\nmsgsched-sweep: summary in {os.path.join(out, 'summary.csv')}")
EOF
exit $rc
