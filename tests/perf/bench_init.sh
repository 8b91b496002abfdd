#!/bin/sh
# bench_init.sh: init time and descriptors per rank of N ranks forked on
# this host, with every pair connected at init (GEOCCL_CONNECT=all) and
# with only the pairs the plans use (GEOCCL_CONNECT=lazy), taking turns
# ROUNDS times so that the slow phases of a shared machine fall on both.
# Each run is tests/test_lazy_connect --bench N: every rank times its
# ncclCommInitRank, counts /proc/self/fd after it, and one 32 KiB float
# all-reduce is checked.
#
#   tests/perf/bench_init.sh [BUILDDIR]     (BUILDDIR holds tests/test_lazy_connect;
#                                            default .)
#
# Environment: SIZES (default "64 128 256"), MODES (default "all lazy"),
# ROUNDS (default 1).  Any other GEOCCL_* setting passes through (e.g.
# GEOCCL_SHM=2 for AF_UNIX sockets without shared-memory rings).
#
# One line per run: the slowest rank's init, the mean, the job's (first
# fork to the last rank ready) and the descriptors a rank holds after init
# (the process's whole table: stdio, the library's own, the connections).
# Exit status: 0 all runs right; 1 otherwise; 2 bad arguments.
set -u

bin=${1:-.}/tests/test_lazy_connect
[ -x "$bin" ] || { echo "$0: $bin: not an executable" >&2; exit 2; }
sizes=${SIZES:-64 128 256}
modes=${MODES:-all lazy}
rounds=${ROUNDS:-1}
status=0

# 256 ranks hold up to 2 x 255 connections each with GEOCCL_CONNECT=all.
ulimit -n "$(ulimit -Hn)" 2>/dev/null
echo "# bench_init.sh, $(date -u '+%F %T') UTC, $(nproc) cores, open files $(ulimit -n)," \
  "GEOCCL_NSTREAMS=${GEOCCL_NSTREAMS:-2 (default)}, GEOCCL_SHM=${GEOCCL_SHM:-1 (default)}"
for round in $(seq 1 "$rounds"); do
  for n in $sizes; do
    for mode in $modes; do
      if ! GEOCCL_CONNECT=$mode GEOCCL_SOCKET_IFNAME=lo "$bin" --bench "$n"; then
        echo "# ranks $n, GEOCCL_CONNECT=$mode: FAILED" >&2
        status=1
      fi
    done
  done
done
exit $status
