"""Training across regions that come and go: an elastic geoccl group.

    import geoccl.elastic as elastic
    dist.init_process_group("geoccl")              # the first members
    el = elastic.Elastic(state_fn)                 # collective over them
    # a process started later, to join the running job, instead:
    #   el = elastic.Elastic.join(state_fn)         # blocks until admitted
    while el.round < rounds:
        ...local steps...
        el.all_reduce(pseudo_grad, average=True)   # survives the loss of ranks
        ...outer step...
        if not el.end_round():                     # leave (SIGTERM) or join here
            break
    el.close()

Contracts (docs/pytorch.md, "Elastic training", says more):
- Loss. A collective of the helper that fails because ranks died makes the
  survivors agree on who is gone, form the group of the rest from the
  current communicator (ncclCommShrink, NCCL_SHRINK_ABORT), and finish the
  same call there: when some survivor completed it before the loss (its
  result counted every rank), that result is sent to the others; otherwise
  it is run again over the survivors, with the inputs it had. No process
  restarts; the call returns, and `size` tells how many ranks its result
  counted. A rank that dies while the survivors re-form starts the re-form
  again from where it got to.
- Round boundary. end_round() is one small all-reduce over the group: it
  checks that every member is at the same round, tells who leaves (a rank
  that got SIGTERM, or called leave()) and whether joiners wait. Leavers
  return False and stop; the others shrink without them (no error is seen
  anywhere); joiners are then admitted: every member and joiner forms the
  grown group, rank 0 sends the round number and every tensor of
  state_fn() to all, and a hash of that state, all-reduced, must agree on
  every rank (else it raises). A joiner contributes from the next round on.
- Who is gone, who waits. With GEOCCL_ELASTIC_ETCD set (membership
  "geoccl"), GeoCCL keeps the job's members in etcd (geoccl.h's elastic
  calls): the survivors get the same dead set from it
  (geocclCommGetFailedRanks, a rank is gone once its lease runs out,
  GEOCCL_ELASTIC_TTL), joiners register there (geocclCommJoin) and the
  members admit them with geocclCommGrow; any region may be lost,
  rank 0's included, and the torch store is not used after the start.
  Otherwise (membership "store") the ranks agree through the job's torch
  store: each beats a counter every `beat` seconds; after a failure every
  survivor says so, and a rank that neither says so nor beats for `detect`
  seconds is gone; joiners take a ticket there and the grown group is a new
  communicator made through it. That store must outlive the ranks that may
  be lost: with init_process_group("env://") it lives in rank 0's process.

Every collective of the job must go through the helper (all_reduce,
barrier, broadcast, or run(fn)) while it is elastic: the group behind it
changes, and torch.distributed's default group is the first one's.
"""
import datetime
import hashlib
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import geoccl.torch as _gt

_C = _gt._C
PREFIX = "geoccl_elastic/"


def _log(msg):
    """One line on stderr, with the wall clock (tests line events up with
    the moment they caused them); GEOCCL_ELASTIC_QUIET=1 silences it."""
    if os.environ.get("GEOCCL_ELASTIC_QUIET", "0") != "1":
        print("geoccl.elastic[%d] %.3f: %s" % (os.getpid(), time.time(), msg), file=sys.stderr,
              flush=True)


def _default_store():
    c10d = dist.distributed_c10d
    if dist.is_initialized():
        return _job_store(c10d._get_default_store())
    # A joiner; a bounded wait: a job that has ended has no store any more
    return _connect_env_store(60)


def _connect_env_store(timeout_s):
    """A connection of its own to the job's env:// store, under the prefix
    init_process_group("env://") gives it."""
    tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                        is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.PrefixStore("default_pg", tcp)


def _job_store(store):
    """The store init_process_group made (env://: the TCPStore under
    "default_pg") or was given, from the default group's store. torch 2.x
    keeps each group's store under one more prefix, the group's name (the
    default group's "0/"), and a joiner, which is in no group yet, reaches
    the job's store without it: the members' keys (admissions, the job's
    end) must be where it looks, and where the beats' own connection puts
    theirs. Whether store is that prefix over its underlying store is
    asked of the store itself (a key added through one, read through the
    other), so that no torch release's wrapping is assumed."""
    c10d = dist.distributed_c10d
    world = getattr(c10d, "_world", None)  # torch 2.x
    inner = getattr(store, "underlying_store", None)
    if world is None or inner is None:
        return store
    name = world.pg_names.get(c10d._get_default_group())
    if not name:
        return store
    probe = "%sprobe/%d/%s" % (PREFIX, os.getpid(), os.urandom(8).hex())
    store.add(probe, 1)
    # PrefixStore(p, s) keeps key k as s's "p/k"
    wrapped = inner.add("%s//%s" % (name, probe), 0) == 1
    for st, key in ((store, probe), (inner, "%s//%s" % (name, probe))):
        try:
            st.delete_key(key)
        except Exception:  # a store without delete: the key stays, unused
            pass
    return inner if wrapped else store


def _membership():
    """Where the job's members are kept: "geoccl" (etcd, through GeoCCL)
    when GEOCCL_ELASTIC_ETCD is set, else "store" (the torch store)."""
    return "geoccl" if os.environ.get("GEOCCL_ELASTIC_ETCD") else "store"


class MembershipError(RuntimeError):
    """The survivors could not re-form (a rank taken for gone is alive, a
    failure while admitting joiners, state that differs after the send)."""


class _Op:
    """One collective of the helper: its number in the group's stream and
    how to run it on a group (again, on the re-formed group, after a
    failure; run restores its inputs first). The output kept for survivors
    that did not complete it is Elastic._last's."""

    def __init__(self, seq, run):
        self.seq = seq
        self.run = run      # run(pg) -> result, on the current group


class Elastic:
    """The elastic group of the calling rank. state_fn() returns the list
    of tensors that make the training state (model and optimizer tensors,
    the same shapes and order on every rank); a joiner receives them."""

    def __init__(self, state_fn, store=None, group=None, timeout=None, detect=1.0, beat=0.1,
                 leave_signal=signal.SIGTERM, membership=None, _pg=None, _epoch=0, _round=0):
        self.membership = membership or _membership()
        if store is not None:
            base = store
        elif self.membership == "geoccl" and _pg is not None:
            base = dist.HashStore()  # a joiner: nothing goes through a torch store
        else:
            base = _default_store()
        # the job's env:// store, which the beats reach on a connection of their own
        self._env_store = (store is None and "MASTER_ADDR" in os.environ and
                           "MASTER_PORT" in os.environ)
        self._base = base
        self._store = dist.PrefixStore(PREFIX, base)
        self._lock = threading.Lock()   # one store call at a time
        self.state_fn = state_fn
        self.timeout = timeout if timeout is not None else dist.distributed_c10d.default_pg_timeout
        self.detect = detect
        self.beat = beat
        self.pg = _pg if _pg is not None else _gt.backend(group)
        self.epoch = _epoch
        self.round = _round
        self.admitted = 0          # joiners admitted so far (the tickets' count)
        self.seq = 0               # collectives run on this epoch's group
        self._last = None          # (op, output copy) of the last completed op
        self._leave = False
        self._tickets = 0          # rank 0: tickets the beat thread saw
        self._stop = threading.Event()
        self.events = []           # (time, what, details) for the caller's report
        if leave_signal is not None and threading.current_thread() is threading.main_thread():
            signal.signal(leave_signal, lambda *_: self.leave())
        self._thread = threading.Thread(target=self._beats, daemon=True)
        if self.membership == "store":
            self._thread.start()

    # ---- who is here --------------------------------------------------------------

    @property
    def rank(self):
        return self.pg.rank()

    @property
    def size(self):
        return self.pg.size()

    def leave(self):
        """Leave at the next round boundary (what SIGTERM does)."""
        self._leave = True

    def _st(self, fn, *a):
        with self._lock:
            return fn(*a)

    def _key(self, *parts):
        return "/".join(str(p) for p in (self.epoch,) + parts)

    def _beats(self):
        # A connection of its own where the store is the job's env:// one,
        # so that beats neither wait for the main thread's store calls nor
        # hold them up (each may be a WAN round trip).
        own, st = None, None
        while not self._stop.wait(self.beat):
            try:
                if own is None and self._env_store:
                    own = dist.PrefixStore(PREFIX, _connect_env_store(30))
                    st = lambda fn, *a: fn(*a)  # noqa: E731
                store, call = (own, st) if own is not None else (self._store, self._st)
                e, r = self.epoch, self.rank
                call(store.add, "%d/beat/%d" % (e, r), 1)
                if r == 0:
                    self._tickets = call(store.add, "join/tickets", 0)
            except Exception:  # the store's host is gone: the failure path says so;
                own = None      # or this connection broke: the next beat opens another

    def close(self, finished=False):
        """Stops the beats (before the process or the store goes).
        finished (every member, at the end of the job): rank 0 tells the
        processes still waiting to join that they never will."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if finished and self.rank == 0 and self.membership == "store":
            try:
                self._st(self._store.add, "done", 1)
            except Exception:
                pass

    # ---- collectives --------------------------------------------------------------

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, average=False):
        """tensor in place, summed (op) over the group; average divides by
        the number of ranks the result counted. Returns that number."""
        src = tensor.detach().clone()
        counted = [0]

        def run(pg):
            tensor.copy_(src)
            opts = dist.AllreduceOptions()
            opts.reduceOp = op
            self._wait(pg.allreduce([tensor], opts))
            counted[0] = pg.size()
            if average:
                tensor.div_(pg.size())
            return tensor

        self._do(run, [tensor], counted)
        return counted[0]

    def barrier(self):
        flag = torch.zeros(1, dtype=torch.int32)
        self._do(lambda pg: self._wait(pg.allreduce([flag], dist.AllreduceOptions())), [])

    def run(self, fn, outputs=()):
        """fn(pg) -> Work on the current group, made again on the group of
        the survivors after a loss; outputs: the tensors it writes."""
        self._do(lambda pg: self._wait(fn(pg)), list(outputs))

    def _wait(self, work):
        """Waits for work; polls the store's flag that another rank saw a
        failure (a rank waiting on a live peer would not see it)."""
        if self.membership == "geoccl":  # GeoCCL spreads a failure to every rank
            work.wait()
            return
        next_look = time.monotonic() + self.beat
        while not work.is_completed():
            time.sleep(0.002)
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + self.beat
                try:
                    broken = self._st(self._store.add, self._key("broken"), 0)
                except Exception:
                    broken = 0
                if broken:
                    raise RuntimeError("geoccl.elastic: another rank saw a failure")
        work.wait()

    def _do(self, run, outputs, counted=None):
        self.seq += 1
        op = _Op(self.seq, run)
        err = None
        while True:
            if err is None:
                try:
                    op.run(self.pg)
                    self._last = (op, [t.detach().clone() for t in outputs],
                                  counted[0] if counted else None)
                    return
                except Exception as e:  # a failure: re-form, then finish op there
                    err = e
            try:
                if self._recover(op, err, outputs, counted):
                    return
                err = None  # run op again on the group re-formed
            except MembershipError:
                raise
            except Exception as e:
                # Another rank died while the survivors re-formed (in the
                # shrink, or in a call on the group just made): re-form
                # again from wherever this got to; the agreement and the
                # shrink start afresh (_recover keeps them apart).
                _log("rank %d: re-forming failed: %s" % (self.rank,
                                                         str(e).splitlines()[0][:200]))
                err = e

    # ---- loss ---------------------------------------------------------------------

    def _recover(self, op, err, outputs, counted):
        """Re-forms after op failed; True when op's result came from a
        survivor that had completed it (the caller returns), False when
        it must run again on the new group."""
        t0 = time.time()
        _log("rank %d of %d: call #%d failed: %s" % (self.rank, self.size, op.seq,
                                                     str(err).splitlines()[0][:200]))
        self.events.append((t0, "failure", op.seq))
        if self.membership == "geoccl":
            dead = self.pg.failed_ranks()
            if not dead:
                raise MembershipError("geoccl.elastic: a call failed but no rank is gone: %s"
                                      % err)
        else:
            dead = self._agree_dead()
        t1 = time.time()
        old_rank, old_size = self.rank, self.size
        try:
            self.pg = self.pg.shrink(dead, True, None)
        except Exception:
            # A survivor died in the shrink: it failed on every survivor.
            # The next agreement is on this group again, under a new epoch
            # (the same on all: each counted this attempt), so that it
            # starts from nothing; the beats follow self.epoch.
            self.epoch += 1
            raise
        self.epoch += 1
        self.seq = op.seq  # this op keeps its number in the new stream
        t2 = time.time()
        # Who completed op? Each rank puts the op it failed in its slot:
        # failed at op.seq means it lacks op's result; op.seq + 1 means it
        # completed op.seq and failed on the next one (this op is that one).
        n = self.size
        v = torch.zeros(n, dtype=torch.int64)
        v[self.rank] = op.seq
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        self.pg.allreduce([v], opts).wait()
        k = int(v.min())
        done = [r for r in range(n) if int(v[r]) > k]
        self.events.append((t2, "re-formed", (old_rank, old_size, self.rank, self.size, dead)))
        _log("ranks %s gone: rank %d of %d is rank %d of %d; agreed in %.2f s, shrunk in "
             "%.2f s" % (dead, old_rank, old_size, self.rank, self.size, t1 - t0, t2 - t1))
        if not done:
            return False  # nobody has op k's result: run it again here
        # Survivor done[0] completed op k: its result (every rank counted)
        # goes to those that did not; they return it, the others rerun op.
        src = done[0]
        if op.seq == k:  # this rank lacks op k's result
            for t in outputs:
                self._bcast(t, src)
            if counted is not None:
                c = torch.tensor([0], dtype=torch.int64)
                self._bcast(c, src)
                counted[0] = int(c)
            self._last = (op, [t.detach().clone() for t in outputs], counted and counted[0])
            return True
        # This rank completed op k (self._last) and now reruns op k + 1.
        last_op, kept, last_counted = self._last
        for t in kept:
            self._bcast(t, src)
        if last_counted is not None:
            self._bcast(torch.tensor([last_counted], dtype=torch.int64), src)
        self.seq = op.seq
        return False

    def _bcast(self, t, src):
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self.pg.broadcast([t], opts).wait()

    def _agree_dead(self):
        """The ranks of this epoch's group that are gone, the same list on
        every survivor (the first to decide writes it). Few store round
        trips per look (the store may be a WAN round trip away): the
        survivors set their bit in one counter (an add of 1 << rank), and
        only the ranks missing there have their beats read."""
        me, n = self.rank, self.size
        st = self._store
        self._st(st.add, self._key("broken"), 1)
        self._st(st.add, self._key("here"), 1 << me)
        seen = {}  # rank -> (beat count, when it last moved)
        deadline = time.monotonic() + self.timeout.total_seconds()
        while True:
            try:
                decided = self._st(st.add, self._key("decided"), 0)
                here = self._st(st.add, self._key("here"), 0)
                beats = {r: self._st(st.add, self._key("beat", r), 0)
                         for r in range(n) if not here >> r & 1}
            except Exception as ex:
                raise MembershipError("geoccl.elastic: the store is gone (%s): the survivors "
                                      "cannot agree without it" % ex)
            if decided:
                break
            now = time.monotonic()
            if now > deadline:
                raise MembershipError("geoccl.elastic: rank %d: no agreement on the ranks gone "
                                      "within %s; still unsure of ranks %s" % (
                                          me, self.timeout, sorted(beats)))
            gone, unsure = [], False
            for r, b in beats.items():
                if r not in seen or seen[r][0] != b:
                    seen[r] = (b, now)
                if now - seen[r][1] >= self.detect:
                    gone.append(r)
                else:
                    unsure = True
            if not unsure:
                if self._st(st.add, self._key("decider"), 1) == 1:
                    self._st(st.set, self._key("dead"), ",".join(map(str, gone)))
                    self._st(st.add, self._key("decided"), 1)
                    break
            time.sleep(0.01)
        raw = self._st(st.get, self._key("dead")).decode()
        dead = [int(x) for x in raw.split(",") if x]
        if any(r < 0 or r >= n for r in dead):
            raise MembershipError("geoccl.elastic: the store names ranks %s gone in a group of %d"
                                  % (dead, n))
        if me in dead:
            raise MembershipError("geoccl.elastic: rank %d was taken for gone by the others "
                                  "(it did not beat for %.1f s); it must stop" % (me, self.detect))
        if not dead:
            raise MembershipError("geoccl.elastic: a call failed but every rank is alive")
        return dead

    # ---- round boundary -----------------------------------------------------------

    def end_round(self):
        """Ends the round: round += 1 everywhere. Returns False on a rank
        that leaves here (it must stop using the group), True on the
        others, after leavers are gone and joiners have the state."""
        info = {}

        def run(pg):
            n = pg.size()
            v = torch.zeros(n + 3, dtype=torch.int64)
            v[pg.rank()] = 1 if self._leave else 0
            if self.membership == "geoccl":
                v[n] = pg.joiners_waiting()
            else:
                v[n] = self._tickets if pg.rank() == 0 else 0
            v[n + 1] = self.round
            v[n + 2] = -self.round
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.MAX
            self._wait(pg.allreduce([v], opts))
            info["v"] = v
            return v

        self._do(run, [])
        v = info["v"]
        n = self.size
        if int(v[n + 1]) != -int(v[n + 2]):
            raise MembershipError("geoccl.elastic: the members are at different rounds (%d to "
                                  "%d)" % (-int(v[n + 2]), int(v[n + 1])))
        self.round += 1
        leavers = [r for r in range(n) if int(v[r])]
        tickets = int(v[n])
        if self.membership == "geoccl":
            return self._grow_geoccl(leavers, tickets)
        if leavers:
            if self.rank in leavers:
                _log("rank %d of %d leaves after round %d" % (self.rank, n, self.round))
                self.pg.quiesce()
                self.events.append((time.time(), "left", self.round))
                return False
            if len(leavers) == n:
                return False
            old = self.rank
            self.pg = self.pg.shrink(leavers, False, None)
            self.epoch += 1
            self.seq = 0
            self.events.append((time.time(), "leavers", leavers))
            _log("ranks %s left after round %d: rank %d is rank %d of %d" % (
                leavers, self.round, old, self.rank, self.size))
        if tickets > self.admitted:
            self._grow(tickets)
        return True

    # ---- joining ------------------------------------------------------------------

    def _grow(self, tickets):
        """Admits the joiners with tickets admitted+1 .. tickets: every
        member and joiner forms the grown group (a new communicator through
        the store), then rank 0 sends the state."""
        t0 = time.time()
        k = tickets - self.admitted
        n = self.size
        epoch = self.epoch + 1
        if self.rank == 0:
            for i in range(k):
                key = "join/admit/%d" % (self.admitted + 1 + i)
                self._st(self._store.set, key, "%d %d %d" % (epoch, n + i, n + k))
                self._st(self._store.add, key + "/ready", 1)  # what the joiner polls
        grown = self._form(epoch, self.rank, n + k)
        self.pg.quiesce()
        self.pg = grown
        self.epoch = epoch
        self.seq = 0
        self.admitted = tickets
        self._send_state()
        self.events.append((time.time(), "joined", (k, self.size, time.time() - t0)))
        _log("%d joiner(s) admitted after round %d: %d ranks (%.2f s)" % (
            k, self.round, self.size, time.time() - t0))

    def _grow_geoccl(self, leavers, joiners):
        """geocclCommGrow, when someone leaves or waits: every member calls
        it; the leader admits the joiners it finds registered."""
        if not leavers and not joiners:
            return True
        t0 = time.time()
        n = self.size
        if self.rank in leavers:
            self.pg.leave()
        grown = self.pg.grow()
        if grown is None:
            if self.rank in leavers:
                self.pg.quiesce()
                _log("rank %d of %d leaves after round %d" % (self.rank, n, self.round))
                self.events.append((time.time(), "left", self.round))
                return False
            return True  # the joiners counted had gone
        self.pg = grown
        self.epoch += 1
        self.seq = 0
        if self.size > n - len(leavers):
            self._send_state()
        self.events.append((time.time(), "grown", (leavers, n, self.size, time.time() - t0)))
        _log("after round %d: %s left, %d joined: %d ranks (%.2f s)" % (
            self.round, leavers, self.size - (n - len(leavers)), self.size, time.time() - t0))
        return True

    def _form(self, epoch, rank, size):
        store = dist.PrefixStore("%s%d/grow/" % (PREFIX, epoch), self._base)
        return _C.ProcessGroupGeoCCL(store, rank, size, self.timeout)

    @classmethod
    def join(cls, state_fn, store=None, timeout=None, **kw):
        """A new process enters the running job: waits until the members
        admit it at a round boundary, then receives the round and the state
        (state_fn()'s tensors, written in place) and is a member."""
        timeout = timeout if timeout is not None else dist.distributed_c10d.default_pg_timeout
        if (kw.get("membership") or _membership()) == "geoccl":
            t0 = time.time()
            _log("waiting to join (geocclCommJoin)")
            pg = _C.ProcessGroupGeoCCL.join(store if store is not None else dist.HashStore(),
                                            timeout)
            el = cls(state_fn, store=store, timeout=timeout, _pg=pg, _epoch=1, **kw)
            el._send_state()
            _log("joined as rank %d of %d at round %d (%.2f s after asking)" % (
                el.rank, el.size, el.round, time.time() - t0))
            return el
        base = store if store is not None else _default_store()
        st = dist.PrefixStore(PREFIX, base)
        ticket = st.add("join/tickets", 1)
        t0 = time.time()
        _log("waiting to join (ticket %d)" % ticket)
        # The members admit at their next round boundary; a job that ends
        # first says so (close(finished=True) on its rank 0).  Polled with
        # add(key, 0), not a wait with a timeout: torch's TCPStore leaves a
        # timed-out wait's answer on the connection and its short timeout
        # on the socket, and the next request then reads that (a joiner's
        # get of its admission failed so with "Socket Timeout").
        key = "join/admit/%d" % ticket
        while not st.add(key + "/ready", 0):
            if st.add("done", 0):
                raise MembershipError("geoccl.elastic: the job ended before it admitted "
                                      "this process")
            if time.time() - t0 > timeout.total_seconds():
                raise MembershipError("geoccl.elastic: not admitted within %s" % timeout)
            time.sleep(0.05)
        epoch, rank, size = (int(x) for x in st.get(key).decode().split())
        pg = _C.ProcessGroupGeoCCL(dist.PrefixStore("%s%d/grow/" % (PREFIX, epoch), base),
                                   rank, size, timeout)
        el = cls(state_fn, store=base, timeout=timeout, _pg=pg, _epoch=epoch, **kw)
        el._send_state()
        _log("joined as rank %d of %d at round %d (%.2f s after asking)" % (
            el.rank, el.size, el.round, time.time() - t0))
        return el

    def _send_state(self):
        """Rank 0's round, admitted count and state to every rank; then the
        state's hash, all-reduced, must be the same on every rank."""
        head = torch.tensor([self.round, self.admitted], dtype=torch.int64)
        self._bcast(head, 0)
        self.round, self.admitted = int(head[0]), int(head[1])
        for t in self.state_fn():
            if t.is_contiguous():
                self._bcast(t, 0)
            else:
                c = t.contiguous()
                self._bcast(c, 0)
                t.copy_(c)
        h = state_hash(self.state_fn(), self.round)
        v = torch.tensor([h, -h], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        self.pg.allreduce([v], opts).wait()
        if int(v[0]) != -int(v[1]):
            raise MembershipError("geoccl.elastic: the state differs between ranks after it "
                                  "was sent (hash %x here)" % h)

    def identical(self):
        """True when every rank's state_fn() is bit-identical (a hash,
        all-reduced)."""
        h = state_hash(self.state_fn(), self.round)
        v = torch.zeros(2, dtype=torch.int64)

        def fn(pg):
            v.copy_(torch.tensor([h, -h], dtype=torch.int64))
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.MAX
            return pg.allreduce([v], opts)

        self.run(fn, [v])
        return int(v[0]) == -int(v[1])


def state_hash(tensors, round_=0):
    """A 62-bit hash of the tensors' bytes (and the round)."""
    m = hashlib.blake2b(digest_size=8)
    m.update(str(round_).encode())
    for t in tensors:
        m.update(t.detach().contiguous().cpu().numpy().tobytes())
    return int.from_bytes(m.digest(), "little") & ((1 << 62) - 1)
