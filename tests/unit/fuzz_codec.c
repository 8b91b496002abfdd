/*
 * Fuzz harness for every codec decoder (compress/codec.h).
 *
 * Two ways to build it:
 *  - libFuzzer: clang -fsanitize=fuzzer,address,undefined -DGEOCCL_LIBFUZZER
 *      -I include -I . -I <build dir with config.h> tests/unit/fuzz_codec.c
 *      compress/codec*.c -lzstd -lm
 *    gives LLVMFuzzerTestOneInput only (libFuzzer brings main).  A corpus
 *    of valid chunks to start from: GEOCCL_FUZZ_SEED_DIR=dir
 *    GEOCCL_FUZZ_SECONDS=0 tests/unit/fuzz_codec writes one file per seed.
 *  - `make check` (any C compiler; the Makefile adds -fsanitize=address,
 *    undefined when GEOCCL_FUZZ_SANITIZE is left as it is): a main() that
 *    runs a mutation loop for GEOCCL_FUZZ_SECONDS (default 10) seconds in
 *    all, seeded with valid chunks of every codec, and mutates them by bit
 *    flips, byte overwrites, truncation, extension, header field edits with
 *    the checksum fixed (so that mutations reach the payload checks) and
 *    random payloads.
 *
 * Every input goes through every decoder, plain and accumulating, into a
 * destination of exactly the expected size followed by a guard.  A decoder
 * must return ncclSuccess or an error (ncclInvalidArgument; ncclInvalidUsage
 * for zstd chunks in a build without zstd), must not write past the
 * destination, and on error must leave the destination untouched; the
 * sanitizers catch out-of-bounds reads.  Anything else aborts.
 */
#include "config.h"
#include "compress/codec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GUARD 64

/* The largest element count the harness decodes into (bounds memory). */
#define FUZZ_MAX_COUNT (1u << 20)

static size_t typeSize(ncclDataType_t t)
{
    static const size_t s[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return (unsigned)t < ncclNumTypes ? s[t] : 0;
}

static void fail(const char *what, int codec, int acc, size_t len, size_t count)
{
    fprintf(stderr, "fuzz_codec: %s (decoder %s%s, chunk of %zu bytes, count %zu)\n", what,
            geoCodecs[codec].name, acc ? " accumulate" : "", len, count);
    abort();
}

static uint64_t resultCount[GEO_CODEC_COUNT][2];

/* Runs every decoder on (data, len) expecting count elements of dtype. */
static void decodeAll(const unsigned char *data, size_t len, size_t count, ncclDataType_t dtype)
{
    size_t s = typeSize(dtype);
    if (s == 0 || count > FUZZ_MAX_COUNT)
        return;
    size_t bytes = count * s;
    unsigned char *dst = malloc(bytes + GUARD), *ref = malloc(bytes + GUARD);
    if (!dst || !ref) {
        free(dst);
        free(ref);
        return;
    }
    for (size_t i = 0; i < bytes + GUARD; i++)
        ref[i] = (unsigned char)(i * 13 + 5);
    for (int id = 0; id < GEO_CODEC_COUNT; id++) {
        for (int acc = 0; acc <= 1; acc++) {
            if (acc && dtype != ncclFloat32)
                continue;
            memcpy(dst, ref, bytes + GUARD);
            const char *why = NULL;
            ncclResult_t r = acc ? geoCodecs[id].decodeAccumulate(data, len, dtype, (float *)dst,
                                                                  count, &why)
                                 : geoCodecs[id].decode(data, len, dtype, dst, count, &why);
            if (r != ncclSuccess && r != ncclInvalidArgument && r != ncclInvalidUsage &&
                r != ncclSystemError)
                fail("unexpected result code", id, acc, len, count);
            if (r != ncclSuccess && memcmp(dst, ref, bytes) != 0)
                fail("failed decode wrote its destination", id, acc, len, count);
            if (r != ncclSuccess && !why)
                fail("failed decode gave no reason", id, acc, len, count);
            if (memcmp(dst + bytes, ref + bytes, GUARD) != 0)
                fail("decode wrote past its destination", id, acc, len, count);
            resultCount[id][r == ncclSuccess]++;
        }
    }
    /* The dispatcher too. */
    memcpy(dst, ref, bytes + GUARD);
    ncclResult_t r = geoCodecDecodeChunk(data, len, dtype, dst, count, 0, NULL);
    if (r != ncclSuccess && memcmp(dst, ref, bytes) != 0)
        fail("failed dispatched decode wrote its destination", 0, 0, len, count);
    if (memcmp(dst + bytes, ref + bytes, GUARD) != 0)
        fail("dispatched decode wrote past its destination", 0, 0, len, count);
    free(dst);
    free(ref);
}

/* The count and dtype an input is decoded with: those its header claims
 * (so that well-formed inputs reach the payload checks), and off-by-one
 * counts. */
static void fuzzInput(const unsigned char *data, size_t len, unsigned salt)
{
    size_t count = 0;
    ncclDataType_t dtype = ncclFloat32;
    if (len >= GEO_CODEC_HEADER_BYTES) {
        uint64_t c;
        memcpy(&c, data + 8, 8);
        count = c <= FUZZ_MAX_COUNT ? (size_t)c : salt % 4096;
        if (typeSize((ncclDataType_t)data[6]))
            dtype = (ncclDataType_t)data[6];
    }
    decodeAll(data, len, count, dtype);
    if (salt % 4 == 0)
        decodeAll(data, len, count + 1, dtype);
    if (salt % 4 == 1 && count > 0)
        decodeAll(data, len, count - 1, dtype);
    if (salt % 4 == 2 && dtype != ncclFloat32)
        decodeAll(data, len, count, ncclFloat32);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* libFuzzer's buffer is exactly size bytes: reads past it are caught. */
    unsigned salt = size > 0 ? data[size - 1] : 0;
    fuzzInput(data, size, salt);
    /* And with the header checksum made valid, so that blind mutations of
     * header fields reach the checks behind it. */
    if (size >= GEO_CODEC_HEADER_BYTES) {
        unsigned char *copy = malloc(size);
        if (copy) {
            memcpy(copy, data, size);
            uint32_t sum = geoCodecChecksum(copy, 28);
            memcpy(copy + 28, &sum, 4);
            fuzzInput(copy, size, salt >> 2);
            free(copy);
        }
    }
    return 0;
}

#ifndef GEOCCL_LIBFUZZER

/* ------------------------------------------------------------------------ */
/* Stand-alone mutation loop                                                */
/* ------------------------------------------------------------------------ */

static uint64_t rng = 0x243F6A8885A308D3ull;

static uint64_t rnd(void)
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct {
    unsigned char *data;
    size_t len;
} seed;

#define MAX_SEEDS 256
static seed seeds[MAX_SEEDS];
static int nseeds;

static void addSeed(geoCodecId id, const void *x, size_t n, ncclDataType_t dt,
                    const geoCodecParams *p)
{
    const geoCodec *c = &geoCodecs[id];
    size_t max = c->maxEncodedSize(n, dt, p);
    if (max == 0 || nseeds == MAX_SEEDS)
        return;
    unsigned char *buf = malloc(max);
    size_t w;
    float *r = (dt == ncclFloat32 && n) ? calloc(n, sizeof(float)) : NULL;
    if (buf && c->encode(x, n, dt, p, 1, r, buf, max, &w) == ncclSuccess) {
        seeds[nseeds].data = buf;
        seeds[nseeds].len = w;
        nseeds++;
    } else {
        free(buf);
    }
    free(r);
}

static void makeSeeds(void)
{
    static const size_t counts[] = {0, 1, 7, 64, 333, 2048};
    size_t maxn = 2048;
    float *x = malloc(maxn * sizeof(double));
    for (int kind = 0; kind < 2; kind++) {
        for (size_t i = 0; i < maxn; i++) /* gradient-like, or compressible */
            x[i] = kind ? (float)(i % 8) : (float)((int64_t)(rnd() % 2001) - 1000) * 1e-4f;
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            size_t n = counts[ci];
            for (int id = 0; id < GEO_CODEC_COUNT; id++) {
                geoCodecParams p = GEO_CODEC_PARAMS_INIT;
                p.blockSize = ci % 2 ? 8 : 256;
                p.stochastic = (int)(ci % 2);
                p.topkFraction = ci % 2 ? 0.5 : 0.01;
                addSeed((geoCodecId)id, x, n, ncclFloat32, &p);
            }
            addSeed(GEO_CODEC_LOSSLESS, x, n / 2, ncclFloat64, NULL);
            addSeed(GEO_CODEC_LOSSLESS, x, n * 2, ncclFloat16, NULL);
            addSeed(GEO_CODEC_NONE, x, n, ncclInt32, NULL);
        }
    }
    free(x);
}

static void fixChecksum(unsigned char *b, size_t len)
{
    if (len >= GEO_CODEC_HEADER_BYTES) {
        uint32_t s = geoCodecChecksum(b, 28);
        memcpy(b + 28, &s, 4);
    }
}

/* Small and boundary values for header fields. */
static uint64_t interesting(uint64_t cur)
{
    static const uint64_t v[] = {0, 1, 7, 8, 9, 255, 256, 257, 65536, 1u << 24, (1u << 24) + 8,
                                 UINT32_MAX, (uint64_t)UINT32_MAX + 1, UINT64_MAX,
                                 UINT64_MAX / 2};
    switch (rnd() % 4) {
    case 0: return cur + 1;
    case 1: return cur - 1;
    case 2: return cur ^ (1ull << (rnd() % 64));
    default: return v[rnd() % (sizeof(v) / sizeof(v[0]))];
    }
}

/* Mutates buf (len bytes, room for cap) in place; returns the new length. */
static size_t mutate(unsigned char *buf, size_t len, size_t cap)
{
    int fixSum = rnd() % 8 != 0;
    int rounds = 1 + (int)(rnd() % 3);
    for (int k = 0; k < rounds; k++) {
        switch (rnd() % 9) {
        case 0: /* bit flip */
            if (len)
                buf[rnd() % len] ^= (unsigned char)(1u << (rnd() % 8));
            break;
        case 1: /* byte overwrite */
            if (len)
                buf[rnd() % len] = (unsigned char)rnd();
            break;
        case 2: /* truncate */
            len = len ? (size_t)(rnd() % len) : 0;
            break;
        case 3: { /* extend */
            size_t add = 1 + (size_t)(rnd() % 64);
            if (len + add > cap)
                add = cap - len;
            for (size_t i = 0; i < add; i++)
                buf[len + i] = (unsigned char)rnd();
            len += add;
            break;
        }
        case 4: case 5: { /* 64-bit header field: count or payload length */
            if (len < GEO_CODEC_HEADER_BYTES)
                break;
            size_t off = (rnd() % 2) ? 8 : 16;
            uint64_t v;
            memcpy(&v, buf + off, 8);
            v = interesting(v);
            memcpy(buf + off, &v, 8);
            break;
        }
        case 6: { /* param (block size / k) */
            if (len < GEO_CODEC_HEADER_BYTES)
                break;
            uint32_t v;
            memcpy(&v, buf + 24, 4);
            v = (uint32_t)interesting(v);
            memcpy(buf + 24, &v, 4);
            break;
        }
        case 7: /* codec, dtype, flags, version */
            if (len >= GEO_CODEC_HEADER_BYTES)
                buf[4 + rnd() % 4] = (unsigned char)(rnd() % 4 ? rnd() % 16 : rnd());
            break;
        default: /* payload run of random bytes, or of one byte */
            if (len > GEO_CODEC_HEADER_BYTES) {
                size_t at = GEO_CODEC_HEADER_BYTES + (size_t)(rnd() % (len - GEO_CODEC_HEADER_BYTES));
                size_t run = 1 + (size_t)(rnd() % 32);
                unsigned char b = (unsigned char)rnd();
                int same = rnd() % 2;
                for (size_t i = at; i < len && i < at + run; i++)
                    buf[i] = same ? b : (unsigned char)rnd();
            }
            break;
        }
    }
    if (fixSum)
        fixChecksum(buf, len);
    return len;
}

int main(void)
{
    const char *env = getenv("GEOCCL_FUZZ_SECONDS");
    double seconds = env ? atof(env) : 10.0;
    makeSeeds();
    /* GEOCCL_FUZZ_SEED_DIR=dir: write the seeds there as a libFuzzer corpus
     * (the header checksum keeps blind mutation from getting far). */
    const char *dir = getenv("GEOCCL_FUZZ_SEED_DIR");
    for (int i = 0; dir && i < nseeds; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/seed-%03d", dir, i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(seeds[i].data, 1, seeds[i].len, f) != seeds[i].len) {
            fprintf(stderr, "fuzz_codec: cannot write %s\n", path);
            if (f)
                fclose(f);
            return 1;
        }
        fclose(f);
    }
    size_t cap = 0;
    for (int i = 0; i < nseeds; i++)
        cap = seeds[i].len > cap ? seeds[i].len : cap;
    cap += 256;
    unsigned char *buf = malloc(cap);
    /* Every seed decodes as it is. */
    for (int i = 0; i < nseeds; i++)
        fuzzInput(seeds[i].data, seeds[i].len, 3);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t iters = 0;
    for (;;) {
        if ((iters & 63) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 >= seconds)
                break;
        }
        seed *s = &seeds[rnd() % (uint64_t)nseeds];
        memcpy(buf, s->data, s->len);
        size_t len = mutate(buf, s->len, cap);
        /* A copy of exactly len bytes, so that reads past the chunk are out
         * of bounds for the address sanitizer. */
        unsigned char *exact = malloc(len ? len : 1);
        memcpy(exact, buf, len);
        fuzzInput(exact, len, (unsigned)rnd());
        free(exact);
        iters++;
    }
    printf("fuzz_codec: %d seeds, %llu mutated inputs in %.1f s; decodes ok/rejected:\n", nseeds,
           (unsigned long long)iters, seconds);
    for (int id = 0; id < GEO_CODEC_COUNT; id++)
        printf("  %-8s %llu / %llu\n", geoCodecs[id].name, (unsigned long long)resultCount[id][1],
               (unsigned long long)resultCount[id][0]);
    for (int i = 0; i < nseeds; i++)
        free(seeds[i].data);
    free(buf);
    return 0;
}

#endif
