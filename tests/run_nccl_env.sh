#!/usr/bin/env bash
#
# A job script that speaks NCCL, run with LD_PRELOAD=libgeoccl.so: no
# GEOCCL_ variable but the secret, only NCCL_COMM_ID, NCCL_SOCKET_IFNAME and
# NCCL_DEBUG.  GeoCCL must read them as its own twins (comm/base/param.c):
#
#   a. three ranks (tests/helpers/nccl_env_rank, each calling
#      ncclGetUniqueId itself) bootstrap over NCCL_COMM_ID=127.0.0.1:PORT,
#      rank 0 listening there; each logs at INFO, says it took lo from
#      NCCL_SOCKET_IFNAME and listens on 127.0.0.1 (lo), and the
#      all-reduce is right;
#   b. NCCL_SOCKET_IFNAME naming no interface: every rank fails at once,
#      saying no usable interface and naming NCCL_SOCKET_IFNAME's value;
#   c. two ranks with NCCL_SOCKET_NTHREADS=2 x NCCL_NSOCKS_PERTHREAD=2,
#      NCCL_IB_DISABLE=1 and NCCL_FOO=1: 4 streams per pair, taken from the
#      twins, NCCL_IB_DISABLE accepted, NCCL_FOO in the one line of those
#      ignored, and the all-reduce right.
#
# Loopback only; takes seconds.  KEEP=1 keeps the ranks' outputs.
set -u
if [ -n "${GEOCCL_SANITIZE:-}" ]; then
    echo "SKIP: built with -fsanitize=$GEOCCL_SANITIZE: LD_PRELOAD of this libgeoccl.so into a"
    echo "      program built without the sanitizer runtime cannot work"
    exit 77
fi
B=${GEOCCL_TEST_BUILDDIR:-$PWD}
lib=$B/lib/.libs/libgeoccl.so
bin=$B/tests/helpers/nccl_env_rank
[ -x "$bin" ] || { echo "FAIL: $bin not built"; exit 1; }
[ -f "$lib" ] || { echo "FAIL: $lib not built"; exit 1; }
# libtool may have built a wrapper script; run the real binary.
if head -c 2 "$bin" | grep -q '#!'; then
    real=$(dirname "$bin")/.libs/$(basename "$bin")
    [ -x "$real" ] && bin=$real
fi
libpath="${NCCL_LIB_DIR:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
WORK=$(mktemp -d /tmp/geoccl-nccl-env.XXXXXX) || exit 1
if [ -z "${KEEP:-}" ]; then
    trap 'rm -rf "$WORK"' EXIT
else
    echo "the ranks' outputs stay in $WORK (KEEP is set)"
fi

# No GEOCCL_ or NCCL_ variable of the caller's reaches the ranks (the
# harness exports GEOCCL_SOCKET_IFNAME=lo).
clean=()
for v in $(compgen -e); do
    case $v in GEOCCL_* | NCCL_*) clean+=(-u "$v") ;; esac
done
SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
PORT=$((20000 + $$ % 4000 * 3)) # below the ephemeral range; three per run

# job NAME NRANKS PORT VAR=VALUE...: runs the ranks with those variables;
# outputs in $WORK/NAME.rR, exit statuses in $WORK/NAME.rcR.
job() {
    local name=$1 n=$2 port=$3 r pids=()
    shift 3
    for ((r = 0; r < n; r++)); do
        (env "${clean[@]}" LD_PRELOAD="$lib" LD_LIBRARY_PATH="$libpath" \
            GEOCCL_COMM_SECRET="$SECRET" NCCL_COMM_ID=127.0.0.1:"$port" "$@" \
            timeout 60 "$bin" "$r" "$n" > "$WORK/$name.r$r" 2>&1
         echo $? > "$WORK/$name.rc$r") &
        pids+=($!)
    done
    wait "${pids[@]}"
}

failed=0
fail() {
    echo "FAIL: $*"
    failed=1
}
show() {
    sed 's/^/      /' "$1" | tail -15
}

echo "a. NCCL_COMM_ID, NCCL_SOCKET_IFNAME=lo, NCCL_DEBUG=INFO, 3 ranks"
job a 3 "$PORT" NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO
for r in 0 1 2; do
    f=$WORK/a.r$r
    if [ "$(cat "$WORK/a.rc$r")" != 0 ] || ! grep -q "rank $r: all-reduce .* correct" "$f"; then
        fail "a: rank $r did not finish with a right all-reduce"
        show "$f"
        continue
    fi
    grep -q '\[geoccl\] INFO ' "$f" || fail "a: rank $r logged nothing at INFO"
    grep -q "GEOCCL_SOCKET_IFNAME set by environment to lo (from NCCL_SOCKET_IFNAME=lo)" "$f" ||
        fail "a: rank $r does not say it took lo from NCCL_SOCKET_IFNAME"
    grep -q "GEOCCL_COMM_ID set by environment to 127.0.0.1:$PORT (from NCCL_COMM_ID=" "$f" ||
        fail "a: rank $r does not say it took NCCL_COMM_ID"
    grep -Eq "joining root 127\.0\.0\.1:$PORT, listening on 127\.0\.0\.1:[0-9]+ \(lo\)" "$f" ||
        { fail "a: rank $r does not listen on 127.0.0.1 (lo)"; grep joining "$f"; }
done
[ "$failed" = 0 ] && echo "   3 ranks: INFO log names lo and 127.0.0.1, all-reduce right"

echo "b. NCCL_SOCKET_IFNAME=nosuch0 (no such interface), 2 ranks"
t0=$(date +%s)
job b 2 $((PORT + 1)) NCCL_SOCKET_IFNAME=nosuch0 NCCL_DEBUG=WARN
t1=$(date +%s)
for r in 0 1; do
    f=$WORK/b.r$r
    [ "$(cat "$WORK/b.rc$r")" = 3 ] || { fail "b: rank $r: exit $(cat "$WORK/b.rc$r"), not an init failure"; show "$f"; }
    grep -q "no usable network interface (NCCL_SOCKET_IFNAME=nosuch0, read as GEOCCL_SOCKET_IFNAME)" "$f" ||
        { fail "b: rank $r's error does not name NCCL_SOCKET_IFNAME=nosuch0"; show "$f"; }
done
[ $((t1 - t0)) -le 20 ] || fail "b: the ranks took $((t1 - t0)) s to fail"
grep -h "no usable" "$WORK/b.r0" | head -1 | sed 's/^/   /'

echo "c. NCCL_SOCKET_NTHREADS=2, NCCL_NSOCKS_PERTHREAD=2, NCCL_IB_DISABLE=1, NCCL_FOO=1, 2 ranks"
job c 2 $((PORT + 2)) NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO NCCL_SOCKET_NTHREADS=2 \
    NCCL_NSOCKS_PERTHREAD=2 NCCL_IB_DISABLE=1 NCCL_FOO=1
for r in 0 1; do
    f=$WORK/c.r$r
    if [ "$(cat "$WORK/c.rc$r")" != 0 ]; then
        fail "c: rank $r failed"
        show "$f"
        continue
    fi
    grep -q "GEOCCL_NSTREAMS set by environment to 4 (from NCCL_SOCKET_NTHREADS=2 x NCCL_NSOCKS_PERTHREAD=2)" "$f" ||
        fail "c: rank $r does not take 4 streams from the NCCL twins"
    grep -Eq "connected to 1 (of 1 )?peers.*, 4 streams each" "$f" || fail "c: rank $r does not use 4 streams"
    grep -q "NCCL_IB_DISABLE=1 accepted" "$f" || fail "c: rank $r does not accept NCCL_IB_DISABLE"
    n=$(grep -c "ignored: .*NCCL_FOO" "$f")
    [ "$n" = 1 ] || fail "c: rank $r lists NCCL_FOO as ignored on $n lines, not 1"
    grep "ignored:" "$f" | grep -q "NCCL_SOCKET_IFNAME\|NCCL_IB_DISABLE" &&
        fail "c: rank $r lists a variable it reads as ignored"
done
grep -h "ignored:" "$WORK/c.r0" | head -1 | sed 's/^.*\[geoccl\] /   /'

if [ "$failed" = 0 ]; then
    echo "PASS: NCCL_* settings are read under LD_PRELOAD"
    exit 0
fi
exit 1
