# CUnit, for the unit tests. Without it the CUnit tests are not built and
# `make check` runs only the tests that do not need it.
# Sets CUNIT_CFLAGS, CUNIT_LIBS; HAVE_CUNIT (config.h and AM_CONDITIONAL).
AC_DEFUN([GEOCCL_CHECK_CUNIT],
[GEOCCL_CHECK_PACKAGE([CUNIT], [cunit], [CUnit], [cunit], [-lcunit],
    [CUnit/Basic.h], [(void)CU_initialize_registry()],
    [CUnit installation for the unit tests (default: pkg-config cunit, then
     the system paths); --without-cunit skips the unit tests],
    [Define to 1 if CUnit is available (unit tests).])
])
