#!/usr/bin/env bash
# bench_wan.sh: GeoCCL's hierarchical all-reduce against the alternatives on
# the same emulated WAN links (tools/geoccl-wan), side by side in one
# run. Needs root (network namespaces, tc).
#
#   sudo tests/perf/bench_wan.sh [options] BUILDDIR
#
# BUILDDIR holds geoccl-perf and tests/perf/mpi-allreduce-perf (configure
# with MPI found) and, optionally, gloo-allreduce-perf (built there with
# tests/perf/gloo/build.sh when missing and Gloo is installed).
#
# For every configuration (topology x rate) the script brings the emulated
# WAN up once (R regions, the rate on every region's egress, the same
# one-way delay everywhere), runs everything below back to back, then takes
# the WAN down again (also on failure or Ctrl-C: a trap always runs
# `geoccl-wan down`). All ranks run in their region's namespace; rank r is
# in region r / P (region order, so a ring in rank order crosses each region
# boundary once). Float sum all-reduce, every result checked (-c 1):
#
#   hier         GeoCCL, default algorithm: hierarchical with > 1 region
#                (its frames between regions encrypted: the default)
#   hierclear    the same with GEOCCL_ENCRYPT=off: what encryption costs
#   hiereq       the same with GEOCCL_HIER_SHARES=equal: what the shares by
#                WAN rate gain on uneven links
#   hiercubic    the same with GEOCCL_WAN_CC=cubic between regions: what the
#                automatic choice (GEOCCL_WAN_CC=auto) gains or loses
#   hiernopace   the same with GEOCCL_WAN_PACE=0: what pacing gains (into a
#                slow downlink where the probe finds one; each connection at
#                its share of its region's uplink, with BBR restarted before
#                its PROBE_RTT, in calls of 0.5 s or more of the uplink)
#   flat         GeoCCL, GEOCCL_ALGO=flat (one ring over all ranks)
#   ompi         Open MPI MPI_Allreduce, default (tuned) decision
#   ompiring     Open MPI, ring forced: --mca coll_tuned_use_dynamic_rules 1
#                --mca coll_tuned_allreduce_algorithm 4
#   gloochunked  Gloo AllreduceRingChunked (bandwidth-optimal ring)
#   gloo         Gloo AllreduceRing: not bandwidth-optimal, every rank sends
#                (P-1) x size, so it only runs up to --gloo-ring-max
#   hierint8     GeoCCL hierarchical with GEOCCL_COMPRESS=int8 (error
#                feedback on, the default) on --data gauss; -c 1 holds every
#                result to int8's error bound (the table gives the largest
#                error and the bound)
#   hierlossless GeoCCL hierarchical with GEOCCL_COMPRESS=lossless on --data
#                gauss (gradient-like mantissas: the pattern data would
#                compress some 35x, no gradient does)
#   hierauto     GeoCCL hierarchical with GEOCCL_COMPRESS=auto on --data gauss:
#                the plan picks none or lossless per size and, on uneven
#                links, per sending region (compressing only where it pays)
#   tcpstep      no collective: tests/perf/tcp_alone.py moves the bytes each
#                rank pair carries in the hierarchical all-reduce (equal
#                shares; equal ranks per region only) over one TCP connection
#                per pair (BBR, or --cc), every byte in memory when an
#                iteration starts, and no iteration starting anywhere before
#                every rank has all its bytes: stricter than an all-reduce,
#                whose ranks start a call once their own last one is done
#   tcpfree      the same without the step: each rank starts its next
#                iteration once its own bytes are in (iterations overlap
#                more than all-reduce calls can); the two bracket what the
#                transport itself gives an all-reduce on these links
#   hierbase     GeoCCL hierarchical from another build (GEOCCL_BASE_BUILD,
#                e.g. of an earlier commit): what a change costs or gains,
#                on the same links in the same run
# These, hierclear, hiereq, hiercubic, hiernopace, tcpstep and tcpfree are not in the default --algos (each is one more run per
# configuration); ask for them with e.g. -a hier,hierint8,hierlossless.
#
# Sizes below --big run in one invocation per tool (-n ITERS -w WARMUP); the
# sizes from --big up run in a second one (-n BIG_ITERS -w BIG_WARMUP). The
# two size groups alternate over the tools, so a slow phase of the shared
# machine falls on all of them alike.
#
# Options (lists are comma-separated):
#   -t, --topos LIST       topologies RxP (R regions x P ranks each);
#                          default 3x2,2x4
#   -r, --rates LIST       egress rate per region, tc units; default 100mbit,1gbit;
#                          an entry of R rates joined by '/' (100mbit/1gbit/1gbit)
#                          gives each region its own (uneven links; the bound is
#                          then the uneven one, see Output)
#   -d, --delay D          one-way delay per region (default 25ms)
#   --cc ALGO              TCP congestion control inside the regions, for every
#                          tool (geoccl-wan up --cc; default: the host's)
#   --mtu BYTES            MTU between regions (geoccl-wan up --mtu; default 1500)
#   -p, --paths LIST       path conditions, ';'-separated, each a list of
#                          geoccl-wan up options: e.g. "--loss 0.1 --seed 1"
#                          or "--jitter 10 --reorder"; "" (the default) is a
#                          clean path; every topology x rate runs each
#   -s, --sizes MIN-MAX    size range in MiB, stepped by -f (default 1-256)
#   -f, --factor N         size step factor (default 4)
#   -a, --algos LIST       what to run (default hier,flat,ompi,ompiring,gloochunked,gloo)
#   --big MIB              first size of the second group (default 64)
#   --iters N, --warmup N  iterations below --big (default 2 and 1)
#   --big-iters N, --big-warmup N   at --big and above (default 1 and 1)
#   --slow-min MIB, --slow-algos LIST
#                          at rates below 1 Gbit/s, sizes >= --slow-min
#                          (default 256) run only for the algorithms in
#                          --slow-algos (default hier,ompiring; "all" = every
#                          one): the others skip them to keep the run short
#   --gloo-ring-max MIB    largest size for Gloo's plain ring (default 16
#                          below 1 Gbit/s, 64 from 1 Gbit/s up)
#   -n, --name NAME        name of the emulated WAN (default gbench)
#   -o, --outdir DIR       raw outputs (default: a new directory in /tmp)
#   --port N               first bootstrap port (default 29600; +1 per run)
#   --wait-max S           how long to wait for someone else's WAN to go
#                          down before each `up` (default 3600; polls every 20 s)
#   --report DIR           print the tables of an earlier run again from its
#                          raw outputs (DIR = its outdir); needs no WAN
#   -h, --help
#
# Environment: MPIRUN (default mpirun), GEOCCL_WAN (default: the
# geoccl-wan of this source tree), GLOO_PERF (a built gloo-allreduce-perf),
# GEOCCL_BASE_BUILD (the build whose geoccl-perf hierbase runs).
#
# Output: per configuration, a markdown table (times are the out-of-place
# average per call, maximum over ranks, as rank 0 prints it; tcpstep and
# tcpfree: rank 0's own average; in-place times are in the raw tables), the bound 2(R-1)/R x bytes / (rate/8) (uneven rates E_q, each the
# lower of a region's egress and an --ingress-rate(s) path option: the least
# over splits of max_q (1 + (R-2) f_q) x bytes / E_q, which the hierarchical
# all-reduce's shares reach; with one rate it is the same formula), the same bound at the TCP
# goodput the emulated link delivers (0.965 x rate: tbf counts IP bytes, TCP
# carries 1448 of every 1500), GeoCCL's WAN bytes per rank, and what the
# machine did meanwhile: CPU use (from /proc/stat, sampled every second),
# per-region egress through the shaper (tc counters) against the rate
# (the delay lines' own counters, and top every 15 s, are in
# OUTDIR/CONFIG/machine.txt and top.txt). A configuration where no region
# got to 80% of its rate while the CPUs were at least 90% busy is flagged
# CPU-bound: its times measure the emulator, not the algorithms.
#
# Exit status: 0 everything ran and every result was right; 1 some run
# failed or timed out (its cells show "-"; its messages are in OUTDIR) or
# found wrong results (the time is marked "(wrong)"); 2 bad arguments or
# missing tools; 77 cannot emulate a WAN here.
set -uo pipefail
# The ranks bootstrap at GEOCCL_COMM_ID across regions, where traffic is
# encrypted: they share a random 256-bit key for this run.
export GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}

PROG=${0##*/}
SRCDIR=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)

usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$(readlink -f "$0")"; }
die() { echo "$PROG: $*" >&2; exit 2; }

topos=3x2,2x4
rates=100mbit,1gbit
delay=25ms
sizes=1-256
factor=4
algos=hier,flat,ompi,ompiring,gloochunked,gloo
big=64
iters=2 warmup=1 big_iters=1 big_warmup=1
slow_algos=hier,ompiring
slow_min=256
gloo_ring_max=
wname=gbench
cc=
mtu=1500
paths=("")
outdir=
port=29600
wait_max=3600
builddir=
report_dir=

while [ $# -gt 0 ]; do
  case $1 in
    -t|--topos) topos=${2:?}; shift 2;;
    -r|--rates) rates=${2:?}; shift 2;;
    -d|--delay) delay=${2:?}; shift 2;;
    --cc) cc=${2:?}; shift 2;;
    --mtu) mtu=${2:?}; shift 2;;
    -p|--paths) IFS=';' read -r -a paths <<< "${2?}"; [ ${#paths[@]} -gt 0 ] || paths=(""); shift 2;;
    -s|--sizes) sizes=${2:?}; shift 2;;
    -f|--factor) factor=${2:?}; shift 2;;
    -a|--algos) algos=${2:?}; shift 2;;
    --big) big=${2:?}; shift 2;;
    --iters) iters=${2:?}; shift 2;;
    --warmup) warmup=${2:?}; shift 2;;
    --big-iters) big_iters=${2:?}; shift 2;;
    --big-warmup) big_warmup=${2:?}; shift 2;;
    --slow-algos) slow_algos=${2:?}; shift 2;;
    --slow-min) slow_min=${2:?}; shift 2;;
    --gloo-ring-max) gloo_ring_max=${2:?}; shift 2;;
    -n|--name) wname=${2:?}; shift 2;;
    -o|--outdir) outdir=${2:?}; shift 2;;
    --port) port=${2:?}; shift 2;;
    --wait-max) wait_max=${2:?}; shift 2;;
    --report) report_dir=${2:?}; shift 2;;
    -h|--help) usage; exit 0;;
    -*) die "unknown option '$1' (see --help)";;
    *) [ -z "$builddir" ] || die "one build directory only"; builddir=$1; shift;;
  esac
done
[ -n "$builddir" ] || [ -n "$report_dir" ] || { usage >&2; exit 2; }
[[ $sizes =~ ^([0-9]+)-([0-9]+)$ ]] || die "--sizes $sizes: want MIN-MAX in MiB"
smin=${BASH_REMATCH[1]} smax=${BASH_REMATCH[2]}
for v in "$smin" "$smax" "$factor" "$big" "$iters" "$warmup" "$big_iters" "$big_warmup" "$port" "$wait_max" "$slow_min"; do
  [[ $v =~ ^[0-9]+$ ]] || die "'$v': want a non-negative integer"
done
if [ "$smin" -lt 1 ] || [ "$smax" -lt "$smin" ] || [ "$factor" -lt 2 ]; then
  die "bad size range or factor"
fi
[[ $wname =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "--name $wname: 1..8 lower-case letters or digits"
for a in ${algos//,/ }; do
  case $a in hier|hierclear|hiereq|hiercubic|hiernopace|hierbase|flat|hierint8|hierlossless|hierauto|ompi|ompiring|gloochunked|gloo|tcpstep|tcpfree) ;; *) die "unknown algorithm '$a'";; esac
done

# The markdown table and the notes for one configuration.
report() {
  local bps=$1 bpsl=${2:-$1}
  echo
  echo "### $R regions x $P ranks ($N ranks), $rate per region, $delay one-way, TCP ${cc:-of the host}$([ "${mtu:-1500}" = 1500 ] || echo ", MTU $mtu")${path:+, path: $path}"
  echo
  awk -v R="$R" -v P="$P" -v bps="$bps" -v bpsl="$bpsl" -v dir="$cdir" -v sizes="${size_list[*]}" '
    function load(kind,   f, line, a, n, grp) {
      for (grp = 0; grp < 2; grp++) {
        f = dir "/" kind "." (grp ? "big" : "small") ".out"
        while ((getline line < f) > 0) {
          if (line ~ /^#/) continue
          n = split(line, a, " ")
          if (n < 9 || a[1] !~ /^[0-9]+$/) continue
          T[kind, a[1]] = a[6] / 1e6
          W[kind, a[1]] = a[9] + (n >= 13 ? a[13] : 0)
          if (n >= 14) WAN[kind, a[1]] = a[14]
        }
        close(f)
        # geoccl-perf -c 1 with a lossy codec: "#  SIZE  int8 bound: max abs err E ... bound B ..."
        f = dir "/" kind "." (grp ? "big" : "small") ".out"
        while ((getline line < f) > 0) {
          if (line !~ / bound: max abs err /) continue
          n = split(line, a, " ")
          for (i = 1; i < n; i++) {
            if (a[i] == "err" && a[i - 1] == "abs") ERR[kind, a[2]] = a[i + 1]
            if (a[i] == "bound" && a[i + 1] ~ /^[0-9.e+-]+$/) BND[kind, a[2]] = a[i + 1]
          }
        }
        close(f)
      }
    }
    function cell(kind, s) {
      if (!((kind, s) in T)) return "-"
      if (W[kind, s] != 0) return sprintf("%.3f (wrong)", T[kind, s])
      return sprintf("%.3f", T[kind, s])
    }
    function ratio(a, b) { return b > 0 ? sprintf("%.2f", a / b) : "-" }
    # seconds per byte of the all-reduce bound over regions with egress E[q]
    # bytes/s: the least over shares f of max_q (1 + (R-2) f_q) / E_q
    function bound_per_byte(   q, lo, hi, mid, sum, it, c) {
      lo = 0; hi = 0; c = R - 2
      for (q = 1; q <= R; q++) {
        if (1 / E[q] > lo) lo = 1 / E[q]
        if ((1 + c / R) / E[q] > hi) hi = (1 + c / R) / E[q]
      }
      if (c == 0) return lo
      for (it = 0; it < 100; it++) {
        mid = (lo + hi) / 2; sum = 0
        for (q = 1; q <= R; q++) if (mid * E[q] > 1) sum += (mid * E[q] - 1) / c
        if (sum >= 1) hi = mid; else lo = mid
      }
      return hi
    }
    BEGIN {
      ne = split(bpsl, E, " ")
      for (q = 1; q <= R; q++) E[q] = (q <= ne ? E[q] : E[ne]) / 8
      bpb = bound_per_byte()
      nk = split("hier hierclear hiereq hiercubic hiernopace hierbase flat hierint8 hierlossless hierauto ompi ompiring gloochunked gloo tcpstep tcpfree", kinds, " ")
      for (k = 1; k <= nk; k++) load(kinds[k])
      print "| size | bound (s) | bound at TCP goodput (s) | GeoCCL hier (s) | hier / bound | hier / goodput bound | GeoCCL hier, GEOCCL_ENCRYPT=off (s) | hier / hier off | GeoCCL hier, equal shares (s) | GeoCCL hier, cubic (s) | GeoCCL hier, GEOCCL_WAN_PACE=0 (s) | GeoCCL hier, base build (s) | hier / base | GeoCCL flat (s) | GeoCCL hier int8 (s) | GeoCCL hier lossless (s) | GeoCCL hier auto (s) | OMPI default (s) | OMPI ring (s) | Gloo ring_chunked (s) | Gloo ring (s) | hier speedup over OMPI ring | hier speedup over OMPI default | WAN B/rank hier | WAN B/rank flat | WAN B/rank hier int8 | WAN B/rank hier lossless | WAN B/rank hier auto | int8 max error / bound | TCP alone, in step (s) | TCP alone, no step (s) | hier / TCP in step |"
      print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      n = split(sizes, sz, " ")
      for (i = 1; i <= n; i++) {
        s = sz[i] * 1048576
        bound = bpb * s
        gbound = bound / 0.965
        h = ((("hier", s) in T)) ? T["hier", s] : 0
        printf "| %d MiB | %.3f | %.3f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
          sz[i], bound, gbound, cell("hier", s),
          h ? ratio(h, bound) : "-", h ? ratio(h, gbound) : "-",
          cell("hierclear", s), (h && (("hierclear", s) in T)) ? ratio(h, T["hierclear", s]) : "-",
          cell("hiereq", s), cell("hiercubic", s), cell("hiernopace", s),
          cell("hierbase", s), (h && (("hierbase", s) in T)) ? ratio(h, T["hierbase", s]) : "-",
          cell("flat", s), cell("hierint8", s), cell("hierlossless", s), cell("hierauto", s),
          cell("ompi", s), cell("ompiring", s), cell("gloochunked", s), cell("gloo", s),
          (h && (("ompiring", s) in T)) ? ratio(T["ompiring", s], h) : "-",
          (h && (("ompi", s) in T)) ? ratio(T["ompi", s], h) : "-",
          (("hier", s) in WAN) ? WAN["hier", s] : "-", (("flat", s) in WAN) ? WAN["flat", s] : "-",
          (("hierint8", s) in WAN) ? WAN["hierint8", s] : "-",
          (("hierlossless", s) in WAN) ? WAN["hierlossless", s] : "-",
          (("hierauto", s) in WAN) ? WAN["hierauto", s] : "-",
          (("hierint8", s) in ERR) ? ERR["hierint8", s] " / " BND["hierint8", s] : "-",
          cell("tcpstep", s), cell("tcpfree", s),
          (h && (("tcpstep", s) in T)) ? ratio(h, T["tcpstep", s]) : "-"
      }
    }'
  echo
  # What the machine did during each run: CPU (2 decimals of the whole
  # machine), load, and per region the average egress through the shaper
  # over the run and the best 10-second egress (samples are about a second
  # apart, taken one region after the other, so shorter windows jitter on a
  # loaded machine), against the rate; overlimits
  # count packets the shaper held back (0: the link was never the limit).
  echo "Machine during the runs ($(nproc) cores; CPU busy = user+system+irq over all cores, steal separate):"
  echo
  echo "| run | wall (s) | CPU busy | steal | load (max) | per-region egress: average / best 10 s (Mbit/s) | shaper overlimits |"
  echo "|---|---:|---:|---:|---:|---|---:|"
  awk -v R="$R" -v mon="$cdir/monitor.txt" -v bps="$bps" '
    BEGIN {
      ns = 0; top = 0; topname = ""; nbig = 0; bigcpu = 0
      while ((getline line < mon) > 0) {
        split(line, a, " ")
        ns++; t[ns] = a[1]; busy[ns] = a[2]; idle[ns] = a[3]; steal[ns] = a[4]; ld[ns] = a[5]
        for (i = 0; i < R; i++) { sent[ns, i] = a[6 + 2 * i]; over[ns, i] = a[7 + 2 * i] }
      }
    }
    {
      name = $1; t0 = $2; t1 = $3
      first = 0; last = 0; mx = 0
      for (j = 1; j <= ns; j++) if (t[j] >= t0 && t[j] <= t1) { if (!first) first = j; last = j }
      if (!first || last - first < 1) { printf "| %s | %.1f | - | - | - | - | - |\n", name, t1 - t0; next }
      db = busy[last] - busy[first]; di = idle[last] - idle[first]; dst = steal[last] - steal[first]
      tot = db + di + dst
      for (j = first; j <= last; j++) if (ld[j] > mx) mx = ld[j]
      eg = ""; ov = 0
      for (i = 0; i < R; i++) {
        avg = (sent[last, i] - sent[first, i]) * 8 / (t[last] - t[first]) / 1e6
        best = -1
        for (j = first + 10; j <= last; j++) {
          r = (sent[j, i] - sent[j - 10, i]) * 8 / (t[j] - t[j - 10]) / 1e6
          if (r > best) best = r
        }
        if ((best < 0 ? avg : best) > top) { top = best < 0 ? avg : best; topname = name }
        eg = eg sprintf("%sr%d %.0f / %s", i ? ", " : "", i, avg, best < 0 ? "-" : sprintf("%.0f", best))
        ov += over[last, i] - over[first, i]
      }
      pb = tot > 0 ? 100 * db / tot : 0
      ps = tot > 0 ? 100 * dst / tot : 0
      printf "| %s | %.1f | %.0f%% | %.0f%% | %.2f | %s | %d |\n", name, t1 - t0, pb, ps, mx, eg, ov
      if (last - first >= 10) { nbig++; bigcpu += pb }
    }
    END {
      # The verdict: did any region ever get near its rate?
      rate = bps / 1e6
      printf "\nBest egress of any region in any run: %.0f Mbit/s (%s), %.0f%% of the rate", top, topname, 100 * top / rate
      if (nbig) printf "; CPU busy %.0f%% on average over the runs of 10 s or more", bigcpu / nbig
      if (!nbig)
        print ".\nRuns too short (under 10 s) to say what limited them."
      else if (top < 0.8 * rate && bigcpu / nbig >= 90)
        print ".\n**CPU-bound:** no region reached 80% of its rate while the machine was busy; these times measure the emulator and the CPUs, not the algorithms."
      else if (top < 0.8 * rate)
        print ".\nNo region reached 80% of its rate, but the CPUs were not saturated either: latency-bound or a slow algorithm."
      else
        print ".\nLink-bound: the shapers were the limit."
    }' "$cdir/runs.txt"
  echo
}

# --report: the tables of an earlier run, from its raw outputs.
if [ -n "$report_dir" ]; then
  [ -d "$report_dir" ] || die "$report_dir: no such directory"
  found=0
  for cdir in "$report_dir"/*/; do
    cdir=${cdir%/}
    [ -f "$cdir/config" ] || continue
    R='' P='' rate='' bps='' bpsl='' delay='' sizes='' cc='' mtu=1500 path=''
    # shellcheck disable=SC1091 # written by this script
    . "$cdir/config"
    read -r -a size_list <<< "$sizes"
    N=$((R * P))
    report "$bps" "${bpsl:-$bps}"
    found=1
  done
  [ "$found" = 1 ] || die "$report_dir: no configuration directories (with a config file) in it"
  exit 0
fi
builddir=$(cd "$builddir" 2>/dev/null && pwd) || die "$builddir: no such directory"
wan=${GEOCCL_WAN:-$SRCDIR/tools/geoccl-wan}
geoperf=$builddir/geoccl-perf
mpiperf=$builddir/tests/perf/mpi-allreduce-perf
tcpalone=$SRCDIR/tests/perf/tcp_alone.py
mpirun=${MPIRUN:-mpirun}
[ -x "$wan" ] || die "$wan: not an executable"
[ -x "$geoperf" ] || die "$geoperf: not built"
[ "$(id -u)" = 0 ] || { echo "$PROG: must run as root (the emulated WAN needs it)" >&2; exit 77; }
has() { [[ ,$algos, == *,$1,* ]]; }
if has hierbase; then
  [ -x "${GEOCCL_BASE_BUILD:-}/geoccl-perf" ] ||
    die "hierbase: GEOCCL_BASE_BUILD=${GEOCCL_BASE_BUILD:-} holds no built geoccl-perf"
  GEOCCL_BASE_BUILD=$(cd "$GEOCCL_BASE_BUILD" && pwd)
fi
if has ompi || has ompiring; then
  [ -x "$mpiperf" ] || die "$mpiperf: not built (configure found no MPI?); or leave out ompi,ompiring with -a"
  command -v "$mpirun" >/dev/null 2>&1 || die "$mpirun not found"
fi
outdir=${outdir:-$(mktemp -d /tmp/bench-wan.XXXXXX)} || exit 2
mkdir -p "$outdir" || exit 2
outdir=$(cd "$outdir" && pwd)
gloo=${GLOO_PERF:-$builddir/gloo-allreduce-perf}
if has gloo || has gloochunked; then
  if [ ! -x "$gloo" ]; then
    "$SRCDIR/tests/perf/gloo/build.sh" "$gloo" >"$outdir/gloo-build.log" 2>&1
    if [ ! -x "$gloo" ]; then
      echo "$PROG: Gloo benchmark not built (see $outdir/gloo-build.log); Gloo columns skipped" >&2
      algos=$(echo ",$algos," | sed 's/,gloochunked,/,/; s/,gloo,/,/; s/^,//; s/,$//')
    fi
  fi
fi

MiB=1048576
size_list=()
for ((s = smin; s <= smax; s *= factor)); do size_list+=("$s"); done
small_list=() big_list=()
for s in "${size_list[@]}"; do
  if [ "$s" -lt "$big" ]; then small_list+=("$s"); else big_list+=("$s"); fi
done

status=0
bg_pids=()
monitor_pid=
wan_up=0

# shellcheck disable=SC2317 # run by the trap
cleanup() {
  local p
  [ -n "$monitor_pid" ] && kill "$monitor_pid" 2>/dev/null
  for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; done
  if [ "$wan_up" = 1 ]; then
    "$wan" down -n "$wname" -q
    wan_up=0
  fi
}
trap cleanup EXIT
trap 'echo "$PROG: interrupted" >&2; exit 130' INT
trap 'echo "$PROG: terminated" >&2; exit 143' TERM HUP

log() { echo "[$(date -u +%T)] $*" >&2; }

# rate in tc units -> bits per second
rate_bps() {
  awk -v v="${1,,}" 'BEGIN {
    if (match(v, /^[0-9.]+/) == 0) exit 1
    n = substr(v, 1, RLENGTH); u = substr(v, RLENGTH + 1)
    f = u == "bit" ? 1 : u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : u == "gbit" ? 1e9 : 0
    if (f == 0) exit 1
    printf "%.0f\n", n * f }'
}
# "r1/r2/..." -> "bps1 bps2 ..."; one rate -> R copies of it
rate_list_bps() {  # RATE R
  local parts=() out=() p
  IFS=/ read -r -a parts <<< "$1"
  if [ "${#parts[@]}" = 1 ]; then
    for ((p = 0; p < $2; p++)); do parts[p]=$1; done
  fi
  [ "${#parts[@]}" = "$2" ] || return 1
  for p in "${parts[@]}"; do out+=("$(rate_bps "$p")") || return 1; done
  echo "${out[*]}"
}
# The rates the bound uses: each region's egress, or its ingress where a
# path option (--ingress-rate RATE, --ingress-rates R0,R1,..; "none" = no
# limit) makes that lower: the hierarchical all-reduce sends and receives the
# same bytes per region.  EGRESS_BPS R PATH
with_ingress() {
  local eg=() in=() q words=() i r
  read -r -a eg <<< "$1"
  read -r -a words <<< "$3"
  for ((i = 0; i < ${#words[@]}; i++)); do
    case ${words[i]} in
      --ingress-rate) for ((q = 0; q < $2; q++)); do in[q]=${words[i + 1]}; done;;
      --ingress-rates) IFS=, read -r -a in <<< "${words[i + 1]}";;
    esac
  done
  for ((q = 0; q < $2; q++)); do
    r=${in[q]:-none}
    if [ "$r" != none ]; then
      r=$(rate_bps "$r") || return 1
      [ "$r" -lt "${eg[q]}" ] && eg[q]=$r
    fi
  done
  echo "${eg[*]}"
}
for rt in ${rates//,/ }; do
  for r1 in ${rt//\// }; do rate_bps "$r1" >/dev/null || die "rate '$r1': want e.g. 100mbit, 1gbit"; done
done
for tp in ${topos//,/ }; do [[ $tp =~ ^[1-9][0-9]?x[1-9][0-9]?$ ]] || die "topology '$tp': want RxP"; done

# Someone else's WAN (any name) blocks ours: they share 10.231.0.0/24.
wan_busy() {
  "$wan" status 2>/dev/null | grep -q "region(s)" && return 0
  ip -o -4 addr show to 10.231.0.1/32 2>/dev/null | grep -q . && return 0
  return 1
}

wan_up_wait() {  # R RATE
  local waited=0 said=0
  while :; do
    if wan_busy; then
      if [ "$said" = 0 ]; then
        log "another emulated WAN is up; waiting for it (polling every 20 s):"
        "$wan" status 2>&1 | head -n 1 >&2
        said=1
      fi
      [ "$waited" -ge "$wait_max" ] && { echo "$PROG: waited $waited s for the WAN; giving up" >&2; return 1; }
      sleep 20
      waited=$((waited + 20))
      continue
    fi
    if "$wan" up -n "$wname" -r "$1" --rates "${2//\//,}" --delay "$delay" ${cc:+--cc "$cc"} --mtu "$mtu" $path -q 2>"$cdir/wan-up.err"; then
      wan_up=1
      log "waited $waited s for the WAN; '$wname' up: $1 regions, $2, $delay, TCP ${cc:-of the host}${path:+, path $path}"
      return 0
    fi
    local rc=$?
    [ "$rc" = 77 ] && { cat "$cdir/wan-up.err" >&2; exit 77; }
    # Lost a race with another up, or left over from an earlier run of ours.
    cat "$cdir/wan-up.err" >&2
    "$wan" down -n "$wname" -q
    [ "$waited" -ge "$wait_max" ] && return 1
    sleep 20
    waited=$((waited + 20))
  done
}

# Samples every second: time, CPU jiffies (busy, idle+iowait, steal), load,
# and per region the shaper's sent bytes and overlimits.
monitor() {  # R FILE TOPFILE
  local r=$1 f=$2 tf=$3 i line t k=0
  while :; do
    # who uses the CPUs (other jobs share this machine), every 15 s
    if [ $((k++ % 15)) = 7 ]; then
      { echo "== $(date -u +%T)"; top -bn1 -w 150 | sed -n '1,5p;7,18p'; } >> "$tf"
    fi
    t=$(date +%s.%N)
    read -r _ u n s idl iow irq sirq st _ < /proc/stat
    line="$t $((u + n + s + irq + sirq)) $((idl + iow)) $st $(cut -d' ' -f1 /proc/loadavg)"
    for ((i = 0; i < r; i++)); do
      line+=" $(tc -n "$wname-r$i" -s qdisc show dev dl0 2>/dev/null |
        awk '/Sent/ { gsub(/[,()]/, ""); s = $2; o = $9 } END { printf "%.0f %.0f", s, o }')"
    done
    echo "$line" >> "$f"
    sleep 1
  done
}

# run_ranks NAME TIMEOUT -- builds and starts one process per rank from
# the function rank_cmd, waits for all; rank 0's stdout is NAME.out.
run_ranks() {
  local name=$1 tmo=$2 r reg rc=0 pids=() t0 t1
  t0=$(date +%s.%N)
  for ((r = 0; r < N; r++)); do
    reg=$((r / P))
    local -a cmd
    rank_cmd "$r" "$reg"
    if [ "$r" = 0 ]; then
      timeout -k 10 "$tmo" "$wan" exec -n "$wname" -i "$reg" -- "${cmd[@]}" \
        >"$cdir/$name.out" 2>"$cdir/$name.r$r.err" &
    else
      timeout -k 10 "$tmo" "$wan" exec -n "$wname" -i "$reg" -- "${cmd[@]}" \
        >"$cdir/$name.r$r.out" 2>"$cdir/$name.r$r.err" &
    fi
    pids+=($!)
    bg_pids=("${pids[@]}")
  done
  for r in "${!pids[@]}"; do
    wait "${pids[$r]}" || { local e=$?; [ "$rc" = 0 ] && rc=$e; }
  done
  bg_pids=()
  t1=$(date +%s.%N)
  echo "$name $t0 $t1 $rc" >> "$cdir/runs.txt"
  return "$rc"
}

# one measurement: KIND (hier hierclear hiereq hiercubic hiernopace hierbase flat hierint8 hierlossless hierauto ompi ompiring gloochunked gloo tcpstep tcpfree) GROUP
# (small big) -b -e -n -w
measure() {
  local kind=$1 grp=$2 b=$3 e=$4 n=$5 w=$6 name rc
  name=$kind.$grp
  local nsz=0 s
  for ((s = b / MiB; s <= e / MiB; s *= factor)); do nsz=$((nsz + 1)); done
  # A size may take up to persize s (-T), the whole run that per size plus
  # start-up; generous, the tools' own watchdogs fire first.
  local persize=1800 tmo
  tmo=$((persize * nsz + 300))
  local args=(-b "$b" -e "$e" -f "$factor" -n "$n" -w "$w" -d float -o sum -c 1 -T "$persize")
  log "$cfg: $kind, $((b / MiB))-$((e / MiB)) MiB, -n $n -w $w"
  echo "$kind $grp: $(date -u +%T)" >> "$cdir/commands.txt"
  case $kind in
    hier|hierclear|hiereq|hiercubic|hiernopace|hierbase|flat|hierint8|hierlossless|hierauto)
      port=$((port + 1))
      local algoenv=()
      [ "$kind" = flat ] && algoenv=(GEOCCL_ALGO=flat)
      [ "$kind" = hierclear ] && algoenv=(GEOCCL_ENCRYPT=off)
      [ "$kind" = hiereq ] && algoenv=(GEOCCL_HIER_SHARES=equal)
      [ "$kind" = hiercubic ] && algoenv=(GEOCCL_WAN_CC=cubic)
      [ "$kind" = hiernopace ] && algoenv=(GEOCCL_WAN_PACE=0)
      # compressed: gradient-like data, so that lossless meets realistic
      # mantissas and int8's check runs on the values it is meant for
      [ "$kind" = hierint8 ] && algoenv=(GEOCCL_COMPRESS=int8) && args+=(--data gauss)
      [ "$kind" = hierlossless ] && algoenv=(GEOCCL_COMPRESS=lossless) && args+=(--data gauss)
      [ "$kind" = hierauto ] && algoenv=(GEOCCL_COMPRESS=auto) && args+=(--data gauss)
      local perfbin=$geoperf
      [ "$kind" = hierbase ] && perfbin=$GEOCCL_BASE_BUILD/geoccl-perf
      rank_cmd() {
        cmd=(env RANK="$1" NRANKS="$N" GEOCCL_COMM_ID="10.231.0.10:$port" "${algoenv[@]}"
             GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=INIT "$perfbin" "${args[@]}")
      }
      echo "  rank r: $wan exec -n $wname -i REGION(r) -- env RANK=r NRANKS=$N GEOCCL_COMM_ID=10.231.0.10:$port GEOCCL_COMM_SECRET=(the same 64 hex digits) ${algoenv[*]} GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=INIT $perfbin ${args[*]}" >> "$cdir/commands.txt"
      run_ranks "$name" "$tmo"; rc=$?
      ;;
    gloo|gloochunked)
      local algo=ring
      [ "$kind" = gloochunked ] && algo=ring_chunked
      local prefix=$cfg-$name-$$-$RANDOM
      rank_cmd() {
        cmd=("$gloo" --rank "$1" --size "$N" --store "$outdir/gstore" --prefix "$prefix"
             --host "10.231.0.$((10 + $2))" --algo "$algo" "${args[@]}")
      }
      echo "  rank r: $wan exec -n $wname -i REGION(r) -- $gloo --rank r --size $N --store $outdir/gstore --prefix $prefix --host 10.231.0.(10+REGION) --algo $algo ${args[*]}" >> "$cdir/commands.txt"
      run_ranks "$name" "$tmo"; rc=$?
      ;;
    tcpstep|tcpfree)
      port=$((port + 1))
      local hosts="" i
      for ((i = 0; i < R; i++)); do hosts+="${hosts:+,}10.231.0.$((10 + i))"; done
      local -a topts=(--port $((27100 + (port % 50) * 64)))
      [ -n "$cc" ] && topts+=(--cc "$cc")
      [ "$kind" = tcpfree ] && topts+=(--no-sync)
      rank_cmd() {
        cmd=(python3 "$tcpalone" --rank "$1" --size "$N" --per-region "$P" --hosts "$hosts"
             "${topts[@]}" "${args[@]}")
      }
      echo "  rank r: $wan exec -n $wname -i REGION(r) -- python3 $tcpalone --rank r --size $N --per-region $P --hosts $hosts ${topts[*]} ${args[*]}" >> "$cdir/commands.txt"
      run_ranks "$name" "$tmo"; rc=$?
      ;;
    ompi|ompiring)
      local -a envs opts line
      mapfile -t envs < <("$wan" mpirun-args -n "$wname" --env | sed -n 's/^export //p')
      read -r -a opts <<< "$("$wan" mpirun-args -n "$wname")"
      line=(env "${envs[@]}" "$mpirun" "${opts[@]}" --oversubscribe --bind-to none)
      [ "$kind" = ompiring ] && line+=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4)
      local i
      for ((i = 0; i < R; i++)); do
        [ "$i" -gt 0 ] && line+=(:)
        line+=(-np "$P" "$wan" exec -n "$wname" -i "$i" -- "$mpiperf" "${args[@]}")
      done
      echo "  ${line[*]}" >> "$cdir/commands.txt"
      local t0 t1
      t0=$(date +%s.%N)
      timeout -k 10 "$tmo" "${line[@]}" >"$cdir/$name.out" 2>"$cdir/$name.err" &
      bg_pids=($!)
      wait "${bg_pids[0]}"; rc=$?
      bg_pids=()
      t1=$(date +%s.%N)
      echo "$name $t0 $t1 $rc" >> "$cdir/runs.txt"
      ;;
  esac
  if [ "$rc" != 0 ]; then
    log "$cfg: $kind ($grp) exit status $rc; see $cdir/$name.*"
    status=1
  fi
  grep -q 'Wrong values.*FAILED\|Out of bounds.*FAILED' "$cdir/$name.out" 2>/dev/null && status=1
  return 0
}

echo "# bench_wan.sh, $(date -u '+%F %T') UTC, $(nproc) cores," \
  "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
echo "# topologies $topos; rates $rates; delay $delay; TCP congestion control ${cc:-of the host ($(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null))}; sizes ${size_list[*]} MiB; MTU between regions $mtu;" \
  "-n $iters -w $warmup below $big MiB, -n $big_iters -w $big_warmup from $big MiB;" \
  "sizes >= $slow_min MiB below 1 Gbit/s only for: $slow_algos; algorithms: $algos"
echo "# raw outputs in $outdir"
t_start=$(date +%s)

for tp in ${topos//,/ }; do
  R=${tp%x*} P=${tp#*x} N=$((R * P))
  for rate in ${rates//,/ }; do
    for path in "${paths[@]}"; do
      bpsl=$(rate_list_bps "$rate" "$R") || die "rate '$rate': $R regions need 1 or $R rates"
      bpsl=$(with_ingress "$bpsl" "$R" "$path") || die "path '$path': bad ingress rate"
      # the fastest region's rate stands for the configuration where one is needed
      bps=$(tr ' ' '\n' <<< "$bpsl" | sort -n | tail -n 1)
      cfg=${tp}-${rate//\//-}${path:+-$(tr -c 'A-Za-z0-9.\n' '_' <<< "${path//--/}" | tr -s '_' | sed 's/^_//; s/_$//')}
      cdir=$outdir/$cfg
      mkdir -p "$cdir"
      : > "$cdir/runs.txt"
      : > "$cdir/monitor.txt"
      : > "$cdir/commands.txt"
      echo "R=$R P=$P rate=$rate bps=$bps bpsl='$bpsl' delay=$delay sizes='${size_list[*]}' cc='$cc' mtu=$mtu path='$path'" > "$cdir/config"
      wan_up_wait "$R" "$rate" || { status=1; continue; }
      {
        echo "== $cfg: $(date -u +%T) uptime: $(uptime)"
        "$wan" status -n "$wname"
      } >> "$cdir/machine.txt"
      monitor "$R" "$cdir/monitor.txt" "$cdir/top.txt" &
      monitor_pid=$!
      grm=${gloo_ring_max:-$([ "$bps" -lt 1000000000 ] && echo 16 || echo 64)}
      for grp in small big; do
        if [ "$grp" = small ]; then
          [ ${#small_list[@]} -gt 0 ] || continue
          b=$((small_list[0] * MiB)) e=$((small_list[${#small_list[@]} - 1] * MiB)) n=$iters w=$warmup
        else
          [ ${#big_list[@]} -gt 0 ] || continue
          b=$((big_list[0] * MiB)) e=$((big_list[${#big_list[@]} - 1] * MiB)) n=$big_iters w=$big_warmup
        fi
        for kind in hier hierclear hiereq hiercubic hiernopace hierbase flat hierint8 hierlossless hierauto ompi ompiring gloochunked gloo tcpstep tcpfree; do
          has "$kind" || continue
          ke=$e
          if [ "$bps" -lt 1000000000 ] && [ "$slow_algos" != all ] &&
             [[ ,$slow_algos, != *,$kind,* ]]; then
            # the largest size of this group below --slow-min, if any
            [ "$b" -ge $((slow_min * MiB)) ] && continue
            while [ "$ke" -ge $((slow_min * MiB)) ]; do ke=$((ke / factor)); done
            [ "$ke" -lt "$b" ] && continue
          fi
          if [ "$kind" = gloo ]; then
            [ "$b" -gt $((grm * MiB)) ] && continue
            while [ "$ke" -gt $((grm * MiB)) ]; do ke=$((ke / factor)); done
          fi
          measure "$kind" "$grp" "$b" "$ke" "$n" "$w"
        done
      done
      kill "$monitor_pid" 2>/dev/null; wait "$monitor_pid" 2>/dev/null; monitor_pid=
      # The delay lines' counters (packets, drops, lateness) into dlI.log.
      for ((i = 0; i < R; i++)); do
        pf=/run/geoccl-wan/$wname/dl$i.pid
        [ -f "$pf" ] && kill -USR1 "$(cat "$pf")" 2>/dev/null
      done
      sleep 1
      {
        echo "== $cfg end: $(date -u +%T) uptime: $(uptime)"
        "$wan" status -n "$wname"
        for ((i = 0; i < R; i++)); do
          echo "-- delay line r$i:"; tail -n 3 "/run/geoccl-wan/$wname/dl$i.log" 2>/dev/null
        done
      } >> "$cdir/machine.txt"
      "$wan" down -n "$wname" -q
      wan_up=0
      report "$bps" "$bpsl" | tee "$cdir/report.md"
      grep -h 'destroy:' "$cdir"/hier*.*.err "$cdir"/flat.*.err 2>/dev/null | sed 's/^/# /' > "$cdir/phases.txt"
      echo "# $cfg done at $(date -u +%T), $(( $(date +%s) - t_start )) s since start"
    done
  done
done
echo "# total $(( $(date +%s) - t_start )) s; raw outputs in $outdir"
exit "$status"
