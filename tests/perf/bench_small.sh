#!/bin/sh
# bench_small.sh: small all-reduces of ranks on one host, GeoCCL beside Open MPI
# in one run: float sum, out of place, every result checked (-c 1).
#
#   tests/perf/bench_small.sh [BUILDDIR]   (BUILDDIR holds geoccl-perf and
#                                           tests/perf/mpi-allreduce-perf; default .)
#
#   GeoCCL         geoccl-perf -N NP (forked ranks; the host segment where its
#                  cost model puts the call, GEOCCL_HOST_COLL=1)
#   GeoCCL msgs    the same with GEOCCL_HOST_COLL=0 (the message-passing path
#                  alone; only for up to MSG_MAX_NP ranks: it is slow beyond)
#   OMPI vader     mpirun mpi-allreduce-perf, Open MPI's shared-memory BTL
#   OMPI tcp       the same with --mca btl tcp,self on loopback
#
# Cases: 4 ranks at 8 B to 64 KiB (factor 2), then 16, 64 and 256 ranks at 8 B.
# Each case runs ROUNDS times, the programs taking turns within a round, so
# that the slow phases of a shared machine fall on all alike; the table
# gives per size the median over the rounds of each program's time per call
# (its average over ITERS calls, the maximum over ranks) and the ratio
# GeoCCL / vader.
#
# Environment: ROUNDS (default 3), ITERS (default 200; 50 from 64 ranks, 20 at
# 256), WARMUP (default 20; 5, 3), CASES (default "4 16 64 256"), MSG_MAX_NP
# (default 16), MPIRUN (default mpirun), OUTDIR (raw outputs; default a new
# directory under ${TMPDIR:-/tmp}).
# Exit status: 0 every run finished with right results; 1 otherwise; 2 bad
# arguments or a missing program.
set -u

build=${1:-.}
perf=$build/geoccl-perf
mpiperf=$build/tests/perf/mpi-allreduce-perf
mpirun=${MPIRUN:-mpirun}
for p in "$perf" "$mpiperf"; do
  [ -x "$p" ] || { echo "$0: $p: not an executable" >&2; exit 2; }
done
command -v "$mpirun" >/dev/null 2>&1 || { echo "$0: $mpirun not found" >&2; exit 2; }
rounds=${ROUNDS:-3}
cases=${CASES:-4 16 64 256}
msg_max=${MSG_MAX_NP:-16}
outdir=${OUTDIR:-$(mktemp -d "${TMPDIR:-/tmp}/bench-small.XXXXXX")} || exit 2
mkdir -p "$outdir" || exit 2
status=0

# run NAME NP ROUND CMD...: the table's data lines go to NAME.NP.ROUND.txt.
run() {
  name=$1 np=$2 round=$3
  shift 3
  out=$outdir/$name.$np.$round
  echo "+ $*" >&2
  if ! "$@" >"$out.txt" 2>"$out.err"; then
    echo "$0: $name, $np ranks, round $round failed:" >&2
    tail -5 "$out.err" | sed 's/^/    /' >&2
    status=1
  fi
  if grep -q '^# Wrong values.*FAILED\|^# Out of bounds values.*FAILED' "$out.txt"; then
    echo "$0: $name, $np ranks, round $round: wrong results" >&2
    status=1
  fi
}

echo "# bench_small.sh, $(date -u '+%F %T') UTC, $(nproc) cores, cases: $cases ranks," \
  "$rounds rounds; raw outputs in $outdir"
for np in $cases; do
  if [ "$np" -le 4 ]; then range="-b 8 -e 64K -f 2"; else range="-b 8 -e 8"; fi
  if [ "$np" -ge 256 ]; then it=${ITERS:-20} wu=${WARMUP:-3}
  elif [ "$np" -ge 64 ]; then it=${ITERS:-50} wu=${WARMUP:-5}
  else it=${ITERS:-200} wu=${WARMUP:-20}
  fi
  common="$range -n $it -w $wu -d float -o sum -c 1"
  mpi="$mpirun --allow-run-as-root --oversubscribe -np $np"
  for round in $(seq 1 "$rounds"); do
    # shellcheck disable=SC2086 # the options are meant to split
    run geoccl "$np" "$round" env GEOCCL_SOCKET_IFNAME=lo "$perf" -N "$np" $common
    # shellcheck disable=SC2086
    run ompi-vader "$np" "$round" $mpi --mca btl vader,self "$mpiperf" $common
    # shellcheck disable=SC2086
    run ompi-tcp "$np" "$round" $mpi --mca btl tcp,self --mca btl_tcp_if_include lo \
      "$mpiperf" $common
    if [ "$np" -le "$msg_max" ]; then
      # shellcheck disable=SC2086
      run geoccl-msgs "$np" "$round" env GEOCCL_SOCKET_IFNAME=lo GEOCCL_HOST_COLL=0 \
        "$perf" -N "$np" $common
    fi
  done
done

echo
echo "| ranks | size (B) | GeoCCL (us) | OMPI vader (us) | OMPI tcp (us) | GeoCCL msgs (us) | GeoCCL / vader |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
# Data lines: size is field 1, the out-of-place time field 6.
for f in "$outdir"/*.txt; do
  b=$(basename "$f" .txt)
  awk -v key="$b" '!/^#/ && NF >= 12 { print key, $1, $6 }' "$f"
done | awk '
  { split($1, k, "."); name = k[1]; np = k[2]
    t[name, np, $2, ++n[name, np, $2]] = $3; seen[np, $2] = 1; nps[np] = 1 }
  function median(name, np, s,   m, i, j, v, a) {
    m = n[name, np, s]
    if (m == 0) return -1
    for (i = 1; i <= m; i++) a[i] = t[name, np, s, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { v = a[i]; a[i] = a[j]; a[j] = v }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  function cell(v) { return v < 0 ? "-" : sprintf("%.1f", v) }
  END {
    for (np = 1; np <= 4096; np++) {
      if (!(np in nps)) continue
      for (s = 8; s <= 67108864; s *= 2) {
        if (!((np, s) in seen)) continue
        g = median("geoccl", np, s); v = median("ompi-vader", np, s)
        printf "| %d | %d | %s | %s | %s | %s | %s |\n", np, s, cell(g), cell(v),
               cell(median("ompi-tcp", np, s)), cell(median("geoccl-msgs", np, s)),
               (g > 0 && v > 0 ? sprintf("%.2f", g / v) : "-")
      }
    }
  }'
exit $status
