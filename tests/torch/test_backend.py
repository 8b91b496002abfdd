"""The geoccl torch.distributed backend against Gloo, 4 processes on loopback.

Each test spawns WORLD processes; each process forms a geoccl group and a
Gloo group over the same ranks and checks every result of geoccl against
what Gloo gives for the same inputs (or, for the calls Gloo lacks, against
Gloo's all-reduce of the same data). Run by tests/torch/run_torch.sh with
PYTHONPATH set to the build tree.
"""
import datetime
import os
import sys
import tempfile
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int32, torch.int64, torch.uint8, torch.int8]
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
TORCH1 = torch.__version__.startswith("1.")


# ---------------------------------------------------------------- harness

def _child(fn, rank, world, init, env, q):
    try:
        os.environ.update(env)
        import geoccl.torch  # noqa: F401  registers the backend
        hard_exit = fn(rank, world, init)
        q.put((rank, None))
        if hard_exit:  # its group's peers are gone: no clean shutdown
            q.close()
            q.join_thread()
            os._exit(0)
    except BaseException:  # the parent prints it
        q.put((rank, traceback.format_exc()))
        sys.exit(1)


def _stacks(rank, pid):
    """Where a hung rank is: every thread's native stack (gdb, where the
    machine has it and may attach), so that a hang seen once says where."""
    import shutil
    import subprocess
    gdb = shutil.which("gdb")
    if gdb is None:
        return ""
    try:
        out = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex",
                              "thread apply all bt 30"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return "\nrank %d: no stacks (%s)" % (rank, e)
    keep = [ln for ln in out.splitlines() if ln.startswith(("Thread ", "#"))]
    return "\nrank %d (pid %d), its threads:\n%s" % (rank, pid, "\n".join(keep[:400]))


def run_ranks(fn, init, env=None, timeout=90, expect_exit=None):
    """Runs fn(rank, world, init) in WORLD spawned processes; fails with the
    tracebacks of the ranks that failed. expect_exit: {rank: exit code} of
    ranks that are meant to die without reporting."""
    expect_exit = expect_exit or {}
    env = dict(env or {})
    env.setdefault("GEOCCL_SOCKET_IFNAME", "lo")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, WORLD, init, env, q))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    deadline = time.time() + timeout
    reports = {}
    while len(reports) < WORLD - len(expect_exit) and time.time() < deadline:
        try:
            rank, err = q.get(timeout=1)
            reports[rank] = err
        except Exception:
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(max(1, deadline - time.time()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    stacks = "".join(_stacks(r, procs[r].pid) for r in hung)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, "ranks %s still ran after %d s (hang)%s" % (hung, timeout, stacks)
    failed = {r: e for r, e in reports.items() if e}
    assert not failed, "\n".join("rank %d:\n%s" % kv for kv in sorted(failed.items()))
    for r, code in expect_exit.items():
        assert procs[r].exitcode == code, "rank %d exited %s, not %d" % (
            r, procs[r].exitcode, code)
    missing = [r for r in range(WORLD) if r not in reports and r not in expect_exit]
    assert not missing, "ranks %s reported nothing (exit codes %s)" % (
        missing, [p.exitcode for p in procs])


def file_init(tmp_path):
    return {"kind": "file", "path": str(tmp_path / "store")}


def env_init():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return {"kind": "env", "port": port}


def init_groups(rank, world, init):
    """The default group is geoccl; returns (geoccl group, gloo group)."""
    if init["kind"] == "file":
        store = dist.FileStore(init["path"], world)
        kw = {"device_id": torch.device(init["device"])} if init.get("device") else {}
        dist.init_process_group("geoccl", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60), **kw)
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(init["port"]),
                          RANK=str(rank), WORLD_SIZE=str(world))
        dist.init_process_group("geoccl", init_method="env://",
                                timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend() == "geoccl"
    gloo = dist.new_group(backend="gloo")
    return dist.group.WORLD, gloo


# ------------------------------------------------------------ the inputs

def data(rank, n, dtype, strided, salt=0):
    """Small integers (exact in every dtype, products of WORLD of them fit
    int8), different on every rank; strided: a non-contiguous view."""
    v = (torch.arange(n, dtype=torch.int64) * 7 + rank + salt) % 3 + 1
    v = v.to(dtype)
    if strided:
        base = torch.zeros(n, 2, dtype=dtype)
        base[:, 1] = v
        v = base[:, 1]
        assert n < 2 or not v.is_contiguous()
    return v


def empty(n, dtype, strided):
    if strided:
        return torch.full((n, 3), 99, dtype=dtype)[:, 2]
    return torch.full((n,), 99, dtype=dtype)


def same(a, b, what):
    assert a.dtype == b.dtype, what
    assert torch.equal(a, b), "%s:\ngeoccl %s\ngloo   %s" % (what, a, b)


def gloo_takes(fn):
    """Runs fn (a Gloo call); False when Gloo does not take its dtype."""
    try:
        fn()
        return True
    except RuntimeError as e:
        if "upported" in str(e) or "type" in str(e).lower():
            return False
        raise


# ------------------------------------------------------------- scenarios

REDUCE_OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]


def check_all_reduce(rank, world, geo, gloo, dtype, strided):
    n = 37
    for op in REDUCE_OPS:
        a = data(rank, n, dtype, strided)
        b = a.clone()
        dist.all_reduce(a, op=op, group=geo)
        if not gloo_takes(lambda: dist.all_reduce(b, op=op, group=gloo)):
            # Gloo lacks this dtype: its result in int64
            c = data(rank, n, torch.int64, False)
            dist.all_reduce(c, op=op, group=gloo)
            b = c.to(dtype)
        same(a, b, "all_reduce %s %s strided=%s" % (op, dtype, strided))
    # AVG (Gloo has none): Gloo's sum over the ranks; integers divide as
    # NCCL's ncclAvg does, rounding toward zero
    a = data(rank, n, dtype, strided)
    dist.all_reduce(a, op=dist.ReduceOp.AVG, group=geo)
    c = data(rank, n, torch.float64, False)
    dist.all_reduce(c, group=gloo)
    want = (c / world) if dtype in FLOATS else torch.trunc(c / world)
    same(a, want.to(dtype), "all_reduce AVG %s" % dtype)
    # PREMUL_SUM (what FSDP and DDP's pre-divide ask NCCL for): the sum of
    # factor x input, the factor a float or a one-element tensor. Gloo has
    # none: Gloo's sum of the inputs pre-multiplied, exact here (0.5 times
    # small integers); also through reduce and reduce_scatter. Integer
    # tensors are refused, as by NCCL's backend.
    f = 0.5
    if dtype not in FLOATS:
        with pytest.raises(RuntimeError, match="PREMUL_SUM needs a floating-point"):
            dist.all_reduce(data(rank, n, dtype, strided), op=dist._make_nccl_premul_sum(f),
                            group=geo)
        return
    # the factor tensor: a list of one with torch 1.x, the tensor with 2.x
    tf = torch.tensor([f], dtype=torch.float64)
    for op in (dist._make_nccl_premul_sum(f),
               dist._make_nccl_premul_sum([tf] if TORCH1 else tf)):
        a = data(rank, n, dtype, strided)
        dist.all_reduce(a, op=op, group=geo)
        c = data(rank, n, torch.float64, False) * f
        dist.all_reduce(c, group=gloo)
        same(a, c.to(dtype), "all_reduce PREMUL_SUM %s %s" % (f, dtype))
        a = data(rank, n, dtype, strided)
        dist.reduce(a, dst=world - 1, op=op, group=geo)
        if rank == world - 1:
            same(a, c.to(dtype), "reduce PREMUL_SUM %s %s" % (f, dtype))
        out = empty(3, dtype, False)
        dist.reduce_scatter(out, [data(rank, 3, dtype, False, salt=q) for q in range(world)],
                            op=op, group=geo)
        for q in range(world):  # the reduced input q, which rank q keeps
            c = data(rank, 3, torch.float64, False, salt=q) * f
            dist.all_reduce(c, group=gloo)
            if q == rank:
                same(out, c.to(dtype), "reduce_scatter PREMUL_SUM %s %s" % (f, dtype))


def check_others(rank, world, geo, gloo, dtype, strided):
    n = 11

    # broadcast from rank 1
    a = data(rank, n, dtype, strided)
    dist.broadcast(a, src=1, group=geo)
    same(a, data(1, n, dtype, strided), "broadcast %s" % dtype)

    # all_gather into a list, against Gloo's
    outs = [empty(n, dtype, strided) for _ in range(world)]
    dist.all_gather(outs, data(rank, n, dtype, strided), group=geo)
    ref = [torch.zeros(n, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(ref, data(rank, n, torch.int64, False), group=gloo)
    for i in range(world):
        same(outs[i], ref[i].to(dtype), "all_gather %s part %d" % (dtype, i))

    # all_gather into one tensor
    one = torch.full((world * n,), 99, dtype=dtype)
    dist._all_gather_base(one, data(rank, n, dtype, strided), group=geo)
    same(one, torch.cat(ref).to(dtype), "_all_gather_base %s" % dtype)

    # reduce_scatter: Gloo has none; its all-reduce of the same inputs
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        ins = [data(rank, n, dtype, strided, salt=i) for i in range(world)]
        out = empty(n, dtype, strided)
        dist.reduce_scatter(out, ins, op=op, group=geo)
        full = torch.cat([data(rank, n, torch.int64, False, salt=i) for i in range(world)])
        dist.all_reduce(full, op=op, group=gloo)
        want = full[rank * n:(rank + 1) * n].to(dtype)
        same(out, want, "reduce_scatter %s %s" % (op, dtype))
        out2 = torch.full((n,), 99, dtype=dtype)
        dist._reduce_scatter_base(out2, torch.cat(ins), op=op, group=geo)
        same(out2, want, "_reduce_scatter_base %s %s" % (op, dtype))

    # reduce to rank 2
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN):
        a = data(rank, n, dtype, strided)
        dist.reduce(a, dst=2, op=op, group=geo)
        b = data(rank, n, torch.int64, False)
        dist.reduce(b, dst=2, op=op, group=gloo)
        if rank == 2:
            same(a, b.to(dtype), "reduce %s %s" % (op, dtype))

    # gather to rank 3, scatter from rank 0, against Gloo's
    outs = [empty(n, dtype, strided) for _ in range(world)] if rank == 3 else None
    dist.gather(data(rank, n, dtype, strided), outs, dst=3, group=geo)
    gref = [torch.zeros(n, dtype=torch.int64) for _ in range(world)] if rank == 3 else None
    dist.gather(data(rank, n, torch.int64, False), gref, dst=3, group=gloo)
    if rank == 3:
        for i in range(world):
            same(outs[i], gref[i].to(dtype), "gather %s part %d" % (dtype, i))
    ins = [data(i, n, dtype, strided, salt=5) for i in range(world)] if rank == 0 else None
    out = empty(n, dtype, strided)
    dist.scatter(out, ins, src=0, group=geo)
    sins = [data(i, n, torch.int64, False, salt=5) for i in range(world)] if rank == 0 else None
    sref = torch.zeros(n, dtype=torch.int64)
    dist.scatter(sref, sins, src=0, group=gloo)
    same(out, sref.to(dtype), "scatter %s" % dtype)

    # all_to_all_single, equal and uneven splits, against Gloo's
    inp = data(rank, world * 3, dtype, strided)
    out = torch.full((world * 3,), 99, dtype=dtype)
    dist.all_to_all_single(out, inp, group=geo)
    ref = torch.zeros(world * 3, dtype=torch.int64)
    dist.all_to_all_single(ref, data(rank, world * 3, torch.int64, False), group=gloo)
    same(out, ref.to(dtype), "all_to_all_single %s" % dtype)
    in_splits = [(rank + p) % 3 for p in range(world)]       # what rank sends to p
    out_splits = [(p + rank) % 3 for p in range(world)]      # what p sends to rank
    inp = data(rank, sum(in_splits), dtype, False, salt=1)
    out = torch.full((sum(out_splits),), 99, dtype=dtype)
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=geo)
    ref = torch.zeros(sum(out_splits), dtype=torch.int64)
    dist.all_to_all_single(ref, data(rank, sum(in_splits), torch.int64, False, salt=1),
                           out_splits, in_splits, group=gloo)
    same(out, ref.to(dtype), "all_to_all_single uneven %s" % dtype)

    # all_to_all of lists (Gloo has none): part p of rank q is q's data(salt=p)
    ins = [data(rank, p + 1, dtype, strided, salt=p) for p in range(world)]
    outs = [empty(rank + 1, dtype, strided) for _ in range(world)]
    dist.all_to_all(outs, ins, group=geo)
    for q in range(world):
        same(outs[q], data(q, rank + 1, dtype, False, salt=rank), "all_to_all %s from %d" % (dtype, q))

    # send/recv around the ring (even ranks send first)
    right, left = (rank + 1) % world, (rank - 1) % world
    mine, got = data(rank, n, dtype, strided, salt=9), empty(n, dtype, strided)
    if rank % 2 == 0:
        dist.send(mine, right, group=geo)
        dist.recv(got, left, group=geo)
    else:
        dist.recv(got, left, group=geo)
        dist.send(mine, right, group=geo)
    same(got, data(left, n, dtype, False, salt=9), "send/recv %s" % dtype)


def check_async_order(rank, world, geo):
    """Work objects return at once and complete in call order."""
    ts = [torch.full((1000,), float(rank + i)) for i in range(20)]
    works = [dist.all_reduce(t, group=geo, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    for w in reversed(works):
        w.wait()
    for i, t in enumerate(ts):
        assert torch.all(t == sum(r + i for r in range(world))), i
    for f in futs:
        assert f.done()
        assert isinstance(f.value(), list) and f.value()[0].numel() == 1000


def check_invalid(rank, world, geo):
    def raises(fn, text):
        with pytest.raises((RuntimeError, ValueError)) as e:
            fn()
        assert text in str(e.value), "%r not in %r" % (text, str(e.value))

    raises(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16), group=geo), "dtype")
    raises(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BAND,
                                   group=geo), "BAND")
    raises(lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool),
                                   op=dist._make_nccl_premul_sum(2.0), group=geo), "PREMUL_SUM")
    raises(lambda: dist.all_gather([torch.ones(3)] * (world - 1), torch.ones(3), group=geo),
           "output tensors")
    raises(lambda: dist._all_gather_base(torch.ones(5), torch.ones(3), group=geo), "elements")
    # torch 2.x's dispatcher refuses it before the backend sees it
    raises(lambda: dist.broadcast(torch.ones(2, 2).to_sparse(), 0, group=geo),
           "dense" if TORCH1 else "SparseCPU")
    raises(lambda: dist.all_reduce(torch.ones(2, 2).to_sparse(), op=dist.ReduceOp.MAX,
                                   group=geo), "SUM only")
    raises(lambda: dist.recv(torch.ones(1), group=geo), "source")
    # nothing was sent: the group still works
    t = torch.ones(4)
    dist.all_reduce(t, group=geo)
    assert torch.all(t == world)


def scenario_ops(rank, world, init):
    geo, gloo = init_groups(rank, world, init)
    check_invalid(rank, world, geo)
    for dtype in DTYPES:
        for strided in (False, True):
            check_all_reduce(rank, world, geo, gloo, dtype, strided)
            check_others(rank, world, geo, gloo, dtype, strided)
    b = torch.tensor([rank == 1, False, True])
    dist.all_reduce(b, group=geo)          # bool SUM: logical or
    same(b, torch.tensor([True, False, True]), "bool all_reduce")
    check_async_order(rank, world, geo)
    # the sequence number: the calls made on the group, the same on every
    # rank (a call of the backend's own, made on one rank, is not counted)
    import geoccl.torch
    if rank == 0:
        geoccl.torch.backend(geo).stats()
    s = geo._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1), group=geo)
    assert geo._get_sequence_number_for_group() == s + 1
    seqs = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(seqs, torch.tensor([s], dtype=torch.int64), group=gloo)
    assert all(int(x) == s for x in seqs), seqs
    dist.barrier(group=geo)
    # abort: later calls are refused with a clear error, destroy still works
    geo.abort()
    with pytest.raises(RuntimeError, match="aborted"):
        dist.all_reduce(torch.ones(2), group=geo)
    dist.destroy_process_group()


def scenario_batches(rank, world, init):
    """batch_isend_irecv where every rank receives before it sends, against
    Gloo; with torch 2.x also _coalescing_manager blocks (torch brackets
    them with startCoalescing and endCoalescing for a backend that
    coalesces): sends and receives with collectives, sync and async calls,
    the fast path of all_reduce, a call the backend makes for itself inside
    one (not held back), an empty block."""
    import geoccl.torch
    geo, gloo = init_groups(rank, world, init)
    n = 1000
    right, left = (rank + 1) % world, (rank - 1) % world
    got = {}
    for name, g in (("geoccl", geo), ("gloo", gloo)):
        ops, got[name] = [], {}
        for p in range(world):
            if p == rank:
                continue
            got[name][p] = torch.full((n,), -1.0)
            ops.append(dist.P2POp(dist.irecv, got[name][p], p, group=g))
            ops.append(dist.P2POp(dist.isend, torch.full((n,), float(rank * 10 + p)), p, group=g))
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    for p in got["gloo"]:
        same(got["geoccl"][p], got["gloo"][p], "batch_isend_irecv from %d" % p)
        assert torch.all(got["geoccl"][p] == p * 10 + rank)
    # a batch of one call: 0 sends to 1
    if rank < 2:
        t = torch.full((n,), 5.0) if rank == 0 else torch.zeros(n)
        op = dist.isend if rank == 0 else dist.irecv
        for w in dist.batch_isend_irecv([dist.P2POp(op, t, 1 - rank, group=geo)]):
            w.wait()
        assert torch.all(t == 5)
    if TORCH1:
        dist.destroy_process_group()
        return
    from torch.distributed.distributed_c10d import _coalescing_manager
    cpu = torch.device("cpu")
    assert geo._get_backend(cpu).supports_coalescing
    # sync: the collectives return no work; the block's end waits for all
    b = torch.full((n,), float(rank))
    g = [torch.empty(n) for _ in range(world)]
    r = torch.full((n,), -1.0)
    red = torch.full((n,), float(rank + 1))
    with _coalescing_manager(geo, cpu):
        dist.irecv(r, left, group=geo)
        assert dist.broadcast(b, 1, group=geo) is None
        dist.all_gather(g, torch.full((n,), float(rank)), group=geo)
        dist.reduce(red, 0, op=dist._make_nccl_premul_sum(2.0), group=geo)
        dist.isend(torch.full((n,), float(rank)), right, group=geo)
        geoccl.torch.backend(geo).stats()  # runs now, before the block's calls
    assert torch.all(b == 1) and torch.all(r == left)
    for p in range(world):
        assert torch.all(g[p] == p), p
    if rank == 0:
        assert torch.all(red == 2 * sum(range(1, world + 1)))
    # async: all_reduce's fast path (allreduce_coalesced inside the block),
    # and an async collective's own work, waited for after the block
    xs = [torch.full((n,), float(rank + i)) for i in range(3)]
    with _coalescing_manager(geo, cpu, async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x, group=geo)
    cm.wait()
    for i, x in enumerate(xs):
        assert torch.all(x == sum(p + i for p in range(world))), i
    t = torch.full((n,), float(rank))
    r = torch.full((n,), -1.0)
    with _coalescing_manager(geo, cpu, async_ops=True) as cm:
        w = dist.broadcast(t, 2, group=geo, async_op=True)
        dist.irecv(r, right, group=geo)
        dist.isend(torch.full((n,), float(rank)), left, group=geo)
    cm.wait()
    w.wait()
    assert torch.all(t == 2) and torch.all(r == right)
    # a collective whose job reads what its first call returned (sparse
    # all_reduce: the counts, then the entries), with a send and a receive
    sp = sparse_input(rank, world, 0, torch.float32)
    ref = sp.clone()
    dist.all_reduce(ref, group=gloo)
    r = torch.full((n,), -1.0)
    with _coalescing_manager(geo, cpu, async_ops=True) as cm:
        dist.irecv(r, left, group=geo)
        w = geo.allreduce([sp])
        dist.isend(torch.full((n,), float(rank)), right, group=geo)
    cm.wait()
    w.wait()
    same(sp.to_dense(), ref.coalesce().to_dense(), "sparse all_reduce in a batch")
    assert torch.all(r == left)
    with _coalescing_manager(geo, cpu):
        pass
    dist.barrier(group=geo)
    dist.destroy_process_group()


def scenario_tensor_coalesced(rank, world, init):
    """torch 2.x's allgather_into_tensor_coalesced and
    reduce_scatter_tensor_coalesced against Gloo's, bit for bit: lists of
    tensors of odd sizes (one empty), every dtype, contiguous and strided,
    one list of mixed dtypes; then through the calls a _coalescing_manager
    block of all_gather_into_tensor or reduce_scatter_tensor becomes (with
    and without a device: held in a batch or not); dist.set_timeout."""
    from torch.distributed.distributed_c10d import _coalescing_manager
    geo, gloo = init_groups(rank, world, init)
    # the group torch 2.x uses is geoccl's own: it names itself, and keeps
    # the device init_process_group bound it to
    assert type(geo).__name__ == "GroupGeoCCL" and geo.name() == "geoccl"
    assert geo.bound_device_id == torch.device("cpu:0"), geo.bound_device_id
    sizes = [1, 13, 0, 37]

    def gathered(dtypes, strided):
        """geoccl's outputs, and Gloo's (in int64 where Gloo lacks the dtype)."""
        ins = [data(rank, n, d, strided, salt=i) for i, (n, d) in enumerate(zip(sizes, dtypes))]
        outs = [empty(world * n, d, strided) for n, d in zip(sizes, dtypes)]
        geo.allgather_into_tensor_coalesced(outs, ins).wait()
        refs = [torch.full((world * n,), 99, dtype=d) for n, d in zip(sizes, dtypes)]
        gins = [data(rank, n, d, False, salt=i) for i, (n, d) in enumerate(zip(sizes, dtypes))]
        if not gloo_takes(lambda: gloo.allgather_into_tensor_coalesced(refs, gins).wait()):
            refs = [torch.zeros(world * n, dtype=torch.int64) for n in sizes]
            gins = [g.to(torch.int64) for g in gins]
            gloo.allgather_into_tensor_coalesced(refs, gins).wait()
        return outs, [r.to(d) for r, d in zip(refs, dtypes)]

    def scattered(dtypes, strided, op):
        ins = [data(rank, world * n, d, strided, salt=i)
               for i, (n, d) in enumerate(zip(sizes, dtypes))]
        outs = [empty(n, d, strided) for n, d in zip(sizes, dtypes)]
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = op
        geo.reduce_scatter_tensor_coalesced(outs, ins, opts).wait()
        refs = [torch.full((n,), 99, dtype=d) for n, d in zip(sizes, dtypes)]
        gins = [data(rank, world * n, d, False, salt=i)
                for i, (n, d) in enumerate(zip(sizes, dtypes))]
        if not gloo_takes(lambda: gloo.reduce_scatter_tensor_coalesced(refs, gins, opts).wait()):
            refs = [torch.zeros(n, dtype=torch.int64) for n in sizes]
            gins = [g.to(torch.int64) for g in gins]
            gloo.reduce_scatter_tensor_coalesced(refs, gins, opts).wait()
        return outs, [r.to(d) for r, d in zip(refs, dtypes)]

    mixed = [torch.float32, torch.int64, torch.float16, torch.uint8]
    for dtypes in [[d] * len(sizes) for d in DTYPES] + [mixed]:
        for strided in (False, True):
            outs, refs = gathered(dtypes, strided)
            for i, (a, b) in enumerate(zip(outs, refs)):
                same(a, b, "allgather_into_tensor_coalesced %s strided=%s tensor %d"
                     % (dtypes[i], strided, i))
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
                outs, refs = scattered(dtypes, strided, op)
                for i, (a, b) in enumerate(zip(outs, refs)):
                    same(a, b, "reduce_scatter_tensor_coalesced %s %s strided=%s tensor %d"
                         % (op, dtypes[i], strided, i))
    # float32 of every bit pattern a normal float has: gathered as they are
    g = torch.Generator().manual_seed(rank)
    ins = [torch.randn(n, generator=g) for n in sizes]
    outs = [torch.empty(world * n) for n in sizes]
    refs = [torch.empty(world * n) for n in sizes]
    geo.allgather_into_tensor_coalesced(outs, ins).wait()
    gloo.allgather_into_tensor_coalesced(refs, ins).wait()
    for i, (a, b) in enumerate(zip(outs, refs)):
        same(a, b, "allgather_into_tensor_coalesced randn tensor %d" % i)
    # the public calls, which a _coalescing_manager block gathers into one
    # of these (without a device), or holds in the backend's batch (with a
    # device; Gloo does not coalesce so)
    cpu = torch.device("cpu")

    def block(grp, device):
        ins = [data(rank, n, torch.float32, False, salt=i) for i, n in enumerate(sizes)]
        outs = [empty(world * n, torch.float32, False) for n in sizes]
        with _coalescing_manager(grp, device, async_ops=True) as cm:
            for o, x in zip(outs, ins):
                dist.all_gather_into_tensor(o, x, group=grp)
        cm.wait()
        rins = [data(rank, world * n, torch.int32, False, salt=i) for i, n in enumerate(sizes)]
        routs = [empty(n, torch.int32, False) for n in sizes]
        with _coalescing_manager(grp, device):
            for o, x in zip(routs, rins):
                dist.reduce_scatter_tensor(o, x, op=dist.ReduceOp.MAX, group=grp)
        return outs + routs

    want = block(gloo, None)
    for device in (None, cpu):
        for i, (a, b) in enumerate(zip(block(geo, device), want)):
            same(a, b, "_coalescing_manager, device %s, tensor %d" % (device, i))
    # dist.set_timeout: the works made after it wait so long at most
    dist.set_timeout(datetime.timedelta(seconds=1), group=geo)
    if rank == 0:
        got = torch.zeros(1)
        w = dist.irecv(got, src=1, group=geo)
        with pytest.raises(RuntimeError, match="within 1000 ms"):
            w.wait()
    dist.barrier(group=gloo)
    if rank == 1:
        dist.send(torch.ones(1), 0, group=geo)
    dist.set_timeout(datetime.timedelta(seconds=60), group=geo)
    if rank == 0:
        w.wait()
        assert got.item() == 1
    # wrong sizes are refused before anything is queued; the group goes on
    with pytest.raises(RuntimeError, match="needs 4 x 3"):
        geo.allgather_into_tensor_coalesced([torch.empty(11)], [torch.ones(3)])
    with pytest.raises(RuntimeError, match="outputs for"):
        geo.reduce_scatter_tensor_coalesced([torch.empty(1)], [torch.ones(4), torch.ones(4)])
    t = torch.ones(4)
    dist.all_reduce(t, group=geo)
    assert torch.all(t == world)
    dist.destroy_process_group()


def sparse_input(rank, world, dense_dims, dtype):
    """Entries that overlap between ranks, duplicated (not coalesced), none
    on rank 2."""
    n = 0 if rank == 2 else rank + 2
    idx = torch.stack([torch.arange(n) % world, torch.zeros(n, dtype=torch.int64)])
    vals = (torch.arange(n * 2 ** dense_dims) % 5 + rank).reshape([n] + [2] * dense_dims)
    return torch.sparse_coo_tensor(idx, vals.to(dtype), [world, 3] + [2] * dense_dims)


def scenario_sparse_and_monitored(rank, world, init):
    geo, gloo = init_groups(rank, world, init)
    # sparse all_reduce (SUM), against Gloo's
    for dense_dims in (0, 2):
        for dtype in (torch.float32, torch.int64):
            a = sparse_input(rank, world, dense_dims, dtype)
            b = a.clone()
            dist.all_reduce(a, group=geo)
            dist.all_reduce(b, group=gloo)
            assert a.is_sparse and a.is_coalesced(), "sparse all_reduce %s" % dtype
            same(a.to_dense(), b.coalesce().to_dense(), "sparse all_reduce %s" % dtype)
    # monitored_barrier: passes, then rank 1 stays away
    td = datetime.timedelta
    dist.monitored_barrier(geo, timeout=td(seconds=20))
    dist.monitored_barrier(geo, timeout=td(seconds=20), wait_all_ranks=True)
    if rank == 0:
        with pytest.raises(RuntimeError, match="Rank 1 failed to pass monitoredBarrier in 1000 ms"):
            dist.monitored_barrier(geo, timeout=td(seconds=1))
    elif rank != 1:
        with pytest.raises(RuntimeError, match="Rank %d successfully reached monitoredBarrier, "
                           "but received errors while waiting for send/recv from rank 0: rank 0 "
                           "reported: Rank 1 failed" % rank):
            dist.monitored_barrier(geo, timeout=td(seconds=1))
    # the collectives still work after a failed monitored barrier
    t = torch.ones(4)
    dist.all_reduce(t, group=geo)
    assert torch.all(t == world)
    if rank == 0:
        with pytest.raises(RuntimeError, match="Ranks 1, 2, 3 failed to pass monitoredBarrier"):
            dist.monitored_barrier(geo, timeout=td(seconds=0.2), wait_all_ranks=True)
    dist.barrier(group=geo)
    dist.destroy_process_group()


def scenario_ddp(rank, world, init):
    geo, gloo = init_groups(rank, world, init)

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 4))

    nets = {}
    for name, group in (("geoccl", geo), ("gloo", gloo)):
        m = model()
        if rank == 1:  # DDP's start-up broadcast must undo this
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(1.0)
        ddp = torch.nn.parallel.DistributedDataParallel(m, process_group=group,
                                                        bucket_cap_mb=0.001)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(8):
            x = torch.randn(8, 16, generator=g)
            y = torch.randint(0, 4, (8,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        nets[name] = [p.detach().clone() for p in m.parameters()]
        # DDP's logging data names the group's backend as get_backend does
        # (under torch 2.x a plugin's group says "custom" unless it names itself)
        assert ddp._get_ddp_logging_data().get("backend_name") == name
        assert dist.get_backend(group) == name
    for a, b in zip(nets["geoccl"], nets["gloo"]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
    # every rank holds the same model
    flat = torch.cat([p.reshape(-1) for p in nets["geoccl"]])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=geo)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=geo)
    assert torch.equal(lo, hi)
    dist.destroy_process_group()


def scenario_death(rank, world, init):
    geo, _ = init_groups(rank, world, init)
    t = torch.ones(1 << 16)
    for _ in range(3):
        dist.all_reduce(t, group=geo)
    dist.barrier(group=geo)
    if rank == world - 1:
        os._exit(17)  # dies between two collectives, without a word
    t0 = time.time()
    with pytest.raises(RuntimeError) as e:
        for _ in range(1000):
            dist.all_reduce(t, group=geo)
    took = time.time() - t0
    msg = str(e.value)
    assert "geoccl: allreduce #" in msg and "failed" in msg, msg
    assert "rank" in msg, msg  # GeoCCL's last error names the peer
    limit = float(os.environ["GEOCCL_TIMEOUT"]) * 2 + 5
    assert took < limit, "failed after %.1f s (GEOCCL_TIMEOUT %s)" % (took, os.environ["GEOCCL_TIMEOUT"])
    # the group stays failed, with the same kind of message
    with pytest.raises(RuntimeError, match="geoccl"):
        dist.all_reduce(t, group=geo)
    return True


def scenario_compress(rank, world, init):
    """Two labelled regions on loopback and GEOCCL_COMPRESS=int8: the
    float32 all-reduce is compressed between them (GeoCCL's counters say
    so), stays within the codec's error of Gloo's and is the same on every
    rank."""
    os.environ["GEOCCL_REGION"] = "r%d" % (rank * 2 // world)
    geo, gloo = init_groups(rank, world, init)
    import geoccl.torch
    pg = geoccl.torch.backend(geo)
    assert pg.compression() == "int8", pg.compression()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(1 << 16, generator=g)
    a, b = x.clone(), x.clone()
    before = pg.stats()
    dist.all_reduce(a, group=geo)
    after = pg.stats()
    dist.all_reduce(b, group=gloo)
    err = (a - b).abs().max().item()
    bound = 4 * b.abs().max().item() / 127
    assert 0 < err < bound, "int8 error %g, bound %g" % (err, bound)
    sent = after["bytes_wan"] - before["bytes_wan"]
    raw = after["bytes_wan_raw"] - before["bytes_wan_raw"]
    assert 0 < sent < raw / 2, "sent %d of %d bytes between regions" % (sent, raw)
    lo, hi = a.clone(), a.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=gloo)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=gloo)
    assert torch.equal(lo, hi), "ranks differ"
    i = torch.arange(10, dtype=torch.int64) + rank  # not a float sum: exact
    j = i.clone()
    dist.all_reduce(i, group=geo)
    dist.all_reduce(j, group=gloo)
    same(i, j, "int64 all_reduce under int8 compression")
    # error feedback follows registrations: the same input into a registered
    # tensor gives another result the second time (its residual is used); a
    # new registration of that memory, or none, starts from no residual
    t = torch.empty(1 << 14)

    def reduce_x():
        t.copy_(x[:t.numel()])
        dist.all_reduce(t, group=geo)
        return t.clone()

    with geoccl.torch.register_error_feedback(t, group=geo):
        r0, r1 = reduce_x(), reduce_x()
    assert not torch.equal(r0, r1), "a registered tensor's second call used no residual"
    reg = geoccl.torch.register_error_feedback(t, group=geo)
    assert torch.equal(reduce_x(), r0), "a new registration picked up the old residual"
    reg.close()
    assert torch.equal(reduce_x(), r0) and torch.equal(reduce_x(), r0), \
        "an unregistered tensor kept a residual"
    dist.destroy_process_group()


# ----------------------------------------------------------------- tests

def test_every_op_and_dtype_against_gloo(tmp_path):
    run_ranks(scenario_ops, file_init(tmp_path), timeout=100)


def test_sparse_all_reduce_and_monitored_barrier(tmp_path):
    run_ranks(scenario_sparse_and_monitored, file_init(tmp_path), timeout=60)


def test_batches_and_coalescing(tmp_path):
    run_ranks(scenario_batches, file_init(tmp_path), timeout=60)


@pytest.mark.skipif(TORCH1, reason="torch 1.x has no allgather_into_tensor_coalesced, "
                    "reduce_scatter_tensor_coalesced or set_timeout")
def test_tensor_coalesced_and_set_timeout(tmp_path):
    run_ranks(scenario_tensor_coalesced, dict(file_init(tmp_path), device="cpu:0"), timeout=90)


def test_ddp_matches_gloo_env_init():
    run_ranks(scenario_ddp, env_init(), timeout=60)


def test_compression_between_regions(tmp_path):
    run_ranks(scenario_compress, file_init(tmp_path), env={"GEOCCL_COMPRESS": "int8"},
              timeout=60)


def test_dead_rank_fails_wait_no_hang():
    # The survivors report before they exit; rank 3 exits 17 without a word.
    run_ranks(scenario_death, env_init(), env={"GEOCCL_TIMEOUT": "5"}, timeout=60,
              expect_exit={WORLD - 1: 17})


def test_backend_registered():
    import geoccl.torch  # noqa: F401
    assert "GEOCCL" in dist.Backend._plugins
    assert dist.Backend("geoccl") == "geoccl"
