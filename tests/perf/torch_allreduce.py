"""Time torch.distributed.all_reduce of one float32 tensor over a backend,
for tests/perf/bench_torch_wan.sh: what the geoccl backend adds to
GeoCCL's own all-reduce (geoccl-perf on the same links), and Gloo's time.

    RANK=r WORLD_SIZE=N MASTER_ADDR=A MASTER_PORT=P \\
        python3 tests/perf/torch_allreduce.py --backend geoccl --mib 64

Rank 0 prints "torch_allreduce BACKEND MiB: median S s (runs S S ...)"
after --warmup untimed calls; every result is checked (the sum of the
ranks' values 1..N is exact in float32)."""
import argparse
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", choices=["geoccl", "gloo"], default="geoccl")
    ap.add_argument("--mib", type=float, default=64)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    if a.backend == "geoccl":
        import geoccl.torch  # noqa: F401  registers the backend
    dist.init_process_group(a.backend, init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    n = int(a.mib * (1 << 20)) // 4
    x = torch.empty(n, dtype=torch.float32)
    want = float(world * (world + 1) // 2)
    times = []
    for i in range(a.warmup + a.iters):
        x.fill_(rank + 1)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        t = time.perf_counter() - t0
        bad = int((x != want).sum().item())
        if bad:
            raise SystemExit("rank %d: %d of %d elements wrong after all_reduce" % (rank, bad, n))
        if i >= a.warmup:
            times.append(t)
    if rank == 0:
        print("torch_allreduce %s %g MiB: median %.3f s (runs %s)" % (
            a.backend, a.mib, statistics.median(times), " ".join("%.3f" % t for t in times)),
            flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
