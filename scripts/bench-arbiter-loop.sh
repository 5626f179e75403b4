#!/bin/bash
# egpud compute-arbiter loop cost: 64 slices x 2 attached processes (2 of them
# egpu-burn, the rest egpu-probe holding 1 MiB) on a simulated 1x80GiB node;
# reads the loop thread CPU time, tick count and tick-duration histogram from
# /metrics. Build first: cargo build --release -p egpu -p egpu-simgpu -p egpu-hook -p egpu-workloads -p egpu-burn
# Usage: T=target/release SECS=20 scripts/bench-arbiter-loop.sh
set -u
T=${T:-target/release}
D=$(mktemp -d)
$T/egpud --simulate 1x80GiB --run-dir $D/run --state-dir $D/state --metrics-addr 127.0.0.1:0 --log warn 2>$D/log &
EGPUD=$!
export EGPU_SOCKET=$D/run/egpud.sock
for i in $(seq 50); do [ -f $D/run/metrics.addr ] && $T/egpu devices >/dev/null 2>&1 && break; sleep 0.2; done
ADDR=$(cat $D/run/metrics.addr)
for i in $(seq 0 63); do $T/egpu create --name s$i --gpu-memory 256MiB --gpu-compute 1% --gpu-compute-limit 100% >/dev/null; done
PIDS=()
for i in $(seq 0 63); do for k in 1 2; do
  if [ $i -lt 2 ] && [ $k = 1 ]; then
    $T/egpu exec s$i -- $T/egpu-burn --seconds 60 >/dev/null 2>&1 &
  else
    sleep 100 | $T/egpu exec s$i -- $T/egpu-probe alloc --size 1MiB --hold >/dev/null 2>&1 &
  fi
  PIDS+=($!)
done; done
for i in $(seq 100); do n=$(curl -s http://$ADDR/metrics | grep '^egpu_slice_processes' | awk '{s+=$2} END {print s}'); [ "${n:-0}" = 128 ] && break; sleep 0.5; done
echo "attached processes: $n"
m() { curl -s http://$ADDR/metrics | grep -E "^$1 " | awk '{print $2}'; }
c0=$(m egpu_arbiter_cpu_seconds_total); t0=$(m egpu_arbiter_ticks_total); s0=$(m egpu_arbiter_tick_seconds_sum); x0=$(m egpu_arbiter_missed_ticks_total); w0=$(date +%s.%N)
sleep ${SECS:-20}
c1=$(m egpu_arbiter_cpu_seconds_total); t1=$(m egpu_arbiter_ticks_total); s1=$(m egpu_arbiter_tick_seconds_sum); x1=$(m egpu_arbiter_missed_ticks_total); w1=$(date +%s.%N)
python3 -c "
w=$w1-$w0; t=$t1-$t0
print(f'wall {w:.1f}s ticks {t:.0f} achieved period {w/t*1e3:.3f} ms missed {$x1-$x0:.0f}')
print(f'arbiter thread cpu {($c1-$c0)/w*100:.2f}% of a core; mean tick {($s1-$s0)/t*1e6:.1f} us')"
curl -s http://$ADDR/metrics | grep -E "^egpu_arbiter_tick_seconds_bucket|^egpu_arbiter_achieved|^egpu_slice_compute_usage_ratio\{slice=\"s[01]\""
kill $EGPUD; for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done
pkill -P $$ 2>/dev/null
wait 2>/dev/null
