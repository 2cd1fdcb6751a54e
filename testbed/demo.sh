#!/usr/bin/env bash
# `make demo`: the raw-link ping-pong between two DPDK processes over memif (`knb raw`),
# the physical limit every TCP number is compared with. Arguments go to `knb raw`.
#
# knb raw takes its topology from the testbed library with the prefix in
# $LUNA_TESTBED_PREFIX (default luna); this script brings memif up first and always
# tears it down.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${LUNA_TESTBED_PREFIX:-luna}"
export LUNA_TESTBED_PREFIX="$prefix"

die() { printf 'make demo: %s\n' "$*" >&2; exit 1; }

[[ "$(id -u)" -eq 0 ]] || die "must run as root (DPDK, hugepages, namespaces). Fix: sudo make demo"

echo "make demo: building knb (release) and testbed"
cargo build -q --release -p knb || die "building knb failed (see above)"
cargo build -q -p testbed || die "building testbed failed (see above)"
knb=target/release/knb
testbed=target/debug/testbed

# Until `knb raw` exists, say so plainly instead of pretending.
if ! "$knb" raw --help >/dev/null 2>&1; then
    die "'knb raw' is not implemented yet (it is being built on branch 'dpdk'); nothing to demo until it lands. \`make test\` works today."
fi

"$testbed" up memif --prefix "$prefix"
trap '"$testbed" down memif --prefix "$prefix" || true' EXIT
echo "make demo: knb raw $* (memif, prefix $prefix)"
"$knb" raw "$@"
