/* The codec table, names and GEOCCL_COMPRESS parsing, and the chunk header
 * (format in codec.h). */
#include "config.h"
#include "compress/codec_impl.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CODEC_ENTRY(ID, NAME, N, LOSSY, SUPPORTS)                                  \
    [ID] = {NAME,           ID,           LOSSY,          SUPPORTS,                \
            codec##N##MaxSize, codec##N##Encode, codec##N##Decode, codec##N##DecodeAcc}

const geoCodec geoCodecs[GEO_CODEC_COUNT] = {
    CODEC_ENTRY(GEO_CODEC_NONE, "none", None, 0, codecAnyType),
    CODEC_ENTRY(GEO_CODEC_LOSSLESS, "lossless", Lossless, 0, codecAnyType),
    CODEC_ENTRY(GEO_CODEC_FP16, "fp16", Fp16, 1, codecFloat32Only),
    CODEC_ENTRY(GEO_CODEC_BF16, "bf16", Bf16, 1, codecFloat32Only),
    CODEC_ENTRY(GEO_CODEC_INT8, "int8", Int8, 1, codecFloat32Only),
    CODEC_ENTRY(GEO_CODEC_INT4, "int4", Int4, 1, codecFloat32Only),
    CODEC_ENTRY(GEO_CODEC_SIGN, "sign", Sign, 1, codecFloat32Only),
    CODEC_ENTRY(GEO_CODEC_TOPK, "topk", Topk, 1, codecFloat32Only),
};

_Static_assert(sizeof(geoCodecs) / sizeof(geoCodecs[0]) == GEO_CODEC_COUNT,
               "one table entry per codec id");

static const geoCodecParams codecDefaults = GEO_CODEC_PARAMS_INIT;

/* Flags each codec may set (header byte 7); the rest must be 0. */
static const uint32_t codecFlagsAllowed[GEO_CODEC_COUNT] = {
    [GEO_CODEC_LOSSLESS] = GEO_CODEC_FLAG_ZSTD,
    [GEO_CODEC_INT8] = GEO_CODEC_FLAG_STOCHASTIC,
    [GEO_CODEC_INT4] = GEO_CODEC_FLAG_STOCHASTIC,
};

size_t codecTypeSize(ncclDataType_t dtype)
{
    switch (dtype) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

int codecAnyType(ncclDataType_t dtype) { return codecTypeSize(dtype) != 0; }
int codecFloat32Only(ncclDataType_t dtype) { return dtype == ncclFloat32; }

const geoCodecParams *codecParamsOrDefault(const geoCodecParams *params)
{
    return params ? params : &codecDefaults;
}

int codecBlockSizeValid(uint32_t blockSize)
{
    return blockSize >= 8 && blockSize <= GEO_CODEC_BLOCK_MAX && blockSize % 8 == 0;
}

void geoCodecParamsInit(geoCodecParams *params)
{
    if (params)
        *params = codecDefaults;
}

const geoCodec *geoCodecGet(geoCodecId id)
{
    return ((unsigned)id < GEO_CODEC_COUNT) ? &geoCodecs[id] : NULL;
}

const geoCodec *geoCodecByName(const char *name)
{
    if (!name)
        return NULL;
    for (int i = 0; i < GEO_CODEC_COUNT; i++)
        if (strcmp(geoCodecs[i].name, name) == 0)
            return &geoCodecs[i];
    return NULL;
}

ncclResult_t geoCodecParse(const char *text, geoCodecId *id, geoCodecParams *params)
{
    if (!text || !id)
        return ncclInvalidArgument;
    if (strcmp(text, "auto") == 0) {
        *id = GEO_CODEC_AUTO;
        return ncclSuccess;
    }
    const char *colon = strchr(text, ':');
    if (!colon) {
        const geoCodec *c = geoCodecByName(text);
        if (!c)
            return ncclInvalidArgument;
        *id = c->id;
        return ncclSuccess;
    }
    /* Only topk takes an argument. */
    if ((size_t)(colon - text) != 4 || strncmp(text, "topk", 4) != 0)
        return ncclInvalidArgument;
    const char *num = colon + 1;
    /* strtod would accept blanks, a sign, hex, "inf" and "nan": allow only
     * digits, one dot and an exponent. */
    if (!(*num >= '0' && *num <= '9') && *num != '.')
        return ncclInvalidArgument;
    for (const char *p = num; *p; p++)
        if (!strchr("0123456789.eE+-", *p))
            return ncclInvalidArgument;
    char *end = NULL;
    errno = 0;
    double k = strtod(num, &end);
    if (errno != 0 || end == num || *end != '\0' || !(k > 0.0) || !(k <= 1.0))
        return ncclInvalidArgument;
    *id = GEO_CODEC_TOPK;
    if (params)
        params->topkFraction = k;
    return ncclSuccess;
}

void codecWriteHeader(unsigned char *dst, geoCodecId codec, ncclDataType_t dtype,
                      uint32_t flags, uint64_t count, uint64_t payloadBytes, uint32_t param)
{
    codecSt32(dst + 0, GEO_CODEC_MAGIC);
    dst[4] = GEO_CODEC_VERSION;
    dst[5] = (unsigned char)codec;
    dst[6] = (unsigned char)dtype;
    dst[7] = (unsigned char)flags;
    codecSt64(dst + 8, count);
    codecSt64(dst + 16, payloadBytes);
    codecSt32(dst + 24, param);
    codecSt32(dst + 28, geoCodecChecksum(dst, 28));
}

ncclResult_t geoCodecReadHeader(const void *src, size_t len, geoCodecHeader *hdr,
                                const char **why)
{
    const unsigned char *p = src;
    if (!p)
        CODEC_BAD(why, "chunk pointer is NULL");
    if (len < GEO_CODEC_HEADER_BYTES)
        CODEC_BAD(why, "chunk shorter than its 32-byte header");
    if (codecLd32(p) != GEO_CODEC_MAGIC)
        CODEC_BAD(why, "chunk magic is not GEOC");
    if (p[4] != GEO_CODEC_VERSION)
        CODEC_BAD(why, "chunk format version is not 1");
    if (codecLd32(p + 28) != geoCodecChecksum(p, 28))
        CODEC_BAD(why, "chunk header checksum mismatch");
    if (p[5] >= GEO_CODEC_COUNT)
        CODEC_BAD(why, "chunk names an unknown codec");
    if (codecTypeSize((ncclDataType_t)p[6]) == 0)
        CODEC_BAD(why, "chunk names an unknown dtype");
    if ((p[7] & ~codecFlagsAllowed[p[5]]) != 0)
        CODEC_BAD(why, "chunk header has flags its codec does not define");
    uint64_t payload = codecLd64(p + 16);
    if (payload != (uint64_t)(len - GEO_CODEC_HEADER_BYTES))
        CODEC_BAD(why, "chunk length differs from header + payload length");
    if (hdr) {
        hdr->codec = (geoCodecId)p[5];
        hdr->dtype = (ncclDataType_t)p[6];
        hdr->flags = p[7];
        hdr->count = codecLd64(p + 8);
        hdr->payloadBytes = payload;
        hdr->param = codecLd32(p + 24);
    }
    return ncclSuccess;
}

ncclResult_t codecDecodeBegin(const void *src, size_t len, geoCodecId codec,
                              ncclDataType_t dtype, const void *dst, size_t count,
                              int accumulate, geoCodecHeader *hdr, const char **why)
{
    ncclResult_t res = geoCodecReadHeader(src, len, hdr, why);
    if (res != ncclSuccess)
        return res;
    if (hdr->codec != codec)
        CODEC_BAD(why, "chunk was encoded by another codec");
    if (hdr->dtype != dtype)
        CODEC_BAD(why, "chunk dtype differs from the expected dtype");
    if (accumulate && dtype != ncclFloat32)
        CODEC_BAD(why, "decode-accumulate needs float32 elements");
    if (hdr->count != (uint64_t)count)
        CODEC_BAD(why, "chunk element count differs from the expected count");
    if (count > 0 && !dst)
        CODEC_BAD(why, "destination is NULL");
    return ncclSuccess;
}

ncclResult_t codecEncodeBegin(const geoCodec *codec, const void *src, size_t count,
                              ncclDataType_t dtype, const geoCodecParams *params,
                              const float *residual, const void *dst, size_t cap,
                              const size_t *written, size_t *need)
{
    if (!codec->supports(dtype))
        return ncclInvalidArgument;
    if (residual && dtype != ncclFloat32)
        return ncclInvalidArgument;
    if (!dst || !written || (count > 0 && !src))
        return ncclInvalidArgument;
    *need = codec->maxEncodedSize(count, dtype, params);
    if (*need == 0 || cap < *need)
        return ncclInvalidArgument;
    return ncclSuccess;
}

ncclResult_t geoCodecDecodeChunk(const void *src, size_t len, ncclDataType_t dtype,
                                 void *dst, size_t count, int accumulate,
                                 const char **why)
{
    geoCodecHeader hdr;
    ncclResult_t res = geoCodecReadHeader(src, len, &hdr, why);
    if (res != ncclSuccess)
        return res;
    const geoCodec *c = &geoCodecs[hdr.codec];
    return accumulate ? c->decodeAccumulate(src, len, dtype, dst, count, why)
                      : c->decode(src, len, dtype, dst, count, why);
}
