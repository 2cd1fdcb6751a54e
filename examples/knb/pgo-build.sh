#!/bin/bash
# knb built with profile-guided optimisation, for both memif stacks alike
# (docs/benchmarks.md, "Profile-guided build"). luna is a LibOS: it is compiled into the
# application, so an application that wants the last 10% builds itself with a profile of
# its own traffic; this script does that for knb, whose one binary holds luna, smoltcp and
# the raw link, and trains it on luna AND smoltcp with the same workloads so that neither
# stack of the comparison gets a build the other lacks.
#
#   examples/knb/pgo-build.sh            # -> target/pgo/release/knb
#   target/pgo/release/knb compare ...   # as target/release/knb
#
# Steps: rustup's llvm-tools (llvm-profdata matching rustc's LLVM; Debian's is older and
# reads no profile of it) -> an instrumented knb (target/pgo-gen) -> training runs (root,
# hugepages: make setup) -> merged profile (target/pgo/knb.profdata) -> the optimised knb.
# Environment: PGO_SECS (seconds per training run, default 3), CARGO.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
CARGO=${CARGO:-cargo}
secs=${PGO_SECS:-3}
[[ $secs =~ ^[0-9]+$ && $secs -ge 1 ]] || { echo "PGO_SECS: whole seconds >= 1, not $secs" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "the training runs need root (memif, namespaces, hugepages)" >&2; exit 2; }

sysroot=$(rustc --print sysroot)
host=$(rustc -vV | sed -n 's/^host: //p')
profdata=$sysroot/lib/rustlib/$host/bin/llvm-profdata
if [ ! -x "$profdata" ]; then
    echo "pgo-build: installing rustup's llvm-tools (llvm-profdata for rustc's LLVM)" >&2
    rustup component add llvm-tools >&2 || {
        echo "pgo-build: cannot install llvm-tools (rustup component add llvm-tools)" >&2
        exit 1
    }
fi
[ -x "$profdata" ] || { echo "pgo-build: no $profdata after installing llvm-tools" >&2; exit 1; }

raw=$root/target/pgo/raw
rm -rf "$raw"
mkdir -p "$raw"
echo "pgo-build: instrumented build (target/pgo-gen)" >&2
# --target: the flags reach knb's own code only, not build scripts and proc-macros (which
# would otherwise run instrumented and write profiles of bindgen into the training set).
# Flags the user already has stay (both builds get them).
CARGO_TARGET_DIR=$root/target/pgo-gen RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$raw" \
    $CARGO build --release -p knb --target "$host"
gen=$root/target/pgo-gen/$host/release/knb

# The same workloads for both stacks: 4 KiB at iodepth 1 and 16, 16 connections, small
# messages. The raw link is not trained (it is DPDK's code, not ours).
for stack in luna smoltcp; do
    for args in "--iodepth 1" "--iodepth 16" "--connections 16" "--req-size 64 --resp-size 64"; do
        echo "pgo-build: training $stack $args" >&2
        # shellcheck disable=SC2086
        LLVM_PROFILE_FILE="$raw/knb-%p-%m.profraw" "$gen" rpc --stack "$stack" $args \
            --duration "$secs" --warmup 0.5 >/dev/null
    done
done
ls "$raw"/*.profraw >/dev/null 2>&1 || { echo "pgo-build: the training wrote no profile" >&2; exit 1; }
"$profdata" merge -o "$root/target/pgo/knb.profdata" "$raw"/*.profraw
# Both stacks' children must have written their counts (a child killed before exiting
# writes none): each stack's per-packet code must have run in the merged profile.
"$profdata" show --all-functions --counts "$root/target/pgo/knb.profdata" >"$raw/show.txt" 2>/dev/null
for fn in 'luna_stack.*ingress.*handle_frame' 'knb7backend7smoltcp4Lane4poll'; do
    # (grep -c reads to the end: no SIGPIPE for pipefail to report.)
    n=$(grep -A3 -E "$fn" "$raw/show.txt" | grep 'Block counts' | grep -c -E '[1-9]' || true)
    [ "${n:-0}" -gt 0 ] || {
        echo "pgo-build: no counts for $fn in the profile: a training run wrote none" >&2
        exit 1
    }
done
echo "pgo-build: optimised build (target/pgo)" >&2
CARGO_TARGET_DIR=$root/target/pgo RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$root/target/pgo/knb.profdata" \
    $CARGO build --release -p knb --target "$host"
mkdir -p "$root/target/pgo/release"
cp "$root/target/pgo/$host/release/knb" "$root/target/pgo/release/knb"
echo "pgo-build: $root/target/pgo/release/knb" >&2
