/*
 * GPU decoders of every codec but lossless: one thread per group of 8
 * elements, grid-stride.  Every CUDA block checks the chunk header, as the
 * CPU decoder does, before it writes anything; topk has one kernel that
 * checks the header and the indices first, and the writers read its
 * verdict.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "cuda/kernels_internal.h"

/* ------------------------------------------------------------------------ */
/* Decoders: the chunk checks                                                */
/* ------------------------------------------------------------------------ */

GEO_DEV size_t devTypeSize(unsigned dtype)
{
    switch (dtype) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

GEO_DEV bool devBlockValid(uint32_t b) { return b >= 8 && b <= GEO_CODEC_BLOCK_MAX && b % 8 == 0; }

/* codecAdd / codecMul: saturate at SIZE_MAX. */
GEO_DEV size_t devAdd(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
GEO_DEV size_t devMul(size_t a, size_t b)
{
    return (b != 0 && a > SIZE_MAX / b) ? SIZE_MAX : a * b;
}

/* What the CPU's decoder checks before it writes (every check but the topk
 * indices), in its order.  Reads at most the 32 header bytes and, for a
 * padding check, one payload byte, all within len. */
GEO_DEV int chunkStatus(const unsigned char *src, size_t len, unsigned codec, unsigned dtype,
                        bool acc, size_t count)
{
    if (len < GEO_CODEC_HEADER_BYTES)
        return GEO_CUDA_DECODE_SHORT;
    uint32_t w[8];
    for (int i = 0; i < 8; i++)
        w[i] = ((const uint32_t *)src)[i];
    if (w[0] != GEO_CODEC_MAGIC)
        return GEO_CUDA_DECODE_MAGIC;
    if ((w[1] & 0xFF) != GEO_CODEC_VERSION)
        return GEO_CUDA_DECODE_VERSION;
    uint32_t sum = 0x811C9DC5u;
    for (int i = 0; i < 28; i++)
        sum = (sum ^ ((w[i / 4] >> (8 * (i % 4))) & 0xFF)) * 0x01000193u;
    if (w[7] != sum)
        return GEO_CUDA_DECODE_CHECKSUM;
    unsigned hcodec = (w[1] >> 8) & 0xFF, hdtype = (w[1] >> 16) & 0xFF, flags = w[1] >> 24;
    if (hcodec >= GEO_CODEC_COUNT)
        return GEO_CUDA_DECODE_UNKNOWN_CODEC;
    if (devTypeSize(hdtype) == 0)
        return GEO_CUDA_DECODE_UNKNOWN_DTYPE;
    unsigned allowed = (hcodec == GEO_CODEC_LOSSLESS || hcodec == GEO_CODEC_INT8 ||
                        hcodec == GEO_CODEC_INT4) ? 1u : 0u;
    if (flags & ~allowed)
        return GEO_CUDA_DECODE_FLAGS;
    uint64_t hcount = (uint64_t)w[2] | (uint64_t)w[3] << 32;
    uint64_t payload = (uint64_t)w[4] | (uint64_t)w[5] << 32;
    uint32_t param = w[6];
    if (payload != (uint64_t)(len - GEO_CODEC_HEADER_BYTES))
        return GEO_CUDA_DECODE_LENGTH;
    if (hcodec != codec)
        return GEO_CUDA_DECODE_OTHER_CODEC;
    if (hdtype != dtype)
        return GEO_CUDA_DECODE_DTYPE;
    if (acc && dtype != ncclFloat32)
        return GEO_CUDA_DECODE_ACC_DTYPE;
    if (hcount != (uint64_t)count)
        return GEO_CUDA_DECODE_COUNT;
    const unsigned char *p = src + GEO_CODEC_HEADER_BYTES;
    switch (codec) {
    case GEO_CODEC_NONE: {
        size_t s = devTypeSize(dtype);
        if (count > SIZE_MAX / s || payload != (uint64_t)count * s)
            return GEO_CUDA_DECODE_PAYLOAD;
        if (param != 0)
            return GEO_CUDA_DECODE_PARAM;
        return GEO_CUDA_DECODE_OK;
    }
    case GEO_CODEC_FP16:
    case GEO_CODEC_BF16:
        if (dtype != ncclFloat32)
            return GEO_CUDA_DECODE_DTYPE;
        if (payload != 2 * (uint64_t)count || count > SIZE_MAX / 2)
            return GEO_CUDA_DECODE_PAYLOAD;
        if (param != 0)
            return GEO_CUDA_DECODE_PARAM;
        return GEO_CUDA_DECODE_OK;
    case GEO_CODEC_INT8:
    case GEO_CODEC_INT4: {
        if (dtype != ncclFloat32)
            return GEO_CUDA_DECODE_DTYPE;
        if (!devBlockValid(param))
            return GEO_CUDA_DECODE_PARAM;
        size_t nb = count / param + (count % param != 0);
        size_t vals = codec == GEO_CODEC_INT8 ? count : count / 2 + (count & 1);
        size_t want = devAdd(devMul(nb, 4), vals);
        if (want == SIZE_MAX || payload != (uint64_t)want)
            return GEO_CUDA_DECODE_PAYLOAD;
        if (codec == GEO_CODEC_INT4 && (count & 1) && (p[4 * nb + count / 2] >> 4) != 0)
            return GEO_CUDA_DECODE_PADDING;
        return GEO_CUDA_DECODE_OK;
    }
    case GEO_CODEC_SIGN: {
        if (dtype != ncclFloat32)
            return GEO_CUDA_DECODE_DTYPE;
        if (!devBlockValid(param))
            return GEO_CUDA_DECODE_PARAM;
        size_t nb = count / param + (count % param != 0);
        size_t want = devAdd(devMul(nb, 4), count / 8 + (count % 8 != 0));
        if (want == SIZE_MAX || payload != (uint64_t)want)
            return GEO_CUDA_DECODE_PAYLOAD;
        if (count % 8 && (p[4 * nb + count / 8] >> (count % 8)) != 0)
            return GEO_CUDA_DECODE_PADDING;
        return GEO_CUDA_DECODE_OK;
    }
    case GEO_CODEC_TOPK:
        if (dtype != ncclFloat32)
            return GEO_CUDA_DECODE_DTYPE;
        if ((size_t)param > count)
            return GEO_CUDA_DECODE_TOPK_K;
        if (payload != 8 * (uint64_t)param)
            return GEO_CUDA_DECODE_PAYLOAD;
        return GEO_CUDA_DECODE_OK;
    default:
        return GEO_CUDA_DECODE_OTHER_CODEC; /* lossless never gets here */
    }
}

/* Every CUDA block of a decoder starts with this: thread 0 checks the chunk
 * (block 0 also writes the verdict), and the block goes on only if valid. */
GEO_DEV bool blockChunkOk(const unsigned char *src, size_t len, unsigned codec, unsigned dtype,
                          bool acc, size_t count, int *status)
{
    __shared__ int st;
    if (threadIdx.x == 0) {
        st = chunkStatus(src, len, codec, dtype, acc, count);
        if (blockIdx.x == 0)
            *status = st;
    }
    __syncthreads();
    return st == GEO_CUDA_DECODE_OK;
}

/* ------------------------------------------------------------------------ */
/* Decoders                                                                  */
/* ------------------------------------------------------------------------ */

/* none, non-float32 or plain decode: copy count * size payload bytes. */
template <bool A16>
GEO_KERNEL void decodeCopyKernel(const unsigned char *src, size_t len, unsigned dtype,
                                 unsigned char *dst, size_t count, size_t nbytes, int *status)
{
    if (!blockChunkOk(src, len, GEO_CODEC_NONE, dtype, false, count, status))
        return;
    const unsigned char *p = src + GEO_CODEC_HEADER_BYTES; /* 16-byte aligned */
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t nvec = A16 ? nbytes / 16 : 0;
    for (size_t v = first; v < nvec; v += stride)
        ((uint4 *)dst)[v] = ((const uint4 *)p)[v];
    for (size_t b = 16 * nvec + first; b < nbytes; b += stride)
        dst[b] = p[b];
}

/* float32 decoders of none (accumulate only), fp16, bf16, int8, int4, sign:
 * one thread per group of 8 elements. */
template <int CODEC, bool ACC, bool A>
GEO_KERNEL void decodeKernel(const unsigned char *src, size_t len, float *dst, size_t count,
                             int *status)
{
    if (!blockChunkOk(src, len, CODEC, ncclFloat32, ACC, count, status))
        return;
    const unsigned char *p = src + GEO_CODEC_HEADER_BYTES;
    /* Valid chunk: the header's param is the block size (int8/int4/sign). */
    uint32_t B = ((const uint32_t *)src)[6];
    size_t nb = 0;
    unsigned shift = 0;
    bool pow2 = false;
    if (CODEC == GEO_CODEC_INT8 || CODEC == GEO_CODEC_INT4 || CODEC == GEO_CODEC_SIGN) {
        nb = count / B + (count % B != 0);
        pow2 = (B & (B - 1)) == 0;
        while ((1u << shift) < B)
            shift++;
    }
    const float *scales = (const float *)p;
    const unsigned char *vals = p + 4 * nb;
    size_t ngroups = (count + 7) / 8;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < ngroups; g += stride) {
        size_t e = 8 * g;
        unsigned n = groupLen(e, count);
        float d[8];
        if (CODEC == GEO_CODEC_NONE) {
            if (n == 8)
                load8<true>((const float *)p + e, d);
            else
                loadPart((const float *)p + e, d, n);
        } else if (CODEC == GEO_CODEC_FP16 || CODEC == GEO_CODEC_BF16) {
            uint32_t hv[8];
            if (n == 8) {
                uint4 w = *(const uint4 *)(p + 2 * e);
                uint32_t ws[4] = {w.x, w.y, w.z, w.w};
                for (int j = 0; j < 8; j++)
                    hv[j] = (ws[j / 2] >> (16 * (j % 2))) & 0xFFFFu;
            } else {
                GEO_UNROLL
                for (unsigned j = 0; j < 8; j++) {
                    hv[j] = 0;
                    if (j < n)
                        hv[j] = ((const uint16_t *)p)[e + j];
                }
            }
            for (int j = 0; j < 8; j++)
                d[j] = CODEC == GEO_CODEC_FP16 ? f16ToF32(hv[j]) : bf16ToF32(hv[j]);
        } else {
            size_t b = pow2 ? e >> shift : e / B; /* the 8 share a block (B % 8 == 0) */
            float scale = scales[b];
            if (CODEC == GEO_CODEC_SIGN) {
                uint32_t sb = fBits(scale), byte = vals[e / 8];
                for (int j = 0; j < 8; j++)
                    d[j] = bitsF(sb ^ (((byte >> j) & 1u) << 31));
            } else {
                int q[8];
                if (CODEC == GEO_CODEC_INT8) {
                    if (n == 8) {
                        uint32_t w0 = ((const uint32_t *)(vals + e))[0];
                        uint32_t w1 = ((const uint32_t *)(vals + e))[1];
                        for (int j = 0; j < 4; j++) {
                            q[j] = (int)(int8_t)(uint8_t)(w0 >> (8 * j));
                            q[4 + j] = (int)(int8_t)(uint8_t)(w1 >> (8 * j));
                        }
                    } else {
                        GEO_UNROLL
                        for (unsigned j = 0; j < 8; j++) {
                            q[j] = 0;
                            if (j < n)
                                q[j] = (int)(int8_t)vals[e + j];
                        }
                    }
                } else {
                    uint32_t w = 0;
                    if (n == 8) {
                        w = *(const uint32_t *)(vals + e / 2);
                    } else {
                        GEO_UNROLL
                        for (unsigned m = 0; m < 4; m++)
                            if (m < (n + 1) / 2)
                                w |= (uint32_t)vals[e / 2 + m] << (8 * m);
                    }
                    for (int j = 0; j < 8; j++)
                        q[j] = (int)(((w >> (4 * j)) & 0xFu) ^ 8u) - 8;
                }
                for (int j = 0; j < 8; j++)
                    d[j] = fMulN((float)q[j], scale);
            }
        }
        if (ACC) {
            float o[8];
            if (n == 8)
                load8<A>(dst + e, o);
            else
                loadPart(dst + e, o, n);
            for (int j = 0; j < 8; j++)
                d[j] = fAddN(o[j], d[j]);
        }
        if (n == 8)
            store8<A>(dst + e, d);
        else
            storePart(dst + e, d, n);
    }
}

/* topk, first kernel (one block): the header checks, then every index in
 * order (range, then strictly increasing), as the CPU; writes *status. */
GEO_KERNEL_ONE void topkCheckKernel(const unsigned char *src, size_t len, bool acc, size_t count,
                                int *status)
{
    __shared__ int st;
    __shared__ unsigned long long firstBad;
    if (threadIdx.x == 0) {
        st = chunkStatus(src, len, GEO_CODEC_TOPK, ncclFloat32, acc, count);
        firstBad = ULLONG_MAX;
    }
    __syncthreads();
    if (st == GEO_CUDA_DECODE_OK) {
        const uint32_t *idx = (const uint32_t *)(src + GEO_CODEC_HEADER_BYTES);
        size_t k = ((const uint32_t *)src)[6];
        for (size_t base = 0; base < k; base += blockDim.x) {
            size_t j = base + threadIdx.x;
            if (j < k) {
                uint32_t i = idx[j];
                if ((uint64_t)i >= (uint64_t)count || (j > 0 && i <= idx[j - 1]))
                    atomicMin(&firstBad, (unsigned long long)j);
            }
            __syncthreads();
            bool found = firstBad != ULLONG_MAX;
            __syncthreads(); /* everyone has read it before the next round's atomics */
            if (found) { /* uniform */
                if (threadIdx.x == 0) {
                    uint32_t i = idx[firstBad];
                    st = (uint64_t)i >= (uint64_t)count ? GEO_CUDA_DECODE_TOPK_RANGE
                                                        : GEO_CUDA_DECODE_TOPK_ORDER;
                }
                break;
            }
        }
    }
    if (threadIdx.x == 0)
        *status = st;
}

/* topk decode (not accumulate): zero dst when the check passed. */
GEO_KERNEL void topkZeroKernel(float *dst, size_t count, const int *status)
{
    if (*status != GEO_CUDA_DECODE_OK)
        return;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        dst[i] = 0.0f;
}

/* topk: dst[idx[j]] = (or +=) val[j]; indices are distinct (checked). */
template <bool ACC>
GEO_KERNEL void topkScatterKernel(const unsigned char *src, float *dst, const int *status)
{
    if (*status != GEO_CUDA_DECODE_OK)
        return;
    size_t k = ((const uint32_t *)src)[6];
    const uint32_t *idx = (const uint32_t *)(src + GEO_CODEC_HEADER_BYTES);
    const float *val = (const float *)(idx + k);
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < k; j += stride) {
        if (ACC)
            dst[idx[j]] = fAddN(dst[idx[j]], val[j]);
        else
            dst[idx[j]] = val[j];
    }
}

template <int CODEC>
static void launchDecode(const DecodeCall &c)
{
    unsigned grid = gridFor(hDivUp(c.count, 8), GEO_THREADS);
    float *d = (float *)c.dst;
    if (c.acc && c.a)
        GEO_LAUNCH(grid, GEO_THREADS, c.st, decodeKernel<CODEC, true, true>)
        (c.src, c.len, d, c.count, c.status);
    else if (c.acc)
        GEO_LAUNCH(grid, GEO_THREADS, c.st, decodeKernel<CODEC, true, false>)
        (c.src, c.len, d, c.count, c.status);
    else if (c.a)
        GEO_LAUNCH(grid, GEO_THREADS, c.st, decodeKernel<CODEC, false, true>)
        (c.src, c.len, d, c.count, c.status);
    else
        GEO_LAUNCH(grid, GEO_THREADS, c.st, decodeKernel<CODEC, false, false>)
        (c.src, c.len, d, c.count, c.status);
}

void gpuNoneDecode(const DecodeCall &c)
{
    if (c.acc) {
        launchDecode<GEO_CODEC_NONE>(c);
        return;
    }
    /* Any dtype: bytes.  A chunk whose count disagrees stops at the header
     * check, so a saturated nbytes is never used. */
    size_t nbytes = hMul(c.count, hostTypeSize(c.dtype));
    unsigned g = gridFor(nbytes == SIZE_MAX ? 1 : hDivUp(nbytes, 16), GEO_THREADS);
    unsigned char *d = (unsigned char *)c.dst;
    if (c.a)
        GEO_LAUNCH(g, GEO_THREADS, c.st, decodeCopyKernel<true>)
        (c.src, c.len, c.dtype, d, c.count, nbytes, c.status);
    else
        GEO_LAUNCH(g, GEO_THREADS, c.st, decodeCopyKernel<false>)
        (c.src, c.len, c.dtype, d, c.count, nbytes, c.status);
}

void gpuFp16Decode(const DecodeCall &c) { launchDecode<GEO_CODEC_FP16>(c); }

void gpuBf16Decode(const DecodeCall &c) { launchDecode<GEO_CODEC_BF16>(c); }

void gpuInt8Decode(const DecodeCall &c) { launchDecode<GEO_CODEC_INT8>(c); }

void gpuInt4Decode(const DecodeCall &c) { launchDecode<GEO_CODEC_INT4>(c); }

void gpuSignDecode(const DecodeCall &c) { launchDecode<GEO_CODEC_SIGN>(c); }

void gpuTopkDecode(const DecodeCall &c)
{
    GEO_LAUNCH(1, GEO_THREADS_ONE, c.st, topkCheckKernel)(c.src, c.len, c.acc, c.count, c.status);
    /* k from the length; a chunk whose header disagrees fails the check
     * and the kernels below do nothing. */
    size_t k = c.len >= GEO_CODEC_HEADER_BYTES ? (c.len - GEO_CODEC_HEADER_BYTES) / 8 : 0;
    float *d = (float *)c.dst;
    if (!c.acc && c.count > 0)
        GEO_LAUNCH(gridFor(c.count, GEO_THREADS), GEO_THREADS, c.st, topkZeroKernel)
        (d, c.count, c.status);
    if (k > 0) {
        if (c.acc)
            GEO_LAUNCH(gridFor(k, GEO_THREADS), GEO_THREADS, c.st, topkScatterKernel<true>)
            (c.src, d, c.status);
        else
            GEO_LAUNCH(gridFor(k, GEO_THREADS), GEO_THREADS, c.st, topkScatterKernel<false>)
            (c.src, d, c.status);
    }
}
