#include "config.h"
#include "comm/base/checks.h"
#include "comm/coll/tuning.h"
#include "comm/coll/hier_internal.h"
#include "comm/core/comm.h"
#include "comm/base/debug.h"
#include "comm/base/param.h"
#include "topology/model.h"
#include "topology/wan_tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TCP_GOODPUT (1448.0 / 1500.0)

void geoTuningFree(struct ncclComm *comm)
{
    free(comm->plan);
    comm->plan = NULL;
    geoHierNodesFree(comm);
}

static int coll_of(geoOpType t)
{
    switch (t) {
    case GEO_OP_ALLREDUCE: return TOPO_COLL_ALLREDUCE;
    case GEO_OP_ALLGATHER: return TOPO_COLL_ALLGATHER;
    case GEO_OP_REDUCESCATTER: return TOPO_COLL_REDUCESCATTER;
    case GEO_OP_BROADCAST: return TOPO_COLL_BROADCAST;
    default: return -1;
    }
}

/* Whether the congestion control named (comm->wan.cc; "" = the host's)
 * is BBR, which has no loss term. */
static int cc_is_bbr(const char *name)
{
    char host[32] = "";
    if (name == NULL || name[0] == '\0') {
        const char *tcp = geoParamStr(GEO_PARAM_TCP_CC);
        FILE *f = NULL;
        if (tcp != NULL && tcp[0] != '\0')
            snprintf(host, sizeof(host), "%s", tcp);
        else if ((f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r")) != NULL) {
            if (fgets(host, sizeof(host), f) == NULL)
                host[0] = '\0';
            fclose(f);
        }
        host[strcspn(host, "\n")] = '\0';
        name = host;
    }
    return strcmp(name, "bbr") == 0;
}

double geoTuningGoodput(const struct ncclComm *comm)
{
    const geoTopo *t = &comm->topo;
    return t->bw_measured || (t->inherited && comm->inherit.bw_measured) ? 1.0 : TCP_GOODPUT;
}

/* The model from the probe's figures or the topology file; 0, or -1 with
 * the reason in why. */
static int build_model(const struct ncclComm *comm, topoModel *m, const char **why)
{
    const geoTopo *t = &comm->topo;
    const topoRegionMap *rm = &comm->regions;
    int R = rm->nregions;

    topoModelInit(m);
    if (R > TOPO_MODEL_MAX_REGIONS) {
        *why = "more regions than the model takes";
        return -1;
    }
    if (t->egress == NULL || t->oneway == NULL) {
        *why = "the probe did not run";
        return -1;
    }
    m->nregions = R;
    for (int g = 0; g < R; g++) {
        snprintf(m->names[g], sizeof(m->names[g]), "%s", rm->names[g][0] ? rm->names[g]
                                                                          : "default");
        m->ranks[g] = rm->size[g];
        m->egress_Bps[g] = t->egress[g];
        m->ingress_Bps[g] = t->ingress != NULL ? t->ingress[g] : 0;
        m->lat_s[g] = t->oneway[g];
        if (!(t->egress[g] > 0)) {
            *why = "no WAN rate known (labels on one host, GEOCCL_PROBE=0, or a topology file "
                   "without bw=)";
            return -1;
        }
        for (int h = 0; h < R; h++)
            if (g != h && t->region_rtt && t->region_rtt[g * R + h] > 0)
                m->rtt_s[g][h] = t->region_rtt[g * R + h];
    }
    /* Measured rates are goodput; a file's are link rates. */
    m->wan_goodput = geoTuningGoodput(comm);
    if (t->intra_Bps > 0) {
        m->intra_Bps = t->intra_Bps;
        m->intra_alpha_s = t->intra_alpha;
        m->intra_shared = 1;
    }
    if (comm->topo_file_loaded) {
        if (comm->topo_file.intra_bw_bytes > 0)
            m->intra_Bps = comm->topo_file.intra_bw_bytes, m->intra_shared = 1;
        if (comm->topo_file.intra_delay_ms >= 0 && comm->topo_file.intra_bw_bytes > 0)
            m->intra_alpha_s = comm->topo_file.intra_delay_ms * 1e-3;
    }
    /* Ranks per CPU on the most crowded host: the same on every rank (from
     * the bootstrap's boot ids and CPU counts), so every rank plans alike. */
    double share = 1;
    for (int i = 0; i < comm->nranks; i++) {
        const geoPeerInfo *p = &comm->peers[i];
        if (p->net.local.boot_id[0] == '\0' || p->ncpu < 1)
            continue;
        int same = 0;
        for (int j = 0; j < comm->nranks; j++)
            same += strcmp(comm->peers[j].net.local.boot_id, p->net.local.boot_id) == 0;
        if ((double)same / p->ncpu > share)
            share = (double)same / p->ncpu;
    }
    m->cpu_share = share;
    /* Loss: each region's worst outgoing pair as the probe counted it (or
     * the file said), and whether that pair runs a loss-driven control:
     * auto's choice, or the one named (GEOCCL_WAN_CC), or the host's. */
    for (int g = 0; g < R && t->loss != NULL; g++)
        for (int h = 0; h < R; h++) {
            double p = t->loss[g * R + h];
            if (h == g || !(p > m->loss[g]) || !(p < 1))
                continue;
            m->loss[g] = p;
            if (t->wan_choice != NULL && t->wan_choice[g * R + h] >= 0)
                m->loss_driven[g] = t->wan_choice[g * R + h] == TOPO_CC_CUBIC;
            else
                m->loss_driven[g] = !cc_is_bbr(comm->wan.cc);
        }
    /* Connections are made; the probe may have told WAN pairs to use fewer. */
    m->wan_streams = t->streams_used > 0 ? t->streams_used : comm->nstreams;
    m->chunk = comm->chunk_size;
    m->hier_slice = comm->hier_slice;
    m->direct_max = comm->direct_max;
    /* The nodes the bootstrap's table shows (coll_hier_node.c); their
     * link as the topology file's `node` line gives it, else the intra
     * link's figures. */
    m->node_alpha_s = m->intra_alpha_s;
    m->node_Bps = m->intra_Bps;
    if (comm->topo_file_loaded && comm->topo_file.node_bw_bytes > 0)
        m->node_Bps = comm->topo_file.node_bw_bytes;
    if (comm->topo_file_loaded && comm->topo_file.node_delay_ms >= 0)
        m->node_alpha_s = comm->topo_file.node_delay_ms * 1e-3;
    for (int g = 0; g < R && comm->hier_nodes != NULL; g++)
        m->node_ranks[g] = comm->hier_nodes->G[g];
    return 0;
}

ncclResult_t geoTuningInit(struct ncclComm *comm)
{
    topoModel m;
    topoCodecCost costs[16];
    int n = topoDefaultNCodecs < 16 ? topoDefaultNCodecs : 16;
    const char *why = NULL;
    topoPlanForce force = TOPO_PLAN_FORCE_NONE;

    geoTuningFree(comm);
    comm->plan_why[0] = '\0';
    GEO_CHECK(geoHierNodesBuild(comm));
    const char *shares = geoParamStr(GEO_PARAM_HIER_SHARES);
    if (strcmp(shares, "equal") != 0 && strcmp(shares, "auto") != 0)
        return GEO_COMM_ERR(comm, ncclInvalidArgument,
                            "init: GEOCCL_HIER_SHARES=%s: must be auto or equal", shares);
    /* Equal shares until a model says otherwise. */
    {
        int R = comm->regions.nregions > 0 ? comm->regions.nregions : 1;
        for (int q = 0; q < R && q < 64; q++)
            comm->hier_w[q] = (unsigned)((uint64_t)TOPO_SHARE_ONE * (q + 1) / R -
                                         (uint64_t)TOPO_SHARE_ONE * q / R);
        comm->hier_uneven = 0;
        geoWanPaceReset(&comm->wan.pace);
    }
    if (comm->regions.nregions < 2) {
        snprintf(comm->plan_why, sizeof(comm->plan_why), "one region: flat, uncompressed");
        return ncclSuccess;
    }
    if (build_model(comm, &m, &why) != 0) {
        snprintf(comm->plan_why, sizeof(comm->plan_why), "no plan: %s; hierarchical between "
                 "regions, compression as GEOCCL_COMPRESS says", why);
        geoInfo(GEO_LOG_TUNING, "%s", comm->plan_why);
        return ncclSuccess;
    }
    m.hier_equal = strcmp(shares, "equal") == 0;
    comm->hier_uneven = topoHierShares(&m, comm->hier_w);
    if (comm->rank == 0 && comm->hier_uneven) {
        char line[512];
        int o = 0;
        for (int q = 0; q < m.nregions && o < (int)sizeof(line) - 40; q++)
            o += snprintf(line + o, sizeof(line) - (size_t)o, "%s%s %.1f%%", q ? ", " : "",
                          m.names[q], 100.0 * comm->hier_w[q] / TOPO_SHARE_ONE);
        unsigned eq[TOPO_MODEL_MAX_REGIONS];
        for (int q = 0; q < m.nregions; q++)
            eq[q] = (unsigned)((uint64_t)TOPO_SHARE_ONE * (q + 1) / m.nregions -
                               (uint64_t)TOPO_SHARE_ONE * q / m.nregions);
        geoInfo(GEO_LOG_TUNING, "hierarchical shares by WAN rate: %s; WAN time %.3f s/GiB "
                "(equal shares: %.3f s/GiB; GEOCCL_HIER_SHARES=equal forces them)", line,
                topoHierWanPerByte(&m, comm->hier_w) * (1 << 30),
                topoHierWanPerByte(&m, eq) * (1 << 30));
    }
    comm->replan.wan_per_byte = topoHierWanPerByte(&m, comm->hier_w);
    /* The uplink pace caps each region at its plan's figure, after a
     * re-plan (comm/coll/replan.c) too: a region planned lower sends on
     * its lowered link with its connections held to their shares, which
     * BBR alone does not keep (they finish apart, and the call with the
     * last).  A link that comes back then shows no more than the cap; the
     * re-plan's rule reads a region that ran at its cap as at least that
     * fast, and goes back to the probe's figure (topology/replan.h). */
    {
        const int g = comm->regions.region_of[comm->rank];
        const int lowered = comm->replan.probe != NULL && g >= 0 && g < m.nregions &&
                            comm->topo.egress[g] < comm->replan.probe[g];
        geoWanPaceSetup(&comm->wan.pace, &m, &comm->regions, comm->rank, lowered);
    }
    memcpy(costs, topoDefaultCodecCosts, sizeof(costs[0]) * (size_t)n);
    for (int i = 0; i < n; i++)
        if (costs[i].id == GEO_CODEC_TOPK && comm->auto_params.topkFraction > 0) {
            /* (index, value) pairs for a fraction k of the elements on the
             * first trip, R k on the return trip (coll_hier_codec.c): the mean of
             * the two trips' ratios. */
            double R = comm->regions.nregions;
            costs[i].ratio = 0.5 / comm->auto_params.topkFraction * 2.0 / (1.0 + R);
        }
    if (comm->algo == GEO_ALGO_FLAT)
        force.algo = TOPO_ALGO_FLAT;
    else if (comm->algo == GEO_ALGO_HIER)
        force.algo = TOPO_ALGO_HIER;
    if (!comm->codec_auto)
        force.codec = (int)comm->codec;
    force.nstreams = m.wan_streams;
    comm->plan_chunks = !geoParamIsSet(GEO_PARAM_CHUNK_SIZE) &&
                        !geoParamIsSet(GEO_PARAM_HIER_SLICE);
    topoPlan *p = malloc(sizeof(*p));
    if (p == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory for the plan");
    if (topoPlanBuild(&m, costs, n, comm->codec_auto ? comm->auto_mask : 0, &force, p) != 0) {
        free(p);
        snprintf(comm->plan_why, sizeof(comm->plan_why), "no plan: the model rejected the "
                 "measured figures; hierarchical between regions");
        geoWarn(GEO_LOG_TUNING, "%s", comm->plan_why);
        return ncclSuccess;
    }
    comm->plan = p;
    if (comm->rank == 0 && geoDebugLevel() >= GEO_LEVEL_INFO) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (f != NULL) {
            topoPlanPrint(p, f);
            fclose(f);
            for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
                geoInfo(GEO_LOG_TUNING, "plan: %s", line);
            free(text);
        }
    }
    return ncclSuccess;
}

int geoTuningChoose(struct ncclComm *comm, geoOpType type, size_t bytes, int *hier, int *codec,
                    size_t *chunk)
{
    int several = comm->regions.nregions > 1;
    *hier = several && comm->algo != GEO_ALGO_FLAT;
    *codec = comm->codec_auto ? GEO_CODEC_NONE : (int)comm->codec;
    *chunk = 0;
    int c = coll_of(type);
    if (!several || comm->plan == NULL || c < 0)
        return 0;
    const topoPlanEntry *e = topoPlanLookup(comm->plan, c, bytes);
    if (e == NULL)
        return 0;
    if (comm->algo == GEO_ALGO_AUTO)
        *hier = e->algo == TOPO_ALGO_HIER;
    if (comm->codec_auto)
        *codec = e->codec;
    if (comm->plan_chunks)
        *chunk = e->chunk;
    return 1;
}

int geoTuningNodeStage(const struct ncclComm *comm, size_t bytes)
{
    if (comm->plan == NULL || comm->regions.nregions < 2)
        return 1;
    const topoPlanEntry *e = topoPlanLookup(comm->plan, TOPO_COLL_ALLREDUCE, bytes);
    return e == NULL || e->algo != TOPO_ALGO_HIER || e->node_stage;
}

const unsigned char *geoTuningRegionCodecs(const struct ncclComm *comm, size_t bytes)
{
    if (!comm->codec_auto || comm->plan == NULL || comm->regions.nregions < 2)
        return NULL;
    const topoPlanEntry *e = topoPlanLookup(comm->plan, TOPO_COLL_ALLREDUCE, bytes);
    return e != NULL && e->algo == TOPO_ALGO_HIER && e->by_region ? e->region_codec : NULL;
}

/* One line naming the regions where the hierarchical all-reduce can run
 * its node stage (coll_hier_node.c), after the plan's text; nothing where
 * none can. */
static void print_nodes(const struct ncclComm *comm, FILE *f)
{
    const geoHierNodes *n = comm->hier_nodes;
    int any = 0;
    for (int q = 0; n != NULL && q < comm->regions.nregions && q < 64; q++) {
        if (n->G[q] == 0)
            continue;
        fprintf(f, "%s region '%s' %d nodes of %d ranks", any ? "," : "nodes:",
                comm->regions.names[q][0] ? comm->regions.names[q] : "default", n->H[q],
                n->G[q]);
        any = 1;
    }
    if (any)
        fprintf(f, " (the hierarchical all-reduce's node stage %s)\n",
                comm->plan ? "where the plan says hier+node" : "at every size");
}

void geoTuningPrint(const struct ncclComm *comm, FILE *f, int json)
{
    if (!json)
        print_nodes(comm, f);
    if (comm->plan == NULL) {
        if (json) {
            fprintf(f, "{\"plan\": null, \"why\": \"");
            for (const char *s = comm->plan_why; *s; s++)
                fputc(*s == '"' ? '\'' : *s, f);
            fprintf(f, "\"}");
        } else {
            fprintf(f, "%s\n", comm->plan_why);
        }
        return;
    }
    if (json)
        topoPlanJson(comm->plan, f);
    else
        topoPlanPrint(comm->plan, f);
}
