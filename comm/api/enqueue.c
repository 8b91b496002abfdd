/* NCCL collective and point-to-point entry points: validate every argument
 * before anything is sent, then run now or record in the current group. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/coll/coll.h"
#include "comm/device/coll_device.h"
#include "comm/core/comm.h"
#include "comm/api/group.h"
#include "comm/device/nccl_real.h"
#include "comm/coll/reduce.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

/* The caller's file:line is not worth a parameter here: fn and what name
 * the refused argument. */
static ncclResult_t arg_error(struct ncclComm *comm, const char *fn, const char *what)
{
    return GEO_ERR(comm && geoCommCheck(comm, fn) == ncclSuccess ? &comm->err : NULL,
                   ncclInvalidArgument, "%s: invalid argument: %s", fn, what);
}

static int needs_op(geoOpType t)
{
    return t == GEO_OP_ALLREDUCE || t == GEO_OP_REDUCE || t == GEO_OP_REDUCESCATTER;
}

static int is_rooted(geoOpType t)
{
    return t == GEO_OP_BROADCAST || t == GEO_OP_REDUCE || t == GEO_OP_GATHER ||
           t == GEO_OP_SCATTER || t == GEO_OP_SEND || t == GEO_OP_RECV;
}

static ncclResult_t validate_op(geoOp *op, const char *fn)
{
    struct ncclComm *comm = op->comm;
    char msg[160];
    size_t es;

    if (geoCommCheck(comm, fn) != ncclSuccess)
        return arg_error(NULL, fn, "comm is NULL or not a live communicator");
    es = geoTypeSize(op->dt);
    if ((int)op->dt < 0 || op->dt >= ncclNumTypes || es == 0) {
        snprintf(msg, sizeof(msg), "datatype %d is not an ncclDataType_t", (int)op->dt);
        return arg_error(comm, fn, msg);
    }
    if (needs_op(op->type)) {
        if ((int)op->op < 0 || (op->op >= ncclNumOps && (op->op - ncclNumOps >= GEO_MAX_REDOPS ||
                                                         !comm->redops[op->op - ncclNumOps].used))) {
            snprintf(msg, sizeof(msg), "reduction op %d is neither built in nor a live "
                     "ncclRedOpCreatePreMulSum handle of this communicator", (int)op->op);
            return arg_error(comm, fn, msg);
        }
        if (op->op >= ncclNumOps && comm->redops[op->op - ncclNumOps].datatype != op->dt) {
            snprintf(msg, sizeof(msg), "PreMulSum op %d was created for %s, used with %s",
                     (int)op->op, geoTypeName(comm->redops[op->op - ncclNumOps].datatype),
                     geoTypeName(op->dt));
            return arg_error(comm, fn, msg);
        }
    }
    if (is_rooted(op->type) && (op->root < 0 || op->root >= comm->nranks)) {
        snprintf(msg, sizeof(msg), "%s %d is outside [0, %d)",
                 op->type == GEO_OP_SEND || op->type == GEO_OP_RECV ? "peer" : "root", op->root,
                 comm->nranks);
        return arg_error(comm, fn, msg);
    }
    size_t mult = 1;
    if (op->type == GEO_OP_ALLGATHER || op->type == GEO_OP_REDUCESCATTER ||
        op->type == GEO_OP_ALLTOALL || op->type == GEO_OP_GATHER || op->type == GEO_OP_SCATTER)
        mult = (size_t)comm->nranks;
    if (op->count > SIZE_MAX / es / mult) {
        snprintf(msg, sizeof(msg), "count %zu overflows the address space", op->count);
        return arg_error(comm, fn, msg);
    }
    if (op->count > 0) {
        int me_root = op->root == comm->rank;
        int need_send = 1, need_recv = 1;
        switch (op->type) {
        case GEO_OP_BROADCAST: need_send = me_root; break;
        case GEO_OP_REDUCE: need_recv = me_root; break;
        case GEO_OP_GATHER: need_recv = me_root; break;
        case GEO_OP_SCATTER: need_send = me_root; break;
        case GEO_OP_SEND: need_recv = 0; break;
        case GEO_OP_RECV: need_send = 0; break;
        default: break;
        }
        if (need_send && op->sendbuff == NULL)
            return arg_error(comm, fn, "sendbuff is NULL with count > 0");
        if (need_recv && op->recvbuff == NULL)
            return arg_error(comm, fn, "recvbuff is NULL with count > 0");
    }
    op->device = op->count > 0 &&
                 (geoDevIsDevicePtr(op->sendbuff) || geoDevIsDevicePtr(op->recvbuff));
    if (__atomic_load_n(&comm->err.async_error, __ATOMIC_ACQUIRE) == ncclInProgress)
        return GEO_COMM_ERR(comm, ncclInvalidUsage,
                            "%s: the communicator is still initialising (non-blocking init); "
                            "poll ncclCommGetAsyncError until it returns ncclSuccess", fn);
    if (comm->finalized)
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: the communicator was finalized", fn);
    /* The cause was reported where the communicator broke; every later
     * call only hands the code back. */
    ncclResult_t broken = geoCommAsyncError(comm);
    if (broken != ncclSuccess) {
        geoInfo(GEO_LOG_COLL, "%s on a broken communicator: %s", fn, geoErrLast(&comm->err));
        return broken;
    }
    if (op->device)
        GEO_CHECK(geoDevCheck(comm, op, fn));
    return ncclSuccess;
}

static ncclResult_t enqueue_op(geoOp *op, const char *fn)
{
    struct ncclComm *comm = op->comm;
    ncclResult_t res = validate_op(op, fn);
    if (res != ncclSuccess)
        return res;
    if (op->count == 0)
        return ncclSuccess; /* every rank skips it alike: nothing to match */
    /* The residual this call may use is fixed now, with the registrations
     * as they are at the call (geoccl.h). */
    if (op->type == GEO_OP_ALLREDUCE)
        op->ef_key = geoCommEfKey(comm, op->recvbuff, op->count * geoTypeSize(op->dt));
    if (op->device)
        return geoDevEnqueue(op, fn);
    if (geoGroupActive())
        return geoGroupAddOp(op);
    geoDebugSetRank(comm->rank);
    op->next = NULL;
    if (op->type == GEO_OP_SEND || op->type == GEO_OP_RECV)
        return geoRunCommOps(comm, op, NULL);
    return geoRunCommOps(comm, NULL, op);
}

#define MAKE_OP(T, C, S, R, N, D, O, ROOT) \
    geoOp op = {.type = (T), .comm = (C), .sendbuff = (S), .recvbuff = (R), .count = (N), \
                .dt = (D), .op = (O), .root = (ROOT), .stream = stream, .next = NULL}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op_, ncclComm_t comm,
                           cudaStream_t stream)
{
    MAKE_OP(GEO_OP_ALLREDUCE, comm, sendbuff, recvbuff, count, datatype, op_, 0);
    return enqueue_op(&op, "ncclAllReduce");
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    const geoNcclRealLib *real;
    /* NVIDIA's ncclBcast calls ncclBroadcast through its PLT. */
    if (geoNcclRealInCall() && (real = geoNcclReal()) != NULL)
        return real->Broadcast(sendbuff, recvbuff, count, datatype, root,
                               (geoRealComm)(void *)comm, stream);
    MAKE_OP(GEO_OP_BROADCAST, comm, sendbuff, recvbuff, count, datatype, ncclSum, root);
    return enqueue_op(&op, "ncclBroadcast");
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream)
{
    MAKE_OP(GEO_OP_BROADCAST, comm, buff, buff, count, datatype, ncclSum, root);
    return enqueue_op(&op, "ncclBcast");
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op_, int root, ncclComm_t comm,
                        cudaStream_t stream)
{
    MAKE_OP(GEO_OP_REDUCE, comm, sendbuff, recvbuff, count, datatype, op_, root);
    return enqueue_op(&op, "ncclReduce");
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    MAKE_OP(GEO_OP_ALLGATHER, comm, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0);
    return enqueue_op(&op, "ncclAllGather");
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op_, ncclComm_t comm,
                               cudaStream_t stream)
{
    MAKE_OP(GEO_OP_REDUCESCATTER, comm, sendbuff, recvbuff, recvcount, datatype, op_, 0);
    return enqueue_op(&op, "ncclReduceScatter");
}

ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    MAKE_OP(GEO_OP_ALLTOALL, comm, sendbuff, recvbuff, count, datatype, ncclSum, 0);
    return enqueue_op(&op, "ncclAlltoAll");
}

ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    MAKE_OP(GEO_OP_GATHER, comm, sendbuff, recvbuff, count, datatype, ncclSum, root);
    return enqueue_op(&op, "ncclGather");
}

ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    MAKE_OP(GEO_OP_SCATTER, comm, sendbuff, recvbuff, count, datatype, ncclSum, root);
    return enqueue_op(&op, "ncclScatter");
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    MAKE_OP(GEO_OP_SEND, comm, sendbuff, NULL, count, datatype, ncclSum, peer);
    return enqueue_op(&op, "ncclSend");
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    MAKE_OP(GEO_OP_RECV, comm, NULL, recvbuff, count, datatype, ncclSum, peer);
    return enqueue_op(&op, "ncclRecv");
}
