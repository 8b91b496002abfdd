#!/bin/sh
# bench_loopback.sh: GeoCCL's all-reduce against Open MPI's, 4 processes on
# this machine, float sum, 1 KiB to 256 MiB, all in one run; prints the
# three tables and a combined markdown table.
#
#   tests/perf/bench_loopback.sh [BUILDDIR]
#       BUILDDIR (default .) holds geoccl-perf and tests/perf/mpi-allreduce-perf
#   tests/perf/bench_loopback.sh GEOCCL_PERF MPI_ALLREDUCE_PERF
#       the two binaries by path
#
# The three measurements:
#   GeoCCL            geoccl-perf -N 4, GEOCCL_SOCKET_IFNAME=lo (TCP on loopback)
#   Open MPI (tcp)    mpirun ... --mca btl tcp,self --mca btl_tcp_if_include lo:
#                     also TCP on loopback, the like-for-like comparison
#   Open MPI (vader)  mpirun with Open MPI's default BTL, which on one machine
#                     is vader (shared memory): no sockets at all, for scale
#
# Sizes up to 16 MiB run 20 timed iterations after 5 warm-up ones; 32 MiB
# to 256 MiB run 10 after 2, which keeps the whole script to about 2-3 minutes
# on 2 cores. Every result is checked (-c 1). The combined table uses the
# out-of-place columns; the full tables (in-place too) are printed first and
# kept in OUTDIR.
#
# Environment: OUTDIR (default: a new directory under ${TMPDIR:-/tmp}),
# MPIRUN (default mpirun), TIMEOUT (seconds a single size may take before the
# tool gives up, default 300).
#
# Exit status: 0 when all runs finished with every result right; 1 when some
# run failed, hung or found wrong results (the table shows "-" for what is
# missing and the run's messages say why); 2 for bad arguments.
set -u

case $# in
  0|1)
    dir=${1:-.}
    geoccl=$dir/geoccl-perf
    mpiperf=$dir/tests/perf/mpi-allreduce-perf
    ;;
  2)
    geoccl=$1
    mpiperf=$2
    ;;
  *)
    echo "usage: $0 [BUILDDIR] | $0 GEOCCL_PERF MPI_ALLREDUCE_PERF" >&2
    exit 2
    ;;
esac
for exe in "$geoccl" "$mpiperf"; do
  if [ ! -x "$exe" ]; then
    echo "$0: $exe: not an executable (build with MPI found by configure)" >&2
    exit 2
  fi
done
mpirun=${MPIRUN:-mpirun}
if ! command -v "$mpirun" >/dev/null 2>&1; then
  echo "$0: $mpirun not found" >&2
  exit 2
fi
timeout=${TIMEOUT:-300}
outdir=${OUTDIR:-$(mktemp -d "${TMPDIR:-/tmp}/bench-loopback.XXXXXX")} || exit 2
mkdir -p "$outdir" || exit 2

np=4
minb=1024
maxb=268435456
small="-b 1K -e 16M -f 2 -n 20 -w 5"
large="-b 32M -e 256M -f 2 -n 10 -w 2"
common="-d float -o sum -c 1 -T $timeout"
mpirun_common="$mpirun --allow-run-as-root --oversubscribe -np $np"

status=0

# run NAME COMMAND...: runs one measurement, appends its table to
# $outdir/NAME.txt and its command line to $outdir/commands.txt.
run() {
  name=$1
  shift
  echo "$*" >>"$outdir/commands.txt"
  echo "+ $*" >&2
  "$@" >>"$outdir/$name.txt" 2>>"$outdir/$name.err"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "$0: $name: exit status $rc; its messages:" >&2
    sed 's/^/    /' "$outdir/$name.err" >&2
    status=1
  fi
}

: >"$outdir/commands.txt"
for f in geoccl ompi-tcp ompi-vader; do
  : >"$outdir/$f.txt"
  : >"$outdir/$f.err"
done

echo "# bench_loopback.sh, $(date -u '+%F %T') UTC, $(nproc) cores," \
  "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
echo "# raw outputs in $outdir"

# The three runs alternate per size range, so that slow phases of a shared
# machine fall on all of them alike.
for range in "$small" "$large"; do
  # shellcheck disable=SC2086 # the option strings are meant to split
  run geoccl env GEOCCL_SOCKET_IFNAME=lo "$geoccl" -N $np $range $common
  # shellcheck disable=SC2086
  run ompi-tcp $mpirun_common --mca btl tcp,self --mca btl_tcp_if_include lo \
    "$mpiperf" $range $common
  # shellcheck disable=SC2086
  run ompi-vader $mpirun_common "$mpiperf" $range $common
done

for f in geoccl ompi-tcp ompi-vader; do
  echo
  echo "## $f"
  cat "$outdir/$f.txt"
done

echo
echo "All-reduce, float sum, $np processes on one machine; out-of-place time per"
echo "call (average over iterations, maximum over ranks) and bus bandwidth."
echo "ratio > 1: GeoCCL is faster than Open MPI over TCP."
echo
awk -v minb=$minb -v maxb=$maxb '
  FNR == 1 { f = FILENAME == ARGV[1] ? 1 : FILENAME == ARGV[2] ? 2 : 3 }
  /^#/ || NF < 13 { next }
  {
    t[f, $1] = $6; b[f, $1] = $8
    bad[f] += $9 + $13
  }
  function human(s) {
    if (s >= 1048576) return (s / 1048576) " MiB"
    return (s / 1024) " KiB"
  }
  function cell(f, s, a) {
    return ((f, s) in a) ? a[f, s] : "-"
  }
  END {
    print "| size | GeoCCL time (us) | GeoCCL busbw (GB/s) | Open MPI tcp time (us) |" \
          " Open MPI tcp busbw (GB/s) | time(OMPI tcp) / time(GeoCCL) |" \
          " Open MPI vader time (us) | Open MPI vader busbw (GB/s) |"
    print "|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (s = minb; s <= maxb; s *= 2) {
      ratio = "-"
      if (((1, s) in t) && ((2, s) in t) && t[1, s] > 0)
        ratio = sprintf("%.2f", t[2, s] / t[1, s])
      printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", human(s),
             cell(1, s, t), cell(1, s, b), cell(2, s, t), cell(2, s, b), ratio,
             cell(3, s, t), cell(3, s, b)
    }
    split("GeoCCL,Open MPI tcp,Open MPI vader", names, ",")
    for (i = 1; i <= 3; i++)
      if (bad[i] > 0)
        printf "\n%s: %d wrong or out-of-bounds elements (see its table)\n", names[i], bad[i]
  }
' "$outdir/geoccl.txt" "$outdir/ompi-tcp.txt" "$outdir/ompi-vader.txt"

if grep -q '^# Wrong values.*FAILED\|^# Out of bounds values.*FAILED' \
     "$outdir/geoccl.txt" "$outdir/ompi-tcp.txt" "$outdir/ompi-vader.txt"; then
  status=1
fi
exit $status
