# zstd, for the lossless codec (byte-plane shuffle + zstd).
# Sets ZSTD_CFLAGS, ZSTD_LIBS; HAVE_ZSTD (config.h and AM_CONDITIONAL).
AC_DEFUN([GEOCCL_CHECK_ZSTD],
[GEOCCL_CHECK_PACKAGE([ZSTD], [zstd], [zstd], [libzstd], [-lzstd],
    [zstd.h], [(void)ZSTD_versionNumber()],
    [zstd installation (default: pkg-config libzstd, then the system paths);
     --without-zstd drops the lossless codec],
    [Define to 1 if zstd is available (lossless codec).])
])
