#!/bin/sh
#
# The harness's launcher for every test (LOG_COMPILER, SH_LOG_COMPILER):
# runs "$@" and prints its wall time as the last line of the test's log,
#
#   geoccl-test-wall: 12.3 s
#
# which tests/run-all.sh and tests/run-sanitizers.sh print beside each
# result, so that a slow test shows where the suite's minutes go.  The
# exit status is the test's own (77 skip, 99 hard error included).
#
t0=$(date +%s.%N)
"$@"
rc=$?
t1=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" 'BEGIN { printf "geoccl-test-wall: %.1f s\n", b - a }'
exit $rc
