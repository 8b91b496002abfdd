/*
 * Two stream-ordered operations the device collectives (comm/device/)
 * enqueue beside the codecs: a wait on a flag the host writes in mapped
 * pinned memory, and the float32 division of an average.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "cuda/kernels_internal.h"

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
 * emulation's kernels are host threads: an acquire load there too (a
 * plain volatile read leaves the exchange thread's writes unordered with
 * the stream's later copies, a race ThreadSanitizer reports). */
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
