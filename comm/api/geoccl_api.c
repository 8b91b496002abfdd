/* geoccl.h entry points. */
#include "config.h"
#include "geoccl.h"
#include "comm/base/checks.h"
#include "comm/core/comm.h"
#include "comm/device/coll_device.h"
#include "comm/base/param.h"
#include "comm/coll/tuning.h"
#include "topology/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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

int geocclNcclVarCount(void)
{
    int n = 0, id;
    const char *how;
    while (geoParamNcclVar(n, &id, &how) != NULL)
        n++;
    return n;
}

ncclResult_t geocclNcclVarGet(int i, geocclNcclVarInfo *info)
{
    int id = -1;
    const char *how = NULL, *name = info != NULL && i >= 0 ? geoParamNcclVar(i, &id, &how) : NULL;
    GEO_RETURN_IF(name == NULL, ncclInvalidArgument,
                  "geocclNcclVarGet: index %d outside [0, %d) or NULL info", i,
                  geocclNcclVarCount());
    info->name = name;
    info->geoccl = id >= 0 ? geoParamDescribe((geoParamId)id)->name : NULL;
    info->how = how;
    info->value = getenv(name);
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

ncclResult_t geocclCommGetLocalPeers(ncclComm_t comm, int *localPeers)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetLocalPeers") != ncclSuccess,
                  ncclInvalidArgument, "geocclCommGetLocalPeers: NULL or dead comm");
    GEO_RETURN_IF(localPeers == NULL, ncclInvalidArgument,
                  "geocclCommGetLocalPeers: NULL localPeers");
    *localPeers = comm->net.ctx.local_peers;
    return ncclSuccess;
}

ncclResult_t geocclCommGetReconnects(ncclComm_t comm, int peer, uint64_t *reconnects,
                                     uint64_t *bytesResent)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetReconnects") != ncclSuccess,
                  ncclInvalidArgument, "geocclCommGetReconnects: NULL or dead comm");
    GEO_RETURN_IF(peer < -1 || peer >= comm->nranks, ncclInvalidArgument,
                  "geocclCommGetReconnects: peer %d is not -1 or in 0..%d", peer,
                  comm->nranks - 1);
    uint64_t n = 0, bytes = 0;
    for (int p = peer < 0 ? 0 : peer; p < (peer < 0 ? comm->nranks : peer + 1); p++) {
        uint64_t a = 0, b = 0;
        if (p != comm->rank && comm->net.ops->resumeStats != NULL &&
            comm->net.ops->resumeStats(comm->net.state, p, &a, &b) == 0) {
            n += a;
            bytes += b;
        }
    }
    if (reconnects)
        *reconnects = n;
    if (bytesResent)
        *bytesResent = bytes;
    return ncclSuccess;
}

ncclResult_t geocclCommGetSingleCopy(ncclComm_t comm, int *singleCopy)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetSingleCopy") != ncclSuccess,
                  ncclInvalidArgument, "geocclCommGetSingleCopy: NULL or dead comm");
    GEO_RETURN_IF(singleCopy == NULL, ncclInvalidArgument,
                  "geocclCommGetSingleCopy: NULL singleCopy");
    *singleCopy = comm->cma;
    return ncclSuccess;
}

ncclResult_t geocclCommGetEncryption(ncclComm_t comm, int *encryptedPeers, const char **cipher)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetEncryption") != ncclSuccess,
                  ncclInvalidArgument, "geocclCommGetEncryption: NULL or dead comm");
    GEO_RETURN_IF(encryptedPeers == NULL, ncclInvalidArgument,
                  "geocclCommGetEncryption: NULL encryptedPeers");
    int n = 0;
    for (int r = 0; comm->encrypt != NULL && r < comm->nranks; r++)
        n += comm->encrypt[r];
    *encryptedPeers = n;
    if (cipher)
        *cipher = geoCipherName(n ? __atomic_load_n(&comm->net.ctx.cipher_used,
                                                    __ATOMIC_RELAXED)
                                  : GEO_CIPHER_NONE);
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
    /* the exchange thread counts the device calls it runs: wait for them */
    GEO_CHECK(geoDevDrain(comm));
    stats->bytesIntra = comm->net.sent.intra;
    stats->bytesWan = comm->net.sent.wan;
    stats->bytesWanRaw = comm->net.sent.wan_raw;
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
    memset(&comm->net.sent, 0, sizeof(comm->net.sent));
    geoDevResetStats(comm);
    return ncclSuccess;
}

ncclResult_t geocclCommGetDeviceStats(ncclComm_t comm, geocclDeviceStats *stats,
                                      size_t statsBytes)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetDeviceStats") != ncclSuccess || stats == NULL,
                  ncclInvalidArgument,
                  "geocclCommGetDeviceStats: NULL or dead comm, or NULL stats");
    geocclDeviceStats all;
    geoDevGetStats(comm, &all);
    /* a caller built against an older header knows fewer fields; a newer
     * one more, which this library leaves zero */
    size_t n = statsBytes < sizeof(all) ? statsBytes : sizeof(all);
    memcpy(stats, &all, n);
    if (statsBytes > n)
        memset((char *)stats + n, 0, statsBytes - n);
    return ncclSuccess;
}

ncclResult_t geocclCommSetCompression(ncclComm_t comm, const char *spec)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommSetCompression") != ncclSuccess,
                  ncclInvalidArgument, "geocclCommSetCompression: NULL or dead comm");
    /* Device all-reduces still queued on the exchange thread read the
     * codec parameters when they run: they keep the ones they were issued
     * with. */
    GEO_CHECK(geoDevDrain(comm));
    return geoCommSetCodec(comm, spec);
}

ncclResult_t geocclCommGetCompression(ncclComm_t comm, const char **name)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetCompression") != ncclSuccess || name == NULL,
                  ncclInvalidArgument, "geocclCommGetCompression: NULL or dead comm, or NULL name");
    *name = comm->codec_auto ? "auto"
            : geoCodecGet(comm->codec) ? geoCodecGet(comm->codec)->name : "none";
    return ncclSuccess;
}

ncclResult_t geocclCommResetErrorFeedback(ncclComm_t comm)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommResetErrorFeedback") != ncclSuccess,
                  ncclInvalidArgument, "geocclCommResetErrorFeedback: NULL or dead comm");
    /* queued device exchanges hold residuals of comm->ef */
    GEO_CHECK(geoDevDrain(comm));
    geoEfReset(&comm->ef);
    geoDevResetErrorFeedback(comm);
    return ncclSuccess;
}

/* The handle is the registration's tag (never 0 or 1, never reused), so
 * a stale or foreign handle is refused, not dereferenced. */
ncclResult_t geocclCommRegisterErrorFeedback(ncclComm_t comm, void *buff, size_t bytes,
                                             void **handle)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommRegisterErrorFeedback") != ncclSuccess ||
                      buff == NULL || handle == NULL || bytes == 0,
                  ncclInvalidArgument, "geocclCommRegisterErrorFeedback: NULL or dead comm, "
                  "NULL buff or handle, or 0 bytes");
    uint64_t tag = 0;
    ncclResult_t r = geoCommEfRegister(comm, buff, bytes, &tag);
    GEO_RETURN_IF(r == ncclInvalidArgument, r, "geocclCommRegisterErrorFeedback: [%p, +%zu) "
                  "overlaps other memory already registered on this communicator", buff, bytes);
    GEO_RETURN_IF(r != ncclSuccess, r, "geocclCommRegisterErrorFeedback: out of memory");
    *handle = (void *)(uintptr_t)tag;
    return ncclSuccess;
}

ncclResult_t geocclCommDeregisterErrorFeedback(ncclComm_t comm, void *handle)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommDeregisterErrorFeedback") != ncclSuccess,
                  ncclInvalidArgument, "geocclCommDeregisterErrorFeedback: NULL or dead comm");
    uint64_t tag = (uint64_t)(uintptr_t)handle;
    GEO_RETURN_IF(tag < 2 || geoCommEfUnregister(comm, tag) != 0, ncclInvalidArgument,
                  "geocclCommDeregisterErrorFeedback: %p is no registration of this "
                  "communicator", handle);
    /* No new call can take the tag now; queued device exchanges may still
     * hold its residuals. */
    GEO_CHECK(geoDevDrain(comm));
    geoEfDropTag(&comm->ef, tag);
    geoDevDropErrorFeedback(comm, tag);
    return ncclSuccess;
}

ncclResult_t geocclCommGetTopology(ncclComm_t comm, geocclTopology *topo)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetTopology") != ncclSuccess || topo == NULL,
                  ncclInvalidArgument, "geocclCommGetTopology: NULL or dead comm, or NULL topo");
    const geoTopo *t = &comm->topo;
    memset(topo, 0, sizeof(*topo));
    topo->nnodes = t->nnodes;
    topo->nregions = comm->regions.nregions;
    topo->rttMeasured = t->rtt_measured;
    topo->regionsMeasured = t->regions_measured;
    topo->bwMeasured = t->bw_measured;
    topo->fromFile = t->from_file;
    topo->inherited = comm->inherit.valid;
    topo->rttCutMs = t->cut * 1e3;
    topo->streamsNeeded = t->streams_needed;
    topo->windowBytes = t->window_bytes;
    topo->secProbe = t->t_total;
    topo->secRtt = t->t_rtt;
    topo->secBw = t->t_bw;
    topo->secWait = t->t_wait;
    topo->pairsMeasured = t->pairs_measured;
    topo->pairsInherited = t->pairs_inherited;
    return ncclSuccess;
}

ncclResult_t geocclCommGetWarmup(ncclComm_t comm, int *regionPairs, double *sec)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetWarmup") != ncclSuccess, ncclInvalidArgument,
                  "geocclCommGetWarmup: NULL or dead comm");
    if (regionPairs)
        *regionPairs = comm->topo.warm_pairs;
    if (sec)
        *sec = comm->topo.t_warm;
    return ncclSuccess;
}

ncclResult_t geocclCommGetWanCongestion(ncclComm_t comm, const char **name)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetWanCongestion") != ncclSuccess || name == NULL,
                  ncclInvalidArgument, "geocclCommGetWanCongestion: NULL or dead comm, or NULL name");
    *name = comm->wan.cc;
    return ncclSuccess;
}

ncclResult_t geocclCommGetWanPlan(ncclComm_t comm, int from, int to, const char **cc,
                                  const char **why, double *loss)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetWanPlan") != ncclSuccess, ncclInvalidArgument,
                  "geocclCommGetWanPlan: NULL or dead comm");
    const geoTopo *t = &comm->topo;
    GEO_RETURN_IF(from < 0 || to < 0 || from >= t->nregions || to >= t->nregions,
                  ncclInvalidArgument, "geocclCommGetWanPlan: regions %d, %d out of range (%d "
                  "regions)", from, to, t->nregions);
    int k = from * t->nregions + to, c = t->wan_choice != NULL ? t->wan_choice[k] : -1;
    /* this rank's own pairs: moved to cubic after init (wan_tuning.h, geoWanWatch)? */
    const geoWanWatch *w = &comm->wan.watch;
    int moved = w->cc != NULL && w->why != NULL && from == comm->regions.region_of[comm->rank] &&
                to < comm->regions.nregions && w->cc[to] == TOPO_CC_CUBIC && c == TOPO_CC_BBR;
    if (moved)
        c = TOPO_CC_CUBIC;
    if (cc)
        *cc = c == TOPO_CC_BBR ? "bbr" : c == TOPO_CC_CUBIC ? "cubic" : "";
    if (why)
        *why = moved ? w->why[to] : c >= 0 && t->wan_why != NULL ? t->wan_why[k] : "";
    if (loss)
        *loss = t->loss != NULL ? t->loss[k] : -1;
    return ncclSuccess;
}

ncclResult_t geocclCommGetNode(ncclComm_t comm, int node, const char **addr, int *leaderRank,
                               int *region, double *nicGbit)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetNode") != ncclSuccess, ncclInvalidArgument,
                  "geocclCommGetNode: NULL or dead comm");
    const geoTopo *t = &comm->topo;
    GEO_RETURN_IF(node < 0 || node >= t->nnodes, ncclInvalidArgument,
                  "geocclCommGetNode: node %d outside [0, %d)", node, t->nnodes);
    if (addr)
        *addr = t->node_addr[node];
    if (leaderRank)
        *leaderRank = t->leader[node];
    if (region)
        *region = comm->regions.region_of[t->leader[node]];
    if (nicGbit)
        *nicGbit = t->nic_gbit ? t->nic_gbit[node] : -1;
    return ncclSuccess;
}

ncclResult_t geocclCommGetRtt(ncclComm_t comm, double *rttMs)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetRtt") != ncclSuccess || rttMs == NULL,
                  ncclInvalidArgument, "geocclCommGetRtt: NULL or dead comm, or NULL rttMs");
    const geoTopo *t = &comm->topo;
    GEO_RETURN_IF(!t->rtt_measured, ncclInvalidUsage,
                  "geocclCommGetRtt: no round trips were measured (one node, labels given "
                  "with GEOCCL_PROBE=1, or GEOCCL_PROBE=0)");
    for (int i = 0; i < t->nnodes * t->nnodes; i++)
        rttMs[i] = t->rtt[i] >= 0 ? t->rtt[i] * 1e3 : -1;
    return ncclSuccess;
}

ncclResult_t geocclCommGetReplan(ncclComm_t comm, int *replans, double *shares,
                                 const char **why)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetReplan") != ncclSuccess, ncclInvalidArgument,
                  "geocclCommGetReplan: NULL or dead comm");
    if (replans)
        *replans = comm->replan.rule.replans;
    for (int q = 0; shares && q < comm->regions.nregions && q < 64; q++)
        shares[q] = (double)comm->hier_w[q] / TOPO_SHARE_ONE;
    if (why)
        *why = comm->replan.why;
    return ncclSuccess;
}

ncclResult_t geocclCommGetLinks(ncclComm_t comm, double *bwMbit, double *rttMs,
                                double *egressMbit, double *onewayMs)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetLinks") != ncclSuccess, ncclInvalidArgument,
                  "geocclCommGetLinks: NULL or dead comm");
    const geoTopo *t = &comm->topo;
    int R = comm->regions.nregions;
    for (int i = 0; i < R; i++) {
        for (int j = 0; j < R; j++) {
            if (bwMbit)
                bwMbit[i * R + j] = t->bw ? t->bw[i * R + j] * 8e-6 : 0;
            if (rttMs)
                rttMs[i * R + j] = t->region_rtt && t->region_rtt[i * R + j] >= 0
                                       ? t->region_rtt[i * R + j] * 1e3
                                       : -1;
        }
        if (egressMbit)
            egressMbit[i] = t->egress ? t->egress[i] * 8e-6 : 0;
        if (onewayMs)
            onewayMs[i] = t->oneway ? t->oneway[i] * 1e3 : 0;
    }
    return ncclSuccess;
}

ncclResult_t geocclCommGetIngress(ncclComm_t comm, double *ingressMbit)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetIngress") != ncclSuccess ||
                      ingressMbit == NULL,
                  ncclInvalidArgument, "geocclCommGetIngress: NULL or dead comm, or NULL output");
    const geoTopo *t = &comm->topo;
    for (int i = 0; i < comm->regions.nregions; i++)
        ingressMbit[i] = t->ingress ? t->ingress[i] * 8e-6 : 0;
    return ncclSuccess;
}

ncclResult_t geocclCommWriteTopology(ncclComm_t comm, const char *path)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommWriteTopology") != ncclSuccess || path == NULL,
                  ncclInvalidArgument, "geocclCommWriteTopology: NULL or dead comm, or NULL "
                  "path");
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "geocclCommWriteTopology: cannot open %s: %s",
                            path, strerror(errno));
    int bad = geoTopoWrite(&comm->topo, &comm->regions, comm->nranks, f);
    if (fclose(f) != 0 || bad)
        return GEO_COMM_ERR(comm, ncclSystemError,
                            "geocclCommWriteTopology: cannot write %s: %s", path, strerror(errno));
    return ncclSuccess;
}

ncclResult_t geocclCommPrintPlan(ncclComm_t comm, FILE *out, int json)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommPrintPlan") != ncclSuccess || out == NULL,
                  ncclInvalidArgument, "geocclCommPrintPlan: NULL or dead comm, or NULL out");
    geoTuningPrint(comm, out, json);
    return ncclSuccess;
}

ncclResult_t geocclSimulate(const char *topoFile, int json, FILE *out)
{
    char err[512] = "";
    GEO_RETURN_IF(topoFile == NULL || out == NULL, ncclInvalidArgument,
                  "geocclSimulate: NULL topology file or output");
    GEO_RETURN_IF(topoSimulate(topoFile, json, NULL, 0, out, err, sizeof(err)) != 0,
                  ncclInvalidUsage, "geocclSimulate: %s", err);
    return ncclSuccess;
}
