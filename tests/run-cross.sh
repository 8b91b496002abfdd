#!/usr/bin/env bash
#
# The library built for aarch64 (Grace-based GPU nodes are ARM), with
# Debian's cross compiler, from a configured source tree:
#
#   bash tests/run-cross.sh [HOST]          (default HOST aarch64-linux-gnu)
#
# Copies the distributed sources (make distdir), configures them with
# --host=HOST and without the optional packages (their HOST builds are not
# installed here: CUDA, NCCL, zstd, ibverbs, MPI, CUnit, PyTorch), and builds the
# library, the tools and the test programs that need none of them.  Where
# qemu-user runs HOST programs, the codec fuzzer (every decoder on mutated
# input, bounds checked by guards) runs under it for a few seconds.
# Prints "cross HOST: build ok|failed[, fuzz ok|failed|not run (why)] (S s)";
# exit status 0 when the build and what ran passed, 77 when there is no
# cross compiler.  GEOCCL_DISTDIR: sources already copied by make distdir
# (tests/run-all.sh), used as they are instead of a copy of its own.
#
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
[ -n "${GEOCCL_DISTDIR:-}" ] || [ -f Makefile ] ||
    { echo "run-cross: configure the source tree first"; exit 1; }
host=${1:-aarch64-linux-gnu}
command -v "$host-gcc" >/dev/null 2>&1 ||
    { echo "cross $host: skipped ($host-gcc not installed: Debian's gcc-${host%%-*}-linux-gnu)"; exit 77; }

t0=$(date +%s)
work=$(mktemp -d /tmp/geoccl-cross.XXXXXX)
if [ -n "${GEOCCL_DISTDIR:-}" ]; then
    src=$(cd "$GEOCCL_DISTDIR" && pwd) || exit 1
else
    src="$work/src"
    if ! make -s distdir distdir="$src" > "$work/distdir.log" 2>&1; then
        cat "$work/distdir.log"
        echo "cross $host: make distdir failed"
        exit 1
    fi
fi
mkdir -p "$work/build"
cd "$work/build" || exit 1
if ! "$src/configure" --host="$host" --without-cuda --without-nccl --without-zstd \
        --without-ibverbs --without-mpi --without-cunit --without-python > configure.log 2>&1; then
    tail -n 30 configure.log
    echo "cross $host: configure failed (logs in $work)"
    exit 1
fi
# The fuzzer's sanitizers need the HOST sanitizer runtimes, which the cross
# toolchain does not bring.
if ! make -j2 > make.log 2>&1 || ! make -j2 check TESTS= GEOCCL_FUZZ_SANITIZE= > check-build.log 2>&1; then
    grep -E 'error|Error' make.log check-build.log | head -n 30
    echo "cross $host: build failed (logs in $work)"
    exit 1
fi
file -L lib/.libs/libgeoccl.so.0 2>/dev/null | sed 's/^/  /'
status=0
fuzz="not run (no qemu-${host%%-*})"
qemu=$(command -v "qemu-${host%%-*}" || command -v "qemu-${host%%-*}-static" || true)
if [ -n "$qemu" ] && [ -x tests/unit/fuzz_codec ]; then
    sysroot=/usr/$host
    if GEOCCL_FUZZ_SECONDS=5 timeout 300 "$qemu" -L "$sysroot" tests/unit/fuzz_codec > fuzz.log 2>&1; then
        fuzz=ok
    else
        tail -n 20 fuzz.log
        fuzz=failed
        status=1
    fi
fi
echo "cross $host: build ok, fuzz $fuzz ($(( $(date +%s) - t0 )) s)"
[ "$status" -eq 0 ] && rm -rf "$work"
exit "$status"
