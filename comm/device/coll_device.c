/* Collectives on device buffers.
 *
 * One region: every call goes straight to NVIDIA's NCCL (nccl_real.c) on
 * the user's stream, on a real communicator of the same ranks: no extra
 * work, no copy, no thread.
 *
 * Several regions: ncclAllReduce, stream-ordered on the user's stream:
 *
 *   real ncclReduceScatter within my region      (stream)
 *   cudaMemcpyAsync my shard -> pinned host       (stream)
 *   cudaEventRecord(ready)                        (stream)
 *   cuStreamWaitValue32(flag >= seq)              (stream waits; other
 *                                                  streams run on)
 *   cudaMemcpyAsync pinned host -> my shard       (stream)
 *   real ncclAllGather within my region           (stream)
 *
 * and on the host, the communicator's exchange thread takes the jobs in
 * call order: it waits (polling, with the communicator's deadline and
 * abort flag) for the ready event, runs the inter-region step of the
 * hierarchical all-reduce on the shard (geoHierExchange: compression and
 * error feedback as on host buffers), then writes seq into the flag, which
 * lives in mapped pinned memory the GPU reads.  No CUDA or NCCL function
 * is called from a stream callback, and no host function is used: where
 * stream memory operations are unavailable, a one-warp kernel that polls
 * the flag (geoCudaWaitFlag) takes the place of cuStreamWaitValue32, so
 * that no wait ever holds a thread of CUDA's (see devStreamWait).
 *
 * A failure in the exchange marks the communicator broken (ncclComm-
 * GetAsyncError reports it, as NCCL reports a failed kernel) and still
 * releases the stream, so no stream ever waits forever.  Where the GPU
 * has the call's codec, the shard is encoded on the GPU and only the chunks
 * go to the host (dev_codec_job.c).  The other collectives are staged
 * whole through pinned memory and run by the host algorithms
 * (dev_staged.c).
 *
 * The real communicator of my region is created at init where every rank
 * of the region has a GPU of its own (GEOCCL_NCCL_INIT), else at the first
 * device-buffer call (see nccl_real.c): local rank 0 of the region calls
 * the real ncclGetUniqueId and sends it to the others over GeoCCL's own
 * transport.  Every rank of a region must therefore make that first device
 * call at the same point of its call sequence, which collectives guarantee.
 *
 * The layer's files: coll_device.c (this one: argument checks, the entry
 * that picks a path, the build without CUDA), dev_cuda.c (GPU detection,
 * CUDA errors, the communicator's device), dev_lifecycle.c (the device
 * state and NVIDIA's communicator of the region, from creation to free),
 * dev_passthrough.c (one region), dev_exchange.c (the exchange thread,
 * its jobs and the flag), dev_staging.c (pinned slots, the device pool,
 * the device residuals), dev_codec_job.c and dev_codec_stream.c (the
 * GPU-encoded all-reduce: its layout and exchange, its stream program),
 * dev_staged.c (the all-reduce with the host codecs and the other
 * collectives, staged through the host), dev_timing.c (the phase times of
 * the cross-region calls); dev_internal.h holds what they share.
 */
#include "config.h"
#include "comm/device/coll_device.h"
#include "comm/core/comm.h"

#include <string.h>

#ifdef HAVE_CUDA
#include "comm/device/dev_internal.h"

/* ---- argument checks --------------------------------------------------- */

ncclResult_t geoDevCheck(struct ncclComm *comm, const geoOp *op, const char *fn)
{
    if (comm->cuda_dev < 0) {
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: device buffers on a communicator created "
                            "without a GPU (no CUDA device was current at ncclCommInitRank)", fn);
    }
    if (geoNcclReal() == NULL) {
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: device buffers need NVIDIA's NCCL inside "
                            "each region: %s", fn, geoNcclRealError());
    }
    if (comm->regions.nregions == 1)
        return ncclSuccess; /* pass-through: NVIDIA's NCCL checks the rest */
    if (op->type == GEO_OP_SEND || op->type == GEO_OP_RECV) {
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s on device buffers across %d regions is "
                            "not supported by this release (collectives are); use host buffers "
                            "for it, or one region", fn, comm->regions.nregions);
    }
    if ((op->type == GEO_OP_ALLREDUCE || op->type == GEO_OP_REDUCE ||
         op->type == GEO_OP_REDUCESCATTER) && op->op >= ncclNumOps) {
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: PreMulSum ops on device buffers across "
                            "regions are not supported by this release; use ncclAvg or scale "
                            "before the call", fn);
    }
    if (op->type == GEO_OP_ALLREDUCE &&
        (!geoDevIsDevicePtr(op->sendbuff) || !geoDevIsDevicePtr(op->recvbuff))) {
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: one buffer is device memory and the "
                            "other is not; across regions both must be device memory", fn);
    }
    if (geoNcclRealGroupIsOpen() || geoGroupActive()) {
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: a cross-region device collective inside "
                            "ncclGroupStart/End is not supported by this release", fn);
    }
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(op->stream, &cs) != cudaSuccess) {
        cudaGetLastError();
        return GEO_COMM_ERR(comm, ncclInvalidArgument, "%s: the stream is not a valid CUDA stream",
                            fn);
    }
    if (cs != cudaStreamCaptureStatusNone) {
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: CUDA graph capture of a cross-region "
                            "all-reduce is not supported by this release (its host exchange "
                            "cannot be captured)", fn);
    }
    return ncclSuccess;
}

/* ---- the entry point ---------------------------------------------------- */

ncclResult_t geoDevEnqueue(geoOp *op, const char *fn)
{
    struct ncclComm *comm = op->comm;
    struct geoDevState *st;
    ncclResult_t r;
    devGuard g;

    /* Made now, NVIDIA's communicator would be created inside the capture
     * (its init allocates and synchronises: the capture would break). */
    struct geoDevState *cur = __atomic_load_n(&comm->dev, __ATOMIC_ACQUIRE);
    if (cur == NULL || __atomic_load_n(&cur->real, __ATOMIC_ACQUIRE) == NULL) {
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(op->stream, &cs) != cudaSuccess)
            cudaGetLastError();
        if (cs != cudaStreamCaptureStatusNone) {
            return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: NVIDIA's NCCL communicator of this "
                                "region was not made at init (GEOCCL_NCCL_INIT, docs/device.md) "
                                "and cannot be made during CUDA graph capture: make one "
                                "device-buffer call before capturing", fn);
        }
    }
    GEO_CHECK(devReady(comm, fn, &st));
    comm->op_seq++;
    geoErrSetOp(&comm->err, "%s #%llu (%zu elements, device)",
                geoOpTypeName(op->type), (unsigned long long)comm->op_seq, op->count);
    if (comm->regions.nregions == 1) {
        /* NVIDIA's NCCL selects the communicator's device itself */
        if (geoGroupActive() && (r = geoNcclRealGroupOpen(st->lib)) != ncclSuccess)
            return devRealError(comm, st->lib, NULL, "ncclGroupStart", r);
        return devPassThrough(comm, st, op, fn);
    }
    GEO_CHECK(devEnter(comm, &g));
    __atomic_add_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    devTimedCall *tc = devTimingBegin(st, op->stream);
    r = op->type == GEO_OP_ALLREDUCE ? devCrossAllReduce(comm, st, op, tc)
                                     : devStagedCollective(comm, st, op, tc);
    devTimingEnd(st, tc, op->stream, r);
    __atomic_sub_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    devLeave(&g);
    return r;
}

#else /* !HAVE_CUDA: no GPU can exist, so no device buffer can reach us */

int geoDevCurrent(void) { return -1; }
const char *geoDevProblem(void) { return NULL; }
int geoDevIsDevicePtr(const void *p)
{
    (void)p;
    return 0;
}

ncclResult_t geoDevCheck(struct ncclComm *comm, const geoOp *op, const char *fn)
{
    (void)op;
    return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: device buffers need a GeoCCL built with CUDA",
                        fn);
}

ncclResult_t geoDevEnqueue(geoOp *op, const char *fn) { return geoDevCheck(op->comm, op, fn); }
ncclResult_t geoDevDrain(struct ncclComm *comm)
{
    (void)comm;
    return ncclSuccess;
}
ncclResult_t geoDevAsyncError(struct ncclComm *comm)
{
    (void)comm;
    return ncclSuccess;
}
void geoDevResetErrorFeedback(struct ncclComm *comm) { (void)comm; }
void geoDevDropErrorFeedback(struct ncclComm *comm, uint64_t tag)
{
    (void)comm;
    (void)tag;
}
ncclResult_t geoDevFinalize(struct ncclComm *comm)
{
    (void)comm;
    return ncclSuccess;
}
void geoDevFree(struct ncclComm *comm, int abort)
{
    (void)comm;
    (void)abort;
}
void geoDevRedOpDestroy(struct ncclComm *comm, int i)
{
    comm->redops[i].real_valid = 0;
}
int geoDevIdentify(int dev, char bus[16])
{
    (void)dev;
    memset(bus, 0, 16);
    return 0;
}
ncclResult_t geoDevInitAtInit(struct ncclComm *comm)
{
    (void)comm;
    return ncclSuccess;
}
ncclResult_t geoDevRealComm(struct ncclComm *comm, const char *fn, void **real)
{
    (void)real;
    return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s on device memory needs a GeoCCL built with "
                        "CUDA", fn);
}
#endif
