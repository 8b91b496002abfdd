/* The messages of the hierarchical all-reduce (hier_internal.h): how a
 * slice is cut into pieces and parts among the regions (by their shares),
 * which messages this rank sends and receives for it, and the buffers
 * they need; the same plan handed to the device path
 * (geoHierExchangePlan); and the pace around a call, from what its plan
 * sends each peer (topology/wan_tuning.h). */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/coll/coll.h"
#include "comm/coll/hier_internal.h"
#include "comm/core/comm.h"
#include "topology/model.h"
#include "topology/wan_tuning.h"

#include <stdlib.h>
#include <string.h>

void geoSegPadded(size_t count, int n, int i, size_t *off, size_t *len)
{
    size_t shard = (count + (size_t)n - 1) / (size_t)n;
    size_t o = shard * (size_t)i;
    *off = o < count ? o : count;
    *len = o < count ? (count - o < shard ? count - o : shard) : 0;
}

static void msgs_free(hierMsg *m, int n)
{
    for (int i = 0; m && i < n; i++)
        if (m[i].enc_owned)
            free(m[i].enc);
}

void hierSliceFree(struct ncclComm *comm, hierSlice *sl)
{
    msgs_free(sl->tx1, sl->ntx1);
    msgs_free(sl->rx1, sl->nrx1);
    msgs_free(sl->tx2, sl->ntx2);
    msgs_free(sl->rx2, sl->nrx2);
    free(sl->tx1);
    free(sl->rx1);
    free(sl->tx2);
    free(sl->rx2);
    free(sl->parts);
    geoScratchPut(&comm->scratch, sl->tmp);
    memset(sl, 0, sizeof(*sl));
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static ncclResult_t alloc_enc(hierMsg *m, int n, ncclDataType_t dt, const geoCodecParams *params)
{
    for (int i = 0; i < n; i++) {
        if (m[i].codec == NULL)
            continue;
        m[i].enc_cap = m[i].codec->maxEncodedSize(m[i].n, dt, params);
        if (m[i].enc_cap == 0)
            return ncclInvalidArgument;
        m[i].enc = malloc(m[i].enc_cap);
        if (m[i].enc == NULL)
            return ncclSystemError;
        m[i].enc_owned = 1;
    }
    return ncclSuccess;
}

/* The X1 receive buffer of a slice (where the other regions' partials
 * land), from the communicator's scratch (scratch.h): the all-reduce takes
 * it when the slice starts and gives it back once the partials are summed,
 * so only the slices in flight hold one and the pages stay mapped from one
 * call to the next. */
ncclResult_t hierSliceTmp(struct ncclComm *comm, hierSlice *sl)
{
    sl->tmp = geoScratchGet(&comm->scratch, sl->tmp_bytes);
    if (sl->tmp == NULL) {
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for %zu receive bytes",
                            geoErrOp(&comm->err), sl->tmp_bytes);
    }
    size_t t = 0;
    for (int i = 0; i < sl->nrx1; i++) {
        sl->rx1[i].tmp = sl->tmp + t * sl->es;
        t += sl->rx1[i].n;
    }
    return ncclSuccess;
}

void hierSliceTmpPut(struct ncclComm *comm, hierSlice *sl)
{
    geoScratchPut(&comm->scratch, sl->tmp);
    sl->tmp = NULL;
    for (int i = 0; i < sl->nrx1; i++)
        sl->rx1[i].tmp = NULL;
}

/* Part q of a piece of plen elements: region q's share of it
 * (comm->hier_w, equal unless the links are uneven; every rank cuts the
 * same).  A zero share gives an empty part: no message is posted for it. */
static void share_range(const struct ncclComm *comm, size_t plen, int q, size_t *off,
                        size_t *len)
{
    if (!comm->hier_uneven) {
        geoSegRange(plen, comm->regions.nregions, q, off, len);
        return;
    }
    uint64_t before = 0;
    for (int i = 0; i < q; i++)
        before += comm->hier_w[i];
    /* plen < 2^47 elements here, so plen * 2^16 does not overflow */
    size_t a = (size_t)((uint64_t)plen * before / TOPO_SHARE_ONE);
    size_t b = (size_t)((uint64_t)plen * (before + comm->hier_w[q]) / TOPO_SHARE_ONE);
    *off = a;
    *len = b - a;
}

/* Lay out the messages of one slice for this rank (slice_tmp gives the
 * receive buffer). */
ncclResult_t hierSlicePlan(struct ncclComm *comm, hierSlice *sl, size_t es,
                           const hierCodec *hc, ncclDataType_t dt, hierSegFn seg,
                           int node_stage)
{
    const topoRegionMap *m = &comm->regions;
    const int k = m->nregions, g = m->region_of[comm->rank], me = m->local_rank[comm->rank];
    size_t nb = 0, *bounds;
    size_t my_off, my_len;

    hierRankSeg(comm, node_stage, seg, sl->len, g, me, &my_off, &my_len);
    int total_ranks = 0;
    for (int q = 0; q < k; q++)
        total_ranks += m->size[q];
    bounds = malloc(sizeof(size_t) * (size_t)(total_ranks + k + 1));
    if (bounds == NULL)
        return ncclSystemError;
    for (int q = 0; q < k; q++)
        for (int i = 0; i < m->size[q]; i++) {
            size_t o, l;
            hierRankSeg(comm, node_stage, seg, sl->len, q, i, &o, &l);
            if (o >= my_off && o < my_off + my_len)
                bounds[nb++] = o;
        }
    bounds[nb++] = my_off;
    bounds[nb++] = my_off + my_len;
    qsort(bounds, nb, sizeof(size_t), cmp_size);

    /* Upper bounds on message counts: one piece per distinct boundary. */
    size_t maxp = nb, maxm = maxp * (size_t)k;
    sl->tx1 = calloc(maxm, sizeof(hierMsg));
    sl->rx1 = calloc(maxm, sizeof(hierMsg));
    sl->tx2 = calloc(maxm, sizeof(hierMsg));
    sl->rx2 = calloc(maxm, sizeof(hierMsg));
    sl->parts = calloc(maxp, sizeof(hierPart));
    size_t tmp_elems = 0;
    if (!sl->tx1 || !sl->rx1 || !sl->tx2 || !sl->rx2 || !sl->parts) {
        free(bounds);
        return ncclSystemError;
    }
    for (size_t t = 0; t + 1 < nb; t++) {
        size_t a = bounds[t], b = bounds[t + 1];
        if (b <= a || a < my_off || b > my_off + my_len)
            continue;
        size_t plen = b - a;
        hierPart *part = &sl->parts[sl->nparts++];
        size_t so, sn;
        share_range(comm, plen, g, &so, &sn);
        part->off = sl->s0 + a + so;
        part->n = sn;
        part->first_rx = sl->nrx1;
        for (int q = 0; q < k; q++) {
            if (q == g)
                continue;
            /* The owner of this piece in region q. */
            int owner = -1;
            for (int i = 0; i < m->size[q]; i++) {
                size_t o, l;
                hierRankSeg(comm, node_stage, seg, sl->len, q, i, &o, &l);
                if (l > 0 && a >= o && a < o + l) {
                    owner = m->members[q][i];
                    break;
                }
            }
            size_t qo, qn;
            share_range(comm, plen, q, &qo, &qn);
            /* X1: my partial of part q goes to its owner; its partial of my
             * part comes to me.  X2: the reverse, with finished values. */
            const geoCodec *mine = hc->of[g], *theirs = hc->of[q];
            sl->tx1[sl->ntx1++] =
                (hierMsg){.peer = owner, .off = sl->s0 + a + qo, .n = qn, .codec = mine};
            sl->rx1[sl->nrx1++] =
                (hierMsg){.peer = owner, .off = part->off, .n = sn, .codec = theirs};
            sl->tx2[sl->ntx2++] =
                (hierMsg){.peer = owner, .off = part->off, .n = sn, .codec = mine};
            sl->rx2[sl->nrx2++] =
                (hierMsg){.peer = owner, .off = sl->s0 + a + qo, .n = qn, .codec = theirs};
            tmp_elems += sn;
        }
    }
    free(bounds);
    sl->es = es;
    sl->tmp_bytes = tmp_elems * es + 1;
    if (hc->any) {
        /* X2 sends one chunk per part to k-1 owners: one buffer per part,
         * shared by its messages (allocated for the first, k-1 in a row). */
        ncclResult_t r;
        if ((r = alloc_enc(sl->tx1, sl->ntx1, dt, hc->params)) != ncclSuccess ||
            (r = alloc_enc(sl->rx1, sl->nrx1, dt, hc->params)) != ncclSuccess ||
            (r = alloc_enc(sl->rx2, sl->nrx2, dt, &hc->p2)) != ncclSuccess)
            return r;
        int k1 = comm->regions.nregions - 1;
        for (int i = 0; hc->codec && i < sl->ntx2; i += k1) {
            if ((r = alloc_enc(&sl->tx2[i], 1, dt, &hc->p2)) != ncclSuccess)
                return r;
            for (int j = 1; j < k1; j++) {
                sl->tx2[i + j].enc = sl->tx2[i].enc;
                sl->tx2[i + j].enc_cap = sl->tx2[i].enc_cap;
            }
        }
    }
    return ncclSuccess;
}


/* GEOCCL_WAN_PACE around a call (topology/wan_tuning.h geoWanPace, which
 * says why): on = 1 before the first message, 0 once the call is over.
 * What the plan of slice sl sends each peer, X1 and X2 together, each
 * peer once in the order of its first message; call_bytes, the call's
 * bytes (0 when compressed).  Out of memory for that list (over 64 messages):
 * the call is left as it is. */
void hierPaceWan(struct ncclComm *comm, const hierSlice *sl, double call_bytes, int on)
{
    geoWanSend local[64], *to = local;
    const int nmsg = sl->ntx1 + sl->ntx2;
    int n = 0;
    if (!geoWanPaceOn(&comm->wan.pace, &comm->net) || sl->len == 0)
        return;
    if (nmsg > 64 && (to = malloc(sizeof(*to) * (size_t)nmsg)) == NULL)
        return;
    for (int i = 0; i < nmsg; i++) {
        const hierMsg *x = i < sl->ntx1 ? &sl->tx1[i] : &sl->tx2[i - sl->ntx1];
        int j = 0;
        while (j < n && to[j].peer != x->peer)
            j++;
        if (j == n)
            to[n++] = (geoWanSend){.peer = x->peer, .amount = 0};
        to[j].amount += (double)x->n;
    }
    geoWanPace(&comm->wan.pace, &comm->net, &comm->regions, comm->rank, comm->hier_w,
               comm->topo.region_rtt, to, n, sl->len, call_bytes, on);
    if (to != local)
        free(to);
}

static ncclResult_t copy_msgs(const hierMsg *m, int n, hierXferMsg **out)
{
    *out = calloc((size_t)n + 1, sizeof(hierXferMsg));
    if (*out == NULL)
        return ncclSystemError;
    for (int i = 0; i < n; i++)
        (*out)[i] = (hierXferMsg){.peer = m[i].peer, .off = m[i].off, .n = m[i].n};
    return ncclSuccess;
}

ncclResult_t geoHierExchangePlan(struct ncclComm *comm, size_t count, hierXferPlan *plan)
{
    hierSlice sl = {.s0 = 0, .len = count};
    hierCodec none;
    ncclResult_t r = ncclSuccess;

    memset(plan, 0, sizeof(*plan));
    memset(&none, 0, sizeof(none));
    if (comm->regions.nregions > 64)
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: more than 64 regions",
                            geoErrOp(&comm->err));
    /* es = 0: no receive buffers are laid out, only the messages. */
    if (hierSlicePlan(comm, &sl, 0, &none, ncclFloat32, geoSegPadded, 0) != ncclSuccess ||
        copy_msgs(sl.tx1, sl.ntx1, &plan->tx1) != ncclSuccess ||
        copy_msgs(sl.rx1, sl.nrx1, &plan->rx1) != ncclSuccess ||
        copy_msgs(sl.tx2, sl.ntx2, &plan->tx2) != ncclSuccess ||
        copy_msgs(sl.rx2, sl.nrx2, &plan->rx2) != ncclSuccess ||
        (plan->parts = calloc((size_t)sl.nparts + 1, sizeof(hierXferPart))) == NULL) {
        r = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory planning the exchange",
                         geoErrOp(&comm->err));
    } else {
        plan->ntx1 = sl.ntx1;
        plan->nrx1 = sl.nrx1;
        plan->ntx2 = sl.ntx2;
        plan->nrx2 = sl.nrx2;
        plan->nparts = sl.nparts;
        for (int p = 0; p < sl.nparts; p++)
            plan->parts[p] = (hierXferPart){.off = sl.parts[p].off, .n = sl.parts[p].n,
                                        .first_rx = sl.parts[p].first_rx};
    }
    hierSliceFree(comm, &sl);
    if (r != ncclSuccess)
        geoHierExchangePlanFree(plan);
    return r;
}

void geoHierExchangePlanFree(hierXferPlan *plan)
{
    free(plan->tx1);
    free(plan->rx1);
    free(plan->tx2);
    free(plan->rx2);
    free(plan->parts);
    memset(plan, 0, sizeof(*plan));
}
