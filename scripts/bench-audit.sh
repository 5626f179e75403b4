#!/bin/bash
# egpud memory-audit cost: 64 slices x 2 processes holding 1 MiB each on a
# simulated 1x80GiB node, egpud started twice in one run: --memory-audit off
# (the baseline) and report. Reads egpud's CPU time and its audit thread's
# (comm "egpud-memory-au", from schedstat) over SECS seconds, and the audit
# thread's time per tick (one tick a second).
# Build first: cargo build --release -p egpu -p egpu-simgpu -p egpu-hook -p egpu-workloads
# Usage: T=target/release SECS=20 scripts/bench-audit.sh
set -u
T=${T:-target/release}
SECS=${SECS:-20}
HZ=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "$1" 2>/dev/null || echo 0; }
# Nanoseconds a thread ran (schedstat), finer than the clock ticks of stat.
ns() { awk '{print $1}' "$1" 2>/dev/null || echo 0; }
run() {
  local mode=$1 D
  D=$(mktemp -d)
  $T/egpud --simulate 1x80GiB --run-dir $D/run --state-dir $D/state --memory-audit $mode --log warn 2>$D/log &
  local EGPUD=$!
  export EGPU_SOCKET=$D/run/egpud.sock
  for _ in $(seq 50); do $T/egpu devices >/dev/null 2>&1 && break; sleep 0.2; done
  for i in $(seq 0 63); do $T/egpu create --name s$i --gpu-memory 256MiB >/dev/null; done
  local PIDS=()
  for i in $(seq 0 63); do for k in 1 2; do
    sleep 1000 | $T/egpu exec s$i -- $T/egpu-probe alloc --size 1MiB --hold >/dev/null 2>&1 &
    PIDS+=($!)
  done; done
  local n=0
  for _ in $(seq 200); do
    n=$($T/egpu ls -o json | python3 -c "import json,sys; print(sum(sum(p['alive'] for p in s['processes']) for s in json.load(sys.stdin)))")
    [ "$n" = 128 ] && break; sleep 0.5
  done
  local tid=""
  for t in /proc/$EGPUD/task/*; do [ "$(cat $t/comm)" = egpud-memory-au ] && tid=$t; done
  local p0 a0 p1 a1
  p0=$(cpu /proc/$EGPUD/stat); a0=$([ -n "$tid" ] && ns $tid/schedstat || echo 0)
  sleep $SECS
  p1=$(cpu /proc/$EGPUD/stat); a1=$([ -n "$tid" ] && ns $tid/schedstat || echo 0)
  echo "$mode $n $(( p1 - p0 )) $(( a1 - a0 ))"
  kill $EGPUD; for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done
  # The holders' `sleep 1000` are this subshell's children (not $$'s).
  pkill -P $BASHPID sleep 2>/dev/null
  wait 2>/dev/null
  rm -rf $D
}
off=$(run off); rep=$(run report)
python3 - "$off" "$rep" "$SECS" "$HZ" <<'PY'
import sys
off, rep, secs, hz = sys.argv[1].split(), sys.argv[2].split(), float(sys.argv[3]), float(sys.argv[4])
pct = lambda ticks: float(ticks) / hz / secs * 100
print(f"attached processes: off {off[1]}, report {rep[1]}")
print(f"egpud cpu, --memory-audit off:    {pct(off[2]):.2f}% of a core")
print(f"egpud cpu, --memory-audit report: {pct(rep[2]):.2f}% of a core (x{float(rep[2]) / max(float(off[2]), 1):.2f})")
print(f"audit thread: {float(rep[3]) / 1e9 / secs * 100:.3f}% of a core, {float(rep[3]) / 1e6 / secs:.2f} ms per tick (one a second)")
PY
