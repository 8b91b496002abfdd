/* SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), used to prove knowledge
 * of a communicator's secret without sending it.  Also a random-bytes helper
 * reading the kernel's generator. */
#ifndef GEOCCL_HMAC_H_
#define GEOCCL_HMAC_H_

#include <stddef.h>
#include <stdint.h>

#define GEO_SHA256_BYTES 32

typedef struct {
    uint32_t h[8];
    uint64_t nbytes;
    uint8_t block[64];
    size_t fill;
} geoSha256;

void geoSha256Init(geoSha256 *s);
void geoSha256Update(geoSha256 *s, const void *data, size_t len);
void geoSha256Final(geoSha256 *s, uint8_t out[GEO_SHA256_BYTES]);
void geoHmacSha256(const void *key, size_t keylen, const void *msg, size_t msglen,
                   uint8_t out[GEO_SHA256_BYTES]);
/* Constant-time comparison: 1 when equal. */
int geoDigestEqual(const uint8_t *a, const uint8_t *b, size_t len);
/* Fill buf from getrandom(); 0 on success, -1 on failure. */
int geoRandomBytes(void *buf, size_t len);

#endif
