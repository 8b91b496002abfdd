# Sourced by the emulated-WAN tests (tests/wan/test_*.sh): their PASS/FAIL
# counting, the skip that make check reads (exit 77), and bringing a WAN up.
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
