#!/usr/bin/env bash
#
# Every function declared in the CUDA toolkit's own nccl.h must be exported
# by libgeoccl.so: a program (or a PyTorch wheel) built against NVIDIA's
# header resolves all of them at load time. The list is read from the
# header itself, so a newer nccl.h with a new function fails this test.
#
set -u
header="${NCCL_HEADER_DIR:-}/nccl.h"
lib="${GEOCCL_TEST_BUILDDIR:-.}/lib/.libs/libgeoccl.so"
if [ -z "${NCCL_HEADER_DIR:-}" ] || [ ! -f "$header" ]; then
    echo "SKIP: no toolkit nccl.h (configure found no NCCL)"
    exit 77
fi
[ -f "$lib" ] || { echo "FAIL: $lib not built"; exit 1; }

# Function declarations: a return type, then the name and "(".
declared=$(sed -n 's/^[[:space:]]*\(ncclResult_t\|const char[[:space:]]*\*\|void\)[[:space:]]*\*\{0,1\}[[:space:]]*\(p\{0,1\}nccl[A-Za-z0-9_]*\)[[:space:]]*(.*/\2/p' "$header" | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 == "T" || $2 == "W" { print $3 }' | sort -u)
n=0; missing=0
for f in $declared; do
    n=$((n + 1))
    if ! grep -qx "$f" <<< "$exported"; then
        echo "FAIL: libgeoccl.so does not export $f (declared in $header)"
        missing=$((missing + 1))
    fi
done
echo "$n functions declared in $header, $((n - missing)) exported, $missing missing"
[ "$n" -ge 80 ] || { echo "FAIL: only $n declarations parsed from the header"; exit 1; }
[ "$missing" -eq 0 ]
