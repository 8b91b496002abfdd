/* The dispatcher: every host collective enters here (geoCollRun), is
 * reduced to a plain op (PreMulSum scales the input once), asks the plan
 * (tuning.h) for algorithm, codec and chunk, and runs one of the
 * algorithms below it: the host segment where every rank shares this host
 * and the cost model says it pays (comm/intra/hostseg.h), the direct
 * exchange for small all-reduces, the flat
 * ring and chains (coll_ring.c) or the hierarchical algorithms across
 * regions (coll_hier.c).  Every rank decides from the same plan and size,
 * so all take the same algorithm. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/coll/coll.h"
#include "comm/coll/reduce.h"
#include "comm/coll/tuning.h"
#include "comm/core/comm.h"
#include "comm/intra/hostseg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* PreMulSum handles: resolve to a scalar (read now for ncclScalarDevice). */
static int premul_scalar(struct ncclComm *comm, ncclRedOp_t op, double *scalar)
{
    if (op < ncclNumOps)
        return 0;
    geoRedOp *ro = &comm->redops[op - ncclNumOps];
    const void *p = ro->residence == ncclScalarHostImmediate ? (const void *)ro->scalar : ro->ptr;
    /* The host-immediate copy is a byte array inside the op table, and a
     * device-resident scalar is wherever the user put it: copy, never load
     * through a cast pointer (alignment). */
    union {
        float f32; double f64; uint16_t u16; uint8_t u8; int8_t i8;
        int32_t i32; uint32_t u32; int64_t i64; uint64_t u64;
    } v;
    size_t n = geoTypeSize(ro->datatype);
    memset(&v, 0, sizeof(v));
    memcpy(&v, p, n && n <= sizeof(v) ? n : 0);
    switch (ro->datatype) {
    case ncclFloat32: *scalar = v.f32; break;
    case ncclFloat64: *scalar = v.f64; break;
    case ncclFloat16: *scalar = geoHalfToFloat(v.u16); break;
    case ncclBfloat16: *scalar = geoBf16ToFloat(v.u16); break;
    case ncclFloat8e4m3: *scalar = geoFp8e4m3ToFloat(v.u8); break;
    case ncclFloat8e5m2: *scalar = geoFp8e5m2ToFloat(v.u8); break;
    case ncclInt8: *scalar = v.i8; break;
    case ncclUint8: *scalar = v.u8; break;
    case ncclInt32: *scalar = v.i32; break;
    case ncclUint32: *scalar = v.u32; break;
    case ncclInt64: *scalar = (double)v.i64; break;
    case ncclUint64: *scalar = (double)v.u64; break;
    default: *scalar = 1.0; break;
    }
    return 1;
}

ncclResult_t geoCollRun(geoOp *in)
{
    struct ncclComm *comm = in->comm;
    geoOp o = *in;
    const int N = comm->nranks, r = comm->rank;
    const size_t es = geoTypeSize(o.dt);
    size_t total = o.count; /* elements of the input of this rank */
    char *scaled = NULL;
    double scalar;
    ncclResult_t res;

    if (o.type == GEO_OP_ALLREDUCE || o.type == GEO_OP_REDUCE || o.type == GEO_OP_REDUCESCATTER) {
        if (o.type == GEO_OP_REDUCESCATTER)
            total = o.count * (size_t)N;
        if (premul_scalar(comm, o.op, &scalar)) {
            /* Scale our input once, then it is a plain sum. */
            scaled = malloc(total * es + 1);
            if (scaled == NULL)
                return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory for PreMulSum",
                                    geoErrOp(&comm->err));
            geoScale(scaled, o.sendbuff, total, o.dt, scalar);
            o.sendbuff = scaled;
            o.op = ncclSum;
        }
    }

    /* All ranks on this host: the shared segment, where its cost model
     * predicts it faster than messages (the same choice on every rank). */
    if (comm->hostseg != NULL) {
        int t = o.type == GEO_OP_ALLREDUCE ? GEO_HOSTSEG_ALLREDUCE
              : o.type == GEO_OP_REDUCE ? GEO_HOSTSEG_REDUCE
              : o.type == GEO_OP_BROADCAST ? GEO_HOSTSEG_BROADCAST
              : o.type == GEO_OP_ALLGATHER ? GEO_HOSTSEG_ALLGATHER
              : o.type == GEO_OP_REDUCESCATTER ? GEO_HOSTSEG_REDUCESCATTER : -1;
        size_t bytes = (o.type == GEO_OP_ALLGATHER ? o.count * (size_t)N : total) * es;
        int algo = t >= 0 ? geoHostSegChoose(comm, t, bytes) : GEO_HOSTSEG_NONE;
        if (algo != GEO_HOSTSEG_NONE) {
            comm->stats.calls_flat++;
            res = geoHostSegRun(comm, &o, algo);
            free(scaled);
            return res;
        }
    }

    geoWanWatchCallStart(&comm->wan.watch, geoNow());

    /* The plan (comm/coll/tuning.h): algorithm, codec and chunk of this call.
     * Every rank decides from the same plan and the same size. */
    int use_hier, codec;
    size_t plan_chunk, saved_chunk = comm->chunk_size, saved_slice = comm->hier_slice;
    int planned = geoTuningChoose(comm, o.type,
                                  o.type == GEO_OP_ALLGATHER ? o.count * (size_t)N * es
                                                             : total * es,
                                  &use_hier, &codec, &plan_chunk);
    /* Small all-reduces: one message to every rank, unless the plan chose
     * the hierarchical algorithm for this size (with many ranks per region
     * the direct exchange multiplies what each WAN link carries). */
    int direct = o.type == GEO_OP_ALLREDUCE && N > 1 && N <= 32 &&
                 total * es <= comm->direct_max && !(planned && use_hier);
    comm->call_codec = codec;
    comm->call_region_codecs = planned && use_hier && o.type == GEO_OP_ALLREDUCE
                                   ? geoTuningRegionCodecs(comm, total * es) : NULL;
    if (plan_chunk > 0) {
        if (use_hier)
            comm->hier_slice = plan_chunk;
        else
            comm->chunk_size = plan_chunk;
    }
    int hier = use_hier && ((o.type == GEO_OP_ALLREDUCE && !direct) ||
                            o.type == GEO_OP_ALLGATHER || o.type == GEO_OP_REDUCESCATTER);
    if (!hier)
        comm->stats.calls_flat++;
    switch (o.type) {
    case GEO_OP_ALLREDUCE: {
        if (direct) {
            res = geoDirectAllReduce(comm, &o);
            break;
        }
        if (hier) {
            comm->stats.calls_hier++;
            res = geoReplanCallStart(comm, total * es);
            if (res == ncclSuccess)
                res = geoHierAllReduce(comm, &o);
            res = geoReplanCallEnd(comm, res);
            break;
        }
        if (N == 1) {
            if (o.recvbuff != o.sendbuff)
                memmove(o.recvbuff, o.sendbuff, total * es);
            res = ncclSuccess;
            break;
        }
        geoRingPlan p = {.a = 0, .nsteps = 2 * N - 2, .reduce_steps = N - 1, .local = o.sendbuff,
                      .out = o.recvbuff, .out_final = NULL, .divide = o.op == ncclAvg ? N : 0};
        res = geoRingRun(comm, &o, &comm->ring, &p, total);
        break;
    }
    case GEO_OP_REDUCESCATTER: {
        if (hier) {
            comm->stats.calls_hier++;
            res = geoHierReduceScatter(comm, &o);
            break;
        }
        if (N == 1) {
            if (o.recvbuff != o.sendbuff)
                memmove(o.recvbuff, o.sendbuff, total * es);
            res = ncclSuccess;
            break;
        }
        /* Segments are exactly the ranks' blocks: count per rank. */
        geoRingPlan p = {.a = -1, .nsteps = N - 1, .reduce_steps = N - 1, .local = o.sendbuff,
                      .out = NULL, .out_final = o.recvbuff, .divide = o.op == ncclAvg ? N : 0};
        res = geoRingRun(comm, &o, &comm->ring, &p, total);
        break;
    }
    case GEO_OP_ALLGATHER: {
        if (hier) {
            comm->stats.calls_hier++;
            res = geoHierAllGather(comm, &o);
            break;
        }
        char *own = (char *)o.recvbuff + (size_t)r * o.count * es;
        if (own != (const char *)o.sendbuff)
            memmove(own, o.sendbuff, o.count * es);
        if (N == 1) {
            res = ncclSuccess;
            break;
        }
        geoRingPlan p = {.a = 0, .nsteps = N - 1, .reduce_steps = 0, .local = NULL,
                      .out = o.recvbuff, .out_final = NULL, .divide = 0};
        res = geoRingRun(comm, &o, &comm->ring, &p, o.count * (size_t)N);
        break;
    }
    case GEO_OP_BROADCAST:
        if (N == 1) {
            if (o.recvbuff != o.sendbuff)
                memmove(o.recvbuff, o.sendbuff, o.count * es);
            res = ncclSuccess;
            break;
        }
        res = geoChainBcast(comm, &o, &comm->ring);
        break;
    case GEO_OP_REDUCE:
        if (N == 1) {
            if (o.recvbuff != o.sendbuff)
                memmove(o.recvbuff, o.sendbuff, o.count * es);
            res = ncclSuccess;
            break;
        }
        res = geoChainReduce(comm, &o, &comm->ring, o.sendbuff);
        break;
    default:
        res = geoExchange(comm, &o);
        break;
    }
    comm->chunk_size = saved_chunk;
    comm->hier_slice = saved_slice;
    free(scaled);
    if (res != ncclSuccess)
        geoHostSegBreak(comm); /* ranks waiting in the segment need not wait for us */
    /* Between regions, the control each pair runs may change once what it
     * carries is known (topology/wan_tuning.h, geoWanWatch). */
    if (res == ncclSuccess && comm->regions.nregions > 1)
        geoWanWatchCallEnd(&comm->wan.watch, &comm->topo, &comm->regions, comm->rank,
                           comm->nranks, comm->nstreams, &comm->net, geoNow());
    return res;
}

