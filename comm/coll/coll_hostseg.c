/* The collectives on the host segment (comm/intra/hostseg.h): all-reduce, reduce,
 * broadcast, all-gather and reduce-scatter, each in one or two phases per
 * piece of at most a slot (a broadcast: a whole buffer), whatever the
 * number of ranks.
 *
 * Results are bit-identical on every rank and between the algorithms:
 * every element is combined in rank order 0, 1, ..., n - 1 (the direct
 * exchange's order), either by every rank alike (direct) or by the one
 * rank that owns its slice, whose result the others copy (sliced). */
#include "config.h"
#include "comm/intra/hostseg_internal.h"
#include "comm/base/checks.h"
#include "comm/coll/coll.h"
#include "comm/coll/reduce.h"
#include "comm/core/comm.h"

#include <string.h>

/* dst[0..k) = slot_0 op slot_1 op ... op slot_{n-1} at element offset
 * `at` of buffer p (Avg divided by n). */
static void reduce_slots(const geoHostSeg *hs, uint64_t p, size_t at, void *dst, size_t k,
                         const geoOp *op, size_t es)
{
    memcpy(dst, hsSlot(hs, p, 0) + at * es, k * es);
    for (int j = 1; j < hs->n; j++)
        geoReduce(dst, dst, hsSlot(hs, p, j) + at * es, k, op->dt, op->op);
    if (op->op == ncclAvg)
        geoDivide(dst, k, op->dt, hs->n);
}

/* All-reduce (root < 0) or reduce to root, direct: one phase per piece;
 * every rank (or the root alone) combines every slot. */
static ncclResult_t reduce_direct(struct ncclComm *comm, geoHostSeg *hs, const geoOp *op,
                                  int root)
{
    const size_t es = geoTypeSize(op->dt), cap = hs->slot / es;
    const char *in = op->sendbuff;
    char *out = op->recvbuff;
    for (size_t off = 0; off < op->count; off += cap) {
        size_t k = op->count - off < cap ? op->count - off : cap;
        uint64_t p;
        GEO_CHECK(hsBegin(comm, hs, &p));
        memcpy(hsSlot(hs, p, hs->me), in + off * es, k * es);
        hsArrive(hs, p, 0);
        if (root >= 0 && root != hs->me)
            continue;
        GEO_CHECK(hsWait(comm, hs, p, -1));
        reduce_slots(hs, p, 0, out + off * es, k, op, es);
    }
    return ncclSuccess;
}

/* All-reduce or reduce, sliced: in the first phase of a piece each rank
 * combines its slice of every slot into its slot of the next buffer, in
 * the second every rank (or the root alone) copies the others' slices. */
static ncclResult_t reduce_sliced(struct ncclComm *comm, geoHostSeg *hs, const geoOp *op,
                                  int root)
{
    const size_t es = geoTypeSize(op->dt), cap = hs->slot / es;
    const char *in = op->sendbuff;
    char *out = op->recvbuff;
    for (size_t off = 0; off < op->count; off += cap) {
        size_t k = op->count - off < cap ? op->count - off : cap, so, sl;
        uint64_t p1, p2;
        GEO_CHECK(hsBegin(comm, hs, &p1));
        memcpy(hsSlot(hs, p1, hs->me), in + off * es, k * es);
        hsArrive(hs, p1, 0);
        GEO_CHECK(hsWait(comm, hs, p1, -1));
        GEO_CHECK(hsBegin(comm, hs, &p2));
        geoSegRange(k, hs->n, hs->me, &so, &sl);
        char *mine = hsSlot(hs, p2, hs->me) + so * es;
        reduce_slots(hs, p1, so, mine, sl, op, es);
        hsArrive(hs, p2, 0);
        if (root >= 0 && root != hs->me)
            continue;
        memcpy(out + (off + so) * es, mine, sl * es);
        GEO_CHECK(hsWait(comm, hs, p2, -1));
        for (int j = 0; j < hs->n; j++) {
            if (j == hs->me)
                continue;
            geoSegRange(k, hs->n, j, &so, &sl);
            memcpy(out + (off + so) * es, hsSlot(hs, p2, j) + so * es, sl * es);
        }
    }
    return ncclSuccess;
}

/* Broadcast: the root fills a whole buffer (every slot of it) per piece;
 * the others wait for the root alone. */
static ncclResult_t bcast(struct ncclComm *comm, geoHostSeg *hs, const geoOp *op)
{
    const size_t es = geoTypeSize(op->dt), cap = hs->slot * (size_t)hs->n / es;
    const char *in = op->sendbuff;
    char *out = op->recvbuff;
    const int root = op->root, am_root = root == hs->me;
    for (size_t off = 0; off < op->count; off += cap) {
        size_t k = op->count - off < cap ? op->count - off : cap;
        uint64_t p;
        GEO_CHECK(hsBegin(comm, hs, &p));
        char *buf = hsSlot(hs, p, 0);
        if (am_root) {
            memcpy(buf, in + off * es, k * es);
            hsArrive(hs, p, 1);
            if (out != in)
                memcpy(out + off * es, in + off * es, k * es);
            continue;
        }
        hsArrive(hs, p, 0);
        GEO_CHECK(hsWait(comm, hs, p, root));
        memcpy(out + off * es, buf, k * es);
    }
    return ncclSuccess;
}

/* All-gather: one phase per piece of every rank's block. */
static ncclResult_t allgather(struct ncclComm *comm, geoHostSeg *hs, const geoOp *op)
{
    const size_t es = geoTypeSize(op->dt), cap = hs->slot / es, count = op->count;
    const char *in = op->sendbuff;
    char *out = op->recvbuff;
    for (size_t off = 0; off < count; off += cap) {
        size_t k = count - off < cap ? count - off : cap;
        uint64_t p;
        GEO_CHECK(hsBegin(comm, hs, &p));
        memcpy(hsSlot(hs, p, hs->me), in + off * es, k * es);
        hsArrive(hs, p, 0);
        GEO_CHECK(hsWait(comm, hs, p, -1));
        for (int j = 0; j < hs->n; j++)
            memcpy(out + ((size_t)j * count + off) * es, hsSlot(hs, p, j), k * es);
    }
    return ncclSuccess;
}

/* Reduce-scatter: per piece, each rank puts the same elements of every
 * block in its slot (block b at b * k) and combines its own block's. */
static ncclResult_t reducescatter(struct ncclComm *comm, geoHostSeg *hs, const geoOp *op)
{
    const size_t es = geoTypeSize(op->dt), count = op->count;
    const size_t cap = hs->slot / ((size_t)hs->n * es);
    const char *in = op->sendbuff;
    char *out = op->recvbuff;
    if (cap == 0)
        return GEO_COMM_ERR(comm, ncclInternalError, "%s: host segment slots too small for %d "
                            "ranks", geoErrOp(&comm->err), hs->n);
    for (size_t off = 0; off < count; off += cap) {
        size_t k = count - off < cap ? count - off : cap;
        uint64_t p;
        GEO_CHECK(hsBegin(comm, hs, &p));
        char *mine = hsSlot(hs, p, hs->me);
        for (int b = 0; b < hs->n; b++)
            memcpy(mine + (size_t)b * k * es, in + ((size_t)b * count + off) * es, k * es);
        hsArrive(hs, p, 0);
        GEO_CHECK(hsWait(comm, hs, p, -1));
        reduce_slots(hs, p, (size_t)hs->me * k, out + off * es, k, op, es);
    }
    return ncclSuccess;
}

ncclResult_t geoHostSegRun(struct ncclComm *comm, const geoOp *op, int algo)
{
    geoHostSeg *hs = comm->hostseg;
    ncclResult_t res;
    if (hs == NULL)
        return GEO_COMM_ERR(comm, ncclInternalError, "%s: no host segment",
                            geoErrOp(&comm->err));
    switch (op->type) {
    case GEO_OP_ALLREDUCE:
        res = algo == GEO_HOSTSEG_SLICED ? reduce_sliced(comm, hs, op, -1)
                                         : reduce_direct(comm, hs, op, -1);
        break;
    case GEO_OP_REDUCE:
        res = algo == GEO_HOSTSEG_SLICED ? reduce_sliced(comm, hs, op, op->root)
                                         : reduce_direct(comm, hs, op, op->root);
        break;
    case GEO_OP_BROADCAST: res = bcast(comm, hs, op); break;
    case GEO_OP_ALLGATHER: res = allgather(comm, hs, op); break;
    case GEO_OP_REDUCESCATTER: res = reducescatter(comm, hs, op); break;
    default:
        res = GEO_COMM_ERR(comm, ncclInternalError, "%s: not a host-segment collective",
                           geoErrOp(&comm->err));
    }
    if (res != ncclSuccess) {
        hsBreak(hs, hs->me, HS_LEFT); /* the others stop waiting for us (unless set) */
        geoCommFail(comm, res);
    }
    return res;
}
