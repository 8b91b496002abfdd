/*
 * GPU encoder of sign (compress/codec_sign.c on the CPU): one warp per
 * quantisation block, because the order of the block sum is fixed to
 * codec.h's 32 lanes: lane l adds elements l, l+32, ... in turn, then
 * __shfl_down_sync with d = 16..1.  Ballot builds the bits; B <= 256 keeps
 * v in registers for the residual.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "cuda/kernels_internal.h"

/* ------------------------------------------------------------------------ */
/* Encoder: sign                                                             */
/* ------------------------------------------------------------------------ */

/* One step of the sign encoder: elements j0 + lane of the block at start
 * (n elements); returns v (0 past the end), adds |v| to the lane's sum and
 * writes the 4 bytes of sign bits (lanes 0-3).  Warp-uniform. */
template <bool EF>
GEO_DEV float signStep(const float *x, const float *r, unsigned char *bits, size_t start,
                       size_t n, size_t j0, unsigned lane, float &acc)
{
    size_t e = j0 + lane;
    bool in = e < n;
    float v = 0.0f;
    if (in) {
        v = x[start + e];
        if (EF)
            v = fAdd(v, r[start + e]);
        acc = fAdd(acc, fAbs(v));
    }
    uint32_t word = __ballot_sync(GEO_FULL_MASK, in && fLtZero(v));
    /* Byte t holds elements j0 + 8t .. +7; it exists when j0 + 8t < n. */
    if (lane < 4 && j0 + 8 * lane < n)
        bits[(start + j0) / 8 + lane] = (unsigned char)(word >> (8 * lane));
    return v;
}

GEO_DEV float signResidual(float v, float scale)
{
    return fFiniteOr0(fSub(v, fLtZero(v) ? fNeg(scale) : scale));
}

/* The block sum from the lanes' sums (codec.h's tree), then the scale. */
GEO_DEV float signScale(float acc, size_t n)
{
    for (int d = 16; d > 0; d >>= 1)
        acc = fAdd(acc, __shfl_down_sync(GEO_FULL_MASK, acc, d));
    float sum = __shfl_sync(GEO_FULL_MASK, acc, 0);
    /* n <= 2^24: exact.  A NaN sum (a NaN in the block) has no defined
     * bits: the CPU's vectorised lanes may add two NaNs in either order. */
    return fIsNan(sum) ? bitsF(GEO_NAN_CANONICAL) : fDiv(sum, (float)(uint32_t)n);
}

/*
 * One warp per block of B elements: lane l sums |v| of elements l, l+32,
 * ... in order, the warp adds the lanes as codec.h says.  SMALL (B <= 256):
 * each lane keeps its <= 8 values in registers for the residual pass;
 * otherwise that pass reads them again.
 */
template <bool EF, bool SMALL>
GEO_KERNEL void encodeSignKernel(const float *x, float *r, unsigned char *dst, size_t count,
                                 uint32_t B, ChunkHeader h)
{
    writeHeader(dst, h);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    size_t nb = (count + B - 1) / B;
    float *scales = (float *)(dst + GEO_CODEC_HEADER_BYTES);
    unsigned char *bits = (unsigned char *)(scales + nb);
    for (size_t b = (size_t)blockIdx.x * GEO_WARPS + warp; b < nb;
         b += (size_t)gridDim.x * GEO_WARPS) {
        size_t start = b * B;
        size_t n = count - start < B ? count - start : B;
        float acc = 0.0f;
        if (SMALL) {
            float keep[8];
            GEO_UNROLL
            for (unsigned j = 0; j < 8; j++) {
                keep[j] = 0.0f;
                if (32 * j < n) /* warp-uniform */
                    keep[j] = signStep<EF>(x, r, bits, start, n, 32 * j, lane, acc);
            }
            float scale = signScale(acc, n);
            if (lane == 0)
                scales[b] = scale;
            if (EF) {
                GEO_UNROLL
                for (unsigned j = 0; j < 8; j++)
                    if (32 * j + lane < n)
                        r[start + 32 * j + lane] = signResidual(keep[j], scale);
            }
        } else {
            for (size_t j0 = 0; j0 < n; j0 += 32)
                signStep<EF>(x, r, bits, start, n, j0, lane, acc);
            float scale = signScale(acc, n);
            if (lane == 0)
                scales[b] = scale;
            if (EF) {
                for (size_t e = lane; e < n; e += 32)
                    r[start + e] = signResidual(fAdd(x[start + e], r[start + e]), scale);
            }
        }
    }
}

ncclResult_t gpuSignEncode(const EncodeCall &c, const char **why)
{
    const float *x = (const float *)c.src;
    uint32_t B = c.p->blockSize;
    unsigned grid = gridFor(hDivUp(c.count, B), GEO_WARPS);
    bool small = B <= 256;
    if (c.r && small)
        GEO_LAUNCH(grid, GEO_THREADS, c.st, encodeSignKernel<true, true>)
        (x, c.r, c.out, c.count, B, c.h);
    else if (c.r)
        GEO_LAUNCH(grid, GEO_THREADS, c.st, encodeSignKernel<true, false>)
        (x, c.r, c.out, c.count, B, c.h);
    else if (small)
        GEO_LAUNCH(grid, GEO_THREADS, c.st, encodeSignKernel<false, true>)
        (x, c.r, c.out, c.count, B, c.h);
    else
        GEO_LAUNCH(grid, GEO_THREADS, c.st, encodeSignKernel<false, false>)
        (x, c.r, c.out, c.count, B, c.h);
    return launchResult(why);
}
