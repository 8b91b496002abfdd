/* Hierarchical all-reduce across regions.
 *
 * The buffer is cut into slices of GEOCCL_HIER_SLICE bytes.  Per slice:
 *
 *  RS  intra-region ring reduce-scatter: local rank i of region q ends with
 *      segment i of the slice (geoSegRange(len, n_q, i)) summed over q.
 *  X1  the segment boundaries of all regions cut the slice into pieces; each
 *      piece has exactly one owner per region.  A piece is split in k parts
 *      (k regions); the owner in region q reduces part q: every owner sends
 *      its region's partial of part q to the owner in region q.
 *  R   the owner in region q sums the k partials of part q in region order
 *      (0, 1, ..., k-1: the same order everywhere, so the same bits),
 *  X2  and sends the result back to the other k-1 owners.
 *  AG  intra-region ring all-gather of the finished segments.
 *
 * When the region's ranks share a host (comm->cma, cma.h), RS and AG are
 * single-copy transfers instead of the ring: each rank reads its segment of
 * the others' inputs and sums it, then writes it, finished, into their
 * outputs (intra_cma_rs, intra_cma_ag).
 *
 * Every byte of a region's partial crosses its WAN link once out and once
 * back: 2(k-1)/k of the data per region, the minimum, spread over all the
 * region's ranks whatever the region sizes (3 + 1 works: the lone rank owns
 * the whole slice, the three others a third each).
 *
 * Slices are software-pipelined: iteration s does RS and X1 of slice s, R and
 * X2 of slice s - D, AG of slice s - 2D (D: geoHierDepth), so the WAN always has work
 * queued while the intra phases run.  All ranks run the same schedule and
 * post messages in the same order, which keeps each peer pair's message
 * order matched (transport.h).
 *
 * Compression (GEOCCL_COMPRESS, geocclCommSetCompression): X1 and X2 carry
 * encoded chunks (compress/codec.h) as variable-length messages.  X1
 * encodes my region's partial of part q with error feedback slot 1; the
 * owner decodes the k-1 partials into floats and sums them with its own
 * exact partial in region order.  X2 encodes the finished part once (slot
 * 2), and the owner then replaces its own copy by decode(encode(part)), the
 * very bytes every other region decodes: all ranks end bit-identical.  The
 * intra-region phases stay exact.  With GEOCCL_COMPRESS=auto the plan may
 * give each region a codec of its own for what it sends, X1 and X2 alike
 * (a slow link compresses, a fast one sends exactly): each message is
 * decoded in its sender's codec, and the argument above holds per sender
 * (coll_hier_codec.c, hierChooseCodec).
 *
 * Each slice's messages are laid out in coll_hier_plan.c
 * (hier_internal.h); this file runs the phases. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/coll/cma.h"
#include "comm/coll/coll.h"
#include "comm/coll/hier_internal.h"
#include "comm/core/comm.h"
#include "comm/coll/reduce.h"
#include "compress/codec.h"
#include "topology/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Slices in flight (GEOCCL_HIER_DEPTH; 0: auto).  A slice's WAN round trip
 * must fit in D iterations of the caller's loop, or the caller waits on the
 * link's latency at every slice: with small slices, D = 2 left a 64 MiB
 * sign all-reduce in 1 MiB slices waiting a one-way delay every two slices.
 * But the all-gather of slice s runs only at iteration s + 2D, so a large
 * D pushes the all-gathers to the end, where nothing hides them: a quarter
 * of the slices, 2 to 16.  Up to 16 because 8 left 2 x 4 regions at 1 Gbit/s
 * (1 MiB slices, 8.4 ms of link time each) short of partials now and then;
 * 3 x 2 ran the same at 8, 12 and 16.  Every rank computes the same D. */
int geoHierDepth(const struct ncclComm *comm, size_t nslices)
{
    return comm->hier_depth > 0 ? comm->hier_depth : topoHierDepthAuto(nslices);
}

static ncclResult_t post_all(struct ncclComm *comm, hierMsg *msgs, int n, int send,
                             const hierView *v, size_t es)
{
    for (int i = 0; i < n; i++) {
        hierMsg *x = &msgs[i];
        if (x->enc) {
            if (send)
                GEO_CHECK(geoNetIsendV(&comm->net, x->peer, x->enc, x->enc_len, &x->req));
            else
                GEO_CHECK(geoNetIrecvV(&comm->net, x->peer, x->enc, x->enc_cap, &x->req));
            comm->net.sent.wan_raw += send ? x->n * es : 0;
            x->posted = 1;
            continue;
        }
        if (send)
            GEO_CHECK(geoNetIsend(&comm->net, x->peer, hierAt(v, x->off, es), x->n * es, &x->req));
        else
            GEO_CHECK(geoNetIrecv(&comm->net, x->peer, x->tmp ? x->tmp : hierAt(v, x->off, es),
                                  x->n * es, &x->req));
        x->posted = 1;
    }
    return ncclSuccess;
}

static ncclResult_t wait_msgs(struct ncclComm *comm, hierMsg *msgs, int n)
{
    for (int i = 0; i < n; i++)
        if (msgs[i].posted) {
            GEO_CHECK(geoNetWait(&comm->net, &msgs[i].req));
            msgs[i].posted = 0;
        }
    return ncclSuccess;
}

/* Reduce-scatter of one slice with single-copy reads (cma.h): my segment
 * of every other local rank's input (their addresses: comm->cma_peer_buf,
 * exchanged at the start of the call) comes straight from its memory, a
 * block at a time into a small buffer that stays in cache, and is summed
 * into my output, mine first, then the others in local order from mine
 * (each segment is summed by its owner only, so a fixed order is all that
 * bit-identical results need).  Nothing is sent: the others read mine. */
#define HIER_CMA_BLOCK ((size_t)64 << 10)
static ncclResult_t intra_cma_rs(struct ncclComm *comm, const geoOp *op, const hierSlice *sl,
                                 size_t es)
{
    const geoRing *ring = &comm->region_ring;
    const int n = ring->n, me = ring->me;
    char *out = (char *)op->recvbuff + sl->s0 * es;
    const char *local = (const char *)op->sendbuff + sl->s0 * es;
    size_t moff, mlen;
    geoSegRange(sl->len, n, me, &moff, &mlen);
    if (mlen == 0)
        return ncclSuccess;
    const size_t be = HIER_CMA_BLOCK / es;
    char *tmp = geoScratchGet(&comm->scratch, be * es);
    if (tmp == NULL) {
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for a reduce-scatter",
                            geoErrOp(&comm->err));
    }
    ncclResult_t res = ncclSuccess;
    for (size_t c = 0; c < mlen && res == ncclSuccess; c += be) {
        const size_t m = mlen - c < be ? mlen - c : be, at_el = sl->s0 + moff + c;
        char *dst = out + (moff + c) * es;
        const char *acc = local + (moff + c) * es; /* in place: dst itself (dst == a is fine) */
        for (int k = 1; k < n && res == ncclSuccess; k++) {
            const int j = (me + k) % n;
            res = geoCmaRead(comm, ring->ranks[j], tmp, comm->cma_peer_buf[3 * j] + at_el * es,
                             m * es);
            if (res == ncclSuccess)
                geoReduce(dst, acc, tmp, m, op->dt, op->op);
            acc = dst;
        }
    }
    geoScratchPut(&comm->scratch, tmp);
    return res;
}

/* All-gather of one slice with single-copy writes: once my segment of the
 * slice is final, I write it into every other local rank's output, and
 * wait for no one.  Only its owner writes a segment of anyone's output,
 * and no one else reads it there: the owner itself read it (in place, as
 * input) in the reduce-scatter, before.  So the slices need no signal
 * between the ranks; the one at the end of the call (each has written
 * everything it had to write and read everything it had to read) is
 * enough for everyone to return.  Pulling instead (read the others'
 * segments once each has signalled the slice) cost a wake-up round per
 * slice, and one more at the end, on hosts with fewer cores than ranks. */
static ncclResult_t intra_cma_ag(struct ncclComm *comm, const hierSlice *sl, const char *out,
                                 size_t es)
{
    const geoRing *ring = &comm->region_ring;
    const int n = ring->n, me = ring->me;
    size_t off, len;
    geoSegRange(sl->len, n, me, &off, &len);
    for (int k = 1; k < n && len > 0; k++) {
        const int j = (me + k) % n;
        GEO_CHECK(geoCmaWrite(comm, ring->ranks[j],
                              comm->cma_peer_buf[3 * j + 1] + (sl->s0 + off) * es,
                              out + off * es, len * es));
    }
    return ncclSuccess;
}

/* RS or AG of one slice over my region: in two stages where the call
 * runs the node stage and my region has one (coll_hier_node.c). */
static ncclResult_t intra(struct ncclComm *comm, const geoOp *op, const hierSlice *sl, int ag,
                          size_t es, int cma, int staged)
{
    const geoRing *ring = &comm->region_ring;
    char *out = (char *)op->recvbuff + sl->s0 * es;
    if (staged)
        return hierNodeIntra(comm, op, sl->s0, sl->len, ag, es);
    if (cma)
        return ag ? intra_cma_ag(comm, sl, out, es) : intra_cma_rs(comm, op, sl, es);
    if (ring->n == 1) {
        if (!ag && op->sendbuff != op->recvbuff)
            memmove(out, (const char *)op->sendbuff + sl->s0 * es, sl->len * es);
        return ncclSuccess;
    }
    if (ag) {
        geoRingPlan p = {.a = 0, .nsteps = ring->n - 1, .reduce_steps = 0, .local = NULL,
                         .out = out, .out_final = NULL, .divide = 0};
        return geoRingRun(comm, op, ring, &p, sl->len);
    }
    size_t off, len;
    geoSegRange(sl->len, ring->n, ring->me, &off, &len);
    geoRingPlan p = {.a = -1, .nsteps = ring->n - 1, .reduce_steps = ring->n - 1,
                     .local = (const char *)op->sendbuff + sl->s0 * es, .out = NULL,
                     .out_final = out + off * es, .divide = 0};
    return geoRingRun(comm, op, ring, &p, sl->len);
}

/* Sum the k partials of each of my parts in region order. */
static void reduce_parts(struct ncclComm *comm, const geoOp *op, hierSlice *sl, size_t es,
                         char *scratch, const hierView *v)
{
    const int k = comm->regions.nregions, g = comm->regions.region_of[comm->rank];
    for (int p = 0; p < sl->nparts; p++) {
        hierPart *part = &sl->parts[p];
        char *mine = hierAt(v, part->off, es);
        if (part->n == 0)
            continue;
        /* partial of region q: mine when q == g, else the X1 receive from it */
        const char *src[64] = {0};
        for (int q = 0, j = 0; q < k; q++)
            src[q] = q == g ? mine : sl->rx1[part->first_rx + j++].tmp;
        /* ((p0 + p1) + p2) ...: the running sum in scratch, the last step
         * straight into mine (read by no later step), no copies. */
        const char *acc = src[0];
        for (int q = 1; q < k; q++) {
            char *dst = q == k - 1 ? mine : scratch;
            geoReduce(dst, acc, src[q], part->n, op->dt, op->op);
            acc = dst;
        }
        if (op->op == ncclAvg)
            geoDivide(mine, part->n, op->dt, comm->nranks);
    }
}

ncclResult_t geoHierAllReduce(struct ncclComm *comm, const geoOp *op)
{
    const size_t es = geoTypeSize(op->dt);
    const size_t se = comm->hier_slice / es ? comm->hier_slice / es : 1;
    const size_t M = (op->count + se - 1) / se;
    ncclResult_t res = ncclSuccess;
    hierSlice *sl = calloc(M ? M : 1, sizeof(*sl));
    char *scratch = NULL;
    double t0;

    if (sl == NULL || comm->regions.nregions > 64) {
        free(sl);
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory (or more than 64 regions)",
                            geoErrOp(&comm->err));
    }
    hierCodec hc;
    const hierView view = {.buf = op->recvbuff, .base = 0, .seg = geoSegRange};
    const hierView *v = &view;
    hierChooseCodec(comm, op, &hc, comm->call_region_codecs);
    /* The node stage: every rank decides alike (the same plan and size);
     * my region runs it where it has nodes, the others' segments follow. */
    if (comm->hier_nodes == NULL)
        GEO_CHECK_GOTO(geoHierNodesBuild(comm), res, out);
    const int node_stage = geoHierNodeStage(comm, op->count * es);
    const int staged = node_stage && comm->hier_nodes->node_ring.n > 1;
    size_t maxpart = 0;
    for (size_t s = 0; s < M; s++) {
        sl[s].s0 = s * se;
        sl[s].len = op->count - sl[s].s0 < se ? op->count - sl[s].s0 : se;
        if (hierSlicePlan(comm, &sl[s], es, &hc, op->dt, geoSegRange, node_stage) != ncclSuccess) {
            res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory planning slice %zu",
                               geoErrOp(&comm->err), s);
            goto out;
        }
        for (int p = 0; p < sl[s].nparts; p++)
            if (sl[s].parts[p].n > maxpart)
                maxpart = sl[s].parts[p].n;
    }
    scratch = geoScratchGet(&comm->scratch, maxpart * es + 1);
    if (scratch == NULL) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for the exchange",
                           geoErrOp(&comm->err));
        goto out;
    }
    /* Single-copy reads: the others need my input's and output's addresses
     * (and whether they can be read that way). */
    int cma = comm->cma && comm->region_ring.n > 1 && M > 0 && !staged;
    if (cma)
        GEO_CHECK_GOTO(geoCmaExchange(comm, op->sendbuff, op->recvbuff, op->count * es, &cma),
                       res, out);
    const size_t D = (size_t)geoHierDepth(comm, M);
    if (M > 0)
        hierPaceWan(comm, &sl[0], hc.any ? 0 : (double)op->count * (double)es, 1);
    /* The call's timeline, for GEOCCL_DEBUG=TRACE: when the first partials
     * left for other regions, when the first and the last came in, when the
     * last finished parts came back.  Against the link's time for the bytes
     * it shows where the WAN waited. */
    const double tstart = geoNow();
    double tl[4] = {0, 0, 0, 0};
    for (size_t it = 0; it < M + 2 * D; it++) {
        if (it < M) {
            t0 = geoNow();
            GEO_CHECK_GOTO(intra(comm, op, &sl[it], 0, es, cma, staged), res, out);
            comm->stats.t_intra_rs += geoNow() - t0;
            if (hc.codec) {
                t0 = geoNow();
                GEO_CHECK_GOTO(hierEncodeX1(comm, op, &sl[it], &hc, v), res, out);
                comm->stats.t_codec += geoNow() - t0;
            }
            GEO_CHECK_GOTO(hierSliceTmp(comm, &sl[it]), res, out);
            GEO_CHECK_GOTO(post_all(comm, sl[it].tx1, sl[it].ntx1, 1, v, es), res, out);
            GEO_CHECK_GOTO(post_all(comm, sl[it].rx1, sl[it].nrx1, 0, v, es), res, out);
            if (it == 0)
                tl[0] = geoNow();
        }
        if (it >= D && it - D < M) {
            hierSlice *x = &sl[it - D];
            t0 = geoNow();
            GEO_CHECK_GOTO(wait_msgs(comm, x->rx1, x->nrx1), res, out);
            comm->stats.t_inter += geoNow() - t0;
            if (it - D == 0)
                tl[1] = geoNow();
            if (it - D == M - 1) /* the same slice when there is one */
                tl[2] = geoNow();
            if (hierFusedDecode(op, &hc)) {
                t0 = geoNow();
                GEO_CHECK_GOTO(hierDecodeReduceX1(comm, op, x, (float *)scratch, v), res, out);
                comm->stats.t_codec += geoNow() - t0;
            } else {
                if (hc.any) {
                    t0 = geoNow();
                    GEO_CHECK_GOTO(hierDecodeX1(comm, op, x), res, out);
                    comm->stats.t_codec += geoNow() - t0;
                }
                reduce_parts(comm, op, x, es, scratch, v);
            }
            hierSliceTmpPut(comm, x);
            if (hc.codec) {
                t0 = geoNow();
                GEO_CHECK_GOTO(hierEncodeX2(comm, op, x, &hc, v), res, out);
                comm->stats.t_codec += geoNow() - t0;
            }
            GEO_CHECK_GOTO(post_all(comm, x->tx2, x->ntx2, 1, v, es), res, out);
            GEO_CHECK_GOTO(post_all(comm, x->rx2, x->nrx2, 0, v, es), res, out);
        }
        if (it >= 2 * D && it - 2 * D < M) {
            hierSlice *x = &sl[it - 2 * D];
            t0 = geoNow();
            GEO_CHECK_GOTO(wait_msgs(comm, x->rx2, x->nrx2), res, out);
            GEO_CHECK_GOTO(wait_msgs(comm, x->tx1, x->ntx1), res, out);
            GEO_CHECK_GOTO(wait_msgs(comm, x->tx2, x->ntx2), res, out);
            comm->stats.t_inter += geoNow() - t0;
            if (it - 2 * D == M - 1)
                tl[3] = geoNow();
            if (hc.any) {
                t0 = geoNow();
                GEO_CHECK_GOTO(hierDecodeX2(comm, op, x, v), res, out);
                comm->stats.t_codec += geoNow() - t0;
            }
            t0 = geoNow();
            GEO_CHECK_GOTO(intra(comm, op, x, 1, es, cma, staged), res, out);
            comm->stats.t_intra_ag += geoNow() - t0;
        }
    }
    /* No one may touch my buffers once I return: all have read and written
     * everything. */
    if (cma)
        GEO_CHECK_GOTO(geoCmaSignal(comm, UINT64_MAX), res, out);
    geoTrace(GEO_LOG_COLL, "%s: %zu slices of %zu bytes%s, %zu in flight: first partials sent "
             "at %.1f ms, first in at %.1f, last in at %.1f, last results in at %.1f, done at "
             "%.1f", geoErrOp(&comm->err), M, se * es,
             staged ? " (node and region stages)" : "", D, (tl[0] - tstart) * 1e3,
             (tl[1] - tstart) * 1e3,
             (tl[2] - tstart) * 1e3, (tl[3] - tstart) * 1e3, (geoNow() - tstart) * 1e3);
out:
    if (res != ncclSuccess)
        geoNetBreak(&comm->net); /* posted requests must not outlive sl */
    if (M > 0)
        hierPaceWan(comm, &sl[0], hc.any ? 0 : (double)op->count * (double)es, 0);
    for (size_t s = 0; s < M; s++)
        hierSliceFree(comm, &sl[s]);
    free(sl);
    geoScratchPut(&comm->scratch, scratch);
    return res;
}

ncclResult_t geoHierExchange(struct ncclComm *comm, const geoOp *op, char *buf, size_t base)
{
    const size_t es = geoTypeSize(op->dt);
    const hierView view = {.buf = buf, .base = base, .seg = geoSegPadded};
    const hierView *v = &view;
    hierSlice sl = {.s0 = 0, .len = op->count};
    hierCodec hc;
    char *scratch = NULL;
    ncclResult_t res = ncclSuccess;
    double t0;

    if (comm->regions.nregions > 64)
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: more than 64 regions",
                            geoErrOp(&comm->err));
    /* one codec for all: the GPU path chose it for the whole call */
    hierChooseCodec(comm, op, &hc, NULL);
    if (hierSlicePlan(comm, &sl, es, &hc, op->dt, geoSegPadded, 0) != ncclSuccess) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory planning the exchange",
                           geoErrOp(&comm->err));
        goto out;
    }
    GEO_CHECK_GOTO(hierSliceTmp(comm, &sl), res, out);
    size_t maxpart = 0;
    for (int p = 0; p < sl.nparts; p++)
        if (sl.parts[p].n > maxpart)
            maxpart = sl.parts[p].n;
    scratch = geoScratchGet(&comm->scratch, maxpart * es + 1);
    if (scratch == NULL) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for the exchange",
                           geoErrOp(&comm->err));
        goto out;
    }
    t0 = geoNow();
    hierPaceWan(comm, &sl, hc.any ? 0 : (double)op->count * (double)es, 1);
    if (hc.codec)
        GEO_CHECK_GOTO(hierEncodeX1(comm, op, &sl, &hc, v), res, out);
    GEO_CHECK_GOTO(post_all(comm, sl.tx1, sl.ntx1, 1, v, es), res, out);
    GEO_CHECK_GOTO(post_all(comm, sl.rx1, sl.nrx1, 0, v, es), res, out);
    GEO_CHECK_GOTO(wait_msgs(comm, sl.rx1, sl.nrx1), res, out);
    if (hierFusedDecode(op, &hc)) {
        GEO_CHECK_GOTO(hierDecodeReduceX1(comm, op, &sl, (float *)scratch, v), res, out);
    } else {
        if (hc.any)
            GEO_CHECK_GOTO(hierDecodeX1(comm, op, &sl), res, out);
        reduce_parts(comm, op, &sl, es, scratch, v);
    }
    if (hc.codec)
        GEO_CHECK_GOTO(hierEncodeX2(comm, op, &sl, &hc, v), res, out);
    GEO_CHECK_GOTO(post_all(comm, sl.tx2, sl.ntx2, 1, v, es), res, out);
    GEO_CHECK_GOTO(post_all(comm, sl.rx2, sl.nrx2, 0, v, es), res, out);
    GEO_CHECK_GOTO(wait_msgs(comm, sl.rx2, sl.nrx2), res, out);
    GEO_CHECK_GOTO(wait_msgs(comm, sl.tx1, sl.ntx1), res, out);
    GEO_CHECK_GOTO(wait_msgs(comm, sl.tx2, sl.ntx2), res, out);
    if (hc.any)
        GEO_CHECK_GOTO(hierDecodeX2(comm, op, &sl, v), res, out);
    comm->stats.t_inter += geoNow() - t0;
out:
    if (res != ncclSuccess)
        geoNetBreak(&comm->net); /* posted requests must not outlive sl */
    hierPaceWan(comm, &sl, hc.any ? 0 : (double)op->count * (double)es, 0);
    hierSliceFree(comm, &sl);
    geoScratchPut(&comm->scratch, scratch);
    return res;
}

/* ---- hierarchical all-gather and reduce-scatter ----------------------
 *
 * Both move every byte over the WAN the least number of times: a block
 * crosses into each other region once.  The rank of region q that handles
 * block b (receives it for its region, or reduces its region's share of
 * it) is b itself when b is in q, else the member of q whose local rank is
 * b's local rank modulo q's size: regions of different sizes spread the
 * blocks over all their ranks. */

static int block_handler(const topoRegionMap *m, int q, int b)
{
    if (m->region_of[b] == q)
        return b;
    return m->members[q][m->local_rank[b] % m->size[q]];
}

/* All-gather: (1) each rank sends its block to its handler in every other
 * region; (2) inside each region, every block goes from its handler to the
 * other members.  Messages of a pair are posted in ascending block order. */
ncclResult_t geoHierAllGather(struct ncclComm *comm, const geoOp *op)
{
    const topoRegionMap *m = &comm->regions;
    const int N = comm->nranks, me = comm->rank, g = m->region_of[me];
    const size_t bytes = op->count * geoTypeSize(op->dt);
    char *out = op->recvbuff;
    geoNetRequest *req = calloc((size_t)(N + N * m->size[g] + m->nregions + 1), sizeof(*req));
    int nreq = 0;
    ncclResult_t res = ncclSuccess;
    double t0 = geoNow();

    if (req == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for %d requests",
                            geoErrOp(&comm->err), N + N * m->size[g] + m->nregions);
    if (out + (size_t)me * bytes != (const char *)op->sendbuff)
        memmove(out + (size_t)me * bytes, op->sendbuff, bytes);
    /* (1) inter-region: my block out, the blocks I handle in */
    for (int q = 0; q < m->nregions; q++)
        if (q != g)
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, block_handler(m, q, me), op->sendbuff, bytes,
                                       &req[nreq++]), res, out);
    for (int b = 0; b < N; b++)
        if (m->region_of[b] != g && block_handler(m, g, b) == me)
            GEO_CHECK_GOTO(geoNetIrecv(&comm->net, b, out + (size_t)b * bytes, bytes, &req[nreq++]),
                           res, out);
    for (int i = 0; i < nreq; i++)
        GEO_CHECK_GOTO(geoNetWait(&comm->net, &req[i]), res, out);
    comm->stats.t_inter += geoNow() - t0;
    t0 = geoNow();
    /* (2) intra-region: blocks from their handlers to everyone */
    nreq = 0;
    for (int b = 0; b < N; b++) {
        int h = block_handler(m, g, b);
        if (h == me) {
            for (int i = 0; i < m->size[g]; i++)
                if (m->members[g][i] != me)
                    GEO_CHECK_GOTO(geoNetIsend(&comm->net, m->members[g][i], out + (size_t)b * bytes,
                                               bytes, &req[nreq++]), res, out);
        } else {
            GEO_CHECK_GOTO(geoNetIrecv(&comm->net, h, out + (size_t)b * bytes, bytes, &req[nreq++]),
                           res, out);
        }
    }
    for (int i = 0; i < nreq; i++)
        GEO_CHECK_GOTO(geoNetWait(&comm->net, &req[i]), res, out);
    comm->stats.t_intra_ag += geoNow() - t0;
out:
    if (res != ncclSuccess)
        geoNetBreak(&comm->net);
    free(req);
    return res;
}

/* Reduce-scatter: (1) inside each region, every member sends its input
 * block b to the block's handler, which sums the region's share in local
 * rank order; (2) each handler sends its region's share of block b to rank
 * b, which sums the regions' shares in region order. */
ncclResult_t geoHierReduceScatter(struct ncclComm *comm, const geoOp *op)
{
    const topoRegionMap *m = &comm->regions;
    const int N = comm->nranks, me = comm->rank, g = m->region_of[me], ng = m->size[g];
    const size_t es = geoTypeSize(op->dt), n = op->count, bytes = n * es;
    const char *in = op->sendbuff;
    int mine = 0; /* blocks I handle */
    for (int b = 0; b < N; b++)
        mine += block_handler(m, g, b) == me;
    /* per handled block: ng inputs (mine in place) then the region share */
    char *stage = malloc((size_t)mine * (size_t)ng * bytes + 1);
    char *shares = malloc((size_t)m->nregions * bytes + 1);
    geoNetRequest *req = calloc((size_t)(N * ng + N + m->nregions + 1), sizeof(*req));
    int nreq = 0;
    ncclResult_t res = ncclSuccess;
    double t0 = geoNow();

    if (!stage || !shares || !req) {
        free(stage);
        free(shares);
        free(req);
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory staging %d blocks",
                            geoErrOp(&comm->err), mine);
    }
    /* (1) intra-region */
    for (int b = 0, k = 0; b < N; b++) {
        int h = block_handler(m, g, b);
        if (h != me) {
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, h, in + (size_t)b * bytes, bytes, &req[nreq++]),
                           res, out);
            continue;
        }
        char *slot = stage + (size_t)k++ * (size_t)ng * bytes;
        for (int i = 0; i < ng; i++)
            if (m->members[g][i] != me)
                GEO_CHECK_GOTO(geoNetIrecv(&comm->net, m->members[g][i], slot + (size_t)i * bytes,
                                           bytes, &req[nreq++]), res, out);
            else
                memcpy(slot + (size_t)i * bytes, in + (size_t)b * bytes, bytes);
    }
    for (int i = 0; i < nreq; i++)
        GEO_CHECK_GOTO(geoNetWait(&comm->net, &req[i]), res, out);
    for (int b = 0, k = 0; b < N; b++) {
        if (block_handler(m, g, b) != me)
            continue;
        char *slot = stage + (size_t)k++ * (size_t)ng * bytes;
        for (int i = 1; i < ng; i++) /* region share into the slot's first input */
            geoReduce(slot, slot, slot + (size_t)i * bytes, n, op->dt, op->op);
    }
    comm->stats.t_intra_rs += geoNow() - t0;
    t0 = geoNow();
    /* (2) inter-region: shares of other ranks' blocks out, mine in */
    nreq = 0;
    for (int b = 0, k = 0; b < N; b++) {
        if (block_handler(m, g, b) != me)
            continue;
        char *slot = stage + (size_t)k++ * (size_t)ng * bytes;
        if (b != me)
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, b, slot, bytes, &req[nreq++]), res, out);
        else
            memcpy(shares + (size_t)g * bytes, slot, bytes);
    }
    for (int q = 0; q < m->nregions; q++)
        if (q != g)
            GEO_CHECK_GOTO(geoNetIrecv(&comm->net, block_handler(m, q, me), shares + (size_t)q * bytes, bytes,
                                       &req[nreq++]), res, out);
    for (int i = 0; i < nreq; i++)
        GEO_CHECK_GOTO(geoNetWait(&comm->net, &req[i]), res, out);
    {
        char *dst = op->recvbuff;
        memmove(dst, shares, bytes);
        for (int q = 1; q < m->nregions; q++)
            geoReduce(dst, dst, shares + (size_t)q * bytes, n, op->dt, op->op);
        if (op->op == ncclAvg)
            geoDivide(dst, n, op->dt, N);
    }
    comm->stats.t_inter += geoNow() - t0;
out:
    if (res != ncclSuccess)
        geoNetBreak(&comm->net);
    free(stage);
    free(shares);
    free(req);
    return res;
}
