#!/bin/sh
# `pip install` of GeoCCL's source tree as a PyTorch user does it, then the
# installed package from outside the tree:
#  - a fresh virtual environment that sees the interpreter's torch: for a
#    system interpreter, python3 -m venv --system-site-packages; for one
#    that is itself in a virtual environment (GEOCCL_PYTHON=/opt/torch2/bin/python),
#    a venv made from it is one of the base interpreter's and would not see
#    that environment's packages, so the new one gets a .pth file naming
#    that environment's site-packages (after its own, so that what pip
#    installs wins), and the system's only where that environment has them;
#  - pip install --no-build-isolation --no-index <source>: no network, so
#    setuptools and wheel come from the system; setup.py drives GeoCCL's
#    autotools build (in a scratch folder, GEOCCL_BUILD_DIR: nothing is
#    written into the source tree);
#  - in a scratch folder: import geoccl.torch (the package must come from
#    the environment, libgeoccl from inside it), python -m geoccl, and DDP
#    over 4 processes with backend "geoccl" on loopback against Gloo
#    (test_backend.py's DDP test, and the registration test).
# Exits 77 (skipped), saying why, when the interpreter has no torch with its
# C++ headers, no venv, or no pytest, setuptools or wheel to run with.
#
# make check runs it with GEOCCL_TEST_SRCDIR (and GEOCCL_PYTHON when
# configure found torch); by hand: sh tests/torch/run_pip_install.sh from
# the source tree.
set -u

srcdir=${GEOCCL_TEST_SRCDIR:-${srcdir:-.}}
srcdir=$(cd "$srcdir" && pwd) || exit 99
# The interpreter configure took, else Debian's (python3-torch), else PATH's.
python=${GEOCCL_PYTHON:-}
if [ -z "$python" ]; then
  if [ -x /usr/bin/python3 ]; then python=/usr/bin/python3; else python=python3; fi
fi

if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "$python has no torch (python3-torch); skipping"
  exit 77
fi
if ! "$python" -c '
import os, sys, torch.utils.cpp_extension as e
h = os.path.join(e.include_paths()[0], "torch/csrc/distributed/c10d/ProcessGroup.hpp")
sys.exit(0 if os.path.exists(h) else 1)' 2>/dev/null; then
  echo "$python has torch without its C++ headers (libtorch-dev); skipping"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/geoccl-pip.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
venv=$tmp/venv
vpy=$venv/bin/python
# The interpreter's own virtual environment, if it is in one: whether it
# sees the system's packages, then its site-packages, one a line.
"$python" - > "$tmp/layer.txt" <<'EOF'
import os, site, sys
if sys.prefix != sys.base_prefix:
    system = False
    for line in open(os.path.join(sys.prefix, "pyvenv.cfg")):
        k, _, v = line.partition("=")
        if k.strip() == "include-system-site-packages":
            system = v.strip().lower() == "true"
    print("system" if system else "isolated")
    print("\n".join(site.getsitepackages()))
else:
    print("system")
EOF
system=
[ "$(head -n 1 "$tmp/layer.txt")" = system ] && system=--system-site-packages
# A venv with its own pip needs ensurepip (python3-venv); without it the
# pip it sees (the system's, or the layered environment's) installs into it.
if ! "$python" -m venv $system "$venv" > "$tmp/venv.log" 2>&1; then
  rm -rf "$venv"
  if ! "$python" -m venv $system --without-pip "$venv" >> "$tmp/venv.log" 2>&1; then
    echo "$python -m venv fails (python3-venv):"
    tail -n 5 "$tmp/venv.log"
    echo "skipping"
    exit 77
  fi
fi
if [ "$(wc -l < "$tmp/layer.txt")" -gt 1 ]; then
  sp=$("$vpy" -c 'import site; print(site.getsitepackages()[0])') || exit 99
  tail -n +2 "$tmp/layer.txt" > "$sp/geoccl-test-layer.pth"
  echo "the new environment also sees: $(tail -n +2 "$tmp/layer.txt" | tr '\n' ' ')"
fi
if ! "$vpy" -m pip --version > /dev/null 2>&1; then
  echo "the virtual environment has no pip (python3-pip or python3-venv); skipping"
  exit 77
fi
want=$("$python" -c 'import torch; print(torch.__version__)')
got=$("$vpy" -c 'import torch; print(torch.__version__)' 2>&1 | tail -n 1)
if [ "$got" != "$want" ]; then
  echo "FAIL: the new environment's torch is $got, not $python's $want"
  exit 1
fi
echo "torch $got in the new environment"
for m in setuptools wheel pytest; do
  if ! "$vpy" -c "import $m" 2>/dev/null; then
    echo "$python has no $m (python3-$m), which this offline build and test need; skipping"
    exit 77
  fi
done

# Outside make's jobserver (its descriptors do not reach setup.py's make
# through pip), and with nothing of the build tree on the path.
unset MAKEFLAGS MFLAGS MAKELEVEL PYTHONPATH
# What the source tree holds before, to see that the build wrote nothing
# there (distcheck makes it read-only).
list_src() { (cd "$srcdir" && ls -a . geoccl); }
list_src > "$tmp/src-before.txt"
# A tree configured in place (tests/run-all.sh builds there) cannot be
# configured again in pip's build folder (setup.py refuses, as configure
# would): then install from a copy of its tracked files, which is what a
# user's fresh clone holds.
src=$srcdir
if [ -f "$srcdir/config.status" ]; then
  if ! git -C "$srcdir" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    echo "$srcdir is configured in place and is not a git checkout to copy; skipping"
    exit 77
  fi
  src=$tmp/src
  mkdir -p "$src" &&
    (cd "$srcdir" && git ls-files -z | tar --null -T - -cf -) | tar -C "$src" -xf - || exit 99
fi
t0=$(date +%s)
if ! GEOCCL_BUILD_DIR=$tmp/build "$vpy" -m pip install --no-build-isolation --no-index \
     --no-cache-dir --disable-pip-version-check "$src" > "$tmp/pip.log" 2>&1; then
  tail -n 40 "$tmp/pip.log"
  echo "FAIL: pip install --no-build-isolation --no-index $src"
  exit 1
fi
echo "pip install: $(( $(date +%s) - t0 )) s"
list_src > "$tmp/src-after.txt"
if ! diff "$tmp/src-before.txt" "$tmp/src-after.txt"; then
  echo "FAIL: the build wrote into $srcdir (above)"
  exit 1
fi

cd "$tmp" || exit 99
fail=0
# The package from the environment, its extension loaded with the
# environment's copy of libgeoccl ($ORIGIN/lib), not a build tree's.
if ! "$vpy" - "$venv" <<'EOF'
import os, sys
import geoccl.torch, geoccl._C, geoccl._build
venv = os.path.realpath(sys.argv[1])
pkg = os.path.realpath(os.path.dirname(geoccl.__file__))
assert pkg.startswith(venv + os.sep), "geoccl imported from %s, not %s" % (pkg, venv)
libs = {os.path.realpath(l.split()[-1]) for l in open("/proc/self/maps") if "libgeoccl" in l}
assert libs == {os.path.join(pkg, "lib", geoccl._build.LIBGEOCCL)}, libs
print("import geoccl.torch: %s (%s), libgeoccl %s" % (pkg, geoccl._C.torch_api, libs.pop()))
EOF
then
  echo "FAIL: import geoccl.torch from the environment"
  fail=1
fi

"$vpy" -m geoccl > "$tmp/info.txt" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  head -n 8 "$tmp/info.txt"
  for want in '^GeoCCL [0-9]' '^built for  *torch ' '^extension  *geoccl._C loads' \
              '^GEOCCL_TIMEOUT ' '^NCCL_SOCKET_IFNAME '; do
    if ! grep -q "$want" "$tmp/info.txt"; then
      echo "FAIL: python -m geoccl printed no line matching $want"
      fail=1
    fi
  done
else
  cat "$tmp/info.txt"
  echo "FAIL: python -m geoccl exited $rc"
  fail=1
fi

# DDP over the installed backend, against Gloo, env:// through a TCPStore
# (the communicator's id, with its secret, travels through the store).
if ! "$vpy" -m pytest -q -p no:cacheprovider "$srcdir/tests/torch/test_backend.py" \
     -k "ddp or registered"; then
  echo "FAIL: DDP over the pip-installed backend"
  fail=1
fi

[ $fail -eq 0 ] && echo "PASS: pip install, import, python -m geoccl, DDP"
exit $fail
