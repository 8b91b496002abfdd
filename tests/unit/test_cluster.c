/*
 * Regions from round-trip times and link figures (topology/cluster.h),
 * called directly on synthetic matrices: two and three regions with
 * asymmetric RTTs, every node far from every other, one region, jitter
 * (minimum of heavy-tailed samples, as the probe takes it), one direction
 * unmeasured, single linkage through a chain; the one-way delay solver,
 * stream counts and the steady-state rate estimate.  The probe that feeds
 * these from real sockets is tested over emulated regions
 * (tests/wan/test_probe_wan.sh).
 */
#include "config.h"
#include "topology/cluster.h"
#include "topology/nics.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MS 1e-3

/* rtt of n nodes placed in regions reg[] with intra RTT `in` and inter
 * RTT between regions a < b given by inter(a, b). */
static double *make_matrix(int n, const int *reg, double in, double (*inter)(int, int))
{
    double *m = malloc(sizeof(double) * (size_t)n * (size_t)n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            m[i * n + j] = i == j ? 0 : reg[i] == reg[j] ? in
                           : inter(reg[i] < reg[j] ? reg[i] : reg[j],
                                   reg[i] < reg[j] ? reg[j] : reg[i]);
    return m;
}

static double inter_50(int a, int b)
{
    (void)a, (void)b;
    return 50 * MS;
}

/* Asymmetric: RTT(i,j) = d_i + d_j with d = 25, 10, 5 ms. */
static double inter_asym(int a, int b)
{
    static const double d[] = {25 * MS, 10 * MS, 5 * MS, 40 * MS};
    return d[a] + d[b];
}

static void expect_regions(int n, const double *m, const int *want, int want_k)
{
    int got[64];
    double cut = -1;
    int k = topoClusterRtt(n, m, TOPO_MIN_WAN_RTT, TOPO_MAX_LAN_RTT, TOPO_MIN_GAP_RATIO, got,
                           &cut);
    CU_ASSERT_EQUAL(k, want_k);
    for (int i = 0; i < n; i++)
        CU_ASSERT_EQUAL(got[i], want[i]);
    if (want_k > 1) {
        CU_ASSERT(cut > 0);
    } else {
        CU_ASSERT_EQUAL(cut, 0);
    }
}

static void test_two_regions(void)
{
    /* Interleaved placement: regions numbered by their lowest node. */
    int reg[] = {0, 1, 0, 1, 1, 0};
    double *m = make_matrix(6, reg, 0.08 * MS, inter_50);
    expect_regions(6, m, reg, 2);
    free(m);
}

static void test_three_regions_asymmetric(void)
{
    int reg[] = {0, 0, 1, 1, 1, 2, 3};
    double *m = make_matrix(7, reg, 0.2 * MS, inter_asym);
    expect_regions(7, m, reg, 4);
    free(m);
}

static void test_all_far_apart(void)
{
    /* One node per region, the closest two 10 ms apart: never joined. */
    int reg[] = {0, 1, 2, 3};
    double *m = make_matrix(4, reg, 0, inter_asym);
    expect_regions(4, m, reg, 4);
    free(m);
}

static void test_one_region(void)
{
    int reg[] = {0, 0, 0, 0, 0};
    double *m = make_matrix(5, reg, 0.1 * MS, inter_50);
    /* Loopback-like spread by factors of ten, all under a millisecond. */
    m[0 * 5 + 1] = m[1 * 5 + 0] = 0.02 * MS;
    m[2 * 5 + 3] = m[3 * 5 + 2] = 0.9 * MS;
    expect_regions(5, m, reg, 1);
    int one;
    CU_ASSERT_EQUAL(topoClusterRtt(1, m, TOPO_MIN_WAN_RTT, TOPO_MAX_LAN_RTT, TOPO_MIN_GAP_RATIO,
                                   &one, NULL), 1);
    CU_ASSERT_EQUAL(one, 0);
    free(m);
}

/* Samples with heavy-tailed jitter (exponential, mean 8 ms, and one sample
 * in five delayed by 30 ms more), the minimum of 5 kept as the probe does:
 * 200 seeded trials must all give the regions as built. */
static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 11;
}

static double jittered_min(double base, uint64_t *seed)
{
    double best = INFINITY;
    for (int k = 0; k < 5; k++) {
        double u = ((double)lcg(seed) + 1) / 9007199254740993.0;
        double x = base - 8 * MS * log(u);
        if (lcg(seed) % 5 == 0)
            x += 30 * MS;
        if (x < best)
            best = x;
    }
    return best;
}

static void test_jitter_does_not_split(void)
{
    int reg[] = {0, 0, 0, 1, 1, 2, 2, 2};
    int n = 8, bad = 0;
    uint64_t seed = 12345;
    for (int trial = 0; trial < 200; trial++) {
        double m[64];
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                double base = reg[i] == reg[j] ? 0.1 * MS : inter_asym(reg[i], reg[j]);
                /* Jitter only on the links of node 1 and node 6 within
                 * their regions, and on every WAN pair. */
                int jittery = reg[i] != reg[j] || i == 1 || j == 1 || i == 6 || j == 6;
                m[i * n + j] = i == j ? 0 : jittery ? jittered_min(base, &seed) : base;
                if (reg[i] == reg[j] && jittery)
                    m[i * n + j] = base + (m[i * n + j] - base) * 0.05; /* LAN: 0.4 ms mean */
            }
        int got[8];
        int k = topoClusterRtt(n, m, TOPO_MIN_WAN_RTT, TOPO_MAX_LAN_RTT, TOPO_MIN_GAP_RATIO, got,
                               NULL);
        if (k != 3 || memcmp(got, reg, sizeof(reg)) != 0)
            bad++;
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* The probe's sampling for many nodes (topoRttSampleRound), run here as
 * the leaders run it: each round's pairs measured (jittered, minimum of 5
 * samples, as ping_rounds keeps), then the regions found over the sparse
 * matrix.  reg[]: the truth; returns the pairs measured, or -1 when the
 * regions found differ from the truth (as a partition) or the rounds do
 * not end. */
static long sampled_regions(int n, const int *reg, int k0, int *rounds_out, uint64_t *seed)
{
    size_t nn = (size_t)n * (size_t)n;
    double *m = malloc(sizeof(double) * nn);
    unsigned char *lm = malloc((size_t)n), *with = malloc(nn);
    int *got = malloc(sizeof(int) * (size_t)n), *map = malloc(sizeof(int) * (size_t)n * 2);
    long pairs = 0;
    int round = 0;
    for (size_t x = 0; x < nn; x++)
        m[x] = x % ((size_t)n + 1) == 0 ? 0 : -1;
    for (; round < 64; round++) {
        int np = topoRttSampleRound(n, k0, round, m, lm, with);
        CU_ASSERT_FATAL(np >= 0);
        if (np == 0)
            break;
        int seen = 0;
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++) {
                int a = with[(size_t)i * (size_t)n + (size_t)j];
                CU_ASSERT_EQUAL(a, with[(size_t)j * (size_t)n + (size_t)i]); /* symmetric */
                CU_ASSERT(!a || m[(size_t)i * (size_t)n + (size_t)j] < 0);  /* never twice */
                if (!a)
                    continue;
                seen++;
                double base = reg[i] == reg[j] ? 0.1 * MS : inter_asym(reg[i] % 4, reg[j] % 4) +
                                                                 (reg[i] + reg[j]) * 0.1 * MS;
                double x = jittered_min(base, seed);
                if (reg[i] == reg[j])
                    x = base + (x - base) * 0.05;
                m[(size_t)i * (size_t)n + (size_t)j] = m[(size_t)j * (size_t)n + (size_t)i] = x;
            }
        CU_ASSERT_EQUAL(seen, np);
        pairs += np;
    }
    int k = topoClusterRtt(n, m, TOPO_MIN_WAN_RTT, TOPO_MAX_LAN_RTT, TOPO_MIN_GAP_RATIO, got,
                           NULL);
    /* Same partition: got[i] == got[j] exactly when reg[i] == reg[j]. */
    int ok = round < 64 && k > 0;
    for (int i = 0; i < n * 2; i++)
        map[i] = -1;
    for (int i = 0; i < n && ok; i++) {
        if (map[reg[i]] < 0)
            map[reg[i]] = got[i];
        if (map[n + got[i]] < 0)
            map[n + got[i]] = reg[i];
        ok = map[reg[i]] == got[i] && map[n + got[i]] == reg[i];
    }
    if (rounds_out)
        *rounds_out = round;
    free(m);
    free(lm);
    free(with);
    free(got);
    free(map);
    return ok ? pairs : -1;
}

static void test_sampling_many_nodes(void)
{
    uint64_t seed = 777;
    int n = 1000, rounds = 0;
    int *reg = malloc(sizeof(int) * (size_t)n);
    long all = (long)n * (n - 1) / 2;

    /* 4 regions of 400, 300, 200 and 100 nodes, ranks placed region by
     * region: round 0's 16 landmarks fall in every region. */
    for (int i = 0; i < n; i++)
        reg[i] = i < 400 ? 0 : i < 700 ? 1 : i < 900 ? 2 : 3;
    long p = sampled_regions(n, reg, 16, &rounds, &seed);
    CU_ASSERT(p > 0 && p <= (long)n * 16);
    CU_ASSERT_EQUAL(rounds, 1);
    printf("\n   1000 nodes, 4 regions: %ld of %ld pairs measured, %d round(s)", p, all, rounds);

    /* Interleaved: node i in region i % 7. */
    for (int i = 0; i < n; i++)
        reg[i] = i % 7;
    p = sampled_regions(n, reg, 16, &rounds, &seed);
    CU_ASSERT(p > 0 && p <= (long)n * 16);

    /* A big region and 5 small ones of 3 nodes that no landmark of round
     * 0 hits (nodes 1-3, 5-7, ...: the landmarks are 0, 62, 125, ...). */
    for (int i = 0; i < n; i++)
        reg[i] = 0;
    for (int g = 0; g < 5; g++)
        for (int j = 1; j <= 3; j++)
            reg[g * 4 + j] = g + 1;
    p = sampled_regions(n, reg, 16, &rounds, &seed);
    CU_ASSERT(p > 0 && p <= (long)n * 16 + 400);
    CU_ASSERT(rounds >= 2);
    printf("; 1 big + 5 small regions: %ld pairs, %d rounds", p, rounds);

    /* Every node a region of its own: the rounds still end, no region
     * joined, at most about all the pairs. */
    n = 300;
    for (int i = 0; i < n; i++)
        reg[i] = i;
    p = sampled_regions(n, reg, 16, &rounds, &seed);
    CU_ASSERT(p > 0 && p <= (long)n * (n - 1) / 2);
    printf("; 300 lone nodes: %ld pairs, %d rounds", p, rounds);

    /* Few nodes (n <= 2 k0): every pair, in one round. */
    n = 20;
    for (int i = 0; i < n; i++)
        reg[i] = i % 3;
    p = sampled_regions(n, reg, 16, &rounds, &seed);
    CU_ASSERT_EQUAL(p, 20 * 19 / 2);
    CU_ASSERT_EQUAL(rounds, 1);

    /* The probe's test setting, landmarks = 1: 2 regions x 2 nodes. */
    int four[] = {0, 0, 1, 1};
    p = sampled_regions(4, four, 1, &rounds, &seed);
    CU_ASSERT(p > 0 && p < 6);
    CU_ASSERT(rounds >= 2);
    free(reg);
}

static void test_unmeasured_and_chain(void)
{
    /* 0-1 and 1-2 close, 0-2 unmeasured both ways, 3 far: {0,1,2} {3}.
     * Pair 1-3 measured in one direction only. */
    double m[16];
    for (int i = 0; i < 16; i++)
        m[i] = -1;
    for (int i = 0; i < 4; i++)
        m[i * 4 + i] = 0;
    m[0 * 4 + 1] = m[1 * 4 + 0] = 0.1 * MS;
    m[1 * 4 + 2] = m[2 * 4 + 1] = 0.3 * MS;
    m[1 * 4 + 3] = 40 * MS;
    m[0 * 4 + 3] = m[3 * 4 + 0] = NAN;
    int want[] = {0, 0, 0, 1};
    expect_regions(4, m, want, 2);
    /* A pair measured as 0.2 ms one way and 45 ms the other: the smaller
     * counts (a late answer only ever adds delay). */
    int reg2[] = {0, 1};
    double m2[4] = {0, 0.2 * MS, 45 * MS, 0};
    int want2[] = {0, 0};
    (void)reg2;
    expect_regions(2, m2, want2, 1);
}

static void test_oneway(void)
{
    /* d = 25, 10, 5, 40 ms: recovered exactly from the pair sums. */
    double d[] = {25 * MS, 10 * MS, 5 * MS, 40 * MS}, rtt[16], got[4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            rtt[i * 4 + j] = i == j ? 0 : d[i] + d[j];
    topoSolveOneWay(4, rtt, got);
    for (int i = 0; i < 4; i++)
        CU_ASSERT_DOUBLE_EQUAL(got[i], d[i], 1e-6);
    double r3[9];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            r3[i * 3 + j] = i == j ? 0 : d[i] + d[j];
    topoSolveOneWay(3, r3, got);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_DOUBLE_EQUAL(got[i], d[i], 1e-6);
    /* Two regions: an even split. */
    double two[4] = {0, 30 * MS, 30 * MS, 0};
    topoSolveOneWay(2, two, got);
    CU_ASSERT_DOUBLE_EQUAL(got[0], 15 * MS, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(got[1], 15 * MS, 1e-9);
}

static void test_streams(void)
{
    /* 1 Gbit/s x 50 ms = 6.25 MB: one 8 MB window suffices, 2 MB needs 4. */
    CU_ASSERT_EQUAL(topoStreamsNeeded(125e6, 0.05, 8e6, 64), 1);
    CU_ASSERT_EQUAL(topoStreamsNeeded(125e6, 0.05, 2e6, 64), 4);
    CU_ASSERT_EQUAL(topoStreamsNeeded(1.25e9, 0.1, 1e6, 16), 16);
    CU_ASSERT_EQUAL(topoStreamsNeeded(0, 0.05, 1e6, 16), 1);
}

static void test_steady_rate(void)
{
    /* Slow start: the first messages take longer; then 10 ms per 1 MB. */
    double t[20], b[20];
    double now = 0;
    for (int i = 0; i < 20; i++) {
        now += i < 5 ? 0.05 : 0.01;
        t[i] = now;
        b[i] = 1e6;
    }
    double r = topoSteadyRate(20, t, b, 0.5, 1.0);
    CU_ASSERT_DOUBLE_EQUAL(r, 1e8, 1e8 * 0.01);
    CU_ASSERT_EQUAL(topoSteadyRate(2, t, b, 0.5, 1.0), 0);
    /* A drain at twice the rate after 80% of the duration is left out. */
    for (int i = 15; i < 20; i++)
        t[i] = t[14] + (i - 14) * 0.005;
    r = topoSteadyRate(20, t, b, 0.5, 0.8);
    CU_ASSERT_DOUBLE_EQUAL(r, 1e8, 1e8 * 0.05);
}

/* The local NICs: whatever this machine has, the list is sane; loopback
 * and names that are not interfaces have no rate. */
static void test_nics(void)
{
    topoNic nics[32];
    int n = topoNicList(nics, 32);
    CU_ASSERT(n >= 0 && n <= 32);
    for (int i = 0; i < n; i++) {
        CU_ASSERT(nics[i].name[0] != '\0');
        CU_ASSERT_STRING_NOT_EQUAL(nics[i].name, "lo"); /* loopback left out */
        CU_ASSERT(nics[i].gbit == -1 || nics[i].gbit > 0);
    }
    CU_ASSERT_EQUAL(topoNicSpeed("lo"), -1);
    CU_ASSERT_EQUAL(topoNicSpeed("no-such-interface"), -1);
    CU_ASSERT_EQUAL(topoNicSpeed("../../../etc"), -1);
    CU_ASSERT_EQUAL(topoNicSpeed(NULL), -1);
    CU_ASSERT_EQUAL(topoNicList(nics, 0), 0);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return CU_get_error();
    CU_pSuite s = CU_add_suite("regions from RTTs", NULL, NULL);
    if (s == NULL) {
        CU_cleanup_registry();
        return CU_get_error();
    }
    CU_add_test(s, "two interleaved regions", test_two_regions);
    CU_add_test(s, "four regions, asymmetric RTTs", test_three_regions_asymmetric);
    CU_add_test(s, "nodes all far apart", test_all_far_apart);
    CU_add_test(s, "one region", test_one_region);
    CU_add_test(s, "jitter does not split a region", test_jitter_does_not_split);
    CU_add_test(s, "unmeasured pairs, chains, one-way answers", test_unmeasured_and_chain);
    CU_add_test(s, "sampled round trips for 1000 nodes find the regions",
                test_sampling_many_nodes);
    CU_add_test(s, "one-way delays from RTTs", test_oneway);
    CU_add_test(s, "streams for the bandwidth-delay product", test_streams);
    CU_add_test(s, "steady-state rate", test_steady_rate);
    CU_add_test(s, "local NICs", test_nics);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failures = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failures != 0;
}
