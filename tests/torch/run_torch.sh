#!/bin/sh
# Runs the pytest suite of the torch.distributed backend (tests/torch/) with
# the extension of this build tree. Exits 77 (automake's "skipped"), saying
# why, when configure found no PyTorch, the extension was not built, or the
# interpreter has no pytest.
#
# make check runs it from the top build directory with GEOCCL_HAVE_TORCH,
# GEOCCL_PYTHON and GEOCCL_TEST_SRCDIR in the environment; without
# GEOCCL_PYTHON it takes PYTHON from the build's Makefile.
set -u

srcdir=${GEOCCL_TEST_SRCDIR:-${srcdir:-.}}
builddir=${GEOCCL_TEST_BUILDDIR:-.}
# Run by hand: the interpreter configure found (its torch is the one _C.so
# was built against; another torch's would fail to load it).
python=${GEOCCL_PYTHON:-}
if [ -z "$python" ] && [ -f "$builddir/Makefile" ]; then
  python=$(sed -n 's/^PYTHON = //p' "$builddir/Makefile")
fi
python=${python:-/usr/bin/python3}

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

# Built with sanitizers (tests/run-sanitizers.sh): the interpreter was not,
# and the sanitizer runtimes must load before anything else, so they are
# preloaded (the ones _C.so links); Python's own allocations at exit are
# not this project's leaks.
# There the two second-loss scenarios of test_elastic.py are left out: they
# run the same C++ shrink as the first loss, and with it the whole torch
# test took 142 s of the sanitizer stage, the suite's longest path.
set --
if [ -n "${GEOCCL_SANITIZE:-}" ]; then
  rt=$(ldd "$builddir/geoccl/_C.so" | awk '$1 ~ /^lib(asan|ubsan|tsan)\.so/ {print $3}' | tr '\n' ' ')
  LD_PRELOAD="$rt${LD_PRELOAD:+ $LD_PRELOAD}"
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  export LD_PRELOAD ASAN_OPTIONS
  set -- -k "not second_loss"
fi

# The build tree's geoccl/ (with _C.so) must win over any installed one.
PYTHONPATH="$builddir${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
exec "$python" -m pytest -q -p no:cacheprovider "$@" \
    "$srcdir/tests/torch/test_backend.py" "$srcdir/tests/torch/test_elastic.py"
