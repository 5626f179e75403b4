#!/usr/bin/env python3
"""Write a larger synthetic usage trace, as two Prometheus range-query JSON
files (dcgm-exporter metric names and labels), for timing
`egpu simulate --elastic --usage-duty ... --usage-memory ...` at scale.

Each synthetic pod copies one genai-2026 pod's duty cycle and memory, one
sample a minute, shifted in time by a seeded random offset (so the copies
do not burst together: this is a cost test, not a workload to draw
savings from).

Usage: python3 scripts/elastic-synthetic-trace.py OUT_DIR [PODS] [MINUTES] [GENAI_DIR]
(defaults 500 pods, 2,880 minutes, ../shared/data/genai-2026). Needs numpy.
"""
import csv
import gzip
import json
import os
import sys

import numpy as np


def series(path, scale):
    by_pod = {}
    with gzip.open(path, "rt") as f:
        for r in csv.DictReader(f):
            by_pod.setdefault(r["container_ip"], []).append((float(r["timestamp_anon"]), float(r["value"]) * scale))
    return by_pod


def main(out, pods=500, minutes=2880, root="../shared/data/genai-2026"):
    duty = series(f"{root}/pod_gpu_duty_cycle_anon.csv.gz", 1.0)
    mem = series(f"{root}/pod_gpu_memory_used_bytes_anon.csv.gz", 1 / 2**20)
    names = sorted(set(duty) & set(mem))
    rng = np.random.default_rng(1)
    result = {"DCGM_FI_DEV_GPU_UTIL": [], "DCGM_FI_DEV_FB_USED": []}
    for i in range(pods):
        src = names[rng.integers(len(names))]
        offset = int(rng.integers(minutes))
        labels = {"namespace": "synthetic", "pod": f"p{i}", "gpu": "0", "Hostname": f"node{i // 8}"}
        for metric, data, fmt in (("DCGM_FI_DEV_GPU_UTIL", duty, "%.1f"), ("DCGM_FI_DEV_FB_USED", mem, "%.0f")):
            v = np.array([x for _, x in sorted(data[src])])
            v = np.resize(v, minutes + offset)[offset:offset + minutes]
            values = [[1_700_000_000 + 60 * k, fmt % x] for k, x in enumerate(v)]
            result[metric].append({"metric": dict(labels, __name__=metric), "values": values})
    os.makedirs(out, exist_ok=True)
    for metric, name in (("DCGM_FI_DEV_GPU_UTIL", "duty.json"), ("DCGM_FI_DEV_FB_USED", "mem.json")):
        with open(os.path.join(out, name), "w") as f:
            json.dump({"status": "success", "data": {"resultType": "matrix", "result": result[metric]}}, f)
    print(f"{pods} pods x {minutes} minutes in {out}/duty.json and {out}/mem.json")


if __name__ == "__main__":
    a = sys.argv[1:]
    if not a:
        sys.exit(__doc__)
    main(a[0], *(int(x) for x in a[1:3]), *a[3:4])
