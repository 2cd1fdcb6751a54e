#!/usr/bin/env bash
# Build check of dpdk-sys against a DPDK other than the installed one, without source
# changes: bindgen and the C shim run over the other version's headers (`cargo check`,
# nothing is linked). Default: Debian trixie's libdpdk-dev 24.11 from deb.debian.org
# (23.11 is not packaged for Debian; 24.11 is the next LTS and differs more).
#
#   ffi/dpdk/compat-check.sh [URL-of-a-libdpdk-dev.deb]
set -euo pipefail
cd "$(dirname "$0")/../.."
url="${1:-http://deb.debian.org/debian/pool/main/d/dpdk/libdpdk-dev_24.11.8-0+deb13u1_amd64.deb}"
work="${DPDK_COMPAT_DIR:-/tmp/luna-dpdk-compat}"
mkdir -p "$work"
deb="$work/$(basename "$url")"
if [[ ! -s "$deb" ]]; then
    echo "compat-check: downloading $url"
    curl -fsS --retry 3 -o "$deb.part" "$url" || {
        echo "compat-check: download failed; fix: check access to deb.debian.org" >&2; exit 1; }
    mv "$deb.part" "$deb"
fi
root="$work/root"
rm -rf "$root" "$work/pc"
dpkg-deb -x "$deb" "$root"
mkdir -p "$work/pc"
# Point the .pc files at the extracted tree; dependencies (libbsd, ...) resolve from the system.
for pc in "$root"/usr/lib/x86_64-linux-gnu/pkgconfig/libdpdk*.pc; do
    sed "s|^prefix=/usr|prefix=$root/usr|" "$pc" > "$work/pc/$(basename "$pc")"
done
version=$(PKG_CONFIG_PATH="$work/pc" pkg-config --modversion libdpdk)
echo "compat-check: cargo check -p dpdk-sys against DPDK $version"
PKG_CONFIG_PATH="$work/pc" CARGO_TARGET_DIR="$work/target" cargo check -q -p dpdk-sys
grep -q "$root" "$work"/target/debug/build/dpdk-sys-*/output || {
    echo "compat-check: the build did not use DPDK $version headers" >&2; exit 1; }
echo "compat-check: dpdk-sys builds against DPDK $version unchanged"
