#!/usr/bin/env bash
#
# GeoCCL demo: installs what is missing (as root, with apt-get), builds the
# library if needed, then:
#   1. the minimal example: 4 ranks on this machine, one all-reduce, checked;
#   2. 3 emulated regions x 2 ranks (network namespaces, 100 Mbit/s and 25 ms
#      one-way between regions, tools/geoccl-wan) and the all-reduce
#      table of GeoCCL's hierarchical algorithm against its flat ring, on the
#      same links, with the bytes each rank sent over the WAN.
# Without root (or without ip netns) step 2 runs the same ranks with region
# labels on loopback and says that the links are not shaped.
#
# Environment: DEMO_RATE (100mbit), DEMO_DELAY (25ms), DEMO_MAXBYTES (16M),
# DEMO_NO_WAN=1 (labels on loopback even as root).
set -euo pipefail
# The ranks bootstrap at GEOCCL_COMM_ID across regions, where traffic is
# encrypted: they share a random 256-bit key for this run.
export GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
cd "$(dirname "$0")/.."
top=$PWD

bash config/install-deps.sh

if [ ! -x geoccl-perf ] || [ ! -x examples/minimal ] || [ ! -f lib/libgeoccl.la ]; then
    echo "== building (log in build.log)"
    { ./autogen.sh && ./configure && make -j"$(nproc)"; } > build.log 2>&1 ||
        { tail -40 build.log; echo "build failed: see build.log"; exit 1; }
fi

rate=${DEMO_RATE:-100mbit}
delay=${DEMO_DELAY:-25ms}
maxbytes=${DEMO_MAXBYTES:-16M}
regions=3
per=2
nranks=$((regions * per))
wan=tools/geoccl-wan
perf_args=(-b 1M -e "$maxbytes" -f 4 -n 2 -w 1 -c 1)

echo
echo "== 1. minimal example: 4 ranks, all-reduce of 1M floats"
GEOCCL_SOCKET_IFNAME=lo ./examples/minimal

echo
echo "== 2. $regions regions x $per ranks"
cat <<EOF
   With emulated regions no labels are given: GeoCCL's probe measures the
   round trips between the ranks' addresses, finds the regions, measures the
   links and plans:
     hierarchical all-reduce = ring reduce-scatter inside each region
       -> owners of each piece exchange it between regions (each region
          sends 2(R-1)/R of the data once: the minimum), reduced in region order
       -> ring all-gather inside each region;
     flat ring (GEOCCL_ALGO=flat) = one ring over all ranks in region order;
   a cost model fed with the measured links picks one per message size.
EOF

shaped=0
if [ -z "${DEMO_NO_WAN:-}" ] && [ "$(id -u)" = 0 ] && "$wan" up -r "$regions" --rate "$rate" --delay "$delay" -q > wan.log 2>&1; then
    shaped=1
    trap '"$wan" down > /dev/null 2>&1 || true; rm -f "${topo:-}" wan.probe.*' EXIT
    echo
    "$wan" status | sed -n '1,4p'
    echo "   every region's link to the others: $rate, $delay one way; inside a region: unshaped"
    echo
    echo "-- geoccl-probe on the $nranks ranks (no labels): what GeoCCL measured and chose"
    topo=$(mktemp -u /tmp/geoccl-demo-XXXXXX.topo)
    pids=()
    for ((r = 0; r < nranks; r++)); do
        "$wan" exec -i $((r / per)) --no-label -- env RANK=$r NRANKS=$nranks \
            GEOCCL_COMM_ID=10.231.0.10:29610 "$top/geoccl-probe" -o "$topo" > "wan.probe.$r" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    grep -v '^vm:' wan.probe.0 | sed -n '/^plan for/,/sizes: from/{/allgather\|reducescatter\|broadcast/d};p'
    echo "   (the next runs load $topo with GEOCCL_TOPO_FILE instead of probing again)"
else
    echo
    echo "   NOTE: cannot build network namespaces here (needs root and ip netns; see wan.log):"
    echo "   the regions are labels on loopback (GEOCCL_REGION=r0..r$((regions - 1))), the links are"
    echo "   NOT shaped or delayed, and with one host there is nothing for the probe to measure."
fi

run_geoccl() { # $1 = algo (hier|flat), $2 = port
    local algo=$1 port=$2 r pids=() status=0 out
    out=$(mktemp)
    if [ "$shaped" = 1 ]; then
        for ((r = 0; r < nranks; r++)); do
            if [ "$r" = 0 ]; then
                "$wan" exec -i $((r / per)) --no-label -- env RANK=$r NRANKS=$nranks GEOCCL_ALGO="$algo" \
                    GEOCCL_TOPO_FILE="$topo" GEOCCL_COMM_ID=10.231.0.10:"$port" \
                    "$top/geoccl-perf" "${perf_args[@]}" > "$out" &
            else
                "$wan" exec -i $((r / per)) --no-label -- env RANK=$r NRANKS=$nranks GEOCCL_ALGO="$algo" \
                    GEOCCL_TOPO_FILE="$topo" GEOCCL_COMM_ID=10.231.0.10:"$port" \
                    "$top/geoccl-perf" "${perf_args[@]}" > /dev/null &
            fi
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || status=$?; done
    else
        local labels="" g
        for ((r = 0; r < nranks; r++)); do
            g=$((r / per)); labels+="${labels:+,}r$g"
        done
        GEOCCL_SOCKET_IFNAME=lo GEOCCL_ALGO="$algo" GEOCCL_PERF_REGIONS="$labels" \
            ./geoccl-perf -N "$nranks" "${perf_args[@]}" > "$out" || status=$?
    fi
    grep -vE '^#  Rank|^# Using|^#$' "$out"
    rm -f "$out"
    return $status
}

echo
if [ "$shaped" = 1 ]; then
    echo "-- GeoCCL as planned (GEOCCL_ALGO=auto: hierarchical at these sizes)"
    run_geoccl auto 29611
else
    echo "-- hierarchical (the default with several regions and no link figures)"
    run_geoccl hier 29611
fi
echo
echo "-- flat ring over the same links (GEOCCL_ALGO=flat)"
run_geoccl flat 29612
echo
if [ "$shaped" = 1 ]; then
    echo "The WAN bound for an all-reduce of B bytes over $regions regions is"
    bits=$(awk -v r="$rate" 'BEGIN { m = 1; if (r ~ /gbit$/) m = 1e9; else if (r ~ /mbit$/) m = 1e6;
                                     else if (r ~ /kbit$/) m = 1e3; sub(/[a-z]+$/, "", r); print r * m }')
    echo "2(R-1)/R * B / rate: at $rate, 16 MiB needs >= $(awk -v b="$bits" -v k="$regions" \
        'BEGIN { printf "%.2f", 2 * (k - 1) / k * 16777216 * 8 / b }') s; the hier column should be"
    echo "close to that, the flat ring about 2(N-1)/N / (2(R-1)/R) = $(awk -v n="$nranks" -v k="$regions" \
        'BEGIN { printf "%.2f", (n - 1) / n / ((k - 1) / k) }')x slower."
fi
echo "Run the test suite with: bash tests/run-all.sh"
