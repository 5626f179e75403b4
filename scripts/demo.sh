#!/usr/bin/env bash
# eGPU's demo: builds everything but the Kubernetes pieces in release mode,
# then runs `egpu demo`. With no NVIDIA GPU it starts a node on the
# simulated GPU; with one, it uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
# The demo needs no Kubernetes piece: leaving egpu-k8s out spares a newcomer
# building the Kubernetes client libraries.
cargo build --release --workspace --exclude egpu-k8s --quiet
exec target/release/egpu demo "$@"
