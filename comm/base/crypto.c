#include "config.h"
#include "comm/base/crypto.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_AES
#define HWCAP_AES (1 << 3)
#endif
#endif

void geoSha256(const void *data, size_t len, uint8_t out[GEO_SHA256_BYTES])
{
    unsigned int n = 0;
    if (EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) != 1 || n != GEO_SHA256_BYTES)
        memset(out, 0, GEO_SHA256_BYTES); /* only without memory; a zero digest matches nothing */
}

void geoHmacSha256(const void *key, size_t keylen, const void *msg, size_t msglen,
                   uint8_t out[GEO_SHA256_BYTES])
{
    unsigned int n = 0;
    static const uint8_t empty[1];
    if (HMAC(EVP_sha256(), key, (int)keylen, msglen ? msg : empty, msglen, out, &n) == NULL ||
        n != GEO_SHA256_BYTES) {
        /* Only without memory.  A random value proves nothing to anyone,
         * so every check against it fails, as it should. */
        if (geoRandomBytes(out, GEO_SHA256_BYTES) != 0)
            memset(out, 0xa5, GEO_SHA256_BYTES);
    }
}

int geoHkdf(const void *key, size_t keylen, const void *salt, size_t saltlen, const void *info,
            size_t infolen, uint8_t *out, size_t outlen)
{
    EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    size_t n = outlen;
    int ok = pc != NULL && EVP_PKEY_derive_init(pc) > 0 &&
             EVP_PKEY_CTX_set_hkdf_md(pc, EVP_sha256()) > 0 &&
             (saltlen == 0 || EVP_PKEY_CTX_set1_hkdf_salt(pc, salt, (int)saltlen) > 0) &&
             EVP_PKEY_CTX_set1_hkdf_key(pc, key, (int)keylen) > 0 &&
             (infolen == 0 || EVP_PKEY_CTX_add1_hkdf_info(pc, info, (int)infolen) > 0) &&
             EVP_PKEY_derive(pc, out, &n) > 0 && n == outlen;
    EVP_PKEY_CTX_free(pc);
    return ok ? 0 : -1;
}

int geoScrypt(const char *pass, size_t passlen, const void *salt, size_t saltlen, uint64_t n,
              uint32_t r, uint32_t p, uint8_t *out, size_t outlen)
{
    /* scrypt needs 128 * r * n * p bytes and a little more; libcrypto
     * refuses (rather than allocates) beyond maxmem. */
    uint64_t maxmem = 128 * (uint64_t)r * n * p + (1u << 20);
    return EVP_PBE_scrypt(pass, passlen, salt, saltlen, n, r, p, maxmem, out, outlen) == 1 ? 0
                                                                                          : -1;
}

void geoWipe(void *p, size_t len)
{
    if (p != NULL && len > 0)
        OPENSSL_cleanse(p, len);
}

void geoCryptoThreadDone(void)
{
    OPENSSL_thread_stop();
}

int geoDigestEqual(const uint8_t *a, const uint8_t *b, size_t len)
{
    return CRYPTO_memcmp(a, b, len) == 0;
}

int geoRandomBytes(void *buf, size_t len)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int geoX25519New(void **priv, uint8_t pub[GEO_X25519_BYTES])
{
    EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, NULL);
    EVP_PKEY *k = NULL;
    size_t n = GEO_X25519_BYTES;
    int ok = pc != NULL && EVP_PKEY_keygen_init(pc) > 0 && EVP_PKEY_keygen(pc, &k) > 0 &&
             EVP_PKEY_get_raw_public_key(k, pub, &n) > 0 && n == GEO_X25519_BYTES;
    EVP_PKEY_CTX_free(pc);
    if (!ok) {
        EVP_PKEY_free(k);
        *priv = NULL;
        return -1;
    }
    *priv = k;
    return 0;
}

int geoX25519Shared(void *priv, const uint8_t peer[GEO_X25519_BYTES],
                    uint8_t out[GEO_X25519_BYTES])
{
    EVP_PKEY *pk = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, NULL, peer, GEO_X25519_BYTES);
    EVP_PKEY_CTX *dc = priv && pk ? EVP_PKEY_CTX_new(priv, NULL) : NULL;
    size_t n = GEO_X25519_BYTES;
    static const uint8_t zero[GEO_X25519_BYTES];
    int ok = dc != NULL && EVP_PKEY_derive_init(dc) > 0 && EVP_PKEY_derive_set_peer(dc, pk) > 0 &&
             EVP_PKEY_derive(dc, out, &n) > 0 && n == GEO_X25519_BYTES &&
             CRYPTO_memcmp(out, zero, sizeof(zero)) != 0;
    EVP_PKEY_CTX_free(dc);
    EVP_PKEY_free(pk);
    return ok ? 0 : -1;
}

void geoX25519Free(void *priv)
{
    EVP_PKEY_free(priv);
}

static const EVP_CIPHER *evp_of(int cipher)
{
    switch (cipher) {
    case GEO_CIPHER_AES256GCM:
        return EVP_aes_256_gcm();
    case GEO_CIPHER_CHACHA20POLY1305:
        return EVP_chacha20_poly1305();
    default:
        return NULL;
    }
}

int geoAeadInit(geoAead *a, int cipher, const uint8_t key[GEO_AEAD_KEY_BYTES], int encrypt)
{
    const EVP_CIPHER *c = evp_of(cipher);
    EVP_CIPHER_CTX *ctx = c ? EVP_CIPHER_CTX_new() : NULL;

    a->ctx = NULL;
    a->cipher = cipher;
    a->encrypt = encrypt;
    if (ctx == NULL)
        return -1;
    if (EVP_CipherInit_ex(ctx, c, NULL, NULL, NULL, encrypt) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_IVLEN, 12, NULL) != 1 ||
        EVP_CipherInit_ex(ctx, NULL, NULL, key, NULL, encrypt) != 1) {
        EVP_CIPHER_CTX_free(ctx);
        return -1;
    }
    a->ctx = ctx;
    return 0;
}

static void nonce_of(uint64_t counter, uint8_t iv[12])
{
    memset(iv, 0, 4);
    for (int i = 0; i < 8; i++)
        iv[4 + i] = (uint8_t)(counter >> (8 * i));
}

/* Frames are at most a few hundred KiB: EVP's int lengths hold them. */
static int aead_run(geoAead *a, uint64_t counter, const void *aad, size_t aadlen, const void *in,
                    void *out, size_t len)
{
    EVP_CIPHER_CTX *ctx = a->ctx;
    uint8_t iv[12];
    int n;

    if (ctx == NULL || len > (size_t)1 << 30 || aadlen > (size_t)1 << 20)
        return -1;
    nonce_of(counter, iv);
    if (EVP_CipherInit_ex(ctx, NULL, NULL, NULL, iv, a->encrypt) != 1)
        return -1;
    if (aadlen > 0 && EVP_CipherUpdate(ctx, NULL, &n, aad, (int)aadlen) != 1)
        return -1;
    if (len > 0 && (EVP_CipherUpdate(ctx, out, &n, in, (int)len) != 1 || (size_t)n != len))
        return -1;
    return 0;
}

int geoAeadSeal(geoAead *a, uint64_t counter, const void *aad, size_t aadlen, const void *in,
                void *out, size_t len, uint8_t tag[GEO_AEAD_TAG_BYTES])
{
    int n;
    if (!a->encrypt || aead_run(a, counter, aad, aadlen, in, out, len) != 0)
        return -1;
    if (EVP_CipherFinal_ex(a->ctx, (uint8_t *)out + len, &n) != 1 ||
        EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_GET_TAG, GEO_AEAD_TAG_BYTES, tag) != 1)
        return -1;
    return 0;
}

int geoAeadOpen(geoAead *a, uint64_t counter, const void *aad, size_t aadlen, const void *in,
                void *out, size_t len, const uint8_t tag[GEO_AEAD_TAG_BYTES])
{
    uint8_t t[GEO_AEAD_TAG_BYTES];
    int n;
    if (a->encrypt || aead_run(a, counter, aad, aadlen, in, out, len) != 0)
        return -1;
    memcpy(t, tag, sizeof(t));
    if (EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_SET_TAG, GEO_AEAD_TAG_BYTES, t) != 1)
        return -1;
    return EVP_CipherFinal_ex(a->ctx, (uint8_t *)out + len, &n) == 1 ? 0 : -1;
}

void geoAeadFree(geoAead *a)
{
    EVP_CIPHER_CTX_free(a->ctx);
    a->ctx = NULL;
}

int geoCipherPreferred(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned int eax, ebx, ecx, edx;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_AES))
        return GEO_CIPHER_AES256GCM;
#elif defined(__aarch64__)
    if (getauxval(AT_HWCAP) & HWCAP_AES)
        return GEO_CIPHER_AES256GCM;
#endif
    return GEO_CIPHER_CHACHA20POLY1305;
}

const char *geoCipherName(int cipher)
{
    switch (cipher) {
    case GEO_CIPHER_AES256GCM:
        return "aes-256-gcm";
    case GEO_CIPHER_CHACHA20POLY1305:
        return "chacha20-poly1305";
    case GEO_CIPHER_MIXED:
        return "aes-256-gcm with some peers, chacha20-poly1305 with others";
    default:
        return "none";
    }
}
