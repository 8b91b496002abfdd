#!/usr/bin/env bash
#
# GeoCCL demo: installs what is missing (as root, with apt-get), builds the
# library if needed, then runs
#   1. the minimal example: 4 ranks forked on this machine, one all-reduce,
#      checked on every rank;
#   2. geoccl-perf: an all-reduce bandwidth table over 4 ranks on loopback.
#
# Regions and an emulated WAN arrive with the hierarchical all-reduce; until
# then every rank is in one region and the links are not shaped.
#
set -euo pipefail
cd "$(dirname "$0")/.."

bash config/install-deps.sh

if [ ! -x examples/minimal ] || [ ! -f lib/libgeoccl.la ]; then
    echo "== building (log in build.log)"
    { ./autogen.sh && ./configure && make -j"$(nproc)"; } > build.log 2>&1 ||
        { tail -40 build.log; echo "build failed: see build.log"; exit 1; }
fi

export GEOCCL_SOCKET_IFNAME=${GEOCCL_SOCKET_IFNAME:-lo}
echo
echo "== 1. minimal example: 4 ranks, all-reduce of 1M floats"
./examples/minimal
echo
echo "== 2. all-reduce bandwidth, 4 ranks on loopback (links not shaped: one region)"
if [ -x ./geoccl-perf ]; then
    ./geoccl-perf -N 4 -b 1K -e 64M -f 8 -n 10 -w 2 -c 1
else
    echo "(geoccl-perf not built)"
fi
echo
echo "Run the test suite with: bash tests/run-all.sh"
