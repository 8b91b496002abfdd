/*
 * GPU encoders of the element-wise codecs: none with error feedback, fp16
 * and bf16 (compress/codec_cast.c and codec_raw.c on the CPU).  One thread
 * per group of 8 elements, grid-stride; 16-byte loads and stores when x and
 * r are aligned.  none without a residual is the header and a copy.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "cuda/kernels_internal.h"

/* ------------------------------------------------------------------------ */
/* Encoders: none with error feedback, fp16, bf16                           */
/* ------------------------------------------------------------------------ */

enum { ELEM_NONE = 0, ELEM_FP16 = 1, ELEM_BF16 = 2 };

template <int K, bool EF, bool A>
GEO_KERNEL void encodeElemKernel(const float *x, float *r, unsigned char *dst, size_t count,
                                 ChunkHeader h)
{
    writeHeader(dst, h);
    unsigned char *out = dst + GEO_CODEC_HEADER_BYTES;
    size_t ngroups = (count + 7) / 8;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < ngroups; g += stride) {
        size_t e = 8 * g;
        unsigned n = groupLen(e, count);
        float v[8];
        loadV<EF, A>(x, r, e, n, v);
        if (K == ELEM_NONE) {
            /* out + 32 + 32g: 16-byte aligned. */
            float *o = (float *)out + e;
            if (n == 8)
                store8<true>(o, v);
            else
                storePart(o, v, n);
            if (EF) {
                float z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                storeR<A>(r, e, n, z);
            }
        } else {
            uint32_t q[8];
            for (int j = 0; j < 8; j++)
                q[j] = K == ELEM_FP16 ? f32ToF16(fBits(v[j])) : f32ToBf16(fBits(v[j]));
            if (n == 8) {
                uint4 w;
                w.x = q[0] | q[1] << 16;
                w.y = q[2] | q[3] << 16;
                w.z = q[4] | q[5] << 16;
                w.w = q[6] | q[7] << 16;
                *(uint4 *)(out + 2 * e) = w; /* 32 + 16g: aligned */
            } else {
                GEO_UNROLL
                for (unsigned j = 0; j < 8; j++)
                    if (j < n)
                        ((uint16_t *)out)[e + j] = (uint16_t)q[j];
            }
            if (EF) {
                float t[8];
                for (int j = 0; j < 8; j++) {
                    float d = K == ELEM_FP16 ? f16ToF32(q[j]) : bf16ToF32(q[j]);
                    t[j] = fFiniteOr0(fSub(v[j], d));
                }
                storeR<A>(r, e, n, t);
            }
        }
    }
}

/* The kernels' template instances for the run-time flags. */
template <int K>
static void launchElem(const EncodeCall &c)
{
    unsigned grid = gridFor(hDivUp(c.count, 8), GEO_THREADS);
    const float *x = (const float *)c.src;
    if (c.r && c.a)
        GEO_LAUNCH(grid, GEO_THREADS, c.st, encodeElemKernel<K, true, true>)
        (x, c.r, c.out, c.count, c.h);
    else if (c.r)
        GEO_LAUNCH(grid, GEO_THREADS, c.st, encodeElemKernel<K, true, false>)
        (x, c.r, c.out, c.count, c.h);
    else if (c.a)
        GEO_LAUNCH(grid, GEO_THREADS, c.st, encodeElemKernel<K, false, true>)
        (x, c.r, c.out, c.count, c.h);
    else
        GEO_LAUNCH(grid, GEO_THREADS, c.st, encodeElemKernel<K, false, false>)
        (x, c.r, c.out, c.count, c.h);
}

ncclResult_t gpuNoneEncode(const EncodeCall &c, const char **why)
{
    if (c.r) { /* float32: v = x + r is the payload, r becomes 0 */
        launchElem<ELEM_NONE>(c);
        return launchResult(why);
    }
    gpuLaunchHeader(c);
    cudaError_t err = cudaMemcpyAsync(c.out + GEO_CODEC_HEADER_BYTES, c.src, c.payload,
                                      cudaMemcpyDeviceToDevice, c.st);
    if (err != cudaSuccess) {
        SET_WHY(cudaGetErrorString(err));
        return ncclUnhandledCudaError;
    }
    return launchResult(why);
}

ncclResult_t gpuFp16Encode(const EncodeCall &c, const char **why)
{
    launchElem<ELEM_FP16>(c);
    return launchResult(why);
}

ncclResult_t gpuBf16Encode(const EncodeCall &c, const char **why)
{
    launchElem<ELEM_BF16>(c);
    return launchResult(why);
}
