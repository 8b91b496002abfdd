/* What a caller asks of GeoCCL and of a live communicator: the text of a
 * result code and of the last error, the version, a communicator's
 * asynchronous error, size, device and rank.  None of these block or
 * change the communicator. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/core/comm.h"
#include "comm/device/coll_device.h"
#include "comm/device/nccl_real.h"

const char *ncclGetErrorString(ncclResult_t result)
{
    const geoNcclRealLib *real;
    if (geoNcclRealInCall() && (real = geoNcclReal()) != NULL)
        return real->GetErrorString(result);
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with GEOCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (ncclGetLastError names the call that failed)";
    case ncclInternalError: return "internal error - please report this issue to the GeoCCL developers";
    case ncclInvalidArgument: return "invalid argument (ncclGetLastError says which)";
    case ncclInvalidUsage: return "invalid usage (ncclGetLastError says what)";
    case ncclRemoteError: return "remote process exited, closed its connection or stopped answering";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    if (comm != NULL && comm->magic == GEO_COMM_MAGIC)
        return geoErrLast(&comm->err); /* the API hands out the buffer itself */
    return geoThreadError();
}

void ncclResetDebugInit(void) { geoParamReload(); }

ncclResult_t ncclGetVersion(int *version)
{
    const geoNcclRealLib *real;
    if (geoNcclRealInCall() && (real = geoNcclReal()) != NULL)
        return real->GetVersion(version); /* NVIDIA's library asking itself */
    GEO_RETURN_IF(version == NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    const geoNcclRealLib *real;
    if (geoNcclRealInCall() && (real = geoNcclReal()) != NULL)
        return real->CommGetAsyncError((geoRealComm)(void *)comm, asyncError);
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommGetAsyncError") != ncclSuccess, ncclInvalidArgument,
                  "ncclCommGetAsyncError: comm is NULL or not a live communicator");
    GEO_RETURN_IF(asyncError == NULL, ncclInvalidArgument,
                  "ncclCommGetAsyncError: asyncError is NULL");
    *asyncError = geoCommAsyncError(comm);
    if (*asyncError == ncclSuccess)
        *asyncError = geoDevAsyncError(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommCount") != ncclSuccess || count == NULL,
                  ncclInvalidArgument, "ncclCommCount: NULL or dead comm, or NULL count");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommCuDevice") != ncclSuccess || device == NULL,
                  ncclInvalidArgument, "ncclCommCuDevice: NULL or dead comm, or NULL device");
    *device = comm->cuda_dev;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommUserRank") != ncclSuccess || rank == NULL,
                  ncclInvalidArgument, "ncclCommUserRank: NULL or dead comm, or NULL rank");
    *rank = comm->rank;
    return ncclSuccess;
}
