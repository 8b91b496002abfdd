# libibverbs, for the RDMA transport and NIC discovery. Only the library is
# checked: no RDMA device is needed to build or to test.
# Sets IBVERBS_CFLAGS, IBVERBS_LIBS; HAVE_IBVERBS (config.h and AM_CONDITIONAL).
AC_DEFUN([GEOCCL_CHECK_IBVERBS],
[GEOCCL_CHECK_PACKAGE([IBVERBS], [ibverbs], [libibverbs], [libibverbs], [-libverbs],
    [infiniband/verbs.h], [int n = 0; (void)ibv_get_device_list(&n)],
    [rdma-core libibverbs installation (default: pkg-config libibverbs, then
     the system paths); --without-ibverbs drops the verbs transport],
    [Define to 1 if libibverbs is available (RDMA transport, NIC discovery).])
])
