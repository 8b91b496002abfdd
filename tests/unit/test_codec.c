/*
 * The codecs (compress/codec.h): each codec's round-trip error against its
 * documented bound on several distributions; fp16/bf16 against independent
 * reference conversions; the format's header bytes; reproducibility of
 * stochastic rounding; decoders rejecting truncated, extended and edited
 * chunks and wrong counts without touching dst; decodeAccumulate ==
 * decode + add; maxEncodedSize; lossless exactness for every dtype and its
 * raw fallback; the error-feedback bookkeeping; GEOCCL_COMPRESS parsing.
 * Last, CPU throughput per codec on 64 MiB of float32 (printed, not
 * asserted; GEOCCL_CODEC_BENCH_MIB changes the size, 0 skips).
 */
#include "config.h"
#include "compress/codec.h"

#include <CUnit/Basic.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------ */
/* Data                                                                     */
/* ------------------------------------------------------------------------ */

static uint64_t rngState = 0x1234567887654321ull;

static uint64_t rnd64(void)
{
    uint64_t z = (rngState += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rndU(void) { return (double)(rnd64() >> 11) * 0x1p-53; }

static float rndGauss(void)
{
    double u = rndU(), v = rndU();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

enum {
    DIST_GAUSS,   /* gradient-like */
    DIST_UNIFORM, /* [-1, 1) */
    DIST_ZEROS,
    DIST_HUGE,    /* 1e30 .. 1e36, both signs (block sums stay finite) */
    DIST_TINY,    /* 1e-45 .. 1e-30 (subnormals too) */
    DIST_WIDE,    /* exponents -125 .. 100 (block sums stay finite) */
    DIST_SPIKES,  /* mostly tiny with rare large values */
    DIST_COUNT
};

static const char *distName[DIST_COUNT] = {"gauss", "uniform", "zeros", "huge",
                                           "tiny",  "wide",    "spikes"};

static float sgn(void) { return (rnd64() & 1) ? -1.0f : 1.0f; }

static void fill(float *x, size_t n, int dist)
{
    for (size_t i = 0; i < n; i++) {
        switch (dist) {
        case DIST_GAUSS: x[i] = rndGauss() * 1e-3f; break;
        case DIST_UNIFORM: x[i] = (float)(2.0 * rndU() - 1.0); break;
        case DIST_ZEROS: x[i] = 0.0f; break;
        case DIST_HUGE: x[i] = sgn() * (float)(1e30 * pow(1e6, rndU())); break;
        case DIST_TINY: x[i] = sgn() * (float)(1e-45 * pow(1e15, rndU())); break;
        case DIST_WIDE: x[i] = sgn() * ldexpf((float)(1.0 + rndU()), (int)(rnd64() % 226) - 125); break;
        case DIST_SPIKES: x[i] = (rnd64() % 97 == 0) ? sgn() * 1e4f : rndGauss() * 1e-6f; break;
        }
    }
}

static const size_t counts[] = {0, 1, 7, 8, 255, 256, 257, 1000, 4099, 65539};
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static int failures; /* counted in loops, asserted once per case */

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            if (failures++ < 10)                                                \
                fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                       \
    } while (0)

/* Encodes into a fresh buffer of maxEncodedSize bytes; checks the size
 * promises.  Returns the chunk (caller frees) and its length in *len. */
static unsigned char *encode(geoCodecId id, const void *x, size_t n, ncclDataType_t dt,
                             const geoCodecParams *p, uint64_t counter, float *residual,
                             size_t *len)
{
    const geoCodec *c = &geoCodecs[id];
    size_t max = c->maxEncodedSize(n, dt, p);
    CHECK(max >= GEO_CODEC_HEADER_BYTES);
    unsigned char *buf = malloc(max ? max : 1);
    size_t written = 0;
    ncclResult_t r = c->encode(x, n, dt, p, counter, residual, buf, max, &written);
    CHECK(r == ncclSuccess);
    CHECK(written <= max);
    if (id != GEO_CODEC_LOSSLESS)
        CHECK(written == max);
    *len = written;
    return buf;
}

static float *decodeNew(geoCodecId id, const unsigned char *chunk, size_t len, size_t n)
{
    float *out = malloc(n * sizeof(float) + 1);
    const char *why = NULL;
    ncclResult_t r = geoCodecs[id].decode(chunk, len, ncclFloat32, out, n, &why);
    if (r != ncclSuccess)
        fprintf(stderr, "decode %s failed: %s\n", geoCodecs[id].name, why ? why : "?");
    CHECK(r == ncclSuccess);
    return out;
}

static int sameBits(float a, float b) { return memcmp(&a, &b, sizeof(float)) == 0; }

/* Independent reference: binary32 -> bfloat16 nearest even, in double. */
static float refBf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
    float a, b;
    memcpy(&a, &lo, 4);
    memcpy(&b, &hi, 4);
    double da = fabs((double)v - a), db = fabs((double)v - (double)b);
    if (isinf(b))
        db = fabs((double)v - ldexp(1.0, 128) * (v < 0 ? -1 : 1));
    if (da < db || (da == db && ((lo >> 16) & 1) == 0))
        return a;
    return b;
}

/* ------------------------------------------------------------------------ */
/* Table and parsing                                                        */
/* ------------------------------------------------------------------------ */

static void test_table_and_names(void)
{
    static const char *names[GEO_CODEC_COUNT] = {"none", "lossless", "fp16", "bf16",
                                                 "int8", "int4",     "sign", "topk"};
    for (int i = 0; i < GEO_CODEC_COUNT; i++) {
        const geoCodec *c = &geoCodecs[i];
        CU_ASSERT_EQUAL((int)c->id, i);
        CU_ASSERT_STRING_EQUAL(c->name, names[i]);
        CU_ASSERT_PTR_EQUAL(geoCodecByName(names[i]), c);
        CU_ASSERT_PTR_EQUAL(geoCodecGet((geoCodecId)i), c);
        CU_ASSERT_EQUAL(c->lossy, i >= GEO_CODEC_FP16);
        CU_ASSERT_PTR_NOT_NULL(c->supports);
        CU_ASSERT_PTR_NOT_NULL(c->maxEncodedSize);
        CU_ASSERT_PTR_NOT_NULL(c->encode);
        CU_ASSERT_PTR_NOT_NULL(c->decode);
        CU_ASSERT_PTR_NOT_NULL(c->decodeAccumulate);
        for (int t = 0; t < ncclNumTypes; t++)
            CU_ASSERT_EQUAL(c->supports((ncclDataType_t)t), c->lossy ? t == ncclFloat32 : 1);
        CU_ASSERT_FALSE(c->supports(ncclNumTypes));
    }
    CU_ASSERT_PTR_NULL(geoCodecByName("auto"));
    CU_ASSERT_PTR_NULL(geoCodecByName("INT8"));
    CU_ASSERT_PTR_NULL(geoCodecByName(NULL));
    CU_ASSERT_PTR_NULL(geoCodecGet(GEO_CODEC_AUTO));
    CU_ASSERT_PTR_NULL(geoCodecGet(GEO_CODEC_COUNT));
}

static void test_parse(void)
{
    geoCodecParams p;
    geoCodecParamsInit(&p);
    geoCodecId id = GEO_CODEC_NONE;
    static const struct {
        const char *text;
        geoCodecId id;
    } ok[] = {{"none", GEO_CODEC_NONE}, {"lossless", GEO_CODEC_LOSSLESS},
              {"fp16", GEO_CODEC_FP16}, {"bf16", GEO_CODEC_BF16},
              {"int8", GEO_CODEC_INT8}, {"int4", GEO_CODEC_INT4},
              {"sign", GEO_CODEC_SIGN}, {"topk", GEO_CODEC_TOPK},
              {"auto", GEO_CODEC_AUTO}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        CU_ASSERT_EQUAL(geoCodecParse(ok[i].text, &id, &p), ncclSuccess);
        CU_ASSERT_EQUAL(id, ok[i].id);
    }
    CU_ASSERT_EQUAL(p.topkFraction, 0.01); /* plain "topk" kept the default */
    CU_ASSERT_EQUAL(geoCodecParse("topk:0.05", &id, &p), ncclSuccess);
    CU_ASSERT_EQUAL(id, GEO_CODEC_TOPK);
    CU_ASSERT_EQUAL(p.topkFraction, 0.05);
    CU_ASSERT_EQUAL(geoCodecParse("topk:1", &id, &p), ncclSuccess);
    CU_ASSERT_EQUAL(p.topkFraction, 1.0);
    CU_ASSERT_EQUAL(geoCodecParse("topk:1e-3", &id, &p), ncclSuccess);
    CU_ASSERT_EQUAL(p.topkFraction, 1e-3);
    CU_ASSERT_EQUAL(geoCodecParse("topk:.5", &id, NULL), ncclSuccess);

    static const char *bad[] = {"",           "INT8",     " int8",     "int8 ",
                                "int8:1",     "topk:",    "topk:0",    "topk:1.5",
                                "topk:-0.1",  "topk:abc", "topk:nan",  "topk:inf",
                                "topk:0.1x",  "topk: 0.1", "topk:0x0.1", "int16",
                                "topk:1e-400", "auto:1",  "topk::0.1"};
    p.topkFraction = 0.25;
    id = GEO_CODEC_INT8;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (geoCodecParse(bad[i], &id, &p) != ncclInvalidArgument)
            fprintf(stderr, "accepted \"%s\"\n", bad[i]);
        CU_ASSERT_EQUAL(geoCodecParse(bad[i], &id, &p), ncclInvalidArgument);
    }
    CU_ASSERT_EQUAL(id, GEO_CODEC_INT8); /* outputs untouched on error */
    CU_ASSERT_EQUAL(p.topkFraction, 0.25);
    CU_ASSERT_EQUAL(geoCodecParse(NULL, &id, &p), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geoCodecParse("int8", NULL, &p), ncclInvalidArgument);
}

/* ------------------------------------------------------------------------ */
/* Format                                                                   */
/* ------------------------------------------------------------------------ */

static uint32_t fnv1a(const unsigned char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 16777619u;
    }
    return h;
}

/* A small int8 chunk byte for byte, from the format description. */
static void test_golden_int8(void)
{
    const float x[8] = {1.0f, -0.5f, 0.25f, 0.0f, 2.0f, -2.0f, 0.05f, -1.0f};
    geoCodecParams p = GEO_CODEC_PARAMS_INIT;
    p.blockSize = 8;
    size_t len;
    failures = 0;
    unsigned char *c = encode(GEO_CODEC_INT8, x, 8, ncclFloat32, &p, 0, NULL, &len);
    unsigned char want[32 + 4 + 8] = {
        'G', 'E', 'O', 'C', 1, GEO_CODEC_INT8, ncclFloat32, 0, /* magic .. flags */
        8, 0, 0, 0, 0, 0, 0, 0,                                /* count */
        12, 0, 0, 0, 0, 0, 0, 0,                               /* payload bytes */
        8, 0, 0, 0,                                            /* block size */
    };
    uint32_t sum = fnv1a(want, 28);
    memcpy(want + 28, &sum, 4);
    float scale = 2.0f / 127.0f;
    memcpy(want + 32, &scale, 4);
    /* t = x * 63.5: 63.5 -> 64 and -63.5 -> -64 (ties to even), -31.75 ->
     * -32, 15.875 -> 16, 3.175 -> 3. */
    const int8_t q[8] = {64, -32, 16, 0, 127, -127, 3, -64};
    memcpy(want + 36, q, 8);
    CU_ASSERT_EQUAL(len, sizeof(want));
    CU_ASSERT_EQUAL(memcmp(c, want, sizeof(want)), 0);
    CU_ASSERT_EQUAL(failures, 0);
    free(c);
}

/* Sign and topk chunks: scales, bit order, index/value layout. */
static void test_golden_sign_topk(void)
{
    const float x[10] = {1.0f, -1.0f, 3.0f, -3.0f, 0.0f, -0.0f, 5.0f, -5.0f, 2.0f, -6.0f};
    geoCodecParams p = GEO_CODEC_PARAMS_INIT;
    p.blockSize = 8;
    size_t len;
    failures = 0;
    unsigned char *c = encode(GEO_CODEC_SIGN, x, 10, ncclFloat32, &p, 0, NULL, &len);
    CU_ASSERT_EQUAL(len, 32 + 2 * 4 + 2);
    float s0, s1;
    memcpy(&s0, c + 32, 4);
    memcpy(&s1, c + 36, 4);
    CU_ASSERT_EQUAL(s0, 18.0f / 8.0f);
    CU_ASSERT_EQUAL(s1, 4.0f);
    CU_ASSERT_EQUAL(c[40], 0x8A); /* elements 1, 3, 7 negative; -0 is not */
    CU_ASSERT_EQUAL(c[41], 0x02); /* element 9 */
    free(c);

    p.topkFraction = 0.25; /* k = 3: |-6|, then 5 and -5 tie: lower index first */
    c = encode(GEO_CODEC_TOPK, x, 10, ncclFloat32, &p, 0, NULL, &len);
    CU_ASSERT_EQUAL(len, 32 + 3 * 8);
    uint32_t param;
    memcpy(&param, c + 24, 4);
    CU_ASSERT_EQUAL(param, 3);
    uint32_t idx[3];
    float val[3];
    memcpy(idx, c + 32, 12);
    memcpy(val, c + 44, 12);
    CU_ASSERT(idx[0] == 6 && idx[1] == 7 && idx[2] == 9);
    CU_ASSERT(val[0] == 5.0f && val[1] == -5.0f && val[2] == -6.0f);
    CU_ASSERT_EQUAL(failures, 0);
    free(c);
}

/* ------------------------------------------------------------------------ */
/* Round trips                                                              */
/* ------------------------------------------------------------------------ */

/* Checks the documented bound of codec id between v (what was encoded) and
 * d (decoded), n elements; params p; chunk c. */
static void checkBound(geoCodecId id, const float *v, const float *d, size_t n,
                       const geoCodecParams *p, const unsigned char *c)
{
    switch (id) {
    case GEO_CODEC_NONE:
    case GEO_CODEC_LOSSLESS:
        for (size_t i = 0; i < n; i++)
            CHECK(sameBits(v[i], d[i]));
        break;
    case GEO_CODEC_FP16:
        for (size_t i = 0; i < n; i++) {
            float a = fabsf(v[i]);
            if (a <= 65504.0f)
                CHECK(fabsf(v[i] - d[i]) <= fmaxf(ldexpf(a, -11), 0x1p-25f));
            else
                CHECK(d[i] == copysignf(65504.0f, v[i]));
#ifdef __FLT16_MAX__
            if (a <= 65504.0f)
                CHECK(sameBits(d[i], (float)(_Float16)v[i]));
#endif
        }
        break;
    case GEO_CODEC_BF16:
        for (size_t i = 0; i < n; i++) {
            CHECK(fabsf(v[i] - d[i]) <= fmaxf(ldexpf(fabsf(v[i]), -8), 0x1p-134f));
            CHECK(sameBits(d[i], refBf16(v[i])));
        }
        break;
    case GEO_CODEC_INT8:
    case GEO_CODEC_INT4: {
        float lim = id == GEO_CODEC_INT8 ? 127.0f : 7.0f;
        for (size_t s = 0; s < n; s += p->blockSize) {
            size_t e = s + p->blockSize < n ? s + p->blockSize : n;
            float absmax = 0;
            for (size_t i = s; i < e; i++)
                absmax = fmaxf(absmax, fabsf(v[i]));
            double scale = (double)absmax / lim;
            double bound = p->stochastic ? scale * (1 + 1e-4) : scale * (0.5 + 1e-4);
            for (size_t i = s; i < e; i++) {
                if (absmax < 0x1p-100f)
                    CHECK(d[i] == 0.0f);
                else
                    CHECK(fabs((double)v[i] - d[i]) <= bound);
            }
        }
        break;
    }
    case GEO_CODEC_SIGN:
        for (size_t s = 0; s < n; s += p->blockSize) {
            size_t e = s + p->blockSize < n ? s + p->blockSize : n;
            double sum = 0;
            for (size_t i = s; i < e; i++)
                sum += fabs((double)v[i]);
            double mean = sum / (double)(e - s);
            /* binary32 sums: at most ceil(n/32) + 5 roundings, then one
             * division (which may round to a subnormal). */
            double tol = (double)((e - s + 31) / 32 + 6) * 0x1p-24 * mean + 0x1p-149;
            for (size_t i = s; i < e; i++) {
                CHECK(fabs(fabs((double)d[i]) - mean) <= tol);
                CHECK((v[i] < 0) == (d[i] < 0) || d[i] == 0.0f);
                CHECK(fabs((double)v[i] - d[i]) <= fabs((double)v[i]) + fabs((double)d[i]));
            }
        }
        break;
    case GEO_CODEC_TOPK: {
        uint32_t k;
        memcpy(&k, c + 24, 4);
        size_t want = n == 0 ? 0 : (size_t)ceil(p->topkFraction * (double)n);
        if (n > 0 && want < 1)
            want = 1;
        if (want > n)
            want = n;
        CHECK(k == want);
        float minKept = INFINITY, maxDropped = 0;
        char *kept = calloc(n + 1, 1);
        for (uint32_t j = 0; j < k; j++) {
            uint32_t i;
            memcpy(&i, c + 32 + 4 * (size_t)j, 4);
            kept[i] = 1;
            minKept = fminf(minKept, fabsf(v[i]));
        }
        for (size_t i = 0; i < n; i++) {
            if (kept[i])
                CHECK(sameBits(d[i], v[i]));
            else {
                CHECK(d[i] == 0.0f);
                maxDropped = fmaxf(maxDropped, fabsf(v[i]));
            }
        }
        CHECK(k == 0 || maxDropped <= minKept);
        free(kept);
        break;
    }
    default:
        CHECK(0);
    }
}

static void roundTrips(geoCodecId id, int stochastic)
{
    geoCodecParams p = GEO_CODEC_PARAMS_INIT;
    p.stochastic = stochastic;
    p.seed = 42;
    static const uint32_t blocks[] = {256, 8, 1000, 4096};
    static const double fracs[] = {0.01, 0.1, 0.5, 1.0};
    failures = 0;
    for (int dist = 0; dist < DIST_COUNT; dist++) {
        for (size_t ci = 0; ci < NCOUNTS; ci++) {
            size_t n = counts[ci];
            p.blockSize = blocks[(dist + ci) % 4];
            p.topkFraction = fracs[(dist + ci) % 4];
            float *x = malloc(n * sizeof(float) + 1);
            fill(x, n, dist);
            size_t len;
            unsigned char *c = encode(id, x, n, ncclFloat32, &p, ci, NULL, &len);
            float *d = decodeNew(id, c, len, n);
            int before = failures;
            checkBound(id, x, d, n, &p, c);
            if (failures != before)
                fprintf(stderr, "  %s%s: distribution %s, count %zu, block %u\n",
                        geoCodecs[id].name, stochastic ? " stochastic" : "", distName[dist], n,
                        p.blockSize);
            free(c);
            free(d);
            free(x);
        }
    }
    CU_ASSERT_EQUAL(failures, 0);
}

static void test_roundtrip_none(void) { roundTrips(GEO_CODEC_NONE, 0); }
static void test_roundtrip_lossless(void) { roundTrips(GEO_CODEC_LOSSLESS, 0); }
static void test_roundtrip_fp16(void) { roundTrips(GEO_CODEC_FP16, 0); }
static void test_roundtrip_bf16(void) { roundTrips(GEO_CODEC_BF16, 0); }
static void test_roundtrip_int8(void) { roundTrips(GEO_CODEC_INT8, 0); }
static void test_roundtrip_int8_stochastic(void) { roundTrips(GEO_CODEC_INT8, 1); }
static void test_roundtrip_int4(void) { roundTrips(GEO_CODEC_INT4, 0); }
static void test_roundtrip_int4_stochastic(void) { roundTrips(GEO_CODEC_INT4, 1); }
static void test_roundtrip_sign(void) { roundTrips(GEO_CODEC_SIGN, 0); }
static void test_roundtrip_topk(void) { roundTrips(GEO_CODEC_TOPK, 0); }

/* fp16: every finite half value survives; ties go to even; saturation. */
static void test_fp16_exhaustive(void)
{
    float *x = malloc(65536 * sizeof(float));
    size_t n = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t e = (h >> 10) & 31, m = h & 1023;
        if (e == 31)
            continue;
        float f = (e == 0) ? ldexpf((float)m, -24) : ldexpf(1.0f + (float)m / 1024, (int)e - 15);
        x[n++] = (h & 0x8000) ? -f : f;
    }
    size_t len;
    failures = 0;
    unsigned char *c = encode(GEO_CODEC_FP16, x, n, ncclFloat32, NULL, 0, NULL, &len);
    float *d = decodeNew(GEO_CODEC_FP16, c, len, n);
    for (size_t i = 0; i < n; i++)
        CHECK(sameBits(x[i], d[i]));
    free(c);
    free(d);
    const float special[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65519.0f, 65520.0f, 1e6f,
                             -1e6f, INFINITY, -INFINITY, 0x1p-25f, 0x1.8p-25f, -0.0f};
    const float want[] = {1.0f, 1.0f + 2 * 0x1p-10f, 65504.0f, 65504.0f, 65504.0f,
                          -65504.0f, INFINITY, -INFINITY, 0.0f, 0x1p-24f, -0.0f};
    c = encode(GEO_CODEC_FP16, special, 11, ncclFloat32, NULL, 0, NULL, &len);
    d = decodeNew(GEO_CODEC_FP16, c, len, 11);
    for (int i = 0; i < 11; i++)
        CHECK(sameBits(d[i], want[i]));
    free(c);
    free(d);
    const float nan[2] = {NAN, -NAN};
    c = encode(GEO_CODEC_FP16, nan, 2, ncclFloat32, NULL, 0, NULL, &len);
    d = decodeNew(GEO_CODEC_FP16, c, len, 2);
    CHECK(isnan(d[0]) && isnan(d[1]));
    free(c);
    free(d);
    c = encode(GEO_CODEC_BF16, nan, 2, ncclFloat32, NULL, 0, NULL, &len);
    d = decodeNew(GEO_CODEC_BF16, c, len, 2);
    CHECK(isnan(d[0]) && isnan(d[1]));
    free(c);
    free(d);
    const float big[3] = {FLT_MAX, -FLT_MAX, 0x1.FFp127f};
    c = encode(GEO_CODEC_BF16, big, 3, ncclFloat32, NULL, 0, NULL, &len);
    d = decodeNew(GEO_CODEC_BF16, c, len, 3);
    CHECK(d[0] == 0x1.FEp127f && d[1] == -0x1.FEp127f && d[2] == 0x1.FEp127f);
    free(c);
    free(d);
    free(x);
    CU_ASSERT_EQUAL(failures, 0);
}

/* ------------------------------------------------------------------------ */
/* Reproducibility                                                          */
/* ------------------------------------------------------------------------ */

static void test_reproducible(void)
{
    size_t n = 5000;
    float *x = malloc(n * sizeof(float));
    fill(x, n, DIST_GAUSS);
    failures = 0;
    for (int id = 0; id < GEO_CODEC_COUNT; id++) {
        for (int st = 0; st <= 1; st++) {
            geoCodecParams p = GEO_CODEC_PARAMS_INIT;
            p.stochastic = st;
            p.seed = 7;
            size_t l1, l2, l3, l4;
            unsigned char *a = encode((geoCodecId)id, x, n, ncclFloat32, &p, 3, NULL, &l1);
            unsigned char *b = encode((geoCodecId)id, x, n, ncclFloat32, &p, 3, NULL, &l2);
            CHECK(l1 == l2 && memcmp(a, b, l1) == 0);
            p.seed = 8;
            unsigned char *c = encode((geoCodecId)id, x, n, ncclFloat32, &p, 3, NULL, &l3);
            p.seed = 7;
            unsigned char *d = encode((geoCodecId)id, x, n, ncclFloat32, &p, 4, NULL, &l4);
            int rounding = st && (id == GEO_CODEC_INT8 || id == GEO_CODEC_INT4);
            /* Only stochastic rounding depends on the seed and counter. */
            CHECK((l1 == l3 && memcmp(a, c, l1) == 0) == !rounding);
            CHECK((l1 == l4 && memcmp(a, d, l1) == 0) == !rounding);
            if (rounding)
                CHECK(a[7] == GEO_CODEC_FLAG_STOCHASTIC);
            free(a);
            free(b);
            free(c);
            free(d);
        }
    }
    free(x);
    CU_ASSERT_EQUAL(failures, 0);
}

/* Stochastic rounding is unbiased: the mean of many encodings approaches
 * the value, where nearest rounding keeps a fixed error. */
static void test_stochastic_unbiased(void)
{
    size_t n = 256;
    float x[256];
    x[0] = 1.0f;
    for (size_t i = 1; i < n; i++)
        x[i] = 0.123f; /* 15.621 steps of 1/127: nearest is off by 0.379 steps */
    geoCodecParams p = GEO_CODEC_PARAMS_INIT;
    p.stochastic = 1;
    p.seed = 99;
    double sum = 0;
    size_t samples = 0;
    failures = 0;
    for (uint64_t ctr = 0; ctr < 400; ctr++) {
        size_t len;
        unsigned char *c = encode(GEO_CODEC_INT8, x, n, ncclFloat32, &p, ctr, NULL, &len);
        float *d = decodeNew(GEO_CODEC_INT8, c, len, n);
        for (size_t i = 1; i < n; i++) {
            CHECK(d[i] == 15.0f * (1.0f / 127.0f) || d[i] == 16.0f * (1.0f / 127.0f));
            sum += d[i];
            samples++;
        }
        free(c);
        free(d);
    }
    double mean = sum / (double)samples;
    CU_ASSERT(fabs(mean - 0.123) < 1e-4);
    CU_ASSERT_EQUAL(failures, 0);
    /* The generator itself: the same bits for the same inputs, in [0, 1). */
    uint64_t key = geoCodecRandomKey(1, 2);
    CU_ASSERT_EQUAL(key, geoCodecRandomKey(1, 2));
    CU_ASSERT_NOT_EQUAL(key, geoCodecRandomKey(2, 1));
    for (uint64_t i = 0; i < 1000; i++) {
        float u = geoCodecUniform(key, i);
        CU_ASSERT(u >= 0.0f && u < 1.0f);
    }
}

/* ------------------------------------------------------------------------ */
/* Corrupt input                                                            */
/* ------------------------------------------------------------------------ */

/* Decodes (plain and accumulating) into a guarded buffer; checks that a
 * failure leaves dst untouched.  Returns the decode result. */
static ncclResult_t tryDecode(geoCodecId id, const unsigned char *c, size_t len, size_t n)
{
    size_t bytes = n * sizeof(float);
    unsigned char *dst = malloc(bytes + 64);
    unsigned char *ref = malloc(bytes + 64);
    for (size_t i = 0; i < bytes + 64; i++)
        ref[i] = (unsigned char)(i * 7 + 3);
    memcpy(dst, ref, bytes + 64);
    const char *why = NULL;
    ncclResult_t r = geoCodecs[id].decode(c, len, ncclFloat32, dst, n, &why);
    if (r != ncclSuccess) {
        CHECK(memcmp(dst, ref, bytes + 64) == 0);
        CHECK(why != NULL);
    }
    CHECK(memcmp(dst + bytes, ref + bytes, 64) == 0);
    memcpy(dst, ref, bytes + 64);
    ncclResult_t r2 = geoCodecs[id].decodeAccumulate(c, len, ncclFloat32, (float *)dst, n, NULL);
    CHECK(r2 == r);
    if (r2 != ncclSuccess)
        CHECK(memcmp(dst, ref, bytes + 64) == 0);
    CHECK(memcmp(dst + bytes, ref + bytes, 64) == 0);
    free(dst);
    free(ref);
    return r;
}

static void setHeader(unsigned char *c, size_t off, const void *v, size_t n)
{
    memcpy(c + off, v, n);
    uint32_t sum = fnv1a(c, 28);
    memcpy(c + 28, &sum, 4);
}

static void corruptChunks(geoCodecId id, const float *x, size_t n, const geoCodecParams *p)
{
    size_t len;
    unsigned char *c = encode(id, x, n, ncclFloat32, p, 1, NULL, &len);
    unsigned char *m = malloc(len + 16);
    CHECK(tryDecode(id, c, len, n) == ncclSuccess);

    /* Every truncation, and extensions. */
    for (size_t l = 0; l < len; l++) {
        memcpy(m, c, l);
        CHECK(tryDecode(id, m, l, n) == ncclInvalidArgument);
    }
    memcpy(m, c, len);
    memset(m + len, 0, 16);
    CHECK(tryDecode(id, m, len + 1, n) == ncclInvalidArgument);
    CHECK(tryDecode(id, m, len + 16, n) == ncclInvalidArgument);

    /* Every single-bit flip in the header (the checksum catches them). */
    for (size_t bit = 0; bit < 32 * 8; bit++) {
        memcpy(m, c, len);
        m[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        CHECK(tryDecode(id, m, len, n) == ncclInvalidArgument);
    }

    /* Field edits with a valid checksum. */
    const uint64_t counts64[] = {n + 1, n - 1, 0, (uint64_t)n << 32, UINT64_MAX};
    for (size_t i = 0; i < 5; i++) {
        if (counts64[i] == n)
            continue;
        memcpy(m, c, len);
        setHeader(m, 8, &counts64[i], 8);
        CHECK(tryDecode(id, m, len, n) == ncclInvalidArgument);
        /* When the caller's count follows the header's, the chunk may
         * still be consistent (topk indices all below it; int4 and sign
         * must then have clear padding): no result is required, only the
         * checks tryDecode makes. */
        if (counts64[i] < n)
            tryDecode(id, m, len, (size_t)counts64[i]);
    }
    const uint64_t plens[] = {len - 32 + 1, len - 32 - 1, 0, UINT64_MAX, 1ull << 40};
    for (size_t i = 0; i < 5; i++) {
        if (plens[i] == len - 32)
            continue;
        memcpy(m, c, len);
        setHeader(m, 16, &plens[i], 8);
        CHECK(tryDecode(id, m, len, n) == ncclInvalidArgument);
    }
    uint32_t param;
    memcpy(&param, c + 24, 4);
    const uint32_t params[] = {0, 1, 7, 9, param + 1, param - 1, param * 2 + 8, GEO_CODEC_BLOCK_MAX + 8,
                               UINT32_MAX};
    for (size_t i = 0; i < sizeof(params) / sizeof(params[0]); i++) {
        if (params[i] == param)
            continue;
        memcpy(m, c, len);
        setHeader(m, 24, &params[i], 4);
        ncclResult_t r = tryDecode(id, m, len, n);
        /* A block size that gives the same number of blocks is a valid
         * chunk (it decodes the same); anything else must be refused. */
        int sameBlocks = (id == GEO_CODEC_INT8 || id == GEO_CODEC_INT4 || id == GEO_CODEC_SIGN) &&
                         params[i] >= 8 && params[i] % 8 == 0 && params[i] <= GEO_CODEC_BLOCK_MAX &&
                         (n + params[i] - 1) / params[i] == (n + param - 1) / param;
        CHECK(sameBlocks ? r == ncclSuccess : r == ncclInvalidArgument);
    }
    for (unsigned v = 0; v < 256; v++) {
        memcpy(m, c, len);
        unsigned char b = (unsigned char)v;
        if (b != c[5]) { /* another codec id */
            setHeader(m, 5, &b, 1);
            CHECK(tryDecode(id, m, len, n) == ncclInvalidArgument);
        }
        memcpy(m, c, len);
        if (b != c[6]) { /* another dtype */
            setHeader(m, 6, &b, 1);
            CHECK(tryDecode(id, m, len, n) == ncclInvalidArgument);
        }
        memcpy(m, c, len);
        if (b != c[7]) { /* other flags */
            setHeader(m, 7, &b, 1);
            ncclResult_t r = tryDecode(id, m, len, n);
            int onlyStochastic = (id == GEO_CODEC_INT8 || id == GEO_CODEC_INT4) &&
                                 (b & ~GEO_CODEC_FLAG_STOCHASTIC) == 0;
            CHECK(onlyStochastic ? r == ncclSuccess : r != ncclSuccess);
        }
        memcpy(m, c, len);
        if (b != c[4]) { /* another version */
            setHeader(m, 4, &b, 1);
            CHECK(tryDecode(id, m, len, n) == ncclInvalidArgument);
        }
    }
    /* Wrong counts from the caller. */
    CHECK(tryDecode(id, c, len, n + 1) == ncclInvalidArgument);
    if (n > 0)
        CHECK(tryDecode(id, c, len, n - 1) == ncclInvalidArgument);
    /* Wrong dtype from the caller. */
    float *d = malloc(n * sizeof(double) + 8);
    CHECK(geoCodecs[id].decode(c, len, ncclFloat64, d, n, NULL) == ncclInvalidArgument);
    CHECK(geoCodecs[id].decode(c, len, ncclFloat16, d, n, NULL) == ncclInvalidArgument);
    free(d);
    /* Another codec's decoder. */
    for (int o = 0; o < GEO_CODEC_COUNT; o++)
        if (o != (int)id)
            CHECK(tryDecode((geoCodecId)o, c, len, n) == ncclInvalidArgument);

    /* topk: indices out of range, repeated, decreasing. */
    if (id == GEO_CODEC_TOPK && param >= 2) {
        uint32_t bad[] = {(uint32_t)n, UINT32_MAX};
        for (int i = 0; i < 2; i++) {
            memcpy(m, c, len);
            memcpy(m + 32 + 4 * (size_t)(param - 1), &bad[i], 4);
            CHECK(tryDecode(id, m, len, n) == ncclInvalidArgument);
        }
        memcpy(m, c, len);
        memcpy(m + 36, m + 32, 4); /* duplicate */
        CHECK(tryDecode(id, m, len, n) == ncclInvalidArgument);
        memcpy(m, c, len);
        uint32_t i0, i1;
        memcpy(&i0, c + 32, 4);
        memcpy(&i1, c + 36, 4);
        memcpy(m + 32, &i1, 4);
        memcpy(m + 36, &i0, 4);
        CHECK(tryDecode(id, m, len, n) == ncclInvalidArgument);
    }
    free(m);
    free(c);
}

static void test_corrupt_chunks(void)
{
    failures = 0;
    size_t n = 1000;
    float *x = malloc(n * sizeof(float));
    fill(x, n, DIST_GAUSS);
    for (int id = 0; id < GEO_CODEC_COUNT; id++) {
        geoCodecParams p = GEO_CODEC_PARAMS_INIT;
        corruptChunks((geoCodecId)id, x, n, &p);
        p.stochastic = 1;
        p.blockSize = 64;
        p.topkFraction = 0.3;
        corruptChunks((geoCodecId)id, x, 77, &p);
        corruptChunks((geoCodecId)id, x, 1, &p);
    }
    /* lossless with a zstd frame inside: compressible input. */
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i % 16);
    size_t len;
    unsigned char *c = encode(GEO_CODEC_LOSSLESS, x, n, ncclFloat32, NULL, 0, NULL, &len);
#ifdef HAVE_ZSTD
    CHECK(c[7] == GEO_CODEC_FLAG_ZSTD);
#endif
    free(c);
    corruptChunks(GEO_CODEC_LOSSLESS, x, n, NULL);
    /* Payload bytes of a zstd chunk: flips and random bytes, never a crash
     * and never an error that wrote dst (tryDecode checks). */
    c = encode(GEO_CODEC_LOSSLESS, x, n, ncclFloat32, NULL, 0, NULL, &len);
    for (size_t i = 32; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            c[i] ^= (unsigned char)(1u << bit);
            tryDecode(GEO_CODEC_LOSSLESS, c, len, n);
            c[i] ^= (unsigned char)(1u << bit);
        }
    }
    free(c);
    free(x);
    /* Garbage and NULL. */
    unsigned char junk[256];
    for (int t = 0; t < 200; t++) {
        for (size_t i = 0; i < sizeof(junk); i++)
            junk[i] = (unsigned char)rnd64();
        for (int id = 0; id < GEO_CODEC_COUNT; id++)
            CHECK(tryDecode((geoCodecId)id, junk, (size_t)(rnd64() % sizeof(junk)), 16) ==
                  ncclInvalidArgument);
    }
    float d[4];
    for (int id = 0; id < GEO_CODEC_COUNT; id++)
        CHECK(geoCodecs[id].decode(NULL, 64, ncclFloat32, d, 4, NULL) == ncclInvalidArgument);
    CU_ASSERT_EQUAL(failures, 0);
}

/* ------------------------------------------------------------------------ */
/* Accumulate, sizes, lossless, encoder arguments                           */
/* ------------------------------------------------------------------------ */

static void test_decode_accumulate(void)
{
    failures = 0;
    for (int id = 0; id < GEO_CODEC_COUNT; id++) {
        for (size_t ci = 0; ci < NCOUNTS; ci++) {
            size_t n = counts[ci];
            float *x = malloc(n * sizeof(float) + 4), *a = malloc(n * sizeof(float) + 4),
                  *a0 = malloc(n * sizeof(float) + 4);
            fill(x, n, ci % 2 ? DIST_WIDE : DIST_UNIFORM);
            fill(a0, n, DIST_GAUSS);
            memcpy(a, a0, n * sizeof(float));
            geoCodecParams p = GEO_CODEC_PARAMS_INIT;
            p.topkFraction = 0.2;
            p.blockSize = ci % 2 ? 64 : 256;
            size_t len;
            unsigned char *c = encode((geoCodecId)id, x, n, ncclFloat32, &p, 0, NULL, &len);
            float *t = decodeNew((geoCodecId)id, c, len, n);
            CHECK(geoCodecs[id].decodeAccumulate(c, len, ncclFloat32, a, n, NULL) == ncclSuccess);
            for (size_t i = 0; i < n; i++)
                CHECK(sameBits(a[i], a0[i] + t[i]));
            free(c);
            free(t);
            free(x);
            free(a);
            free(a0);
        }
        /* A non-float32 chunk cannot be accumulated. */
        if (!geoCodecs[id].lossy) {
            int32_t ix[16] = {0};
            float a[16] = {0};
            size_t len;
            unsigned char *ci = encode((geoCodecId)id, ix, 16, ncclInt32, NULL, 0, NULL, &len);
            CHECK(geoCodecs[id].decodeAccumulate(ci, len, ncclInt32, a, 16, NULL) ==
                  ncclInvalidArgument);
            free(ci);
        }
    }
    CU_ASSERT_EQUAL(failures, 0);
}

static void test_sizes_and_encoder_args(void)
{
    failures = 0;
    float x[300];
    fill(x, 300, DIST_GAUSS);
    for (int id = 0; id < GEO_CODEC_COUNT; id++) {
        const geoCodec *c = &geoCodecs[id];
        size_t max = c->maxEncodedSize(300, ncclFloat32, NULL);
        unsigned char *buf = malloc(max + 8);
        size_t w = 12345;
        memset(buf, 0xA5, max + 8);
        /* cap one byte short: refused before anything is written. */
        CHECK(c->encode(x, 300, ncclFloat32, NULL, 0, NULL, buf, max - 1, &w) ==
              ncclInvalidArgument);
        CHECK(w == 12345);
        for (size_t i = 0; i < max + 8; i++)
            CHECK(buf[i] == 0xA5);
        CHECK(c->encode(NULL, 300, ncclFloat32, NULL, 0, NULL, buf, max, &w) == ncclInvalidArgument);
        CHECK(c->encode(x, 300, ncclFloat32, NULL, 0, NULL, NULL, max, &w) == ncclInvalidArgument);
        CHECK(c->encode(x, 300, ncclFloat32, NULL, 0, NULL, buf, max, NULL) == ncclInvalidArgument);
        CHECK(c->encode(x, 300, ncclNumTypes, NULL, 0, NULL, buf, max, &w) == ncclInvalidArgument);
        CHECK(c->maxEncodedSize(300, ncclNumTypes, NULL) == 0);
        if (c->lossy) {
            CHECK(c->maxEncodedSize(300, ncclFloat64, NULL) == 0);
            CHECK(c->encode(x, 75, ncclFloat64, NULL, 0, NULL, buf, max, &w) == ncclInvalidArgument);
        }
        /* A residual needs float32 elements. */
        if (!c->lossy) {
            float r[300] = {0};
            CHECK(c->encode(x, 150, ncclFloat16, NULL, 0, r, buf, max, &w) == ncclInvalidArgument);
        }
        /* Invalid parameters. */
        geoCodecParams p = GEO_CODEC_PARAMS_INIT;
        if (id == GEO_CODEC_INT8 || id == GEO_CODEC_INT4 || id == GEO_CODEC_SIGN) {
            const uint32_t badBlocks[] = {0, 1, 4, 12, GEO_CODEC_BLOCK_MAX + 8};
            for (int i = 0; i < 5; i++) {
                p.blockSize = badBlocks[i];
                CHECK(c->maxEncodedSize(300, ncclFloat32, &p) == 0);
                CHECK(c->encode(x, 300, ncclFloat32, &p, 0, NULL, buf, max, &w) ==
                      ncclInvalidArgument);
            }
        }
        if (id == GEO_CODEC_TOPK) {
            const double badK[] = {0.0, -0.5, 1.5, NAN};
            for (int i = 0; i < 4; i++) {
                p.topkFraction = badK[i];
                CHECK(c->maxEncodedSize(300, ncclFloat32, &p) == 0);
            }
            p.topkFraction = 0.01;
            CHECK(c->maxEncodedSize((size_t)UINT32_MAX + 1, ncclFloat32, &p) == 0);
        }
        /* Overflowing sizes. */
        size_t big = c->maxEncodedSize(SIZE_MAX, ncclFloat32, NULL);
        CHECK(big == 0 || big >= GEO_CODEC_HEADER_BYTES);
        if (!c->lossy)
            CHECK(c->maxEncodedSize(SIZE_MAX / 2, ncclFloat32, NULL) == 0);
        free(buf);
    }
    /* The exact sizes (block 256). */
    CHECK(geoCodecs[GEO_CODEC_FP16].maxEncodedSize(1000, ncclFloat32, NULL) == 32 + 2000);
    CHECK(geoCodecs[GEO_CODEC_INT8].maxEncodedSize(1000, ncclFloat32, NULL) == 32 + 16 + 1000);
    CHECK(geoCodecs[GEO_CODEC_INT4].maxEncodedSize(1001, ncclFloat32, NULL) == 32 + 16 + 501);
    CHECK(geoCodecs[GEO_CODEC_SIGN].maxEncodedSize(1001, ncclFloat32, NULL) == 32 + 16 + 126);
    CHECK(geoCodecs[GEO_CODEC_TOPK].maxEncodedSize(1001, ncclFloat32, NULL) == 32 + 11 * 8);
    CHECK(geoCodecs[GEO_CODEC_NONE].maxEncodedSize(1000, ncclFloat64, NULL) == 32 + 8000);
    CU_ASSERT_EQUAL(failures, 0);
}

static void test_lossless_every_dtype(void)
{
    static const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    failures = 0;
    for (int t = 0; t < ncclNumTypes; t++) {
        for (int kind = 0; kind < 3; kind++) {
            size_t n = 10007, s = sizes[t];
            unsigned char *x = malloc(n * s);
            for (size_t i = 0; i < n * s; i++) {
                if (kind == 0) /* random bytes: incompressible */
                    x[i] = (unsigned char)rnd64();
                else if (kind == 1) /* smooth values: high bytes repeat */
                    x[i] = (i % s == s - 1) ? 0x3F : (unsigned char)(rnd64() & (i % s ? 0x0F : 0xFF));
                else
                    x[i] = 0;
            }
            for (int id = GEO_CODEC_NONE; id <= GEO_CODEC_LOSSLESS; id++) {
                size_t len;
                unsigned char *c = encode((geoCodecId)id, x, n, (ncclDataType_t)t, NULL, 0, NULL, &len);
                unsigned char *d = malloc(n * s);
                CHECK(geoCodecs[id].decode(c, len, (ncclDataType_t)t, d, n, NULL) == ncclSuccess);
                CHECK(memcmp(x, d, n * s) == 0);
                if (id == GEO_CODEC_LOSSLESS && kind == 0) {
                    CHECK(c[7] == 0); /* raw fallback */
                    CHECK(len == 32 + n * s);
                }
#ifdef HAVE_ZSTD
                if (id == GEO_CODEC_LOSSLESS && kind != 0) {
                    CHECK(c[7] == GEO_CODEC_FLAG_ZSTD);
                    CHECK(len < 32 + n * s);
                }
#endif
                free(c);
                free(d);
            }
            free(x);
        }
    }
    CU_ASSERT_EQUAL(failures, 0);
}

/* ------------------------------------------------------------------------ */
/* Error feedback                                                           */
/* ------------------------------------------------------------------------ */

static void test_error_feedback(void)
{
    failures = 0;
    for (int id = 0; id < GEO_CODEC_COUNT; id++) {
        for (int st = 0; st <= 1; st++) {
            for (int dist = 0; dist < DIST_COUNT; dist++) {
                size_t n = 3001;
                float *x = malloc(n * sizeof(float)), *r = malloc(n * sizeof(float)),
                      *r0 = malloc(n * sizeof(float));
                fill(x, n, dist);
                fill(r0, n, DIST_GAUSS);
                for (size_t i = 0; i < n; i++)
                    r0[i] *= 0.1f;
                memcpy(r, r0, n * sizeof(float));
                geoCodecParams p = GEO_CODEC_PARAMS_INIT;
                p.stochastic = st;
                p.topkFraction = 0.05;
                size_t len;
                unsigned char *c = encode((geoCodecId)id, x, n, ncclFloat32, &p, 5, r, &len);
                float *d = decodeNew((geoCodecId)id, c, len, n);
                for (size_t i = 0; i < n; i++) {
                    float v = x[i] + r0[i];
                    /* d + r_new == v up to one rounding of r_new = v - d. */
                    double err = fabs(((double)d[i] + r[i]) - v);
                    CHECK(err <= 0x1p-24 * fabs((double)v - d[i]) + 0x1p-50 * fabs(v) + 1e-45);
                    if (!geoCodecs[id].lossy)
                        CHECK(r[i] == 0.0f && sameBits(d[i], v));
                }
                free(c);
                free(d);
                free(x);
                free(r);
                free(r0);
            }
        }
    }
    CU_ASSERT_EQUAL(failures, 0);
}

/* Over many steps the residual telescopes: the sum of what was sent plus
 * the final residual equals the sum of the inputs (what error feedback is
 * for), even for sign and topk whose single steps lose a lot. */
static void test_error_feedback_telescopes(void)
{
    failures = 0;
    size_t n = 2048;
    int steps = 50;
    for (int id = GEO_CODEC_FP16; id < GEO_CODEC_COUNT; id++) {
        float *x = malloc(n * sizeof(float)), *r = calloc(n, sizeof(float));
        double *sentSum = calloc(n, sizeof(double)), *inSum = calloc(n, sizeof(double));
        geoCodecParams p = GEO_CODEC_PARAMS_INIT;
        p.topkFraction = 0.05;
        double maxErrNoEf = 0, maxErr = 0;
        for (int s = 0; s < steps; s++) {
            fill(x, n, DIST_GAUSS);
            for (size_t i = 0; i < n; i++)
                inSum[i] += x[i];
            size_t len;
            unsigned char *c = encode((geoCodecId)id, x, n, ncclFloat32, &p, (uint64_t)s, r, &len);
            float *d = decodeNew((geoCodecId)id, c, len, n);
            for (size_t i = 0; i < n; i++)
                sentSum[i] += d[i];
            free(c);
            free(d);
        }
        for (size_t i = 0; i < n; i++) {
            maxErr = fmax(maxErr, fabs(sentSum[i] + r[i] - inSum[i]));
            maxErrNoEf = fmax(maxErrNoEf, fabs(r[i]));
        }
        /* Gaussian inputs of 1e-3: the sum of 50 steps is exact to ~1e-9. */
        CHECK(maxErr < 1e-7);
        free(x);
        free(r);
        free(sentSum);
        free(inSum);
    }
    CU_ASSERT_EQUAL(failures, 0);
}

/* Non-finite values (an overflowing step under loss scaling) reach the
 * decoded side and leave a finite residual. */
static void test_non_finite(void)
{
    failures = 0;
    for (int id = GEO_CODEC_FP16; id < GEO_CODEC_COUNT; id++) {
        size_t n = 512;
        float x[512], r[512];
        fill(x, n, DIST_GAUSS);
        memset(r, 0, sizeof(r));
        x[3] = INFINITY;
        x[300] = NAN;
        geoCodecParams p = GEO_CODEC_PARAMS_INIT;
        size_t len;
        unsigned char *c = encode((geoCodecId)id, x, n, ncclFloat32, &p, 0, r, &len);
        float *d = decodeNew((geoCodecId)id, c, len, n);
        int sawNonFinite = 0;
        for (size_t i = 0; i < n; i++) {
            CHECK(isfinite(r[i]));
            sawNonFinite |= !isfinite(d[i]);
        }
        CHECK(sawNonFinite);
        free(c);
        free(d);
    }
    CU_ASSERT_EQUAL(failures, 0);
}

/* ------------------------------------------------------------------------ */
/* Throughput                                                               */
/* ------------------------------------------------------------------------ */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_throughput(void)
{
    const char *env = getenv("GEOCCL_CODEC_BENCH_MIB");
    size_t mib = env ? (size_t)strtoul(env, NULL, 10) : 64;
    if (mib == 0)
        return;
    size_t n = mib * (1u << 20) / sizeof(float);
    float *x = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
    if (!x || !d) {
        free(x);
        free(d);
        return;
    }
    fill(x, n, DIST_GAUSS);
    memset(d, 0, n * sizeof(float));
    /* Every codec with its defaults, then int8 and int4 with stochastic
     * rounding, then int8 with error feedback. */
    for (int run = 0; run < GEO_CODEC_COUNT + 3; run++) {
        int id = run < GEO_CODEC_COUNT ? run : run == GEO_CODEC_COUNT + 1 ? GEO_CODEC_INT4
                                                                          : GEO_CODEC_INT8;
        const geoCodec *c = &geoCodecs[id];
        geoCodecParams p = GEO_CODEC_PARAMS_INIT;
        p.stochastic = run == GEO_CODEC_COUNT || run == GEO_CODEC_COUNT + 1;
        float *r = run == GEO_CODEC_COUNT + 2 ? calloc(n, sizeof(float)) : NULL;
        const char *what = p.stochastic ? " (stochastic)" : r ? " (error feedback)" : "";
        size_t max = c->maxEncodedSize(n, ncclFloat32, &p);
        unsigned char *buf = malloc(max);
        if (!buf) {
            free(r);
            continue;
        }
        memset(buf, 0, max); /* fault the pages in outside the timing */
        size_t len = 0;
        double te = 1e30, td = 1e30;
        for (int rep = 0; rep < 2; rep++) {
            double t0 = now();
            CU_ASSERT_EQUAL(c->encode(x, n, ncclFloat32, &p, 0, r, buf, max, &len), ncclSuccess);
            double t1 = now();
            CU_ASSERT_EQUAL(c->decode(buf, len, ncclFloat32, d, n, NULL), ncclSuccess);
            double t2 = now();
            te = fmin(te, t1 - t0);
            td = fmin(td, t2 - t1);
        }
        double bytes = (double)n * sizeof(float);
        printf("\n    codec %s%s: encode %.2f GB/s decode %.2f GB/s ratio %.2f", c->name, what,
               bytes / te * 1e-9, bytes / td * 1e-9, bytes / (double)len);
        free(buf);
        free(r);
    }
    printf("\n    (%zu MiB of float32, one thread, best of 2)\n    ", mib);
    free(x);
    free(d);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("codec", NULL, NULL);
    CU_add_test(s, "table and names", test_table_and_names);
    CU_add_test(s, "GEOCCL_COMPRESS parsing", test_parse);
    CU_add_test(s, "golden int8 chunk", test_golden_int8);
    CU_add_test(s, "golden sign and topk chunks", test_golden_sign_topk);
    CU_add_test(s, "round trip none", test_roundtrip_none);
    CU_add_test(s, "round trip lossless", test_roundtrip_lossless);
    CU_add_test(s, "round trip fp16", test_roundtrip_fp16);
    CU_add_test(s, "round trip bf16", test_roundtrip_bf16);
    CU_add_test(s, "round trip int8", test_roundtrip_int8);
    CU_add_test(s, "round trip int8 stochastic", test_roundtrip_int8_stochastic);
    CU_add_test(s, "round trip int4", test_roundtrip_int4);
    CU_add_test(s, "round trip int4 stochastic", test_roundtrip_int4_stochastic);
    CU_add_test(s, "round trip sign", test_roundtrip_sign);
    CU_add_test(s, "round trip topk", test_roundtrip_topk);
    CU_add_test(s, "fp16 every value, ties, saturation", test_fp16_exhaustive);
    CU_add_test(s, "reproducible with a seed", test_reproducible);
    CU_add_test(s, "stochastic rounding unbiased", test_stochastic_unbiased);
    CU_add_test(s, "decoders reject corrupt chunks", test_corrupt_chunks);
    CU_add_test(s, "decodeAccumulate == decode + add", test_decode_accumulate);
    CU_add_test(s, "sizes and encoder arguments", test_sizes_and_encoder_args);
    CU_add_test(s, "lossless every dtype, raw fallback", test_lossless_every_dtype);
    CU_add_test(s, "error feedback bookkeeping", test_error_feedback);
    CU_add_test(s, "error feedback telescopes", test_error_feedback_telescopes);
    CU_add_test(s, "non-finite values", test_non_finite);
    CU_add_test(s, "throughput", test_throughput);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
