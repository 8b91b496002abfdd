#!/usr/bin/env bash
# bench_plan.sh: the cost model and the automatic plan against
# measurement, on emulated regions (tools/geoccl-wan). Needs root.
#
#   sudo tests/perf/bench_plan.sh [-t TOPOS] [-r RATES] [-d DELAY_MS] [-n ITERS]
#                                 [-e MAX] [-p PATHS] BUILDDIR
#
# For every topology RxP and rate (defaults 3x2,2x4 and 100mbit,1gbit, 25 ms
# one-way) the script brings the WAN up, and with no region labels:
#   1. geoccl-probe -o FILE: the probe finds the regions and measures the
#      links; FILE is the topology it wrote.
#   2. geoccl-probe --simulate FILE --json: the model's predicted all-reduce
#      time per size for flat and hierarchical (default chunk and slice).
#   3. geoccl-perf, float sum all-reduce 64 KiB .. MAX (x4; -e, default 256M), with
#      GEOCCL_TOPO_FILE=FILE (every run plans from the same figures):
#        flat   GEOCCL_ALGO=flat  (chunk and slice at their defaults, set)
#        hier   GEOCCL_ALGO=hier  (likewise)
#        auto   nothing forced: the plan picks algorithm and chunk per size
# and prints, per size, predicted and measured time for flat and hier with
# their ratio, and auto beside the better forced plan. All in one run on the
# same links; the machine is shared, so read ratios, not absolute times.
#
# A topology may also be uneven and asymmetric: SIZES@RATES@DELAYS, e.g.
# 2+3+1@100mbit/1gbit/1gbit@25/10/5 (region sizes, each region's egress
# rate and one-way delay in ms); -r and -d do not apply to it.
# -p PATHS runs every configuration once per path condition: a
# ';'-separated list of geoccl-wan up options, "" a clean path, e.g.
# -p ';--loss 1 --seed 1' (the probe then measures each pair's loss, the
# topology file carries it and --simulate predicts from it).
# Everything (outputs, the topology file, the commands) is kept in the
# directory printed at the end.
set -uo pipefail
# The ranks bootstrap at GEOCCL_COMM_ID across regions, where traffic is
# encrypted: they share a random 256-bit key for this run.
export GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
export LC_ALL=C

TOPOS=3x2,2x4
RATES=100mbit,1gbit
DELAY=25
ITERS=3
MAX=256M
PATHS=
while [ $# -gt 1 ]; do
    case $1 in
        -t) TOPOS=$2; shift 2;;
        -r) RATES=$2; shift 2;;
        -d) DELAY=$2; shift 2;;
        -n) ITERS=$2; shift 2;;
        -e) MAX=$2; shift 2;;
        -p) PATHS=$2; shift 2;;
        *) echo "unknown option $1"; exit 2;;
    esac
done
BUILD=$(cd "${1:?usage: bench_plan.sh [options] BUILDDIR}" && pwd) || exit 1
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WAN=$SRC/tools/geoccl-wan
NAME=gplan
OUT=$(mktemp -d /tmp/geoccl-bench-plan.XXXXXX)
[ "$(id -u)" = 0 ] || { echo "needs root"; exit 77; }
unset GEOCCL_REGION GEOCCL_TOPO_FILE GEOCCL_ALGO GEOCCL_COMPRESS GEOCCL_CHUNK_SIZE GEOCCL_HIER_SLICE GEOCCL_NSTREAMS
trap '"$WAN" down -n "$NAME" -q >/dev/null 2>&1' EXIT
trap 'exit 130' INT TERM
PORT=29800

# run_ranks OUTFILE ENV... -- CMD...: rank r in region ${REG[r]}.
run_ranks() {
    local out=$1 r n
    shift 1
    local -a env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    n=${#REG[@]}
    PORT=$((PORT + 1))
    local -a pids=()
    for ((r = 0; r < n; r++)); do
        "$WAN" exec -n "$NAME" -i "${REG[$r]}" --no-label -- env RANK=$r NRANKS=$n \
            GEOCCL_COMM_ID=10.231.0.10:$PORT "${env[@]}" "$@" \
            > "$out.$r" 2> "$out.$r.err" &
        pids+=($!)
    done
    local bad=0
    for p in "${pids[@]}"; do wait "$p" || bad=1; done
    cp "$out.0" "$out"
    echo "   $* (${env[*]}): $( [ $bad = 0 ] && echo ok || echo FAILED)" >> "$OUT/commands.txt"
    return $bad
}

echo "# bench_plan.sh $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores; one-way delay $DELAY ms (RxP topologies)"
for topo in ${TOPOS//,/ }; do
    REG=()
    if [[ $topo == *@* ]]; then
        # SIZES@RATES@DELAYS: one configuration, its own rates and delays.
        IFS=@ read -r sizes rates delays <<< "$topo"
        IFS=+ read -r -a sz <<< "$sizes"
        for ((g = 0; g < ${#sz[@]}; g++)); do
            for ((k = 0; k < sz[g]; k++)); do REG+=("$g"); done
        done
        up0=(-r "${#sz[@]}" --rates "${rates//\//,}" --delays "${delays//\//,}")
        cfgs=("$sizes-${rates//\//-}")
    else
        R=${topo%x*} P=${topo#*x}
        for ((r = 0; r < R * P; r++)); do REG+=($((r / P))); done
        cfgs=()
        for rate in ${RATES//,/ }; do cfgs+=("$topo-$rate"); done
    fi
    IFS=';' read -r -a paths <<< "$PATHS"
    [ ${#paths[@]} -gt 0 ] || paths=("")
    [[ $PATHS == *';' ]] && paths+=("")
    for base in "${cfgs[@]}"; do
      for path in "${paths[@]}"; do
        read -r -a pathargs <<< "$path"
        cfg=$base
        [ -z "$path" ] || cfg=$base-$(echo "$path" | tr -s ' ' | sed 's/^ //;s/ $//;s/--//g;s/ /-/g')
        [[ $topo == *@* ]] || up0=(-r "$R" --rate "${base##*-}" --delay "${DELAY}ms")
        up=("${up0[@]}" "${pathargs[@]}")
        "$WAN" down -n "$NAME" -q >/dev/null 2>&1
        "$WAN" up -n "$NAME" -q "${up[@]}" || exit 1
        echo "== $cfg" >> "$OUT/commands.txt"
        run_ranks "$OUT/$cfg.probe" -- "$BUILD/geoccl-probe" --json -o "$OUT/$cfg.topo"
        "$BUILD/geoccl-probe" --simulate "$OUT/$cfg.topo" --json > "$OUT/$cfg.sim" 2>&1
        perf=("$BUILD/geoccl-perf" -b 64K -e "$MAX" -f 4 -n "$ITERS" -w 1 -c 1)
        run_ranks "$OUT/$cfg.flat" GEOCCL_TOPO_FILE="$OUT/$cfg.topo" GEOCCL_ALGO=flat \
            GEOCCL_CHUNK_SIZE=512K GEOCCL_HIER_SLICE=4M -- "${perf[@]}"
        run_ranks "$OUT/$cfg.hier" GEOCCL_TOPO_FILE="$OUT/$cfg.topo" GEOCCL_ALGO=hier \
            GEOCCL_CHUNK_SIZE=512K GEOCCL_HIER_SLICE=4M -- "${perf[@]}"
        run_ranks "$OUT/$cfg.auto" GEOCCL_TOPO_FILE="$OUT/$cfg.topo" -- "${perf[@]}"
        "$WAN" down -n "$NAME" -q >/dev/null 2>&1
        python3 "$SRC/tests/perf/plan_table.py" "$OUT" "$cfg"
      done
    done
done
echo
echo "# outputs and commands: $OUT"
