#!/bin/sh
# bench_shm.sh: the same-host fast path (GEOCCL_SHM) against TCP on loopback,
# side by side in one run: geoccl-perf -N NP (forked ranks on this machine),
# float sum all-reduce, 1 MiB to 64 MiB (factor 4), with GEOCCL_SHM=0 (TCP),
# 2 (AF_UNIX sockets) and 1 (AF_UNIX + shared-memory rings) taking turns
# ROUNDS times, so that the slow phases of a shared machine fall on all
# alike. Every result is checked (-c 1).
#
#   tests/perf/bench_shm.sh [BUILDDIR]      (BUILDDIR holds geoccl-perf; default .)
#
# Environment: NP (ranks, default 4), ROUNDS (default 3), ITERS (timed calls
# per size and run, default 10), WARMUP (default 3), OUTDIR (raw outputs;
# default a new directory under ${TMPDIR:-/tmp}).
#
# The table: per size, the median over the rounds of the out-of-place time
# per call (geoccl-perf: average over iterations, maximum over ranks), for
# each setting, and speedups = time(SHM=0) / time(setting).
# Exit status: 0 all runs finished with right results; 1 otherwise; 2 bad
# arguments.
set -u

perf=${1:-.}/geoccl-perf
[ -x "$perf" ] || { echo "$0: $perf: not an executable" >&2; exit 2; }
np=${NP:-4}
rounds=${ROUNDS:-3}
iters=${ITERS:-10}
warmup=${WARMUP:-3}
outdir=${OUTDIR:-$(mktemp -d "${TMPDIR:-/tmp}/bench-shm.XXXXXX")} || exit 2
mkdir -p "$outdir" || exit 2
status=0

echo "# bench_shm.sh, $(date -u '+%F %T') UTC, $(nproc) cores, $np ranks, $rounds rounds;" \
  "raw outputs in $outdir"
for round in $(seq 1 "$rounds"); do
  for shm in 0 2 1; do
    cmd="env GEOCCL_SHM=$shm GEOCCL_SOCKET_IFNAME=lo $perf -N $np -b 1M -e 64M -f 4"
    cmd="$cmd -n $iters -w $warmup -d float -o sum -c 1"
    echo "+ $cmd" >&2
    # shellcheck disable=SC2086 # the command is meant to split
    if ! $cmd >"$outdir/shm$shm.$round.txt" 2>"$outdir/shm$shm.$round.err"; then
      echo "$0: GEOCCL_SHM=$shm round $round failed:" >&2
      sed 's/^/    /' "$outdir/shm$shm.$round.err" >&2
      status=1
    fi
    if grep -q '^# Wrong values.*FAILED\|^# Out of bounds values.*FAILED' \
        "$outdir/shm$shm.$round.txt"; then
      status=1
    fi
  done
done

echo
echo "| size | TCP, GEOCCL_SHM=0 (us) | AF_UNIX, GEOCCL_SHM=2 (us) | rings, GEOCCL_SHM=1 (us) | speedup 2 | speedup 1 |"
echo "|---:|---:|---:|---:|---:|---:|"
awk '!/^#/ && NF >= 13 { print FILENAME, $1, $6 }' "$outdir"/shm[012].*.txt | awk '
  { k = split($1, p, "/"); shm = substr(p[k], 4, 1); t[shm, $2, ++n[shm, $2]] = $3
    sizes[$2] = 1 }
  function median(shm, s,   k, m, i, j, v, a) {
    m = n[shm, s]
    if (m == 0) return 0
    for (i = 1; i <= m; i++) a[i] = t[shm, s, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { v = a[i]; a[i] = a[j]; a[j] = v }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    for (s = 1048576; s <= 67108864; s *= 4) {
      if (!(s in sizes)) continue
      t0 = median(0, s); t2 = median(2, s); t1 = median(1, s)
      printf "| %d MiB | %.0f | %.0f | %.0f | %.2f | %.2f |\n", s / 1048576, t0, t2, t1,
             (t2 > 0 ? t0 / t2 : 0), (t1 > 0 ? t0 / t1 : 0)
    }
  }'
exit $status
