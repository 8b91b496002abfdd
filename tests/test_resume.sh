#!/usr/bin/env bash
#
# TCP connections resume after a reset (comm/transport/net_tcp_internal.h,
# "Resume after a reset").  Four forked ranks of geoccl-perf on loopback, TCP only
# (GEOCCL_SHM=0: the same-host sockets are not resumed), all-reduce 16 MiB
# of exactly summable integers in a loop, every result checked bit for bit
# by geoccl-perf; while they run, `ss -K` kills established connections
# between them, one end only, as a middlebox's reset would:
#   a. one reset, in the clear;
#   b. a reset every 0.5 s, encrypted (GEOCCL_ENCRYPT=all: the frames sent
#      again are sealed under the new connection's keys);
#   c. every connection of rank 0 at once;
#   d. GEOCCL_RECONNECT_TIMEOUT=0: one reset is an error on the ranks (the
#      way it was before resume), and the run fails rather than hangs;
#   e. during init: ranks 0-2 of 4 (env bootstrap, one process each) have
#      joined the bootstrap root and wait for the last one; every
#      connection to the root is reset; rank 3 starts.  The three join
#      again (comm/bootstrap/join.c, their token) and all four run;
#   f. from the start: a random connection of the run reset every 30 ms for
#      2 s, through the bootstrap, the data connections' handshakes, the
#      probe and the first all-reduces.
# a-c pass when geoccl-perf exits 0 with "Wrong values : 0 OK" and reports
# resumed connections and no error.  The time from reset to resume, from
# the ranks' INFO lines, is printed.
#
#   sudo bash tests/test_resume.sh [BUILDDIR]
#
# Needs root and `ss -K` (the kernel's sock_destroy): exit 77, skipped,
# otherwise.  Takes about a minute.
#
set -uo pipefail
BUILD=${1:-${GEOCCL_TEST_BUILDDIR:-$PWD}}
PERF=$BUILD/geoccl-perf
passed=0
failed=0
pass() { passed=$((passed + 1)); echo "PASS: $*"; }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }
[ -x "$PERF" ] || { echo "FAIL: no $PERF"; echo "0 passed, 1 failed"; exit 1; }
if [ "$(id -u)" != 0 ] || ! command -v ss >/dev/null; then
    echo "SKIP: needs root and ss"; exit 77
fi
export GEOCCL_SHM=0 GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
LOG=$(mktemp -d)
RUN=
# stop_run PID: geoccl-perf -N's ranks first, then their parent.  Killed
# the other way round, the ranks outlive it (reparented, out of pkill -P's
# reach) and go on with their all-reduces after the test has ended, taking
# the CPU from every test after this one.
stop_run() {
    [ -n "$1" ] || return 0
    pkill -KILL -P "$1" 2>/dev/null
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}
cleanup() {
    local p
    stop_run "$RUN"
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    [ -n "${KEEP_LOG:-}" ] || rm -rf "$LOG"
}
pids=()
trap cleanup EXIT

# Established TCP connections of the run whose pid is $1 (its forked ranks
# are its children): "localport peerport" per line.
rank_ports() {
    local kids
    kids=$(pgrep -P "$1" | tr '\n' '|')
    [ -n "$kids" ] || return 0
    ss -tnpH state established 2>/dev/null | grep -E "pid=(${kids%|})," |
        awk '{n = split($3, a, ":"); m = split($4, b, ":"); print a[n], b[m]}'
}

# start NAME ITERS [ENV...]: geoccl-perf in the background, pid in $RUN
start() {
    local name=$1 iters=$2
    shift 2
    env "$@" GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=NET "$PERF" -N 4 -b 16M -e 16M -n "$iters" \
        -w 1 >"$LOG/$name.out" 2>"$LOG/$name.err" &
    RUN=$!
    for _ in $(seq 100); do  # until the ranks are connected
        [ "$(rank_ports "$RUN" | wc -l)" -ge 24 ] && return 0
        sleep 0.1
    done
}

kill_one() {  # a random established connection of run $1, at one end
    local p
    p=$(rank_ports "$1" | shuf -n1)
    [ -n "$p" ] && ss -K "( sport = :${p% *} and dport = :${p#* } )" >/dev/null 2>&1
    return 0
}

check() {  # NAME: passed, resumed, nothing wrong
    local name=$1 rc=$2 n
    n=$(grep -c "resumed .* s after the reset" "$LOG/$name.err")
    if [ "$rc" = 0 ] && grep -q "Wrong values *: 0 OK" "$LOG/$name.out" && [ "$n" -gt 0 ]; then
        pass "$name: $n connections resumed, 0 wrong values; $(grep -h 'connections resumed' "$LOG/$name.out" | head -1 | sed 's/^# //')"
        grep -ho "resumed [0-9.]* s after" "$LOG/$name.err" | awk '{s += $2; if ($2 > m) m = $2} END {printf "  reset to resume: mean %.1f ms, max %.1f ms over %d\n", 1000 * s / NR, 1000 * m, NR}'
    else
        fail "$name: exit $rc, $n resumed; last lines:"
        tail -n 5 "$LOG/$name.out" "$LOG/$name.err" | sed 's/^/    /'
    fi
}

# Is sock_destroy there?
start probe 2000
p=$(rank_ports "$RUN" | head -1)
if [ -z "$p" ] || ! ss -K "( sport = :${p% *} and dport = :${p#* } )" 2>/dev/null | grep -q ESTAB; then
    stop_run "$RUN"
    echo "SKIP: ss -K cannot kill sockets here (no CONFIG_INET_DIAG_DESTROY)"; exit 77
fi
stop_run "$RUN"

start one 60 GEOCCL_ENCRYPT=off
sleep 1; kill_one "$RUN"
timeout 120 tail --pid="$RUN" -f /dev/null; wait "$RUN"; check one $?

start repeated 120 GEOCCL_ENCRYPT=all
for _ in $(seq 16); do sleep 0.5; kill_one "$RUN"; done
timeout 120 tail --pid="$RUN" -f /dev/null; wait "$RUN"; check repeated $?

start rank0 60
sleep 1
kids=$(pgrep -P "$RUN" | head -1)  # rank 0 is forked first
for p in $(ss -tnpH state established | grep "pid=$kids," | awk '{print $3}' | awk -F: '{print $NF}'); do
    ss -K "( sport = :$p )" >/dev/null 2>&1
done
timeout 120 tail --pid="$RUN" -f /dev/null; wait "$RUN"; check rank0 $?

start off 60 GEOCCL_RECONNECT_TIMEOUT=0
sleep 1; kill_one "$RUN"
timeout 60 tail --pid="$RUN" -f /dev/null; wait "$RUN"; rc=$?
if [ "$rc" != 0 ] && grep -q "reset\|closed or reset\|failed while" "$LOG/off.err"; then
    pass "off: GEOCCL_RECONNECT_TIMEOUT=0 makes a reset an error (exit $rc)"
else
    fail "off: exit $rc with GEOCCL_RECONNECT_TIMEOUT=0"
fi
# e. a reset during init, while three ranks wait at the bootstrap root
# The root's port: below the kernel's ephemeral range (where the other
# tests' connections take theirs: a port drawn there was once already
# bound, the root could not listen and ranks 1-3 waited out their 300 s)
# and free now.
ephemeral_lo=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
span=$(( ${ephemeral_lo:-32768} - 20000 ))
[ "$span" -ge 1000 ] || span=10000
for _ in $(seq 50); do
    port=$((20000 + RANDOM % span))
    [ -z "$(ss -tanH "( sport = :$port )" 2>/dev/null)" ] && break
done
for r in 0 1 2; do
    GEOCCL_COMM_ID=127.0.0.1:$port RANK=$r NRANKS=4 GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=INIT \
        "$PERF" -b 1M -e 1M -n 3 -w 1 >"$LOG/init$r.out" 2>"$LOG/init$r.err" &
    pids[$r]=$!
done
for _ in $(seq 100); do  # until all three wait at the root
    [ "$(ss -tnH state established "( sport = :$port )" | wc -l)" -ge 3 ] && break
    sleep 0.1
done
nb=$(ss -tnH state established "( sport = :$port )" | wc -l)
ss -K "( sport = :$port )" >/dev/null 2>&1
sleep 0.3
GEOCCL_COMM_ID=127.0.0.1:$port RANK=3 NRANKS=4 "$PERF" -b 1M -e 1M -n 3 -w 1 \
    >"$LOG/init3.out" 2>"$LOG/init3.err" &
pids[3]=$!
rcs=""
for r in 0 1 2 3; do
    timeout 120 tail --pid="${pids[$r]}" -f /dev/null; wait "${pids[$r]}"; rcs="$rcs $?"
done
again=$(cat "$LOG"/init?.err | grep -c "joined the bootstrap root .* again")
if [ "$rcs" = " 0 0 0 0" ] && [ "$nb" -ge 3 ] && [ "$again" -ge 3 ] &&
    grep -q "Wrong values *: 0 OK" "$LOG/init0.out"; then
    pass "init: $nb bootstrap connections reset while the ranks waited; $again ranks joined again, 0 wrong values"
else
    fail "init: exits$rcs, $nb connections reset, $again joined again; last lines:"
    tail -n 5 "$LOG"/init?.err | sed 's/^/    /'
fi
# f. resets from the start, init included
env GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=INIT,NET "$PERF" -N 4 -b 4M -e 4M -n 20 -w 1 \
    >"$LOG/storm.out" 2>"$LOG/storm.err" &
RUN=$!
kills=0
for _ in $(seq 60); do
    p=$(rank_ports "$RUN" | shuf -n1)
    [ -n "$p" ] && ss -K "( sport = :${p% *} and dport = :${p#* } )" >/dev/null 2>&1 &&
        kills=$((kills + 1))
    sleep 0.03
done
timeout 120 tail --pid="$RUN" -f /dev/null; wait "$RUN"; rc=$?
if [ "$rc" = 0 ] && [ "$kills" -gt 0 ] && grep -q "Wrong values *: 0 OK" "$LOG/storm.out"; then
    pass "storm: $kills resets from the start (init included), 0 wrong values; $(grep -c "again\|resumed" "$LOG/storm.err") rejoins and resumes"
else
    fail "storm: exit $rc after $kills resets; last lines:"
    tail -n 5 "$LOG/storm.out" "$LOG/storm.err" | sed 's/^/    /'
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
