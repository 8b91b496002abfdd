/*
 * What the host side of cuda/'s files shares: the launch macro, the
 * argument-check macros, small host helpers, the encode and decode calls
 * after the common checks (codec_kernels.cu makes them), and the entry
 * points each codec's file gives the table in codec_kernels.cu.
 *
 * The entry points are the only functions with external linkage besides
 * codec_kernels.h's API; GEO_KERN_HIDDEN keeps them out of the library's
 * exported symbols.  Kernels stay static to the file that launches them,
 * so no file launches another's kernels and nvcc needs no relocatable
 * device code.
 */
#ifndef GEOCCL_CUDA_KERNELS_INTERNAL_H_
#define GEOCCL_CUDA_KERNELS_INTERNAL_H_

#include "cuda/kernels_device.h"

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

static inline size_t hostTypeSize(ncclDataType_t dtype)
{
    switch (dtype) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static inline size_t hAdd(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static inline size_t hMul(size_t a, size_t b)
{
    return (b != 0 && a > SIZE_MAX / b) ? SIZE_MAX : a * b;
}
static inline size_t hDivUp(size_t a, size_t b) { return a / b + (a % b != 0); }
static inline bool hBlockValid(uint32_t b)
{
    return b >= 8 && b <= GEO_CODEC_BLOCK_MAX && b % 8 == 0;
}

/* k of topk, as compress/codec_topk.c computes it (in double). */
static inline size_t hTopkCount(size_t count, double f)
{
    if (count == 0)
        return 0;
    double kd = ceil(f * (double)count);
    if (!(kd < (double)count))
        return count;
    return kd < 1.0 ? 1 : (size_t)kd;
}

static inline unsigned gridFor(size_t items, unsigned perBlock)
{
    size_t g = (items + perBlock - 1) / perBlock;
    if (g == 0)
        g = 1;
    return g > GEO_MAX_GRID ? GEO_MAX_GRID : (unsigned)g;
}

static inline bool aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* The result of the launches just made.  No launch fails with
 * cudaErrorNotReady: that is a query's answer (cudaEventQuery,
 * cudaStreamQuery) that CUDA keeps as the thread's last error until read,
 * left there by an earlier call on this thread (the caller's own poll of
 * its stream), not by these launches. */
static inline ncclResult_t launchResult(const char **why)
{
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess && err != cudaErrorNotReady) {
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

#ifdef GEO_CUDA_EMU
#define GEO_KERN_HIDDEN
#else
#define GEO_KERN_HIDDEN __attribute__((visibility("hidden")))
#endif

/* Each codec's encoder (codec_cast.cu, codec_quant.cu, codec_sign.cu,
 * codec_topk.cu): enqueues the kernels that write the chunk, header
 * included, and the residual (count > 0); returns what launchResult says. */
GEO_KERN_HIDDEN ncclResult_t gpuNoneEncode(const EncodeCall &c, const char **why);
GEO_KERN_HIDDEN ncclResult_t gpuFp16Encode(const EncodeCall &c, const char **why);
GEO_KERN_HIDDEN ncclResult_t gpuBf16Encode(const EncodeCall &c, const char **why);
GEO_KERN_HIDDEN ncclResult_t gpuInt8Encode(const EncodeCall &c, const char **why);
GEO_KERN_HIDDEN ncclResult_t gpuInt4Encode(const EncodeCall &c, const char **why);
GEO_KERN_HIDDEN ncclResult_t gpuSignEncode(const EncodeCall &c, const char **why);
GEO_KERN_HIDDEN ncclResult_t gpuTopkEncode(const EncodeCall &c, const char **why);

/* Each codec's decoder (codec_decode.cu): enqueues the kernels that check
 * the chunk, write *status and, when it is valid, decode or accumulate it. */
GEO_KERN_HIDDEN void gpuNoneDecode(const DecodeCall &c);
GEO_KERN_HIDDEN void gpuFp16Decode(const DecodeCall &c);
GEO_KERN_HIDDEN void gpuBf16Decode(const DecodeCall &c);
GEO_KERN_HIDDEN void gpuInt8Decode(const DecodeCall &c);
GEO_KERN_HIDDEN void gpuInt4Decode(const DecodeCall &c);
GEO_KERN_HIDDEN void gpuSignDecode(const DecodeCall &c);
GEO_KERN_HIDDEN void gpuTopkDecode(const DecodeCall &c);

/* Enqueues the one-warp kernel that writes c.h at c.out (codec_kernels.cu):
 * a chunk of no elements, or the header before none's payload copy. */
GEO_KERN_HIDDEN void gpuLaunchHeader(const EncodeCall &c);

/* Scratch bytes topk's encoder needs for count elements (codec_topk.cu). */
GEO_KERN_HIDDEN size_t gpuTopkScratchBytes(size_t count);

#endif
