/* One region: every device-buffer call goes straight to NVIDIA's NCCL on
 * the user's stream, on the real communicator of the same ranks (no copy,
 * no thread); PreMulSum ops get a real twin the first time they are used. */
#include "config.h"

#ifdef HAVE_CUDA
#include "comm/device/dev_internal.h"

static ncclResult_t real_redop(struct ncclComm *comm, struct geoDevState *st, ncclRedOp_t op,
                               ncclRedOp_t *out)
{
    if (op < ncclNumOps) {
        *out = op;
        return ncclSuccess;
    }
    geoRedOp *r = &comm->redops[op - ncclNumOps];
    if (!r->real_valid) {
        ncclResult_t res;
        if (st->lib->RedOpCreatePreMulSum == NULL) {
            return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: the real NCCL at %s has no "
                                "ncclRedOpCreatePreMulSum", geoErrOp(&comm->err), st->lib->path);
        }
        void *scalar = r->residence == ncclScalarDevice ? (void *)r->ptr : (void *)r->scalar;
        GEO_REAL_CALL(res, st->lib, RedOpCreatePreMulSum, &r->real_op, scalar, r->datatype,
                      r->residence, st->real);
        if (res != ncclSuccess)
            return devRealError(comm, st->lib, st->real, "ncclRedOpCreatePreMulSum", res);
        r->real_valid = 1;
    }
    *out = r->real_op;
    return ncclSuccess;
}

void geoDevRedOpDestroy(struct ncclComm *comm, int i)
{
    geoRedOp *r = &comm->redops[i];
    struct geoDevState *st = comm->dev;
    if (r->real_valid && st && st->real && st->lib->RedOpDestroy) {
        ncclResult_t res;
        GEO_REAL_CALL(res, st->lib, RedOpDestroy, r->real_op, st->real);
        (void)res;
    }
    r->real_valid = 0;
}

ncclResult_t devPassThrough(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
                            const char *fn)
{
    const geoNcclRealLib *L = st->lib;
    geoRealComm rc = st->real;
    ncclRedOp_t rop = ncclSum;
    ncclResult_t r = ncclSuccess;
    int root = comm->regions.local_rank[op->root];

    if (op->type == GEO_OP_ALLREDUCE || op->type == GEO_OP_REDUCE ||
        op->type == GEO_OP_REDUCESCATTER)
        GEO_CHECK(real_redop(comm, st, op->op, &rop));
    switch (op->type) {
    case GEO_OP_ALLREDUCE:
        GEO_REAL_CALL(r, L, AllReduce, op->sendbuff, op->recvbuff, op->count, op->dt, rop, rc,
                      op->stream);
        break;
    case GEO_OP_BROADCAST:
        GEO_REAL_CALL(r, L, Broadcast, op->sendbuff, op->recvbuff, op->count, op->dt, root, rc,
                      op->stream);
        break;
    case GEO_OP_REDUCE:
        GEO_REAL_CALL(r, L, Reduce, op->sendbuff, op->recvbuff, op->count, op->dt, rop, root, rc,
                      op->stream);
        break;
    case GEO_OP_ALLGATHER:
        GEO_REAL_CALL(r, L, AllGather, op->sendbuff, op->recvbuff, op->count, op->dt, rc,
                      op->stream);
        break;
    case GEO_OP_REDUCESCATTER:
        GEO_REAL_CALL(r, L, ReduceScatter, op->sendbuff, op->recvbuff, op->count, op->dt, rop,
                      rc, op->stream);
        break;
    case GEO_OP_SEND:
        GEO_REAL_CALL(r, L, Send, op->sendbuff, op->count, op->dt, root, rc, op->stream);
        break;
    case GEO_OP_RECV:
        GEO_REAL_CALL(r, L, Recv, op->recvbuff, op->count, op->dt, root, rc, op->stream);
        break;
    case GEO_OP_ALLTOALL:
    case GEO_OP_GATHER:
    case GEO_OP_SCATTER: {
        void *f = op->type == GEO_OP_ALLTOALL ? (void *)L->AlltoAll
                  : op->type == GEO_OP_GATHER ? (void *)L->Gather
                                              : (void *)L->Scatter;
        if (f == NULL) {
            return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: the real NCCL at %s (version %d) "
                                "lacks it", fn, L->path, L->version);
        }
        if (op->type == GEO_OP_ALLTOALL)
            GEO_REAL_CALL(r, L, AlltoAll, op->sendbuff, op->recvbuff, op->count, op->dt, rc,
                          op->stream);
        else if (op->type == GEO_OP_GATHER)
            GEO_REAL_CALL(r, L, Gather, op->sendbuff, op->recvbuff, op->count, op->dt, root, rc,
                          op->stream);
        else
            GEO_REAL_CALL(r, L, Scatter, op->sendbuff, op->recvbuff, op->count, op->dt, root, rc,
                          op->stream);
        break;
    }
    }
    if (r != ncclSuccess && r != ncclInProgress)
        return devRealError(comm, L, rc, fn, r);
    return r;
}
#endif
