#!/usr/bin/env bash
#
# Elastic regions (docs/elastic.md): 3 regions x 2 ranks on the emulated WAN
# (tools/geoccl-wan), 100 Mbit/s, 25 ms one way, one etcd member per region
# (started here, in the region's namespace; the ranks list their own region's
# member first), one tests/helpers/elastic_rank per rank looping on 1 MiB
# float all-reduces, every result checked exactly.
#   a. region 2 lost: its two ranks and its etcd member SIGKILLed while the
#      all-reduces run.  Every survivor's call fails with an error (never a
#      wrong value or a hang), geocclCommGetFailedRanks gives every survivor
#      the same dead set (ranks 4 and 5), ncclCommShrink(NCCL_SHRINK_ABORT)
#      makes a 2 x 2 communicator that all-reduces exactly.  Then two new
#      processes in region 2 call geocclCommJoin; the survivors see them
#      waiting (geocclCommJoinersWaiting), call geocclCommGrow between two
#      rounds, and the 3 x 2 communicator all-reduces exactly, its links
#      taken over, not measured (inherited, no bandwidth probe).
#   b. the same with region 0 lost: the region of rank 0, whose process held
#      the first bootstrap root (GEOCCL_COMM_ID), and its etcd member.
#   c. region 1 leaves gracefully (SIGUSR1: geocclCommLeave, then
#      geocclCommGrow at the next round boundary): the other four go on as a
#      2 x 2 communicator and nobody sees an error.
#   d. a region never seen before: a 2 x 2 job labelled r0, r1 grows with
#      two joiners labelled r2; every rank measures only r0-r2 and r1-r2
#      (the counts of geocclCommGetTopology and the INFO line say so), takes
#      r0-r1 as inherited, and the 3 x 2 communicator all-reduces exactly;
#      then the same six start fresh as 3 x 2, for the whole probe's time.
# Printed: the time from the kill to the first exact call of a survivor, from
# the joiners' start to the first exact 3 x 2 call, and rank 0's mean call
# time before the joiners came and while they waited (joining must not slow
# the survivors until the switch-over).
#
#   sudo bash tests/wan/test_elastic.sh [BUILDDIR]
#   CASES="b" KEEP=1 sudo -E bash ...   (some cases; keep the ranks' output)
#
# Needs root, network namespaces, TUN and etcd (Debian's etcd-server,
# installed by config/install-deps.sh); exit 77, skipped, with the reason
# otherwise.  Its WAN is called "gelast".  About 2.5 minutes.
#
set -uo pipefail
export GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
export LC_ALL=C

SRC=$(cd "$(dirname "$0")/../.." && pwd) || exit 1
. "$SRC/tests/helpers/wan_common.sh"
BUILD=${1:-${GEOCCL_TEST_BUILDDIR:-$PWD}}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "no build directory '$BUILD'"; exit 1; }
WAN=$SRC/tools/geoccl-wan
NAME=gelast
WAIT_MAX=${GEOCCL_WAN_WAIT:-600}
RATE=100mbit
DELAY_MS=25
BYTES=${BYTES:-1048576}
LIMIT=${LIMIT:-90}    # seconds any one step may take
BOUNDARY=${BOUNDARY:-16} # all-reduces per round: members look for joiners and
                         # leavers between rounds, as a trainer would

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces); run: sudo bash $0"
[ -x "$WAN" ] || { echo "no $WAN"; exit 1; }
command -v etcd > /dev/null ||
    skip "etcd is not installed (Debian: etcd-server, which config/install-deps.sh installs)"
command -v curl > /dev/null || skip "needs curl (to see that etcd is up)"
wan_lock

. "$SRC/tests/helpers/etcd_cluster.sh"   # elastic_scratch, endpoints, etcd_up, etcd_down
elastic_scratch geoccl-elastic

LIBDIR=$BUILD/lib/.libs
if [ -n "${ELASTIC_RANK:-}" ]; then
    BIN=$ELASTIC_RANK
    [ -x "$BIN" ] || { echo "ELASTIC_RANK=$BIN is not executable"; exit 1; }
else
    [ -e "$LIBDIR/libgeoccl.so" ] || { echo "no $LIBDIR/libgeoccl.so (build first)"; exit 1; }
    BIN=$WORK/elastic_rank
    cc -O2 -std=gnu11 -Wall -Wextra -pthread -I "$BUILD/include" -I "$SRC/include" \
        "$SRC/tests/helpers/elastic_rank.c" -L "$LIBDIR" -lgeoccl -Wl,-rpath,"$LIBDIR" \
        -o "$BIN" > "$WORK/cc.log" 2>&1 || { cat "$WORK/cc.log"; echo "cannot build elastic_rank"; exit 1; }
fi

addr() { echo "10.231.0.$((10 + $1))"; }
TOKEN=geoccl

# member D CASE RANK REGION PORT / joiner D CASE NAME REGION: one process in
# its region; D/NAME.out, D/NAME.pid, D/NAME.exit ("STATUS TIME").
run_in() {
    local d=$1 who=$2 g=$3
    shift 3
    (
        "$WAN" exec -n "$NAME" -i "$g" -- env GEOCCL_ELASTIC_ETCD="$(endpoints "$g")" \
            GEOCCL_ELASTIC_JOB="$JOB" GEOCCL_TIMEOUT=60 ELASTIC_BOUNDARY="$BOUNDARY" "$@" > "$d/$who.out" 2>&1 &
        echo $! > "$d/$who.pid"
        wait $!
        echo "$? $EPOCHREALTIME" > "$d/$who.exit"
    ) 2> /dev/null &
    while [ ! -s "$d/$who.pid" ]; do sleep 0.01; done
    PIDS+=("$(cat "$d/$who.pid")")
}
members() {
    local d=$1 port=$2 r
    for r in 0 1 2 3 4 5; do
        run_in "$d" "rank$r" $((r / 2)) RANK=$r NRANKS=6 GEOCCL_COMM_ID="$(addr 0):$port" \
            "$BIN" member "$BYTES" "$d"
    done
}

# lines D PATTERN: how many lines of D/*.out match (extended regex).
lines() { cat "$1"/*.out 2>/dev/null | grep -cE "$2"; }
# await D PATTERN COUNT: until that many lines match, within LIMIT s.
await() {
    local t0=$SECONDS
    while [ "$(lines "$1" "$2")" -lt "$3" ]; do
        [ $((SECONDS - t0)) -gt "$LIMIT" ] && return 1
        sleep 0.1
    done
}
# stamps D PATTERN AFTER: the T of "... at T" in matching lines later than AFTER.
stamps() { cat "$1"/*.out | grep -E "$2" | sed -E 's/.* at ([0-9.]+).*/\1/' |
              awk -v a="$3" '$1 > a'; }
# stop_all D WHO...: the ranks end after the same round; each must exit 0.
stop_all() {
    local d=$1 w st bad=0 t0=$SECONDS
    shift
    touch "$d/stop"
    for w in "$@"; do
        while [ ! -s "$d/$w.exit" ] && [ $((SECONDS - t0)) -lt "$LIMIT" ]; do sleep 0.1; done
        read -r st _ < "$d/$w.exit" 2>/dev/null || st=timeout
        if [ "$st" != 0 ] || ! grep -q "done calls" "$d/$w.out"; then
            bad=$((bad + 1))
            echo "   $w ended with status $st:"
            grep -v ' INFO ' "$d/$w.out" | tail -n 4 | sed 's/^/      /'
        fi
    done
    return $bad
}
# round_means D AFTER: rank 0's mean round time without and with joiners
# waiting, from its round lines at n=4 (seconds).
round_means() {
    cat "$1"/*.out | awk '/call [0-9]+ n=4 / { split($6, s, "="); split($7, j, "=");
        if (j[2] > 0) { w += s[2]; nw++ } else { o += s[2]; no++ } }
        END { printf "%.3f s over %d calls before, %.3f s over %d while joiners waited",
              no ? o / no : 0, no, nw ? w / nw : 0, nw }'
}

# lose CASE REGION PORT: the region's ranks and etcd member die mid-call;
# the survivors shrink; two joiners restart the region.
lose() {
    local c=$1 g=$2 port=$3 d=$WORK/$1 r tk tj first last bad=0 dead
    local victims=("rank$((2 * g))" "rank$((2 * g + 1))") survivors=()
    for r in 0 1 2 3 4 5; do [ $((r / 2)) = "$g" ] || survivors+=("rank$r"); done
    mkdir -p "$d"
    JOB=elastic-$c-$$
    echo "== $c. region $g lost (ranks $((2 * g)), $((2 * g + 1)) and its etcd member), then restarted"
    etcd_up "$c"
    members "$d" "$port"
    if ! await "$d" "exact n=6" 6; then
        fail "$c. the 3 x 2 communicator did not start"; grep -hv ' INFO ' "$d"/*.out | tail -n 8
        etcd_down; return
    fi
    sleep 2   # a few rounds, then the kill lands inside one of them
    tk=$(now)
    kill -9 "$(cat "$d/${victims[0]}.pid")" "$(cat "$d/${victims[1]}.pid")" "${ETCD_PID[$g]}"
    if ! await "$d" "exact n=4" 4; then
        fail "$c. the survivors did not all-reduce again within $LIMIT s"
        grep -hv ' INFO ' "$d"/rank*.out | tail -n 12 | sed 's/^/   /'
        etcd_down; return
    fi
    first=$(stamps "$d" "exact n=4" "$tk" | sort -n | head -1)
    last=$(stamps "$d" "exact n=4" "$tk" | sort -n | tail -1)
    for w in "${survivors[@]}"; do
        grep -q "error in call" "$d/$w.out" || { bad=1; echo "   $w saw no error"; }
    done
    dead=$(grep -ho "dead=[0-9,]*" "$d"/rank*.out | sort -u | tr '\n' ' ')
    if [ "$bad" = 0 ] && [ "$dead" = "dead=$((2 * g)),$((2 * g + 1)) " ]; then
        pass "$c. every survivor's call failed with an error, all named ranks $((2 * g)),$((2 * g + 1)) dead, and the 2 x 2 communicator all-reduced exactly: $(since "$tk" "$first") s from the kill to the first exact call ($(since "$tk" "$last") s to the last survivor's)"
    else
        fail "$c. survivors without an error or disagreeing on the dead: $dead"
    fi
    KILL_TIMES+=("$c: $(since "$tk" "$first") s (last survivor $(since "$tk" "$last") s)")
    sleep 2   # some rounds at 2 x 2 before the joiners come
    tj=$(now)
    run_in "$d" joiner0 "$g" "$BIN" join "$BYTES" "$d"
    run_in "$d" joiner1 "$g" "$BIN" join "$BYTES" "$d"
    if ! await "$d" "exact n=6 at" 12; then
        fail "$c. the joiners and survivors did not all-reduce as 3 x 2 within $LIMIT s"
        grep -hv ' INFO ' "$d"/*.out | grep -v " call " | tail -n 12 | sed 's/^/   /'
        stop_all "$d" "${survivors[@]}" joiner0 joiner1 > /dev/null
        etcd_down; return
    fi
    first=$(stamps "$d" "exact n=6" "$tj" | sort -n | head -1)
    last=$(stamps "$d" "exact n=6" "$tj" | sort -n | tail -1)
    local inh
    inh=$(grep -ho "joined after .*" "$d"/joiner*.out | head -2 | tr '\n' ';')
    if grep -q "inherited=1 bw_measured=0" "$d/joiner0.out" &&
       grep -q "inherited=1 bw_measured=0" "$d/joiner1.out"; then
        pass "$c. two joiners in region $g grew the survivors back to 3 x 2, exact: $(since "$tj" "$first") s from the joiners' start to the first exact 3 x 2 call ($(since "$tj" "$last") s to the last rank's); links taken over, not measured ($inh)"
    else
        fail "$c. the joiners measured links that were known: $inh"
    fi
    JOIN_TIMES+=("$c: $(since "$tj" "$first") s (last rank $(since "$tj" "$last") s)")
    echo "   rank 0's call time: $(round_means "$d")"
    if stop_all "$d" "${survivors[@]}" joiner0 joiner1; then
        pass "$c. all 6 ended after the same round, every result exact"
    else
        fail "$c. not every rank ended cleanly"
    fi
    etcd_down
}

# leave CASE REGION PORT: the region leaves between rounds.
leave() {
    local c=$1 g=$2 port=$3 d=$WORK/$1 r stay=() tl
    mkdir -p "$d"
    JOB=elastic-$c-$$
    echo "== $c. region $g leaves gracefully"
    etcd_up "$c"
    members "$d" "$port"
    if ! await "$d" "exact n=6" 6; then
        fail "$c. the 3 x 2 communicator did not start"; etcd_down; return
    fi
    sleep 2
    tl=$(now)
    kill -USR1 "$(cat "$d/rank$((2 * g)).pid")" "$(cat "$d/rank$((2 * g + 1)).pid")"
    for r in 0 1 2 3 4 5; do [ $((r / 2)) = "$g" ] || stay+=("rank$r"); done
    if await "$d" "left at" 2 && await "$d" "exact n=4" 4 &&
       [ "$(lines "$d" "error in call")" = 0 ]; then
        pass "$c. region $g left and the others went on as 2 x 2 with no error seen, $(since "$tl" "$(stamps "$d" "exact n=4" "$tl" | sort -n | tail -1)") s after the request"
    else
        fail "$c. the leave did not go cleanly"
        grep -hv ' INFO ' "$d"/*.out | grep -v " call " | tail -n 12 | sed 's/^/   /'
    fi
    if stop_all "$d" "${stay[@]}" "rank$((2 * g))" "rank$((2 * g + 1))"; then
        pass "$c. all 6 ended cleanly (the two that left, too)"
    else
        fail "$c. not every rank ended cleanly"
    fi
    etcd_down
}

# fresh CASE PORT: a 2 x 2 job of labelled regions r0 and r1 (namespaces 0
# and 1); two joiners labelled r2 in namespace 2, a region never seen.  Every
# rank of the grown communicator measures only r0-r2 and r1-r2 and takes
# r0-r1 as inherited (geocclCommGetTopology's counts and the INFO line), and
# all-reduces exactly.  Then the same six fresh as 3 x 2: the whole probe.
fresh() {
    local c=$1 port=$2 d=$WORK/$1 r tj full0 part full
    local topo=(GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=TOPO ELASTIC_TOPO=1)
    mkdir -p "$d" "$d/full"
    JOB=elastic-$c-$$
    echo "== $c. a region never seen before joins a 2 x 2 job"
    etcd_up "$c"
    for r in 0 1 2 3; do
        run_in "$d" "rank$r" $((r / 2)) RANK=$r NRANKS=4 GEOCCL_REGION=r$((r / 2)) "${topo[@]}" \
            GEOCCL_COMM_ID="$(addr 0):$port" "$BIN" member "$BYTES" "$d"
    done
    if ! await "$d" "exact n=4" 4; then
        fail "$c. the 2 x 2 communicator did not start"; etcd_down; return
    fi
    sleep 1
    tj=$(now)
    run_in "$d" joiner0 2 GEOCCL_REGION=r2 "${topo[@]}" "$BIN" join "$BYTES" "$d"
    run_in "$d" joiner1 2 GEOCCL_REGION=r2 "${topo[@]}" "$BIN" join "$BYTES" "$d"
    full0=$(grep -ho "ready n=4 .* probe=[0-9.]*" "$d"/rank*.out | sed 's/.*probe=//' | sort -n | tail -1)
    if await "$d" "exact n=6 at" 6 &&
       [ "$(lines "$d" "(grown to|joined after) .* bw_measured=1 pairs_measured=2 pairs_inherited=1")" = 6 ] &&
       [ "$(lines "$d" "2 pairs of regions measured \(r0-r2 r1-r2\), 1 inherited \(r0-r1\)")" = 6 ]; then
        part=$(grep -hoE "(grown to|joined after) .* probe=[0-9.]*" "$d"/*.out | sed 's/.*probe=//' | sort -n | tail -1)
        pass "$c. region r2, never seen, joined the 2 x 2 job: every rank measured r0-r2 and r1-r2 only, took r0-r1 as inherited, exact as 3 x 2 $(since "$tj" "$(stamps "$d" "exact n=6" "$tj" | sort -n | tail -1)") s after the joiners started"
    else
        fail "$c. the new region's pairs were not measured alone"
        grep -h "pairs\|probe:" "$d"/*.out | grep -v " call " | tail -n 12 | sed 's/^/   /'
    fi
    stop_all "$d" rank0 rank1 rank2 rank3 joiner0 joiner1 || fail "$c. not every rank ended cleanly"
    JOB=elastic-$c-full-$$
    touch "$d/full/stop"
    for r in 0 1 2 3 4 5; do
        run_in "$d/full" "rank$r" $((r / 2)) RANK=$r NRANKS=6 GEOCCL_REGION=r$((r / 2)) "${topo[@]}" \
            GEOCCL_COMM_ID="$(addr 0):$((port + 10))" "$BIN" member "$BYTES" "$d/full"
    done
    if await "$d/full" "exact n=6" 6 && stop_all "$d/full" rank0 rank1 rank2 rank3 rank4 rank5 &&
       [ "$(lines "$d/full" "ready n=6 .* bw_measured=1 pairs_measured=3")" = 6 ]; then
        full=$(grep -ho "ready n=6 .* probe=[0-9.]*" "$d/full"/rank*.out | sed 's/.*probe=//' | sort -n | tail -1)
        pass "$c. probe time (slowest rank): the grow with r2 ${part:-?} s (2 pairs measured), the same six fresh as 3 x 2 ${full:-?} s (3 pairs), the 2 x 2 job ${full0:-?} s (1 pair)"
    else
        fail "$c. the fresh 3 x 2 communicator did not measure its 3 pairs"
    fi
    etcd_down
}

echo "== 3 regions x 2 ranks, $RATE each, $DELAY_MS ms one way; $BYTES-byte all-reduces"
wan_up -r 3 --rate "$RATE" --delay "${DELAY_MS}ms"
KILL_TIMES=()
JOIN_TIMES=()
for c in ${CASES:-a b c d}; do
    case $c in
        a) lose a 2 29571 ;;
        b) lose b 0 29572 ;;
        c) leave c 1 29573 ;;
        d) fresh d 29574 ;;
    esac
done
echo "== kill -> first exact survivor call: ${KILL_TIMES[*]:-none}"
echo "== joiners' start -> first exact 3 x 2 call: ${JOIN_TIMES[*]:-none}"
finish
