#!/usr/bin/env bash
#
# The WAN changing under a running job, every case of tests/wan/test_replan.sh
# judged against its target (BENCHMARKS.md, "A WAN that changes"): 3 regions
# x 2 ranks, 25 ms one way, every result checked exactly.
#
#   sudo bash tests/perf/bench_replan.sh [BUILDDIR] [CASE ...]
#
# CASE (default: all, in this order, about 16 minutes):
#   drop100   region 0's uplink 100 -> 25 Mbit/s after call 5 of 20 and back
#             after call 12, 16 MiB (targets 1.15x the new bound from the
#             fifth call after the drop, 1.10x the old from the fifth after
#             the return)
#   drop1g    the same at 1 Gbit/s -> 250 Mbit/s, 64 MiB
#   route     every one-way delay 25 -> 60 ms after call 3 of 11, 64 MiB at
#             100 Mbit/s (1.10x the new bound from the fifth call after)
#   cross     4 bulk cubic flows on region 0's uplink from call 2 to 8 of 9,
#             64 MiB at 100 Mbit/s: the flows' throughput against beside one
#             TCP flow (at least half), the calls against the bound on what
#             the flows left
#   crossnopace  the same with GEOCCL_WAN_PACE=0 (no caps: what a
#             dedicated link's setting would take from other flows)
#   flap      region 0's uplink between 25 and 100 Mbit/s every 2 s for 60 s
#             from call 3 of 28, 16 MiB (at most one re-plan per settled
#             change)
# Run on a quiet machine: the 1 Gbit/s links take the CPU's time to emulate.
# Prints each case's checks and a last line "N cases passed, N failed".
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd) || exit 1
BUILD=${1:-${GEOCCL_TEST_BUILDDIR:-$PWD}}
[ $# -gt 0 ] && shift
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(drop100 drop1g route cross crossnopace flap)
ok=0 bad=0
for c in "${cases[@]}"; do
    case $c in
        drop100) env=(SCENARIO=drop) ;;
        drop1g) env=(SCENARIO=drop RATE=1gbit LOW=250mbit BYTES=67108864) ;;
        route) env=(SCENARIO=route BYTES=67108864 CALLS=11 DROP=3 BACK=11) ;;
        cross) env=(SCENARIO=cross BYTES=67108864 CALLS=9 DROP=2 BACK=8) ;;
        crossnopace) env=(SCENARIO=cross BYTES=67108864 CALLS=9 DROP=2 BACK=8 PACE=0) ;;
        flap) env=(SCENARIO=flap CALLS=28 DROP=3 BACK=28) ;;
        *) echo "unknown case $c"; exit 2 ;;
    esac
    echo "=== $c: ${env[*]}"
    out=$(env "${env[@]}" TIMES=judge GEOCCL_DEBUG=WARN bash "$SRC/tests/wan/test_replan.sh" "$BUILD" 2>&1)
    rc=$?
    grep -E "^   rank 0: call|^PASS|^FAIL|^   [a-z]\. |^   (cross|reference|all-reduce|replans)|passed," <<< "$out" |
        sed -E 's/, ended [0-9.]+//'
    if [ $rc = 0 ]; then ok=$((ok + 1)); else bad=$((bad + 1)); fi
done
echo "$ok cases passed, $bad failed"
[ $bad = 0 ]
