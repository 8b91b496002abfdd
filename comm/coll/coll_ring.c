/* Ring and chain algorithms, chunk-pipelined.
 *
 * All-reduce is a reduce-scatter ring followed by an all-gather ring (2(N-1)
 * steps, each rank sends 2(N-1)/N of the data: the bandwidth optimum).
 * The engine below runs any "ring of segments": at step s rank r sends
 * segment (r + a - s) mod N to r+1 and receives segment (r + a - s - 1)
 * mod N from r-1; in the first `reduce_steps` steps the received chunk is
 * combined with the local input, afterwards it is a copy.  Each segment is
 * cut into chunks; as soon as chunk c of step s is processed, chunk c of
 * step s+1 is sent, so all steps are in flight at once. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/coll/coll.h"
#include "comm/core/comm.h"
#include "comm/coll/reduce.h"

#include <stdlib.h>
#include <string.h>

const char *geoOpTypeName(geoOpType t)
{
    static const char *names[] = {"allreduce", "broadcast",     "reduce",  "allgather",
                                  "reducescatter", "alltoall", "gather", "scatter",
                                  "send",      "recv"};
    return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

static inline int mod(int x, int n) { return ((x % n) + n) % n; }

/* Segment i of count elements split in n parts (first count%n get one more). */
void geoSegRange(size_t count, int n, int i, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    *off = (size_t)i * base + ((size_t)i < extra ? (size_t)i : extra);
    *len = base + ((size_t)i < extra ? 1 : 0);
}

static size_t chunk_elems(struct ncclComm *comm, size_t es)
{
    size_t c = comm->chunk_size / es;
    return c ? c : 1;
}

static size_t nchunks(size_t len, size_t ce) { return (len + ce - 1) / ce; }

/* Wait for every posted request in reqs[0..n). First error wins. */
static ncclResult_t wait_all(struct ncclComm *comm, geoNetRequest *reqs, size_t n,
                             const unsigned char *posted)
{
    ncclResult_t res = ncclSuccess;
    for (size_t i = 0; i < n; i++) {
        if (posted && !posted[i])
            continue;
        ncclResult_t r = geoNetWait(&comm->net, &reqs[i]);
        if (r != ncclSuccess && res == ncclSuccess)
            res = r;
    }
    return res;
}


ncclResult_t geoRingRun(struct ncclComm *comm, const geoOp *op, const geoRing *ring,
                        const geoRingPlan *p, size_t seg_count_total)
{
    const int N = ring->n, r = ring->me;
    const int next = ring->ranks[(r + 1) % N], prev = ring->ranks[(r + N - 1) % N];
    const size_t es = geoTypeSize(op->dt);
    const size_t ce = chunk_elems(comm, es);
    size_t maxlen, dummy;
    geoSegRange(seg_count_total, N, 0, &dummy, &maxlen);
    const size_t maxc = nchunks(maxlen, ce) ? nchunks(maxlen, ce) : 1;
    const size_t nitems = (size_t)p->nsteps * maxc;
    const int W = comm->window > 0 ? comm->window : 1;
    /* Without an output buffer for the partial sums (a reduce-scatter), a
     * partial is forwarded from its slot, and the slot is reused only once
     * that send has completed.  But every rank sends its whole step-0
     * segment first, so a forwarded partial waits on the link behind up to
     * maxc chunks, which the next rank takes only as fast as it can post
     * receives, which waits on its own forwarded sends, and so on round the
     * ring.  With 2W slots that cycle closes unless the transport buffers
     * about maxc - W chunks per link: reduce-scatters of 256 MiB over 5
     * ranks hung over loopback TCP, of 64 MiB over the same-host rings.
     * With maxc + W slots the slot reused for item i was forwarded as an
     * item the next rank posts before its own item i: no cycle, whatever
     * the transport buffers, for about one segment of memory. */
    const int nslots = p->reduce_steps > 0 && p->out == NULL && maxc + (size_t)W > 2 * (size_t)W
                           ? (int)(maxc + (size_t)W)
                           : 2 * W;
    ncclResult_t res = ncclSuccess;

    geoNetRequest *sreq = calloc(nitems, sizeof(*sreq));
    geoNetRequest *rreq = calloc(nitems, sizeof(*rreq));
    unsigned char *sposted = calloc(nitems, 1), *rposted = calloc(nitems, 1);
    geoNetRequest **slot_send = calloc((size_t)nslots, sizeof(*slot_send));
    char *slots = geoScratchGet(&comm->scratch, (size_t)nslots * ce * es);
    if (!sreq || !rreq || !sposted || !rposted || !slot_send || !slots) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for %zu chunk requests",
                           geoErrOp(&comm->err), nitems);
        goto out;
    }

#define SEND_SEG(s) mod(r + p->a - (s), N)
#define RECV_SEG(s) mod(r + p->a - (s)-1, N)
    /* Step 0: send the local segment, all chunks. */
    {
        size_t off, len;
        int x = SEND_SEG(0);
        geoSegRange(seg_count_total, N, ring->blk[x], &off, &len);
        const char *src = p->reduce_steps > 0 ? p->local : p->out;
        for (size_t c = 0; c < nchunks(len, ce); c++) {
            size_t n = len - c * ce < ce ? len - c * ce : ce;
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, next, src + (off + c * ce) * es, n * es, &sreq[c]),
                           res, out);
            sposted[c] = 1;
        }
    }

    /* Items in (step, chunk) order; recvs are posted up to W ahead. */
    size_t k_post_s = 0, k_post_c = 0; /* next recv to post */
    size_t inflight = 0;
    size_t slot_rr = 0;
    int *item_slot = malloc(nitems * sizeof(int));
    if (item_slot == NULL) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for %zu chunk slots",
                           geoErrOp(&comm->err), nitems);
        goto out;
    }
    for (size_t s = 0; s < (size_t)p->nsteps; s++) {
        size_t off, len;
        int x = RECV_SEG((int)s);
        geoSegRange(seg_count_total, N, ring->blk[x], &off, &len);
        size_t nc = nchunks(len, ce);
        for (size_t c = 0; c < nc; c++) {
            /* Post receives ahead, keeping the posting order (step, chunk). */
            while (inflight < (size_t)W && k_post_s < (size_t)p->nsteps) {
                size_t poff, plen;
                int px = RECV_SEG((int)k_post_s);
                geoSegRange(seg_count_total, N, ring->blk[px], &poff, &plen);
                size_t pnc = nchunks(plen, ce);
                if (k_post_c >= pnc) {
                    k_post_s++;
                    k_post_c = 0;
                    continue;
                }
                size_t n = plen - k_post_c * ce < ce ? plen - k_post_c * ce : ce;
                size_t idx = k_post_s * maxc + k_post_c;
                char *dst;
                if ((int)k_post_s < p->reduce_steps) {
                    int sl = (int)(slot_rr++ % (size_t)nslots);
                    if (slot_send[sl]) { /* slot still being sent from */
                        GEO_CHECK_GOTO(geoNetWait(&comm->net, slot_send[sl]), res, out_slots);
                        slot_send[sl] = NULL;
                    }
                    item_slot[idx] = sl;
                    dst = slots + (size_t)sl * ce * es;
                } else {
                    item_slot[idx] = -1;
                    dst = p->out + (poff + k_post_c * ce) * es;
                }
                GEO_CHECK_GOTO(geoNetIrecv(&comm->net, prev, dst, n * es, &rreq[idx]), res, out_slots);
                rposted[idx] = 1;
                inflight++;
                k_post_c++;
            }
            size_t idx = s * maxc + c;
            size_t n = len - c * ce < ce ? len - c * ce : ce;
            size_t eoff = off + c * ce;
            GEO_CHECK_GOTO(geoNetWait(&comm->net, &rreq[idx]), res, out_slots);
            inflight--;
            const char *send_from;
            if ((int)s < p->reduce_steps) {
                char *slot = slots + (size_t)item_slot[idx] * ce * es;
                int final = (int)s == p->reduce_steps - 1;
                char *dst;
                if (p->out)
                    dst = p->out + eoff * es;
                else if (final)
                    dst = p->out_final + (c * ce) * es;
                else
                    dst = slot;
                geoReduce(dst, p->local + eoff * es, slot, n, op->dt, op->op);
                if (final && p->divide)
                    geoDivide(dst, n, op->dt, p->divide);
                send_from = dst;
            } else {
                send_from = p->out + eoff * es;
            }
            if (s + 1 < (size_t)p->nsteps) {
                size_t sidx = (s + 1) * maxc + c;
                GEO_CHECK_GOTO(geoNetIsend(&comm->net, next, send_from, n * es, &sreq[sidx]), res,
                               out_slots);
                sposted[sidx] = 1;
                if ((int)s < p->reduce_steps && !p->out)
                    slot_send[item_slot[idx]] = &sreq[sidx];
            }
        }
    }
out_slots:
    free(item_slot);
out:
    if (res == ncclSuccess)
        res = wait_all(comm, sreq, sreq ? nitems : 0, sposted);
    else if (comm->net.state)
        geoNetBreak(&comm->net); /* requests below stay referenced */
    free(sreq);
    free(rreq);
    free(sposted);
    free(rposted);
    free(slot_send);
    geoScratchPut(&comm->scratch, slots);
    return res;
#undef SEND_SEG
#undef RECV_SEG
}

/* Chain from root through root+1, ... (broadcast), chunk-pipelined. */
ncclResult_t geoChainBcast(struct ncclComm *comm, const geoOp *op, const geoRing *ring)
{
    const int N = ring->n, r = ring->me;
    const int pos = mod(r - ring->pos_of[op->root], N);
    const int next = ring->ranks[(r + 1) % N], prev = ring->ranks[(r + N - 1) % N];
    const size_t es = geoTypeSize(op->dt), ce = chunk_elems(comm, es);
    const size_t nc = nchunks(op->count, ce);
    char *buf = op->recvbuff;
    ncclResult_t res = ncclSuccess;
    geoNetRequest *sreq = calloc(nc ? nc : 1, sizeof(*sreq));
    geoNetRequest *rreq = calloc(nc ? nc : 1, sizeof(*rreq));
    unsigned char *sp = calloc(nc ? nc : 1, 1), *rp = calloc(nc ? nc : 1, 1);

    if (!sreq || !rreq || !sp || !rp) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for %zu chunk requests",
                           geoErrOp(&comm->err), nc);
        goto out;
    }
    if (pos == 0) {
        if (op->sendbuff != op->recvbuff)
            memcpy(op->recvbuff, op->sendbuff, op->count * es);
        buf = (char *)op->sendbuff;
    }
    for (size_t c = 0; c < nc && pos != 0; c++) {
        size_t n = op->count - c * ce < ce ? op->count - c * ce : ce;
        GEO_CHECK_GOTO(geoNetIrecv(&comm->net, prev, buf + c * ce * es, n * es, &rreq[c]), res, out);
        rp[c] = 1;
    }
    for (size_t c = 0; c < nc; c++) {
        size_t n = op->count - c * ce < ce ? op->count - c * ce : ce;
        if (pos != 0)
            GEO_CHECK_GOTO(geoNetWait(&comm->net, &rreq[c]), res, out);
        if (pos != N - 1) {
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, next, buf + c * ce * es, n * es, &sreq[c]), res,
                           out);
            sp[c] = 1;
        }
    }
out:
    if (res == ncclSuccess)
        res = wait_all(comm, sreq, nc, sp);
    else
        geoNetBreak(&comm->net);
    free(sreq);
    free(rreq);
    free(sp);
    free(rp);
    return res;
}

/* Chain root+1 -> root+2 -> ... -> root, each adding its input. */
ncclResult_t geoChainReduce(struct ncclComm *comm, const geoOp *op, const geoRing *ring,
                                const char *local)
{
    const int N = ring->n, r = ring->me;
    const int pos = mod(r - ring->pos_of[op->root] - 1, N); /* root is N-1 */
    const int next = ring->ranks[(r + 1) % N], prev = ring->ranks[(r + N - 1) % N];
    const size_t es = geoTypeSize(op->dt), ce = chunk_elems(comm, es);
    const size_t nc = nchunks(op->count, ce);
    const int W = comm->window > 0 ? comm->window : 1;
    const int nslots = 2 * W;
    ncclResult_t res = ncclSuccess;
    geoNetRequest *sreq = calloc(nc ? nc : 1, sizeof(*sreq));
    geoNetRequest *rreq = calloc(nc ? nc : 1, sizeof(*rreq));
    unsigned char *sp = calloc(nc ? nc : 1, 1), *rp = calloc(nc ? nc : 1, 1);
    char *slots = geoScratchGet(&comm->scratch, (size_t)nslots * ce * es);

    if (!sreq || !rreq || !sp || !rp || !slots) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for %zu chunk requests",
                           geoErrOp(&comm->err), nc);
        goto out;
    }
    size_t posted = 0;
    for (size_t c = 0; c < nc; c++) {
        size_t n = op->count - c * ce < ce ? op->count - c * ce : ce;
        char *slot = slots + (c % (size_t)nslots) * ce * es;
        if (pos == 0) {
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, next, local + c * ce * es, n * es, &sreq[c]), res,
                           out);
            sp[c] = 1;
            continue;
        }
        while (posted < nc && posted < c + (size_t)W) {
            size_t pn = op->count - posted * ce < ce ? op->count - posted * ce : ce;
            char *ps = slots + (posted % (size_t)nslots) * ce * es;
            if (posted >= (size_t)nslots && sp[posted - (size_t)nslots])
                GEO_CHECK_GOTO(geoNetWait(&comm->net, &sreq[posted - (size_t)nslots]), res, out);
            GEO_CHECK_GOTO(geoNetIrecv(&comm->net, prev, ps, pn * es, &rreq[posted]), res, out);
            rp[posted++] = 1;
        }
        GEO_CHECK_GOTO(geoNetWait(&comm->net, &rreq[c]), res, out);
        if (pos == N - 1) {
            char *dst = (char *)op->recvbuff + c * ce * es;
            geoReduce(dst, local + c * ce * es, slot, n, op->dt, op->op);
            if (op->op == ncclAvg)
                geoDivide(dst, n, op->dt, N);
        } else {
            geoReduce(slot, local + c * ce * es, slot, n, op->dt, op->op);
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, next, slot, n * es, &sreq[c]), res, out);
            sp[c] = 1;
        }
    }
out:
    if (res == ncclSuccess)
        res = wait_all(comm, sreq, nc, sp);
    else
        geoNetBreak(&comm->net);
    free(sreq);
    free(rreq);
    free(sp);
    free(rp);
    geoScratchPut(&comm->scratch, slots);
    return res;
}

/* Root-centred and all-pairs exchanges: every message posted at once. */
ncclResult_t geoExchange(struct ncclComm *comm, const geoOp *op)
{
    const int N = comm->nranks, r = comm->rank;
    const size_t es = geoTypeSize(op->dt), bytes = op->count * es;
    geoNetRequest *reqs = calloc(2 * (size_t)N, sizeof(*reqs));
    unsigned char *posted = calloc(2 * (size_t)N, 1);
    char *copy = NULL;
    ncclResult_t res = ncclSuccess;
    const char *sb = op->sendbuff;
    char *rb = op->recvbuff;

    if (!reqs || !posted) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for %d requests",
                           geoErrOp(&comm->err), 2 * N);
        goto out;
    }
    switch (op->type) {
    case GEO_OP_ALLTOALL:
        if (sb == rb && bytes) { /* in place: keep our input while peers overwrite it */
            copy = malloc(bytes * (size_t)N);
            if (copy == NULL) {
                res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory keeping the input "
                                   "(%zu bytes)", geoErrOp(&comm->err), bytes * (size_t)N);
                goto out;
            }
            memcpy(copy, sb, bytes * (size_t)N);
            sb = copy;
        }
        /* Post in rank distance order so that every pair starts at once. */
        for (int d = 1; d < N; d++) {
            int to = (r + d) % N, from = (r + N - d) % N;
            GEO_CHECK_GOTO(geoNetIrecv(&comm->net, from, rb + (size_t)from * bytes, bytes,
                                       &reqs[2 * d]), res, out);
            posted[2 * d] = 1;
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, to, sb + (size_t)to * bytes, bytes,
                                       &reqs[2 * d + 1]), res, out);
            posted[2 * d + 1] = 1;
        }
        memmove(rb + (size_t)r * bytes, sb + (size_t)r * bytes, bytes);
        break;
    case GEO_OP_GATHER:
        if (r == op->root) {
            for (int p = 0; p < N; p++)
                if (p != r) {
                    GEO_CHECK_GOTO(geoNetIrecv(&comm->net, p, rb + (size_t)p * bytes, bytes, &reqs[p]),
                                   res, out);
                    posted[p] = 1;
                }
            if (rb + (size_t)r * bytes != sb)
                memmove(rb + (size_t)r * bytes, sb, bytes);
        } else {
            GEO_CHECK_GOTO(geoNetIsend(&comm->net, op->root, sb, bytes, &reqs[0]), res, out);
            posted[0] = 1;
        }
        break;
    case GEO_OP_SCATTER:
        if (r == op->root) {
            for (int p = 0; p < N; p++)
                if (p != r) {
                    GEO_CHECK_GOTO(geoNetIsend(&comm->net, p, sb + (size_t)p * bytes, bytes, &reqs[p]),
                                   res, out);
                    posted[p] = 1;
                }
            if (sb + (size_t)r * bytes != rb)
                memmove(rb, sb + (size_t)r * bytes, bytes);
        } else {
            GEO_CHECK_GOTO(geoNetIrecv(&comm->net, op->root, rb, bytes, &reqs[0]), res, out);
            posted[0] = 1;
        }
        break;
    default:
        res = GEO_COMM_ERR(comm, ncclInternalError, "%s: internal error: geoExchange has no "
                           "case for %s", geoErrOp(&comm->err), geoOpTypeName(op->type));
        goto out;
    }
out:
    if (res == ncclSuccess)
        res = wait_all(comm, reqs, 2 * (size_t)N, posted);
    else if (reqs)
        geoNetBreak(&comm->net);
    free(reqs);
    free(posted);
    free(copy);
    return res;
}

/* Small all-reduce: every rank sends its whole input to every other rank
 * (one message latency instead of 2(N-1)) and sums all N inputs locally in
 * rank order, so every rank computes the same bits. */
ncclResult_t geoDirectAllReduce(struct ncclComm *comm, const geoOp *op)
{
    const int N = comm->nranks, me = comm->rank;
    const size_t es = geoTypeSize(op->dt), bytes = op->count * es;
    char *all = malloc(bytes * (size_t)N);
    geoNetRequest *reqs = calloc(2 * (size_t)N, sizeof(*reqs));
    unsigned char *posted = calloc(2 * (size_t)N, 1);
    ncclResult_t res = ncclSuccess;

    if (!all || !reqs || !posted) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for %d inputs",
                           geoErrOp(&comm->err), N);
        goto out;
    }
    memcpy(all + (size_t)me * bytes, op->sendbuff, bytes);
    for (int d = 1; d < N; d++) {
        int to = (me + d) % N, from = (me + N - d) % N;
        GEO_CHECK_GOTO(geoNetIrecv(&comm->net, from, all + (size_t)from * bytes, bytes, &reqs[2 * d]),
                       res, out);
        posted[2 * d] = 1;
        GEO_CHECK_GOTO(geoNetIsend(&comm->net, to, all + (size_t)me * bytes, bytes, &reqs[2 * d + 1]),
                       res, out);
        posted[2 * d + 1] = 1;
    }
    res = wait_all(comm, reqs, 2 * (size_t)N, posted);
    if (res == ncclSuccess) {
        char *dst = op->recvbuff;
        memcpy(dst, all, bytes);
        for (int r = 1; r < N; r++)
            geoReduce(dst, dst, all + (size_t)r * bytes, op->count, op->dt, op->op);
        if (op->op == ncclAvg)
            geoDivide(dst, op->count, op->dt, N);
    }
out:
    if (res != ncclSuccess && reqs)
        geoNetBreak(&comm->net);
    free(all);
    free(reqs);
    free(posted);
    return res;
}

ncclResult_t geoP2pRun(struct ncclComm *comm, geoOp *ops)
{
    size_t n = 0, i = 0;
    ncclResult_t res = ncclSuccess;
    for (geoOp *o = ops; o; o = o->next)
        n++;
    geoNetRequest *reqs = calloc(n ? n : 1, sizeof(*reqs));
    unsigned char *posted = calloc(n ? n : 1, 1);
    if (!reqs || !posted) {
        free(reqs);
        free(posted);
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for %zu requests",
                            geoErrOp(&comm->err), n);
    }
    for (geoOp *o = ops; o; o = o->next, i++) {
        size_t bytes = o->count * geoTypeSize(o->dt);
        if (o->root == comm->rank) {
            /* Self-send: matched with the first self-recv in order. */
            continue;
        }
        if (o->type == GEO_OP_SEND)
            res = geoNetIsend(&comm->net, o->root, o->sendbuff, bytes, &reqs[i]);
        else
            res = geoNetIrecv(&comm->net, o->root, o->recvbuff, bytes, &reqs[i]);
        if (res != ncclSuccess)
            break;
        posted[i] = 1;
    }
    /* Self-sends pair with self-receives in call order. */
    if (res == ncclSuccess) {
        geoOp *s = ops, *rv = ops;
        for (;;) {
            while (s && !(s->type == GEO_OP_SEND && s->root == comm->rank))
                s = s->next;
            while (rv && !(rv->type == GEO_OP_RECV && rv->root == comm->rank))
                rv = rv->next;
            if (!s || !rv)
                break;
            if (s->count * geoTypeSize(s->dt) != rv->count * geoTypeSize(rv->dt)) {
                res = GEO_COMM_ERR(comm, ncclInvalidUsage,
                                   "send/recv to self with different sizes");
                break;
            }
            memmove(rv->recvbuff, s->sendbuff, s->count * geoTypeSize(s->dt));
            s = s->next;
            rv = rv->next;
        }
    }
    if (res == ncclSuccess)
        res = wait_all(comm, reqs, n, posted);
    else
        geoNetBreak(&comm->net);
    free(reqs);
    free(posted);
    return res;
}
