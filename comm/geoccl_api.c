/* geoccl.h entry points. */
#include "config.h"
#include "geoccl.h"
#include "comm/checks.h"
#include "comm/comm.h"
#include "comm/param.h"

#include <string.h>

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

ncclResult_t geocclCommGetRegion(ncclComm_t comm, int *nregions, int *region, int *localRank,
                                 int *regionSize, const char **name)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetRegion") != ncclSuccess, ncclInvalidArgument,
                  "geocclCommGetRegion: NULL or dead comm");
    const topoRegionMap *m = &comm->regions;
    int g = m->region_of[comm->rank];
    if (nregions)
        *nregions = m->nregions;
    if (region)
        *region = g;
    if (localRank)
        *localRank = m->local_rank[comm->rank];
    if (regionSize)
        *regionSize = m->size[g];
    if (name)
        *name = m->names[g];
    return ncclSuccess;
}

ncclResult_t geocclCommGetStats(ncclComm_t comm, geocclStats *stats)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetStats") != ncclSuccess || stats == NULL,
                  ncclInvalidArgument, "geocclCommGetStats: NULL or dead comm, or NULL stats");
    stats->bytesIntra = comm->stats.bytes_intra;
    stats->bytesWan = comm->stats.bytes_wan;
    stats->bytesWanRaw = comm->stats.bytes_wan_raw;
    stats->secCodec = comm->stats.t_codec;
    stats->callsFlat = comm->stats.calls_flat;
    stats->callsHier = comm->stats.calls_hier;
    stats->secIntraReduceScatter = comm->stats.t_intra_rs;
    stats->secInter = comm->stats.t_inter;
    stats->secIntraAllGather = comm->stats.t_intra_ag;
    return ncclSuccess;
}

ncclResult_t geocclCommResetStats(ncclComm_t comm)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommResetStats") != ncclSuccess, ncclInvalidArgument,
                  "geocclCommResetStats: NULL or dead comm");
    memset(&comm->stats, 0, sizeof(comm->stats));
    return ncclSuccess;
}

ncclResult_t geocclCommSetCompression(ncclComm_t comm, const char *spec)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommSetCompression") != ncclSuccess,
                  ncclInvalidArgument, "geocclCommSetCompression: NULL or dead comm");
    return geoCommSetCodec(comm, spec);
}

ncclResult_t geocclCommGetCompression(ncclComm_t comm, const char **name)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetCompression") != ncclSuccess || name == NULL,
                  ncclInvalidArgument, "geocclCommGetCompression: NULL or dead comm, or NULL name");
    *name = geoCodecGet(comm->codec) ? geoCodecGet(comm->codec)->name : "none";
    return ncclSuccess;
}

ncclResult_t geocclCommResetErrorFeedback(ncclComm_t comm)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommResetErrorFeedback") != ncclSuccess,
                  ncclInvalidArgument, "geocclCommResetErrorFeedback: NULL or dead comm");
    geoEfReset(&comm->ef);
    return ncclSuccess;
}
