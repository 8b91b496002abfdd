#!/usr/bin/env bash
#
# The same-host fast path (GEOCCL_SHM) needs proof that a rank can open the
# other's socket file (comm/transport/net_local.h, rule 3); sharing the kernel and the
# network namespace is not enough. Two ranks of one host and one network
# namespace, each its own process (env bootstrap on 127.0.0.1):
#
#   a. both in this mount namespace: the pair uses the fast path (both log
#      "same-host fast path to 1 of them") and the all-reduce is right;
#   b. rank 1 in its own mount namespace with a private /dev/shm (two
#      containers sharing the host's network look like this): neither can
#      open the other's socket, rank 1 (the connector) says so and falls
#      back to TCP at once, both log "to 0 of them", the all-reduce is
#      right, and it does not wait for any timeout.
#
# Needs root and unshare -m (exit 77, skipped, otherwise). Takes seconds.
set -u
B=${GEOCCL_TEST_BUILDDIR:-$PWD}
PERF=$B/geoccl-perf
SKIP=77
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (unshare -m)"; exit $SKIP; }
command -v unshare > /dev/null || { echo "SKIP: no unshare"; exit $SKIP; }
unshare -m true 2> /dev/null || { echo "SKIP: unshare -m is not permitted here"; exit $SKIP; }
[ -x "$PERF" ] || { echo "no $PERF (build first)"; exit 1; }
WORK=$(mktemp -d /tmp/geoccl-shm-fallback.XXXXXX) || exit 1
trap 'rm -rf "$WORK"' EXIT
failed=0
PORT=$((20000 + $$ % 8000 * 2)) # below the ephemeral range; two per run
SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')

# pair NAME PORT PRIVATE: runs the two ranks; PRIVATE=1 puts rank 1 behind
# a private /dev/shm. Outputs in $WORK/NAME.r0 and NAME.r1.
pair() {
    local name=$1 port=$2 private=$3 p0 rc0 rc1
    local envs=(GEOCCL_COMM_ID=127.0.0.1:"$port" GEOCCL_COMM_SECRET="$SECRET" NRANKS=2
                GEOCCL_SOCKET_IFNAME=lo
                GEOCCL_SHM=1 GEOCCL_TIMEOUT=20 GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=NET)
    local args=(-b 4M -e 4M -n 3 -w 1 -d float -o sum -c 1)
    env "${envs[@]}" RANK=0 timeout 60 "$PERF" "${args[@]}" > "$WORK/$name.r0" 2>&1 &
    p0=$!
    if [ "$private" = 1 ]; then
        timeout 60 unshare -m --propagation private sh -c \
            'mount -t tmpfs -o mode=1777 geoccl-test /dev/shm && exec "$@"' sh \
            env "${envs[@]}" RANK=1 "$PERF" "${args[@]}" > "$WORK/$name.r1" 2>&1
    else
        env "${envs[@]}" RANK=1 timeout 60 "$PERF" "${args[@]}" > "$WORK/$name.r1" 2>&1
    fi
    rc1=$?
    wait "$p0"
    rc0=$?
    echo "   $name: exit status rank 0 $rc0, rank 1 $rc1"
    [ "$rc0" = 0 ] && [ "$rc1" = 0 ]
}

# expect NAME N: both ranks logged "same-host fast path to N of them" and
# rank 0's table has no wrong element.
expect() {
    local name=$1 n=$2 r ok=1
    for r in 0 1; do
        if ! grep -q "same-host fast path to $n of them" "$WORK/$name.r$r"; then
            echo "   rank $r: not 'fast path to $n of them':"
            grep "connected to" "$WORK/$name.r$r" | sed 's/^/      /'
            ok=0
        fi
    done
    if ! grep -q '^# Wrong values *: 0 OK' "$WORK/$name.r0" ||
        ! grep -q '^# Out of bounds values *: 0 OK' "$WORK/$name.r0"; then
        echo "   rank 0's results:"
        grep -v INFO "$WORK/$name.r0" | sed 's/^/      /' | tail -8
        ok=0
    fi
    [ "$ok" = 1 ]
}

t0=$(date +%s)
if pair a "$PORT" 0 && expect a 1; then
    echo "PASS: a. same mount namespace: the fast path"
else
    echo "FAIL: a. same mount namespace"
    failed=$((failed + 1))
fi
t1=$(date +%s)
if pair b $((PORT + 1)) 1 && expect b 0 &&
    grep -q "its same-host socket cannot be opened from here" "$WORK/b.r1"; then
    echo "PASS: b. private /dev/shm: TCP after a failed open, in $((t1 - t0)) s + $(($(date +%s) - t1)) s"
else
    echo "FAIL: b. private /dev/shm"
    grep -h "same-host\|WARN" "$WORK/b.r0" "$WORK/b.r1" | sed 's/^/      /' | head -10
    failed=$((failed + 1))
fi
[ "$failed" = 0 ]
