# GEOCCL_ARG_SANITIZERS: --enable-sanitizers=LIST builds the library, the
# tools and the tests with -fsanitize=LIST (address,undefined or thread;
# the two cannot be combined).  Every report ends the program with an error
# (no recovery), so a report fails its test.  GEOCCL_SANITIZE (the list, or
# empty) reaches the tests' environment: the harness scales its time limits
# by GEOCCL_TEST_TIME_SCALE, and tests that cannot run under a sanitizer
# runtime (LD_PRELOAD into programs built without it, dlopen with
# RTLD_DEEPBIND) skip themselves and say why.
AC_DEFUN([GEOCCL_ARG_SANITIZERS],
[AC_REQUIRE([AC_PROG_CC])dnl
AC_ARG_ENABLE([sanitizers],
    [AS_HELP_STRING([--enable-sanitizers=LIST],
        [build everything with -fsanitize=LIST: address,undefined or thread
         (default: none)])],
    [], [enable_sanitizers=no])
GEOCCL_SANITIZE=
GEOCCL_TEST_TIME_SCALE=1
AS_CASE([$enable_sanitizers],
    [no|""], [],
    [yes], [AC_MSG_ERROR([--enable-sanitizers needs a list: address,undefined or thread])],
    [*thread*address*|*address*thread*],
        [AC_MSG_ERROR([--enable-sanitizers: thread cannot be combined with address])],
    [GEOCCL_SANITIZE=$enable_sanitizers])
AS_IF([test -n "$GEOCCL_SANITIZE"],
    [geoccl_san_flags="-fsanitize=$GEOCCL_SANITIZE -fno-omit-frame-pointer -g"
     AS_CASE([$GEOCCL_SANITIZE], [*undefined*],
         [geoccl_san_flags="$geoccl_san_flags -fno-sanitize-recover=undefined"])
     AC_MSG_CHECKING([whether $CC builds and runs with $geoccl_san_flags])
     CFLAGS="$CFLAGS $geoccl_san_flags"
     LDFLAGS="$LDFLAGS -fsanitize=$GEOCCL_SANITIZE"
     AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])],
         [AC_MSG_RESULT([yes])],
         [AC_MSG_RESULT([no])
          AC_MSG_ERROR([$CC cannot build with -fsanitize=$GEOCCL_SANITIZE (is its runtime installed?)])])
     dnl Thread sanitizer runs take longer than address ones: the harness
     dnl and the shell tests multiply their limits by this.
     AS_CASE([$GEOCCL_SANITIZE], [*thread*], [GEOCCL_TEST_TIME_SCALE=8],
                                 [GEOCCL_TEST_TIME_SCALE=4])
     AC_DEFINE_UNQUOTED([GEOCCL_SANITIZE], ["$GEOCCL_SANITIZE"],
                        [Sanitizers the build runs under (--enable-sanitizers).])])
AC_SUBST([GEOCCL_SANITIZE])
AC_SUBST([GEOCCL_TEST_TIME_SCALE])
AM_CONDITIONAL([SANITIZE], [test -n "$GEOCCL_SANITIZE"])
])
