/* Cryptography, all of it from OpenSSL's libcrypto: SHA-256, HMAC-SHA-256,
 * HKDF, scrypt and the authenticated ciphers that protect frames between
 * regions (AES-256-GCM, ChaCha20-Poly1305).  Nothing here is written by
 * GeoCCL: these are thin wrappers that fix the parameters and report
 * failure as a return value.  Randomness comes from the kernel
 * (getrandom). */
#ifndef GEOCCL_CRYPTO_H_
#define GEOCCL_CRYPTO_H_

#include <stddef.h>
#include <stdint.h>

#define GEO_SHA256_BYTES 32
#define GEO_AEAD_KEY_BYTES 32
#define GEO_AEAD_TAG_BYTES 16

/* out = SHA-256(data). */
void geoSha256(const void *data, size_t len, uint8_t out[GEO_SHA256_BYTES]);
/* out = HMAC-SHA-256(key, msg). */
void geoHmacSha256(const void *key, size_t keylen, const void *msg, size_t msglen,
                   uint8_t out[GEO_SHA256_BYTES]);
/* HKDF-SHA-256 (RFC 5869), extract and expand: outlen (<= 255 * 32)
 * bytes from key, salt and info.  0 on success, -1 on failure. */
int geoHkdf(const void *key, size_t keylen, const void *salt, size_t saltlen, const void *info,
            size_t infolen, uint8_t *out, size_t outlen);
/* scrypt (RFC 7914) with cost n (a power of two), block size r and
 * parallelism p.  0 on success, -1 on failure (bad parameters, memory). */
int geoScrypt(const char *pass, size_t passlen, const void *salt, size_t saltlen, uint64_t n,
              uint32_t r, uint32_t p, uint8_t *out, size_t outlen);
/* Overwrite len bytes at p with zeros in a way the compiler keeps (key
 * material, secrets, plaintext about to be freed). */
void geoWipe(void *p, size_t len);

/* Frees what libcrypto keeps for the calling thread (its error queue and
 * random generators); its next call allocates them again.  A detached
 * thread calls it before the step after which the process may end: a
 * thread that exits after the process's atexit cleanup of libcrypto would
 * otherwise leave that state behind. */
void geoCryptoThreadDone(void);
/* Constant-time comparison: 1 when equal. */
int geoDigestEqual(const uint8_t *a, const uint8_t *b, size_t len);
/* Fill buf from getrandom(); 0 on success, -1 on failure. */
int geoRandomBytes(void *buf, size_t len);

/* Ephemeral X25519 (RFC 7748): forward secrecy for a connection's keys.
 * geoX25519New makes a key pair: *priv (free with geoX25519Free) and its
 * public half; geoX25519Shared derives the shared secret with a peer's
 * public key.  0 on success, -1 on failure (and for a peer key that gives
 * the all-zero secret). */
#define GEO_X25519_BYTES 32
int geoX25519New(void **priv, uint8_t pub[GEO_X25519_BYTES]);
int geoX25519Shared(void *priv, const uint8_t peer[GEO_X25519_BYTES],
                    uint8_t out[GEO_X25519_BYTES]);
void geoX25519Free(void *priv);

/* Authenticated encryption of numbered frames.  One geoAead is one key in
 * one direction; frame k is sealed with the 96-bit nonce (0, k): the
 * caller numbers frames from 0 and never reuses a number under one key
 * (every connection gets fresh keys, so counters start at 0 again on a new
 * connection).  A receiver that opens frame k with the number it expects
 * refuses a replayed, reordered or altered frame: the tag does not match. */
enum { GEO_CIPHER_NONE = 0, GEO_CIPHER_AES256GCM = 1, GEO_CIPHER_CHACHA20POLY1305 = 2,
       GEO_CIPHER_MIXED = 3 /* reporting only: different ciphers with different peers */ };

typedef struct {
    void *ctx;                  /* EVP_CIPHER_CTX, keyed once */
    int cipher;
    int encrypt;
} geoAead;

/* Key a for one direction.  0 on success, -1 on failure (a->ctx NULL). */
int geoAeadInit(geoAead *a, int cipher, const uint8_t key[GEO_AEAD_KEY_BYTES], int encrypt);
/* Encrypt len bytes from in into out (in == out allowed) as frame number
 * counter, authenticating aad too; the tag goes to tag.  0 or -1. */
int geoAeadSeal(geoAead *a, uint64_t counter, const void *aad, size_t aadlen, const void *in,
                void *out, size_t len, uint8_t tag[GEO_AEAD_TAG_BYTES]);
/* Decrypt and check.  0: authentic, out holds the plaintext; -1: not
 * authentic (or a library failure): out holds garbage, use none of it. */
int geoAeadOpen(geoAead *a, uint64_t counter, const void *aad, size_t aadlen, const void *in,
                void *out, size_t len, const uint8_t tag[GEO_AEAD_TAG_BYTES]);
void geoAeadFree(geoAead *a);
/* AES-256-GCM when this CPU has AES instructions (x86 AES-NI, Arm's
 * crypto extension), else ChaCha20-Poly1305, which is faster in
 * software. */
int geoCipherPreferred(void);
const char *geoCipherName(int cipher);

#endif
