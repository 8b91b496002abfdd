/*
 * GPU codecs: CUDA kernels that encode, decode and decode-accumulate the
 * chunks of compress/codec.h on device memory, byte for byte the same
 * chunks as the CPU reference codecs (compress/codec_*.c) for the same
 * input, params and (seed, counter), with the error-feedback update fused
 * into encode exactly as the CPU does it.
 *
 * Codecs: none, fp16, bf16, int8, int4, sign, topk.  lossless (byte-plane
 * shuffle + zstd) is CPU-only: zstd has no device implementation here, so
 * every function below answers ncclInvalidUsage for GEO_CODEC_LOSSLESS
 * and the caller encodes those chunks on the host.
 *
 * This header is plain C: it needs no CUDA header.  A stream is passed as
 * `struct CUstream_st *`, which is what cudaStream_t is (NULL is the legacy
 * default stream).
 *
 * Ordering and blocking: every function checks its arguments on the host,
 * enqueues its kernels (and memsets) on `stream` and returns without
 * waiting; the results are there once the stream reaches that point.
 * Inputs must stay valid and unmodified until then.  Any host thread may
 * call these functions concurrently (they keep no state); two calls that
 * share device buffers must be ordered by their streams.
 *
 * Memory: src, dst, residual and scratch are device memory (or managed
 * memory).  Chunk pointers (encode's dst, decode's src) must be 16-byte
 * aligned (cudaMalloc gives 256); float arrays must be 4-byte aligned and
 * are read with 16-byte vector loads when they are 16-byte aligned.  The
 * chunk must not overlap src, residual or scratch.
 *
 * Results: ncclSuccess; ncclInvalidArgument (bad argument: unsupported
 * dtype, invalid params, NULL or misaligned pointer, cap or scratch too
 * small), ncclInvalidUsage (lossless), both before anything is enqueued;
 * ncclUnhandledCudaError when CUDA refused a launch or a memset (some of
 * the call's work may then be enqueued: treat the outputs as undefined).
 * On an error, *why (when why is not NULL) names the failed check or the
 * CUDA error, a static string for the caller's log line.
 *
 * Exactness: the arithmetic that defines the bytes is written with PTX
 * instructions whose rounding and subnormal handling are explicit (add.rn,
 * mul.rn, div.rn, cvt without .ftz), so -ftz=true, -fmad=true or
 * --use_fast_math in NVCCFLAGS do not change the chunks.  NaNs: IEEE 754
 * does not fix a NaN result's bits; where one reaches a chunk or a decoded
 * value the kernels reproduce what the CPU reference gives on x86-64 (the
 * NaN operand, quieted; 0xFFC00000 for an invalid operation such as
 * 0 * inf).  One exception: a sign block containing a NaN gets the scale
 * 0x7FC00000, because the CPU's NaN there depends on how its compiler
 * vectorised the sum (both are NaN; tests/device/codec_check.c reports
 * such chunks separately).
 */
#ifndef GEOCCL_CUDA_CODEC_KERNELS_H_
#define GEOCCL_CUDA_CODEC_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "compress/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* cudaStream_t is struct CUstream_st * */

/*
 * What a GPU decoder found, written to its device status word: 0 for a
 * valid chunk (decoded), else the first failed check, in the order the CPU
 * decoder checks (geoCudaDecodeStatusString gives the CPU's text).  On a
 * nonzero status nothing was written to dst.
 */
typedef enum {
    GEO_CUDA_DECODE_OK = 0,
    GEO_CUDA_DECODE_SHORT = 1,          /* len < 32 */
    GEO_CUDA_DECODE_MAGIC = 2,          /* magic is not GEOC */
    GEO_CUDA_DECODE_VERSION = 3,        /* version is not 1 */
    GEO_CUDA_DECODE_CHECKSUM = 4,       /* header checksum mismatch */
    GEO_CUDA_DECODE_UNKNOWN_CODEC = 5,  /* codec id out of range */
    GEO_CUDA_DECODE_UNKNOWN_DTYPE = 6,  /* dtype byte names no type */
    GEO_CUDA_DECODE_FLAGS = 7,          /* flags the codec does not define */
    GEO_CUDA_DECODE_LENGTH = 8,         /* len != 32 + payload length */
    GEO_CUDA_DECODE_OTHER_CODEC = 9,    /* chunk of another codec */
    GEO_CUDA_DECODE_DTYPE = 10,         /* chunk dtype != expected dtype */
    GEO_CUDA_DECODE_ACC_DTYPE = 11,     /* accumulate needs float32 */
    GEO_CUDA_DECODE_COUNT = 12,         /* element count != expected */
    GEO_CUDA_DECODE_PAYLOAD = 13,       /* payload length inconsistent */
    GEO_CUDA_DECODE_PARAM = 14,         /* param field invalid for the codec */
    GEO_CUDA_DECODE_PADDING = 15,       /* int4 nibble / sign bits after the end not 0 */
    GEO_CUDA_DECODE_TOPK_K = 16,        /* topk k > count */
    GEO_CUDA_DECODE_TOPK_RANGE = 17,    /* topk index >= count */
    GEO_CUDA_DECODE_TOPK_ORDER = 18,    /* topk indices not strictly increasing */
    GEO_CUDA_DECODE_STATUS_COUNT = 19
} geoCudaDecodeStatus;

/* The reason for a status word's value, a static string ("" for 0, "unknown
 * decode status" out of range). */
const char *geoCudaDecodeStatusString(int status);

/* 1 if the GPU implements codec (every codec but lossless), else 0. */
int geoCudaCodecAvailable(geoCodecId codec);

/*
 * Chunk size (header included) the GPU encoder writes for these arguments,
 * equal to geoCodecs[codec].maxEncodedSize (the GPU codecs' chunks have
 * exact sizes).  params NULL = GEO_CODEC_PARAMS_INIT.  Returns 0 when the
 * GPU cannot encode them (lossless, unsupported dtype, invalid params,
 * size overflow).
 */
size_t geoCudaCodecEncodedSize(geoCodecId codec, size_t count, ncclDataType_t dtype,
                               const geoCodecParams *params);

/*
 * Device scratch bytes encode needs for these arguments (topk: histograms
 * and per-tile counts; 0 for the other codecs).  Scratch holds nothing
 * between calls, so one buffer of the largest size serves every call on
 * one stream.  Returns 0 also for arguments encode would reject.
 */
size_t geoCudaCodecScratchBytes(geoCodecId codec, size_t count, const geoCodecParams *params);

/*
 * Encodes count elements at src (device) into one chunk at dst (device),
 * stream-ordered; the chunk's bytes equal those of geoCodecs[codec].encode
 * on the same values, params and counter.
 *   [in]     codec    any codec but GEO_CODEC_LOSSLESS
 *   [in]     src      count elements of dtype (ncclFloat32 for lossy
 *                     codecs; any dtype for none); NULL when count is 0
 *   [in]     count    elements (topk: at most GEO_CODEC_TOPK_MAX_COUNT)
 *   [in]     dtype    element type
 *   [in]     params   encoder settings; NULL = GEO_CODEC_PARAMS_INIT
 *   [in]     counter  stochastic rounding stream (see codec.h)
 *   [in,out] residual NULL, or count float32 values on the device (error
 *                     feedback, float32 only): v = src + residual is encoded
 *                     and residual becomes v - decode(chunk) (0 where not
 *                     finite), exactly as the CPU codec leaves it
 *   [out]    dst      the chunk, 16-byte aligned
 *   [in]     cap      bytes at dst; >= geoCudaCodecEncodedSize(...)
 *   [in]     scratch  device scratch of scratchBytes >=
 *                     geoCudaCodecScratchBytes(...) (NULL when that is 0);
 *                     16-byte aligned
 *   [in]     stream   the stream to enqueue on
 *   [out]    written  host memory: the chunk length, set before return
 *                     (on success only); the bytes are there when the
 *                     stream gets there
 *   [out]    why      optional: the failed check on error
 * Returns as the header says.  Does not block.
 */
ncclResult_t geoCudaCodecEncode(geoCodecId codec, const void *src, size_t count,
                                ncclDataType_t dtype, const geoCodecParams *params,
                                uint64_t counter, float *residual, void *dst, size_t cap,
                                void *scratch, size_t scratchBytes,
                                struct CUstream_st *stream, size_t *written,
                                const char **why);

/*
 * Decodes the chunk of exactly len bytes at src (device, 16-byte aligned)
 * into count elements of dtype at dst (device), stream-ordered.  The chunk
 * is checked on the device exactly as the CPU decoder checks it (header,
 * codec, dtype, count, payload length, params, padding, topk indices)
 * before anything is written; the verdict goes to *status (device int): 0,
 * or a geoCudaDecodeStatus, in which case dst is untouched.
 *   [in]  codec   the codec the caller expects (not lossless)
 *   [in]  src     the chunk (device)
 *   [in]  len     its length in bytes
 *   [in]  dtype   expected element type (ncclFloat32 for lossy codecs)
 *   [out] dst     count elements (device); may be NULL when count is 0
 *   [in]  count   expected element count
 *   [out] status  device int; written by this call's kernels
 *   [in]  stream  the stream to enqueue on
 *   [out] why     optional: the failed argument check on error
 * Returns as the header says (a corrupt chunk is not an error here: its
 * verdict is *status).  Does not block.
 */
ncclResult_t geoCudaCodecDecode(geoCodecId codec, const void *src, size_t len,
                                ncclDataType_t dtype, void *dst, size_t count, int *status,
                                struct CUstream_st *stream, const char **why);

/*
 * dst[i] += decoded element i, one binary32 addition each (bit for bit the
 * CPU's decodeAccumulate); the chunk must hold float32 elements.  Arguments,
 * checks and results as geoCudaCodecDecode.
 */
ncclResult_t geoCudaCodecDecodeAccumulate(geoCodecId codec, const void *src, size_t len,
                                          ncclDataType_t dtype, float *dst, size_t count,
                                          int *status, struct CUstream_st *stream,
                                          const char **why);

/*
 * The stream waits (a one-warp kernel that polls) until the 32-bit word at
 * dflag, the device address of mapped pinned memory the host writes, has
 * reached seq: (int32_t)(*dflag - seq) >= 0, as cuStreamWaitValue32 with
 * CU_STREAM_WAIT_VALUE_GEQ.  For devices without stream memory operations:
 * unlike a host function that polls, it holds no thread of CUDA's, so a
 * wait can never keep another stream's host function (or wait) from
 * running.  It occupies one warp of one SM while it waits.  Does not
 * block; ncclInvalidArgument for a NULL or misaligned dflag,
 * ncclUnhandledCudaError when the launch failed.
 */
ncclResult_t geoCudaWaitFlag(const uint32_t *dflag, uint32_t seq, struct CUstream_st *stream,
                             const char **why);

/*
 * dst[i] = dst[i] / divisor for count float32 values on the device (the
 * average of a float all-reduce), one binary32 division rounded to
 * nearest each, as the CPU's geoDivide.  Stream-ordered; does not block.
 * ncclInvalidArgument for a NULL or misaligned dst (count > 0) or a
 * divisor < 1; ncclUnhandledCudaError when the launch failed.
 */
ncclResult_t geoCudaDivideF32(float *dst, size_t count, int divisor, struct CUstream_st *stream,
                              const char **why);

#ifdef __cplusplus
}
#endif

#endif
