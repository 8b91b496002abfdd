# NCCL headers and library, for reference only.
#
# libgeoccl is never linked against libnccl: the real NCCL is loaded with
# dlopen at run time. What is found here serves the ABI test (which compiles
# the toolkit's own nccl.h against libgeoccl) and gives the library a default
# directory to dlopen from.
#
# Sets: NCCL_HEADER_DIR, NCCL_LIB_DIR, NCCL_CPPFLAGS, NCCL_VERSION_CODE;
# HAVE_NCCL and GEOCCL_NCCL_LIB_DIR (config.h), AM_CONDITIONAL HAVE_NCCL.
# Must come after GEOCCL_CHECK_CUDA: nccl.h includes cuda_runtime.h.

AC_DEFUN([GEOCCL_CHECK_NCCL],
[AC_REQUIRE([GEOCCL_CHECK_CUDA])dnl
AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@],
        [NCCL installation holding include/nccl.h and libnccl.so (default:
         the CUDA toolkit directory, then /usr); never linked, only used by
         the ABI test and as the default dlopen directory])],
    [], [with_nccl=guess])

geoccl_have_nccl=no
geoccl_nccl_where=disabled
NCCL_HEADER_DIR=
NCCL_LIB_DIR=
NCCL_CPPFLAGS=
NCCL_VERSION_CODE=

AS_IF([test "x$with_nccl" != xno], [
    geoccl_nccl_where="not found"
    AS_CASE([$with_nccl],
        [yes|guess],
            [geoccl_nccl_candidates="${CUDA_DIR:-/usr/local/cuda} /usr"],
        [geoccl_nccl_candidates=$with_nccl])

    for geoccl_dir in $geoccl_nccl_candidates; do
        AC_MSG_CHECKING([for NCCL in $geoccl_dir])
        AS_IF([test ! -r "$geoccl_dir/include/nccl.h"],
              [AC_MSG_RESULT([no (no include/nccl.h)]); continue])
        dnl nccl.h includes cuda_runtime.h: take it from the CUDA toolkit
        dnl found above, else it must sit beside nccl.h (the usual layout).
        geoccl_nccl_cppflags="-I$geoccl_dir/include"
        AS_IF([test -n "$CUDA_CPPFLAGS" && test "x$CUDA_CPPFLAGS" != "x-I$geoccl_dir/include"],
              [geoccl_nccl_cppflags="$geoccl_nccl_cppflags $CUDA_CPPFLAGS"])
        geoccl_save_CPPFLAGS=$CPPFLAGS
        CPPFLAGS="$geoccl_nccl_cppflags $CPPFLAGS"
        AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]],
                                           [[ncclComm_t c = 0; (void)c; return NCCL_MAJOR < 2;]])],
                          [geoccl_nccl_hdr_ok=yes], [geoccl_nccl_hdr_ok=no])
        AS_IF([test "x$geoccl_nccl_hdr_ok" = xyes],
              [AC_COMPUTE_INT([geoccl_nccl_code], [NCCL_VERSION_CODE], [[#include <nccl.h>]],
                              [geoccl_nccl_code=])])
        CPPFLAGS=$geoccl_save_CPPFLAGS
        AS_IF([test "x$geoccl_nccl_hdr_ok" != xyes],
              [AC_MSG_RESULT([no (nccl.h does not compile; cuda_runtime.h missing?)]); continue])

        geoccl_nccl_libdir=
        GEOCCL_MULTIARCH_LIBDIRS([$geoccl_dir])
        for geoccl_libdir in $geoccl_libdirs; do
            AS_IF([test -e "$geoccl_libdir/libnccl.so"],
                  [geoccl_nccl_libdir=$geoccl_libdir; break])
        done
        AS_IF([test -z "$geoccl_nccl_libdir"],
              [AC_MSG_RESULT([no (header found, libnccl.so not found)]); continue])
        AC_MSG_RESULT([yes])

        NCCL_HEADER_DIR=$geoccl_dir/include
        NCCL_LIB_DIR=$geoccl_nccl_libdir
        NCCL_CPPFLAGS=$geoccl_nccl_cppflags
        NCCL_VERSION_CODE=$geoccl_nccl_code
        geoccl_have_nccl=yes
        break
    done
])

AS_IF([test "x$geoccl_have_nccl" = xyes], [
    AS_IF([test -n "$NCCL_VERSION_CODE"],
          [geoccl_nccl_version="`expr $NCCL_VERSION_CODE / 10000`.`expr $NCCL_VERSION_CODE % 10000 / 100`.`expr $NCCL_VERSION_CODE % 100`"],
          [geoccl_nccl_version="unknown version"])
    geoccl_nccl_where="$NCCL_HEADER_DIR/nccl.h ($geoccl_nccl_version), $NCCL_LIB_DIR/libnccl.so (not linked)"
    AC_DEFINE([HAVE_NCCL], [1], [Define to 1 if NCCL headers and library were found at configure time.])
    AC_DEFINE_UNQUOTED([GEOCCL_NCCL_LIB_DIR], ["$NCCL_LIB_DIR"],
                       [Directory holding the libnccl.so found at configure time (a dlopen fallback).])
])
GEOCCL_COMPONENT_RESULT([NCCL], [nccl])

AM_CONDITIONAL([HAVE_NCCL], [test "x$geoccl_have_nccl" = xyes])
AC_SUBST([NCCL_HEADER_DIR])
AC_SUBST([NCCL_LIB_DIR])
AC_SUBST([NCCL_CPPFLAGS])
AC_SUBST([NCCL_VERSION_CODE])
])
