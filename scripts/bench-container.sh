#!/usr/bin/env bash
# Container start cost of joining a slice: wall time of `runc run` of a
# container that runs `true`, with and without a slice's CDI edits (the
# mounts, the environment and the egpu-cdi-hook check), interleaved, in one
# run. Needs root and runc.
# Usage: scripts/bench-container.sh [RUNS]   (prints medians and the ratio)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-30}
command -v runc >/dev/null || { echo "runc is not installed (apt-get install runc)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "needs root (rootful runc)" >&2; exit 2; }
cargo build -q --release -p egpu -p egpu-cdi-hook -p egpu-hook -p egpu-simgpu
T=$PWD/target/release
W=$(mktemp -d)
cleanup() {
  [ -n "${PID:-}" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
"$T/egpud" --simulate 1x16GiB --run-dir "$W/run" --state-dir "$W/state" --cdi-dir "$W/cdi" --log warn &
PID=$!
export EGPU_SOCKET=$W/run/egpud.sock
for _ in $(seq 300); do "$T/egpu" devices >/dev/null 2>&1 && break; sleep 0.1; done
"$T/egpu" create --name bench --gpu-memory 1GiB >/dev/null

# Two bundles over the host's /usr: plain, and with the slice's CDI edits
# applied as a runtime applies them (environment, mounts, hooks).
for b in bare slice; do
  mkdir -p "$W/$b/rootfs/etc"
  for d in bin lib lib64 sbin; do [ -L "/$d" ] && ln -s "$(readlink "/$d")" "$W/$b/rootfs/$d"; done
  (cd "$W/$b" && runc spec)
done
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
spec = json.load(open(f"{w}/cdi/egpu.io-slice_bench.json"))
edits = spec["devices"][0]["containerEdits"]
for b in ("bare", "slice"):
    c = json.load(open(f"{w}/{b}/config.json"))
    c["root"] = {"path": f"{w}/{b}/rootfs", "readonly": True}
    c["process"]["terminal"] = False
    c["process"]["args"] = ["/bin/sh", "-c", "true"]
    c["mounts"].append({"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]})
    if b == "slice":
        c["process"]["env"] += edits["env"]
        c["mounts"] += [{"destination": m["containerPath"], "type": m["type"], "source": m["hostPath"], "options": m["options"]} for m in edits["mounts"]]
        c.setdefault("hooks", {})
        for h in edits["hooks"]:
            c["hooks"].setdefault(h["hookName"], []).append({"path": h["path"], "args": h["args"]})
    json.dump(c, open(f"{w}/{b}/config.json", "w"))
PY
: >"$W/times"
for i in $(seq "$RUNS"); do
  for b in bare slice; do
    s=$(date +%s%N)
    runc --root "$W/runc" run --bundle "$W/$b" "bench-$b-$i" >/dev/null
    e=$(date +%s%N)
    echo "$b $(( (e - s) / 1000 ))" >>"$W/times"
  done
done
python3 - "$W/times" "$RUNS" <<'PY'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    k, us = line.split()
    t.setdefault(k, []).append(int(us) / 1000)
b, s = statistics.median(t["bare"]), statistics.median(t["slice"])
print(f"runs: {sys.argv[2]} each, interleaved")
print(f"runc run, plain container:        median {b:.1f} ms")
print(f"runc run, in a slice (CDI edits): median {s:.1f} ms  ({s / b:.2f}x, +{s - b:.1f} ms)")
PY
