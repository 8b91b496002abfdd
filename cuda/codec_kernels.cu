/*
 * GPU codecs (cuda/codec_kernels.h), the host side: the public functions
 * check the arguments every codec shares, build the header on the host (it
 * reaches the device as a kernel argument, so no host buffer has to outlive
 * the call) and dispatch through gpuCodecs[], a table of per-codec
 * operations indexed by geoCodecId.  The kernels that write and read the
 * chunks of compress/codec.h byte for byte as the CPU reference does are in
 * codec_cast.cu, codec_quant.cu, codec_sign.cu, codec_topk.cu (encoders)
 * and codec_decode.cu; the exactness rules they share in kernels_device.h.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "cuda/kernels_internal.h"

static const geoCodecParams hostDefaults = GEO_CODEC_PARAMS_INIT;

/* The 32 header bytes (compress/codec.h's layout and checksum) for the
 * kernels to write. */
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

GEO_KERNEL void headerKernel(unsigned char *dst, ChunkHeader h) { writeHeader(dst, h); }

void gpuLaunchHeader(const EncodeCall &c) { GEO_LAUNCH(1, 32, c.st, headerKernel)(c.out, c.h); }

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
    /* none */ {true, headerNone, payloadRaw, validAlways, gpuNoneEncode, gpuNoneDecode},
    /* lossless */ {true, NULL, NULL, NULL, NULL, NULL},
    /* fp16 */ {false, headerNone, payloadCast, validAlways, gpuFp16Encode, gpuFp16Decode},
    /* bf16 */ {false, headerNone, payloadCast, validAlways, gpuBf16Encode, gpuBf16Decode},
    /* int8 */ {false, headerQuant, payloadInt8, validBlock, gpuInt8Encode, gpuInt8Decode},
    /* int4 */ {false, headerQuant, payloadInt4, validBlock, gpuInt4Encode, gpuInt4Decode},
    /* sign */ {false, headerSign, payloadSign, validBlock, gpuSignEncode, gpuSignDecode},
    /* topk */ {false, headerTopk, payloadTopk, validTopk, gpuTopkEncode, gpuTopkDecode},
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
    return gpuTopkScratchBytes(count);
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
        gpuLaunchHeader(c);
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
