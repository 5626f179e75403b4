#!/usr/bin/env bash
# eGPU's demo: builds everything in release mode, then runs `egpu demo`. With
# no NVIDIA GPU it starts a node on the simulated GPU; with one, it uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --quiet
exec target/release/egpu demo "$@"
