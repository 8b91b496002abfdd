# Compiler mode, warnings, debug build and system libraries.

# GEOCCL_ARG_DEBUG: must run before AC_PROG_CC, which picks the default
# CFLAGS ("-g -O2") when the user gave none.
AC_DEFUN([GEOCCL_ARG_DEBUG],
[AC_ARG_ENABLE([debug],
    [AS_HELP_STRING([--enable-debug],
        [debug build: -O0 -g3 unless CFLAGS is set, and GEOCCL_ENABLE_DEBUG
         defined for extra internal checks (default: no)])],
    [], [enable_debug=no])
AS_IF([test "x$enable_debug" = xyes && test "x${CFLAGS+set}" != xset],
      [CFLAGS="-O0 -g3"])
])

AC_DEFUN([GEOCCL_CHECK_COMPILER],
[AC_REQUIRE([AC_PROG_CC])dnl
AC_MSG_CHECKING([whether $CC compiles C11])
AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[
#if !defined(__STDC_VERSION__) || __STDC_VERSION__ < 201112L
#error not C11
#endif
_Static_assert(sizeof(char) == 1, "c11");]], [[]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([GeoCCL needs a C11 compiler; set CC or CFLAGS (e.g. -std=gnu11)])])

AS_IF([test "x$enable_debug" = xyes],
      [AC_DEFINE([GEOCCL_ENABLE_DEBUG], [1], [Define to 1 in a debug build (--enable-debug).])])

AC_ARG_ENABLE([werror],
    [AS_HELP_STRING([--enable-werror], [treat compiler warnings as errors (default: no)])],
    [], [enable_werror=no])

dnl Always on; the sources are expected to build clean with them.
WARN_CFLAGS="-Wall -Wextra"
AS_IF([test "x$enable_werror" = xyes], [WARN_CFLAGS="$WARN_CFLAGS -Werror"])
AC_SUBST([WARN_CFLAGS])

dnl Catch a source missing from the library at link time, not at dlopen or
dnl LD_PRELOAD time in a user's process.
AC_MSG_CHECKING([whether the linker accepts -Wl,--no-undefined])
geoccl_save_LDFLAGS=$LDFLAGS
LDFLAGS="$LDFLAGS -Wl,--no-undefined"
AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])],
    [AC_MSG_RESULT([yes]); GEOCCL_NO_UNDEFINED="-Wl,--no-undefined"],
    [AC_MSG_RESULT([no]);  GEOCCL_NO_UNDEFINED=])
LDFLAGS=$geoccl_save_LDFLAGS
AC_SUBST([GEOCCL_NO_UNDEFINED])
])

# GEOCCL_CHECK_SYSLIBS: threads, math, clock/shm, dlopen. The result goes to
# GEOCCL_SYS_LIBS (linked into libgeoccl and recorded in its .la and .pc),
# not to LIBS, so that later checks see a clean link line.
AC_DEFUN([GEOCCL_CHECK_SYSLIBS],
[geoccl_save_LIBS=$LIBS
LIBS=
AC_CHECK_HEADERS([pthread.h], [], [AC_MSG_ERROR([pthread.h is required])])
AC_SEARCH_LIBS([pthread_create], [pthread], [], [AC_MSG_ERROR([POSIX threads are required])])
AC_SEARCH_LIBS([clock_gettime], [rt], [], [AC_MSG_ERROR([clock_gettime is required])])
AC_SEARCH_LIBS([dlopen], [dl], [], [AC_MSG_ERROR([dlopen is required (the real NCCL is loaded with it)])])
AC_SEARCH_LIBS([shm_open], [rt])
geoccl_found_libs=$LIBS
LIBS=$geoccl_save_LIBS
dnl -lpthread and -lm always: harmless where glibc has them built in, and the
dnl .la and .pc files then say what the library needs.
GEOCCL_SYS_LIBS=
for geoccl_l in $geoccl_found_libs -lpthread -lm; do
    case " $GEOCCL_SYS_LIBS " in
        *" $geoccl_l "*) ;;
        *) GEOCCL_SYS_LIBS="$GEOCCL_SYS_LIBS $geoccl_l" ;;
    esac
done
GEOCCL_SYS_LIBS=`echo $GEOCCL_SYS_LIBS`
AC_SUBST([GEOCCL_SYS_LIBS])
])
