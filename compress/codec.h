/*
 * Gradient codecs: the interface every codec implements, the table of
 * codecs indexed by geoCodecId, and the encoded chunk format.
 *
 * A codec turns `count` elements into one self-describing encoded chunk and
 * back.  The collectives cut a shard into chunks and call encode, decode or
 * decodeAccumulate per chunk so that coding pipelines with the network.
 *
 * Layering: this module includes only nccl.h (for ncclDataType_t and
 * ncclResult_t) and its own headers.  It does not log: a failing decoder
 * returns the code and, when asked, a static string naming the failed check
 * (the `why` argument) that the caller, who knows the peer and the
 * operation, puts into its one log line.
 *
 * Threads: every function here is reentrant and keeps no state between
 * calls; any thread may call any of them concurrently on distinct buffers.
 * None of them blocks.
 *
 * ------------------------------------------------------------------------
 * Encoded chunk format, version 1 (what a CUDA encoder must reproduce byte
 * for byte).  All multi-byte fields are little-endian, payload values too
 * (the library builds only on little-endian hosts).
 *
 *   offset size  field
 *   0      4     magic 0x434F4547 (the bytes "GEOC")
 *   4      1     version, 1
 *   5      1     codec id (enum geoCodecId)
 *   6      1     dtype of the elements the chunk stands for (ncclDataType_t)
 *   7      1     flags, per codec (below); bits a codec does not define are 0
 *                (decoders refuse a chunk with any of them set)
 *   8      8     count: elements in the chunk
 *   16     8     payload length in bytes; the chunk is exactly 32 + this
 *   24     4     param: block size (int8, int4, sign), k (topk), else 0
 *   28     4     checksum: FNV-1a 32 (offset basis 0x811C9DC5, prime
 *                0x01000193, one byte at a time) over bytes 0..27
 *   32     ...   payload
 *
 * Payloads (n = count, B = block size, nb = ceil(n / B) blocks; block b holds
 * elements [b*B, min((b+1)*B, n)); the last one may be shorter):
 *   none      n * size(dtype) bytes: the elements as they are.  flags 0.
 *   lossless  flags bit 0 clear: n * size(dtype) raw bytes, as `none`
 *             (the encoder's choice when zstd does not shrink the planes).
 *             flags bit 0 set: one zstd frame (with its content size and
 *             content checksum, made by the host's libzstd) whose
 *             content is the byte-plane shuffle of the elements: for
 *             elements of S bytes, plane j (0 <= j < S) holds byte j of
 *             element 0, 1, ..., n-1, and the planes follow each other.
 *   fp16      n binary16 values (2 bytes each).  flags 0.
 *   bf16      n bfloat16 values (the top 16 bits of binary32).  flags 0.
 *   int8      nb float32 scales, then n int8 values q; x' = (float)q * scale.
 *             flags bit 0: stochastic rounding was used (information only).
 *   int4      nb float32 scales, then ceil(n/2) bytes: element i is the
 *             4-bit two's complement nibble at byte i/2, low nibble for
 *             even i, high nibble for odd i; q in [-7, 7]; the unused high
 *             nibble of an odd count is 0 (decoders check it).
 *             x' = (float)q * scale.  flags as int8.
 *   sign      nb float32 scales, then ceil(n/8) bytes: bit (i % 8) (LSB
 *             first) of byte i/8 is 1 when element i was < 0 (so -0 and
 *             NaN give 0); x' = bit ? -scale : +scale (a sign flip).  Unused
 *             bits of the last byte are 0 (decoders check it).  flags 0.
 *   topk      k uint32 indices, strictly increasing and < n, then k float32
 *             values.  param = k.  flags 0.
 *
 * The arithmetic that defines the bytes (CPU reference; a kernel must do the
 * same): IEEE binary32, round to nearest even, no fused multiply-add (CUDA:
 * __fmul_rn/__fadd_rn or -fmad=false), subnormals kept (no -ftz), IEEE
 * division (CUDA's default -prec-div=true).  In the encoder v = x + r when a
 * residual r is given (one binary32 addition), else v = x.
 *   fp16/bf16 round v to nearest even; finite values beyond the format's
 *             largest finite value become that value with v's sign
 *             (saturation, so that error feedback stays finite); infinities
 *             stay infinite; NaN becomes a quiet NaN (fp16 0x7E00, bf16 the
 *             high half with bit 6 set), sign kept.
 *   int8/int4 L = 127 (int8) or 7 (int4).  absmax = the largest |v| of the
 *             block, found as the largest (bits(v) & 0x7FFFFFFF) as an
 *             unsigned integer (so a NaN wins).  If absmax < 2^-100: scale
 *             = 0 and every q = 0.  Else scale = absmax / L and
 *             inv = L / absmax (two divisions), t = v * inv clamped to
 *             [-L, L] (a NaN becomes -L).  Nearest: q = t rounded to nearest
 *             even.  Stochastic: q = floor(t + u) clamped to [-L, L], with
 *             u = geoCodecUniform(geoCodecRandomKey(seed, counter), i) for
 *             the element's index i in the chunk.
 *   sign      scale = (sum of |v| over the block) / (float)nElementsOfBlock,
 *             summed as 32 lanes: lane l (0..31) adds |v| of the block's
 *             elements l, l+32, l+64, ... in increasing order, starting from
 *             0.0f; then for d = 16, 8, 4, 2, 1 every lane l < d does
 *             lane[l] += lane[l + d]; the sum is lane[0] (one warp with
 *             __shfl_down_sync does exactly this).
 *   topk      key(i) = bits(v_i) & 0x7FFFFFFF as an unsigned integer;
 *             k = min(n, max(1, ceil(fraction * n))), the product in
 *             binary64 (so fraction 0.3 of 10 elements keeps 4: 0.3 * 10 is
 *             3.0000000000000004);
 *             the chunk keeps the k elements that come first when ordered by
 *             key descending, then index ascending; values are v exactly.
 *
 * ------------------------------------------------------------------------
 * Error bounds of one round trip (x' = decode(encode(v)); v finite):
 *   none, lossless  exact (bit for bit, every dtype).
 *   fp16   |v - x'| <= 2^-11 |v| when 2^-14 <= |v| <= 65504;
 *          |v - x'| <= 2^-25 when |v| < 2^-14 (subnormal step 2^-24);
 *          |v| > 65504 saturates to +-65504.
 *   bf16   |v - x'| <= 2^-8 |v| for normal v up to the largest bfloat16
 *          (0x1.FEp127, about 3.39e38; larger v saturate to it);
 *          |v - x'| <= 2^-134 for subnormal v.
 *   int8   nearest: |v - x'| <= scale / 2 = absmax / 254 per block;
 *          stochastic: |v - x'| < scale = absmax / 127 and E[x'] = v
 *          (both up to binary32 rounding of t, about 2^-24 * 127 steps).
 *          Blocks with absmax < 2^-100 decode to 0 (error <= absmax).
 *          With every binary32 rounding counted (scale, inv, t, the clamp
 *          and q * scale, each at most 2^-24 relative): |v - x'| <=
 *          absmax (1/254 + 2^-21) nearest, absmax (1/127 + 2^-21)
 *          stochastic, or 2^-100 for a block below it.
 *   int4   nearest: |v - x'| <= scale / 2 = absmax / 14 per block;
 *          stochastic: |v - x'| < scale = absmax / 7; same caveats
 *          (absmax (1/14 + 2^-21), absmax (1/7 + 2^-21) with rounding).
 *   sign   x' has the sign of v (+scale for v = 0 or -0) and |x'| = scale
 *          = mean |v| of the block, so |v - x'| <= |v| + scale <= 2 absmax
 *          and sum |x'| = sum |v| over a block (up to rounding: the
 *          32-lane sum and the division leave scale <= absmax (1 + (B/32 +
 *          6) 2^-23) for a block of B elements).  The
 *          block's sum of |v| must stay finite in binary32 (below about
 *          3.4e38), else the scale is infinite.  The sign codec is meant to
 *          be used with error feedback.
 *   topk   kept elements exact; the others decode to 0, and every dropped
 *          |v| <= the smallest kept |v|.
 * With error feedback the residual makes the sum over calls unbiased: after
 * encode, x' + r_new == v = x + r_old up to one rounding of the subtraction.
 * One call's error is then r_old - r_new, not a round trip's: bounded by
 * twice the round trip's for fp16, bf16, int8 and int4 once the residuals
 * settle, not bounded for sign and topk (a dropped element's residual grows
 * until it is sent).  Through the hierarchical all-reduce a result crosses
 * two round trips (the partials of k - 1 regions, then the sum), with the
 * float sums between them: geoccl-perf's check (tools/perf_common.c,
 * codec_bound) composes these bounds, from zero residuals, into the bound it
 * holds each element to.
 */
#ifndef GEOCCL_COMPRESS_CODEC_H_
#define GEOCCL_COMPRESS_CODEC_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Codec ids; the value is stored in every chunk (header byte 5), so the
 * numbers must never change. */
typedef enum {
    GEO_CODEC_NONE = 0,     /* plain copy, every dtype */
    GEO_CODEC_LOSSLESS = 1, /* byte-plane shuffle + zstd, every dtype */
    GEO_CODEC_FP16 = 2,     /* float32 -> binary16, nearest even */
    GEO_CODEC_BF16 = 3,     /* float32 -> bfloat16, nearest even */
    GEO_CODEC_INT8 = 4,     /* per-block absmax scale, 8-bit */
    GEO_CODEC_INT4 = 5,     /* per-block absmax scale, 4-bit */
    GEO_CODEC_SIGN = 6,     /* 1 bit per element, per-block mean |x|; a NaN
                               mean is stored as 0x7FC00000 */
    GEO_CODEC_TOPK = 7,     /* fraction k largest by magnitude */
    GEO_CODEC_COUNT = 8,    /* number of codecs (size of geoCodecs[]) */
    GEO_CODEC_AUTO = 9      /* not a codec: geoCodecParse("auto") returns it;
                               the caller chooses a real one */
} geoCodecId;

/* Format constants (see the format description above). */
#define GEO_CODEC_MAGIC 0x434F4547u /* "GEOC" */
#define GEO_CODEC_VERSION 1
#define GEO_CODEC_HEADER_BYTES 32
/* Header flags. */
#define GEO_CODEC_FLAG_ZSTD 0x01u       /* lossless: payload is a zstd frame */
#define GEO_CODEC_FLAG_STOCHASTIC 0x01u /* int8/int4: stochastic rounding */
/* Block sizes (int8, int4, sign) are multiples of 8 in [8, 2^24], so that
 * int4 and sign blocks start on a byte and a block's element count is exact
 * in binary32. */
#define GEO_CODEC_BLOCK_DEFAULT 256u
#define GEO_CODEC_BLOCK_MAX (1u << 24)
/* topk chunks index elements with uint32: at most this many elements. */
#define GEO_CODEC_TOPK_MAX_COUNT ((size_t)UINT32_MAX)

/* Encoder settings.  Decoding needs none of them: what it needs is in the
 * chunk's header. */
typedef struct {
    uint32_t blockSize; /* int8, int4, sign: elements per scale; multiple of
                           8 in [8, GEO_CODEC_BLOCK_MAX]; default 256 */
    int stochastic;     /* int8, int4: 1 = stochastic rounding, 0 = nearest */
    uint64_t seed;      /* stochastic rounding seed (with the call's counter) */
    double topkFraction; /* topk: fraction of elements kept, in (0, 1];
                            default 0.01 */
    int zstdLevel;      /* lossless: zstd level, default 1 (fast); clamped
                           to the levels the linked libzstd has */
} geoCodecParams;

#define GEO_CODEC_PARAMS_INIT {GEO_CODEC_BLOCK_DEFAULT, 0, 0, 0.01, 1}

/* The fields of a chunk header, after geoCodecReadHeader checked them. */
typedef struct {
    geoCodecId codec;
    ncclDataType_t dtype;
    uint32_t flags;
    uint64_t count;
    uint64_t payloadBytes;
    uint32_t param;
} geoCodecHeader;

/*
 * One codec.  Every member is set for every codec.  All functions are
 * reentrant and thread-safe and do not block.
 *
 * Common result codes: ncclSuccess; ncclInvalidArgument for a bad argument
 * or (decoders) a corrupt or truncated chunk; ncclSystemError when memory
 * for scratch space could not be allocated (lossless, topk); ncclInvalidUsage
 * when a lossless chunk needs zstd and this build has none.
 */
typedef struct geoCodec {
    /* Lower-case name, as in GEOCCL_COMPRESS ("int8"). */
    const char *name;
    geoCodecId id;
    /* 1 when a round trip may change values (needs the user's consent). */
    int lossy;

    /* 1 if the codec can encode elements of dtype: ncclFloat32 for lossy
     * codecs, every valid type for none and lossless; else 0. */
    int (*supports)(ncclDataType_t dtype);

    /* Largest chunk (header included) encode can write for these
     * arguments; exact for every codec but lossless, whose chunk may be
     * smaller.  params NULL means GEO_CODEC_PARAMS_INIT.  Returns 0 when
     * the arguments cannot be encoded (unsupported dtype, invalid params,
     * count too large, size overflow). */
    size_t (*maxEncodedSize)(size_t count, ncclDataType_t dtype,
                             const geoCodecParams *params);

    /*
     * Encodes count elements of dtype at src into one chunk at dst.
     *   [in]     src       count elements (float32 for lossy codecs); may
     *                      be NULL when count is 0
     *   [in]     count     elements
     *   [in]     dtype     their type; must satisfy supports()
     *   [in]     params    encoder settings; NULL = GEO_CODEC_PARAMS_INIT
     *   [in]     counter   stochastic rounding stream: the caller makes
     *                      (seed, counter) unique per chunk and step (e.g.
     *                      step * nchunks + chunk); ignored otherwise
     *   [in,out] residual  NULL, or count float32 values (error feedback;
     *                      dtype must be ncclFloat32): the codec encodes
     *                      v = src + residual and stores v - decode(chunk)
     *                      in residual (0 for an element where that is not
     *                      finite, so one overflowing step does not poison
     *                      later ones).  Lossless codecs leave 0.
     *   [out]    dst       the chunk; must not overlap src or residual (nor
     *                      may src and residual overlap)
     *   [in]     cap       bytes at dst; must be >= maxEncodedSize(count,
     *                      dtype, params)
     *   [out]    written   chunk length (header included), on success only
     * Returns ncclSuccess; ncclInvalidArgument (unsupported dtype, invalid
     * params, cap too small, NULL pointers) before anything is written;
     * ncclSystemError (no memory for scratch) with residual unchanged.
     */
    ncclResult_t (*encode)(const void *src, size_t count, ncclDataType_t dtype,
                           const geoCodecParams *params, uint64_t counter,
                           float *residual, void *dst, size_t cap, size_t *written);

    /*
     * Decodes one chunk of exactly len bytes into count elements at dst.
     *   [in]  src    the chunk
     *   [in]  len    its length: must be exactly header + payload length
     *   [in]  dtype  the element type the caller expects; must equal the
     *                chunk's (ncclFloat32 for lossy codecs)
     *   [out] dst    count elements of dtype
     *   [in]  count  elements the caller expects; must equal the chunk's
     *   [out] why    optional: on error, a static string naming the failed
     *                check (for the caller's log line)
     * Every length, index and header field is checked against len and count
     * before dst is written; on error dst is untouched.  Returns
     * ncclSuccess; ncclInvalidArgument for a corrupt, truncated or
     * mismatched chunk (or another codec's chunk); ncclInvalidUsage for a
     * zstd chunk in a build without zstd; ncclSystemError when scratch
     * memory could not be allocated.
     */
    ncclResult_t (*decode)(const void *src, size_t len, ncclDataType_t dtype,
                           void *dst, size_t count, const char **why);

    /*
     * dst[i] += decoded element i, in float32: as decode, but the chunk's
     * dtype must be ncclFloat32.  The sum is one binary32 addition per
     * element, so decodeAccumulate == decode into t, then dst += t,
     * bit for bit.  Same checks and results as decode; on error dst is
     * untouched.
     */
    ncclResult_t (*decodeAccumulate)(const void *src, size_t len, ncclDataType_t dtype,
                                     float *dst, size_t count, const char **why);
} geoCodec;

/* The codecs, indexed by geoCodecId (geoCodecs[id].id == id). */
extern const geoCodec geoCodecs[GEO_CODEC_COUNT];

/* The codec for an id; NULL for GEO_CODEC_AUTO or an out-of-range id. */
const geoCodec *geoCodecGet(geoCodecId id);

/* The codec whose name is exactly name ("none", "lossless", "fp16", "bf16",
 * "int8", "int4", "sign", "topk"); NULL if none.  "auto" is not a codec. */
const geoCodec *geoCodecByName(const char *name);

/*
 * Parses the GEOCCL_COMPRESS syntax:
 *   none | lossless | fp16 | bf16 | int8 | int4 | sign | topk[:<k>] | auto
 * where k is a decimal fraction in (0, 1] (e.g. "topk:0.01"; plain "topk"
 * keeps params->topkFraction).
 *   [in]     text    the string, without surrounding blanks
 *   [out]    id      the codec, or GEO_CODEC_AUTO
 *   [in,out] params  may be NULL; for topk:<k> its topkFraction is set;
 *                    other fields are left as the caller set them
 * Outputs are set only on success.  Returns ncclSuccess, or
 * ncclInvalidArgument for anything else (unknown name, bad or out-of-range
 * k, trailing characters, NULL text or id).
 */
ncclResult_t geoCodecParse(const char *text, geoCodecId *id, geoCodecParams *params);

/* Fills *params with GEO_CODEC_PARAMS_INIT. */
void geoCodecParamsInit(geoCodecParams *params);

/*
 * Reads and checks a chunk's header: len >= 32, magic, version, checksum,
 * a known codec id and dtype, flags the codec defines, payload length ==
 * len - 32.  Payload consistency is left to the codec's decoder.
 *   [in]  src, len  the chunk
 *   [out] hdr       the fields, on success only
 *   [out] why       optional reason on error
 * Returns ncclSuccess or ncclInvalidArgument.
 */
ncclResult_t geoCodecReadHeader(const void *src, size_t len, geoCodecHeader *hdr,
                                const char **why);

/* Decodes (accumulate = 0) or decodes and adds (accumulate = 1; dst is
 * float32) a chunk with whichever codec its header names.  Arguments and
 * results as geoCodec.decode. */
ncclResult_t geoCodecDecodeChunk(const void *src, size_t len, ncclDataType_t dtype,
                                 void *dst, size_t count, int accumulate,
                                 const char **why);

/* The inline helpers below also compile as CUDA device code. */
#if defined(__CUDACC__)
#define GEO_CODEC_HD __host__ __device__
#else
#define GEO_CODEC_HD
#endif

/* The header checksum: FNV-1a 32 over n bytes. */
static inline GEO_CODEC_HD uint32_t geoCodecChecksum(const unsigned char *p, size_t n)
{
    uint32_t h = 0x811C9DC5u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x01000193u;
    return h;
}

/*
 * Stochastic rounding bits: a counter-based generator, so that any thread
 * (or CUDA thread) can produce element i's number without the others.
 * geoCodecMix64 is the splitmix64 finaliser.  The key is computed once per
 * chunk from (seed, counter); element i's uniform in [0, 1) is the top 24
 * bits of mix64(key + (i + 1) * 0x9E3779B97F4A7C15) times 2^-24 (exact in
 * binary32).
 */
static inline GEO_CODEC_HD uint64_t geoCodecMix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline GEO_CODEC_HD uint64_t geoCodecRandomKey(uint64_t seed, uint64_t counter)
{
    return geoCodecMix64(seed ^ geoCodecMix64(counter ^ 0x9E3779B97F4A7C15ull));
}

static inline GEO_CODEC_HD float geoCodecUniform(uint64_t key, uint64_t i)
{
    uint64_t r = geoCodecMix64(key + (i + 1) * 0x9E3779B97F4A7C15ull);
    return (float)(uint32_t)(r >> 40) * 0x1p-24f;
}

#ifdef __cplusplus
}
#endif

#endif
