/*
 * sign: one bit per element (set when the element is < 0) and one float32
 * scale per block, the mean |v| of the block, summed in the 32-lane order
 * codec.h specifies so that a warp reduction reproduces it bit for bit.
 */
#include "config.h"
/* GCC at -O2 (its "very cheap" vectoriser) leaves the bit packing and
 * unpacking scalar; with the dynamic cost model of -O3 they vectorise:
 * encode 1.85 -> 3.21 GB/s, decode 2.86 -> 4.79 GB/s here (tests/unit/test_codec,
 * 64 MiB).  Only this file: int8's encoder is slower at -O3.  The bytes do
 * not change (the arithmetic is the same; no -ffast-math). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include "compress/codec_impl.h"

CODEC_INLINE void laneAdd(float *restrict lane, const float *restrict v, size_t n)
{
    for (size_t l = 0; l < n; l++)
        lane[l] += fabsf(v[l]);
}

/* Sum of |v| over one block: lanes of 32, then a halving tree. */
static float blockAbsSum(const float *restrict v, size_t n)
{
    float lane[32] = {0};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        laneAdd(lane, v + i, 32);
    laneAdd(lane, v + i, n - i);
    for (size_t d = 16; d >= 1; d /= 2)
        for (size_t l = 0; l < d; l++)
            lane[l] += lane[l + d];
    return lane[0];
}

/* 8 elements -> one byte, bit j set when v[j] < 0. */
CODEC_INLINE void packSigns(unsigned char *restrict out, const float *restrict v, size_t nbytes)
{
    for (size_t k = 0; k < nbytes; k++) {
        uint32_t b = 0;
        for (unsigned j = 0; j < 8; j++)
            b |= (uint32_t)(v[8 * k + j] < 0.0f) << j;
        out[k] = (unsigned char)b;
    }
}

CODEC_INLINE void signResidualTile(float *restrict r, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        r[i] = codecFiniteOr0(r[i] - (r[i] < 0.0f ? -scale : scale));
}

static size_t signPayload(size_t count, uint32_t block)
{
    return codecAdd(codecMul(codecDivUp(count, block), 4), codecDivUp(count, 8));
}

size_t codecSignMaxSize(size_t count, ncclDataType_t dtype, const geoCodecParams *params)
{
    params = codecParamsOrDefault(params);
    if (dtype != ncclFloat32 || !codecBlockSizeValid(params->blockSize))
        return 0;
    size_t p = signPayload(count, params->blockSize);
    return p == SIZE_MAX ? 0 : codecChunkSize(p);
}

ncclResult_t codecSignEncode(const void *src, size_t count, ncclDataType_t dtype,
                             const geoCodecParams *params, uint64_t counter,
                             float *residual, void *dst, size_t cap, size_t *written)
{
    (void)counter;
    size_t need;
    ncclResult_t res = codecEncodeBegin(&geoCodecs[GEO_CODEC_SIGN], src, count, dtype, params,
                                        residual, dst, cap, written, &need);
    if (res != ncclSuccess)
        return res;
    params = codecParamsOrDefault(params);
    uint32_t block = params->blockSize;
    unsigned char *out = dst;
    codecWriteHeader(out, GEO_CODEC_SIGN, dtype, 0, count, need - GEO_CODEC_HEADER_BYTES, block);
    unsigned char *scales = out + GEO_CODEC_HEADER_BYTES;
    unsigned char *bits = scales + 4 * codecDivUp(count, block);
    const float *x = src;
    for (size_t start = 0, b = 0; start < count; start += block, b++) {
        size_t n = count - start < block ? count - start : block;
        const float *v = x + start;
        if (residual) {
            codecAddInto(residual + start, v, n);
            v = residual + start;
        }
        float scale = blockAbsSum(v, n) / (float)n;
        /* One NaN for every compiler and device: a vectorised sum keeps
         * whichever NaN payload its operand order picked. */
        if (scale != scale)
            scale = codecU2F(0x7FC00000u);
        codecStF(scales + 4 * b, scale);
        /* Blocks start on a byte (block % 8 == 0); only the chunk's last
         * byte may be partial. */
        unsigned char *o = bits + start / 8;
        size_t k = 0;
        for (; k + CODEC_TILE / 8 <= n / 8; k += CODEC_TILE / 8)
            packSigns(o + k, v + 8 * k, CODEC_TILE / 8);
        packSigns(o + k, v + 8 * k, n / 8 - k);
        if (n % 8) {
            unsigned last = 0;
            for (size_t j = 0; j < n % 8; j++)
                last |= (unsigned)(v[n / 8 * 8 + j] < 0.0f) << j;
            o[n / 8] = (unsigned char)last;
        }
        if (residual) {
            size_t i = 0;
            for (; i + CODEC_TILE <= n; i += CODEC_TILE)
                signResidualTile(residual + start + i, CODEC_TILE, scale);
            signResidualTile(residual + start + i, n - i, scale);
        }
    }
    *written = need;
    return ncclSuccess;
}

/* Element 8k+j is scale with its sign bit flipped when bit j of byte k is
 * set (IEEE negation), so the loop is integer work that vectorises. */
CODEC_INLINE void unpackTile(float *restrict d, const unsigned char *restrict bits, size_t nbytes,
                             float scale, int acc)
{
    uint32_t sb = codecF2U(scale);
    for (size_t k = 0; k < nbytes; k++) {
        uint32_t b = bits[k];
        for (unsigned j = 0; j < 8; j++) {
            float s = codecU2F(sb ^ (((b >> j) & 1u) << 31));
            if (acc)
                d[8 * k + j] += s;
            else
                d[8 * k + j] = s;
        }
    }
}

static ncclResult_t signDecode(const void *src, size_t len, ncclDataType_t dtype, float *dst,
                               size_t count, int acc, const char **why)
{
    geoCodecHeader h;
    ncclResult_t res = codecDecodeBegin(src, len, GEO_CODEC_SIGN, dtype, dst, count, acc, &h,
                                        why);
    if (res != ncclSuccess)
        return res;
    if (dtype != ncclFloat32)
        CODEC_BAD(why, "sign chunks stand for float32 elements");
    if (!codecBlockSizeValid(h.param))
        CODEC_BAD(why, "sign block size is not a multiple of 8 in [8, 2^24]");
    uint32_t block = h.param;
    size_t payload = signPayload(count, block);
    if (payload == SIZE_MAX || h.payloadBytes != (uint64_t)payload)
        CODEC_BAD(why, "sign payload length differs from scales + bits");
    const unsigned char *scales = (const unsigned char *)src + GEO_CODEC_HEADER_BYTES;
    const unsigned char *bits = scales + 4 * codecDivUp(count, block);
    if (count % 8 && (bits[count / 8] >> (count % 8)) != 0)
        CODEC_BAD(why, "sign padding bits after the last element are not 0");
    for (size_t start = 0, b = 0; start < count; start += block, b++) {
        size_t n = count - start < block ? count - start : block;
        float scale = codecLdF(scales + 4 * b);
        float *d = dst + start;
        const unsigned char *q = bits + start / 8;
        size_t k = 0;
        if (acc)
            for (; k + CODEC_TILE / 8 <= n / 8; k += CODEC_TILE / 8)
                unpackTile(d + 8 * k, q + k, CODEC_TILE / 8, scale, 1);
        else
            for (; k + CODEC_TILE / 8 <= n / 8; k += CODEC_TILE / 8)
                unpackTile(d + 8 * k, q + k, CODEC_TILE / 8, scale, 0);
        unpackTile(d + 8 * k, q + k, n / 8 - k, scale, acc);
        for (size_t j = 0; j < n % 8; j++) {
            float s = codecU2F(codecF2U(scale) ^ (((uint32_t)(q[n / 8] >> j) & 1u) << 31));
            if (acc)
                d[n / 8 * 8 + j] += s;
            else
                d[n / 8 * 8 + j] = s;
        }
    }
    return ncclSuccess;
}

ncclResult_t codecSignDecode(const void *src, size_t len, ncclDataType_t dtype, void *dst,
                             size_t count, const char **why)
{
    return signDecode(src, len, dtype, dst, count, 0, why);
}

ncclResult_t codecSignDecodeAcc(const void *src, size_t len, ncclDataType_t dtype,
                                float *dst, size_t count, const char **why)
{
    return signDecode(src, len, dtype, dst, count, 1, why);
}
