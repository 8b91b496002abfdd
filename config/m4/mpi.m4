# MPI, for the MPI-launched example and its test. libgeoccl itself never
# uses MPI. The flags come from the wrapper compiler (Open MPI's
# --showme:compile/--showme:link, MPICH's -compile_info/-link_info), so MPI
# programs are compiled by $(CC) like everything else.
#
# Sets MPICC, MPIRUN, MPI_CFLAGS, MPI_LIBS; HAVE_MPI (config.h and
# AM_CONDITIONAL).

AC_DEFUN([GEOCCL_CHECK_MPI],
[AC_ARG_WITH([mpi],
    [AS_HELP_STRING([--with-mpi@<:@=DIR@:>@],
        [MPI installation whose bin/ holds mpicc and mpirun (default: mpicc
         on PATH); --without-mpi skips the MPI example])],
    [], [with_mpi=guess])
AC_ARG_VAR([MPICC], [MPI C wrapper compiler, used only to read MPI's flags])
AC_ARG_VAR([MPIRUN], [MPI launcher used by the MPI example test])

geoccl_have_mpi=no
geoccl_mpi_where=disabled
MPI_CFLAGS=
MPI_LIBS=

AS_IF([test "x$with_mpi" != xno], [
    geoccl_mpi_where="not found"
    AS_CASE([$with_mpi],
        [yes|guess], [geoccl_mpi_path=$PATH],
        [geoccl_mpi_path=$with_mpi/bin])
    AS_IF([test -z "$MPICC"],
          [AC_PATH_PROGS([MPICC], [mpicc], [], [$geoccl_mpi_path])])
    AS_IF([test -z "$MPIRUN"],
          [AC_PATH_PROGS([MPIRUN], [mpirun mpiexec], [], [$geoccl_mpi_path])])
    AS_IF([test -n "$MPICC"], [
        AC_MSG_CHECKING([for the flags of $MPICC])
        AS_IF([geoccl_c=`$MPICC --showme:compile 2>/dev/null` &&
               geoccl_l=`$MPICC --showme:link 2>/dev/null`],
              [geoccl_how="--showme"],
              [geoccl_c=`$MPICC -compile_info 2>/dev/null | cut -d' ' -f2-` &&
               geoccl_l=`$MPICC -link_info 2>/dev/null | cut -d' ' -f2-`],
              [# MPICH prints a whole command line: keep only the flags.
               geoccl_c=`for w in $geoccl_c; do case $w in -I*|-D*|-pthread) echo "$w";; esac; done | tr '\n' ' '`
               geoccl_l=`for w in $geoccl_l; do case $w in -L*|-l*|-Wl,*|-pthread) echo "$w";; esac; done | tr '\n' ' '`
               geoccl_how="-compile_info"],
              [geoccl_how=])
        AS_IF([test -n "$geoccl_how"],
              [AC_MSG_RESULT([$geoccl_how])],
              [AC_MSG_RESULT([unknown wrapper])])
        AS_IF([test -n "$geoccl_how"], [
            AC_MSG_CHECKING([whether $CC builds an MPI program with them])
            GEOCCL_TRY_HEADER_LIB([$geoccl_c], [$geoccl_l], [mpi.h],
                [int argc = 0; char **argv = 0; MPI_Init(&argc, &argv); MPI_Finalize()],
                [AC_MSG_RESULT([yes])
                 MPI_CFLAGS=`echo $geoccl_c`
                 MPI_LIBS=`echo $geoccl_l`
                 geoccl_have_mpi=yes
                 geoccl_mpi_where="$MPICC, launcher ${MPIRUN:-none found}"
                 AC_DEFINE([HAVE_MPI], [1], [Define to 1 if MPI was found (MPI example).])],
                [AC_MSG_RESULT([no])])
        ])
    ])
])
GEOCCL_COMPONENT_RESULT([MPI], [mpi])
AM_CONDITIONAL([HAVE_MPI], [test "x$geoccl_have_mpi" = xyes])
AC_SUBST([MPI_CFLAGS])
AC_SUBST([MPI_LIBS])
])
