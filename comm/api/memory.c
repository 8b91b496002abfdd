/* Memory and registration: ncclMemAlloc/ncclMemFree (device memory from
 * NVIDIA's allocator on a GPU, page-aligned host memory without one),
 * buffer registration handles, and symmetric memory windows, which GeoCCL
 * forwards to NVIDIA's NCCL where a single-region communicator has a real
 * one and otherwise answers without it. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/core/comm.h"
#include "comm/device/coll_device.h"
#include "comm/device/nccl_real.h"

#include <stdint.h>
#include <stdlib.h>

ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    const geoNcclRealLib *real;
    if (geoNcclRealInCall() && (real = geoNcclReal()) != NULL && real->MemAlloc)
        return real->MemAlloc(ptr, size);
    /* On a GPU, NCCL's allocator gives device memory (PyTorch's NCCL memory
     * pool relies on it); without one, page-aligned host memory. */
    if (geoDevCurrent() >= 0 && (real = geoNcclReal()) != NULL && real->MemAlloc) {
        ncclResult_t r;
        GEO_REAL_CALL(r, real, MemAlloc, ptr, size);
        return r;
    }
    GEO_RETURN_IF(ptr == NULL, ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    GEO_RETURN_IF(posix_memalign(ptr, 4096, size ? size : 1) != 0, ncclSystemError,
                  "ncclMemAlloc: cannot allocate %zu bytes", size);
    return ncclSuccess;
}

ncclResult_t ncclMemFree(void *ptr)
{
    const geoNcclRealLib *real;
    if (ptr != NULL && (geoNcclRealInCall() || geoDevIsDevicePtr(ptr)) &&
        (real = geoNcclReal()) != NULL && real->MemFree) {
        ncclResult_t r;
        GEO_REAL_CALL(r, real, MemFree, ptr);
        return r;
    }
    free(ptr);
    return ncclSuccess;
}

/* Registration handles: a GeoCCL handle wraps the real NCCL's one (device
 * buffers of a single-region communicator whose real communicator exists)
 * or stands for a host buffer, which needs no registration. */
#define GEO_REG_MAGIC 0x47656f5265674831ULL
typedef struct {
    uint64_t magic;
    void *real;                 /* the real NCCL's handle, or NULL */
} geoRegHandle;

ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    const geoNcclRealLib *real;
    if (geoNcclRealInCall() && (real = geoNcclReal()) != NULL && real->CommRegister)
        return real->CommRegister((geoRealComm)(void *)comm, buff, size, handle);
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommRegister") != ncclSuccess || handle == NULL,
                  ncclInvalidArgument, "ncclCommRegister: NULL or dead comm, or NULL handle");
    geoRegHandle *h = calloc(1, sizeof(*h));
    GEO_RETURN_IF(h == NULL, ncclSystemError, "ncclCommRegister: out of memory");
    h->magic = GEO_REG_MAGIC;
    /* Registration is local in NCCL, so it must not create the real
     * communicator (a collective): it forwards once a device call made it. */
    if (buff && comm->regions.nregions == 1 && comm->dev && geoDevIsDevicePtr(buff)) {
        void *rc = NULL;
        if (geoDevRealComm(comm, "ncclCommRegister", &rc) == ncclSuccess && rc &&
            (real = geoNcclReal())->CommRegister) {
            ncclResult_t r;
            GEO_REAL_CALL(r, real, CommRegister, (geoRealComm)rc, buff, size, &h->real);
            if (r != ncclSuccess) {
                free(h);
                return GEO_COMM_ERR(comm, r, "ncclCommRegister: NVIDIA's NCCL refused the "
                                    "buffer: %s", real->GetErrorString(r));
            }
        }
    }
    if (h->real == NULL && buff && geoDevIsDevicePtr(buff))
        geoInfo(GEO_LOG_CUDA, "ncclCommRegister: device buffer %p not registered with the "
                "real NCCL (%s); collectives on it work unregistered", buff,
                comm->regions.nregions != 1 ? "several regions"
                                            : "no device collective has run on this "
                                              "communicator yet");
    *handle = h;
    return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    const geoNcclRealLib *real;
    if (geoNcclRealInCall() && (real = geoNcclReal()) != NULL && real->CommDeregister)
        return real->CommDeregister((geoRealComm)(void *)comm, handle);
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommDeregister") != ncclSuccess, ncclInvalidArgument,
                  "ncclCommDeregister: NULL or dead comm");
    geoRegHandle *h = handle;
    GEO_RETURN_IF(h == NULL || h->magic != GEO_REG_MAGIC, ncclInvalidArgument,
                  "ncclCommDeregister: handle was not returned by ncclCommRegister");
    ncclResult_t r = ncclSuccess;
    if (h->real) {
        void *rc = NULL;
        if (geoDevRealComm(comm, "ncclCommDeregister", &rc) == ncclSuccess && rc)
            GEO_REAL_CALL(r, geoNcclReal(), CommDeregister, (geoRealComm)rc, h->real);
    }
    h->magic = 0;
    free(h);
    return r;
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int winFlags)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommWindowRegister") != ncclSuccess,
                  ncclInvalidArgument, "ncclCommWindowRegister: NULL or dead comm");
    GEO_RETURN_IF(win == NULL, ncclInvalidArgument, "ncclCommWindowRegister: win is NULL");
    *win = NULL;
    /* Collective in NCCL, so it may create the real communicator. */
    if (comm->regions.nregions == 1 && geoDevIsDevicePtr(buff)) {
        const geoNcclRealLib *real = geoNcclReal();
        void *rc = NULL;
        if (real && real->CommWindowRegister == NULL)
            return GEO_COMM_ERR(comm, ncclInvalidUsage, "ncclCommWindowRegister: the real NCCL at "
                                "%s (version %d) has no ncclCommWindowRegister", real->path,
                                real->version);
        GEO_CHECK(geoDevRealComm(comm, "ncclCommWindowRegister", &rc));
        ncclResult_t r;
        GEO_REAL_CALL(r, real, CommWindowRegister, (geoRealComm)rc, buff, size, win, winFlags);
        return r;
    }
    return GEO_COMM_ERR(comm, ncclInvalidUsage, "ncclCommWindowRegister: symmetric memory windows "
                        "are supported by GeoCCL only on device memory of a single-region "
                        "communicator on a GPU with NVIDIA's NCCL loaded (%s)",
                        comm->regions.nregions != 1 ? "this one spans several regions"
                        : comm->cuda_dev < 0        ? "this one has no GPU"
                                                    : "the buffer is not device memory");
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    const geoNcclRealLib *real;
    if (geoNcclRealInCall() && (real = geoNcclReal()) != NULL && real->CommWindowDeregister)
        return real->CommWindowDeregister((geoRealComm)(void *)comm, win);
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommWindowDeregister") != ncclSuccess,
                  ncclInvalidArgument, "ncclCommWindowDeregister: NULL or dead comm");
    void *rc = NULL;
    if (win != NULL && comm->dev && comm->regions.nregions == 1 &&
        geoDevRealComm(comm, "ncclCommWindowDeregister", &rc) == ncclSuccess && rc &&
        (real = geoNcclReal())->CommWindowDeregister) {
        ncclResult_t r;
        GEO_REAL_CALL(r, real, CommWindowDeregister, (geoRealComm)rc, win);
        return r;
    }
    return GEO_COMM_ERR(comm, ncclInvalidUsage, "ncclCommWindowDeregister: no window was "
                        "registered (GeoCCL registers windows only on device memory of a "
                        "single-region communicator)");
}
