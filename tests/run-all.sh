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
# The stages, and which run at once (the suite is mostly waiting: emulated
# WAN delays, timeouts, ranks that wait for one another):
#   1. autogen, configure, one copy of the distributed sources (make
#      distdir) for the builds of stage 3, made before anything is built
#      here; make; the test programs.
#   2. make check of this build, one job more than there are cores: the
#      emulated-WAN tests one after the other, at a higher priority, beside
#      the tests that compute (Makefile.am, "test ordering").
#   3. beside stage 2, from its start, at a lower priority: the same
#      sources under the sanitizers (tests/run-sanitizers.sh: the suite
#      less the emulated-WAN tests that measure links under
#      address,undefined; the threaded tests under thread; the two at
#      once), and built for aarch64 (tests/run-cross.sh).
#      GEOCCL_TEST_SANITIZERS=0 and GEOCCL_TEST_CROSS=0 leave them out of a
#      quick local run.
# Each stage's wall time is printed at the end ("== stage times").
#
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1

t_start=$(date +%s)
stage_times=()
# stage_done NAME T0: NAME took from T0 until now.
stage_done() { stage_times+=("$1: $(( $(date +%s) - $2 )) s"); }
print_stage_times() {
    stage_times+=("total: $(( $(date +%s) - t_start )) s")
    echo "== stage times"
    printf '  %s\n' "${stage_times[@]}"
}

# The closing line when the suite could not even start.
fail_before_tests() {
    echo "== $1 failed"
    print_stage_times
    echo "0 passed, 1 failed"
    exit 1
}

t0=$(date +%s)
bash config/install-deps.sh ||
    echo "warning: could not install every build package; going on with what is here"

echo "== autogen"
if ! ./autogen.sh > autogen.log 2>&1; then
    cat autogen.log
    fail_before_tests "autogen.sh"
fi

echo "== configure $*"
./configure "$@" || { [ -f config.log ] && tail -n 50 config.log; fail_before_tests "configure"; }
stage_done "packages, autogen, configure" "$t0"

san=${GEOCCL_TEST_SANITIZERS:-1} cross=${GEOCCL_TEST_CROSS:-1}
work=$(mktemp -d /tmp/geoccl-run-all.XXXXXX)
dist=
if [ "$san" != 0 ] || [ "$cross" != 0 ]; then
    # Before make: dist-hook copies whole folders (tests/device), which in
    # a build in the source tree would then hold this build's objects.
    if make -s distdir distdir="$work/src" > "$work/distdir.log" 2>&1; then
        dist=$work/src
    else
        cat "$work/distdir.log"
        echo "== make distdir failed: no sanitizer or cross builds"
    fi
fi

echo "== make"
t0=$(date +%s)
make -j2 || fail_before_tests "make"
# The test programs too, so that stage 2's make check only runs tests.
make -j2 check TESTS= || fail_before_tests "make (test programs)"
stage_done "make, test programs" "$t0"

# Stage 3, in the background, its output printed after stage 2's.  At a
# lower priority (nice 10), it takes what stage 2 leaves: stage 2's tests
# hold the ranks to time limits of 1x, the sanitizer builds' to 4x and 8x
# (GEOCCL_TEST_TIME_SCALE), and kernel threads (softirq: the emulated
# links' packets) go before it.
san_pid='' cross_pid=''
if [ -n "$dist" ] && [ "$san" != 0 ]; then
    (
        t0=$(date +%s)
        GEOCCL_DISTDIR=$dist nice -n 10 bash tests/run-sanitizers.sh > "$work/sanitizers.out" 2>&1
        echo $? > "$work/sanitizers.rc"
        echo $(( $(date +%s) - t0 )) > "$work/sanitizers.secs"
    ) &
    san_pid=$!
fi
if [ -n "$dist" ] && [ "$cross" != 0 ]; then
    (
        t0=$(date +%s)
        GEOCCL_DISTDIR=$dist nice -n 10 bash tests/run-cross.sh > "$work/cross.out" 2>&1
        echo $? > "$work/cross.rc"
        echo $(( $(date +%s) - t0 )) > "$work/cross.secs"
    ) &
    cross_pid=$!
fi

echo "== make check"
t0=$(date +%s)
jobs=$(( $(nproc 2>/dev/null || echo 2) + 1 ))
rm -f test-suite.log
make -j"$jobs" check
check_status=$?
stage_done "make check (-j$jobs)" "$t0"

# Per-test results, from the .trs files of the parallel harness, with each
# test's wall and CPU time (tests/helpers/timed.sh).
echo "== results"
find . -name '*.trs' -newer config.status 2>/dev/null | sort | while read -r trs; do
    result=$(sed -n 's/^:test-result: *//p' "$trs" | head -n 1)
    wall=$(sed -n 's/^geoccl-test-wall: \([0-9.]* s\)\( (\(cpu [0-9.]* s\))\)\{0,1\}$/\1, \3/p' \
               "${trs%.trs}.log" 2>/dev/null | tail -n 1)
    wall=${wall%, }
    printf '  %-6s %-36s %s\n' "${result:-?}" "${trs%.trs}" "${wall:+($wall)}"
done

count() {
    sed -n "s/^# $1: *\\([0-9][0-9]*\\).*/\\1/p" test-suite.log 2>/dev/null | head -n 1
}
pass=$(count PASS); skip=$(count SKIP); xfail=$(count XFAIL)
fail=$(count FAIL); xpass=$(count XPASS); error=$(count ERROR)
failed=$(( ${fail:-0} + ${xpass:-0} + ${error:-0} ))

if [ ! -f test-suite.log ]; then
    echo "== make check failed: no test-suite.log"
    failed=$((failed + 1))
elif [ "$check_status" -ne 0 ] || [ "$failed" -ne 0 ]; then
    echo "== test-suite.log"
    cat test-suite.log
    # make check failed without any test failing: count it as one failure.
    [ "$failed" -eq 0 ] && failed=1
fi

pass=${pass:-0}

if [ "$san" != 0 ] || [ "$cross" != 0 ]; then
    if [ -z "$dist" ]; then
        failed=$((failed + 1))
    else
        t0=$(date +%s)
        wait $san_pid $cross_pid
        stage_done "waiting after make check for the sanitizer and cross builds" "$t0"
    fi
fi
if [ "$san" != 0 ] && [ -n "$dist" ]; then
    echo "== sanitizers"
    cat "$work/sanitizers.out"
    while read -r p f; do
        pass=$((pass + p)); failed=$((failed + f))
    done < <(sed -n 's/^  [a-z,]*: \([0-9]*\) passed, \([0-9]*\) failed.*/\1 \2/p' "$work/sanitizers.out")
    # A mode that did not even build counts as one failure, and so does a
    # run that printed no summary.
    failed=$((failed + $(grep -c -E '^  [a-z,]*: (configure failed|build failed|did not finish)' "$work/sanitizers.out")))
    grep -q '^== sanitizers: summary' "$work/sanitizers.out" || failed=$((failed + 1))
    stage_times+=("sanitizers (beside make check): $(cat "$work/sanitizers.secs" 2>/dev/null || echo '?') s")
fi
if [ "$cross" != 0 ] && [ -n "$dist" ]; then
    echo "== aarch64 cross build"
    cat "$work/cross.out"
    case $(cat "$work/cross.rc" 2>/dev/null) in
        0) pass=$((pass + 1)) ;;
        77) skip=$(( ${skip:-0} + 1 )) ;;
        *) failed=$((failed + 1)) ;;
    esac
    stage_times+=("aarch64 cross build (beside make check): $(cat "$work/cross.secs" 2>/dev/null || echo '?') s")
fi
if [ "$failed" -eq 0 ]; then
    chmod -R u+w "$work" 2>/dev/null
    rm -rf "$work"
else
    echo "== the copied sources and the stage 3 logs are kept in $work"
fi

print_stage_times
echo "(${skip:-0} skipped, ${xfail:-0} expected failures)"
echo "${pass} passed, ${failed} failed"
[ "$failed" -eq 0 ]
