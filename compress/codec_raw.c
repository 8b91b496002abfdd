/*
 * The exact codecs: none (a copy) and lossless (byte-plane shuffle, then
 * zstd at a low level; raw when that does not shrink the chunk or when the
 * build has no zstd).
 *
 * The shuffle puts byte j of every element together (plane j) because the
 * high bytes of floating-point values (sign, exponent) repeat far more than
 * the low mantissa bytes, which zstd then finds.  Whole-chunk planes need a
 * scratch copy of the chunk; it also lets the decoder check the whole zstd
 * frame before it writes dst.
 */
#include "config.h"
#include "compress/codec_impl.h"

#include <stdlib.h>
#include <string.h>

#ifdef HAVE_ZSTD
#include <zstd.h>
#endif

/* ------------------------------------------------------------------------ */
/* none                                                                     */
/* ------------------------------------------------------------------------ */

size_t codecNoneMaxSize(size_t count, ncclDataType_t dtype, const geoCodecParams *params)
{
    (void)params;
    size_t s = codecTypeSize(dtype);
    if (s == 0)
        return 0;
    size_t raw = codecMul(count, s);
    return raw == SIZE_MAX ? 0 : codecChunkSize(raw);
}

/* The payload when a residual is given (float32): v = x + r, then r = 0. */
CODEC_INLINE void efRawTile(unsigned char *restrict out, const float *restrict x,
                            float *restrict r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        codecStF(out + 4 * i, x[i] + r[i]);
        r[i] = 0.0f;
    }
}

#define EF_RAW_TILE(o, len) efRawTile(out + 4 * (o), x + (o), r + (o), (len))
static void rawWriteWithResidual(unsigned char *restrict out, const float *restrict x,
                                 float *restrict r, size_t n)
{
    CODEC_FOR_TILES(n, EF_RAW_TILE);
}

ncclResult_t codecNoneEncode(const void *src, size_t count, ncclDataType_t dtype,
                             const geoCodecParams *params, uint64_t counter,
                             float *residual, void *dst, size_t cap, size_t *written)
{
    (void)counter;
    size_t need;
    ncclResult_t res = codecEncodeBegin(&geoCodecs[GEO_CODEC_NONE], src, count, dtype,
                                        params, residual, dst, cap, written, &need);
    if (res != ncclSuccess)
        return res;
    unsigned char *out = dst;
    size_t raw = need - GEO_CODEC_HEADER_BYTES;
    codecWriteHeader(out, GEO_CODEC_NONE, dtype, 0, count, raw, 0);
    if (residual)
        rawWriteWithResidual(out + GEO_CODEC_HEADER_BYTES, src, residual, count);
    else if (raw)
        memcpy(out + GEO_CODEC_HEADER_BYTES, src, raw);
    *written = need;
    return ncclSuccess;
}

/* dst[i] += float32 element i of a raw payload. */
CODEC_INLINE void accRawTile(float *restrict d, const unsigned char *restrict p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] += codecLdF(p + 4 * i);
}

#define ACC_RAW_TILE(o, len) accRawTile(dst + (o), p + 4 * (o), (len))
static void rawAccumulate(float *restrict dst, const unsigned char *restrict p, size_t n)
{
    CODEC_FOR_TILES(n, ACC_RAW_TILE);
}

static ncclResult_t rawDecode(const void *src, size_t len, geoCodecId id,
                              ncclDataType_t dtype, void *dst, size_t count, int acc,
                              const char **why)
{
    geoCodecHeader h;
    ncclResult_t res = codecDecodeBegin(src, len, id, dtype, dst, count, acc, &h, why);
    if (res != ncclSuccess)
        return res;
    size_t s = codecTypeSize(dtype);
    if (count > SIZE_MAX / s || h.payloadBytes != (uint64_t)count * s)
        CODEC_BAD(why, "raw payload length differs from count * element size");
    if (h.param != 0)
        CODEC_BAD(why, "raw chunk has a nonzero param field");
    const unsigned char *p = (const unsigned char *)src + GEO_CODEC_HEADER_BYTES;
    if (acc)
        rawAccumulate(dst, p, count);
    else if (count)
        memcpy(dst, p, count * s);
    return ncclSuccess;
}

ncclResult_t codecNoneDecode(const void *src, size_t len, ncclDataType_t dtype, void *dst,
                             size_t count, const char **why)
{
    return rawDecode(src, len, GEO_CODEC_NONE, dtype, dst, count, 0, why);
}

ncclResult_t codecNoneDecodeAcc(const void *src, size_t len, ncclDataType_t dtype,
                                float *dst, size_t count, const char **why)
{
    return rawDecode(src, len, GEO_CODEC_NONE, dtype, dst, count, 1, why);
}

/* ------------------------------------------------------------------------ */
/* lossless                                                                 */
/* ------------------------------------------------------------------------ */

size_t codecLosslessMaxSize(size_t count, ncclDataType_t dtype, const geoCodecParams *params)
{
    /* The raw fallback bounds the chunk. */
    return codecNoneMaxSize(count, dtype, params);
}

#ifdef HAVE_ZSTD
/* 4-byte elements to 4 planes; with r, the element is x + r and r becomes 0. */
CODEC_INLINE void shuf4Tile(unsigned char *restrict p0, unsigned char *restrict p1,
                            unsigned char *restrict p2, unsigned char *restrict p3,
                            const unsigned char *restrict in, float *restrict r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = codecLd32(in + 4 * i);
        if (r) {
            u = codecF2U(codecU2F(u) + r[i]);
            r[i] = 0.0f;
        }
        p0[i] = (unsigned char)u;
        p1[i] = (unsigned char)(u >> 8);
        p2[i] = (unsigned char)(u >> 16);
        p3[i] = (unsigned char)(u >> 24);
    }
}

CODEC_INLINE void shuf2Tile(unsigned char *restrict p0, unsigned char *restrict p1,
                            const unsigned char *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t u = codecLd16(in + 2 * i);
        p0[i] = (unsigned char)u;
        p1[i] = (unsigned char)(u >> 8);
    }
}

#define SHUF4_TILE(o, len) \
    shuf4Tile(out + (o), out + n + (o), out + 2 * n + (o), out + 3 * n + (o), in + 4 * (o), NULL, (len))
#define SHUF4_EF_TILE(o, len)                                                         \
    shuf4Tile(out + (o), out + n + (o), out + 2 * n + (o), out + 3 * n + (o), in + 4 * (o), \
              r + (o), (len))
#define SHUF2_TILE(o, len) shuf2Tile(out + (o), out + n + (o), in + 2 * (o), (len))

/* Planes of n elements of s bytes: out[j * n + i] = byte j of element i.
 * With r (s == 4 only): the element is x + r and r becomes 0. */
static void shuffle(unsigned char *restrict out, const unsigned char *restrict in,
                    float *restrict r, size_t n, size_t s)
{
    if (s == 4 && r) {
        CODEC_FOR_TILES(n, SHUF4_EF_TILE);
    } else if (s == 4) {
        CODEC_FOR_TILES(n, SHUF4_TILE);
    } else if (s == 2) {
        CODEC_FOR_TILES(n, SHUF2_TILE);
    } else if (s == 1) {
        memcpy(out, in, n);
    } else {
        for (size_t j = 0; j < s; j++) {
            unsigned char *restrict pj = out + j * n;
            const unsigned char *restrict ij = in + j;
            for (size_t i = 0; i < n; i++)
                pj[i] = ij[i * s];
        }
    }
}

CODEC_INLINE uint32_t unshuf4(const unsigned char *restrict in, size_t n, size_t i)
{
    return (uint32_t)in[i] | (uint32_t)in[n + i] << 8 | (uint32_t)in[2 * n + i] << 16 |
           (uint32_t)in[3 * n + i] << 24;
}

CODEC_INLINE void unshuf4Tile(unsigned char *restrict d, const unsigned char *restrict in,
                              size_t n, size_t o, size_t len)
{
    for (size_t i = o; i < o + len; i++)
        codecSt32(d + 4 * i, unshuf4(in, n, i));
}

CODEC_INLINE void unshuf4AccTile(float *restrict d, const unsigned char *restrict in,
                                 size_t n, size_t o, size_t len)
{
    for (size_t i = o; i < o + len; i++)
        d[i] += codecU2F(unshuf4(in, n, i));
}

CODEC_INLINE void unshuf2Tile(unsigned char *restrict d, const unsigned char *restrict in,
                              size_t n, size_t o, size_t len)
{
    for (size_t i = o; i < o + len; i++)
        codecSt16(d + 2 * i, (uint16_t)(in[i] | in[n + i] << 8));
}

#define UNSHUF4_TILE(o, len) unshuf4Tile(dst, in, n, (o), (len))
#define UNSHUF4_ACC_TILE(o, len) unshuf4AccTile(dst, in, n, (o), (len))
#define UNSHUF2_TILE(o, len) unshuf2Tile(dst, in, n, (o), (len))

/* The inverse of shuffle: element i from byte i of every plane, stored
 * (acc = 0) or, for float32, added to dst (acc = 1). */
static void unshuffle(void *restrict dst, const unsigned char *restrict in, size_t n,
                      size_t s, int acc)
{
    if (s == 4 && acc) {
        CODEC_FOR_TILES(n, UNSHUF4_ACC_TILE);
    } else if (s == 4) {
        CODEC_FOR_TILES(n, UNSHUF4_TILE);
    } else if (s == 2) {
        CODEC_FOR_TILES(n, UNSHUF2_TILE);
    } else if (s == 1) {
        memcpy(dst, in, n);
    } else {
        unsigned char *restrict d = dst;
        for (size_t j = 0; j < s; j++) {
            const unsigned char *restrict pj = in + j * n;
            unsigned char *restrict dj = d + j;
            for (size_t i = 0; i < n; i++)
                dj[i * s] = pj[i];
        }
    }
}
#endif

ncclResult_t codecLosslessEncode(const void *src, size_t count, ncclDataType_t dtype,
                                 const geoCodecParams *params, uint64_t counter,
                                 float *residual, void *dst, size_t cap, size_t *written)
{
    (void)counter;
    size_t need;
    ncclResult_t res = codecEncodeBegin(&geoCodecs[GEO_CODEC_LOSSLESS], src, count, dtype,
                                        params, residual, dst, cap, written, &need);
    if (res != ncclSuccess)
        return res;
    params = codecParamsOrDefault(params);
    unsigned char *out = dst;
    size_t raw = need - GEO_CODEC_HEADER_BYTES;
#ifdef HAVE_ZSTD
    if (raw > 1) {
        unsigned char *planes = malloc(raw);
        if (!planes)
            return ncclSystemError;
        int level = params->zstdLevel;
        if (level < ZSTD_minCLevel())
            level = ZSTD_minCLevel();
        if (level > ZSTD_maxCLevel())
            level = ZSTD_maxCLevel();
        /* The residual is folded into the planes (and zeroed) here; the raw
         * fallback below then copies the planes back, not x + r again. */
        size_t s = codecTypeSize(dtype);
        shuffle(planes, src, residual, count, s);
        /* Capacity raw - 1: only a chunk that shrinks is worth decoding.
         * The frame carries its content size and checksum, so that the
         * decoder can check the size first and corruption afterwards. */
        size_t z = (size_t)-1; /* an error code */
        ZSTD_CCtx *cctx = ZSTD_createCCtx();
        if (cctx && !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level)) &&
            !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1)) &&
            !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1)))
            z = ZSTD_compress2(cctx, out + GEO_CODEC_HEADER_BYTES, raw - 1, planes, raw);
        ZSTD_freeCCtx(cctx);
        if (!ZSTD_isError(z) && z < raw) {
            free(planes);
            codecWriteHeader(out, GEO_CODEC_LOSSLESS, dtype, GEO_CODEC_FLAG_ZSTD, count, z, 0);
            *written = GEO_CODEC_HEADER_BYTES + z;
            return ncclSuccess;
        }
        unshuffle(out + GEO_CODEC_HEADER_BYTES, planes, count, s, 0);
        free(planes);
        codecWriteHeader(out, GEO_CODEC_LOSSLESS, dtype, 0, count, raw, 0);
        *written = need;
        return ncclSuccess;
    }
#endif
    codecWriteHeader(out, GEO_CODEC_LOSSLESS, dtype, 0, count, raw, 0);
    if (residual)
        rawWriteWithResidual(out + GEO_CODEC_HEADER_BYTES, src, residual, count);
    else if (raw)
        memcpy(out + GEO_CODEC_HEADER_BYTES, src, raw);
    *written = need;
    return ncclSuccess;
}

static ncclResult_t losslessDecode(const void *src, size_t len, ncclDataType_t dtype,
                                   void *dst, size_t count, int acc, const char **why)
{
    geoCodecHeader h;
    ncclResult_t res = codecDecodeBegin(src, len, GEO_CODEC_LOSSLESS, dtype, dst, count, acc,
                                        &h, why);
    if (res != ncclSuccess)
        return res;
    if (!(h.flags & GEO_CODEC_FLAG_ZSTD))
        return rawDecode(src, len, GEO_CODEC_LOSSLESS, dtype, dst, count, acc, why);
    if (h.param != 0)
        CODEC_BAD(why, "lossless chunk has a nonzero param field");
#ifdef HAVE_ZSTD
    size_t s = codecTypeSize(dtype);
    if (count > SIZE_MAX / s)
        CODEC_BAD(why, "lossless chunk too large for this host");
    size_t raw = count * s;
    const unsigned char *p = (const unsigned char *)src + GEO_CODEC_HEADER_BYTES;
    size_t plen = (size_t)h.payloadBytes;
    /* A zstd frame proper: not a skippable frame, not a legacy format. */
    if (plen < 4 || codecLd32(p) != ZSTD_MAGICNUMBER)
        CODEC_BAD(why, "lossless payload does not start with the zstd frame magic");
    unsigned long long content = ZSTD_getFrameContentSize(p, plen);
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN)
        CODEC_BAD(why, "lossless payload is not a zstd frame with a content size");
    if (content != (unsigned long long)raw)
        CODEC_BAD(why, "lossless frame content size differs from count * element size");
    size_t frame = ZSTD_findFrameCompressedSize(p, plen);
    if (ZSTD_isError(frame) || frame != plen)
        CODEC_BAD(why, "lossless payload is not exactly one zstd frame");
    unsigned char *planes = malloc(raw ? raw : 1);
    if (!planes)
        return ncclSystemError;
    size_t got = ZSTD_decompress(planes, raw, p, plen);
    if (ZSTD_isError(got) || got != raw) {
        free(planes);
        CODEC_BAD(why, "lossless zstd frame is corrupt");
    }
    unshuffle(dst, planes, count, s, acc);
    free(planes);
    return ncclSuccess;
#else
    if (why)
        *why = "lossless chunk is zstd-compressed and this build has no zstd";
    return ncclInvalidUsage;
#endif
}

ncclResult_t codecLosslessDecode(const void *src, size_t len, ncclDataType_t dtype,
                                 void *dst, size_t count, const char **why)
{
    return losslessDecode(src, len, dtype, dst, count, 0, why);
}

ncclResult_t codecLosslessDecodeAcc(const void *src, size_t len, ncclDataType_t dtype,
                                    float *dst, size_t count, const char **why)
{
    return losslessDecode(src, len, dtype, dst, count, 1, why);
}
