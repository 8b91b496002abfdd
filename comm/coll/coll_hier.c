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
 * (choose_codec). */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/coll/cma.h"
#include "comm/coll/coll.h"
#include "comm/core/comm.h"
#include "comm/coll/reduce.h"
#include "compress/codec.h"
#include "compress/ef.h"
#include "topology/model.h"
#include "topology/wan_tuning.h"

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
 * 3 x 2 ran the same at 8, 12 and 16 (2026-11-30; BENCHMARKS.md as of
 * commit 87c1c2f holds the A/B runs).  Every
 * rank computes the same D. */
int geoHierDepth(const struct ncclComm *comm, size_t nslices)
{
    return comm->hier_depth > 0 ? comm->hier_depth : topoHierDepthAuto(nslices);
}

typedef struct {
    int peer;
    size_t off;         /* element offset in the buffer */
    size_t n;           /* elements */
    char *tmp;          /* X1 receive: where the peer's partial lands */
    const geoCodec *codec; /* the sending region's codec; NULL: exact */
    char *enc;          /* compressed: the chunk sent, or the receive buffer */
    size_t enc_cap;     /* bytes at enc */
    size_t enc_len;     /* send: chunk bytes */
    int enc_owned;      /* enc was allocated for this message */
    geoNetRequest req;
    int posted;
} hierMsg;

/* What compression does in this call.  Each region encodes what it sends
 * in its codec, of[q] (NULL: exact); codec is my region's, any whether
 * some region compresses.  One codec for all unless the plan gives each
 * region its own (geoTuningRegionCodecs). */
typedef struct {
    const geoCodec *codec;
    const geoCodec *of[64];
    int any;
    const geoCodecParams *params;
    /* The return trip's parameters: the same, except that topk keeps R
     * times the fraction, so that the union of the R regions' kept elements
     * (at most R k of the part is non-zero after the first trip) goes back
     * whole: sparsified once, like top-k SGD, not twice.  Where some
     * regions send their partials exactly (a codec per region), the part
     * is denser than that and its return trip keeps only the R k largest. */
    geoCodecParams p2;
    float *ef1, *ef2;   /* residuals over the whole buffer, or NULL */
    uint64_t counter;   /* stochastic rounding stream of this call */
} hierCodec;

typedef struct {
    size_t off, n;      /* my part of the piece: elements I reduce */
    int first_rx;       /* index of its k-1 X1 receives in rx1 */
} hierPart;

typedef struct {
    size_t s0, len;     /* slice in elements */
    hierMsg *tx1, *rx1, *tx2, *rx2;
    int ntx1, nrx1, ntx2, nrx2;
    hierPart *parts;
    int nparts;
    char *tmp;          /* X1 receive buffer (slice_tmp), NULL outside */
    size_t tmp_bytes, es;
} hierSlice;

/* Where the call's data lives on this host and how a region's slice is cut
 * among its ranks.  The host path: the user's buffer (base 0), cut by
 * geoSegRange.  The device path (geoHierExchange): a staging buffer that
 * holds only elements [base, base + n) of the call, cut as NCCL's
 * reduce-scatter cuts (geoSegPadded). */
typedef void (*hierSegFn)(size_t count, int n, int i, size_t *off, size_t *len);
typedef struct {
    char *buf;
    size_t base;
    hierSegFn seg;
} hierView;

static char *at(const hierView *v, size_t off, size_t es)
{
    return v->buf + (off - v->base) * es;
}

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

static void slice_free(struct ncclComm *comm, hierSlice *sl)
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
static ncclResult_t slice_tmp(struct ncclComm *comm, hierSlice *sl)
{
    sl->tmp = geoScratchGet(&comm->scratch, sl->tmp_bytes);
    if (sl->tmp == NULL) {
        geoCommSetError(comm, "%s: out of memory for %zu receive bytes", geoErrOp(&comm->err),
                        sl->tmp_bytes);
        return ncclSystemError;
    }
    size_t t = 0;
    for (int i = 0; i < sl->nrx1; i++) {
        sl->rx1[i].tmp = sl->tmp + t * sl->es;
        t += sl->rx1[i].n;
    }
    return ncclSuccess;
}

static void slice_tmp_put(struct ncclComm *comm, hierSlice *sl)
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
static ncclResult_t slice_plan(struct ncclComm *comm, hierSlice *sl, size_t es,
                               const hierCodec *hc, ncclDataType_t dt, hierSegFn seg)
{
    const topoRegionMap *m = &comm->regions;
    const int k = m->nregions, g = m->region_of[comm->rank], me = m->local_rank[comm->rank];
    size_t nb = 0, *bounds;
    size_t my_off, my_len;

    seg(sl->len, m->size[g], me, &my_off, &my_len);
    int total_ranks = 0;
    for (int q = 0; q < k; q++)
        total_ranks += m->size[q];
    bounds = malloc(sizeof(size_t) * (size_t)(total_ranks + k + 1));
    if (bounds == NULL)
        return ncclSystemError;
    for (int q = 0; q < k; q++)
        for (int i = 0; i < m->size[q]; i++) {
            size_t o, l;
            seg(sl->len, m->size[q], i, &o, &l);
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
                seg(sl->len, m->size[q], i, &o, &l);
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
static void pace_wan(struct ncclComm *comm, const hierSlice *sl, double call_bytes, int on)
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
            GEO_CHECK(geoNetIsend(&comm->net, x->peer, at(v, x->off, es), x->n * es, &x->req));
        else
            GEO_CHECK(geoNetIrecv(&comm->net, x->peer, x->tmp ? x->tmp : at(v, x->off, es), x->n * es,
                                  &x->req));
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
        geoCommSetError(comm, "%s: out of memory for a reduce-scatter", geoErrOp(&comm->err));
        return ncclSystemError;
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
 * slice, and one more at the end, on hosts with fewer cores than ranks
 * (2026-11-30; BENCHMARKS.md as of commit 951e80f holds the A/B runs). */
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

/* RS or AG of one slice over my region. */
static ncclResult_t intra(struct ncclComm *comm, const geoOp *op, const hierSlice *sl, int ag,
                          size_t es, int cma)
{
    const geoRing *ring = &comm->region_ring;
    char *out = (char *)op->recvbuff + sl->s0 * es;
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
        char *mine = at(v, part->off, es);
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

static ncclResult_t codec_error(struct ncclComm *comm, const char *what, int peer,
                                const char *why, ncclResult_t res)
{
    if (peer >= 0)
        geoCommSetError(comm, "%s: %s rank %d (host %s): %s", geoErrOp(&comm->err), what, peer,
                        comm->peers[peer].net.host, why ? why : "invalid chunk");
    else
        geoCommSetError(comm, "%s: %s: %s", geoErrOp(&comm->err), what, why ? why : "failed");
    geoWarn(GEO_LOG_COMPRESS, "%s", geoErrLast(&comm->err));
    return res == ncclInvalidArgument ? ncclRemoteError : res;
}

/* X1 sends of one slice: encode my region's partial of each part. */
static ncclResult_t encode_x1(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                              const hierCodec *hc, const hierView *v)
{
    const size_t es = geoTypeSize(op->dt);
    for (int i = 0; i < sl->ntx1; i++) {
        hierMsg *x = &sl->tx1[i];
        ncclResult_t r = hc->codec->encode(at(v, x->off, es), x->n, op->dt,
                                           hc->params, hc->counter + 2 * x->off,
                                           hc->ef1 ? hc->ef1 + x->off : NULL, x->enc,
                                           x->enc_cap, &x->enc_len);
        if (r != ncclSuccess)
            return codec_error(comm, "encoding a partial for", x->peer, NULL, r);
    }
    return ncclSuccess;
}

/* X1 receives: decode the other regions' partials of my parts. */
static ncclResult_t decode_x1(struct ncclComm *comm, const geoOp *op, hierSlice *sl)
{
    for (int i = 0; i < sl->nrx1; i++) {
        hierMsg *x = &sl->rx1[i];
        const char *why = NULL;
        if (x->codec == NULL) /* an exact region's: already in place */
            continue;
        ncclResult_t r = x->codec->decode(x->enc, x->req.size, op->dt, x->tmp, x->n, &why);
        if (r != ncclSuccess)
            return codec_error(comm, "a corrupt compressed chunk from", x->peer, why, r);
    }
    return ncclSuccess;
}

/* X1 receives and R of a float32 sum/avg in one pass: the k partials of
 * each of my parts summed in region order, the other regions' decoded
 * straight into the sum (decodeAccumulate: one binary32 addition each, the
 * same bits as decode_x1 then reduce_parts, without the decoded copies). */
static int fused_decode(const geoOp *op, const hierCodec *hc)
{
    return hc->any && op->dt == ncclFloat32 &&
           (op->op == ncclSum || op->op == ncclAvg);
}

static ncclResult_t decode_reduce_x1(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                                     float *acc, const hierView *v)
{
    const int k = comm->regions.nregions, g = comm->regions.region_of[comm->rank];
    for (int p = 0; p < sl->nparts; p++) {
        hierPart *part = &sl->parts[p];
        float *mine = (float *)at(v, part->off, sizeof(float));
        if (part->n == 0)
            continue;
        for (int q = 0, j = 0; q < k; q++) {
            if (q == g) {
                if (q == 0)
                    memcpy(acc, mine, part->n * sizeof(float));
                else
                    geoReduce(acc, acc, mine, part->n, ncclFloat32, ncclSum);
                continue;
            }
            hierMsg *x = &sl->rx1[part->first_rx + j++];
            const char *why = NULL;
            ncclResult_t r = ncclSuccess;
            if (x->codec == NULL) { /* an exact region's partial, in x->tmp */
                if (q == 0)
                    memcpy(acc, x->tmp, part->n * sizeof(float));
                else
                    geoReduce(acc, acc, x->tmp, part->n, ncclFloat32, ncclSum);
            } else if (q == 0) {
                r = x->codec->decode(x->enc, x->req.size, ncclFloat32, acc, part->n, &why);
            } else {
                r = x->codec->decodeAccumulate(x->enc, x->req.size, ncclFloat32, acc, part->n,
                                               &why);
            }
            if (r != ncclSuccess)
                return codec_error(comm, "a corrupt compressed chunk from", x->peer, why, r);
        }
        if (op->op == ncclAvg)
            geoDivide(acc, part->n, ncclFloat32, comm->nranks);
        memcpy(mine, acc, part->n * sizeof(float));
    }
    return ncclSuccess;
}

/* X2: encode each finished part once, and keep decode(encode(part)) as my
 * own copy: the bytes every other region decodes. */
static ncclResult_t encode_x2(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                              const hierCodec *hc, const hierView *v)
{
    const size_t es = geoTypeSize(op->dt);
    int k1 = comm->regions.nregions - 1;
    for (int i = 0; i < sl->ntx2; i += k1) {
        hierMsg *x = &sl->tx2[i];
        char *part = at(v, x->off, es);
        const char *why = NULL;
        ncclResult_t r = hc->codec->encode(part, x->n, op->dt, &hc->p2,
                                           hc->counter + 2 * x->off + 1,
                                           hc->ef2 ? hc->ef2 + x->off : NULL, x->enc, x->enc_cap,
                                           &x->enc_len);
        if (r != ncclSuccess)
            return codec_error(comm, "encoding a reduced part for", x->peer, NULL, r);
        if (hc->codec->lossy &&
            (r = hc->codec->decode(x->enc, x->enc_len, op->dt, part, x->n, &why)) != ncclSuccess)
            return codec_error(comm, "decoding our own chunk", -1, why, r);
        for (int j = 1; j < k1; j++)
            sl->tx2[i + j].enc_len = x->enc_len;
    }
    return ncclSuccess;
}

/* X2 receives: decode the finished parts owned by other regions. */
static ncclResult_t decode_x2(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                              const hierView *v)
{
    const size_t es = geoTypeSize(op->dt);
    for (int i = 0; i < sl->nrx2; i++) {
        hierMsg *x = &sl->rx2[i];
        const char *why = NULL;
        if (x->codec == NULL) /* an exact region's: already in place */
            continue;
        ncclResult_t r = x->codec->decode(x->enc, x->req.size, op->dt, at(v, x->off, es), x->n,
                                          &why);
        if (r != ncclSuccess)
            return codec_error(comm, "a corrupt compressed chunk from", x->peer, why, r);
    }
    return ncclSuccess;
}

/* The codec a call may use (coll.h): lossy codecs only on float32 sum/avg,
 * and only when the user chose one; anything else is sent exactly (said
 * once at INFO). */
void geoHierCodecPolicy(struct ncclComm *comm, const geoOp *op, int codec,
                        geoHierCodecChoice *out)
{
    memset(out, 0, sizeof(*out));
    out->codec = GEO_CODEC_NONE;
    geoCodecId id = (geoCodecId)codec;
    if (id == GEO_CODEC_NONE || id >= GEO_CODEC_COUNT)
        return;
    const geoCodec *c = geoCodecGet(id);
    if (c == NULL)
        return;
    int ok = c->supports(op->dt) &&
             (!c->lossy || op->op == ncclSum || op->op == ncclAvg);
    if (!ok) {
        if (!comm->compress_fallback_noted) {
            comm->compress_fallback_noted = 1;
            geoInfo(GEO_LOG_COMPRESS, "GEOCCL_COMPRESS=%s applies to float sum/avg only: %s %s "
                    "all-reduces cross the WAN exactly", c->name, geoTypeName(op->dt),
                    geoOpName(op->op));
        }
        return;
    }
    out->codec = id;
    out->p1 = comm->codec_auto ? comm->auto_params : comm->codec_params;
    out->p2 = out->p1;
    if (id == GEO_CODEC_TOPK) {
        double k2 = out->p2.topkFraction * comm->regions.nregions;
        out->p2.topkFraction = k2 < 1 ? k2 : 1;
    }
    /* the call's own number: a device call's exchange runs on the
     * exchange thread, when the user thread may have issued later calls */
    out->counter = (op->seq ? op->seq : comm->op_seq) << 40;
    if (c->lossy && comm->ef_enabled) {
        /* GEOCCL_EF=2: only the return trip keeps a residual; 3: only the
         * first trip (see the parameter's help).  Unset: 3 for sign, whose
         * residuals on both trips made the digits example diverge while the
         * first trip alone matched uncompressed accuracy (BENCHMARKS.md,
         * "Which trip keeps the residual"); 1 for the others. */
        int mode = comm->ef_mode ? comm->ef_mode : id == GEO_CODEC_SIGN ? 3 : 1;
        out->ef1 = mode != 2;
        out->ef2 = mode != 3;
    }
}

void geoEfNoteUnregistered(struct ncclComm *comm, const void *buf)
{
    if (__atomic_exchange_n(&comm->ef_unreg_noted, 1, __ATOMIC_RELAXED))
        return;
    geoInfo(GEO_LOG_COMPRESS, "error feedback: %p is in no buffer registered with "
            "geocclCommRegisterErrorFeedback: compressed without error feedback (this and "
            "every other such call; GEOCCL_EF_KEY=address keys residuals by address instead)",
            buf);
}

/* The call's codecs: region q's is by_region[q] where the plan gives each
 * region its own, else comm->call_codec (the plan's or the user's), each
 * through the policy.  Every rank takes the same, so each message is
 * decoded in the codec it was encoded in.  Why a codec per sending region
 * keeps the results bit-identical: a region's X1 partials are decoded only
 * by the owner of each part, which sums them in region order; its X2 part
 * is encoded once and every region, the owner included (encode_x2),
 * decodes those same bytes.  Error feedback keeps residuals only for my
 * region's codec. */
static void choose_codec(struct ncclComm *comm, const geoOp *op, hierCodec *hc,
                         const unsigned char *by_region)
{
    const int R = comm->regions.nregions, g = comm->regions.region_of[comm->rank];
    geoHierCodecChoice ch, mine;
    memset(hc, 0, sizeof(*hc));
    memset(&mine, 0, sizeof(mine));
    for (int q = 0; q < R && q < 64; q++) {
        geoHierCodecPolicy(comm, op, by_region ? by_region[q] : comm->call_codec, &ch);
        if (ch.codec == GEO_CODEC_NONE)
            continue;
        hc->of[q] = geoCodecGet((geoCodecId)ch.codec);
        /* p2 differs from p1 only for topk (R k on the return trip) */
        if (!hc->any || ch.codec == GEO_CODEC_TOPK)
            hc->p2 = ch.p2;
        hc->any = 1;
        hc->counter = ch.counter;
        if (q == g)
            mine = ch;
    }
    if (!hc->any)
        return;
    hc->codec = hc->of[g];
    hc->params = comm->codec_auto ? &comm->auto_params : &comm->codec_params;
    ch = mine;
    if ((ch.ef1 || ch.ef2) && op->ef_key == 0) {
        geoEfNoteUnregistered(comm, op->recvbuff);
    } else if (ch.ef1 || ch.ef2) {
        size_t evicted = 0;
        geoEfBeginOp(&comm->ef);
        if (geoEfGet(&comm->ef, op->ef_key, op->recvbuff, op->count, 1, &hc->ef1, &evicted) !=
                ncclSuccess ||
            geoEfGet(&comm->ef, op->ef_key, op->recvbuff, op->count, 2, &hc->ef2, &evicted) !=
                ncclSuccess) {
            hc->ef1 = hc->ef2 = NULL;
            if (!comm->ef_full_noted) {
                comm->ef_full_noted = 1;
                geoInfo(GEO_LOG_COMPRESS, "error feedback: a %zu-element buffer does not fit "
                        "GEOCCL_EF_MAX_BYTES=%zu; it is compressed without error feedback",
                        op->count, comm->ef.maxBytes);
            }
        }
        if (!ch.ef1)
            hc->ef1 = NULL;
        if (!ch.ef2)
            hc->ef2 = NULL;
        if (geoEfTakeEvictionNotice(&comm->ef))
            geoInfo(GEO_LOG_COMPRESS, "error feedback: GEOCCL_EF_MAX_BYTES=%zu reached; least "
                    "recently used residuals are dropped (%llu so far)", comm->ef.maxBytes,
                    (unsigned long long)comm->ef.evictions);
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
        geoCommSetError(comm, "%s: out of memory (or more than 64 regions)", geoErrOp(&comm->err));
        free(sl);
        return ncclSystemError;
    }
    hierCodec hc;
    const hierView view = {.buf = op->recvbuff, .base = 0, .seg = geoSegRange};
    const hierView *v = &view;
    choose_codec(comm, op, &hc, comm->call_region_codecs);
    size_t maxpart = 0;
    for (size_t s = 0; s < M; s++) {
        sl[s].s0 = s * se;
        sl[s].len = op->count - sl[s].s0 < se ? op->count - sl[s].s0 : se;
        if (slice_plan(comm, &sl[s], es, &hc, op->dt, geoSegRange) != ncclSuccess) {
            geoCommSetError(comm, "%s: out of memory planning slice %zu", geoErrOp(&comm->err), s);
            res = ncclSystemError;
            goto out;
        }
        for (int p = 0; p < sl[s].nparts; p++)
            if (sl[s].parts[p].n > maxpart)
                maxpart = sl[s].parts[p].n;
    }
    scratch = geoScratchGet(&comm->scratch, maxpart * es + 1);
    if (scratch == NULL) {
        res = ncclSystemError;
        goto out;
    }
    /* Single-copy reads: the others need my input's and output's addresses
     * (and whether they can be read that way). */
    int cma = comm->cma && comm->region_ring.n > 1 && M > 0;
    if (cma)
        GEO_CHECK_GOTO(geoCmaExchange(comm, op->sendbuff, op->recvbuff, op->count * es, &cma),
                       res, out);
    const size_t D = (size_t)geoHierDepth(comm, M);
    if (M > 0)
        pace_wan(comm, &sl[0], hc.any ? 0 : (double)op->count * (double)es, 1);
    /* The call's timeline, for GEOCCL_DEBUG=TRACE: when the first partials
     * left for other regions, when the first and the last came in, when the
     * last finished parts came back.  Against the link's time for the bytes
     * it shows where the WAN waited (BENCHMARKS.md as of commit 17941ed). */
    const double tstart = geoNow();
    double tl[4] = {0, 0, 0, 0};
    for (size_t it = 0; it < M + 2 * D; it++) {
        if (it < M) {
            t0 = geoNow();
            GEO_CHECK_GOTO(intra(comm, op, &sl[it], 0, es, cma), res, out);
            comm->stats.t_intra_rs += geoNow() - t0;
            if (hc.codec) {
                t0 = geoNow();
                GEO_CHECK_GOTO(encode_x1(comm, op, &sl[it], &hc, v), res, out);
                comm->stats.t_codec += geoNow() - t0;
            }
            GEO_CHECK_GOTO(slice_tmp(comm, &sl[it]), res, out);
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
            if (fused_decode(op, &hc)) {
                t0 = geoNow();
                GEO_CHECK_GOTO(decode_reduce_x1(comm, op, x, (float *)scratch, v), res, out);
                comm->stats.t_codec += geoNow() - t0;
            } else {
                if (hc.any) {
                    t0 = geoNow();
                    GEO_CHECK_GOTO(decode_x1(comm, op, x), res, out);
                    comm->stats.t_codec += geoNow() - t0;
                }
                reduce_parts(comm, op, x, es, scratch, v);
            }
            slice_tmp_put(comm, x);
            if (hc.codec) {
                t0 = geoNow();
                GEO_CHECK_GOTO(encode_x2(comm, op, x, &hc, v), res, out);
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
                GEO_CHECK_GOTO(decode_x2(comm, op, x, v), res, out);
                comm->stats.t_codec += geoNow() - t0;
            }
            t0 = geoNow();
            GEO_CHECK_GOTO(intra(comm, op, x, 1, es, cma), res, out);
            comm->stats.t_intra_ag += geoNow() - t0;
        }
    }
    /* No one may touch my buffers once I return: all have read and written
     * everything. */
    if (cma)
        GEO_CHECK_GOTO(geoCmaSignal(comm, UINT64_MAX), res, out);
    geoTrace(GEO_LOG_COLL, "%s: %zu slices of %zu bytes, %zu in flight: first partials sent at "
             "%.1f ms, first in at %.1f, last in at %.1f, last results in at %.1f, done at %.1f",
             geoErrOp(&comm->err), M, se * es, D, (tl[0] - tstart) * 1e3, (tl[1] - tstart) * 1e3,
             (tl[2] - tstart) * 1e3, (tl[3] - tstart) * 1e3, (geoNow() - tstart) * 1e3);
out:
    if (res != ncclSuccess)
        geoNetBreak(&comm->net); /* posted requests must not outlive sl */
    if (M > 0)
        pace_wan(comm, &sl[0], hc.any ? 0 : (double)op->count * (double)es, 0);
    for (size_t s = 0; s < M; s++)
        slice_free(comm, &sl[s]);
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

    GEO_RETURN_IF(comm->regions.nregions > 64, ncclInvalidUsage,
                  "%s: more than 64 regions", geoErrOp(&comm->err));
    /* one codec for all: the GPU path chose it for the whole call */
    choose_codec(comm, op, &hc, NULL);
    if (slice_plan(comm, &sl, es, &hc, op->dt, geoSegPadded) != ncclSuccess) {
        geoCommSetError(comm, "%s: out of memory planning the exchange", geoErrOp(&comm->err));
        res = ncclSystemError;
        goto out;
    }
    GEO_CHECK_GOTO(slice_tmp(comm, &sl), res, out);
    size_t maxpart = 0;
    for (int p = 0; p < sl.nparts; p++)
        if (sl.parts[p].n > maxpart)
            maxpart = sl.parts[p].n;
    scratch = geoScratchGet(&comm->scratch, maxpart * es + 1);
    if (scratch == NULL) {
        geoCommSetError(comm, "%s: out of memory for the exchange", geoErrOp(&comm->err));
        res = ncclSystemError;
        goto out;
    }
    t0 = geoNow();
    pace_wan(comm, &sl, hc.any ? 0 : (double)op->count * (double)es, 1);
    if (hc.codec)
        GEO_CHECK_GOTO(encode_x1(comm, op, &sl, &hc, v), res, out);
    GEO_CHECK_GOTO(post_all(comm, sl.tx1, sl.ntx1, 1, v, es), res, out);
    GEO_CHECK_GOTO(post_all(comm, sl.rx1, sl.nrx1, 0, v, es), res, out);
    GEO_CHECK_GOTO(wait_msgs(comm, sl.rx1, sl.nrx1), res, out);
    if (fused_decode(op, &hc)) {
        GEO_CHECK_GOTO(decode_reduce_x1(comm, op, &sl, (float *)scratch, v), res, out);
    } else {
        if (hc.any)
            GEO_CHECK_GOTO(decode_x1(comm, op, &sl), res, out);
        reduce_parts(comm, op, &sl, es, scratch, v);
    }
    if (hc.codec)
        GEO_CHECK_GOTO(encode_x2(comm, op, &sl, &hc, v), res, out);
    GEO_CHECK_GOTO(post_all(comm, sl.tx2, sl.ntx2, 1, v, es), res, out);
    GEO_CHECK_GOTO(post_all(comm, sl.rx2, sl.nrx2, 0, v, es), res, out);
    GEO_CHECK_GOTO(wait_msgs(comm, sl.rx2, sl.nrx2), res, out);
    GEO_CHECK_GOTO(wait_msgs(comm, sl.tx1, sl.ntx1), res, out);
    GEO_CHECK_GOTO(wait_msgs(comm, sl.tx2, sl.ntx2), res, out);
    if (hc.any)
        GEO_CHECK_GOTO(decode_x2(comm, op, &sl, v), res, out);
    comm->stats.t_inter += geoNow() - t0;
out:
    if (res != ncclSuccess)
        geoNetBreak(&comm->net); /* posted requests must not outlive sl */
    pace_wan(comm, &sl, hc.any ? 0 : (double)op->count * (double)es, 0);
    slice_free(comm, &sl);
    geoScratchPut(&comm->scratch, scratch);
    return res;
}

static ncclResult_t copy_msgs(const hierMsg *m, int n, geoXMsg **out)
{
    *out = calloc((size_t)n + 1, sizeof(geoXMsg));
    if (*out == NULL)
        return ncclSystemError;
    for (int i = 0; i < n; i++)
        (*out)[i] = (geoXMsg){.peer = m[i].peer, .off = m[i].off, .n = m[i].n};
    return ncclSuccess;
}

ncclResult_t geoHierExchangePlan(struct ncclComm *comm, size_t count, geoXPlan *plan)
{
    hierSlice sl = {.s0 = 0, .len = count};
    hierCodec none;
    ncclResult_t r = ncclSuccess;

    memset(plan, 0, sizeof(*plan));
    memset(&none, 0, sizeof(none));
    GEO_RETURN_IF(comm->regions.nregions > 64, ncclInvalidUsage,
                  "%s: more than 64 regions", geoErrOp(&comm->err));
    /* es = 0: no receive buffers are laid out, only the messages. */
    if (slice_plan(comm, &sl, 0, &none, ncclFloat32, geoSegPadded) != ncclSuccess ||
        copy_msgs(sl.tx1, sl.ntx1, &plan->tx1) != ncclSuccess ||
        copy_msgs(sl.rx1, sl.nrx1, &plan->rx1) != ncclSuccess ||
        copy_msgs(sl.tx2, sl.ntx2, &plan->tx2) != ncclSuccess ||
        copy_msgs(sl.rx2, sl.nrx2, &plan->rx2) != ncclSuccess ||
        (plan->parts = calloc((size_t)sl.nparts + 1, sizeof(geoXPart))) == NULL) {
        geoCommSetError(comm, "%s: out of memory planning the exchange", geoErrOp(&comm->err));
        r = ncclSystemError;
    } else {
        plan->ntx1 = sl.ntx1;
        plan->nrx1 = sl.nrx1;
        plan->ntx2 = sl.ntx2;
        plan->nrx2 = sl.nrx2;
        plan->nparts = sl.nparts;
        for (int p = 0; p < sl.nparts; p++)
            plan->parts[p] = (geoXPart){.off = sl.parts[p].off, .n = sl.parts[p].n,
                                        .first_rx = sl.parts[p].first_rx};
    }
    slice_free(comm, &sl);
    if (r != ncclSuccess)
        geoHierExchangePlanFree(plan);
    return r;
}

void geoHierExchangePlanFree(geoXPlan *plan)
{
    free(plan->tx1);
    free(plan->rx1);
    free(plan->tx2);
    free(plan->rx2);
    free(plan->parts);
    memset(plan, 0, sizeof(*plan));
}

/* ---- hierarchical all-gather and reduce-scatter ----------------------
 *
 * Both move every byte over the WAN the least number of times: a block
 * crosses into each other region once.  The rank of region q that handles
 * block b (receives it for its region, or reduces its region's share of
 * it) is b itself when b is in q, else the member of q whose local rank is
 * b's local rank modulo q's size: regions of different sizes spread the
 * blocks over all their ranks. */

static int handler(const topoRegionMap *m, int q, int b)
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

    GEO_RETURN_IF(req == NULL, ncclSystemError, "out of memory");
    if (out + (size_t)me * bytes != (const char *)op->sendbuff)
        memmove(out + (size_t)me * bytes, op->sendbuff, bytes);
    /* (1) inter-region: my block out, the blocks I handle in */
    for (int q = 0; q < m->nregions; q++)
        if (q != g)
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, handler(m, q, me), op->sendbuff, bytes,
                                       &req[nreq++]), res, out);
    for (int b = 0; b < N; b++)
        if (m->region_of[b] != g && handler(m, g, b) == me)
            GEO_CHECK_GOTO(geoNetIrecv(&comm->net, b, out + (size_t)b * bytes, bytes, &req[nreq++]),
                           res, out);
    for (int i = 0; i < nreq; i++)
        GEO_CHECK_GOTO(geoNetWait(&comm->net, &req[i]), res, out);
    comm->stats.t_inter += geoNow() - t0;
    t0 = geoNow();
    /* (2) intra-region: blocks from their handlers to everyone */
    nreq = 0;
    for (int b = 0; b < N; b++) {
        int h = handler(m, g, b);
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
        mine += handler(m, g, b) == me;
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
        GEO_RETURN_IF(1, ncclSystemError, "out of memory");
    }
    /* (1) intra-region */
    for (int b = 0, k = 0; b < N; b++) {
        int h = handler(m, g, b);
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
        if (handler(m, g, b) != me)
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
        if (handler(m, g, b) != me)
            continue;
        char *slot = stage + (size_t)k++ * (size_t)ng * bytes;
        if (b != me)
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, b, slot, bytes, &req[nreq++]), res, out);
        else
            memcpy(shares + (size_t)g * bytes, slot, bytes);
    }
    for (int q = 0; q < m->nregions; q++)
        if (q != g)
            GEO_CHECK_GOTO(geoNetIrecv(&comm->net, handler(m, q, me), shares + (size_t)q * bytes, bytes,
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
