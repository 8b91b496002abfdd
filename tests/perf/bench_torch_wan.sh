#!/usr/bin/env bash
# bench_torch_wan.sh: PyTorch on emulated regions (tools/geoccl-wan),
# the geoccl backend and Gloo side by side on the same links, one run:
#
#   ddp       examples/torch/ddp_digits.py (DistributedDataParallel, small
#             MLP on sklearn's digits): ms per step and test accuracy
#   diloco    examples/torch/diloco.py: GeoCCL uncompressed, GeoCCL with
#             GEOCCL_COMPRESS=int8 (error feedback on) and Gloo: all-reduce
#             ms per round and test accuracy
#   allreduce tests/perf/torch_allreduce.py, --mib MiB of float32 through
#             dist.all_reduce on both backends, and geoccl-perf (GeoCCL's C
#             API) on the same links: what the backend adds to GeoCCL
#
#   sudo tests/perf/bench_torch_wan.sh [options] BUILDDIR
#
# BUILDDIR: a build configured with PyTorch found (geoccl/_C.so built) and
# geoccl-perf. Rank r runs in region r / P. Options:
#   -t RxP        regions x ranks per region (default 3x2)
#   -r RATE       egress rate of every region (default 100mbit)
#   -d MS         one-way delay of every region (default 25)
#   --steps N     DDP steps (default 100; the time is the mean after 10)
#   --rounds N    DiLoCo rounds (default 30)
#   --mib M       all-reduce size (default 64)
#   --what LIST   ddp,diloco,allreduce (default all three)
#   -o DIR        raw outputs (default: a new directory in /tmp)
# Prints one table per part; every rank's output stays in DIR.
set -uo pipefail
export LC_ALL=C
SRC=$(cd "$(dirname "$0")/../.." && pwd) || exit 1
topo=3x2 rate=100mbit delay=25 steps=100 rounds=30 mib=64 what=ddp,diloco,allreduce out=
while [ $# -gt 1 ]; do
    case $1 in
        -t) topo=$2; shift 2;;
        -r) rate=$2; shift 2;;
        -d) delay=$2; shift 2;;
        --steps) steps=$2; shift 2;;
        --rounds) rounds=$2; shift 2;;
        --mib) mib=$2; shift 2;;
        --what) what=$2; shift 2;;
        -o) out=$2; shift 2;;
        *) echo "unknown option $1 (see the top of $0)"; exit 2;;
    esac
done
build=$(cd "${1:-.}" && pwd) || exit 2
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces): sudo $0 ..."; exit 2; }
[ -f "$build/geoccl/_C.so" ] || { echo "no $build/geoccl/_C.so: configure with PyTorch found and make"; exit 2; }
python=$(sed -n 's/^PYTHON = //p' "$build/Makefile" 2>/dev/null)
python=${python:-/usr/bin/python3}
R=${topo%x*} P=${topo#*x} N=$((R * P))
out=${out:-$(mktemp -d /tmp/bench-torch-wan.XXXXXX)}
mkdir -p "$out"
wan=$SRC/tools/geoccl-wan name=gtorch port=29800
export GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
trap '"$wan" down -n "$name" -q >/dev/null 2>&1' EXIT
trap 'echo interrupted; exit 130' INT TERM
sysctl -qw net.core.rmem_max=67108864 net.core.wmem_max=67108864
"$wan" up -n "$name" -q -r "$R" --rate "$rate" --delay "$delay" --wait 600 > "$out/up.log" 2>&1 ||
    { echo "geoccl-wan up failed:"; cat "$out/up.log"; exit 1; }
echo "== $R regions x $P ranks, $rate egress per region, $delay ms one-way; outputs in $out"
echo "   $("$python" -c 'import torch; print("torch", torch.__version__)'), $(nproc) cores"

# ranks TAG ENV... -- CMD...: one process per rank in its region's namespace,
# rendezvous at rank 0's address (PyTorch's store; geoccl-perf gets
# GEOCCL_COMM_ID in ENV, which a torch job must not have); waits.
ranks() {
    local tag=$1 r bad=0
    shift
    local -a env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    port=$((port + 1))
    local -a pids=()
    for ((r = 0; r < N; r++)); do
        timeout -k 10 900 "$wan" exec -n "$name" -i $((r / P)) -- env RANK=$r WORLD_SIZE=$N \
            LOCAL_RANK=$((r % P)) MASTER_ADDR=10.231.0.10 MASTER_PORT=$port NRANKS=$N \
            GEOCCL_SOCKET_IFNAME=wan0 \
            GLOO_SOCKET_IFNAME=wan0 PYTHONPATH="$build" "${env[@]}" "$@" \
            > "$out/$tag.rank$r.log" 2>&1 &
        pids+=($!)
    done
    for ((r = 0; r < N; r++)); do wait "${pids[$r]}" || bad=$((bad + 1)); done
    if [ "$bad" != 0 ]; then
        echo "   $tag: $bad rank(s) failed; rank 0's last lines:"
        tail -3 "$out/$tag.rank0.log" | sed 's/^/      /'
    fi
    return "$bad"
}
# field FILE REGEX: the first capture of REGEX (sed -E) in FILE's last match
field() { sed -nE "s#.*$2.*#\1#p" "$1" | tail -1; }

if [[ ,$what, == *,ddp,* ]]; then
    echo "== DDP, examples/torch/ddp_digits.py --steps $steps (ms per step after the first 10)"
    printf '   %-8s %12s %10s\n' backend ms/step accuracy
    for b in geoccl gloo; do
        ranks "ddp-$b" -- "$python" "$SRC/examples/torch/ddp_digits.py" --backend "$b" \
            --steps "$steps" --log-every 1000 || continue
        f=$out/ddp-$b.rank0.log
        ms=$(field "$f" ': ([0-9.]+) ms/step') acc=$(field "$f" 'test accuracy ([0-9.]+)')
        printf '   %-8s %12s %10s\n' "$b" "$ms" "$acc"
        eval "ddp_$b=$ms"
    done
    [ -n "${ddp_geoccl:-}" ] && [ -n "${ddp_gloo:-}" ] &&
        echo "   gloo / geoccl: $(awk -v a="$ddp_gloo" -v b="$ddp_geoccl" 'BEGIN{printf "%.2fx", a / b}')"
fi

if [[ ,$what, == *,diloco,* ]]; then
    echo "== DiLoCo, examples/torch/diloco.py --rounds $rounds (H 20)"
    printf '   %-14s %18s %10s  %s\n' run "all-reduce ms/rnd" accuracy "WAN bytes"
    for v in geoccl geoccl-int8 gloo; do
        b=${v%%-*} env=()
        [ "$v" = geoccl-int8 ] && env=(GEOCCL_COMPRESS=int8)
        [ "$b" = geoccl ] && [ "$v" = geoccl ] && env=(GEOCCL_COMPRESS=none)
        ranks "diloco-$v" "${env[@]}" -- "$python" "$SRC/examples/torch/diloco.py" --backend "$b" \
            --rounds "$rounds" --log-every 1000 || continue
        f=$out/diloco-$v.rank0.log
        printf '   %-14s %18s %10s  %s\n' "$v" "$(field "$f" ', ([0-9.]+) ms all-reduce per round')" \
            "$(field "$f" 'test accuracy ([0-9.]+)')" "$(field "$f" ', ([0-9]+ bytes to other regions \([0-9]+ uncompressed\))')"
    done
fi

if [[ ,$what, == *,allreduce,* ]]; then
    echo "== all-reduce of $mib MiB float32 sum, 1 warm-up + 3 timed calls (median s)"
    printf '   %-24s %10s\n' run seconds
    for b in geoccl gloo; do
        ranks "ar-$b" -- "$python" "$SRC/tests/perf/torch_allreduce.py" --backend "$b" \
            --mib "$mib" --iters 3 --warmup 1 || continue
        s=$(field "$out/ar-$b.rank0.log" 'median ([0-9.]+) s')
        printf '   %-24s %10s\n' "torch $b backend" "$s"
        eval "ar_$b=$s"
    done
    bytes=$(awk -v m="$mib" 'BEGIN{printf "%d", m * 1048576}')
    if ranks ar-geoccl-perf GEOCCL_COMM_ID=10.231.0.10:$((port + 1001)) -- "$build/geoccl-perf" -b "$bytes" -e "$bytes" -n 3 -w 1 -c 1; then
        # geoccl-perf's table: size, count, type, op, root, out-of-place time (us), ...
        us=$(awk -v b="$bytes" '$1 == b {print $6; exit}' "$out/ar-geoccl-perf.rank0.log")
        ar_c=$(awk -v u="$us" 'BEGIN{if (u != "") printf "%.3f", u / 1e6}')
        printf '   %-24s %10s\n' "geoccl-perf (C API)" "$ar_c"
        [ -n "${ar_geoccl:-}" ] && [ -n "$ar_c" ] &&
            echo "   torch geoccl / geoccl-perf: $(awk -v a="$ar_geoccl" -v b="$ar_c" 'BEGIN{printf "%.3f", a / b}')"
    fi
    [ -n "${ar_geoccl:-}" ] && [ -n "${ar_gloo:-}" ] &&
        echo "   gloo / torch geoccl: $(awk -v a="$ar_gloo" -v b="$ar_geoccl" 'BEGIN{printf "%.2fx", a / b}')"
fi
