/* Compressed hierarchical all-reduce (comm/coll/coll_hier.c with compress/):
 * for every codec on 2 and 3 regions (even and uneven) the result is
 * bit-identical on every rank, within the codec's error, and error feedback
 * makes the running sum of the results converge to the exact running sum;
 * lossy codecs never touch integer or max all-reduces; the statistics count
 * the compressed bytes; residuals belong to registrations, not addresses
 * (geocclCommRegisterErrorFeedback). */
#include "config.h"
#include "geoccl.h"
#include "tests/helpers/harness.h"
#include "nccl.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *labels[8];
    int nranks;
    const char *codec;
    int ef;              /* GEOCCL_EF; -1: unset (each codec's default) */
    const char *hash_out; /* rank 0 writes the hash of all results here */
} cfg;

static float val(int r, size_t i, int step)
{
    unsigned x = (unsigned)(r * 2654435761u + i * 40503u + (unsigned)step * 97u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return ((float)(x % 20001) - 10000.0f) / 1000.0f; /* [-10, 10] */
}

static uint64_t fnv(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= ((const unsigned char *)p)[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* Runs 6 steps of a 40000-float sum; checks identity every step, and that
 * |sum of results - exact sum of inputs| over the steps stays within a
 * codec-dependent bound (error feedback keeps it from growing with steps). */
static int body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    const cfg *c = arg;
    const size_t count = 40000;
    const int steps = 6;
    ncclComm_t comm;
    int bad = 0;
    setenv("GEOCCL_REGION", c->labels[rank], 1);
    setenv("GEOCCL_COMPRESS", c->codec, 1);
    char efs[8];
    snprintf(efs, sizeof(efs), "%d", c->ef);
    if (c->ef < 0)
        unsetenv("GEOCCL_EF");
    else
        setenv("GEOCCL_EF", efs, 1);
    uint64_t run_hash = 0;
    setenv("GEOCCL_DIRECT_MAX", "0", 1);
    setenv("GEOCCL_HIER_SLICE", "64K", 1);
    ncclResetDebugInit();
    if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess)
        return 1;
    float *in = malloc(count * 4), *out = malloc(count * 4);
    void *reg = NULL;
    if (geocclCommRegisterErrorFeedback(comm, out, count * 4, &reg) != ncclSuccess) {
        fprintf(stderr, "rank %d: %s\n", rank, ncclGetLastError(comm));
        bad = 1;
    }
    double *acc = calloc(count, sizeof(double)), *exact = calloc(count, sizeof(double));
    uint64_t *all = malloc(sizeof(uint64_t) * (size_t)nranks);
    for (int s = 0; s < steps && !bad; s++) {
        for (size_t i = 0; i < count; i++)
            in[i] = val(rank, i, s);
        if (ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) {
            fprintf(stderr, "rank %d: %s\n", rank, ncclGetLastError(comm));
            bad = 1;
            break;
        }
        uint64_t h = fnv(out, count * 4);
        run_hash = run_hash * 31 + h;
        ncclAllGather(&h, all, 8, ncclUint8, comm, NULL);
        for (int q = 0; q < nranks; q++)
            if (all[q] != h) {
                fprintf(stderr, "%s: rank %d differs from rank %d at step %d\n", c->codec, q,
                        rank, s);
                bad = 1;
            }
        for (size_t i = 0; i < count; i++) {
            acc[i] += out[i];
            for (int q = 0; q < nranks; q++)
                exact[i] += val(q, i, s);
        }
    }
    /* Mean absolute error of the accumulated sum, relative to its scale. */
    double err = 0, scale = 0;
    for (size_t i = 0; i < count; i++) {
        err += fabs(acc[i] - exact[i]);
        scale += fabs(exact[i]);
    }
    double rel = err / scale;
    double limit = strcmp(c->codec, "none") == 0 || strcmp(c->codec, "lossless") == 0 ? 1e-6
                   : strcmp(c->codec, "fp16") == 0 || strcmp(c->codec, "bf16") == 0   ? 0.01
                   : strcmp(c->codec, "int8") == 0                                       ? 0.02
                   : strncmp(c->codec, "topk", 4) == 0 ? 0.95 /* 5% per step: much still queued */
                                                       : 0.6;
    if (rank == 0 && c->hash_out) {
        FILE *f = fopen(c->hash_out, "w");
        if (f == NULL || fprintf(f, "%016llx\n", (unsigned long long)run_hash) < 0)
            bad = 1;
        if (f)
            fclose(f);
    }
    if (!c->ef)
        limit = 10; /* without feedback only identity is checked */
    else if (c->ef >= 2 && limit < 0.65)
        limit = 0.65; /* one trip of feedback: still better than none (0.66-0.69) */
    if (!(rel <= limit)) {
        fprintf(stderr, "%s (ef %d): accumulated relative error %.4g > %.4g\n", c->codec, c->ef,
                rel, limit);
        bad = 1;
    }
    geocclStats st;
    geocclCommGetStats(comm, &st);
    if (rank == 0)
        printf("  %-9s ef=%d %d ranks: rel. error of the summed results %.2e, WAN %.2fx smaller\n",
               c->codec, c->ef, nranks, rel,
               st.bytesWan ? (double)st.bytesWanRaw / (double)st.bytesWan : 0.0);
    if (strcmp(c->codec, "none") != 0 && strcmp(c->codec, "lossless") != 0 &&
        !(st.bytesWan < st.bytesWanRaw))
        bad = 1;
    fflush(stdout);
    /* Integers and max are never compressed lossily: exact results. */
    int32_t iv[1000], io[1000];
    for (int i = 0; i < 1000; i++)
        iv[i] = rank * 1000 + i;
    ncclAllReduce(iv, io, 1000, ncclInt32, ncclSum, comm, NULL);
    for (int i = 0; i < 1000; i++)
        if (io[i] != nranks * i + 1000 * nranks * (nranks - 1) / 2)
            bad = 1;
    ncclAllReduce(in, out, count, ncclFloat, ncclMax, comm, NULL);
    for (size_t i = 0; i < count && !bad; i++) {
        float m = -INFINITY;
        for (int q = 0; q < nranks; q++)
            m = fmaxf(m, val(q, i, steps - 1));
        if (out[i] != m)
            bad = 1;
    }
    if (reg && geocclCommDeregisterErrorFeedback(comm, reg) != ncclSuccess)
        bad = 1;
    free(in);
    free(out);
    free(acc);
    free(exact);
    free(all);
    ncclCommDestroy(comm);
    return bad;
}

/* One int8 all-reduce of step 0's inputs into out; *h its hash. */
static int reg_call(int rank, ncclComm_t comm, float *in, float *out, size_t count, uint64_t *h)
{
    for (size_t i = 0; i < count; i++)
        in[i] = val(rank, i, 0);
    if (ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) {
        fprintf(stderr, "rank %d: %s\n", rank, ncclGetLastError(comm));
        return 1;
    }
    *h = fnv(out, count * 4);
    return 0;
}

/* The same input all-reduced again and again into the same buffer: with
 * a residual the second result differs from the first; a new registration
 * of the same memory (another tensor placed there) starts from none, so
 * its first result is the very first one again; without a registration no
 * residual is kept (every result the first), unless GEOCCL_EF_KEY=address
 * (arg non-NULL), which keys by address as before.  Bad registrations are
 * refused. */
static int reg_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    const int by_address = arg != NULL;
    const size_t count = 40000;
    ncclComm_t comm;
    int bad = 0;
    (void)nranks;
    setenv("GEOCCL_REGION", rank < 2 ? "a" : "b", 1);
    setenv("GEOCCL_COMPRESS", "int8", 1);
    unsetenv("GEOCCL_EF");
    setenv("GEOCCL_DIRECT_MAX", "0", 1);
    if (by_address)
        setenv("GEOCCL_EF_KEY", "address", 1);
    else
        unsetenv("GEOCCL_EF_KEY");
    ncclResetDebugInit();
    if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess)
        return 1;
    float *in = malloc(count * 4), *out = malloc(count * 4);
    uint64_t h0 = 0, h1 = 0, h2 = 0, u1 = 0, u2 = 0;
    void *reg = NULL, *reg2 = NULL, *other = NULL;
    if (by_address) {
        bad |= reg_call(rank, comm, in, out, count, &u1);
        bad |= reg_call(rank, comm, in, out, count, &u2);
        if (!bad && u1 == u2) {
            fprintf(stderr, "rank %d: GEOCCL_EF_KEY=address: no residual was used\n", rank);
            bad = 1;
        }
        goto done;
    }
    if (geocclCommRegisterErrorFeedback(comm, out, count * 4, &reg) != ncclSuccess)
        bad = 1;
    bad |= reg_call(rank, comm, in, out, count, &h0);
    bad |= reg_call(rank, comm, in, out, count, &h1);
    if (!bad && h0 == h1) {
        fprintf(stderr, "rank %d: a registered buffer's second call used no residual\n", rank);
        bad = 1;
    }
    /* refused: an overlap, a foreign handle, twice the same */
    if (geocclCommRegisterErrorFeedback(comm, out + 10, 40, &other) != ncclInvalidArgument ||
        geocclCommRegisterErrorFeedback(comm, out, 0, &other) != ncclInvalidArgument ||
        geocclCommDeregisterErrorFeedback(comm, (void *)in) != ncclInvalidArgument) {
        fprintf(stderr, "rank %d: a bad registration was accepted\n", rank);
        bad = 1;
    }
    if (geocclCommDeregisterErrorFeedback(comm, reg) != ncclSuccess ||
        geocclCommDeregisterErrorFeedback(comm, reg) != ncclInvalidArgument)
        bad = 1;
    /* the same memory registered again: another tensor's, no residual */
    if (geocclCommRegisterErrorFeedback(comm, out, count * 4, &reg2) != ncclSuccess)
        bad = 1;
    bad |= reg_call(rank, comm, in, out, count, &h2);
    if (!bad && h2 != h0) {
        fprintf(stderr, "rank %d: a new registration of the same memory picked up the old "
                "residual\n", rank);
        bad = 1;
    }
    if (geocclCommDeregisterErrorFeedback(comm, reg2) != ncclSuccess)
        bad = 1;
    /* unregistered: no residual kept */
    bad |= reg_call(rank, comm, in, out, count, &u1);
    bad |= reg_call(rank, comm, in, out, count, &u2);
    if (!bad && (u1 != h0 || u2 != h0)) {
        fprintf(stderr, "rank %d: an unregistered buffer kept a residual\n", rank);
        bad = 1;
    }
done:
    if (rank == 0 && !bad)
        printf("  int8 %s: residuals %s\n", by_address ? "GEOCCL_EF_KEY=address" : "registered",
               by_address ? "kept by address" : "follow registrations, not addresses");
    free(in);
    free(out);
    ncclCommDestroy(comm);
    return bad;
}

static void test_ef_registrations(void)
{
    CU_ASSERT_EQUAL(harness_run_noinit(4, reg_body, NULL, 120), 0);
    CU_ASSERT_EQUAL(harness_run_noinit(4, reg_body, (void *)1, 120), 0);
}

static void run_codecs(const char **labels, int nranks)
{
    const char *codecs[] = {"none", "lossless", "fp16", "bf16", "int8", "int4", "sign", "topk:0.05"};
    for (size_t k = 0; k < sizeof(codecs) / sizeof(codecs[0]); k++) {
        cfg c = {.nranks = nranks, .codec = codecs[k], .ef = 1};
        memcpy(c.labels, labels, sizeof(c.labels));
        CU_ASSERT_EQUAL(harness_run_noinit(nranks, body, &c, 120), 0);
    }
    /* without feedback, and with it on one trip only (GEOCCL_EF=2, 3) */
    for (int ef = 0; ef <= 3; ef += (ef == 0 ? 2 : 1)) {
        cfg c = {.nranks = nranks, .codec = "sign", .ef = ef};
        memcpy(c.labels, labels, sizeof(c.labels));
        CU_ASSERT_EQUAL(harness_run_noinit(nranks, body, &c, 120), 0);
    }
}

static uint64_t run_hash_of(const char **labels, int nranks, const char *codec, int ef)
{
    char path[] = "/tmp/geoccl-efhash-XXXXXX";
    int fd = mkstemp(path);
    unsigned long long h = 0;
    if (fd < 0)
        return 0;
    close(fd);
    cfg c = {.nranks = nranks, .codec = codec, .ef = ef, .hash_out = path};
    memcpy(c.labels, labels, sizeof(c.labels));
    CU_ASSERT_EQUAL(harness_run_noinit(nranks, body, &c, 120), 0);
    FILE *f = fopen(path, "r");
    if (f == NULL || fscanf(f, "%llx", &h) != 1)
        h = 0;
    if (f)
        fclose(f);
    unlink(path);
    return h;
}

/* GEOCCL_EF unset: sign keeps its residual on the first trip only (the
 * same bits as GEOCCL_EF=3), the other codecs on both (as GEOCCL_EF=1). */
static void test_ef_defaults(void)
{
    const char *l[8] = {"a", "a", "b", "b"};
    uint64_t sign_default = run_hash_of(l, 4, "sign", -1);
    uint64_t sign_first = run_hash_of(l, 4, "sign", 3);
    uint64_t sign_both = run_hash_of(l, 4, "sign", 1);
    uint64_t int8_default = run_hash_of(l, 4, "int8", -1);
    uint64_t int8_both = run_hash_of(l, 4, "int8", 1);
    uint64_t int8_first = run_hash_of(l, 4, "int8", 3);
    CU_ASSERT(sign_default != 0 && int8_default != 0);
    CU_ASSERT_EQUAL(sign_default, sign_first);
    CU_ASSERT_NOT_EQUAL(sign_default, sign_both);
    CU_ASSERT_EQUAL(int8_default, int8_both);
    CU_ASSERT_NOT_EQUAL(int8_default, int8_first);
}

static void test_2x2(void)
{
    const char *l[8] = {"a", "a", "b", "b"};
    run_codecs(l, 4);
}

static void test_3_uneven(void)
{
    const char *l[8] = {"a", "a", "b", "c", "c", "c"};
    run_codecs(l, 6);
}

static void test_bad_spec(void)
{
    /* geocclCommSetCompression refuses what is not a codec. */
    ncclComm_t comm;
    CU_ASSERT_EQUAL_FATAL(ncclCommInitAll(&comm, 1, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(geocclCommSetCompression(comm, "zip"), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geocclCommSetCompression(comm, "topk:2"), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geocclCommSetCompression(comm, "int8"), ncclSuccess);
    const char *name = NULL;
    CU_ASSERT_EQUAL(geocclCommGetCompression(comm, &name), ncclSuccess);
    CU_ASSERT_STRING_EQUAL(name, "int8");
    CU_ASSERT_EQUAL(geocclCommResetErrorFeedback(comm), ncclSuccess);
    /* auto: the plan chooses among the codecs listed (or the exact ones). */
    CU_ASSERT_EQUAL(geocclCommSetCompression(comm, "auto:int8,zip"), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geocclCommSetCompression(comm, "auto:int8,topk:0.01"), ncclSuccess);
    CU_ASSERT_EQUAL(geocclCommGetCompression(comm, &name), ncclSuccess);
    CU_ASSERT_STRING_EQUAL(name, "auto");
    CU_ASSERT_EQUAL(geocclCommSetCompression(comm, "auto"), ncclSuccess);
    CU_ASSERT_EQUAL(geocclCommSetCompression(comm, "none"), ncclSuccess);
    CU_ASSERT_EQUAL(geocclCommGetCompression(comm, &name), ncclSuccess);
    CU_ASSERT_STRING_EQUAL(name, "none");
    ncclCommDestroy(comm);
}

int main(void)
{
    harness_setup_env();
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("compressed hierarchical all-reduce", NULL, NULL);
    CU_add_test(s, "every codec, 2 regions x 2", test_2x2);
    CU_add_test(s, "every codec, regions of 2, 1, 3", test_3_uneven);
    CU_add_test(s, "geocclCommSetCompression", test_bad_spec);
    CU_add_test(s, "error feedback defaults per codec", test_ef_defaults);
    CU_add_test(s, "residuals follow registrations", test_ef_registrations);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
