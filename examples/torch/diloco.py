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
end the test accuracy and GeoCCL's bytes between regions.

With --elastic the ranks form an elastic group (geoccl/elastic.py): when
ranks die the others go on without them, SIGTERM makes a rank leave at the
end of its round, and a process started with --join enters the running
job at the next round boundary with the current weights:

    python3 examples/torch/diloco.py --elastic            # under torchrun, or per rank
    RANK=4 python3 examples/torch/diloco.py --elastic --join   # later, to join

Every rank then prints one line per round (its size and time) and, at the
end, a hash of its weights and whether every member's are bit-identical.
--elastic-etcd (GEOCCL_ELASTIC_ETCD) lets GeoCCL keep who is in the job in
etcd instead of the store of rank 0."""
import os
import time

import torch
import torch.distributed as dist

import common


def main(args, rank, world):
    if args.elastic:
        return main_elastic(args, rank, world)
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
        inner_steps(args, model, inner, xtr, ytr, per, g)
        # The ranks finish their inner steps at different times: meet
        # first, so that the all-reduce's time is the all-reduce's.
        dist.barrier()
        t1 = time.perf_counter()
        # pseudo-gradient, averaged over the ranks in one all-reduce
        pseudo_gradient(shared, model, flat)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(world)
        t2 = time.perf_counter()
        outer_step(flat, shared, model, outer)
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


def pseudo_gradient(shared, model, flat):
    """flat <- the shared weights minus this rank's, the round's pseudo-gradient."""
    off = 0
    for s, p in zip(shared, model.parameters()):
        flat[off:off + s.numel()].copy_((s - p.detach()).reshape(-1))
        off += s.numel()


def outer_step(flat, shared, model, outer):
    """The outer optimizer's step on the averaged pseudo-gradient in flat; the
    model starts the next round from the new shared weights."""
    off = 0
    for s in shared:
        s.grad = flat[off:off + s.numel()].view_as(s).clone()
        off += s.numel()
    outer.step()
    with torch.no_grad():
        for s, p in zip(shared, model.parameters()):
            p.copy_(s)


def inner_steps(args, model, inner, xtr, ytr, per, g):
    for _ in range(args.inner_steps):
        idx = torch.randint(0, len(ytr), (per,), generator=g)
        inner.zero_grad()
        torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        inner.step()


def main_elastic(args, rank, world):
    """The same training on an elastic group: the shared weights and the
    outer momentum are the state a joiner receives; the inner AdamW state
    stays each rank's own, as in DiLoCo."""
    import geoccl.elastic as elastic
    if args.elastic_etcd:
        os.environ["GEOCCL_ELASTIC_ETCD"] = args.elastic_etcd
        os.environ.setdefault("GEOCCL_ELASTIC_JOB", args.elastic_job)
    if args.join:
        common.setup(args, rank, world)
    else:
        common.init(args, rank, world)
    xtr, ytr, xte, yte = common.digits()
    model = common.mlp(args.hidden, args.seed)
    shared = [p.detach().clone() for p in model.parameters()]
    outer = torch.optim.SGD(shared, lr=args.outer_lr, momentum=0.9, nesterov=True)
    # The momentum exists from the start (SGD's first step from a zero
    # buffer equals its first step without one), so that a joiner has the
    # same tensors to receive.
    for s in shared:
        outer.state[s]["momentum_buffer"] = torch.zeros_like(s)
    inner = torch.optim.AdamW(model.parameters(), lr=args.inner_lr)

    def state():
        return shared + [outer.state[s]["momentum_buffer"] for s in shared]

    if args.join:
        el = elastic.Elastic.join(state, detect=args.detect)
    else:
        el = elastic.Elastic(state, detect=args.detect)
    with torch.no_grad():
        for s, p in zip(shared, model.parameters()):
            p.copy_(s)
    g = torch.Generator().manual_seed(args.seed + 1000 * rank + 7 * el.round)
    per = args.batch // world
    flat = torch.zeros(sum(p.numel() for p in shared))
    left = False
    while el.round < args.rounds:
        rnd = el.round + 1
        t0 = time.perf_counter()
        inner_steps(args, model, inner, xtr, ytr, per, g)
        el.barrier()
        t1 = time.perf_counter()
        pseudo_gradient(shared, model, flat)
        print("round %d: outer all-reduce at %.3f" % (rnd, time.time()), flush=True)
        counted = el.all_reduce(flat, average=True)
        rank_in, size_in = el.rank, el.size  # the group that ran it (end_round may grow it)
        t2 = time.perf_counter()
        outer_step(flat, shared, model, outer)
        if not el.end_round():
            left = True
            break
        t3 = time.perf_counter()
        print("round %d: rank %d of %d, %d counted, %.3f s (inner %.3f, all-reduce %.3f), "
              "ended at %.3f" % (rnd, rank_in, size_in, counted, t3 - t0, t1 - t0, t2 - t1,
                                 time.time()), flush=True)
        if el.rank == 0 and rnd % args.log_every == 0:
            print("round %3d  test accuracy %.4f" % (rnd, common.accuracy(model, xte, yte)),
                  flush=True)
    acc = common.accuracy(model, xte, yte)
    h = elastic.state_hash(state(), el.round)
    if left:
        print("left after round %d: test accuracy %.4f, state hash %016x" % (el.round, acc, h),
              flush=True)
    else:
        same = el.identical()
        print("final: rank %d of %d, round %d, test accuracy %.4f, state hash %016x, "
              "identical on every rank: %s" % (el.rank, el.size, el.round, acc, h,
                                                "yes" if same else "NO"), flush=True)
        el.barrier()  # rank 0 may host the store: nobody leaves before all are done
    el.close(finished=not left)
    if not args.join:
        dist.destroy_process_group()


if __name__ == "__main__":
    ap = common.arguments(__doc__)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--inner-steps", "-H", type=int, default=20)
    ap.add_argument("--batch", type=int, default=128, help="global batch (all ranks)")
    ap.add_argument("--inner-lr", type=float, default=1e-3)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--elastic", action="store_true",
                    help="an elastic group (geoccl.elastic): survive lost ranks, leave on "
                         "SIGTERM, admit --join processes between rounds")
    ap.add_argument("--join", action="store_true",
                    help="with --elastic: enter a running job (RANK: this process's data seed "
                         "and region label; MASTER_ADDR/PORT: the job's store)")
    ap.add_argument("--elastic-etcd", default=os.environ.get("GEOCCL_ELASTIC_ETCD", ""),
                    metavar="ENDPOINTS",
                    help="etcd endpoints (host:port,...) where GeoCCL keeps the job's members "
                         "(GEOCCL_ELASTIC_ETCD)")
    ap.add_argument("--elastic-job", default=os.environ.get("GEOCCL_ELASTIC_JOB", "diloco"),
                    help="the job's name in etcd (GEOCCL_ELASTIC_JOB)")
    ap.add_argument("--detect", type=float, default=1.0,
                    help="with --elastic: seconds without a beat before a silent rank is "
                         "taken for gone")
    common.launch(main, ap.parse_args())
