#!/usr/bin/env bash
# luna testbed setup: the one idempotent entry point used by `make setup`, `make demo`,
# `make test` and .ci/run. On a Debian bookworm machine, as root, it
#   1. installs the Debian packages the project needs (only the missing ones),
#   2. reserves 2 MiB hugepages (never lowers a larger reservation),
#   3. mounts hugetlbfs at /dev/hugepages if nothing is mounted there.
# It loads no kernel modules. A second run with everything in place is a fast no-op.
#
# Environment:
#   LUNA_HUGEPAGES   minimum number of 2 MiB hugepages to reserve (default 1024)
#   LUNA_SETUP_SKIP_APT=1  skip the package step (for machines managed otherwise)
set -euo pipefail

MIN_HUGEPAGES="${LUNA_HUGEPAGES:-1024}"
HUGEPAGE_SYSFS=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
HUGE_MNT=/dev/hugepages

# One package per line; `why` is for the reader.
PACKAGES=(
    libdpdk-dev      # DPDK 22.11 headers/libs: ffi/dpdk bindgen + linking
    dpdk             # DPDK runtime and PMD plugins (net_memif, net_tap, net_af_packet)
    dpdk-dev         # dpdk-testpmd: the testbed checks its EAL arguments against it
    clang            # bindgen
    libclang-dev     # bindgen
    pkg-config       # finding libdpdk
    gcc              # C shim for DPDK static-inline functions
    make
    iproute2         # ip, tc: namespaces, veth, addresses, qdiscs
    iptables         # NFQUEUE hook for the user-space impairment engine (no sch_netem)
    procps           # sysctl inside namespaces
    util-linux       # taskset, mountpoint
    iputils-ping     # reachability checks in tests
    ethtool
    tcpdump
    tshark
    iperf3           # kernel baseline throughput
    sockperf         # kernel baseline latency
    python3-scapy    # crafting packets in attack/edge-case suites
    netcat-openbsd
    curl             # ffi/dpdk/compat-check.sh fetches another DPDK release's headers
    nghttp2-client   # nghttp, h2load: real HTTP/2 clients against luna-h2 (r2c/tests/h2_clients.rs)
    nghttp2-server   # nghttpd: the kernel-TCP HTTP/2 server of ATTACK_PROTO_SERVER=kernel make attack-proto
    memcached        # the kernel-TCP memcached of ATTACK_PROTO_SERVER=kernel make attack-proto (its own service is not used)
    python3-h2       # adversarial HTTP/2 clients (h2, hyperframe, hpack) for the HTTP/2 attack tests
    python3-grpcio   # Python gRPC unary client against luna-grpc
    libmemcached-tools  # memccapable, memcslap: real memcached clients against luna-kv (r2c/tests/memcached_clients.rs)
    python3-pymemcache  # pymemcache client (Debian's python3) against luna-kv
    valgrind         # make bench: callgrind instruction counts (luna-stack/benches/make-bench.sh)
    redis-server     # unmodified redis-server under LD_PRELOAD=libluna-preload.so (ffi/preload/tests/redis.rs)
    redis-tools      # redis-benchmark, redis-cli: its stock clients
    nginx-light      # unmodified nginx (sendfile on) under the LD_PRELOAD shim (ffi/preload/tests/http_servers.rs; its own service is not used)
)

log() { printf 'testbed/setup: %s\n' "$*" >&2; }
die() { printf 'testbed/setup: error: %s\n' "$*" >&2; exit 1; }

if [[ "$(id -u)" -ne 0 ]]; then
    die "must run as root (namespaces, hugepages and apt need it). Fix: sudo make setup"
fi
if [[ ! "$MIN_HUGEPAGES" =~ ^[0-9]+$ ]]; then
    die "LUNA_HUGEPAGES='$MIN_HUGEPAGES' is not a number. Fix: LUNA_HUGEPAGES=1024"
fi

# --- 1. packages -------------------------------------------------------------------------
install_packages() {
    local missing=() pkg status
    for pkg in "${PACKAGES[@]}"; do
        status="$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)"
        [[ "$status" == ii* ]] || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "packages: all ${#PACKAGES[@]} present"
        return 0
    fi
    command -v apt-get >/dev/null || die "apt-get not found: this script expects Debian bookworm. Fix: install ${missing[*]} by hand"
    log "packages: installing ${missing[*]}"
    # tshark asks whether non-root users may capture; answer once, non-interactively.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    export DEBIAN_FRONTEND=noninteractive
    local apt_opts=(-y -q --no-install-recommends -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    if ! apt-get update -q >/tmp/luna-setup-apt.log 2>&1; then
        tail -20 /tmp/luna-setup-apt.log >&2
        die "apt-get update failed (log: /tmp/luna-setup-apt.log). Fix: check the Debian mirror in /etc/apt/sources.list, then rerun"
    fi
    if ! apt-get install "${apt_opts[@]}" "${missing[@]}" >>/tmp/luna-setup-apt.log 2>&1; then
        tail -20 /tmp/luna-setup-apt.log >&2
        die "apt-get install ${missing[*]} failed (log: /tmp/luna-setup-apt.log). Fix: run 'apt-get install ${missing[*]}' by hand and read its error"
    fi
    log "packages: installed ${#missing[@]}"
}

if [[ "${LUNA_SETUP_SKIP_APT:-0}" == 1 ]]; then
    log "packages: skipped (LUNA_SETUP_SKIP_APT=1)"
else
    install_packages
fi

# --- 2. hugepages --------------------------------------------------------------------------
[[ -w "$HUGEPAGE_SYSFS" ]] || die "$HUGEPAGE_SYSFS is missing or read-only: the kernel has no 2 MiB hugepage support. Fix: boot a kernel with CONFIG_HUGETLBFS"
current="$(cat "$HUGEPAGE_SYSFS")"
if (( current >= MIN_HUGEPAGES )); then
    log "hugepages: $current x 2 MiB reserved (>= $MIN_HUGEPAGES)"
else
    log "hugepages: raising $current -> $MIN_HUGEPAGES x 2 MiB"
    echo "$MIN_HUGEPAGES" >"$HUGEPAGE_SYSFS"
    got="$(cat "$HUGEPAGE_SYSFS")"
    if (( got < MIN_HUGEPAGES )); then
        die "only $got of $MIN_HUGEPAGES hugepages could be reserved (memory fragmented or too small). Fix: free memory, 'echo 3 > /proc/sys/vm/drop_caches', rerun; or boot with hugepages=$MIN_HUGEPAGES"
    fi
fi

# --- 3. hugetlbfs mount ----------------------------------------------------------------------
if awk -v m="$HUGE_MNT" '$2 == m && $3 == "hugetlbfs" { found = 1 } END { exit !found }' /proc/mounts; then
    log "hugetlbfs: mounted at $HUGE_MNT"
else
    mkdir -p "$HUGE_MNT"
    mount -t hugetlbfs -o pagesize=2M nodev "$HUGE_MNT" \
        || die "mounting hugetlbfs at $HUGE_MNT failed. Fix: check 'dmesg', or mount it by hand: mount -t hugetlbfs nodev $HUGE_MNT"
    log "hugetlbfs: mounted at $HUGE_MNT"
fi

# --- 4. sanity: the tools the testbed calls ----------------------------------------------------
for tool in ip tc sysctl taskset; do
    command -v "$tool" >/dev/null || die "'$tool' not found in PATH after setup. Fix: apt-get install iproute2 procps util-linux"
done
log "ready"
