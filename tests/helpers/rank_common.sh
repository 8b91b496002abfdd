# Sourced by the emulated-WAN tests that run tests/helpers/hier_rank.c, one
# process per rank inside its region's namespace (test_hier_wan.sh,
# test_faults.sh), after wan_common.sh.  The sourcing script sets SRC,
# BUILD, WAN, NAME and WORK first.  It builds the rank program (BIN) and
# arms the clean-up: no rank left running, no WAN of ours left up.

RANK_PIDS=()

# Whatever happens from here on: no rank left running, no WAN of ours left up.
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    local p
    for p in "${RANK_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait   # the per-rank wrappers
    "$WAN" down -n "$NAME" -q >/dev/null 2>&1
    # KEEP_LOGS=DIR: the ranks' own output kept there (what they said at INFO)
    [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp -r "$WORK"/. "$KEEP_LOGS"/ 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM


# ---- hier_rank (BIN) --------------------------------------------------------------

LIBDIR=$BUILD/lib/.libs
if [ -n "${HIER_RANK:-}" ]; then
    BIN=$HIER_RANK
    [ -x "$BIN" ] || { echo "HIER_RANK=$BIN is not executable"; exit 1; }
else
    [ -e "$LIBDIR/libgeoccl.so" ] || { echo "no $LIBDIR/libgeoccl.so (build first, or pass the build directory)"; exit 1; }
    BIN=$WORK/hier_rank
    if ! cc -O2 -std=gnu11 -Wall -Wextra -pthread -I "$BUILD/include" -I "$SRC/include" -I "$SRC" \
            "$SRC/tests/helpers/hier_rank.c" "$SRC/tests/helpers/harness.c" \
            -L "$LIBDIR" -lgeoccl -Wl,-rpath,"$LIBDIR" -o "$BIN" > "$WORK/cc.log" 2>&1; then
        cat "$WORK/cc.log"
        echo "cannot build hier_rank"
        exit 1
    fi
fi
echo "== hier_rank: $BIN"

# ---- ranks --------------------------------------------------------------------

# start STEPDIR PORT TIMEOUT "REGION_OF_RANK0 REGION_OF_RANK1 ..." ARGS...
# Starts one hier_rank per rank in its region's namespace. Per rank, in
# STEPDIR: rankR.out (its output), rankR.pid, and rankR.exit ("STATUS TIME",
# written when it ends). Rank 0 must be in region 0 (it listens on r0's
# address).
start() {
    local d=$1 port=$2 timeout=$3 layout=$4 r=0 g k n
    shift 4
    read -r -a REGION_OF <<< "$layout"
    n=${#REGION_OF[@]}
    k=$(tr ' ' '\n' <<< "$layout" | sort -u | grep -c .)
    mkdir -p "$d"
    for g in "${REGION_OF[@]}"; do
        (
            "$WAN" exec -n "$NAME" -i "$g" -- env RANK=$r NRANKS="$n" EXPECT_REGIONS="$k" \
                GEOCCL_COMM_ID=10.231.0.10:"$port" GEOCCL_TIMEOUT="$timeout" \
                "$BIN" "$@" > "$d/rank$r.out" 2>&1 &
            echo $! > "$d/rank$r.pid"
            wait $!
            echo "$? $EPOCHREALTIME" > "$d/rank$r.exit"
        ) 2>/dev/null &   # not bash's "Killed" notes: the steps report kills
        r=$((r + 1))
    done
    NR=$n
    for ((r = 0; r < n; r++)); do
        while [ ! -s "$d/rank$r.pid" ]; do sleep 0.01; done
        RANK_PIDS+=("$(cat "$d/rank$r.pid")")
    done
}

# finish_ranks STEPDIR DEADLINE: waits until every rank has ended or the
# wall clock passes DEADLINE; kills the rest with SIGKILL. Returns how many
# had to be killed.
finish_ranks() {
    local d=$1 deadline=$2 r left killed=0
    while :; do
        left=0
        for ((r = 0; r < NR; r++)); do [ -s "$d/rank$r.exit" ] || left=1; done
        [ "$left" = 0 ] && break
        awk -v a="$(now)" -v b="$deadline" 'BEGIN { exit !(a > b) }' && break
        sleep 0.1
    done
    for ((r = 0; r < NR; r++)); do
        if [ ! -s "$d/rank$r.exit" ]; then
            kill -9 "$(cat "$d/rank$r.pid")" 2>/dev/null
            killed=$((killed + 1))
        fi
    done
    wait   # the wrappers write their .exit and end
    return $killed
}

