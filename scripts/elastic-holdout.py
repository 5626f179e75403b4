#!/usr/bin/env python3
"""Does the elastic fleet's tuning carry over to pods it was not tuned on?

Splits the genai-2026 pods at random into two halves (per seed), finds on
each half the `--fleet-*` setting of a small grid that needs the fewest
GPUs within the 1% violation budget, and evaluates that setting on the
other half, next to the other half's own best and the defaults.

Usage: python3 scripts/elastic-holdout.py [GENAI_DIR] [EGPU_BINARY]
(defaults: ../shared/data/genai-2026, target/release/egpu). Writes the
halves as CSV files for `egpu simulate --elastic --usage-duty/--usage-memory`
into a temporary directory. About 2 minutes on a 2-core machine.
"""
import csv
import gzip
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile

SEEDS = (1, 2, 3)
SIZES = (80, 96)
GRID = {
    "--fleet-mem-window": ("1", "2", "5", "10"),
    "--fleet-compute-quantile": ("0.3", "0.5", "0.8"),
    "--fleet-share": ("even", "reach", "equal"),
}
DEFAULTS = ("2", "0.5", "even")


def read(path):
    with gzip.open(path, "rt") as f:
        return [(r["container_ip"], r["timestamp_anon"], r["value"]) for r in csv.DictReader(f)]


def write(path, rows, pods):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("pod", "timestamp", "value"))
        w.writerows(r for r in rows if r[0] in pods)


def fleet(binary, half, size, setting):
    with tempfile.TemporaryDirectory() as out:
        # --lenient: genai-2026 has one pod with memory samples and no duty
        # samples; its duty counts as 0, as `--genai-dir` loads it.
        args = [binary, "simulate", "--elastic", "--no-progress", "--lenient", "--gpu-mem-gib", str(size), "--out", out,
                "--usage-duty", half + "/duty.csv", "--usage-memory", half + "/mem.csv"]
        for flag, value in zip(GRID, setting):
            args += [flag, value]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out + "/elastic.json") as f:
            e = json.load(f)[0]
    f = e["fleet"]
    return f["gpus"] if f["met"] else 10**9, dict(f["tried"])[f["gpus"]], e["lower_bound"]


def main(root, binary):
    duty = read(root + "/pod_gpu_duty_cycle_anon.csv.gz")
    mem = read(root + "/pod_gpu_memory_used_bytes_anon.csv.gz")
    pods = sorted({r[0] for r in duty + mem})
    settings = list(itertools.product(*GRID.values()))
    print("seed | GPU GiB | half | lower bound | defaults | own best (setting) | other half's best setting here")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in SEEDS:
            order = pods[:]
            random.Random(seed).shuffle(order)
            halves = {}
            for name, part in (("A", set(order[: len(order) // 2])), ("B", set(order[len(order) // 2:]))):
                d = os.path.join(tmp, f"{seed}{name}")
                os.makedirs(d)
                write(d + "/duty.csv", duty, part)
                write(d + "/mem.csv", mem, part)
                halves[name] = d
            for size in SIZES:
                res = {h: {s: fleet(binary, halves[h], size, s) for s in settings} for h in halves}
                # Fewest GPUs, then the fewest violations.
                best = {h: min(settings, key=lambda s: res[h][s][:2]) for h in halves}
                for h, other in (("A", "B"), ("B", "A")):
                    g, v, lb = res[h][DEFAULTS]
                    bg, bv, _ = res[h][best[h]]
                    og, ov, _ = res[h][best[other]]
                    print(f"{seed} | {size} | {h} | {lb} | {g} ({100 * v:.3f}%) | {bg} ({100 * bv:.3f}%; {' '.join(best[h])}) "
                          f"| {og} ({100 * ov:.3f}%; {' '.join(best[other])})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/genai-2026",
         sys.argv[2] if len(sys.argv) > 2 else "target/release/egpu")
