/* geoccl.h entry points. */
#include "config.h"
#include "geoccl.h"
#include "comm/checks.h"
#include "comm/comm.h"
#include "comm/param.h"

int geocclParamCount(void) { return GEO_PARAM_COUNT; }

ncclResult_t geocclParamGet(int i, geocclParamInfo *info)
{
    GEO_RETURN_IF(info == NULL || i < 0 || i >= GEO_PARAM_COUNT, ncclInvalidArgument,
                  "geocclParamGet: index %d outside [0, %d) or NULL info", i, GEO_PARAM_COUNT);
    const geoParamDesc *d = geoParamDescribe((geoParamId)i);
    info->name = d->name;
    info->value = geoParamStr((geoParamId)i);
    info->dflt = d->dflt;
    info->help = d->help;
    info->is_set = geoParamIsSet((geoParamId)i);
    return ncclSuccess;
}

const char *geocclVersionString(void) { return GEOCCL_VERSION_STRING; }

ncclResult_t geocclCommGetTransportInfo(ncclComm_t comm, int *nstreams, size_t *chunkBytes,
                                        double *timeoutSec)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetTransportInfo") != ncclSuccess,
                  ncclInvalidArgument, "geocclCommGetTransportInfo: NULL or dead comm");
    if (nstreams)
        *nstreams = comm->nstreams;
    if (chunkBytes)
        *chunkBytes = comm->chunk_size;
    if (timeoutSec)
        *timeoutSec = comm->timeout;
    return ncclSuccess;
}
