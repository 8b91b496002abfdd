#!/bin/sh
# A part of PyTorch's distributed suite (tests/torch/dist_suite.py) that
# fits the test suite's time, for geoccl alone: the coalesced collectives,
# receives from any source, batches of isend/irecv, and the gathers. Gloo
# passes every one of them
# (the full side-by-side run, tests/torch/dist_suite.sh, shows it), so each
# must pass here, not be skipped; except where the suite itself skips a
# test for every backend at its 3 ranks (torch 2.x's subgroup tests want 8:
# "Skipped due to small world size."). Exits 77, saying why, without
# PyTorch, the extension, or where the suite's modules do not import.
set -u

srcdir=${GEOCCL_TEST_SRCDIR:-${srcdir:-.}}
builddir=${GEOCCL_TEST_BUILDDIR:-.}
python=${GEOCCL_PYTHON:-}
if [ -z "$python" ] && [ -f "$builddir/Makefile" ]; then
  python=$(sed -n 's/^PYTHON = //p' "$builddir/Makefile")
fi
python=${python:-/usr/bin/python3}

if [ "${GEOCCL_HAVE_TORCH:-no}" != yes ]; then
  echo "configured without PyTorch; skipping"
  exit 77
fi
if [ ! -f "$builddir/geoccl/_C.so" ]; then
  echo "$builddir/geoccl/_C.so was not built; skipping"
  exit 77
fi
if [ -n "${GEOCCL_SANITIZE:-}" ]; then
  echo "a sanitizer build: the suite's spawned interpreters are not instrumented; skipping"
  exit 77
fi
builddir=$(cd "$builddir" && pwd)
PYTHONPATH="$builddir${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
if ! "$python" -c 'import torch.testing._internal.distributed' >/dev/null 2>&1; then
  echo "$python has no torch.testing._internal.distributed; skipping"
  exit 77
fi

work=$(mktemp -d /tmp/geoccl_dist_subset.XXXXXX)
trap 'rm -rf "$work"' EXIT
tests="all_gather_coalesced all_reduce_coalesced any_source batch_isend_irecv_gloo test_gather test_gather_checks"
# shellcheck disable=SC2086
(cd "$work" && TEMP_DIR="$work" "$python" "$srcdir/tests/torch/dist_suite.py" --backend geoccl \
   --timeout 60 --out "$work/geoccl.tsv" $tests >"$work/log" 2>&1)
rc=$?
if [ ! -s "$work/geoccl.tsv" ]; then
  tail -n 30 "$work/log"
  echo "FAIL: the suite ran no test (exit $rc)"
  exit 1
fi
cut -f 1-3 "$work/geoccl.tsv"
n=$(wc -l <"$work/geoccl.tsv")
small="Skipped due to small world size."
bad=$(awk -F '\t' -v small="$small" '$2 != "pass" && !($2 == "skip" && $4 == small)' \
        "$work/geoccl.tsv")
if [ -n "$bad" ]; then
  echo "FAIL: of $n tests, these did not pass:"
  echo "$bad"
  exit 1
fi
skipped=$(awk -F '\t' '$2 == "skip"' "$work/geoccl.tsv" | wc -l)
if [ "$skipped" -eq 0 ]; then
  echo "PASS: $n tests of PyTorch's distributed suite pass for geoccl"
else
  echo "PASS: $((n - skipped)) tests of PyTorch's distributed suite pass for geoccl," \
       "$skipped skipped by the suite for every backend (too few ranks)"
fi
