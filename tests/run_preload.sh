#!/usr/bin/env bash
#
# Drop-in check: tests/test_abi_nccl is the ABI test compiled against the
# toolkit's nccl.h and linked with NVIDIA's libnccl.so (as a trainer is).
# Run with LD_PRELOAD=libgeoccl.so, every NCCL call must land in GeoCCL and
# work on host buffers; without the preload it would be NVIDIA's library.
#
set -u
if [ -n "${GEOCCL_SANITIZE:-}" ]; then
    echo "SKIP: built with -fsanitize=$GEOCCL_SANITIZE: LD_PRELOAD of this libgeoccl.so into a"
    echo "      program built without the sanitizer runtime cannot work (the runtime must load first)"
    exit 77
fi
bin="./tests/test_abi_nccl"
lib="${GEOCCL_TEST_BUILDDIR:-$PWD}/lib/.libs/libgeoccl.so"
[ -x "$bin" ] || { echo "SKIP: $bin not built (no NCCL library found)"; exit 77; }
export LD_LIBRARY_PATH="${NCCL_LIB_DIR:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# libtool may have built a wrapper script; run the real binary under it.
if head -c 2 "$bin" | grep -q '#!'; then
    real=$(dirname "$bin")/.libs/$(basename "$bin")
    [ -x "$real" ] && bin=$real
fi
echo "LD_PRELOAD=$lib $bin"
LD_PRELOAD="$lib" "$bin"
