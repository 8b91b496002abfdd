# GeoCCL configure helpers shared by the per-component checks.
#
# Every optional component follows one pattern:
#   --with-X            look for it and fail if it cannot be found
#   --with-X=DIR        look only under DIR and fail if it is not there
#   --without-X         do not look; the build goes on without it
#   (no option)         look in the default places; go on without it if absent
# The check leaves geoccl_have_X=yes|no and geoccl_X_where (what the summary
# prints), AC_DEFINEs HAVE_X and sets the AM_CONDITIONAL HAVE_X.

# GEOCCL_MULTIARCH_LIBDIRS(PREFIX)
# ---------------------------------
# Print the library directories under PREFIX to search, most specific first.
AC_DEFUN([GEOCCL_MULTIARCH_LIBDIRS],
[AC_REQUIRE([GEOCCL_PROG_MULTIARCH])dnl
geoccl_libdirs="$1/lib64 $1/lib"
AS_IF([test -n "$geoccl_multiarch"],
      [geoccl_libdirs="$1/lib/$geoccl_multiarch $geoccl_libdirs"])
])

# GEOCCL_PROG_MULTIARCH
# ---------------------
# The Debian multiarch triplet of the C compiler (x86_64-linux-gnu), or empty.
AC_DEFUN([GEOCCL_PROG_MULTIARCH],
[AC_REQUIRE([AC_PROG_CC])dnl
geoccl_multiarch=`$CC -print-multiarch 2>/dev/null`
])

# GEOCCL_PKG_CONFIG_QUERY(MODULE, CFLAGS-VAR, LIBS-VAR)
# -----------------------------------------------------
# Ask pkg-config for MODULE. On success set the two shell variables and
# geoccl_pkg_found=yes; otherwise geoccl_pkg_found=no and the variables are
# left alone. Does not use pkg.m4, so autogen.sh does not need it.
AC_DEFUN([GEOCCL_PKG_CONFIG_QUERY],
[AC_REQUIRE([GEOCCL_PROG_PKG_CONFIG])dnl
geoccl_pkg_found=no
AS_IF([test -n "$PKG_CONFIG" && $PKG_CONFIG --exists "$1" 2>/dev/null],
      [$2=`$PKG_CONFIG --cflags "$1"`
       $3=`$PKG_CONFIG --libs "$1"`
       geoccl_pkg_found=yes])
])

AC_DEFUN([GEOCCL_PROG_PKG_CONFIG],
[AC_ARG_VAR([PKG_CONFIG], [path to the pkg-config program])dnl
AC_PATH_TOOL([PKG_CONFIG], [pkg-config])
])

# GEOCCL_TRY_HEADER_LIB(CPPFLAGS, LIBS, HEADER, FUNCTION-CALL, [ACTION-IF-OK],
#                       [ACTION-IF-NOT])
# ----------------------------------------------------------------------------
# Compile and link a program that includes HEADER and calls FUNCTION-CALL with
# the given flags added. Nothing is cached, so it can be tried in several
# directories in turn.
AC_DEFUN([GEOCCL_TRY_HEADER_LIB],
[geoccl_save_CPPFLAGS=$CPPFLAGS
geoccl_save_LIBS=$LIBS
CPPFLAGS="$1 $CPPFLAGS"
LIBS="$2 $LIBS"
AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <$3>]], [[$4;]])],
               [geoccl_try_ok=yes], [geoccl_try_ok=no])
CPPFLAGS=$geoccl_save_CPPFLAGS
LIBS=$geoccl_save_LIBS
AS_IF([test "x$geoccl_try_ok" = xyes], [$5], [$6])
])

# GEOCCL_COMPONENT_RESULT(NAME, VAR-PREFIX)
# -----------------------------------------
# Report a component the user asked for by name and fail if it was not found;
# warn when it was only looked for by default.
AC_DEFUN([GEOCCL_COMPONENT_RESULT],
[AS_IF([test "x$geoccl_have_$2" != xyes],
       [AS_CASE([$with_$2],
                [no], [],
                [guess], [AC_MSG_NOTICE([$1 not found; building without it])],
                [AC_MSG_ERROR([$1 was requested (--with-$2=$with_$2) but could not be found; see config.log])])])
])

# GEOCCL_CHECK_PACKAGE(VAR, opt, Display, pkg-module, -llib, header, call,
#                      help, config.h description)
# ------------------------------------------------------------------------
# The check for an ordinary header+library package: --with-opt[=DIR] /
# --without-opt; by default pkg-config pkg-module, then the system paths.
# Proves the result by compiling HEADER and linking CALL. Sets VAR_CFLAGS,
# VAR_LIBS (AC_SUBST), HAVE_VAR (config.h and AM_CONDITIONAL),
# geoccl_have_opt and geoccl_opt_where.
AC_DEFUN([GEOCCL_CHECK_PACKAGE],
[AC_ARG_WITH([$2], [AS_HELP_STRING([--with-$2@<:@=DIR@:>@], [$8])],
             [], [with_$2=guess])

geoccl_have_$2=no
geoccl_$2_where=disabled
$1_CFLAGS=
$1_LIBS=
AS_IF([test "x$with_$2" != xno], [
    geoccl_$2_where="not found"
    AS_CASE([$with_$2],
        [yes|guess],
            [GEOCCL_PKG_CONFIG_QUERY([$4], [geoccl_cflags], [geoccl_libs])
             AS_IF([test "x$geoccl_pkg_found" = xyes],
                   [geoccl_how="pkg-config $4"],
                   [geoccl_cflags= ; geoccl_libs="$5"; geoccl_how="system paths"])],
        [/usr],
            [# The compiler's own paths: adding -I/usr/include would only
             # upset its search order.
             geoccl_cflags= ; geoccl_libs="$5"; geoccl_how=/usr],
        [geoccl_cflags="-I$with_$2/include"
         GEOCCL_MULTIARCH_LIBDIRS([$with_$2])
         geoccl_libs=
         for geoccl_libdir in $geoccl_libdirs; do
             test -d "$geoccl_libdir" && { geoccl_libs="-L$geoccl_libdir"; break; }
         done
         geoccl_libs="$geoccl_libs $5"
         geoccl_how=$with_$2])
    AC_MSG_CHECKING([for $3 ($geoccl_how)])
    GEOCCL_TRY_HEADER_LIB([$geoccl_cflags], [$geoccl_libs], [$6], [$7],
        [AC_MSG_RESULT([yes])
         $1_CFLAGS=$geoccl_cflags
         $1_LIBS=$geoccl_libs
         geoccl_have_$2=yes
         geoccl_$2_where="$geoccl_how: `echo $geoccl_libs`"
         AC_DEFINE([HAVE_$1], [1], [$9])],
        [AC_MSG_RESULT([no])])
])
GEOCCL_COMPONENT_RESULT([$3], [$2])
AM_CONDITIONAL([HAVE_$1], [test "x$geoccl_have_$2" = xyes])
AC_SUBST([$1_CFLAGS])
AC_SUBST([$1_LIBS])
])
