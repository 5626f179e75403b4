#!/usr/bin/env python3
"""Helpers for the compute checks of scripts/device-check.sh.

Subcommands, each printing one JSON object:
  snap EGPU SOCK          egpud's cumulative per-slice GPU seconds on device 0
                          (`egpu ls -o json` compute_used_seconds), with the
                          CLOCK_MONOTONIC time of the sample: {"t": s, "used": {name: s}}
  split A0 A1 NAMES...    from two `snap` objects (JSON strings), each slice's
                          share of the device over the window, percent:
                          {"window_s": w, "pct": {name: p}}
  burn FILE               an `egpu-burn -o json` output: kernels/s over the
                          intervals after the first (warm-up), and the whole
                          run's latency percentiles
  resize EGPU SOCK A B PRE_S POST_S WIN_MS TO_A TO_B
                          slices A and B are saturating; polls egpud for PRE_S,
                          resizes B to TO_B% (share = limit) then A to TO_A%,
                          polls for POST_S; the split over successive windows
                          of at least WIN_MS after the resize returned, and
                          when it reached TO_A/TO_B: the start of the first
                          window within 5 points of TO_A from which on the mean
                          split is within 3 points (docs/device-check.md)
  wake N                  the host's wake-up latency: N sleeps of 400 us, how
                          late each woke (percentiles in us, and the fraction
                          over 1 ms, longer than a saturating burner's queue
                          of 0.4 ms kernels lasts on the simulated GPU)
"""
import json
import subprocess
import sys
import time


def ls(egpu, sock):
    r = subprocess.run([egpu, "--socket", sock, "ls", "-o", "json"], capture_output=True, text=True, timeout=20)
    t = time.monotonic()
    doc = json.loads(r.stdout)
    slices = doc if isinstance(doc, list) else doc.get("slices", [])
    used = {}
    for s in slices:
        for d in s.get("devices", []):
            if d.get("device") == 0:
                used[s["name"]] = d.get("compute_used_seconds", 0.0)
    return {"t": t, "used": used}


def split(a, b, names):
    w = b["t"] - a["t"]
    pct = {n: round((b["used"].get(n, 0.0) - a["used"].get(n, 0.0)) / w * 100, 2) if w > 0 else None for n in names}
    return {"window_s": round(w, 3), "pct": pct}


def burn(path):
    lines = []
    for l in open(path):
        l = l.strip()
        if l.startswith("{"):
            try:
                lines.append(json.loads(l))
            except ValueError:
                pass
    ivs = [l for l in lines if not l.get("mode", "").endswith("-total")]
    total = next((l for l in lines if l.get("mode", "").endswith("-total")), {})
    steady = ivs[1:] if len(ivs) > 1 else ivs
    k = sum(i["kernels"] for i in steady)
    span = sum(i["kernels"] / i["kernels_per_s"] for i in steady if i.get("kernels_per_s"))
    return {
        "kernels_per_s": round(k / span, 2) if span > 0 else None,
        "steady_intervals": len(steady),
        "kernels": total.get("kernels"),
        "p50_us": total.get("latency_p50_us"),
        "p99_us": total.get("latency_p99_us"),
        "gpu_busy_frac": total.get("gpu_busy_frac"),
        "complete": bool(total),
    }


def resize(egpu, sock, a, b, pre_s, post_s, win_ms, to_a, to_b):
    samples = []
    end = time.monotonic() + pre_s
    while time.monotonic() < end:
        samples.append(ls(egpu, sock))
    pre = split(samples[0], samples[-1], [a, b])
    rc = []
    for name, pct in ((b, to_b), (a, to_a)):  # shrink first: shares may not add up past 100%
        r = subprocess.run([egpu, "--socket", sock, "resize", name, "--gpu-compute", f"{pct}%", "--gpu-compute-limit", f"{pct}%"],
                           capture_output=True, text=True, timeout=20)
        rc.append(r.returncode)
    t0 = time.monotonic()
    post = []
    end = t0 + post_s
    while time.monotonic() < end:
        post.append(ls(egpu, sock))
    # Windows of >= win_ms between samples taken after the resize returned.
    wins = []
    i = 0
    while i < len(post) - 1:
        j = i + 1
        while j < len(post) and (post[j]["t"] - post[i]["t"]) * 1e3 < win_ms:
            j += 1
        if j >= len(post):
            break
        da = post[j]["used"].get(a, 0.0) - post[i]["used"].get(a, 0.0)
        db = post[j]["used"].get(b, 0.0) - post[i]["used"].get(b, 0.0)
        wins.append({
            "start_ms": round((post[i]["t"] - t0) * 1e3, 1),
            "len_ms": round((post[j]["t"] - post[i]["t"]) * 1e3, 1),
            "a_split_pct": round(da / (da + db) * 100, 1) if da + db > 0 else None,
        })
        i = j
    # Reached: the first window within `tol` of the target from which on the
    # mean split stays within `mean_tol` (one noisy later window does not
    # un-reach it; a window still in transition does not count as reached).
    tol, mean_tol = 5.0, 3.0
    conv = None
    for k, w in enumerate(wins):
        rest = [x["a_split_pct"] for x in wins[k:] if x["a_split_pct"] is not None]
        if w["a_split_pct"] is not None and abs(w["a_split_pct"] - to_a) <= tol and abs(sum(rest) / len(rest) - to_a) <= mean_tol:
            conv = w["start_ms"]
            break
    within = [x["a_split_pct"] is not None and abs(x["a_split_pct"] - to_a) <= tol for x in wins]
    whole = split(post[0], post[-1], [a, b]) if len(post) > 1 else None
    print(json.dumps({
        "resize_rc": rc, "from": pre["pct"], "to_target": {a: to_a, b: to_b},
        "after": whole["pct"] if whole else None, "after_window_s": whole["window_s"] if whole else None,
        "window_tolerance_pts": tol, "mean_tolerance_pts": mean_tol, "converged_ms": conv, "windows": len(wins),
        "windows_within_tolerance_frac": round(sum(within) / len(within), 3) if within else None,
        "first_windows": wins[:25], "samples_post": len(post),
    }))


def wake(n):
    late = []
    for _ in range(n):
        t = time.perf_counter_ns()
        time.sleep(0.0004)
        late.append(time.perf_counter_ns() - t - 400_000)
    late.sort()
    q = lambda f: round(late[min(n - 1, int(f * n))] / 1000, 1)
    return {"samples": n, "sleep_us": 400, "late_p50_us": q(0.5), "late_p90_us": q(0.9), "late_p99_us": q(0.99),
            "late_max_us": round(late[-1] / 1000, 1), "over_1ms_frac": round(sum(x > 1_000_000 for x in late) / n, 4)}


def main():
    cmd = sys.argv[1]
    if cmd == "snap":
        print(json.dumps(ls(sys.argv[2], sys.argv[3])))
    elif cmd == "split":
        print(json.dumps(split(json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4:])))
    elif cmd == "burn":
        print(json.dumps(burn(sys.argv[2])))
    elif cmd == "wake":
        print(json.dumps(wake(int(sys.argv[2]))))
    elif cmd == "resize":
        a = sys.argv[2:]
        resize(a[0], a[1], a[2], a[3], float(a[4]), float(a[5]), float(a[6]), float(a[7]), float(a[8]))
    else:
        raise SystemExit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()
