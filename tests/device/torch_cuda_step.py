"""The torch backend's CUDA path on one GPU, run by tests/device/run.sh:
N processes (default 3) share GPU 0, each its own region (GEOCCL_REGION),
with the default process group on backend "geoccl" and a Gloo group beside
it.  Checked against Gloo in the same processes:

  all_reduce: a CUDA tensor (sum, then avg of 1 Mi floats) on "geoccl"
      against the same values on the CPU through Gloo;
  ddp: one DistributedDataParallel step of a small model on CUDA tensors
      (its constructor broadcasts the state, its reducer all-reduces the
      gradients through "geoccl"), against the gradients each rank computes
      without DDP and averages through Gloo.

    torch_cuda_step.py [NPROCS [cuda|cpu]]

cpu runs the same steps on CPU tensors (GeoCCL's host path): a check of
this script where no GPU is.  Prints PASS/FAIL per check and the times; exit 0 only when all passed.
Needs geoccl (the bundle's python/ on PYTHONPATH) and torch with CUDA."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def worker(rank, world, port, q, dev):
    os.environ["GEOCCL_REGION"] = "r%d" % rank
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import geoccl.torch  # noqa: F401  registers the backend
    if dev == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("geoccl", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    res = {}
    # all_reduce on CUDA against Gloo on the CPU (integers: exact).
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(-1000, 1000, (1 << 20,), generator=g).float()
    xc = x.clone().to(dev)
    sync()
    t0 = time.time()
    dist.all_reduce(xc)
    sync()
    res["all_reduce_ms"] = (time.time() - t0) * 1e3
    ref = x.clone()
    dist.all_reduce(ref, group=gloo)
    res["all_reduce"] = torch.equal(xc.cpu(), ref)
    ya = x.clone().to(dev)
    dist.all_reduce(ya, op=dist.ReduceOp.AVG)
    res["all_reduce_avg"] = torch.allclose(ya.cpu(), ref / world, rtol=1e-6, atol=1e-4)
    # One DDP step against gradients averaged through Gloo.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(dev)
    plain = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(dev)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():  # different start per rank: DDP's broadcast must fix it
        for p in model.parameters():
            p.add_(0.01 * rank)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[0] if dev == "cuda" else None)
    torch.manual_seed(100 + rank)
    xb = torch.randn(64, 256, device=dev)
    yb = torch.randint(0, 10, (64,), device=dev)
    sync()
    t0 = time.time()
    torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
    sync()
    res["ddp_ms"] = (time.time() - t0) * 1e3
    torch.nn.functional.cross_entropy(plain(xb), yb).backward()
    ok = True
    for pd, pp in zip(model.parameters(), plain.parameters()):
        gr = pp.grad.detach().cpu()
        dist.all_reduce(gr, group=gloo)
        gr /= world
        if not torch.allclose(pd.grad.detach().cpu(), gr, rtol=1e-4, atol=1e-6):
            ok = False
    res["ddp"] = ok
    q.put((rank, res))
    dist.destroy_process_group()


def main():
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    dev = sys.argv[2] if len(sys.argv) > 2 else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("FAIL: torch %s sees no CUDA device" % torch.__version__)
        return 1
    port = 29500 + os.getpid() % 1000
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, q, dev)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=150)
    res = []
    while not q.empty():
        res.append(q.get())
    good = len(res) == world and all(p.exitcode == 0 for p in procs)
    for rank, r in sorted(res):
        print("  rank %d: all_reduce sum %s (%.1f ms), avg %s; ddp step %s (%.1f ms)"
              % (rank, r["all_reduce"], r["all_reduce_ms"], r["all_reduce_avg"], r["ddp"],
                 r["ddp_ms"]))
        good = good and r["all_reduce"] and r["all_reduce_avg"] and r["ddp"]
    print("%s: torch backend \"geoccl\" on %s tensors, %d processes%s, against Gloo (torch %s)"
          % ("PASS" if good else "FAIL", dev.upper(), world, " on one GPU" if dev == "cuda" else "",
             torch.__version__))
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
