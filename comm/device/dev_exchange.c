/* The exchange thread of a communicator and what it shares with the
 * user's streams: the queue of cross-region jobs (taken in call order),
 * the flag in mapped pinned memory the streams wait on (cuStreamWaitValue32
 * or a polling kernel), and the drain that host-path calls wait for.  A
 * job's own work is dev_staged.c's or dev_codec_job.c's; this file runs
 * it, raises the flag after it (also after a failure, so no stream waits
 * forever) and frees it. */
#include "config.h"

#ifdef HAVE_CUDA
#include "comm/device/dev_internal.h"

#include "cuda/codec_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void devSleepUs(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Raise the flag to seq (never lower it: a job that failed while it was
 * being enqueued raises it past its own values at once). */
void devFlagRelease(struct geoDevState *st, uint32_t seq)
{
    uint32_t cur = __atomic_load_n(st->flag, __ATOMIC_ACQUIRE);
    while ((int32_t)(seq - cur) > 0 &&
           !__atomic_compare_exchange_n(st->flag, &cur, seq, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_ACQUIRE))
        ;
}

/* Wait for a point of the stream (an event): deadline and abort flag. */
ncclResult_t devWaitEvent(struct ncclComm *comm, struct geoDevState *st, cudaEvent_t ev,
                          const char *what)
{
    double t0 = geoNow();
    long backoff = 1;
    for (;;) {
        cudaError_t e = devEventQuery(ev);
        if (e == cudaSuccess)
            return ncclSuccess;
        if (e != cudaErrorNotReady) {
            char buf[96];
            cudaGetLastError();
            snprintf(buf, sizeof(buf), "waiting for %s", what);
            return devCudaError(comm, buf, e);
        }
        if (geoErrAborted(&comm->err) || __atomic_load_n(&st->aborting, __ATOMIC_ACQUIRE)) {
            return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: aborted", geoErrOp(&comm->err));
        }
        if (geoNow() - t0 > comm->timeout) {
            return GEO_COMM_ERR(comm, ncclSystemError, "%s: the stream did not reach %s within "
                                "GEOCCL_TIMEOUT=%.0f s", geoErrOp(&comm->err), what, comm->timeout);
        }
        devSleepUs(backoff);
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
        const unsigned long long wan0 = comm->net.sent.wan, raw0 = comm->net.sent.wan_raw;
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
                    j->wan_t0 = geoNow();
                    res = geoCollRun(&hop);
                    j->wan_t1 = geoNow();
                }
            } else if (j->codec_job) {
                res = devCodecExchange(comm, st, j);
                comm->stats.calls_hier++;
            } else {
                res = devWaitEvent(comm, st, j->slot->ready, "the reduce-scatter's shard");
                if (res == ncclSuccess) {
                    comm->call_codec = j->codec; /* the plan's (or the user's) */
                    j->wan_t0 = geoNow();
                    res = geoHierExchange(comm, &j->op, j->slot->host, j->off);
                    j->wan_t1 = geoNow();
                    comm->stats.calls_hier++;
                }
            }
            if (res != ncclSuccess) /* reported (and logged) where it failed */
                geoCommFail(comm, res);
        }
        devFlagRelease(st, j->seq); /* also after a failure: the stream goes on */
        /* this job's WAN bytes: host-path calls, which also count, wait for
         * the queue to drain first (geoDevDrain); a reset may zero the
         * counters meanwhile */
        const unsigned long long wan1 = comm->net.sent.wan, raw1 = comm->net.sent.wan_raw;
        devTimingHost(j, wan1 >= wan0 ? wan1 - wan0 : wan1, raw1 >= raw0 ? raw1 - raw0 : raw1);
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

/* Queue j for the exchange thread, which frees it once done: the caller
 * must not touch j afterwards.  Returns the sequence number before j's n
 * values; j's own (what its stream waits for) is that + n. */
uint32_t devJobPush(struct geoDevState *st, devJob *j, uint32_t n)
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

/* Make the stream wait until the flag reaches value. */
ncclResult_t devStreamWait(struct ncclComm *comm, struct geoDevState *st, cudaStream_t s,
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
        return GEO_COMM_ERR(comm, r, "%s: the kernel that waits for the exchange failed to "
                            "launch: %s", geoErrOp(&comm->err), why ? why : "no detail");
    }
    return ncclSuccess;
}

/* Flag values only grow, and cuStreamWaitValue32 compares without wrap:
 * long before 2^32, once every job is done and every stream has passed
 * its waits (each slot's done event comes after its job's last wait), the
 * flag and the sequence start again from 0.  User thread. */
#define GEO_FLAG_REWIND (1u << 31)
ncclResult_t devFlagRewind(struct ncclComm *comm, struct geoDevState *st, uint32_t need)
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

ncclResult_t devCrossSetup(struct ncclComm *comm, struct geoDevState *st)
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
    GEO_CHECK(devSlotsPrepin(comm, st));
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
    GEO_CHECK(devEfStoreSetup(comm, st));
    if (!st->thread_live) {
        if (pthread_create(&st->thread, NULL, exchange_main, comm) != 0) {
            return GEO_COMM_ERR(comm, ncclSystemError, "%s: cannot start the exchange thread",
                                geoErrOp(&comm->err));
        }
        st->thread_live = 1;
    }
    return ncclSuccess;
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
            return GEO_COMM_ERR(comm, ncclSystemError, "%s: %d cross-region device all-reduces "
                                "still wait for their streams after GEOCCL_TIMEOUT=%.0f s",
                                geoErrOp(&comm->err), st->pending, comm->timeout);
        }
    }
    pthread_mutex_unlock(&st->lock);
    return ncclSuccess;
}
#endif
