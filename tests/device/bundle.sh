#!/usr/bin/env bash
#
# Builds the device bundle: one folder with everything tests/device/run.sh
# --bundle runs on a lent GPU machine, which has no network, no package
# manager and perhaps no compiler or autotools.  Run on a build machine
# with the CUDA toolkit (no GPU needed):
#
#   tests/device/bundle.sh [--build BUILDDIR] [--torch TORCHDIR] DIR
#
# DIR (made afresh; at most 48 MiB):
#   bin/      codec_check, dev_allreduce, passthrough_bench, pinned_cma:
#             built against the real CUDA runtime, linked to libcudart.so.13
#             (shared, so that --emulate can put the emulated one first),
#             RUNPATH $ORIGIN/../lib
#   lib/      libgeoccl.so.0: the kernels as sm_90 machine code plus sm_90
#             PTX (GEOCCL_BUNDLE_ARCH), its CUDA runtime static and hidden
#             as in every build; libcudart.so.13 for the programs; every
#             other library they need beyond glibc, libstdc++/libgcc, the
#             driver (libcuda.so.1) and NCCL (found at run time), copied
#   emu/      the same library API on the CPU emulation, for run.sh
#             --emulate: libcudart.so.13 (tests/device/dev_emu_runtime.c and
#             dev_emu_bundle.c), libgeoccl.so.0 (the library's objects with
#             the kernels compiled as C++ against the emulation,
#             tests/device/cuda_emu_kernels.cpp) and libnccl.so.2 (the
#             one-rank emulated NCCL, nccl_emu.c).  The programs in bin/ are
#             the same files in both modes; only these libraries differ.
#   python/   geoccl/ (the package, with _C.so built against torch 2.11.0's
#             headers and libraries for CPython 3.12, RUNPATH to lib/; torch
#             itself is not carried) and torch_step.py
#   run.sh, BUILDINFO (what was built from what), MANIFEST (every file)
#
# torch: by default the torch==2.11.0 cp312 manylinux x86_64 wheel, kept in
# ${XDG_CACHE_HOME:-~/.cache}/geoccl/wheels (downloaded with pip once; its
# headers and the five libraries _C.so links are unpacked beside it);
# --torch TORCHDIR uses an installed torch package folder instead (one with
# include/ and lib/), with the Python headers of the interpreter holding it.
# CPython 3.12's headers: from a python3.12 (on PATH or a pyenv version), or
# GEOCCL_PY312_INCLUDE.
#
# The build folder (default: build-bundle in the source tree) is configured
# once (--with-cuda-arch=90, without ibverbs, MPI, CUnit and the Python
# extension, which is built here instead) and reused: make is incremental.
#
# Last, every ELF file of the bundle is checked with ldd (LD_LIBRARY_PATH
# unset): each library it needs must resolve inside the bundle or be one of
# the allowed ones above (for _C.so also torch's, resolved against the
# unpacked wheel); libcuda.so.1 and libnccl.so.2 may be missing here.  Any
# other library, missing or found outside the bundle, fails the build.
set -euo pipefail

# A build of its own, also when a make (make check) runs this script.
unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES
SRC=$(cd "$(dirname "$0")/../.." && pwd)
ORIG_SRC=$SRC
BUILD=$SRC/build-bundle
TORCH_DIR=
OUT=
ARCH=${GEOCCL_BUNDLE_ARCH:-90}
MAX_BYTES=$((48 * 1024 * 1024))
TORCH_WANT=2.11.0
while [ $# -gt 0 ]; do
    case $1 in
        --build) BUILD=$(mkdir -p "$2" && cd "$2" && pwd); shift 2 ;;
        --torch) TORCH_DIR=$(cd "$2" && pwd); shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; $d'; exit 0 ;;
        -*) echo "bundle.sh: unknown option $1" >&2; exit 2 ;;
        *) OUT=$1; shift ;;
    esac
done
[ -n "$OUT" ] || { echo "usage: bundle.sh [--build BUILDDIR] [--torch TORCHDIR] DIR" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
case $OUT in
    "$SRC"|/) echo "bundle.sh: refusing to use $OUT as the bundle folder" >&2; exit 2 ;;
esac

T0=$SECONDS
step() { echo "bundle: $* (t=$((SECONDS - T0))s)"; }
die() { echo "bundle.sh: FAIL: $*" >&2; exit 1; }
CACHE=${GEOCCL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/geoccl}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -x "$CUDA_HOME/bin/nvcc" ] || die "no nvcc in $CUDA_HOME/bin (set CUDA_HOME)"
CUDA_LIBDIR=$CUDA_HOME/lib64
[ -d "$CUDA_LIBDIR" ] || CUDA_LIBDIR=$CUDA_HOME/lib
[ -f "$CUDA_LIBDIR/libcudart.so" ] || die "no libcudart.so in $CUDA_LIBDIR"

# --- torch: headers and the libraries _C.so links -------------------------
PYINC=${GEOCCL_PY312_INCLUDE:-}
if [ -z "$TORCH_DIR" ]; then
    whl_name=torch-$TORCH_WANT-cp312-cp312-manylinux_2_28_x86_64.whl
    whl=$CACHE/wheels/$whl_name
    if [ -f "$whl" ]; then
        step "torch wheel: cached ($whl)"
    else
        step "torch wheel: not cached, downloading $whl_name with pip"
        mkdir -p "$CACHE/wheels"
        t=$SECONDS
        python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
            --platform manylinux_2_28_x86_64 -d "$CACHE/wheels" "torch==$TORCH_WANT" ||
            die "pip could not download torch==$TORCH_WANT for cp312 (no network? put the wheel in $CACHE/wheels)"
        [ -f "$whl" ] || die "pip saved no $whl_name in $CACHE/wheels"
        step "torch wheel: downloaded in $((SECONDS - t)) s"
    fi
    unpacked=$CACHE/torch-$TORCH_WANT-cp312
    if [ ! -f "$unpacked/.complete" ] || [ "$whl" -nt "$unpacked/.complete" ]; then
        step "unpacking torch's headers and link libraries into $unpacked"
        rm -rf "$unpacked"
        mkdir -p "$unpacked"
        python3 - "$whl" "$unpacked" <<'EOF'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
libs = {"libc10.so", "libc10_cuda.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so",
        "libgomp.so.1"}
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith("torch/include/") or n == "torch/version.py" or \
           (n.startswith("torch/lib/") and n[len("torch/lib/"):] in libs):
            z.extract(n, dest)
EOF
        touch "$unpacked/.complete"
    fi
    TORCH_DIR=$unpacked/torch
    if [ -z "$PYINC" ]; then
        # A python3.12 on PATH, else one of pyenv's 3.12 versions.
        for py in python3.12 $(pyenv versions --bare 2>/dev/null | grep '^3\.12' | sed 's/^/pyenv:/'); do
            case $py in
                pyenv:*) inc=$(PYENV_VERSION=${py#pyenv:} python3.12 -c \
                               'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null) || continue ;;
                *) inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null) || continue ;;
            esac
            [ -f "$inc/Python.h" ] && { PYINC=$inc; break; }
        done
    fi
    [ -n "$PYINC" ] || die "no CPython 3.12 headers: install a python3.12 (or a pyenv 3.12) or set GEOCCL_PY312_INCLUDE to its include/python3.12"
else
    if [ -z "$PYINC" ]; then
        PYINC=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    fi
fi
[ -f "$PYINC/Python.h" ] || die "no Python.h in $PYINC"
[ -f "$TORCH_DIR/include/torch/csrc/distributed/c10d/ProcessGroup.hpp" ] ||
    die "$TORCH_DIR has no c10d headers"
TORCH_VERSION=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$TORCH_DIR/version.py")
step "torch $TORCH_VERSION from $TORCH_DIR; Python headers $PYINC"

# --- the library: configure once, make what is out of date ----------------
# A tree configured in place (tests/run-all.sh builds there) cannot be
# configured again in another folder (configure refuses): then the library
# is built from a copy of its tracked files beside the build folder, what a
# user's fresh clone holds (tar keeps their times: make stays incremental).
if [ -f "$SRC/config.status" ]; then
    git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
        die "$SRC is configured in place and is not a git checkout to copy: run make distclean there, or bundle from a clean clone"
    copy=$BUILD.src
    step "$SRC is configured in place: building from a copy of its tracked files in $copy"
    mkdir -p "$copy"
    (cd "$SRC" && git ls-files -z | tar --null -T - -cf -) | tar -C "$copy" -xf - ||
        die "could not copy the tracked files to $copy"
    SRC=$copy
fi
if [ ! -x "$SRC/configure" ]; then
    step "autogen.sh"
    (cd "$SRC" && ./autogen.sh >/dev/null 2>&1) || die "autogen.sh failed"
fi
if [ ! -f "$BUILD/config.status" ] || [ "$SRC/configure" -nt "$BUILD/config.status" ]; then
    step "configure in $BUILD (--with-cuda-arch=$ARCH)"
    mkdir -p "$BUILD"
    (cd "$BUILD" && "$SRC/configure" --with-cuda="$CUDA_HOME" --with-cuda-arch="$ARCH" \
        --without-ibverbs --without-mpi --without-cunit --without-python >configure.out 2>&1) ||
        { tail -20 "$BUILD/configure.out" >&2; die "configure failed (see $BUILD/configure.out)"; }
fi
grep -q '^#define HAVE_CUDA 1' "$BUILD/config.h" || die "configure found no CUDA toolkit"
step "make lib/libgeoccl.la"
make -C "$BUILD" -j"$(nproc)" -s lib/libgeoccl.la >"$BUILD/make-bundle.out" 2>&1 ||
    { tail -20 "$BUILD/make-bundle.out" >&2; die "make failed (see $BUILD/make-bundle.out)"; }

# Variables of the configured Makefile, so the flags stay the build's own.
mkvar() { make -s -C "$BUILD" -f Makefile -f - "geoccl-print-$1" <<'EOF'
geoccl-print-%: ; @echo '$($*)'
EOF
}
CC=$(mkvar CC)
CXX=$(mkvar CXX)
# (configure ran as $SRC/configure, so its include paths are absolute)
CPPF="$(mkvar DEFS) -I$BUILD -I$SRC $(mkvar AM_CPPFLAGS) $(mkvar CPPFLAGS)"
CFL="$CPPF $(mkvar AM_CFLAGS) $(mkvar CFLAGS)"
LIBADD=$(mkvar lib_libgeoccl_la_LIBADD)
CUDA_LIBS=$(mkvar CUDA_LIBS)
LIB_LDFLAGS=$(mkvar lib_libgeoccl_la_LDFLAGS | sed 's/-version-info [0-9:]*//')
EMU_CXXFLAGS=$(mkvar GEOCCL_EMU_CXXFLAGS)
# The library's PIC objects, as libtool's .lo files name them.
REAL_OBJS=() C_OBJS=()
for lo in $(mkvar lib_libgeoccl_la_OBJECTS); do
    pic=$(sed -n "s/^pic_object='\(.*\)'$/\1/p" "$BUILD/$lo")
    o=$BUILD/$(dirname "$lo")/$pic
    [ -f "$o" ] || die "$lo: no PIC object $o"
    REAL_OBJS+=("$o")
    case $lo in cuda/*) ;; *) C_OBJS+=("$o") ;; esac
done

# --- assemble ---------------------------------------------------------------
step "assembling $OUT"
rm -rf "${OUT:?}"/bin "$OUT"/lib "$OUT"/emu "$OUT"/python "$OUT"/run.sh "$OUT"/BUILDINFO "$OUT"/MANIFEST
mkdir -p "$OUT"/bin "$OUT"/lib "$OUT"/emu "$OUT"/python/geoccl
OBJ=$BUILD/bundle-obj
mkdir -p "$OBJ"
RUNPATH_BIN="-Wl,--enable-new-dtags -Wl,-rpath,\$ORIGIN/../lib"

# libgeoccl.so.0, real: the objects make built (kernels by nvcc), linked as
# libtool links them, plus RUNPATH $ORIGIN for libzstd and libcrypto.
$CC -shared -pthread -o "$OUT/lib/libgeoccl.so.0" "${REAL_OBJS[@]}" \
    -Wl,-soname,libgeoccl.so.0 $LIB_LDFLAGS $LIBADD -Wl,--enable-new-dtags -Wl,-rpath,\$ORIGIN ||
    die "linking lib/libgeoccl.so.0"
cp -L "$CUDA_LIBDIR/libcudart.so" "$OUT/lib/libcudart.so.13"

# The emulation: runtime, library, NCCL.
echo 'libcudart.so.13 { global: *; };' >"$OBJ/cudart.map"
$CC -shared -fPIC $CFL -o "$OUT/emu/libcudart.so.13" \
    "$SRC/tests/device/dev_emu_runtime.c" "$SRC/tests/device/dev_emu_bundle.c" \
    -Wl,-soname,libcudart.so.13 -Wl,--version-script="$OBJ/cudart.map" -lpthread -lm ||
    die "building emu/libcudart.so.13"
if [ ! -f "$OBJ/emu_kernels.o" ] || [ -n "$(find "$SRC/cuda" "$SRC/tests/device" "$SRC/compress" \
        -newer "$OBJ/emu_kernels.o" \( -name '*.cu' -o -name '*.h' -o -name '*.cpp' \) | head -n1)" ]; then
    step "compiling the emulated kernels"
    $CC -x c++ $EMU_CXXFLAGS -fPIC -pthread $CPPF \
        -DGEO_CUDA_EMU -DGEO_CUDA_EMU_STREAMS -I"$SRC/tests/device" \
        -c -o "$OBJ/emu_kernels.o" "$SRC/tests/device/cuda_emu_kernels.cpp" ||
        die "compiling the emulated kernels"
fi
EMU_LIBADD=${LIBADD/"$CUDA_LIBS"/-ldl -lstdc++}
$CC -shared -pthread -o "$OUT/emu/libgeoccl.so.0" "${C_OBJS[@]}" "$OBJ/emu_kernels.o" \
    "$OUT/emu/libcudart.so.13" -Wl,-soname,libgeoccl.so.0 -Wl,--no-undefined $EMU_LIBADD \
    -Wl,--enable-new-dtags -Wl,-rpath,\$ORIGIN:\$ORIGIN/../lib ||
    die "linking emu/libgeoccl.so.0"
$CC -shared -fPIC $CFL -o "$OUT/emu/libnccl.so.2" "$SRC/tests/device/nccl_emu.c" \
    -Wl,-soname,libnccl.so.2 || die "building emu/libnccl.so.2"

# The programs.
CUDART="$CUDA_LIBDIR/libcudart.so"
prog() { # name libs...
    local name=$1
    shift
    $CC $CFL -I"$CUDA_HOME/include" -o "$OUT/bin/$name" "$SRC/tests/device/$name.c" \
        "$@" "$CUDART" $RUNPATH_BIN -lm -ldl || die "building bin/$name"
}
prog codec_check "$OUT/lib/libgeoccl.so.0" $(mkvar ZSTD_LIBS)
prog dev_allreduce "$OUT/lib/libgeoccl.so.0"
# Linked by soname only: against the emulated NCCL's libnccl.so.2 (the same
# API; its cuda* symbols bind at load), so that no NVIDIA NCCL is needed
# here; run.sh finds the real one.
prog passthrough_bench "$OUT/emu/libnccl.so.2" -Wl,--allow-shlib-undefined
prog pinned_cma

# geoccl/_C.so against torch's headers (the build's flags: Makefile.am).
std=
for s in -std=c++17 -std=c++20; do
    if echo '#include <ATen/ATen.h>' | $CXX $s -E -x c++ -I"$TORCH_DIR/include" \
            -I"$TORCH_DIR/include/torch/csrc/api/include" - >/dev/null 2>&1; then
        std=$s
        break
    fi
done
[ -n "$std" ] || die "torch's headers accept neither C++17 nor C++20 with $CXX"
TXX="$std -O2 -fPIC -pthread -Wall -Wno-deprecated-declarations -Wno-unused-parameter \
 -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H -I$SRC/include \
 -I$TORCH_DIR/include -I$TORCH_DIR/include/torch/csrc/api/include -I$PYINC \
 -D_GLIBCXX_USE_CXX11_ABI=1 -DGEOCCL_TORCH_C10_CUDA -DGEOCCL_TORCH_CUDA -I$CUDA_HOME/include"
echo "$TXX $TORCH_VERSION" >"$OBJ/torch.flags.new"
cmp -s "$OBJ/torch.flags.new" "$OBJ/torch.flags" 2>/dev/null || rm -f "$OBJ"/*.torch.o
mv "$OBJ/torch.flags.new" "$OBJ/torch.flags"
# The files at once (each takes some 15 s).
TOBJS=() TPIDS=()
# Every source of geoccl/csrc/, as the autotools build compiles them.
TSRCS=$(cd "$SRC/geoccl/csrc" && ls *.cpp | sed 's/\.cpp$//')
for f in $TSRCS; do
    o=$OBJ/$f.torch.o
    if [ ! -f "$o" ] || [ -n "$(find "$SRC/geoccl/csrc" "$SRC/include/nccl.h" "$SRC/include/geoccl.h" \
            -newer "$o" | head -n1)" ]; then
        step "compiling geoccl/csrc/$f.cpp against torch $TORCH_VERSION"
        rm -f "$o"
        $CXX $TXX -c -o "$o" "$SRC/geoccl/csrc/$f.cpp" &
        TPIDS+=($!)
    fi
    TOBJS+=("$o")
done
for p in "${TPIDS[@]}"; do
    wait "$p" || die "compiling geoccl/csrc/ against torch (see the compiler's message above)"
done
$CXX -shared -pthread -o "$OUT/python/geoccl/_C.so" "${TOBJS[@]}" "$OUT/lib/libgeoccl.so.0" \
    -L"$TORCH_DIR/lib" -ltorch_python -ltorch -ltorch_cpu -lc10 -lc10_cuda "$CUDART" \
    -Wl,--enable-new-dtags -Wl,-rpath,\$ORIGIN/../../lib || die "linking geoccl/_C.so"
for f in "$SRC"/geoccl/*.py; do
    cp "$f" "$OUT/python/geoccl/${f##*/}"
done
VERSION=$(mkvar PACKAGE_VERSION)
sed -e "s|@VERSION@|$VERSION|g" -e "s|@TORCH_VERSION@|$TORCH_VERSION|g" \
    -e 's|@PYTHON@|python3|g' -e 's|@CUDA@|True|g' -e 's|@NCCL_LIB_DIR@||g' \
    -e 's|@LIBDIR@|../../lib|' -e 's|@LIBGEOCCL@|libgeoccl.so.0|' \
    "$SRC/geoccl/_build.py.in" >"$OUT/python/geoccl/_build.py"
cp "$SRC/tests/device/torch_cuda_step.py" "$OUT/python/torch_cuda_step.py"
cp "$SRC/tests/device/run.sh" "$OUT/run.sh"
chmod +x "$OUT/run.sh"

# --- every library a file needs, copied in ---------------------------------
# Allowed outside the bundle: glibc, libstdc++/libgcc, the driver, NCCL; for
# _C.so also what torch brings (its own libraries and CUDA runtime, loaded
# by `import torch` before _C.so, so found by their sonames).
base_ok() {
    case $1 in
        linux-vdso.so.*|ld-linux-x86-64.so.*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|\
        libstdc++.so.*|libgcc_s.so.*|libcuda.so.1|libnccl.so.2) return 0 ;;
    esac
    return 1
}
torch_ok() {
    case $1 in libtorch*.so|libc10*.so|libcudart.so.13) return 0 ;; esac
    return 1
}
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
# The programs and libraries (not _C.so: torch's libraries are not ours to
# resolve; its own NEEDED entries are checked below).
elves() { find "$OUT/bin" "$OUT/lib" "$OUT/emu" -type f | sort; }
# ldd as the GPU machine's loader will see it: no LD_LIBRARY_PATH.
lddof() { env -u LD_LIBRARY_PATH ldd "$1"; }
for round in 1 2 3 4; do
    copied=0
    for f in $(elves); do
        while read -r name arrow path _; do
            [ "$arrow" = "=>" ] || continue
            base_ok "$name" && continue
            case $path in "$OUT"/*|not) continue ;; esac
            [ -e "$OUT/lib/$name" ] && continue
            echo "bundle: copying $path (needed by ${f#$OUT/})"
            cp -L "$path" "$OUT/lib/$name"
            copied=1
        done < <(lddof "$f")
    done
    [ $copied = 0 ] && break
done

# --- the check ----------------------------------------------------------------
step "checking every file's libraries with ldd (LD_LIBRARY_PATH unset)"
bad=0
for f in $(elves); do
    rel=${f#$OUT/}
    missing=() outside=()
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        if [ "$path" = not ]; then
            case $name in libcuda.so.1|libnccl.so.2) continue ;; esac
            missing+=("$name")
            continue
        fi
        base_ok "$name" && continue
        case $path in "$OUT"/*) continue ;; esac
        outside+=("$name=$path")
    done < <(lddof "$f")
    # A copied library has no RUNPATH: what it needs beyond the allowed
    # ones would be found only where the system has it.
    case $rel in lib/libgeoccl.so.0|lib/libcudart.so.13|emu/*|bin/*) ;; *)
        for n in $(needed "$f"); do base_ok "$n" || outside+=("$n(needed by a copied library)"); done ;;
    esac
    if [ ${#missing[@]} -gt 0 ] || [ ${#outside[@]} -gt 0 ]; then
        echo "  $rel: FAIL: missing ${missing[*]:-none}; outside the bundle ${outside[*]:-none}"
        bad=1
    else
        echo "  $rel: ok (needs $(needed "$f" | tr '\n' ' '))"
    fi
done
C=$OUT/python/geoccl/_C.so
cbad=()
for n in $(needed "$C"); do
    base_ok "$n" || torch_ok "$n" || [ -f "$OUT/lib/$n" ] || cbad+=("$n")
    torch_ok "$n" && [ "$n" != libcudart.so.13 ] && { [ -f "$TORCH_DIR/lib/$n" ] || cbad+=("$n(not in torch)"); }
done
if [ ${#cbad[@]} -gt 0 ]; then
    echo "  python/geoccl/_C.so: FAIL: ${cbad[*]}"
    bad=1
else
    echo "  python/geoccl/_C.so: ok (needs $(needed "$C" | tr '\n' ' '); torch's from torch, libgeoccl.so.0 from lib/)"
fi
[ $bad = 0 ] || die "a bundled file needs a library the bundle does not hold"

# The kernels: machine code for sm_$ARCH and PTX of it in every fat binary
# of libgeoccl (its .nv_fatbin section: entries of kind 1, PTX, and 2, ELF).
fat=$(python3 - "$OUT/lib/libgeoccl.so.0" <<'EOF'
import struct, subprocess, sys
f = sys.argv[1]
off = size = None
for line in subprocess.run(["readelf", "-S", "-W", f], capture_output=True, text=True).stdout.splitlines():
    if ".nv_fatbin" in line:
        fields = line.split("]", 1)[1].split()
        off, size = int(fields[3], 16), int(fields[4], 16)
if off is None:
    sys.exit("no .nv_fatbin section")
with open(f, "rb") as fh:
    fh.seek(off)
    data = fh.read(size)
p, kinds = 0, {}
while p + 16 <= len(data):
    magic, _, hsz, fsz = struct.unpack_from("<IHHQ", data, p)
    if magic != 0xBA55ED50:
        p += 8
        continue
    q, end = p + hsz, p + hsz + fsz
    while q < end:
        kind, _, ehs, esz = struct.unpack_from("<HHIQ", data, q)
        arch = struct.unpack_from("<I", data, q + 28)[0]
        name = {1: "PTX compute_%d", 2: "SASS sm_%d"}.get(kind, "kind " + str(kind) + "/%d") % arch
        kinds[name] = kinds.get(name, 0) + 1
        q += ehs + esz
    p = end
print(", ".join("%d %s" % (n, k) for k, n in sorted(kinds.items())))
EOF
) || die "cannot read libgeoccl.so.0's kernels: $fat"
echo "  lib/libgeoccl.so.0 kernels: $fat"
case $fat in *"SASS sm_$ARCH"*"PTX compute_$ARCH"*|*"PTX compute_$ARCH"*"SASS sm_$ARCH"*) ;;
    *) die "libgeoccl.so.0 lacks sm_$ARCH machine code or its PTX" ;;
esac

# What the programs of the emulation need from its runtime must be there:
# an undefined cuda* symbol would fail only when called.
undef=$( (for f in "$OUT"/bin/* "$OUT"/emu/libgeoccl.so.0 "$OUT"/emu/libnccl.so.2; do
              nm -D --undefined-only "$f" | awk '$1 == "U" {print $2}'
          done) | sed 's/@.*//' | grep -E '^(cuda|cu[A-Z]|__cuda)' | sort -u)
have=$(nm -D --defined-only "$OUT/emu/libcudart.so.13" | awk '{print $3}' | sed 's/@.*//' | sort -u)
gap=$(comm -23 <(echo "$undef") <(echo "$have") | tr '\n' ' ')
[ -z "${gap// /}" ] || die "the emulated runtime lacks what bundled programs call: $gap"

# --- record -------------------------------------------------------------------
{
    echo "GeoCCL $VERSION device bundle"
    echo "source: $(git -C "$ORIG_SRC" describe --always --dirty 2>/dev/null || echo unknown)"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    echo "nvcc: $("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), kernels: $(mkvar NVCC_GENCODE)"
    echo "torch: $TORCH_VERSION (headers and link libraries; not carried), $std"
    echo "python headers: $PYINC"
    echo "cudart: libgeoccl static (hidden); programs and _C.so shared (lib/libcudart.so.13)"
} >"$OUT/BUILDINFO"
(cd "$OUT" && find . -type f ! -name MANIFEST | sed 's|^\./||' | sort >MANIFEST)
bytes=$(du -sb "$OUT" | cut -f1)
step "bundle $OUT: $((bytes / 1024)) KiB in $(wc -l <"$OUT/MANIFEST") files"
[ "$bytes" -le "$MAX_BYTES" ] || die "the bundle holds $bytes bytes, over 48 MiB"
echo "bundle: OK"
