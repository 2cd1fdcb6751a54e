#!/usr/bin/env bash
# Build msgsched's fuzz targets and run each for a bounded time; fail on the first crash.
#
#   msgsched/fuzz/run-bounded.sh <seconds-per-target> [target...]
#
# Needs the nightly toolchain and cargo-fuzz. The committed seeds in seeds/<target>/ are
# read-only inputs; new corpus entries go to corpus-work/<target>/ (git-ignored), crashes
# to artifacts/<target>/. msgsched forbids unsafe code: debug assertions, not ASan.
set -euo pipefail

secs="${1:-}"
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 1 ]; then
    echo "usage: $0 <seconds-per-target> [target...]" >&2
    exit 2
fi
shift
cd "$(dirname "$0")"
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
build_flags=(--sanitizer none --debug-assertions)
cargo +nightly fuzz build "${build_flags[@]}"
for t in "${targets[@]}"; do
    mkdir -p "corpus-work/$t"
    echo "run-bounded: $t for ${secs}s"
    cargo +nightly fuzz run "${build_flags[@]}" "$t" "corpus-work/$t" "seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -12
done
