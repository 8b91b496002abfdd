#!/usr/bin/env bash
#
# Writes docs/environment.md to standard output: the fixed intro below,
# then the parameter table of comm/base/param.c as printed by
# tests/helpers/gen_env_table (built in BUILDDIR when missing).
#
#   bash tests/helpers/gen_env_doc.sh [BUILDDIR] > docs/environment.md
#
# BUILDDIR defaults to GEOCCL_TEST_BUILDDIR, else the current directory.
# tests/test_env_doc.sh compares the page with this output.
#
set -euo pipefail

build=${1:-${GEOCCL_TEST_BUILDDIR:-.}}
prog=$build/tests/helpers/gen_env_table
if [ ! -x "$prog" ]; then
    make -C "$build" tests/helpers/gen_env_table >&2
fi

cat <<'INTRO'
# Environment variables

GeoCCL reads every setting below from the environment once, at its first
use, and logs each one that is set at `INFO` (subsystem `ENV`).
`geoccl-info` prints the same table with the values in force. Integers take
the suffixes `K`, `M` and `G` (powers of 1024; `4M`, `1GiB` and `0x10` are
numbers too); a value that is not a number is replaced by the default, with
a warning. Where a line says "rank 0's value is used by all", the ranks
agree on rank 0's setting at init.

Job scripts written for NVIDIA's NCCL keep their settings: where a
parameter has an NCCL twin (the last column), GeoCCL reads the twin when
the `GEOCCL_` variable is unset, and the `GEOCCL_` variable wins when both
are set. At `INFO`, each value taken from a twin is logged with the twin
it came from, a twin's setting GeoCCL cannot honour is said with the
reason, and the other `NCCL_` variables set are listed, in one line, as
ignored (NVIDIA's NCCL, where GeoCCL loads it for device buffers within a
region, reads its own variables). `NCCL_COMM_ID` bootstraps exactly as
`GEOCCL_COMM_ID` does, with the same `GEOCCL_COMM_SECRET` rules.

Each subject has its page: logging and timeouts in
[transport.md](transport.md), the bootstrap and encryption in
[security.md](security.md), regions, algorithms and slices in
[hierarchical.md](hierarchical.md), the probe and the plan in
[probe.md](probe.md), congestion control, warm-up and pacing in
[wan-tuning.md](wan-tuning.md), codecs and error feedback in
[compression.md](compression.md), device buffers in [device.md](device.md).

This page is generated from the table in `comm/base/param.c` by
`bash tests/helpers/gen_env_doc.sh BUILDDIR > docs/environment.md`; edit the table,
not this page (`tests/test_env_doc.sh`, in `make check`, fails when the two
differ).

INTRO
"$prog"
