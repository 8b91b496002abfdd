/* Collectives on device buffers.
 *
 * One region: every call goes straight to NVIDIA's NCCL (nccl_real.c) on
 * the user's stream, on a real communicator of the same ranks: no extra
 * work, no copy, no thread.
 *
 * Several regions: ncclAllReduce only, stream-ordered on the user's stream:
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
 * releases the stream, so no stream ever waits forever.
 *
 * The real communicator of my region is created at the first device-buffer
 * call (see nccl_real.c for why not at init): local rank 0 of the region
 * calls the real ncclGetUniqueId and sends it to the others over GeoCCL's
 * own transport.  Every rank of a region must therefore make that first
 * device call at the same point of its call sequence, which collectives
 * guarantee.
 */
#include "config.h"
#include "comm/coll/tuning.h"
#include "comm/device/coll_device.h"
#include "comm/base/checks.h"
#include "comm/core/comm.h"

#include "comm/device/nccl_real.h"
#include "comm/base/param.h"
#include "comm/coll/reduce.h"
#include "compress/ef.h"
#include "cuda/codec_kernels.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#define GEO_DEV_MAX_SLOTS 64

typedef CUresult (*waitValueFn)(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                unsigned int flags);

/* Pinned staging for one job in flight.  Pinned memory is never freed
 * while the communicator lives: cudaFreeHost waits for every stream of the
 * device (the trainer's compute streams too), so a slot that must grow
 * keeps its old buffer on the communicator's retired list (see devSlotGet),
 * and everything goes at ncclCommDestroy; ncclCommAbort frees none of it
 * (see geoDevFree). */
typedef struct {
    char *host;
    size_t cap;
    cudaEvent_t ready;      /* the shard is on the host */
    cudaEvent_t done;       /* the result is back on the device */
    int busy;               /* a job owns it (until done completes) */
    int exchanged;          /* the exchange thread is finished with it */
} devSlot;

/* A staging buffer a slot outgrew (devSlotGet). */
typedef struct devRetired {
    void *host;
    size_t bytes;
    struct devRetired *next;
} devRetired;

struct devCodecJob;

typedef struct devJob {
    geoOp op;               /* count, dt, op; recvbuff keys error feedback */
    devSlot *slot;
    size_t off, len;        /* my shard in elements */
    uint32_t seq;           /* the flag value that releases all of the job */
    uint64_t op_seq;
    int codec;              /* host exchange: the codec of the call */
    struct devCodecJob *codec_job;       /* GPU-encoded exchange (NULL: host exchange) */
    int staged;             /* another collective, run on host staging */
    size_t sbytes;          /* staged: the input's bytes at slot->host, the
                               output's after them (at rat) */
    size_t rat;
    struct devJob *next;
} devJob;

struct geoDevState {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    const geoNcclRealLib *lib;
    geoRealComm real;
    ncclResult_t real_failed;   /* the lazy init failed with this: no retry */

    /* cross-region all-reduce */
    uint32_t *flag;             /* mapped pinned: the exchange thread writes */
    void *dflag;                /* its device address */
    uint32_t seq;               /* last job issued */
    waitValueFn wait_value;     /* NULL: host-function fallback */
    int wait_value_checked;
    devSlot slots[GEO_DEV_MAX_SLOTS];
    int nslots;
    devRetired *retired;        /* outgrown staging, freed at destroy */
    devJob *head, *tail;
    int pending;                /* jobs queued or running */
    int stop, aborting;
    pthread_t thread;
    int thread_live;

    /* error feedback of the GPU-encoded exchange: residuals in device
     * memory, keyed by (address of my shard in the user's buffer, shard
     * elements, trip) */
    geoEfStore ef;
    int ef_ready;
    cudaStream_t ef_stream;     /* the call that may evict (ef_stream_valid) */
    int ef_stream_valid;
    cudaEvent_t ef_ev;          /* recorded after each GPU-encoded call */
    cudaStream_t last_stream;   /* ... on this stream */
    int ef_leak;                /* abort could not order the frees: keep them */

    /* Device staging (the chunks of a GPU-encoded exchange, the padded
     * buffer of an uneven count, the residuals) comes from a memory pool of
     * the communicator's own (see devPoolSetup), not from the device's default
     * pool. */
    cudaMemPool_t pool;
    int pool_checked;
};

/* ---- small CUDA helpers -------------------------------------------------- */

static int gpu_count;
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
/* Set when a CUDA driver is installed but this runtime cannot use it (most
 * often a driver older than the runtime's major version needs): the machine
 * has GPUs that we must not silently treat as absent. */
static char gpu_problem[384];

/* "13.0" from CUDA's 1000 * major + 10 * minor. */
static void cuda_version_text(int v, char *buf, size_t len)
{
    snprintf(buf, len, "%d.%d", v / 1000, v % 1000 / 10);
}

static void count_gpus(void)
{
    int n = 0, drv = 0, rt = 0;
    char dtxt[16], rtxt[16];
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess) {
        gpu_count = n;
        return;
    }
    cudaGetLastError();
    gpu_count = 0;
    /* cudaDriverGetVersion answers 0 when no driver (libcuda.so.1) loads;
     * both answer without a usable device. */
    if (cudaDriverGetVersion(&drv) != cudaSuccess) {
        cudaGetLastError();
        drv = 0;
    }
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) {
        cudaGetLastError();
        rt = CUDART_VERSION;
    }
    cuda_version_text(drv, dtxt, sizeof(dtxt));
    cuda_version_text(rt, rtxt, sizeof(rtxt));
    if (e == cudaErrorNoDevice || drv == 0) {
        geoInfo(GEO_LOG_INIT | GEO_LOG_CUDA, "no GPU: %s; host buffers only",
                drv == 0 ? "no CUDA driver is installed (libcuda.so.1 not found)"
                         : "the CUDA driver sees no device");
        return;
    }
    if (e == cudaErrorInsufficientDriver)
        snprintf(gpu_problem, sizeof(gpu_problem),
                 "the CUDA driver supports CUDA %s, but GeoCCL's CUDA runtime is %s and needs "
                 "a driver for CUDA %d.x: update the driver, or build GeoCCL with a CUDA "
                 "toolkit no newer than %s (./configure --with-cuda=DIR)", dtxt, rtxt,
                 rt / 1000, dtxt);
    else
        snprintf(gpu_problem, sizeof(gpu_problem),
                 "the CUDA runtime %s cannot use the GPUs (driver for CUDA %s): "
                 "cudaGetDeviceCount failed with %s (%s)", rtxt, dtxt, cudaGetErrorName(e),
                 cudaGetErrorString(e));
    geoWarn(GEO_LOG_INIT | GEO_LOG_CUDA, "%s", gpu_problem);
}

const char *geoDevProblem(void)
{
    pthread_once(&gpu_once, count_gpus);
    return gpu_problem[0] ? gpu_problem : NULL;
}

int geoDevCurrent(void)
{
    int d = -1;
    pthread_once(&gpu_once, count_gpus);
    if (gpu_count == 0)
        return -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return d;
}

int geoDevIsDevicePtr(const void *p)
{
    struct cudaPointerAttributes a;
    if (p == NULL)
        return 0;
    pthread_once(&gpu_once, count_gpus);
    if (gpu_count == 0)
        return 0;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static ncclResult_t devCudaError(struct ncclComm *comm, const char *what, cudaError_t e)
{
    geoCommSetError(comm, "%s: %s (%s)", geoErrOp(&comm->err), what, cudaGetErrorString(e));
    geoWarn(GEO_LOG_CUDA, "%s", geoErrLast(&comm->err));
    return ncclUnhandledCudaError;
}

#define CUDA_CHECK(comm, call, what)                        \
    do {                                                    \
        cudaError_t geo_ce_ = (call);                       \
        if (geo_ce_ != cudaSuccess)                         \
            return devCudaError((comm), (what), geo_ce_);     \
    } while (0)

/* The communicator's device made current for the duration of a call, the
 * caller's restored after it, as NCCL does: events, pinned memory and
 * stream-ordered allocations belong to the device current when they are
 * made, and the caller's thread may have another one current (PyTorch's
 * watchdog thread aborts with device 0 current). */
typedef struct {
    int prev;
    int switched;
} devGuard;

static ncclResult_t devEnter(struct ncclComm *comm, devGuard *g)
{
    g->prev = -1;
    g->switched = 0;
    if (comm->cuda_dev < 0)
        return ncclSuccess;
    if (cudaGetDevice(&g->prev) != cudaSuccess) {
        cudaGetLastError();
        g->prev = -1;
    }
    if (g->prev == comm->cuda_dev)
        return ncclSuccess;
    cudaError_t e = cudaSetDevice(comm->cuda_dev);
    if (e != cudaSuccess)
        return devCudaError(comm, "selecting the communicator's CUDA device", e);
    g->switched = 1;
    return ncclSuccess;
}

static void devLeave(const devGuard *g)
{
    if (g->switched && g->prev >= 0 && cudaSetDevice(g->prev) != cudaSuccess)
        cudaGetLastError();
}

static ncclResult_t devRealError(struct ncclComm *comm, const geoNcclRealLib *lib, geoRealComm rc,
                                 const char *what, ncclResult_t r)
{
    const char *txt;
    GEO_REAL_CALL(txt, lib, GetLastError, rc);
    geoCommSetError(comm, "%s: NVIDIA's NCCL failed %s: %s (%s)", geoErrOp(&comm->err), what,
                    lib->GetErrorString(r), txt && txt[0] ? txt : "no detail");
    geoWarn(GEO_LOG_CUDA, "%s", geoErrLast(&comm->err));
    return r;
}

/* ---- state and the real communicator ------------------------------------ */

static struct geoDevState *dev_state(struct ncclComm *comm)
{
    pthread_mutex_lock(&comm->lock);
    if (comm->dev == NULL) {
        struct geoDevState *st = calloc(1, sizeof(*st));
        if (st) {
            pthread_mutex_init(&st->lock, NULL);
            pthread_cond_init(&st->cv, NULL);
            /* geoDevAsyncError reads it without the lock */
            __atomic_store_n(&comm->dev, st, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&comm->lock);
    return comm->dev;
}

typedef struct {
    int32_t ok;
    int32_t pad;
    ncclUniqueId id;
} realIdMsg;

/* Create the real communicator of my region (collective over the region). */
static ncclResult_t real_init(struct ncclComm *comm, struct geoDevState *st, const char *fn)
{
    const geoRing *ring = &comm->region_ring;
    const int n = ring->n, me = ring->me;
    realIdMsg msg;
    ncclResult_t r = ncclSuccess;
    int prev = -1;

    memset(&msg, 0, sizeof(msg));
    if (me == 0) {
        GEO_REAL_CALL(r, st->lib, GetUniqueId, &msg.id);
        msg.ok = r == ncclSuccess;
        geoNetRequest *req = calloc((size_t)n, sizeof(*req));
        if (req == NULL) {
            geoCommSetError(comm, "%s: out of memory", fn);
            return ncclSystemError;
        }
        ncclResult_t s = ncclSuccess;
        for (int i = 1; i < n && s == ncclSuccess; i++)
            s = geoNetIsend(&comm->net, ring->ranks[i], &msg, sizeof(msg), &req[i]);
        for (int i = 1; i < n && s == ncclSuccess; i++)
            s = geoNetWait(&comm->net, &req[i]);
        free(req);
        if (r != ncclSuccess)
            return devRealError(comm, st->lib, NULL, "ncclGetUniqueId", r);
        GEO_CHECK(s);
    } else {
        geoNetRequest req;
        memset(&req, 0, sizeof(req));
        GEO_CHECK(geoNetIrecv(&comm->net, ring->ranks[0], &msg, sizeof(msg), &req));
        GEO_CHECK(geoNetWait(&comm->net, &req));
        if (!msg.ok) {
            geoCommSetError(comm, "%s: local rank 0 of my region (rank %d) could not get an "
                            "NCCL unique id from NVIDIA's NCCL", fn, ring->ranks[0]);
            return ncclRemoteError;
        }
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    cfg.cgaClusterSize = comm->real_cfg.cgaClusterSize;
    cfg.minCTAs = comm->real_cfg.minCTAs;
    cfg.maxCTAs = comm->real_cfg.maxCTAs;
    cfg.splitShare = comm->real_cfg.splitShare;
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    if (prev != comm->cuda_dev && cudaSetDevice(comm->cuda_dev) != cudaSuccess) {
        cudaGetLastError();
        geoCommSetError(comm, "%s: cannot select CUDA device %d of the communicator", fn,
                        comm->cuda_dev);
        return ncclUnhandledCudaError;
    }
    /* Made into a local and published once complete: geoDevAsyncError
     * (ncclCommGetAsyncError, any thread) reads st->real without a lock, and
     * NCCL writes its output argument before its init has finished. */
    geoRealComm made = NULL;
    GEO_REAL_CALL(r, st->lib, CommInitRankConfig, &made, n, msg.id, me, &cfg);
    if (prev >= 0 && prev != comm->cuda_dev)
        cudaSetDevice(prev);
    if (r != ncclSuccess)
        return devRealError(comm, st->lib, NULL, "ncclCommInitRankConfig", r);
    __atomic_store_n(&st->real, made, __ATOMIC_RELEASE);
    geoInfo(GEO_LOG_INIT | GEO_LOG_CUDA, "%s: real NCCL communicator of region '%s' ready: "
            "local rank %d of %d on CUDA device %d (NCCL %d from %s)", fn,
            comm->peers[comm->rank].region[0] ? comm->peers[comm->rank].region : "default",
            me, n, comm->cuda_dev, st->lib->version, st->lib->path);
    return ncclSuccess;
}

/* The device state with a live real communicator, or an error naming the
 * missing piece. */
static ncclResult_t devReady(struct ncclComm *comm, const char *fn, struct geoDevState **out)
{
    if (comm->cuda_dev < 0) {
        geoCommSetError(comm, "%s: device buffers on a communicator created without a GPU "
                        "(no CUDA device was current at ncclCommInitRank)", fn);
        return ncclInvalidUsage;
    }
    const geoNcclRealLib *lib = geoNcclReal();
    if (lib == NULL) {
        geoCommSetError(comm, "%s: device buffers need NVIDIA's NCCL inside each region: %s",
                        fn, geoNcclRealError());
        return ncclInvalidUsage;
    }
    struct geoDevState *st = dev_state(comm);
    if (st == NULL) {
        geoCommSetError(comm, "%s: out of memory", fn);
        return ncclSystemError;
    }
    st->lib = lib;
    if (st->real == NULL) {
        if (st->real_failed != ncclSuccess) {
            geoCommSetError(comm, "%s: the real NCCL communicator of this region failed to "
                            "initialise earlier (%s)", fn, lib->GetErrorString(st->real_failed));
            return st->real_failed;
        }
        if (geoNcclRealGroupIsOpen()) {
            geoCommSetError(comm, "%s: the first device-buffer call of a communicator cannot "
                            "be inside a group that already holds device operations of "
                            "another communicator; make one call on it outside a group "
                            "first", fn);
            return ncclInvalidUsage;
        }
        ncclResult_t r = real_init(comm, st, fn);
        if (r != ncclSuccess) {
            st->real_failed = r;
            return r;
        }
    }
    *out = st;
    return ncclSuccess;
}

ncclResult_t geoDevRealComm(struct ncclComm *comm, const char *fn, void **real)
{
    struct geoDevState *st;
    if (comm->regions.nregions != 1) {
        geoCommSetError(comm, "%s is supported by GeoCCL on device memory within one region "
                        "only; this communicator spans %d regions", fn,
                        comm->regions.nregions);
        return ncclInvalidUsage;
    }
    GEO_CHECK(devReady(comm, fn, &st));
    *real = st->real;
    return ncclSuccess;
}

/* ---- the real communicator at init ------------------------------------ */

int geoDevIdentify(int dev, char bus[16])
{
    memset(bus, 0, 16);
    if (dev < 0 || geoNcclReal() == NULL)
        return 0;
    if (cudaDeviceGetPCIBusId(bus, 16, dev) != cudaSuccess) {
        cudaGetLastError();
        memset(bus, 0, 16);
        return 0;
    }
    bus[15] = '\0';
    return 1;
}

ncclResult_t geoDevInitAtInit(struct ncclComm *comm)
{
    const int mode = comm->peers[0].nccl_init;
    const geoRing *ring = &comm->region_ring;
    const char *region = comm->peers[comm->rank].region[0] ? comm->peers[comm->rank].region
                                                          : "default";
    char why[320] = "";
    if (mode == GEO_NCCL_INIT_LAZY || (mode == GEO_NCCL_INIT_AUTO && comm->cuda_dev < 0))
        return ncclSuccess; /* (a host-only rank: its region's others find it not ready) */
    /* The same table on every rank of the region: they all decide alike. */
    for (int i = 0; i < ring->n && !why[0]; i++) {
        const geoPeerInfo *a = &comm->peers[ring->ranks[i]];
        if (!a->dev_ready) {
            snprintf(why, sizeof(why), "rank %d has no CUDA device or no NVIDIA NCCL",
                     ring->ranks[i]);
            break;
        }
        for (int j = 0; j < i && !why[0]; j++) {
            const geoPeerInfo *b = &comm->peers[ring->ranks[j]];
            /* (peers' strings, bounded: the table is theirs) */
            if (strncmp(a->net.host, b->net.host, sizeof(a->net.host)) == 0 &&
                strncmp(a->dev_bus, b->dev_bus, sizeof(a->dev_bus)) == 0)
                snprintf(why, sizeof(why), "ranks %d and %d share the GPU %.16s of host %.*s "
                         "(NVIDIA's NCCL takes one rank per GPU)", ring->ranks[j],
                         ring->ranks[i], a->dev_bus, (int)sizeof(a->net.host), a->net.host);
        }
    }
    if (why[0] && mode == GEO_NCCL_INIT_EAGER) {
        geoCommSetError(comm, "init: GEOCCL_NCCL_INIT=eager, but NVIDIA's NCCL communicator of "
                        "region '%s' cannot be made: %s", region, why);
        return ncclInvalidUsage;
    }
    if (why[0]) {
        geoInfo(GEO_LOG_INIT | GEO_LOG_CUDA, "init: NVIDIA's NCCL communicator of region '%s' "
                "is made at the first device-buffer call: %s", region, why);
        return ncclSuccess;
    }
    struct geoDevState *st;
    return devReady(comm, "init", &st);
}

/* ---- argument checks --------------------------------------------------- */

ncclResult_t geoDevCheck(struct ncclComm *comm, const geoOp *op, const char *fn)
{
    if (comm->cuda_dev < 0) {
        geoCommSetError(comm, "%s: device buffers on a communicator created without a GPU "
                        "(no CUDA device was current at ncclCommInitRank)", fn);
        return ncclInvalidUsage;
    }
    if (geoNcclReal() == NULL) {
        geoCommSetError(comm, "%s: device buffers need NVIDIA's NCCL inside each region: %s",
                        fn, geoNcclRealError());
        return ncclInvalidUsage;
    }
    if (comm->regions.nregions == 1)
        return ncclSuccess; /* pass-through: NVIDIA's NCCL checks the rest */
    if (op->type == GEO_OP_SEND || op->type == GEO_OP_RECV) {
        geoCommSetError(comm, "%s on device buffers across %d regions is not supported by this "
                        "release (collectives are); use host buffers for it, or one region",
                        fn, comm->regions.nregions);
        return ncclInvalidUsage;
    }
    if ((op->type == GEO_OP_ALLREDUCE || op->type == GEO_OP_REDUCE ||
         op->type == GEO_OP_REDUCESCATTER) && op->op >= ncclNumOps) {
        geoCommSetError(comm, "%s: PreMulSum ops on device buffers across regions are not "
                        "supported by this release; use ncclAvg or scale before the call", fn);
        return ncclInvalidUsage;
    }
    if (op->type == GEO_OP_ALLREDUCE &&
        (!geoDevIsDevicePtr(op->sendbuff) || !geoDevIsDevicePtr(op->recvbuff))) {
        geoCommSetError(comm, "%s: one buffer is device memory and the other is not; across "
                        "regions both must be device memory", fn);
        return ncclInvalidUsage;
    }
    if (geoNcclRealGroupIsOpen() || geoGroupActive()) {
        geoCommSetError(comm, "%s: a cross-region device collective inside "
                        "ncclGroupStart/End is not supported by this release", fn);
        return ncclInvalidUsage;
    }
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(op->stream, &cs) != cudaSuccess) {
        cudaGetLastError();
        geoCommSetError(comm, "%s: the stream is not a valid CUDA stream", fn);
        return ncclInvalidArgument;
    }
    if (cs != cudaStreamCaptureStatusNone) {
        geoCommSetError(comm, "%s: CUDA graph capture of a cross-region all-reduce is not "
                        "supported by this release (its host exchange cannot be captured)", fn);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* ---- pass-through -------------------------------------------------------- */

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
            geoCommSetError(comm, "%s: the real NCCL at %s has no ncclRedOpCreatePreMulSum",
                            geoErrOp(&comm->err), st->lib->path);
            return ncclInvalidUsage;
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

static ncclResult_t devPassThrough(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
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
            geoCommSetError(comm, "%s: the real NCCL at %s (version %d) lacks it", fn, L->path,
                            L->version);
            return ncclInvalidUsage;
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

/* ---- cross-region all-reduce: the exchange thread ------------------------ */

static void devSleepUs(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Raise the flag to seq (never lower it: a job that failed while it was
 * being enqueued raises it past its own values at once). */
static void devFlagRelease(struct geoDevState *st, uint32_t seq)
{
    uint32_t cur = __atomic_load_n(st->flag, __ATOMIC_ACQUIRE);
    while ((int32_t)(seq - cur) > 0 &&
           !__atomic_compare_exchange_n(st->flag, &cur, seq, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_ACQUIRE))
        ;
}

/* Wait for a point of the stream (an event): deadline and abort flag. */
static ncclResult_t devWaitEvent(struct ncclComm *comm, struct geoDevState *st, cudaEvent_t ev,
                                 const char *what)
{
    double t0 = geoNow();
    long backoff = 1;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return ncclSuccess;
        if (e != cudaErrorNotReady) {
            char buf[96];
            cudaGetLastError();
            snprintf(buf, sizeof(buf), "waiting for %s", what);
            return devCudaError(comm, buf, e);
        }
        if (geoErrAborted(&comm->err) || __atomic_load_n(&st->aborting, __ATOMIC_ACQUIRE)) {
            geoCommSetError(comm, "%s: aborted", geoErrOp(&comm->err));
            return ncclInvalidUsage;
        }
        if (geoNow() - t0 > comm->timeout) {
            geoCommSetError(comm, "%s: the stream did not reach %s within GEOCCL_TIMEOUT=%.0f s",
                            geoErrOp(&comm->err), what, comm->timeout);
            return ncclSystemError;
        }
        devSleepUs(backoff);
        if (backoff < 200)
            backoff *= 2;
    }
}

struct devCodecJob;
static ncclResult_t devCodecExchange(struct ncclComm *comm, struct geoDevState *st, devJob *j);
static void devCodecJobFree(struct devCodecJob *cj);
static int devCodecEnqueueDone(struct devCodecJob *cj);

static void *exchange_main(void *arg)
{
    struct ncclComm *comm = arg;
    struct geoDevState *st = comm->dev;
    geoDebugSetRank(comm->rank);
    if (comm->cuda_dev >= 0)
        cudaSetDevice(comm->cuda_dev);
    pthread_mutex_lock(&st->lock);
    for (;;) {
        while (st->head == NULL && !st->stop)
            pthread_cond_wait(&st->cv, &st->lock);
        if (st->head == NULL && st->stop)
            break;
        devJob *j = st->head;
        st->head = j->next;
        if (st->head == NULL)
            st->tail = NULL;
        pthread_mutex_unlock(&st->lock);

        ncclResult_t res = geoCommAsyncError(comm);
        if (res == ncclSuccess) {
            geoErrSetOp(&comm->err, "AllReduce #%llu (%zu elements, "
                        "device)", (unsigned long long)j->op_seq, j->op.count);
            if (j->staged) {
                geoErrSetOp(&comm->err, "%s #%llu (%zu elements, "
                            "device, staged)", geoOpTypeName(j->op.type),
                            (unsigned long long)j->op_seq, j->op.count);
                res = devWaitEvent(comm, st, j->slot->ready, "the staged input");
                if (res == ncclSuccess) {
                    geoOp hop = j->op;
                    hop.sendbuff = j->slot->host;
                    hop.recvbuff = j->slot->host + j->rat;
                    hop.device = 0;
                    hop.stream = NULL;
                    res = geoCollRun(&hop);
                }
            } else if (j->codec_job) {
                res = devCodecExchange(comm, st, j);
                comm->stats.calls_hier++;
            } else {
                res = devWaitEvent(comm, st, j->slot->ready, "the reduce-scatter's shard");
                if (res == ncclSuccess) {
                    comm->call_codec = j->codec; /* the plan's (or the user's) */
                    res = geoHierExchange(comm, &j->op, j->slot->host, j->off);
                    comm->stats.calls_hier++;
                }
            }
            if (res != ncclSuccess) {
                geoWarn(GEO_LOG_CUDA, "%s", geoErrLast(&comm->err));
                geoCommFail(comm, res);
            }
        }
        devFlagRelease(st, j->seq); /* also after a failure: the stream goes on */
        /* The user thread may still be enqueuing the job; with every wait
         * released it cannot block for long.  If it still has not finished
         * after GEOCCL_TIMEOUT (a wedged device), the job is left to it:
         * leaked, never freed under it. */
        double t_enq = geoNow();
        while (j->codec_job && !devCodecEnqueueDone(j->codec_job)) {
            if (geoNow() - t_enq > comm->timeout) {
                geoWarn(GEO_LOG_CUDA, "%s: the calling thread did not finish enqueuing within "
                        "GEOCCL_TIMEOUT=%.0f s; its job is not freed", geoErrOp(&comm->err),
                        comm->timeout);
                j->codec_job = NULL;
                break;
            }
            devSleepUs(50);
        }
        pthread_mutex_lock(&st->lock);
        j->slot->exchanged = 1;
        st->pending--;
        devCodecJobFree(j->codec_job);
        free(j);
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->lock);
    return NULL;
}


/* ---- cross-region all-reduce, encoded on the GPU -------------------------
 *
 * When a float32 call is compressed with a codec the GPU implements (every
 * codec but lossless), or is an uncompressed float32 sum or average (codec
 * none: a chunk is a copy with a header), the shard does not go to the
 * host whole (GEOCCL_CUDA_CODECS=0 turns this off): the stream encodes it
 * with the kernels of cuda/ (error feedback residuals in device memory),
 * copies only the chunks to pinned memory, and the exchange thread moves
 * them.  The messages are those of
 * the host exchange (geoHierExchangePlan), each cut in sub-chunks of E
 * elements; sub-chunk c of every message forms round c.  GPU chunks have
 * exact sizes, so every buffer is laid out before anything runs, the same
 * offsets in device and host staging, a round's chunks of one kind
 * contiguous (one copy each way).
 *
 * On the user's stream, in this order:
 *   NCCL reduce-scatter into my shard
 *   for each round c: encode its first-trip sub-chunks (residual of trip
 *       1), copy them to the host, record tx1[c]
 *   for each round c: wait until flag >= base + 1 + c (round c of the other
 *       regions' partials is on the host), copy it in, decode-accumulate
 *       each onto my region's partial of my part (the other regions in
 *       ascending order), divide (avg),
 *       encode the finished part (residual of trip 2), decode that chunk
 *       back into my part (so every region holds the very same bits),
 *       copy the chunks out, record tx2[c]
 *   for each round c: wait until flag >= base + 1 + C + c, copy the other
 *       regions' finished parts in, decode them into place
 *   copy the decoders' status words out, record end, free the device
 *   staging (stream-ordered)
 *   NCCL all-gather
 * The exchange thread runs one fixed schedule that every rank shares, so
 * each peer pair posts its messages in the same order (transport.h):
 *   it = 0 .. C + D - 1:
 *     it < C:  wait tx1[it]; post round it's first-trip sends and receives
 *     it >= D: r = it - D: wait round r's first-trip receives, release the
 *              stream (flag = base + 1 + r), wait tx2[r], post round r's
 *              return-trip sends and receives
 *   then, round by round: wait the return trip, release the stream
 *   then: wait end, read the status words: a corrupt chunk fails the
 *   communicator (ncclCommGetAsyncError), as a failed kernel does in NCCL.
 * The WAN carries round c while the GPU encodes round c + 1, and the return
 * trip of round r overlaps the first trip of the rounds after it.  Kernels
 * and copies share the user's stream; beside a WAN transfer they are short.
 *
 * The job is queued to the exchange thread before its stream program is
 * enqueued: the user thread may block on a full launch queue behind a wait
 * that only the exchange thread releases.  An event not yet recorded reads
 * as complete, so the exchange thread first waits for the user thread to
 * have recorded it (devCodecJob.recorded).  If enqueuing fails half-way,
 * the flag is raised past the job's values, so no stream waits forever,
 * the all-gather is still enqueued (region peers are in it) and the
 * communicator is failed.
 *
 * Numbers: the sum starts from my region's partial (the host path sums in
 * region order), and codecs scale (int8, int4, sign) and select (topk) per
 * sub-chunk of E elements rather than per message, so the GPU and host
 * paths may differ in the last bits; every rank still ends bit-identical.
 * Both sides of a pair must take the same path: GEOCCL_CUDA_CODECS must be
 * the same on every rank (a mismatch shows as chunks of unexpected size).
 */

#define CODEC_PIPELINE_DEPTH 2

typedef struct {
    int peer;
    int msg;                /* index in the plan's list */
    size_t off, n;          /* elements of the call's buffer */
    size_t at, len;         /* the chunk: byte offset in the staging, bytes */
    int status;             /* index of its decoder's status word, or -1 */
    geoNetRequest req;
    int posted;
} devCodecChunk;

typedef struct {
    devCodecChunk *m;
    int n;
    int *first;             /* round c: m[first[c] .. first[c + 1]) */
} devCodecRounds;

typedef struct devCodecJob {
    geoXPlan plan;
    geoHierCodecChoice ch;
    size_t E;               /* elements per sub-chunk */
    int rounds;
    devCodecRounds tx1, rx1, tx2, rx2;
    size_t status_at;       /* status words (int) at this byte offset */
    int nstatus;
    size_t bytes;           /* staging bytes, device and host alike */
    size_t scratch_at, scratch_bytes;
    char *dbuf;             /* device staging (stream-ordered allocation) */
    char *host;             /* pinned staging (the job's slot) */
    cudaEvent_t *ev;        /* tx1[c] = ev[c], tx2[c] = ev[C + c], end = ev[2C] */
    int nev;
    uint32_t base;          /* the stream waits for base + 1 .. base + 2C */
    /* The job is queued before its stream program is enqueued (the user
     * thread could otherwise block on a full launch queue behind a wait
     * only the exchange thread can release): events up to recorded - 1 are
     * recorded; failed: enqueuing failed; enq_done: the user thread is
     * finished with the job (the exchange thread frees it only then). */
    int recorded, failed, enq_done;
} devCodecJob;

static int devCodecEnqueueDone(devCodecJob *cj)
{
    return __atomic_load_n(&cj->enq_done, __ATOMIC_ACQUIRE);
}

static size_t devStageAlign(size_t x) { return (x + 255) & ~(size_t)255; }

static void free_rounds(devCodecRounds *l)
{
    free(l->m);
    free(l->first);
    memset(l, 0, sizeof(*l));
}

static void devCodecJobFree(devCodecJob *cj)
{
    if (cj == NULL)
        return;
    geoHierExchangePlanFree(&cj->plan);
    free_rounds(&cj->tx1);
    free_rounds(&cj->rx1);
    free_rounds(&cj->tx2);
    free_rounds(&cj->rx2);
    for (int i = 0; i < cj->nev; i++)
        cudaEventDestroy(cj->ev[i]); /* pending ones are released when done */
    free(cj->ev);
    free(cj);
}

/* The sub-chunks of msgs, round-major, their chunks laid out from *at.
 * group > 1: messages come in runs of group that carry one chunk (the
 * return trip sends a part to each other region): only the first of a run
 * gets room. */
static ncclResult_t lay_out_rounds(devCodecRounds *l, const geoXMsg *msgs, int nmsgs, int rounds,
                                   size_t E, int codec, const geoCodecParams *p, int group,
                                   size_t *at, int *nstatus)
{
    size_t cnt = 0;
    for (int i = 0; i < nmsgs; i++)
        cnt += (msgs[i].n + E - 1) / E;
    l->m = calloc(cnt + 1, sizeof(devCodecChunk));
    l->first = calloc((size_t)rounds + 1, sizeof(int));
    if (l->m == NULL || l->first == NULL)
        return ncclSystemError;
    int k = 0;
    for (int c = 0; c < rounds; c++) {
        l->first[c] = k;
        for (int i = 0; i < nmsgs; i++) {
            size_t o = (size_t)c * E;
            if (o >= msgs[i].n)
                continue;
            devCodecChunk *x = &l->m[k++];
            x->peer = msgs[i].peer;
            x->msg = i;
            x->off = msgs[i].off + o;
            x->n = msgs[i].n - o < E ? msgs[i].n - o : E;
            x->status = nstatus ? (*nstatus)++ : -1;
            if (group > 1 && i % group != 0) {
                /* the run's first message is the one before (same n) */
                x->at = l->m[k - 2].at;
                x->len = l->m[k - 2].len;
                continue;
            }
            x->len = geoCudaCodecEncodedSize((geoCodecId)codec, x->n, ncclFloat32, p);
            if (x->len == 0)
                return ncclInvalidArgument;
            x->at = *at;
            *at = devStageAlign(*at + x->len);
        }
    }
    l->first[rounds] = k;
    l->n = k;
    return ncclSuccess;
}

/* Lay out one job: sub-chunks, staging offsets, status words, events. */
static ncclResult_t devCodecPrepare(struct ncclComm *comm, const geoOp *op,
                                    const geoHierCodecChoice *ch, size_t chunk, devCodecJob **out)
{
    devCodecJob *cj = calloc(1, sizeof(*cj));
    ncclResult_t r;
    *out = NULL;
    if (cj == NULL)
        goto oom;
    cj->ch = *ch;
    GEO_CHECK_GOTO(geoHierExchangePlan(comm, op->count, &cj->plan), r, fail);
    cj->E = (chunk ? chunk : comm->hier_slice) / sizeof(float);
    if (cj->E < 1024)
        cj->E = 1024;
    const geoXMsg *lists[4] = {cj->plan.tx1, cj->plan.rx1, cj->plan.tx2, cj->plan.rx2};
    const int ns[4] = {cj->plan.ntx1, cj->plan.nrx1, cj->plan.ntx2, cj->plan.nrx2};
    size_t maxn = 0;
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < ns[l]; i++)
            if (lists[l][i].n > maxn)
                maxn = lists[l][i].n;
    cj->rounds = (int)((maxn + cj->E - 1) / cj->E);
    if (cj->rounds == 0) {
        *out = cj; /* nothing crosses the WAN from or to this rank */
        return ncclSuccess;
    }
    const int k1 = comm->regions.nregions - 1;
    size_t at = 0;
    if ((r = lay_out_rounds(&cj->tx1, cj->plan.tx1, cj->plan.ntx1, cj->rounds, cj->E, ch->codec,
                            &ch->p1, 1, &at, NULL)) != ncclSuccess ||
        (r = lay_out_rounds(&cj->rx1, cj->plan.rx1, cj->plan.nrx1, cj->rounds, cj->E, ch->codec,
                            &ch->p1, 1, &at, &cj->nstatus)) != ncclSuccess ||
        (r = lay_out_rounds(&cj->tx2, cj->plan.tx2, cj->plan.ntx2, cj->rounds, cj->E, ch->codec,
                            &ch->p2, k1, &at, &cj->nstatus)) != ncclSuccess ||
        (r = lay_out_rounds(&cj->rx2, cj->plan.rx2, cj->plan.nrx2, cj->rounds, cj->E, ch->codec,
                            &ch->p2, 1, &at, &cj->nstatus)) != ncclSuccess) {
        if (r == ncclSystemError)
            goto oom;
        geoCommSetError(comm, "the GPU codec cannot encode these chunks (codec parameters); "
                        "the host codecs encode them");
        goto fail;
    }
    size_t s1 = geoCudaCodecScratchBytes((geoCodecId)ch->codec, cj->E, &ch->p1);
    size_t s2 = geoCudaCodecScratchBytes((geoCodecId)ch->codec, cj->E, &ch->p2);
    cj->scratch_bytes = s1 > s2 ? s1 : s2;
    cj->scratch_at = at;
    at = devStageAlign(at + cj->scratch_bytes);
    cj->status_at = at;
    cj->bytes = at + (size_t)cj->nstatus * sizeof(int) + 1;
    cj->nev = 2 * cj->rounds + 1;
    cj->ev = calloc((size_t)cj->nev, sizeof(cudaEvent_t));
    if (cj->ev == NULL)
        goto oom;
    for (int i = 0; i < cj->nev; i++) {
        cudaError_t e = cudaEventCreateWithFlags(&cj->ev[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            cj->nev = i;
            r = devCudaError(comm, "cudaEventCreate", e);
            goto fail;
        }
    }
    *out = cj;
    return ncclSuccess;
oom:
    geoCommSetError(comm, "%s: out of memory laying out the compressed exchange",
                    geoErrOp(&comm->err));
    r = ncclSystemError;
fail:
    if (r == ncclSuccess)
        r = ncclInternalError;
    devCodecJobFree(cj);
    return r;
}

/* Make the stream wait until the flag reaches value. */
static ncclResult_t devStreamWait(struct ncclComm *comm, struct geoDevState *st, cudaStream_t s,
                                  uint32_t value)
{
    CUresult cr = CUDA_ERROR_NOT_SUPPORTED;
    if (st->wait_value)
        cr = st->wait_value((CUstream)s, (CUdeviceptr)(uintptr_t)st->dflag, value,
                            CU_STREAM_WAIT_VALUE_GEQ);
    if (cr == CUDA_SUCCESS)
        return ncclSuccess;
    if (st->wait_value) {
        geoInfo(GEO_LOG_CUDA, "cuStreamWaitValue32 failed (%d): falling back to a polling "
                "kernel", (int)cr);
        st->wait_value = NULL;
    }
    /* Not a host function that polls: CUDA may run every host function of
     * the context on one thread, so one job's wait held there would keep
     * an earlier job's wait (on another stream) from ever running, while
     * the exchange thread needs that earlier job's stream to go on first:
     * a deadlock.  The kernel holds one warp, no thread of CUDA's. */
    const char *why = NULL;
    ncclResult_t r = geoCudaWaitFlag((const uint32_t *)st->dflag, value, (struct CUstream_st *)s,
                                     &why);
    if (r != ncclSuccess) {
        geoCommSetError(comm, "%s: the kernel that waits for the exchange failed to launch: %s",
                        geoErrOp(&comm->err), why ? why : "no detail");
        return r;
    }
    return ncclSuccess;
}

/* One copy of the chunks of l's round c between device and host staging. */
static ncclResult_t copy_round(struct ncclComm *comm, devCodecJob *cj, const devCodecRounds *l,
                               int c, int d2h, cudaStream_t s)
{
    int a = l->first[c], b = l->first[c + 1];
    if (a == b)
        return ncclSuccess;
    size_t lo = l->m[a].at, hi = l->m[b - 1].at + l->m[b - 1].len;
    cudaError_t e = d2h ? cudaMemcpyAsync(cj->host + lo, cj->dbuf + lo, hi - lo,
                                          cudaMemcpyDeviceToHost, s)
                        : cudaMemcpyAsync(cj->dbuf + lo, cj->host + lo, hi - lo,
                                          cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess)
        return devCudaError(comm, d2h ? "copying chunks to the host" : "copying chunks to the GPU",
                            e);
    return ncclSuccess;
}

static ncclResult_t kernel_error(struct ncclComm *comm, const char *what, ncclResult_t r,
                                 const char *why)
{
    geoCommSetError(comm, "%s: %s on the GPU failed: %s", geoErrOp(&comm->err), what,
                    why ? why : "no detail");
    geoWarn(GEO_LOG_CUDA | GEO_LOG_COMPRESS, "%s", geoErrLast(&comm->err));
    return r;
}

/* Enqueue everything between the reduce-scatter and the all-gather (see
 * the section's comment).  mine: my shard on the device, elements [off,
 * off + len) of the call; ef1, ef2: its residuals or NULL. */
static ncclResult_t enqueue_program(struct ncclComm *comm, struct geoDevState *st,
                                    devCodecJob *cj, const geoOp *op, char *mine, size_t off,
                                    float *ef1, float *ef2, cudaStream_t s)
{
    const int C = cj->rounds, k1 = comm->regions.nregions - 1;
    const geoCodecId codec = (geoCodecId)cj->ch.codec;
    const size_t E = cj->E;
    int *status = (int *)(cj->dbuf + cj->status_at);
    void *scratch = cj->scratch_bytes ? cj->dbuf + cj->scratch_at : NULL;
    const char *why = NULL;
    size_t written;
    ncclResult_t r;
#define SHARD_AT(o) ((float *)(mine + ((o) - off) * sizeof(float)))

    if (cj->nstatus > 0)
        CUDA_CHECK(comm, cudaMemsetAsync(status, 0, (size_t)cj->nstatus * sizeof(int), s),
                   "clearing the decoders' status words");
    for (int c = 0; c < C; c++) {
        for (int i = cj->tx1.first[c]; i < cj->tx1.first[c + 1]; i++) {
            devCodecChunk *x = &cj->tx1.m[i];
            r = geoCudaCodecEncode(codec, SHARD_AT(x->off), x->n, ncclFloat32, &cj->ch.p1,
                                   cj->ch.counter + 2 * x->off, ef1 ? ef1 + (x->off - off) : NULL,
                                   cj->dbuf + x->at, x->len, scratch, cj->scratch_bytes, s,
                                   &written, &why);
            if (r != ncclSuccess)
                return kernel_error(comm, "encoding a partial", r, why);
        }
        GEO_CHECK(copy_round(comm, cj, &cj->tx1, c, 1, s));
        CUDA_CHECK(comm, cudaEventRecord(cj->ev[c], s), "cudaEventRecord");
        __atomic_add_fetch(&cj->recorded, 1, __ATOMIC_RELEASE);
    }
    for (int c = 0; c < C; c++) {
        GEO_CHECK(devStreamWait(comm, st, s, cj->base + 1 + (uint32_t)c));
        GEO_CHECK(copy_round(comm, cj, &cj->rx1, c, 0, s));
        int i = cj->rx1.first[c], t = cj->tx2.first[c];
        for (int p = 0; p < cj->plan.nparts; p++) {
            const geoXPart *part = &cj->plan.parts[p];
            size_t o = (size_t)c * E;
            if (o >= part->n)
                continue;
            size_t m = part->n - o < E ? part->n - o : E;
            float *dst = SHARD_AT(part->off + o);
            for (int j = 0; j < k1; j++, i++) {
                devCodecChunk *x = &cj->rx1.m[i];
                if (i >= cj->rx1.first[c + 1] || x->msg != part->first_rx + j || x->n != m) {
                    geoCommSetError(comm, "%s: internal error: the exchange plan and its "
                                    "rounds disagree", geoErrOp(&comm->err));
                    return ncclInternalError;
                }
                r = geoCudaCodecDecodeAccumulate(codec, cj->dbuf + x->at, x->len, ncclFloat32,
                                                 dst, m, status + x->status, s, &why);
                if (r != ncclSuccess)
                    return kernel_error(comm, "decoding a partial", r, why);
            }
            if (op->op == ncclAvg &&
                (r = geoCudaDivideF32(dst, m, comm->nranks, s, &why)) != ncclSuccess)
                return kernel_error(comm, "averaging", r, why);
            devCodecChunk *x = &cj->tx2.m[t];
            if (t >= cj->tx2.first[c + 1] || x->off != part->off + o || x->n != m) {
                geoCommSetError(comm, "%s: internal error: the return trip's rounds disagree "
                                "with the parts", geoErrOp(&comm->err));
                return ncclInternalError;
            }
            r = geoCudaCodecEncode(codec, dst, m, ncclFloat32, &cj->ch.p2,
                                   cj->ch.counter + 2 * x->off + 1,
                                   ef2 ? ef2 + (x->off - off) : NULL, cj->dbuf + x->at, x->len,
                                   scratch, cj->scratch_bytes, s, &written, &why);
            if (r != ncclSuccess)
                return kernel_error(comm, "encoding a reduced part", r, why);
            /* lossy: keep what every other region decodes (none: equal) */
            if (codec != GEO_CODEC_NONE &&
                (r = geoCudaCodecDecode(codec, cj->dbuf + x->at, x->len, ncclFloat32, dst, m,
                                        status + x->status, s, &why)) != ncclSuccess)
                return kernel_error(comm, "decoding our own chunk", r, why);
            t += k1;
        }
        GEO_CHECK(copy_round(comm, cj, &cj->tx2, c, 1, s));
        CUDA_CHECK(comm, cudaEventRecord(cj->ev[C + c], s), "cudaEventRecord");
        __atomic_add_fetch(&cj->recorded, 1, __ATOMIC_RELEASE);
    }
    for (int c = 0; c < C; c++) {
        GEO_CHECK(devStreamWait(comm, st, s, cj->base + 1 + (uint32_t)(C + c)));
        GEO_CHECK(copy_round(comm, cj, &cj->rx2, c, 0, s));
        for (int i = cj->rx2.first[c]; i < cj->rx2.first[c + 1]; i++) {
            devCodecChunk *x = &cj->rx2.m[i];
            r = geoCudaCodecDecode(codec, cj->dbuf + x->at, x->len, ncclFloat32, SHARD_AT(x->off),
                                   x->n, status + x->status, s, &why);
            if (r != ncclSuccess)
                return kernel_error(comm, "decoding a finished part", r, why);
        }
    }
    if (cj->nstatus > 0)
        CUDA_CHECK(comm, cudaMemcpyAsync(cj->host + cj->status_at, status,
                                         (size_t)cj->nstatus * sizeof(int),
                                         cudaMemcpyDeviceToHost, s),
                   "copying the decoders' status words");
    CUDA_CHECK(comm, cudaEventRecord(cj->ev[2 * C], s), "cudaEventRecord");
    __atomic_add_fetch(&cj->recorded, 1, __ATOMIC_RELEASE);
#undef SHARD_AT
    return ncclSuccess;
}

/* Post round c of list l (sends or receives). */
static ncclResult_t post_round(struct ncclComm *comm, devCodecJob *cj, devCodecRounds *l, int c,
                               int send)
{
    for (int i = l->first[c]; i < l->first[c + 1]; i++) {
        devCodecChunk *x = &l->m[i];
        if (send) {
            GEO_CHECK(geoNetIsendV(&comm->net, x->peer, cj->host + x->at, x->len, &x->req));
            comm->net.sent.wan_raw += x->n * sizeof(float);
        } else {
            GEO_CHECK(geoNetIrecvV(&comm->net, x->peer, cj->host + x->at, x->len, &x->req));
        }
        x->posted = 1;
    }
    return ncclSuccess;
}

/* Wait round c of l (all rounds when c < 0); receives must have the exact
 * chunk size the GPU decoder will read. */
static ncclResult_t wait_round(struct ncclComm *comm, devCodecRounds *l, int c, int recv)
{
    int a = c < 0 ? 0 : l->first[c], b = c < 0 ? l->n : l->first[c + 1];
    for (int i = a; i < b; i++) {
        devCodecChunk *x = &l->m[i];
        if (!x->posted)
            continue;
        GEO_CHECK(geoNetWait(&comm->net, &x->req));
        x->posted = 0;
        if (recv && x->req.size != x->len) {
            geoCommSetError(comm, "%s: rank %d (host %s) sent a compressed chunk of %zu bytes "
                            "where %zu were expected (are GEOCCL_COMPRESS and "
                            "GEOCCL_CUDA_CODECS the same on every rank?)", geoErrOp(&comm->err),
                            x->peer, comm->peers[x->peer].net.host, x->req.size, x->len);
            return ncclRemoteError;
        }
    }
    return ncclSuccess;
}

/* Wait for event idx of the job: first until the user thread has recorded
 * it, then until the stream has reached it. */
static ncclResult_t wait_recorded(struct ncclComm *comm, struct geoDevState *st, devCodecJob *cj,
                                  int idx, const char *what)
{
    double t0 = geoNow();
    long backoff = 1;
    while (__atomic_load_n(&cj->recorded, __ATOMIC_ACQUIRE) <= idx) {
        if (__atomic_load_n(&cj->failed, __ATOMIC_ACQUIRE)) {
            geoCommSetError(comm, "%s: enqueuing the call on the stream failed",
                            geoErrOp(&comm->err));
            return ncclUnhandledCudaError;
        }
        if (geoErrAborted(&comm->err) || __atomic_load_n(&st->aborting, __ATOMIC_ACQUIRE)) {
            geoCommSetError(comm, "%s: aborted", geoErrOp(&comm->err));
            return ncclInvalidUsage;
        }
        if (geoNow() - t0 > comm->timeout) {
            geoCommSetError(comm, "%s: the call was not enqueued within GEOCCL_TIMEOUT=%.0f s",
                            geoErrOp(&comm->err), comm->timeout);
            return ncclSystemError;
        }
        devSleepUs(backoff);
        if (backoff < 200)
            backoff *= 2;
    }
    return devWaitEvent(comm, st, cj->ev[idx], what);
}

/* The exchange thread's part of a GPU-encoded job. */
static ncclResult_t devCodecExchange(struct ncclComm *comm, struct geoDevState *st, devJob *j)
{
    devCodecJob *cj = j->codec_job;
    const int C = cj->rounds;
    ncclResult_t res = ncclSuccess;

    for (int it = 0; it < C + CODEC_PIPELINE_DEPTH; it++) {
        if (it < C) {
            GEO_CHECK_GOTO(wait_recorded(comm, st, cj, it, "the encoded partials"), res, out);
            GEO_CHECK_GOTO(post_round(comm, cj, &cj->tx1, it, 1), res, out);
            GEO_CHECK_GOTO(post_round(comm, cj, &cj->rx1, it, 0), res, out);
        }
        if (it >= CODEC_PIPELINE_DEPTH && it - CODEC_PIPELINE_DEPTH < C) {
            int r = it - CODEC_PIPELINE_DEPTH;
            GEO_CHECK_GOTO(wait_round(comm, &cj->rx1, r, 1), res, out);
            devFlagRelease(st, cj->base + 1 + (uint32_t)r);
            GEO_CHECK_GOTO(wait_recorded(comm, st, cj, C + r, "the encoded reduced parts"), res,
                           out);
            GEO_CHECK_GOTO(post_round(comm, cj, &cj->tx2, r, 1), res, out);
            GEO_CHECK_GOTO(post_round(comm, cj, &cj->rx2, r, 0), res, out);
        }
    }
    for (int r = 0; r < C; r++) {
        GEO_CHECK_GOTO(wait_round(comm, &cj->rx2, r, 1), res, out);
        devFlagRelease(st, cj->base + 1 + (uint32_t)(C + r));
    }
    GEO_CHECK_GOTO(wait_round(comm, &cj->tx1, -1, 0), res, out);
    GEO_CHECK_GOTO(wait_round(comm, &cj->tx2, -1, 0), res, out);
    GEO_CHECK_GOTO(wait_recorded(comm, st, cj, 2 * C, "the decoders"), res, out);
    const int *status = (const int *)(cj->host + cj->status_at);
    const devCodecRounds *lists[3] = {&cj->rx1, &cj->tx2, &cj->rx2};
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < lists[l]->n; i++) {
            const devCodecChunk *x = &lists[l]->m[i];
            int v = x->status >= 0 ? status[x->status] : 0;
            if (v != GEO_CUDA_DECODE_OK) {
                geoCommSetError(comm, "%s: a corrupt compressed chunk %s rank %d (host %s): %s",
                                geoErrOp(&comm->err), l == 1 ? "of ours, for" : "from", x->peer,
                                comm->peers[x->peer].net.host, geoCudaDecodeStatusString(v));
                res = ncclRemoteError;
                goto out;
            }
        }
out:
    if (res != ncclSuccess)
        geoNetBreak(&comm->net); /* posted requests must not outlive the job */
    return res;
}

/* Hand a job to the exchange thread, reserving n flag values for its
 * stream waits (base + 1 .. base + n); j->seq = base + n releases them all.
 * Returns base. */
/* Queue j for the exchange thread, which frees it once done: the caller
 * must not touch j afterwards.  Returns the sequence number before j's n
 * values; j's own (what its stream waits for) is that + n. */
static uint32_t devJobPush(struct geoDevState *st, devJob *j, uint32_t n)
{
    pthread_mutex_lock(&st->lock);
    uint32_t base = st->seq;
    st->seq += n;
    j->seq = st->seq;
    j->next = NULL;
    if (st->tail)
        st->tail->next = j;
    else
        st->head = j;
    st->tail = j;
    st->pending++;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->lock);
    return base;
}

/* Give back a slot no job took. */
static void devSlotPut(struct geoDevState *st, devSlot *slot)
{
    pthread_mutex_lock(&st->lock);
    slot->busy = 0;
    pthread_mutex_unlock(&st->lock);
}

/* Device staging is stream-ordered (cudaMallocAsync/cudaFreeAsync: nothing
 * waits), from a pool of the communicator's own whose release threshold
 * keeps everything: the device's default pool gives freed memory back to
 * the system at every synchronisation (its threshold is 0), so each call
 * would allocate from the driver again, and a trainer's caching allocator
 * (PyTorch's) would find that memory gone and come back between its
 * blocks.  The pool holds at most what the largest calls in flight at
 * once needed, and goes at ncclCommDestroy/Abort (cudaMemPoolDestroy does
 * not wait: blocks still in use are released when they are freed).  A
 * device without pools (cudaDevAttrMemoryPoolsSupported 0) uses the
 * default one, said once at INFO. */
static void devPoolSetup(struct ncclComm *comm, struct geoDevState *st)
{
    if (st->pool_checked)
        return;
    st->pool_checked = 1;
    int dev = comm->cuda_dev, ok = 0;
    if (dev < 0 && cudaGetDevice(&dev) != cudaSuccess)
        dev = 0;
    if (cudaDeviceGetAttribute(&ok, cudaDevAttrMemoryPoolsSupported, dev) == cudaSuccess && ok) {
        struct cudaMemPoolProps props;
        memset(&props, 0, sizeof(props));
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        unsigned long long keep = ~0ull;
        if (cudaMemPoolCreate(&st->pool, &props) == cudaSuccess) {
            if (cudaMemPoolSetAttribute(st->pool, cudaMemPoolAttrReleaseThreshold, &keep) ==
                cudaSuccess)
                return;
            cudaMemPoolDestroy(st->pool);
        }
    }
    cudaGetLastError();
    st->pool = NULL;
    geoInfo(GEO_LOG_CUDA, "device %d: no memory pool of the communicator's own; device staging "
            "comes from the device's default pool", dev);
}

static cudaError_t devMalloc(struct geoDevState *st, void **p, size_t bytes, cudaStream_t s)
{
    return st->pool ? cudaMallocFromPoolAsync(p, bytes, st->pool, s) : cudaMallocAsync(p, bytes, s);
}

/* Residuals of the GPU-encoded exchange live in device memory, allocated
 * and zeroed on the stream of the call that first needs them (stream-
 * ordered: nothing waits).  Calls on different streams are chained (each
 * waits for the previous call's ef_ev), so a residual evicted during a call
 * is freed on that call's stream after every earlier use.  Outside a call
 * (reset, destroy) the last call is waited for first. */
static void *dev_ef_alloc(void *ctx, size_t bytes)
{
    struct geoDevState *st = ctx;
    void *p = NULL;
    cudaStream_t s = st->ef_stream_valid ? st->ef_stream : 0;
    if (devMalloc(st, &p, bytes, s) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (cudaMemsetAsync(p, 0, bytes, s) != cudaSuccess) {
        cudaGetLastError();
        cudaFreeAsync(p, s);
        return NULL;
    }
    return p;
}

static void dev_ef_release(void *ctx, void *p, size_t bytes)
{
    struct geoDevState *st = ctx;
    (void)bytes;
    if (st->ef_leak)
        return;
    if (st->ef_stream_valid) {
        if (cudaFreeAsync(p, st->ef_stream) != cudaSuccess)
            cudaGetLastError();
        return;
    }
    if ((st->ef_ev != NULL && cudaEventSynchronize(st->ef_ev) != cudaSuccess) ||
        cudaFreeAsync(p, 0) != cudaSuccess)
        cudaGetLastError();
}

static ncclResult_t devCrossSetup(struct ncclComm *comm, struct geoDevState *st)
{
    devPoolSetup(comm, st);
    if (st->flag == NULL) {
        void *h = NULL;
        CUDA_CHECK(comm, cudaHostAlloc(&h, 64, cudaHostAllocMapped | cudaHostAllocPortable),
                   "cudaHostAlloc of the exchange flag");
        memset(h, 0, 64);
        st->flag = h;
        cudaError_t e = cudaHostGetDevicePointer(&st->dflag, h, 0);
        if (e != cudaSuccess) {
            cudaFreeHost(h);
            st->flag = NULL;
            return devCudaError(comm, "cudaHostGetDevicePointer of the exchange flag", e);
        }
    }
    if (!st->wait_value_checked) {
        void *fn = NULL;
        enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        st->wait_value_checked = 1;
#if CUDART_VERSION >= 12050
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000,
                                                         cudaEnableDefault, &q);
#else
        cudaError_t e = cudaGetDriverEntryPoint("cuStreamWaitValue32", &fn, cudaEnableDefault,
                                                &q);
#endif
        if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && fn != NULL)
            st->wait_value = (waitValueFn)fn;
        else
            cudaGetLastError();
        geoInfo(GEO_LOG_CUDA, "cross-region device all-reduce: the stream waits with %s",
                st->wait_value ? "cuStreamWaitValue32" : "a polling kernel");
    }
    if (!st->ef_ready) {
        const geoEfAllocator dev_alloc = {.allocZeroed = dev_ef_alloc,
                                          .release = dev_ef_release, .ctx = st};
        if (geoEfInit(&st->ef, comm->ef.maxBytes, &dev_alloc) != ncclSuccess) {
            geoCommSetError(comm, "%s: cannot set up the device error-feedback store",
                            geoErrOp(&comm->err));
            return ncclInternalError;
        }
        st->ef_ready = 1;
    }
    if (!st->thread_live) {
        if (pthread_create(&st->thread, NULL, exchange_main, comm) != 0) {
            geoCommSetError(comm, "%s: cannot start the exchange thread", geoErrOp(&comm->err));
            return ncclSystemError;
        }
        st->thread_live = 1;
    }
    return ncclSuccess;
}

/* Staging capacity for a request of bytes: a power of two of at least
 * 64 KiB, so that a slot grows a few times at most as call sizes rise and
 * serves every smaller call afterwards. */
static size_t slot_cap_for(size_t bytes)
{
    size_t c = (size_t)64 << 10;
    while (c < bytes && c < ((size_t)1 << (sizeof(size_t) * 8 - 2)))
        c <<= 1;
    return c < bytes ? bytes : c;
}

/* A free staging slot of at least bytes (user thread).  Chooses, in this
 * order: the smallest free slot that is large enough; a new slot while
 * there are fewer than GEO_DEV_MAX_SLOTS; the largest free slot, grown.
 * Pinning happens only for a new or a grown slot, never a cudaFreeHost:
 * a grown slot's old buffer is kept (st->retired) until destroy.  Bound:
 * the retired buffers of a slot are powers of two below its capacity, so
 * they hold less than the slot itself. */
static ncclResult_t devSlotGet(struct ncclComm *comm, struct geoDevState *st, size_t bytes,
                               devSlot **out)
{
    double t0 = geoNow();
    for (;;) {
        devSlot *pick = NULL, *largest = NULL;
        pthread_mutex_lock(&st->lock);
        for (int i = 0; i < st->nslots; i++) {
            devSlot *s = &st->slots[i];
            if (s->busy && s->exchanged && cudaEventQuery(s->done) == cudaSuccess)
                s->busy = 0;
            if (s->busy)
                continue;
            if (s->cap >= bytes && (pick == NULL || s->cap < pick->cap))
                pick = s;
            if (largest == NULL || s->cap > largest->cap)
                largest = s;
        }
        if (pick == NULL && st->nslots < GEO_DEV_MAX_SLOTS) {
            pick = &st->slots[st->nslots];
            memset(pick, 0, sizeof(*pick));
            if (cudaEventCreateWithFlags(&pick->ready, cudaEventDisableTiming) != cudaSuccess ||
                cudaEventCreateWithFlags(&pick->done, cudaEventDisableTiming) != cudaSuccess) {
                pthread_mutex_unlock(&st->lock);
                cudaGetLastError();
                geoCommSetError(comm, "%s: cudaEventCreate failed", geoErrOp(&comm->err));
                return ncclUnhandledCudaError;
            }
            st->nslots++;
        }
        if (pick == NULL)
            pick = largest;
        if (pick)
            pick->busy = 1;
        pthread_mutex_unlock(&st->lock);
        if (pick) {
            if (pick->cap < bytes) {
                size_t cap = slot_cap_for(bytes);
                void *h = NULL;
                devRetired *old = pick->host ? malloc(sizeof(*old)) : NULL;
                cudaError_t e = pick->host && old == NULL
                                    ? cudaErrorMemoryAllocation
                                    : cudaHostAlloc(&h, cap, cudaHostAllocPortable);
                if (e != cudaSuccess) {
                    free(old);
                    devSlotPut(st, pick);
                    return devCudaError(comm, "cudaHostAlloc of a staging buffer", e);
                }
                if (old) {
                    old->host = pick->host;
                    old->bytes = pick->cap;
                    pthread_mutex_lock(&st->lock);
                    old->next = st->retired;
                    st->retired = old;
                    pthread_mutex_unlock(&st->lock);
                }
                pick->host = h;
                pick->cap = cap;
            }
            pick->exchanged = 0;
            *out = pick;
            return ncclSuccess;
        }
        if (geoNow() - t0 > comm->timeout) {
            geoCommSetError(comm, "%s: %d cross-region device all-reduces are in flight and "
                            "none finished within GEOCCL_TIMEOUT", geoErrOp(&comm->err),
                            GEO_DEV_MAX_SLOTS);
            return ncclSystemError;
        }
        devSleepUs(100);
    }
}

/* Flag values only grow, and cuStreamWaitValue32 compares without wrap:
 * long before 2^32, once every job is done and every stream has passed
 * its waits (each slot's done event comes after its job's last wait), the
 * flag and the sequence start again from 0.  User thread. */
#define GEO_FLAG_REWIND (1u << 31)
static ncclResult_t devFlagRewind(struct ncclComm *comm, struct geoDevState *st, uint32_t need)
{
    if (st->seq + need < GEO_FLAG_REWIND)
        return ncclSuccess;
    GEO_CHECK(geoDevDrain(comm));
    for (int i = 0; i < st->nslots; i++) {
        cudaError_t e;
        if (st->slots[i].busy && (e = cudaEventSynchronize(st->slots[i].done)) != cudaSuccess)
            return devCudaError(comm, "waiting for the streams before rewinding the flag", e);
    }
    pthread_mutex_lock(&st->lock);
    st->seq = 0;
    __atomic_store_n(st->flag, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&st->lock);
    geoInfo(GEO_LOG_CUDA, "cross-region device all-reduce: exchange flag rewound to 0");
    return ncclSuccess;
}

/* The residuals of my shard (those the policy keeps), from the device
 * store.  Evicted ones are freed on the stream after every earlier job
 * (see dev_ef_release). */
static void shard_residuals(struct ncclComm *comm, struct geoDevState *st, const geoOp *op,
                            const geoHierCodecChoice *ch, size_t off, size_t len, float **ef1,
                            float **ef2)
{
    /* keyed by the buffer's registration and my shard's address: (buffer,
     * shard) names a bucket of it */
    const char *key = (const char *)op->recvbuff + off * sizeof(float);
    size_t evicted = 0;
    ncclResult_t r1 = ncclSuccess, r2 = ncclSuccess;
    *ef1 = *ef2 = NULL;
    if (len == 0 || (!ch->ef1 && !ch->ef2))
        return;
    if (op->ef_key == 0) {
        geoEfNoteUnregistered(comm, op->recvbuff);
        return;
    }
    st->ef_stream = op->stream;
    st->ef_stream_valid = 1;
    geoEfBeginOp(&st->ef);
    if (ch->ef1)
        r1 = geoEfGet(&st->ef, op->ef_key, key, len, 1, ef1, &evicted);
    if (ch->ef2 && r1 == ncclSuccess)
        r2 = geoEfGet(&st->ef, op->ef_key, key, len, 2, ef2, &evicted);
    st->ef_stream_valid = 0;
    if (r1 != ncclSuccess || r2 != ncclSuccess) {
        *ef1 = *ef2 = NULL;
        if (!comm->ef_full_noted) {
            comm->ef_full_noted = 1;
            geoInfo(GEO_LOG_COMPRESS, "error feedback: no device residual for a %zu-element "
                    "shard (%s; GEOCCL_EF_MAX_BYTES=%zu per store); it is compressed without "
                    "error feedback", len,
                    (r1 == ncclSystemError || r2 == ncclSystemError) ? "out of device memory"
                                                                     : "over the bound",
                    st->ef.maxBytes);
        }
    }
    if (geoEfTakeEvictionNotice(&st->ef))
        geoInfo(GEO_LOG_COMPRESS, "error feedback (device): GEOCCL_EF_MAX_BYTES=%zu reached; "
                "least recently used residuals are dropped (%llu so far)", st->ef.maxBytes,
                (unsigned long long)st->ef.evictions);
}

/* The cross-region all-reduce with the GPU codecs (see "encoded on the
 * GPU" above); cj is laid out (devCodecPrepare) and becomes the job's. */
static ncclResult_t devCodecAllReduce(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
                                      devCodecJob *cj)
{
    const geoNcclRealLib *L = st->lib;
    const int n = comm->region_ring.n, me = comm->region_ring.me;
    const size_t es = sizeof(float), count = op->count;
    const size_t shard = (count + (size_t)n - 1) / (size_t)n;
    const uint32_t nvals = 2 * (uint32_t)cj->rounds;
    size_t off, len;
    cudaStream_t s = op->stream;
    ncclResult_t r = ncclSuccess, ag;
    cudaError_t ce;
    char *tmp = NULL, *work;
    const char *send;
    float *ef1 = NULL, *ef2 = NULL;
    devSlot *slot = NULL;
    devJob *j = NULL;

    geoSegPadded(count, n, me, &off, &len);
    /* Everything that can fail alone comes before the reduce-scatter, so
     * that a failure leaves no region peer waiting in NCCL. */
    if (cj->rounds > 0) {
        GEO_CHECK_GOTO(devFlagRewind(comm, st, nvals), r, fail);
        GEO_CHECK_GOTO(devSlotGet(comm, st, cj->bytes, &slot), r, fail);
        cj->host = slot->host;
        j = calloc(1, sizeof(*j));
        if (j == NULL) {
            geoCommSetError(comm, "%s: out of memory", geoErrOp(&comm->err));
            r = ncclSystemError;
            goto fail_slot;
        }
        if ((ce = devMalloc(st, (void **)&cj->dbuf, cj->bytes, s)) != cudaSuccess) {
            cj->dbuf = NULL;
            r = devCudaError(comm, "cudaMallocAsync of the chunk staging", ce);
            goto fail_slot;
        }
    }
    /* Jobs on different streams touch the same residuals: each waits for
     * the one before. */
    if (st->ef_ev != NULL && st->last_stream != s &&
        (ce = cudaStreamWaitEvent(s, st->ef_ev, 0)) != cudaSuccess) {
        r = devCudaError(comm, "ordering after the previous call's stream", ce);
        goto fail_dbuf;
    }
    shard_residuals(comm, st, op, &cj->ch, off, len, &ef1, &ef2);
    if (count % (size_t)n == 0) {
        send = op->sendbuff;
        work = op->recvbuff;
    } else {
        /* NCCL cuts a reduce-scatter in equal shards: pad to n * shard. */
        if ((ce = devMalloc(st, (void **)&tmp, shard * (size_t)n * es, s)) != cudaSuccess) {
            tmp = NULL;
            r = devCudaError(comm, "cudaMallocAsync of the padded buffer", ce);
            goto fail_dbuf;
        }
        if ((ce = cudaMemcpyAsync(tmp, op->sendbuff, count * es, cudaMemcpyDeviceToDevice, s)) !=
                cudaSuccess ||
            (ce = cudaMemsetAsync(tmp + count * es, 0, (shard * (size_t)n - count) * es, s)) !=
                cudaSuccess) {
            r = devCudaError(comm, "padding the input", ce);
            goto fail_dbuf;
        }
        send = tmp;
        work = tmp;
    }
    char *mine = work + (size_t)me * shard * es;
    GEO_REAL_CALL(r, L, ReduceScatter, send, mine, shard, ncclFloat32, ncclSum, st->real, s);
    if (r != ncclSuccess) {
        r = devRealError(comm, L, st->real, "the intra-region reduce-scatter", r);
        goto fail_dbuf;
    }
    /* From here on a failure still enqueues the all-gather (region peers
     * are in it) and fails the communicator. */
    if (cj->rounds > 0) {
        j->op = *op;
        j->op.next = NULL;
        j->slot = slot;
        j->off = off;
        j->len = len;
        j->op_seq = comm->op_seq;
        j->codec = cj->ch.codec;
        j->codec_job = cj;
        cj->base = devJobPush(st, j, nvals);
        r = enqueue_program(comm, st, cj, op, mine, off, ef1, ef2, s);
        ce = cudaFreeAsync(cj->dbuf, s);
        if (r == ncclSuccess && ce != cudaSuccess)
            r = devCudaError(comm, "cudaFreeAsync", ce);
        ce = cudaEventRecord(slot->done, s);
        if (r == ncclSuccess && ce != cudaSuccess)
            r = devCudaError(comm, "cudaEventRecord", ce);
        if (r != ncclSuccess) {
            /* Waits of this job may be enqueued: let them (and those of
             * jobs still in flight before it, whose results are then not
             * valid either) pass; the communicator reports the failure. */
            __atomic_store_n(&cj->failed, 1, __ATOMIC_RELEASE);
            devFlagRelease(st, cj->base + nvals);
            geoCommFail(comm, r);
            if (ce != cudaSuccess) {
                /* no done event after the queued copies: never reuse it */
                pthread_mutex_lock(&st->lock);
                slot->cap = 0;
                slot->host = NULL; /* leaked on purpose: copies may still land */
                pthread_mutex_unlock(&st->lock);
            }
        }
        __atomic_store_n(&cj->enq_done, 1, __ATOMIC_RELEASE); /* cj is the thread's now */
    } else {
        devCodecJobFree(cj); /* nothing of mine crosses the WAN */
    }
    if (st->ef_ev != NULL || cudaEventCreateWithFlags(&st->ef_ev, cudaEventDisableTiming) ==
                                 cudaSuccess) {
        if (cudaEventRecord(st->ef_ev, s) == cudaSuccess)
            st->last_stream = s;
        else
            cudaGetLastError();
    } else {
        cudaGetLastError();
        st->ef_ev = NULL;
    }
    GEO_REAL_CALL(ag, L, AllGather, mine, work, shard, ncclFloat32, st->real, s);
    if (ag != ncclSuccess && r == ncclSuccess)
        r = devRealError(comm, L, st->real, "the intra-region all-gather", ag);
    if (tmp) {
        if ((ce = cudaMemcpyAsync(op->recvbuff, tmp, count * es, cudaMemcpyDeviceToDevice, s)) !=
                cudaSuccess &&
            r == ncclSuccess)
            r = devCudaError(comm, "copying the result out of the padded buffer", ce);
        cudaFreeAsync(tmp, s);
    }
    return r;

fail_dbuf:
    if (cj->dbuf)
        cudaFreeAsync(cj->dbuf, s);
fail_slot:
    free(j);
    if (slot)
        devSlotPut(st, slot);
fail:
    if (tmp)
        cudaFreeAsync(tmp, s);
    devCodecJobFree(cj);
    return r;
}

static ncclResult_t devCrossAllReduce(struct ncclComm *comm, struct geoDevState *st, geoOp *op)
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
            return devCodecAllReduce(comm, st, op, cj);
        if (r != ncclInvalidArgument)
            return r;
        /* The GPU codec refuses these parameters: the host codecs serve. */
        geoInfo(GEO_LOG_CUDA | GEO_LOG_COMPRESS, "%s: %s", geoErrOp(&comm->err),
                geoErrLast(&comm->err));
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
    GEO_REAL_CALL(r, L, ReduceScatter, send, mine, shard, op->dt, rsop, st->real, s);
    if (r != ncclSuccess) {
        r = devRealError(comm, L, st->real, "the intra-region reduce-scatter", r);
        goto undo_slot;
    }
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
        geoCommSetError(comm, "%s: out of memory", geoErrOp(&comm->err));
        r = ncclSystemError;
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
    /* From here the job belongs to the exchange thread, which frees it
     * when done: never touch it again, keep only its sequence number. */
    uint32_t jseq = devJobPush(st, j, 1) + 1;
    j = NULL;

    /* The job is queued: the stream must wait for it whatever happens, or
     * the exchange thread would write into a slot reused by a later call. */
    GEO_CHECK(devStreamWait(comm, st, s, jseq));
    if (len > 0)
        CUDA_CHECK(comm, cudaMemcpyAsync(mine, slot->host, len * es, cudaMemcpyHostToDevice, s),
                   "copying the exchanged shard back");
    CUDA_CHECK(comm, cudaEventRecord(slot->done, s), "cudaEventRecord");
    GEO_REAL_CALL(r, L, AllGather, mine, work, shard, op->dt, st->real, s);
    if (r != ncclSuccess)
        return devRealError(comm, L, st->real, "the intra-region all-gather", r);
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

static ncclResult_t devStagedCollective(struct ncclComm *comm, struct geoDevState *st, geoOp *op)
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
        geoCommSetError(comm, "%s: out of memory", geoErrOp(&comm->err));
        return ncclSystemError;
    }
    j->op = *op;
    j->op.next = NULL;
    j->op.seq = comm->op_seq;
    j->slot = slot;
    j->op_seq = comm->op_seq;
    j->staged = 1;
    j->sbytes = in;
    j->rat = rat;
    uint32_t jseq = devJobPush(st, j, 1) + 1; /* j is the exchange thread's now (it frees it) */
    j = NULL;
    /* queued: the stream must wait for it whatever happens */
    GEO_CHECK(devStreamWait(comm, st, s, jseq));
    if (copy_out)
        CUDA_CHECK(comm, cudaMemcpyAsync(op->recvbuff, slot->host + rat, out, cudaMemcpyDefault,
                                         s), "copying the output back");
    CUDA_CHECK(comm, cudaEventRecord(slot->done, s), "cudaEventRecord");
    return ncclSuccess;
}

/* ---- entry points -------------------------------------------------------- */

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
            geoCommSetError(comm, "%s: NVIDIA's NCCL communicator of this region was not made at "
                            "init (GEOCCL_NCCL_INIT, docs/device.md) and cannot be made during "
                            "CUDA graph capture: make one device-buffer call before capturing",
                            fn);
            return ncclInvalidUsage;
        }
    }
    GEO_CHECK(devReady(comm, fn, &st));
    comm->op_seq++;
    geoErrSetOp(&comm->err, "%s #%llu (%zu elements, device)",
                geoOpTypeName(op->type), (unsigned long long)comm->op_seq, op->count);
    if (comm->regions.nregions == 1) {
        /* NVIDIA's NCCL selects the communicator's device itself */
        if (geoGroupActive())
            GEO_CHECK(geoNcclRealGroupOpen(st->lib));
        return devPassThrough(comm, st, op, fn);
    }
    GEO_CHECK(devEnter(comm, &g));
    __atomic_add_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    r = op->type == GEO_OP_ALLREDUCE ? devCrossAllReduce(comm, st, op)
                                     : devStagedCollective(comm, st, op);
    __atomic_sub_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    devLeave(&g);
    return r;
}

ncclResult_t geoDevDrain(struct ncclComm *comm)
{
    struct geoDevState *st = comm->dev;
    double t0 = geoNow();
    if (st == NULL)
        return ncclSuccess;
    pthread_mutex_lock(&st->lock);
    while (st->pending > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&st->cv, &st->lock, &ts);
        if (st->pending > 0 && (geoErrAborted(&comm->err) || geoNow() - t0 > comm->timeout)) {
            pthread_mutex_unlock(&st->lock);
            geoCommSetError(comm, "%s: %d cross-region device all-reduces still wait for their "
                            "streams after GEOCCL_TIMEOUT=%.0f s", geoErrOp(&comm->err),
                            st->pending, comm->timeout);
            return ncclSystemError;
        }
    }
    pthread_mutex_unlock(&st->lock);
    return ncclSuccess;
}

void geoDevResetErrorFeedback(struct ncclComm *comm)
{
    struct geoDevState *st = comm->dev;
    devGuard g;
    if (st != NULL && st->ef_ready && devEnter(comm, &g) == ncclSuccess) {
        st->ef_stream_valid = 0;
        geoEfReset(&st->ef);
        devLeave(&g);
    }
}

void geoDevDropErrorFeedback(struct ncclComm *comm, uint64_t tag)
{
    struct geoDevState *st = comm->dev;
    devGuard g;
    if (st != NULL && st->ef_ready && devEnter(comm, &g) == ncclSuccess) {
        st->ef_stream_valid = 0;
        geoEfDropTag(&st->ef, tag);
        devLeave(&g);
    }
}

ncclResult_t geoDevAsyncError(struct ncclComm *comm)
{
    struct geoDevState *st = __atomic_load_n(&comm->dev, __ATOMIC_ACQUIRE);
    ncclResult_t r = ncclSuccess, a = ncclSuccess;
    geoRealComm rc = st ? __atomic_load_n(&st->real, __ATOMIC_ACQUIRE) : NULL;
    if (rc == NULL)
        return ncclSuccess; /* st->lib was set before st->real was published */
    GEO_REAL_CALL(r, st->lib, CommGetAsyncError, rc, &a);
    return r != ncclSuccess ? r : a;
}

ncclResult_t geoDevFinalize(struct ncclComm *comm)
{
    struct geoDevState *st = comm->dev;
    ncclResult_t r = ncclSuccess;
    if (st == NULL)
        return ncclSuccess;
    GEO_CHECK(geoDevDrain(comm));
    if (st->real)
        GEO_REAL_CALL(r, st->lib, CommFinalize, st->real);
    if (r != ncclSuccess && r != ncclInProgress)
        return devRealError(comm, st->lib, st->real, "ncclCommFinalize", r);
    return r;
}

void geoDevFree(struct ncclComm *comm, int abort)
{
    struct geoDevState *st = comm->dev;
    ncclResult_t r;
    devGuard g;
    if (st == NULL)
        return;
    /* Failing to select the device leaves the caller's current: the frees
     * below still work there (they are not bound to a device). */
    if (devEnter(comm, &g) != ncclSuccess)
        g.switched = 0;
    if (st->thread_live) {
        if (!abort && geoDevDrain(comm) != ncclSuccess)
            abort = 1;
        pthread_mutex_lock(&st->lock);
        st->stop = 1;
        __atomic_store_n(&st->aborting, abort, __ATOMIC_RELEASE); /* read unlocked by the waits */
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->lock);
        pthread_join(st->thread, NULL);
    }
    if (st->flag)
        devFlagRelease(st, st->seq); /* no stream may wait for a job that will not run */
    if (st->real) {
        for (int i = 0; i < GEO_MAX_REDOPS; i++)
            if (comm->redops[i].real_valid && !abort)
                geoDevRedOpDestroy(comm, i);
        if (abort)
            GEO_REAL_CALL(r, st->lib, CommAbort, st->real);
        else
            GEO_REAL_CALL(r, st->lib, CommDestroy, st->real);
        if (r != ncclSuccess)
            geoWarn(GEO_LOG_CUDA, "the real NCCL communicator's %s failed: %s",
                    abort ? "abort" : "destroy", st->lib->GetErrorString(r));
    }
    /* Destroy: cudaFreeHost waits for the whole device, so queued copies
     * into the slots and waits on the flag are finished before the memory
     * goes.  Abort must not wait: it runs when some stream is stuck (a
     * collective whose peer died; PyTorch's watchdog aborts communicators
     * one after the other exactly then), and cudaFreeHost would wait for
     * that stream, whoever owns it.  So abort frees no pinned memory: the
     * slots' buffers, the retired ones and the flag stay allocated until
     * the process ends (queued copies may still land in them, so they
     * could not be reused either).  The bound is what this communicator
     * had pinned, logged below; events are released without waiting. */
    size_t kept = 0;
    for (int i = 0; i < st->nslots; i++) {
        if (st->slots[i].host) {
            if (abort)
                kept += st->slots[i].cap;
            else
                cudaFreeHost(st->slots[i].host);
        }
        cudaEventDestroy(st->slots[i].ready);
        cudaEventDestroy(st->slots[i].done);
    }
    while (st->retired) {
        devRetired *x = st->retired;
        st->retired = x->next;
        if (abort)
            kept += x->bytes;
        else
            cudaFreeHost(x->host);
        free(x);
    }
    if (st->flag) {
        if (abort)
            kept += 64;
        else
            cudaFreeHost(st->flag);
    }
    if (kept > 0)
        geoInfo(GEO_LOG_CUDA, "ncclCommAbort: %zu bytes of pinned staging left allocated "
                "until the process ends (freeing pinned memory waits for every stream of the "
                "device, and one may be stuck)", kept);
    if (st->ef_ready) {
        st->ef_stream_valid = 0;
        if (abort) {
            /* The residuals are freed on a stream of our own once the last
             * call that used them is past (ef_ev): nothing waits here. */
            cudaStream_t fs = NULL;
            if (cudaStreamCreateWithFlags(&fs, cudaStreamNonBlocking) == cudaSuccess &&
                (st->ef_ev == NULL || cudaStreamWaitEvent(fs, st->ef_ev, 0) == cudaSuccess)) {
                st->ef_stream = fs;
                st->ef_stream_valid = 1;
            } else {
                cudaGetLastError();
                st->ef_leak = 1; /* bounded by GEOCCL_EF_MAX_BYTES */
            }
            geoEfFree(&st->ef);
            if (fs)
                cudaStreamDestroy(fs); /* returns at once; its work still runs */
        } else {
            geoEfFree(&st->ef);
        }
    }
    if (st->ef_ev)
        cudaEventDestroy(st->ef_ev);
    if (st->pool && !st->ef_leak)
        cudaMemPoolDestroy(st->pool); /* waits for nothing (see devPoolSetup) */
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->lock);
    free(st);
    comm->dev = NULL;
    devLeave(&g);
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
    geoCommSetError(comm, "%s: device buffers need a GeoCCL built with CUDA", fn);
    return ncclInvalidUsage;
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
    geoCommSetError(comm, "%s on device memory needs a GeoCCL built with CUDA", fn);
    return ncclInvalidUsage;
}
#endif
