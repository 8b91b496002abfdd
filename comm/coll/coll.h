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
#include "compress/codec.h"
#include "comm/core/comm.h"

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
    cudaStream_t stream;   /* the user's stream (device buffers only) */
    int device;            /* buffers are GPU memory: the real NCCL path */
    uint64_t seq;          /* the call's comm->op_seq when it runs later, on
                              the device exchange thread; 0: comm->op_seq */
    uint64_t ef_key;       /* all-reduce: the error-feedback tag of recvbuff
                              (geoCommEfKey, at the call); 0: no residual */
    struct geoOp *next;    /* group list */
} geoOp;

/* A ring of segments: at step s, position r sends segment (r + a - s) mod N
 * to r+1 and receives (r + a - s - 1) mod N from r-1; the first
 * reduce_steps steps combine the received chunk with the local input. */
typedef struct {
    int a;                 /* segment offset (0 or -1) */
    int nsteps;
    int reduce_steps;
    const char *local;     /* local input, all N segments */
    char *out;             /* output of every segment (all-reduce, all-gather) */
    char *out_final;       /* reduce-scatter: output of my final segment only */
    int divide;            /* Avg: divide the final reduced segment by this */
} geoRingPlan;

/* Segment i of count elements cut in n (the first count % n get one more). */
void geoSegRange(size_t count, int n, int i, size_t *off, size_t *len);
/* Run a ring of segments over `total` elements (chunk-pipelined). */
ncclResult_t geoRingRun(struct ncclComm *comm, const geoOp *op, const geoRing *ring,
                        const geoRingPlan *p, size_t total);

/* Flat algorithms over comm->ring (coll_ring.c), for the dispatcher:
 * pipelined chains for broadcast and reduce (region order: each region
 * boundary crossed once), one message per pair for all-to-all, gather and
 * scatter, and the direct exchange of a small all-reduce. */
ncclResult_t geoChainBcast(struct ncclComm *comm, const geoOp *op, const geoRing *ring);
ncclResult_t geoChainReduce(struct ncclComm *comm, const geoOp *op, const geoRing *ring,
                            const char *input);
ncclResult_t geoExchange(struct ncclComm *comm, const geoOp *op);
ncclResult_t geoDirectAllReduce(struct ncclComm *comm, const geoOp *op);

/* Hierarchical all-reduce over the communicator's regions (coll_hier.c);
 * op->op is a built-in op (PreMulSum already applied to the input). */
ncclResult_t geoHierAllReduce(struct ncclComm *comm, const geoOp *op);
/* Slices in flight of the hierarchical all-reduce for nslices slices. */
int geoHierDepth(const struct ncclComm *comm, size_t nslices);
/* The node layout of the hierarchical all-reduce (coll_hier_node.c):
 * built from the bootstrap's table once the regions are known (tuning
 * init), freed with the plan.  Build: ncclSuccess or ncclSystemError
 * (reported). */
ncclResult_t geoHierNodesBuild(struct ncclComm *comm);
void geoHierNodesFree(struct ncclComm *comm);
/* 1 when a hierarchical all-reduce of `bytes` runs the node stage (some
 * region has one and the plan, or with no plan the default, says so). */
int geoHierNodeStage(struct ncclComm *comm, size_t bytes);
/* The peers inside my region that the hierarchical all-reduce's rings
 * send to or receive from (the region ring's neighbours, and where my
 * region has nodes, the node ring's and the region stage's: the rail
 * ring's neighbours, or its halving partners), each once, the
 * first max of them in peers; returns how many there are.  The WAN
 * stage's peers are in the exchange plan (geoHierExchangePlan). */
int geoHierIntraPeers(const struct ncclComm *comm, int *peers, int max);
/* fanout.c: rank from sends len bytes of buf to every rank r != from with
 * !skip[r] (skip may be NULL), and each of those receives them into buf;
 * what names the call in errors.  The ranks skipped call nothing. */
ncclResult_t geoFanOut(struct ncclComm *comm, int from, const uint8_t *skip, void *buf,
                       size_t len, const char *what);
/* The inter-region step of the hierarchical all-reduce alone, for a caller
 * that ran the intra-region reduce-scatter itself (the device path, with the
 * real NCCL).  Local rank i of region q owns elements geoSegPadded(op->count,
 * size[q], i) (NCCL's reduce-scatter cut); buf holds my region's partial
 * sum of my elements, [base, base + len).  On return it holds the sum over
 * all regions (divided by nranks for ncclAvg), bit-identical in every
 * region, compressed between regions as the communicator says.  One slice,
 * not pipelined.  op->recvbuff only keys error-feedback residuals. */
ncclResult_t geoHierExchange(struct ncclComm *comm, const geoOp *op, char *buf, size_t base);
/* The messages of geoHierExchange for this rank, for a caller that moves
 * the data itself (the device path, which encodes on the GPU).  Offsets
 * are elements of the call's buffer, in my shard (geoSegPadded).
 *   tx1[i]  my region's partial of elements [off, off + n) goes to peer
 *   rx1[i]  peer's region's partial of one of my parts arrives
 *   parts   my parts: I sum the k partials of [off, off + n); the k - 1
 *           received ones are rx1[first_rx ..]; in region order
 *   tx2[i]  my finished part [off, off + n) goes to peer; the k - 1
 *           messages of one part are consecutive
 *   rx2[i]  peer's finished part [off, off + n) arrives
 * Each list is in posting order: a sender's list to one peer and that
 * peer's receive list from it hold the same (off, n) in the same order. */
typedef struct {
    int peer;
    size_t off, n;
} hierXferMsg;
typedef struct {
    size_t off, n;
    int first_rx;
} hierXferPart;
typedef struct {
    hierXferMsg *tx1, *rx1, *tx2, *rx2;
    int ntx1, nrx1, ntx2, nrx2;
    hierXferPart *parts;
    int nparts;
} hierXferPlan;
ncclResult_t geoHierExchangePlan(struct ncclComm *comm, size_t count, hierXferPlan *plan);
void geoHierExchangePlanFree(hierXferPlan *plan);

/* What compression does in one hierarchical all-reduce: the codec
 * (GEO_CODEC_NONE: exact; lossy codecs only on float32 sum/avg), the
 * first trip's and the return trip's parameters, which trips keep an
 * error-feedback residual (GEOCCL_EF), and the stochastic-rounding
 * counter of the call (comm->op_seq << 40; element offset o of the first
 * trip uses counter + 2 o, of the return trip counter + 2 o + 1).  codec
 * is what the plan or the user chose for this call. */
typedef struct {
    int codec;
    geoCodecParams p1, p2;
    int ef1, ef2;
    uint64_t counter;
} geoHierCodecChoice;
void geoHierCodecPolicy(struct ncclComm *comm, const geoOp *op, int codec,
                        geoHierCodecChoice *out);
/* Says once per communicator, at INFO, that a compressed all-reduce into
 * buf keeps no residual (op->ef_key 0: buf is in no registration). */
void geoEfNoteUnregistered(struct ncclComm *comm, const void *buf);

/* Segment i of count elements cut in n equal shards of ceil(count / n)
 * (the last ones shorter or empty), as ncclReduceScatter on a padded buffer. */
void geoSegPadded(size_t count, int n, int i, size_t *off, size_t *len);
/* Hierarchical all-gather and reduce-scatter: each block crosses into every
 * other region once, handled by a rank that spreads the load. */
ncclResult_t geoHierAllGather(struct ncclComm *comm, const geoOp *op);
ncclResult_t geoHierReduceScatter(struct ncclComm *comm, const geoOp *op);

/* One collective on the host segment (comm/intra/hostseg.h) with the
 * algorithm geoHostSegChoose gave (coll_hostseg.c); op->op is a built-in
 * op.  On failure the communicator is marked failed and the other ranks
 * stop waiting for this one. */
ncclResult_t geoHostSegRun(struct ncclComm *comm, const geoOp *op, int algo);

const char *geoOpTypeName(geoOpType t);
/* Run one collective (not send/recv) to completion: the dispatcher
 * (dispatch.c) chooses the algorithm. */
ncclResult_t geoCollRun(geoOp *op);
/* Run a list of sends and receives concurrently (posted in list order),
 * all on one communicator, to completion. */
ncclResult_t geoP2pRun(struct ncclComm *comm, geoOp *ops);

#endif
