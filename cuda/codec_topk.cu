/*
 * GPU encoder of topk (compress/codec_topk.c on the CPU).  It selects the
 * same set as the CPU: the k-th largest key T is found exactly (radix
 * select on the 31 key bits, 11 + 11 + 9: histogram passes and one-block
 * find kernels), then every key > T and the first (in index order) keys
 * == T up to k are kept, placed by an order-preserving scan (a per-tile
 * count, a scan of the tile counts, the write pass), so the indices come
 * out increasing.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "cuda/kernels_internal.h"

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

size_t gpuTopkScratchBytes(size_t count)
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

ncclResult_t gpuTopkEncode(const EncodeCall &c, const char **why)
{
    size_t k = hTopkCount(c.count, c.p->topkFraction);
    return c.r ? launchTopk<true>(c, k, why) : launchTopk<false>(c, k, why);
}
