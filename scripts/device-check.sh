#!/usr/bin/env bash
# eGPU device check: the memory suite and PyTorch under libegpu.so on a real
# NVIDIA GPU, with prebuilt binaries (no Rust toolchain needed).
#
#   scripts/package-device.sh dist      # on a build machine
#   dist/device-check.sh [RESULT.json]  # on the GPU machine (default $OUT/device-check.json or ./device-check.json)
#   scripts/device-check.sh --simulate --dist target/debug [RESULT.json]   # the same checks on the simulated GPU, no PyTorch
#
# Binaries are taken from --dist DIR, $EGPU_DIST, the script's own directory
# (packaged layout) or ../dist. Starts its own egpud (killed by pid on exit),
# runs every check with a timeout, writes ONE JSON file with each check's
# pass/fail and numbers, and exits non-zero if any check failed.
set -uo pipefail

SIM=0
RESULT=""
DIST=${EGPU_DIST:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --simulate) SIM=1 ;;
    --dist) DIST=$2; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) RESULT=$1 ;;
  esac
  shift
done
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -z "$DIST" ]; then
  if [ -x "$HERE/egpud" ]; then DIST=$HERE; else DIST=$HERE/../dist; fi
fi
DIST=$(cd "$DIST" && pwd) || { echo "device-check: no binaries in $DIST (run scripts/package-device.sh)" >&2; exit 2; }
PYDIR=$HERE/device
RESULT=${RESULT:-${OUT:-.}/device-check.json}
for f in egpud egpu egpu-probe libegpu.so; do
  [ -e "$DIST/$f" ] || { echo "device-check: $DIST/$f is missing (run scripts/package-device.sh)" >&2; exit 2; }
done

W=$(mktemp -d /tmp/egpu-device-check.XXXXXX)
RUN=$W/run
SOCK=$RUN/egpud.sock
RES=$W/results.jsonl
: >"$RES"
EGPUD=""
START=$(date +%s)
GIB=$((1 << 30))
MIB=$((1 << 20))
LIMIT=$((2 * GIB))

cleanup() {
  if [ -n "$EGPUD" ]; then
    timeout 10 "$DIST/egpu" --socket "$SOCK" rm --force dc >/dev/null 2>&1
    kill "$EGPUD" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$EGPUD" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$EGPUD" 2>/dev/null
  fi
  rm -rf "$W"
}
trap cleanup EXIT

# record NAME STATUS(pass|fail|skip) DETAILS_JSON
record() {
  python3 - "$1" "$2" "${3:-{\}}" >>"$RES" <<'PY'
import json, sys
name, status, details = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    d = json.loads(details)
except Exception:
    d = {"raw": details[-2000:]}
print(json.dumps({"name": name, "pass": {"pass": True, "fail": False}.get(status), "status": status, "details": d}))
PY
  echo "device-check: $1: $2" >&2
}

# pyj EXPR: evaluates EXPR with L = the JSON lines read from stdin.
pyj() { python3 -c "import json,sys
L=[json.loads(l) for l in sys.stdin if l.strip().startswith('{')]
ev=lambda n: next((v for v in L if v.get('event')==n), {})
print($1)"; }

E() { timeout "${T:-60}" "$DIST/egpu" --socket "$SOCK" "$@"; }

# Background jobs with a controllable stdin (a FIFO) and stdout in a file.
# bg NAME CMD...; wait_line NAME PATTERN SECONDS (prints the line); send NAME TEXT; finish NAME
declare -A BG_PID BG_FD
bg() {
  local n=$1 fd; shift
  mkfifo "$W/$n.in"
  : >"$W/$n.out"
  "$@" <"$W/$n.in" >"$W/$n.out" 2>"$W/$n.err" &
  BG_PID[$n]=$!
  exec {fd}>"$W/$n.in"
  BG_FD[$n]=$fd
}
wait_line() {
  local n=$1 pat=$2 deadline=$((SECONDS + $3)) line
  while [ $SECONDS -lt "$deadline" ]; do
    line=$(grep -m1 -- "$pat" "$W/$n.out" 2>/dev/null) && { printf '%s\n' "$line"; return 0; }
    kill -0 "${BG_PID[$n]}" 2>/dev/null || { grep -m1 -- "$pat" "$W/$n.out" 2>/dev/null; return $?; }
    sleep 0.02
  done
  return 1
}
send() { printf '%s\n' "$2" >&"${BG_FD[$1]}"; }
finish() {
  local fd=${BG_FD[$1]}
  exec {fd}>&-
  timeout 60 tail --pid="${BG_PID[$1]}" -f /dev/null 2>/dev/null
  wait "${BG_PID[$1]}" 2>/dev/null
}
X() { local s=$1; shift; E exec "$s" -- "$@"; }

# --- egpud -------------------------------------------------------------------
args=(--run-dir "$RUN" --state-dir "$W/state" --socket "$SOCK" --hook-lib "$DIST/libegpu.so")
if [ $SIM = 1 ]; then args+=(--simulate 1x16GiB --sim-lib "$DIST/libegpu_simgpu.so"); fi
mkdir -p "$RUN"
"$DIST/egpud" "${args[@]}" >"$W/egpud.log" 2>&1 &
EGPUD=$!
for _ in $(seq 300); do [ -S "$SOCK" ] && break; kill -0 "$EGPUD" 2>/dev/null || break; sleep 0.1; done
if devs=$(E devices -o json 2>&1); then
  record egpud-up pass "{\"devices\": $(printf '%s' "$devs" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' 2>/dev/null || echo null)}"
else
  record egpud-up fail "$(python3 -c 'import json,sys; print(json.dumps({"log": open(sys.argv[1]).read()[-3000:], "error": sys.argv[2]}))' "$W/egpud.log" "$devs")"
  EGPUD_FAILED=1
fi

if [ -z "${EGPUD_FAILED:-}" ]; then
  E create --name dc --gpu-memory 2GiB --device 0 >/dev/null || record create-slice fail '{}'

  # --- slice view, three ways in --------------------------------------------
  for way in direct dlopen procaddr; do
    out=$(X dc "$DIST/egpu-probe" --via $way info 2>"$W/err")
    v=$(printf '%s\n' "$out" | pyj "json.dumps({'cuda_total': ev('info').get('mem_get_info',{}).get('total'), 'cuda_free': ev('info').get('mem_get_info',{}).get('free'), 'nvml_count': ev('nvml').get('nvml',{}).get('count'), 'nvml_total': (ev('nvml').get('nvml',{}).get('devices') or [{}])[0].get('memory',{}).get('total')})")
    ok=$(printf '%s' "$v" | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['cuda_total']==$LIMIT and d['nvml_total']==$LIMIT and d['nvml_count']==1)")
    [ "$ok" = True ] && record "view-$way" pass "$v" || record "view-$way" fail "$v"
  done

  # --- every allocation family, three ways in ------------------------------
  for fam in mem pitch managed array mipmap async pool vmm multicast graph; do
    for way in direct dlopen procaddr; do
      out=$(X dc "$DIST/egpu-probe" --via $way alloc --family $fam --size 256MiB --until-oom 2>"$W/err")
      rc=$?
      v=$(printf '%s\n' "$out" | pyj "json.dumps({'rc': $rc, 'summary': ev('summary'), 'stop': ev('oom') or ev('error')})")
      verdict=$(printf '%s' "$v" | python3 -c "
import json,sys
d=json.load(sys.stdin); s=d['summary']; stop=d['stop']
if stop.get('code') in (801, 1) and s.get('allocated',0)==0: print('skip')
elif s.get('stopped')=='oom' and d['rc']==0 and 0 < s['allocated']*256*2**20 <= $LIMIT and s.get('mem_after_free',{}).get('total')==$LIMIT: print('pass')
else: print('fail')")
      record "alloc-$fam-$way" "$verdict" "$v"
    done
  done

  # --- independent witness: the driver's own view of a holding process --------
  bg hold X dc "$DIST/egpu-probe" alloc --size 256MiB --until-oom --hold
  if hold_line=$(wait_line hold '"holding"' 60); then
    pid=$(printf '%s\n' "$hold_line" | pyj "ev('holding').get('pid')")
    if [ $SIM = 1 ]; then
      used=$(env -u LD_PRELOAD LD_LIBRARY_PATH="$RUN/simlib:${LD_LIBRARY_PATH:-}" EGPU_SIM_GPUS=1x16GiB EGPU_SIM_STATE="$RUN/simgpu.state" "$DIST/egpu-probe" info 2>/dev/null | pyj "ev('nvml')['nvml']['devices'][0]['memory']['used']" 2>/dev/null || echo null)
      src=simulated-nvml-device-used
    else
      used=$(timeout 20 nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', *' -v p="$pid" '$1==p {print $2*1048576}')
      src=nvidia-smi-process-used
    fi
    ok=$(python3 -c "u='$used'; print(u not in ('','null') and float(u) <= $LIMIT + 64*$MIB)")
    [ "$ok" = True ] && st=pass || st=fail
    record witness-holding "$st" "{\"pid\": ${pid:-null}, \"driver_used\": ${used:-null}, \"source\": \"$src\", \"limit\": $LIMIT}"
  else
    record witness-holding fail "$(python3 -c 'import json,sys; print(json.dumps({"error": "probe did not reach holding", "stdout": open(sys.argv[1]).read()[-1000:]}))' "$W/hold.out")"
  fi
  finish hold

  # --- fail closed ------------------------------------------------------------
  LD_PRELOAD="$DIST/libegpu.so" EGPU_SLICE_DIR="$W/no-such-slice" LD_LIBRARY_PATH="$RUN/simlib:${LD_LIBRARY_PATH:-}" timeout 30 "$DIST/egpu-probe" alloc >"$W/fc.out" 2>"$W/fc.err"
  rc=$?
  if [ $rc = 4 ] && grep -q "GPU access refused" "$W/fc.err"; then st=pass; else st=fail; fi
  record fail-closed "$st" "$(python3 -c 'import json,sys; print(json.dumps({"rc": int(sys.argv[1]), "stderr": open(sys.argv[2]).read()[-500:], "stdout": open(sys.argv[3]).read()[-500:]}))' $rc "$W/fc.err" "$W/fc.out")"

  # --- live resize: a blocked egpu-probe grow succeeds after egpu resize ------
  E create --name gr --gpu-memory 1GiB --device 0 >/dev/null
  bg grow X gr "$DIST/egpu-probe" grow --step 128MiB --until 1536MiB
  if wait_line grow '"blocked"' 60 >/dev/null; then
    t0=$(python3 -c 'import time; print(time.monotonic_ns())')
    E resize gr --gpu-memory 3GiB >/dev/null
    if unblocked=$(wait_line grow '"unblocked"' 60); then
      lat=$(printf '%s\n' "$unblocked" | pyj "ev('unblocked')['t_ns'] - $t0")
      record resize-probe pass "{\"resize_to_alloc_ns\": $lat}"
    else
      record resize-probe fail '{"error": "not unblocked within 60 s"}'
    fi
  else
    record resize-probe fail "$(python3 -c 'import json,sys; print(json.dumps({"error": "grow never blocked", "stdout": open(sys.argv[1]).read()[-1000:], "stderr": open(sys.argv[2]).read()[-1000:]}))' "$W/grow.out" "$W/grow.err")"
  fi
  finish grow
  E rm --force gr >/dev/null 2>&1

  # --- PyTorch ------------------------------------------------------------------
  if [ $SIM = 1 ]; then
    record pytorch skip '{"reason": "--simulate: the simulated GPU does not run PyTorch"}'
  elif ! X dc python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>"$W/torch.err"; then
    record pytorch fail "$(python3 -c 'import json,sys; print(json.dumps({"error": open(sys.argv[1]).read()[-1500:]}))' "$W/torch.err")"
  else
    T=120
    v=$(X dc python3 "$PYDIR/torch_check.py" view $LIMIT 2>/dev/null | tail -1)
    [ "$(printf '%s' "$v" | pyj "L[-1].get('ok')")" = True ] && record torch-mem-get-info pass "$v" || record torch-mem-get-info fail "${v:-{\}}"
    v=$(X dc python3 "$PYDIR/torch_check.py" oom 2>/dev/null | tail -1)
    [ "$(printf '%s' "$v" | pyj "L[-1].get('ok')")" = True ] && record torch-oom-at-limit pass "$v" || record torch-oom-at-limit fail "${v:-{\}}"
    for conf in "" "expandable_segments:True"; do
      v=$(PYTORCH_CUDA_ALLOC_CONF=$conf X dc python3 "$PYDIR/torch_check.py" fill $((128 * MIB)) 2>/dev/null | tail -1)
      ok=$(printf '%s' "$v" | pyj "L[-1].get('bytes',0) > 0 and L[-1]['bytes'] <= $LIMIT and L[-1]['reserved'] <= $LIMIT")
      name=torch-fill${conf:+-expandable}
      [ "$ok" = True ] && record "$name" pass "$v" || record "$name" fail "${v:-{\}}"
    done
    E create --name tr --gpu-memory 2GiB --device 0 >/dev/null
    bg tr X tr python3 "$PYDIR/torch_check.py" resize $((256 * MIB))
    if wait_line tr '"blocked"' 120 >/dev/null; then
      E resize tr --gpu-memory 3GiB >/dev/null
      send tr go
      if res=$(wait_line tr '"check"' 120); then
        [ "$(printf '%s' "$res" | pyj "L[-1].get('ok') if L else False")" = True ] && record torch-live-resize pass "$res" || record torch-live-resize fail "$res"
      else
        record torch-live-resize fail '{"error": "no result after the resize"}'
      fi
    else
      record torch-live-resize fail '{"error": "never blocked"}'
    fi
    finish tr
    E rm --force tr >/dev/null 2>&1
    T=60
  fi

  # --- hook overhead on this machine's driver ----------------------------------
  calls=20000
  bare=$(LD_LIBRARY_PATH="$RUN/simlib:${LD_LIBRARY_PATH:-}" EGPU_SIM_GPUS=1x16GiB EGPU_SIM_STATE="$W/bench.state" timeout 120 "$DIST/egpu-probe" bench --calls $calls 2>/dev/null)
  hooked=$(T=120 X dc "$DIST/egpu-probe" bench --calls $calls 2>/dev/null)
  v=$(printf '%s\n%s\n' "$bare" "$hooked" | pyj "json.dumps({v['op']+('_hook' if v['hooked'] else '_bare'): v['median_ns'] for v in L if v.get('event')=='bench'})")
  verdict=$(printf '%s' "$v" | python3 -c "
import json,sys
d=json.load(sys.stdin)
ok = all(k in d for k in ('launch_bare','launch_hook','alloc_free_bare','alloc_free_hook'))
# Real GPU: added launch cost <= 50 ns plus 3% of the bare launch (run-to-run noise).
# Simulated: informative only (often a debug build on a shared machine).
print('pass' if ok and ($SIM == 1 or d['launch_hook'] - d['launch_bare'] <= 50 + 0.03 * d['launch_bare']) else 'fail')")
  record hook-overhead "$verdict" "$(printf '%s' "$v" | python3 -c "import json,sys; d=json.load(sys.stdin); d['criterion']='launch_hook - launch_bare <= 50 ns + 3% of launch_bare (real GPU only)'; print(json.dumps(d))")"
fi

python3 - "$RES" "$RESULT" "$SIM" "$START" <<'PY'
import json, os, platform, sys, time
res, path, sim, start = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
checks = [json.loads(l) for l in open(res) if l.strip()]
failed = [c["name"] for c in checks if c["status"] == "fail"]
doc = {"simulate": sim, "host": platform.node(), "duration_s": int(time.time()) - start,
       "passed": sum(c["status"] == "pass" for c in checks), "failed": failed,
       "skipped": [c["name"] for c in checks if c["status"] == "skip"], "ok": not failed and bool(checks), "checks": checks}
os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
with open(path, "w") as f:
    json.dump(doc, f, indent=1)
print(f"device-check: {doc['passed']} passed, {len(failed)} failed, {len(doc['skipped'])} skipped -> {path}", file=sys.stderr)
sys.exit(0 if doc["ok"] else 1)
PY
