#!/usr/bin/env bash
#
# Build GeoCCL from this checkout and run its whole test suite:
#
#   bash tests/run-all.sh [configure options...]
#
# Installs missing build packages first when run as root on a system with
# apt-get. The last line printed is always "N passed, N failed"; the exit
# status is 0 only when nothing failed.
#
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1

# The closing line when the suite could not even start.
fail_before_tests() {
    echo "== $1 failed"
    echo "0 passed, 1 failed"
    exit 1
}

bash config/install-deps.sh ||
    echo "warning: could not install every build package; going on with what is here"

echo "== autogen"
if ! ./autogen.sh > autogen.log 2>&1; then
    cat autogen.log
    fail_before_tests "autogen.sh"
fi

echo "== configure $*"
./configure "$@" || { [ -f config.log ] && tail -n 50 config.log; fail_before_tests "configure"; }

echo "== make"
make -j2 || fail_before_tests "make"

echo "== make check"
rm -f test-suite.log
make -j2 check
check_status=$?

# Per-test results, from the .trs files of the parallel harness, with each
# test's wall time (tests/helpers/timed.sh).
echo "== results"
find . -name '*.trs' -newer config.status 2>/dev/null | sort | while read -r trs; do
    result=$(sed -n 's/^:test-result: *//p' "$trs" | head -n 1)
    wall=$(sed -n 's/^geoccl-test-wall: //p' "${trs%.trs}.log" 2>/dev/null | tail -n 1)
    printf '  %-6s %-36s %s\n' "${result:-?}" "${trs%.trs}" "${wall:+($wall)}"
done

count() {
    sed -n "s/^# $1: *\\([0-9][0-9]*\\).*/\\1/p" test-suite.log 2>/dev/null | head -n 1
}
if [ ! -f test-suite.log ]; then
    fail_before_tests "make check (no test-suite.log: the tests did not build)"
fi
pass=$(count PASS); skip=$(count SKIP); xfail=$(count XFAIL)
fail=$(count FAIL); xpass=$(count XPASS); error=$(count ERROR)
failed=$(( ${fail:-0} + ${xpass:-0} + ${error:-0} ))

if [ "$check_status" -ne 0 ] || [ "$failed" -ne 0 ]; then
    echo "== test-suite.log"
    cat test-suite.log
    # make check failed without any test failing: count it as one failure.
    [ "$failed" -eq 0 ] && failed=1
fi

pass=${pass:-0}

# The same sources under the sanitizers (tests/run-sanitizers.sh: the whole
# suite under address,undefined; the threaded tests under thread), then
# built for aarch64 (tests/run-cross.sh).  GEOCCL_TEST_SANITIZERS=0 and
# GEOCCL_TEST_CROSS=0 leave them out of a quick local run.
if [ "${GEOCCL_TEST_SANITIZERS:-1}" != 0 ]; then
    echo "== sanitizers"
    san_log=$(mktemp)
    bash tests/run-sanitizers.sh 2>&1 | tee "$san_log"
    while read -r p f; do
        pass=$((pass + p)); failed=$((failed + f))
    done < <(sed -n 's/^  [a-z,]*: \([0-9]*\) passed, \([0-9]*\) failed.*/\1 \2/p' "$san_log")
    # A mode that did not even build counts as one failure.
    failed=$((failed + $(grep -c -E '^  [a-z,]*: (configure|build) failed' "$san_log")))
    rm -f "$san_log"
fi
if [ "${GEOCCL_TEST_CROSS:-1}" != 0 ]; then
    echo "== aarch64 cross build"
    bash tests/run-cross.sh
    case $? in
        0) pass=$((pass + 1)) ;;
        77) skip=$(( ${skip:-0} + 1 )) ;;
        *) failed=$((failed + 1)) ;;
    esac
fi

echo "(${skip:-0} skipped, ${xfail:-0} expected failures)"
echo "${pass} passed, ${failed} failed"
[ "$failed" -eq 0 ]
