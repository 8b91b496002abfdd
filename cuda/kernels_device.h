/*
 * Device helpers that every kernel file of cuda/ shares: the exact float
 * arithmetic, the NaN rules, the fp16/bf16 conversions, the chunk header
 * a kernel writes, and loads and stores of groups of 8 elements.  All are
 * inline (GEO_DEV) so that each .cu compiles on its own without
 * relocatable device code.
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
 *     order (each kernel file says how).
 *
 * Built by nvcc for the library, or (GEO_CUDA_EMU) as plain C++ against
 * tests/device/cuda_emu_device.h, which runs the same kernels on the CPU so
 * that their indexing, bounds, barriers and warp logic are tested by make
 * check where no GPU is; that build compiles every kernel file as one
 * translation unit (tests/device/cuda_emu_kernels.cpp).
 */
#ifndef GEOCCL_CUDA_KERNELS_DEVICE_H_
#define GEOCCL_CUDA_KERNELS_DEVICE_H_

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
/* Chunk header                                                             */
/* ------------------------------------------------------------------------ */

/* The 32 header bytes as words, built on the host and passed by value. */
struct ChunkHeader {
    uint32_t w[8];
};

/* Thread 0 of block 0 writes the header (dst is 16-byte aligned); constant
 * indices keep h out of local memory. */
GEO_DEV void writeHeader(unsigned char *dst, const ChunkHeader &h)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        ((uint4 *)dst)[0] = make_uint4(h.w[0], h.w[1], h.w[2], h.w[3]);
        ((uint4 *)dst)[1] = make_uint4(h.w[4], h.w[5], h.w[6], h.w[7]);
    }
}

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

#endif
