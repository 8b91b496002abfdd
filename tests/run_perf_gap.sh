#!/usr/bin/env bash
#
# geoccl-perf -G MS: MS milliseconds of idle before each timed call, left
# out of the time columns (a training step's compute between all-reduces).
# Two local ranks (-N 2) on loopback, 64 KiB float sum, -n 3 -w 1 -G G,
# G 300 ms times GEOCCL_TEST_TIME_SCALE (the sanitizer builds': there, at
# nice 10 beside a loaded suite, 64 KiB calls took 118-248 ms, 0.1-0.3 ms
# alone):
#   - the header says "gap: G ms";
#   - the run takes at least the 2 x 3 gaps (out-of-place and in-place);
#   - the reported time per call stays below G / 2 (the gap is not
#     counted), and no element is wrong;
#   - -G -1 is refused with exit status 2.
set -u
B=${GEOCCL_TEST_BUILDDIR:-$PWD}
PERF=$B/geoccl-perf
[ -x "$PERF" ] || { echo "no $PERF (build first)"; exit 1; }
out=$(mktemp /tmp/geoccl-perf-gap.XXXXXX) || exit 1
trap 'rm -f "$out"' EXIT
failed=0
scale=${GEOCCL_TEST_TIME_SCALE:-1}
[[ $scale =~ ^[1-9][0-9]*$ ]] || scale=1
G=$((300 * scale))

t0=$(date +%s%N)
GEOCCL_SOCKET_IFNAME=lo timeout $((120 * scale)) "$PERF" -N 2 -b 64K -e 64K -n 3 -w 1 -c 1 -G "$G" > "$out" 2>&1
rc=$?
t1=$(date +%s%N)
ms=$(( (t1 - t0) / 1000000 ))
cat "$out"
if [ "$rc" != 0 ]; then
    echo "FAIL: geoccl-perf -G $G exited $rc"
    exit 1
fi
grep -q "^# .*gap: $G ms" "$out" || { echo "FAIL: no 'gap: $G ms' in the header"; failed=1; }
[ "$ms" -ge $((6 * G)) ] || { echo "FAIL: the run took $ms ms, less than its 6 gaps of $G ms"; failed=1; }
# The data row: size count type redop root time algbw busbw #wrong time ...
row=$(grep -E '^ +65536 ' "$out" | head -n 1)
read -r _ _ _ _ _ t_oop _ _ w_oop t_ip _ _ w_ip _ <<< "$row"
echo "out-of-place $t_oop us (#wrong $w_oop), in-place $t_ip us (#wrong $w_ip), run $ms ms"
for v in "$t_oop" "$t_ip"; do
    if ! awk -v t="$v" -v g="$G" 'BEGIN { exit !(t > 0 && t < g * 500) }'; then
        echo "FAIL: $v us per call: the gap was counted (or the row did not parse)"
        failed=1
    fi
done
[ "$w_oop" = 0 ] && [ "$w_ip" = 0 ] || { echo "FAIL: wrong elements"; failed=1; }

"$PERF" -N 2 -b 64K -e 64K -G -1 > "$out" 2>&1
rc=$?
[ "$rc" = 2 ] || { echo "FAIL: -G -1 exited $rc, want 2"; cat "$out"; failed=1; }

[ "$failed" = 0 ] && echo "PASS: geoccl-perf -G leaves the idle time out"
exit "$failed"
