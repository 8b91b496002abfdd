#!/usr/bin/env bash
# bench_codecs.sh: the codecs of GEOCCL_COMPRESS side by side, in one run on
# one emulated WAN (tools/geoccl-wan): a float sum all-reduce per
# codec with geoccl-perf, hierarchical (more than one region), every rank in
# its region's namespace. Needs root (network namespaces, tc).
#
#   sudo tests/perf/bench_codecs.sh [options] BUILDDIR
#
# BUILDDIR holds geoccl-perf, tests/unit/test_codec (make tests/unit/test_codec) and
# lib/.libs/libgeoccl.so (the helper below links it, with the source tree's
# include/).
#
# What runs, with the WAN up once (R regions x P ranks, rank r in region
# r / P, the same rate and one-way delay on every region's egress):
#
# 1. tests/unit/test_codec, once, for its CPU throughput lines (one thread, 64 MiB
#    of Gaussian floats: "codec X: encode Y GB/s decode Z GB/s ratio R").
# 2. Per codec: geoccl-perf -b SIZE -e SIZE -n ITERS -w WARMUP -d float
#    -o sum -c 0 with GEOCCL_COMPRESS=codec (-c 0: nothing but the timing;
#    -c 1 would check a lossy codec's result against its error bound).
#    geoccl-perf's input is its default pattern, small integers: element j
#    of rank r is (j + 3r) mod 201 as a float, the same 4 KiB tile
#    repeated; for the lossy codecs the size of the encoding does not
#    depend on the data (topk's is a fixed count). `lossless` runs on
#    --data gauss instead (normal values, a stream per rank): on the
#    pattern it compresses some 35x, which says nothing about gradients.
# 3. Per codec in --gauss-codecs (default none,lossless): the same
#    all-reduce on gradient-like input, from a small helper that this script
#    compiles (out-of-place, Gaussian floats, sd 1e-3, a different seed per
#    rank; time = average of ITERS calls after WARMUP, the maximum over
#    ranks; WAN bytes = most any rank sent between regions per call). Here
#    lossless meets random mantissas, its realistic case.
#
# The table: time (out-of-place average per call, maximum over ranks);
# speedup = time(none) / time; WAN bytes per rank (geoccl-perf's wan(B)/rank
# column: the most any rank sent to other regions per call); ratio =
# WAN bytes of none / WAN bytes of the codec; bound = 2(R-1)/R x SIZE /
# (rate/8), the time the region's egress needs for an uncompressed
# all-reduce; bound/ratio = that for the codec's bytes; time / (bound/ratio)
# (1 = at the link's limit; TCP payload alone makes it at least 1.036,
# because tbf counts IP bytes and TCP carries 1448 of every 1500). Also per
# run: CPU busy over the machine and the bytes through all regions' shapers
# over the whole run (geoccl-perf: WARMUP + ITERS calls out-of-place and as
# many in-place; helper: WARMUP + ITERS calls).
#
# Options:
#   -r R, -p P             regions, ranks per region (default 3, 2)
#   --rate RATE            egress rate per region, tc units (default 100mbit)
#   --delay D              one-way delay per region (default 25ms)
#   -s, --size SIZE        bytes per all-reduce, geoccl-perf units (default 64M)
#   -c, --codecs LIST      default none,lossless,fp16,bf16,int8,int4,sign,topk:0.01
#   --gauss-codecs LIST    codecs also run on Gaussian input (default
#                          none,lossless; "" = none of them)
#   --iters N, --warmup N  timed and untimed calls (default 2 and 1)
#   -n, --name NAME        name of the emulated WAN (default gcodec)
#   -o, --outdir DIR       raw outputs (default: a new directory in /tmp)
#   --port N               first bootstrap port (default 29700; +1 per run)
#   --wait-max S           how long to wait for someone else's WAN to go down
#                          (default 3600; polls every 20 s)
#   --no-codec-test        skip tests/unit/test_codec
#   --report DIR           print the tables of an earlier run again
#   -h, --help
#
# Exit status: 0 all ran; 1 a run failed or timed out; 2 bad arguments or
# missing tools; 77 cannot emulate a WAN here.
set -uo pipefail
# The ranks bootstrap at GEOCCL_COMM_ID across regions, where traffic is
# encrypted: they share a random 256-bit key for this run.
export GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}

PROG=${0##*/}
SRCDIR=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)

usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$(readlink -f "$0")"; }
die() { echo "$PROG: $*" >&2; exit 2; }
log() { echo "[$(date -u +%T)] $*" >&2; }

R=3 P=2 rate=100mbit delay=25ms size=64M
codecs=none,lossless,fp16,bf16,int8,int4,sign,topk:0.01
gauss_codecs=none,lossless
iters=2 warmup=1 wname=gcodec outdir='' port=29700 wait_max=3600
codec_test=1 builddir='' report_dir=''

while [ $# -gt 0 ]; do
  case $1 in
    -r) R=${2:?}; shift 2;;
    -p) P=${2:?}; shift 2;;
    --rate) rate=${2:?}; shift 2;;
    --delay) delay=${2:?}; shift 2;;
    -s|--size) size=${2:?}; shift 2;;
    -c|--codecs) codecs=${2:?}; shift 2;;
    --gauss-codecs) gauss_codecs=${2-}; shift 2;;
    --iters) iters=${2:?}; shift 2;;
    --warmup) warmup=${2:?}; shift 2;;
    -n|--name) wname=${2:?}; shift 2;;
    -o|--outdir) outdir=${2:?}; shift 2;;
    --port) port=${2:?}; shift 2;;
    --wait-max) wait_max=${2:?}; shift 2;;
    --no-codec-test) codec_test=0; shift;;
    --report) report_dir=${2:?}; shift 2;;
    -h|--help) usage; exit 0;;
    -*) die "unknown option '$1' (see --help)";;
    *) [ -z "$builddir" ] || die "one build directory only"; builddir=$1; shift;;
  esac
done

# The tables, from the raw outputs in $outdir.
report() {
  # shellcheck disable=SC1091 # written by this script
  . "$outdir/config"
  echo
  echo "### $R regions x $P ranks, $rate per region, $delay one-way, $size float sum"
  echo
  echo "geoccl-perf input: (j + 3r) mod 201 as float (small integers, a repeated 4 KiB tile)."
  echo "gauss rows: the helper's Gaussian input (sd 1e-3, a seed per rank): gradient-like, random mantissas."
  echo
  awk -v R="$R" -v bps="$bps" -v bytes="$bytes" -v dir="$outdir" -v list="$runs" '
    function num(x) { return x + 0 }
    BEGIN {
      n = split(list, runs, " ")
      for (i = 1; i <= n; i++) {
        k = runs[i]; f = dir "/" k ".out"; T[k] = ""; W[k] = ""
        while ((getline line < f) > 0) {
          if (line ~ /^#/) continue
          m = split(line, a, " ")
          if (k ~ /^gauss-/ && a[1] == "result") { T[k] = a[2] / 1e6; W[k] = a[3] }
          else if (k !~ /^gauss-/ && m >= 14 && a[1] == bytes) { T[k] = a[6] / 1e6; W[k] = a[14] }
        }
        close(f)
        f = dir "/" k ".mon"
        if ((getline line < f) > 0) MON[k] = line
        close(f)
      }
      bound = 2 * (R - 1) / R * bytes / (bps / 8)
      printf "bound 2(R-1)/R x bytes / rate = %.3f s (at TCP goodput, x 1500/1448: %.3f s)\n\n", bound, bound * 1500 / 1448
      print "| input | codec | time (s) | speedup vs none | WAN bytes/rank | ratio | bound / ratio (s) | time / (bound / ratio) | CPU busy | shaper bytes, all regions |"
      print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
      for (i = 1; i <= n; i++) {
        k = runs[i]
        input = k ~ /^gauss-/ ? "gauss" : "perf"
        codec = k; sub(/^(gauss|perf)-/, "", codec)
        base = input "-none"
        if (T[k] == "") { printf "| %s | %s | fail | - | - | - | - | - | - | - |\n", input, codec; continue }
        sp = (T[base] != "") ? sprintf("%.2f", T[base] / T[k]) : "-"
        ratio = (W[base] != "" && W[k] > 0) ? W[base] / W[k] : 0
        rs = ratio ? sprintf("%.2f", ratio) : "-"
        br = ratio ? bound / ratio : 0
        split(MON[k], mo, " ")
        printf "| %s | %s | %.3f | %s | %.0f | %s | %s | %s | %s | %s |\n", input, codec, T[k], sp, W[k], rs,
          br ? sprintf("%.3f", br) : "-", br ? sprintf("%.2f", T[k] / br) : "-",
          mo[1] != "" ? mo[1] "%" : "-", mo[2] != "" ? mo[2] : "-"
      }
    }'
  echo
  if grep -qs '^result .* .* .* .* .* ' "$outdir"/gauss-*.out; then
    echo "gauss rows, where the time goes (seconds per call, each the maximum over ranks, from geocclCommGetStats;"
    echo "the phases are pipelined over slices, so they need not add up to the total):"
    echo
    echo "| codec | total | intra-region reduce-scatter | waiting on inter-region messages | intra-region all-gather | codec (encode, decode) |"
    echo "|---|---:|---:|---:|---:|---:|"
    for k in $runs; do
      [[ $k == gauss-* ]] || continue
      awk -v c="${k#gauss-}" '$1 == "result" && NF >= 7 {
        printf "| %s | %.3f | %.3f | %.3f | %.3f | %.3f |\n", c, $2 / 1e6, $4, $5, $6, $7 }' "$outdir/$k.out"
    done
    echo
  fi
  if [ -s "$outdir/test_codec.out" ]; then
    echo "CPU codec throughput, one thread (tests/unit/test_codec: 64 MiB of Gaussian float32, best of 2; GB/s of float32 input):"
    echo
    echo "| codec | encode (GB/s) | decode (GB/s) | ratio on Gaussian data |"
    echo "|---|---:|---:|---:|"
    sed -n 's/^ *codec \(.*\): encode \([0-9.]*\) GB\/s decode \([0-9.]*\) GB\/s ratio \([0-9.]*\).*/| \1 | \2 | \3 | \4 |/p' \
      "$outdir/test_codec.out"
    echo
  fi
}

if [ -n "$report_dir" ]; then
  outdir=$(cd "$report_dir" 2>/dev/null && pwd) || die "$report_dir: no such directory"
  [ -f "$outdir/config" ] || die "$outdir: no config file (not an outdir of this script)"
  report
  exit 0
fi

[ -n "$builddir" ] || { usage >&2; exit 2; }
builddir=$(cd "$builddir" 2>/dev/null && pwd) || die "$builddir: no such directory"
for v in "$R" "$P" "$iters" "$warmup" "$port" "$wait_max"; do
  [[ $v =~ ^[0-9]+$ ]] || die "'$v': want a non-negative integer"
done
{ [ "$R" -ge 2 ] && [ "$P" -ge 1 ] && [ "$iters" -ge 1 ]; } || die "want -r >= 2, -p >= 1, --iters >= 1"
[[ $wname =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "--name $wname: 1..8 lower-case letters or digits"
bytes=$(awk -v s="$size" 'BEGIN {
  if (match(s, /^[0-9]+/) == 0) exit 1
  n = substr(s, 1, RLENGTH); u = toupper(substr(s, RLENGTH + 1))
  f = u == "" ? 1 : u == "K" ? 1024 : u == "M" ? 1048576 : u == "G" ? 1073741824 : 0
  if (f == 0) exit 1; printf "%.0f\n", n * f }') || die "--size $size: want e.g. 64M"
bps=$(awk -v v="${rate,,}" 'BEGIN {
  if (match(v, /^[0-9.]+/) == 0) exit 1
  n = substr(v, 1, RLENGTH); u = substr(v, RLENGTH + 1)
  f = u == "bit" ? 1 : u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : u == "gbit" ? 1e9 : 0
  if (f == 0) exit 1; printf "%.0f\n", n * f }') || die "--rate $rate: want e.g. 100mbit"

wan=${GEOCCL_WAN:-$SRCDIR/tools/geoccl-wan}
geoperf=$builddir/geoccl-perf
[ -x "$wan" ] || die "$wan: not an executable"
[ -x "$geoperf" ] || die "$geoperf: not built"
if [ "$codec_test" = 1 ] && [ ! -x "$builddir/tests/unit/test_codec" ]; then
  die "$builddir/tests/unit/test_codec: not built (make tests/unit/test_codec; or --no-codec-test)"
fi
[ "$(id -u)" = 0 ] || { echo "$PROG: must run as root (the emulated WAN needs it)" >&2; exit 77; }
outdir=${outdir:-$(mktemp -d /tmp/bench-codecs.XXXXXX)} || exit 2
mkdir -p "$outdir" || exit 2
outdir=$(cd "$outdir" && pwd)
N=$((R * P))

# ---- the Gaussian-input helper (compiled here, linked with BUILDDIR's library)
helper=
if [ -n "$gauss_codecs" ]; then
  cat > "$outdir/gauss_allreduce.c" <<'EOF'
/* One rank: ITERS timed out-of-place float sum all-reduces of COUNT
 * Gaussian floats (sd 1e-3, seeded by the rank) after WARMUP untimed ones.
 * Rank 0 prints "result <usec per call> <WAN bytes per call> <seconds per
 * call in: intra-region reduce-scatter, inter-region phase, intra-region
 * all-gather, codec>", each the maximum over ranks (geocclCommGetStats).
 * Env bootstrap: GEOCCL_COMM_ID, RANK, NRANKS. */
#include <geoccl.h>
#include <math.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) { \
  fprintf(stderr, "%s: %s: %s\n", #call, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
  exit(1); } } while (0)

static uint64_t rng;
static double uniform(void) /* (0, 1), xorshift64* */
{
  rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
  return ((rng * 2685821657736338717ull) >> 11) * 0x1.0p-53 + 0x1.0p-54;
}
static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
  if (argc != 4) { fprintf(stderr, "usage: %s BYTES ITERS WARMUP\n", argv[0]); return 2; }
  size_t count = strtoull(argv[1], NULL, 10) / sizeof(float);
  int iters = atoi(argv[2]), warmup = atoi(argv[3]);
  int rank = atoi(getenv("RANK")), nranks = atoi(getenv("NRANKS"));
  ncclUniqueId id;
  ncclComm_t comm;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  float *in = malloc(count * sizeof(float)), *out = malloc(count * sizeof(float));
  if (!in || !out) { fprintf(stderr, "out of memory\n"); return 1; }
  rng = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
  for (size_t i = 0; i + 1 < count; i += 2) { /* Box-Muller */
    double u = uniform(), v = uniform(), m = 1e-3 * sqrt(-2.0 * log(u));
    in[i] = (float)(m * cos(2 * M_PI * v));
    in[i + 1] = (float)(m * sin(2 * M_PI * v));
  }
  if (count % 2) in[count - 1] = 0.0f;
  for (size_t i = 0; i < count; i++) out[i] = 0.0f;
  int one = 1;
  for (int i = 0; i < warmup; i++)
    CHECK(ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, NULL));
  CHECK(ncclAllReduce(&one, &one, 1, ncclInt32, ncclSum, comm, NULL)); /* barrier (exact) */
  geocclStats s0, s1;
  CHECK(geocclCommGetStats(comm, &s0));
  double t0 = now();
  for (int i = 0; i < iters; i++)
    CHECK(ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, NULL));
  double r[6] = {(now() - t0) * 1e6 / iters, 0};
  CHECK(geocclCommGetStats(comm, &s1));
  r[1] = (double)(s1.bytesWan - s0.bytesWan) / iters;
  r[2] = (s1.secIntraReduceScatter - s0.secIntraReduceScatter) / iters;
  r[3] = (s1.secInter - s0.secInter) / iters;
  r[4] = (s1.secIntraAllGather - s0.secIntraAllGather) / iters;
  r[5] = (s1.secCodec - s0.secCodec) / iters;
  CHECK(ncclAllReduce(r, r, 6, ncclDouble, ncclMax, comm, NULL)); /* max: exact */
  if (rank == 0)
    printf("result %.2f %.0f %.4f %.4f %.4f %.4f\n", r[0], r[1], r[2], r[3], r[4], r[5]);
  CHECK(ncclCommDestroy(comm));
  free(in); free(out);
  return 0;
}
EOF
  libdir=$builddir/lib/.libs
  [ -e "$libdir/libgeoccl.so" ] || libdir=$builddir/lib
  if ${CC:-cc} -O2 -o "$outdir/gauss-allreduce" "$outdir/gauss_allreduce.c" \
       -I"$SRCDIR/include" -I"$builddir/include" -L"$libdir" -Wl,-rpath,"$libdir" -lgeoccl -lm \
       2> "$outdir/gauss-build.log"; then
    helper=$outdir/gauss-allreduce
  else
    echo "$PROG: the Gaussian helper did not build (see $outdir/gauss-build.log); gauss rows skipped" >&2
    gauss_codecs=
  fi
fi

runs=
for c in ${codecs//,/ }; do runs+="perf-$c "; done
for c in ${gauss_codecs//,/ }; do runs+="gauss-$c "; done
{ echo "R=$R P=$P rate=$rate delay=$delay size=$size bytes=$bytes bps=$bps"
  echo "runs=\"$runs\""; } > "$outdir/config"

# ---- the WAN: wait for the one slot, bring ours up, always take it down

wan_up=0 bg_pids=()
# shellcheck disable=SC2317 # run by the trap
cleanup() {
  local p
  for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; done
  if [ "$wan_up" = 1 ]; then "$wan" down -n "$wname" -q; wan_up=0; fi
}
trap cleanup EXIT
trap 'echo "$PROG: interrupted" >&2; exit 130' INT
trap 'echo "$PROG: terminated" >&2; exit 143' TERM HUP

wan_busy() {  # anyone's WAN: they all use 10.231.0.0/24
  "$wan" status 2>/dev/null | grep -q "region(s)" && return 0
  ip -o -4 addr show to 10.231.0.1/32 2>/dev/null | grep -q . && return 0
  return 1
}
waited=0 said=0
while :; do
  if wan_busy; then
    if [ "$said" = 0 ]; then
      log "another emulated WAN is up; waiting for it (polling every 20 s):"
      "$wan" status 2>&1 | head -n 1 >&2
      said=1
    fi
    [ "$waited" -ge "$wait_max" ] && { echo "$PROG: waited $waited s for the WAN; giving up" >&2; exit 1; }
    sleep 20; waited=$((waited + 20)); continue
  fi
  if "$wan" up -n "$wname" -r "$R" --rate "$rate" --delay "$delay" -q 2> "$outdir/wan-up.err"; then
    wan_up=1; break
  fi
  rc=$?
  [ "$rc" = 77 ] && { cat "$outdir/wan-up.err" >&2; exit 77; }
  cat "$outdir/wan-up.err" >&2
  "$wan" down -n "$wname" -q
  [ "$waited" -ge "$wait_max" ] && exit 1
  sleep 20; waited=$((waited + 20))
done
log "waited $waited s; '$wname' up: $R regions x $P ranks, $rate, $delay one-way"

echo "# bench_codecs.sh, $(date -u '+%F %T') UTC, $(nproc) cores," \
  "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $R regions x $P ranks, $rate, $delay; $size float sum, -n $iters -w $warmup; raw outputs in $outdir"

# ---- CPU throughput of the codecs (nothing else of ours runs meanwhile)
if [ "$codec_test" = 1 ]; then
  log "tests/unit/test_codec (CPU codec throughput)"
  (cd "$builddir" && GEOCCL_CODEC_BENCH_MIB=64 timeout 600 ./tests/unit/test_codec) > "$outdir/test_codec.out" 2>&1 ||
    log "tests/unit/test_codec exit status $? (see $outdir/test_codec.out)"
fi

# ---- the runs
cpu() { read -r _ u n s idl iow irq sirq st _ < /proc/stat; echo "$((u + n + s + irq + sirq)) $((idl + iow + st))"; }
shaped() {  # bytes through all regions' shapers
  local i tot=0 b
  for ((i = 0; i < R; i++)); do
    b=$(tc -n "$wname-r$i" -s qdisc show dev dl0 2>/dev/null | awk '/Sent/ { s = $2 } END { print s + 0 }')
    tot=$((tot + b))
  done
  echo "$tot"
}

status=0
for k in $runs; do
  codec=${k#*-}
  port=$((port + 1))
  if [[ $k == gauss-* ]]; then
    prog=("$helper" "$bytes" "$iters" "$warmup")
  else
    prog=("$geoperf" -b "$size" -e "$size" -n "$iters" -w "$warmup" -d float -o sum -c 0 -T 900)
    # lossless on the pattern would report a ratio no gradient reaches
    [ "$codec" = lossless ] && prog+=(--data gauss)
  fi
  log "$k: GEOCCL_COMPRESS=$codec ${prog[*]##*/}"
  echo "rank r: $wan exec -n $wname -i REGION(r) -- env RANK=r NRANKS=$N GEOCCL_COMM_ID=10.231.0.10:$port GEOCCL_COMM_SECRET=(the same 64 hex digits) GEOCCL_COMPRESS=$codec ${prog[*]}" \
    > "$outdir/$k.cmd"
  read -r b0 i0 < <(cpu); s0=$(shaped)
  pids=()
  for ((r = 0; r < N; r++)); do
    o=$outdir/$k.r$r.out
    [ "$r" = 0 ] && o=$outdir/$k.out
    timeout -k 10 1200 "$wan" exec -n "$wname" -i $((r / P)) -- env RANK=$r NRANKS=$N \
      GEOCCL_COMM_ID="10.231.0.10:$port" GEOCCL_COMPRESS="$codec" "${prog[@]}" \
      > "$o" 2> "$outdir/$k.r$r.err" &
    pids+=($!)
  done
  bg_pids=("${pids[@]}")
  rc=0
  for p in "${pids[@]}"; do wait "$p" || { e=$?; [ "$rc" = 0 ] && rc=$e; }; done
  bg_pids=()
  read -r b1 i1 < <(cpu); s1=$(shaped)
  awk -v b="$((b1 - b0))" -v i="$((i1 - i0))" -v s="$((s1 - s0))" \
    'BEGIN { printf "%.0f %.0f\n", b + i ? 100 * b / (b + i) : 0, s }' > "$outdir/$k.mon"
  if [ "$rc" != 0 ]; then
    log "$k: exit status $rc; see $outdir/$k.*"
    status=1
  fi
done

report
exit "$status"
