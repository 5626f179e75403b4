#!/usr/bin/env python3
"""Facts about the genai-2026 usage trace that explain the elastic results
(docs/elastic.md): how long compute bursts last, when the cluster is busy, and
how often a pod's bursts in a 15-minute window follow bursts in the one before.

Usage: python3 scripts/elastic-trace-facts.py [../shared/data/genai-2026]
Needs numpy. Fills gaps as `egpu simulate --elastic` does: a pod repeats its
last sample between its first and last one, and uses nothing outside them.
"""
import csv
import gzip
import sys

import numpy as np

BURST = 0.8  # duty above which a minute counts as a burst
BUSY = 15.0  # summed duty (GPUs' worth) above which a minute counts as busy
WINDOW = 15  # minutes: the window of the levels-only foresight reference


def read(path):
    with gzip.open(path, "rt") as f:
        return [(r["container_ip"], float(r["timestamp_anon"]), float(r["value"])) for r in csv.DictReader(f)]


def sampling_step(*files):
    """The trace's own sampling step, seconds, as `egpu simulate --elastic`
    finds it: the median gap between consecutive distinct timestamps of one
    pod in one file (the lower median), to the nearest second, at least 1;
    60 when no pod has two samples."""
    gaps = []
    for rows in files:
        by_pod = {}
        for p, t, _ in rows:
            by_pod.setdefault(p, []).append(t)
        for ts in by_pod.values():
            ts = np.unique(np.array(ts))
            gaps.extend(np.diff(ts))
    if not gaps:
        return 60.0
    gaps.sort()
    return float(max(1.0, round(gaps[(len(gaps) - 1) // 2])))


def main(root):
    duty = read(f"{root}/pod_gpu_duty_cycle_anon.csv.gz")
    mem = read(f"{root}/pod_gpu_memory_used_bytes_anon.csv.gz")
    t0 = min(r[1] for r in duty + mem)
    step = sampling_step(duty, mem)
    minutes = int(round((max(r[1] for r in duty + mem) - t0) / step)) + 1
    pods = sorted({r[0] for r in duty + mem})
    at = {p: i for i, p in enumerate(pods)}
    d = np.full((len(pods), minutes), np.nan)
    m = np.full((len(pods), minutes), np.nan)
    # Samples of one pod in one period (none in genai-2026): duty averaged,
    # memory its largest, as `egpu simulate --elastic` does.
    n = np.zeros((len(pods), minutes))
    for p, t, v in duty:
        i, k = at[p], int(round((t - t0) / step))
        d[i, k] = v * 0.01 if n[i, k] == 0 else (d[i, k] * n[i, k] + v * 0.01) / (n[i, k] + 1)
        n[i, k] += 1
    for p, t, v in mem:
        i, k = at[p], int(round((t - t0) / step))
        m[i, k] = v / 2**30 if np.isnan(m[i, k]) else max(m[i, k], v / 2**30)
    life = []
    for i in range(len(pods)):
        seen = np.where(~np.isnan(d[i]) | ~np.isnan(m[i]))[0]
        a, b = seen[0], seen[-1]
        life.append((a, b))
        for grid in (d, m):
            row = grid[i]
            last = 0.0
            for t in range(minutes):
                if a <= t <= b:
                    last = row[t] if not np.isnan(row[t]) else last
                    row[t] = last
                else:
                    row[t] = 0.0
    d = np.clip(d, 0.0, 1.0)
    runs = []
    for row in d > BURST:
        n = 0
        for hot in row:
            if hot:
                n += 1
            elif n:
                runs.append(n)
                n = 0
        if n:
            runs.append(n)
    runs = np.array(runs)
    bursty = int(((d > BURST).sum(1) > 10).sum())
    total = d.sum(0)
    busy = np.where(total >= BUSY)[0]
    print(f"{len(pods)} pods, {minutes} sampling periods of {step:g} s (called minutes below)")
    print(f"bursts (duty > {BURST:.0%}): {len(runs)} runs, {(runs == 1).sum()} of one minute, {(runs == 2).sum()} of two, "
          f"{(runs >= 3).sum()} longer; {bursty} pods have more than 10 burst minutes")
    print("summed duty, GPUs' worth: p50 %.2f, p90 %.2f, p99 %.2f, max %.2f, mean %.2f"
          % (*np.percentile(total, [50, 90, 99]), total.max(), total.mean()))
    print(f"busy minutes (summed duty >= {BUSY:g}): {len(busy)}, between minute {busy.min()} and {busy.max()}")
    print("summed memory, max: %.2f GPUs of 80 GiB, %.2f of 96 GiB" % (m.sum(0).max() / 80, m.sum(0).max() / 96))
    # Do a pod's bursts come on a rhythm a predictor could learn? The
    # autocorrelation of its burst minutes, and the gaps between burst starts.
    hot = d > BURST
    often = np.where(hot.sum(1) > 10)[0]
    lags = (1, 2, 5, 10, 30, 60)
    corr = [np.mean([np.corrcoef(hot[i, :-k], hot[i, k:])[0, 1] for i in often]) for k in lags]
    gaps = []
    for i in often:
        t = np.where(hot[i])[0]
        starts = t[np.r_[True, np.diff(t) > 1]]
        gaps.append(np.median(np.diff(starts)))
    print("bursty pods: mean autocorrelation of burst minutes at lags %s: %s; median gap between burst starts per pod %.0f-%.0f minutes"
          % (", ".join(map(str, lags)), ", ".join("%.3f" % c for c in corr), min(gaps), max(gaps)))
    # Past levels as a forecast: of a pod's 15-minute windows with a burst,
    # how many follow a window with one (both windows wholly in its life).
    # Counted over every pair of consecutive windows wholly in a pod's life,
    # all pods together.
    w = WINDOW
    pairs = np.zeros((2, 2), dtype=int)  # [burst before][burst now]
    for i, (a, b) in enumerate(life):
        full = [k for k in range(minutes // w) if a <= k * w and (k + 1) * w - 1 <= b]
        has = {k: bool(hot[i, k * w:(k + 1) * w].any()) for k in full}
        for k in full:
            if (k - 1) in has:
                pairs[int(has[k - 1]), int(has[k])] += 1
    rate = lambda before: pairs[before, 1] / max(pairs[before].sum(), 1)
    print(f"{w}-minute windows of a pod after another of its windows: it bursts in {rate(1):.0%} of those after a "
          f"window with a burst ({pairs[1].sum()}) and {rate(0):.0%} of those after a quiet one ({pairs[0].sum()}); "
          f"of the {pairs[:, 1].sum()} with a burst, {pairs[0, 1] / max(pairs[:, 1].sum(), 1):.0%} follow a quiet window")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/genai-2026")
