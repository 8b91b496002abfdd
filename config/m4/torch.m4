# PyTorch, for the torch.distributed backend (geoccl/, geoccl/csrc/). The
# extension is compiled against the headers of the torch that a Python 3
# imports, with that torch's C++ ABI, and linked with its libraries.
#
# --with-python=PYTHON  use this interpreter (fail if it has no torch)
# --without-python      do not build the extension
# (no option)           /usr/bin/python3 first (Debian's, where
#                       python3-torch installs), then python3 on PATH;
#                       none when cross compiling
#
# Sets PYTHON, TORCH_CXXFLAGS, TORCH_CXXSTD, TORCH_LIBS, TORCH_VERSION;
# HAVE_TORCH (AM_CONDITIONAL) and geoccl_have_torch / geoccl_torch_where;
# with torch, AM_PATH_PYTHON's directories for that interpreter (pyexecdir,
# pkgpyexecdir: where `make install` puts the package geoccl/).

AC_DEFUN([GEOCCL_CHECK_TORCH],
[AC_REQUIRE([AC_PROG_CXX])dnl
AC_ARG_WITH([python],
    [AS_HELP_STRING([--with-python=PYTHON],
        [Python 3 interpreter whose PyTorch the torch.distributed backend is
         built for (default: /usr/bin/python3, then python3 on PATH);
         --without-python skips it])],
    [], [with_python=guess])
# A cross build cannot link against this machine's torch: guess no.
AS_IF([test "x$with_python" = xguess && test "x$cross_compiling" = xyes],
      [with_python=no])

geoccl_have_torch=no
geoccl_torch_where=disabled
TORCH_CXXFLAGS=
TORCH_CXXSTD=
TORCH_LIBS=
TORCH_VERSION=

AS_IF([test "x$with_python" != xno], [
    geoccl_torch_where="no Python 3 with torch found"
    AS_CASE([$with_python],
        [yes|guess], [geoccl_pythons="/usr/bin/python3 `command -v python3 2>/dev/null`"],
        [geoccl_pythons=$with_python])
    # One probe prints everything the build needs, one item a line.
    geoccl_torch_probe='
import sys, os, sysconfig
import torch, torch.utils.cpp_extension as ext
lib = ext.library_paths()[[0]]
print(torch.__version__)
print(" ".join("-I" + d for d in ext.include_paths() + [[sysconfig.get_paths()@<:@"include"@:>@]]))
print("-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(lib)
print("yes" if torch.version.cuda and os.path.exists(os.path.join(lib, "libc10_cuda.so")) else "no")
'
    for geoccl_py in $geoccl_pythons; do
        AC_MSG_CHECKING([whether $geoccl_py has PyTorch with its C++ headers])
        AS_IF([geoccl_out=`$geoccl_py -c "$geoccl_torch_probe" 2>/dev/null`], [
            geoccl_torch_ver=`echo "$geoccl_out" | sed -n 1p`
            geoccl_torch_inc=`echo "$geoccl_out" | sed -n 2p`
            geoccl_torch_abi=`echo "$geoccl_out" | sed -n 3p`
            geoccl_torch_lib=`echo "$geoccl_out" | sed -n 4p`
            geoccl_torch_c10cuda=`echo "$geoccl_out" | sed -n 5p`
            AS_IF([test -f "`echo $geoccl_torch_inc | sed 's/^-I//; s/ .*//'`/torch/csrc/distributed/c10d/ProcessGroup.hpp" &&
                   test -f "$geoccl_torch_lib/libtorch_python.so"], [
                AC_MSG_RESULT([yes, torch $geoccl_torch_ver])
                PYTHON=$geoccl_py
                TORCH_VERSION=$geoccl_torch_ver
                TORCH_CXXFLAGS="$geoccl_torch_inc $geoccl_torch_abi"
                TORCH_LIBS="-L$geoccl_torch_lib -Wl,-rpath,$geoccl_torch_lib -ltorch_python -ltorch -ltorch_cpu -lc10"
                AS_IF([test "x$geoccl_torch_c10cuda" = xyes],
                      [TORCH_CXXFLAGS="$TORCH_CXXFLAGS -DGEOCCL_TORCH_C10_CUDA"
                       TORCH_LIBS="$TORCH_LIBS -lc10_cuda"])
                geoccl_have_torch=yes
                geoccl_torch_where="torch $geoccl_torch_ver ($geoccl_py)"
                break
            ], [AC_MSG_RESULT([no (headers or libtorch_python.so missing: libtorch-dev)])])
        ], [AC_MSG_RESULT([no])])
    done
    AS_IF([test "x$geoccl_have_torch" != xyes && test "x$with_python" != xguess],
          [AC_MSG_ERROR([--with-python=$with_python: no PyTorch with C++ headers there])])
])
AS_IF([test "x$geoccl_have_torch" = xyes && test -z "$CXX"],
      [geoccl_have_torch=no; geoccl_torch_where="no C++ compiler"])
# The C++ standard torch's headers need: C++17 up to some 2.x release,
# C++20 since (ATen.h stops with #error below that). Preprocessing is
# enough to tell, and much cheaper than compiling.
AS_IF([test "x$geoccl_have_torch" = xyes], [
    AC_LANG_PUSH([C++])
    geoccl_save_CPPFLAGS=$CPPFLAGS
    for geoccl_std in -std=c++17 -std=c++20; do
        AC_MSG_CHECKING([whether torch's headers accept $geoccl_std])
        CPPFLAGS="$geoccl_save_CPPFLAGS $geoccl_std $TORCH_CXXFLAGS"
        AC_PREPROC_IFELSE([AC_LANG_SOURCE([[#include <ATen/ATen.h>]])],
                          [AC_MSG_RESULT([yes]); TORCH_CXXSTD=$geoccl_std; break],
                          [AC_MSG_RESULT([no])])
    done
    CPPFLAGS=$geoccl_save_CPPFLAGS
    AC_LANG_POP([C++])
    AS_IF([test -z "$TORCH_CXXSTD"],
          [geoccl_have_torch=no
           geoccl_torch_where="torch $TORCH_VERSION: its headers need a newer C++ than $CXX has"
           AS_IF([test "x$with_python" != xguess],
                 [AC_MSG_ERROR([--with-python=$with_python: $geoccl_torch_where])])])
])
# Where `make install` puts the package: that interpreter's site-packages
# under the prefix (AM_PATH_PYTHON; --with-python-sys-prefix and
# --with-python_exec_prefix move it).
AS_IF([test "x$geoccl_have_torch" = xyes],
      [AM_PATH_PYTHON([3.7], [], [geoccl_have_torch=no
                                  geoccl_torch_where="$PYTHON is older than Python 3.7"])])
AC_SUBST([PYTHON])
AC_SUBST([TORCH_CXXFLAGS])
AC_SUBST([TORCH_CXXSTD])
AC_SUBST([TORCH_LIBS])
AC_SUBST([TORCH_VERSION])
AM_CONDITIONAL([HAVE_TORCH], [test "x$geoccl_have_torch" = xyes])
])
