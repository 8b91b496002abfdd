"""The ``geoccl`` backend of torch.distributed.

    import geoccl.torch
    torch.distributed.init_process_group("geoccl")   # env://, a store, ...

Importing this module registers the backend; ``backend(group)`` gives the
group's ProcessGroupGeoCCL. The communicator's unique id
(the bootstrap root's address and the communicator's secret) travels
through the process group's store: whoever can read the store can join the
communicator, so keep the store on a trusted network (as the store itself
already requires).

CPU tensors take GeoCCL's host path; CUDA tensors its device path (when
``geoccl._C.cuda`` is true). GeoCCL's environment (GEOCCL_COMPRESS,
GEOCCL_TIMEOUT, GEOCCL_REGION, ...) applies as it does to any program.
GEOCCL_TORCH_ANY_SOURCE=1 (on every rank) allows recv without src: each
send then also counts itself in the group's store (one round trip to the
store per send), which is where such a receive finds its sender.

torch.distributed.monitored_barrier refuses every backend but gloo by
name before it reaches the group; importing this module puts
``monitored_barrier`` (below) in its place, which sends the groups of
geoccl to their own monitored barrier and every other group to torch's.
"""
import os as _os

import torch as _torch
import torch.distributed as _dist

try:
    from geoccl import _C
except ImportError as e:  # the extension was not built, or libgeoccl is missing
    raise ImportError(
        "geoccl.torch needs the compiled extension geoccl._C, built for this "
        "torch: `pip install --no-build-isolation <GeoCCL source>` in this "
        "environment, or GeoCCL's build when configure finds a Python 3 with "
        "PyTorch (./configure --with-python=/usr/bin/python3); "
        "`python -m geoccl` says what this copy was built for: %s" % e) from e

ProcessGroupGeoCCL = _C.ProcessGroupGeoCCL
BACKEND = "geoccl"


def backend(group=None):
    """The ProcessGroupGeoCCL behind group (default: the default group),
    whose compression(), set_compression() and stats() are GeoCCL's own.
    With torch 1.x that is the group itself; with 2.x the group is a
    ProcessGroup (GroupGeoCCL) and this is the c10d Backend it dispatches to."""
    pg = _dist.group.WORLD if group is None else group
    if isinstance(pg, ProcessGroupGeoCCL):
        return pg
    b = pg._get_backend(_torch.device("cpu"))
    if not isinstance(b, ProcessGroupGeoCCL):
        raise ValueError("group's backend is %s, not geoccl" % _dist.get_backend(pg))
    return b


class ErrorFeedbackRegistration:
    """A tensor whose memory keeps GeoCCL's error-feedback residuals (see
    register_error_feedback); holds a reference to the tensor, so that its
    memory cannot go to another tensor while registered."""

    def __init__(self, backend_, tensor):
        self._backend = backend_
        self.tensor = tensor
        self._handle = backend_.register_error_feedback(tensor)

    def close(self):
        """Drops the registration and its residuals (after queued work)."""
        if self._handle is not None:
            h, self._handle = self._handle, None
            self._backend.deregister_error_feedback(h)
            self.tensor = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def register_error_feedback(tensor, group=None):
    """Compressed all-reduces into tensor (contiguous, the same tensor from
    call to call: a gradient bucket, a pseudo-gradient) keep error-feedback
    residuals between calls. Without a registration a lossy codec encodes
    without them: GeoCCL cannot tell a tensor from another one that the
    allocator placed at the same address. Returns an
    ErrorFeedbackRegistration (close() it, or use it in a with block)."""
    return ErrorFeedbackRegistration(backend(group), tensor)


def _any_source():
    return _os.environ.get("GEOCCL_TORCH_ANY_SOURCE", "0").strip().lower() in ("1", "yes", "true", "on")


def _create(store, rank, world_size, timeout):
    pg = _C.ProcessGroupGeoCCL(store, rank, world_size, timeout)
    if _any_source():
        pg.enable_any_source()
    return pg


def _create_group(opts, _options=None):
    """torch 2.x's creator (extended_api): torch takes a ProcessGroup from
    it as the group, in place of the one it made (opts.process_group),
    which would name every plugin "custom"; this one names itself "geoccl"
    and keeps the device that group was bound to (init_process_group's
    device_id)."""
    b = _create(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    g = _C.GroupGeoCCL(opts.store, opts.group_rank, opts.group_size, b)
    made = getattr(opts, "process_group", None)
    if made is not None and made.bound_device_id is not None:
        g.bound_device_id = made.bound_device_id
    return g


# torch's own, also when this module is imported a second time
_torch_monitored_barrier = getattr(_dist.monitored_barrier, "_geoccl_wraps",
                                   _dist.monitored_barrier)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier for geoccl's groups as well as
    gloo's: rank 0 waits up to timeout (default: the default group
    timeout) for the other ranks and raises naming the first that missed it
    ("Rank 1 failed to pass monitoredBarrier in 2000 ms"), or every one that
    did with wait_all_ranks=True; the others then raise saying that rank 0
    reported errors. It runs through the group's store, on the calling
    thread, and leaves the group's collectives usable after a failure."""
    c10d = _dist.distributed_c10d
    if group is not None and c10d._rank_not_in_group(group):
        return _torch_monitored_barrier(group, timeout, wait_all_ranks)
    if _dist.get_backend(group) != BACKEND:
        return _torch_monitored_barrier(group, timeout, wait_all_ranks)
    if timeout is None:
        timeout = c10d.default_pg_timeout
    pg = c10d._get_default_group() if group is None else group
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


monitored_barrier._geoccl_wraps = _torch_monitored_barrier


def _register():
    if BACKEND.upper() in getattr(_dist.Backend, "_plugins", {}):
        return
    if _C.torch_api == "Backend":
        # torch 2.x: the plugin makes a c10d Backend for these devices.
        try:
            _dist.Backend.register_backend(BACKEND, _create_group, extended_api=True,
                                           devices=["cpu", "cuda"] if _C.cuda else ["cpu"])
        except TypeError:  # 2.0 has no devices argument
            _dist.Backend.register_backend(BACKEND, _create)
    else:
        _dist.Backend.register_backend(BACKEND, _create)

    if not hasattr(_dist.monitored_barrier, "_geoccl_wraps"):
        _dist.monitored_barrier = monitored_barrier
        _dist.distributed_c10d.monitored_barrier = monitored_barrier


_register()
