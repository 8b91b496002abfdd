#!/bin/sh
# Runs the pytest suite of the torch.distributed backend (tests/torch/) with
# the extension of this build tree. Exits 77 (automake's "skipped"), saying
# why, when configure found no PyTorch, the extension was not built, or the
# interpreter has no pytest.
#
# make check runs it from the top build directory with GEOCCL_HAVE_TORCH,
# GEOCCL_PYTHON and GEOCCL_TEST_SRCDIR in the environment.
set -u

srcdir=${GEOCCL_TEST_SRCDIR:-${srcdir:-.}}
builddir=${GEOCCL_TEST_BUILDDIR:-.}
python=${GEOCCL_PYTHON:-/usr/bin/python3}

if [ "${GEOCCL_HAVE_TORCH:-no}" != yes ]; then
  echo "configured without PyTorch (no Python 3 with torch and its headers); skipping"
  exit 77
fi
if [ ! -f "$builddir/geoccl/_C.so" ]; then
  echo "$builddir/geoccl/_C.so was not built; skipping"
  exit 77
fi
if ! "$python" -c 'import pytest' 2>/dev/null; then
  echo "$python has no pytest (python3-pytest); skipping"
  exit 77
fi

# The build tree's geoccl/ (with _C.so) must win over any installed one.
PYTHONPATH="$builddir${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
exec "$python" -m pytest -q -p no:cacheprovider "$srcdir/tests/torch/test_backend.py"
