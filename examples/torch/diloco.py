"""DiLoCo-style training of a small MLP on sklearn's digits: every rank
takes H local steps (inner AdamW) on its own data, then the ranks average
their pseudo-gradients (the start-of-round weights minus their own) with
one all-reduce, and an outer Nesterov SGD step moves the shared weights.

    PYTHONPATH=<build dir> python3 examples/torch/diloco.py --backend geoccl
    GEOCCL_COMPRESS=int8 PYTHONPATH=<build dir> python3 examples/torch/diloco.py --regions 2

Communication is one all-reduce of all parameters per round, H times less
often than data-parallel training. With --regions 2 (or real regions), the
all-reduce crosses GeoCCL's WAN path, where GEOCCL_COMPRESS (e.g. int8)
compresses the pseudo-gradients (error feedback included). Rank 0 prints
per round the time of the H inner steps (with the wait for the slowest
rank) and of the all-reduce, and at the
end the test accuracy and GeoCCL's bytes between regions."""
import time

import torch
import torch.distributed as dist

import common


def main(args, rank, world):
    common.init(args, rank, world)
    xtr, ytr, xte, yte = common.digits()
    model = common.mlp(args.hidden, args.seed)  # the same start on every rank
    shared = [p.detach().clone() for p in model.parameters()]
    outer = torch.optim.SGD(shared, lr=args.outer_lr, momentum=0.9, nesterov=True)
    inner = torch.optim.AdamW(model.parameters(), lr=args.inner_lr)
    g = torch.Generator().manual_seed(args.seed + 1000 * rank)  # each rank its own data
    per = args.batch // world
    flat = torch.zeros(sum(p.numel() for p in shared))
    # flat is the pseudo-gradient of every round: its error-feedback
    # residuals (GEOCCL_COMPRESS lossy) are kept for it
    reg = None
    if args.backend == "geoccl":
        import geoccl.torch
        reg = geoccl.torch.register_error_feedback(flat)
    t_inner = t_comm = 0.0
    for rnd in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.inner_steps):
            idx = torch.randint(0, len(ytr), (per,), generator=g)
            inner.zero_grad()
            torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            inner.step()
        # The ranks finish their inner steps at different times: meet
        # first, so that the all-reduce's time is the all-reduce's.
        dist.barrier()
        t1 = time.perf_counter()
        # pseudo-gradient, averaged over the ranks in one all-reduce
        off = 0
        for s, p in zip(shared, model.parameters()):
            flat[off:off + s.numel()].copy_((s - p.detach()).reshape(-1))
            off += s.numel()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(world)
        t2 = time.perf_counter()
        off = 0
        for s in shared:
            s.grad = flat[off:off + s.numel()].view_as(s).clone()
            off += s.numel()
        outer.step()
        with torch.no_grad():
            for s, p in zip(shared, model.parameters()):
                p.copy_(s)
        t_inner += t1 - t0
        t_comm += t2 - t1
        if rank == 0 and (rnd + 1) % args.log_every == 0:
            print("round %3d  inner %.1f ms  all-reduce %.2f ms  test accuracy %.4f" % (
                rnd + 1, 1e3 * (t1 - t0), 1e3 * (t2 - t1), common.accuracy(model, xte, yte)),
                flush=True)
    acc = common.accuracy(model, xte, yte)
    wan = ""
    if args.backend == "geoccl":
        import geoccl.torch
        pg = geoccl.torch.backend()
        st = pg.stats()
        wan = ", codec %s, %d bytes to other regions (%d uncompressed)" % (
            pg.compression(), st["bytes_wan"], st["bytes_wan_raw"])
    if rank == 0:
        print("backend %s  ranks %d  regions %d  H %d  rounds %d: %.2f ms inner per round, "
              "%.2f ms all-reduce per round, test accuracy %.4f%s" % (
                  args.backend, world, args.regions, args.inner_steps, args.rounds,
                  1e3 * t_inner / args.rounds, 1e3 * t_comm / args.rounds, acc, wan), flush=True)
    if reg is not None:
        reg.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = common.arguments(__doc__)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--inner-steps", "-H", type=int, default=20)
    ap.add_argument("--batch", type=int, default=128, help="global batch (all ranks)")
    ap.add_argument("--inner-lr", type=float, default=1e-3)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--log-every", type=int, default=10)
    common.launch(main, ap.parse_args())
