#!/usr/bin/env bash
#
# Faults between emulated regions (tools/geoccl-wan): 3 regions x 2
# ranks, 1 Gbit/s, 10 ms one-way (RTT 20 ms between regions), one
# tests/helpers/hier_rank per rank in its region's namespace, looping on 4 MiB
# float all-reduces followed by a broadcast, an all-gather, a reduce-scatter
# and a send/recv ring (hier_rank loop ... all), every result checked.
# Regions come from the namespaces' labels (GEOCCL_PROBE=0).
#
# What a middlebox or a route change does, which the ranks must survive
# with every result exact (every rank exits 0 with "loop ok" and counts
# reconnects; comm/transport/net_tcp_internal.h, "Resume after a reset"):
#   a. one WAN connection reset (`ss -K` at one end, inside region 1),
#      hierarchical all-reduce;
#   b. every connection between regions 0 and 1 reset at once, flat
#      all-reduce (GEOCCL_ALGO=flat);
#   c. a WAN connection reset every 2 s for 12 s, hierarchical all-reduce
#      with lossless compression between regions;
#   d. region 2's link down for 15 s (no carrier, no FIN, no RST: TCP
#      retransmits, with backoff), with GEOCCL_TIMEOUT=90;
#   g. during init: rank 3 starts 3 s after the others, so that they wait
#      at the bootstrap root meanwhile; every connection between regions 1
#      and 0 (rank 2's to the root among them) is reset every 0.2 s for the
#      first 2 s;
#   h. from the start: every data connection between regions 1 and 0
#      (those to the bootstrap root are g's) reset every 0.05 s for 3 s:
#      their handshakes at init (a dialler whose ack was lost dials afresh
#      and replaces the slot it had taken, or resumes it from its start
#      where the acceptor's set-up is over: hello_fits in
#      comm/transport/net_tcp_handshake.c), the probe (GEOCCL_PROBE=1) and the first
#      calls.  How many dialled again is printed: at 10 ms one-way a few
#      per run; the same for 4 s at 40 ms, 18-37 (6 runs, every rank exact).
# What a dead peer does, which must end every other rank with a clear error
# (exit 2, after ncclCommAbort returned), never a hang:
#   e. a rank SIGKILLed: every other rank fails within 2 s;
#   f. a rank SIGSTOPped: every other rank fails within GEOCCL_TIMEOUT (10)
#      + 5 s.
# The time from reset to resume (the ranks' INFO lines) is printed, in
# milliseconds and in round trips.
#
#   sudo bash tests/wan/test_faults.sh [BUILDDIR]
#
# Needs root, network namespaces, TUN and `ss -K` (the kernel's
# sock_destroy); exit 77, skipped, with the reason otherwise.  Its WAN is
# called "gfault"; another emulated WAN up is waited for (GEOCCL_WAN_WAIT,
# default 600 s).  Takes about 2 minutes.
#
set -uo pipefail
export GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
export LC_ALL=C

SRC=$(cd "$(dirname "$0")/../.." && pwd) || exit 1
. "$SRC/tests/helpers/wan_common.sh"
BUILD=${1:-${GEOCCL_TEST_BUILDDIR:-$PWD}}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "no build directory '$BUILD'"; exit 1; }
WAN=$SRC/tools/geoccl-wan
NAME=gfault
WAIT_MAX=${GEOCCL_WAN_WAIT:-600}
RTT_MS=20
LAYOUT="0 0 1 1 2 2"
BYTES=4194304

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces); run: sudo bash $0"
command -v ss >/dev/null || skip "needs ss (iproute2)"
wan_lock
unset GEOCCL_SOCKET_IFNAME GEOCCL_REGION GEOCCL_TOPO_FILE GEOCCL_ALGO GEOCCL_HIER_SLICE \
    GEOCCL_TIMEOUT GEOCCL_COMPRESS GEOCCL_RECONNECT_TIMEOUT
export GEOCCL_PROBE=0 GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=NET

WORK=$(mktemp -d /tmp/geoccl-faults.XXXXXX) || exit 1
. "$SRC/tests/helpers/rank_common.sh"

# conns REGION TO: "localport peerport" of the established connections from
# region REGION to region TO's address.
conns() {
    ip netns exec "$NAME-r$1" ss -tnH state established dst "10.231.0.$((10 + $2))" 2>/dev/null |
        awk '{n = split($3, a, ":"); m = split($4, b, ":"); print a[n], b[m]}'
}
# reset REGION "localport peerport": kills that connection at region
# REGION's end; its peer gets an RST, as from a middlebox.
reset() {
    ip netns exec "$NAME-r$1" ss -K "( sport = :${2% *} and dport = :${2#* } )" 2>/dev/null |
        grep -c ESTAB
}
# wait_conns: until region 1 has connections to region 0 (init is over).
wait_conns() {
    local i
    for i in $(seq 300); do
        [ "$(conns 1 0 | wc -l)" -gt 0 ] && return 0
        sleep 0.1
    done
    return 1
}

RESUMES=()
# survived WHAT STEPDIR: every rank exited 0 with "loop ok"; the ranks
# together resumed connections.
survived() {
    local what=$1 d=$2 r st bad=0 rec=0 n
    for ((r = 0; r < NR; r++)); do
        read -r st _ < "$d/rank$r.exit"
        if [ "$st" = 0 ] && grep -q "^rank $r: loop ok" "$d/rank$r.out"; then
            n=$(sed -n "s/^rank $r: loop ok.*reconnects \([0-9]*\),.*/\1/p" "$d/rank$r.out")
            rec=$((rec + ${n:-0}))
        else
            bad=$((bad + 1))
            echo "   rank $r [r${REGION_OF[$r]}] status $st:"
            grep -v "INFO" "$d/rank$r.out" | tail -n 6 | sed 's/^/      /'
        fi
    done
    grep -ho "resumed [0-9.]* s after the reset" "$d"/rank*.out > "$d/resumes"
    RESUMES+=("$d/resumes")
    grep -h "^rank 0: loop" "$d/rank0.out" | sed "s/^/   /"
    if [ "$bad" = 0 ] && [ "$rec" -gt 0 ]; then
        pass "$what: every rank exact, $rec reconnects counted"
    else
        fail "$what: $bad of $NR ranks failed, $rec reconnects counted"
    fi
}

# failed_within WHAT STEPDIR T0 LIMIT VICTIM: every rank but VICTIM exited 2
# within LIMIT s of T0.
failed_within() {
    local what=$1 d=$2 t0=$3 limit=$4 victim=$5 r st te dt bad=0 worst=0
    for ((r = 0; r < NR; r++)); do
        [ "$r" = "$victim" ] && continue
        read -r st te < "$d/rank$r.exit"
        dt=$(since "$t0" "$te")
        worst=$(awk -v a="$worst" -v b="$dt" 'BEGIN { print (b > a) ? b : a }')
        if [ "$st" != 2 ] || ! awk -v x="$dt" -v l="$limit" 'BEGIN { exit !(x >= 0 && x <= l) }'; then
            bad=$((bad + 1))
            echo "   rank $r [r${REGION_OF[$r]}] status $st, ended $dt s after the fault (limit $limit s):"
            grep -v "INFO" "$d/rank$r.out" | tail -n 4 | sed 's/^/      /'
        fi
    done
    grep -h "^rank [0-9]*: error after" "$d"/rank*.out | head -2 | sed 's/^/   /'
    if [ "$bad" = 0 ]; then
        pass "$what: the other $((NR - 1)) ranks failed with an error within $worst s (limit $limit s)"
    else
        fail "$what: $bad ranks did not fail within $limit s"
    fi
}

deadline() { awk -v a="$(now)" -v l="$1" 'BEGIN { printf "%.6f", a + l }'; }

# ranks_failed STEPDIR: how many ranks did not exit 0 with "loop ok" (their
# last lines go to stderr).
ranks_failed() {
    local d=$1 r st bad=0
    for ((r = 0; r < NR; r++)); do
        read -r st _ < "$d/rank$r.exit"
        [ "$st" = 0 ] && grep -q "^rank $r: loop ok" "$d/rank$r.out" || {
            bad=$((bad + 1)); grep -v INFO "$d/rank$r.out" | tail -n 4 | sed 's/^/      /' >&2; }
    done
    echo "$bad"
}

echo "== 3 regions x 2 ranks, 1 Gbit/s, 10 ms one-way"
wan_up -r 3 --rate 1gbit --delay 10ms

# ss -K needs the kernel's sock_destroy.
d=$WORK/a
GEOCCL_ALGO=hier start "$d" 29601 30 "$LAYOUT" loop 6 "$BYTES" all
wait_conns || echo "   no WAN connection from region 1 seen"
sleep 2
c=$(conns 1 0 | shuf -n 1)
if [ -z "$c" ] || [ "$(reset 1 "$c")" = 0 ]; then
    finish_ranks "$d" "$(deadline 1)"
    skip "ss -K cannot kill sockets here (no CONFIG_INET_DIAG_DESTROY)"
fi
finish_ranks "$d" "$(deadline 60)"
survived "a. one connection reset, hierarchical" "$d"

d=$WORK/b
GEOCCL_ALGO=flat start "$d" 29602 30 "$LAYOUT" loop 6 "$BYTES" all
wait_conns
sleep 2
n=0
while read -r c; do n=$((n + $(reset 1 "$c"))); done < <(conns 1 0)
echo "   $n connections between regions 1 and 0 reset"
finish_ranks "$d" "$(deadline 60)"
survived "b. every connection between two regions reset, flat" "$d"

d=$WORK/c
GEOCCL_ALGO=hier GEOCCL_COMPRESS=lossless start "$d" 29603 30 "$LAYOUT" loop 16 "$BYTES" all
wait_conns
n=0
for _ in $(seq 6); do
    sleep 2
    g=$((RANDOM % 3)); h=$(( (g + 1 + RANDOM % 2) % 3 ))
    c=$(conns "$g" "$h" | shuf -n 1)
    [ -n "$c" ] && n=$((n + $(reset "$g" "$c")))
done
echo "   $n resets in 12 s"
finish_ranks "$d" "$(deadline 60)"
survived "c. a reset every 2 s for 12 s, hierarchical, lossless compression" "$d"

d=$WORK/d
GEOCCL_ALGO=hier start "$d" 29604 90 "$LAYOUT" loop 25 "$BYTES" all
wait_conns
sleep 2
# The bridge's end of region 2's veth down: wan0 loses its carrier, its
# routes stay, everything is dropped silently both ways; then back.
ip link set "$NAME-v2" down
sleep 15
ip link set "$NAME-v2" up
echo "   region 2's link was down for 15 s"
finish_ranks "$d" "$(deadline 120)"
# Nothing was reset: the connections outlive the outage; count calls only.
bad=$(ranks_failed "$d")
grep -h "^rank 0: loop" "$d/rank0.out" | sed 's/^/   /'
if [ "$bad" = 0 ]; then pass "d. link down for 15 s: every rank exact"
else fail "d. link down for 15 s: $bad of $NR ranks failed"; fi

d=$WORK/g
late=$WORK/late_rank.sh
printf '#!/bin/sh\n[ "$RANK" = 3 ] && sleep 3\nexec "%s" "$@"\n' "$BIN" > "$late"
chmod +x "$late"
bin_was=$BIN BIN=$late
GEOCCL_ALGO=hier start "$d" 29607 30 "$LAYOUT" loop 6 "$BYTES" all
BIN=$bin_was
n=0
for _ in $(seq 10); do
    while read -r c; do n=$((n + $(reset 1 "$c"))); done < <(conns 1 0)
    sleep 0.2
done
echo "   $n connections between regions 1 and 0 reset while the ranks waited at the root"
finish_ranks "$d" "$(deadline 60)"
# (the bootstrap's rejoins are not resumed data connections: no count needed)
bad=$(ranks_failed "$d")
if [ "$bad" = 0 ] && [ "$n" -gt 0 ]; then pass "g. resets at the bootstrap during init: every rank exact"
else fail "g. resets at the bootstrap during init: $bad of $NR ranks failed, $n resets"; fi

d=$WORK/h
GEOCCL_ALGO=hier GEOCCL_PROBE=1 start "$d" 29608 30 "$LAYOUT" loop 6 "$BYTES" all
n=0
for _ in $(seq 60); do
    while read -r c; do n=$((n + $(reset 1 "$c"))); done < <(conns 1 0 | grep -v " 29608$")
    sleep 0.05
done
finish_ranks "$d" "$(deadline 60)"
again=$(cat "$d"/rank*.out | grep -c "dialled again at set-up")
echo "   $n data connections between regions 1 and 0 reset in the first 3 s; $again data connections dialled again at set-up"
bad=$(ranks_failed "$d")
grep -h "^rank 0: loop" "$d/rank0.out" | sed 's/^/   /'
if [ "$bad" = 0 ] && [ "$n" -gt 0 ]; then pass "h. data connections reset from the start: handshakes, probe, first calls: every rank exact"
else fail "h. data connections reset from the start: $bad of $NR ranks failed, $n resets"; fi

d=$WORK/e
GEOCCL_ALGO=hier start "$d" 29605 30 "$LAYOUT" loop 60 "$BYTES" all
wait_conns
sleep 2
kill -9 "$(cat "$d/rank4.pid")"
t0=$(now)
finish_ranks "$d" "$(deadline 45)"
failed_within "e. rank 4 SIGKILLed" "$d" "$t0" 2 4

d=$WORK/f
GEOCCL_ALGO=hier start "$d" 29606 10 "$LAYOUT" loop 60 "$BYTES" all
wait_conns
sleep 2
kill -STOP "$(cat "$d/rank4.pid")"
t0=$(now)
# Every rank but the stopped one ends; then the stopped one is killed.
for _ in $(seq 300); do
    left=0
    for r in 0 1 2 3 5; do [ -s "$d/rank$r.exit" ] || left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
done
kill -9 "$(cat "$d/rank4.pid")"
finish_ranks "$d" "$(deadline 5)"
failed_within "f. rank 4 SIGSTOPped, GEOCCL_TIMEOUT=10" "$d" "$t0" 15 4

cat "${RESUMES[@]}" | awk -v rtt="$RTT_MS" '{ s += $2; if ($2 > m) m = $2 }
    END { if (NR) printf "reset to resume: mean %.1f ms (%.1f RTT), max %.1f ms (%.1f RTT) over %d resumes, RTT %d ms\n",
              1000 * s / NR, 1000 * s / NR / rtt, 1000 * m, 1000 * m / rtt, NR, rtt }'

"$WAN" down -n "$NAME" -q >/dev/null 2>&1
finish
