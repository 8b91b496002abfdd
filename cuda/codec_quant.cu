/*
 * GPU encoders of int8 and int4 (compress/codec_quant.c on the CPU): one
 * team per quantisation block, a warp when the block has <= 2048 elements
 * (8 teams per CUDA block), else the whole CUDA block.  Pass 1 reads v and
 * reduces absmax (a max of integers: any order gives the CPU's); pass 2
 * quantises v kept in registers (one group per thread: B <= 256) or read
 * again (cache), writes values and residual.  Stochastic rounding draws
 * geoCodecUniform's bits on the device.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "cuda/kernels_internal.h"

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

/* The kernel's template instances for the run-time flags; the team is a
 * warp when the block has <= 2048 elements, else the CUDA block. */
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

ncclResult_t gpuInt8Encode(const EncodeCall &c, const char **why)
{
    launchQuant<8>(c, geoCodecRandomKey(c.p->seed, c.counter));
    return launchResult(why);
}

ncclResult_t gpuInt4Encode(const EncodeCall &c, const char **why)
{
    launchQuant<4>(c, geoCodecRandomKey(c.p->seed, c.counter));
    return launchResult(why);
}
