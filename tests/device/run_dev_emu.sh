#!/usr/bin/env bash
#
# The device-buffer path (comm/coll_device.c, comm/nccl_real.c, the codec
# kernels) run end to end without a GPU: tests/device/dev_allreduce, built
# as dev_allreduce-emu against the emulated CUDA runtime and kernels, with
# the one-rank emulated NCCL as "NVIDIA's" (see Makefile.am).  Every rank is
# its own region, so every call crosses regions: the exact all-reduce, the
# GPU-encoded codecs, the host codecs (GEOCCL_CUDA_CODECS=0) and the staged
# collectives, with 2 and 3 ranks.  dev_allreduce checks the results and
# that the ranks agree bit for bit; any failure fails this test.
#
# GEO_EMU_TIMEOUT bounds every emulated wait (a hang aborts the rank);
# GEOCCL_TIMEOUT bounds GeoCCL's own.
set -u
build="${GEOCCL_TEST_BUILDDIR:-$PWD}"
bin="$build/tests/device/dev_allreduce-emu"
lib="$build/tests/device/.libs/libnccl_emu.so"
[ -x "$bin" ] || { echo "SKIP: $bin not built (configured without CUDA)"; exit 77; }
[ -f "$lib" ] || { echo "FAIL: $lib missing"; exit 1; }
export GEOCCL_NCCL_LIB="$lib"
export GEOCCL_SOCKET_IFNAME="${GEOCCL_SOCKET_IFNAME:-lo}"
export GEOCCL_TIMEOUT="${GEOCCL_TIMEOUT:-60}"
export GEO_EMU_TIMEOUT="${GEO_EMU_TIMEOUT:-90}"
mib=1
failed=0
run() {
    local t0=$SECONDS
    echo "== $*"
    if ! "$@"; then
        echo "FAIL: $*"
        failed=$((failed + 1))
    fi
    echo "   ($((SECONDS - t0)) s)"
}
# The emulated kernels run some 10^5 to 10^6 elements a second: the codec
# checks leave out the 4 Mi-element count (DEV_ALLREDUCE_MAX_COUNT), topk
# (the slowest kernels) keeps the 1000-element count only; the 1 MiB
# timing calls still run it over several rounds of sub-chunks.
big=1048579
for n in 2 3; do
    run "$bin" "$n" "$mib"
    run env DEV_ALLREDUCE_MAX_COUNT=$big "$bin" "$n" "$mib" int8
    run env DEV_ALLREDUCE_MAX_COUNT=$big "$bin" "$n" "$mib" sign
    run env DEV_ALLREDUCE_MAX_COUNT=1000 "$bin" "$n" "$mib" topk:0.05
    run "$bin" "$n" "$mib" staged
    run env GEOCCL_CUDA_CODECS=0 "$bin" "$n" "$mib" int8
done
[ "$failed" -eq 0 ] || { echo "FAIL: $failed run(s) of dev_allreduce-emu failed"; exit 1; }
echo "PASS: dev_allreduce-emu, 2 and 3 ranks: exact, int8, sign, topk, staged, host int8"
