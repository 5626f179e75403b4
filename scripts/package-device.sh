#!/usr/bin/env bash
# Builds what scripts/device-check.sh needs on a GPU machine that has no Rust
# toolchain into dist/ (or DIST_DIR): egpud, egpu, libegpu.so, egpu-probe,
# egpu-burn (the compute checks), libegpu_simgpu.so (for --simulate, e.g. a
# check of the packaged layout on a machine without a GPU), the check
# scripts, and COMMIT (the commit, the profile and `git status --short`, which
# device-check.sh copies into its result). Binaries are stripped of debug
# information (`strip --strip-debug`): the device tool carries at most 64 MiB
# with the working tree, so the package must stay under 60 MiB (checked).
#
# Usage: scripts/package-device.sh [--profile release|debug] [--no-build] [DIST_DIR]
#   then carry DIST_DIR to the machine and run DIST_DIR/device-check.sh [RESULT.json]
#   --profile debug --no-build: package target/debug as it is (a quick check
#   of this script and of the packaged layout; not for a device run).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=release
BUILD=1
DIST=dist
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) PROFILE=$2; shift ;;
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "package-device: unknown option $1" >&2; exit 2 ;;
    *) DIST=$1 ;;
  esac
  shift
done
case "$PROFILE" in release|debug) ;; *) echo "package-device: --profile release or debug" >&2; exit 2 ;; esac
if [ $BUILD = 1 ]; then
  if [ "$PROFILE" = release ]; then
    cargo build --release -p egpu -p egpu-hook -p egpu-simgpu -p egpu-workloads -p egpu-burn
  else
    cargo build -p egpu -p egpu-hook -p egpu-simgpu -p egpu-workloads -p egpu-burn
  fi
fi
# What device-check.sh runs (egpu-mkslice is not among them: the check
# makes its slices with egpud).
BINS=(egpud egpu libegpu.so egpu-probe egpu-burn libegpu_simgpu.so)
if command -v strip >/dev/null 2>&1; then
  STRIP=1
else
  STRIP=0
  echo "package-device: WARNING: no 'strip' here (binutils): the binaries are packaged unstripped and may not fit the 64 MiB carry limit" >&2
fi
mkdir -p "$DIST/device"
rm -f "$DIST/egpu-mkslice"  # packaged by earlier versions
for f in "${BINS[@]}"; do
  cp -f "target/$PROFILE/$f" "$DIST/$f"
  if [ $STRIP = 1 ]; then strip --strip-debug "$DIST/$f"; fi
done
cp -f scripts/device-check.sh "$DIST/device-check.sh"
cp -f scripts/device/*.py "$DIST/device/"
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "profile $PROFILE"
  echo "stripped $([ $STRIP = 1 ] && echo yes || echo no)"
  echo "packaged $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "rustc $(rustc --version 2>/dev/null || echo unknown)"
  echo "glibc $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
  echo "git status --short:"
  git status --short 2>/dev/null || true
} >"$DIST/COMMIT"
total=$(du -cb "$DIST" | tail -1 | cut -f1)
du -b "$DIST"/* | sort -n | awk '{printf "  %8.1f MiB  %s\n", $1 / 1048576, $2}'
awk -v d="$DIST" -v t="$total" -v p="$PROFILE" 'BEGIN { printf "package-device: %s holds %.1f MiB (%.0f bytes, profile %s)\n", d, t / 1048576, t, p }'
if [ "$total" -gt $((60 << 20)) ]; then
  echo "package-device: ERROR: $DIST is over 60 MiB: it will not travel (the device tool carries at most 64 MiB with the working tree)" >&2
  exit 1
fi
echo "packaged into $DIST: carry it and run $DIST/device-check.sh [RESULT.json] on the GPU machine (docs/device-check.md)"
