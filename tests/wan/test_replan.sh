#!/usr/bin/env bash
#
# The plan follows the links (GEOCCL_REPLAN; comm/coll/replan.c): 3 regions
# x 2 ranks on the emulated WAN (tools/geoccl-wan), 25 ms one way, every
# uplink at RATE.  The ranks run CALLS all-reduces of BYTES of floats
# (tests/helpers/hier_rank.c "calls": every result checked exactly and the
# same on every rank).  Before call DROP+1, region 0's uplink falls to LOW;
# before call BACK+1 it returns to RATE.  Checked:
#   a. every call succeeded with exact, identical results;
#   b. the plan was made again after the drop (region 0's share fell) and
#      again after the return (shares back to about equal), by every rank
#      at the same call (a rank that switched alone would have failed a);
#   c. at most two re-plans per change (no oscillation);
#   d. the calls from the fifth after the drop on are within 1.15x of the
#      new uneven bound (BYTES x 8 / LOW: the slow region sends the whole
#      buffer once), and from the fifth after the return within 1.10x of the
#      old bound (2 (R-1)/R BYTES x 8 / RATE), both at the links' rates
#      (16 MiB: 5.37 s and 1.79 s).  With TIMES=report (the default in
#      the suite) d is printed, not judged: timing on a loaded 2-core
#      machine is no test; tests/perf/bench_replan.sh judges it quietly.
#
#   sudo bash tests/wan/test_replan.sh [BUILDDIR]
#   RATE=1gbit LOW=250mbit BYTES=67108864 TIMES=judge sudo -E bash ...
#
# Needs root, network namespaces and TUN (exit 77 otherwise).  Its WAN is
# called "grepl".  The last line is "N passed, N failed".
#
set -uo pipefail
export GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
export LC_ALL=C

SRC=$(cd "$(dirname "$0")/../.." && pwd) || exit 1
. "$SRC/tests/helpers/wan_common.sh"
BUILD=${1:-${GEOCCL_TEST_BUILDDIR:-$PWD}}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "no build directory '$BUILD'"; exit 1; }
WAN=$SRC/tools/geoccl-wan
NAME=grepl
WAIT_MAX=${GEOCCL_WAN_WAIT:-600}
RATE=${RATE:-100mbit}
LOW=${LOW:-25mbit}
BYTES=${BYTES:-16777216}
CALLS=${CALLS:-20}
DROP=${DROP:-5}
BACK=${BACK:-12}
TIMES=${TIMES:-report}
DELAY_MS=25

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces); run: sudo bash $0"
[ -x "$WAN" ] || { echo "no $WAN"; exit 1; }
wan_lock

unset GEOCCL_SOCKET_IFNAME GEOCCL_REGION GEOCCL_TOPO_FILE GEOCCL_ALGO GEOCCL_HIER_SLICE \
      GEOCCL_TIMEOUT GEOCCL_WAN_PACE GEOCCL_REPLAN GEOCCL_COMPRESS
export GEOCCL_ALGO=hier GEOCCL_DEBUG=${GEOCCL_DEBUG:-INFO} GEOCCL_DEBUG_SUBSYS=${GEOCCL_DEBUG_SUBSYS:-TUNING}
WORK=$(mktemp -d /tmp/geoccl-replan.XXXXXX) || exit 1
. "$SRC/tests/helpers/rank_common.sh"

bps() { # tc rate -> bits/s
    awk -v r="$1" 'BEGIN { n = r + 0; u = tolower(substr(r, length(n "") + 1));
        m = u ~ /^g/ ? 1e9 : u ~ /^m/ ? 1e6 : u ~ /^k/ ? 1e3 : 1; printf "%.0f", n * m }'
}

# region 0's uplink to RATE_ARG, the running connections kept
set_rate() {
    "$WAN" set -n "$NAME" -q 0 rate="$1" > "$WORK/set.log" 2>&1 || {
        cat "$WORK/set.log"; echo "geoccl-wan set failed"; exit 1; }
}

echo "== 3 regions x 2 ranks, $RATE each, ${DELAY_MS} ms one way; region 0 to $LOW after call $DROP, back after call $BACK; $CALLS x $BYTES B"
wan_up -r 3 --rate "$RATE" --delay "${DELAY_MS}ms"
D=$WORK/run
mkdir -p "$D/pause"
export HIER_RANK_PAUSE_AT="$DROP,$BACK" HIER_RANK_PAUSE_DIR=$D/pause
t0=$(now)
start "$D" 29561 60 "0 0 1 1 2 2" calls "$CALLS" "$BYTES"
deadline=$(awk -v a="$t0" 'BEGIN { printf "%.6f", a + 600 }')
for k in "$DROP" "$BACK"; do
    while [ ! -e "$D/pause/at-$k" ]; do
        [ -s "$D/rank0.exit" ] && break
        awk -v a="$(now)" -v b="$deadline" 'BEGIN { exit !(a > b) }' && break
        sleep 0.05
    done
    if [ "$k" = "$DROP" ]; then set_rate "$LOW"; else set_rate "$RATE"; fi
    touch "$D/pause/go-$k"
done
finish_ranks "$D" "$deadline"
killed=$?
echo "   $(since "$t0" "$(now)") s"
grep "^rank 0: call " "$D/rank0.out" | sed 's/^/   /'
grep -h "calls ok" "$D"/rank*.out | sed 's/^/   /'

bad=0
for ((r = 0; r < NR; r++)); do
    read -r st _ < "$D/rank$r.exit"
    if [ "$st" != 0 ] || ! grep -q "^rank $r: calls ok" "$D/rank$r.out"; then
        bad=$((bad + 1))
        grep -v ' INFO \| TRACE ' "$D/rank$r.out" | tail -n 4 | sed 's/^/      /'
    fi
done
RANK_PIDS=()
if [ "$bad" = 0 ] && [ "$killed" = 0 ]; then
    pass "a. $CALLS calls, every result exact and the same on every rank"
else
    fail "a. $bad of $NR ranks failed, $killed killed"
fi

# per call: time, replans, region 0's share
calls=$(grep "^rank 0: call " "$D/rank0.out" |
    sed -E 's/^rank 0: call ([0-9]+): ([0-9.]+) s, replans ([0-9]+), shares ([0-9.]+).*/\1 \2 \3 \4/')
rp_drop=$(awk -v a="$DROP" -v b="$BACK" '$1 == a { x = $3 } $1 == b { print $3 - x }' <<< "$calls")
rp_back=$(awk -v b="$BACK" '$1 == b { x = $3 } { last = $3 } END { print last - x }' <<< "$calls")
sh_low=$(awk -v b="$BACK" '$1 == b { print $4 }' <<< "$calls")
sh_end=$(awk '{ s = $4 } END { print s }' <<< "$calls")
if [ "${rp_drop:-0}" -ge 1 ] && [ "${rp_back:-0}" -ge 1 ] &&
   awk -v l="${sh_low:-1}" -v e="${sh_end:-0}" 'BEGIN { exit !(l < 0.2 && e > 0.28) }'; then
    pass "b. made again after the drop (region 0's share $sh_low) and after the return ($sh_end)"
else
    fail "b. re-plans after the drop ${rp_drop:-?}, after the return ${rp_back:-?}; region 0's share ${sh_low:-?} then ${sh_end:-?}"
fi
if [ "${rp_drop:-9}" -le 2 ] && [ "${rp_back:-9}" -le 2 ]; then
    pass "c. at most two re-plans per change ($rp_drop, $rp_back)"
else
    fail "c. ${rp_drop:-?} re-plans after the drop, ${rp_back:-?} after the return"
fi

# d: the bounds, at the links' rates
low=$(bps "$LOW") high=$(bps "$RATE")
new_bound=$(awk -v b="$BYTES" -v r="$low" 'BEGIN { printf "%.3f", b * 8 / r }')
old_bound=$(awk -v b="$BYTES" -v r="$high" 'BEGIN { printf "%.3f", 2 * 2 / 3 * b * 8 / r }')
worst_low=$(awk -v a=$((DROP + 5)) -v b="$BACK" '$1 >= a && $1 <= b && $2 > w { w = $2 } END { printf "%.3f", w }' <<< "$calls")
worst_high=$(awk -v a=$((BACK + 5)) '$1 >= a && $2 > w { w = $2 } END { printf "%.3f", w }' <<< "$calls")
r1=$(awk -v w="$worst_low" -v b="$new_bound" 'BEGIN { printf "%.2f", w / b }')
r2=$(awk -v w="$worst_high" -v b="$old_bound" 'BEGIN { printf "%.2f", w / b }')
line="d. from the fifth call after the drop: slowest $worst_low s, ${r1}x the new bound $new_bound s (target 1.15x); after the return: $worst_high s, ${r2}x the old bound $old_bound s (target 1.10x)"
if [ "$TIMES" = judge ]; then
    if awk -v a="$r1" -v b="$r2" 'BEGIN { exit !(a <= 1.15 && b <= 1.10) }'; then pass "$line"; else fail "$line"; fi
else
    echo "   $line"
fi
finish
