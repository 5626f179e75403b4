#!/usr/bin/env python3
"""PyTorch under libegpu.so (run inside a slice by scripts/device-check.sh).

Subcommands, each printing one JSON object per line:
  view LIMIT        torch.cuda.mem_get_info() total must equal LIMIT bytes
  oom               a tensor larger than what is left raises OutOfMemoryError,
                    one that fits succeeds
  fill CHUNK        allocate CHUNK-byte tensors until OOM (for the
                    expandable_segments / VMM path); report the total
  resize STEP       allocate STEP-byte tensors until OOM, print "blocked",
                    wait for a line on stdin (the script resizes the slice),
                    then retry once and report whether it succeeded
"""
import json
import sys
import time


def out(**kw):
    print(json.dumps(kw), flush=True)


def main():
    import torch
    cmd = sys.argv[1]
    dev = torch.device("cuda:0")
    torch.cuda.init()
    if cmd == "view":
        free, total = torch.cuda.mem_get_info(0)
        out(check="view", free=free, total=total, ok=total == int(sys.argv[2]))
    elif cmd == "oom":
        free, total = torch.cuda.mem_get_info(0)
        big = free + (256 << 20)
        raised = False
        try:
            torch.empty(big, dtype=torch.uint8, device=dev)
        except torch.cuda.OutOfMemoryError:
            raised = True
        torch.cuda.empty_cache()
        free2, _ = torch.cuda.mem_get_info(0)
        small = max(free2 - (256 << 20), 1 << 20)
        fits = True
        try:
            t = torch.empty(small, dtype=torch.uint8, device=dev)
            t.fill_(1)
            torch.cuda.synchronize()
            del t
        except torch.cuda.OutOfMemoryError:
            fits = False
        out(check="oom", free=free, total=total, too_big=big, raised=raised, fits_bytes=small, fits=fits, ok=raised and fits)
    elif cmd == "fill":
        chunk = int(sys.argv[2])
        held = []
        try:
            while len(held) < 100000:
                held.append(torch.empty(chunk, dtype=torch.uint8, device=dev))
        except torch.cuda.OutOfMemoryError:
            pass
        free, total = torch.cuda.mem_get_info(0)
        reserved = torch.cuda.memory_reserved(0)
        out(check="fill", chunks=len(held), bytes=len(held) * chunk, reserved=reserved, free=free, total=total)
    elif cmd == "resize":
        step = int(sys.argv[2])
        held = []
        try:
            while len(held) < 100000:
                held.append(torch.empty(step, dtype=torch.uint8, device=dev))
        except torch.cuda.OutOfMemoryError:
            pass
        out(event="blocked", bytes=len(held) * step)
        sys.stdin.readline()
        t0 = time.monotonic_ns()
        ok = False
        for _ in range(2000):
            try:
                held.append(torch.empty(step, dtype=torch.uint8, device=dev))
                ok = True
                break
            except torch.cuda.OutOfMemoryError:
                time.sleep(0.001)
        out(check="resize", ok=ok, retry_ns=time.monotonic_ns() - t0, bytes=len(held) * step)
    else:
        raise SystemExit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()
