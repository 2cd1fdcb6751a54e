#!/usr/bin/env bash
# Build msgsched's fuzz targets and run each for a bounded time; fail on the first crash.
#
#   msgsched/fuzz/run-bounded.sh <seconds-per-target> [target...]
#
# Targets: every `cargo fuzz list` entry (memcached_*, h2_*, hpack_*), or those named.
# The runner is luna-stack's (seeds in seeds/<target>/, new entries in corpus-work/<target>/,
# crashes in artifacts/<target>/); `make test-fuzz` runs this after luna-stack's, with the
# same seconds per target.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
FUZZ_DIR="$here" exec bash "$here/../../luna-stack/fuzz/run-bounded.sh" "$@"
