#!/usr/bin/env bash
# Builds the binaries scripts/device-check.sh needs on a GPU machine that has
# no Rust toolchain, into dist/ (or $1): egpud, egpu, libegpu.so, egpu-probe,
# egpu-mkslice, egpu-burn (the compute checks), libegpu_simgpu.so (for
# --simulate), and the check scripts.
# Usage: scripts/package-device.sh [DIST_DIR]   then copy DIST_DIR to the machine and run
#        DIST_DIR/device-check.sh [RESULT.json]
set -euo pipefail
cd "$(dirname "$0")/.."
DIST=${1:-dist}
cargo build --release -p egpu -p egpu-hook -p egpu-simgpu -p egpu-workloads -p egpu-burn
mkdir -p "$DIST/device"
for f in egpud egpu libegpu.so egpu-probe egpu-mkslice egpu-burn libegpu_simgpu.so; do
  cp -f "target/release/$f" "$DIST/$f"
done
cp -f scripts/device-check.sh "$DIST/device-check.sh"
cp -f scripts/device/*.py "$DIST/device/"
echo "packaged into $DIST: run $DIST/device-check.sh [result.json] on the GPU machine"
