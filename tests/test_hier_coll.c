/* Hierarchical all-gather and reduce-scatter (comm/coll/coll_hier.c) on region
 * layouts of even and uneven sizes: exact results for every data type and
 * op, in and out of place, and the WAN bytes each region sends are the
 * minimum (each block crosses into every other region once).  And the
 * inter-region step alone (geoHierExchange), as the device path runs it
 * after NVIDIA's reduce-scatter: shards cut as geoSegPadded. */
#include "config.h"
#include "comm/coll/coll.h"
#include "comm/core/comm.h"
#include "comm/coll/reduce.h"
#include "geoccl.h"
#include "tests/helpers/harness.h"
#include "nccl.h"

#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *labels[8];
} layout;

static int body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    const layout *l = arg;
    ncclComm_t comm;
    int bad = 0;
    setenv("GEOCCL_REGION", l->labels[rank], 1);
    if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess)
        return 1;
    const size_t counts[] = {1, 3, 1000, 65537};
    for (size_t ci = 0; ci < 4 && !bad; ci++) {
        size_t n = counts[ci];
        for (int t = 0; t < ncclNumTypes && !bad; t++) {
            size_t es = harness_type_size((ncclDataType_t)t);
            for (int op = 0; op < ncclNumOps && !bad; op++) {
                if (ci == 3 && !(t == ncclFloat32 && op == ncclSum))
                    continue; /* big count: one case keeps the time down */
                for (int inplace = 0; inplace < 2 && !bad; inplace++) {
                    /* reduce-scatter: input N*n, output n */
                    char *in = malloc(es * n * (size_t)nranks), *out = malloc(es * n);
                    char *want = malloc(es * n);
                    char *all = malloc(es * n * (size_t)nranks);
                    for (int r = 0; r < nranks; r++) {
                        /* rank r's input block b holds values for block b */
                        if (r == rank)
                            for (int b = 0; b < nranks; b++)
                                harness_fill_input(in + (size_t)b * n * es, (ncclDataType_t)t,
                                                   (ncclRedOp_t)op, nranks, rank, (size_t)b * n, n,
                                                   (uint32_t)(ci * 131 + t * 7 + op));
                    }
                    harness_fill_expected(want, (ncclDataType_t)t, (ncclRedOp_t)op, nranks,
                                          (size_t)rank * n, n, (uint32_t)(ci * 131 + t * 7 + op));
                    char *dst = inplace ? in + (size_t)rank * n * es : out;
                    char msg[256];
                    if (ncclReduceScatter(in, dst, n, (ncclDataType_t)t, (ncclRedOp_t)op, comm,
                                          NULL) != ncclSuccess ||
                        harness_check(dst, want, (ncclDataType_t)t, (ncclRedOp_t)op, nranks, n,
                                      msg, sizeof(msg)) != 0) {
                        fprintf(stderr, "rank %d: reduce-scatter %s %s n=%zu%s: %s\n", rank,
                                harness_type_name((ncclDataType_t)t),
                                harness_op_name((ncclRedOp_t)op), n, inplace ? " in place" : "",
                                msg);
                        bad = 1;
                    }
                    /* all-gather of each rank's rank-specific block */
                    if (op == 0 && !bad) {
                        harness_fill_bytes(all + (size_t)rank * n * es, n * es, (uint32_t)rank + 1,
                                           0);
                        char *src = inplace ? all + (size_t)rank * n * es : out;
                        if (!inplace)
                            memcpy(out, all + (size_t)rank * n * es, n * es);
                        if (ncclAllGather(src, all, n, (ncclDataType_t)t, comm, NULL) !=
                            ncclSuccess)
                            bad = 1;
                        for (int r = 0; r < nranks && !bad; r++) {
                            char *exp = malloc(n * es);
                            harness_fill_bytes(exp, n * es, (uint32_t)r + 1, 0);
                            if (memcmp(exp, all + (size_t)r * n * es, n * es) != 0) {
                                fprintf(stderr, "rank %d: all-gather block %d wrong (%s n=%zu)\n",
                                        rank, r, harness_type_name((ncclDataType_t)t), n);
                                bad = 1;
                            }
                            free(exp);
                        }
                    }
                    free(in);
                    free(out);
                    free(want);
                    free(all);
                }
            }
        }
    }
    /* WAN bytes of one float all-gather and reduce-scatter of 4096
     * elements per rank: each rank sends its block to the k-1 other
     * regions (all-gather) and each region sends its share of the other
     * regions' blocks once (reduce-scatter). */
    int nreg = 0, region = 0, lsize = 0;
    geocclCommGetRegion(comm, &nreg, &region, NULL, &lsize, NULL);
    float *buf = calloc(4096 * (size_t)nranks, sizeof(float));
    geocclStats a, b;
    geocclCommResetStats(comm);
    ncclAllGather(buf + (size_t)rank * 4096, buf, 4096, ncclFloat, comm, NULL);
    geocclCommGetStats(comm, &a);
    if (a.bytesWan != (unsigned long long)(nreg - 1) * 4096 * 4) {
        fprintf(stderr, "rank %d: all-gather sent %llu WAN bytes, not %d\n", rank, a.bytesWan,
                (nreg - 1) * 4096 * 4);
        bad = 1;
    }
    geocclCommResetStats(comm);
    ncclReduceScatter(buf, buf, 4096, ncclFloat, ncclSum, comm, NULL);
    geocclCommGetStats(comm, &b);
    unsigned long long total = 0, mine = b.bytesWan;
    /* per region: (N - size) blocks leave it */
    unsigned long long *sums = calloc((size_t)nranks, sizeof(*sums));
    int *regs = calloc((size_t)nranks, sizeof(int));
    ncclAllGather(&mine, sums, 8, ncclUint8, comm, NULL);
    ncclAllGather(&region, regs, sizeof(int), ncclUint8, comm, NULL);
    for (int r = 0; r < nranks; r++)
        if (regs[r] == region)
            total += sums[r];
    if (total != (unsigned long long)(nranks - lsize) * 4096 * 4) {
        fprintf(stderr, "rank %d: region %d sent %llu WAN bytes in reduce-scatter, not %d\n",
                rank, region, total, (nranks - lsize) * 4096 * 4);
        bad = 1;
    }
    free(sums);
    free(regs);
    free(buf);
    ncclCommDestroy(comm);
    return bad;
}

/* geoHierExchange after a reduce-scatter done "by hand": every rank builds
 * its region's partial of its padded shard from the inputs of its region's
 * ranks, exchanges, and must hold the full reduction of its shard. */
static int exchange_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    const layout *l = arg;
    ncclComm_t comm;
    int bad = 0;
    setenv("GEOCCL_REGION", l->labels[rank], 1);
    if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess)
        return 1;
    const topoRegionMap *m = &comm->regions;
    const int g = m->region_of[rank], n = m->size[g], me = m->local_rank[rank];
    const size_t counts[] = {1, 3, 7, 1000, 65537};
    const struct { ncclDataType_t t; ncclRedOp_t op; } cases[] = {
        {ncclFloat32, ncclSum}, {ncclInt32, ncclMax}, {ncclFloat16, ncclSum},
        {ncclFloat64, ncclAvg}, {ncclInt64, ncclProd}, {ncclUint8, ncclMin},
    };
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]) && !bad; ci++)
        for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]) && !bad; k++) {
            ncclDataType_t t = cases[k].t;
            ncclRedOp_t op = cases[k].op;
            size_t es = harness_type_size(t), cnt = counts[ci], off, len;
            uint32_t seed = (uint32_t)(ci * 17 + k);
            geoSegPadded(cnt, n, me, &off, &len);
            char *part = malloc(len * es + 1), *tmp = malloc(len * es + 1);
            char *want = malloc(len * es + 1);
            char key[1];
            for (int i = 0; i < n; i++) {
                char *dst = i == 0 ? part : tmp;
                harness_fill_input(dst, t, op, nranks, m->members[g][i], off, len, seed);
                if (i > 0)
                    geoReduce(part, part, tmp, len, t, op);
            }
            harness_fill_expected(want, t, op, nranks, off, len, seed);
            geoOp o = {.type = GEO_OP_ALLREDUCE, .comm = comm, .sendbuff = key, .recvbuff = key,
                       .count = cnt, .dt = t, .op = op};
            char msg[256] = "";
            ncclResult_t r = geoHierExchange(comm, &o, part, off);
            if (r != ncclSuccess ||
                (len > 0 && harness_check(part, want, t, op, nranks, len, msg, sizeof(msg)))) {
                fprintf(stderr, "rank %d: exchange %s %s count %zu shard [%zu, +%zu): %s %s\n",
                        rank, harness_type_name(t), harness_op_name(op), cnt, off, len,
                        ncclGetErrorString(r), msg);
                bad = 1;
            }
            free(part);
            free(tmp);
            free(want);
        }
    ncclCommDestroy(comm);
    return bad;
}

static void run_exchange(const char *l0, const char *l1, const char *l2, const char *l3,
                         const char *l4, int n)
{
    layout l = {{l0, l1, l2, l3, l4}};
    CU_ASSERT_EQUAL(harness_run_noinit(n, exchange_body, &l, 120), 0);
}

static void test_exchange_2x2(void) { run_exchange("a", "a", "b", "b", NULL, 4); }
static void test_exchange_3_1(void) { run_exchange("a", "a", "a", "b", NULL, 4); }
static void test_exchange_1x3(void) { run_exchange("a", "b", "c", NULL, NULL, 3); }
static void test_exchange_interleaved(void) { run_exchange("a", "b", "a", "c", "b", 5); }

static void run(const char *l0, const char *l1, const char *l2, const char *l3, const char *l4,
                int n)
{
    layout l = {{l0, l1, l2, l3, l4}};
    CU_ASSERT_EQUAL(harness_run_noinit(n, body, &l, 180), 0);
}

static void test_2x2(void) { run("a", "a", "b", "b", NULL, 4); }
static void test_3_1(void) { run("a", "a", "a", "b", NULL, 4); }
static void test_interleaved(void) { run("a", "b", "a", "c", "b", 5); }

int main(void)
{
    harness_setup_env();
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("hierarchical all-gather and reduce-scatter", NULL, NULL);
    CU_add_test(s, "2 regions x 2", test_2x2);
    CU_add_test(s, "3 + 1", test_3_1);
    CU_add_test(s, "interleaved 2 + 2 + 1", test_interleaved);
    CU_add_test(s, "device-path exchange, 2 regions x 2", test_exchange_2x2);
    CU_add_test(s, "device-path exchange, 3 + 1", test_exchange_3_1);
    CU_add_test(s, "device-path exchange, 3 regions of 1", test_exchange_1x3);
    CU_add_test(s, "device-path exchange, interleaved 2 + 2 + 1", test_exchange_interleaved);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
