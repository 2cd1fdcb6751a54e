#!/usr/bin/env bash
# Build every fuzz target and run each for a bounded time; fail on the first crash.
#
#   luna-stack/fuzz/run-bounded.sh <seconds-per-target> [target...]
#
# Needs the nightly toolchain; installs cargo-fuzz if it is missing. The committed seeds in
# seeds/<target>/ are read-only inputs; new corpus entries go to corpus-work/<target>/
# (git-ignored), crashes to artifacts/<target>/.
#
# Targets: every `cargo fuzz list` entry (the 7 wire parsers plus stack_listen and
# stack_established, which inject frames into a whole Stack), or those named.
# Cost on the 2-core dev machine: cold build ~70-100 s (incremental ~3 s), then 9 targets ×
# <seconds-per-target>; `run-bounded.sh 30` took 220 s in all with the 7 wire targets.
# `make test-fuzz` runs this with 6 s per target.
#
# Other crates' fuzz directories (msgsched/fuzz) run their targets through this script
# with FUZZ_DIR set to their own directory: one runner, one contract.
set -euo pipefail

secs="${1:-}"
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 1 ]; then
    echo "usage: $0 <seconds-per-target> [target...]" >&2
    exit 2
fi
shift

cd "${FUZZ_DIR:-$(dirname "$0")}"

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "run-bounded: the nightly toolchain is required (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "run-bounded: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

# The fuzzed crates forbid unsafe code, so AddressSanitizer has nothing to find; debug assertions
# (integer overflow checks) are what catch arithmetic bugs here.
build_flags=(--sanitizer none --debug-assertions)

start=$(date +%s)
cargo +nightly fuzz build "${build_flags[@]}"
built=$(date +%s)
echo "run-bounded: build took $((built - start)) s"

for t in "${targets[@]}"; do
    mkdir -p "corpus-work/$t"
    seeds=()
    [ -d "seeds/$t" ] && seeds=("seeds/$t")
    echo "run-bounded: $t for ${secs} s"
    # -rss_limit_mb / -max_len keep a run inside the shared machine's means; a crash, a
    # timeout (-timeout, per input) or a leak makes libFuzzer exit non-zero.
    if ! cargo +nightly fuzz run "${build_flags[@]}" "$t" "corpus-work/$t" "${seeds[@]}" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
        -print_final_stats=1 2>"corpus-work/$t.log"; then
        tail -n 40 "corpus-work/$t.log" >&2
        echo "run-bounded: FAILED: $t (artifacts in $(pwd)/artifacts/$t)" >&2
        exit 1
    fi
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "corpus-work/$t.log" | tr '\n' ' '
    echo
done
end=$(date +%s)
echo "run-bounded: ${#targets[@]} targets ok; build $((built - start)) s, total $((end - start)) s"
