/*
 * Helpers shared by the codec implementations (compress/codec_*.c); not for
 * use outside compress/.
 */
#ifndef GEOCCL_COMPRESS_CODEC_IMPL_H_
#define GEOCCL_COMPRESS_CODEC_IMPL_H_

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "compress/codec.h"

/* The encoded bytes are defined without fused multiply-add (codec.h); GCC
 * contracts a*b+c across statements by default wherever the target has an
 * FMA instruction (aarch64, x86 with -mfma), which would change them.  The
 * vectoriser's -O3 cost model: at -O2 GCC 12 only vectorises loops it need
 * not version for aliasing, and the char-typed chunk pointers alias
 * everything.  These pragmas are seen only by the codec sources. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "vect-cost-model=dynamic")
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the codec payloads are little-endian; port codecLd/codecSt first"
#endif

/* For the small helpers of the hot loops: inlined even when called twice,
 * so a call with a constant length becomes a loop the vectoriser takes at
 * -O2 (GCC's "very cheap" model there needs a known trip count). */
#define CODEC_INLINE static inline __attribute__((always_inline))

/* Elements per tile of the block codecs' inner loops. */
#define CODEC_TILE 64

/* Unaligned little-endian loads and stores (chunks sit at any address); they
 * compile to plain moves and keep loops vectorisable. */
static inline uint16_t codecLd16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t codecLd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t codecLd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline float codecLdF(const unsigned char *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}
static inline void codecSt16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void codecSt32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void codecSt64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void codecStF(unsigned char *p, float v) { memcpy(p, &v, 4); }

static inline uint32_t codecF2U(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float codecU2F(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* r when finite, else 0: (r - r) is 0 exactly for finite r and NaN for an
 * infinity or a NaN (not folded without -ffast-math). */
static inline float codecFiniteOr0(float r) { return (r - r == 0.0f) ? r : 0.0f; }

/* Calls FN(first, len) over [0, n) in CODEC_TILE pieces; full pieces pass
 * the constant CODEC_TILE, so an inlined FN gets a loop that vectorises. */
#define CODEC_FOR_TILES(n, FN)                                              \
    do {                                                                    \
        size_t tile_ = 0, n_ = (n);                                         \
        for (; tile_ + CODEC_TILE <= n_; tile_ += CODEC_TILE)               \
            FN(tile_, CODEC_TILE);                                          \
        if (tile_ < n_)                                                     \
            FN(tile_, n_ - tile_);                                          \
    } while (0)

/* r[i] = x[i] + r[i]: forms v = x + r in the residual array. */
CODEC_INLINE void codecAddTile(float *restrict r, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        r[i] = x[i] + r[i];
}

static inline void codecAddInto(float *restrict r, const float *restrict x, size_t n)
{
    size_t i = 0;
    for (; i + CODEC_TILE <= n; i += CODEC_TILE)
        codecAddTile(r + i, x + i, CODEC_TILE);
    codecAddTile(r + i, x + i, n - i);
}

/* Set *why (when asked) and return ncclInvalidArgument. */
#define CODEC_BAD(why, text)                                                \
    do {                                                                    \
        if (why)                                                            \
            *(why) = (text);                                                \
        return ncclInvalidArgument;                                         \
    } while (0)

/* Bytes per element of a valid dtype, else 0. */
size_t codecTypeSize(ncclDataType_t dtype);

/* params, or the defaults when NULL. */
const geoCodecParams *codecParamsOrDefault(const geoCodecParams *params);

/* 1 if blockSize is valid (multiple of 8 in [8, GEO_CODEC_BLOCK_MAX]). */
int codecBlockSizeValid(uint32_t blockSize);

/* a + b, or SIZE_MAX on overflow (SIZE_MAX inputs stay SIZE_MAX). */
static inline size_t codecAdd(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
/* a * b, or SIZE_MAX on overflow. */
static inline size_t codecMul(size_t a, size_t b)
{
    return (b != 0 && a > SIZE_MAX / b) ? SIZE_MAX : a * b;
}
/* ceil(a / b) for b > 0, without overflow. */
static inline size_t codecDivUp(size_t a, size_t b) { return a / b + (a % b != 0); }

/* Header plus payload, or 0 when it overflows. */
static inline size_t codecChunkSize(size_t payload)
{
    return payload > SIZE_MAX - GEO_CODEC_HEADER_BYTES ? 0 : payload + GEO_CODEC_HEADER_BYTES;
}

/* Writes the 32-byte header at dst (checksum included). */
void codecWriteHeader(unsigned char *dst, geoCodecId codec, ncclDataType_t dtype,
                      uint32_t flags, uint64_t count, uint64_t payloadBytes, uint32_t param);

/*
 * The checks every decoder starts with: the header is valid and names this
 * codec, its dtype equals the caller's (and is float32 when accumulating),
 * its count equals the caller's, and dst is not NULL when count > 0.
 * On success *hdr holds the header and the payload starts at src + 32.
 */
ncclResult_t codecDecodeBegin(const void *src, size_t len, geoCodecId codec,
                              ncclDataType_t dtype, const void *dst, size_t count,
                              int accumulate, geoCodecHeader *hdr, const char **why);

/* Encoder argument checks shared by all codecs: dtype supported, params
 * valid, pointers set, cap >= need (need from maxEncodedSize, 0 = cannot
 * encode). */
ncclResult_t codecEncodeBegin(const geoCodec *codec, const void *src, size_t count,
                              ncclDataType_t dtype, const geoCodecParams *params,
                              const float *residual, const void *dst, size_t cap,
                              const size_t *written, size_t *need);

/* The members of each codec's table entry (codec.c builds geoCodecs[] from
 * them), defined in the codec_*.c files. */
#define CODEC_DECLARE(N)                                                            \
    size_t codec##N##MaxSize(size_t count, ncclDataType_t dtype,                    \
                             const geoCodecParams *params);                         \
    ncclResult_t codec##N##Encode(const void *src, size_t count, ncclDataType_t dtype, \
                                  const geoCodecParams *params, uint64_t counter,   \
                                  float *residual, void *dst, size_t cap, size_t *written); \
    ncclResult_t codec##N##Decode(const void *src, size_t len, ncclDataType_t dtype, \
                                  void *dst, size_t count, const char **why);       \
    ncclResult_t codec##N##DecodeAcc(const void *src, size_t len, ncclDataType_t dtype, \
                                     float *dst, size_t count, const char **why)

CODEC_DECLARE(None);
CODEC_DECLARE(Lossless);
CODEC_DECLARE(Fp16);
CODEC_DECLARE(Bf16);
CODEC_DECLARE(Int8);
CODEC_DECLARE(Int4);
CODEC_DECLARE(Sign);
CODEC_DECLARE(Topk);

/* supports() of every lossy codec: float32 only. */
int codecFloat32Only(ncclDataType_t dtype);
/* supports() of none and lossless: every valid type. */
int codecAnyType(ncclDataType_t dtype);

#endif
