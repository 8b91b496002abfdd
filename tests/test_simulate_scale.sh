#!/usr/bin/env bash
#
# geoccl-probe --simulate on the large example topologies
# (examples/topo/3x1024.topo at 1 GiB, 8x4096.topo at 256 MiB): the
# exact hierarchical all-reduce the plan chooses must run the node and
# region stages (regions of many nodes), come within 1.10x of the WAN
# bound (what the WAN alone takes: its bytes at the regions' rates plus
# two one-way delays), and print the node, region and WAN stage times; the
# --json output must hold the same stages, and the plan's all-reduce
# entries must say whether they run the node stage.
#
#   bash tests/test_simulate_scale.sh      (from a build directory, or with
#                                           GEOCCL_TEST_SRCDIR/BUILDDIR set)
#
# Exit status 0 when every check holds; 1 with what failed.
#
set -uo pipefail

src=${GEOCCL_TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
build=${GEOCCL_TEST_BUILDDIR:-.}
probe=$build/geoccl-probe
fails=0

if [ ! -x "$probe" ]; then
    echo "FAIL: $probe is not built"
    exit 1
fi

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

# check FILE BYTES: the stage table's row for BYTES, then the JSON
check() {
    local topo=$src/examples/topo/$1 bytes=$2 out row json
    if ! out=$("$probe" --simulate "$topo" 2>&1); then
        fail "geoccl-probe --simulate $1: $out"
        return
    fi
    # bytes stages slice node region WAN latency total bound ratio bw-ratio 1ring 1ring*
    row=$(printf '%s\n' "$out" | awk -v b="$bytes" '
        /hierarchical all-reduce by stage/ { t = 1; next }
        t && $1 == b { print; exit }')
    if [ -z "$row" ]; then
        fail "$1: no stage row for $bytes bytes"
        printf '%s\n' "$out" | tail -12
        return
    fi
    echo "$1 $bytes: $row"
    printf '%s\n' "$row" | awk -v f="$1" '
        function num(x) { return x ~ /^[0-9.]+(e[-+]?[0-9]+)?$/ }
        {
            bad = ""
            if ($2 !~ /^node\+/) bad = bad " stages " $2 " (node+tree or node+ring expected)"
            if (!num($4) || $4 <= 0) bad = bad " node stage time " $4
            if (!num($5) || $5 <= 0) bad = bad " region stage time " $5
            if (!num($6) || $6 <= 0) bad = bad " WAN stage time " $6
            if (!num($10) || $10 > 1.10 || $10 < 1) bad = bad " ratio " $10 " (1 to 1.10)"
            if (!num($12) || $12 <= $8) bad = bad " one ring per region " $12 " not slower than " $8
            if (bad != "") { print "FAIL: " f ":" bad; exit 1 }
        }' || fails=$((fails + 1))
    for what in "node stage, then its region stage" "node link"; do
        printf '%s\n' "$out" | grep -q "$what" || fail "$1: the text says nothing of '$what'"
    done
    if ! json=$("$probe" --simulate "$topo" --json 2>&1); then
        fail "geoccl-probe --simulate $1 --json: $json"
        return
    fi
    printf '%s\n' "$json" | grep -q "\"hier_stages\": \[" || fail "$1: no hier_stages in --json"
    printf '%s\n' "$json" | grep "\"bytes\": $bytes, \"node_stage\": 1, \"stages\": \"node+" |
        grep -q '"node_s": [0-9].*"region_s": [0-9].*"wan_s": [0-9].*"ratio": ' ||
        fail "$1: --json has no node_s, region_s, wan_s and ratio for $bytes bytes"
}

check 3x1024.topo 1073741824
check 8x4096.topo 268435456

if [ "$fails" -ne 0 ]; then
    echo "FAIL: $fails check(s)"
    exit 1
fi
echo "PASS: the hierarchical plan within 1.10x of the WAN bound on 3x1024 and 8x4096"
