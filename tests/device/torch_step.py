"""Two-process data-parallel training step with PyTorch on one GPU, run by
tests/device/run.sh with LD_PRELOAD=libgeoccl.so: ProcessGroupNCCL's
communicator is GeoCCL's.  Each rank is its own region (GEOCCL_REGION), so
collectives take GeoCCL's cross-region device path (two ranks on one GPU
cannot share one NVIDIA NCCL communicator).

    torch_step.py [manual|ddp]

manual (default): the gradient all-reduce is done by hand, as DDP's reducer
does it.  ddp: torch.nn.parallel.DistributedDataParallel itself (its
constructor broadcasts the module state, which takes GeoCCL's staged
cross-region broadcast).  Prints PASS/FAIL and the step time."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, port, q, mode):
    os.environ["GEOCCL_REGION"] = "r%d" % rank
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).cuda()
    if mode == "ddp":
        # different initial weights per rank: DDP's broadcast must fix them
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * rank)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)
    x = torch.randn(64, 256, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    ok = True
    times = []
    for step in range(5):
        t0 = time.time()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if mode != "ddp":
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= world
        opt.step()
        torch.cuda.synchronize()
        times.append(time.time() - t0)
    # every rank must hold the same parameters
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = flat.sum().double()
    t = torch.tensor([gathered.item()], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    t2 = torch.tensor([-gathered.item()], device="cuda", dtype=torch.float64)
    dist.all_reduce(t2, op=dist.ReduceOp.MAX)
    if abs(t.item() + t2.item()) > 1e-6 * max(1.0, abs(t.item())):
        ok = False
    q.put((rank, ok, min(times[1:]), float(loss)))
    dist.destroy_process_group()


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "manual"
    if mode not in ("manual", "ddp"):
        print("usage: torch_step.py [manual|ddp]")
        return 2
    world = 2
    port = 29500 + os.getpid() % 1000
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, q, mode)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=150)
    res = []
    while not q.empty():
        res.append(q.get())
    good = len(res) == world and all(r[1] for r in res) and all(p.exitcode == 0 for p in procs)
    for r in sorted(res):
        print("  rank %d: params agree %s, step %.2f ms, loss %.4f" % (r[0], r[1], r[2] * 1e3, r[3]))
    print("%s: torch two-process data-parallel step (%s) through GeoCCL (torch %s)"
          % ("PASS" if good else "FAIL", mode, torch.__version__))
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
