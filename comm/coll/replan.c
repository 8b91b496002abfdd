/* The plan follows the links (GEOCCL_REPLAN; topology/replan.h says what
 * is measured and the rule).  This file runs it around the hierarchical
 * all-reduce on host buffers:
 *
 *  - which calls are observed: those whose WAN time the plan puts at
 *    GEOCCL_REPLAN_MIN_MS or more (the same answer on every rank: the same
 *    plan, the same size);
 *  - the exchange that gives every rank the same figures, hidden inside the
 *    next observed call: at its start each rank sends its rate of the last
 *    observed call to its region's leader (its lowest rank), which adds
 *    them up and sends the region's figure to the other leaders; at its
 *    end each leader sends all regions' figures to its ranks.  The WAN hop
 *    travels while the call's data does, so it costs no round trip; the
 *    two hops inside a region cost one each.  The messages sit at the same
 *    place in every pair's message order (before the call's first message,
 *    after its last), so they never mix with the call's data;
 *  - the switch: every rank applies the rule to those figures at the end
 *    of the same call, and where it fires makes the plan again (shares,
 *    codec per region, chunks, pacing: geoTuningInit) from the new uplink
 *    figures, which the next call uses.  No call mixes two plans.
 *
 * What it leaves: the device path's exchange (geoHierExchange) is not
 * observed; its calls use whatever plan the host calls last made. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/base/debug.h"
#include "comm/base/param.h"
#include "comm/coll/tuning.h"
#include "comm/core/comm.h"
#include "topology/replan.h"

#include <stdlib.h>
#include <string.h>

void geoReplanFree(struct ncclComm *comm)
{
    topoReplan *rp = &comm->replan;
    topoReplanSnapFree(&rp->start);
    topoReplanSnapFree(&rp->end);
    free(rp->agg);
    free(rp->from);
    free(rp->req);
    free(rp->probe);
    memset(rp, 0, sizeof(*rp));
}

#define F TOPO_REPLAN_FIG

static int leader_of(const struct ncclComm *comm, int g)
{
    return comm->regions.members[g][0];
}

static ncclResult_t wait_all(struct ncclComm *comm, int from, int to)
{
    for (int i = from; i < to; i++)
        GEO_CHECK(geoNetWait(&comm->net, &comm->replan.req[i]));
    return ncclSuccess;
}

ncclResult_t geoReplanCallStart(struct ncclComm *comm, size_t bytes)
{
    topoReplan *rp = &comm->replan;
    const topoRegionMap *m = &comm->regions;
    const int R = m->nregions;
    rp->observing = 0;
    rp->inflight = 0;
    if (geoParamInt(GEO_PARAM_REPLAN) <= 0 || R < 2 || R > TOPO_REPLAN_MAX_REGIONS ||
        comm->plan == NULL || comm->topo.egress == NULL || !(rp->wan_per_byte > 0) ||
        rp->wan_per_byte * (double)bytes * 1e3 < (double)geoParamInt(GEO_PARAM_REPLAN_MIN_MS))
        return ncclSuccess;
    if (rp->agg == NULL) {
        rp->agg = calloc((size_t)R * TOPO_REPLAN_FIG, sizeof(*rp->agg));
        rp->from = calloc((size_t)comm->nranks * TOPO_REPLAN_FIG, sizeof(*rp->from));
        rp->req = calloc((size_t)(comm->nranks + R), sizeof(*rp->req));
        if (rp->agg == NULL || rp->from == NULL || rp->req == NULL)
            return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory re-planning",
                                geoErrOp(&comm->err));
    }
    /* Every rank observes the same calls (the exchange depends on it), so
     * running out of memory here is an error, not a call left out. */
    if (topoReplanSnapshot(&comm->net, m, comm->rank, comm->nranks, &rp->start) != 0)
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory re-planning",
                            geoErrOp(&comm->err));
    rp->observing = 1;
    rp->t0 = geoNow();
    comm->wan.pace.call_cap = 0; /* the call's uplink caps, set where it paces */
    if (!rp->pending)
        return ncclSuccess;
    /* The last observed call's rates, on their way: to my leader, and from
     * the leaders to each other. */
    const int g = m->region_of[comm->rank], L = leader_of(comm, g);
    rp->nreq = 0;
    if (comm->rank != L) {
        GEO_CHECK(geoNetIsendCtl(&comm->net, L, rp->mine, sizeof(rp->mine),
                                 &rp->req[rp->nreq++]));
        rp->inflight = 1;
        return ncclSuccess;
    }
    for (int i = 1; i < m->size[g]; i++)
        GEO_CHECK(geoNetIrecv(&comm->net, m->members[g][i], &rp->from[F * i],
                              F * sizeof(double), &rp->req[rp->nreq++]));
    GEO_CHECK(wait_all(comm, 0, rp->nreq));
    /* The region's rate: its ranks' rates added (they send at once); how
     * busy and how full its uplink was: its busiest rank's share of its
     * call, and its fullest rank's; its uplink's cap: its ranks' caps
     * added, where every rank's connections were capped. */
    memcpy(rp->from, rp->mine, sizeof(rp->mine));
    double sum = 0, busy = 0, full = 0, cap = 0;
    int uncapped = 0;
    for (int i = 0; i < m->size[g]; i++) {
        const double *f = &rp->from[F * i];
        sum += f[0] > 0 ? f[0] : 0;
        busy = f[1] > busy ? f[1] : busy;
        full = f[2] > full ? f[2] : full;
        cap += f[3] > 0 ? f[3] : 0;
        uncapped |= !(f[3] > 0);
    }
    rp->agg[F * g] = sum;
    rp->agg[F * g + 1] = busy;
    rp->agg[F * g + 2] = full;
    rp->agg[F * g + 3] = uncapped ? 0 : cap;
    rp->nreq = 0;
    for (int h = 0; h < R; h++) {
        if (h == g)
            continue;
        GEO_CHECK(geoNetIsendCtl(&comm->net, leader_of(comm, h), &rp->agg[F * g],
                                 F * sizeof(double), &rp->req[rp->nreq++]));
        GEO_CHECK(geoNetIrecv(&comm->net, leader_of(comm, h), &rp->agg[F * h],
                              F * sizeof(double), &rp->req[rp->nreq++]));
    }
    rp->inflight = 1;
    return ncclSuccess;
}

/* Every rank holds the same rp->agg: apply the rule, and make the plan
 * again where it fires. */
static ncclResult_t decide(struct ncclComm *comm)
{
    topoReplan *rp = &comm->replan;
    const int R = comm->regions.nregions;
    const double gp = geoTuningGoodput(comm);
    double plan[TOPO_REPLAN_MAX_REGIONS], next[TOPO_REPLAN_MAX_REGIONS];
    double obs[TOPO_REPLAN_MAX_REGIONS], busy[TOPO_REPLAN_MAX_REGIONS];
    double full[TOPO_REPLAN_MAX_REGIONS], known[TOPO_REPLAN_MAX_REGIONS];
    double cap[TOPO_REPLAN_MAX_REGIONS];
    char seen[768];
    int o = 0;
    for (int g = 0; g < R; g++) {
        plan[g] = comm->topo.egress[g] * gp;
        /* the probe measured each uplink full, at init */
        known[g] = (rp->probe != NULL ? rp->probe[g] : comm->topo.egress[g]) * gp;
        obs[g] = rp->agg[F * g];
        busy[g] = rp->agg[F * g + 1];
        full[g] = rp->agg[F * g + 2];
        cap[g] = rp->agg[F * g + 3];
        if (o < (int)sizeof(seen) - 96)
            o += snprintf(seen + o, sizeof(seen) - (size_t)o, "%s%s %.1f Mbit/s (plan %.1f, "
                          "cap %.1f, busy %.0f%%, full %.0f%%)", g ? ", " : "",
                          comm->regions.names[g], obs[g] * 8e-6, plan[g] * 8e-6, cap[g] * 8e-6,
                          busy[g] * 100, full[g] * 100);
    }
    if (comm->rank == 0)
        geoInfo(GEO_LOG_TUNING, "replan: the last observed call's uplinks: %s", seen);
    double band = (double)geoParamInt(GEO_PARAM_REPLAN_BAND) / 100.0;
    char why[sizeof(rp->why) - 64];
    if (!topoReplanObserve(&rp->rule, R, plan, known, obs, busy, full, cap, band,
                           (int)geoParamInt(GEO_PARAM_REPLAN), comm->regions.names, next, why,
                           (int)sizeof(why)))
        return ncclSuccess;
    if (rp->probe == NULL) {
        rp->probe = malloc(sizeof(double) * (size_t)R);
        if (rp->probe == NULL)
            return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory re-planning",
                                geoErrOp(&comm->err));
        memcpy(rp->probe, comm->topo.egress, sizeof(double) * (size_t)R);
    }
    for (int g = 0; g < R; g++)
        comm->topo.egress[g] = next[g] / gp;
    snprintf(rp->why, sizeof(rp->why), "re-plan %d: %s", rp->rule.replans, why);
    if (comm->rank == 0)
        geoInfo(GEO_LOG_TUNING, "%s; GEOCCL_REPLAN=0 keeps the plan made at init", rp->why);
    return geoTuningInit(comm);
}

ncclResult_t geoReplanCallEnd(struct ncclComm *comm, ncclResult_t res)
{
    topoReplan *rp = &comm->replan;
    const topoRegionMap *m = &comm->regions;
    if (!rp->observing || res != ncclSuccess) {
        rp->observing = 0;
        return res;
    }
    rp->observing = 0;
    if (topoReplanSnapshot(&comm->net, m, comm->rank, comm->nranks, &rp->end) != 0)
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory re-planning",
                            geoErrOp(&comm->err));
    double busy = 0, full = 0, took = geoNow() - rp->t0;
    double now = topoReplanRate(&rp->start, &rp->end, &busy, &full);
    double mine[F] = {now, took > 0 ? busy / took : 0, took > 0 ? full / took : 0,
                      comm->wan.pace.call_cap};
    if (!rp->inflight) {
        memcpy(rp->mine, mine, sizeof(mine));
        rp->pending = 1;
        return ncclSuccess;
    }
    rp->inflight = 0;
    const int R = m->nregions, g = m->region_of[comm->rank], L = leader_of(comm, g);
    GEO_CHECK(wait_all(comm, 0, rp->nreq));
    rp->nreq = 0;
    if (comm->rank == L) {
        for (int i = 1; i < m->size[g]; i++)
            GEO_CHECK(geoNetIsendCtl(&comm->net, m->members[g][i], rp->agg,
                                     F * sizeof(double) * (size_t)R, &rp->req[rp->nreq++]));
    } else {
        GEO_CHECK(geoNetIrecv(&comm->net, L, rp->agg, F * sizeof(double) * (size_t)R,
                              &rp->req[rp->nreq++]));
    }
    GEO_CHECK(wait_all(comm, 0, rp->nreq));
    memcpy(rp->mine, mine, sizeof(mine));
    return decide(comm);
}
