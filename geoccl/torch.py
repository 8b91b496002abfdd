"""The ``geoccl`` backend of torch.distributed.

    import geoccl.torch
    torch.distributed.init_process_group("geoccl")   # env://, a store, ...

Importing this module registers the backend. The communicator's unique id
(the bootstrap root's address and the communicator's secret) travels
through the process group's store: whoever can read the store can join the
communicator, so keep the store on a trusted network (as the store itself
already requires).

CPU tensors take GeoCCL's host path; CUDA tensors its device path (when
``geoccl._C.cuda`` is true). GeoCCL's environment (GEOCCL_COMPRESS,
GEOCCL_TIMEOUT, GEOCCL_REGION, ...) applies as it does to any program.
"""
import torch.distributed as _dist

try:
    from geoccl import _C
except ImportError as e:  # the extension was not built, or libgeoccl is missing
    raise ImportError(
        "geoccl.torch needs the compiled extension geoccl._C, which GeoCCL's "
        "build makes when configure finds a Python 3 with PyTorch "
        "(./configure --with-python=/usr/bin/python3): %s" % e) from e

ProcessGroupGeoCCL = _C.ProcessGroupGeoCCL
BACKEND = "geoccl"


def _create(store, rank, world_size, timeout):
    return _C.ProcessGroupGeoCCL(store, rank, world_size, timeout)


def _register():
    if BACKEND.upper() in getattr(_dist.Backend, "_plugins", {}):
        return
    if _C.torch_api == "Backend":
        # torch 2.x: the plugin makes a c10d Backend for these devices.
        try:
            _dist.Backend.register_backend(BACKEND, _create,
                                           devices=["cpu", "cuda"] if _C.cuda else ["cpu"])
        except TypeError:  # 2.0 has no devices argument
            _dist.Backend.register_backend(BACKEND, _create)
    else:
        _dist.Backend.register_backend(BACKEND, _create)


_register()
