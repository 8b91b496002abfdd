# Sourced by the emulated-WAN tests (tests/wan/*.sh): their PASS/FAIL
# counting, the skip that make check reads (exit 77), one such test at a
# time, and bringing a WAN up.
# The sourcing script sets WAN, NAME, WORK and WAIT_MAX before it calls
# wan_up.

SKIP=77
passed=0
failed=0

pass() { passed=$((passed + 1)); echo "PASS: $*"; }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }
skip() { echo "SKIP: $*"; echo "0 passed, 0 failed"; exit $SKIP; }
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" = 0 ]
    exit $?
}

# wan_lock: waits (up to WAIT_MAX s, default 600) until no other
# emulated-WAN test runs on this machine, holds that until this test's
# shell exits, and raises this test's priority.  These tests share the
# subnet and measure rates and delays, so they run one at a time, whole,
# even where make check -jN or another build's make check starts one beside
# another; tests that only compute run beside them.  The lock is held by a
# process of its own (flock(1) on $GEOCCL_WAN_LOCK, default
# /run/geoccl-wan-tests.lock, then tail --pid on this shell), not by a
# descriptor of this shell, which the delay lines and the ranks would
# inherit and could keep after the test.
wan_lock() {
    local lock=${GEOCCL_WAN_LOCK:-/run/geoccl-wan-tests.lock} max=${WAIT_MAX:-600} marker t0=$SECONDS
    marker=$(mktemp -u "${TMPDIR:-/tmp}/geoccl-wan-lock.XXXXXX")
    ( flock -w "$max" "$lock" sh -c ': > "$1"; exec tail --pid="$2" -f /dev/null' sh "$marker" $$ \
          < /dev/null > /dev/null 2>&1 & )
    until [ -e "$marker" ]; do
        [ $((SECONDS - t0)) -gt $((max + 5)) ] &&
            skip "another emulated-WAN test held $lock for $max s"
        sleep 0.2
    done
    rm -f "$marker"
    [ $((SECONDS - t0)) -lt 2 ] || echo "== waited $((SECONDS - t0)) s for another emulated-WAN test ($lock)"
    stale_wan_down
    # Before the tests that compute beside this one: what the ranks measure
    # and are held to (rates, delays, seconds to notice a fault) must not be
    # the CPU's.  The delay lines run SCHED_FIFO (geoccl-wan up).
    renice -n -10 -p $$ > /dev/null 2>&1 || true
}

# stale_wan_down: with the lock held no other emulated-WAN test runs, so a
# WAN that is up now is a person's or one left by a run that was killed
# (its delay lines killed with it; namespaces outlive their processes).
# One whose delay lines all are gone carries no traffic between regions:
# take it down rather than wait for it (a suite once waited 600 s for
# such a one, and skipped).  A WAN whose delay lines run is left alone.
stale_wan_down() {
    local ifc other
    ifc=$(ip -o -4 addr show to 10.231.0.1/32 2>/dev/null | awk '{ print $2 }' | head -1)
    other=${ifc%-br}
    [ -n "$ifc" ] && [ "$other" != "$ifc" ] && [ -x "${WAN:-}" ] || return 0
    "$WAN" status -n "$other" 2>/dev/null | grep -q 'delay line pid [0-9]* running' && return 0
    echo "== taking down the emulated WAN '$other': up, but none of its delay lines runs (left by a killed run)"
    "$WAN" down -n "$other" -q > /dev/null 2>&1
}

# wan_up ARGS...: takes a leftover of ours down and brings ours up with ARGS;
# geoccl-wan waits (--wait) while another WAN holds the shared subnet.
# Skips (77) when the machine cannot emulate one or the other WAN stays up.
wan_up() {
    local rc
    "$WAN" down -n "$NAME" -q >/dev/null 2>&1
    "$WAN" up -n "$NAME" -q --wait "$WAIT_MAX" "$@" > "$WORK/up.log" 2>&1
    rc=$?
    case $rc in
        0) return 0 ;;
        "$SKIP") skip "$(cat "$WORK/up.log")" ;;
        75) skip "another emulated WAN stayed up for $WAIT_MAX s ($WAN status)" ;;
    esac
    cat "$WORK/up.log"
    echo "geoccl-wan up $* failed (status $rc)"
    exit 1
}

now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
