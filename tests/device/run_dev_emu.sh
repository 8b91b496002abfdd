#!/usr/bin/env bash
#
# The device-buffer path (comm/device/, the codec kernels) run end to
# end without a GPU: tests/device/dev_allreduce, built
# as dev_allreduce-emu against the emulated CUDA runtime and kernels, with
# the one-rank emulated NCCL as "NVIDIA's" (see Makefile.am).  Every rank is
# its own region, so every call crosses regions: the exact all-reduce, the
# GPU-encoded codecs, the host codecs (GEOCCL_CUDA_CODECS=0) and the staged
# collectives, with 2 and 3 ranks.  dev_allreduce checks the results and
# that the ranks agree bit for bit; any failure fails this test, and so
# does a run whose calls did not take the path it is meant to test (the
# emulation's counts, GEO_EMU_STATS).
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
export GEO_EMU_STATS=1
log=$(mktemp "${TMPDIR:-/tmp}/dev_emu.XXXXXX") || exit 1
trap 'rm -f "$log"' EXIT
mib=1
failed=0

# run KERNELS WAIT ARGS...: KERNELS yes/no: emulated codec kernels ran;
# WAIT word/poll: the streams waited with cuStreamWaitValue32, or with the
# polling kernel (no stream waited on a word, no host function ran; the
# wait kernels are launches, so KERNELS is not checked then).
run() {
    local kernels=$1 wait=$2 t0=$SECONDS ok=1
    shift 2
    echo "== $*"
    "$@" >"$log" 2>&1 || ok=0
    grep -v '^cuda emulation stats' "$log"
    local stats
    stats=$(grep '^cuda emulation stats' "$log")
    if [ "$ok" = 1 ]; then
        if [ -z "$stats" ]; then
            echo "no emulation statistics"; ok=0
        fi
        if [ "$kernels" = yes ] && echo "$stats" | grep -q ' 0 kernel launches'; then
            echo "a rank launched no kernel (GPU path not taken)"; ok=0
        fi
        if [ "$kernels" = no ] && [ "$wait" = word ] &&
            echo "$stats" | grep -qv ' 0 kernel launches'; then
            echo "a rank launched kernels (host path expected)"; ok=0
        fi
        if [ "$wait" = word ] && echo "$stats" | grep -q ' 0 stream waits'; then
            echo "a rank's stream never waited with cuStreamWaitValue32"; ok=0
        fi
        # (hostfn's own blocked host function is one)
        local own=0
        case "$*" in *hostfn*) own=1 ;; esac
        if [ "$wait" = poll ] && echo "$stats" | grep -qv " 0 stream waits on a word, $own host functions"; then
            echo "a rank's stream waited on a word or in a host function (polling kernel expected)"; ok=0
        fi
        if [ "$wait" = poll ] && echo "$stats" | grep -q ' 0 kernel launches'; then
            echo "a rank launched no kernel (polling kernel expected)"; ok=0
        fi
    fi
    if [ "$ok" != 1 ]; then
        echo "FAIL: $*"
        failed=$((failed + 1))
    fi
    echo "   ($((SECONDS - t0)) s)"
}

# The emulated kernels run some 10^5 to 10^6 elements a second: the codec
# checks leave out the 4 Mi-element count (DEV_ALLREDUCE_MAX_COUNT), topk
# (the slowest kernels: on 3 ranks even its 1000-element calls take
# minutes) keeps that count and 2 ranks only; 3 ranks run int8 and sign through the same exchange.  A
# 64 KiB GEOCCL_HIER_SLICE cuts the larger calls in many rounds of
# sub-chunks, so the pipelined schedule (CODEC_PIPELINE_DEPTH,
# comm/device/dev_codec_job.c) runs, not only its one-round case.
# Under the sanitizers (GEOCCL_SANITIZE: tests/run-sanitizers.sh, where the
# emulated kernels run 5-10x slower) the codecs run at 1000 elements and
# topk only queued (below): what the sanitizers look for here is in the
# threads and buffers of the device path, which the exact runs and the
# queued ones cover; the kernels' own memory use is tests/device/codec_emu's
# under address,undefined.  The host codecs' runs (GEOCCL_CUDA_CODECS=0)
# stop at the same count there too (hc): at 4 Mi elements int8 on the host
# takes about a minute a run under the thread sanitizer.
# There too the exact runs check one large count, 65539 elements (odd,
# five 64 KiB slices with GEOCCL_HIER_SLICE=65536: the pipelined exchange
# and an uneven split), instead of 2^20 and 2^20 + 3; the MiB call each run
# ends with still goes through the same pipeline.
big=1048579 tk=1 hc=
if [ -n "${GEOCCL_SANITIZE:-}" ]; then
    big=1000 tk=0 hc=DEV_ALLREDUCE_MAX_COUNT=1000
    export DEV_ALLREDUCE_EXACT_BIG=65539
fi
# Each run ends with one timed call of its 1 MiB after one warm-up
# (DEV_ALLREDUCE_ITERS): an emulated kernel's time says nothing of a GPU's,
# and what is wanted of those calls is the pipelined path with compression;
# more calls would only lengthen the runs under the sanitizers.
export DEV_ALLREDUCE_ITERS="${DEV_ALLREDUCE_ITERS:-1}"
sl=GEOCCL_HIER_SLICE=65536
for n in 2 3; do
    run yes word env $sl "$bin" "$n" "$mib"
    run yes word env $sl DEV_ALLREDUCE_MAX_COUNT=$big "$bin" "$n" "$mib" int8
    run yes word env DEV_ALLREDUCE_MAX_COUNT=$big "$bin" "$n" "$mib" sign
    [ "$n" = 2 ] && [ "$tk" = 1 ] &&
        run yes word env DEV_ALLREDUCE_MAX_COUNT=1000 "$bin" "$n" "$mib" topk:0.05
    run no word "$bin" "$n" "$mib" staged
    run no word env GEOCCL_CUDA_CODECS=0 $hc "$bin" "$n" "$mib" int8
done
# Without stream memory operations (a kernel polls the flag), and with a
# device that lags behind the host (each stream operation delayed).
run yes poll env $sl GEO_EMU_NO_WAIT_VALUE=1 "$bin" 3 "$mib"
run no poll env GEO_EMU_NO_WAIT_VALUE=1 "$bin" 3 "$mib" staged
# Beside another stream's host function that blocks until they are done,
# the all-reduces must finish: their waits may not queue behind it on the
# emulation's one host-function thread (as on CUDA's), with and without
# stream memory operations.
# (Their limits scale with the sanitizers' slowdown, GEOCCL_TEST_TIME_SCALE,
# as the harness's do.)
ts=${GEOCCL_TEST_TIME_SCALE:-1}
run yes word env GEOCCL_TIMEOUT=$((30 * ts)) "$bin" 2 "$mib" hostfn
run yes poll env GEOCCL_TIMEOUT=$((30 * ts)) GEO_EMU_NO_WAIT_VALUE=1 "$bin" 2 "$mib" hostfn
run yes word env $sl GEO_EMU_DELAY_US=1000 "$bin" 3 "$mib"
# A host that polls a slot's event before its completion shows: the query
# answers cudaErrorNotReady, which CUDA keeps as the thread's last error;
# the launches that follow must not read it as theirs (GPU codecs and the
# host exchange).
run yes word env $sl GEO_EMU_QUERY_LAG=3 "$bin" 2 "$mib"
run no word env GEO_EMU_QUERY_LAG=3 GEOCCL_CUDA_CODECS=0 "$bin" 2 "$mib"
run no word env GEO_EMU_DELAY_US=1000 GEOCCL_CUDA_CODECS=0 "$bin" 3 "$mib"
run no word env GEO_EMU_DELAY_US=1000 "$bin" 3 "$mib" staged
# Reproducible stochastic rounding: four int8 calls queued back to back on a
# lagging device must give the results they give when each is waited for
# (the host exchange of a device call rounds with the call's own sequence
# number, not the one the user thread has reached since).
# Likewise a compression set for later calls while these are queued
# (geocclCommSetCompression waits for their exchanges) must not change them.
queued() {
    local c=$1 h= sync
    shift
    for sync in "" 1; do
        run $([ "$c" = 1 ] && echo yes || echo no) word env GEOCCL_CUDA_CODECS=$c \
            GEO_EMU_DELAY_US=5000 ${sync:+DEV_ALLREDUCE_SYNC_EACH=1} "$@"
        h="$h $(sed -n 's/^dev_allreduce: queued calls.*: hash //p' "$log")"
    done
    set -- $h
    if [ $# -ne 2 ] || [ "$1" != "$2" ]; then
        echo "FAIL: GEOCCL_CUDA_CODECS=$c: queued calls and calls waited for differ:$h"
        failed=$((failed + 1))
    fi
}
# Under the sanitizers 10000 elements a call, not 100000: the queued topk
# calls encoded by the emulated kernels would run past GEOCCL_TIMEOUT under
# address,undefined beside codec_emu.
qn=
[ -n "${GEOCCL_SANITIZE:-}" ] && qn=DEV_ALLREDUCE_MAX_COUNT=10000
for c in 0 1; do
    queued $c $qn GEOCCL_COMPRESS_STOCHASTIC=7 "$bin" 2 "$mib" queued:int8
    queued $c $qn DEV_ALLREDUCE_SWITCH=topk:0.5 "$bin" 2 "$mib" queued:topk:0.05
done
# What the device path's phase timing relies on: cudaEventElapsedTime
# refuses events never recorded or made without timing, and answers not
# ready (the thread's last error) for one its stream has not reached.
echo "== $bin events"
GEO_EMU_STATS=0 "$bin" events || { echo "FAIL: events"; failed=$((failed + 1)); }
# Communicators made on GeoCCL's own threads (ncclCommInitAll, inits in a
# group) belong to the device the caller chose, not to device 0; and one
# thread's grouped all-reduce over their devices (nccl-tests -g 3) finds
# NVIDIA's communicator of the region made at init (GEOCCL_NCCL_INIT=auto;
# the emulated NCCL's ranks are threads of this one process).
echo "== GEO_EMU_DEVICES=4 $bin devices"
GEO_EMU_DEVICES=4 GEO_EMU_STATS=0 "$bin" devices || { echo "FAIL: devices"; failed=$((failed + 1)); }
# Under CUDA graph capture: the grouped all-reduce is queued when the
# region's NCCL communicator was made at init, and refused, saying why,
# when it would have to be made inside the capture (GEOCCL_NCCL_INIT=lazy).
for m in "" refuse; do
    echo "== GEO_EMU_DEVICES=4 $bin capture $m"
    GEO_EMU_DEVICES=4 GEO_EMU_STATS=0 GEOCCL_NCCL_INIT=$([ -n "$m" ] && echo lazy || echo auto) \
        "$bin" capture $m || { echo "FAIL: capture $m"; failed=$((failed + 1)); }
done
# Pinned staging: growing sizes free no pinned memory, repeated sizes pin
# nothing new (the emulation counts cudaHostAlloc and cudaFreeHost).
# Device staging likewise: the repeated sizes allocate no device memory
# from the driver (the communicator's own pool keeps it); a device without
# pools falls back to the default one and still gives exact results.
run yes word "$bin" 2 "$mib" pinned
run yes word env GEO_EMU_NO_POOLS=1 "$bin" 2 "$mib"
# Error-feedback residuals belong to registrations, not addresses: memory
# registered again (another tensor at the same address) starts from none,
# unregistered memory keeps none; on the GPU codecs and the host ones.
run yes word "$bin" 2 "$mib" efreuse
run no word env GEOCCL_CUDA_CODECS=0 "$bin" 2 "$mib" efreuse
# ncclCommAbort while another stream of the process and the communicator's
# own are stuck: it must return (the emulated cudaFreeHost, like CUDA's,
# waits for every stream, so a free in abort would hold it).
run yes word "$bin" 2 "$mib" abort
# The caller's thread has another device current than the communicator's:
# events, pinned memory and stream-ordered allocations must still be the
# communicator's device's (the emulation refuses an event recorded on a
# stream of another device), and the caller's device comes back.
run yes word env GEO_EMU_DEVICES=2 DEV_ALLREDUCE_OTHER_DEVICE=1 "$bin" 2 "$mib"
# NCCL_COMM_ID is GeoCCL's bootstrap root: NVIDIA's NCCL must not see it
# (the emulated one, like NVIDIA's, opens rank 0's root at that address:
# GeoCCL's port, and every region's rank 0 the same one).
port=$((20000 + RANDOM % 20000))
run yes word env NCCL_COMM_ID=127.0.0.1:$port GEOCCL_COMM_SECRET=dev-emu-test \
    DEV_ALLREDUCE_MAX_COUNT=1000 "$bin" 2 "$mib"
# A driver older than the runtime: init refuses, naming both CUDA versions
# (the emulated runtime is the toolkit's version); no driver: host-only.
old_drv=1080
echo "== GEO_EMU_DRIVER_VERSION=$old_drv $bin driver old"
out=$(GEO_EMU_DRIVER_VERSION=$old_drv GEO_EMU_STATS=0 "$bin" driver old 2>&1)
echo "$out"
rt=$(echo "$out" | sed -n 's/^dev_allreduce: CUDA runtime //p')
want="supports CUDA 1.8, but GeoCCL's CUDA runtime is $rt"
if [ -z "$rt" ] || ! echo "$out" | grep -q '^PASS' || ! echo "$out" | grep -qF "$want"; then
    echo "FAIL: driver old (wanted the text: $want)"; failed=$((failed + 1))
fi
echo "== GEO_EMU_DRIVER_VERSION=0 $bin driver none"
GEO_EMU_DRIVER_VERSION=0 GEO_EMU_STATS=0 "$bin" driver none || { echo "FAIL: driver none"; failed=$((failed + 1)); }
# The programs run.sh runs on a GPU machine skip (exit 77, "no GPU") only
# where there is none: no driver installed, or none seen.  A driver older
# than the runtime fails them (exit 1), naming both versions
# (tests/device/gpu_probe.h).
echo "== GEO_EMU_DRIVER_VERSION=$old_drv $bin 2 $mib (the program's own probe)"
out=$(GEO_EMU_DRIVER_VERSION=$old_drv GEO_EMU_STATS=0 "$bin" 2 "$mib" 2>&1)
rc=$?
rtnum=$(echo "$rt" | awk -F. '{ printf "%d", $1 * 1000 + $2 * 10 }')
echo "$out" | sed 's/^/   /'  # its FAIL line is the expected outcome, not this test's
if [ "$rc" != 1 ] || ! echo "$out" | grep -q "^FAIL: dev_allreduce: cudaGetDeviceCount" ||
    ! echo "$out" | grep -qF "cudaDriverGetVersion $old_drv (CUDA 1.8)" ||
    ! echo "$out" | grep -qF "cudaRuntimeGetVersion $rtnum (CUDA $rt)"; then
    echo "FAIL: probe with an old driver (exit $rc, wanted 1 naming both versions)"; failed=$((failed + 1))
else
    echo "PASS: an old driver fails the program (exit 1), naming both versions"
fi
echo "== GEO_EMU_DRIVER_VERSION=0 $bin 2 $mib (the program's own probe)"
out=$(GEO_EMU_DRIVER_VERSION=0 GEO_EMU_STATS=0 "$bin" 2 "$mib" 2>&1)
rc=$?
echo "$out" | sed 's/^/   /'
if [ "$rc" != 77 ] || ! echo "$out" | grep -q "^SKIP: dev_allreduce: no GPU"; then
    echo "FAIL: probe without a driver (exit $rc, wanted 77)"; failed=$((failed + 1))
else
    echo "PASS: no driver skips the program (exit 77)"
fi
[ "$failed" -eq 0 ] || { echo "FAIL: $failed run(s) of dev_allreduce-emu failed"; exit 1; }
echo "PASS: dev_allreduce-emu: 2 and 3 ranks, exact, int8, sign, topk$([ "$tk" = 1 ] || echo " (queued only)"), staged, host int8, polling-kernel waits, a blocked host function beside, lagging device"
