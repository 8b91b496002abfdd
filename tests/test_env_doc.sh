#!/usr/bin/env bash
#
# docs/environment.md must be what tests/helpers/gen_env_doc.sh makes of the
# parameter table (comm/base/param.c).  On a difference it prints the diff
# (page first, generated second) and how to regenerate the page, and fails.
#
set -uo pipefail

src=${GEOCCL_TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
build=${GEOCCL_TEST_BUILDDIR:-.}
page=$src/docs/environment.md

if [ ! -x "$build/tests/helpers/gen_env_table" ]; then
    echo "FAIL: $build/tests/helpers/gen_env_table is not built"
    exit 1
fi
if [ ! -f "$page" ]; then
    echo "FAIL: $page is missing"
    exit 1
fi
want=$(mktemp)
trap 'rm -f "$want"' EXIT
if ! bash "$src/tests/helpers/gen_env_doc.sh" "$build" > "$want"; then
    echo "FAIL: tests/helpers/gen_env_doc.sh failed"
    exit 1
fi
if ! diff -u --label docs/environment.md --label generated "$page" "$want"; then
    echo "FAIL: docs/environment.md differs from the parameter table in comm/base/param.c"
    echo "  (above: - the page, + the table); regenerate it from a build directory:"
    echo "  bash tests/helpers/gen_env_doc.sh BUILDDIR > docs/environment.md"
    exit 1
fi
echo "PASS: docs/environment.md matches the parameter table ($(grep -c '^| `GEOCCL_' "$page") variables)"
