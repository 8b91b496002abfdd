"""What the two examples share: the digits data, the model, starting the
ranks (torchrun's env:// or --nprocs on this host) and choosing the backend."""
import argparse
import datetime
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def arguments(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--backend", choices=["geoccl", "gloo"], default="geoccl")
    ap.add_argument("--nprocs", type=int, default=4,
                    help="ranks to start on this host when not run by torchrun")
    ap.add_argument("--regions", type=int, default=1,
                    help="label the ranks with this many GEOCCL_REGIONs (consecutive ranks "
                         "share one), so that GeoCCL's hierarchical all-reduce and "
                         "GEOCCL_COMPRESS apply between them")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    return ap


def digits():
    """sklearn's 8x8 digits: (train x, train y, test x, test y), 80/20 split."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    x, y = x[perm], y[perm]
    cut = int(0.8 * len(y))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def mlp(hidden, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def setup(args, rank, world):
    """What init does before the group forms (a process that joins a
    running job, diloco.py --join, needs only this)."""
    # Several ranks share this host's cores: one intra-op thread each keeps
    # them from fighting over the cores (the same for both backends).
    torch.set_num_threads(args.threads)
    if args.regions > 1:
        os.environ["GEOCCL_REGION"] = "r%d" % (rank * args.regions // world)
    if args.backend == "geoccl":
        import geoccl.torch  # noqa: F401  registers the backend
    os.environ.setdefault("GEOCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def init(args, rank, world):
    setup(args, rank, world)
    dist.init_process_group(args.backend, init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))


def launch(main, args):
    """Under torchrun: main(args, rank, world) here. Else --nprocs ranks."""
    if "RANK" in os.environ:
        main(args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    s.close()
    mp.spawn(_spawned, args=(main, args), nprocs=args.nprocs)


def _spawned(rank, main, args):
    main(args, rank, args.nprocs)
