#!/usr/bin/env bash
#
# What crosses the WAN between regions, seen from outside. Two regions of an
# emulated WAN (tools/geoccl-wan: 1 Gbit/s, 5 ms), one rank in each
# (tests/helpers/wan_mark: rank 0 in r0 sends 8 MiB filled with a 16-byte ASCII
# pattern to rank 1 in r1, which checks every byte; env bootstrap with
# GEOCCL_COMM_ID and a GEOCCL_COMM_SECRET). Four checks, each reported by
# name:
#
#   a. plaintext-hidden: with the defaults, tcpdump on the bridge that
#      carries all traffic between regions (-w, whole packets) sees the
#      transfer (at least 8 MiB of TCP payload from r0 to r1, both ranks
#      exit 0) and not one copy of the pattern.
#   b. plaintext-control: the same with GEOCCL_ENCRYPT=off; the capture
#      must hold the pattern (so a's search can find it).
#   c. tamper-detected: on a WAN brought up with --tamper EVERY (one payload
#      byte changed in every EVERY-th TCP packet with payload, checksums kept
#      valid, so TCP delivers the change), with the defaults: rank 1 exits 4
#      (a call failed), never 3 (wrong bytes delivered), and the library's
#      error text (ncclGetLastError) names its peer, rank 0 or 10.231.0.10;
#      rank 0 exits 0 or 4; r0's delay line tampered with at least one packet.
#   d. tamper-cleartext: the same with GEOCCL_ENCRYPT=off: no integrity is
#      asked for, so rank 1 may exit 3; it may also exit 4 (a frame header
#      was hit), but the ranks must not hang, and it must not exit 0 (then
#      the tampering never reached the receiver and c proves nothing).
#
# The topology probe and the WAN warm-up are off (GEOCCL_PROBE=0,
# GEOCCL_WAN_WARMUP=0; exec labels the regions): what crosses is the
# bootstrap, the connection handshakes and the transfer. Before the
# transfer r0 sends 6 TCP packets with payload, and r1 sends 4 in all
# (measured with a 16-byte transfer), so with EVERY = 16 on a WAN brought
# up fresh for each of c and d (the delay lines' count starts at 0) the
# tampering lands in the transfer, not in the handshakes.
# Every rank runs under GEOCCL_TIMEOUT=15 and timeout(1).
#
#   sudo bash tests/wan/run_wan_security.sh [BUILDDIR]
#
# BUILDDIR (or $GEOCCL_TEST_BUILDDIR, else the current directory) holds the
# built library and geoccl-info; wan_mark is $WAN_MARK when set, else
# BUILDDIR/tests/helpers/wan_mark, else it is built here with cc.
#
# Exit status: 0 when every check passed, 1 otherwise, 77 (skipped) when the machine cannot
# emulate a WAN (geoccl-wan exits 77), tcpdump is missing, or another WAN
# stays up for $GEOCCL_WAN_WAIT seconds (default 600; only one can be up).
# Its own WAN is "gsec", always taken down on the way out. Takes about 5 s
# (3 WANs brought up, 4 transfers), plus any wait for another WAN.
#
set -uo pipefail
export LC_ALL=C

SRC=$(cd "$(dirname "$0")/../.." && pwd) || exit 1
. "$SRC/tests/helpers/wan_common.sh"
BUILD=${1:-${GEOCCL_TEST_BUILDDIR:-$PWD}}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "no build directory '$BUILD'"; exit 1; }
WAN=$SRC/tools/geoccl-wan
NAME=gsec
WAIT_MAX=${GEOCCL_WAN_WAIT:-600}
EVERY=16                 # --tamper
BYTES=$((8 << 20))       # wan_mark's default
RANK_TIMEOUT=15          # GEOCCL_TIMEOUT
RANK_LIMIT=45            # seconds before timeout(1) stops a rank
R0=10.231.0.10 R1=10.231.0.11

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, tcpdump); run: sudo bash $0"
command -v tcpdump >/dev/null 2>&1 || skip "no tcpdump (apt-get install tcpdump)"
[ -x "$WAN" ] || { echo "no $WAN"; exit 1; }
wan_lock

# The settings under test come from here, not from the caller's shell (make
# check exports GEOCCL_SOCKET_IFNAME=lo, for one).
for v in $(compgen -e | grep '^GEOCCL_'); do
    case $v in
        GEOCCL_DELAYLINE|GEOCCL_TEST_*|GEOCCL_WAN_WAIT|GEOCCL_SANITIZE|GEOCCL_DEBUG*) ;;
        *) unset "$v" ;;
    esac
done
export GEOCCL_PROBE=0 GEOCCL_WAN_WARMUP=0

WORK=$(mktemp -d /tmp/geoccl-wan-security.XXXXXX) || exit 1
TCPDUMP_PID=
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    [ -n "$TCPDUMP_PID" ] && kill "$TCPDUMP_PID" 2>/dev/null
    "$WAN" down -n "$NAME" -q >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM
T0=$EPOCHREALTIME

# ---- wan_mark, and whether the library knows GEOCCL_ENCRYPT ------------------

LIBDIR=$BUILD/lib/.libs
if [ -n "${WAN_MARK:-}" ]; then
    BIN=$WAN_MARK
elif [ -x "$BUILD/tests/helpers/wan_mark" ]; then
    BIN=$BUILD/tests/helpers/wan_mark
else
    [ -e "$LIBDIR/libgeoccl.so" ] || { echo "no $LIBDIR/libgeoccl.so (build first, or pass the build directory)"; exit 1; }
    BIN=$WORK/wan_mark
    cc -O2 -std=gnu11 -Wall -Wextra -pthread -I "$SRC/include" "$SRC/tests/helpers/wan_mark.c" \
        -L "$LIBDIR" -lgeoccl -Wl,-rpath,"$LIBDIR" -o "$BIN" > "$WORK/cc.log" 2>&1 ||
        { cat "$WORK/cc.log"; echo "cannot build wan_mark"; exit 1; }
fi
[ -x "$BIN" ] || { echo "wan_mark $BIN is not executable"; exit 1; }
PATTERN=$("$BIN" --pattern) && [ ${#PATTERN} = 16 ] || { echo "$BIN --pattern failed"; exit 1; }
echo "== wan_mark: $BIN (pattern \"$PATTERN\", $BYTES bytes)"

# ---- helpers ------------------------------------------------------------------

SECRET=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
PORT=$((29800 + $$ % 100 * 2))

# pair DIR [VAR=VALUE...]: runs rank 0 in r0 and rank 1 in r1 with the
# settings given; their output in DIR/rankR.out, exit status in DIR/rankR.rc
# (124 or 137: stopped by timeout, i.e. hung).
pair() {
    local d=$1 r pids=()
    shift
    mkdir -p "$d"
    PORT=$((PORT + 1))
    for r in 0 1; do
        (
            "$WAN" exec -n "$NAME" -i "$r" -- env RANK=$r NRANKS=2 GEOCCL_COMM_ID=$R0:$PORT \
                GEOCCL_COMM_SECRET="$SECRET" GEOCCL_TIMEOUT=$RANK_TIMEOUT "$@" \
                timeout -k 5 $RANK_LIMIT "$BIN" > "$d/rank$r.out" 2>&1
            echo $? > "$d/rank$r.rc"
        ) &
        pids+=($!)
    done
    wait "${pids[@]}"   # not tcpdump, which runs in the background too
    for r in 0 1; do
        echo "   rank $r: exit $(cat "$d/rank$r.rc"): $(grep -h "^wan_mark rank $r:" "$d/rank$r.out" | sed "s/^wan_mark rank $r: //" | paste -sd'|' - | sed 's/|/ | /g')"
    done
}

# capture_start FILE / capture_stop: tcpdump on the bridge, whole packets.
capture_start() {
    CAP=$1
    # --immediate-mode: every packet is handed over at once, not in blocks
    # that a stop (SIGINT) would leave behind (a capture then lacked the
    # last 150 KB of the transfer, with "0 packets dropped").
    tcpdump -i "$NAME-br" -nn -s 0 -B 16384 -U --immediate-mode -w "$CAP" 2> "$CAP.err" &
    TCPDUMP_PID=$!
    local t
    for ((t = 0; t < 100; t++)); do
        grep -q 'listening on' "$CAP.err" 2>/dev/null && return 0
        kill -0 "$TCPDUMP_PID" 2>/dev/null || break
        sleep 0.05
    done
    cat "$CAP.err"
    echo "tcpdump did not start on $NAME-br"
    exit 1
}
capture_stop() {
    sleep 0.5   # the last ACKs
    kill -INT "$TCPDUMP_PID" 2>/dev/null
    wait "$TCPDUMP_PID" 2>/dev/null
    TCPDUMP_PID=
    echo "   capture: $(grep -h 'captured\|dropped by kernel' "$CAP.err" | paste -sd, - | sed 's/,/, /g')"
}
# Bytes of TCP payload from r0 to r1 in capture $1 (tcpdump's "length").
payload_r0_r1() {
    tcpdump -nn -r "$1" "tcp and src host $R0 and dst host $R1" 2>/dev/null |
        awk '{ for (i = 1; i < NF; i++) if ($i == "length") { s += $(i + 1) } } END { printf "%d\n", s }'
}
copies() { grep -a -o -F -- "$PATTERN" "$1" | wc -l; }

# Tampered and seen counts of region I's delay line: "T P".
tampered() {
    local i=$1 log=/run/geoccl-wan/$NAME/dl$1.log n t
    n=$(wc -l < "$log")
    kill -USR1 "$(cat "/run/geoccl-wan/$NAME/dl$i.pid")" 2>/dev/null
    for ((t = 0; t < 50; t++)); do
        [ "$(wc -l < "$log")" -gt "$n" ] && break
        sleep 0.05
    done
    n=$(tail -1 "$log" | sed -n 's/.*; tampered \([0-9]*\) of \([0-9]*\) .*/\1 \2/p')
    echo "${n:-0 0}"
}

wrong_bytes() { sed -n 's/.*: \([0-9]*\) WRONG .*/\1/p' "$1/rank1.out" | head -1; }
hung() { [ "$1" = 124 ] || [ "$1" = 137 ]; }

# plaintext NAME DIR [VAR=VALUE...]: one capture of one transfer.
plaintext() {
    local name=$1 d=$2
    shift 2
    echo "== $name${*:+ ($*)}"
    mkdir -p "$d"
    capture_start "$d/cap.pcap"
    pair "$d" "$@"
    capture_stop
    local rc0 rc1 pb n
    rc0=$(cat "$d/rank0.rc") rc1=$(cat "$d/rank1.rc")
    pb=$(payload_r0_r1 "$d/cap.pcap")
    n=$(copies "$d/cap.pcap")
    echo "   $pb bytes of TCP payload r0 -> r1 captured; $n copies of \"$PATTERN\" in the capture"
    if [ "$rc0" != 0 ] || [ "$rc1" != 0 ]; then
        fail "$name: the transfer did not succeed (exit $rc0, $rc1), so the capture says nothing"
        return 1
    fi
    if [ "$pb" -lt "$BYTES" ]; then
        fail "$name: the capture holds $pb bytes from r0 to r1, less than the $BYTES sent: it missed the transfer"
        return 1
    fi
    N_COPIES=$n
    return 0
}

# ---- a, b: what a capture between the regions shows -------------------------

wan_up -r 2 --rate 1gbit --delay 5ms
if plaintext plaintext-hidden "$WORK/a"; then
    if [ "$N_COPIES" = 0 ]; then
        pass "plaintext-hidden: the transfer crossed, the pattern did not"
    else
        fail "plaintext-hidden: plaintext found: $N_COPIES copies of \"$PATTERN\" crossed the WAN"
    fi
fi
if plaintext plaintext-control "$WORK/b" GEOCCL_ENCRYPT=off; then
    if [ "$N_COPIES" -gt 0 ]; then
        pass "plaintext-control: $N_COPIES copies of the pattern in the capture with GEOCCL_ENCRYPT=off"
    else
        fail "plaintext-control: no copy of the pattern with GEOCCL_ENCRYPT=off: the search cannot find plaintext, so plaintext-hidden proves nothing"
    fi
fi
"$WAN" down -n "$NAME" -q >/dev/null 2>&1

# ---- c, d: a man in the middle ----------------------------------------------

# tamper NAME DIR [VAR=VALUE...]: one transfer on a fresh WAN with --tamper;
# sets RC0, RC1, TAMPERED (by r0's delay line) and LASTERR (rank 1's
# ncclGetLastError).
tamper() {
    local name=$1 d=$2 t0 t1
    shift 2
    echo "== $name (--tamper $EVERY${*:+, $*})"
    "$WAN" down -n "$NAME" -q >/dev/null 2>&1
    wan_up -r 2 --rate 1gbit --delay 5ms --tamper "$EVERY"
    pair "$d" "$@"
    t0=$(tampered 0) t1=$(tampered 1)
    RC0=$(cat "$d/rank0.rc") RC1=$(cat "$d/rank1.rc")
    TAMPERED=${t0% *}
    LASTERR=$(sed -n 's/^wan_mark rank 1: last error: //p' "$d/rank1.out" | head -1)
    echo "   tampered with, of the TCP packets with payload: by r0's delay line ${t0% *} of ${t0#* }, by r1's ${t1% *} of ${t1#* }"
}

tamper tamper-detected "$WORK/c"
if hung "$RC0" || hung "$RC1"; then
    fail "tamper-detected: a rank hung (exit $RC0, $RC1: stopped by timeout)"
elif [ "$TAMPERED" -lt 1 ]; then
    fail "tamper-detected: the delay line tampered with nothing (the test's fault)"
elif [ "$RC1" = 3 ]; then
    fail "tamper-detected: rank 1 got wrong bytes and no error: $(wrong_bytes "$WORK/c") bytes changed by $TAMPERED tampered packets went unnoticed"
elif [ "$RC1" = 0 ]; then
    fail "tamper-detected: silent success: $TAMPERED packets were tampered with, yet rank 1 reported every byte right and no error"
elif [ "$RC1" != 4 ]; then
    fail "tamper-detected: rank 1 exited $RC1 (want 4: a call failed)"
elif ! grep -q -e 'rank 0' -e "${R0//./\\.}" <<< "$LASTERR"; then
    fail "tamper-detected: rank 1 failed, but its error does not name its peer (rank 0, $R0): $LASTERR"
elif [ "$RC0" != 0 ] && [ "$RC0" != 4 ]; then
    fail "tamper-detected: rank 0 exited $RC0 (want 0 or 4)"
else
    pass "tamper-detected: rank 1 failed (exit 4) naming its peer: $LASTERR"
fi

tamper tamper-cleartext "$WORK/d" GEOCCL_ENCRYPT=off
if hung "$RC0" || hung "$RC1"; then
    fail "tamper-cleartext: a rank hung (exit $RC0, $RC1: stopped by timeout)"
elif [ "$TAMPERED" -lt 1 ]; then
    fail "tamper-cleartext: the delay line tampered with nothing (the test's fault)"
elif [ "$RC1" = 3 ]; then
    pass "tamper-cleartext: no integrity asked for: rank 1 exit 3, $(wrong_bytes "$WORK/d") wrong bytes (from $TAMPERED tampered packets), rank 0 exit $RC0; no hang"
elif [ "$RC1" = 4 ]; then
    pass "tamper-cleartext: rank 1 failed (exit 4: $LASTERR), rank 0 exit $RC0; no hang"
elif [ "$RC1" = 0 ]; then
    fail "tamper-cleartext: $TAMPERED packets were tampered with in the clear, yet rank 1 saw every byte right: the tampering does not reach the receiver, so tamper-detected proves nothing"
else
    fail "tamper-cleartext: rank 1 exited $RC1 (want 3, or 4)"
fi

echo "== $(awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s" \
     "(including any wait for another WAN)"
finish
