#!/usr/bin/env bash
# bench_delayline.sh: what the emulated WAN itself costs (tools/geoccl-wan).
# Needs root and iperf3.
#
#   sudo tests/perf/bench_delayline.sh [-r REGIONS] [--rate RATE] [--delay D] [-t SECONDS] [-P STREAMS] [-l LOSS,...]
#
# For each delay-line mode, segmentation-offload packets (the default) and
# MTU-sized packets (`geoccl-wan up --no-gso`), one after the other on the
# same machine: brings up REGIONS regions (default 3) at RATE (default
# 1gbit) and D one-way (default 25ms), has every region send to the next
# (r0 -> r1 -> ... -> r0) with iperf3 (-P STREAMS, default 2) for SECONDS
# (default 10) all at once, and prints per mode: each receiver's goodput,
# the whole machine's CPU use meanwhile (/proc/stat), and each delay line's
# counters (packets through it, how late it released them on average and
# how many over 1 ms). With -l, each mode runs again per loss rate (percent,
# `geoccl-wan up --loss L --seed 1`) and the rows add the loss the delay
# lines drew (lost of the segments they carried, all of them together) and
# how many offload packets they cut to lose some of their segments. The WAN
# is taken down after each row, also on failure.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
WAN=${GEOCCL_WAN:-$HERE/../../tools/geoccl-wan}
NAME=gdlbench
REGIONS=3 RATE=1gbit DELAY=25ms SECS=10 STREAMS=2 LOSSES=''

while [ $# -gt 0 ]; do
    case $1 in
        -r) REGIONS=$2; shift 2;;
        --rate) RATE=$2; shift 2;;
        --delay) DELAY=$2; shift 2;;
        -t) SECS=$2; shift 2;;
        -P) STREAMS=$2; shift 2;;
        -l) LOSSES=$2; shift 2;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
        *) echo "bench_delayline.sh: unknown option '$1'" >&2; exit 2;;
    esac
done
[[ $REGIONS =~ ^[0-9]+$ ]] && [ "$REGIONS" -ge 2 ] || { echo "-r wants 2 or more" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bench_delayline.sh: needs root (namespaces, tc)" >&2; exit 77; }
command -v iperf3 >/dev/null || { echo "bench_delayline.sh: iperf3 missing" >&2; exit 77; }

OUT=$(mktemp -d /tmp/bench-delayline.XXXXXX)
trap '"$WAN" down -n "$NAME" -q >/dev/null 2>&1' EXIT

cpu_ticks() {  # busy idle
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $5 + $6 }' /proc/stat
}

echo "# bench_delayline.sh, $(date -u '+%Y-%m-%d %H:%M:%S') UTC, $(nproc) cores; $REGIONS regions, $RATE, $DELAY one way; iperf3 -P $STREAMS -t $SECS, r(i) -> r(i+1), all at once"
echo
echo "| delay line | loss asked | receiver goodput (Mbit/s) | CPU busy | packets per delay line | late: average (us) / over 1 ms | loss drawn (lost / segments) | offload packets cut |"
echo "|---|---:|---|---:|---|---|---:|---:|"
rows=("gso 0" "no-gso 0")
for l in ${LOSSES//,/ }; do rows+=("gso $l" "no-gso $l"); done
for row in "${rows[@]}"; do
    read -r mode loss <<<"$row"
    opt=()
    [ "$mode" = no-gso ] && opt=(--no-gso)
    [ "$loss" != 0 ] && opt+=(--loss "$loss" --seed 1)
    "$WAN" up -r "$REGIONS" -n "$NAME" --rate "$RATE" --delay "$DELAY" -q "${opt[@]}" || exit 1
    for ((i = 0; i < REGIONS; i++)); do
        ip netns exec "$NAME-r$i" iperf3 -s -D -1 -p 5201 >/dev/null 2>&1
    done
    sleep 0.5
    read -r b1 i1 < <(cpu_ticks)
    pids=()
    for ((i = 0; i < REGIONS; i++)); do
        j=$(( (i + 1) % REGIONS ))
        ip netns exec "$NAME-r$i" iperf3 -c "10.231.0.$((10 + j))" -p 5201 -t "$SECS" -P "$STREAMS" -J \
            > "$OUT/$mode-r$i.json" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    read -r b2 i2 < <(cpu_ticks)
    busy=$(( 100 * (b2 - b1) / ((b2 - b1) + (i2 - i1)) ))
    rates=() pk=() late=() lost=0 segs=0 cut=0
    for ((i = 0; i < REGIONS; i++)); do
        rates+=("$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['end']['sum_received']['bits_per_second']/1e6))" "$OUT/$mode-r$i.json" 2>/dev/null || echo '-')")
        pid=$(cat "/run/geoccl-wan/$NAME/dl$i.pid")
        kill -USR1 "$pid"
    done
    sleep 0.3
    for ((i = 0; i < REGIONS; i++)); do
        line=$(tail -n 1 "/run/geoccl-wan/$NAME/dl$i.log")
        pk+=("$(sed -n 's/.* in \([0-9]*\) pkts.*/\1/p' <<<"$line")")
        late+=("$(sed -n 's/.*late avg \([0-9.]*\) us max [0-9.]* us, >1 ms \([0-9]*\).*/\1 \/ \2/p' <<<"$line")")
        read -r a b c < <(sed -n 's/.*lost (model) \([0-9]*\) of \([0-9]*\) segments.*GSO packets cut \([0-9]*\).*/\1 \2 \3/p' <<<"$line")
        lost=$((lost + ${a:-0})) segs=$((segs + ${b:-0})) cut=$((cut + ${c:-0}))
    done
    "$WAN" down -n "$NAME" -q
    drawn=-
    [ "$segs" -gt 0 ] && drawn="$(awk -v l="$lost" -v s="$segs" 'BEGIN { printf "%.3f%% (%d / %d)", 100 * l / s, l, s }')"
    [ "$loss" = 0 ] && cut=-
    (IFS=,; echo "| $mode | $loss% | ${rates[*]} | $busy% | ${pk[*]} | ${late[*]} | $drawn | $cut |") | sed 's/,\([^ ]\)/, \1/g'
done
echo
echo "raw iperf3 output in $OUT"
