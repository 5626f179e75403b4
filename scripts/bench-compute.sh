#!/usr/bin/env bash
# Compute isolation end to end on the simulated GPU: accuracy (30/70,
# 20/30/50, 10/20/30/40), work conservation (lone 30%/100%, 40% limit),
# priority (high latency loop vs 3 saturating best-effort), resize
# convergence, and the launch-path overhead of the gate (bare driver vs
# hook without arbiter vs hook gated, event every 1/8/16 launches).
#
# egpu-burn processes run under LD_PRELOAD=libegpu.so; the bench plays
# egpud with the arbiter's own Arbiter::tick_tables every 10 ms (truth: the
# simulated GPU's per-process busy time) and reads what each slice got from
# the simulated GPU's busy time, never from the hook.
#
# Usage: scripts/bench-compute.sh [accuracy|conservation|priority|resize|overhead|all] [WINDOW_S]
# Prints one JSON line per result.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p egpu-hook -p egpu-simgpu -p egpu-burn -p egpu-workloads --example compute-bench
exec target/release/examples/compute-bench "${1:-all}" "${2:-10}"
