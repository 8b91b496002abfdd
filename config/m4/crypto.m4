# OpenSSL's libcrypto: every MAC, key derivation and cipher GeoCCL uses
# (comm/base/crypto.c).  Required, not optional: ranks prove the
# communicator's secret to each other and traffic between regions is
# encrypted by default, and GeoCCL writes no cryptography of its own.
# Sets CRYPTO_CFLAGS and CRYPTO_LIBS.
AC_DEFUN([GEOCCL_CHECK_CRYPTO],
[GEOCCL_CHECK_PACKAGE([CRYPTO], [openssl], [OpenSSL libcrypto], [libcrypto], [-lcrypto],
    [openssl/evp.h],
    [(void)EVP_aes_256_gcm(); (void)EVP_chacha20_poly1305(); (void)EVP_PBE_scrypt(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)],
    [OpenSSL 1.1.1 or later (libcrypto; default: pkg-config libcrypto, then the
     system paths); required],
    [Define to 1: libcrypto is available (always; configure fails without it).])
AS_IF([test "x$geoccl_have_openssl" != xyes],
      [AC_MSG_ERROR([OpenSSL's libcrypto (1.1.1 or later) is required: it authenticates ranks and encrypts traffic between regions. On Debian: apt-get install libssl-dev])])
])
