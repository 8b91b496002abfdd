#!/usr/bin/env bash
#
# The device bundle, proved complete without a GPU: tests/device/bundle.sh
# builds it (its own build folder, kept between runs: only what changed is
# rebuilt; torch 2.11's wheel comes from the cache, or is downloaded once,
# which this test says), then tests/device/run.sh --bundle DIR --emulate
# runs every stage from it on the CPU emulation, with no compiler.  A file,
# library or stage missing from the bundle fails here.  The times of both
# are printed; the emulated run must take at most 5 minutes.
#
# Skips (77) without the CUDA toolkit (configured without CUDA), or when
# the torch wheel is neither cached nor downloadable.
set -u
build="${GEOCCL_TEST_BUILDDIR:-$PWD}"
src="${GEOCCL_TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
grep -q '^#define HAVE_CUDA 1' "$build/config.h" 2>/dev/null ||
    { echo "SKIP: configured without CUDA"; exit 77; }
work="$build/tests/device/bundle-test"
bundle="$work/bundle"
mkdir -p "$work"
cache=${GEOCCL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/geoccl}
if [ -f "$cache/wheels/torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl" ]; then
    echo "torch 2.11.0 wheel: cached in $cache/wheels"
else
    echo "torch 2.11.0 wheel: not cached in $cache/wheels: bundle.sh downloads it (about 530 MB)"
fi
t0=$SECONDS
bash "$src/tests/device/bundle.sh" --build "$work/build" "$bundle" >"$work/bundle.log" 2>&1
rc=$?
tb=$((SECONDS - t0))
cat "$work/bundle.log"
if [ $rc != 0 ]; then
    if grep -q 'pip could not download' "$work/bundle.log"; then
        echo "SKIP: no torch 2.11 wheel (not cached, no download)"
        exit 77
    fi
    echo "FAIL: bundle.sh (${tb}s)"
    exit 1
fi
echo "bundle.sh: ${tb}s"
# No compiler may be used: the emulated run sees none on its PATH.
nocc="$work/nocc"
mkdir -p "$nocc"
for c in gcc cc g++ c++ clang nvcc ld make; do
    printf '#!/bin/sh\necho "run.sh --emulate called %s" >&2\nexit 99\n' "$c" >"$nocc/$c"
    chmod +x "$nocc/$c"
done
t0=$SECONDS
PATH="$nocc:$PATH" bash "$bundle/run.sh" --bundle "$bundle" --emulate --out "$work/out"
rc=$?
te=$((SECONDS - t0))
echo "run.sh --emulate: ${te}s (bundle.sh ${tb}s)"
if grep -q 'run.sh --emulate called' "$work/out/run.log"; then
    echo "FAIL: the emulated run called a compiler or make"
    exit 1
fi
[ $rc = 0 ] || { echo "FAIL: run.sh --bundle --emulate (see $work/out/run.log)"; exit 1; }
# Every stage a GPU run has ran here too, and left its result.
for st in environment NCCL "codec check" "codec throughput" "pinned memory CMA" \
        "device all-reduce" "pass-through vs NCCL" "capture and abort" "device modes" \
        "torch backend CUDA" compute-sanitizer summary; do
    grep -q "^=== $st ===" "$work/out/run.log" || { echo "FAIL: no stage \"$st\" in the run"; exit 1; }
done
for r in "bundle: pass" "NCCL: pass" "codec check: pass" "codec throughput: pass" \
        "device all-reduce x4: pass" "device all-reduce x3 topk:0.05: pass" \
        "pass-through vs NCCL: pass" "capture: pass" "capture refuse: pass" "abort: pass" \
        "device hostfn: pass" "torch backend CUDA: na (emulated: not run; link check passed" \
        "compute-sanitizer: na"; do
    grep -qF "$r" "$work/out/summary.txt" || { echo "FAIL: the summary lacks \"$r\""; exit 1; }
done
[ "$te" -le 300 ] || { echo "FAIL: the emulated run took ${te}s, over 5 minutes"; exit 1; }
echo "PASS: device bundle built (${tb}s) and run emulated (${te}s)"
