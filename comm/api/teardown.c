/* The end of a communicator: finalize (flush device work), destroy (free),
 * abort (break the transport so that calls in other threads fail and
 * leave, then free), revoke (break it, keep the memory).  Every path waits
 * for a non-blocking init's thread first, and frees in one place, which
 * stops the device path's exchange thread before the transport it uses. */
#include "config.h"
#include "comm/api/init_internal.h"
#include "comm/base/checks.h"
#include "comm/core/comm.h"
#include "comm/coll/tuning.h"
#include "comm/device/coll_device.h"
#include "comm/intra/hostseg.h"
#include "comm/elastic/elastic.h"
#include "topology/topofile.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void comm_release(struct ncclComm *comm, int abort)
{
    /* The device path's exchange thread runs collectives on this
     * communicator and counts them: stop it before reading the counters. */
    geoDevFree(comm, abort); /* before the transport: its thread uses it */
    geoElasticDetach(comm, abort);
    if (comm->stats.calls_flat + comm->stats.calls_hier > 0)
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET,
                "destroy: %llu flat and %llu hierarchical collectives; sent %llu bytes to my "
                "region and %llu bytes over the WAN (%.2fx less than uncompressed); "
                "hierarchical phases: intra reduce-scatter %.3f s, inter-region %.3f s, intra "
                "all-gather %.3f s, codec %.3f s",
                (unsigned long long)comm->stats.calls_flat,
                (unsigned long long)comm->stats.calls_hier,
                (unsigned long long)comm->net.sent.intra,
                (unsigned long long)comm->net.sent.wan,
                comm->net.sent.wan ? (double)comm->net.sent.wan_raw /
                                            (double)comm->net.sent.wan
                                      : 1.0,
                comm->stats.t_intra_rs, comm->stats.t_inter, comm->stats.t_intra_ag,
                comm->stats.t_codec);
    geoCommRingFree(&comm->ring);
    geoCommRingFree(&comm->region_ring);
    free(comm->cma_peer_buf);
    geoHostSegFree(comm, abort);
    geoEfFree(&comm->ef);
    topoRegionMapFree(&comm->regions);
    geoTopoFree(&comm->topo);
    geoWanTuningFree(&comm->wan);
    geoTopoInheritFree(&comm->inherit);
    geoTuningFree(comm);
    geoReplanFree(comm);
    if (comm->topo_file_loaded)
        topoFileFree(&comm->topo_file);
    if (comm->net.ops && comm->net.state)
        comm->net.ops->destroy(comm->net.state);
    comm->net.state = NULL;
    free(comm->peers);
    free(comm->encrypt);
    free(comm->connect_want);
    geoWipe(comm->secret, sizeof(comm->secret));
    geoWipe(comm->job_key, sizeof(comm->job_key));
    free(comm->net.ctx.peers);
    free(comm->net.ctx.failed);
    comm->magic = 0;
    geoScratchFree(&comm->scratch);
    while (comm->ef_regs) {
        geoEfReg *x = comm->ef_regs;
        comm->ef_regs = x->next;
        free(x);
    }
    pthread_mutex_destroy(&comm->ef_lock);
    pthread_mutex_destroy(&comm->lock);
    geoErrDestroy(&comm->err);
    free(comm);
}

void geoCommFree(struct ncclComm *comm) { comm_release(comm, 0); }

static void join_init_thread(struct ncclComm *comm)
{
    if (comm->init_thread_live) {
        pthread_join(comm->init_thread, NULL);
        comm->init_thread_live = 0;
    }
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommFinalize") != ncclSuccess, ncclInvalidArgument,
                  "ncclCommFinalize: comm is NULL or not a live communicator");
    join_init_thread(comm);
    /* Host operations complete before their call returns; device ones are
     * flushed by the real NCCL and the exchange thread. */
    ncclResult_t res = geoDevFinalize(comm);
    comm->finalized = 1;
    return res;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess; /* as NCCL: destroying NULL is a no-op */
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommDestroy") != ncclSuccess, ncclInvalidArgument,
                  "ncclCommDestroy: not a live communicator");
    join_init_thread(comm);
    geoCommFree(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommAbort") != ncclSuccess, ncclInvalidArgument,
                  "ncclCommAbort: not a live communicator");
    geoErrAbort(&comm->err);
    if (comm->net.ops && comm->net.state)
        geoNetBreak(&comm->net);
    join_init_thread(comm);
    if (comm->net.ops && comm->net.state)
        geoNetBreak(&comm->net);
    /* Let calls running in other threads see the failure and leave. */
    for (int i = 0; i < 10000 && __atomic_load_n(&comm->active_calls, __ATOMIC_ACQUIRE) > 0; i++)
        usleep(1000);
    if (__atomic_load_n(&comm->active_calls, __ATOMIC_ACQUIRE) > 0) {
        geoWarn(GEO_LOG_INIT, "ncclCommAbort: a call is still running after 10 s; the "
                "communicator's memory is left allocated");
        return ncclSuccess;
    }
    comm_release(comm, 1);
    return ncclSuccess;
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommRevoke") != ncclSuccess, ncclInvalidArgument,
                  "ncclCommRevoke: comm is NULL or not a live communicator");
    GEO_RETURN_IF(revokeFlags != NCCL_REVOKE_DEFAULT, ncclInvalidArgument,
                  "ncclCommRevoke: revokeFlags must be 0");
    /* Asked for, so no failure to report: the text is what the
     * communicator's later calls fail with (ncclGetLastError). */
    geoErrSet(&comm->err, "communicator revoked");
    geoInfo(GEO_LOG_INIT, "communicator revoked (ncclCommRevoke)");
    geoHostSegBreak(comm);
    if (comm->net.ops && comm->net.state)
        geoNetBreak(&comm->net);
    return ncclSuccess;
}
