#!/usr/bin/env bash
#
# geoccl-perf's check with a lossy codec: 4 local ranks (-N 4) on loopback
# in two regions (GEOCCL_PERF_REGIONS=a,a,b,b), so that the float sum
# all-reduce runs hierarchically and its partials cross between the regions
# through GEOCCL_COMPRESS=int8:
#   - -c 1 --data gauss exits 0, prints an "int8 bound:" line per size whose
#     worst err/bound is at most 1, and no element is wrong;
#   - the default pattern data passes the same check;
#   - --check-exact (no codec error allowed) reports wrong elements and
#     exits 1: the check can fail, and int8 did change the results;
#   - with lossless compression, gauss data is sent almost whole (WAN bytes
#     at least 70% of uncompressed): unlike the pattern, it is no easy case.
set -u
B=${GEOCCL_TEST_BUILDDIR:-$PWD}
PERF=$B/geoccl-perf
[ -x "$PERF" ] || { echo "no $PERF (build first)"; exit 1; }
out=$(mktemp /tmp/geoccl-perf-bound.XXXXXX) || exit 1
trap 'rm -f "$out"' EXIT
failed=0
export GEOCCL_SOCKET_IFNAME=lo GEOCCL_PERF_REGIONS=a,a,b,b
unset GEOCCL_ALGO GEOCCL_COMPRESS_BLOCK GEOCCL_COMPRESS_STOCHASTIC GEOCCL_EF GEOCCL_TOPO_FILE
run() { timeout 60 "$PERF" -N 4 -b 64K -e 1M -f 4 -n 2 -w 1 -T 30 "$@" > "$out" 2>&1; }

GEOCCL_COMPRESS=int8 run -c 1 --data gauss
rc=$?
cat "$out"
[ "$rc" = 0 ] || { echo "FAIL: int8 -c 1 --data gauss exited $rc, want 0"; failed=1; }
n=$(grep -c '^# .* int8 bound: max abs err ' "$out")
[ "$n" = 3 ] || { echo "FAIL: $n 'int8 bound:' lines, want one per size (3)"; failed=1; }
if ! awk '/ int8 bound: / { if ($NF + 0 > 1) bad = 1; seen = 1 } END { exit !(seen && !bad) }' "$out"; then
    echo "FAIL: worst err/bound above 1, or no bound line"; failed=1
fi
grep -q '^# Wrong values *: 0 OK' "$out" || { echo "FAIL: wrong elements within the bound"; failed=1; }

GEOCCL_COMPRESS=int8 run -c 1 --data pattern
rc=$?
[ "$rc" = 0 ] && grep -q ' int8 bound: ' "$out" ||
    { cat "$out"; echo "FAIL: int8 on pattern data exited $rc (or printed no bound)"; failed=1; }

GEOCCL_COMPRESS=int8 run -c 1 --data gauss --check-exact
rc=$?
wrong=$(sed -n 's/^# Wrong values *: \([0-9]*\) .*/\1/p' "$out")
echo "--check-exact: exit $rc, ${wrong:-?} wrong elements"
if [ "$rc" != 1 ] || [ "${wrong:-0}" -le 0 ]; then
    cat "$out"; echo "FAIL: --check-exact with int8 should report wrong elements and exit 1"; failed=1
fi

# wan(B)/rank of the 1 MiB row (last column), gauss data
wan_of() { GEOCCL_COMPRESS=$1 run -c 1 --data gauss || { cat "$out"; echo "FAIL: $1 exited $?"; failed=1; }
           awk '$1 == 1048576 && $3 == "float" { print $NF }' "$out"; }
none=$(wan_of none)
lossless=$(wan_of lossless)
echo "1 MiB gauss: WAN bytes per rank none $none, lossless $lossless"
if ! awk -v a="$lossless" -v b="$none" 'BEGIN { exit !(b > 0 && a >= 0.7 * b) }'; then
    echo "FAIL: lossless shrank gauss data below 70% (or the rows did not parse)"; failed=1
fi

[ "$failed" = 0 ] && echo "PASS: geoccl-perf checks lossy results against the codec's bound"
exit "$failed"
