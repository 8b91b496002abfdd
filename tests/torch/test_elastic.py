"""geoccl.elastic on loopback (tests/torch/run_torch.sh runs it): 4 ranks in
2 labelled regions and the torch store of rank 0.

- a rank SIGKILLed just before a round's all-reduce: the others go on as a
  group of 3 and that round's sum counts the ranks it says it counted;
- a rank that gets SIGTERM leaves at the end of its round, nobody errs;
- a process started with Elastic.join is admitted at a round boundary and
  receives the state (checked by the helper's all-reduced hash);
- every rank that ends holds the same state and round;
- a second rank dying while the survivors re-form after the first loss (in
  the shrink, or in the first call on the group it made): they re-form
  again and go on as a group of 2;
- the members' store keys are where a joiner reads them (torch 2.x gives
  the default group its store under one more prefix).

Each rank is this file run as a script (`worker`), so that a rank can die
without taking pytest with it.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ROUNDS = 12  # at least; then until the joiner is in (the size is agreed)
KILL_ROUND, TERM_ROUND, JOIN_AFTER = 3, 6, 4


def _die_while_reforming(el, stage):
    """This rank dies in the re-form that another rank's loss starts:
    "agreed" once the dead set is agreed (the others' shrink then fails),
    "shrunk" once the group of the survivors is made (their first call on
    it fails)."""
    if stage == "agreed":
        agree = el._agree_dead

        def agreed():
            agree()
            os.kill(os.getpid(), signal.SIGKILL)
        el._agree_dead = agreed
        return

    class Dying:
        def __init__(self, pg):
            self._pg = pg

        def __getattr__(self, name):
            return getattr(self._pg, name)

        def shrink(self, *a):
            self._pg.shrink(*a)
            os.kill(os.getpid(), signal.SIGKILL)
    el.pg = Dying(el.pg)


def worker(rank, join, second=None):
    import torch
    import torch.distributed as dist
    import geoccl.torch  # noqa: F401
    import geoccl.elastic as elastic

    os.environ["GEOCCL_REGION"] = "r%d" % (rank // 2)
    if not join:
        dist.init_process_group("geoccl", rank=rank, world_size=4)
    state = [torch.zeros(1000), torch.zeros(3)]
    fn = lambda: state  # noqa: E731
    el = elastic.Elastic.join(fn, detect=0.5) if join else elastic.Elastic(fn, detect=0.5)
    if second and rank == 2:
        _die_while_reforming(el, second)
    while el.round < ROUNDS or (not second and el.size < 3 and el.round < 400):
        rnd = el.round + 1
        if rank == 3 and not join and rnd == KILL_ROUND:
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 2 and not join and not second and rnd == TERM_ROUND:
            os.kill(os.getpid(), signal.SIGTERM)  # leave at the end of this round
        time.sleep(0.05)  # a round's local work
        g = torch.full((1000,), 1.0)
        n = el.all_reduce(g)
        assert torch.equal(g, torch.full((1000,), float(n))), (rnd, n, g[:4])
        state[0].add_(g / n)
        state[1][0] = rnd
        print("round %d size %d counted %d" % (rnd, el.size, n), flush=True)
        if not el.end_round():
            print("left after round %d" % el.round, flush=True)
            el.close()
            return
    same = el.identical()
    print("final round %d size %d state %.1f identical %s" % (
        el.round, el.size, float(state[0][0]), same), flush=True)
    el.barrier()
    el.close(finished=True)


def _run(tmp_path, second=None):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               GEOCCL_SOCKET_IFNAME="lo", GEOCCL_ELASTIC_QUIET="0")
    if second:
        # the shrink that waits for the rank that died in it gives up after this
        env["GEOCCL_TIMEOUT"] = "5"
    env.pop("GEOCCL_ELASTIC_ETCD", None)
    procs = {}

    def start(name, rank, join=False):
        out = open(tmp_path / (name + ".out"), "w")
        procs[name] = subprocess.Popen(
            [sys.executable, __file__, "worker", str(rank)] + (["join"] if join else []) +
            (["second=" + second] if second else []),
            env=env, stdout=out, stderr=subprocess.STDOUT)

    for r in range(4):
        start("rank%d" % r, r)
    t0 = time.time()
    while not second and time.time() - t0 < 120:
        text = (tmp_path / "rank0.out").read_text()
        if "round %d " % JOIN_AFTER in text:
            break
        time.sleep(0.05)
    if not second:
        start("joiner", 3, join=True)
    codes = {}
    for name, p in procs.items():
        try:
            codes[name] = p.wait(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            codes[name] = "timeout"
    outs = {n: (tmp_path / (n + ".out")).read_text() for n in procs}
    return codes, outs


def test_loss_leave_join(tmp_path):
    codes, outs = _run(tmp_path)
    why = "\n".join("== %s (%s)\n%s" % (n, codes[n], outs[n][-1500:]) for n in outs)
    assert codes["rank3"] == -signal.SIGKILL, why
    for n in ("rank0", "rank1", "rank2", "joiner"):
        assert codes[n] == 0, why
    assert "left after round %d" % TERM_ROUND in outs["rank2"], why
    # the loss: the round of the kill counted 3 ranks, as did the next
    assert "round %d size 3 counted 3" % (KILL_ROUND + 1) in outs["rank0"], why
    assert "round %d size 2 counted 2" % (TERM_ROUND + 1) in outs["rank0"], why
    finals = [o.splitlines()[-1] for n, o in outs.items() if n in ("rank0", "rank1", "joiner")]
    assert all(" size 3 " in f for f in finals), why
    assert len(set(finals)) == 1 and finals[0].endswith("identical True"), why
    assert "joined as rank 2 of 3" in outs["joiner"], why


def store_keys(port):
    """One rank of an env:// job: a key the members put in their store must
    be where a joiner's (and the beats') own connection reads it."""
    import torch.distributed as dist
    import geoccl.elastic as elastic

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("geoccl", rank=0, world_size=1)
    elastic._default_store().add("shared", 5)
    print("joiner reads %d" % elastic._connect_env_store(10).add("shared", 0), flush=True)
    dist.destroy_process_group()


def test_members_share_joiners_keys():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ, GEOCCL_SOCKET_IFNAME="lo")
    out = subprocess.run([sys.executable, __file__, "store_keys", str(port)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    text = out.stdout.decode(errors="replace")
    assert out.returncode == 0 and "joiner reads 5" in text, text


@pytest.mark.parametrize("stage", ["agreed", "shrunk"])
def test_second_loss_while_reforming(tmp_path, stage):
    codes, outs = _run(tmp_path, second=stage)
    why = "\n".join("== %s (%s)\n%s" % (n, codes[n], outs[n][-2500:]) for n in outs)
    assert codes["rank3"] == -signal.SIGKILL and codes["rank2"] == -signal.SIGKILL, why
    assert codes["rank0"] == 0 and codes["rank1"] == 0, why
    # the round of the first loss counted the two ranks left at its end
    assert "round %d size 2 counted 2" % KILL_ROUND in outs["rank0"], why
    assert "re-forming failed" in outs["rank0"], why
    finals = [outs[n].splitlines()[-1] for n in ("rank0", "rank1")]
    assert finals[0] == finals[1] and finals[0].endswith("identical True"), why
    assert " size 2 " in finals[0], why


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "store_keys":
    store_keys(int(sys.argv[2]))
elif __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "worker":
    extra = sys.argv[3:]
    worker(int(sys.argv[2]), "join" in extra,
           next((a.split("=", 1)[1] for a in extra if a.startswith("second=")), None))
