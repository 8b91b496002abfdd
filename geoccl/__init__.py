"""GeoCCL's Python package.

``import geoccl.torch`` registers the ``geoccl`` backend of
torch.distributed (see geoccl/torch.py). The compiled part, ``geoccl._C``,
is built by GeoCCL's own build (``make``) when configure found a Python 3
with PyTorch."""
