#!/usr/bin/env bash
#
# One prepared run for a lent GPU machine (one GPU, 15 minutes of device time
# for a whole session, a fresh Debian image with the CUDA toolkit and maybe
# NCCL, no network), from the
# repository root of a copied working tree:
#
#   bash tests/device/run.sh
#
# With the device tool, carry the autotools output so that the full build
# works where autoconf/automake/libtool are missing:
#   carry: configure Makefile.in aclocal.m4 config.h.in build-aux m4
# Without them (and without autotools there) only the direct build of the
# codec check below runs.
#
# What it does, each stage under a "=== name ===" marker, within its budget
# of 7 minutes (BUDGET below, so that a rerun fits the lease; later stages
# are skipped when time runs short, and a GPU stage skipped fails the run):
#   1. environment: the GPU (nvidia-smi), its compute capability, nvcc,
#      the RDMA devices (ibv_devinfo).
#   2. packages: if build tools are missing and apt-get works, installs them;
#      never fails the run (there is usually no network).
#      NCCL: nccl.h and libnccl.so.2 from the toolkit, /usr, or a Python
#      wheel (PyTorch's nvidia-nccl: then links under build-device/nccl
#      give configure its include/ and lib/, and GEOCCL_NCCL_LIB and
#      LD_LIBRARY_PATH point at the wheel's library).
#   3. codec check, direct build: nvcc compiles cuda/*.cu for
#      this GPU's architecture only, gcc the CPU codecs (compress/) and
#      tests/device/codec_check.c; no autotools needed.
#   4. codec check, run: GPU chunks vs CPU chunks byte for byte, residuals,
#      decoders, corrupt chunks; then each kernel's throughput beside the
#      GPU's memory bandwidth.  Then tests/device/pinned_cma.c: can
#      process_vm_readv/writev read and write cudaHostAlloc'd and registered
#      host memory (which path a host all-reduce on such buffers takes in a
#      region).
#   5. full build: configure (--with-cuda-arch=<this GPU>, --without-X for
#      packages that are missing) and make, if configure is there or
#      autoreconf can make it; it runs in the background while stage 4's
#      correctness checks run on the GPU (no throughput is measured beside
#      it: the kernels' throughput is measured after it, alone).
#   6. device collectives: dev_allreduce with 2 and 4 ranks on the
#      one GPU, each rank its own region, device buffers (checks sum/avg,
#      prints time and bandwidth at 64 MiB); passthrough_bench alone and
#      under LD_PRELOAD=libgeoccl.so (one rank, one region: GeoCCL forwards
#      to NVIDIA's NCCL; prints the overhead in %); dev_allreduce with 3
#      ranks and a codec (int8, sign, topk, fp16, int4 encoded on the GPU,
#      then int8 with GEOCCL_CUDA_CODECS=0): bit-identical results on every
#      rank, error bounds, 64 MiB time; dev_allreduce --staged (broadcast,
#      all-gather, reduce-scatter, reduce across regions on device buffers);
#      dev_allreduce hostfn, efreuse and pinned with 2 ranks (waits beside a
#      blocked host function, residuals per registration, staging kept);
#      if PyTorch imports, a two-process data-parallel step with
#      LD_PRELOAD=libgeoccl.so, by hand and with DistributedDataParallel.
#   No host-only tests (make check runs anywhere without a GPU).
# When nvidia-smi lists a GPU, a GPU stage that did not run (skipped for
# any reason but a missing PyTorch) fails the run, with the reason; so does
# a run that took longer than its budget.
# The last line is the summary: "=== summary: ... ===", then
# "N passed, N failed" (stages).  Exit 0 only when no stage failed.
#
# Output also goes to $OUT/device-run.log when OUT is set (the device tool
# fetches $OUT), written as it goes so a timeout still leaves it.
#
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
START=$(date +%s)
BUDGET=${GEOCCL_DEVICE_BUDGET:-420} # seconds for the whole run: 7 minutes on one H200
BUILD=$ROOT/build-device
mkdir -p "$BUILD"

if [ -n "${OUT:-}" ] && mkdir -p "$OUT" 2>/dev/null; then
    LOG=$OUT/device-run.log
else
    LOG=$BUILD/device-run.log
fi
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!

elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((BUDGET - $(elapsed))); }
section() { echo; echo "=== $1 === (t=$(elapsed)s)"; }

STAGES_PASSED=0
STAGES_FAILED=0
SUMMARY=()
GPU_SEEN=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    GPU_SEEN=1
fi
stage_result() { # name status text
    local st=$2 why=${3:-}
    if [ "$st" = skip ] && [ $GPU_SEEN = 1 ] && [ "$why" != "no torch" ]; then
        set -- "$1" fail "nvidia-smi shows a GPU but this stage did not run: $why"
    fi
    case $2 in
        pass) STAGES_PASSED=$((STAGES_PASSED + 1)) ;;
        fail) STAGES_FAILED=$((STAGES_FAILED + 1)) ;;
    esac
    SUMMARY+=("$1: $2${3:+ ($3)}")
}

NPROC=$(nproc 2>/dev/null || echo 4)

# ---------------------------------------------------------------------------
section "environment"
echo "host $(hostname), $(uname -sr), $NPROC CPUs, tree $ROOT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-}
if [ -z "$NVCC" ]; then
    if [ -x "$CUDA_HOME/bin/nvcc" ]; then
        NVCC=$CUDA_HOME/bin/nvcc
    elif command -v nvcc >/dev/null 2>&1; then
        NVCC=$(command -v nvcc)
        CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
    fi
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory,compute_cap \
        --format=csv 2>&1 | sed 's/^/  /'
else
    echo "  nvidia-smi: not found"
fi
# The RDMA devices this machine has, so that an ibverbs transport can be
# planned on facts: ibv_devinfo when installed, else the kernel's view.
echo "  RDMA devices:"
if command -v ibv_devinfo >/dev/null 2>&1; then
    ibv_devinfo -l 2>&1 | sed 's/^/    /'
    ibv_devinfo 2>&1 | grep -E 'hca_id|transport|fw_ver|link_layer|state|active_mtu|active_speed|active_width' |
        sed 's/^/    /'
elif [ -d /sys/class/infiniband ] && [ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
    echo "    ibv_devinfo not installed; /sys/class/infiniband holds: $(ls /sys/class/infiniband | tr '\n' ' ')"
else
    echo "    none (no ibv_devinfo, /sys/class/infiniband empty or missing)"
fi
ARCH=
if command -v nvidia-smi >/dev/null 2>&1; then
    ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
           head -n1 | tr -d ' .')
fi
case $ARCH in
    [0-9][0-9]|[0-9][0-9][0-9]) ;;
    *) ARCH= ;;
esac
if [ -n "$NVCC" ]; then
    echo "  nvcc: $NVCC ($("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
else
    echo "  nvcc: not found"
fi
echo "  GPU architecture: ${ARCH:-unknown (nvcc -arch=native)}"
for t in gcc g++ make autoreconf pkg-config; do
    printf '  %-11s %s\n' "$t" "$(command -v $t || echo missing)"
done

# ---------------------------------------------------------------------------
section "packages"
have_header() { echo "#include <$1>" | gcc -E -x c - >/dev/null 2>&1; }
want=()
command -v autoreconf >/dev/null 2>&1 || [ -x "$ROOT/configure" ] || want+=(autoconf automake libtool)
command -v pkg-config >/dev/null 2>&1 || want+=(pkg-config)
have_header zstd.h || want+=(libzstd-dev)
have_header CUnit/CUnit.h || want+=(libcunit1-dev)
if [ ${#want[@]} -eq 0 ]; then
    echo "  nothing missing"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "  missing: ${want[*]}; trying apt-get (no network is normal here)"
    if timeout 40 apt-get update -qq >/dev/null 2>&1 &&
       DEBIAN_FRONTEND=noninteractive timeout 120 apt-get install -y -qq \
           --no-install-recommends "${want[@]}" >/dev/null 2>&1; then
        echo "  installed"
    else
        echo "  apt-get did not work; going on without: ${want[*]}"
    fi
else
    echo "  missing: ${want[*]} (no apt-get as root; going on without)"
fi

# ---------------------------------------------------------------------------
section "NCCL"
# NVIDIA's NCCL may sit in the toolkit, in /usr, or only inside a Python
# package (PyTorch's nvidia-nccl wheel: include/nccl.h and lib/libnccl.so.2,
# often without the libnccl.so link).  configure wants <dir>/include/nccl.h
# and a libnccl.so; GeoCCL dlopens libnccl.so.2 at run time.  A wheel's copy
# is given to both through a directory of links under the build folder.
NCCL_DIR=
find_nccl() {
    local d
    for d in "$CUDA_HOME" /usr /usr/local; do
        if [ -r "$d/include/nccl.h" ] && { compgen -G "$d/lib*/libnccl.so" ||
                compgen -G "$d/lib/*/libnccl.so"; } >/dev/null; then
            echo "$d"; return 0
        fi
    done
    local lib
    lib=$(find /opt /usr/local /usr/lib /root -name 'libnccl.so.2' -path '*nvidia*' 2>/dev/null | head -n1)
    [ -n "$lib" ] || lib=$(find /opt /usr/local /usr/lib /root -name 'libnccl.so.2' 2>/dev/null | head -n1)
    [ -n "$lib" ] || return 1
    local libdir hdr
    libdir=$(dirname "$(readlink -f "$lib")")
    hdr=$(find "$(dirname "$libdir")" -maxdepth 3 -name nccl.h 2>/dev/null | head -n1)
    [ -n "$hdr" ] || return 1
    local link=$BUILD/nccl
    mkdir -p "$link/include" "$link/lib"
    ln -sf "$hdr" "$link/include/nccl.h"
    ln -sf "$libdir/libnccl.so.2" "$link/lib/libnccl.so.2"
    ln -sf "$libdir/libnccl.so.2" "$link/lib/libnccl.so"
    echo "$link"
}
if NCCL_DIR=$(find_nccl); then
    echo "  NCCL: $NCCL_DIR ($(readlink -f "$NCCL_DIR/include/nccl.h"))"
    grep -m3 -E '^#define NCCL_(MAJOR|MINOR|PATCH)' "$(readlink -f "$NCCL_DIR/include/nccl.h")" | sed 's/^/    /'
    for l in "$NCCL_DIR"/lib*/libnccl.so.2 "$NCCL_DIR"/lib/*/libnccl.so.2; do
        if [ -e "$l" ]; then
            # Found by GeoCCL's dlopen and by passthrough_bench alone.
            export GEOCCL_NCCL_LIB=$(readlink -f "$l")
            export LD_LIBRARY_PATH=$(dirname "$GEOCCL_NCCL_LIB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            echo "  GEOCCL_NCCL_LIB=$GEOCCL_NCCL_LIB"
            break
        fi
    done
else
    NCCL_DIR=
    echo "  NCCL not found (no nccl.h with libnccl.so.2): device stages will fail to find it"
fi

# ---------------------------------------------------------------------------
section "codec check: direct build"
DIRECT=$BUILD/direct
mkdir -p "$DIRECT"
ARCHFLAGS="-arch=native"
[ -n "$ARCH" ] && ARCHFLAGS="-gencode=arch=compute_$ARCH,code=sm_$ARCH"
ZSTD_DEF="" ZSTD_LIB=""
if have_header zstd.h && echo 'int main(void){return 0;}' |
       gcc -x c - -lzstd -o "$DIRECT/zt" >/dev/null 2>&1; then
    ZSTD_DEF="#define HAVE_ZSTD 1"
    ZSTD_LIB="-lzstd"
fi
cat > "$DIRECT/config.h" <<EOF
/* Minimal config.h for the direct build of tests/device/codec_check. */
#define HAVE_CUDA 1
$ZSTD_DEF
EOF
CHECK_BIN=
direct_build() {
    [ -n "$NVCC" ] || { echo "no nvcc"; return 1; }
    local inc="-I$DIRECT -I$ROOT/include -I$ROOT"
    # One nvcc per kernel file, all at once (no relocatable device code:
    # each file launches only its own kernels).
    echo "  nvcc $ARCHFLAGS cuda/*.cu"
    mkdir -p "$DIRECT/cuda"
    local nvpids=() nvobjs=() cu
    for cu in "$ROOT"/cuda/*.cu; do
        nvobjs+=("$DIRECT/cuda/$(basename "$cu" .cu).o")
        "$NVCC" -O3 $ARCHFLAGS -DHAVE_CONFIG_H $inc -Xcompiler -fPIC \
            -c "$cu" -o "${nvobjs[-1]}" &
        nvpids+=($!)
    done
    local objs=() f ok=0 p
    for f in "$ROOT"/compress/codec*.c "$ROOT/tests/device/codec_check.c"; do
        local o
        o=$DIRECT/$(basename "$f" .c).o
        gcc -std=gnu11 -O2 -g -Wall -Wextra -DHAVE_CONFIG_H $inc -I"$CUDA_HOME/include" \
            -c "$f" -o "$o" || ok=1
        objs+=("$o")
    done
    for p in "${nvpids[@]}"; do
        wait "$p" || ok=1
    done
    [ $ok = 0 ] || return 1
    local libdir=$CUDA_HOME/lib64
    [ -d "$libdir" ] || libdir=$CUDA_HOME/lib
    gcc -o "$DIRECT/codec_check" "${objs[@]}" "${nvobjs[@]}" \
        -L"$libdir" -Wl,-rpath,"$libdir" -lcudart -lstdc++ $ZSTD_LIB -lm
}
if direct_build; then
    CHECK_BIN=$DIRECT/codec_check
    echo "  built $CHECK_BIN"
    stage_result "direct build" pass
else
    echo "  direct build failed"
    stage_result "direct build" fail
fi

# ---------------------------------------------------------------------------
section "full build (in the background, beside the codec check)"
FULL_OK=0
full_build() {
    if [ ! -x "$ROOT/configure" ]; then
        command -v autoreconf >/dev/null 2>&1 || { echo "  no configure and no autoreconf: skipped"; return 2; }
        (cd "$ROOT" && ./autogen.sh >"$BUILD/autogen.log" 2>&1) ||
            { echo "  autogen.sh failed (see $BUILD/autogen.log)"; tail -5 "$BUILD/autogen.log"; return 1; }
    fi
    local opts=(--with-cuda="$CUDA_HOME")
    [ -n "$NCCL_DIR" ] && opts+=(--with-nccl="$NCCL_DIR")
    [ -n "$ARCH" ] && opts+=(--with-cuda-arch="$ARCH")
    have_header zstd.h || opts+=(--without-zstd)
    have_header CUnit/CUnit.h || opts+=(--without-cunit)
    have_header infiniband/verbs.h || opts+=(--without-ibverbs)
    command -v mpicc >/dev/null 2>&1 || opts+=(--without-mpi)
    echo "  configure ${opts[*]}"
    local obj=$BUILD/full
    mkdir -p "$obj"
    (cd "$obj" && "$ROOT/configure" "${opts[@]}" >configure.out 2>&1) ||
        { echo "  configure failed:"; tail -20 "$obj/configure.out"; return 1; }
    sed -n '/configuration summary/,$p' "$obj/configure.out" | sed 's/^/  /'
    local t
    t=$(left)
    [ "$t" -gt 200 ] && t=200
    timeout "$t" make -C "$obj" -j"$NPROC" >"$obj/make.out" 2>&1 ||
        { echo "  make failed:"; grep -E "error|Error" "$obj/make.out" | head -20; tail -5 "$obj/make.out"; return 1; }
    echo "  make: ok ($(grep -ci warning "$obj/make.out") warning lines)"
    return 0
}
# The full build runs on the CPUs while the codec check runs on the GPU.
FB_PID=
if [ "$(left)" -lt 150 ]; then
    echo "  skipped: $(left)s left"
else
    echo "  started; its output follows the codec check"
    ( full_build >"$BUILD/full-build.txt" 2>&1; echo $? >"$BUILD/full-build.rc" ) &
    FB_PID=$!
fi

# ---------------------------------------------------------------------------
section "codec check: GPU vs CPU"
# Correctness only: the full build shares the machine now, so throughput is
# measured after it ("codec throughput").
if [ -n "$CHECK_BIN" ]; then
    t=$(left)
    [ "$t" -gt 200 ] && t=200
    [ "$t" -lt 30 ] && t=30
    timeout "$t" "$CHECK_BIN" --no-perf
    rc=$?
    case $rc in
        0) stage_result "codec_check" pass "$(grep -a 'codec_check: .* passed' "$LOG" | tail -n1 | sed 's/codec_check: //')" ;;
        77) stage_result "codec_check" skip "no GPU visible" ;;
        124) stage_result "codec_check" fail "timed out after ${t}s" ;;
        *) stage_result "codec_check" fail "exit $rc" ;;
    esac
else
    stage_result "codec_check" skip "not built"
fi

# ---------------------------------------------------------------------------
section "single-copy reads of CUDA host memory"
# Which path a host all-reduce on pinned buffers takes inside a region
# (comm/coll/cma.c reads and writes peers' buffers with process_vm_readv/writev
# when it can).
libdir=$CUDA_HOME/lib64
[ -d "$libdir" ] || libdir=$CUDA_HOME/lib
if gcc -std=gnu11 -O2 -Wall -I"$CUDA_HOME/include" "$ROOT/tests/device/pinned_cma.c" \
       -L"$libdir" -Wl,-rpath,"$libdir" -lcudart -o "$BUILD/pinned_cma" 2>&1; then
    timeout 30 "$BUILD/pinned_cma"
    case $? in
        0) stage_result "pinned memory CMA" pass "$(grep -ac 'pinned_cma: .* readable and writable$' "$LOG") of 4 host kinds readable and writable" ;;
        77) stage_result "pinned memory CMA" skip "no GPU visible" ;;
        *) stage_result "pinned memory CMA" fail ;;
    esac
else
    stage_result "pinned memory CMA" fail "build"
fi

# ---------------------------------------------------------------------------
section "full build"
if [ -z "$FB_PID" ]; then
    stage_result "full build" skip "no time left"
else
    wait "$FB_PID"
    cat "$BUILD/full-build.txt"
    case $(cat "$BUILD/full-build.rc" 2>/dev/null || echo 1) in
        0) FULL_OK=1; stage_result "full build" pass ;;
        2) stage_result "full build" skip "no autotools output" ;;
        *) stage_result "full build" fail ;;
    esac
fi

# ---------------------------------------------------------------------------
section "codec throughput"
# Nothing else of this script runs now.
if [ -n "$CHECK_BIN" ] && [ "$(left)" -gt 150 ]; then
    timeout 60 "$CHECK_BIN" --perf-only
    rc=$?
    case $rc in
        0) stage_result "codec throughput" pass ;;
        77) stage_result "codec throughput" skip "no GPU visible" ;;
        *) stage_result "codec throughput" fail "exit $rc" ;;
    esac
else
    stage_result "codec throughput" skip "not built or no time"
fi


# ---------------------------------------------------------------------------
section "device collectives through GeoCCL"
# Programs built by make check (compiled there on every CI machine too).
DEV_OK=0
if [ $FULL_OK = 1 ] && [ "$(left)" -gt 60 ]; then
    obj=$BUILD/full
    if timeout 120 make -C "$obj" tests/device/dev_allreduce tests/device/passthrough_bench \
            >"$obj/make-device.out" 2>&1; then
        DEV_OK=1
    else
        echo "  building the device programs failed:"
        tail -n 15 "$obj/make-device.out" | sed 's/^/    /'
        stage_result "device programs" fail "build"
    fi
else
    echo "  skipped (full build: $FULL_OK, $(left)s left)"
    stage_result "device programs" skip "no full build or no time"
fi
GEOLIB=$BUILD/full/lib/.libs/libgeoccl.so
export GEOCCL_SOCKET_IFNAME=${GEOCCL_SOCKET_IFNAME:-lo}
# libtool wrapper scripts run the real binary with the build's library path.
if [ $DEV_OK = 1 ]; then
    for n in 2 4; do
        if [ "$(left)" -lt 40 ]; then
            stage_result "device all-reduce x$n" skip "no time left"
            continue
        fi
        echo "  dev_allreduce $n ranks (GEOCCL_REGION=r<i>), 64 MiB figures"
        timeout 90 "$BUILD/full/tests/device/dev_allreduce" "$n" 64
        rc=$?
        fig=$(grep -a "^dev_allreduce: $n ranks" "$LOG" | tail -n1 | sed 's/^dev_allreduce: //')
        case $rc in
            0) stage_result "device all-reduce x$n" pass "$fig" ;;
            77) stage_result "device all-reduce x$n" skip "no GPU visible" ;;
            124) stage_result "device all-reduce x$n" fail "timed out" ;;
            *) stage_result "device all-reduce x$n" fail "exit $rc" ;;
        esac
    done

    if [ "$(left)" -gt 40 ] && [ -x "$BUILD/full/tests/device/passthrough_bench" ]; then
        pb=$BUILD/full/tests/device/passthrough_bench
        echo "  passthrough_bench alone (NVIDIA's NCCL)"
        alone=$(timeout 60 "$pb" 64 2>&1); rc1=$?
        echo "$alone" | sed 's/^/    /'
        echo "  passthrough_bench with LD_PRELOAD=$GEOLIB"
        geo=$(LD_PRELOAD=$GEOLIB GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=CUDA timeout 60 "$pb" 64 2>&1); rc2=$?
        echo "$geo" | sed 's/^/    /'
        if [ $rc1 = 0 ] && [ $rc2 = 0 ]; then
            read -r a_big a_small <<<"$(echo "$alone" | awk '/^RESULT/ {print $2, $3}')"
            read -r g_big g_small <<<"$(echo "$geo" | awk '/^RESULT/ {print $2, $3}')"
            ov=$(awk -v a="$a_big" -v g="$g_big" -v as="$a_small" -v gs="$g_small" \
                 'BEGIN { printf "64 MiB: %.1f us vs %.1f us alone (%+.1f%%); 4 B: %.2f us vs %.2f us (%+.1f%%)", g, a, 100 * (g - a) / a, gs, as, 100 * (gs - as) / as }')
            echo "  pass-through overhead: $ov"
            if echo "$geo" | grep -q "real NCCL"; then
                stage_result "pass-through vs NCCL" pass "$ov"
            else
                stage_result "pass-through vs NCCL" fail "GeoCCL did not log loading the real NCCL; $ov"
            fi
        elif [ $rc1 = 77 ]; then
            stage_result "pass-through vs NCCL" skip "no GPU visible"
        else
            stage_result "pass-through vs NCCL" fail "exit $rc1 alone, $rc2 through GeoCCL"
        fi
    else
        stage_result "pass-through vs NCCL" skip "not built or no time"
    fi

    # Compressed device all-reduce: chunks encoded on the GPU
    # (GEOCCL_CUDA_CODECS=1, the default), so only encoded chunks go through
    # pinned host memory; 3 ranks in 3 regions; bit-identical results, error
    # bounds, and the 64 MiB time; int8 once more with the host codecs
    # (GEOCCL_CUDA_CODECS=0) for comparison.
    for spec in staged int8 sign topk:0.05 fp16 int4 "int8 host"; do
        codec=${spec%% *}
        if [ "$(left)" -lt 50 ]; then
            stage_result "device all-reduce $spec" skip "no time left"
            continue
        fi
        cc=1; [ "$spec" != "${spec% host}" ] && cc=0
        echo "  dev_allreduce 3 ranks, $codec, GEOCCL_CUDA_CODECS=$cc, 64 MiB figures"
        GEOCCL_CUDA_CODECS=$cc timeout 60 "$BUILD/full/tests/device/dev_allreduce" 3 64 "$codec"
        rc=$?
        fig=$(grep -a "^dev_allreduce: \(3 ranks.*$codec:\|$codec\)" "$LOG" | tail -n1 | sed 's/^dev_allreduce: //')
        case $rc in
            0) stage_result "device all-reduce $spec" pass "$fig" ;;
            77) stage_result "device all-reduce $spec" skip "no GPU visible" ;;
            124) stage_result "device all-reduce $spec" fail "timed out" ;;
            *) stage_result "device all-reduce $spec" fail "exit $rc" ;;
        esac
    done

    # What the emulation checks, on the GPU: waits beside another stream's
    # blocked host function (hostfn), error-feedback residuals that follow
    # registrations (efreuse), staging that is not freed or re-pinned on
    # the hot path (pinned: results only; the counts need the emulation).
    for mode in hostfn efreuse pinned; do
        if [ "$(left)" -lt 40 ]; then
            stage_result "device $mode" skip "no time left"
            continue
        fi
        echo "  dev_allreduce 2 ranks, $mode"
        GEOCCL_TIMEOUT=30 timeout 40 "$BUILD/full/tests/device/dev_allreduce" 2 1 "$mode"
        rc=$?
        fig=$(grep -a "^dev_allreduce: $mode" "$LOG" | tail -n1 | sed 's/^dev_allreduce: //')
        case $rc in
            0) stage_result "device $mode" pass "$fig" ;;
            77) stage_result "device $mode" skip "no GPU visible" ;;
            124) stage_result "device $mode" fail "timed out" ;;
            *) stage_result "device $mode" fail "exit $rc" ;;
        esac
    done

    if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        if [ "$(left)" -gt 60 ]; then
            t=$(($(left) - 30)); [ "$t" -gt 160 ] && t=160
            for mode in manual ddp; do
                [ "$mode" = ddp ] && { t=$(($(left) - 30)); [ "$t" -gt 160 ] && t=160; }
                if [ "$t" -lt 30 ]; then
                    stage_result "torch step $mode" skip "no time left"
                    continue
                fi
                echo "  torch two-process step ($mode), LD_PRELOAD=$GEOLIB"
                LD_PRELOAD=$GEOLIB timeout "$t" python3 "$ROOT/tests/device/torch_step.py" $mode
                rc=$?
                fig=$(grep -a "step .* ms" "$LOG" | tail -n1 | sed 's/^ *//')
                case $rc in
                    0) stage_result "torch step $mode" pass "$fig" ;;
                    124) stage_result "torch step $mode" fail "timed out after ${t}s" ;;
                    *) stage_result "torch step $mode" fail "exit $rc" ;;
                esac
            done
        else
            stage_result "torch step" skip "no time left"
        fi
    else
        echo "  PyTorch with CUDA is not importable: torch step skipped"
        stage_result "torch step" skip "no torch"
    fi
fi

# No host-only tests here: make check runs on any machine, and leased GPU
# time is for what needs the GPU.

# ---------------------------------------------------------------------------
section "summary"
for s in "${SUMMARY[@]}"; do
    echo "  $s"
done
echo "=== summary: $(IFS=';'; echo "${SUMMARY[*]}" | sed 's/;/; /g'); $(elapsed)s ==="
echo "$STAGES_PASSED passed, $STAGES_FAILED failed"
status=0
[ $STAGES_FAILED = 0 ] || status=1
if [ "$(elapsed)" -gt "$BUDGET" ]; then
    echo "FAIL: the run took $(elapsed)s, over its budget of ${BUDGET}s"
    status=1
fi
# Let tee write the last lines before the device tool collects $OUT.
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null || sleep 1
exit $status
