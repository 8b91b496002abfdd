/*
 * GPU codecs (cuda/codec_kernels.h): kernels that write and read the chunks
 * of compress/codec.h byte for byte as the CPU reference does.
 *
 * How exactness is kept:
 *   - The arithmetic that defines bytes (v = x + r, the scale divisions,
 *     v * inv, rounding to an integer, the residual v - q * scale, the
 *     fp16 rounding trick, the sign codec's sums) goes through the helpers
 *     below, which are single PTX instructions with an explicit rounding
 *     mode and no .ftz: never contracted into an FMA, subnormals kept,
 *     whatever -fmad/-ftz/--use_fast_math say.  Every other test on a
 *     float is done on its bits.  NaN results that reach bytes get the
 *     bits the CPU reference gets (the *N helpers).
 *   - Reductions whose result depends on order are done in the CPU's
 *     order: absmax is a max of integers (any order); the sign codec's
 *     block sum is codec.h's 32-lane order, which is one warp: lane l adds
 *     elements l, l+32, ... in turn, then __shfl_down_sync with d = 16..1.
 *   - topk selects the same set as the CPU: the k-th largest key T is found
 *     exactly (radix select on the 31 key bits, 11 + 11 + 9), then every key
 *     > T and the first (in index order) keys == T up to k are kept, placed
 *     by an order-preserving scan, so the indices come out increasing.
 *
 * Layout of the work:
 *   none(+EF), fp16, bf16   one thread per group of 8 elements, grid-stride;
 *                           16-byte loads/stores when aligned.
 *   int8, int4              one team per quantisation block: a warp when the
 *                           block has <= 2048 elements (8 teams per CUDA
 *                           block), else the whole CUDA block.  Pass 1 reads
 *                           v and reduces absmax; pass 2 quantises v kept in
 *                           registers (one group per thread: B <= 256) or
 *                           read again (cache), writes values and residual.
 *   sign                    one warp per quantisation block (the order of the
 *                           sum is fixed to 32 lanes); ballot builds the bits;
 *                           B <= 256 keeps v in registers for the residual.
 *   topk                    histogram passes + find kernels, a per-tile count,
 *                           a scan of the tile counts, and the write pass.
 *   decoders                one thread per group of 8 elements, grid-stride;
 *                           every CUDA block checks the chunk header before it
 *                           writes anything (topk: one kernel checks header and
 *                           indices first, the writers read its verdict).
 *
 * Host side: the public functions check the arguments every codec shares,
 * build the header on the host (it reaches the device as a kernel argument,
 * so no host buffer has to outlive the call) and dispatch through
 * gpuCodecs[], a table of per-codec operations indexed by geoCodecId.
 *
 * Built by nvcc for the library, or (GEO_CUDA_EMU) as plain C++ against
 * tests/device/cuda_emu_device.h, which runs the same kernels on the CPU so
 * that their indexing, bounds, barriers and warp logic are tested by make
 * check where no GPU is.
 */
#ifdef GEO_CUDA_EMU
/* The emulation switches stacks with _longjmp, which the checked longjmp
 * of _FORTIFY_SOURCE refuses; it must go before any system header. */
#undef _FORTIFY_SOURCE
#endif
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "cuda/codec_kernels.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef GEO_CUDA_EMU
#include "cuda_emu_device.h"
#else
#include <cuda_runtime.h>
#endif

/* ------------------------------------------------------------------------ */
/* Exact arithmetic                                                         */
/* ------------------------------------------------------------------------ */

#ifdef GEO_CUDA_EMU
#define GEO_DEV static inline
#define GEO_KERNEL static
#define GEO_KERNEL_ONE static
/* The emulation is compiled with -ffp-contract=off on a host with IEEE
 * binary32 arithmetic (SSE on x86-64), so the plain operators are exact. */
GEO_DEV float fAdd(float a, float b) { return a + b; }
GEO_DEV float fSub(float a, float b) { return a - b; }
GEO_DEV float fMul(float a, float b) { return a * b; }
GEO_DEV float fDiv(float a, float b) { return a / b; }
GEO_DEV int fToIntRne(float a) { return (int)nearbyintf(a); }
GEO_DEV int fToIntFloor(float a) { return (int)floorf(a); }
GEO_DEV uint32_t fBits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
GEO_DEV float bitsF(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#else
#define GEO_DEV static __device__ __forceinline__
#define GEO_KERNEL static __global__ __launch_bounds__(GEO_THREADS)
#define GEO_KERNEL_ONE static __global__ __launch_bounds__(GEO_THREADS_ONE)
GEO_DEV float fAdd(float a, float b)
{
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
GEO_DEV float fSub(float a, float b)
{
    float r;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
GEO_DEV float fMul(float a, float b)
{
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
GEO_DEV float fDiv(float a, float b)
{
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
/* Float to int, nearest even / toward -inf, subnormal inputs kept. */
GEO_DEV int fToIntRne(float a)
{
    int r;
    asm("cvt.rni.s32.f32 %0, %1;" : "=r"(r) : "f"(a));
    return r;
}
GEO_DEV int fToIntFloor(float a)
{
    int r;
    asm("cvt.rmi.s32.f32 %0, %1;" : "=r"(r) : "f"(a));
    return r;
}
GEO_DEV uint32_t fBits(float f) { return __float_as_uint(f); }
GEO_DEV float bitsF(uint32_t u) { return __uint_as_float(u); }
#endif

#ifdef GEO_CUDA_EMU
#define GEO_UNROLL
#else
#define GEO_UNROLL _Pragma("unroll")
#endif

/* Threads per CUDA block of every kernel but the single-block ones. */
#define GEO_THREADS 256
/* Threads of the single-block kernels (topk find and scan, topk check). */
#define GEO_THREADS_ONE 1024
#define GEO_WARPS (GEO_THREADS / 32)
#define GEO_FULL_MASK 0xFFFFFFFFu
/* Grid-stride kernels never launch more blocks than this. */
#define GEO_MAX_GRID (1u << 20)

/* |f| (fabsf), -f, and "f < 0.0f" on bits: exact under any flags. */
GEO_DEV float fAbs(float f) { return bitsF(fBits(f) & 0x7FFFFFFFu); }
GEO_DEV float fNeg(float f) { return bitsF(fBits(f) ^ 0x80000000u); }
GEO_DEV bool fLtZero(float f)
{
    uint32_t u = fBits(f), a = u & 0x7FFFFFFFu;
    return (u >> 31) != 0 && a != 0 && a <= 0x7F800000u;
}
/* r when finite, else 0 (codecFiniteOr0). */
GEO_DEV float fFiniteOr0(float f) { return (fBits(f) & 0x7F800000u) != 0x7F800000u ? f : 0.0f; }

/*
 * NaN bits.  IEEE 754 leaves a NaN result's sign and payload open, and the
 * hardware differs: the GPU returns one canonical NaN, while the CPU
 * reference (x86-64, where CI runs it) returns the NaN operand quieted (the
 * first one if both are NaN) and 0xFFC00000 for an invalid operation
 * (inf - inf, 0 * inf).  Where a NaN can reach chunk bytes or decoded
 * values, the kernels use the *N helpers, which give the x86 result in the
 * operand order of the C reference.  ARM with default-NaN mode off agrees
 * except for the invalid-operation NaN (0x7FC00000 there).
 */
#define GEO_NAN_INVALID 0xFFC00000u
/* The sign codec's NaN scale (its sum has no defined NaN order, see
 * encodeSignKernel). */
#define GEO_NAN_CANONICAL 0x7FC00000u
GEO_DEV bool fIsNan(float f) { return (fBits(f) & 0x7FFFFFFFu) > 0x7F800000u; }
GEO_DEV float fNanOf(float a, float b)
{
    return fIsNan(a) ? bitsF(fBits(a) | 0x00400000u)
           : fIsNan(b) ? bitsF(fBits(b) | 0x00400000u) : bitsF(GEO_NAN_INVALID);
}
GEO_DEV float fAddN(float a, float b)
{
    float r = fAdd(a, b);
    return fIsNan(r) ? fNanOf(a, b) : r;
}
GEO_DEV float fMulN(float a, float b)
{
    float r = fMul(a, b);
    return fIsNan(r) ? fNanOf(a, b) : r;
}
GEO_DEV float fDivN(float a, float b)
{
    float r = fDiv(a, b);
    return fIsNan(r) ? fNanOf(a, b) : r;
}

/* ------------------------------------------------------------------------ */
/* Conversions, exactly as compress/codec_cast.c                           */
/* ------------------------------------------------------------------------ */

GEO_DEV uint32_t f32ToF16(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7FFFFFFFu;
    uint32_t nrm = (a + 0x0FFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    float t = fMul(bitsF(a), 0x1p24f);
    uint32_t sub = fBits(fAdd(t, 0x1p23f)) - 0x4B000000u;
    uint32_t h = a < 0x38800000u ? sub : nrm;
    h = a >= 0x477FF000u ? 0x7BFFu : h;
    h = a >= 0x7F800000u ? (a == 0x7F800000u ? 0x7C00u : 0x7E00u) : h;
    return (sign | h) & 0xFFFFu;
}

GEO_DEV float f16ToF32(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    uint32_t nrm = ((e + 112u) << 23) | (m << 13);
    uint32_t special = 0x7F800000u | (m << 13);
    uint32_t sub = fBits(fMul((float)(int)m, 0x1p-24f));
    uint32_t bits = e == 0 ? sub : (e == 31 ? special : nrm);
    return bitsF(sign | bits);
}

GEO_DEV uint32_t f32ToBf16(uint32_t x)
{
    uint32_t a = x & 0x7FFFFFFFu;
    uint32_t r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    uint32_t satur = ((x >> 16) & 0x8000u) | 0x7F7Fu;
    r = ((r & 0x7FFFu) == 0x7F80u && a < 0x7F800000u) ? satur : r;
    r = a > 0x7F800000u ? ((x >> 16) | 0x40u) : r;
    return r & 0xFFFFu;
}

GEO_DEV float bf16ToF32(uint32_t h) { return bitsF(h << 16); }

/* ------------------------------------------------------------------------ */
/* Stochastic rounding bits: geoCodecUniform (codec.h), on the device       */
/* ------------------------------------------------------------------------ */

GEO_DEV uint64_t devMix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

GEO_DEV float devUniform(uint64_t key, uint64_t i)
{
    uint64_t r = devMix64(key + (i + 1) * 0x9E3779B97F4A7C15ull);
    return fMul((float)(uint32_t)(r >> 40), 0x1p-24f);
}

/* ------------------------------------------------------------------------ */
/* Chunk header                                                             */
/* ------------------------------------------------------------------------ */

/* The 32 header bytes as words, built on the host and passed by value. */
struct ChunkHeader {
    uint32_t w[8];
};

static ChunkHeader makeHeader(geoCodecId codec, ncclDataType_t dtype, uint32_t flags,
                              uint64_t count, uint64_t payload, uint32_t param)
{
    unsigned char b[32];
    uint32_t magic = GEO_CODEC_MAGIC;
    memcpy(b, &magic, 4);
    b[4] = GEO_CODEC_VERSION;
    b[5] = (unsigned char)codec;
    b[6] = (unsigned char)dtype;
    b[7] = (unsigned char)flags;
    memcpy(b + 8, &count, 8);
    memcpy(b + 16, &payload, 8);
    memcpy(b + 24, &param, 4);
    uint32_t sum = geoCodecChecksum(b, 28);
    memcpy(b + 28, &sum, 4);
    ChunkHeader h;
    memcpy(h.w, b, 32);
    return h;
}

/* Thread 0 of block 0 writes the header (dst is 16-byte aligned); constant
 * indices keep h out of local memory. */
GEO_DEV void writeHeader(unsigned char *dst, const ChunkHeader &h)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        ((uint4 *)dst)[0] = make_uint4(h.w[0], h.w[1], h.w[2], h.w[3]);
        ((uint4 *)dst)[1] = make_uint4(h.w[4], h.w[5], h.w[6], h.w[7]);
    }
}

GEO_KERNEL void headerKernel(unsigned char *dst, ChunkHeader h) { writeHeader(dst, h); }

/* ------------------------------------------------------------------------ */
/* Groups of 8 elements                                                     */
/* ------------------------------------------------------------------------ */

/* v[0..7] = p[0..7]; A: p is 16-byte aligned. */
template <bool A>
GEO_DEV void load8(const float *p, float v[8])
{
    if (A) {
        float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        for (int j = 0; j < 8; j++)
            v[j] = p[j];
    }
}

template <bool A>
GEO_DEV void store8(float *p, const float v[8])
{
    if (A) {
        ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        for (int j = 0; j < 8; j++)
            p[j] = v[j];
    }
}

/* The first n (< 8) elements, zeros after.  Loops over partial groups run
 * all 8 steps with a test, so that the arrays keep constant indices (and
 * stay in registers). */
GEO_DEV void loadPart(const float *p, float v[8], unsigned n)
{
    GEO_UNROLL
    for (unsigned j = 0; j < 8; j++) {
        v[j] = 0.0f;
        if (j < n)
            v[j] = p[j];
    }
}

GEO_DEV void storePart(float *p, const float v[8], unsigned n)
{
    GEO_UNROLL
    for (unsigned j = 0; j < 8; j++)
        if (j < n)
            p[j] = v[j];
}

/* v = x (+ r) for the group at element e of n in the group (n <= 8). */
template <bool EF, bool A>
GEO_DEV void loadV(const float *x, const float *r, size_t e, unsigned n, float v[8])
{
    if (n == 8) {
        load8<A>(x + e, v);
        if (EF) {
            float t[8];
            load8<A>(r + e, t);
            for (int j = 0; j < 8; j++)
                v[j] = fAddN(v[j], t[j]);
        }
    } else {
        loadPart(x + e, v, n);
        if (EF) {
            float t[8];
            loadPart(r + e, t, n);
            GEO_UNROLL
            for (unsigned j = 0; j < 8; j++)
                if (j < n)
                    v[j] = fAddN(v[j], t[j]);
        }
    }
}

template <bool A>
GEO_DEV void storeR(float *r, size_t e, unsigned n, const float t[8])
{
    if (n == 8)
        store8<A>(r + e, t);
    else
        storePart(r + e, t, n);
}

/* Elements in the group starting at e of a range of count. */
GEO_DEV unsigned groupLen(size_t e, size_t count)
{
    return count - e < 8 ? (unsigned)(count - e) : 8u;
}

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

/* ------------------------------------------------------------------------ */
/* Encoders: int8, int4                                                      */
/* ------------------------------------------------------------------------ */

/* Blocks with absmax below 2^-100 (as bits) get scale 0. */
#define QUANT_TINY_BITS 0x0D800000u

/* Max of m over a team of TEAM threads (32: a warp; GEO_THREADS: the CUDA
 * block, every thread must call).  All members get the result. */
template <int TEAM>
GEO_DEV uint32_t teamMax(uint32_t m)
{
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t t = __shfl_xor_sync(GEO_FULL_MASK, m, o);
        m = t > m ? t : m;
    }
    if (TEAM > 32) {
        __shared__ uint32_t part[GEO_WARPS];
        if (threadIdx.x % 32 == 0)
            part[threadIdx.x / 32] = m;
        __syncthreads();
        m = part[0];
        for (int w = 1; w < GEO_WARPS; w++)
            m = part[w] > m ? part[w] : m;
        __syncthreads(); /* part[] is reused by the next block */
    }
    return m;
}

/*
 * One team per quantisation block of B elements.  BITS 8 or 4; EF: residual;
 * SR: stochastic rounding; A: x and r 16-byte aligned; TEAM 32 or
 * GEO_THREADS.  Payload: nb float32 scales, then the values.
 */
template <int BITS, bool EF, bool SR, bool A, int TEAM>
GEO_KERNEL void encodeQuantKernel(const float *x, float *r, unsigned char *dst, size_t count,
                                  uint32_t B, uint64_t key, ChunkHeader h)
{
    writeHeader(dst, h);
    const int L = BITS == 8 ? 127 : 7;
    const float lim = (float)L;
    const unsigned teams = GEO_THREADS / TEAM;
    const unsigned team = threadIdx.x / TEAM, lane = threadIdx.x % TEAM;
    size_t nb = (count + B - 1) / B;
    unsigned char *scales = dst + GEO_CODEC_HEADER_BYTES;
    unsigned char *vals = scales + 4 * nb;
    /* Uniform over the team (and, for TEAM = GEO_THREADS, the CUDA block). */
    for (size_t b = (size_t)blockIdx.x * teams + team; b < nb; b += (size_t)gridDim.x * teams) {
        size_t start = b * B;
        size_t n = count - start < B ? count - start : B;
        size_t ngroups = (n + 7) / 8;
        /* At most one group per thread (B <= 8 * TEAM, the usual case):
         * its values stay in registers for pass 2. */
        const bool one = ngroups <= TEAM;
        float keep[8] = {0, 0, 0, 0, 0, 0, 0, 0};

        uint32_t am = 0;
        for (size_t g = lane; g < ngroups; g += TEAM) {
            size_t e = start + 8 * g;
            float v[8];
            loadV<EF, A>(x, r, e, groupLen(8 * g, n), v);
            if (one)
                for (int j = 0; j < 8; j++)
                    keep[j] = v[j];
            for (int j = 0; j < 8; j++) { /* padding zeros do not change it */
                uint32_t u = fBits(v[j]) & 0x7FFFFFFFu;
                am = u > am ? u : am;
            }
        }
        am = teamMax<TEAM>(am);
        float scale = 0.0f, inv = 0.0f;
        if (am >= QUANT_TINY_BITS) { /* !(absmax < 2^-100); a NaN too */
            float absmax = bitsF(am);
            scale = fDivN(absmax, lim);
            inv = fDiv(lim, absmax);
        }
        if (lane == 0)
            ((float *)scales)[b] = scale;

        for (size_t g = lane; g < ngroups; g += TEAM) {
            size_t e = start + 8 * g;
            unsigned gn = groupLen(8 * g, n);
            float v[8];
            if (one) {
                for (int j = 0; j < 8; j++)
                    v[j] = keep[j];
            } else {
                loadV<EF, A>(x, r, e, gn, v);
            }
            int q[8];
            for (unsigned j = 0; j < 8; j++) {
                float t = fMul(v[j], inv);
                t = t > -lim ? t : -lim; /* a NaN becomes -lim */
                t = t < lim ? t : lim;
                int qi;
                if (SR) {
                    float s = fAdd(t, devUniform(key, e + j));
                    qi = fToIntFloor(s);
                    qi = qi < L ? qi : L;
                } else {
                    qi = fToIntRne(t);
                }
                q[j] = j < gn ? qi : 0;
            }
            if (BITS == 8) {
                /* vals + start + 8g: 4-byte aligned (vals is, start % 8 == 0). */
                if (gn == 8) {
                    uint32_t w0 = (uint32_t)(q[0] & 0xFF) | (uint32_t)(q[1] & 0xFF) << 8 |
                                  (uint32_t)(q[2] & 0xFF) << 16 | (uint32_t)(q[3] & 0xFF) << 24;
                    uint32_t w1 = (uint32_t)(q[4] & 0xFF) | (uint32_t)(q[5] & 0xFF) << 8 |
                                  (uint32_t)(q[6] & 0xFF) << 16 | (uint32_t)(q[7] & 0xFF) << 24;
                    ((uint32_t *)(vals + e))[0] = w0;
                    ((uint32_t *)(vals + e))[1] = w1;
                } else {
                    GEO_UNROLL
                    for (unsigned j = 0; j < 8; j++)
                        if (j < gn)
                            vals[e + j] = (unsigned char)(q[j] & 0xFF);
                }
            } else {
                uint32_t w = 0;
                for (int j = 0; j < 8; j++)
                    w |= (uint32_t)(q[j] & 0xF) << (4 * j);
                unsigned char *o = vals + e / 2; /* 4-byte aligned */
                if (gn == 8) {
                    *(uint32_t *)o = w;
                } else {
                    GEO_UNROLL
                    for (unsigned m = 0; m < 4; m++)
                        if (m < (gn + 1) / 2)
                            o[m] = (unsigned char)(w >> (8 * m));
                }
            }
            if (EF) {
                float t[8];
                for (int j = 0; j < 8; j++)
                    t[j] = fFiniteOr0(fSub(v[j], fMul((float)q[j], scale)));
                storeR<A>(r, e, gn, t);
            }
        }
    }
}

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

/* ------------------------------------------------------------------------ */
/* Encoder: topk                                                             */
/* ------------------------------------------------------------------------ */

/* Radix select levels: digit = (key >> shift) & (2^bits - 1) among keys
 * whose higher bits (key >> (shift + bits)) equal the prefix found so far. */
#define TOPK_BINS 2048
/* Elements per CUDA block in the count and write passes, a multiple of
 * GEO_THREADS.  The emulation test makes it small so that its sizes give
 * many tiles (several rounds of topkScanKernel). */
#ifndef GEO_TOPK_TILE
#define GEO_TOPK_TILE 4096
#endif
#define TOPK_TILE GEO_TOPK_TILE

GEO_DEV unsigned topkShift(int level) { return level == 0 ? 20u : level == 1 ? 9u : 0u; }
GEO_DEV unsigned topkBits(int level) { return level == 2 ? 9u : 11u; }

/* Scratch layout (bytes): hist[2048] u32 | state | tileGt[nt] u32 |
 * tileEq[nt] u32 | tileGtPre[nt] u64 | tileEqPre[nt] u64. */
struct TopkState {
    unsigned long long need; /* how many of the k are still to be found in the bucket */
    uint32_t prefix;         /* key bits found so far (the threshold after level 2) */
    uint32_t pad;
};

struct TopkScratch {
    uint32_t *hist;
    TopkState *state;
    uint32_t *tileGt, *tileEq;
    unsigned long long *tileGtPre, *tileEqPre;
};

static size_t topkTiles(size_t count) { return (count + TOPK_TILE - 1) / TOPK_TILE; }

/* Offset of tileGtPre: after hist, state and the two u32 arrays, rounded
 * up to 16. */
static size_t topkPreOffset(size_t nt) { return (TOPK_BINS * 4 + 32 + nt * 8 + 15) / 16 * 16; }

static size_t topkScratchBytes(size_t count)
{
    size_t nt = topkTiles(count);
    return topkPreOffset(nt) + nt * 16;
}

static TopkScratch topkScratchLayout(void *scratch, size_t count)
{
    size_t nt = topkTiles(count);
    unsigned char *p = (unsigned char *)scratch;
    TopkScratch s;
    s.hist = (uint32_t *)p;
    s.state = (TopkState *)(p + TOPK_BINS * 4);
    s.tileGt = (uint32_t *)(p + TOPK_BINS * 4 + 32);
    s.tileEq = s.tileGt + nt;
    s.tileGtPre = (unsigned long long *)(p + topkPreOffset(nt));
    s.tileEqPre = s.tileGtPre + nt;
    return s;
}

GEO_DEV uint32_t topkKey(float v) { return fBits(v) & 0x7FFFFFFFu; }

/*
 * Histogram of one level's digit over the keys in the current bucket.
 * Level 0 also forms v = x + r into r (error feedback) and writes the
 * header.  Warp-uniform loop so that the warp intrinsics see all lanes.
 */
template <int LEVEL, bool EF>
GEO_KERNEL void topkHistKernel(const float *x, float *r, size_t count, TopkScratch s,
                               unsigned char *dst, ChunkHeader h)
{
    __shared__ uint32_t hist[TOPK_BINS];
    const unsigned shift = topkShift(LEVEL), bits = topkBits(LEVEL);
    const unsigned nbins = 1u << bits;
    if (LEVEL == 0)
        writeHeader(dst, h);
    uint32_t prefix = LEVEL == 0 ? 0u : s.state->prefix;
    for (unsigned i = threadIdx.x; i < nbins; i += blockDim.x)
        hist[i] = 0;
    __syncthreads();
    const unsigned lane = threadIdx.x % 32;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i0 = (size_t)blockIdx.x * blockDim.x + (threadIdx.x - lane); i0 < count;
         i0 += stride) {
        size_t i = i0 + lane;
        bool in = i < count;
        uint32_t digit = 0xFFFFFFFFu;
        if (in) {
            float v;
            if (LEVEL == 0 && EF) {
                v = fAddN(x[i], r[i]);
                r[i] = v;
            } else {
                v = EF ? r[i] : x[i];
            }
            uint32_t key = topkKey(v);
            if ((key >> (shift + bits)) == prefix)
                digit = (key >> shift) & (nbins - 1);
        }
        bool mine = digit != 0xFFFFFFFFu;
        if (__any_sync(GEO_FULL_MASK, mine)) {
            /* One shared atomic per distinct digit in the warp. */
            uint32_t peers = __match_any_sync(GEO_FULL_MASK, digit);
            unsigned leader = __ffs(peers) - 1;
            if (mine && lane == leader)
                atomicAdd(&hist[digit], (uint32_t)__popc(peers));
        }
    }
    __syncthreads();
    for (unsigned i = threadIdx.x; i < nbins; i += blockDim.x)
        if (hist[i])
            atomicAdd(&s.hist[i], hist[i]);
}

/*
 * One CUDA block of GEO_THREADS_ONE threads: suffix sums of the level's
 * histogram, the digit d whose bucket holds the need-th largest key, the
 * new prefix and need; then clears the histogram for the next level.
 */
template <int LEVEL>
GEO_KERNEL_ONE void topkFindKernel(TopkScratch s, unsigned long long k)
{
    static_assert(TOPK_BINS <= 2 * GEO_THREADS_ONE, "two bins per thread");
    __shared__ unsigned long long suf[TOPK_BINS];
    const unsigned bits = topkBits(LEVEL), nbins = 1u << bits;
    unsigned long long need = LEVEL == 0 ? k : s.state->need;
    uint32_t prefix = LEVEL == 0 ? 0u : s.state->prefix;
    /* suf[i] = hist[nbins - 1 - i], then an inclusive prefix sum of it:
     * suf[i] = number of keys whose digit is >= nbins - 1 - i. */
    for (unsigned i = threadIdx.x; i < nbins; i += blockDim.x)
        suf[i] = s.hist[nbins - 1 - i];
    __syncthreads();
    /* Hillis-Steele; thread t owns entries t and t + GEO_THREADS_ONE. */
    const unsigned i0 = threadIdx.x, i1 = threadIdx.x + GEO_THREADS_ONE;
    for (unsigned off = 1; off < nbins; off <<= 1) {
        unsigned long long a0 = i0 < nbins && i0 >= off ? suf[i0 - off] : 0;
        unsigned long long a1 = i1 < nbins && i1 >= off ? suf[i1 - off] : 0;
        __syncthreads();
        if (i0 < nbins)
            suf[i0] += a0;
        if (i1 < nbins)
            suf[i1] += a1;
        __syncthreads();
    }
    /* Digit d = nbins - 1 - i: S(d) = suf[i] >= need > S(d + 1) = suf[i - 1]. */
    for (unsigned i = threadIdx.x; i < nbins; i += blockDim.x) {
        unsigned long long above = i == 0 ? 0 : suf[i - 1];
        if (suf[i] >= need && above < need) {
            s.state->need = need - above;
            s.state->prefix = prefix << bits | (nbins - 1 - i);
        }
    }
    for (unsigned i = threadIdx.x; i < nbins; i += blockDim.x)
        s.hist[i] = 0;
}

/* Per tile of TOPK_TILE elements: keys > T and keys == T. */
template <bool EF>
GEO_KERNEL void topkCountKernel(const float *x, const float *r, size_t count, TopkScratch s)
{
    __shared__ uint32_t part[2][GEO_WARPS];
    const uint32_t T = s.state->prefix;
    size_t base = (size_t)blockIdx.x * TOPK_TILE;
    uint32_t gt = 0, eq = 0;
    for (unsigned o = threadIdx.x; o < TOPK_TILE; o += blockDim.x) {
        size_t i = base + o;
        if (i < count) {
            uint32_t key = topkKey(EF ? r[i] : x[i]);
            gt += key > T;
            eq += key == T;
        }
    }
    for (int d = 16; d > 0; d >>= 1) {
        gt += __shfl_xor_sync(GEO_FULL_MASK, gt, d);
        eq += __shfl_xor_sync(GEO_FULL_MASK, eq, d);
    }
    if (threadIdx.x % 32 == 0) {
        part[0][threadIdx.x / 32] = gt;
        part[1][threadIdx.x / 32] = eq;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        gt = eq = 0;
        for (int w = 0; w < GEO_WARPS; w++) {
            gt += part[0][w];
            eq += part[1][w];
        }
        s.tileGt[blockIdx.x] = gt;
        s.tileEq[blockIdx.x] = eq;
    }
}

/* One block of GEO_THREADS_ONE threads: exclusive prefix sums of the tile
 * counts, in tile order. */
GEO_KERNEL_ONE void topkScanKernel(TopkScratch s, size_t ntiles)
{
    __shared__ unsigned long long a[2][GEO_THREADS_ONE];
    unsigned long long carryGt = 0, carryEq = 0;
    for (size_t base = 0; base < ntiles; base += GEO_THREADS_ONE) {
        size_t t = base + threadIdx.x;
        unsigned long long gt = t < ntiles ? s.tileGt[t] : 0;
        unsigned long long eq = t < ntiles ? s.tileEq[t] : 0;
        a[0][threadIdx.x] = gt;
        a[1][threadIdx.x] = eq;
        __syncthreads();
        for (unsigned off = 1; off < GEO_THREADS_ONE; off <<= 1) {
            unsigned long long ag = threadIdx.x >= off ? a[0][threadIdx.x - off] : 0;
            unsigned long long ae = threadIdx.x >= off ? a[1][threadIdx.x - off] : 0;
            __syncthreads();
            a[0][threadIdx.x] += ag;
            a[1][threadIdx.x] += ae;
            __syncthreads();
        }
        /* a[] is now inclusive; exclusive = inclusive - own. */
        if (t < ntiles) {
            s.tileGtPre[t] = carryGt + a[0][threadIdx.x] - gt;
            s.tileEqPre[t] = carryEq + a[1][threadIdx.x] - eq;
        }
        carryGt += a[0][GEO_THREADS_ONE - 1];
        carryEq += a[1][GEO_THREADS_ONE - 1];
        __syncthreads(); /* a[] is rewritten by the next round */
    }
}

/*
 * Per tile: keeps keys > T and the first takeEqual keys == T of the chunk
 * (in index order), each at position (keys > T before it) + min(keys == T
 * before it, takeEqual), so the output is in index order; the residual
 * becomes 0 where kept, else v (0 where not finite).
 */
template <bool EF>
GEO_KERNEL void topkWriteKernel(const float *x, float *r, size_t count, TopkScratch s,
                                unsigned char *dst, unsigned long long k)
{
    __shared__ uint32_t part[2][GEO_WARPS];
    const uint32_t T = s.state->prefix;
    const unsigned long long takeEqual = s.state->need;
    uint32_t *idx = (uint32_t *)(dst + GEO_CODEC_HEADER_BYTES);
    uint32_t *val = idx + k;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t below = (1u << lane) - 1u; /* lanes before this one */
    unsigned long long gtBefore = s.tileGtPre[blockIdx.x];
    unsigned long long eqBefore = s.tileEqPre[blockIdx.x];
    size_t base = (size_t)blockIdx.x * TOPK_TILE;
    for (unsigned o = 0; o < TOPK_TILE; o += GEO_THREADS) {
        size_t i = base + o + threadIdx.x;
        bool in = i < count;
        float v = 0.0f;
        uint32_t key = 0;
        if (in) {
            v = EF ? r[i] : x[i];
            key = topkKey(v);
        }
        bool gt = in && key > T, eq = in && key == T;
        uint32_t bg = __ballot_sync(GEO_FULL_MASK, gt);
        uint32_t be = __ballot_sync(GEO_FULL_MASK, eq);
        if (lane == 0) {
            part[0][warp] = (uint32_t)__popc(bg);
            part[1][warp] = (uint32_t)__popc(be);
        }
        __syncthreads();
        unsigned long long g = gtBefore + (unsigned)__popc(bg & below);
        unsigned long long q = eqBefore + (unsigned)__popc(be & below);
        unsigned long long roundGt = 0, roundEq = 0;
        for (unsigned w = 0; w < GEO_WARPS; w++) {
            if (w < warp) {
                g += part[0][w];
                q += part[1][w];
            }
            roundGt += part[0][w];
            roundEq += part[1][w];
        }
        __syncthreads(); /* part[] is rewritten by the next round */
        bool take = gt || (eq && q < takeEqual);
        if (take) {
            unsigned long long pos = g + (q < takeEqual ? q : takeEqual);
            if (pos < k) { /* always, by construction; never write outside */
                idx[pos] = (uint32_t)i;
                val[pos] = fBits(v);
            }
        }
        if (EF && in)
            r[i] = take ? 0.0f : fFiniteOr0(v);
        gtBefore += roundGt;
        eqBefore += roundEq;
    }
}

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

/* dst[i] = dst[i] / divisor, binary32 division rounded to nearest (the
 * average of a float all-reduce, as comm/coll/reduce.c's geoDivide). */
GEO_KERNEL void divideF32Kernel(float *dst, size_t count, float divisor)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        dst[i] = fDiv(dst[i], divisor);
}

/* A load of the host's word with acquire order at system scope: what the
 * host wrote before its release store of the flag (the received bytes in the
 * pinned slots) is visible to everything ordered after the wait.  The
 * emulation's kernels are host threads: an acquire load there too (with a
 * plain volatile read ThreadSanitizer rightly saw no order between the
 * exchange thread's writes and the stream's later copies). */
#ifdef GEO_CUDA_EMU
static inline unsigned ldAcquireSys(const volatile unsigned *p)
{
    return GEO_EMU_LD_ACQUIRE(p);
}
#else
static __device__ __forceinline__ unsigned ldAcquireSys(const volatile unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
#endif

/* The stream waits until the word at flag (mapped pinned memory the host
 * writes with release order) has reached seq, compared as
 * cuStreamWaitValue32's GEQ does: (int32_t)(*flag - seq) >= 0.  Lane 0 polls
 * with a growing sleep (at most ~4 us between reads of host memory); the
 * other lanes return at once. */
GEO_KERNEL_ONE void waitFlagKernel(const volatile unsigned *flag, unsigned seq)
{
    if (threadIdx.x != 0)
        return;
    unsigned ns = 32;
    while ((int)(ldAcquireSys(flag) - seq) < 0) {
        __nanosleep(ns);
        if (ns < 4096)
            ns *= 2;
    }
}

/* ------------------------------------------------------------------------ */
/* Host side                                                                 */
/* ------------------------------------------------------------------------ */

#ifdef GEO_CUDA_EMU
#define GEO_LAUNCH(grid, block, stream, ...) geoEmuLaunch((grid), (block), (stream), __VA_ARGS__)
#else
#define GEO_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<(grid), (block), 0, (stream)>>>
#endif

#define SET_WHY(text)                                                       \
    do {                                                                    \
        if (why)                                                            \
            *why = (text);                                                  \
    } while (0)
#define BAD_ARG(text)                                                       \
    do {                                                                    \
        SET_WHY(text);                                                      \
        return ncclInvalidArgument;                                         \
    } while (0)

static const geoCodecParams hostDefaults = GEO_CODEC_PARAMS_INIT;

static size_t hostTypeSize(ncclDataType_t dtype)
{
    switch (dtype) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static size_t hAdd(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t hMul(size_t a, size_t b) { return (b != 0 && a > SIZE_MAX / b) ? SIZE_MAX : a * b; }
static size_t hDivUp(size_t a, size_t b) { return a / b + (a % b != 0); }
static bool hBlockValid(uint32_t b) { return b >= 8 && b <= GEO_CODEC_BLOCK_MAX && b % 8 == 0; }

/* k of topk, as compress/codec_topk.c computes it (in double). */
static size_t hTopkCount(size_t count, double f)
{
    if (count == 0)
        return 0;
    double kd = ceil(f * (double)count);
    if (!(kd < (double)count))
        return count;
    return kd < 1.0 ? 1 : (size_t)kd;
}

static unsigned gridFor(size_t items, unsigned perBlock)
{
    size_t g = (items + perBlock - 1) / perBlock;
    if (g == 0)
        g = 1;
    return g > GEO_MAX_GRID ? GEO_MAX_GRID : (unsigned)g;
}

static bool aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* The result of the launches just made. */
static ncclResult_t launchResult(const char **why)
{
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        SET_WHY(cudaGetErrorString(err));
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

/* An encode call after the common checks. */
struct EncodeCall {
    geoCodecId codec;
    const void *src;        /* count elements of dtype */
    size_t count;
    ncclDataType_t dtype;
    const geoCodecParams *p; /* never NULL */
    uint64_t counter;
    float *r;               /* residual or NULL */
    unsigned char *out;     /* the chunk, 16-byte aligned */
    uint64_t payload;       /* its payload bytes */
    void *scratch;
    bool a;                 /* src and r 16-byte aligned */
    cudaStream_t st;
    ChunkHeader h;
};

/* A decode call after the common checks. */
struct DecodeCall {
    geoCodecId codec;
    const unsigned char *src; /* the chunk, 16-byte aligned */
    size_t len;
    ncclDataType_t dtype;
    void *dst;
    size_t count;
    bool acc;
    bool a;                   /* dst 16-byte aligned */
    int *status;
    cudaStream_t st;
};

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

template <int BITS, bool EF, bool SR, bool A>
static void launchQuant4(const EncodeCall &c, uint64_t key)
{
    const float *x = (const float *)c.src;
    uint32_t B = c.p->blockSize;
    size_t nb = hDivUp(c.count, B);
    if (B <= 2048) {
        unsigned grid = gridFor(nb, GEO_THREADS / 32);
        GEO_LAUNCH(grid, GEO_THREADS, c.st, encodeQuantKernel<BITS, EF, SR, A, 32>)
        (x, c.r, c.out, c.count, B, key, c.h);
    } else {
        unsigned grid = gridFor(nb, 1);
        GEO_LAUNCH(grid, GEO_THREADS, c.st, encodeQuantKernel<BITS, EF, SR, A, GEO_THREADS>)
        (x, c.r, c.out, c.count, B, key, c.h);
    }
}

template <int BITS>
static void launchQuant(const EncodeCall &c, uint64_t key)
{
    bool ef = c.r != NULL, sr = c.p->stochastic != 0, a = c.a;
    if (ef) {
        if (sr) {
            if (a) launchQuant4<BITS, true, true, true>(c, key);
            else launchQuant4<BITS, true, true, false>(c, key);
        } else {
            if (a) launchQuant4<BITS, true, false, true>(c, key);
            else launchQuant4<BITS, true, false, false>(c, key);
        }
    } else {
        if (sr) {
            if (a) launchQuant4<BITS, false, true, true>(c, key);
            else launchQuant4<BITS, false, true, false>(c, key);
        } else {
            if (a) launchQuant4<BITS, false, false, true>(c, key);
            else launchQuant4<BITS, false, false, false>(c, key);
        }
    }
}

template <bool EF>
static ncclResult_t launchTopk(const EncodeCall &c, size_t k, const char **why)
{
    const float *x = (const float *)c.src;
    TopkScratch s = topkScratchLayout(c.scratch, c.count);
    size_t nt = topkTiles(c.count);
    cudaError_t err = cudaMemsetAsync(s.hist, 0, TOPK_BINS * 4, c.st);
    if (err != cudaSuccess) {
        SET_WHY(cudaGetErrorString(err));
        return ncclUnhandledCudaError;
    }
    /* Histogram passes: enough blocks to fill the GPU, few enough that the
     * per-block histograms flush cheaply (each block loops over many tiles). */
    unsigned hgrid = gridFor(c.count, GEO_THREADS * 16);
    if (hgrid > 1024)
        hgrid = 1024;
    unsigned long long kk = k;
    GEO_LAUNCH(hgrid, GEO_THREADS, c.st, topkHistKernel<0, EF>)(x, c.r, c.count, s, c.out, c.h);
    GEO_LAUNCH(1, GEO_THREADS_ONE, c.st, topkFindKernel<0>)(s, kk);
    GEO_LAUNCH(hgrid, GEO_THREADS, c.st, topkHistKernel<1, EF>)(x, c.r, c.count, s, c.out, c.h);
    GEO_LAUNCH(1, GEO_THREADS_ONE, c.st, topkFindKernel<1>)(s, kk);
    GEO_LAUNCH(hgrid, GEO_THREADS, c.st, topkHistKernel<2, EF>)(x, c.r, c.count, s, c.out, c.h);
    GEO_LAUNCH(1, GEO_THREADS_ONE, c.st, topkFindKernel<2>)(s, kk);
    GEO_LAUNCH((unsigned)nt, GEO_THREADS, c.st, topkCountKernel<EF>)(x, c.r, c.count, s);
    GEO_LAUNCH(1, GEO_THREADS_ONE, c.st, topkScanKernel)(s, nt);
    GEO_LAUNCH((unsigned)nt, GEO_THREADS, c.st, topkWriteKernel<EF>)(x, c.r, c.count, s, c.out, kk);
    return launchResult(why);
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

/* ------------------------------------------------------------------------ */
/* The codecs                                                                */
/* ------------------------------------------------------------------------ */

static ncclResult_t noneEncode(const EncodeCall &c, const char **why)
{
    if (c.r) { /* float32: v = x + r is the payload, r becomes 0 */
        launchElem<ELEM_NONE>(c);
        return launchResult(why);
    }
    GEO_LAUNCH(1, 32, c.st, headerKernel)(c.out, c.h);
    cudaError_t err = cudaMemcpyAsync(c.out + GEO_CODEC_HEADER_BYTES, c.src, c.payload,
                                      cudaMemcpyDeviceToDevice, c.st);
    if (err != cudaSuccess) {
        SET_WHY(cudaGetErrorString(err));
        return ncclUnhandledCudaError;
    }
    return launchResult(why);
}

static void noneDecode(const DecodeCall &c)
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

static ncclResult_t fp16Encode(const EncodeCall &c, const char **why)
{
    launchElem<ELEM_FP16>(c);
    return launchResult(why);
}

static void fp16Decode(const DecodeCall &c) { launchDecode<GEO_CODEC_FP16>(c); }

static ncclResult_t bf16Encode(const EncodeCall &c, const char **why)
{
    launchElem<ELEM_BF16>(c);
    return launchResult(why);
}

static void bf16Decode(const DecodeCall &c) { launchDecode<GEO_CODEC_BF16>(c); }

static ncclResult_t int8Encode(const EncodeCall &c, const char **why)
{
    launchQuant<8>(c, geoCodecRandomKey(c.p->seed, c.counter));
    return launchResult(why);
}

static void int8Decode(const DecodeCall &c) { launchDecode<GEO_CODEC_INT8>(c); }

static ncclResult_t int4Encode(const EncodeCall &c, const char **why)
{
    launchQuant<4>(c, geoCodecRandomKey(c.p->seed, c.counter));
    return launchResult(why);
}

static void int4Decode(const DecodeCall &c) { launchDecode<GEO_CODEC_INT4>(c); }

static ncclResult_t signEncode(const EncodeCall &c, const char **why)
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

static void signDecode(const DecodeCall &c) { launchDecode<GEO_CODEC_SIGN>(c); }

static ncclResult_t topkEncode(const EncodeCall &c, const char **why)
{
    size_t k = hTopkCount(c.count, c.p->topkFraction);
    return c.r ? launchTopk<true>(c, k, why) : launchTopk<false>(c, k, why);
}

static void topkDecode(const DecodeCall &c)
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

/*
 * One GPU codec.  The public functions check the arguments common to all
 * codecs, build the header and call these.
 */
struct GpuCodec {
    /* Any dtype (none) or float32 only (the lossy codecs). */
    bool anyType;
    /* Header param and flags for these params and count (the CPU's). */
    void (*header)(const geoCodecParams *p, size_t count, uint32_t *param, uint32_t *flags);
    /* Payload bytes for count elements of dtype (dtype and params already
     * valid for the codec), SIZE_MAX when it overflows. */
    size_t (*payload)(const geoCodecParams *p, size_t count, size_t typeSize);
    /* 1 when params are valid for the codec. */
    bool (*paramsValid)(const geoCodecParams *p, size_t count);
    /* Enqueues the kernels that write the chunk, header included, and the
     * residual (count > 0); returns what launchResult says. */
    ncclResult_t (*encode)(const EncodeCall &c, const char **why);
    /* Enqueues the kernels that check the chunk, write *status and, when
     * it is valid, decode or accumulate it. */
    void (*decode)(const DecodeCall &c);
};

static void headerNone(const geoCodecParams *, size_t, uint32_t *param, uint32_t *flags)
{
    *param = 0;
    *flags = 0;
}
static void headerQuant(const geoCodecParams *p, size_t, uint32_t *param, uint32_t *flags)
{
    *param = p->blockSize;
    *flags = p->stochastic ? GEO_CODEC_FLAG_STOCHASTIC : 0;
}
static void headerSign(const geoCodecParams *p, size_t, uint32_t *param, uint32_t *flags)
{
    *param = p->blockSize;
    *flags = 0;
}
static void headerTopk(const geoCodecParams *p, size_t count, uint32_t *param, uint32_t *flags)
{
    *param = (uint32_t)hTopkCount(count, p->topkFraction);
    *flags = 0;
}

static size_t payloadRaw(const geoCodecParams *, size_t count, size_t s) { return hMul(count, s); }
static size_t payloadCast(const geoCodecParams *, size_t count, size_t) { return hMul(count, 2); }
static size_t payloadInt8(const geoCodecParams *p, size_t count, size_t)
{
    return hAdd(hMul(hDivUp(count, p->blockSize), 4), count);
}
static size_t payloadInt4(const geoCodecParams *p, size_t count, size_t)
{
    return hAdd(hMul(hDivUp(count, p->blockSize), 4), hDivUp(count, 2));
}
static size_t payloadSign(const geoCodecParams *p, size_t count, size_t)
{
    return hAdd(hMul(hDivUp(count, p->blockSize), 4), hDivUp(count, 8));
}
static size_t payloadTopk(const geoCodecParams *p, size_t count, size_t)
{
    return hMul(hTopkCount(count, p->topkFraction), 8);
}

static bool validAlways(const geoCodecParams *, size_t) { return true; }
static bool validBlock(const geoCodecParams *p, size_t) { return hBlockValid(p->blockSize); }
static bool validTopk(const geoCodecParams *p, size_t count)
{
    return p->topkFraction > 0.0 && p->topkFraction <= 1.0 && count <= GEO_CODEC_TOPK_MAX_COUNT;
}

/* Indexed by geoCodecId; lossless has none (encode == NULL). */
static const GpuCodec gpuCodecs[GEO_CODEC_COUNT] = {
    /* none */ {true, headerNone, payloadRaw, validAlways, noneEncode, noneDecode},
    /* lossless */ {true, NULL, NULL, NULL, NULL, NULL},
    /* fp16 */ {false, headerNone, payloadCast, validAlways, fp16Encode, fp16Decode},
    /* bf16 */ {false, headerNone, payloadCast, validAlways, bf16Encode, bf16Decode},
    /* int8 */ {false, headerQuant, payloadInt8, validBlock, int8Encode, int8Decode},
    /* int4 */ {false, headerQuant, payloadInt4, validBlock, int4Encode, int4Decode},
    /* sign */ {false, headerSign, payloadSign, validBlock, signEncode, signDecode},
    /* topk */ {false, headerTopk, payloadTopk, validTopk, topkEncode, topkDecode},
};

static const GpuCodec *gpuCodec(geoCodecId codec)
{
    if (codec < GEO_CODEC_NONE || codec >= GEO_CODEC_COUNT || !gpuCodecs[codec].encode)
        return NULL;
    return &gpuCodecs[codec];
}

/* ------------------------------------------------------------------------ */
/* API                                                                       */
/* ------------------------------------------------------------------------ */

extern "C" int geoCudaCodecAvailable(geoCodecId codec) { return gpuCodec(codec) != NULL; }

extern "C" size_t geoCudaCodecEncodedSize(geoCodecId codec, size_t count, ncclDataType_t dtype,
                                          const geoCodecParams *params)
{
    const GpuCodec *g = gpuCodec(codec);
    const geoCodecParams *p = params ? params : &hostDefaults;
    size_t s = hostTypeSize(dtype);
    if (!g || s == 0 || (!g->anyType && dtype != ncclFloat32) || !g->paramsValid(p, count))
        return 0;
    size_t payload = g->payload(p, count, s);
    return payload > SIZE_MAX - GEO_CODEC_HEADER_BYTES ? 0 : payload + GEO_CODEC_HEADER_BYTES;
}

extern "C" size_t geoCudaCodecScratchBytes(geoCodecId codec, size_t count,
                                           const geoCodecParams *params)
{
    if (codec != GEO_CODEC_TOPK || count == 0 ||
        geoCudaCodecEncodedSize(codec, count, ncclFloat32, params) == 0)
        return 0;
    return topkScratchBytes(count);
}

static const char *const decodeStatusText[GEO_CUDA_DECODE_STATUS_COUNT] = {
    "",
    "chunk shorter than its 32-byte header",
    "chunk magic is not GEOC",
    "chunk format version is not 1",
    "chunk header checksum mismatch",
    "chunk names an unknown codec",
    "chunk names an unknown dtype",
    "chunk header has flags its codec does not define",
    "chunk length differs from header + payload length",
    "chunk was encoded by another codec",
    "chunk dtype differs from the expected dtype",
    "decode-accumulate needs float32 elements",
    "chunk element count differs from the expected count",
    "chunk payload length differs from what its header implies",
    "chunk param field is invalid for its codec",
    "chunk padding after the last element is not 0",
    "topk k exceeds the element count",
    "topk index outside the chunk",
    "topk indices not strictly increasing",
};

extern "C" const char *geoCudaDecodeStatusString(int status)
{
    if (status < 0 || status >= GEO_CUDA_DECODE_STATUS_COUNT)
        return "unknown decode status";
    return decodeStatusText[status];
}

extern "C" ncclResult_t geoCudaCodecEncode(geoCodecId codec, const void *src, size_t count,
                                           ncclDataType_t dtype, const geoCodecParams *params,
                                           uint64_t counter, float *residual, void *dst,
                                           size_t cap, void *scratch, size_t scratchBytes,
                                           struct CUstream_st *stream, size_t *written,
                                           const char **why)
{
    if (codec == GEO_CODEC_LOSSLESS) {
        SET_WHY("lossless (zstd) has no GPU encoder; encode it on the host");
        return ncclInvalidUsage;
    }
    const GpuCodec *g = gpuCodec(codec);
    if (!g)
        BAD_ARG("unknown codec id");
    const geoCodecParams *p = params ? params : &hostDefaults;
    size_t s = hostTypeSize(dtype);
    if (s == 0)
        BAD_ARG("invalid dtype");
    if (!g->anyType && dtype != ncclFloat32)
        BAD_ARG("lossy codecs encode float32 only");
    if (residual && dtype != ncclFloat32)
        BAD_ARG("error feedback needs float32 elements");
    if (!dst || !written || (count > 0 && !src))
        BAD_ARG("NULL pointer argument");
    if (!aligned(dst, 16))
        BAD_ARG("chunk (dst) is not 16-byte aligned");
    if ((src && !aligned(src, s)) || (residual && !aligned(residual, 4)))
        BAD_ARG("src or residual is not aligned to its element size");
    size_t need = geoCudaCodecEncodedSize(codec, count, dtype, p);
    if (need == 0)
        BAD_ARG("invalid params or count for this codec");
    if (cap < need)
        BAD_ARG("cap is smaller than the encoded size");
    size_t scratchNeed = geoCudaCodecScratchBytes(codec, count, p);
    if (scratchNeed && (!scratch || scratchBytes < scratchNeed || !aligned(scratch, 16)))
        BAD_ARG("scratch missing, too small or not 16-byte aligned");

    EncodeCall c;
    c.codec = codec;
    c.src = src;
    c.count = count;
    c.dtype = dtype;
    c.p = p;
    c.counter = counter;
    c.r = residual;
    c.out = (unsigned char *)dst;
    c.payload = need - GEO_CODEC_HEADER_BYTES;
    c.scratch = scratch;
    /* Vector loads need src and r 16-byte aligned (the chunk always is). */
    c.a = aligned(src, 16) && (!residual || aligned(residual, 16));
    c.st = (cudaStream_t)stream;
    uint32_t param, flags;
    g->header(p, count, &param, &flags);
    c.h = makeHeader(codec, dtype, flags, count, c.payload, param);

    ncclResult_t res;
    if (count == 0) {
        GEO_LAUNCH(1, 32, c.st, headerKernel)(c.out, c.h);
        res = launchResult(why);
    } else {
        res = g->encode(c, why);
    }
    if (res == ncclSuccess)
        *written = need;
    return res;
}

static ncclResult_t decodeAny(geoCodecId codec, const void *src, size_t len,
                              ncclDataType_t dtype, void *dst, size_t count, bool acc,
                              int *status, struct CUstream_st *stream, const char **why)
{
    if (codec == GEO_CODEC_LOSSLESS) {
        SET_WHY("lossless (zstd) has no GPU decoder; decode it on the host");
        return ncclInvalidUsage;
    }
    const GpuCodec *g = gpuCodec(codec);
    if (!g)
        BAD_ARG("unknown codec id");
    size_t s = hostTypeSize(dtype);
    if (s == 0)
        BAD_ARG("invalid dtype");
    if ((!g->anyType || acc) && dtype != ncclFloat32)
        BAD_ARG("lossy chunks and decode-accumulate are float32 only");
    if (!src || !status || (count > 0 && !dst))
        BAD_ARG("NULL pointer argument");
    if (!aligned(src, 16))
        BAD_ARG("chunk (src) is not 16-byte aligned");
    if (!aligned(status, 4) || (dst && !aligned(dst, s)))
        BAD_ARG("dst or status is not aligned to its element size");

    DecodeCall c;
    c.codec = codec;
    c.src = (const unsigned char *)src;
    c.len = len;
    c.dtype = dtype;
    c.dst = dst;
    c.count = count;
    c.acc = acc;
    c.a = aligned(dst, 16);
    c.status = status;
    c.st = (cudaStream_t)stream;
    g->decode(c);
    return launchResult(why);
}

extern "C" ncclResult_t geoCudaCodecDecode(geoCodecId codec, const void *src, size_t len,
                                           ncclDataType_t dtype, void *dst, size_t count,
                                           int *status, struct CUstream_st *stream,
                                           const char **why)
{
    return decodeAny(codec, src, len, dtype, dst, count, false, status, stream, why);
}

extern "C" ncclResult_t geoCudaCodecDecodeAccumulate(geoCodecId codec, const void *src,
                                                     size_t len, ncclDataType_t dtype,
                                                     float *dst, size_t count, int *status,
                                                     struct CUstream_st *stream,
                                                     const char **why)
{
    return decodeAny(codec, src, len, dtype, dst, count, true, status, stream, why);
}

extern "C" ncclResult_t geoCudaWaitFlag(const uint32_t *dflag, uint32_t seq,
                                        struct CUstream_st *stream, const char **why)
{
    if (dflag == NULL || !aligned(dflag, 4))
        BAD_ARG("flag is NULL or not 4-byte aligned");
    GEO_LAUNCH(1, 32, (cudaStream_t)stream, waitFlagKernel)((const volatile unsigned *)dflag, seq);
    return launchResult(why);
}

extern "C" ncclResult_t geoCudaDivideF32(float *dst, size_t count, int divisor,
                                         struct CUstream_st *stream, const char **why)
{
    if (count == 0)
        return ncclSuccess;
    if (dst == NULL || !aligned(dst, 4))
        BAD_ARG("dst is NULL or not 4-byte aligned");
    if (divisor <= 0)
        BAD_ARG("divisor must be positive");
    GEO_LAUNCH(gridFor(count, GEO_THREADS), GEO_THREADS, (cudaStream_t)stream, divideF32Kernel)
    (dst, count, (float)divisor);
    return launchResult(why);
}
