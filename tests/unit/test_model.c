/*
 * The cost model, the plan and --simulate (topology/model.h), called
 * directly.
 *
 * Calibration against measured all-reduce times (the model's target:
 * within 25% at 1 MiB and above, checked where the links are the limit,
 * printed everywhere); the shape of predictions (monotone, hier
 * below flat on a slow WAN, close to the link bound at 64 MiB); the plan
 * (one region, forced choices, allowed codecs, ranges without gaps,
 * lookup); building a model from a topology file; topoSimulate on the
 * example files.
 */
#define _GNU_SOURCE
#include "config.h"
#include "topology/model.h"
#include "topology/topofile.h"
#include "topology/wan_tuning.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)

/* R regions x P ranks, each region's egress at `rate` ("100mbit"), 25 ms
 * one way, intra as examples/topo/3x2-100mbit.topo: the emulated WAN of
 * BENCHMARKS.md, built through the topology file like --simulate does. */
static void emulated(topoModel *m, int R, int P, const char *rate)
{
    char text[1024], err[256] = "";
    size_t n = 0;
    for (int q = 0; q < R; q++)
        n += (size_t)snprintf(text + n, sizeof(text) - n,
                              "region r%d bw=%s delay=25 ranks=%d\n", q, rate, P);
    snprintf(text + n, sizeof(text) - n, "intra bw=140M delay=0.2\n");
    topoFile tf;
    CU_ASSERT_EQUAL_FATAL(topoFileParse(text, "emu", &tf, err, sizeof(err)), 0);
    int rc = topoModelFromFile(&tf, m, err, sizeof(err));
    topoFileFree(&tf);
    if (rc != 0)
        fprintf(stderr, "\n    %s", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
}

static const topoCodecCost *codec_named(const char *name)
{
    for (int i = 0; i < topoDefaultNCodecs; i++)
        if (strcmp(topoDefaultCodecCosts[i].name, name) == 0)
            return &topoDefaultCodecCosts[i];
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Calibration                                                              */
/* ------------------------------------------------------------------------ */

/* The model was fitted to these: the first full run of
 * tests/perf/bench_wan.sh (2026-11-29, build 5ad226f, the 2-core VM;
 * BENCHMARKS.md as of commit dc44b80 has its tables). GeoCCL hier and
 * flat, seconds per call; 0 where the run has no figure.  Its 1 Gbit/s rows
 * measured the emulator (the delay lines then wanted more than the 2 cores),
 * so they are printed, not checked.  The current page's 100 Mbit/s figures
 * are within 3% of these at 64 and 256 MiB and 10-20% faster at 1-4 MiB. */
static const struct {
    int R, P;
    const char *rate;
    int link_bound; /* that run's verdict: the links, not the CPUs, set the time */
    size_t mib;
    double hier, flat;
} rows[] = {
    {3, 2, "100mbit", 1, 1, 0.197, 0.272},   {3, 2, "100mbit", 1, 4, 0.574, 0.705},
    {3, 2, "100mbit", 1, 16, 2.097, 2.868},  {3, 2, "100mbit", 1, 64, 7.741, 9.807},
    {3, 2, "100mbit", 1, 256, 30.840, 0},    {3, 2, "1gbit", 0, 1, 0.134, 0.204},
    {3, 2, "1gbit", 0, 4, 0.133, 0.207},     {3, 2, "1gbit", 0, 16, 0.325, 0.369},
    {3, 2, "1gbit", 0, 64, 1.723, 1.516},    {3, 2, "1gbit", 0, 256, 7.410, 6.182},
    {2, 4, "100mbit", 1, 1, 0.143, 0.177},   {2, 4, "100mbit", 1, 4, 0.425, 0.649},
    {2, 4, "100mbit", 1, 16, 1.469, 2.730},  {2, 4, "100mbit", 1, 64, 5.821, 10.095},
    {2, 4, "100mbit", 1, 256, 23.011, 0},    {2, 4, "1gbit", 0, 1, 0.121, 0.127},
    {2, 4, "1gbit", 0, 4, 0.119, 0.153},     {2, 4, "1gbit", 0, 16, 0.363, 0.417},
    {2, 4, "1gbit", 0, 64, 0.890, 1.517},    {2, 4, "1gbit", 0, 256, 4.304, 7.051},
};

/* The codecs in the same conditions (3x2, 100 Mbit/s, 64 MiB, hier; the
 * first run of tests/perf/bench_codecs.sh, 2026-11-29, build 59b02b4, in
 * BENCHMARKS.md as of commit dc44b80). */
static const struct {
    const char *codec;
    double ratio; /* 0: the default table's; else what that input gave */
    double sec;
} codec_rows[] = {
    {"none", 0, 7.905}, {"fp16", 0, 4.976}, {"bf16", 0, 3.975}, {"int8", 0, 2.126},
    {"int4", 0, 1.289}, {"sign", 0, 0.930}, {"topk:0.01", 0, 0.845},
    {"lossless", 1.19, 6.572}, /* Gaussian input: 1.19 measured */
};

static int within(double pred, double meas, double tol)
{
    return pred >= meas * (1 - tol) && pred <= meas * (1 + tol);
}

static void test_calibration(void)
{
    fprintf(stderr, "\n    predicted / measured (all-reduce):");
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        topoModel m;
        emulated(&m, rows[i].R, rows[i].P, rows[i].rate);
        size_t b = rows[i].mib * MiB;
        double h = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, b, 0, 0);
        double f = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_FLAT, NULL, b, 0, 0);
        fprintf(stderr, "\n    %dx%d %-7s %4zu MiB  hier %.2f", rows[i].R, rows[i].P,
                rows[i].rate, rows[i].mib, h / rows[i].hier);
        if (rows[i].flat > 0)
            fprintf(stderr, "  flat %.2f", f / rows[i].flat);
        if (!rows[i].link_bound)
            continue;
        if (!within(h, rows[i].hier, 0.25)) {
            fprintf(stderr, " <- hier %.3f s predicted, %.3f measured", h, rows[i].hier);
            CU_FAIL("hierarchical all-reduce prediction more than 25% off a link-bound row");
        }
        if (rows[i].flat > 0 && !within(f, rows[i].flat, 0.25)) {
            fprintf(stderr, " <- flat %.3f s predicted, %.3f measured", f, rows[i].flat);
            CU_FAIL("flat all-reduce prediction more than 25% off a link-bound row");
        }
    }
    topoModel m;
    emulated(&m, 3, 2, "100mbit");
    for (size_t i = 0; i < sizeof(codec_rows) / sizeof(codec_rows[0]); i++) {
        const topoCodecCost *c0 = codec_named(codec_rows[i].codec);
        CU_ASSERT_PTR_NOT_NULL_FATAL(c0);
        topoCodecCost c = *c0;
        if (codec_rows[i].ratio > 0)
            c.ratio = codec_rows[i].ratio;
        double t = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, &c, 64 * MiB, 0, 0);
        fprintf(stderr, "\n    3x2 100mbit 64 MiB hier %-9s %.2f", c.name,
                t / codec_rows[i].sec);
        /* the codecs whose time the link sets: within 25% */
        if (c.ratio <= 4 && !within(t, codec_rows[i].sec, 0.25))
            CU_FAIL("prediction with a codec more than 25% off");
    }
}

/* ------------------------------------------------------------------------ */
/* Shape of the predictions                                                 */
/* ------------------------------------------------------------------------ */

static void test_monotone(void)
{
    topoModel ms[3];
    emulated(&ms[0], 3, 2, "100mbit");
    emulated(&ms[1], 2, 4, "1gbit");
    emulated(&ms[2], 4, 16, "10gbit");
    for (int k = 0; k < 3; k++)
        for (int coll = 0; coll < TOPO_COLL_COUNT; coll++)
            for (int algo = 0; algo < TOPO_ALGO_COUNT; algo++)
                for (int c = -1; c < topoDefaultNCodecs; c++) {
                    const topoCodecCost *cc = c < 0 ? NULL : &topoDefaultCodecCosts[c];
                    double prev = 0;
                    for (size_t b = 1; b <= ((size_t)4 << 30); b = b * 3 / 2 + 1) {
                        double t = topoPredict(&ms[k], coll, algo, cc, b, 0, 0);
                        if (!(t >= prev)) {
                            fprintf(stderr, "\n    model %d %s %s %s: %zu bytes %.6g s < %.6g",
                                    k, topoCollName(coll), topoAlgoName(algo),
                                    cc ? cc->name : "-", b, t, prev);
                            CU_FAIL("prediction not monotone in bytes");
                            break;
                        }
                        prev = t;
                    }
                }
}

static void test_hier_beats_flat_on_slow_wan(void)
{
    topoModel m;
    emulated(&m, 3, 2, "100mbit");
    for (size_t b = MiB; b <= ((size_t)4 << 30); b *= 2) {
        double h = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, b, 0, 0);
        double f = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_FLAT, NULL, b, 0, 0);
        if (!(h < f)) {
            fprintf(stderr, "\n    %zu bytes: hier %.4g s, flat %.4g s", b, h, f);
            CU_FAIL("hier not faster than flat on 3x2 at 100 Mbit/s");
        }
    }
}

/* 64 MiB at 100 Mbit/s: within 1.10x of every region's egress bound
 * 2(R-1)/R x bytes / rate, and never below it. */
static void test_hier_near_bound(void)
{
    static const int shapes[][2] = {{3, 2}, {2, 4}, {4, 8}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        topoModel m;
        int R = shapes[i][0];
        emulated(&m, R, shapes[i][1], "100mbit");
        double bound = 2.0 * (R - 1) / R * (double)(64 * MiB) / 12.5e6;
        double t = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, 0, 0);
        CU_ASSERT(t >= bound);
        if (!(t <= 1.10 * bound)) {
            fprintf(stderr, "\n    %dx%d: %.3f s against bound %.3f s", R, shapes[i][1], t,
                    bound);
            CU_FAIL("hier at 64 MiB above 1.10x the link bound");
        }
    }
}

/* The loss term: a loss-driven control at 1% on 50 ms holds
 * 2 x 2.8 Mbit/s per pair where the hierarchical all-reduce needs
 * 25 Mbit/s (3x2 at 100 Mbit/s): the prediction grows by that ratio; BBR
 * on the same loss, or no loss, predicts the link. */
static void test_loss_term(void)
{
    topoModel m;
    emulated(&m, 3, 2, "100mbit");
    double clean = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, 0, 0);
    for (int q = 0; q < 3; q++)
        m.loss[q] = 0.01;
    double bbr = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, 0, 0);
    CU_ASSERT_DOUBLE_EQUAL(bbr, clean, 1e-9);
    for (int q = 0; q < 3; q++)
        m.loss_driven[q] = 1;
    double cubic = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, 0, 0);
    /* per stream 1448 / 0.05 * sqrt(150) = 355 kB/s; a region's 2 ranks x 2 peers x 2 streams */
    double rate = 8 * 1448 / 0.05 * sqrt(150), bound = 4.0 / 3 * 64 * MiB / rate;
    CU_ASSERT(cubic > 3 * clean);
    CU_ASSERT(cubic >= bound && cubic < 1.2 * bound);
    m.loss[0] = 1.5; /* not a share */
    CU_ASSERT(topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, 0, 0) < 0);
}

static void test_compression_and_streams(void)
{
    topoModel m;
    emulated(&m, 3, 2, "100mbit");
    const topoCodecCost *int8 = codec_named("int8");
    double none = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, 0, 0);
    double q = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, int8, 64 * MiB, 0, 0);
    CU_ASSERT(q < none / 3);
    /* flat ignores codecs: the library compresses only the hierarchical path */
    CU_ASSERT_DOUBLE_EQUAL(topoPredict(&m, 0, TOPO_ALGO_FLAT, int8, 64 * MiB, 0, 0),
                           topoPredict(&m, 0, TOPO_ALGO_FLAT, NULL, 64 * MiB, 0, 0), 1e-12);
    /* a stream cap makes streams count */
    m.stream_Bps = 2e6;
    double one = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_FLAT, NULL, 64 * MiB, 0, 1);
    double eight = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_FLAT, NULL, 64 * MiB, 0, 8);
    CU_ASSERT(eight < one / 4);
    /* invalid arguments */
    CU_ASSERT(topoPredict(&m, TOPO_COLL_COUNT, 0, NULL, 1, 0, 0) < 0);
    CU_ASSERT(topoPredict(&m, 0, 2, NULL, 1, 0, 0) < 0);
    CU_ASSERT(topoPredict(NULL, 0, 0, NULL, 1, 0, 0) < 0);
    m.ranks[1] = 0;
    CU_ASSERT(topoPredict(&m, 0, 0, NULL, 1, 0, 0) < 0);
}

/* ------------------------------------------------------------------------ */
/* Plan                                                                     */
/* ------------------------------------------------------------------------ */

/* Ranges start at 0, follow each other without gap or overlap, end at
 * SIZE_MAX; lookup finds the entry that holds a size. */
static void check_ranges(const topoPlan *p)
{
    for (int coll = 0; coll < TOPO_COLL_COUNT; coll++) {
        int n = p->nentries[coll];
        CU_ASSERT_FATAL(n >= 1 && n <= TOPO_PLAN_BUCKETS);
        CU_ASSERT_EQUAL(p->entries[coll][0].lo, 0);
        CU_ASSERT_EQUAL(p->entries[coll][n - 1].hi, SIZE_MAX);
        for (int i = 0; i < n; i++) {
            const topoPlanEntry *e = &p->entries[coll][i];
            CU_ASSERT(e->lo <= e->hi);
            if (i > 0 && e->lo != p->entries[coll][i - 1].hi + 1)
                CU_FAIL("gap or overlap between plan ranges");
            if (i > 0 && e->algo == p->entries[coll][i - 1].algo &&
                e->codec == p->entries[coll][i - 1].codec &&
                e->chunk == p->entries[coll][i - 1].chunk &&
                e->nstreams == p->entries[coll][i - 1].nstreams &&
                e->by_region == p->entries[coll][i - 1].by_region &&
                memcmp(e->region_codec, p->entries[coll][i - 1].region_codec,
                       (size_t)p->nregions) == 0)
                CU_FAIL("neighbouring ranges with the same choice not merged");
            CU_ASSERT(e->sec_lo >= 0 && e->sec_top >= e->sec_lo);
            CU_ASSERT(topoPlanLookup(p, coll, e->lo) == e);
            CU_ASSERT(topoPlanLookup(p, coll, e->hi) == e);
        }
        static const size_t probes[] = {0, 1, 1000, 1024, 1025, 5000, 1 << 20, 3 << 20,
                                        (size_t)5 << 30, SIZE_MAX};
        for (size_t k = 0; k < sizeof(probes) / sizeof(probes[0]); k++) {
            const topoPlanEntry *e = topoPlanLookup(p, coll, probes[k]);
            CU_ASSERT(e != NULL && e->lo <= probes[k] && probes[k] <= e->hi);
        }
    }
    CU_ASSERT_PTR_NULL(topoPlanLookup(p, -1, 1));
    CU_ASSERT_PTR_NULL(topoPlanLookup(p, TOPO_COLL_COUNT, 1));
}

static const unsigned ALL_CODECS = 0xFFu;

/* 2 regions x 4 ranks on one 2-core host at 1 Gbit/s (cpu_share 4), with
 * the intra-region figures the probe measured there with every pair of
 * local ranks busy (405 MB/s per rank, 93 us: what geoccl-probe measured on
 * that emulated WAN under tests/perf/bench_plan.sh).
 * Scaled by the CPU share a second time, that figure made the hierarchical
 * all-reduce look slower than the ring from 8 MiB, and the plan took the
 * ring, which measured 1.01 s at 64 MiB against hier's 0.62-0.68 s; taken
 * as measured (intra_shared), hier is faster and near its measured time. */
static void test_intra_shared_not_scaled_twice(void)
{
    topoModel m;
    emulated(&m, 2, 4, "1gbit");
    m.intra_Bps = 405e6;
    m.intra_alpha_s = 93e-6;
    m.cpu_share = 4;
    m.wan_streams = 1;
    size_t b = 64 * MiB;
    m.intra_shared = 0;
    double h0 = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, b, 0, 0);
    double f0 = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_FLAT, NULL, b, 0, 0);
    m.intra_shared = 1;
    double h1 = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, b, 0, 0);
    double f1 = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_FLAT, NULL, b, 0, 0);
    CU_ASSERT(h0 > f0); /* what the plan did before */
    CU_ASSERT(h1 < f1);
    CU_ASSERT(within(h1, 0.6788, 0.25));
    if (!(h1 < f1) || !within(h1, 0.6788, 0.25))
        fprintf(stderr, "\n    shared: hier %.3f s, flat %.3f s; scaled: hier %.3f s, flat %.3f s",
                h1, f1, h0, f0);
}

static void test_plan_one_region(void)
{
    topoModel m;
    emulated(&m, 1, 8, "100mbit");
    topoPlan p;
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs,
                                        ALL_CODECS, NULL, &p), 0);
    check_ranges(&p);
    for (int coll = 0; coll < TOPO_COLL_COUNT; coll++)
        for (int i = 0; i < p.nentries[coll]; i++) {
            CU_ASSERT_EQUAL(p.entries[coll][i].algo, TOPO_ALGO_FLAT);
            CU_ASSERT_EQUAL(p.entries[coll][i].codec, TOPO_CODEC_NONE);
            CU_ASSERT_STRING_EQUAL(p.entries[coll][i].codec_name, "none");
        }
    /* even when hier and a codec are forced */
    topoPlanForce f = TOPO_PLAN_FORCE_NONE;
    f.algo = TOPO_ALGO_HIER;
    f.codec = 4;
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs,
                                        ALL_CODECS, &f, &p), 0);
    for (int i = 0; i < p.nentries[0]; i++) {
        CU_ASSERT_EQUAL(p.entries[0][i].algo, TOPO_ALGO_FLAT);
        CU_ASSERT_EQUAL(p.entries[0][i].codec, TOPO_CODEC_NONE);
    }
}

static void test_plan_choices(void)
{
    topoModel m;
    emulated(&m, 3, 2, "100mbit");
    topoPlan p;
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs,
                                        ALL_CODECS, NULL, &p), 0);
    check_ranges(&p);
    /* large all-reduces: hierarchical and compressed; small ones flat */
    const topoPlanEntry *e = topoPlanLookup(&p, TOPO_COLL_ALLREDUCE, 64 * MiB);
    CU_ASSERT_EQUAL(e->algo, TOPO_ALGO_HIER);
    CU_ASSERT(e->codec != TOPO_CODEC_NONE);
    e = topoPlanLookup(&p, TOPO_COLL_ALLREDUCE, 1024);
    CU_ASSERT_EQUAL(e->algo, TOPO_ALGO_FLAT);
    /* Just above GEOCCL_DIRECT_MAX (16 KiB) the flat path is the ring, one
     * WAN latency per step: a 19 KB gradient must go hierarchical (the
     * bucket [16K, 32K) once took the direct exchange's regime from its
     * start); below it, the direct exchange (flat) beats the three phases
     * of the hierarchical algorithm. */
    e = topoPlanLookup(&p, TOPO_COLL_ALLREDUCE, 19240);
    CU_ASSERT_EQUAL(e->algo, TOPO_ALGO_HIER);
    CU_ASSERT(topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_FLAT, NULL, 19240, 0, 0) >
              topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 19240, 0, 0));
    e = topoPlanLookup(&p, TOPO_COLL_ALLREDUCE, 8192);
    CU_ASSERT_EQUAL(e->algo, TOPO_ALGO_FLAT);
    /* no lossy codec allowed: lossless or none, still hierarchical */
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs, 1u << 1,
                                        NULL, &p), 0);
    check_ranges(&p);
    for (int coll = 0; coll < TOPO_COLL_COUNT; coll++)
        for (int i = 0; i < p.nentries[coll]; i++)
            CU_ASSERT(p.entries[coll][i].codec == TOPO_CODEC_NONE ||
                      p.entries[coll][i].codec == 1);
    e = topoPlanLookup(&p, TOPO_COLL_ALLREDUCE, 64 * MiB);
    CU_ASSERT_EQUAL(e->algo, TOPO_ALGO_HIER);
    /* nothing allowed: none everywhere */
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs, 0, NULL,
                                        &p), 0);
    for (int coll = 0; coll < TOPO_COLL_COUNT; coll++)
        for (int i = 0; i < p.nentries[coll]; i++)
            CU_ASSERT_EQUAL(p.entries[coll][i].codec, TOPO_CODEC_NONE);
    /* only codecs other than all-reduce's never compress */
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs,
                                        ALL_CODECS, NULL, &p), 0);
    for (int coll = 1; coll < TOPO_COLL_COUNT; coll++)
        for (int i = 0; i < p.nentries[coll]; i++)
            CU_ASSERT_EQUAL(p.entries[coll][i].codec, TOPO_CODEC_NONE);
    /* at every bucket's decision point (1.5 x its start), the plan's choice
     * predicts no worse (beyond the 1% preference margin) than the defaults
     * flat, hier, hier + int8 */
    for (int k = TOPO_PLAN_MIN_LOG2; k <= TOPO_PLAN_MAX_LOG2; k++) {
        size_t b = k > TOPO_PLAN_MIN_LOG2 ? ((size_t)3 << k) / 2 : (size_t)1 << k;
        e = topoPlanLookup(&p, TOPO_COLL_ALLREDUCE, b);
        const topoCodecCost *c = e->codec ? codec_named(e->codec_name) : NULL;
        double t = topoPredict(&m, 0, e->algo, c, b, e->chunk, e->nstreams);
        double alt[3] = {topoPredict(&m, 0, TOPO_ALGO_FLAT, NULL, b, 0, 0),
                         topoPredict(&m, 0, TOPO_ALGO_HIER, NULL, b, 0, 0),
                         topoPredict(&m, 0, TOPO_ALGO_HIER, codec_named("int8"), b, 0, 0)};
        for (int j = 0; j < 3; j++)
            if (!(t <= alt[j] * 1.0101)) {
                fprintf(stderr, "\n    %zu bytes: plan %.4g s, alternative %d %.4g s", b, t, j,
                        alt[j]);
                CU_FAIL("the plan's choice is slower than a default");
            }
    }
    /* bad arguments */
    topoPlanForce bad = {0, 0, 0, 0}; /* zeroed, not TOPO_PLAN_FORCE_NONE */
    CU_ASSERT_EQUAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs, 0, &bad, &p),
                    -1);
    topoPlanForce unknown = TOPO_PLAN_FORCE_NONE;
    unknown.codec = 42;
    CU_ASSERT_EQUAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs, 0, &unknown,
                                  &p), -1);
}

static void test_plan_forced(void)
{
    topoModel m;
    emulated(&m, 3, 2, "100mbit");
    topoPlan p;
    topoPlanForce f = TOPO_PLAN_FORCE_NONE;

    f.algo = TOPO_ALGO_FLAT;
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs,
                                        ALL_CODECS, &f, &p), 0);
    check_ranges(&p);
    for (int coll = 0; coll < TOPO_COLL_COUNT; coll++)
        for (int i = 0; i < p.nentries[coll]; i++) {
            CU_ASSERT_EQUAL(p.entries[coll][i].algo, TOPO_ALGO_FLAT);
            CU_ASSERT_EQUAL(p.entries[coll][i].codec, TOPO_CODEC_NONE);
        }

    /* a forced lossy codec is consent: used on every hierarchical
     * all-reduce though the mask allows nothing */
    f = (topoPlanForce)TOPO_PLAN_FORCE_NONE;
    f.algo = TOPO_ALGO_HIER;
    f.codec = 6; /* sign */
    f.nstreams = 3;
    f.chunk = 1 << 20;
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs, 0, &f,
                                        &p), 0);
    check_ranges(&p);
    for (int coll = 0; coll < TOPO_COLL_COUNT; coll++)
        for (int i = 0; i < p.nentries[coll]; i++) {
            const topoPlanEntry *e = &p.entries[coll][i];
            CU_ASSERT_EQUAL(e->nstreams, 3);
            CU_ASSERT_EQUAL(e->chunk, (size_t)1 << 20);
            if (coll != TOPO_COLL_BROADCAST)
                CU_ASSERT_EQUAL(e->algo, TOPO_ALGO_HIER);
            if (coll == TOPO_COLL_ALLREDUCE) {
                CU_ASSERT_EQUAL(e->codec, 6);
                CU_ASSERT_STRING_EQUAL(e->codec_name, "sign");
            } else
                CU_ASSERT_EQUAL(e->codec, TOPO_CODEC_NONE);
        }
    /* the plan of 3 streams, 1 MiB slices is predicted as such (the last
     * bucket's choice is made at 1.5 x 4 GiB) */
    const topoPlanEntry *e = topoPlanLookup(&p, TOPO_COLL_ALLREDUCE, 64 * MiB);
    CU_ASSERT_DOUBLE_EQUAL(e->sec_top,
                           topoPredict(&m, 0, TOPO_ALGO_HIER, codec_named("sign"),
                                       ((size_t)1 << 32) + ((size_t)1 << 31), 1 << 20, 3),
                           1e-9);

    /* forcing none keeps every codec out */
    f = (topoPlanForce)TOPO_PLAN_FORCE_NONE;
    f.codec = TOPO_CODEC_NONE;
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs,
                                        ALL_CODECS, &f, &p), 0);
    for (int i = 0; i < p.nentries[0]; i++)
        CU_ASSERT_EQUAL(p.entries[0][i].codec, TOPO_CODEC_NONE);
}

static void test_plan_print(void)
{
    topoModel m;
    emulated(&m, 2, 4, "1gbit");
    topoPlan p;
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs,
                                        ALL_CODECS, NULL, &p), 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    topoPlanPrint(&p, f);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "plan for 2 regions, 8 ranks"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "allreduce"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "broadcast"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "and up"));
    free(buf);

    buf = NULL;
    f = open_memstream(&buf, &len);
    topoPlanJson(&p, f);
    fclose(f);
    CU_ASSERT_EQUAL(buf[0], '{');
    CU_ASSERT_EQUAL(buf[len - 1], '}');
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "\"coll\": \"reducescatter\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "\"hi\": null"));
    int entries = 0;
    for (const char *s = buf; (s = strstr(s, "\"coll\"")) != NULL; s++)
        entries++;
    CU_ASSERT_EQUAL(entries, p.nentries[0] + p.nentries[1] + p.nentries[2] + p.nentries[3]);
    free(buf);
}

/* ------------------------------------------------------------------------ */
/* Model from a topology file                                               */
/* ------------------------------------------------------------------------ */

static int model_from(const char *text, topoModel *m, char *err, size_t errlen)
{
    topoFile tf;
    if (topoFileParse(text, "m.topo", &tf, err, errlen) != 0)
        return -2;
    int rc = topoModelFromFile(&tf, m, err, errlen);
    topoFileFree(&tf);
    return rc;
}

static void expect_model_error(const char *text, const char *what)
{
    topoModel m;
    char err[512] = "";
    int rc = model_from(text, &m, err, sizeof(err));
    CU_ASSERT_EQUAL(rc, -1);
    if (rc != -1 || strstr(err, what) == NULL) {
        fprintf(stderr, "\n    \"%s\": rc %d, \"%s\"; wanted ... %s", text, rc, err, what);
        CU_FAIL("model error does not say what is missing");
    }
}

static void test_model_from_file(void)
{
    topoModel m;
    char err[512] = "";
    CU_ASSERT_EQUAL_FATAL(model_from("region a bw=1gbit delay=10 ranks=3\n"
                                     "region b bw=100mbit delay=30\n"
                                     "rank 0 b\nrank 1 b\n"
                                     "rtt a c 100\n"
                                     "region c bw=10gbit ranks=1\n"
                                     "rtt b c 44\n"
                                     "intra bw=10gbit delay=0.05\n"
                                     "streams 4\n", &m, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(m.nregions, 3);
    CU_ASSERT_STRING_EQUAL(m.names[2], "c");
    CU_ASSERT_EQUAL(m.ranks[0], 3);
    CU_ASSERT_EQUAL(m.ranks[1], 2); /* counted from its rank lines */
    CU_ASSERT_EQUAL(m.ranks[2], 1);
    CU_ASSERT_DOUBLE_EQUAL(m.egress_Bps[1], 12.5e6, 1e-3);
    CU_ASSERT_DOUBLE_EQUAL(m.lat_s[0], 0.010, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(m.rtt_s[0][2], 0.100, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(m.rtt_s[2][0], 0.100, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(m.rtt_s[1][2], 0.044, 1e-12);
    CU_ASSERT_EQUAL(m.rtt_s[0][1], 0);
    CU_ASSERT_DOUBLE_EQUAL(m.intra_alpha_s, 50e-6, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(m.intra_Bps, 1.25e9, 1e-3);
    CU_ASSERT_EQUAL(m.wan_streams, 4);
    CU_ASSERT_DOUBLE_EQUAL(m.stream_Bps, 1.25e9 * 1448 / 1500 / 4, 1);
    CU_ASSERT(m.wan_goodput < 1);

    /* a measured RTT wins over the delays: a, c 100 ms instead of 10 + 0 */
    topoModel m2 = m;
    m2.rtt_s[0][2] = m2.rtt_s[2][0] = 0;
    m2.lat_s[2] = 0;
    CU_ASSERT(topoPredict(&m, 0, TOPO_ALGO_HIER, NULL, MiB, 0, 0) >
              topoPredict(&m2, 0, TOPO_ALGO_HIER, NULL, MiB, 0, 0) + 0.02);

    /* one region needs neither rate nor delay */
    CU_ASSERT_EQUAL(model_from("region solo ranks=4\n", &m, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(m.nregions, 1);

    expect_model_error("", "no region");
    expect_model_error("region a bw=1gbit delay=5\nregion b bw=1gbit delay=5 ranks=2\n",
                       "region 'a' has no size");
    expect_model_error("region a delay=5 ranks=1\nregion b bw=1gbit delay=5 ranks=2\n",
                       "region 'a' has no bw=");
    expect_model_error("region a bw=1gbit ranks=1\nregion b bw=1gbit delay=5 ranks=2\n"
                       "region c bw=1gbit delay=5 ranks=2\nrtt a b 20\n",
                       "region 'a' has no delay= and no rtt line to region 'c'");
}

/* Shares: split unevenly only for a gain of TOPO_SHARES_MIN_GAIN, not on
 * the probe's own error (one region of three 11% slow or 25% fast on
 * symmetric links), yet on a region 25% slow or 1.6x fast. */
static void expect_shares(const char *r0, const char *r1, const char *r2, int uneven)
{
    char text[512], err[512] = "";
    topoModel m;
    unsigned w[TOPO_MODEL_MAX_REGIONS];
    snprintf(text, sizeof(text), "region a bw=%s delay=25 ranks=2\nregion b bw=%s delay=25 "
             "ranks=2\nregion c bw=%s delay=25 ranks=2\n", r0, r1, r2);
    CU_ASSERT_EQUAL_FATAL(model_from(text, &m, err, sizeof(err)), 0);
    int got = topoHierShares(&m, w);
    if (got != uneven)
        printf("\n    %s / %s / %s: %s shares, expected %s\n", r0, r1, r2,
               got ? "uneven" : "equal", uneven ? "uneven" : "equal");
    CU_ASSERT_EQUAL(got, uneven);
    CU_ASSERT_EQUAL(w[0] + w[1] + w[2], TOPO_SHARE_ONE);
    if (!uneven)
        for (int q = 0; q < 3; q++)
            CU_ASSERT(w[q] >= TOPO_SHARE_ONE / 3 && w[q] <= TOPO_SHARE_ONE / 3 + 1);
}

static void test_shares_gain(void)
{
    expect_shares("100mbit", "100mbit", "89mbit", 0);
    expect_shares("125mbit", "100mbit", "100mbit", 0);
    expect_shares("95mbit", "100mbit", "80mbit", 0);  /* about the 0.01% run (1.148): 1.146 */
    expect_shares("100mbit", "100mbit", "75mbit", 1);
    expect_shares("160mbit", "100mbit", "100mbit", 1);
    expect_shares("100mbit", "1gbit", "1gbit", 1);
}

/* ------------------------------------------------------------------------ */
/* A codec per sending region                                               */
/* ------------------------------------------------------------------------ */

/* The plan's 64 MiB all-reduce on three regions of two ranks, six ranks on
 * two cores (cpu_share 3, as on the emulated regions), with only `allowed`
 * codecs; the entry is copied to *e. */
static void plan_64m(const char *r0, const char *r1, const char *r2, unsigned allowed,
                     topoModel *m, topoPlanEntry *e)
{
    char text[512], err[512] = "";
    snprintf(text, sizeof(text), "region a bw=%s delay=25 ranks=2\nregion b bw=%s delay=25 "
             "ranks=2\nregion c bw=%s delay=25 ranks=2\nintra bw=140M delay=0.2\n", r0, r1,
             r2);
    CU_ASSERT_EQUAL_FATAL(model_from(text, m, err, sizeof(err)), 0);
    m->cpu_share = 3;
    topoPlan *p = malloc(sizeof(*p));
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(m, topoDefaultCodecCosts, topoDefaultNCodecs, allowed,
                                        NULL, p), 0);
    check_ranges(p);
    *e = *topoPlanLookup(p, TOPO_COLL_ALLREDUCE, 64 * MiB);
    free(p);
}

static void test_plan_by_region(void)
{
    const unsigned lossless = 1u << 1;
    const topoCodecCost *ll = codec_named("lossless");
    topoModel m;
    topoPlanEntry e;
    /* One codec on every region, equal shares: the closed form of model.c's
     * header (W_q = 2 (R-1)/R L / ratio / E_q, C_q = L/P (1/enc + 2 (R-1)/R
     * / dec)), as the model computed it before it took a codec per region
     * (build bf455e0, 3x2 at 100 Mbit/s, 64 MiB: 7.49695997727 s
     * uncompressed, 6.83089863694 s lossless). */
    emulated(&m, 3, 2, "100mbit");
    const topoCodecCost *same[3] = {ll, ll, ll};
    CU_ASSERT_DOUBLE_EQUAL(topoPredictHierByRegion(&m, same, 64 * MiB, 0, 0), 6.83089863694,
                           1e-9);
    CU_ASSERT_DOUBLE_EQUAL(topoPredictHierByRegion(&m, NULL, 64 * MiB, 0, 0), 7.49695997727,
                           1e-9);
    CU_ASSERT_DOUBLE_EQUAL(topoPredict(&m, 0, TOPO_ALGO_HIER, ll, 64 * MiB, 0, 0), 6.83089863694,
                           1e-9);

    /* 100M/1G/1G with the exact codecs (GEOCCL_COMPRESS=auto): lossless
     * (1.1x, 0.42 GB/s to encode on a core shared by three ranks) pays on
     * the 100 Mbit/s link, which sets the pace, and not on the 1 Gbit/s
     * ones, where encoding costs more than the link time it saves. */
    plan_64m("100mbit", "1gbit", "1gbit", lossless, &m, &e);
    printf("\n    100M/1G/1G: by_region %d, codecs %d %d %d, %.3f s (one codec: %s)",
           e.by_region, e.region_codec[0], e.region_codec[1], e.region_codec[2], e.sec_top,
           e.codec_name);
    CU_ASSERT_EQUAL(e.algo, TOPO_ALGO_HIER);
    CU_ASSERT_EQUAL(e.by_region, 1);
    CU_ASSERT_EQUAL(e.region_codec[0], ll->id);
    CU_ASSERT_EQUAL(e.region_codec[1], TOPO_CODEC_NONE);
    CU_ASSERT_EQUAL(e.region_codec[2], TOPO_CODEC_NONE);
    const topoCodecCost *mix[3] = {ll, NULL, NULL};
    double tmix = topoPredictHierByRegion(&m, mix, 64 * MiB, e.chunk, e.nstreams);
    double tnone = topoPredictHierByRegion(&m, NULL, 64 * MiB, e.chunk, e.nstreams);
    double tall = topoPredictHierByRegion(&m, same, 64 * MiB, e.chunk, e.nstreams);
    printf("; mixed %.3f s, none %.3f s, lossless everywhere %.3f s", tmix, tnone, tall);
    CU_ASSERT(tmix < 0.95 * tnone);
    CU_ASSERT(tmix <= 1.01 * tall);

    /* Symmetric links: every region alike, so one codec for all. */
    plan_64m("100mbit", "100mbit", "100mbit", lossless, &m, &e);
    CU_ASSERT_EQUAL(e.by_region, 0);
    plan_64m("1gbit", "1gbit", "1gbit", ALL_CODECS, &m, &e);
    CU_ASSERT_EQUAL(e.by_region, 0);

    /* No codec allowed, or one forced: nothing to choose per region. */
    plan_64m("100mbit", "1gbit", "1gbit", 0, &m, &e);
    CU_ASSERT_EQUAL(e.by_region, 0);
    CU_ASSERT_EQUAL(e.codec, TOPO_CODEC_NONE);
    topoPlanForce f = TOPO_PLAN_FORCE_NONE;
    f.codec = ll->id;
    topoPlan *p = malloc(sizeof(*p));
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs, ALL_CODECS,
                                        &f, p), 0);
    for (int i = 0; i < p->nentries[TOPO_COLL_ALLREDUCE]; i++)
        CU_ASSERT_EQUAL(p->entries[TOPO_COLL_ALLREDUCE][i].by_region, 0);

    /* The mix in the printed plan and its JSON. */
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, topoDefaultCodecCosts, topoDefaultNCodecs, lossless,
                                        NULL, p), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f2 = open_memstream(&text, &len);
    topoPlanPrint(p, f2);
    fputc('\n', f2);
    topoPlanJson(p, f2);
    fclose(f2);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "codec of what each region sends: a lossless, b none, "
                                        "c none (one codec for all: "));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\"region_codecs\": {\"a\": \"lossless\", \"b\": "
                                        "\"none\", \"c\": \"none\"}"));
    free(text);
    free(p);
    printf("\n");
}

/* ------------------------------------------------------------------------ */
/* Ingress: a slow downlink                                                 */
/* ------------------------------------------------------------------------ */

static void test_ingress(void)
{
    const double M = 1e6 / 8; /* bytes/s of a Mbit/s */
    topoModel up, down;
    char err[512] = "";
    /* region r0's uplink at 100 Mbit/s, or its downlink only: the
     * hierarchical all-reduce sends and receives the same bytes, so both
     * give r0 no share and the same bound. */
    CU_ASSERT_EQUAL_FATAL(model_from("region r0 bw=100mbit delay=25 ranks=2\n"
                                     "region r1 bw=1gbit delay=25 ranks=2\n"
                                     "region r2 bw=1gbit delay=25 ranks=2\n"
                                     "intra bw=140M delay=0.2\n", &up, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL_FATAL(model_from("region r0 bw=1gbit in=100mbit delay=25 ranks=2\n"
                                     "region r1 bw=1gbit delay=25 ranks=2\n"
                                     "region r2 bw=1gbit delay=25 ranks=2\n"
                                     "intra bw=140M delay=0.2\n", &down, err, sizeof(err)), 0);
    CU_ASSERT_DOUBLE_EQUAL(down.ingress_Bps[0], 100 * M, 1e-3);
    CU_ASSERT_EQUAL(down.ingress_Bps[1], 0);
    unsigned wu[TOPO_MODEL_MAX_REGIONS], wd[TOPO_MODEL_MAX_REGIONS];
    CU_ASSERT_EQUAL(topoHierShares(&up, wu), 1);
    CU_ASSERT_EQUAL(topoHierShares(&down, wd), 1);
    CU_ASSERT_EQUAL(wd[0], 0);
    for (int q = 0; q < 3; q++)
        CU_ASSERT_EQUAL(wu[q], wd[q]);
    double b = topoHierWanPerByte(&down, wd) * 64 * MiB;
    CU_ASSERT_DOUBLE_EQUAL(b, 64 * MiB / (100 * M * 1448 / 1500), 1e-6);
    double tu = topoPredict(&up, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, 0, 0);
    double td = topoPredict(&down, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, 0, 0);
    CU_ASSERT_DOUBLE_EQUAL(td, tu, 0.01 * tu);
    CU_ASSERT(td >= b);
    /* without its in= the same links look 10x faster */
    down.ingress_Bps[0] = 0;
    CU_ASSERT(topoPredict(&down, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, 0, 0) <
              0.3 * td);
    down.ingress_Bps[0] = 100 * M;
    /* the flat ring's edge into r0 runs at its ingress; all-gather: r0
     * receives (N - 2) blocks at 100 Mbit/s */
    CU_ASSERT(topoPredict(&down, TOPO_COLL_ALLREDUCE, TOPO_ALGO_FLAT, NULL, 64 * MiB, 0, 0) >
              2.0 * 5 / 6 * 64 * MiB / (100 * M));
    CU_ASSERT(topoPredict(&down, TOPO_COLL_ALLGATHER, TOPO_ALGO_HIER, NULL, 64 * MiB, 0, 0) >
              4.0 / 6 * 64 * MiB / (100 * M));
    down.ingress_Bps[0] = -1;
    CU_ASSERT(topoPredict(&down, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, MiB, 0, 0) < 0);
    {
        topoFile tf;
        CU_ASSERT_EQUAL(topoFileParse("region a bw=1gbit in=fast\n", "t", &tf, err,
                                      sizeof(err)), -1);
        CU_ASSERT(strstr(err, "t:1: bad rate 'fast'") != NULL);
    }

    /* From the probe's all-to-all rates (Mbit/s here; any unit works). */
    double in[4];
    /* r0's downlink at 100: the flows into it get 50 each while the same
     * senders' flows to the third region get 950 */
    const double slow_down[9] = {0, 500, 500, 50, 0, 950, 50, 950, 0};
    topoIngressFromRates(3, slow_down, in);
    CU_ASSERT_DOUBLE_EQUAL(in[0], 100, 1e-9);
    CU_ASSERT_EQUAL(in[1], 0);
    CU_ASSERT_EQUAL(in[2], 0);
    /* r0's uplink at 100 (egress): nothing held back on the way in */
    const double slow_up[9] = {0, 50, 50, 500, 0, 500, 500, 500, 0};
    topoIngressFromRates(3, slow_up, in);
    CU_ASSERT(in[0] == 0 && in[1] == 0 && in[2] == 0);
    /* the ladder 50/100/200/400 (egress): each sender splits its uplink
     * evenly, so no region reads as held back, the 400 one included */
    double lad[16];
    const double e[4] = {50, 100, 200, 400};
    for (int g = 0; g < 4; g++)
        for (int h = 0; h < 4; h++)
            lad[g * 4 + h] = g == h ? 0 : e[g] / 3;
    topoIngressFromRates(4, lad, in);
    for (int h = 0; h < 4; h++)
        CU_ASSERT_EQUAL(in[h], 0);
    /* two slow downlinks (r0, r1 at 100; uplinks 1 Gbit/s) */
    const double two[9] = {0, 50, 950, 50, 0, 950, 50, 50, 0};
    topoIngressFromRates(3, two, in);
    CU_ASSERT_DOUBLE_EQUAL(in[0], 100, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(in[1], 100, 1e-9);
    CU_ASSERT_EQUAL(in[2], 0);
    /* one slow flow (r0 -> r2 at a third of r0 -> r1; the probe at 1 Gbit/s
     * with 0.1% loss): r2 still receives as much as a sender sends, so no
     * downlink */
    const double one[9] = {0, 258, 64, 250, 0, 250, 250, 250, 0};
    topoIngressFromRates(3, one, in);
    CU_ASSERT(in[0] == 0 && in[1] == 0 && in[2] == 0);
    /* two regions: nothing to compare with */
    const double pair[4] = {0, 100, 1000, 0};
    topoIngressFromRates(2, pair, in);
    CU_ASSERT(in[0] == 0 && in[1] == 0);
}

/* ------------------------------------------------------------------------ */
/* Simulate                                                                 */
/* ------------------------------------------------------------------------ */

static void example_path(char *buf, size_t len, const char *name)
{
    const char *src = getenv("GEOCCL_TEST_SRCDIR");
    snprintf(buf, len, "%s/examples/topo/%s", src ? src : ".", name);
}

static char *simulate(const char *path, int json, int *rc, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return NULL;
    *rc = topoSimulate(path, json, NULL, 0, f, err, errlen);
    fclose(f);
    return buf;
}

static void test_simulate_3x2(void)
{
    char path[1024], err[512] = "";
    int rc;
    example_path(path, sizeof(path), "3x2-100mbit.topo");
    char *out = simulate(path, 0, &rc, err, sizeof(err));
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    if (rc != 0)
        fprintf(stderr, "\n    %s", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "3 regions, 6 ranks"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "100 Mbit/s"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "plan for 3 regions, 6 ranks"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "allreduce"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "hier"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "int8"));
    /* the size table: 1 KiB .. 1 GiB in x4 steps, RTT 50 ms */
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "       1024 "));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, " 1073741824 "));
    CU_ASSERT_PTR_NULL(strstr(out, " 2147483648 "));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "        50"));
    free(out);

    out = simulate(path, 1, &rc, err, sizeof(err));
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(out[0], '{');
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"plan\": {"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"name\": \"r2\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"bytes\": 1073741824"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"rtt_s\": [[0, 0.05, 0.05]"));
    free(out);

    /* errors: a missing file, a bad line, a region without a rate */
    out = simulate("/nonexistent/x.topo", 0, &rc, err, sizeof(err));
    CU_ASSERT_EQUAL(rc, -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "/nonexistent/x.topo"));
    free(out);
    char tmp[] = "/tmp/geoccl-model-XXXXXX";
    int fd = mkstemp(tmp);
    CU_ASSERT_FATAL(fd >= 0);
    FILE *tf = fdopen(fd, "w");
    fputs("region a ranks=2 bw=1gbit delay=3\nregion b ranks=2\n", tf);
    fclose(tf);
    out = simulate(tmp, 0, &rc, err, sizeof(err));
    CU_ASSERT_EQUAL(rc, -1);
    CU_ASSERT(strncmp(err, tmp, strlen(tmp)) == 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "region 'b' has no bw="));
    free(out);
    unlink(tmp);
}

static void test_simulate_4x1024(void)
{
    char path[1024], err[512] = "";
    int rc;
    example_path(path, sizeof(path), "4x1024.topo");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char *out = simulate(path, 0, &rc, err, sizeof(err));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    if (rc != 0)
        fprintf(stderr, "\n    %s", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CU_ASSERT(sec < 2.0); /* "fast for 4096 ranks": milliseconds, with room for a busy CI */
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "4 regions, 4096 ranks"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "190")); /* europe-asia RTT */
    free(out);
}

/* The node level inside regions (model.h node_ranks, node_stage): the
 * file's `node` line and node_ranks=, the intra phase in two stages
 * against one ring, the plan's choice between them, the stage figures,
 * and nothing changed where no node is described. */
static void test_nodes(void)
{
    char err[256] = "";
    topoFile tf;
    topoModel m, flat;
    const char *text = "region a bw=10gbit delay=10 ranks=64\n"
                       "region b bw=10gbit delay=10 ranks=64 node_ranks=4\n"
                       "intra bw=400gbit delay=0.01\n"
                       "node ranks=8 bw=1200gbit delay=0.003\n";
    CU_ASSERT_EQUAL_FATAL(topoFileParse(text, "t", &tf, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(tf.node_ranks, 8);
    CU_ASSERT_EQUAL(tf.regions[1].node_ranks, 4);
    CU_ASSERT_DOUBLE_EQUAL(tf.node_bw_bytes, 150e9, 1);
    CU_ASSERT_EQUAL_FATAL(topoModelFromFile(&tf, &m, err, sizeof(err)), 0);
    topoFileFree(&tf);
    CU_ASSERT_EQUAL(m.node_ranks[0], 8);
    CU_ASSERT_EQUAL(m.node_ranks[1], 4);
    CU_ASSERT_DOUBLE_EQUAL(m.node_alpha_s, 3e-6, 1e-12);
    CU_ASSERT_TRUE(topoModelHasNodes(&m));
    /* bad node lines, and ranks a node does not divide */
    CU_ASSERT_EQUAL(topoFileParse("node ranks=0\n", "t", &tf, err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "t:1: bad node ranks '0'"));
    CU_ASSERT_EQUAL(topoFileParse("node speed=1\n", "t", &tf, err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "unknown node attribute 'speed=1'"));
    CU_ASSERT_EQUAL(topoFileParse("region a ranks=6 bw=1gbit delay=1\nregion b ranks=4 "
                                  "bw=1gbit delay=1\nnode ranks=4\n", "t", &tf, err,
                                  sizeof(err)), 0);
    CU_ASSERT_EQUAL(topoModelFromFile(&tf, &flat, err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "region 'a' has 6 ranks, not a whole number of nodes of 4"));
    topoFileFree(&tf);

    /* Staged: per slice (G-1) + (H-1) latencies per phase instead of P-1;
     * at small slices that is most of the time. */
    topoModel one = m;
    one.node_stage = 0;
    m.node_stage = 1;
    double t1 = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, MiB, 0);
    double t0 = topoPredict(&one, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, 64 * MiB, MiB, 0);
    CU_ASSERT(t1 > 0 && t1 < t0);
    topoHierStages st;
    CU_ASSERT_EQUAL_FATAL(topoPredictHierStages(&m, NULL, 64 * MiB, MiB, 0, &st), 0);
    CU_ASSERT_DOUBLE_EQUAL(st.total_s, t1, 1e-12);
    CU_ASSERT_EQUAL(st.node_stage, 1);
    CU_ASSERT_EQUAL(st.nslices, 64);
    CU_ASSERT(st.node_s > 0 && st.region_s > 0 && st.wan_s > 0);
    /* region a: 8 nodes of 8 ranks, 1 MiB slices: 2 x 64 x 7 x (3 us + 16 KiB at 150 GB/s) */
    CU_ASSERT_DOUBLE_EQUAL(st.node_s, 2 * 64 * 7 * (3e-6 + MiB / 8.0 / 150e9), 1e-6);
    CU_ASSERT(st.bound_s <= st.total_s);
    CU_ASSERT_DOUBLE_EQUAL(st.bound_s - st.bw_bound_s, st.latency_s, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(st.latency_s, 0.02, 1e-9);
    CU_ASSERT_EQUAL(topoPredictHierStages(&m, NULL, MiB, 0, 0, NULL), -1);
    CU_ASSERT_EQUAL_FATAL(topoPredictHierStages(&one, NULL, 64 * MiB, MiB, 0, &st), 0);
    CU_ASSERT_EQUAL(st.node_stage, 0);
    CU_ASSERT_DOUBLE_EQUAL(st.total_s, t0, 1e-12);

    /* The plan takes the node stage where it wins, and says so. */
    topoPlan *p = malloc(sizeof(*p));
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&m, NULL, 0, 0, NULL, p), 0);
    const topoPlanEntry *e = topoPlanLookup(p, TOPO_COLL_ALLREDUCE, 16 * MiB);
    CU_ASSERT_EQUAL(e->algo, TOPO_ALGO_HIER);
    CU_ASSERT_EQUAL(e->node_stage, 1);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    topoPlanPrint(p, f);
    topoPlanJson(p, f);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "hier+node"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "\"node_stage\": 1"));
    free(buf);

    /* No node described: the same predictions and plan whatever
     * node_stage says (3x2 and 2x4 keep their plans). */
    emulated(&flat, 3, 2, "100mbit");
    CU_ASSERT_FALSE(topoModelHasNodes(&flat));
    topoModel off = flat;
    off.node_stage = 0;
    for (size_t b = MiB; b <= 256 * MiB; b *= 4)
        CU_ASSERT_DOUBLE_EQUAL(
            topoPredict(&flat, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, b, 0, 0),
            topoPredict(&off, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, b, 0, 0), 0);
    CU_ASSERT_EQUAL_FATAL(topoPlanBuild(&flat, NULL, 0, 0, NULL, p), 0);
    for (int c = 0; c < TOPO_COLL_COUNT; c++)
        for (int i = 0; i < p->nentries[c]; i++)
            CU_ASSERT_EQUAL(p->entries[c][i].node_stage, 0);
    /* Regions of one node each (P ranks on one node): no node stage. */
    flat.node_ranks[0] = flat.node_ranks[1] = flat.node_ranks[2] = 2;
    CU_ASSERT_FALSE(topoModelHasNodes(&flat));
    free(p);
}

/* The WAN congestion control choice: the Mathis rate against the share a
 * pair carries, cubic on clean or nearly clean paths, BBR on lossy or
 * unmeasured ones, streams where there is no BBR. */
static void test_wan_cc_choice(void)
{
    char why[192];
    int n;
    const double share = 50e6 / 8 / 2, rtt = 0.05; /* 100 Mbit/s, 3 regions x 2 ranks */
    /* Mathis at 0.1%, 50 ms: 1448 / 0.05 * sqrt(1500) = 1.12 MB/s = 9.0 Mbit/s */
    CU_ASSERT_DOUBLE_EQUAL(topoLossRate(rtt, 1e-3, 1448) * 8e-6, 8.97, 0.01);
    CU_ASSERT_TRUE(isinf(topoLossRate(rtt, 0, 1448)));
    /* none lost of the probe's 3400 segments still allows 0.11%: bbr */
    CU_ASSERT_EQUAL(topoWanCcChoice(share, rtt, 0, 3400, 2, 1, 8, &n, why, sizeof(why)),
                    TOPO_CC_BBR);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "0 of 3400 segments, at most 0.107%"));
    CU_ASSERT_EQUAL(n, 2);
    /* a clean path the user vouches for (topology file: 1e9 segments): cubic */
    CU_ASSERT_EQUAL(topoWanCcChoice(share, rtt, 0, 1e9, 2, 1, 8, &n, why, sizeof(why)),
                    TOPO_CC_CUBIC);
    /* 0.1% of 3400 (3.4 segments): cubic might hold 11 Mbit/s on 2 streams, 25 needed */
    CU_ASSERT_EQUAL(topoWanCcChoice(share, rtt, 1e-3, 3400, 2, 1, 8, &n, why, sizeof(why)),
                    TOPO_CC_BBR);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "cubic might hold"));
    /* a loss small enough for cubic, counted over enough segments:
     * 1 in 100000 of 2e6 holds 2 x 26 Mbit/s > 1.25 x 25 */
    CU_ASSERT_EQUAL(topoWanCcChoice(share, rtt, 1e-5, 2e6, 2, 1, 8, &n, why, sizeof(why)),
                    TOPO_CC_CUBIC);
    /* the same loss at 1 Gbit/s needs more than cubic holds */
    CU_ASSERT_EQUAL(topoWanCcChoice(10 * share, rtt, 1e-5, 2e6, 2, 1, 8, &n, why,
                                    sizeof(why)), TOPO_CC_BBR);
    /* too few segments to call it a measurement, or none: bbr */
    CU_ASSERT_EQUAL(topoWanCcChoice(share, rtt, 0, 100, 2, 1, 8, &n, why, sizeof(why)),
                    TOPO_CC_BBR);
    CU_ASSERT_EQUAL(topoWanCcChoice(share, rtt, -1, 0, 2, 1, 8, &n, why, sizeof(why)),
                    TOPO_CC_BBR);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "not measured"));
    /* no bbr: cubic on the streams the loss term asks, capped */
    CU_ASSERT_EQUAL(topoWanCcChoice(share, rtt, 1e-3, 3400, 2, 0, 8, &n, why, sizeof(why)),
                    TOPO_CC_CUBIC);
    CU_ASSERT_EQUAL(n, 4); /* ceil(1.25 x 25 / 8.97) */
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "no bbr"));
    CU_ASSERT_EQUAL(topoWanCcChoice(share, rtt, 1e-2, 3400, 2, 0, 8, &n, why, sizeof(why)),
                    TOPO_CC_CUBIC);
    CU_ASSERT_EQUAL(n, 8);
}

/* 3 regions x 2 ranks at 100 Mbit/s, 50 ms round trips, 2 streams,
 * 256 KiB stripes: a message of msg bytes, retrans of segs sent again,
 * paused of calls after a pause, tcp_slow_start_after_idle restart. */
static int revisit(double msg, double retrans, double segs, int paused, int calls, int restart,
                   char why[192])
{
    return topoWanCcRevisit(msg, 256 * 1024, 25e6 / 8, 0.05, retrans, segs, 2, paused, calls,
                            restart, why, 192);
}

/* After init (wan_tuning.h, geoWanWatch): a pair on BBR moves to cubic when
 * cubic's window at the loss the counts allow holds a message, or its
 * streams hold the bulk share; not while calls often pause past an RTO. */
static void test_wan_cc_revisit(void)
{
    char why[192];
    /* DDP's 59 KB messages: 41 segments on one connection; none sent again
     * of 4320: the loss is at most 0.084%, cubic's mean window 42 */
    CU_ASSERT_EQUAL(revisit(59e3, 0, 4320, 0, 20, 1, why), TOPO_CC_CUBIC);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "window of 42 segments holds"));
    /* of the probe's 3400 alone, 0.107% and a window of 37: not yet */
    CU_ASSERT_EQUAL(revisit(59e3, 0, 3400, 0, 20, 1, why), TOPO_CC_BBR);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "short of"));
    /* 1% sent again: bbr */
    CU_ASSERT_EQUAL(revisit(59e3, 43, 4320, 0, 20, 1, why), TOPO_CC_BBR);
    /* 3 of 10 calls after pauses over 200 ms (DiLoCo's local steps): cubic
     * would restart its window after each, unless the kernel is told not
     * to; 1 in 10 (an evaluation now and then) is fine */
    CU_ASSERT_EQUAL(revisit(59e3, 0, 1e6, 3, 10, 1, why), TOPO_CC_BBR);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "3 of 10 calls came after a pause"));
    CU_ASSERT_EQUAL(revisit(59e3, 0, 1e6, 3, 10, 0, why), TOPO_CC_CUBIC);
    CU_ASSERT_EQUAL(revisit(59e3, 0, 1e6, 1, 10, 1, why), TOPO_CC_CUBIC);
    /* too little counted */
    CU_ASSERT_EQUAL(revisit(59e3, 0, 300, 0, 20, 1, why), TOPO_CC_BBR);
    /* bulk, 1.4 MB messages over 2 streams (483 segments each): by the
     * window after 1e6 clean segments; by the bulk share (2 x 21 Mbit/s
     * >= 1.25 x 25) after 20000; neither after 5000 */
    CU_ASSERT_EQUAL(revisit(1.4e6, 0, 1e6, 0, 20, 1, why), TOPO_CC_CUBIC);
    CU_ASSERT_EQUAL(revisit(1.4e6, 0, 20000, 0, 20, 1, why), TOPO_CC_CUBIC);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "streams of cubic hold"));
    CU_ASSERT_EQUAL(revisit(1.4e6, 0, 5000, 0, 20, 1, why), TOPO_CC_BBR);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return CU_get_error();
    CU_pSuite s = CU_add_suite("cost model, plan and simulate", NULL, NULL);
    if (s == NULL) {
        CU_cleanup_registry();
        return CU_get_error();
    }
    CU_add_test(s, "calibration against BENCHMARKS.md", test_calibration);
    CU_add_test(s, "predictions monotone in bytes", test_monotone);
    CU_add_test(s, "hier faster than flat, 3x2 at 100 Mbit/s, >= 1 MiB",
                test_hier_beats_flat_on_slow_wan);
    CU_add_test(s, "hier at 64 MiB within 1.10x of the link bound", test_hier_near_bound);
    CU_add_test(s, "codecs, stream caps, invalid arguments", test_compression_and_streams);
    CU_add_test(s, "intra figures measured under sharing are not scaled twice",
                test_intra_shared_not_scaled_twice);
    CU_add_test(s, "plan: one region is flat, no codec", test_plan_one_region);
    CU_add_test(s, "plan: choices and allowed codecs", test_plan_choices);
    CU_add_test(s, "plan: forced choices", test_plan_forced);
    CU_add_test(s, "plan: print and JSON", test_plan_print);
    CU_add_test(s, "topoModelFromFile", test_model_from_file);
    CU_add_test(s, "shares: uneven only for a gain of TOPO_SHARES_MIN_GAIN", test_shares_gain);
    CU_add_test(s, "plan: a codec per sending region", test_plan_by_region);
    CU_add_test(s, "ingress: a slow downlink in shares, predictions and the probe's rates",
                test_ingress);
    CU_add_test(s, "simulate 3x2 at 100 Mbit/s", test_simulate_3x2);
    CU_add_test(s, "simulate 4 x 1024 ranks", test_simulate_4x1024);
    CU_add_test(s, "nodes inside regions: node and region stages", test_nodes);
    CU_add_test(s, "WAN congestion control from loss", test_wan_cc_choice);
    CU_add_test(s, "WAN congestion control revisited after init", test_wan_cc_revisit);
    CU_add_test(s, "loss term of a loss-driven control", test_loss_term);

    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failures = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failures != 0;
}
