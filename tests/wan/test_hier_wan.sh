#!/usr/bin/env bash
#
# The hierarchical all-reduce (comm/coll/coll_hier.c) across emulated regions:
# real network namespaces joined by shaped, delayed links
# (tools/geoccl-wan), one process per rank (tests/helpers/hier_rank.c),
# env bootstrap at rank 0 in region r0 (GEOCCL_COMM_ID=10.231.0.10:PORT),
# GEOCCL_SOCKET_IFNAME unset so that each rank picks its interface itself.
#
#   a. 2 regions x 2 ranks, 1 Gbit/s, 5 ms:     the matrix passes on every rank
#   b. 3 regions of 2 + 1 + 2 ranks, 1 Gbit/s, 5 ms: the matrix passes
#   c. 3 regions x 1 rank, and 3 + 1 ranks in 2 regions: the matrix passes
#   e. same-host fast path (GEOCCL_SHM): on b's WAN and layout, with regions
#      from the labels and no probe (so that the traffic is the same in every
#      run), the matrix with GEOCCL_SHM=1 and with 0: every rank must report
#      (hier_rank's "local peers N") the other ranks of its own region as
#      fast-path peers with 1 and none with 0, and the bytes through all
#      regions' shapers must be the same within 5% (a fast path between
#      regions would bypass the shapers and shrink them).
#   w. GEOCCL_WAN_CC=auto after init (topology/wan_tuning.h, geoWanWatch): 3
#      regions x 2 ranks, 100 Mbit/s, 25 ms, 40 s of 170 KB all-reduces at
#      defaults (probe on): on clean links every rank moves its connections
#      to both other regions from bbr to cubic; with 1% random loss none
#      does; every result exact both times.
#   p. GEOCCL_WAN_PACE: 3 regions x 2 ranks, 1 Gbit/s egress, region 0's
#      ingress 100 Mbit/s: rank 0 says it paces into r0, region 1's
#      connections to r0 carry a maximum pacing rate of about half r0's
#      downlink in all while 16 MiB all-reduces run; results exact.
#   u. GEOCCL_WAN_PACE, uplink: 3 regions x 2 ranks, 1 Gbit/s, 25 ms, 0.1%
#      loss, 64 MiB all-reduces for 16 s: region 1's connections carry
#      maximum pacing rates adding up to 1.1-2.45x its uplink's figure at
#      init, none is seen in BBR's PROBE_RTT, results exact.
#   d. cut-off: 3 regions x 2 ranks, 100 Mbit/s, 25 ms, GEOCCL_TIMEOUT=10;
#      every rank loops on 16 MiB all-reduces; 2 s after every rank said it
#      entered the loop region 2's link goes down (inside its namespace, so peers see a dead link: no
#      FIN, no RST). Every rank must fail its call and exit 2 (after
#      ncclCommAbort returned) within GEOCCL_TIMEOUT + 5 s of the cut.
#      Ranks still running 60 s after the cut are killed and fail the step.
#
# "matrix" is every type x op x in-place/out-of-place x counts 1, 2, 7, 4099,
# 262147-element float sum and int8 max, and a pre-multiplied float sum,
# checked against tests/helpers/harness.c's reference and for identical bits on
# every rank, with geocclCommGetStats showing hierarchical calls and WAN
# bytes (see hier_rank.c).
#
#   sudo bash tests/wan/test_hier_wan.sh [BUILDDIR]
#
# BUILDDIR (or $GEOCCL_TEST_BUILDDIR, else the current directory) holds the
# built lib/.libs/libgeoccl.so. hier_rank is $HIER_RANK when set, else it is
# built here with cc from this source tree against that library.
# Needs root, network namespaces and TUN (exit 77, "skipped", otherwise).
# Only one emulated WAN can exist at a time: while another one is up this
# waits, checking every 30 s, for up to $GEOCCL_WAN_WAIT seconds (default
# 600), then skips. Its own WAN is called "ghier" and is always taken down
# on the way out. Takes about 3 minutes. The last line is always
# "N passed, N failed".
#
set -uo pipefail
# The ranks bootstrap at GEOCCL_COMM_ID across regions, where traffic is
# encrypted: they share a random 256-bit key for this run.
export GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
export LC_ALL=C   # decimal points in $EPOCHREALTIME and awk

SRC=$(cd "$(dirname "$0")/../.." && pwd) || exit 1
. "$SRC/tests/helpers/wan_common.sh"
BUILD=${1:-${GEOCCL_TEST_BUILDDIR:-$PWD}}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "no build directory '$BUILD'"; exit 1; }
WAN=$SRC/tools/geoccl-wan
NAME=ghier
WAIT_MAX=${GEOCCL_WAN_WAIT:-600}
TIMEOUT_CUT=10          # GEOCCL_TIMEOUT in the cut-off step
MATRIX_LIMIT=100        # seconds a matrix step may take before ranks are killed


[ "$(id -u)" = 0 ] || skip "needs root (network namespaces); run: sudo bash $0"
[ -x "$WAN" ] || { echo "no $WAN"; exit 1; }
wan_lock

# The settings under test come from here, not from the caller's shell.
unset GEOCCL_SOCKET_IFNAME GEOCCL_REGION GEOCCL_TOPO_FILE GEOCCL_ALGO GEOCCL_HIER_SLICE GEOCCL_TIMEOUT GEOCCL_WAN_PACE
# This tests the hierarchical algorithm: the plan, fed by the probe's
# measurements, would choose flat for some sizes (tests/wan/test_probe_wan.sh
# tests that).
export GEOCCL_ALGO=hier

WORK=$(mktemp -d /tmp/geoccl-hier-wan.XXXXXX) || exit 1

. "$SRC/tests/helpers/rank_common.sh"

# matrix NAME PORT "LAYOUT": the matrix on every rank of the layout.
matrix() {
    local what=$1 port=$2 layout=$3 d t0 r st bad=0 killed
    d=$WORK/$port
    t0=$(now)
    start "$d" "$port" 60 "$layout" matrix
    finish_ranks "$d" "$(awk -v a="$t0" -v l=$MATRIX_LIMIT 'BEGIN { printf "%.6f", a + l }')"
    killed=$?
    echo "   $what: $NR ranks in regions ($layout), $(since "$t0" "$(now)") s"
    # Rank 0's summary; every rank's, with the first lines of its output,
    # where one failed (a short log keeps a later step's failure in view).
    for ((r = 0; r < NR; r++)); do
        read -r st _ < "$d/rank$r.exit"
        [ "$st" = 0 ] && grep -q "^rank $r: matrix ok" "$d/rank$r.out" || bad=$((bad + 1))
    done
    for ((r = 0; r < NR; r++)); do
        [ "$r" = 0 ] || [ "$bad" != 0 ] || [ "$killed" != 0 ] || continue
        read -r st _ < "$d/rank$r.exit"
        echo "   [r${REGION_OF[$r]}] status $st: $(grep "^rank $r: matrix" "$d/rank$r.out" || echo "(no summary)")"
        if [ "$st" != 0 ]; then sed -n '1,15p' "$d/rank$r.out" | grep -v "^rank $r: matrix" | sed 's/^/      /'; fi
    done
    RANK_PIDS=()
    if [ "$bad" = 0 ] && [ "$killed" = 0 ]; then
        pass "$what"
    else
        fail "$what: $bad of $NR ranks failed, $killed killed after $MATRIX_LIMIT s"
    fi
}

# loop_bad DIR: the ranks of DIR's loop that did not end "loop ok", their
# last lines shown; the exit status is their number (RANK_PIDS cleared).
loop_bad() {
    local d=$1 r st bad=0
    for ((r = 0; r < NR; r++)); do
        read -r st _ < "$d/rank$r.exit"
        [ "$st" = 0 ] && grep -q "^rank $r: loop ok" "$d/rank$r.out" || {
            bad=$((bad + 1)); grep -v ' INFO \| TRACE ' "$d/rank$r.out" | tail -n 4 |
                sed 's/^/      /'; }
    done
    RANK_PIDS=()
    return "$bad"
}

# ---- a, c (3 + 1): 2 regions -------------------------------------------------

echo "== 2 regions, 1 Gbit/s, 5 ms one-way"
wan_up -r 2 --rate 1gbit --delay 5ms
matrix "a. 2 regions x 2 ranks" 29501 "0 0 1 1"
matrix "c. 3 + 1 ranks in 2 regions" 29502 "0 0 0 1"

# ---- b, c (3 x 1): 3 regions -------------------------------------------------

echo "== 3 regions, 1 Gbit/s, 5 ms one-way"
wan_up -r 3 --rate 1gbit --delay 5ms
matrix "b. 3 regions of 2 + 1 + 2 ranks" 29503 "0 0 1 2 2"
matrix "c. 3 regions x 1 rank" 29504 "0 1 2"

# ---- e: the same-host fast path never crosses a region ------------------------

shaped() {  # bytes through all regions' shapers so far
    local i b s=0
    for i in 0 1 2; do
        b=$(tc -n "$NAME-r$i" -s qdisc show dev dl0 2>/dev/null | awk '/Sent/ { s = $2 } END { print s + 0 }')
        s=$((s + b))
    done
    echo "$s"
}
declare -A SHAPED
e_bad=0
for shm in 0 1; do
    b0=$(shaped)
    GEOCCL_SHM=$shm GEOCCL_PROBE=0 matrix "e. 2 + 1 + 2 ranks, GEOCCL_SHM=$shm" $((29506 + shm)) "0 0 1 2 2"
    SHAPED[$shm]=$(( $(shaped) - b0 ))
    d=$WORK/$((29506 + shm))
    for ((r = 0; r < NR; r++)); do
        same=$(tr ' ' '\n' <<< "0 0 1 2 2" | grep -cx "${REGION_OF[$r]}")
        want=$(( shm ? same - 1 : 0 ))
        got=$(sed -n "s/^rank $r: matrix .*; local peers \([0-9-]*\)\$/\1/p" "$d/rank$r.out")
        if [ "$got" != "$want" ]; then
            echo "   rank $r [r${REGION_OF[$r]}], GEOCCL_SHM=$shm: ${got:-no} fast-path peers, expected $want"
            e_bad=$((e_bad + 1))
        fi
    done
done
echo "   bytes through the shapers: ${SHAPED[0]} with GEOCCL_SHM=0, ${SHAPED[1]} with 1"
if [ "$e_bad" = 0 ] && [ "${SHAPED[0]}" -gt 0 ] &&
   awk -v a="${SHAPED[0]}" -v b="${SHAPED[1]}" 'BEGIN { exit !(b >= 0.95 * a && b <= 1.05 * a) }'; then
    pass "e. the fast path joins exactly the ranks of each region; WAN bytes unchanged"
else
    fail "e. fast path: $e_bad ranks with the wrong peer count, shaper bytes ${SHAPED[0]} vs ${SHAPED[1]}"
fi

# ---- w: the WAN's congestion control after init ---------------------------------

# watch STEP PORT SECS: 3 regions x 2 ranks loop for SECS s on 170 KB
# all-reduces (DDP's gradient bucket of a small model) at defaults; prints
# per rank how many other regions its connections moved to cubic, in
# $MOVED ("r0:2 r1:2 ..."), and fails the step unless every rank ended
# "loop ok". 170 KB (29 KB messages between regions, 20 segments per
# connection) keeps both cases clear of the rule's line: on clean links
# cubic's mean window at the loss bound passes 40 segments once some 5000
# segments are counted with the probe's few retransmissions among them, and
# at 1% loss it stays under 13. The 40 s leave the counts time to grow
# past the line on a loaded machine: the suite runs this beside the
# sanitizer builds, and there 20 s left one pair of one rank on bbr (its
# connections counted 932 segments a second where the others counted 3788). Each window in which a pair stays on
# bbr is logged (TRACE, "bbr still"); for a rank that did not move both
# pairs the last such line is printed.  The lossy links' loop runs 20 s:
# there no window comes near the line (under 13 segments where it is 40),
# so more time adds no evidence.
watch() {
    local step=$1 port=$2 secs=$3 r n bad=0
    d=$WORK/$step
    GEOCCL_DEBUG=TRACE GEOCCL_DEBUG_SUBSYS=NET start "$d" "$port" 60 "0 0 1 1 2 2" loop "$secs" 174080
    finish_ranks "$d" "$(awk -v a="$(now)" 'BEGIN { printf "%.6f", a + 110 }')"
    MOVED="" THIN=0
    loop_bad "$d"
    bad=$?
    for ((r = 0; r < NR; r++)); do
        n=$(grep -c "cubic from now on" "$d/rank$r.out")
        MOVED="$MOVED r$r:$n"
        if [ "$step" = clean ] && [ "$n" != 2 ]; then
            local last segs
            last=$(grep -h "bbr still" "$d/rank$r.out" | tail -n 1)
            [ -n "$last" ] && sed "s/.*TRACE /      rank $r: /" <<< "$last"
            # "(loss ... (R of N segments" or "too little counted yet (N segments)"
            segs=$(sed -nE -e 's/.*\(loss [^(]*\([0-9]+ of ([0-9]+) segments.*/\1/p' \
                       -e 's/.*too little counted yet \(([0-9]+) segments\).*/\1/p' <<< "$last")
            # no window logged for the pair left on bbr: no evidence either
            # way (seen once beside a loaded suite), counted as thin and said
            [ "$n" = 1 ] && [ -z "$last" ] && echo "      rank $r: no window logged for its other pair"
            [ "$n" = 1 ] && { [ -z "$last" ] || { [ -n "$segs" ] && [ "$segs" -lt 5000 ]; }; } &&
                THIN=$((THIN + 1))
        fi
    done
    RANK_PIDS=()
    grep -h "cubic from now on" "$d/rank0.out" | head -1 | sed 's/.*INFO /   rank 0: /'
    return "$bad"
}
echo "== w. 3 regions, 100 Mbit/s, 25 ms one-way, 170 KB all-reduces: clean, then 1% loss"
wan_up -r 3 --rate 100mbit --delay 25ms
# A pair a rank barely sends on (in some runs rank 5's connections to
# region 0 counted 932 segments in the 40 s, where the others' counted
# thousands a second) gives the rule too little to bound the loss: it stays
# on bbr for want of evidence, which is right.  So: every rank moved at
# least one pair, and a rank that kept one on bbr had counted under 5000
# segments on it (THIN counts those).
if watch clean 29530 40 && [ "$(tr ' ' '\n' <<< "$MOVED" | grep -c ':[12]$')" = 6 ] &&
   [ "$(tr ' ' '\n' <<< "$MOVED" | grep -c ':2$')" = "$((6 - THIN))" ]; then
    pass "w. clean links: every rank moved its pairs from bbr to cubic after init, but for $THIN pair(s) with too few segments, or no window logged, to judge ($MOVED)"
else
    fail "w. clean links: ranks' pairs moved to cubic:$MOVED (every rank should say 2, or 1 where the other pair counted under 5000 segments)"
fi
wan_up -r 3 --rate 100mbit --delay 25ms --loss 1 --seed 5
if watch lossy 29531 20 && [ "$(tr ' ' '\n' <<< "$MOVED" | grep -c ':0$')" = 6 ]; then
    pass "w. 1% loss: every pair stayed on bbr ($MOVED)"
else
    fail "w. 1% loss: ranks' pairs moved to cubic:$MOVED (every rank should say 0)"
fi

# ---- p: pacing into a slow downlink ---------------------------------------------

# Region 0 receives at 100 Mbit/s (a policer: tbf on its ingress), every
# region sends at 1 Gbit/s. The probe must see r0's downlink hold its flows
# back, rank 0 must say at init that the hierarchical all-reduce paces into
# r0, and while the all-reduces run region 1's connections to r0 must carry
# a maximum pacing rate (ss: "pacing_rate NOW/MAX"), the MAX of the four
# adding up to about half of r0's downlink (region 1 sends half of what r0
# receives). Results exact on every rank.
echo "== p. 3 regions x 2 ranks, 1 Gbit/s out, region 0 receives at 100 Mbit/s; 16 MiB all-reduces"
wan_up -r 3 --rate 1gbit --delay 25ms --ingress-rates 100mbit,none,none
d=$WORK/pace
GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=TUNING start "$d" 29532 60 "0 0 1 1 2 2" loop 10 16777216
p_max=0
for ((i = 0; i < 20; i++)); do
    sleep 1
    # bytes/s of the largest sum of r1's maximum pacing rates into r0 seen
    m=$("$WAN" exec -n "$NAME" -i 1 -- ss -tin dst 10.231.0.10 2>/dev/null |
        grep -o 'pacing_rate [0-9]*bps/[0-9]*bps' | sed 's|.*/||; s|bps||' |
        awk '{ s += $1 } END { printf "%.0f", s / 8 }')
    [ "${m:-0}" -gt "$p_max" ] && p_max=$m
done
finish_ranks "$d" "$(awk -v a="$(now)" 'BEGIN { printf "%.6f", a + 90 }')"
loop_bad "$d"
p_bad=$?
p_line=$(grep -h "paced into regions" "$d/rank0.out" | head -1 | sed 's/.*INFO //')
echo "   rank 0: ${p_line:-(no pacing line)}"
echo "   region 1's connections into r0: at most $((p_max * 8 / 1000000)) Mbit/s in all"
if [ "$p_bad" = 0 ] && [[ $p_line == *" r0 "* ]] &&
   awk -v m="$p_max" 'BEGIN { exit !(m >= 0.3 * 12.5e6 && m <= 0.75 * 12.5e6) }'; then
    pass "p. slow downlink: paced into r0, region 1 at about half its rate, results exact"
else
    fail "p. slow downlink: $p_bad ranks failed; pacing line '${p_line}'; region 1 paced at $p_max bytes/s in all (want 30-75% of 12.5e6)"
fi

# ---- u: each connection at its share of the uplink; no PROBE_RTT mid-call --------

# 3 regions x 2 ranks, 1 Gbit/s, 25 ms, 0.1% loss (so the pairs stay on
# BBR), 64 MiB all-reduces for 16 s (0.74 s of the uplink each: over the
# 0.5 s from which a call is paced, and the 5 round trips a BBR restart
# needs). Each region's first rank says at init
# at what goodput its region sends in all; the maximum pacing rates of
# region 1's connections to the other regions that sent in the last 0.5 s
# (ss, "pacing_rate NOW/MAX", both ranks) must add up to 1.1-2.45 times
# that figure (topology/wan_pace.c: 1.2 times, and a gain of 1 to 2).
# Sampled every 0.25 s, some sending connection must be on bbr and none
# may be seen in BBR's PROBE_RTT (a window of 4 segments, cwnd_gain 1):
# with the restarts at call starts turned off, one run saw it in 3 of 71
# samples.
echo "== u. 3 regions x 2 ranks, 1 Gbit/s, 25 ms, 0.1% loss; 64 MiB all-reduces for 16 s"
wan_up -r 3 --rate 1gbit --delay 25ms --loss 0.1 --seed 3
d=$WORK/uplink
GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=TUNING start "$d" 29533 60 "0 0 1 1 2 2" loop 16 67108864
u_max=0 u_probe=0 u_samples=0 u_bbr=0
t_end=$(awk -v a="$(now)" 'BEGIN { printf "%.0f", a + 21 }')
while [ "$(awk -v a="$(now)" 'BEGIN { printf "%.0f", a }')" -lt "$t_end" ]; do
    sleep 0.25
    out=$("$WAN" exec -n "$NAME" -i 1 -- ss -tin state established 2>/dev/null)
    # connections that sent in the last 0.5 s (a pair's second stream
    # stays idle while the plan uses one, but carries the pair's cap too)
    # (ss leaves lastsnd out when it is 0); per sample: the caps' sum in
    # bytes/s, sending connections on bbr, connections in PROBE_RTT
    read -r m b p < <(awk '
        /cwnd:/ {
            last = 0; max = 0
            if (match($0, /lastsnd:[0-9]+/)) last = substr($0, RSTART + 8, RLENGTH - 8) + 0
            if (match($0, /pacing_rate [0-9]+bps\/[0-9]+bps/)) {
                r = substr($0, RSTART, RLENGTH); sub(/.*\//, "", r); max = r + 0 }
            if (last < 500) { cap += max; bbr += / bbr:\(/ }
            probe += / cwnd:4 / && /pacing_gain:1,cwnd_gain:1\)/
        }
        END { printf "%.0f %d %d\n", cap / 8, bbr, probe }' <<< "$out")
    [ "${m:-0}" -gt "$u_max" ] && u_max=$m
    u_bbr=$((u_bbr + ${b:-0}))
    u_probe=$((u_probe + ${p:-0}))
    u_samples=$((u_samples + 1))
done
finish_ranks "$d" "$(awk -v a="$(now)" 'BEGIN { printf "%.6f", a + 90 }')"
loop_bad "$d"
u_bad=$?
u_line=$(grep -h "region r1 sends at" "$d"/rank*.out | head -1 | sed 's/.*INFO //')
u_up=$(sed -n 's/.*sends at \([0-9.]*\) Mbit\/s in all.*/\1/p' <<< "$u_line")
echo "   ${u_line:-(no uplink pacing line from region 1)}"
echo "   region 1's connections to other regions: at most $((u_max * 8 / 1000000)) Mbit/s in" \
     "all; seen in PROBE_RTT in $u_probe of $u_samples samples"
if [ "$u_bad" = 0 ] && [ -n "$u_up" ] && [ "$u_probe" = 0 ] && [ "$u_samples" -ge 40 ] &&
   [ "$u_bbr" -gt 0 ] &&
   awk -v m="$u_max" -v u="$u_up" 'BEGIN { exit !(m * 8e-6 >= 1.1 * u && m * 8e-6 <= 2.45 * u) }'
then
    pass "u. uplink: region 1 paced at its share (1.1-2.45x), no PROBE_RTT, results exact"
else
    fail "u. uplink: $u_bad ranks failed; uplink '${u_up:-none}' Mbit/s, caps" \
         "$((u_max * 8 / 1000000)) Mbit/s in all (want 1.1-2.45x); PROBE_RTT in $u_probe of" \
         "$u_samples samples (want 0 of 40 or more); sending on bbr: $u_bbr (want some)"
fi

# ---- d: region 2 cut off mid-all-reduce -----------------------------------------

echo "== 3 regions, 100 Mbit/s, 25 ms one-way; GEOCCL_TIMEOUT=$TIMEOUT_CUT; region 2 cut off 2 s into the all-reduce loop"
wan_up -r 3 --rate 100mbit --delay 25ms
d=$WORK/cut
t0=$(now)
start "$d" 29505 "$TIMEOUT_CUT" "0 0 1 1 2 2" loop 120 16777216
# The cut must fall in the all-reduce loop, after init: wait until every
# rank says it is there (init, the probe included, took 1.4 s here alone,
# and longer beside a loaded suite: a fixed 4 s could cut the init), then
# 2 s more, inside a call (a 16 MiB call takes about 1.8 s on these links).
wait_until=$(awk -v a="$(now)" -v s="${GEOCCL_TEST_TIME_SCALE:-1}" 'BEGIN { printf "%.6f", a + 60 * s }')
while :; do
    inloop=0 early=0
    for ((r = 0; r < NR; r++)); do
        grep -q "^rank $r: in the all-reduce loop" "$d/rank$r.out" 2>/dev/null && inloop=$((inloop + 1))
        [ -s "$d/rank$r.exit" ] && early=$((early + 1))
    done
    [ "$inloop" = "$NR" ] || [ "$early" != 0 ] && break
    awk -v a="$(now)" -v b="$wait_until" 'BEGIN { exit !(a > b) }' && break
    sleep 0.1
done
echo "   $inloop of $NR ranks in the all-reduce loop $(since "$t0" "$(now)") s after the start"
sleep 2
early=0
for ((r = 0; r < NR; r++)); do [ -s "$d/rank$r.exit" ] && early=$((early + 1)); done
# wan0 is region 2's only way out (a veth to the bridge); down, it drops
# everything silently, both ways.
ip netns exec "$NAME-r2" ip link set wan0 down
tcut=$(now)
echo "   region 2's wan0 down $(since "$t0" "$tcut") s after the start"
finish_ranks "$d" "$(awk -v a="$tcut" 'BEGIN { printf "%.6f", a + 60 }')"
killed=$?
limit=$((TIMEOUT_CUT + 5))
bad=0
worst=0
for ((r = 0; r < NR; r++)); do
    read -r st te < "$d/rank$r.exit"
    dt=$(since "$tcut" "$te")
    worst=$(awk -v a="$worst" -v b="$dt" 'BEGIN { print (b > a) ? b : a }')
    verdict=ok
    if [ "$st" != 2 ]; then
        verdict="status $st, expected 2"
    elif ! awk -v x="$dt" -v l="$limit" 'BEGIN { exit !(x >= 0 && x <= l) }'; then
        verdict="exited ${dt} s after the cut, limit $limit s"
    fi
    [ "$verdict" = ok ] || bad=$((bad + 1))
    echo "   rank $r [r${REGION_OF[$r]}] status $st, ended ${dt} s after the cut: $verdict"
    sed 's/^/      /' "$d/rank$r.out" | head -8
done
RANK_PIDS=()
if [ "$bad" = 0 ] && [ "$killed" = 0 ] && [ "$early" = 0 ] && [ "$inloop" = "$NR" ]; then
    pass "d. cut-off: all $NR ranks exited 2 within ${worst} s of the cut (limit $limit s)"
else
    fail "d. cut-off: $bad of $NR ranks wrong, $killed killed 60 s after the cut, $early ended before it, $inloop of $NR had entered the loop"
fi

"$WAN" down -n "$NAME" -q >/dev/null 2>&1
finish
