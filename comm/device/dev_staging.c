/* Memory of the cross-region calls: pinned staging slots (one per job in
 * flight, never freed while the communicator lives), device staging from
 * a memory pool of the communicator's own, and the device residuals of the
 * GPU-encoded exchange's error feedback. */
#include "config.h"

#ifdef HAVE_CUDA
#include "comm/device/dev_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- pinned staging slots ----------------------------------------------- */

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

/* A new slot's events (no staging yet). */
static cudaError_t slot_events(devSlot *s)
{
    memset(s, 0, sizeof(*s));
    cudaError_t e = cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
    return e;
}

ncclResult_t devSlotsPrepin(struct ncclComm *comm, struct geoDevState *st)
{
    const size_t cap = slot_cap_for(GEO_DEV_PREPIN_BYTES);
    while (st->nslots < GEO_DEV_PREPIN_SLOTS) {
        devSlot *s = &st->slots[st->nslots];
        cudaError_t e = slot_events(s);
        if (e != cudaSuccess)
            return devCudaError(comm, "cudaEventCreate of a staging slot", e);
        if ((e = cudaHostAlloc((void **)&s->host, cap, cudaHostAllocPortable)) != cudaSuccess) {
            cudaEventDestroy(s->ready);
            cudaEventDestroy(s->done);
            s->host = NULL;
            return devCudaError(comm, "cudaHostAlloc of a staging buffer", e);
        }
        s->cap = cap;
        st->nslots++;
    }
    return ncclSuccess;
}

/* A free staging slot of at least bytes (user thread).  Chooses, in this
 * order: the smallest free slot that is large enough; a new slot while
 * there are fewer than GEO_DEV_MAX_SLOTS; the largest free slot, grown.
 * Pinning happens only for a new or a grown slot, never a cudaFreeHost:
 * a grown slot's old buffer is kept (st->retired) until destroy.  Bound:
 * the retired buffers of a slot are powers of two below its capacity, so
 * they hold less than the slot itself. */
ncclResult_t devSlotGet(struct ncclComm *comm, struct geoDevState *st, size_t bytes,
                        devSlot **out)
{
    double t0 = geoNow();
    for (;;) {
        devSlot *pick = NULL, *largest = NULL;
        pthread_mutex_lock(&st->lock);
        for (int i = 0; i < st->nslots; i++) {
            devSlot *s = &st->slots[i];
            if (s->busy && s->exchanged && devEventQuery(s->done) == cudaSuccess)
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
            if (slot_events(pick) != cudaSuccess) {
                pthread_mutex_unlock(&st->lock);
                cudaGetLastError();
                return GEO_COMM_ERR(comm, ncclUnhandledCudaError, "%s: cudaEventCreate failed",
                                    geoErrOp(&comm->err));
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
            return GEO_COMM_ERR(comm, ncclSystemError, "%s: %d cross-region device all-reduces "
                                "are in flight and none finished within GEOCCL_TIMEOUT",
                                geoErrOp(&comm->err), GEO_DEV_MAX_SLOTS);
        }
        devSleepUs(100);
    }
}

/* Give back a slot no job took. */
void devSlotPut(struct geoDevState *st, devSlot *slot)
{
    pthread_mutex_lock(&st->lock);
    slot->busy = 0;
    pthread_mutex_unlock(&st->lock);
}

/* ---- device staging ----------------------------------------------------- */

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
void devPoolSetup(struct ncclComm *comm, struct geoDevState *st)
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

cudaError_t devMalloc(struct geoDevState *st, void **p, size_t bytes, cudaStream_t s)
{
    return st->pool ? cudaMallocFromPoolAsync(p, bytes, st->pool, s) : cudaMallocAsync(p, bytes, s);
}

/* ---- device residuals of the GPU-encoded exchange ----------------------- */

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

ncclResult_t devEfStoreSetup(struct ncclComm *comm, struct geoDevState *st)
{
    if (!st->ef_ready) {
        const geoEfAllocator dev_alloc = {.allocZeroed = dev_ef_alloc,
                                          .release = dev_ef_release, .ctx = st};
        if (geoEfInit(&st->ef, comm->ef.maxBytes, &dev_alloc) != ncclSuccess) {
            return GEO_COMM_ERR(comm, ncclInternalError, "%s: cannot set up the device "
                                "error-feedback store", geoErrOp(&comm->err));
        }
        st->ef_ready = 1;
    }
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
#endif
