"""Data-parallel training of a small MLP on sklearn's digits with
DistributedDataParallel over the geoccl or the gloo backend.

    PYTHONPATH=<build dir> python3 examples/torch/ddp_digits.py --backend geoccl
    PYTHONPATH=<build dir> torchrun --nproc_per_node 4 examples/torch/ddp_digits.py

Each step takes a global batch, each rank its slice; rank 0 prints the mean
time per step (after the first 10) and the test accuracy."""
import time

import torch
import torch.distributed as dist

import common


def main(args, rank, world):
    common.init(args, rank, world)
    xtr, ytr, xte, yte = common.digits()
    model = torch.nn.parallel.DistributedDataParallel(common.mlp(args.hidden, args.seed))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    g = torch.Generator().manual_seed(args.seed)  # the same global batches everywhere
    per = args.batch // world
    times = []
    for step in range(args.steps):
        idx = torch.randint(0, len(ytr), (args.batch,), generator=g)[rank * per:(rank + 1) * per]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        times.append(time.perf_counter() - t0)
        if rank == 0 and (step + 1) % args.log_every == 0:
            print("step %4d  loss %.4f  %.2f ms/step" % (
                step + 1, loss.item(), 1e3 * sum(times[-args.log_every:]) / args.log_every),
                flush=True)
    acc = common.accuracy(model.module, xte, yte)
    steady = times[10:] or times
    if rank == 0:
        print("backend %s  ranks %d  steps %d  batch %d  hidden %d: %.2f ms/step, "
              "test accuracy %.4f" % (args.backend, world, args.steps, args.batch, args.hidden,
                                      1e3 * sum(steady) / len(steady), acc), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = common.arguments(__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=128, help="global batch (all ranks)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--log-every", type=int, default=100)
    common.launch(main, ap.parse_args())
