"""GeoCCL's Python package.

``import geoccl.torch`` registers the ``geoccl`` backend of
torch.distributed (see geoccl/torch.py); ``python -m geoccl`` says what
this copy was built with (geoccl/__main__.py). The compiled part,
``geoccl._C``, is built against the torch of one interpreter: by
``pip install --no-build-isolation .`` (setup.py) for the environment it
runs in, or by GeoCCL's own build (``make``, ``make install``) when
configure found a Python 3 with PyTorch."""
