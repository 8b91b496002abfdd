/* What the files of the device layer share (comm/device/): the device
 * state of a communicator, the jobs its exchange thread runs, the layout
 * of a GPU-encoded job, and the helpers more than one file calls.  Not for
 * use outside comm/device/: coll_device.h is the layer's interface.
 * Everything here exists only in a build with CUDA. */
#ifndef GEOCCL_DEV_INTERNAL_H_
#define GEOCCL_DEV_INTERNAL_H_

#ifdef HAVE_CUDA
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "comm/base/checks.h"
#include "comm/coll/coll.h"
#include "comm/core/comm.h"
#include "comm/device/coll_device.h"
#include "comm/device/nccl_real.h"
#include "compress/ef.h"

/* Cross-region jobs in flight at once on a communicator (a slot each). */
#define GEO_DEV_MAX_SLOTS 64
/* Slots pinned when the communicator's device state is set up (with
 * NVIDIA's communicator of the region), and the staging each holds:
 * pinning synchronises the device (CUDA's implicit synchronisation), so
 * it must not happen inside a stream-ordered call, where another stream's
 * blocked host function would hold it.  Two jobs of up to 4 MiB of staging
 * each (a shard of up to 4 MiB on the host exchange) are in flight without
 * pinning; a larger call grows a slot, and that call synchronises. */
#define GEO_DEV_PREPIN_SLOTS 2
#define GEO_DEV_PREPIN_BYTES ((size_t)4 << 20)

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

/* ---- phase timing of the cross-region calls (dev_timing.c) ------------
 *
 * Each call's work on its stream is cut by timing events into intervals,
 * each of one phase; the intervals tile the call's span on the stream, so
 * the phases sum to it.  Nothing waits for the events: they are read when
 * they are complete, at the next call or when the figures are asked for. */
enum {
    DEV_PH_OTHER,   /* padding an uneven count, status words, ordering */
    DEV_PH_RS,      /* NVIDIA's reduce-scatter in the region */
    DEV_PH_ENCODE,  /* GPU encode kernels */
    DEV_PH_COPYOUT, /* device to pinned host */
    DEV_PH_WAN,     /* the stream waits for the exchange between regions */
    DEV_PH_COPYIN,  /* pinned host to device */
    DEV_PH_DECODE,  /* GPU decode, accumulate and average kernels */
    DEV_PH_AG,      /* NVIDIA's all-gather in the region */
    DEV_PH_N
};

/* One call's events (user thread), and what its exchange measured on the
 * host (exchange thread: written before host_done is set). */
typedef struct devTimedCall {
    cudaEvent_t *ev;
    unsigned char *ph;      /* ph[i]: the phase of ev[i - 1] .. ev[i] */
    int n, cap;
    int cur;                /* the phase open since ev[n - 1] */
    int bad;                /* not counted (an event failed, or the call) */
    int linked;             /* a job's exchange reports on it (user thread
                               sets it before queueing the job) */
    unsigned gen;           /* the statistics' generation it belongs to */
    double host_sec;        /* the exchange thread's time on the WAN */
    unsigned long long wan, wan_raw;
    int host_done;          /* atomic: the exchange is finished with it */
    struct devTimedCall *next;
} devTimedCall;

/* The communicator's timing: a pool of timing events, the calls not yet
 * read, and the sums (user thread only). */
typedef struct {
    cudaEvent_t *pool;
    int npool, pool_cap;
    int nev;                /* events made (bounded) */
    devTimedCall *head, *tail;
    unsigned gen;
    unsigned long long calls, untimed, inflight, wan, wan_raw;
    double sec[DEV_PH_N], call, host;
} devTiming;

typedef struct devJob {
    geoOp op;               /* count, dt, op; recvbuff keys error feedback */
    devSlot *slot;
    size_t off, len;        /* my shard in elements */
    uint32_t seq;           /* the flag value that releases all of the job */
    uint64_t op_seq;
    int codec;              /* host exchange: the codec of the call */
    struct devCodecJob *codec_job; /* GPU-encoded exchange (NULL: host exchange) */
    int staged;             /* another collective, run on host staging */
    size_t sbytes;          /* staged: the input's bytes at slot->host, the
                               output's after them (at rat) */
    size_t rat;
    devTimedCall *timing;   /* NULL: the call is not timed */
    double wan_t0, wan_t1;  /* the exchange's first data ready, last transfer
                               done (geoNow; 0: not reached) */
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
    waitValueFn wait_value;     /* NULL: the polling kernel waits */
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
     * the communicator's own (see devPoolSetup), not from the device's
     * default pool. */
    cudaMemPool_t pool;
    int pool_checked;

    devTiming timing;
};

/* ---- CUDA helpers (dev_cuda.c) ---------------------------------------- */

/* Report "op: what (CUDA's text)" on the communicator (GEO_COMM_ERR: the
 * record and one WARN line, with the file:line of the site that names what)
 * and return ncclUnhandledCudaError. */
ncclResult_t devCudaErrorAt(struct ncclComm *comm, const char *file, int line, const char *what,
                            cudaError_t e);
#define devCudaError(comm, what, e) devCudaErrorAt((comm), __FILE__, __LINE__, (what), (e))

/* Return devCudaError(comm, what, ...) when call fails. */
#define CUDA_CHECK(comm, call, what)                        \
    do {                                                    \
        cudaError_t geo_ce_ = (call);                       \
        if (geo_ce_ != cudaSuccess)                         \
            return devCudaError((comm), (what), geo_ce_);   \
    } while (0)

/* cudaEventQuery with its cudaErrorNotReady consumed: CUDA keeps a query's
 * not-ready answer as the thread's last error (it is not sticky), and the
 * launch check that follows on the thread (cudaGetLastError after the
 * kernels, cuda/kernels_internal.h) would report it as a failed launch. */
static inline cudaError_t devEventQuery(cudaEvent_t ev)
{
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady)
        (void)cudaGetLastError();
    return e;
}

/* The communicator's device made current for the duration of a call, the
 * caller's restored after it, as NCCL does: events, pinned memory and
 * stream-ordered allocations belong to the device current when they are
 * made, and the caller's thread may have another one current (PyTorch's
 * watchdog thread aborts with device 0 current). */
typedef struct {
    int prev;
    int switched;
} devGuard;

/* Make comm's device current (g remembers the caller's); ncclSuccess, or
 * the CUDA error recorded on comm. */
ncclResult_t devEnter(struct ncclComm *comm, devGuard *g);
/* Make the caller's device current again. */
void devLeave(const devGuard *g);

/* ---- NVIDIA's communicator of the region (dev_lifecycle.c) ------------ */

/* Report a failed call of NVIDIA's NCCL (what) with its last error text on
 * comm (the record and one WARN line, with the file:line of the site that
 * names what) and return r. */
ncclResult_t devRealErrorAt(struct ncclComm *comm, const char *file, int line,
                            const geoNcclRealLib *lib, geoRealComm rc, const char *what,
                            ncclResult_t r);
#define devRealError(comm, lib, rc, what, r) \
    devRealErrorAt((comm), __FILE__, __LINE__, (lib), (rc), (what), (r))
/* The device state of comm with a live real communicator (made now, a
 * collective over the region, when there is none yet), or an error naming
 * the missing piece. */
ncclResult_t devReady(struct ncclComm *comm, const char *fn, struct geoDevState **out);

/* ---- one region: NVIDIA's NCCL does it all (dev_passthrough.c) -------- */

/* Issue op on NVIDIA's communicator of the region, on op->stream. */
ncclResult_t devPassThrough(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
                            const char *fn);

/* ---- the exchange thread, its jobs and the flag (dev_exchange.c) ------ */

/* Sleep us microseconds (the back-off of the polling waits). */
void devSleepUs(long us);
/* What cross-region calls need, made once, with NVIDIA's communicator of
 * the region (devReady), outside any stream-ordered call: the device
 * memory pool, the flag, the first pinned slots, the way streams wait on
 * the flag, the device residual store and the exchange thread.  Every
 * cross-region call calls it again (then it makes nothing). */
ncclResult_t devCrossSetup(struct ncclComm *comm, struct geoDevState *st);
/* Queue j for the exchange thread, which frees it once done: the caller
 * must not touch j afterwards.  Returns the sequence number before j's n
 * flag values (base): the stream may wait for base + 1 .. base + n, and
 * j->seq = base + n releases them all. */
uint32_t devJobPush(struct geoDevState *st, devJob *j, uint32_t n);
/* Raise the flag to seq (never lower it). */
void devFlagRelease(struct geoDevState *st, uint32_t seq);
/* Rewind the flag to 0 when need more values would come near its wrap. */
ncclResult_t devFlagRewind(struct ncclComm *comm, struct geoDevState *st, uint32_t need);
/* Make stream s wait until the flag reaches value. */
ncclResult_t devStreamWait(struct ncclComm *comm, struct geoDevState *st, cudaStream_t s,
                           uint32_t value);
/* Wait (exchange thread) until the stream has passed ev: the
 * communicator's deadline and abort flag bound it. */
ncclResult_t devWaitEvent(struct ncclComm *comm, struct geoDevState *st, cudaEvent_t ev,
                          const char *what);

/* ---- staging memory and device residuals (dev_staging.c) ------------- */

/* The communicator's own device memory pool (see there why), made once. */
void devPoolSetup(struct ncclComm *comm, struct geoDevState *st);
/* A stream-ordered device allocation from that pool. */
cudaError_t devMalloc(struct geoDevState *st, void **p, size_t bytes, cudaStream_t s);
/* The store of the GPU-encoded exchange's residuals, made once. */
ncclResult_t devEfStoreSetup(struct ncclComm *comm, struct geoDevState *st);
/* A free pinned staging slot of at least bytes (user thread), waiting for
 * one within the communicator's timeout. */
ncclResult_t devSlotGet(struct ncclComm *comm, struct geoDevState *st, size_t bytes,
                        devSlot **out);
/* Give back a slot no job took. */
void devSlotPut(struct geoDevState *st, devSlot *slot);
/* Pin the first GEO_DEV_PREPIN_SLOTS slots (once; devCrossSetup). */
ncclResult_t devSlotsPrepin(struct ncclComm *comm, struct geoDevState *st);
/* Offsets in the staging buffers are on 256-byte boundaries. */
static inline size_t devStageAlign(size_t x) { return (x + 255) & ~(size_t)255; }

/* ---- the GPU-encoded exchange (dev_codec_job.c, dev_codec_stream.c) --- */

/* One sub-chunk of a message of the exchange plan: what crosses the WAN
 * in one round between this rank and peer. */
typedef struct {
    int peer;
    int msg;                /* index in the plan's list */
    size_t off, n;          /* elements of the call's buffer */
    size_t at, len;         /* the chunk: byte offset in the staging, bytes */
    int status;             /* index of its decoder's status word, or -1 */
    geoNetRequest req;
    int posted;
} devCodecChunk;

/* The sub-chunks of one list of the plan (first trip's sends, ...) by
 * round. */
typedef struct {
    devCodecChunk *m;
    int n;
    int *first;             /* round c: m[first[c] .. first[c + 1]) */
} devCodecRounds;

/* A GPU-encoded job: the plan, its sub-chunks by round, where each lies in
 * the staging, the status words of the decoders and the events the
 * exchange thread waits for. */
typedef struct devCodecJob {
    hierXferPlan plan;
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

/* 1 once the user thread is finished with cj (the exchange thread frees it
 * only then). */
static inline int devCodecEnqueueDone(devCodecJob *cj)
{
    return __atomic_load_n(&cj->enq_done, __ATOMIC_ACQUIRE);
}
/* Lay out the GPU-encoded job of op (codec ch, sub-chunks of chunk bytes):
 * ncclInvalidArgument, neither recorded nor logged, when the GPU codec
 * refuses these parameters (no error: the host codecs serve then), another
 * error reported on comm otherwise. */
ncclResult_t devCodecPrepare(struct ncclComm *comm, const geoOp *op,
                             const geoHierCodecChoice *ch, size_t chunk, devCodecJob **out);
void devCodecJobFree(devCodecJob *cj);
/* The exchange thread's part of j, a GPU-encoded job. */
ncclResult_t devCodecExchange(struct ncclComm *comm, struct geoDevState *st, devJob *j);
/* The cross-region all-reduce with the GPU codecs; cj, laid out, becomes
 * the job's. */
ncclResult_t devCodecAllReduce(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
                               devCodecJob *cj, devTimedCall *tc);

/* ---- phase timing (dev_timing.c) --------------------------------------- */

/* Start timing a call on stream s (reading the calls complete before it
 * first): NULL when it is not timed (too many events in flight). */
devTimedCall *devTimingBegin(struct geoDevState *st, cudaStream_t s);
/* The work enqueued on s from here on is phase ph (tc may be NULL). */
void devTimingPhase(struct geoDevState *st, devTimedCall *tc, int ph, cudaStream_t s);
/* The call is enqueued (r: its result; a failed call is not counted). */
void devTimingEnd(struct geoDevState *st, devTimedCall *tc, cudaStream_t s, ncclResult_t r);
/* j's exchange will report on tc (before j is queued). */
static inline void devTimingLink(devJob *j, devTimedCall *tc)
{
    j->timing = tc;
    if (tc)
        tc->linked = 1;
}
/* Exchange thread: what j's exchange measured; j is finished with tc. */
void devTimingHost(devJob *j, unsigned long long wan, unsigned long long wan_raw);
/* Read the calls whose events are complete and whose exchange is done. */
void devTimingHarvest(struct geoDevState *st);
/* Free every event and call (geoDevFree, the exchange thread joined). */
void devTimingFree(struct geoDevState *st);

/* ---- staged through the host (dev_staged.c) --------------------------- */

/* The cross-region all-reduce: the GPU-encoded exchange where the GPU has
 * the call's codec, else the shard exchanged by the host codecs. */
ncclResult_t devCrossAllReduce(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
                               devTimedCall *tc);
/* Any other collective across regions, run by the host algorithms on
 * pinned staging. */
ncclResult_t devStagedCollective(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
                                 devTimedCall *tc);

#endif /* HAVE_CUDA */
#endif
