#!/usr/bin/env bash
#
# Elastic membership without etcd (docs/elastic.md, "Without etcd"): six
# processes of tests/helpers/elastic_rank on loopback, three labelled
# regions (GEOCCL_REGION a, b, c) of two ranks, GEOCCL_COMM_ID with
# GEOCCL_ELASTIC_JOB set, so rank 0's process serves the membership store
# (comm/elastic/store_root.c); 256 KiB float all-reduces, every result
# checked exactly:
#   a. region c's two processes SIGKILLed mid-call: the four others get an
#      error, agree through the store that ranks 4 and 5 are dead, shrink,
#      and all-reduce exactly as 2 x 2;
#   b. two fresh processes with GEOCCL_REGION=c call geocclCommJoin; the
#      members grow and the 3 x 2 communicator all-reduces exactly, with the
#      parent's figures (inherited, no probe);
#   c. region b leaves (SIGUSR1: geocclCommLeave, then geocclCommGrow at
#      the next round boundary): no rank sees an error, the other four go
#      on as 2 x 2;
#   d. a second loss while the survivors re-form: one of region c's two
#      ranks is SIGKILLed and the other dies once the dead set is agreed,
#      before its shrink; the shrink fails on ranks 0 and 1 (after
#      GEOCCL_TIMEOUT), they agree again on the same communicator, now
#      with both gone, and all-reduce exactly as 1 x 2;
#   e. a member lost as the others grow: two joiners in region c wait, and
#      rank 1 dies at the round boundary where the members would admit
#      them; rank 0's geocclCommGrow fails, it agrees that rank 1 is dead,
#      shrinks to 1, and admits the joiners at the next boundary: exact as
#      1 + 2;
#   f. every process still running ends cleanly.
# The emulated-WAN version, with etcd and region 0 lost too, is
# tests/wan/test_elastic.sh.  About 35 seconds.
#
#   bash tests/test_elastic_local.sh [BUILDDIR]
#
set -uo pipefail
export LC_ALL=C
BUILD=${1:-${GEOCCL_TEST_BUILDDIR:-$PWD}}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "no build directory"; exit 1; }
SRC=$(cd "$(dirname "$0")/.." && pwd)
passed=0
failed=0
pass() { passed=$((passed + 1)); echo "PASS: $*"; }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }

WORK=$(mktemp -d /tmp/geoccl-elastic-local.XXXXXX) || exit 1
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

BIN=${ELASTIC_RANK:-}
if [ -z "$BIN" ]; then
    LIBDIR=$BUILD/lib/.libs
    BIN=$WORK/elastic_rank
    cc -O2 -std=gnu11 -Wall -Wextra -pthread -I "$BUILD/include" -I "$SRC/include" \
        "$SRC/tests/helpers/elastic_rank.c" -L "$LIBDIR" -lgeoccl -Wl,-rpath,"$LIBDIR" \
        -o "$BIN" > "$WORK/cc.log" 2>&1 || { cat "$WORK/cc.log"; echo "FAIL: cannot build elastic_rank"; exit 1; }
fi

unset GEOCCL_ELASTIC_ETCD GEOCCL_SOCKET_IFNAME GEOCCL_TOPO_FILE GEOCCL_PROBE
PORT=$((20000 + RANDOM % 8000))
export GEOCCL_COMM_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
# GEOCCL_TIMEOUT: also how long d's shrink waits for the rank that died in it
export GEOCCL_COMM_ID=127.0.0.1:$PORT GEOCCL_ELASTIC_JOB=local-$$ GEOCCL_TIMEOUT=15
export GEOCCL_DEBUG=${GEOCCL_DEBUG:-WARN} ELASTIC_BOUNDARY=4
REGION=(a a b b c c)

# run NAME REGION ARGS...: one process; WORK/NAME.out, .pid, .exit
run() {
    local who=$1 g=$2
    shift 2
    (
        GEOCCL_REGION=$g "$@" > "$WORK/$who.out" 2>&1 &
        echo $! > "$WORK/$who.pid"
        wait $!
        echo "$?" > "$WORK/$who.exit"
    ) 2> /dev/null &
    while [ ! -s "$WORK/$who.pid" ]; do sleep 0.01; done
    PIDS+=("$(cat "$WORK/$who.pid")")
}
lines() { cat "$WORK"/*.out 2>/dev/null | grep -cE "$1"; }
await() { # PATTERN COUNT
    local t0=$SECONDS
    while [ "$(lines "$1")" -lt "$2" ]; do
        [ $((SECONDS - t0)) -gt 60 ] && return 1
        sleep 0.1
    done
}
show() { grep -hv " call " "$WORK"/*.out | tail -n 12 | sed 's/^/   /'; }

for r in 0 1 2 3 4 5; do
    run "rank$r" "${REGION[$r]}" env RANK=$r NRANKS=6 "$BIN" member 262144 "$WORK"
done
await "exact n=6" 6 || { fail "the 3 x 2 communicator did not start"; show; exit 1; }
sleep 1
kill -9 "$(cat "$WORK/rank4.pid")" "$(cat "$WORK/rank5.pid")"
if await "exact n=4" 4 && [ "$(lines "error in call")" = 4 ] &&
   [ "$(grep -ho "dead=[0-9,]*" "$WORK"/rank*.out | sort -u)" = "dead=4,5" ]; then
    pass "a. region c lost: the 4 survivors got an error, agreed ranks 4,5 are dead, shrank, exact"
else
    fail "a. the survivors did not recover"; show
fi
run joiner0 c "$BIN" join 262144 "$WORK"
run joiner1 c "$BIN" join 262144 "$WORK"
if await "exact n=6" 12 && [ "$(lines "joined after .* inherited=1")" = 2 ]; then
    pass "b. two joiners in region c grew it back to 3 x 2, exact, links inherited"
else
    fail "b. the joiners were not admitted"; show
fi
sleep 1
errors=$(lines "error in call")
# Region b is ranks 2 and 3 of the grown communicator: processes rank2, rank3.
kill -USR1 "$(cat "$WORK/rank2.pid")" "$(cat "$WORK/rank3.pid")"
if await "left at" 2 && await "exact n=4" 8 && [ "$(lines "error in call")" = "$errors" ]; then
    pass "c. region b left between rounds, no error seen, the others went on as 2 x 2"
else
    fail "c. the leave did not go cleanly"; show
fi
# The 2 x 2 is rank0 rank1 (region a) and joiner0 joiner1 (region c).
cat "$WORK/joiner0.pid" > "$WORK/die_in_shrink"
kill -9 "$(cat "$WORK/joiner1.pid")"
if await "dies in the shrink" 1 && await "shrink failed" 2 && await "exact n=2" 2 &&
   [ "$(grep -ho "shrunk to 2 at [0-9.]* dead=[0-9,]*" "$WORK"/rank[01].out | sed 's/.*dead=//' | sort -u)" = "2,3" ]; then
    pass "d. a second rank died in the re-form: the survivors' shrink failed, they agreed again (ranks 2,3), exact as 1 x 2"
else
    fail "d. the survivors did not re-form after the second loss"; show
fi
# The 1 x 2 is rank0 rank1 (region a).
cat "$WORK/rank1.pid" > "$WORK/die_in_grow"
run joiner2 c "$BIN" join 262144 "$WORK"
run joiner3 c "$BIN" join 262144 "$WORK"
if await "dies in the grow" 1 && await "grow failed" 1 && await "exact n=3" 3 &&
   [ "$(grep -ho "shrunk to 1 at [0-9.]* dead=[0-9,]*" "$WORK/rank0.out" | sed 's/.*dead=//')" = "1" ]; then
    pass "e. a member died as the others grew: the grow failed, rank 0 agreed rank 1 is dead, shrank, then admitted both joiners, exact as 3"
else
    fail "e. the member's loss in the grow was not recovered"; show
fi
touch "$WORK/stop"
bad=0
for w in rank0 rank2 rank3 joiner2 joiner3; do
    t0=$SECONDS
    while [ ! -s "$WORK/$w.exit" ] && [ $((SECONDS - t0)) -lt 30 ]; do sleep 0.1; done
    [ "$(cat "$WORK/$w.exit" 2>/dev/null)" = 0 ] || { bad=1; echo "   $w: status $(cat "$WORK/$w.exit" 2>/dev/null)"; }
done
if [ "$bad" = 0 ]; then pass "f. every process still running ended cleanly"; else fail "f. not every process ended cleanly"; show; fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
