/* The topology probe's run (probe.h): the nodes, the order of its stages
 * (round trips, regions, region-level figures, bandwidth, streams,
 * congestion control, warm-up), the stream counts per WAN pair, the
 * warm-up of the WAN connections, and the helpers every stage uses.  The
 * stages themselves: probe_rtt.c, probe_bw.c, probe_known.c
 * (probe_internal.h). */
#include "config.h"
#include "topology/probe.h"
#include "topology/probe_internal.h"
#include "comm/base/checks.h"
#include "comm/transport/transport.h"
#include "comm/base/param.h"
#include "topology/cluster.h"
#include "topology/model.h"
#include "topology/nics.h"
#include "topology/wan_tuning.h"

#include <arpa/inet.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void geoTopoFree(geoTopo *t)
{
    free(t->node_of);
    free(t->leader);
    free(t->node_addr);
    free(t->rtt);
    free(t->nic_gbit);
    free(t->bw);
    free(t->egress);
    free(t->ingress);
    free(t->loss);
    free(t->loss_segs);
    free(t->rttvar);
    free(t->wan_choice);
    free(t->wan_why);
    free(t->region_rtt);
    free(t->oneway);
    free(t->fresh);
    memset(t, 0, sizeof(*t));
}

/* A poll loop's deadline: the communicator's timeout, as for every wait. */
ncclResult_t probeCheckDeadline(geoProbeCtx *pc, double deadline, const char *what)
{
    if (geoErrAborted(pc->err)) {
        geoNetBreak(pc->net);
        return GEO_ERR(pc->err, ncclRemoteError, "init: probe %s: communicator aborted", what);
    }
    if (geoNow() > deadline) {
        geoNetBreak(pc->net);
        return GEO_ERR(pc->err, ncclRemoteError, "init: probe %s: no answer within "
                       "GEOCCL_TIMEOUT (%.0f s)", what, pc->timeout);
    }
    return ncclSuccess;
}

/* ---- nodes -------------------------------------------------------------- */

static ncclResult_t find_nodes(geoProbeCtx *pc, geoTopo *t)
{
    int n = pc->nranks;
    t->node_of = malloc(sizeof(int) * (size_t)n);
    t->leader = malloc(sizeof(int) * (size_t)n);
    t->node_addr = malloc(sizeof(*t->node_addr) * (size_t)n);
    t->nic_gbit = malloc(sizeof(double) * (size_t)n);
    if (!t->node_of || !t->leader || !t->node_addr || !t->nic_gbit)
        return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d ranks", n);
    for (int k = 0; k < n; k++)
        t->nic_gbit[k] = -1;
    t->nnodes = 0;
    for (int r = 0; r < n; r++) {
        char a[GEO_ADDR_STRLEN];
        geoAddrHost(&pc->net->ctx.peers[r].addr, a);
        int k;
        for (k = 0; k < t->nnodes; k++)
            if (strcmp(t->node_addr[k], a) == 0)
                break;
        if (k == t->nnodes) {
            memcpy(t->node_addr[k], a, 64);
            t->leader[k] = r;
            t->nnodes++;
        }
        t->node_of[r] = k;
    }
    t->nic_gbit[t->node_of[pc->rank]] = topoNicSpeed(pc->if_name);
    return ncclSuccess;
}

/* ---- small exchanges ---------------------------------------------------- */

/* Every rank in ranks[] sends its len bytes to every other; all[i*len] gets
 * ranks[i]'s.  Only members call it. */
ncclResult_t probeExchangeAmong(geoProbeCtx *pc, const int *ranks, int n, int me,
                                const void *mine, size_t len, void *all)
{
    geoNetRequest *rq = calloc((size_t)2 * (size_t)n, sizeof(geoNetRequest));
    ncclResult_t res = ncclSuccess;
    if (rq == NULL)
        return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d requests",
                       2 * n);
    memcpy((char *)all + (size_t)me * len, mine, len);
    for (int i = 0; i < n && res == ncclSuccess; i++) {
        if (i == me)
            continue;
        res = geoNetIrecv(pc->net, ranks[i], (char *)all + (size_t)i * len, len, &rq[2 * i]);
        if (res == ncclSuccess)
            res = geoNetIsend(pc->net, ranks[i], mine, len, &rq[2 * i + 1]);
    }
    for (int i = 0; i < 2 * n; i++) {
        if (i / 2 == me || rq[i].buf == NULL)
            continue;
        ncclResult_t r = geoNetWait(pc->net, &rq[i]);
        if (res == ncclSuccess)
            res = r;
    }
    free(rq);
    return res;
}

/* src sends len bytes to each of dst[] (src itself skipped). */
ncclResult_t probeFanOut(geoProbeCtx *pc, int src, const int *dst, int n, void *buf,
                         size_t len)
{
    if (pc->rank != src) {
        geoNetRequest r;
        GEO_CHECK(geoNetIrecv(pc->net, src, buf, len, &r));
        return geoNetWait(pc->net, &r);
    }
    geoNetRequest *rq = calloc((size_t)(n > 0 ? n : 1), sizeof(geoNetRequest));
    ncclResult_t res = ncclSuccess;
    if (rq == NULL)
        return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d requests",
                       n);
    for (int i = 0; i < n && res == ncclSuccess; i++)
        if (dst[i] != src)
            res = geoNetIsend(pc->net, dst[i], buf, len, &rq[i]);
    for (int i = 0; i < n; i++)
        if (dst[i] != src && rq[i].buf != NULL) {
            ncclResult_t r = geoNetWait(pc->net, &rq[i]);
            if (res == ncclSuccess)
                res = r;
        }
    free(rq);
    return res;
}

/* ---- the log and the streams ------------------------------------------- */

static void log_matrix(const geoTopo *t, int R)
{
    if (geoDebugLevel() < GEO_LEVEL_INFO)
        return;
    char line[512];
    for (int i = 0; i < R; i++) {
        int len = snprintf(line, sizeof(line), "probe: region %d ->", i);
        for (int j = 0; j < R && len < (int)sizeof(line) - 64; j++) {
            len += snprintf(line + len, sizeof(line) - (size_t)len, " %d:%.1fms/%.0fMbit", j,
                            t->region_rtt[i * R + j] * 1e3,
                            t->bw ? t->bw[i * R + j] * 8e-6 : 0.0);
            if (t->loss != NULL && t->loss[i * R + j] >= 0 && j != i)
                len += snprintf(line + len, sizeof(line) - (size_t)len, "/loss %.2g%% of %.0f",
                                t->loss[i * R + j] * 100, t->loss_segs[i * R + j]);
        }
        geoInfo(GEO_LOG_TOPO, "%s", line);
    }
}

/* Connections each WAN pair uses: as many as its link's bandwidth-delay
 * product needs at the smallest window (topoStreamsNeeded, the larger of
 * the two directions), at most the number connected, but only on links fast
 * enough that more streams than needed cost something.  TCP sizes its
 * segmentation-offload packets at about 1 ms of a stream's rate (2 segments
 * at least): where each connection of a hierarchical exchange would carry
 * 50 Mbit/s or more (a region's rate over its ranks and the connections),
 * fewer streams mean larger packets and fewer of them through every stack
 * on the way (measured, 3 emulated regions x 2 ranks at 1 Gbit/s, 256 MiB
 * all-reduce: 2 streams 4.1 s, 1 stream 3.2-3.3 s); on slower links the
 * packets are minimal either way, and two streams per pair kept a 100 Mbit/s
 * link fuller (64 MiB: 7.70 s against 8.00-8.04 s with one, twice each).
 * Computed from figures every rank holds (the link rates and round trips
 * the probe shared, or the topology file's), so both ends of a pair agree;
 * set at the end of the probe, where every pair's messages are matched.
 * GEOCCL_NSTREAMS given by hand: all of them, always. */
#define PROBE_BUSY_STREAM_BPS (50e6 / 8) /* 1 ms of it: 4 segments */

/* Whether each connection of a hierarchical exchange between regions g and
 * h would carry PROBE_BUSY_STREAM_BPS or more (rates g -> h and h -> g). */
static int pair_busy(const geoProbeCtx *pc, double bgh, double bhg, int g, int h)
{
    double per_conn =
        fmin(bgh / pc->regions->size[g], bhg / pc->regions->size[h]) / pc->nstreams;
    return per_conn >= PROBE_BUSY_STREAM_BPS;
}

static void apply_streams(geoProbeCtx *pc, geoTopo *t)
{
    int R = pc->regions->nregions, mine = pc->regions->region_of[pc->rank];
    t->streams_used = pc->nstreams;
    if (pc->net->ops->setStreams == NULL || R < 2 || pc->streams_set || t->bw == NULL ||
        t->region_rtt == NULL || pc->nstreams < 2)
        return;
    int used = 0;
    for (int g = 0; g < R; g++)
        for (int h = g + 1; h < R; h++) {
            int n = pc->nstreams;
            double bgh = t->bw[g * R + h], bhg = t->bw[h * R + g];
            double rtt = t->region_rtt[g * R + h];
            if (bgh > 0 && bhg > 0 && rtt > 0 && pair_busy(pc, bgh, bhg, g, h)) {
                int a = topoStreamsNeeded(bgh * (R - 1), rtt, t->window_bytes, 64);
                int b = topoStreamsNeeded(bhg * (R - 1), rtt, t->window_bytes, 64);
                n = a > b ? a : b;
                n = n > pc->nstreams ? pc->nstreams : n;
            }
            used = n > used ? n : used;
            if (g != mine && h != mine)
                continue;
            for (int p = 0; p < pc->nranks; p++)
                if (pc->regions->region_of[p] == (g == mine ? h : g))
                    pc->net->ops->setStreams(pc->net->state, p, n);
        }
    t->streams_used = used;
}

/* ---- warming the WAN connections ---------------------------------------- */

/* Congestion control learns a connection's rate only from traffic that
 * fills it: BBR paces every connection at its own estimate of the
 * bottleneck and never raises it from an application-limited burst, and
 * cubic's window stays at its initial ten segments.  A connection that
 * only ever carries the bursts of small all-reduces therefore sends them
 * slower than the link allows: on 3 emulated regions x 2 ranks at 1 Gbit/s
 * under BBR, a 1 MiB hierarchical all-reduce took 75-81 ms where the
 * region leaders' connections, which the probe's bandwidth transfer had
 * filled, finished ~20 ms before the others, and 65-67 ms with cubic
 * (BENCHMARKS.md).  So, once the stream counts are set, every WAN pair of
 * the hierarchical exchange (geoHierExchangePlan's peers, on the streams
 * that pair uses) carries the probe's transfer for 10 round trips at once:
 * about what slow start needs to reach a fair share of a 1 Gbit/s link at
 * 50 ms, and each connection's share is then what it gets in a
 * hierarchical all-reduce.  Which pairs (GEOCCL_WAN_WARMUP, rank 0's): 2,
 * pairs of regions whose connections would each carry 50 Mbit/s or more
 * (pair_busy; on slower links a burst is a few packets either way); 1,
 * every pair; 0, none.  Decided from figures every rank holds, so both ends
 * of a pair agree.  It runs with a topology file too (no measurement), and
 * its time is reported apart from the probe's (t_warm). */
static ncclResult_t warm_wan(geoProbeCtx *pc, geoTopo *t)
{
    const topoRegionMap *m = pc->regions;
    int R = m->nregions, mode = pc->warmup, g = m->region_of[pc->rank];
    double maxrtt = 0;
    ncclResult_t res;

    t->warm_pairs = 0;
    /* More than 64 regions: no hierarchical exchange (coll_hier.c), no pairs. */
    if (mode == 0 || R < 2 || R > 64 || t->nnodes < 2 || t->region_rtt == NULL)
        return ncclSuccess;
    unsigned char *warm = calloc((size_t)R * (size_t)R, 1);
    if (warm == NULL)
        return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d regions "
                       "to warm", R);
    for (int a = 0; a < R; a++)
        for (int b = a + 1; b < R; b++) {
            double ab = geoWanPairRate(t, R, a, b), ba = geoWanPairRate(t, R, b, a);
            double rtt = t->region_rtt[a * R + b];
            if (rtt <= 0 || (mode == 2 && !(ab > 0 && ba > 0 && pair_busy(pc, ab, ba, a, b))))
                continue;
            warm[a * R + b] = warm[b * R + a] = 1;
            t->warm_pairs++;
            maxrtt = rtt > maxrtt ? rtt : maxrtt;
        }
    if (t->warm_pairs == 0) {
        free(warm);
        return ncclSuccess;
    }
    /* My partners in the exchange, once each, in the regions warmed with
     * mine.  The relation is symmetric (a piece's owners in two regions
     * exchange both ways), so each partner runs the transfer with me. */
    int *partners = NULL, np = 0;
    res = pc->partners(pc->arg, &partners, &np);
    if (res != ncclSuccess) {
        free(warm);
        return res;
    }
    int *peers = malloc(sizeof(int) * (size_t)(np + 1)), n = 0;
    if (peers == NULL)
        res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d peers to "
                      "warm", np);
    for (int i = 0; peers && i < np; i++)
        if (warm[g * R + m->region_of[partners[i]]])
            peers[n++] = partners[i];
    free(partners);
    double t0 = geoNow(), *in = malloc(sizeof(double) * (size_t)(n + 1));
    if (in == NULL && res == ncclSuccess)
        res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d peers to "
                      "warm", n);
    if (res == ncclSuccess && n > 0) {
        double dur = 10 * maxrtt;
        dur = dur < 0.1 ? 0.1 : dur > 1.0 ? 1.0 : dur;
        res = probeBwTransfer(pc, peers, n, -1, dur, 0.3, 0.8, in);
    }
    if (res == ncclSuccess && n > 0) {
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += in[i];
        t->t_warm = geoNow() - t0;
        geoInfo(GEO_LOG_TOPO | GEO_LOG_INIT,
                "probe: warmed the WAN connections to %d peer%s in %d pair%s of regions: "
                "%.3f s, %.0f Mbit/s received in steady state", n, n == 1 ? "" : "s",
                t->warm_pairs, t->warm_pairs == 1 ? "" : "s", t->t_warm, sum * 8e-6);
    }
    free(in);
    free(peers);
    free(warm);
    return res;
}

/* ---- which pairs were measured ------------------------------------------ */

/* The pairs of regions whose link figures were measured and those taken
 * from the parent, counted for geocclCommGetTopology; with t->fresh, both
 * lists said at INFO (the same on every rank). */
static void count_pairs(const geoProbeCtx *pc, geoTopo *t, int R)
{
    const topoRegionMap *m = pc->regions;
    int all = R * (R - 1) / 2;
    t->pairs_measured = t->pairs_inherited = 0;
    if (t->fresh == NULL) {
        if (t->bw_measured)
            t->pairs_measured = all;
        else if (t->inherited)
            t->pairs_inherited = all;
        return;
    }
    char meas[512] = "", inh[512] = "";
    int lm = 0, li = 0;
    for (int g = 0; g < R; g++)
        for (int h = g + 1; h < R; h++) {
            int fresh = t->fresh[g] || t->fresh[h];
            char *line = fresh ? meas : inh;
            int *len = fresh ? &lm : &li;
            if (fresh && !t->bw_measured)
                continue;
            if (fresh)
                t->pairs_measured++;
            else
                t->pairs_inherited++;
            if (*len < (int)sizeof(meas) - 80)
                *len += snprintf(line + *len, sizeof(meas) - (size_t)*len, "%s%s-%s",
                                 *len ? " " : "", m->names[g], m->names[h]);
        }
    geoInfo(GEO_LOG_TOPO | GEO_LOG_INIT,
            "probe: regions new to the inherited figures: %d pair%s of regions measured (%s), "
            "%d inherited (%s)", t->pairs_measured, t->pairs_measured == 1 ? "" : "s",
            lm ? meas : "none", t->pairs_inherited, li ? inh : "none");
}

/* ---- the whole probe ---------------------------------------------------- */

ncclResult_t geoProbeRun(geoProbeCtx *pc)
{
    geoTopo *t = pc->topo;
    int mode = pc->mode; /* 0 off, 1 auto, 2 always measure */
    int labelled = pc->labelled;
    double t_start = geoNow();
    ncclResult_t res;

    GEO_CHECK(find_nodes(pc, t));
    geoErrSetOp(pc->err, "init probe");
    /* A parent's figures that leave out a region (one never seen before,
     * joining): only the pairs with it are measured, below. */
    if (mode == 1 && labelled && pc->inherit != NULL && probeInheritFresh(pc, t) != 0)
        return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d regions",
                       pc->regions->nregions);
    if (t->leader[t->node_of[pc->rank]] == pc->rank && geoDebugLevel() >= GEO_LEVEL_INFO) {
        topoNic nics[16];
        char line[512] = "none";
        int n = topoNicList(nics, 16), len = 0;
        for (int i = 0; i < n && len < (int)sizeof(line) - 64; i++) {
            char rate[24] = "rate unknown";
            if (nics[i].gbit > 0)
                snprintf(rate, sizeof(rate), "%g Gbit/s", nics[i].gbit);
            len += snprintf(line + len, sizeof(line) - (size_t)len, "%s%s%s %s%s", i ? ", " : "",
                            nics[i].name, nics[i].rdma ? " (rdma)" : "", rate,
                            nics[i].up ? "" : " (down)");
        }
        geoInfo(GEO_LOG_TOPO, "probe: local NICs: %s; data on %s", line, pc->if_name);
    }

    /* Round trips: to find regions, because asked to measure, or because the
     * bandwidth below will be measured between labelled regions: its
     * transfer lasts 12 round trips, and a guess too short for a long link
     * (0.25 s is 5 round trips at 50 ms) ends in slow start and reported
     * 130-160 Mbit/s on a 1 Gbit/s link. */
    int bw_next = labelled && pc->regions->nregions > 1 && !(pc->file != NULL) &&
                  (!(pc->inherit != NULL) || t->fresh != NULL);
    if (t->nnodes > 1 && (mode == 2 || (mode == 1 && (!labelled || bw_next)))) {
        double t0 = geoNow();
        GEO_CHECK(probeMeasureRtt(pc, t));
        t->t_rtt = geoNow() - t0;
        if (!labelled) {
            int *reg = malloc(sizeof(int) * (size_t)t->nnodes);
            int nreg = reg == NULL ? -1
                                   : topoClusterRtt(t->nnodes, t->rtt, TOPO_MIN_WAN_RTT,
                                                    TOPO_MAX_LAN_RTT, TOPO_MIN_GAP_RATIO, reg,
                                                    &t->cut);
            if (nreg < 0) {
                free(reg);
                return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory finding "
                               "the regions of %d nodes", t->nnodes);
            }
            if (nreg > 1) {
                int *of_rank = malloc(sizeof(int) * (size_t)pc->nranks);
                if (of_rank == NULL) {
                    free(reg);
                    return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for "
                                   "%d ranks", pc->nranks);
                }
                for (int r = 0; r < pc->nranks; r++)
                    of_rank[r] = reg[t->node_of[r]];
                res = pc->set_regions(pc->arg, of_rank);
                free(of_rank);
                if (res != ncclSuccess) {
                    free(reg);
                    return res;
                }
                t->regions_measured = 1;
            }
            geoInfo(GEO_LOG_TOPO, "probe: %d nodes form %d region%s (RTT cut %.2f ms)",
                    t->nnodes, nreg, nreg == 1 ? "" : "s", t->cut * 1e3);
            free(reg);
        }
    }

    /* Region-level figures. */
    int R = pc->regions->nregions;
    t->nregions = R;
    t->region_rtt = malloc(sizeof(double) * (size_t)R * (size_t)R);
    t->oneway = calloc((size_t)R, sizeof(double));
    t->bw = calloc((size_t)R * (size_t)R, sizeof(double));
    t->egress = calloc((size_t)R, sizeof(double));
    t->ingress = calloc((size_t)R, sizeof(double));
    t->loss = malloc(sizeof(double) * (size_t)R * (size_t)R);
    t->loss_segs = calloc((size_t)R * (size_t)R, sizeof(double));
    t->rttvar = calloc((size_t)R * (size_t)R, sizeof(double));
    if (!t->region_rtt || !t->oneway || !t->bw || !t->egress || !t->ingress || !t->loss ||
        !t->loss_segs ||
        !t->rttvar)
        return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for the figures "
                       "of %d regions", R);
    for (int i = 0; i < R * R; i++)
        t->region_rtt[i] = t->loss[i] = -1;
    if (t->rtt_measured)
        for (int a = 0; a < t->nnodes; a++)
            for (int b = 0; b < t->nnodes; b++) {
                double x = t->rtt[a * t->nnodes + b];
                int ga = pc->regions->region_of[t->leader[a]];
                int gb = pc->regions->region_of[t->leader[b]];
                double *y = &t->region_rtt[ga * R + gb];
                if (a != b && x >= 0 && (*y < 0 || x < *y))
                    *y = x;
            }
    /* A fresh region (t->fresh) may share its nodes with covered ones: its
     * round trips come from the nodes of all its ranks, not only of the
     * nodes' leaders (0 to a region on the same node). */
    if (t->rtt_measured && t->fresh != NULL)
        for (int r = 0; r < pc->nranks; r++)
            for (int q = 0; q < pc->nranks; q++) {
                int g = pc->regions->region_of[r], h = pc->regions->region_of[q];
                double x = t->rtt[t->node_of[r] * t->nnodes + t->node_of[q]];
                double *y = &t->region_rtt[g * R + h];
                if (g != h && (t->fresh[g] || t->fresh[h]) && x >= 0 && (*y < 0 || x < *y))
                    *y = x;
            }
    for (int g = 0; g < R; g++)
        t->region_rtt[g * R + g] = 0;
    if (t->rtt_measured)
        topoSolveOneWay(R, t->region_rtt, t->oneway);
    if ((pc->file != NULL))
        probeApplyFile(pc, t);
    if ((pc->inherit != NULL))
        probeApplyInherit(pc, t);
    /* The fresh regions' one-way delays, from the round trips measured and
     * inherited together; the covered regions keep the parent's. */
    if (t->rtt_measured && t->fresh != NULL) {
        double *d = malloc(sizeof(double) * (size_t)R);
        if (d == NULL)
            return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d "
                           "regions", R);
        topoSolveOneWay(R, t->region_rtt, d);
        for (int g = 0; g < R; g++)
            if (t->fresh[g])
                t->oneway[g] = d[g];
        free(d);
    }
    /* The smallest window of any rank, so that every rank computes the same
     * stream counts (apply_streams). */
    t->window_bytes = pc->window;
    if (t->window_bytes <= 0)
        t->window_bytes = geoProbeStreamWindow();
    t->streams_needed = pc->nstreams;
    /* Bandwidth: between regions on different nodes (labels on one host
     * have no link to measure), unless the topology file gave it. */
    if (R > 1 && t->nnodes > 1 && (mode == 2 || (mode == 1 && !t->from_file && !t->inherited))) {
        double t0 = geoNow();
        GEO_CHECK(probeMeasureBw(pc, t));
        GEO_CHECK(probeMeasureIntra(pc, t));
        t->t_bw = geoNow() - t0;
        double worst = 1;
        for (int g = 0; g < R; g++) {
            /* A covered region (t->fresh) keeps the parent's rate: it sent
             * to the fresh regions only. */
            int keep = t->fresh != NULL && !t->fresh[g];
            if (!keep)
                t->egress[g] = 0;
            for (int h = 0; h < R; h++)
                if (h != g) {
                    if (!keep)
                        t->egress[g] += t->bw[g * R + h];
                    /* Streams a pair needs when it has the link to itself. */
                    double s = (double)topoStreamsNeeded(
                        t->bw[g * R + h] * (R - 1), t->region_rtt[g * R + h], t->window_bytes,
                        64);
                    if (s > worst)
                        worst = s;
                }
        }
        t->streams_needed = (int)worst;
        if (t->fresh == NULL) {
            topoIngressFromRates(R, t->bw, t->ingress);
        } else {
            double *in = malloc(sizeof(double) * (size_t)R);
            if (in == NULL)
                return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d "
                               "regions", R);
            topoIngressFromRates(R, t->bw, in);
            for (int g = 0; g < R; g++)
                if (t->fresh[g])
                    t->ingress[g] = in[g];
            free(in);
        }
    }
    count_pairs(pc, t, R);
    /* The probe's own cost starts when every leader has arrived (the
     * warm-up round trip); before that, ranks wait for slower peers. */
    if (t->t_arrived > t_start) {
        t->t_wait = t->t_arrived - t_start;
        t->t_rtt -= t->t_wait;
        t_start = t->t_arrived;
    }
    t->t_total = geoNow() - t_start;
    apply_streams(pc, t);
    GEO_CHECK(geoWanCcInit(pc->net, pc->regions, pc->rank, pc->nranks, pc->nstreams, t,
                           pc->wan_cc));
    GEO_CHECK(warm_wan(pc, t));
    if (t->rtt_measured || t->bw_measured) {
        log_matrix(t, R);
        geoInfo(GEO_LOG_TOPO | GEO_LOG_INIT,
                "probe: %d nodes, %d regions, %.3f s (round trips %.3f s over %d node pairs "
                "in %d round%s, bandwidth %.3f s%s; "
                "after %.3f s waiting for peers); %d stream%s per WAN pair needed (window "
                "%.1f MiB), using at most %d of %d connected; inside regions %.0f us, %.0f MB/s "
                "per rank",
                t->nnodes, R, t->t_total, t->t_rtt, t->rtt_pairs, t->rtt_rounds,
                t->rtt_rounds == 1 ? "" : "s", t->t_bw,
                t->bw_again ? ", measured again on warm connections: the first rates set "
                              "regions apart" : "",
                t->t_wait, t->streams_needed,
                t->streams_needed == 1 ? "" : "s", t->window_bytes / 1048576.0,
                t->streams_used, pc->nstreams,
                t->intra_alpha * 1e6, t->intra_Bps * 1e-6);
    }
    return ncclSuccess;
}
