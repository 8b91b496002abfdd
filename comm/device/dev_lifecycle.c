/* A communicator's device state from creation to free, and NVIDIA's
 * communicator of its region: made at init (GEOCCL_NCCL_INIT) or at the
 * first device-buffer call, collectively over the region (local rank 0
 * gets the unique id and sends it over GeoCCL's own transport); its
 * asynchronous error; finalize; destroy and abort, which also stop the
 * exchange thread and free (or, on abort, keep) the staging. */
#include "config.h"

#ifdef HAVE_CUDA
#include "comm/device/dev_internal.h"

#include "comm/base/param.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ncclResult_t devRealErrorAt(struct ncclComm *comm, const char *file, int line,
                            const geoNcclRealLib *lib, geoRealComm rc, const char *what,
                            ncclResult_t r)
{
    const char *txt;
    GEO_REAL_CALL(txt, lib, GetLastError, rc);
    return geoErrReport(&comm->err, r, file, line, "%s: NVIDIA's NCCL failed %s: %s (%s)",
                        geoErrOp(&comm->err), what, lib->GetErrorString(r),
                        txt && txt[0] ? txt : "no detail");
}

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
        int hid = geoParamEnvHide("NCCL_COMM_ID") == 0; /* see below */
        GEO_REAL_CALL(r, st->lib, GetUniqueId, &msg.id);
        if (hid)
            geoParamEnvRestore("NCCL_COMM_ID");
        msg.ok = r == ncclSuccess;
        geoNetRequest *req = calloc((size_t)n, sizeof(*req));
        if (req == NULL) {
            return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory", fn);
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
            return GEO_COMM_ERR(comm, ncclRemoteError, "%s: local rank 0 of my region (rank %d) "
                                "could not get an NCCL unique id from NVIDIA's NCCL", fn,
                                ring->ranks[0]);
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
        return GEO_COMM_ERR(comm, ncclUnhandledCudaError, "%s: cannot select CUDA device %d of "
                            "the communicator", fn, comm->cuda_dev);
    }
    /* Made into a local and published once complete: geoDevAsyncError
     * (ncclCommGetAsyncError, any thread) reads st->real without a lock, and
     * NCCL writes its output argument before its init has finished. */
    geoRealComm made = NULL;
    /* NCCL_COMM_ID is GeoCCL's bootstrap root (read as GEOCCL_COMM_ID's
     * twin).  NVIDIA's NCCL reads it too: its ncclGetUniqueId then returns
     * that address instead of a root of its own, and its rank 0's
     * ncclCommInitRank opens its root there, at GeoCCL's port, as every
     * region's rank 0 would.  Its id here is its own, sent over GeoCCL's
     * transport, so it must not see the variable at all. */
    int hid = geoParamEnvHide("NCCL_COMM_ID") == 0;
    GEO_REAL_CALL(r, st->lib, CommInitRankConfig, &made, n, msg.id, me, &cfg);
    if (hid)
        geoParamEnvRestore("NCCL_COMM_ID");
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
ncclResult_t devReady(struct ncclComm *comm, const char *fn, struct geoDevState **out)
{
    if (comm->cuda_dev < 0) {
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: device buffers on a communicator created "
                            "without a GPU (no CUDA device was current at ncclCommInitRank)", fn);
    }
    const geoNcclRealLib *lib = geoNcclReal();
    if (lib == NULL) {
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: device buffers need NVIDIA's NCCL inside "
                            "each region: %s", fn, geoNcclRealError());
    }
    struct geoDevState *st = dev_state(comm);
    if (st == NULL) {
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory", fn);
    }
    st->lib = lib;
    if (st->real == NULL) {
        if (st->real_failed != ncclSuccess) {
            return GEO_COMM_ERR(comm, st->real_failed, "%s: the real NCCL communicator of this "
                                "region failed to initialise earlier (%s)", fn,
                                lib->GetErrorString(st->real_failed));
        }
        if (geoNcclRealGroupIsOpen()) {
            return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: the first device-buffer call of a "
                                "communicator cannot be inside a group that already holds device "
                                "operations of another communicator; make one call on it outside "
                                "a group first", fn);
        }
        ncclResult_t r = real_init(comm, st, fn);
        if (r != ncclSuccess) {
            st->real_failed = r;
            return r;
        }
        /* Pinning and the pool synchronise the device: made here, at init
         * or with NVIDIA's communicator (whose init synchronises anyway),
         * never inside a later stream-ordered call. */
        if (comm->regions.nregions > 1) {
            devGuard g;
            GEO_CHECK(devEnter(comm, &g));
            r = devCrossSetup(comm, st);
            devLeave(&g);
            if (r != ncclSuccess)
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
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s is supported by GeoCCL on device memory "
                            "within one region only; this communicator spans %d regions", fn,
                            comm->regions.nregions);
    }
    GEO_CHECK(devReady(comm, fn, &st));
    *real = st->real;
    return ncclSuccess;
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
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "init: GEOCCL_NCCL_INIT=eager, but NVIDIA's "
                            "NCCL communicator of region '%s' cannot be made: %s", region, why);
    }
    if (why[0]) {
        geoInfo(GEO_LOG_INIT | GEO_LOG_CUDA, "init: NVIDIA's NCCL communicator of region '%s' "
                "is made at the first device-buffer call: %s", region, why);
        return ncclSuccess;
    }
    struct geoDevState *st;
    return devReady(comm, "init", &st);
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
    devTimingFree(st);
    if (st->pool && !st->ef_leak)
        cudaMemPoolDestroy(st->pool); /* waits for nothing (see devPoolSetup) */
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->lock);
    free(st);
    comm->dev = NULL;
    devLeave(&g);
}
#endif
