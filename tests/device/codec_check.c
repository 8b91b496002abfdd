/*
 * GPU codecs against the CPU reference (cuda/codec_kernels.h vs
 * compress/codec.h), then the kernels' throughput beside the GPU's memory
 * bandwidth.
 *
 * For every GPU codec, many sizes (0, 1, non-multiples of 8 and of the
 * block size, several tiles), block sizes, seeds, counters, inputs (random
 * with per-block magnitudes, special values, ties, zeros), with and
 * without error feedback (two steps, the residual carried), aligned and
 * unaligned float arrays: the GPU chunk must equal the CPU chunk byte for
 * byte, the residuals bit for bit, and decode / decode-accumulate of the
 * chunk on both sides must agree bit for bit.  Corrupted and truncated
 * chunks must be rejected by the GPU exactly when the CPU rejects them,
 * with dst untouched.
 *
 * Exit: 0 all passed, 1 a check failed or CUDA is unusable on a machine
 * with a driver (too old a driver: gpu_probe.h), 77 no GPU (none seen, or
 * no driver installed), 2 a CUDA call failed.
 *
 * Options: --quick (fewer cases, no large sizes), --no-perf, --perf-only,
 * --perf-elems N (elements for the throughput runs, default 2^26),
 * --topk-big N (elements of the big topk cases, default 5 Mi + 11; 300007
 * in the emulation build; run.sh --emulate passes that to the real build
 * running on the emulated runtime); the
 * environment variable GEOCCL_CODEC_CHECK_ARGS may hold --quick and
 * --no-perf too (for make check).
 *
 * Built twice: against CUDA (tests/device/codec_check, run on a lent GPU by
 * tests/device/run.sh) and against the CPU emulation of the kernels
 * (GEO_CUDA_EMU, tests/device/codec_emu, run by make check), where the
 * throughput part is skipped.
 *
 * Under the sanitizers (GEOCCL_SANITIZE: tests/run-sanitizers.sh runs
 * codec_emu under address,undefined, where the emulated kernels run some
 * ten times slower) every codec still runs every size, block size, error
 * feedback setting and corruption, and every input pattern on the sizes
 * below 1000; from 1000 up, as on the largest sizes of the plain run, the
 * random pattern and one other (a different one from size to size), and
 * one of the four big topk cases.  A bad access or undefined arithmetic
 * shows at the sizes and tile edges, which all still run; the patterns
 * change the values, which the smaller sizes run in full.
 */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GEO_CUDA_EMU
#include "cuda_emu.h"
#else
#include <cuda_runtime_api.h>
#endif
#include "gpu_probe.h"

#include "compress/codec.h"
#include "cuda/codec_kernels.h"

static int passed, failed;
static int quick, emu;
/* Built under the sanitizers (GEOCCL_SANITIZE, set by make check in those
 * builds): fewer cases, as correctness() says. */
static int sanitized;
/* Elements of the big topk cases (--topk-big N; 0: the build's default). */
static size_t topkBig;
/* Sign chunks equal but for NaN scales (see nanScalesOnly). */
static int signNanScales;

/* The case being run (codec, size, parameters, seed, input), named by
 * every CUDA failure: a kernel's fault shows at the next synchronising
 * call, whose file:line says nothing of which input made it. */
static char curCase[320] = "setup";

#define CUDA_OK(call)                                                                  \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s:%d: %s: %s, in case: %s\n", __FILE__, __LINE__, #call,  \
                    cudaGetErrorString(e_), curCase);                                  \
            exit(2);                                                                   \
        }                                                                              \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* Device buffer of exactly n bytes (n = 0: 1), so that the emulation's
 * guards and ASan see any access past the end. */
static void *dmalloc(size_t n)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, n ? n : 1));
    return p;
}

/* Bytes for a device array of n floats at offset (0 or 1 floats) into its
 * allocation: (n + 1) floats, so that at offset 1 the array ends at the
 * allocation's end and the guards see any overrun; an empty array at offset 1 gets
 * one float more, so that its pointer (passed, never read) lies inside the
 * allocation, as the emulated runtime's kernel-argument check requires. */
static size_t dbytes(size_t n, int offset)
{
    return (n + 1 + (n == 0 && offset)) * 4;
}

/* ------------------------------------------------------------------------ */
/* Inputs                                                                    */
/* ------------------------------------------------------------------------ */

static uint64_t rngState;

static uint64_t rnd(void)
{
    uint64_t z = (rngState += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rndUnit(void) { return (float)(rnd() >> 40) * 0x1p-24f; }

static float bitsToFloat(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

enum { PAT_RANDOM, PAT_SPECIAL, PAT_TIES, PAT_ZERO, PAT_COUNT };
static const char *const patName[PAT_COUNT] = {"random", "special", "ties", "zero"};

static void fillInput(float *x, size_t n, int pat)
{
    float scale = 1.0f;
    for (size_t i = 0; i < n; i++) {
        if (i % 97 == 0) /* magnitudes change within and across blocks */
            scale = ldexpf(1.0f, (int)(rnd() % 40) - 25);
        float g = (rndUnit() + rndUnit() + rndUnit() + rndUnit() - 2.0f) * scale;
        switch (pat) {
        case PAT_RANDOM:
            x[i] = g;
            break;
        case PAT_SPECIAL: {
            static const uint32_t special[] = {
                0x7FC00000u, 0xFFC00001u, 0x7F800000u, 0xFF800000u, 0x00000000u,
                0x80000000u, 0x00000001u, 0x80800000u, 0x007FFFFFu, 0x477FF000u,
                0xC77FEFFFu, 0x477FE000u, 0x7F7FFFFFu, 0x0D800000u, 0x0D7FFFFFu,
                0x33800000u, 0x38800000u, 0x387FFFFFu, 0xB3000000u, 0x7F7F8000u,
                0x47800000u, 0x3F800000u, 0xBF7FFFFFu, 0x00400000u};
            x[i] = rnd() % 5 == 0 ? bitsToFloat(special[rnd() % (sizeof special / 4)]) : g;
            break;
        }
        case PAT_TIES: {
            static const float ties[] = {0.0f, 0.25f, -0.25f, 0.5f, -0.5f, 1.0f, -1.0f, -0.0f};
            x[i] = ties[rnd() % 8];
            break;
        }
        default:
            x[i] = 0.0f;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* One case                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct {
    geoCodecId codec;
    size_t count;
    geoCodecParams params;
    int ef;        /* error feedback, two steps */
    int offset;    /* float arrays start 0 or 1 element past a 16-byte boundary */
    int pattern;
    uint64_t counter;
} Case;

static void describe(char *buf, size_t n, const Case *c)
{
    snprintf(buf, n, "%s n=%zu B=%u sr=%d seed=%" PRIu64 " k=%g ef=%d off=%d %s ctr=%" PRIu64,
             geoCodecs[c->codec].name, c->count, c->params.blockSize, c->params.stochastic,
             c->params.seed, c->params.topkFraction, c->ef, c->offset, patName[c->pattern],
             c->counter);
}

static void report(int ok, const Case *c, const char *what, const char *detail)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    if (failed <= 40) {
        char d[256];
        describe(d, sizeof d, c);
        printf("FAIL %s: %s%s%s\n", d, what, detail ? ": " : "", detail ? detail : "");
    }
}

/* Where two byte strings first differ, as text. */
static const char *firstDiff(const unsigned char *a, const unsigned char *b, size_t n,
                             char *buf, size_t bn)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            snprintf(buf, bn, "first difference at byte %zu of %zu (cpu %02x, gpu %02x)", i, n,
                     a[i], b[i]);
            return buf;
        }
    return "equal";
}

/*
 * 1 if the two sign chunks differ only in scales that are NaN in both.
 * A block holding a NaN has a NaN scale, but which NaN the CPU reference
 * stores depends on the order its vectorised lanes add two NaNs in (the
 * compiler's choice); the GPU stores 0x7FC00000.  Reported until
 * compress/ fixes that NaN.
 */
static int nanScalesOnly(const Case *c, const unsigned char *a, const unsigned char *b, size_t len)
{
    if (c->codec != GEO_CODEC_SIGN || len < 32)
        return 0;
    size_t nb = (c->count + c->params.blockSize - 1) / c->params.blockSize;
    if (memcmp(a, b, 32) != 0 || memcmp(a + 32 + 4 * nb, b + 32 + 4 * nb, len - 32 - 4 * nb) != 0)
        return 0;
    for (size_t i = 0; i < nb; i++) {
        uint32_t x, y;
        memcpy(&x, a + 32 + 4 * i, 4);
        memcpy(&y, b + 32 + 4 * i, 4);
        if (x != y && !((x & 0x7FFFFFFFu) > 0x7F800000u && (y & 0x7FFFFFFFu) > 0x7F800000u))
            return 0;
    }
    return 1;
}

/* Decode (acc 0) or decode-accumulate (acc 1) the chunk on both sides. */
static void checkDecode(const Case *c, const unsigned char *chunk, size_t len,
                        const void *dchunk, int acc, cudaStream_t st, int *dstatus)
{
    size_t n = c->count;
    float *base = xmalloc((n + 1) * 4), *cpu = xmalloc((n + 1) * 4), *gpu = xmalloc((n + 1) * 4);
    fillInput(base, n, PAT_RANDOM);
    memcpy(cpu, base, n * 4);
    const char *why = NULL;
    const geoCodec *cc = &geoCodecs[c->codec];
    ncclResult_t rc = acc ? cc->decodeAccumulate(chunk, len, ncclFloat32, cpu, n, &why)
                          : cc->decode(chunk, len, ncclFloat32, cpu, n, &why);
    report(rc == ncclSuccess, c, "the cpu decoder rejects the cpu chunk", why);

    float *dmem = dmalloc(dbytes(n, c->offset));
    float *d = dmem + c->offset;
    CUDA_OK(cudaMemcpy(d, base, n * 4, cudaMemcpyHostToDevice));
    ncclResult_t rg = acc ? geoCudaCodecDecodeAccumulate(c->codec, dchunk, len, ncclFloat32, d, n,
                                                         dstatus, st, &why)
                          : geoCudaCodecDecode(c->codec, dchunk, len, ncclFloat32, d, n, dstatus,
                                               st, &why);
    report(rg == ncclSuccess, c, "gpu decode call failed", rg == ncclSuccess ? NULL : why);
    CUDA_OK(cudaStreamSynchronize(st));
    int status = -1;
    CUDA_OK(cudaMemcpy(&status, dstatus, sizeof status, cudaMemcpyDeviceToHost));
    report(status == 0, c, "gpu decoder rejects the chunk", geoCudaDecodeStatusString(status));
    CUDA_OK(cudaMemcpy(gpu, d, n * 4, cudaMemcpyDeviceToHost));
    char buf[160];
    report(memcmp(cpu, gpu, n * 4) == 0, c, acc ? "decodeAccumulate differs" : "decode differs",
           firstDiff((unsigned char *)cpu, (unsigned char *)gpu, n * 4, buf, sizeof buf));
    CUDA_OK(cudaFree(dmem));
    free(base);
    free(cpu);
    free(gpu);
}

/* A corrupted or mismatched chunk: the GPU rejects it iff the CPU does;
 * on rejection dst is untouched, on acceptance both decode the same. */
static void checkCorrupt(const Case *c, const unsigned char *chunk, size_t len, size_t expect,
                         geoCodecId asCodec, const char *what, cudaStream_t st, int *dstatus)
{
    size_t n = expect;
    float *cpu = xmalloc((n + 1) * 4), *gpu = xmalloc((n + 1) * 4);
    for (size_t i = 0; i < n; i++)
        cpu[i] = 1.5f;
    const char *why = "";
    ncclResult_t rc = geoCodecs[asCodec].decode(chunk, len, ncclFloat32, cpu, n, &why);

    unsigned char *dchunk = dmalloc(len);
    CUDA_OK(cudaMemcpy(dchunk, chunk, len, cudaMemcpyHostToDevice));
    float *d = dmalloc(n * 4);
    for (size_t i = 0; i < n; i++)
        gpu[i] = 1.5f;
    CUDA_OK(cudaMemcpy(d, gpu, n * 4, cudaMemcpyHostToDevice));
    const char *gwhy = NULL;
    ncclResult_t rg =
        geoCudaCodecDecode(asCodec, dchunk, len, ncclFloat32, d, n, dstatus, st, &gwhy);
    CUDA_OK(cudaStreamSynchronize(st));
    int status = -1;
    if (rg == ncclSuccess)
        CUDA_OK(cudaMemcpy(&status, dstatus, sizeof status, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(gpu, d, n * 4, cudaMemcpyDeviceToHost));
    char detail[256];
    int gpuRejects = rg != ncclSuccess || status != 0;
    snprintf(detail, sizeof detail, "%s: cpu %s (%s), gpu %s (%s)", what,
             rc == ncclSuccess ? "accepts" : "rejects", rc == ncclSuccess ? "" : why,
             gpuRejects ? "rejects" : "accepts",
             rg != ncclSuccess ? gwhy : geoCudaDecodeStatusString(status));
    report((rc != ncclSuccess) == gpuRejects, c, "corrupt chunk verdicts differ", detail);
    if (gpuRejects) {
        int untouched = 1;
        for (size_t i = 0; i < n; i++)
            untouched &= gpu[i] == 1.5f;
        report(untouched, c, "gpu decoder wrote dst of a rejected chunk", detail);
    } else if (rc == ncclSuccess) {
        report(memcmp(cpu, gpu, n * 4) == 0, c, "accepted corrupt chunk decodes differently",
               detail);
    }
    CUDA_OK(cudaFree(dchunk));
    CUDA_OK(cudaFree(d));
    free(cpu);
    free(gpu);
}

static void corruptions(const Case *c, const unsigned char *chunk, size_t len, cudaStream_t st,
                        int *dstatus)
{
    unsigned char *m = xmalloc(len + 8);
    size_t n = c->count;
    /* Truncated by one byte, and one byte longer. */
    if (len > 0)
        checkCorrupt(c, chunk, len - 1, n, c->codec, "truncated", st, dstatus);
    memcpy(m, chunk, len);
    m[len] = 0;
    checkCorrupt(c, m, len + 1, n, c->codec, "one byte longer", st, dstatus);
    /* Only the first 16 bytes. */
    checkCorrupt(c, chunk, len < 16 ? len : 16, n, c->codec, "16 bytes", st, dstatus);
    /* A flipped header bit (checksum or field), and a header with a
     * recomputed checksum but a wrong field. */
    for (int t = 0; t < 3; t++) {
        memcpy(m, chunk, len);
        m[rnd() % 32] ^= (unsigned char)(1u << (rnd() % 8));
        checkCorrupt(c, m, len, n, c->codec, "header bit flipped", st, dstatus);
    }
    static const int fields[] = {4, 5, 6, 7, 8, 16, 24, 25};
    for (size_t t = 0; t < sizeof fields / sizeof fields[0]; t++) {
        memcpy(m, chunk, len);
        m[fields[t]] ^= (unsigned char)(1u << (rnd() % 8));
        uint32_t sum = geoCodecChecksum(m, 28);
        memcpy(m + 28, &sum, 4);
        checkCorrupt(c, m, len, n, c->codec, "header field changed, checksum fixed", st, dstatus);
    }
    /* Wrong expected count, wrong codec. */
    checkCorrupt(c, chunk, len, n + 1, c->codec, "count + 1 expected", st, dstatus);
    if (n > 0)
        checkCorrupt(c, chunk, len, n - 1, c->codec, "count - 1 expected", st, dstatus);
    geoCodecId other = c->codec == GEO_CODEC_INT8 ? GEO_CODEC_INT4 : GEO_CODEC_INT8;
    checkCorrupt(c, chunk, len, n, other, "decoded as another codec", st, dstatus);
    /* Payload bytes: the last one (padding of int4 and sign), random ones
     * (topk indices: order and range). */
    if (len > 32) {
        memcpy(m, chunk, len);
        m[len - 1] ^= 0xF0;
        checkCorrupt(c, m, len, n, c->codec, "last payload byte changed", st, dstatus);
        memcpy(m, chunk, len);
        m[len - 1] ^= 0x80;
        checkCorrupt(c, m, len, n, c->codec, "last payload bit changed", st, dstatus);
        for (int t = 0; t < 3; t++) {
            memcpy(m, chunk, len);
            m[32 + rnd() % (len - 32)] ^= (unsigned char)(1u << (rnd() % 8));
            checkCorrupt(c, m, len, n, c->codec, "payload bit flipped", st, dstatus);
        }
    }
    if (c->codec == GEO_CODEC_TOPK && len >= 32 + 16) {
        /* Two indices swapped (order), one index = count (range). */
        memcpy(m, chunk, len);
        unsigned char t4[4];
        memcpy(t4, m + 32, 4);
        memcpy(m + 32, m + 36, 4);
        memcpy(m + 36, t4, 4);
        checkCorrupt(c, m, len, n, c->codec, "topk indices swapped", st, dstatus);
        memcpy(m, chunk, len);
        uint32_t bad = (uint32_t)n;
        size_t k = (len - 32) / 8;
        memcpy(m + 32 + 4 * (k - 1), &bad, 4);
        checkCorrupt(c, m, len, n, c->codec, "topk index = count", st, dstatus);
    }
    free(m);
}

static void runCase(const Case *c, cudaStream_t st, int *dstatus, int withCorruptions)
{
    size_t n = c->count;
    const geoCodec *cc = &geoCodecs[c->codec];
    size_t need = cc->maxEncodedSize(n, ncclFloat32, &c->params);
    size_t gneed = geoCudaCodecEncodedSize(c->codec, n, ncclFloat32, &c->params);
    describe(curCase, sizeof curCase, c);
    char buf[200];
    snprintf(buf, sizeof buf, "cpu %zu, gpu %zu", need, gneed);
    report(need == gneed && need != 0, c, "encoded sizes differ", buf);
    if (need != gneed || need == 0)
        return;

    float *x = xmalloc((n + 1) * 4), *r = xmalloc((n + 1) * 4), *rg = xmalloc((n + 1) * 4);
    unsigned char *cchunk = xmalloc(need), *gchunk = xmalloc(need);
    fillInput(x, n, c->pattern);
    for (size_t i = 0; i < n; i++) /* a residual of the inputs' size */
        r[i] = (rndUnit() - 0.5f) * ldexpf(1.0f, (int)(rnd() % 30) - 20);

    float *dxm = dmalloc(dbytes(n, c->offset)), *drm = dmalloc(dbytes(n, c->offset));
    float *dx = dxm + c->offset, *dr = drm + c->offset;
    unsigned char *dchunk = dmalloc(need);
    size_t sbytes = geoCudaCodecScratchBytes(c->codec, n, &c->params);
    void *scratch = sbytes ? dmalloc(sbytes) : NULL;
    CUDA_OK(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dr, r, n * 4, cudaMemcpyHostToDevice));

    int steps = c->ef ? 2 : 1;
    for (int step = 0; step < steps; step++) {
        uint64_t counter = c->counter + (uint64_t)step;
        size_t wc = 0, wg = 0;
        ncclResult_t rc = cc->encode(x, n, ncclFloat32, &c->params, counter, c->ef ? r : NULL,
                                     cchunk, need, &wc);
        report(rc == ncclSuccess && wc == need, c, "cpu encode failed", NULL);
        const char *why = NULL;
        memset(gchunk, 0xEE, need);
        ncclResult_t rgpu = geoCudaCodecEncode(c->codec, dx, n, ncclFloat32, &c->params, counter,
                                               c->ef ? dr : NULL, dchunk, need, scratch, sbytes,
                                               st, &wg, &why);
        report(rgpu == ncclSuccess && wg == need, c, "gpu encode failed", why);
        if (rc != ncclSuccess || rgpu != ncclSuccess)
            break;
        CUDA_OK(cudaStreamSynchronize(st));
        CUDA_OK(cudaMemcpy(gchunk, dchunk, need, cudaMemcpyDeviceToHost));
        int same = memcmp(cchunk, gchunk, need) == 0;
        if (!same && nanScalesOnly(c, cchunk, gchunk, need)) {
            same = 1;
            signNanScales++;
        }
        report(same, c, step ? "chunk differs (EF step 2)" : "chunk differs",
               firstDiff(cchunk, gchunk, need, buf, sizeof buf));
        if (c->ef) {
            CUDA_OK(cudaMemcpy(rg, dr, n * 4, cudaMemcpyDeviceToHost));
            report(memcmp(r, rg, n * 4) == 0, c, "residual differs",
                   firstDiff((unsigned char *)r, (unsigned char *)rg, n * 4, buf, sizeof buf));
            /* Carry the CPU's residual on both sides, so one difference is
             * reported once. */
            CUDA_OK(cudaMemcpy(dr, r, n * 4, cudaMemcpyHostToDevice));
        }
        /* The GPU's input is unchanged (only the residual is written). */
        if (step == 0) {
            CUDA_OK(cudaMemcpy(rg, dx, n * 4, cudaMemcpyDeviceToHost));
            report(memcmp(x, rg, n * 4) == 0, c, "gpu encode modified its input", NULL);
        }
    }
    /* Decoders on the CPU's chunk (equal to the GPU's when the above passed). */
    CUDA_OK(cudaMemcpy(dchunk, cchunk, need, cudaMemcpyHostToDevice));
    checkDecode(c, cchunk, need, dchunk, 0, st, dstatus);
    checkDecode(c, cchunk, need, dchunk, 1, st, dstatus);
    if (withCorruptions)
        corruptions(c, cchunk, need, st, dstatus);

    CUDA_OK(cudaFree(dxm));
    CUDA_OK(cudaFree(drm));
    CUDA_OK(cudaFree(dchunk));
    if (scratch)
        CUDA_OK(cudaFree(scratch));
    free(x);
    free(r);
    free(rg);
    free(cchunk);
    free(gchunk);
}

/* none with other dtypes: bytes copied as they are. */
static void checkNoneTypes(cudaStream_t st, int *dstatus)
{
    static const ncclDataType_t types[] = {ncclInt8, ncclFloat16, ncclFloat64, ncclUint32};
    static const size_t sizes[] = {0, 1, 5, 17, 1000};
    Case c;
    memset(&c, 0, sizeof c);
    c.codec = GEO_CODEC_NONE;
    geoCodecParamsInit(&c.params);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            size_t n = sizes[s], es = types[t] == ncclInt8 ? 1 : types[t] == ncclFloat16 ? 2
                                                             : types[t] == ncclFloat64 ? 8 : 4;
            c.count = n;
            snprintf(curCase, sizeof curCase, "none n=%zu dtype=%d (non-float types)", n,
                     (int)types[t]);
            unsigned char *x = xmalloc(n * es + 1);
            for (size_t i = 0; i < n * es; i++)
                x[i] = (unsigned char)rnd();
            size_t need = geoCodecs[GEO_CODEC_NONE].maxEncodedSize(n, types[t], NULL);
            unsigned char *cch = xmalloc(need), *gch = xmalloc(need);
            size_t w = 0;
            geoCodecs[GEO_CODEC_NONE].encode(x, n, types[t], NULL, 0, NULL, cch, need, &w);
            /* (dy: an empty array at the odd address still lies inside it) */
            unsigned char *dx = dmalloc(n * es), *dch = dmalloc(need),
                          *dy = dmalloc(n * es + 1 + (n == 0 && es == 1));
            CUDA_OK(cudaMemcpy(dx, x, n * es, cudaMemcpyHostToDevice));
            size_t wg = 0;
            const char *why = NULL;
            ncclResult_t rg = geoCudaCodecEncode(GEO_CODEC_NONE, dx, n, types[t], NULL, 0, NULL,
                                                 dch, need, NULL, 0, st, &wg, &why);
            report(rg == ncclSuccess && wg == need, &c, "gpu none encode (dtype) failed", why);
            CUDA_OK(cudaStreamSynchronize(st));
            CUDA_OK(cudaMemcpy(gch, dch, need, cudaMemcpyDeviceToHost));
            report(memcmp(cch, gch, need) == 0, &c, "none chunk (dtype) differs", NULL);
            /* Decode into an odd address for 1-byte types (scalar path). */
            unsigned char *dst = dy + (es == 1 ? 1 : 0);
            rg = geoCudaCodecDecode(GEO_CODEC_NONE, dch, need, types[t], dst, n, dstatus, st, &why);
            report(rg == ncclSuccess, &c, "gpu none decode (dtype) failed", why);
            CUDA_OK(cudaStreamSynchronize(st));
            int status = -1;
            CUDA_OK(cudaMemcpy(&status, dstatus, sizeof status, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(gch, dst, n * es, cudaMemcpyDeviceToHost));
            report(status == 0 && memcmp(gch, x, n * es) == 0, &c, "none decode (dtype) differs",
                   geoCudaDecodeStatusString(status));
            CUDA_OK(cudaFree(dx));
            CUDA_OK(cudaFree(dch));
            CUDA_OK(cudaFree(dy));
            free(x);
            free(cch);
            free(gch);
        }
}

/* geoCudaDivideF32 (the average of a device all-reduce) against the CPU's
 * binary32 division, bit for bit, on every input pattern. */
static void checkDivide(cudaStream_t st)
{
    static const size_t sizes[] = {1, 7, 1000, 65543};
    static const int divisors[] = {1, 2, 3, 7, 1000};
    Case c;
    memset(&c, 0, sizeof c);
    c.codec = GEO_CODEC_NONE;
    geoCodecParamsInit(&c.params);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t di = 0; di < sizeof divisors / sizeof divisors[0]; di++)
            for (int pat = 0; pat < PAT_COUNT; pat++) {
                size_t n = sizes[si];
                c.count = n;
                snprintf(curCase, sizeof curCase, "divide n=%zu divisor=%d %s", n,
                         divisors[di], patName[pat]);
                float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float));
                fillInput(x, n, pat);
                float *dx = dmalloc(n * sizeof(float));
                CUDA_OK(cudaMemcpy(dx, x, n * sizeof(float), cudaMemcpyHostToDevice));
                const char *why = NULL;
                ncclResult_t r = geoCudaDivideF32(dx, n, divisors[di], st, &why);
                report(r == ncclSuccess, &c, "gpu divide failed", why);
                CUDA_OK(cudaStreamSynchronize(st));
                CUDA_OK(cudaMemcpy(y, dx, n * sizeof(float), cudaMemcpyDeviceToHost));
                size_t bad = 0;
                for (size_t i = 0; i < n; i++) {
                    float want = x[i] / (float)divisors[di];
                    if (memcmp(&want, &y[i], sizeof want) != 0 && !(want != want && y[i] != y[i]))
                        bad++;
                }
                char detail[64];
                snprintf(detail, sizeof detail, "%zu of %zu differ (divisor %d, %s)", bad, n,
                         divisors[di], patName[pat]);
                report(bad == 0, &c, "divide differs from the CPU", detail);
                CUDA_OK(cudaFree(dx));
                free(x);
                free(y);
            }
    const char *why = NULL;
    report(geoCudaDivideF32(NULL, 1, 2, st, &why) == ncclInvalidArgument, &c,
           "divide accepted a NULL buffer", why);
}

/* Argument checks that return before anything is enqueued. */
static void checkArguments(cudaStream_t st, int *dstatus)
{
    Case c;
    snprintf(curCase, sizeof curCase, "argument checks (int8)");
    memset(&c, 0, sizeof c);
    c.codec = GEO_CODEC_INT8;
    geoCodecParamsInit(&c.params);
    unsigned char *d = dmalloc(4096);
    float *x = dmalloc(1024);
    size_t w = 0;
    const char *why = NULL;
    report(geoCudaCodecEncode(GEO_CODEC_LOSSLESS, x, 16, ncclFloat32, NULL, 0, NULL, d, 4096,
                              NULL, 0, st, &w, &why) == ncclInvalidUsage,
           &c, "lossless encode is not ncclInvalidUsage", NULL);
    report(geoCudaCodecDecode(GEO_CODEC_LOSSLESS, d, 64, ncclFloat32, x, 16, dstatus, st, &why) ==
               ncclInvalidUsage,
           &c, "lossless decode is not ncclInvalidUsage", NULL);
    report(geoCudaCodecEncode(GEO_CODEC_INT8, x, 16, ncclFloat32, NULL, 0, NULL, d + 4, 4092,
                              NULL, 0, st, &w, &why) == ncclInvalidArgument,
           &c, "misaligned chunk accepted", NULL);
    report(geoCudaCodecEncode(GEO_CODEC_INT8, x, 256, ncclFloat32, NULL, 0, NULL, d, 100, NULL,
                              0, st, &w, &why) == ncclInvalidArgument,
           &c, "cap too small accepted", NULL);
    report(geoCudaCodecEncode(GEO_CODEC_INT8, x, 16, ncclInt32, NULL, 0, NULL, d, 4096, NULL, 0,
                              st, &w, &why) == ncclInvalidArgument,
           &c, "int32 accepted by a lossy codec", NULL);
    geoCodecParams bad;
    geoCodecParamsInit(&bad);
    bad.blockSize = 12;
    report(geoCudaCodecEncode(GEO_CODEC_SIGN, x, 16, ncclFloat32, &bad, 0, NULL, d, 4096, NULL,
                              0, st, &w, &why) == ncclInvalidArgument,
           &c, "block size 12 accepted", NULL);
    report(geoCudaCodecEncode(GEO_CODEC_TOPK, x, 16, ncclFloat32, NULL, 0, NULL, d, 4096, NULL, 0,
                              st, &w, &why) == ncclInvalidArgument,
           &c, "topk without scratch accepted", NULL);
    report(geoCudaCodecAvailable(GEO_CODEC_LOSSLESS) == 0 && geoCudaCodecAvailable(GEO_CODEC_TOPK),
           &c, "geoCudaCodecAvailable", NULL);
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaFree(x));
}

/* ------------------------------------------------------------------------ */
/* The case list                                                             */
/* ------------------------------------------------------------------------ */

static const geoCodecId gpuCodecs[] = {GEO_CODEC_NONE, GEO_CODEC_FP16, GEO_CODEC_BF16,
                                       GEO_CODEC_INT8, GEO_CODEC_INT4, GEO_CODEC_SIGN,
                                       GEO_CODEC_TOPK};

static void correctness(cudaStream_t st, int *dstatus)
{
    static const size_t sizesFull[] = {0, 1, 2, 7, 8, 9, 31, 33, 255, 256, 257, 1000, 4095,
                                       4096, 4097, 12345, 65543, 300007, (1u << 22) + 3};
    static const size_t sizesQuick[] = {0, 1, 2, 7, 8, 9, 31, 33, 255, 256, 257, 1000,
                                        4095, 4097, 9001};
    static const uint32_t blocks[] = {256, 8, 24, 1000, 4096, 65536, 16};
    static const double fractions[] = {0.01, 0.001, 0.3, 1.0, 0.05};
    const size_t *sizes = quick ? sizesQuick : sizesFull;
    size_t nsizes = quick ? sizeof sizesQuick / sizeof sizesQuick[0]
                          : sizeof sizesFull / sizeof sizesFull[0];
    unsigned variant = 0;
    for (size_t ci = 0; ci < sizeof gpuCodecs / sizeof gpuCodecs[0]; ci++) {
        int before = failed;
        int ran = 0;
        for (size_t si = 0; si < nsizes; si++) {
            for (int ef = 0; ef <= 1; ef++) {
                for (int pat = 0; pat < PAT_COUNT; pat++) {
                    /* Every pattern on small sizes; on large ones the random
                     * pattern and one other. */
                    if (sizes[si] > 20000 && pat != PAT_RANDOM && pat != (int)(si % PAT_COUNT))
                        continue;
                    variant++;
                    /* Under the sanitizers sizes from 1000 up count as
                     * large (the cases left out still take their variant,
                     * so every case that runs is the plain run's). */
                    if (sanitized && sizes[si] >= 1000 && pat != PAT_RANDOM &&
                        pat != (int)(si % PAT_COUNT))
                        continue;
                    Case c;
                    memset(&c, 0, sizeof c);
                    c.codec = gpuCodecs[ci];
                    c.count = sizes[si];
                    geoCodecParamsInit(&c.params);
                    c.params.blockSize = blocks[variant % (sizeof blocks / sizeof blocks[0])];
                    c.params.stochastic = (variant / 3) % 2;
                    c.params.seed = variant % 4 == 0 ? 0 : 0x1234567ull * variant;
                    c.params.topkFraction =
                        fractions[variant % (sizeof fractions / sizeof fractions[0])];
                    c.ef = ef;
                    c.offset = (variant / 2) % 2;
                    c.pattern = pat;
                    c.counter = variant % 5 == 0 ? 0 : rnd();
                    rngState = 0xC0DEC0DEull + variant;
                    /* Corruptions on a few small cases per codec. */
                    int corrupt = sizes[si] <= 4097 && pat == PAT_RANDOM;
                    runCase(&c, st, dstatus, corrupt);
                    ran++;
                }
            }
        }
        printf("  %-5s %4d cases  %s\n", geoCodecs[gpuCodecs[ci]].name, ran,
               failed == before ? "ok" : "FAILED");
        fflush(stdout);
    }
    /* topk with more than 1024 tiles (the tile scan runs in several rounds;
     * the emulation build has 256-element tiles), ties included.  Under
     * the sanitizers (GEOCCL_SANITIZE, set by make check in those builds)
     * only the last of the four, ties with error feedback: each takes
     * about 43 s of emulation there against 4 s in the plain build, which
     * runs all four. */
    int bigFirst = sanitized ? 3 : 0;
    for (int ef = 0; ef <= 1; ef++) {
        for (int pat = PAT_RANDOM; pat <= PAT_TIES; pat += PAT_TIES - PAT_RANDOM) {
            if (2 * ef + (pat == PAT_TIES) < bigFirst)
                continue;
            Case c;
            memset(&c, 0, sizeof c);
            c.codec = GEO_CODEC_TOPK;
            c.count = topkBig ? topkBig : emu ? 300007 : (5u << 20) + 11;
            geoCodecParamsInit(&c.params);
            c.params.topkFraction = pat == PAT_TIES ? 0.3 : 0.01;
            c.ef = ef;
            c.pattern = pat;
            c.counter = 3;
            rngState = 0x70C0ull + (uint64_t)(2 * ef + pat);
            runCase(&c, st, dstatus, 0);
        }
    }
    checkNoneTypes(st, dstatus);
    checkDivide(st);
    checkArguments(st, dstatus);
    if (signNanScales)
        printf("  note: %d sign chunks matched only up to the bits of NaN scales (the CPU\n"
               "  reference's NaN there depends on its compiler; the GPU writes 0x7FC00000)\n",
               signNanScales);
}

/* ------------------------------------------------------------------------ */
/* Throughput                                                                */
/* ------------------------------------------------------------------------ */

static double timeIt(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int reps,
                     void (*fn)(void *), void *arg)
{
    fn(arg); /* warm-up */
    CUDA_OK(cudaStreamSynchronize(st));
    CUDA_OK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; i++)
        fn(arg);
    CUDA_OK(cudaEventRecord(e1, st));
    CUDA_OK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1e-3 / reps;
}

typedef struct {
    geoCodecId codec;
    size_t n;
    geoCodecParams params;
    float *x, *r, *y;
    unsigned char *chunk;
    size_t cap, len;
    void *scratch;
    size_t sbytes;
    int *status;
    cudaStream_t st;
    int ef, acc;
} PerfArgs;

static void runEncode(void *p)
{
    PerfArgs *a = p;
    const char *why = NULL;
    if (geoCudaCodecEncode(a->codec, a->x, a->n, ncclFloat32, &a->params, 7, a->ef ? a->r : NULL,
                           a->chunk, a->cap, a->scratch, a->sbytes, a->st, &a->len, &why) !=
        ncclSuccess) {
        fprintf(stderr, "encode failed: %s\n", why);
        exit(2);
    }
}

static void runDecode(void *p)
{
    PerfArgs *a = p;
    const char *why = NULL;
    ncclResult_t r = a->acc ? geoCudaCodecDecodeAccumulate(a->codec, a->chunk, a->len, ncclFloat32,
                                                           a->y, a->n, a->status, a->st, &why)
                            : geoCudaCodecDecode(a->codec, a->chunk, a->len, ncclFloat32, a->y,
                                                 a->n, a->status, a->st, &why);
    if (r != ncclSuccess) {
        fprintf(stderr, "decode failed: %s\n", why);
        exit(2);
    }
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    cudaStream_t st;
} CopyArgs;

static void runCopy(void *p)
{
    CopyArgs *a = p;
    CUDA_OK(cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice, a->st));
}

static void perfLine(const char *name, size_t n, double sec, double moved, double peak,
                     double copyBw)
{
    double in = (double)n * 4 / sec / 1e9, mv = moved / sec / 1e9;
    printf("  %-22s %9.1f us %9.1f %9.1f %7.1f%% %7.1f%%\n", name, sec * 1e6, in, mv,
           peak > 0 ? 100 * mv / peak : 0.0, copyBw > 0 ? 100 * mv / copyBw : 0.0);
}

static void throughput(cudaStream_t st, int *dstatus, size_t n)
{
    int clockKHz = 0, busBits = 0;
    cudaDeviceGetAttribute(&clockKHz, cudaDevAttrMemoryClockRate, 0);
    cudaDeviceGetAttribute(&busBits, cudaDevAttrGlobalMemoryBusWidth, 0);
    cudaGetLastError();
    /* Double data rate: two transfers per memory clock. */
    double peak = 2.0 * clockKHz * 1e3 * busBits / 8 / 1e9;

    float *x = dmalloc(n * 4), *r = dmalloc(n * 4), *y = dmalloc(n * 4);
    float *h = xmalloc(n * 4);
    rngState = 42;
    fillInput(h, n, PAT_RANDOM);
    CUDA_OK(cudaMemcpy(x, h, n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(r, 0, n * 4));
    CUDA_OK(cudaMemset(y, 0, n * 4));
    free(h);
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    int reps = emu ? 1 : 20;

    CopyArgs ca = {y, x, n * 4, st};
    double tc = timeIt(st, e0, e1, reps, runCopy, &ca);
    double copyBw = 2.0 * n * 4 / tc / 1e9;
    printf("  memory bandwidth: theoretical %.0f GB/s (%d MHz x %d bit x 2), "
           "device-to-device cudaMemcpy %.0f GB/s (read + write)\n",
           peak, clockKHz / 1000, busBits, copyBw);
    printf("  %zu float32 elements (%.0f MiB) per call; 'moved' counts the bytes a kernel must\n"
           "  read and write at least (input, residual, chunk, output); %%peak and %%memcpy are\n"
           "  of moved GB/s\n",
           n, n * 4.0 / (1 << 20));
    printf("  %-22s %12s %9s %9s %8s %8s\n", "kernel", "time", "in GB/s", "moved", "%peak",
           "%memcpy");

    for (size_t ci = 0; ci < sizeof gpuCodecs / sizeof gpuCodecs[0]; ci++) {
        PerfArgs a;
        memset(&a, 0, sizeof a);
        a.codec = gpuCodecs[ci];
        a.n = n;
        geoCodecParamsInit(&a.params);
        a.x = x;
        a.r = r;
        a.y = y;
        a.st = st;
        a.status = dstatus;
        a.cap = geoCudaCodecEncodedSize(a.codec, n, ncclFloat32, &a.params);
        a.chunk = dmalloc(a.cap);
        a.sbytes = geoCudaCodecScratchBytes(a.codec, n, &a.params);
        a.scratch = a.sbytes ? dmalloc(a.sbytes) : NULL;
        double chunk = (double)a.cap;
        char name[64];
        snprintf(curCase, sizeof curCase, "throughput %s n=%zu", geoCodecs[a.codec].name, n);
        for (int ef = 0; ef <= 1; ef++) {
            a.ef = ef;
            double t = timeIt(st, e0, e1, reps, runEncode, &a);
            snprintf(name, sizeof name, "%s encode%s", geoCodecs[a.codec].name, ef ? "+EF" : "");
            perfLine(name, n, t, (ef ? 12.0 : 4.0) * n + chunk, peak, copyBw);
        }
        if (a.codec == GEO_CODEC_INT8 || a.codec == GEO_CODEC_INT4) {
            a.params.stochastic = 1;
            a.ef = 1;
            double t = timeIt(st, e0, e1, reps, runEncode, &a);
            snprintf(name, sizeof name, "%s encode+EF+SR", geoCodecs[a.codec].name);
            perfLine(name, n, t, 12.0 * n + chunk, peak, copyBw);
            a.params.stochastic = 0;
        }
        a.ef = 0;
        runEncode(&a);
        for (int acc = 0; acc <= 1; acc++) {
            a.acc = acc;
            double t = timeIt(st, e0, e1, reps, runDecode, &a);
            snprintf(name, sizeof name, "%s decode%s", geoCodecs[a.codec].name, acc ? "Acc" : "");
            perfLine(name, n, t, (acc ? 8.0 : 4.0) * n + chunk, peak, copyBw);
        }
        CUDA_OK(cudaFree(a.chunk));
        if (a.scratch)
            CUDA_OK(cudaFree(a.scratch));
    }
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    CUDA_OK(cudaFree(x));
    CUDA_OK(cudaFree(r));
    CUDA_OK(cudaFree(y));
}

int main(int argc, char **argv)
{
    int perf = 1, check = 1;
    size_t perfElems = (size_t)1 << 26;
#ifdef GEO_CUDA_EMU
    emu = 1;
    quick = 1;
    perfElems = 1 << 14;
#endif
    /* make check passes options this way (tests/device/run.sh: quick). */
    const char *san = getenv("GEOCCL_SANITIZE");
    sanitized = san != NULL && san[0] != '\0';
    const char *envArgs = getenv("GEOCCL_CODEC_CHECK_ARGS");
    if (envArgs && strstr(envArgs, "--quick"))
        quick = 1;
    if (envArgs && strstr(envArgs, "--no-perf"))
        perf = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--no-perf") == 0)
            perf = 0;
        else if (strcmp(argv[i], "--perf-only") == 0)
            check = 0;
        else if (strcmp(argv[i], "--perf-elems") == 0 && i + 1 < argc)
            perfElems = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--topk-big") == 0 && i + 1 < argc)
            topkBig = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: %s [--quick] [--no-perf] [--perf-only] [--perf-elems N] "
                    "[--topk-big N]\n",
                    argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    int probe = gpu_probe("codec_check");
    if (probe != 0)
        return probe;
    CUDA_OK(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    printf("codec_check: %s, sm_%d%d, %d SMs, %.1f GiB, runtime %d, driver %d%s\n", prop.name,
           prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0,
           rt, drv, emu ? " (CPU emulation: correctness only)" : "");

    cudaStream_t st;
    CUDA_OK(cudaStreamCreate(&st));
    int *dstatus = dmalloc(sizeof(int));
    if (check) {
        printf("== GPU vs CPU reference: chunks, residuals, decoders, corrupt chunks\n");
        correctness(st, dstatus);
    }
    if (perf && !emu) {
        printf("== throughput\n");
        throughput(st, dstatus, perfElems);
    }
    CUDA_OK(cudaFree(dstatus));
    CUDA_OK(cudaStreamDestroy(st));
    printf("codec_check: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
