/*
 * Re-planning while the job runs (topology/replan.h), called directly:
 * the rule (a run of observed calls outside the band, in one direction,
 * fires once with their mean; inside the band, a flapping link, a call not
 * observed: no re-plan), and the cost model's time for the plan made again
 * on the new figures against the bound of those links.
 */
#define _GNU_SOURCE
#include "config.h"
#include "topology/model.h"
#include "topology/replan.h"
#include "topology/topofile.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define MBIT (1e6 / 8)

static char names[3][32] = {"r0", "r1", "r2"};

static int observe(topoReplanState *s, double o0, double *next)
{
    double plan[3] = {100 * MBIT, 100 * MBIT, 100 * MBIT};
    double obs[3] = {o0, 97 * MBIT, 99 * MBIT}, busy[3] = {0.95, 0.9, 0.9};
    char why[256];
    return topoReplanObserve(s, 3, plan, NULL, obs, busy, NULL, NULL, 0.25, 2, names, next, why, sizeof(why));
}

static void test_steady(void)
{
    topoReplanState s;
    double next[3];
    memset(&s, 0, sizeof(s));
    for (int i = 0; i < 50; i++)
        CU_ASSERT_EQUAL(observe(&s, (80 + i % 40) * MBIT, next), 0);
    CU_ASSERT_EQUAL(s.replans, 0);
}

static void test_drop(void)
{
    topoReplanState s;
    double next[3];
    memset(&s, 0, sizeof(s));
    /* a settled link first: two readings within the band */
    CU_ASSERT_EQUAL(observe(&s, 95 * MBIT, next), 0);
    CU_ASSERT_EQUAL(observe(&s, 97 * MBIT, next), 0);
    CU_ASSERT_EQUAL(observe(&s, 24 * MBIT, next), 0);
    CU_ASSERT_EQUAL(observe(&s, 26 * MBIT, next), 1);
    CU_ASSERT_DOUBLE_EQUAL(next[0], 25 * MBIT, 1);
    CU_ASSERT_DOUBLE_EQUAL(next[1], 100 * MBIT, 1); /* the others keep the plan's */
    CU_ASSERT_DOUBLE_EQUAL(next[2], 100 * MBIT, 1);
    CU_ASSERT_EQUAL(s.replans, 1);
    /* the runs start again: one more low call alone does not fire */
    CU_ASSERT_EQUAL(observe(&s, 24 * MBIT, next), 0);
}

/* Without two settled readings before it, a run must last twice as long. */
static void test_unsettled(void)
{
    topoReplanState s;
    double next[3];
    memset(&s, 0, sizeof(s));
    CU_ASSERT_EQUAL(observe(&s, 24 * MBIT, next), 0);
    CU_ASSERT_EQUAL(observe(&s, 24 * MBIT, next), 0);
    CU_ASSERT_EQUAL(observe(&s, 24 * MBIT, next), 0);
    CU_ASSERT_EQUAL(observe(&s, 24 * MBIT, next), 1);
}

/* A link flapping between 25 and 100 Mbit/s every 2 s under 2-4 s calls:
 * readings in pairs of about 45 and 65 Mbit/s.  One re-plan for the
 * flapping, none while it lasts, one when it settles at 95. */
static void test_flapping_pairs(void)
{
    topoReplanState s;
    double next[3], plan[3] = {100 * MBIT, 100 * MBIT, 100 * MBIT};
    double busy[3] = {0.95, 0.5, 0.5}, obs[3] = {0, 99 * MBIT, 98 * MBIT};
    const double seq[] = {96, 97, 46, 46, 65, 65, 43, 43, 63, 64, 44, 43, 62, 63, 44, 44,
                          65, 64, 43, 44, 95, 95, 96, 94, 95, 96};
    int fired_at[8], nf = 0;
    char why[256];
    memset(&s, 0, sizeof(s));
    for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
        obs[0] = seq[i] * MBIT;
        if (topoReplanObserve(&s, 3, plan, NULL, obs, busy, NULL, NULL, 0.25, 2, names, next, why, 256)) {
            if (nf < 8)
                fired_at[nf] = (int)i;
            nf++;
            memcpy(plan, next, sizeof(plan));
        }
    }
    CU_ASSERT_EQUAL(nf, 2);
    if (nf == 2) {
        CU_ASSERT_EQUAL(fired_at[0], 3);     /* the drop, after a settled start */
        CU_ASSERT(fired_at[1] >= 20 && fired_at[1] <= 23); /* settled at 95 */
        CU_ASSERT(plan[0] > 90 * MBIT);
    }
}

/* Two settled calls (readings `calm`, busy `cbusy`, full `cfull`), then two
 * reading `obs`: the first three must not re-plan; returns what the fourth
 * answers (1: re-planned, next[] the new figures, why the reason). */
static int settle_then_change(topoReplanState *s, const double *plan, const double *known,
                              const double *calm, const double *cbusy, const double *cfull,
                              const double *obs, const double *busy, const double *full,
                              double *next, char *why)
{
    memset(s, 0, sizeof(*s));
    for (int i = 0; i < 2; i++)
        CU_ASSERT_EQUAL(topoReplanObserve(s, 3, plan, known, calm, cbusy, cfull, NULL, 0.25, 2, names,
                                          next, why, 256), 0);
    CU_ASSERT_EQUAL(topoReplanObserve(s, 3, plan, known, obs, busy, full, NULL, 0.25, 2, names, next,
                                      why, 256), 0);
    return topoReplanObserve(s, 3, plan, known, obs, busy, full, NULL, 0.25, 2, names, next, why, 256);
}

static void test_flapping(void)
{
    topoReplanState s;
    double next[3];
    memset(&s, 0, sizeof(s));
    /* low, high, low, ...: never two in a row on one side */
    for (int i = 0; i < 40; i++)
        CU_ASSERT_EQUAL(observe(&s, (i % 2 ? 180 : 25) * MBIT, next), 0);
    /* a call that was not observed ends a run */
    CU_ASSERT_EQUAL(observe(&s, 25 * MBIT, next), 0);
    CU_ASSERT_EQUAL(observe(&s, 0, next), 0);
    CU_ASSERT_EQUAL(observe(&s, 25 * MBIT, next), 0);
    CU_ASSERT_EQUAL(s.replans, 0);
}

/* A region that did not limit the call (busy under TOPO_REPLAN_BUSY_MIN)
 * reads slow without being slow: its bursts end in round trips. */
static void test_not_limiting(void)
{
    topoReplanState s;
    double next[3];
    char why[256];
    double plan[3] = {1000 * MBIT, 1000 * MBIT, 1000 * MBIT};
    double obs[3] = {250 * MBIT, 260 * MBIT, 265 * MBIT}, busy[3] = {0.98, 0.5, 0.45};
    double calm[3] = {990 * MBIT, 400 * MBIT, 400 * MBIT};
    CU_ASSERT_EQUAL(settle_then_change(&s, plan, NULL, calm, busy, NULL, obs, busy, NULL, next, why), 1);
    CU_ASSERT_DOUBLE_EQUAL(next[0], 250 * MBIT, 1);
    CU_ASSERT_DOUBLE_EQUAL(next[1], 1000 * MBIT, 1);
    CU_ASSERT_DOUBLE_EQUAL(next[2], 1000 * MBIT, 1);
}

static void test_rise(void)
{
    topoReplanState s;
    double next[3];
    char why[256] = "";
    double plan[3] = {300 * MBIT, 300 * MBIT, 100 * MBIT};
    double obs[3] = {900 * MBIT, 950 * MBIT, 100 * MBIT}, busy[3] = {0.2, 0.3, 1};
    double calm[3] = {300 * MBIT, 310 * MBIT, 100 * MBIT};
    double known[3] = {300 * MBIT, 300 * MBIT, 100 * MBIT}; /* a probe that misread */
    /* faster: counted however little the region was busy */
    CU_ASSERT_EQUAL(settle_then_change(&s, plan, known, calm, busy, NULL, obs, busy, NULL, next, why), 1);
    CU_ASSERT_DOUBLE_EQUAL(next[0], 900 * MBIT, 1);
    CU_ASSERT_DOUBLE_EQUAL(next[1], 950 * MBIT, 1);
    CU_ASSERT_DOUBLE_EQUAL(next[2], 100 * MBIT, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "r0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "r1"));
    CU_ASSERT_PTR_NULL(strstr(why, "r2"));
}

/* A link cut and back: the region planned at 23 Mbit/s with no share sends
 * only its own data, finishes first and reads 77 at 80% busy.  That is a
 * floor: the plan takes the probe's figure (96) again.  Read with its
 * uplink full (95% busy), a faster figure is taken as it is. */
/* Two settled calls, then two at 77 Mbit/s with region 0's uplink busy
 * busy0 of the call: the figure the re-plan gives region 0 (0: none). */
static double return_after_cut(double busy0, char *why)
{
    topoReplanState s;
    double next[3];
    double plan[3] = {23.3 * MBIT, 97 * MBIT, 92 * MBIT};
    double known[3] = {96 * MBIT, 97 * MBIT, 92 * MBIT};
    double calm[3] = {23.3 * MBIT, 97 * MBIT, 92 * MBIT}, cbusy[3] = {1, 0.4, 0.4};
    double obs[3] = {77 * MBIT, 92 * MBIT, 92 * MBIT}, busy[3] = {busy0, 1, 1};
    if (settle_then_change(&s, plan, known, calm, cbusy, NULL, obs, busy, NULL, next, why) != 1)
        return 0;
    return next[0];
}

static void test_return_floor(void)
{
    char why[256] = "";
    CU_ASSERT_DOUBLE_EQUAL(return_after_cut(0.8, why), 96 * MBIT, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "at least 77.0"));
    /* the same readings with the uplink full: the link gives 77 */
    CU_ASSERT_DOUBLE_EQUAL(return_after_cut(0.95, why), 77 * MBIT, 1);
    CU_ASSERT_PTR_NULL(strstr(why, "at least"));
}

/* 1 Gbit/s each, region 0's uplink cut to 250: the two fast regions forward
 * region 0's data as it comes, so every region reads 230-260 Mbit/s with
 * its uplink busy the whole call; only region 0's sockets were full
 * (100% of the call against 15%).  Only region 0 is planned slower.
 * Without the full shares, all three were (equal shares again, 1.49x the
 * bound on the emulated WAN). */
static void test_drop_forwarded(void)
{
    topoReplanState s;
    double next[3];
    char why[256] = "";
    double plan[3] = {963 * MBIT, 962 * MBIT, 961 * MBIT};
    double obs[3] = {232 * MBIT, 253 * MBIT, 233 * MBIT}, busy[3] = {1, 0.99, 1};
    double full[3] = {1, 0.15, 0.16};
    CU_ASSERT_EQUAL(settle_then_change(&s, plan, plan, plan, busy, full, obs, busy, full, next, why), 1);
    CU_ASSERT_DOUBLE_EQUAL(next[0], 232 * MBIT, 1);
    CU_ASSERT_DOUBLE_EQUAL(next[1], 962 * MBIT, 1);
    CU_ASSERT_DOUBLE_EQUAL(next[2], 961 * MBIT, 1);
    CU_ASSERT_PTR_NULL(strstr(why, "r1"));
    /* every region full alike (a route change): all three count (with no
     * settled readings before, after four calls) */
    double full_all[3] = {0.95, 0.9, 0.92};
    memset(&s, 0, sizeof(s));
    for (int i = 0; i < 4; i++)
        topoReplanObserve(&s, 3, plan, plan, obs, busy, full_all, NULL, 0.25, 2, names, next, why, 256);
    CU_ASSERT_EQUAL(s.replans, 1);
    CU_ASSERT_DOUBLE_EQUAL(next[1], 253 * MBIT, 1);
    /* nobody's sockets full (the transport counts none): busy decides alone */
    double none[3] = {0, 0, 0};
    memset(&s, 0, sizeof(s));
    for (int i = 0; i < 4; i++)
        topoReplanObserve(&s, 3, plan, plan, obs, busy, none, NULL, 0.25, 2, names, next, why, 256);
    CU_ASSERT_EQUAL(s.replans, 1);
    CU_ASSERT_DOUBLE_EQUAL(next[2], 233 * MBIT, 1);
}

/* The return of that link: region 0, given no share, reads 584 Mbit/s busy
 * the whole call but full only 60% of it (it sends its own data once, in
 * the stages the region's reduction yields it).  A floor: the probe's 963
 * is taken again. */
static void test_return_full_floor(void)
{
    topoReplanState s;
    double next[3];
    char why[256] = "";
    double plan[3] = {242 * MBIT, 962 * MBIT, 961 * MBIT};
    double known[3] = {963 * MBIT, 962 * MBIT, 961 * MBIT};
    double obs[3] = {584 * MBIT, 888 * MBIT, 880 * MBIT}, busy[3] = {1, 1, 1};
    double full[3] = {0.6, 0.99, 0.92};
    CU_ASSERT_EQUAL(settle_then_change(&s, plan, known, plan, busy, full, obs, busy, full, next, why), 1);
    CU_ASSERT_DOUBLE_EQUAL(next[0], 963 * MBIT, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "at least 584.0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "60% full"));
}

/* Region 0 planned at 242 Mbit/s (its link was cut from 1 Gbit/s) and
 * paced at 1.2x that; the others at their probe's figures.  While its link
 * stays cut it reads under 0.9 of its cap: no re-plan.  When the link
 * comes back its connections run at their cap (282 of 290): inside the
 * band, but held by the cap, so a floor, and two such calls go back to the
 * probe's 963.  Region 1 at its cap is no evidence: never planned lower.
 * Without the caps the same readings stay inside the band. */
static void test_return_held_at_cap(void)
{
    double plan[3] = {242 * MBIT, 962 * MBIT, 961 * MBIT};
    double known[3] = {963 * MBIT, 962 * MBIT, 961 * MBIT};
    double cap[3] = {290 * MBIT, 1154 * MBIT, 1153 * MBIT};
    double calm[3] = {245 * MBIT, 900 * MBIT, 890 * MBIT}, busy[3] = {1, 1, 1};
    double back[3] = {282 * MBIT, 1100 * MBIT, 890 * MBIT};
    double full[3] = {1, 0.2, 0.2};
    for (int with_cap = 1; with_cap >= 0; with_cap--) {
        topoReplanState s;
        double next[3];
        char why[256] = "";
        const double *c = with_cap ? cap : NULL;
        memset(&s, 0, sizeof(s));
        for (int i = 0; i < 4; i++)
            CU_ASSERT_EQUAL(topoReplanObserve(&s, 3, plan, known, calm, busy, full, c, 0.25, 2,
                                              names, next, why, 256), 0);
        CU_ASSERT_EQUAL(topoReplanObserve(&s, 3, plan, known, back, busy, full, c, 0.25, 2,
                                          names, next, why, 256), 0);
        int fired = topoReplanObserve(&s, 3, plan, known, back, busy, full, c, 0.25, 2, names,
                                      next, why, 256);
        CU_ASSERT_EQUAL(fired, with_cap);
        if (fired && with_cap) {
            CU_ASSERT_DOUBLE_EQUAL(next[0], 963 * MBIT, 1);
            CU_ASSERT_DOUBLE_EQUAL(next[1], 962 * MBIT, 1);
            CU_ASSERT_PTR_NOT_NULL(strstr(why, "2 held at the pace's cap"));
        }
    }
}

/* 3 regions x 2 ranks, 25 ms one way, region 0's uplink at `r0` Mbit/s,
 * the others at 100: the model of the emulated WAN, as --simulate builds it. */
static void model_3x2(topoModel *m, const char *r0)
{
    char text[512], err[256] = "";
    topoFile tf;
    snprintf(text, sizeof(text),
             "region r0 bw=%s delay=25 ranks=2\nregion r1 bw=100mbit delay=25 ranks=2\n"
             "region r2 bw=100mbit delay=25 ranks=2\nintra bw=140M delay=0.2\n", r0);
    CU_ASSERT_EQUAL_FATAL(topoFileParse(text, "emu", &tf, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL_FATAL(topoModelFromFile(&tf, m, err, sizeof(err)), 0);
    topoFileFree(&tf);
}

/* The capacity drop of the benchmark (region 0's uplink 100 -> 25 Mbit/s,
 * 16 MiB): on the new links equal shares cost about what the issue
 * measured (7.2 s), the shares made again from the new figure come within
 * 1.15x of the uneven bound (5.37 s: the slow region sends the whole
 * buffer once, 16 MiB x 8 / 25 Mbit/s), and the model's time for them is
 * what the benchmark compares its calls with. */
static void test_model_after_drop(void)
{
    topoModel m;
    unsigned w[TOPO_MODEL_MAX_REGIONS];
    model_3x2(&m, "25mbit");
    const size_t bytes = (size_t)16 << 20;
    double bound = (double)bytes * 8 / 25e6;
    m.hier_equal = 1;
    topoHierShares(&m, w);
    double equal = topoHierWanPerByte(&m, w) * (double)bytes;
    m.hier_equal = 0;
    CU_ASSERT_EQUAL(topoHierShares(&m, w), 1);
    double uneven = topoHierWanPerByte(&m, w) * (double)bytes;
    double t = topoPredict(&m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, bytes, 0, 0);
    printf("\n    16 MiB after the drop: WAN time equal shares %.2f s, re-planned %.2f s, "
           "predicted call %.2f s, bound %.2f s", equal, uneven, t, bound);
    CU_ASSERT(equal > 1.25 * bound);
    CU_ASSERT(uneven < 1.10 * bound);
    CU_ASSERT(t > 0 && t < 1.15 * bound);
    CU_ASSERT(w[0] < w[1] / 2);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("replan", NULL, NULL);
    CU_add_test(s, "inside the band: never", test_steady);
    CU_add_test(s, "a drop held two calls: once, with their mean", test_drop);
    CU_add_test(s, "a flapping link or a call not observed: never", test_flapping);
    CU_add_test(s, "not settled before: twice the run", test_unsettled);
    CU_add_test(s, "flapping in pairs: once for it, once when it settles", test_flapping_pairs);
    CU_add_test(s, "faster links: only those regions", test_rise);
    CU_add_test(s, "faster while not limiting: a floor under the probe's figure",
                test_return_floor);
    CU_add_test(s, "slower only where the region limited the call", test_not_limiting);
    CU_add_test(s, "slower where busy alike: only the region whose sockets were full",
                test_drop_forwarded);
    CU_add_test(s, "faster while not full: a floor", test_return_full_floor);
    CU_add_test(s, "a lowered region at its pace's cap: a floor", test_return_held_at_cap);
    CU_add_test(s, "the model on the new links", test_model_after_drop);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failures = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failures != 0;
}
