/* NVIDIA's NCCL, loaded with dlopen: the intra-region engine for device
 * buffers.  See the comment at the top of nccl_real.c for the design. */
#ifndef GEOCCL_NCCL_REAL_H_
#define GEOCCL_NCCL_REAL_H_

#include <stddef.h>

#include "nccl.h"

/* A communicator of the real library: never a GeoCCL ncclComm_t. */
typedef struct geoRealComm_s *geoRealComm;

/* Functions of the real library.  Required members are never NULL in a
 * loaded table; optional ones (marked) are NULL when the library lacks them. */
typedef struct {
    void *handle;
    char path[1024];        /* the file dladdr reports for ncclGetVersion */
    int version;            /* the real ncclGetVersion's answer */

    ncclResult_t (*GetVersion)(int *version);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*CommInitRank)(geoRealComm *comm, int nranks, ncclUniqueId id, int rank);
    ncclResult_t (*CommInitRankConfig)(geoRealComm *comm, int nranks, ncclUniqueId id, int rank,
                                       ncclConfig_t *config);
    ncclResult_t (*CommDestroy)(geoRealComm comm);
    ncclResult_t (*CommAbort)(geoRealComm comm);
    ncclResult_t (*CommFinalize)(geoRealComm comm);
    ncclResult_t (*CommGetAsyncError)(geoRealComm comm, ncclResult_t *err);
    const char *(*GetErrorString)(ncclResult_t res);
    const char *(*GetLastError)(geoRealComm comm);
    ncclResult_t (*AllReduce)(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                              geoRealComm comm, cudaStream_t st);
    ncclResult_t (*AllGather)(const void *s, void *r, size_t n, ncclDataType_t dt,
                              geoRealComm comm, cudaStream_t st);
    ncclResult_t (*ReduceScatter)(const void *s, void *r, size_t n, ncclDataType_t dt,
                                  ncclRedOp_t op, geoRealComm comm, cudaStream_t st);
    ncclResult_t (*Broadcast)(const void *s, void *r, size_t n, ncclDataType_t dt, int root,
                              geoRealComm comm, cudaStream_t st);
    ncclResult_t (*Reduce)(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                           int root, geoRealComm comm, cudaStream_t st);
    ncclResult_t (*Send)(const void *s, size_t n, ncclDataType_t dt, int peer, geoRealComm comm,
                         cudaStream_t st);
    ncclResult_t (*Recv)(void *r, size_t n, ncclDataType_t dt, int peer, geoRealComm comm,
                         cudaStream_t st);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    /* optional */
    ncclResult_t (*GroupSimulateEnd)(ncclSimInfo_t *info);
    ncclResult_t (*AlltoAll)(const void *s, void *r, size_t n, ncclDataType_t dt,
                             geoRealComm comm, cudaStream_t st);
    ncclResult_t (*Gather)(const void *s, void *r, size_t n, ncclDataType_t dt, int root,
                           geoRealComm comm, cudaStream_t st);
    ncclResult_t (*Scatter)(const void *s, void *r, size_t n, ncclDataType_t dt, int root,
                            geoRealComm comm, cudaStream_t st);
    ncclResult_t (*CommRegister)(geoRealComm comm, void *buff, size_t size, void **handle);
    ncclResult_t (*CommDeregister)(geoRealComm comm, void *handle);
    ncclResult_t (*CommWindowRegister)(geoRealComm comm, void *buff, size_t size,
                                       ncclWindow_t *win, int flags);
    ncclResult_t (*CommWindowDeregister)(geoRealComm comm, ncclWindow_t win);
    ncclResult_t (*MemAlloc)(void **ptr, size_t size);
    ncclResult_t (*MemFree)(void *ptr);
    ncclResult_t (*RedOpCreatePreMulSum)(ncclRedOp_t *op, void *scalar, ncclDataType_t dt,
                                         ncclScalarResidence_t residence, geoRealComm comm);
    ncclResult_t (*RedOpDestroy)(ncclRedOp_t op, geoRealComm comm);
    ncclResult_t (*CommSplit)(geoRealComm comm, int color, int key, geoRealComm *newcomm,
                              ncclConfig_t *config);
    ncclResult_t (*CommShrink)(geoRealComm comm, int *exclude, int nexclude,
                               geoRealComm *newcomm, ncclConfig_t *config, int flags);
} geoNcclRealLib;

/* The process's real NCCL, loaded on first use (thread-safe, once):
 * GEOCCL_NCCL_LIB if set (and nothing else), else libnccl.so.2, libnccl.so,
 * then the directory configure found.  NULL when none could be loaded;
 * geoNcclRealError() then says why (it names GEOCCL_NCCL_LIB). */
const geoNcclRealLib *geoNcclReal(void);
const char *geoNcclRealError(void);

/* Uncached: open one candidate (path, or NULL for the search order above)
 * into *lib.  Returns 0, or -1 with the reason in err.  Refuses a library
 * that is GeoCCL itself.  Used by geoNcclReal() and by the tests. */
int geoNcclRealOpen(const char *path, geoNcclRealLib *lib, char *err, size_t errlen);
void geoNcclRealClose(geoNcclRealLib *lib);

/* Once per process: WARN when the first ncclCommInitRank and ncclAllReduce
 * in the process's global scope are not GeoCCL's (NVIDIA's libnccl was
 * loaded ahead of us, e.g. an LD_PRELOAD that failed while libgeoccl was
 * loaded later by other means): callers bound through that scope reach
 * NVIDIA's NCCL, not GeoCCL.  Names the object that holds them. */
void geoNcclCheckBinding(void);

/* Recursion guard.  NVIDIA's library calls some of its own exported
 * functions through the PLT (ncclGetVersion, ncclCommGetAsyncError,
 * ncclBroadcast, ncclMemAlloc, ...).  When it was loaded before us (a
 * trainer linked with -lnccl and run with LD_PRELOAD=libgeoccl.so) those
 * calls land in GeoCCL.  Every call into the real library is bracketed by
 * geoNcclRealEnter/Leave; GeoCCL entry points that NVIDIA's library calls
 * check geoNcclRealInCall() first and forward to the real function. */
void geoNcclRealEnter(void);
void geoNcclRealLeave(void);
int geoNcclRealInCall(void);

/* Call lib->fn(...) under the guard; the value is the call's result. */
#define GEO_REAL_CALL(res, lib, fn, ...)    \
    do {                                    \
        geoNcclRealEnter();                 \
        (res) = (lib)->fn(__VA_ARGS__);     \
        geoNcclRealLeave();                 \
    } while (0)

/* The real group this thread opened inside a GeoCCL group (pass-through of
 * device operations): open it once, close it at the outermost group end.
 * Open's failure is the real ncclGroupStart's code, unreported: the caller
 * has the communicator to report it on; Close and Simulate report theirs
 * on the thread. */
ncclResult_t geoNcclRealGroupOpen(const geoNcclRealLib *lib);
int geoNcclRealGroupIsOpen(void);
ncclResult_t geoNcclRealGroupClose(void);
ncclResult_t geoNcclRealGroupSimulate(ncclSimInfo_t *info);

#endif
