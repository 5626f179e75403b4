#!/usr/bin/env bash
# Builds, for glibc 2.17 and later, the eGPU files that run in environments
# eGPU does not choose: libegpu.so (loaded into every program of a slice's
# container, whatever its image's C library) and egpu-cdi-hook (run by the
# container runtime in the host's namespace), plus the simulated driver and
# the test workloads, so that tests/container.rs can run them in an old image.
# Built as they are by scripts/test.sh, they need glibc 2.34 (the C library of
# the build machine): Ubuntu 20.04, RHEL 8 and Amazon Linux 2 images and hosts
# could not load them. Design and limits: docs/containers.md.
#
# Needs cargo-zigbuild and zig (the ziglang package from PyPI); .ci/run
# installs both. Output: target/<arch>-unknown-linux-gnu/<debug|release>/.
# Every file built is checked to need no glibc symbol version newer than 2.17.
#
# Usage: scripts/build-compat.sh [--release] [more cargo flags...]
set -euo pipefail
cd "$(dirname "$0")/.."

GLIBC=2.17
ARCH=$(uname -m)
TARGET="$ARCH-unknown-linux-gnu"
PROFILE=debug
for a in "$@"; do
    case "$a" in
        --release) PROFILE=release ;;
        -r | --profile | --profile=*)
            echo "build-compat: give --release, not $a: the check below reads target/<triple>/debug or release" >&2
            exit 2 ;;
    esac
done

if ! cargo zigbuild --help >/dev/null 2>&1; then
    echo "build-compat: cargo-zigbuild is missing: cargo install --locked cargo-zigbuild@0.24.1 (and pip install ziglang==0.17.1 for zig)" >&2
    exit 2
fi
if ! command -v zig >/dev/null 2>&1 && ! python3 -m ziglang version >/dev/null 2>&1; then
    echo "build-compat: zig is missing: pip install ziglang==0.17.1" >&2
    exit 2
fi

echo "==> building libegpu.so, egpu-cdi-hook, the simulated driver and the test workloads for glibc $GLIBC"
cargo zigbuild --target "$TARGET.$GLIBC" -p egpu-hook -p egpu-cdi-hook -p egpu-simgpu -p egpu-workloads "$@"

OUT="target/$TARGET/$PROFILE"
# The newest glibc version each file needs (its DT_VERNEED), against $GLIBC.
bad=0
for f in libegpu.so egpu-cdi-hook libegpu_simgpu.so egpu-probe egpu-mkslice; do
    newest=$(LC_ALL=C objdump -p "$OUT/$f" | awk '/^Version References:/ { r = 1; next } r && /^[^ ]/ { r = 0 } r && $4 ~ /^GLIBC_/ { print substr($4, 7) }' | sort -V | tail -1)
    if [ -z "$newest" ]; then
        echo "build-compat: $OUT/$f needs no versioned glibc symbol: not what a glibc build gives" >&2
        bad=1
    elif [ "$(printf '%s\n%s\n' "$newest" "$GLIBC" | sort -V | tail -1)" != "$GLIBC" ]; then
        echo "build-compat: $OUT/$f needs GLIBC_$newest, newer than $GLIBC" >&2
        bad=1
    else
        echo "    $OUT/$f: newest glibc version needed $newest"
    fi
done
exit $bad
