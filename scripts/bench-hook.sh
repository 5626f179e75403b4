#!/usr/bin/env bash
# Hook overhead: per-call cost of cuMemAlloc_v2+cuMemFree_v2 and of
# cuLaunchKernel (1-thread kernel, EGPU_SIM_NS_PER_THREAD=0) through the
# simulated driver, with and without LD_PRELOAD=libegpu.so, in one run.
# With COMPAT=1 it also measures the glibc 2.17 build of the hook
# (scripts/build-compat.sh, what deploy/Dockerfile ships), in the same rounds.
# Usage: [COMPAT=1] scripts/bench-hook.sh [CALLS] [ROUNDS]   (prints a table and JSON lines)
set -euo pipefail
cd "$(dirname "$0")/.."
CALLS=${1:-200000}
ROUNDS=${2:-5}
cargo build -q --release -p egpu-hook -p egpu-simgpu -p egpu-workloads
T=target/release
KINDS="hook"
if [ "${COMPAT:-0}" = 1 ]; then
  ./scripts/build-compat.sh --release -q >/dev/null
  KINDS="hook compat"
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/lib"
for n in libcuda.so.1 libcuda.so libnvidia-ml.so.1 libnvidia-ml.so; do ln -s "$PWD/$T/libegpu_simgpu.so" "$W/lib/$n"; done
export LD_LIBRARY_PATH="$W/lib" EGPU_SIM_GPUS=1x80GiB EGPU_SIM_STATE="$W/sim.state" EGPU_SIM_NS_PER_THREAD=0
UUID=GPU-5e6d0000-0000-4000-8000-0000e6b00000
"$T/egpu-mkslice" "$W/slice" "$UUID:0:64GiB" >/dev/null
run() { "$T/egpu-probe" --via "${VIA:-procaddr}" bench --calls "$CALLS"; }
: >"$W/out"
for _ in $(seq "$ROUNDS"); do
  run | sed 's/^/bare /' >>"$W/out"
  for k in $KINDS; do
    lib="$PWD/$T/libegpu.so"
    [ "$k" = compat ] && lib="$PWD/target/$(uname -m)-unknown-linux-gnu/release/libegpu.so"
    LD_PRELOAD="$lib" EGPU_SLICE_DIR="$W/slice" CUDA_VISIBLE_DEVICES=$UUID run | sed "s/^/$k /" >>"$W/out"
  done
done
python3 - "$W/out" <<'PY'
import json, sys, statistics
rows = {}
for line in open(sys.argv[1]):
    kind, js = line.split(' ', 1)
    v = json.loads(js)
    rows.setdefault((v['op'], kind), []).append(v['median_ns'])
print(f"{'op':<12}{'build':<12}{'bare ns':>10}{'hook ns':>10}{'added ns':>10}{'ratio':>8}")
for op in ('alloc_free', 'launch'):
    b = statistics.median(rows[(op, 'bare')])
    for kind in ('hook', 'compat'):
        if (op, kind) not in rows:
            continue
        h = statistics.median(rows[(op, kind)])
        build = 'usual' if kind == 'hook' else 'glibc 2.17'
        print(f"{op:<12}{build:<12}{b:>10.1f}{h:>10.1f}{h-b:>10.1f}{h/b:>8.2f}")
        print(json.dumps({"op": op, "build": build, "bare_median_ns": round(b, 1), "hook_median_ns": round(h, 1), "added_ns": round(h - b, 1), "ratio": round(h / b, 3)}))
PY
