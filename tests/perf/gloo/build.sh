#!/bin/sh
# build.sh: compiles the Gloo all-reduce benchmark.
#
#   tests/perf/gloo/build.sh [OUTPUT]      (default OUTPUT: ./gloo-allreduce-perf)
#
# Needs g++ (C++17) and Gloo's headers and library: on Debian and Ubuntu,
# apt-get install libgloo-dev. Without them it exits 77 (the automake code
# for "skipped"). Environment: CXX (default g++), CXXFLAGS (default -O2),
# GLOO_CFLAGS / GLOO_LIBS to point at a Gloo installed elsewhere (default:
# pkg-config gloo if it knows it, else the system paths and -lgloo).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-./gloo-allreduce-perf}
cxx=${CXX:-g++}
cxxflags=${CXXFLAGS:--O2}

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "$0: $cxx not found; skipping" >&2
  exit 77
fi

# Debian's libgloo-dev ships no gloo.pc (only CMake files), so pkg-config is
# only a bonus for other installations.
if [ -z "${GLOO_CFLAGS+x}${GLOO_LIBS+x}" ] &&
   command -v pkg-config >/dev/null 2>&1 && pkg-config --exists gloo 2>/dev/null; then
  GLOO_CFLAGS=$(pkg-config --cflags gloo)
  GLOO_LIBS=$(pkg-config --libs gloo)
fi
gloo_cflags=${GLOO_CFLAGS:-}
gloo_libs=${GLOO_LIBS:--lgloo}

# Is Gloo there? Compile and link a one-liner against it.
probe_dir=$(mktemp -d "${TMPDIR:-/tmp}/gloo-probe.XXXXXX")
trap 'rm -rf "$probe_dir"' EXIT INT TERM
cat >"$probe_dir/probe.cc" <<'EOF'
#include <gloo/config.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
int main() {
  gloo::transport::tcp::attr attr("127.0.0.1");
  return GLOO_HAVE_TRANSPORT_TCP && sizeof(attr) ? 0 : 1;
}
EOF
# shellcheck disable=SC2086 # the flag strings are meant to split
if ! "$cxx" -std=c++17 $gloo_cflags "$probe_dir/probe.cc" -o "$probe_dir/probe" \
     $gloo_libs -pthread >"$probe_dir/log" 2>&1; then
  echo "$0: Gloo (headers gloo/*.h and -lgloo with the TCP transport) not found;" \
       "install it with: apt-get install -y libgloo-dev. Skipping." >&2
  sed 's/^/    /' "$probe_dir/log" | head -n 20 >&2
  exit 77
fi

# shellcheck disable=SC2086
"$cxx" -std=c++17 $cxxflags -Wall -Wextra $gloo_cflags \
  "$here/gloo_allreduce_perf.cc" -o "$out" $gloo_libs -pthread
echo "$0: built $out"
