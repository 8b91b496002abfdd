#!/bin/sh
#
# The harness's launcher for every test (LOG_COMPILER, SH_LOG_COMPILER):
# runs "$@" and prints its wall time, and the CPU time (user + system) of
# the processes it waited for, as the last line of the test's log,
#
#   geoccl-test-wall: 12.3 s (cpu 4.1 s)
#
# which tests/run-all.sh and tests/run-sanitizers.sh print beside each
# result, so that a slow test shows where the suite's minutes go, and
# whether it spends them computing or waiting (a test that waits can run
# beside others for free).  The exit status is the test's own (77 skip, 99
# hard error included).
#
t0=$(date +%s.%N)
"$@"
rc=$?
t1=$(date +%s.%N)
# times (run by this shell, not a subshell): its own user and system
# time, then its children's.
tms=$(mktemp "${TMPDIR:-/tmp}/geoccl-timed.XXXXXX") && times > "$tms"
cpu=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, "m"); s += a[1] * 60 + a[2] } }
           END { printf "%.1f", s }' "$tms" 2>/dev/null)
rm -f "$tms"
awk -v a="$t0" -v b="$t1" -v c="$cpu" \
    'BEGIN { printf "geoccl-test-wall: %.1f s (cpu %s s)\n", b - a, c }'
exit $rc
