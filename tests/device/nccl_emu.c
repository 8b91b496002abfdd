/*
 * A stand-in for NVIDIA's libnccl, for the CPU emulation of the device path
 * (tests/device/dev_allreduce-emu): built as tests/device/libnccl_emu.so and
 * loaded by comm/device/nccl_real.c through GEOCCL_NCCL_LIB.
 *
 * It exports every function nccl_real.c requires (and the collectives it
 * may use) with NCCL's signatures, and supports communicators of ONE rank:
 * that is all the emulated test needs, every rank being its own region.
 * With one rank every collective is a copy of the input to the output (a
 * reduction of one contribution; the average divides by one), enqueued on
 * the caller's stream with cudaMemcpyAsync, so it is stream-ordered like
 * NVIDIA's kernels.  The CUDA runtime it calls is not linked in: it is the
 * emulated one (tests/device/dev_emu_runtime.c) that the test program
 * exports (-rdynamic).
 *
 * It exports no geocclXXX symbol and lives in its own object, so
 * nccl_real.c's check that the library is not GeoCCL itself passes.
 */
#include "nccl.h"

#include <cuda_runtime_api.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ncclComm {
    int nranks;
    int destroyed;
};

/* One-rank communicators only: no shared state, except the last error. */
static __thread char emu_error[256];

static ncclResult_t fail(ncclResult_t r, const char *what)
{
    snprintf(emu_error, sizeof(emu_error), "emulated NCCL: %s", what);
    return r;
}

static size_t type_size(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

/* The one-rank collective: count elements (times mult) from s to r on the
 * stream. */
static ncclResult_t copy(const void *s, void *r, size_t count, size_t mult, ncclDataType_t dt,
                         ncclComm_t comm, cudaStream_t st)
{
    size_t es = type_size(dt);
    if (comm == NULL || comm->destroyed)
        return fail(ncclInvalidArgument, "invalid communicator");
    if (es == 0)
        return fail(ncclInvalidArgument, "unsupported data type");
    if (count == 0 || s == r)
        return ncclSuccess;
    if (cudaMemcpyAsync(r, s, count * mult * es, cudaMemcpyDefault, st) != cudaSuccess) {
        cudaGetLastError();
        return fail(ncclUnhandledCudaError, "cudaMemcpyAsync failed");
    }
    return ncclSuccess;
}

static ncclResult_t check_op(ncclRedOp_t op)
{
    /* sum, prod, max, min, avg: one contribution is the result */
    return (int)op >= 0 && (int)op < (int)ncclNumOps
               ? ncclSuccess
               : fail(ncclInvalidArgument, "PreMulSum ops are not emulated");
}

ncclResult_t ncclGetVersion(int *version)
{
    if (version == NULL)
        return fail(ncclInvalidArgument, "version is NULL");
    *version = 22809; /* what nccl_real.c needs: >= 2.19 */
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (id == NULL)
        return fail(ncclInvalidArgument, "id is NULL");
    memset(id, 0, sizeof(*id));
    snprintf(id->internal, sizeof(id->internal), "nccl-emu %ld %ld", (long)getpid(),
             (long)time(NULL));
    return ncclSuccess;
}

/* The library never calls its own exports: a sanitizer build loads it
 * without RTLD_DEEPBIND (comm/device/nccl_real.c), where such a call would
 * bind to GeoCCL's function of the same name. */
static ncclResult_t init_rank(ncclComm_t *comm, int nranks, int rank)
{
    if (comm == NULL)
        return fail(ncclInvalidArgument, "comm is NULL");
    if (nranks != 1 || rank != 0)
        return fail(ncclInvalidUsage, "communicators of one rank only (one rank per region)");
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return fail(ncclSystemError, "out of memory");
    c->nranks = 1;
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    (void)id;
    (void)config;
    return init_rank(comm, nranks, rank);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    (void)id;
    return init_rank(comm, nranks, rank);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    return comm ? ncclSuccess : fail(ncclInvalidArgument, "comm is NULL");
}

static ncclResult_t destroy(ncclComm_t comm)
{
    if (comm == NULL)
        return fail(ncclInvalidArgument, "comm is NULL");
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return destroy(comm); }

ncclResult_t ncclCommAbort(ncclComm_t comm) { return destroy(comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    if (comm == NULL || err == NULL)
        return fail(ncclInvalidArgument, "NULL argument");
    *err = ncclSuccess;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated NCCL)";
    case ncclSystemError: return "unhandled system error (emulated NCCL)";
    case ncclInternalError: return "internal error (emulated NCCL)";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
    default: return "unknown result (emulated NCCL)";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return emu_error;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t st)
{
    if (check_op(op) != ncclSuccess)
        return ncclInvalidArgument;
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t st)
{
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t st)
{
    if (check_op(op) != ncclSuccess)
        return ncclInvalidArgument;
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t dt, int root,
                           ncclComm_t comm, cudaStream_t st)
{
    if (root != 0)
        return fail(ncclInvalidArgument, "root out of range");
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclReduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t st)
{
    if (root != 0)
        return fail(ncclInvalidArgument, "root out of range");
    if (check_op(op) != ncclSuccess)
        return ncclInvalidArgument;
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclAlltoAll(const void *s, void *r, size_t n, ncclDataType_t dt, ncclComm_t comm,
                          cudaStream_t st)
{
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclGather(const void *s, void *r, size_t n, ncclDataType_t dt, int root,
                        ncclComm_t comm, cudaStream_t st)
{
    if (root != 0)
        return fail(ncclInvalidArgument, "root out of range");
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclScatter(const void *s, void *r, size_t n, ncclDataType_t dt, int root,
                         ncclComm_t comm, cudaStream_t st)
{
    if (root != 0)
        return fail(ncclInvalidArgument, "root out of range");
    return copy(s, r, n, 1, dt, comm, st);
}

/* Point-to-point to oneself would need a matching send and receive inside
 * a group; the emulated test never does that. */
ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm,
                      cudaStream_t st)
{
    (void)s, (void)n, (void)dt, (void)peer, (void)comm, (void)st;
    return fail(ncclInvalidUsage, "send/recv are not emulated");
}

ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm,
                      cudaStream_t st)
{
    (void)r, (void)n, (void)dt, (void)peer, (void)comm, (void)st;
    return fail(ncclInvalidUsage, "send/recv are not emulated");
}

/* Every call is complete when it returns (enqueued), so a group is empty. */
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
