#!/usr/bin/env bash
# `make figures`: regenerate LUNA's figures 9-12 (docs/fig9-msgsize, fig10-iodepth(-p99),
# fig11-cdf, fig12-cores: CSV + SVG) with knb sweep: the kernel, smoltcp and luna, the memif
# stacks in both memif modes (copy and zero-copy) as separate series, the raw memif ceiling,
# and LUNA's three claims read off the points (docs/figs-claims.csv). Prints how long it took.
# Root (testbed namespaces, hugepages). Run it on a quiet machine: every point is judged for
# contention and a busy machine's points are hollow in the SVGs (docs/benchmarks.md,
# "Benchmarks people can trust").
#
# Knobs (environment): FIG_OUT (docs), FIG_DURATION (2 s per point), FIG_WARMUP (0.5 s),
# FIG_STACKS (kernel,smoltcp,luna), FIG_MEMIF_MODES (copy,zero-copy), FIG_SIZES, FIG_IODEPTHS,
# FIG_CORES (knb sweep's defaults), FIG_JSON (/tmp/luna-figures/sweep.json), FIG_ARGS (more
# knb sweep arguments). A quick end-to-end check of the script itself:
#   FIG_OUT=/tmp/figs FIG_DURATION=0.2 FIG_WARMUP=0.1 make figures
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${FIG_OUT:-docs}
json=${FIG_JSON:-/tmp/luna-figures/sweep.json}
mkdir -p "$out" "$(dirname "$json")"
start=$(date +%s)
echo "make figures: building knb (release)"
cargo build -q --release -p knb
knb="${CARGO_TARGET_DIR:-target}/release/knb"
args=(sweep --stacks "${FIG_STACKS:-kernel,smoltcp,luna}"
    --memif-modes "${FIG_MEMIF_MODES:-copy,zero-copy}"
    --duration "${FIG_DURATION:-2}" --warmup "${FIG_WARMUP:-0.5}"
    --out-dir "$out" --json "$json")
[[ -n "${FIG_SIZES:-}" ]] && args+=(--sizes "$FIG_SIZES")
[[ -n "${FIG_IODEPTHS:-}" ]] && args+=(--iodepths "$FIG_IODEPTHS")
[[ -n "${FIG_CORES:-}" ]] && args+=(--cores "$FIG_CORES")
# shellcheck disable=SC2206 # FIG_ARGS is a list of words on purpose
[[ -n "${FIG_ARGS:-}" ]] && args+=($FIG_ARGS)
echo "make figures: $knb ${args[*]}"
rc=0
"$knb" "${args[@]}" || rc=$?
load=$(cut -d' ' -f1-3 /proc/loadavg)
echo "make figures: $(($(date +%s) - start)) s in all (build included); load average now $load;" \
    "CSV + SVG in $out/, every run in $json"
if [[ -f "$json" ]] && command -v jq >/dev/null; then
    echo "make figures: contended points: $(jq .contended_points "$json") (0 on a quiet machine; see jq -r '.notes[]' $json)"
fi
exit "$rc"
