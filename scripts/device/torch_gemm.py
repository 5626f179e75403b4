#!/usr/bin/env python3
"""A PyTorch GEMM loop for the hook-overhead check of scripts/device-check.sh.

  torch_gemm.py ITERS SYNC_EVERY SIZE REPS
runs REPS repetitions (after a warm-up) of ITERS SIZExSIZE fp16 matmuls with
torch.cuda.synchronize() every SYNC_EVERY, and prints one JSON object with
each repetition's wall time; the check compares the median natively and
under libegpu.so.
"""
import json
import statistics
import sys
import time


def main():
    import torch
    iters, sync_every, n, reps = (int(x) for x in sys.argv[1:5])
    dev = torch.device("cuda:0")
    a = torch.randn(n, n, dtype=torch.float16, device=dev)
    b = torch.randn(n, n, dtype=torch.float16, device=dev)
    for _ in range(200):
        c = a @ b
    torch.cuda.synchronize()
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(iters):
            c = a @ b
            if (i + 1) % sync_every == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    del c
    print(json.dumps({"iters": iters, "sync_every": sync_every, "size": n, "reps": reps,
                      "wall_s": [round(w, 5) for w in walls], "median_s": round(statistics.median(walls), 5),
                      "min_s": round(min(walls), 5), "torch": torch.__version__, "cuda": torch.version.cuda}), flush=True)


if __name__ == "__main__":
    main()
