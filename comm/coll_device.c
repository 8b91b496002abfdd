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
 * is called from a stream callback.  Where stream memory operations are
 * unavailable, a host function that only polls the flag (no CUDA call in
 * it) takes the place of cuStreamWaitValue32; it holds CUDA's callback
 * thread while it waits.
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
#include "comm/tuning.h"
#include "comm/coll_device.h"
#include "comm/checks.h"
#include "comm/comm.h"
#include "comm/group.h"
#include "comm/nccl_real.h"
#include "comm/reduce.h"

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

/* Pinned staging for one job in flight. */
typedef struct {
    char *host;
    size_t cap;
    cudaEvent_t ready;      /* the shard is on the host */
    cudaEvent_t done;       /* the result is back on the device */
    int busy;               /* a job owns it (until done completes) */
    int exchanged;          /* the exchange thread is finished with it */
} devSlot;

typedef struct devJob {
    geoOp op;               /* count, dt, op; recvbuff keys error feedback */
    devSlot *slot;
    size_t off, len;        /* my shard in elements */
    uint32_t seq;
    uint64_t op_seq;
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
    devJob *head, *tail;
    int pending;                /* jobs queued or running */
    int stop, aborting;
    pthread_t thread;
    int thread_live;
};

/* ---- small CUDA helpers -------------------------------------------------- */

static int gpu_count;
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;

static void count_gpus(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        n = 0;
        cudaGetLastError();
    }
    gpu_count = n;
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

static ncclResult_t cuda_error(struct ncclComm *comm, const char *what, cudaError_t e)
{
    geoCommSetError(comm, "%s: %s (%s)", comm->op_desc, what, cudaGetErrorString(e));
    geoWarn(GEO_LOG_CUDA, "%s", comm->last_error);
    return ncclUnhandledCudaError;
}

#define CUDA_CHECK(comm, call, what)                        \
    do {                                                    \
        cudaError_t geo_ce_ = (call);                       \
        if (geo_ce_ != cudaSuccess)                         \
            return cuda_error((comm), (what), geo_ce_);     \
    } while (0)

static ncclResult_t real_error(struct ncclComm *comm, const geoNcclRealLib *lib, geoRealComm rc,
                               const char *what, ncclResult_t r)
{
    const char *txt;
    GEO_REAL_CALL(txt, lib, GetLastError, rc);
    geoCommSetError(comm, "%s: NVIDIA's NCCL failed %s: %s (%s)", comm->op_desc, what,
                    lib->GetErrorString(r), txt && txt[0] ? txt : "no detail");
    geoWarn(GEO_LOG_CUDA, "%s", comm->last_error);
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
            comm->dev = st;
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
            s = geoNetIsend(comm, ring->ranks[i], &msg, sizeof(msg), &req[i]);
        for (int i = 1; i < n && s == ncclSuccess; i++)
            s = geoNetWait(comm, &req[i]);
        free(req);
        if (r != ncclSuccess)
            return real_error(comm, st->lib, NULL, "ncclGetUniqueId", r);
        GEO_CHECK(s);
    } else {
        geoNetRequest req;
        memset(&req, 0, sizeof(req));
        GEO_CHECK(geoNetIrecv(comm, ring->ranks[0], &msg, sizeof(msg), &req));
        GEO_CHECK(geoNetWait(comm, &req));
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
    GEO_REAL_CALL(r, st->lib, CommInitRankConfig, &st->real, n, msg.id, me, &cfg);
    if (prev >= 0 && prev != comm->cuda_dev)
        cudaSetDevice(prev);
    if (r != ncclSuccess) {
        st->real = NULL;
        return real_error(comm, st->lib, NULL, "ncclCommInitRankConfig", r);
    }
    geoInfo(GEO_LOG_INIT | GEO_LOG_CUDA, "%s: real NCCL communicator of region '%s' ready: "
            "local rank %d of %d on CUDA device %d (NCCL %d from %s)", fn,
            comm->peers[comm->rank].region[0] ? comm->peers[comm->rank].region : "default",
            me, n, comm->cuda_dev, st->lib->version, st->lib->path);
    return ncclSuccess;
}

/* The device state with a live real communicator, or an error naming the
 * missing piece. */
static ncclResult_t dev_ready(struct ncclComm *comm, const char *fn, struct geoDevState **out)
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
    GEO_CHECK(dev_ready(comm, fn, &st));
    *real = st->real;
    return ncclSuccess;
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
    if (op->type != GEO_OP_ALLREDUCE) {
        geoCommSetError(comm, "%s on device buffers across %d regions is not supported by this "
                        "release: only ncclAllReduce is; use host buffers for it, or one "
                        "region", fn, comm->regions.nregions);
        return ncclInvalidUsage;
    }
    if (op->op >= ncclNumOps) {
        geoCommSetError(comm, "%s: PreMulSum ops on device buffers across regions are not "
                        "supported by this release; use ncclAvg or scale before the call", fn);
        return ncclInvalidUsage;
    }
    if (!geoDevIsDevicePtr(op->sendbuff) || !geoDevIsDevicePtr(op->recvbuff)) {
        geoCommSetError(comm, "%s: one buffer is device memory and the other is not; across "
                        "regions both must be device memory", fn);
        return ncclInvalidUsage;
    }
    if (geoNcclRealGroupIsOpen() || geoGroupActive()) {
        geoCommSetError(comm, "%s: a cross-region device all-reduce inside "
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
                            comm->op_desc, st->lib->path);
            return ncclInvalidUsage;
        }
        void *scalar = r->residence == ncclScalarDevice ? (void *)r->ptr : (void *)r->scalar;
        GEO_REAL_CALL(res, st->lib, RedOpCreatePreMulSum, &r->real_op, scalar, r->datatype,
                      r->residence, st->real);
        if (res != ncclSuccess)
            return real_error(comm, st->lib, st->real, "ncclRedOpCreatePreMulSum", res);
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

static ncclResult_t pass_through(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
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
        return real_error(comm, L, rc, fn, r);
    return r;
}

/* ---- cross-region all-reduce: the exchange thread ------------------------ */

static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void release_flag(struct geoDevState *st, uint32_t seq)
{
    __atomic_store_n(st->flag, seq, __ATOMIC_RELEASE);
}

/* Wait for the job's shard to reach the host: deadline and abort flag. */
static ncclResult_t wait_ready(struct ncclComm *comm, struct geoDevState *st, devJob *j)
{
    double t0 = geoNow();
    long backoff = 1;
    for (;;) {
        cudaError_t e = cudaEventQuery(j->slot->ready);
        if (e == cudaSuccess)
            return ncclSuccess;
        if (e != cudaErrorNotReady) {
            cudaGetLastError();
            return cuda_error(comm, "waiting for the reduce-scatter's shard", e);
        }
        if (comm->abort_flag || st->aborting) {
            geoCommSetError(comm, "%s: aborted", comm->op_desc);
            return ncclInvalidUsage;
        }
        if (geoNow() - t0 > comm->timeout) {
            geoCommSetError(comm, "%s: the stream did not reach the all-reduce within "
                            "GEOCCL_TIMEOUT=%.0f s", comm->op_desc, comm->timeout);
            return ncclSystemError;
        }
        sleep_us(backoff);
        if (backoff < 200)
            backoff *= 2;
    }
}

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
            snprintf(comm->op_desc, sizeof(comm->op_desc), "AllReduce #%llu (%zu elements, "
                     "device)", (unsigned long long)j->op_seq, j->op.count);
            res = wait_ready(comm, st, j);
            if (res == ncclSuccess) {
                /* The codec the plan (or the user) gives this size. */
                int hier, codec;
                size_t chunk;
                geoTuningChoose(comm, GEO_OP_ALLREDUCE, j->op.count * geoTypeSize(j->op.dt),
                                &hier, &codec, &chunk);
                comm->call_codec = codec;
                res = geoHierExchange(comm, &j->op, j->slot->host, j->off);
                comm->stats.calls_hier++;
            }
            if (res != ncclSuccess) {
                geoWarn(GEO_LOG_CUDA, "%s", comm->last_error);
                geoCommFail(comm, res);
            }
        }
        pthread_mutex_lock(&st->lock);
        j->slot->exchanged = 1;
        release_flag(st, j->seq); /* also after a failure: the stream goes on */
        st->pending--;
        free(j);
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

/* The host function that replaces cuStreamWaitValue32 where stream memory
 * operations are missing.  It calls nothing from CUDA. */
typedef struct {
    volatile uint32_t *flag;
    uint32_t seq;
} hostWait;

static void CUDART_CB host_wait_flag(void *arg)
{
    hostWait *w = arg;
    long backoff = 1;
    while ((int32_t)(__atomic_load_n(w->flag, __ATOMIC_ACQUIRE) - w->seq) < 0) {
        sleep_us(backoff);
        if (backoff < 100)
            backoff *= 2;
    }
    free(w);
}

static ncclResult_t dev_setup_hier(struct ncclComm *comm, struct geoDevState *st)
{
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
            return cuda_error(comm, "cudaHostGetDevicePointer of the exchange flag", e);
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
                st->wait_value ? "cuStreamWaitValue32" : "a polling host function");
    }
    if (!st->thread_live) {
        if (pthread_create(&st->thread, NULL, exchange_main, comm) != 0) {
            geoCommSetError(comm, "%s: cannot start the exchange thread", comm->op_desc);
            return ncclSystemError;
        }
        st->thread_live = 1;
    }
    return ncclSuccess;
}

/* A free staging slot of at least bytes (user thread). */
static ncclResult_t slot_get(struct ncclComm *comm, struct geoDevState *st, size_t bytes,
                             devSlot **out)
{
    double t0 = geoNow();
    for (;;) {
        devSlot *pick = NULL;
        pthread_mutex_lock(&st->lock);
        for (int i = 0; i < st->nslots && pick == NULL; i++) {
            devSlot *s = &st->slots[i];
            if (s->busy && s->exchanged && cudaEventQuery(s->done) == cudaSuccess)
                s->busy = 0;
            if (!s->busy && (s->cap >= bytes || i == st->nslots - 1 ||
                             st->nslots == GEO_DEV_MAX_SLOTS))
                pick = s;
        }
        if (pick == NULL && st->nslots < GEO_DEV_MAX_SLOTS) {
            pick = &st->slots[st->nslots];
            memset(pick, 0, sizeof(*pick));
            if (cudaEventCreateWithFlags(&pick->ready, cudaEventDisableTiming) != cudaSuccess ||
                cudaEventCreateWithFlags(&pick->done, cudaEventDisableTiming) != cudaSuccess) {
                pthread_mutex_unlock(&st->lock);
                cudaGetLastError();
                geoCommSetError(comm, "%s: cudaEventCreate failed", comm->op_desc);
                return ncclUnhandledCudaError;
            }
            st->nslots++;
        }
        if (pick)
            pick->busy = 1;
        pthread_mutex_unlock(&st->lock);
        if (pick) {
            if (pick->cap < bytes) {
                if (pick->host)
                    cudaFreeHost(pick->host);
                pick->host = NULL;
                pick->cap = 0;
                cudaError_t e = cudaHostAlloc((void **)&pick->host, bytes, cudaHostAllocPortable);
                if (e != cudaSuccess) {
                    pick->busy = 0;
                    return cuda_error(comm, "cudaHostAlloc of a staging buffer", e);
                }
                pick->cap = bytes;
            }
            pick->exchanged = 0;
            *out = pick;
            return ncclSuccess;
        }
        if (geoNow() - t0 > comm->timeout) {
            geoCommSetError(comm, "%s: %d cross-region device all-reduces are in flight and "
                            "none finished within GEOCCL_TIMEOUT", comm->op_desc,
                            GEO_DEV_MAX_SLOTS);
            return ncclSystemError;
        }
        sleep_us(100);
    }
}

static ncclResult_t hier_allreduce(struct ncclComm *comm, struct geoDevState *st, geoOp *op)
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

    GEO_CHECK(dev_setup_hier(comm, st));
    geoSegPadded(count, n, me, &off, &len);
    if (count % (size_t)n == 0) {
        send = op->sendbuff;
        work = op->recvbuff;
    } else {
        /* NCCL cuts a reduce-scatter in equal shards: pad to n * shard. */
        CUDA_CHECK(comm, cudaMallocAsync((void **)&tmp, shard * (size_t)n * es, s),
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
    r = slot_get(comm, st, shard * es + 1, &slot);
    if (r != ncclSuccess)
        goto undo_tmp;
    GEO_REAL_CALL(r, L, ReduceScatter, send, mine, shard, op->dt, rsop, st->real, s);
    if (r != ncclSuccess) {
        r = real_error(comm, L, st->real, "the intra-region reduce-scatter", r);
        goto undo_slot;
    }
    if (len > 0 &&
        (ce = cudaMemcpyAsync(slot->host, mine, len * es, cudaMemcpyDeviceToHost, s)) !=
            cudaSuccess) {
        r = cuda_error(comm, "copying the shard to the host", ce);
        goto undo_slot;
    }
    if ((ce = cudaEventRecord(slot->ready, s)) != cudaSuccess) {
        r = cuda_error(comm, "cudaEventRecord", ce);
        goto undo_slot;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        geoCommSetError(comm, "%s: out of memory", comm->op_desc);
        r = ncclSystemError;
        goto undo_slot;
    }
    j->op = *op;
    j->op.next = NULL;
    j->slot = slot;
    j->off = off;
    j->len = len;
    j->op_seq = comm->op_seq;
    pthread_mutex_lock(&st->lock);
    j->seq = ++st->seq;
    if (st->tail)
        st->tail->next = j;
    else
        st->head = j;
    st->tail = j;
    st->pending++;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->lock);

    /* From here the job is queued: the stream must wait for it whatever
     * happens, or the exchange thread would write into a slot reused by a
     * later call. */
    CUresult cr = CUDA_ERROR_NOT_SUPPORTED;
    if (st->wait_value)
        cr = st->wait_value((CUstream)s, (CUdeviceptr)(uintptr_t)st->dflag, j->seq,
                            CU_STREAM_WAIT_VALUE_GEQ);
    if (cr != CUDA_SUCCESS) {
        if (st->wait_value) {
            geoInfo(GEO_LOG_CUDA, "cuStreamWaitValue32 failed (%d): falling back to a polling "
                    "host function", (int)cr);
            st->wait_value = NULL;
        }
        hostWait *w = malloc(sizeof(*w));
        if (w == NULL) {
            geoCommSetError(comm, "%s: out of memory", comm->op_desc);
            return ncclSystemError;
        }
        w->flag = st->flag;
        w->seq = j->seq;
        CUDA_CHECK(comm, cudaLaunchHostFunc(s, host_wait_flag, w), "cudaLaunchHostFunc");
    }
    if (len > 0)
        CUDA_CHECK(comm, cudaMemcpyAsync(mine, slot->host, len * es, cudaMemcpyHostToDevice, s),
                   "copying the exchanged shard back");
    CUDA_CHECK(comm, cudaEventRecord(slot->done, s), "cudaEventRecord");
    GEO_REAL_CALL(r, L, AllGather, mine, work, shard, op->dt, st->real, s);
    if (r != ncclSuccess)
        return real_error(comm, L, st->real, "the intra-region all-gather", r);
    if (tmp) {
        CUDA_CHECK(comm, cudaMemcpyAsync(op->recvbuff, tmp, count * es, cudaMemcpyDeviceToDevice,
                                         s), "copying the result out of the padded buffer");
        CUDA_CHECK(comm, cudaFreeAsync(tmp, s), "cudaFreeAsync");
    }
    return ncclSuccess;

undo_slot:
    pthread_mutex_lock(&st->lock);
    slot->busy = 0;
    pthread_mutex_unlock(&st->lock);
undo_tmp:
    if (tmp)
        cudaFreeAsync(tmp, s);
    return r;
}

/* ---- entry points -------------------------------------------------------- */

ncclResult_t geoDevEnqueue(geoOp *op, const char *fn)
{
    struct ncclComm *comm = op->comm;
    struct geoDevState *st;
    ncclResult_t r;

    GEO_CHECK(dev_ready(comm, fn, &st));
    comm->op_seq++;
    snprintf(comm->op_desc, sizeof(comm->op_desc), "%s #%llu (%zu elements, device)",
             geoOpTypeName(op->type), (unsigned long long)comm->op_seq, op->count);
    if (comm->regions.nregions == 1) {
        if (geoGroupActive())
            GEO_CHECK(geoNcclRealGroupOpen(st->lib));
        return pass_through(comm, st, op, fn);
    }
    __atomic_add_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    r = hier_allreduce(comm, st, op);
    __atomic_sub_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
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
        if (st->pending > 0 && (comm->abort_flag || geoNow() - t0 > comm->timeout)) {
            pthread_mutex_unlock(&st->lock);
            geoCommSetError(comm, "%s: %d cross-region device all-reduces still wait for their "
                            "streams after GEOCCL_TIMEOUT=%.0f s", comm->op_desc, st->pending,
                            comm->timeout);
            return ncclSystemError;
        }
    }
    pthread_mutex_unlock(&st->lock);
    return ncclSuccess;
}

ncclResult_t geoDevAsyncError(struct ncclComm *comm)
{
    struct geoDevState *st = comm->dev;
    ncclResult_t r = ncclSuccess, a = ncclSuccess;
    if (st == NULL || st->real == NULL)
        return ncclSuccess;
    GEO_REAL_CALL(r, st->lib, CommGetAsyncError, st->real, &a);
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
        return real_error(comm, st->lib, st->real, "ncclCommFinalize", r);
    return r;
}

void geoDevFree(struct ncclComm *comm, int abort)
{
    struct geoDevState *st = comm->dev;
    ncclResult_t r;
    if (st == NULL)
        return;
    if (st->thread_live) {
        if (!abort && geoDevDrain(comm) != ncclSuccess)
            abort = 1;
        pthread_mutex_lock(&st->lock);
        st->stop = 1;
        st->aborting = abort;
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->lock);
        pthread_join(st->thread, NULL);
    }
    if (st->flag)
        release_flag(st, st->seq); /* no stream may wait for a job that will not run */
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
    /* cudaFreeHost waits for the device: queued copies into the slots and
     * waits on the flag are finished before the memory goes. */
    for (int i = 0; i < st->nslots; i++) {
        if (st->slots[i].host)
            cudaFreeHost(st->slots[i].host);
        cudaEventDestroy(st->slots[i].ready);
        cudaEventDestroy(st->slots[i].done);
    }
    if (st->flag)
        cudaFreeHost(st->flag);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->lock);
    free(st);
    comm->dev = NULL;
}

#else /* !HAVE_CUDA: no GPU can exist, so no device buffer can reach us */

int geoDevCurrent(void) { return -1; }
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
ncclResult_t geoDevRealComm(struct ncclComm *comm, const char *fn, void **real)
{
    (void)real;
    geoCommSetError(comm, "%s on device memory needs a GeoCCL built with CUDA", fn);
    return ncclInvalidUsage;
}
#endif
