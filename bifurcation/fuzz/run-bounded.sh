#!/usr/bin/env bash
# Build the classifier fuzz target and run it for a bounded time; fail on a crash.
#
#   bifurcation/fuzz/run-bounded.sh <seconds>
#
# Needs the nightly toolchain and cargo-fuzz (luna-stack/fuzz/run-bounded.sh installs it).
# The committed seeds in seeds/classify/ (minimised by coverage, `-merge=1`) are read-only
# inputs; new corpus entries go to corpus-work/ (git-ignored), crashes to artifacts/.
set -euo pipefail
secs="${1:-}"
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 1 ]; then
    echo "usage: $0 <seconds>" >&2
    exit 2
fi
cd "$(dirname "$0")"
flags=(--sanitizer none --debug-assertions)
cargo +nightly fuzz build "${flags[@]}"
mkdir -p corpus-work/classify
seeds=()
[ -d seeds/classify ] && seeds=(seeds/classify)
if ! cargo +nightly fuzz run "${flags[@]}" classify corpus-work/classify "${seeds[@]}" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=512 \
    -print_final_stats=1 2>corpus-work/classify.log; then
    tail -n 40 corpus-work/classify.log >&2
    echo "run-bounded: FAILED: classify (artifacts in $(pwd)/artifacts/classify)" >&2
    exit 1
fi
grep -E "stat::number_of_executed_units|stat::peak_rss_mb" corpus-work/classify.log | tr '\n' ' '
echo
echo "run-bounded: classify ok"
