/*
 * int8 and int4: per-block absmax scaling, round to nearest even or
 * stochastic rounding from the counter-based generator (codec.h gives the
 * exact arithmetic).  Work goes block by block, and inside a block tile by
 * tile (CODEC_TILE elements) so that every inner loop has a constant trip
 * count and vectorises.
 */
#include "config.h"
#include "compress/codec_impl.h"

/* Blocks with a smaller absmax decode to 0: 127 / absmax would overflow. */
#define QUANT_TINY 0x1p-100f

/* 1.5 * 2^23: adding it rounds a float of magnitude < 2^22 to an integer
 * (nearest even), subtracting it again gives that integer exactly. */
#define QUANT_ROUND 0x1.8p23f

CODEC_INLINE uint32_t absmaxBitsTile(const float *restrict v, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = codecF2U(v[i]) & 0x7FFFFFFFu;
        m = u > m ? u : m;
    }
    return m;
}

/* The largest |v| of n values as bits (a NaN, if any, wins). */
static uint32_t absmaxBits(const float *restrict v, size_t n)
{
    uint32_t m = 0;
    size_t i = 0;
    for (; i + CODEC_TILE <= n; i += CODEC_TILE) {
        uint32_t t = absmaxBitsTile(v + i, CODEC_TILE);
        m = t > m ? t : m;
    }
    uint32_t t = absmaxBitsTile(v + i, n - i);
    return t > m ? t : m;
}

CODEC_INLINE void quantNearestTile(const float *restrict v, int8_t *restrict q, size_t n,
                                   float inv, float lim)
{
    for (size_t i = 0; i < n; i++) {
        float t = v[i] * inv;
        t = t > -lim ? t : -lim; /* also NaN -> -lim */
        t = t < lim ? t : lim;
        q[i] = (int8_t)(int32_t)((t + QUANT_ROUND) - QUANT_ROUND);
    }
}

/* first: the index in the chunk of v[0] (the generator's element index). */
CODEC_INLINE void quantStochasticTile(const float *restrict v, int8_t *restrict q, size_t n,
                                      float inv, float lim, uint64_t key, uint64_t first)
{
    for (size_t i = 0; i < n; i++) {
        float t = v[i] * inv;
        t = t > -lim ? t : -lim;
        t = t < lim ? t : lim;
        float s = t + geoCodecUniform(key, first + i);
        int32_t f = (int32_t)s;          /* toward zero, |s| <= 128 */
        f -= (s < (float)f);             /* floor */
        f = f < (int32_t)lim ? f : (int32_t)lim;
        q[i] = (int8_t)f;
    }
}

/* r[i] = v[i] - q[i] * scale with v read from r (0 where not finite). */
CODEC_INLINE void residualTile(float *restrict r, const int8_t *restrict q, size_t n,
                               float scale)
{
    for (size_t i = 0; i < n; i++)
        r[i] = codecFiniteOr0(r[i] - (float)q[i] * scale);
}

/* Two 4-bit two's complement values per byte, low nibble first; n may be
 * odd only at the end of the chunk. */
CODEC_INLINE void packTile(unsigned char *restrict out, const int8_t *restrict q, size_t n)
{
    for (size_t j = 0; j < n / 2; j++)
        out[j] = (unsigned char)(((uint8_t)q[2 * j] & 0x0Fu) | ((uint8_t)q[2 * j + 1] << 4));
    if (n & 1)
        out[n / 2] = (unsigned char)((uint8_t)q[n - 1] & 0x0Fu);
}

/*
 * Encodes the payload: scales at `scales`, values at `vals` (int8: one byte
 * each; int4: packed).  With r, v = x + r is formed in r and r then
 * becomes the residual.
 */
static void quantEncode(int bits, const float *restrict x, float *r, size_t count,
                        uint32_t block, int stochastic, uint64_t key,
                        unsigned char *restrict scales, unsigned char *restrict vals)
{
    const float lim = bits == 8 ? 127.0f : 7.0f;
    int8_t tmp[CODEC_TILE];
    for (size_t start = 0, b = 0; start < count; start += block, b++) {
        size_t n = count - start < block ? count - start : block;
        const float *v = x + start;
        if (r) {
            codecAddInto(r + start, x + start, n);
            v = r + start;
        }
        float absmax = codecU2F(absmaxBits(v, n));
        float scale = 0.0f, inv = 0.0f;
        if (!(absmax < QUANT_TINY)) { /* NaN takes this branch: NaN scale */
            scale = absmax / lim;
            inv = lim / absmax;
        }
        codecStF(scales + 4 * b, scale);
        for (size_t o = 0; o < n; o += CODEC_TILE) {
            size_t tn = n - o < CODEC_TILE ? n - o : CODEC_TILE;
            int8_t *q = bits == 8 ? (int8_t *)(vals + start + o) : tmp;
            if (stochastic) {
                if (tn == CODEC_TILE)
                    quantStochasticTile(v + o, q, CODEC_TILE, inv, lim, key, start + o);
                else
                    quantStochasticTile(v + o, q, tn, inv, lim, key, start + o);
            } else {
                if (tn == CODEC_TILE)
                    quantNearestTile(v + o, q, CODEC_TILE, inv, lim);
                else
                    quantNearestTile(v + o, q, tn, inv, lim);
            }
            if (bits == 4) {
                if (tn == CODEC_TILE)
                    packTile(vals + (start + o) / 2, q, CODEC_TILE);
                else
                    packTile(vals + (start + o) / 2, q, tn);
            }
            if (r) {
                if (tn == CODEC_TILE)
                    residualTile(r + start + o, q, CODEC_TILE, scale);
                else
                    residualTile(r + start + o, q, tn, scale);
            }
        }
    }
}

/* Payload bytes for count elements, or SIZE_MAX. */
static size_t quantPayload(int bits, size_t count, uint32_t block)
{
    size_t nb = codecDivUp(count, block);
    size_t vals = bits == 8 ? count : codecDivUp(count, 2);
    return codecAdd(codecMul(nb, 4), vals);
}

static size_t quantMaxSize(int bits, size_t count, ncclDataType_t dtype,
                           const geoCodecParams *params)
{
    params = codecParamsOrDefault(params);
    if (dtype != ncclFloat32 || !codecBlockSizeValid(params->blockSize))
        return 0;
    size_t p = quantPayload(bits, count, params->blockSize);
    return p == SIZE_MAX ? 0 : codecChunkSize(p);
}

size_t codecInt8MaxSize(size_t count, ncclDataType_t dtype, const geoCodecParams *params)
{
    return quantMaxSize(8, count, dtype, params);
}

size_t codecInt4MaxSize(size_t count, ncclDataType_t dtype, const geoCodecParams *params)
{
    return quantMaxSize(4, count, dtype, params);
}

static ncclResult_t quantEncodeChunk(int bits, const void *src, size_t count,
                                     ncclDataType_t dtype, const geoCodecParams *params,
                                     uint64_t counter, float *residual, void *dst, size_t cap,
                                     size_t *written)
{
    geoCodecId id = bits == 8 ? GEO_CODEC_INT8 : GEO_CODEC_INT4;
    size_t need;
    ncclResult_t res = codecEncodeBegin(&geoCodecs[id], src, count, dtype, params, residual,
                                        dst, cap, written, &need);
    if (res != ncclSuccess)
        return res;
    params = codecParamsOrDefault(params);
    uint32_t block = params->blockSize;
    unsigned char *out = dst;
    size_t nb = codecDivUp(count, block);
    int stochastic = params->stochastic != 0;
    codecWriteHeader(out, id, dtype, stochastic ? GEO_CODEC_FLAG_STOCHASTIC : 0, count,
                     need - GEO_CODEC_HEADER_BYTES, block);
    unsigned char *scales = out + GEO_CODEC_HEADER_BYTES;
    quantEncode(bits, src, residual, count, block, stochastic,
                geoCodecRandomKey(params->seed, counter), scales, scales + 4 * nb);
    *written = need;
    return ncclSuccess;
}

ncclResult_t codecInt8Encode(const void *src, size_t count, ncclDataType_t dtype,
                             const geoCodecParams *params, uint64_t counter,
                             float *residual, void *dst, size_t cap, size_t *written)
{
    return quantEncodeChunk(8, src, count, dtype, params, counter, residual, dst, cap, written);
}

ncclResult_t codecInt4Encode(const void *src, size_t count, ncclDataType_t dtype,
                             const geoCodecParams *params, uint64_t counter,
                             float *residual, void *dst, size_t cap, size_t *written)
{
    return quantEncodeChunk(4, src, count, dtype, params, counter, residual, dst, cap, written);
}

/* ------------------------------------------------------------------------ */

CODEC_INLINE void deq8Tile(float *restrict d, const unsigned char *restrict q, size_t n,
                           float scale, int acc)
{
    if (acc)
        for (size_t i = 0; i < n; i++)
            d[i] += (float)(int8_t)q[i] * scale;
    else
        for (size_t i = 0; i < n; i++)
            d[i] = (float)(int8_t)q[i] * scale;
}

/* n elements from n/2 (rounded up) bytes. */
CODEC_INLINE void deq4Tile(float *restrict d, const unsigned char *restrict q, size_t n,
                           float scale, int acc)
{
    for (size_t j = 0; j < n / 2; j++) {
        int lo = (int)((q[j] & 0x0Fu) ^ 8u) - 8, hi = (int)((q[j] >> 4) ^ 8u) - 8;
        if (acc) {
            d[2 * j] += (float)lo * scale;
            d[2 * j + 1] += (float)hi * scale;
        } else {
            d[2 * j] = (float)lo * scale;
            d[2 * j + 1] = (float)hi * scale;
        }
    }
    if (n & 1) {
        int lo = (int)((q[n / 2] & 0x0Fu) ^ 8u) - 8;
        if (acc)
            d[n - 1] += (float)lo * scale;
        else
            d[n - 1] = (float)lo * scale;
    }
}

static ncclResult_t quantDecode(int bits, const void *src, size_t len, ncclDataType_t dtype,
                                float *dst, size_t count, int acc, const char **why)
{
    geoCodecId id = bits == 8 ? GEO_CODEC_INT8 : GEO_CODEC_INT4;
    geoCodecHeader h;
    ncclResult_t res = codecDecodeBegin(src, len, id, dtype, dst, count, acc, &h, why);
    if (res != ncclSuccess)
        return res;
    if (dtype != ncclFloat32)
        CODEC_BAD(why, "int8/int4 chunks stand for float32 elements");
    if (!codecBlockSizeValid(h.param))
        CODEC_BAD(why, "int8/int4 block size is not a multiple of 8 in [8, 2^24]");
    uint32_t block = h.param;
    size_t payload = quantPayload(bits, count, block);
    if (payload == SIZE_MAX || h.payloadBytes != (uint64_t)payload)
        CODEC_BAD(why, "int8/int4 payload length differs from scales + values");
    const unsigned char *scales = (const unsigned char *)src + GEO_CODEC_HEADER_BYTES;
    const unsigned char *vals = scales + 4 * codecDivUp(count, block);
    if (bits == 4 && (count & 1) && (vals[count / 2] >> 4) != 0)
        CODEC_BAD(why, "int4 padding nibble after an odd count is not 0");
    for (size_t start = 0, b = 0; start < count; start += block, b++) {
        size_t n = count - start < block ? count - start : block;
        float scale = codecLdF(scales + 4 * b);
        float *d = dst + start;
        size_t o = 0;
        if (bits == 8) {
            const unsigned char *q = vals + start;
            if (acc)
                for (; o + CODEC_TILE <= n; o += CODEC_TILE)
                    deq8Tile(d + o, q + o, CODEC_TILE, scale, 1);
            else
                for (; o + CODEC_TILE <= n; o += CODEC_TILE)
                    deq8Tile(d + o, q + o, CODEC_TILE, scale, 0);
            deq8Tile(d + o, q + o, n - o, scale, acc);
        } else {
            const unsigned char *q = vals + start / 2;
            if (acc)
                for (; o + CODEC_TILE <= n; o += CODEC_TILE)
                    deq4Tile(d + o, q + o / 2, CODEC_TILE, scale, 1);
            else
                for (; o + CODEC_TILE <= n; o += CODEC_TILE)
                    deq4Tile(d + o, q + o / 2, CODEC_TILE, scale, 0);
            deq4Tile(d + o, q + o / 2, n - o, scale, acc);
        }
    }
    return ncclSuccess;
}

ncclResult_t codecInt8Decode(const void *src, size_t len, ncclDataType_t dtype, void *dst,
                             size_t count, const char **why)
{
    return quantDecode(8, src, len, dtype, dst, count, 0, why);
}

ncclResult_t codecInt8DecodeAcc(const void *src, size_t len, ncclDataType_t dtype,
                                float *dst, size_t count, const char **why)
{
    return quantDecode(8, src, len, dtype, dst, count, 1, why);
}

ncclResult_t codecInt4Decode(const void *src, size_t len, ncclDataType_t dtype, void *dst,
                             size_t count, const char **why)
{
    return quantDecode(4, src, len, dtype, dst, count, 0, why);
}

ncclResult_t codecInt4DecodeAcc(const void *src, size_t len, ncclDataType_t dtype,
                                float *dst, size_t count, const char **why)
{
    return quantDecode(4, src, len, dtype, dst, count, 1, why);
}
