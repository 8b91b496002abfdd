/* The communicator's handle check and error reporting, for every layer
 * that holds a communicator (core/comm.h). */
#include "config.h"
#include "comm/core/comm.h"

#include <stdarg.h>


__thread int geoGroupDepth;

ncclResult_t geoCommCheck(const struct ncclComm *comm, const char *fn)
{
    (void)fn;
    if (comm == NULL || comm->magic != GEO_COMM_MAGIC)
        return ncclInvalidArgument;
    return ncclSuccess;
}

void geoCommSetError(struct ncclComm *comm, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    geoErrSetV(&comm->err, fmt, ap);
    va_end(ap);
}

void geoCommFail(struct ncclComm *comm, ncclResult_t res)
{
    geoErrFail(&comm->err, res);
}

ncclResult_t geoCommAsyncError(struct ncclComm *comm)
{
    return geoErrState(&comm->err);
}
