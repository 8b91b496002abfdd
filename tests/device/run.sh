#!/usr/bin/env bash
#
# The GPU check in one run, from a device bundle (tests/device/bundle.sh):
#
#   run.sh --bundle DIR [--out LOGDIR]             on a lent GPU machine
#   run.sh --bundle DIR --emulate [--out LOGDIR]   here, without a GPU
#   run.sh [--out LOGDIR]                          builds the bundle first
#                                                  (bundle.sh, torch from
#                                                  python3 when it has one)
#
# Bundle mode needs no network, package manager, compiler or autotools:
# only bash, coreutils, ldd and, for the torch stage, the machine's python3
# with torch (2.11 for the bundle's _C.so).  NCCL is NVIDIA's, found where
# the machine has it: GEOCCL_NCCL_LIB, the loader's cache, /usr/local/cuda,
# the system library folders, then the nvidia-nccl wheel inside python3's
# site-packages (nvidia/nccl/lib/libnccl.so.2).
#
# Stages, each under "=== name ===" and with its own timeout, all within
# BUDGET (240 s, GEOCCL_DEVICE_BUDGET): environment (GPU, driver, CUDA,
# the bundle's files and libraries), NCCL, codec check, codec throughput,
# pinned memory CMA, device all-reduce, pass-through vs NCCL, capture and
# abort, device modes, torch backend CUDA, compute-sanitizer.  The
# sanitizers run in the background beside the stages that measure nothing.
# A stage that could not run fails (never skips) when a GPU is visible or
# under --emulate; so does a run over BUDGET.
#
# --emulate runs the same programs of bin/ with the bundle's emulated
# libraries first on LD_LIBRARY_PATH (emu/: libcudart.so.13, the CPU
# emulation of the runtime; libgeoccl.so.0, the library with the kernels
# compiled for that emulation; libnccl.so.2, a one-rank NCCL), so that a
# missing file, library or stage fails here, in make check
# (tests/device/run_bundle_emu.sh).  What a CPU cannot do, it says:
#   - sizes: the emulated kernels run some 10^6 elements a second, so the
#     throughput stage measures 2^12 elements in place of 2^20 and 2^26, and
#     the all-reduces 1 MiB once (their figures describe the emulation);
#   - torch backend CUDA: no CUDA torch here; instead every library
#     python/geoccl/_C.so needs must resolve (bundle or torch 2.11's own
#     libraries, unpacked by bundle.sh in ${XDG_CACHE_HOME:-~/.cache}/geoccl)
#     and every symbol it imports must be defined by them, the C/C++
#     runtime, or the interpreter (Py*); nothing is imported or run;
#   - compute-sanitizer: needs a GPU; marked "n/a (emulated)", not passed.
#
# Output: LOGDIR/run.log (everything, written as it goes) and
# LOGDIR/summary.txt (one page: the device, versions, figures, stage
# results).  LOGDIR: --out, else $OUT (the device tool's), else
# ./device-run.  Exit 0 only when no stage failed.
set -uo pipefail

BUNDLE= EMULATE=0 LOGDIR=
while [ $# -gt 0 ]; do
    case $1 in
        --bundle) BUNDLE=$2; shift 2 ;;
        --emulate) EMULATE=1; shift ;;
        --out) LOGDIR=$2; shift 2 ;;
        *) echo "usage: run.sh [--bundle DIR [--emulate]] [--out LOGDIR]" >&2; exit 2 ;;
    esac
done
LOGDIR=${LOGDIR:-${OUT:-$PWD/device-run}}
mkdir -p "$LOGDIR" || exit 1
LOGDIR=$(cd "$LOGDIR" && pwd)
LOG=$LOGDIR/run.log
SUM=$LOGDIR/summary.txt
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
START=$(date +%s)
# 240 s on a GPU; 300 s emulated (make check's limit for it: the emulated
# kernels share this machine's CPUs with the rest of the suite).
BUDGET=${GEOCCL_DEVICE_BUDGET:-$([ $EMULATE = 1 ] && echo 300 || echo 240)}
elapsed() { echo $(($(date +%s) - START)); }
section() { echo; echo "=== $1 === (t=$(elapsed)s)"; }

if [ -z "$BUNDLE" ]; then
    # Build on this machine: bundle.sh needs the toolkit, a compiler and
    # configure (or autotools); torch from python3 when it has one.
    here=$(cd "$(dirname "$0")" && pwd)
    tdir=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
    section "build"
    BUNDLE=$here/../../build-device/bundle
    bash "$here/bundle.sh" --build "$here/../../build-device/build" ${tdir:+--torch "$tdir"} "$BUNDLE" ||
        { echo "FAIL: bundle.sh"; exec 1>&- 2>&-; wait "$TEE_PID"; exit 1; }
fi
BUNDLE=$(cd "$BUNDLE" && pwd -P) || exit 1
B=$BUNDLE

PASSED=0 FAILED=0 NA=0
RESULTS=()
GPU_SEEN=0
if [ $EMULATE = 0 ] && command -v nvidia-smi >/dev/null 2>&1 &&
   nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    GPU_SEEN=1
fi
# result NAME pass|fail|skip|na TEXT
result() {
    local st=$2 why=${3:-}
    if [ "$st" = skip ] && { [ $GPU_SEEN = 1 ] || [ $EMULATE = 1 ]; }; then
        st=fail why="could not run: $why"
    fi
    case $st in
        pass) PASSED=$((PASSED + 1)) ;;
        fail) FAILED=$((FAILED + 1)) ;;
        na) NA=$((NA + 1)) ;;
    esac
    RESULTS+=("$1: $st${why:+ ($why)}")
    echo "  -> $1: $st${why:+ ($why)}"
}
# run_to SECONDS CMD...: CMD with a timeout, never past the budget.
run_to() {
    local t=$1 left
    shift
    left=$((BUDGET - $(elapsed) - 5))
    [ "$left" -lt "$t" ] && t=$left
    [ "$t" -lt 5 ] && t=5
    timeout -k 5 "$t" "$@"
}
rc_result() { # NAME RC FIGURE
    case $2 in
        0) result "$1" pass "$3" ;;
        77) result "$1" skip "no GPU visible" ;;
        124|137) result "$1" fail "timed out" ;;
        *) result "$1" fail "exit $2${3:+; $3}" ;;
    esac
}

# ---------------------------------------------------------------------------
section "environment"
echo "host $(hostname), $(uname -sr), $(nproc) CPUs; bundle $B; mode $([ $EMULATE = 1 ] && echo "emulated (CPU)" || echo GPU)"
sed 's/^/  /' "$B/BUILDINFO" 2>/dev/null
REQUIRED="run.sh BUILDINFO MANIFEST bin/codec_check bin/dev_allreduce bin/passthrough_bench
bin/pinned_cma lib/libgeoccl.so.0 lib/libcudart.so.13 emu/libcudart.so.13 emu/libgeoccl.so.0
emu/libnccl.so.2 python/geoccl/__init__.py python/geoccl/torch.py python/geoccl/_C.so
python/geoccl/_build.py python/torch_cuda_step.py"
miss=()
for f in $REQUIRED; do [ -e "$B/$f" ] || miss+=("$f"); done
while read -r f; do [ -e "$B/$f" ] || miss+=("$f"); done <"$B/MANIFEST"
GPU_NAME= DRIVER= CUDA_DRV=
if [ $EMULATE = 1 ]; then
    export LD_LIBRARY_PATH=$B/emu
    export GEO_EMU_TIMEOUT=${GEO_EMU_TIMEOUT:-90} GEO_EMU_DEVICES=${GEO_EMU_DEVICES:-1}
    GPU_NAME="none: CPU emulation (bundle's emu/)"
    DRIVER="emulated"
    echo "  GPU: $GPU_NAME"
else
    unset LD_LIBRARY_PATH
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 | sed 's/^/  /'
        GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)
        DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)
        CUDA_DRV=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n1)
    else
        echo "  nvidia-smi: not found"
    fi
    case $GPU_NAME in
        *H200*) GPU_KIND=H200 ;; *H100*) GPU_KIND=H100 ;; "") GPU_KIND=none ;; *) GPU_KIND="other" ;;
    esac
    GPU_NAME="$GPU_NAME ($GPU_KIND)"
fi
echo "  GPU: $GPU_NAME; driver $DRIVER${CUDA_DRV:+ (CUDA $CUDA_DRV)}"
echo "  libraries of the programs as they load here (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-unset}):"
lbad=()
for f in "$B"/bin/*; do
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        case $name in libgeoccl.so.0|libcudart.so.13|libnccl.so.2|libzstd.so.1|libcrypto.so.3)
            echo "    $(basename "$f"): $name => $path" ;;
        esac
        if [ "$path" = not ]; then
            case $name in libcuda.so.1|libnccl.so.2) [ $EMULATE = 0 ] && continue ;; esac
            lbad+=("$(basename "$f"): $name")
            continue
        fi
        # Beyond glibc, libstdc++/libgcc and NCCL, a library comes from the
        # bundle (RUNPATH): one found elsewhere is one the bundle lacks.
        case $name in
            linux-vdso.so.*|ld-linux-x86-64.so.*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|\
            librt.so.*|libstdc++.so.*|libgcc_s.so.*|libcuda.so.1|libnccl.so.2) ;;
            *) case $path in "$B"/*) ;; *) lbad+=("$(basename "$f"): $name found outside the bundle ($path)") ;; esac ;;
        esac
        if [ $EMULATE = 1 ]; then
            case $name in libgeoccl.so.0|libcudart.so.13|libnccl.so.2)
                case $path in "$B"/emu/*) ;; *) lbad+=("$(basename "$f"): $name not the emulation's") ;; esac ;;
            esac
        fi
    done < <(ldd "$f" 2>&1)
done
if [ ${#miss[@]} -gt 0 ] || [ ${#lbad[@]} -gt 0 ]; then
    result "bundle" fail "missing files: ${miss[*]:-none}; libraries: ${lbad[*]:-none}"
else
    result "bundle" pass "$(wc -l <"$B/MANIFEST") files, $(($(du -sb "$B" | cut -f1) / 1024)) KiB"
fi

# ---------------------------------------------------------------------------
section "NCCL"
NCCL_LIB=
if [ $EMULATE = 1 ]; then
    NCCL_LIB=$B/emu/libnccl.so.2
else
    find_nccl() {
        local c d
        if [ -n "${GEOCCL_NCCL_LIB:-}" ] && [ -f "$GEOCCL_NCCL_LIB" ]; then echo "$GEOCCL_NCCL_LIB"; return; fi
        c=$(ldconfig -p 2>/dev/null | sed -n 's/.*libnccl\.so\.2 (libc6,x86-64) => //p' | head -n1)
        [ -n "$c" ] && [ -f "$c" ] && { echo "$c"; return; }
        for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
            [ -f "$d/libnccl.so.2" ] && { echo "$d/libnccl.so.2"; return; }
        done
        c=$(python3 -c 'import nvidia.nccl, os
for p in nvidia.nccl.__path__:
    f = os.path.join(p, "lib", "libnccl.so.2")
    if os.path.exists(f): print(f); break' 2>/dev/null)
        [ -n "$c" ] && { echo "$c"; return; }
        return 1
    }
    NCCL_LIB=$(find_nccl) || NCCL_LIB=
fi
if [ -n "$NCCL_LIB" ]; then
    export GEOCCL_NCCL_LIB=$NCCL_LIB
    if [ $EMULATE = 0 ]; then
        # Its folder may hold another CUDA runtime: only a link to it goes
        # on the loader's path.
        mkdir -p "$LOGDIR/nccl"
        ln -sf "$NCCL_LIB" "$LOGDIR/nccl/libnccl.so.2"
        export LD_LIBRARY_PATH=$LOGDIR/nccl
    fi
    echo "  libnccl.so.2: $NCCL_LIB (GEOCCL_NCCL_LIB; a link to it on LD_LIBRARY_PATH)"
    v=$(run_to 20 "$B/bin/passthrough_bench" version 2>&1); rc=$?
    echo "  $v"
    NCCL_VER=$(echo "$v" | sed -n 's/^nccl: //p')
    if [ $rc = 0 ] && [ -n "$NCCL_VER" ]; then
        result "NCCL" pass "$NCCL_VER"
    else
        result "NCCL" fail "ncclGetVersion: exit $rc"
    fi
else
    echo "  no libnccl.so.2 found"
    result "NCCL" skip "no libnccl.so.2 (system paths, /usr/local/cuda, python3's nvidia.nccl)"
fi
export GEOCCL_SOCKET_IFNAME=${GEOCCL_SOCKET_IFNAME:-lo}
export GEOCCL_TIMEOUT=${GEOCCL_TIMEOUT:-60}

# ---------------------------------------------------------------------------
section "codec check"
cc_args="--no-perf"
[ $EMULATE = 1 ] && cc_args="--quick --no-perf --topk-big 300007"
echo "  codec_check $cc_args (GPU chunks against the CPU codecs byte for byte)"
run_to $([ $EMULATE = 1 ] && echo 150 || echo 60) "$B/bin/codec_check" $cc_args; rc=$?
rc_result "codec check" $rc "$(grep -a 'codec_check: [0-9]* passed' "$LOG" | tail -n1 | sed 's/codec_check: //')"
CUDA_RT=$(grep -a '^codec_check: .*runtime [0-9]*, driver' "$LOG" | head -n1 | sed 's/.*runtime \([0-9]*\), driver \([0-9]*\).*/runtime \1, driver supports \2/')

# ---------------------------------------------------------------------------
section "codec throughput"
if [ $EMULATE = 1 ]; then
    sizes="4096"
    echo "  emulated: 2^12 elements in place of 2^20 and 2^26 (figures of the CPU emulation, not a GPU's)"
else
    sizes="1048576 67108864"
fi
ok=1
for n in $sizes; do
    echo "  codec_check --perf-only --perf-elems $n"
    run_to 60 "$B/bin/codec_check" --perf-only --perf-elems "$n"; rc=$?
    [ $rc = 0 ] || { ok=0; rc_result "codec throughput $n" $rc; }
done
[ $ok = 1 ] && result "codec throughput" pass "elements: $sizes"

# ---------------------------------------------------------------------------
section "pinned memory CMA"
run_to 30 "$B/bin/pinned_cma"; rc=$?
rc_result "pinned memory CMA" $rc "$(grep -ac 'pinned_cma: .* readable and writable$' "$LOG") of 4 host kinds readable and writable"

# ---------------------------------------------------------------------------
section "device all-reduce"
# N processes share the one GPU, each its own region: every call crosses
# regions (reduce-scatter in NCCL, encode, copy out, WAN exchange, decode,
# all-gather).  64 MiB, 10 timed calls; emulated: 1 MiB, one call.
: >"$LOGDIR/dev_allreduce.debug"
MIB=64 DA_ENV=()
if [ $EMULATE = 1 ]; then
    MIB=1
    DA_ENV=(DEV_ALLREDUCE_ITERS=1 DEV_ALLREDUCE_MAX_COUNT=1000)
fi
da() { # NAME TIMEOUT ARGS...
    local name=$1 t=$2
    shift 2
    echo "  dev_allreduce $*"
    run_to "$t" env "${DA_ENV[@]}" GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=CUDA "$B/bin/dev_allreduce" "$@" \
        >"$LOGDIR/da.out" 2>&1
    local rc=$?
    grep -av 'GEOCCL INFO' "$LOGDIR/da.out" | sed 's/^/    /'
    grep -a 'the stream waits with\|real NCCL .* loaded from\|falling back to a polling' "$LOGDIR/da.out" |
        sort -u | sed 's/^/    [info] /'
    cat "$LOGDIR/da.out" >>"$LOGDIR/dev_allreduce.debug"
    rc_result "$name" $rc "$(grep -a '^dev_allreduce: [0-9]* ranks' "$LOGDIR/da.out" | tail -n1 | sed 's/^dev_allreduce: //')"
}
da "device all-reduce x2" 60 2 $MIB
da "device all-reduce x4" 60 4 $MIB
for c in int8 sign topk:0.05 fp16 int4; do
    da "device all-reduce x3 $c" 45 3 $MIB $c
done
DA_ENV+=(GEOCCL_CUDA_CODECS=0)
da "device all-reduce x3 int8 (host codecs)" 45 3 $MIB int8
unset 'DA_ENV[-1]'
da "device staged collectives x3" 45 3 $MIB staged
WAIT=$(grep -a 'the stream waits with' "$LOGDIR/dev_allreduce.debug" 2>/dev/null | sed 's/.*the stream waits with //' | sort | uniq -c |
       awk '{c=$1; $1=""; printf "%s%s (said by %d ranks over the runs above)", (NR>1?"; ":""), substr($0,2), c}')
grep -aq 'falling back to a polling' "$LOGDIR/dev_allreduce.debug" 2>/dev/null && WAIT="$WAIT; some fell back to the polling kernel"
echo "  flag wait mechanism: ${WAIT:-not reported}"

# ---------------------------------------------------------------------------
section "pass-through vs NCCL"
# One rank, one region: GeoCCL forwards to NVIDIA's NCCL (emulated: the
# one-rank NCCL).  Alone, then under LD_PRELOAD=libgeoccl.so.0.
GEOLIB=$B/lib/libgeoccl.so.0
[ $EMULATE = 1 ] && GEOLIB=$B/emu/libgeoccl.so.0
pmib=64; [ $EMULATE = 1 ] && pmib=1
alone=$(run_to 60 "$B/bin/passthrough_bench" $pmib 2>&1); rc1=$?
echo "  alone: $alone" | sed 's/^/  /'
geo=$(run_to 60 env LD_PRELOAD="$GEOLIB" GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=CUDA "$B/bin/passthrough_bench" $pmib 2>&1); rc2=$?
echo "$geo" | grep -a -v 'GEOCCL INFO' | sed 's/^/    through GeoCCL: /'
if [ $rc1 = 0 ] && [ $rc2 = 0 ]; then
    read -r a_big a_small <<<"$(echo "$alone" | awk '/^RESULT/ {print $2, $3}')"
    read -r g_big g_small <<<"$(echo "$geo" | awk '/^RESULT/ {print $2, $3}')"
    PT=$(awk -v a="$a_big" -v g="$g_big" -v as="$a_small" -v gs="$g_small" -v m=$pmib \
         'BEGIN { printf "%d MiB: %.1f us vs %.1f us alone (%+.1f%%); 4 B: %.2f us vs %.2f us (%+.1f%%)", m, g, a, 100 * (g - a) / a, gs, as, 100 * (gs - as) / as }')
    echo "  pass-through overhead: $PT"
    if echo "$geo" | grep -q "real NCCL"; then
        result "pass-through vs NCCL" pass "$PT"
    else
        result "pass-through vs NCCL" fail "GeoCCL did not log loading the real NCCL; $PT"
    fi
else
    rc=$rc1; [ $rc = 0 ] && rc=$rc2
    rc_result "pass-through vs NCCL" $rc "exit $rc1 alone, $rc2 through GeoCCL"
fi

# ---------------------------------------------------------------------------
# The sanitizers run from here on, beside stages that measure nothing.
SAN_PIDS=()
if [ $EMULATE = 0 ]; then
    CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
         /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n1)
    if [ -n "$CS" ]; then
        for tool in memcheck racecheck; do
            ( run_to 150 "$CS" --tool $tool --error-exitcode 3 "$B/bin/codec_check" --quick --no-perf --topk-big 300007 \
                  >"$LOGDIR/sanitizer-$tool.log" 2>&1; echo $? >"$LOGDIR/sanitizer-$tool.rc" ) &
            SAN_PIDS+=($!)
        done
    fi
fi

# ---------------------------------------------------------------------------
section "capture and abort"
# One thread's all-reduce under CUDA graph capture, the graph launched
# (device 0 alone on a machine with fewer than 3 GPUs: the emulation has
# one device here too), and refused when NVIDIA's communicator would have
# to be made inside the capture (GEOCCL_NCCL_INIT=lazy).
for m in "" refuse; do
    echo "  dev_allreduce capture $m"
    run_to 45 env GEOCCL_NCCL_INIT=$([ -n "$m" ] && echo lazy || echo auto) \
        "$B/bin/dev_allreduce" capture $m; rc=$?
    rc_result "capture${m:+ $m}" $rc "$(grep -a ': dev_allreduce capture' "$LOG" | tail -n1)"
done
echo "  dev_allreduce 2 1 abort"
run_to 45 env "${DA_ENV[@]}" "$B/bin/dev_allreduce" 2 1 abort; rc=$?
rc_result "abort" $rc "$(grep -a 'ncclCommAbort with two streams stuck returned' "$LOG" | tail -n1 | sed 's/.*returned/returned/')"

# ---------------------------------------------------------------------------
section "device modes"
for mode in hostfn efreuse pinned; do
    echo "  dev_allreduce 2 1 $mode"
    run_to 45 env "${DA_ENV[@]}" GEOCCL_TIMEOUT=30 "$B/bin/dev_allreduce" 2 1 $mode; rc=$?
    rc_result "device $mode" $rc "$(grep -a "^dev_allreduce: $mode" "$LOG" | tail -n1 | sed 's/^dev_allreduce: //')"
done

# ---------------------------------------------------------------------------
section "torch backend CUDA"
if [ $EMULATE = 1 ]; then
    C=$B/python/geoccl/_C.so
    tlib=${GEOCCL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/geoccl}/torch-2.11.0-cp312/torch/lib
    echo "  emulated: no CUDA torch here; checking that $C links against torch 2.11's libraries ($tlib)"
    if [ ! -f "$tlib/libtorch_python.so" ]; then
        result "torch backend CUDA" fail "torch 2.11's libraries not unpacked in $tlib (run bundle.sh here first)"
    else
        bad=()
        for n in $(readelf -d "$C" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            if [ -f "$B/lib/$n" ] || [ -f "$tlib/$n" ]; then continue; fi
            case $n in libc.so.6|libm.so.6|libstdc++.so.6|libgcc_s.so.1|libpthread.so.0|libdl.so.2|ld-linux-x86-64.so.2) continue ;; esac
            bad+=("$n")
        done
        defs=$(for l in "$tlib"/libtorch_python.so "$tlib"/libtorch.so "$tlib"/libtorch_cpu.so \
                   "$tlib"/libc10.so "$tlib"/libc10_cuda.so "$B"/lib/libgeoccl.so.0 "$B"/lib/libcudart.so.13 \
                   $(ldd "$B/lib/libgeoccl.so.0" | awk '/libstdc\+\+|libgcc_s|libc\.so|libm\.so/ {print $3} /ld-linux/ {print $1}'); do
                   nm -D --defined-only "$l" 2>/dev/null | awk '{print $3}'
               done | sed 's/@.*//' | sort -u)
        undef=$(nm -D --undefined-only "$C" | awk '$1 == "U" {print $2}' | sed 's/@.*//' | grep -v '^_*Py' | sort -u)
        gap=$(comm -23 <(echo "$undef") <(echo "$defs"))
        nund=$(echo "$undef" | grep -c .)
        echo "  NEEDED: $(readelf -d "$C" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
        if [ ${#bad[@]} -gt 0 ] || [ -n "$gap" ]; then
            echo "$gap" | head -20 | sed 's/^/    undefined: /'
            result "torch backend CUDA" fail "emulated link check: unresolved ${bad[*]:-} $(echo "$gap" | grep -c .) symbols"
        else
            result "torch backend CUDA" na "emulated: not run; link check passed: every library resolves, $nund imported symbols defined by torch 2.11, the bundle or the C/C++ runtime (Py* left to the interpreter)"
        fi
    fi
elif python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "  python3: torch $(python3 -c 'import torch; print(torch.__version__)'); PYTHONPATH=$B/python"
    run_to 120 env PYTHONPATH="$B/python${PYTHONPATH:+:$PYTHONPATH}" python3 "$B/python/torch_cuda_step.py" 3; rc=$?
    rc_result "torch backend CUDA" $rc "$(grep -a 'rank 0: all_reduce' "$LOG" | tail -n1 | sed 's/^ *//')"
else
    result "torch backend CUDA" skip "python3 has no torch with CUDA"
fi

# ---------------------------------------------------------------------------
section "compute-sanitizer"
if [ $EMULATE = 1 ]; then
    echo "  emulated: compute-sanitizer needs a GPU; not run (codec_check --quick ran on the emulation above)"
    result "compute-sanitizer" na "emulated: not run"
elif [ -z "${CS:-}" ]; then
    result "compute-sanitizer" skip "compute-sanitizer not found"
else
    for p in "${SAN_PIDS[@]}"; do wait "$p"; done
    for tool in memcheck racecheck; do
        echo "  $CS --tool $tool codec_check --quick --no-perf --topk-big 300007:"
        tail -n 4 "$LOGDIR/sanitizer-$tool.log" | sed 's/^/    /'
        rc_result "compute-sanitizer $tool" "$(cat "$LOGDIR/sanitizer-$tool.rc" 2>/dev/null || echo 1)" \
            "$(grep -a 'ERROR SUMMARY' "$LOGDIR/sanitizer-$tool.log" | tail -n1)"
    done
fi

# ---------------------------------------------------------------------------
section "summary"
[ "$(elapsed)" -le "$BUDGET" ] || result "time" fail "$(elapsed)s, over the budget of ${BUDGET}s"
{
    echo "GeoCCL device run, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(elapsed)s, mode: $([ $EMULATE = 1 ] && echo "EMULATED (CPU; figures describe the emulation)" || echo GPU)"
    echo "bundle: $(sed -n 2p "$B/BUILDINFO" 2>/dev/null)"
    echo
    echo "== device"
    echo "GPU: $GPU_NAME"
    echo "driver: $DRIVER${CUDA_DRV:+ (CUDA $CUDA_DRV)}; CUDA ${CUDA_RT:-?}"
    echo "NCCL: ${NCCL_VER:-not found}"
    echo "flag wait: ${WAIT:-not reported}"
    echo
    echo "== codec throughput (codec_check --perf-only; device-to-device copy of the same run)"
    sed -n '/^=== codec throughput/,/^=== pinned memory/p' "$LOG" |
        grep -a -E 'perf-elems|memory bandwidth|kernel  |^  +[a-z0-9]+ (encode|decode) ' | head -n 50
    echo
    echo "== device all-reduce (processes sharing one GPU, one region each)"
    grep -a '^    dev_allreduce: [0-9]* ranks\|^    dev_allreduce: rank 0 per call' "$LOG" | sed 's/^    //'
    echo
    echo "== pass-through vs NCCL"
    echo "${PT:-not measured}"
    echo
    echo "== stages: $PASSED passed, $FAILED failed, $NA not applicable"
    for r in "${RESULTS[@]}"; do echo "$r"; done
} >"$SUM"
cat "$SUM"
echo "=== summary: $PASSED passed, $FAILED failed, $NA n/a; $(elapsed)s; log $LOG ==="
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null || sleep 1
[ $FAILED = 0 ]
