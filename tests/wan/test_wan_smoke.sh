#!/usr/bin/env bash
#
# Smoke test of the emulated WAN (tools/geoccl-wan):
#
#   2 regions, 100 Mbit/s, 25 ms:  RTT r0->r1 is 50 +- 5 ms; one TCP stream
#       r0->r1 gets 90..100 Mbit/s; inside r0 (loopback, own address) the
#       RTT is under 2 ms; GEOCCL_REGION is set by exec.
#   2 regions, 1 Gbit/s, 25 ms:    one TCP stream gets >= 850 Mbit/s.
#   2 regions, delays 30,10 ms:    RTT is 40 +- 5 ms (RTT = D_i + D_j);
#       with --mtu 9000 every hop has that MTU and 9000-byte packets cross
#       whole; --mtu 70000 is refused.
#   run -- false:                  status 1 comes back and nothing is left.
#   after down:                    no namespace, link, state or delay line of
#       ours is left, and the root sysctls have their old values.
#
#   sudo bash tests/wan/test_wan_smoke.sh
#
# Needs root and network namespaces (exit 77, "skipped", otherwise); uses
# ping and iperf3 when present (installs iperf3 with apt-get when it can),
# else tests/helpers/netprobe.py (GEOCCL_WAN_PROBES=python forces the latter). Takes about a minute. The last line is always
# "N passed, N failed".
#
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
. tests/helpers/wan_common.sh
WAN=$PWD/tools/geoccl-wan
PROBE=$PWD/tests/helpers/netprobe.py
NAME=gwsmoke


# Is $1 within [$2, $3]? (decimals)
within() { awk -v x="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(x != "" && x + 0 >= lo && x + 0 <= hi) }'; }

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces); run: sudo bash $0"
if ! command -v ip >/dev/null 2>&1 || ! ip netns list >/dev/null 2>&1; then skip "no 'ip netns' here"; fi
[ -c /dev/net/tun ] || skip "no /dev/net/tun"
wan_lock
if ip -o -4 addr show 2>/dev/null | grep -q ' 10\.231\.0\.1/'; then
    skip "10.231.0.1 is in use (an emulated WAN is up: tools/geoccl-wan status); take it down first"
fi

# Teardown whatever happens from here on.
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    "$WAN" down -n "$NAME" -q >/dev/null 2>&1
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

# ---- tools ---------------------------------------------------------------

have_ping=
command -v ping >/dev/null 2>&1 && have_ping=1
if ! command -v iperf3 >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "== installing iperf3"
    DEBIAN_FRONTEND=noninteractive timeout 90 apt-get install -y -qq iperf3 >/dev/null 2>&1 ||
        { timeout 60 apt-get update -qq >/dev/null 2>&1 &&
          DEBIAN_FRONTEND=noninteractive timeout 90 apt-get install -y -qq iperf3 >/dev/null 2>&1; }
fi
have_iperf=
command -v iperf3 >/dev/null 2>&1 && have_iperf=1
# GEOCCL_WAN_PROBES=python: use netprobe.py even where ping and iperf3 exist.
[ "${GEOCCL_WAN_PROBES:-}" = python ] && have_ping='' have_iperf=''
if { [ -z "$have_ping" ] || [ -z "$have_iperf" ]; } && ! command -v python3 >/dev/null 2>&1; then
    skip "neither ping/iperf3 nor python3 for the probes"
fi
echo "== probes: RTT with $([ -n "$have_ping" ] && echo ping || echo "netprobe.py (UDP)")," \
     "throughput with $([ -n "$have_iperf" ] && echo iperf3 || echo "netprobe.py (TCP)")"

inr() { local r=$1; shift; "$WAN" exec -n "$NAME" -i "$r" -- "$@"; }

# rtt REGION ADDR -> prints the median RTT of 20 probes in ms (empty on
# failure); min/avg/max go to stderr for the log. The median, because on a
# busy machine an odd probe waits milliseconds for a CPU.
PORT=7311
rtt() {
    local r=$1 addr=$2 out pid=''
    if [ -n "$have_ping" ]; then
        out=$(inr "$r" timeout 20 ping -n -c 20 -i 0.05 -W 2 "$addr" 2>&1)
    else
        PORT=$((PORT + 1))
        at "$addr" timeout 25 python3 "$PROBE" udp-echo "$addr" "$PORT" --timeout 5 &
        pid=$!
        sleep 0.5
        out=$(inr "$r" timeout 20 python3 "$PROBE" udp-ping "$addr" "$PORT" -c 20 -i 0.05 2>&1)
        kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    fi
    local med
    med=$(echo "$out" | sed -n 's/.*time=\([0-9.]*\) *ms.*/\1/p' | sort -n |
          awk '{ v[NR] = $1 } END { if (NR) printf "%.3f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    echo "   $(echo "$out" | grep -E 'rtt|round-trip' || echo "$out" | tail -2), median ${med:-none}" >&2
    echo "$med"
}

# Runs a command where address $1 lives: the root namespace for the bridge,
# else the region with that address (r0 for loopback).
at() {
    local addr=$1; shift
    case $addr in
        10.231.0.1) "$@";;
        10.231.0.*) inr $(( ${addr##*.} - 10 )) "$@";;
        *) inr 0 "$@";;
    esac
}

# tput FROM TO_ADDR SECONDS -> prints receiver Mbit/s, slow start excluded.
tput() {
    local r=$1 addr=$2 secs=$3 out pid
    PORT=$((PORT + 1))
    if [ -n "$have_iperf" ]; then
        at "$addr" timeout $((secs + 30)) iperf3 -s -1 -B "$addr" -p "$PORT" >/dev/null 2>&1 &
        pid=$!
        sleep 0.5
        out=$(inr "$r" timeout $((secs + 20)) iperf3 -c "$addr" -p "$PORT" -t "$secs" -O 2 -f m 2>&1)
        wait "$pid" 2>/dev/null
        echo "$out" | grep -E 'sender|receiver' | sed 's/^/   /' >&2
        echo "$out" | awk '/receiver/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") v = $(i - 1) } END { print v }'
    else
        local f
        f=$(mktemp)
        at "$addr" timeout $((secs + 30)) python3 "$PROBE" tcp-sink "$addr" "$PORT" --omit 2 > "$f" 2>&1 &
        pid=$!
        sleep 0.5
        inr "$r" timeout $((secs + 20)) python3 "$PROBE" tcp-send "$addr" "$PORT" -t $((secs + 2)) >/dev/null 2>&1
        wait "$pid" 2>/dev/null
        sed 's/^/   /' "$f" >&2
        awk '/receiver/ { print $2 }' "$f"
        rm -f "$f"
    fi
}

up() {
    local out
    if ! out=$("$WAN" up -n "$NAME" "$@" 2>&1); then
        echo "$out"
        fail "geoccl-wan up $*"
        finish
    fi
    echo "$out" | sed 's/^/   /'
}

root_sysctls() { sysctl -n net.core.rmem_max net.core.wmem_max | tr '\n' ' '; }
sysctls_before=$(root_sysctls)
start=$SECONDS

# ---- 100 Mbit/s, 25 ms -----------------------------------------------------

echo "== 2 regions, 100mbit, 25ms"
up -r 2 --rate 100mbit --delay 25ms
pids=$(cat /run/geoccl-wan/$NAME/dl*.pid 2>/dev/null | tr '\n' ' ')

v=$(rtt 0 10.231.0.11)
if within "$v" 45 55; then pass "RTT r0->r1 at 25 ms one-way: $v ms (want 50 +- 5)"
else fail "RTT r0->r1 at 25 ms one-way: ${v:-none} ms (want 50 +- 5)"; fi

v=$(rtt 0 127.0.0.1)
if within "$v" 0 2; then pass "RTT inside r0 over loopback: $v ms (want < 2)"
else fail "RTT inside r0 over loopback: ${v:-none} ms (want < 2)"; fi

v=$(rtt 0 10.231.0.10)
if within "$v" 0 2; then pass "RTT inside r0 to its own address: $v ms (want < 2)"
else fail "RTT inside r0 to its own address: ${v:-none} ms (want < 2)"; fi

v=$(rtt 0 10.231.0.1)
if within "$v" 0 2; then pass "RTT r0 -> bridge (root namespace, not delayed): $v ms (want < 2)"
else fail "RTT r0 -> bridge (root namespace, not delayed): ${v:-none} ms (want < 2)"; fi

v=$(inr 1 printenv GEOCCL_REGION)
if [ "$v" = r1 ]; then pass "exec -i 1 sets GEOCCL_REGION=r1"
else fail "exec -i 1 sets GEOCCL_REGION=r1 (got '$v')"; fi

v=$(tput 0 10.231.0.11 6)
if within "$v" 90 100; then pass "TCP r0->r1 at 100mbit: $v Mbit/s (want 90..100)"
else fail "TCP r0->r1 at 100mbit: ${v:-none} Mbit/s (want 90..100)"; fi

"$WAN" down -n "$NAME" -q

# ---- 1 Gbit/s, 25 ms -------------------------------------------------------

echo "== 2 regions, 1gbit, 25ms"
up -r 2 --rate 1gbit --delay 25ms
pids+=$(cat /run/geoccl-wan/$NAME/dl*.pid 2>/dev/null | tr '\n' ' ')

v=$(tput 0 10.231.0.11 8)
if within "$v" 850 1000; then pass "TCP r0->r1 at 1gbit, one stream: $v Mbit/s (want >= 850)"
else fail "TCP r0->r1 at 1gbit, one stream: ${v:-none} Mbit/s (want >= 850)"; fi
for p in /run/geoccl-wan/"$NAME"/dl*.pid; do kill -USR1 "$(cat "$p")" 2>/dev/null; done
sleep 0.2
grep -h 'late avg' /run/geoccl-wan/$NAME/dl*.log 2>/dev/null |
    sed 's/^/   /; s/; out .*held now/ ... held now/'

"$WAN" down -n "$NAME" -q

# ---- different delays per region ------------------------------------------

echo "== 2 regions, delays 30ms and 10ms, --mtu 9000"
up -r 2 --rate 1gbit --delays 30ms,10ms --mtu 9000
pids+=$(cat /run/geoccl-wan/$NAME/dl*.pid 2>/dev/null | tr '\n' ' ')
v=$(rtt 0 10.231.0.11)
if within "$v" 35 45; then pass "RTT r0->r1 with delays 30,10 ms: $v ms (want 40 +- 5)"
else fail "RTT r0->r1 with delays 30,10 ms: ${v:-none} ms (want 40 +- 5)"; fi
v=$(for d in "-n $NAME-r0 link show wan0" "-n $NAME-r0 link show dl0" "-n $NAME-r1 link show dl0" \
             "link show $NAME-br"; do ip $d | sed -n 's/.* mtu \([0-9]*\) .*/\1/p'; done | tr '\n' ' ')
if [ "$v" = "9000 9000 9000 9000 " ]; then pass "--mtu 9000 on wan0, dl0 and the bridge"
else fail "--mtu 9000 on wan0, dl0 and the bridge: got '$v'"; fi
if [ -n "$have_ping" ]; then
    # 8972 bytes of ICMP payload + 28 of headers = 9000, not to be fragmented
    if inr 0 ping -n -c 1 -W 3 -M do -s 8972 10.231.0.11 >/dev/null 2>&1; then
        pass "a 9000-byte packet crosses r0 -> r1 whole (ping -M do)"
    else fail "a 9000-byte packet crosses r0 -> r1 whole (ping -M do)"; fi
fi
"$WAN" down -n "$NAME" -q

if out=$("$WAN" up -n "$NAME" -r 2 --mtu 70000 -q 2>&1); then
    fail "up --mtu 70000 is refused"
    "$WAN" down -n "$NAME" -q
else
    case $out in *"--mtu 70000"*) pass "up --mtu 70000 is refused: $out";;
                 *) fail "up --mtu 70000: unclear message '$out'";; esac
fi

# ---- run: teardown after a failing command --------------------------------

echo "== run -r 2 -- false"
"$WAN" run -n "$NAME" -r 2 --rate 100mbit --delay 5ms -q -- \
    bash -c '[ "$GEOCCL_WAN_REGIONS" = 2 ] && [ "$GEOCCL_WAN_ADDRS" = 10.231.0.10,10.231.0.11 ] &&
             "$GEOCCL_WAN" exec -i 1 -- ping -c 1 -W 2 10.231.0.10 >/dev/null 2>&1 || [ -z "$(command -v ping)" ]
             exit 1' >/dev/null 2>&1
rc=$?
if [ "$rc" = 1 ] && [ ! -e /run/netns/$NAME-r0 ] && ! ip link show $NAME-br >/dev/null 2>&1; then
    pass "run passes CMD's status (1) back and tears down"
else
    fail "run passes CMD's status back and tears down (status $rc, namespace $( [ -e /run/netns/$NAME-r0 ] && echo left || echo gone))"
fi

# ---- nothing left -----------------------------------------------------------

echo "== after down"
"$WAN" down -n "$NAME" -q      # again: must be harmless
left=$(ip netns list 2>/dev/null | awk -v n="$NAME" '$1 ~ "^" n "-" { print $1 }' | tr '\n' ' ')
left+=$(ip -o link show 2>/dev/null | awk -F': ' -v n="$NAME" '$2 ~ "^" n "-" { sub(/@.*/, "", $2); print $2 }' | tr '\n' ' ')
[ -e /run/geoccl-wan/$NAME ] && left+="/run/geoccl-wan/$NAME "
for p in $pids; do   # a zombie awaiting init's reaping does not count
    st=$(cat "/proc/$p/stat" 2>/dev/null) && st=${st##*) } && [ "${st%% *}" != Z ] && left+="pid:$p "
done
if [ -z "$left" ]; then pass "down leaves no namespace, link, state or delay line"
else fail "left after down: $left"; fi
sysctls_after=$(root_sysctls)
if [ "$sysctls_after" = "$sysctls_before" ]; then pass "root sysctls restored (rmem_max wmem_max: $sysctls_after)"
else fail "root sysctls: before '$sysctls_before', after '$sysctls_after'"; fi

echo "== took $((SECONDS - start)) s"
finish
