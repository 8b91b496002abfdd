/* Cross-region collectives whose data the host exchanges: the all-reduce
 * (after trying the GPU codecs: dev_codec_stream.c) with my shard copied
 * to pinned memory and exchanged by the host codecs, and every other
 * collective, run by the host algorithms on pinned staging.  The stream
 * waits on the flag while the exchange thread works (dev_exchange.c). */
#include "config.h"

#ifdef HAVE_CUDA
#include "comm/device/dev_internal.h"

#include "comm/base/param.h"
#include "comm/coll/reduce.h"
#include "comm/coll/tuning.h"
#include "cuda/codec_kernels.h"

#include <stdlib.h>

/* ---- the all-reduce ---------------------------------------------------- */

ncclResult_t devCrossAllReduce(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
                               devTimedCall *tc)
{
    const geoNcclRealLib *L = st->lib;
    const int n = comm->region_ring.n, me = comm->region_ring.me;
    const size_t es = geoTypeSize(op->dt), count = op->count;
    const size_t shard = (count + (size_t)n - 1) / (size_t)n;
    size_t off, len;
    cudaStream_t s = op->stream;
    ncclRedOp_t rsop = op->op == ncclAvg ? ncclSum : op->op; /* divided on the host */
    ncclResult_t r;
    char *tmp = NULL, *work;
    const char *send;
    devSlot *slot;

    GEO_CHECK(devCrossSetup(comm, st));
    /* The codec the plan (or the user) gives this size; on the GPU when it
     * has the codec. */
    int hier_unused, codec;
    size_t chunk;
    geoHierCodecChoice ch;
    geoTuningChoose(comm, GEO_OP_ALLREDUCE, count * es, &hier_unused, &codec, &chunk);
    geoHierCodecPolicy(comm, op, codec, &ch);
    /* float32 sum/avg go through the GPU path also uncompressed (codec
     * none: chunks are plain copies with a header), so that they pipeline
     * in rounds too. */
    int exact_f32 = ch.codec == GEO_CODEC_NONE && (op->op == ncclSum || op->op == ncclAvg);
    if (exact_f32) {
        geoCodecParamsInit(&ch.p1);
        ch.p2 = ch.p1;
    }
    if (op->dt == ncclFloat32 && geoParamInt(GEO_PARAM_CUDA_CODECS) != 0 &&
        (exact_f32 ||
         (ch.codec != GEO_CODEC_NONE && geoCudaCodecAvailable((geoCodecId)ch.codec)))) {
        devCodecJob *cj = NULL;
        r = devCodecPrepare(comm, op, &ch, chunk, &cj);
        if (r == ncclSuccess)
            return devCodecAllReduce(comm, st, op, cj, tc);
        if (r != ncclInvalidArgument)
            return r;
        /* The GPU codec refuses these parameters: the host codecs serve. */
        geoInfo(GEO_LOG_CUDA | GEO_LOG_COMPRESS, "%s: the GPU codec cannot encode these chunks "
                "(codec parameters); the host codecs encode them", geoErrOp(&comm->err));
    }
    geoSegPadded(count, n, me, &off, &len);
    if (count % (size_t)n == 0) {
        send = op->sendbuff;
        work = op->recvbuff;
    } else {
        /* NCCL cuts a reduce-scatter in equal shards: pad to n * shard. */
        CUDA_CHECK(comm, devMalloc(st, (void **)&tmp, shard * (size_t)n * es, s),
                   "cudaMallocAsync of the padded buffer");
        CUDA_CHECK(comm, cudaMemcpyAsync(tmp, op->sendbuff, count * es, cudaMemcpyDeviceToDevice,
                                         s), "copying the input to the padded buffer");
        CUDA_CHECK(comm, cudaMemsetAsync(tmp + count * es, 0, (shard * (size_t)n - count) * es,
                                         s), "zeroing the padding");
        send = tmp;
        work = tmp;
    }
    char *mine = work + (size_t)me * shard * es;
    cudaError_t ce = cudaSuccess;
    devJob *j = NULL;
    r = devFlagRewind(comm, st, 1);
    if (r == ncclSuccess)
        r = devSlotGet(comm, st, shard * es + 1, &slot);
    if (r != ncclSuccess)
        goto undo_tmp;
    devTimingPhase(st, tc, DEV_PH_RS, s);
    GEO_REAL_CALL(r, L, ReduceScatter, send, mine, shard, op->dt, rsop, st->real, s);
    if (r != ncclSuccess) {
        r = devRealError(comm, L, st->real, "the intra-region reduce-scatter", r);
        goto undo_slot;
    }
    devTimingPhase(st, tc, DEV_PH_COPYOUT, s);
    if (len > 0 &&
        (ce = cudaMemcpyAsync(slot->host, mine, len * es, cudaMemcpyDeviceToHost, s)) !=
            cudaSuccess) {
        r = devCudaError(comm, "copying the shard to the host", ce);
        goto undo_slot;
    }
    if ((ce = cudaEventRecord(slot->ready, s)) != cudaSuccess) {
        r = devCudaError(comm, "cudaEventRecord", ce);
        goto undo_slot;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        r = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory", geoErrOp(&comm->err));
        goto undo_slot;
    }
    j->op = *op;
    j->op.next = NULL;
    j->op.seq = comm->op_seq; /* the exchange's stochastic rounding stream */
    j->slot = slot;
    j->off = off;
    j->len = len;
    j->op_seq = comm->op_seq;
    j->codec = codec;
    devTimingLink(j, tc);
    /* From here the job belongs to the exchange thread, which frees it
     * when done: never touch it again, keep only its sequence number. */
    uint32_t jseq = devJobPush(st, j, 1) + 1;
    j = NULL;

    /* The job is queued: the stream must wait for it whatever happens, or
     * the exchange thread would write into a slot reused by a later call. */
    devTimingPhase(st, tc, DEV_PH_WAN, s);
    GEO_CHECK(devStreamWait(comm, st, s, jseq));
    devTimingPhase(st, tc, DEV_PH_COPYIN, s);
    if (len > 0)
        CUDA_CHECK(comm, cudaMemcpyAsync(mine, slot->host, len * es, cudaMemcpyHostToDevice, s),
                   "copying the exchanged shard back");
    CUDA_CHECK(comm, cudaEventRecord(slot->done, s), "cudaEventRecord");
    devTimingPhase(st, tc, DEV_PH_AG, s);
    GEO_REAL_CALL(r, L, AllGather, mine, work, shard, op->dt, st->real, s);
    if (r != ncclSuccess)
        return devRealError(comm, L, st->real, "the intra-region all-gather", r);
    devTimingPhase(st, tc, DEV_PH_OTHER, s);
    if (tmp) {
        CUDA_CHECK(comm, cudaMemcpyAsync(op->recvbuff, tmp, count * es, cudaMemcpyDeviceToDevice,
                                         s), "copying the result out of the padded buffer");
        CUDA_CHECK(comm, cudaFreeAsync(tmp, s), "cudaFreeAsync");
    }
    return ncclSuccess;

undo_slot:
    devSlotPut(st, slot);
undo_tmp:
    if (tmp)
        cudaFreeAsync(tmp, s);
    return r;
}

/* ---- other collectives across regions: staged through the host ---------
 *
 * Broadcast, reduce, all-gather, reduce-scatter, all-to-all, gather and
 * scatter on device buffers across regions: on the user's stream, the
 * input is copied to pinned memory (where this rank has one), the stream
 * waits on the flag, and the output is copied back (where this rank has
 * one); in between, the exchange thread runs the host algorithm on the
 * staging (hierarchical where that saves WAN bytes, coll_ring.c and
 * coll_hier.c).  No NCCL call: the collective's traffic inside a region is
 * a small part of it beside the WAN.  Buffers may be host or device memory
 * (cudaMemcpyDefault).  Trainers use these for parameters at start-up
 * (DDP broadcasts its module state) and for sharded optimisers. */

static void staged_sizes(const struct ncclComm *comm, const geoOp *op, size_t *in, size_t *out,
                         int *copy_in, int *copy_out)
{
    const size_t es = geoTypeSize(op->dt), c = op->count, N = (size_t)comm->nranks;
    const int root = op->root == comm->rank;
    *copy_in = *copy_out = 1;
    switch (op->type) {
    case GEO_OP_BROADCAST: *in = c; *out = c; *copy_in = root; break;
    case GEO_OP_REDUCE: *in = c; *out = c; *copy_out = root; break;
    case GEO_OP_ALLGATHER: *in = c; *out = c * N; break;
    case GEO_OP_REDUCESCATTER: *in = c * N; *out = c; break;
    case GEO_OP_ALLTOALL: *in = c * N; *out = c * N; break;
    case GEO_OP_GATHER: *in = c; *out = c * N; *copy_out = root; break;
    case GEO_OP_SCATTER: *in = c * N; *out = c; *copy_in = root; break;
    default: *in = c; *out = c; break;
    }
    *in *= es;
    *out *= es;
}

ncclResult_t devStagedCollective(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
                                 devTimedCall *tc)
{
    cudaStream_t s = op->stream;
    size_t in, out;
    int copy_in, copy_out;
    devSlot *slot = NULL;
    cudaError_t ce;
    ncclResult_t r;

    GEO_CHECK(devCrossSetup(comm, st));
    staged_sizes(comm, op, &in, &out, &copy_in, &copy_out);
    const size_t rat = devStageAlign(in);
    GEO_CHECK(devFlagRewind(comm, st, 1));
    GEO_CHECK(devSlotGet(comm, st, rat + out + 1, &slot));
    devTimingPhase(st, tc, DEV_PH_COPYOUT, s);
    if ((copy_in && (ce = cudaMemcpyAsync(slot->host, op->sendbuff, in, cudaMemcpyDefault, s)) !=
                        cudaSuccess) ||
        (ce = cudaEventRecord(slot->ready, s)) != cudaSuccess) {
        r = devCudaError(comm, "copying the input to the host", ce);
        devSlotPut(st, slot);
        return r;
    }
    devJob *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        devSlotPut(st, slot);
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory", geoErrOp(&comm->err));
    }
    j->op = *op;
    j->op.next = NULL;
    j->op.seq = comm->op_seq;
    j->slot = slot;
    j->op_seq = comm->op_seq;
    j->staged = 1;
    j->sbytes = in;
    j->rat = rat;
    devTimingLink(j, tc);
    uint32_t jseq = devJobPush(st, j, 1) + 1; /* j is the exchange thread's now (it frees it) */
    j = NULL;
    /* queued: the stream must wait for it whatever happens */
    devTimingPhase(st, tc, DEV_PH_WAN, s);
    GEO_CHECK(devStreamWait(comm, st, s, jseq));
    devTimingPhase(st, tc, DEV_PH_COPYIN, s);
    if (copy_out)
        CUDA_CHECK(comm, cudaMemcpyAsync(op->recvbuff, slot->host + rat, out, cudaMemcpyDefault,
                                         s), "copying the output back");
    CUDA_CHECK(comm, cudaEventRecord(slot->done, s), "cudaEventRecord");
    return ncclSuccess;
}
#endif
