/* Collective algorithms on host buffers.  Every algorithm is built on the
 * transport's ordered, matched messages (transport.h) and runs to
 * completion in the calling thread; the transport's progress thread moves
 * the bytes meanwhile, so sends, receives and reductions overlap chunk by
 * chunk.  Results are bit-identical on every rank: each reduced element is
 * computed once, by one rank, in a fixed order, and then copied. */
#ifndef GEOCCL_COLL_H_
#define GEOCCL_COLL_H_

#include <stddef.h>

#include "nccl.h"

struct ncclComm;

typedef enum {
    GEO_OP_ALLREDUCE,
    GEO_OP_BROADCAST,
    GEO_OP_REDUCE,
    GEO_OP_ALLGATHER,
    GEO_OP_REDUCESCATTER,
    GEO_OP_ALLTOALL,
    GEO_OP_GATHER,
    GEO_OP_SCATTER,
    GEO_OP_SEND,
    GEO_OP_RECV,
} geoOpType;

/* One call, as the user made it (arguments already validated). */
typedef struct geoOp {
    geoOpType type;
    struct ncclComm *comm;
    const void *sendbuff;
    void *recvbuff;
    size_t count;          /* per-rank count as in the NCCL call */
    ncclDataType_t dt;
    ncclRedOp_t op;        /* as given: may be a PreMulSum handle */
    int root;              /* root, or peer for send/recv */
    struct geoOp *next;    /* group list */
} geoOp;

const char *geoOpTypeName(geoOpType t);
/* Run one collective (not send/recv) to completion. */
ncclResult_t geoCollRun(geoOp *op);
/* Run a list of sends and receives concurrently (posted in list order),
 * all on one communicator, to completion. */
ncclResult_t geoP2pRun(struct ncclComm *comm, geoOp *ops);

#endif
