/* The node level of the hierarchical all-reduce: which ranks of a region
 * share a node (host), and the two intra-region stages that use it.
 *
 * A region of H nodes with G ranks each (H, G >= 2, the same G on every
 * node) can run its reduce-scatter in two stages instead of one ring over
 * its P = G H ranks:
 *
 *   node stage    a ring over the G ranks of each node on the whole slice:
 *                 the rank at place i of its node ends with node segment
 *                 i (geoSegRange(len, G, i)) summed over the node;
 *   region stage  among the H ranks at place i on every node (a "rail")
 *                 on node segment i: the rank of node h ends with part h
 *                 of it (geoSegRange(node segment, H, h)) summed over the
 *                 region.  Where H is a power of two, recursive halving:
 *                 log2 H exchanges with the rank of node h ^ d (d = H/2,
 *                 H/4, ... 1), each keeping the half of the parts that
 *                 holds its own; elsewhere a ring (H - 1 steps).  Both
 *                 move (H - 1) / H of the node segment; the halving pays
 *                 log2 H message latencies instead of H - 1, which is all
 *                 the cost model tells them apart by (topology/model.c).
 *
 * and its all-gather as the mirror image (region stage by recursive
 * doubling or the ring, then node stage).
 * The same bytes cross the links as with one ring ((P - 1) L per phase for
 * the region), but a slice pays (G - 1) + log2 H (or H - 1) message
 * latencies per phase instead of P - 1, and only the region stage crosses
 * between nodes.  The WAN stage between regions (coll_hier.c) does not change:
 * it takes each rank's final segment, wherever it lies, from
 * hierRankSeg.
 *
 * Whether a region's ranks share a node: the same host name and boot id
 * (what the bootstrap told every rank), or, where GEOCCL_NODE_RANKS is set,
 * each run of that many ranks of the region in rank order (launchers that
 * place ranks node by node, and tests, which run every rank on one host).
 * Every rank computes the same layout from the same table.  The plan
 * (topoPlanEntry.node_stage) says whether a call uses it; without a plan
 * it is used wherever a region allows it (it saves latencies and costs no
 * bytes). */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/coll/coll.h"
#include "comm/coll/reduce.h"
#include "comm/coll/hier_internal.h"
#include "comm/coll/tuning.h"
#include "comm/core/comm.h"

#include <stdlib.h>
#include <string.h>

void geoHierNodesFree(struct ncclComm *comm)
{
    geoHierNodes *n = comm->hier_nodes;
    if (n == NULL)
        return;
    free(n->node_of);
    free(n->node_local);
    free(n->node_ring.ranks);
    free(n->node_ring.blk);
    free(n->rail_ring.ranks);
    free(n->rail_ring.blk);
    free(n);
    comm->hier_nodes = NULL;
}

/* Whether global ranks a and b run on one node (host name and boot id). */
static int same_node(const struct ncclComm *comm, int a, int b)
{
    const geoPeerInfo *x = &comm->peers[a], *y = &comm->peers[b];
    return strncmp(x->net.host, y->net.host, sizeof(x->net.host)) == 0 &&
           strncmp(x->net.local.boot_id, y->net.local.boot_id,
                   sizeof(x->net.local.boot_id)) == 0;
}

/* A ring over n ranks, position i holding ranks[i] (the caller fills
 * them) and segment i.  pos_of stays NULL: it serves the rooted chains
 * (geoChainBcast, geoChainReduce), which run on the full ring only; the
 * node and rail rings carry the two stages, which need no root.  The
 * grouping itself is not topoRegionMapBuild's: that one groups by a
 * 32-byte label, a node is a host name and boot id (or a run of
 * GEOCCL_NODE_RANKS ranks of the region). */
static int ring_make(geoRing *r, int n, int me)
{
    r->n = n;
    r->me = me;
    r->pos_of = NULL;
    r->ranks = malloc(sizeof(int) * (size_t)n);
    r->blk = malloc(sizeof(int) * (size_t)n);
    if (r->ranks == NULL || r->blk == NULL)
        return -1;
    for (int i = 0; i < n; i++)
        r->blk[i] = i;
    return 0;
}

ncclResult_t geoHierNodesBuild(struct ncclComm *comm)
{
    const topoRegionMap *m = &comm->regions;
    const int N = comm->nranks;
    const int64_t per = geoParamInt(GEO_PARAM_NODE_RANKS);
    geoHierNodesFree(comm);
    if (m->nregions < 1 || m->nregions > 64 || m->region_of == NULL)
        return ncclSuccess;
    geoHierNodes *n = calloc(1, sizeof(*n));
    if (n == NULL)
        goto oom;
    comm->hier_nodes = n;
    n->node_of = malloc(sizeof(int) * (size_t)N);
    n->node_local = malloc(sizeof(int) * (size_t)N);
    if (n->node_of == NULL || n->node_local == NULL)
        goto oom;
    /* per node of a region: one member to compare host names with, and
     * how many members it has so far */
    int *first = malloc(sizeof(int) * (size_t)N), *count = malloc(sizeof(int) * (size_t)N);
    if (first == NULL || count == NULL) {
        free(first);
        free(count);
        goto oom;
    }
    for (int q = 0; q < m->nregions; q++) {
        const int P = m->size[q];
        int nodes = 0, G = 0, uniform = 1;
        for (int i = 0; i < P; i++) {
            const int r = m->members[q][i];
            int h = per > 0 ? (int)(i / per) : -1;
            for (int k = 0; h < 0 && k < nodes; k++)
                if (same_node(comm, first[k], r))
                    h = k;
            if (h < 0 || h == nodes) {
                h = nodes++;
                first[h] = r;
                count[h] = 0;
            }
            n->node_of[r] = h;
            n->node_local[r] = count[h]++;
        }
        /* G ranks on each of H nodes, both >= 2 */
        for (int k = 0; k < nodes; k++) {
            G = k == 0 ? count[k] : G;
            uniform &= count[k] == G;
        }
        n->G[q] = uniform && G >= 2 && nodes >= 2 ? G : 0;
        n->H[q] = n->G[q] ? nodes : 0;
    }
    free(first);
    free(count);
    /* My node's ring (by place on the node) and my rail's (by node). */
    const int g = m->region_of[comm->rank];
    if (n->G[g]) {
        const int G = n->G[g], H = n->H[g];
        const int h = n->node_of[comm->rank], i = n->node_local[comm->rank];
        if (ring_make(&n->node_ring, G, i) != 0 || ring_make(&n->rail_ring, H, h) != 0)
            goto oom;
        for (int j = 0; j < m->size[g]; j++) {
            const int r = m->members[g][j];
            if (n->node_of[r] == h)
                n->node_ring.ranks[n->node_local[r]] = r;
            if (n->node_local[r] == i)
                n->rail_ring.ranks[n->node_of[r]] = r;
        }
    }
    if (comm->rank == 0)
        for (int q = 0; q < m->nregions; q++)
            if (n->G[q])
                geoInfo(GEO_LOG_INIT | GEO_LOG_TOPO, "region %d '%s': %d nodes of %d ranks: "
                        "node and region stages available", q,
                        m->names[q][0] ? m->names[q] : "default", n->H[q], n->G[q]);
    return ncclSuccess;
oom:
    geoHierNodesFree(comm);
    return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory for the node layout");
}

int geoHierNodeStage(struct ncclComm *comm, size_t bytes)
{
    const geoHierNodes *n = comm->hier_nodes;
    if (n == NULL)
        return 0;
    int any = 0;
    for (int q = 0; q < comm->regions.nregions && q < 64; q++)
        any |= n->G[q] != 0;
    return any && geoTuningNodeStage(comm, bytes);
}

void hierRankSeg(const struct ncclComm *comm, int node_stage, hierSegFn seg, size_t len, int q,
                 int i, size_t *off, size_t *n)
{
    const geoHierNodes *nd = comm->hier_nodes;
    if (!node_stage || nd == NULL || nd->G[q] == 0) {
        seg(len, comm->regions.size[q], i, off, n);
        return;
    }
    const int r = comm->regions.members[q][i];
    size_t no, nl, ro, rl;
    geoSegRange(len, nd->G[q], nd->node_local[r], &no, &nl);
    geoSegRange(nl, nd->H[q], nd->node_of[r], &ro, &rl);
    *off = no + ro;
    *n = rl;
}

/* Elements [*off, *end) of parts [b0, b1) of a node segment of nl
 * elements cut in H. */
static void parts_range(size_t nl, int H, int b0, int b1, size_t *off, size_t *end)
{
    size_t o, l;
    geoSegRange(nl, H, b0, off, &l);
    geoSegRange(nl, H, b1 - 1, &o, &l);
    *end = o + l;
}

/* One exchange with peer: send [so, se) of buf, receive rn elements into
 * dst (elements of es bytes); an empty side posts nothing (the peer
 * computes the same sizes the other way round). */
static ncclResult_t swap(struct ncclComm *comm, int peer, const char *buf, size_t so, size_t se,
                         char *dst, size_t rn, size_t es)
{
    geoNetRequest sr, rr;
    int ps = 0, pr = 0;
    ncclResult_t res = ncclSuccess;
    if (rn > 0) {
        GEO_CHECK_GOTO(geoNetIrecv(&comm->net, peer, dst, rn * es, &rr), res, out);
        pr = 1;
    }
    if (se > so) {
        GEO_CHECK_GOTO(geoNetIsend(&comm->net, peer, buf + so * es, (se - so) * es, &sr), res,
                       out);
        ps = 1;
    }
    if (pr) {
        GEO_CHECK_GOTO(geoNetWait(&comm->net, &rr), res, out);
        pr = 0;
    }
    if (ps) {
        GEO_CHECK_GOTO(geoNetWait(&comm->net, &sr), res, out);
        ps = 0;
    }
out:
    if (ps || pr)
        geoNetBreak(&comm->net); /* requests on this stack must not outlive it */
    return res;
}

/* Recursive halving over the rail (H a power of two) on the node segment
 * at seg, nl elements, reduced in place: at distance d I hold partials of
 * the 2d parts around mine, send the d that are not on my side to the
 * rank of node me ^ d and sum its partial of mine into seg.  I end with
 * part me summed over the rail. */
static ncclResult_t rail_halving(struct ncclComm *comm, const geoOp *op, const geoRing *rail,
                                 char *seg, size_t nl, size_t es)
{
    const int H = rail->n, me = rail->me;
    size_t most, o;
    geoSegRange(nl, H, 0, &o, &most);
    char *tmp = geoScratchGet(&comm->scratch, most * (size_t)(H / 2) * es + 1);
    ncclResult_t res = ncclSuccess;
    if (tmp == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for the region stage",
                            geoErrOp(&comm->err));
    for (int d = H / 2; d >= 1 && res == ncclSuccess; d /= 2) {
        const int lo = me & ~(2 * d - 1), keep = (me & d) ? lo + d : lo, give = keep ^ d;
        size_t ko, ke, go, ge;
        parts_range(nl, H, keep, keep + d, &ko, &ke);
        parts_range(nl, H, give, give + d, &go, &ge);
        res = swap(comm, rail->ranks[me ^ d], seg, go, ge, tmp, ke - ko, es);
        if (res == ncclSuccess && ke > ko)
            geoReduce(seg + ko * es, seg + ko * es, tmp, ke - ko, op->dt, op->op);
    }
    geoScratchPut(&comm->scratch, tmp);
    return res;
}

/* Recursive doubling, the mirror of rail_halving: at distance d = 1, 2,
 * ... H/2 I hold the d finished parts around mine and swap them with the
 * rank of node me ^ d for its d, straight into seg. */
static ncclResult_t rail_doubling(struct ncclComm *comm, const geoRing *rail, char *seg,
                                  size_t nl, size_t es)
{
    const int H = rail->n, me = rail->me;
    for (int d = 1; d < H; d *= 2) {
        const int mine = me & ~(d - 1), theirs = mine ^ d;
        size_t mo, mend, to, tend;
        parts_range(nl, H, mine, mine + d, &mo, &mend);
        parts_range(nl, H, theirs, theirs + d, &to, &tend);
        GEO_CHECK(swap(comm, rail->ranks[me ^ d], seg, mo, mend, seg + to * es, tend - to, es));
    }
    return ncclSuccess;
}

/* The region stage halves where the rail's size is a power of two (the
 * model's rule too: topology/model.c intra_phase). */
static int rail_halves(int H)
{
    return H >= 2 && (H & (H - 1)) == 0;
}

ncclResult_t hierNodeIntra(struct ncclComm *comm, const geoOp *op, size_t s0, size_t len,
                           int ag, size_t es)
{
    const geoHierNodes *nd = comm->hier_nodes;
    const geoRing *node = &nd->node_ring, *rail = &nd->rail_ring;
    const int halving = rail_halves(rail->n);
    char *out = (char *)op->recvbuff + s0 * es;
    size_t no, nl, ro, rl;
    geoSegRange(len, node->n, node->me, &no, &nl);
    geoSegRange(nl, rail->n, rail->me, &ro, &rl);
    if (!ag) {
        /* node stage: my node segment, summed over the node, into out */
        geoRingPlan p1 = {.a = -1, .nsteps = node->n - 1, .reduce_steps = node->n - 1,
                          .local = (const char *)op->sendbuff + s0 * es, .out = NULL,
                          .out_final = out + no * es, .divide = 0};
        GEO_CHECK(geoRingRun(comm, op, node, &p1, len));
        /* region stage: my part of it, summed over the rail's nodes */
        if (halving)
            return rail_halving(comm, op, rail, out + no * es, nl, es);
        geoRingPlan p2 = {.a = -1, .nsteps = rail->n - 1, .reduce_steps = rail->n - 1,
                          .local = out + no * es, .out = NULL,
                          .out_final = out + (no + ro) * es, .divide = 0};
        return geoRingRun(comm, op, rail, &p2, nl);
    }
    if (halving) {
        GEO_CHECK(rail_doubling(comm, rail, out + no * es, nl, es));
    } else {
        geoRingPlan p2 = {.a = 0, .nsteps = rail->n - 1, .reduce_steps = 0, .local = NULL,
                          .out = out + no * es, .out_final = NULL, .divide = 0};
        GEO_CHECK(geoRingRun(comm, op, rail, &p2, nl));
    }
    geoRingPlan p1 = {.a = 0, .nsteps = node->n - 1, .reduce_steps = 0, .local = NULL,
                      .out = out, .out_final = NULL, .divide = 0};
    return geoRingRun(comm, op, node, &p1, len);
}

int geoHierIntraPeers(const struct ncclComm *comm, int *peers, int max)
{
    const geoHierNodes *nd = comm->hier_nodes;
    const geoRing *rings[3] = {&comm->region_ring, NULL, NULL};
    int n = 0;
    if (nd != NULL && nd->node_ring.n > 1) {
        rings[1] = &nd->node_ring;
        rings[2] = &nd->rail_ring;
    }
    for (int k = 0; k < 3; k++) {
        const geoRing *r = rings[k];
        if (r == NULL || r->n < 2 || r->ranks == NULL)
            continue;
        /* a ring's two neighbours, or the halving's partners me ^ d */
        int cand[64], nc = 0;
        if (k == 2 && rail_halves(r->n))
            for (int d = 1; d < r->n && nc < 64; d *= 2)
                cand[nc++] = r->ranks[r->me ^ d];
        else {
            cand[nc++] = r->ranks[(r->me + 1) % r->n];
            cand[nc++] = r->ranks[(r->me + r->n - 1) % r->n];
        }
        for (int j = 0; j < nc; j++) {
            int seen = cand[j] == comm->rank;
            for (int x = 0; x < n && x < max && !seen; x++)
                seen = peers[x] == cand[j];
            if (!seen) {
                if (n < max)
                    peers[n] = cand[j];
                n++;
            }
        }
    }
    return n;
}
