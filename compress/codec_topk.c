/*
 * topk: the k elements of largest magnitude (ties to the lower index), as
 * k uint32 indices in increasing order and their k float32 values.
 *
 * Selection is a radix select on key = |v| as bits (for binary32 the bit
 * pattern of |v| orders like the value): a histogram of the top 16 key bits
 * finds the bucket that holds the k-th largest key, a second histogram of
 * the low 15 bits inside that bucket finds the key T itself, and one more
 * pass keeps every key > T and the first (in index order) keys == T until
 * there are k.  Three linear passes, no sort, the same set as the ordering
 * codec.h defines, and the output comes out in index order.
 */
#include "config.h"
#include "compress/codec_impl.h"

#include <stdlib.h>
#include <string.h>

#define TOPK_HI_BITS 16
#define TOPK_LO_BITS 15 /* 16 + 15 = the 31 bits of |v| */

/* Elements kept out of count for fraction f: min(count, max(1, ceil(f *
 * count))), 0 for an empty chunk. */
static size_t topkCount(size_t count, double f)
{
    if (count == 0)
        return 0;
    double kd = ceil(f * (double)count);
    if (!(kd < (double)count))
        return count;
    return kd < 1.0 ? 1 : (size_t)kd;
}

static int topkFractionValid(double f) { return f > 0.0 && f <= 1.0; }

size_t codecTopkMaxSize(size_t count, ncclDataType_t dtype, const geoCodecParams *params)
{
    params = codecParamsOrDefault(params);
    if (dtype != ncclFloat32 || !topkFractionValid(params->topkFraction) ||
        count > GEO_CODEC_TOPK_MAX_COUNT)
        return 0;
    size_t p = codecMul(topkCount(count, params->topkFraction), 8);
    return p == SIZE_MAX ? 0 : codecChunkSize(p);
}

static inline uint32_t topkKey(float v) { return codecF2U(v) & 0x7FFFFFFFu; }

/* Finds the key T of the k-th largest key and how many elements with key
 * == T belong to the top k.  hist: 2^16 counters of scratch. */
static void topkThreshold(const float *restrict v, size_t n, size_t k,
                          uint32_t *restrict hist, uint32_t *thresh, size_t *takeEqual)
{
    memset(hist, 0, sizeof(uint32_t) << TOPK_HI_BITS);
    for (size_t i = 0; i < n; i++)
        hist[topkKey(v[i]) >> TOPK_LO_BITS]++;
    size_t above = 0;
    uint32_t hi = (1u << TOPK_HI_BITS) - 1;
    while (above + hist[hi] < k) /* stops: the counts add up to n >= k */
        above += hist[hi--];
    size_t need = k - above;

    memset(hist, 0, sizeof(uint32_t) << TOPK_LO_BITS);
    const uint32_t mask = (1u << TOPK_LO_BITS) - 1;
    for (size_t i = 0; i < n; i++) {
        uint32_t key = topkKey(v[i]);
        if ((key >> TOPK_LO_BITS) == hi)
            hist[key & mask]++;
    }
    size_t above2 = 0;
    uint32_t lo = mask;
    while (above2 + hist[lo] < need)
        above2 += hist[lo--];
    *thresh = hi << TOPK_LO_BITS | lo;
    *takeEqual = need - above2;
}

ncclResult_t codecTopkEncode(const void *src, size_t count, ncclDataType_t dtype,
                             const geoCodecParams *params, uint64_t counter,
                             float *residual, void *dst, size_t cap, size_t *written)
{
    (void)counter;
    size_t need;
    ncclResult_t res = codecEncodeBegin(&geoCodecs[GEO_CODEC_TOPK], src, count, dtype, params,
                                        residual, dst, cap, written, &need);
    if (res != ncclSuccess)
        return res;
    params = codecParamsOrDefault(params);
    size_t k = topkCount(count, params->topkFraction);
    unsigned char *out = dst;
    codecWriteHeader(out, GEO_CODEC_TOPK, dtype, 0, count, 8 * (uint64_t)k, (uint32_t)k);
    if (count == 0) {
        *written = need;
        return ncclSuccess;
    }
    /* Scratch first, so that a failure leaves the residual as it was. */
    uint32_t *hist = malloc(sizeof(uint32_t) << TOPK_HI_BITS);
    if (!hist)
        return ncclSystemError;
    const float *v = src;
    if (residual) {
        codecAddInto(residual, src, count);
        v = residual;
    }
    uint32_t thresh;
    size_t takeEqual;
    topkThreshold(v, count, k, hist, &thresh, &takeEqual);
    free(hist);

    unsigned char *idx = out + GEO_CODEC_HEADER_BYTES, *val = idx + 4 * k;
    size_t j = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t key = topkKey(v[i]);
        int take = key > thresh || (key == thresh && takeEqual > 0);
        if (take) {
            takeEqual -= key == thresh;
            codecSt32(idx + 4 * j, (uint32_t)i);
            codecStF(val + 4 * j, v[i]);
            j++;
        }
        if (residual)
            residual[i] = take ? 0.0f : codecFiniteOr0(residual[i]);
    }
    *written = need;
    return ncclSuccess;
}

static ncclResult_t topkDecode(const void *src, size_t len, ncclDataType_t dtype, float *dst,
                               size_t count, int acc, const char **why)
{
    geoCodecHeader h;
    ncclResult_t res = codecDecodeBegin(src, len, GEO_CODEC_TOPK, dtype, dst, count, acc, &h,
                                        why);
    if (res != ncclSuccess)
        return res;
    if (dtype != ncclFloat32)
        CODEC_BAD(why, "topk chunks stand for float32 elements");
    size_t k = h.param;
    if (k > count)
        CODEC_BAD(why, "topk k exceeds the element count");
    if (h.payloadBytes != 8 * (uint64_t)k)
        CODEC_BAD(why, "topk payload length differs from 8 * k");
    const unsigned char *idx = (const unsigned char *)src + GEO_CODEC_HEADER_BYTES;
    const unsigned char *val = idx + 4 * k;
    /* All indices before any write: strictly increasing (no duplicates, so
     * accumulate adds each element once) and inside the chunk. */
    for (size_t j = 0; j < k; j++) {
        uint32_t i = codecLd32(idx + 4 * j);
        if ((uint64_t)i >= (uint64_t)count)
            CODEC_BAD(why, "topk index outside the chunk");
        if (j > 0 && i <= codecLd32(idx + 4 * (j - 1)))
            CODEC_BAD(why, "topk indices not strictly increasing");
    }
    if (acc) {
        for (size_t j = 0; j < k; j++)
            dst[codecLd32(idx + 4 * j)] += codecLdF(val + 4 * j);
    } else {
        if (count)
            memset(dst, 0, count * sizeof(float));
        for (size_t j = 0; j < k; j++)
            dst[codecLd32(idx + 4 * j)] = codecLdF(val + 4 * j);
    }
    return ncclSuccess;
}

ncclResult_t codecTopkDecode(const void *src, size_t len, ncclDataType_t dtype, void *dst,
                             size_t count, const char **why)
{
    return topkDecode(src, len, dtype, dst, count, 0, why);
}

ncclResult_t codecTopkDecodeAcc(const void *src, size_t len, ncclDataType_t dtype,
                                float *dst, size_t count, const char **why)
{
    return topkDecode(src, len, dtype, dst, count, 1, why);
}
