#!/usr/bin/env bash
# Makes the container image tests/container.rs runs in a slice to show that
# the glibc 2.17 build (scripts/build-compat.sh) works where the usual build
# cannot: a minimal Debian 11 (bullseye, glibc 2.31) root file system, made
# with debootstrap. Needs root and debootstrap (.ci/run installs it); about
# 30 s and 215 MB. Does nothing when the directory already holds one.
#
# Usage: scripts/old-glibc-rootfs.sh [DIR]   (default: target/old-glibc-rootfs)
# EGPU_DEBIAN_MIRROR overrides the mirror (default http://deb.debian.org/debian,
# then http://archive.debian.org/debian, where Debian moves old releases).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${1:-target/old-glibc-rootfs}
SUITE=bullseye
MIRRORS=${EGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian http://archive.debian.org/debian}
LIBC="$DIR/usr/lib/$(uname -m)-linux-gnu/libc.so.6"

if [ -e "$LIBC" ] && [ -e "$DIR/.egpu-complete" ]; then
    echo "old-glibc-rootfs: $DIR is there"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "old-glibc-rootfs: debootstrap needs root" >&2
    exit 2
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    echo "old-glibc-rootfs: debootstrap is missing: apt-get install debootstrap" >&2
    exit 2
fi
rm -rf "$DIR" "$DIR.tmp"
mkdir -p "$(dirname "$DIR")"
ok=
for MIRROR in $MIRRORS; do
    echo "==> debootstrap --variant=minbase --merged-usr $SUITE $DIR ($MIRROR)"
    if debootstrap --variant=minbase --merged-usr "$SUITE" "$DIR.tmp" "$MIRROR" > "$DIR.log" 2>&1; then
        ok=1
        break
    fi
    tail -5 "$DIR.log" >&2
    rm -rf "$DIR.tmp"
done
if [ -z "$ok" ]; then
    echo "old-glibc-rootfs: debootstrap of $SUITE failed from every mirror ($MIRRORS; last log: $DIR.log). Set EGPU_DEBIAN_MIRROR to a mirror that carries $SUITE" >&2
    exit 1
fi
touch "$DIR.tmp/.egpu-complete"
mv "$DIR.tmp" "$DIR"
echo "old-glibc-rootfs: $DIR ($(basename "$(readlink -f "$LIBC")"))"
