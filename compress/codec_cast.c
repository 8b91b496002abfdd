/*
 * fp16 and bf16: float32 rounded to nearest even, 2 bytes per element.
 *
 * The conversions are branch-free selects over integer and float
 * arithmetic so the loops vectorise; finite values beyond the format's
 * largest finite value saturate to it (an infinity would make the error
 * feedback residual infinite), as codec.h specifies.
 */
#include "config.h"
#include "compress/codec_impl.h"

/* cond ? a : b as masks, so that the loops stay free of branches (GCC
 * will not if-convert some of these ternaries) and vectorise. */
static inline uint32_t sel(int cond, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - (uint32_t)(cond != 0);
    return (a & m) | (b & ~m);
}

/* binary32 bits -> binary16, nearest even, saturating. */
static inline uint16_t f32ToF16(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7FFFFFFFu;
    /* Normal half (|x| >= 2^-14): add half an ulp of the 13 dropped bits
     * (minus one unless the kept lsb is odd: ties to even), re-bias the
     * exponent from 127 to 15.  A carry into the exponent is right. */
    uint32_t nrm = (a + 0x0FFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    /* Subnormal half: |x| * 2^24 rounded to an integer in [0, 1024] by
     * adding 2^23 (whose ulp is 1); 1024 is the smallest normal, right.
     * Computed for every x (an overflow to inf is harmless, then unused). */
    float t = codecU2F(a) * 0x1p24f;
    uint32_t sub = codecF2U(t + 0x1p23f) - 0x4B000000u;
    uint32_t h = sel(a < 0x38800000u, sub, nrm);
    h = sel(a >= 0x477FF000u, 0x7BFFu, h); /* would round to inf: saturate */
    h = sel(a >= 0x7F800000u, sel(a == 0x7F800000u, 0x7C00u, 0x7E00u), h);
    return (uint16_t)(sign | h);
}

static inline float f16ToF32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    uint32_t nrm = ((e + 112u) << 23) | (m << 13);
    uint32_t special = 0x7F800000u | (m << 13);
    uint32_t sub = codecF2U((float)(int32_t)m * 0x1p-24f); /* exact */
    uint32_t bits = sel(e == 0, sub, sel(e == 31, special, nrm));
    return codecU2F(sign | bits);
}

/* binary32 bits -> bfloat16, nearest even, saturating. */
static inline uint16_t f32ToBf16(uint32_t x)
{
    uint32_t a = x & 0x7FFFFFFFu;
    uint32_t r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    uint32_t satur = ((x >> 16) & 0x8000u) | 0x7F7Fu;
    r = sel(((r & 0x7FFFu) == 0x7F80u) & (a < 0x7F800000u), satur, r);
    r = sel(a > 0x7F800000u, (x >> 16) | 0x40u, r);
    return (uint16_t)r;
}

static inline float bf16ToF32(uint16_t h) { return codecU2F((uint32_t)h << 16); }

/* ------------------------------------------------------------------------ */

static size_t castMaxSize(size_t count, ncclDataType_t dtype)
{
    if (dtype != ncclFloat32)
        return 0;
    size_t p = codecMul(count, 2);
    return p == SIZE_MAX ? 0 : codecChunkSize(p);
}

size_t codecFp16MaxSize(size_t count, ncclDataType_t dtype, const geoCodecParams *params)
{
    (void)params;
    return castMaxSize(count, dtype);
}

size_t codecBf16MaxSize(size_t count, ncclDataType_t dtype, const geoCodecParams *params)
{
    (void)params;
    return castMaxSize(count, dtype);
}

/* One tile of an encoder: out gets n 16-bit values, r (if any) the
 * residual v - decoded. */
#define CAST_ENCODE_TILES(NAME, TO16, FROM16)                                            \
    CODEC_INLINE void NAME##Tile(unsigned char *restrict out, const float *restrict x,    \
                                 size_t n)                                                \
    {                                                                                     \
        for (size_t i = 0; i < n; i++)                                                    \
            codecSt16(out + 2 * i, TO16(codecF2U(x[i])));                                 \
    }                                                                                     \
    CODEC_INLINE void NAME##EfTile(unsigned char *restrict out, const float *restrict x,  \
                                   float *restrict r, size_t n)                           \
    {                                                                                     \
        for (size_t i = 0; i < n; i++) {                                                  \
            float v = x[i] + r[i];                                                        \
            uint16_t h = TO16(codecF2U(v));                                               \
            codecSt16(out + 2 * i, h);                                                    \
            r[i] = codecFiniteOr0(v - FROM16(h));                                         \
        }                                                                                 \
    }                                                                                     \
    CODEC_INLINE void NAME##DecTile(float *restrict d, const unsigned char *restrict p,   \
                                    size_t n)                                             \
    {                                                                                     \
        for (size_t i = 0; i < n; i++)                                                    \
            d[i] = FROM16(codecLd16(p + 2 * i));                                          \
    }                                                                                     \
    CODEC_INLINE void NAME##AccTile(float *restrict d, const unsigned char *restrict p,   \
                                    size_t n)                                             \
    {                                                                                     \
        for (size_t i = 0; i < n; i++)                                                    \
            d[i] += FROM16(codecLd16(p + 2 * i));                                         \
    }                                                                                     \
    static void NAME##Encode(unsigned char *restrict out, const float *restrict x,        \
                             float *restrict r, size_t n)                                 \
    {                                                                                     \
        if (r) {                                                                          \
            CODEC_FOR_TILES(n, NAME##_EF_TILE);                                           \
        } else {                                                                          \
            CODEC_FOR_TILES(n, NAME##_TILE);                                              \
        }                                                                                 \
    }                                                                                     \
    static void NAME##Decode(float *restrict d, const unsigned char *restrict p, size_t n, \
                             int acc)                                                     \
    {                                                                                     \
        if (acc)                                                                          \
            CODEC_FOR_TILES(n, NAME##_ACC_TILE);                                          \
        else                                                                              \
            CODEC_FOR_TILES(n, NAME##_DEC_TILE);                                          \
    }

#define fp16_TILE(o, len) fp16Tile(out + 2 * (o), x + (o), (len))
#define fp16_EF_TILE(o, len) fp16EfTile(out + 2 * (o), x + (o), r + (o), (len))
#define fp16_DEC_TILE(o, len) fp16DecTile(d + (o), p + 2 * (o), (len))
#define fp16_ACC_TILE(o, len) fp16AccTile(d + (o), p + 2 * (o), (len))
#define bf16_TILE(o, len) bf16Tile(out + 2 * (o), x + (o), (len))
#define bf16_EF_TILE(o, len) bf16EfTile(out + 2 * (o), x + (o), r + (o), (len))
#define bf16_DEC_TILE(o, len) bf16DecTile(d + (o), p + 2 * (o), (len))
#define bf16_ACC_TILE(o, len) bf16AccTile(d + (o), p + 2 * (o), (len))

CAST_ENCODE_TILES(fp16, f32ToF16, f16ToF32)
CAST_ENCODE_TILES(bf16, f32ToBf16, bf16ToF32)

static ncclResult_t castEncode(geoCodecId id, const void *src, size_t count,
                               ncclDataType_t dtype, const geoCodecParams *params,
                               float *residual, void *dst, size_t cap, size_t *written)
{
    size_t need;
    ncclResult_t res = codecEncodeBegin(&geoCodecs[id], src, count, dtype, params, residual,
                                        dst, cap, written, &need);
    if (res != ncclSuccess)
        return res;
    unsigned char *out = dst;
    codecWriteHeader(out, id, dtype, 0, count, 2 * (uint64_t)count, 0);
    if (id == GEO_CODEC_FP16)
        fp16Encode(out + GEO_CODEC_HEADER_BYTES, src, residual, count);
    else
        bf16Encode(out + GEO_CODEC_HEADER_BYTES, src, residual, count);
    *written = need;
    return ncclSuccess;
}

ncclResult_t codecFp16Encode(const void *src, size_t count, ncclDataType_t dtype,
                             const geoCodecParams *params, uint64_t counter,
                             float *residual, void *dst, size_t cap, size_t *written)
{
    (void)counter;
    return castEncode(GEO_CODEC_FP16, src, count, dtype, params, residual, dst, cap, written);
}

ncclResult_t codecBf16Encode(const void *src, size_t count, ncclDataType_t dtype,
                             const geoCodecParams *params, uint64_t counter,
                             float *residual, void *dst, size_t cap, size_t *written)
{
    (void)counter;
    return castEncode(GEO_CODEC_BF16, src, count, dtype, params, residual, dst, cap, written);
}

static ncclResult_t castDecode(geoCodecId id, const void *src, size_t len,
                               ncclDataType_t dtype, float *restrict dst, size_t count,
                               int acc, const char **why)
{
    geoCodecHeader h;
    ncclResult_t res = codecDecodeBegin(src, len, id, dtype, dst, count, acc, &h, why);
    if (res != ncclSuccess)
        return res;
    if (dtype != ncclFloat32)
        CODEC_BAD(why, "fp16/bf16 chunks stand for float32 elements");
    if (h.payloadBytes != 2 * (uint64_t)count || count > SIZE_MAX / 2)
        CODEC_BAD(why, "fp16/bf16 payload length differs from 2 * count");
    if (h.param != 0)
        CODEC_BAD(why, "fp16/bf16 chunk has a nonzero param field");
    const unsigned char *p = (const unsigned char *)src + GEO_CODEC_HEADER_BYTES;
    if (id == GEO_CODEC_FP16)
        fp16Decode(dst, p, count, acc);
    else
        bf16Decode(dst, p, count, acc);
    return ncclSuccess;
}

ncclResult_t codecFp16Decode(const void *src, size_t len, ncclDataType_t dtype, void *dst,
                             size_t count, const char **why)
{
    return castDecode(GEO_CODEC_FP16, src, len, dtype, dst, count, 0, why);
}

ncclResult_t codecFp16DecodeAcc(const void *src, size_t len, ncclDataType_t dtype,
                                float *dst, size_t count, const char **why)
{
    return castDecode(GEO_CODEC_FP16, src, len, dtype, dst, count, 1, why);
}

ncclResult_t codecBf16Decode(const void *src, size_t len, ncclDataType_t dtype, void *dst,
                             size_t count, const char **why)
{
    return castDecode(GEO_CODEC_BF16, src, len, dtype, dst, count, 0, why);
}

ncclResult_t codecBf16DecodeAcc(const void *src, size_t len, ncclDataType_t dtype,
                                float *dst, size_t count, const char **why)
{
    return castDecode(GEO_CODEC_BF16, src, len, dtype, dst, count, 1, why);
}
