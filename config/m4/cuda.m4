# CUDA toolkit: nvcc, cuda_runtime.h and libcudart.
#
# Sets: NVCC, NVCC_GENCODE, CUDA_DIR, CUDA_CPPFLAGS, CUDA_LDFLAGS, CUDA_LIBDIR
# (the folder of -L in CUDA_LDFLAGS), CUDA_LIBS,
# CUDA_LIB_LDFLAGS (libgeoccl's own link: keeps the static runtime unexported);
# HAVE_CUDA (config.h and AM_CONDITIONAL). The build never needs a GPU: only
# the compiler, the headers and the runtime library are checked.

AC_DEFUN([GEOCCL_CHECK_CUDA],
[
AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@],
        [CUDA toolkit directory (default: /usr/local/cuda, else the toolkit
         holding the nvcc found on PATH); --without-cuda builds host-only])],
    [], [with_cuda=guess])
AC_ARG_WITH([cuda-arch],
    [AS_HELP_STRING([--with-cuda-arch=LIST],
        [GPU architectures to build kernels for, e.g. "80 90" or
         "sm_80,sm_90" (default: "80 90"); PTX for the last one is embedded
         too so newer GPUs can JIT it])],
    [geoccl_cuda_arch_given=yes], [with_cuda_arch="80 90"])
AC_ARG_VAR([NVCC], [CUDA compiler (default: DIR/bin/nvcc of the CUDA toolkit)])
AC_ARG_VAR([NVCCFLAGS], [extra flags for nvcc])

geoccl_have_cuda=no
geoccl_cuda_where=disabled
CUDA_DIR=
CUDA_CPPFLAGS=
CUDA_LDFLAGS=
CUDA_LIBDIR=
CUDA_LIBS=
CUDA_LIB_LDFLAGS=
NVCC_GENCODE=

AS_IF([test "x$with_cuda" != xno], [
    geoccl_cuda_where="not found"
    AS_CASE([$with_cuda],
        [yes|guess],
            [geoccl_cuda_candidates=/usr/local/cuda
             AC_PATH_PROG([GEOCCL_NVCC_ON_PATH], [nvcc])
             AS_IF([test -n "$GEOCCL_NVCC_ON_PATH"],
                   [geoccl_nvcc_real=`readlink -f "$GEOCCL_NVCC_ON_PATH" 2>/dev/null || echo "$GEOCCL_NVCC_ON_PATH"`
                    geoccl_nvcc_dir=`dirname "$geoccl_nvcc_real"`
                    geoccl_cuda_candidates="$geoccl_cuda_candidates `dirname "$geoccl_nvcc_dir"`"])],
        [geoccl_cuda_candidates=$with_cuda])

    for geoccl_dir in $geoccl_cuda_candidates; do
        AC_MSG_CHECKING([for a CUDA toolkit in $geoccl_dir])
        geoccl_nvcc=${NVCC:-$geoccl_dir/bin/nvcc}
        AS_IF([test ! -x "$geoccl_nvcc"],
              [AC_MSG_RESULT([no ($geoccl_nvcc not found)]); continue])
        geoccl_found_lib=no
        GEOCCL_MULTIARCH_LIBDIRS([$geoccl_dir])
        for geoccl_libdir in $geoccl_libdirs $geoccl_dir/targets/x86_64-linux/lib; do
            test -d "$geoccl_libdir" || continue
            GEOCCL_TRY_HEADER_LIB([-I$geoccl_dir/include],
                [-L$geoccl_libdir -lcudart],
                [cuda_runtime.h],
                [int n = 0; (void)cudaGetDeviceCount(&n)],
                [geoccl_found_lib=yes; break])
        done
        AS_IF([test "x$geoccl_found_lib" != xyes],
              [AC_MSG_RESULT([no (cuda_runtime.h or libcudart unusable)]); continue])
        AC_MSG_RESULT([yes])
        NVCC=$geoccl_nvcc
        CUDA_DIR=$geoccl_dir
        CUDA_CPPFLAGS="-I$geoccl_dir/include"
        CUDA_LDFLAGS="-L$geoccl_libdir"
        CUDA_LIBDIR=$geoccl_libdir
        dnl Host code that nvcc emits is C++ (static guards, exception
        dnl personality), so libstdc++ comes with libcudart.
        dnl The static runtime where the toolkit has it, as NVIDIA's NCCL
        dnl links it: libgeoccl then needs no libcudart.so.N on the loader
        dnl path (PyTorch carries its own, often of another major version,
        dnl outside that path; a missing dependency makes ld.so ignore an
        dnl LD_PRELOAD of libgeoccl).  Its symbols are kept out of
        dnl libgeoccl's exports (CUDA_LIB_LDFLAGS), so a preloaded libgeoccl
        dnl never takes the place of the trainer's own CUDA runtime.
        AS_IF([test -f "$geoccl_libdir/libcudart_static.a"],
              [CUDA_LIBS="-lcudart_static -ldl -lrt -lpthread -lstdc++"
               CUDA_LIB_LDFLAGS="-Wl,--exclude-libs,libcudart_static.a"
               geoccl_cudart=static],
              [CUDA_LIBS="-lcudart -lstdc++"
               CUDA_LIB_LDFLAGS=
               geoccl_cudart="shared (no libcudart_static.a)"])
        geoccl_have_cuda=yes
        break
    done
])

AS_IF([test "x$geoccl_have_cuda" = xyes], [
    dnl "80 90", "sm_80,sm_90", "80;90" all mean the same.
    geoccl_archs=`echo "$with_cuda_arch" | sed -e 's/[[,;]]/ /g' -e 's/sm_//g' -e 's/compute_//g'`
    geoccl_last_arch=
    for geoccl_arch in $geoccl_archs; do
        AS_CASE([$geoccl_arch],
            [*[[!0-9a-z]]*|""], [AC_MSG_ERROR([bad --with-cuda-arch entry '$geoccl_arch'])])
        NVCC_GENCODE="$NVCC_GENCODE -gencode=arch=compute_$geoccl_arch,code=sm_$geoccl_arch"
        geoccl_last_arch=$geoccl_arch
    done
    AS_IF([test -z "$geoccl_last_arch"], [AC_MSG_ERROR([--with-cuda-arch is empty])])
    NVCC_GENCODE="$NVCC_GENCODE -gencode=arch=compute_$geoccl_last_arch,code=compute_$geoccl_last_arch"
    NVCC_GENCODE=`echo $NVCC_GENCODE`

    dnl Prove that nvcc and the host compiler work together for every arch.
    AC_MSG_CHECKING([whether $NVCC builds kernels for: $geoccl_archs])
    cat > conftest.cu <<_GEOCCL_EOF
__global__ void geoccl_conftest(float *x) { x[[threadIdx.x]] *= 2.0f; }
void geoccl_conftest_launch(float *x) { geoccl_conftest<<<1, 32>>>(x); }
_GEOCCL_EOF
    AS_IF([$NVCC $NVCC_GENCODE $NVCCFLAGS -Xcompiler -fPIC -c conftest.cu -o conftest.$OBJEXT >&AS_MESSAGE_LOG_FD 2>&1],
          [AC_MSG_RESULT([yes])],
          [AC_MSG_RESULT([no])
           geoccl_nvcc_error="$NVCC cannot compile a kernel for '$with_cuda_arch'; see config.log, or use --with-cuda-arch / --without-cuda"
           dnl Asked for by name: stop. Only guessed: go on host-only, loudly.
           AS_IF([test "x$with_cuda" = xguess && test "x$geoccl_cuda_arch_given" != xyes],
                 [AC_MSG_WARN([$geoccl_nvcc_error])
                  geoccl_have_cuda=no
                  geoccl_cuda_where="$CUDA_DIR: nvcc cannot build kernels (see config.log)"
                  CUDA_DIR= ; CUDA_CPPFLAGS= ; CUDA_LDFLAGS= ; CUDA_LIBDIR= ; CUDA_LIBS= ; CUDA_LIB_LDFLAGS= ; NVCC_GENCODE=],
                 [rm -f conftest.cu conftest.$OBJEXT
                  AC_MSG_ERROR([$geoccl_nvcc_error])])])
    rm -f conftest.cu conftest.$OBJEXT
])
AS_IF([test "x$geoccl_have_cuda" = xyes], [
    geoccl_nvcc_version=`$NVCC --version 2>/dev/null | sed -n 's/.*release \([[0-9.]]*\).*/\1/p'`
    geoccl_cuda_where="$CUDA_DIR (nvcc $geoccl_nvcc_version, $CUDA_LDFLAGS, runtime $geoccl_cudart, archs: $geoccl_archs)"
    AC_DEFINE([HAVE_CUDA], [1], [Define to 1 to build the CUDA parts (kernels, device buffers).])
])
GEOCCL_COMPONENT_RESULT([CUDA], [cuda])

AM_CONDITIONAL([HAVE_CUDA], [test "x$geoccl_have_cuda" = xyes])
AC_SUBST([CUDA_DIR])
AC_SUBST([CUDA_CPPFLAGS])
AC_SUBST([CUDA_LDFLAGS])
AC_SUBST([CUDA_LIBDIR])
AC_SUBST([CUDA_LIBS])
AC_SUBST([CUDA_LIB_LDFLAGS])
AC_SUBST([NVCC_GENCODE])
])
