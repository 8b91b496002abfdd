#!/bin/sh
# PyTorch's distributed test suite, run for gloo and for geoccl side by
# side (tests/torch/dist_suite.py drives it; docs/pytorch.md has the
# figures). Prints each test's outcome for both, the totals, and the tests
# that pass for gloo but not for geoccl; exits 1 when there are any.
#
#   tests/torch/dist_suite.sh [-o DIR] [-t SECONDS] [-p] [TEST ...]
#
#   -o DIR      where the per-backend outcomes (gloo.tsv, geoccl.tsv) and
#               logs go (default: a new folder under /tmp, kept)
#   -t SECONDS  a test that runs longer is killed and reported as a hang
#               (default 120)
#   -p          run the two backends at the same time (twice as fast on
#               enough cores; on 2 cores timing-sensitive tests may suffer)
#   TEST        test names or substrings of them (default: all 279)
#
# Run from the top of a build tree (or set GEOCCL_TEST_BUILDDIR), whose
# geoccl/_C.so is used, or anywhere with geoccl installed for the Python in
# GEOCCL_PYTHON (default: the build's, else /usr/bin/python3). The full run
# takes about half an hour per backend on 2 busy cores.
set -u

here=$(cd "$(dirname "$0")" && pwd)
builddir=${GEOCCL_TEST_BUILDDIR:-.}
python=${GEOCCL_PYTHON:-}
if [ -z "$python" ] && [ -f "$builddir/Makefile" ]; then
  python=$(sed -n 's/^PYTHON = //p' "$builddir/Makefile")
fi
python=${python:-/usr/bin/python3}

out="" timeout=120 parallel=no
while getopts "o:t:p" opt; do
  case $opt in
    o) out=$OPTARG ;;
    t) timeout=$OPTARG ;;
    p) parallel=yes ;;
    *) sed -n '2,20s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

if [ -f "$builddir/geoccl/_C.so" ]; then
  builddir=$(cd "$builddir" && pwd)
  PYTHONPATH="$builddir${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONPATH
fi
if ! "$python" -c 'import geoccl.torch' >/dev/null 2>&1; then
  echo "dist_suite.sh: $python cannot import geoccl.torch (build GeoCCL with PyTorch, or install it)" >&2
  exit 77
fi
[ -n "$out" ] || out=$(mktemp -d /tmp/dist_suite.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)

run() {  # backend [TEST ...]
  b=$1
  shift
  # each backend in a scratch folder of its own: the suite writes there
  dir=$(mktemp -d "$out/$b.tmp.XXXXXX")
  (cd "$dir" && TEMP_DIR="$dir" "$python" "$here/dist_suite.py" --backend "$b" \
     --timeout "$timeout" --out "$out/$b.tsv" "$@" >"$out/$b.log" 2>&1)
  tail -n 1 "$out/$b.log"
  rm -rf "$dir"
}

echo "outcomes and logs: $out"
if [ "$parallel" = yes ]; then
  run gloo "$@" &
  run geoccl "$@"
  wait
else
  run gloo "$@"
  run geoccl "$@"
fi
"$python" "$here/dist_suite.py" --compare "$out/gloo.tsv" "$out/geoccl.tsv"
