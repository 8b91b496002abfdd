/* What the hierarchical all-reduce's files share and nothing else sees:
 * coll_hier.c (the phases of a call: the intra-region steps, the exchange
 * between regions, its pipeline over slices), coll_hier_plan.c (each
 * slice's messages for this rank, their buffers, the exchange plan the
 * device path takes, the pace around a call) and coll_hier_codec.c (what
 * a compressed call encodes and decodes, and the codecs it takes).  The
 * algorithm itself is described at the top of coll_hier.c. */
#ifndef GEOCCL_COLL_HIER_INTERNAL_H_
#define GEOCCL_COLL_HIER_INTERNAL_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "comm/coll/coll.h"
#include "comm/core/comm.h"
#include "comm/transport/transport.h"
#include "compress/codec.h"

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

static inline char *hierAt(const hierView *v, size_t off, size_t es)
{
    return v->buf + (off - v->base) * es;
}

/* ---- coll_hier_node.c -------------------------------------------------- */

/* The node layout of every region (coll_hier_node.c says how it is found):
 * per global rank its node within its region (numbered by lowest rank)
 * and its place on that node (by rank); per region, G ranks on each of H
 * nodes where the node stage applies (both >= 2, every node alike), else
 * G = H = 0; and this rank's node ring (positions by place on the node)
 * and rail ring (the ranks at my place on every node, by node), n = 0
 * where my region has no node stage. */
typedef struct geoHierNodes {
    int *node_of;
    int *node_local;
    int G[64], H[64];
    geoRing node_ring, rail_ring;
} geoHierNodes;

/* Segment [*off, *off + *n) of a slice of len elements that region q's
 * local rank i holds after the reduce-scatter: seg's cut, or, with the
 * node stage in a region that has one, part node_of of node segment
 * node_local. */
void hierRankSeg(const struct ncclComm *comm, int node_stage, hierSegFn seg, size_t len, int q,
                 int i, size_t *off, size_t *n);
/* The node and region stages of one slice [s0, s0 + len) of op: the
 * reduce-scatter (ag = 0: my segment, hierRankSeg's, summed over the
 * region into op->recvbuff) or the all-gather (ag = 1).  Only where my
 * region has a node stage.  Errors are recorded where they happen. */
ncclResult_t hierNodeIntra(struct ncclComm *comm, const geoOp *op, size_t s0, size_t len,
                           int ag, size_t es);

/* ---- coll_hier_plan.c -------------------------------------------------- */

/* Lay out the messages of slice sl (s0 and len set) for this rank (its
 * segments cut by seg, or with the node stage as hierRankSeg says), with
 * the encode buffers a compressed call needs (hc); hierSliceTmp gives the
 * X1 receive buffer while the slice is in flight, hierSliceTmpPut takes
 * it back; hierSliceFree frees what the plan allocated.  The plan:
 * ncclSuccess, ncclSystemError (out of memory) or ncclInvalidArgument (a
 * codec that cannot bound its chunks), unreported: the caller, which names
 * the operation, reports it; hierSliceTmp reports its own failure. */
ncclResult_t hierSlicePlan(struct ncclComm *comm, hierSlice *sl, size_t es,
                           const hierCodec *hc, ncclDataType_t dt, hierSegFn seg,
                           int node_stage);
ncclResult_t hierSliceTmp(struct ncclComm *comm, hierSlice *sl);
void hierSliceTmpPut(struct ncclComm *comm, hierSlice *sl);
void hierSliceFree(struct ncclComm *comm, hierSlice *sl);
/* GEOCCL_WAN_PACE around a call of call_bytes bytes (0 when compressed)
 * whose first slice is sl: on = 1 before its first message, 0 after. */
void hierPaceWan(struct ncclComm *comm, const hierSlice *sl, double call_bytes, int on);

/* ---- coll_hier_codec.c ------------------------------------------------- */

/* The call's codecs (by_region: the plan's per sending region, or NULL
 * for comm->call_codec everywhere), and the encode and decode steps of X1
 * and X2 over one slice; each step records a failure on comm and returns
 * its code.  hierFusedDecode: whether X1's decode and sum run in one pass
 * (hierDecodeReduceX1, acc: a part-sized float scratch). */
void hierChooseCodec(struct ncclComm *comm, const geoOp *op, hierCodec *hc,
                     const unsigned char *by_region);
ncclResult_t hierEncodeX1(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                          const hierCodec *hc, const hierView *v);
ncclResult_t hierDecodeX1(struct ncclComm *comm, const geoOp *op, hierSlice *sl);
int hierFusedDecode(const geoOp *op, const hierCodec *hc);
ncclResult_t hierDecodeReduceX1(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                                float *acc, const hierView *v);
ncclResult_t hierEncodeX2(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                          const hierCodec *hc, const hierView *v);
ncclResult_t hierDecodeX2(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                          const hierView *v);

#endif
