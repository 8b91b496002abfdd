"""One rank of a multi-host recipe (docs/multi-host.md), started by torchrun
as `train.py` would be: a geoccl process group from torchrun's env://, an
all-reduce checked exactly, one DDP step whose parameters must come out the
same on every rank, and one line for the test to read:

    recipe-ok rank R of N host H bytes_wan B

B (GeoCCL's bytes sent between regions) says whether this rank found other
regions.  Exits 1, saying what differed, on any mismatch.
"""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import geoccl.torch


def fail(rank, what):
    print(f"recipe-FAIL rank {rank}: {what}", flush=True)
    sys.exit(1)


def main():
    dist.init_process_group("geoccl")
    rank, n = dist.get_rank(), dist.get_world_size()

    # Integers in float32 and int64: every partial sum is exact, so the
    # result must equal the formula bit for bit whatever order GeoCCL adds in.
    count = 100003
    idx = torch.arange(count, dtype=torch.int64)
    f = ((idx * 7 + rank * 13) % 1001 - 500).to(torch.float32)
    want_f = sum(((idx * 7 + r * 13) % 1001 - 500) for r in range(n)).to(torch.float32)
    dist.all_reduce(f)
    if not torch.equal(f, want_f):
        bad = int((f != want_f).sum())
        fail(rank, f"float32 all-reduce: {bad} of {count} elements differ")
    i = idx * (rank + 1)
    dist.all_reduce(i)
    if not torch.equal(i, idx * (n * (n + 1) // 2)):
        fail(rank, "int64 all-reduce differs")

    # One DDP step: each rank's batch differs, the averaged gradients and so
    # the parameters after the step must be the same everywhere.
    torch.manual_seed(0)
    model = nn.Linear(64, 8)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1000 + rank)
    x, y = torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(every, flat)
    for r, other in enumerate(every):
        if not torch.equal(other, flat):
            fail(rank, f"parameters after the DDP step differ from rank {r}'s")

    wan = geoccl.torch.backend().stats()["bytes_wan"]
    print(f"recipe-ok rank {rank} of {n} host {socket.gethostname()} bytes_wan {wan}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
