/* Communicator life cycle: unique id, init (blocking, non-blocking, all,
 * grouped), split, finalize, destroy, abort, queries, errors, version. */
#include "config.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/base/checks.h"
#include "comm/coll/cma.h"
#include "comm/coll/coll.h"
#include "comm/device/coll_device.h"
#include "comm/core/comm.h"
#include "comm/api/group.h"
#include "comm/device/nccl_real.h"
#include "comm/base/param.h"
#include "comm/coll/reduce.h"
#include "comm/coll/tuning.h"
#include "comm/transport/ifaces.h"
#include "topology/topofile.h"

#include <arpa/inet.h>
#include <errno.h>
#include <strings.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    const geoNcclRealLib *real;
    if (geoNcclRealInCall() && (real = geoNcclReal()) != NULL)
        return real->GetUniqueId(uniqueId);
    GEO_RETURN_IF(uniqueId == NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    return geoBootstrapGetUniqueId(uniqueId);
}

/* ---- compression policy --------------------------------------------- */

/* "auto" (the plan chooses among the exact codecs: none, lossless) or
 * "auto:c1,c2,..." (among none and the codecs listed, lossy ones
 * included: listing them is the user's consent). */
static ncclResult_t set_auto(struct ncclComm *comm, const char *spec)
{
    unsigned mask = 1u << GEO_CODEC_LOSSLESS;
    geoCodecParams ap = comm->codec_params;
    if (spec[4] == ':') {
        char list[256], *save = NULL;
        snprintf(list, sizeof(list), "%s", spec + 5);
        mask = 0;
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            geoCodecId id;
            if (geoCodecParse(tok, &id, &ap) != ncclSuccess || id == GEO_CODEC_AUTO) {
                geoCommSetError(comm, "compression '%s': '%s' is not none, lossless, fp16, "
                                "bf16, int8, int4, sign or topk:<k>", spec, tok);
                return ncclInvalidArgument;
            }
            if (id != GEO_CODEC_NONE)
                mask |= 1u << id;
        }
    }
    comm->codec_auto = 1;
    comm->auto_mask = mask;
    comm->auto_params = ap;
    comm->codec = GEO_CODEC_NONE;
    comm->compress_fallback_noted = 0;
    geoInfo(GEO_LOG_COMPRESS, "compression between regions: chosen per call by the plan "
            "(%s)", spec);
    /* Already connected (geocclCommSetCompression): plan again. */
    if (comm->regions.nregions > 0)
        return geoTuningInit(comm);
    return ncclSuccess;
}

ncclResult_t geoCommSetCodec(struct ncclComm *comm, const char *spec)
{
    geoCodecId id;
    geoCodecParams p = comm->codec_params;
    if (spec && strncmp(spec, "auto", 4) == 0 && (spec[4] == '\0' || spec[4] == ':'))
        return set_auto(comm, spec);
    if (geoCodecParse(spec, &id, &p) != ncclSuccess) {
        geoCommSetError(comm, "compression '%s' is not none, lossless, fp16, bf16, int8, int4, "
                        "sign or topk:<k> (0 < k <= 1)", spec ? spec : "(null)");
        return ncclInvalidArgument;
    }
    comm->codec_auto = 0;
    comm->codec = id;
    comm->codec_params = p;
    comm->compress_fallback_noted = 0;
    if (comm->regions.nregions > 0 && comm->plan != NULL)
        GEO_CHECK(geoTuningInit(comm)); /* a forced codec pins the plan */
    if (id != GEO_CODEC_NONE)
        geoInfo(GEO_LOG_COMPRESS, "compression between regions: %s%s", geoCodecGet(id)->name,
                geoCodecGet(id)->lossy ? (comm->ef_enabled ? " with error feedback"
                                                           : " without error feedback")
                                       : "");
    return ncclSuccess;
}

void geoCommCompressionInit(struct ncclComm *comm)
{
    int64_t block = geoParamInt(GEO_PARAM_COMPRESS_BLOCK);
    int64_t seed = geoParamInt(GEO_PARAM_COMPRESS_STOCHASTIC);
    int64_t efmax = geoParamInt(GEO_PARAM_EF_MAX_BYTES);
    geoCodecParamsInit(&comm->codec_params);
    if (block >= 8 && block % 8 == 0 && block <= GEO_CODEC_BLOCK_MAX)
        comm->codec_params.blockSize = (uint32_t)block;
    else
        geoWarn(GEO_LOG_COMPRESS, "GEOCCL_COMPRESS_BLOCK=%lld is not a multiple of 8 in "
                "[8, %u]: using %u", (long long)block, GEO_CODEC_BLOCK_MAX,
                comm->codec_params.blockSize);
    comm->codec_params.stochastic = seed != 0;
    comm->codec_params.seed = (uint64_t)seed;
    int64_t ef = geoParamInt(GEO_PARAM_EF);
    comm->ef_enabled = ef != 0;
    /* Unset: each codec's default (coll_hier_codec.c: first trip only for sign). */
    comm->ef_mode = !geoParamIsSet(GEO_PARAM_EF) ? 0 : ef >= 1 && ef <= 3 ? (int)ef : 1;
    geoEfInit(&comm->ef, efmax < 0 ? 0 : (size_t)efmax, NULL);
    const char *key = geoParamStr(GEO_PARAM_EF_KEY);
    comm->ef_by_address = key && strcmp(key, "address") == 0;
    if (key && !comm->ef_by_address && strcmp(key, "registered") != 0)
        geoWarn(GEO_LOG_COMPRESS, "GEOCCL_EF_KEY=%s is neither registered nor address: "
                "registered", key);
    comm->codec = GEO_CODEC_NONE;
    const char *spec = geoParamStr(GEO_PARAM_COMPRESS);
    if (spec && geoCommSetCodec(comm, spec) != ncclSuccess) {
        geoWarn(GEO_LOG_COMPRESS, "%s: exact transfer", geoErrLast(&comm->err));
        comm->codec = GEO_CODEC_NONE;
    }
}

/* ---- init ------------------------------------------------------------ */

static ncclResult_t check_config(const ncclConfig_t *config)
{
    if (config == NULL)
        return ncclSuccess;
    GEO_RETURN_IF(config->magic != NCCL_CONFIG_MAGIC, ncclInvalidArgument,
                  "ncclConfig_t has magic %#x, not %#x: initialise it with "
                  "NCCL_CONFIG_INITIALIZER", config->magic, NCCL_CONFIG_MAGIC);
    GEO_RETURN_IF(config->size < offsetof(ncclConfig_t, blocking) + sizeof(int) ||
                      config->size > sizeof(ncclConfig_t) + 256,
                  ncclInvalidArgument, "ncclConfig_t has size %zu: initialise it with "
                  "NCCL_CONFIG_INITIALIZER", config->size);
    GEO_RETURN_IF(config->version < NCCL_VERSION(2, 14, 0) ||
                      config->version > NCCL_VERSION(2, 99, 99),
                  ncclInvalidArgument, "ncclConfig_t has version %u, which GeoCCL does not know",
                  config->version);
    GEO_RETURN_IF(config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
                      config->blocking != 1,
                  ncclInvalidArgument, "ncclConfig_t.blocking must be 0 or 1, not %d",
                  config->blocking);
    return ncclSuccess;
}

static void ring_free(geoRing *r)
{
    free(r->blk);
    free(r->pos_of);
    memset(r, 0, sizeof(*r));
}

static void comm_free_ex(struct ncclComm *comm, int abort)
{
    /* The device path's exchange thread runs collectives on this
     * communicator and counts them: stop it before reading the counters. */
    geoDevFree(comm, abort); /* before the transport: its thread uses it */
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
    ring_free(&comm->ring);
    ring_free(&comm->region_ring);
    free(comm->cma_peer_buf);
    geoEfFree(&comm->ef);
    topoRegionMapFree(&comm->regions);
    geoTopoFree(&comm->topo);
    geoWanTuningFree(&comm->wan);
    geoTopoInheritFree(&comm->inherit);
    geoTuningFree(comm);
    if (comm->topo_file_loaded)
        topoFileFree(&comm->topo_file);
    if (comm->net.ops && comm->net.state)
        comm->net.ops->destroy(comm->net.state);
    comm->net.state = NULL;
    free(comm->peers);
    free(comm->encrypt);
    geoWipe(comm->secret, sizeof(comm->secret));
    free(comm->net.ctx.peers);
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

static void comm_free(struct ncclComm *comm) { comm_free_ex(comm, 0); }

/* This process's region label: GEOCCL_REGION, else the topology file's
 * answer for my rank, address or host name, else "" (one region). */
static ncclResult_t my_region(struct ncclComm *comm, const geoSockAddr *addr, const char *host,
                              char out[TOPO_REGION_LABEL_LEN])
{
    /* Read at each init (not cached): launchers and tests set them per rank. */
    const char *label = geoParamStrLive(GEO_PARAM_REGION);
    const char *path = geoParamStrLive(GEO_PARAM_TOPO_FILE);
    memset(out, 0, TOPO_REGION_LABEL_LEN);
    /* A split or shrunk communicator keeps its parent's regions: the parent
     * resolved labels, file and probe already. */
    if (comm->inherit.valid) {
        snprintf(out, TOPO_REGION_LABEL_LEN, "%s", comm->inherit.label);
        return ncclSuccess;
    }
    if (label) {
        if (strlen(label) >= TOPO_REGION_LABEL_LEN) {
            geoCommSetError(comm, "init: GEOCCL_REGION '%s' is longer than %d characters",
                            label, TOPO_REGION_LABEL_LEN - 1);
            return ncclInvalidUsage;
        }
        snprintf(out, TOPO_REGION_LABEL_LEN, "%s", label);
    }
    if (path) {
        char err[512], ip[GEO_ADDR_STRLEN] = "";
        if (access(path, F_OK) != 0 && errno == ENOENT) {
            /* Not there yet: the probe measures, and rank 0 writes it. */
            comm->topo_file_missing = 1;
            geoInfo(GEO_LOG_TOPO, "topology file %s does not exist: probing, rank 0 will "
                    "write it", path);
            return ncclSuccess;
        }
        if (topoFileLoad(path, &comm->topo_file, err, sizeof(err)) != 0) {
            geoCommSetError(comm, "init: %s", err);
            return ncclInvalidUsage;
        }
        comm->topo_file_loaded = 1;
        if (label)
            return ncclSuccess;
        geoAddrHost(addr, ip);
        const char *r = topoFileRegionFor(&comm->topo_file, comm->rank, ip, host);
        if (r)
            snprintf(out, TOPO_REGION_LABEL_LEN, "%s", r);
        else
            geoInfo(GEO_LOG_TOPO, "topology file %s does not place rank %d (%s, %s): default "
                    "region", path, comm->rank, ip, host);
    }
    return ncclSuccess;
}

ncclResult_t geoCommBuildRegions(struct ncclComm *comm)
{
    ring_free(&comm->ring);
    ring_free(&comm->region_ring);
    topoRegionMapFree(&comm->regions);
    char (*labels)[TOPO_REGION_LABEL_LEN] = calloc((size_t)comm->nranks, sizeof(*labels));
    if (labels == NULL)
        goto oom;
    for (int r = 0; r < comm->nranks; r++)
        memcpy(labels[r], comm->peers[r].region, TOPO_REGION_LABEL_LEN);
    int rc = topoRegionMapBuild(&comm->regions, comm->nranks,
                                (const char (*)[TOPO_REGION_LABEL_LEN])labels);
    free(labels);
    if (rc != 0)
        goto oom;
    topoRegionMap *m = &comm->regions;
    int g = m->region_of[comm->rank];
    comm->ring.n = comm->nranks;
    comm->ring.ranks = m->order;
    comm->ring.blk = malloc(sizeof(int) * (size_t)comm->nranks);
    comm->ring.pos_of = malloc(sizeof(int) * (size_t)comm->nranks);
    comm->region_ring.n = m->size[g];
    comm->region_ring.me = m->local_rank[comm->rank];
    comm->region_ring.ranks = m->members[g];
    comm->region_ring.blk = malloc(sizeof(int) * (size_t)m->size[g]);
    comm->region_ring.pos_of = calloc((size_t)comm->nranks, sizeof(int));
    if (!comm->ring.blk || !comm->ring.pos_of || !comm->region_ring.blk ||
        !comm->region_ring.pos_of)
        goto oom;
    for (int i = 0; i < comm->nranks; i++) {
        comm->ring.blk[i] = m->order[i];
        comm->ring.pos_of[m->order[i]] = i;
    }
    comm->ring.me = comm->ring.pos_of[comm->rank];
    for (int i = 0; i < m->size[g]; i++) {
        comm->region_ring.blk[i] = i;
        comm->region_ring.pos_of[m->members[g][i]] = i;
    }
    if (m->nregions > 1 && comm->rank == 0)
        for (int k = 0; k < m->nregions; k++) {
            char list[256];
            int len = 0;
            for (int i = 0; i < m->size[k] && len < (int)sizeof(list) - 16; i++)
                len += snprintf(list + len, sizeof(list) - (size_t)len, "%s%d", i ? "," : "",
                                m->members[k][i]);
            geoInfo(GEO_LOG_INIT | GEO_LOG_TOPO, "region %d '%s': %d ranks (%s)", k,
                    m->names[k][0] ? m->names[k] : "default", m->size[k], list);
        }
    comm->net.region_of = comm->regions.region_of;
    return ncclSuccess;
oom:
    geoCommSetError(comm, "init: out of memory for the region map");
    return ncclSystemError;
}

/* Cache what the probe found where GEOCCL_TOPO_FILE points (rank 0).  A
 * failure to write is logged, not fatal: the communicator works. */
static void write_topo_file(struct ncclComm *comm)
{
    const char *path = geoParamStrLive(GEO_PARAM_TOPO_FILE);
    char tmp[4096];
    if (path == NULL || snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid()) >=
                            (int)sizeof(tmp))
        return;
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        geoWarn(GEO_LOG_TOPO, "cannot write topology file %s: %s", tmp, strerror(errno));
        return;
    }
    int bad = geoTopoWrite(&comm->topo, &comm->regions, comm->nranks, f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        geoWarn(GEO_LOG_TOPO, "cannot write topology file %s: %s", path, strerror(errno));
        unlink(tmp);
        return;
    }
    geoInfo(GEO_LOG_TOPO, "wrote topology file %s: the next start loads it and skips the probe",
            path);
}

/* Everything after the handle exists: bootstrap and connect. */

/* The probe's callbacks: regions it found by measurement become labels
 * "m<k>" and a rebuilt region map; its warm-up opens the connections of the
 * hierarchical exchange (coll_hier_plan.c's partners, found on a 4 Mi-element
 * plan, which has every pair of a slice). */
static ncclResult_t probe_set_regions(void *arg, const int *region_of_rank)
{
    struct ncclComm *comm = arg;
    for (int r = 0; r < comm->nranks; r++)
        snprintf(comm->peers[r].region, sizeof(comm->peers[r].region), "m%d",
                 region_of_rank[r]);
    return geoCommBuildRegions(comm);
}

static ncclResult_t probe_partners(void *arg, int **ranks, int *n)
{
    struct ncclComm *comm = arg;
    geoXPlan plan;
    *ranks = NULL;
    *n = 0;
    GEO_CHECK(geoHierExchangePlan(comm, (size_t)1 << 22, &plan));
    int *out = malloc(sizeof(int) * (size_t)(plan.ntx1 + 1)), k = 0;
    if (out == NULL) {
        geoHierExchangePlanFree(&plan);
        geoCommSetError(comm, "init: out of memory planning the warm-up");
        return ncclSystemError;
    }
    for (int i = 0; i < plan.ntx1; i++) {
        int p = plan.tx1[i].peer, seen = 0;
        for (int j = 0; j < k; j++)
            seen |= out[j] == p;
        if (!seen)
            out[k++] = p;
    }
    geoHierExchangePlanFree(&plan);
    *ranks = out;
    *n = k;
    return ncclSuccess;
}

static ncclResult_t probe(struct ncclComm *comm)
{
    int labelled = comm->inherit.valid; /* the parent's regions, whatever they came from */
    double window = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (comm->peers[r].region[0] != '\0')
            labelled = 1;
        /* The smallest window of any rank, so that every rank computes the
         * same stream counts. */
        if (comm->peers[r].window > 0 && (window <= 0 || comm->peers[r].window < window))
            window = comm->peers[r].window;
    }
    geoProbeCtx pc = {.net = &comm->net,
                      .rank = comm->rank,
                      .nranks = comm->nranks,
                      .timeout = comm->timeout,
                      .err = &comm->err,
                      .regions = &comm->regions,
                      .topo = &comm->topo,
                      .if_name = comm->if_name,
                      .nstreams = comm->nstreams,
                      .mode = comm->peers[0].probe,
                      .landmarks = comm->peers[0].landmarks,
                      .warmup = comm->peers[0].warmup,
                      .streams_set = comm->peers[0].streams_set,
                      .labelled = labelled,
                      .window = window,
                      .file = comm->topo_file_loaded ? &comm->topo_file : NULL,
                      .inherit = comm->inherit.valid ? &comm->inherit : NULL,
                      .wan_cc = comm->wan.cc,
                      .set_regions = probe_set_regions,
                      .partners = probe_partners,
                      .arg = comm};
    GEO_CHECK(geoProbeRun(&pc));
    /* The probe's traffic is not the user's. */
    memset(&comm->stats, 0, sizeof(comm->stats));
    memset(&comm->net.sent, 0, sizeof(comm->net.sent));
    return ncclSuccess;
}

/* GEOCCL_ENCRYPT and GEOCCL_CIPHER, checked before anything is sent. */
static ncclResult_t encrypt_params(struct ncclComm *comm, int *mode, int *cipher)
{
    const char *e = geoParamStr(GEO_PARAM_ENCRYPT), *c = geoParamStr(GEO_PARAM_CIPHER);
    if (strcmp(e, "wan") == 0)
        *mode = GEO_ENCRYPT_WAN;
    else if (strcmp(e, "all") == 0)
        *mode = GEO_ENCRYPT_ALL;
    else if (strcmp(e, "off") == 0)
        *mode = GEO_ENCRYPT_OFF;
    else {
        geoCommSetError(comm, "init: GEOCCL_ENCRYPT=%s: must be wan, all or off", e);
        return ncclInvalidArgument;
    }
    if (strcmp(c, "auto") == 0)
        *cipher = geoCipherPreferred();
    else if (strcmp(c, "aes-256-gcm") == 0)
        *cipher = GEO_CIPHER_AES256GCM;
    else if (strcmp(c, "chacha20-poly1305") == 0)
        *cipher = GEO_CIPHER_CHACHA20POLY1305;
    else {
        geoCommSetError(comm, "init: GEOCCL_CIPHER=%s: must be auto, aes-256-gcm or "
                        "chacha20-poly1305", c);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* What the table says is believed only within bounds: it comes from the
 * other ranks (authenticated, but they may run another build or be
 * misconfigured), and these values size loops, allocations and
 * connections. */
static ncclResult_t check_table(struct ncclComm *comm)
{
    const geoPeerInfo *p0 = &comm->peers[0];
    if (p0->nstreams < 1 || p0->nstreams > 64) {
        geoCommSetError(comm, "init: rank 0 asks for %d streams per peer pair: outside 1..64; "
                        "refusing the communicator", p0->nstreams);
        return ncclRemoteError;
    }
    if (p0->chunk_size < 4096 || p0->chunk_size > ((int64_t)1 << 30)) {
        geoCommSetError(comm, "init: rank 0 asks for chunks of %lld bytes: outside 4 KiB..1 GiB; "
                        "refusing the communicator", (long long)p0->chunk_size);
        return ncclRemoteError;
    }
    for (int r = 0; r < comm->nranks; r++) {
        geoPeerInfo *p = &comm->peers[r];
        /* Strings end inside their fields, whatever was sent. */
        p->net.host[sizeof(p->net.host) - 1] = '\0';
        p->net.local.path[sizeof(p->net.local.path) - 1] = '\0';
        p->region[sizeof(p->region) - 1] = '\0';
        if (p->encrypt < GEO_ENCRYPT_OFF || p->encrypt > GEO_ENCRYPT_ALL ||
            (p->net.addr.sa.sa_family != AF_INET && p->net.addr.sa.sa_family != AF_INET6)) {
            geoCommSetError(comm, "init: rank %d's entry in the bootstrap table is malformed "
                            "(address family %d, encryption mode %d): another GeoCCL "
                            "version?", r, p->net.addr.sa.sa_family, p->encrypt);
            return ncclRemoteError;
        }
    }
    return ncclSuccess;
}

/* Which connections are encrypted: every one under "all"; under "wan"
 * those between regions, where regions are not labelled alike those to
 * another host or network namespace (the probe may find regions later:
 * until then another host may be another region).  A pair follows the
 * stronger of its two ends' settings, so both ends compute the same. */
static ncclResult_t encrypt_plan(struct ncclComm *comm, const geoUniqueIdInternal *id)
{
    const geoPeerInfo *me = &comm->peers[comm->rank];
    comm->encrypt = calloc((size_t)comm->nranks, 1);
    if (comm->encrypt == NULL) {
        geoCommSetError(comm, "init: out of memory for %d peers", comm->nranks);
        return ncclSystemError;
    }
    for (int r = 0; r < comm->nranks; r++) {
        const geoPeerInfo *p = &comm->peers[r];
        int mode = me->encrypt > p->encrypt ? me->encrypt : p->encrypt;
        int same_region = me->region[0] != '\0' && strcmp(me->region, p->region) == 0;
        int same_place = geoLocalSamePlace(&me->net.local, &p->net.local);
        if (r == comm->rank)
            continue;
        comm->encrypt[r] = mode == GEO_ENCRYPT_ALL ||
                           (mode == GEO_ENCRYPT_WAN && !same_region && !same_place);
        if (comm->encrypt[r] && (id->flags & GEO_ID_NOSECRET)) {
            geoCommSetError(comm, "init: connections to rank %d (host %s%s%s) are to be "
                            "encrypted (GEOCCL_ENCRYPT=%s here, %s there), but GEOCCL_COMM_SECRET "
                            "is not set: every key would derive from GEOCCL_COMM_ID, which "
                            "anyone can know.  Set GEOCCL_COMM_SECRET to a passphrase every "
                            "rank shares, or GEOCCL_ENCRYPT=off on every rank to send in the clear", r,
                            p->net.host, p->region[0] ? ", region " : "", p->region,
                            me->encrypt == GEO_ENCRYPT_ALL ? "all"
                            : me->encrypt == GEO_ENCRYPT_WAN ? "wan" : "off",
                            p->encrypt == GEO_ENCRYPT_ALL ? "all"
                            : p->encrypt == GEO_ENCRYPT_WAN ? "wan" : "off");
            return ncclInvalidArgument;
        }
    }
    return ncclSuccess;
}

static ncclResult_t comm_connect(struct ncclComm *comm, const geoUniqueIdInternal *id,
                                 int allow_env_root)
{
    geoPeerInfo mine;
    topoIface ifs[1];
    geoNetAddr addr;
    ncclResult_t res;
    const char *filter = geoParamStr(GEO_PARAM_SOCKET_IFNAME);
    char a[GEO_ADDR_STRLEN];

    geoDebugSetRank(comm->rank);
    {
        char why[400];
        if (geoSocketCheckParams(why, sizeof(why)) != 0) {
            geoCommSetError(comm, "init: %s", why);
            return ncclInvalidArgument;
        }
        int64_t warm = geoParamInt(GEO_PARAM_WAN_WARMUP);
        if (warm < 0 || warm > 2) {
            geoCommSetError(comm, "init: GEOCCL_WAN_WARMUP=%lld: must be 0 (never), 1 (every "
                            "pair of regions) or 2 (fast pairs)", (long long)warm);
            return ncclInvalidArgument;
        }
    }
    int enc_mode, cipher;
    GEO_CHECK(encrypt_params(comm, &enc_mode, &cipher));
    if ((id->flags & GEO_ID_ENV) && allow_env_root && comm->rank == 0)
        GEO_CHECK(geoBootstrapStartRoot(id, comm->nranks, comm->timeout));
    comm->net.ctx = (geoNetCtx){.rank = comm->rank,
                                .nranks = comm->nranks,
                                .nstreams = comm->nstreams,
                                .timeout = comm->timeout,
                                .secret = comm->secret,
                                .comm_hash = comm->comm_hash,
                                .cipher = cipher,
                                .err = &comm->err};
    for (int i = 0; geoNetTransports[i]; i++)
        if (geoNetTransports[i]->canConnect(&comm->net.ctx)) {
            comm->net.ops = geoNetTransports[i];
            break;
        }
    if (comm->net.ops == NULL) {
        geoCommSetError(comm, "init: no transport can connect this communicator");
        return ncclSystemError;
    }
    if (topoFindIfaces(filter, &id->root.sa, ifs, 1) < 1) {
        geoCommSetError(comm, "init: no usable network interface (GEOCCL_SOCKET_IFNAME=%s)",
                        filter ? filter : "unset");
        return ncclSystemError;
    }
    memset(&addr, 0, sizeof(addr));
    memcpy(&addr.addr, &ifs[0].addr,
           ifs[0].addr.ss_family == AF_INET6 ? sizeof(addr.addr.sin6) : sizeof(addr.addr.sin));
    GEO_CHECK(comm->net.ops->listen(&comm->net.ctx, &comm->net.state, &addr));
    snprintf(comm->if_name, sizeof(comm->if_name), "%s", ifs[0].name);

    memset(&mine, 0, sizeof(mine));
    mine.net.addr = addr.addr;
    mine.net.local = addr.local;
    gethostname(mine.net.host, sizeof(mine.net.host) - 1);
    mine.pid = (int32_t)getpid();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    mine.ncpu = (int32_t)(ncpu > 0 ? ncpu : 1);
    mine.streams_set = geoParamIsSet(GEO_PARAM_NSTREAMS);
    mine.window = geoProbeStreamWindow();
    mine.nstreams = comm->nstreams;
    mine.chunk_size = (int64_t)comm->chunk_size;
    mine.probe = (int32_t)geoParamInt(GEO_PARAM_PROBE);
    mine.warmup = (int32_t)geoParamInt(GEO_PARAM_WAN_WARMUP);
    mine.landmarks = (int32_t)geoParamInt(GEO_PARAM_PROBE_LANDMARKS);
    mine.encrypt = enc_mode;
    {
        const char *ni = geoParamStr(GEO_PARAM_NCCL_INIT);
        mine.nccl_init = GEO_NCCL_INIT_AUTO;
        if (ni && strcasecmp(ni, "eager") == 0)
            mine.nccl_init = GEO_NCCL_INIT_EAGER;
        else if (ni && strcasecmp(ni, "lazy") == 0)
            mine.nccl_init = GEO_NCCL_INIT_LAZY;
        else if (ni && strcasecmp(ni, "auto") != 0) {
            geoCommSetError(comm, "init: GEOCCL_NCCL_INIT=%s: must be auto, eager or lazy", ni);
            return ncclInvalidArgument;
        }
        /* Lazy here: NCCL is not even loaded at init. */
        if (mine.nccl_init != GEO_NCCL_INIT_LAZY)
            mine.dev_ready = geoDevIdentify(comm->cuda_dev, mine.dev_bus);
    }
    GEO_CHECK(my_region(comm, &addr.addr, mine.net.host, mine.region));
    /* The streams a cached probe found necessary, unless set by hand. */
    if (comm->topo_file_loaded && comm->topo_file.streams > 0 &&
        !geoParamIsSet(GEO_PARAM_NSTREAMS))
        mine.nstreams = comm->topo_file.streams > 64 ? 64 : comm->topo_file.streams;
    comm->peers = calloc((size_t)comm->nranks, sizeof(geoPeerInfo));
    if (comm->peers == NULL) {
        geoCommSetError(comm, "init: out of memory for %d peers", comm->nranks);
        return ncclSystemError;
    }
    {
        char b[GEO_ADDR_STRLEN];
        geoInfo(GEO_LOG_INIT, "rank %d of %d joining root %s, listening on %s (%s)", comm->rank,
                comm->nranks, geoAddrToString(&id->root, a), geoAddrToString(&addr.addr, b),
                ifs[0].name);
    }
    {
        geoBootSelf self = {.rank = comm->rank, .nranks = comm->nranks,
                            .timeout = comm->timeout, .err = &comm->err};
        geoBootInfo *table = calloc((size_t)comm->nranks, sizeof(*table));
        geoBootInfo me;
        if (table == NULL) {
            geoCommSetError(comm, "init: out of memory for %d peers", comm->nranks);
            return ncclSystemError;
        }
        memset(&me, 0, sizeof(me));
        memcpy(me.bytes, &mine, sizeof(mine));
        res = geoBootstrapJoin(&self, id, &me, table);
        for (int r = 0; res == ncclSuccess && r < comm->nranks; r++)
            memcpy(&comm->peers[r], table[r].bytes, sizeof(comm->peers[r]));
        free(table);
        if (res != ncclSuccess)
            return res;
    }
    GEO_CHECK(check_table(comm));
    /* Every rank uses rank 0's stream count and chunk size. */
    comm->nstreams = comm->peers[0].nstreams;
    comm->chunk_size = (size_t)comm->peers[0].chunk_size;
    GEO_CHECK(geoCommBuildRegions(comm));
    GEO_CHECK(encrypt_plan(comm, id));
    comm->net.ctx.nstreams = comm->nstreams;
    comm->net.ctx.peers = calloc((size_t)comm->nranks, sizeof(geoNetPeer));
    if (comm->net.ctx.peers == NULL) {
        geoCommSetError(comm, "init: out of memory for %d peers", comm->nranks);
        return ncclSystemError;
    }
    for (int r = 0; r < comm->nranks; r++)
        comm->net.ctx.peers[r] = comm->peers[r].net;
    comm->net.ctx.encrypt = comm->encrypt;
    res = comm->net.ops->connect(&comm->net.ctx, comm->net.state);
    if (res != ncclSuccess)
        return res;
    {
        int nenc = 0;
        for (int r = 0; r < comm->nranks; r++)
            nenc += comm->encrypt[r];
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "encryption (GEOCCL_ENCRYPT=%s): connections to %d "
                "of %d peers, %s", geoParamStr(GEO_PARAM_ENCRYPT), nenc, comm->nranks - 1,
                nenc ? geoCipherName(comm->net.ctx.cipher_used) : "none");
    }
    GEO_CHECK(probe(comm));
    GEO_CHECK(geoCmaSetup(comm)); /* the region map is final now */
    if (comm->topo_file_missing && comm->rank == 0)
        write_topo_file(comm);
    GEO_CHECK(geoTuningInit(comm));
    GEO_CHECK(geoDevInitAtInit(comm));
    geoInfo(GEO_LOG_INIT, "communicator %016llx%s%s ready: rank %d of %d, %s, %d streams, "
            "chunk %zu", (unsigned long long)comm->comm_hash, comm->name[0] ? " " : "",
            comm->name, comm->rank, comm->nranks, comm->net.ops->name, comm->nstreams,
            comm->chunk_size);
    return ncclSuccess;
}

typedef struct {
    struct ncclComm *comm;
    geoUniqueIdInternal id;
    int allow_env_root;
} initArgs;

static void *nonblocking_init_main(void *arg)
{
    initArgs *a = arg;
    ncclResult_t res = comm_connect(a->comm, &a->id, a->allow_env_root);
    __atomic_store_n(&a->comm->err.async_error, res, __ATOMIC_RELEASE);
    free(a);
    return NULL;
}

__thread const struct ncclComm *geoInitParent;
__thread int geoInitDevice = GEO_INIT_DEV_CURRENT;

ncclResult_t geoCommInitInternal(struct ncclComm **out, int nranks, const ncclUniqueId *uid,
                                 int rank, const ncclConfig_t *config, int allow_env_root)
{
    geoUniqueIdInternal id;
    struct ncclComm *comm;
    ncclResult_t res;

    GEO_RETURN_IF(out == NULL, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    GEO_RETURN_IF(nranks < 1, ncclInvalidArgument, "ncclCommInitRank: nranks %d < 1", nranks);
    GEO_RETURN_IF(rank < 0 || rank >= nranks, ncclInvalidArgument,
                  "ncclCommInitRank: rank %d is outside [0, %d)", rank, nranks);
    GEO_CHECK(check_config(config));
    /* A driver too old for our CUDA runtime would otherwise read as "no
     * GPU": device buffers would then be taken for host memory. */
    const char *cuda_problem = geoDevProblem();
    GEO_RETURN_IF(cuda_problem != NULL, ncclUnhandledCudaError, "ncclCommInitRank: %s",
                  cuda_problem);
    geoNcclCheckBinding();
    GEO_CHECK(geoBootstrapDecode(uid, &id));

    comm = calloc(1, sizeof(*comm));
    GEO_RETURN_IF(comm == NULL, ncclSystemError, "out of memory");
    pthread_mutex_init(&comm->lock, NULL);
    pthread_mutex_init(&comm->ef_lock, NULL);
    geoErrInit(&comm->err);
    geoScratchInit(&comm->scratch);
    comm->magic = GEO_COMM_MAGIC;
    comm->rank = rank;
    comm->nranks = nranks;
    if (geoInitParent != NULL && geoTopoInheritFrom(&geoInitParent->topo, &geoInitParent->regions,
                                                     geoInitParent->rank,
                                                     geoInitParent->inherit.valid ? &geoInitParent->inherit : NULL,
                                                     &comm->inherit) != 0) {
        geoScratchFree(&comm->scratch);
        pthread_mutex_destroy(&comm->lock);
        pthread_mutex_destroy(&comm->ef_lock);
        geoErrDestroy(&comm->err);
        free(comm);
        GEO_RETURN_IF(1, ncclSystemError, "out of memory for the parent's topology");
    }
    /* NCCL's rule: the communicator belongs to the device current in the
     * caller's thread at the call (or devlist's entry); a thread of our own
     * that runs the init on the caller's behalf passes it in geoInitDevice,
     * since its own current device is 0. */
    comm->cuda_dev = geoInitDevice != GEO_INIT_DEV_CURRENT ? geoInitDevice : geoDevCurrent();
    ncclConfig_t dflt_cfg = NCCL_CONFIG_INITIALIZER;
    comm->real_cfg = dflt_cfg;
    /* Only the members the caller's (possibly older, smaller) config has. */
#define GEO_CFG_HAS(m) (config && config->size >= offsetof(ncclConfig_t, m) + sizeof(config->m))
    if (GEO_CFG_HAS(cgaClusterSize))
        comm->real_cfg.cgaClusterSize = config->cgaClusterSize;
    if (GEO_CFG_HAS(minCTAs))
        comm->real_cfg.minCTAs = config->minCTAs;
    if (GEO_CFG_HAS(maxCTAs))
        comm->real_cfg.maxCTAs = config->maxCTAs;
    if (GEO_CFG_HAS(splitShare))
        comm->real_cfg.splitShare = config->splitShare;
#undef GEO_CFG_HAS
    memcpy(comm->secret, id.secret, sizeof(comm->secret));
    comm->nosecret = (id.flags & GEO_ID_NOSECRET) != 0;
    comm->comm_hash = id.nonce ^ ((uint64_t)geoAddrPort(&id.root) << 48) ^
                      (uint64_t)id.root.sin.sin_addr.s_addr;
    comm->timeout = (double)geoParamInt(GEO_PARAM_TIMEOUT);
    if (comm->timeout <= 0)
        comm->timeout = 300;
    int64_t ns = geoParamInt(GEO_PARAM_NSTREAMS);
    comm->nstreams = (int)(ns < 1 ? 1 : ns > 64 ? 64 : ns);
    int64_t cs = geoParamInt(GEO_PARAM_CHUNK_SIZE);
    comm->chunk_size = (size_t)(cs < 64 ? 64 : cs);
    int64_t w = geoParamInt(GEO_PARAM_WINDOW);
    comm->window = (int)(w < 1 ? 1 : w > 1024 ? 1024 : w);
    comm->blocking = !(config && config->blocking == 0);
    const char *algo = geoParamStr(GEO_PARAM_ALGO);
    comm->algo = GEO_ALGO_AUTO;
    if (algo && strcasecmp(algo, "flat") == 0)
        comm->algo = GEO_ALGO_FLAT;
    else if (algo && (strcasecmp(algo, "hier") == 0 || strcasecmp(algo, "hierarchical") == 0))
        comm->algo = GEO_ALGO_HIER;
    else if (algo && strcasecmp(algo, "auto") != 0)
        geoWarn(GEO_LOG_TUNING, "GEOCCL_ALGO=%s is not auto, flat or hier: using auto", algo);
    int64_t hs = geoParamInt(GEO_PARAM_HIER_SLICE);
    comm->hier_slice = (size_t)(hs < 4096 ? 4096 : hs);
    int64_t hd = geoParamInt(GEO_PARAM_HIER_DEPTH);
    comm->hier_depth = hd < 0 ? 0 : hd > 64 ? 64 : (int)hd;
    int64_t dm = geoParamInt(GEO_PARAM_DIRECT_MAX);
    comm->direct_max = (size_t)(dm < 0 ? 0 : dm);
    geoCommCompressionInit(comm);
    if (config && config->commName)
        snprintf(comm->name, sizeof(comm->name), "%s", config->commName);
    geoErrSetOp(&comm->err, "init");

    if (!comm->blocking) {
        initArgs *a = malloc(sizeof(*a));
        if (a == NULL) {
            comm_free(comm);
            GEO_RETURN_IF(1, ncclSystemError, "out of memory");
        }
        a->comm = comm;
        a->id = id;
        a->allow_env_root = allow_env_root;
        comm->err.async_error = ncclInProgress;
        if (pthread_create(&comm->init_thread, NULL, nonblocking_init_main, a) != 0) {
            free(a);
            comm_free(comm);
            GEO_RETURN_IF(1, ncclSystemError, "cannot start the init thread");
        }
        comm->init_thread_live = 1;
        *out = comm;
        return ncclInProgress;
    }
    res = comm_connect(comm, &id, allow_env_root);
    if (res != ncclSuccess) {
        geoWarn(GEO_LOG_INIT, "%s", geoErrLast(&comm->err)[0] ? geoErrLast(&comm->err) : geoThreadError());
        geoSetThreadError("%s", geoErrLast(&comm->err)[0] ? geoErrLast(&comm->err) : geoThreadError());
        comm_free(comm);
        return res;
    }
    *out = comm;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    GEO_RETURN_IF(comm == NULL, ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
    GEO_RETURN_IF(nranks < 1 || rank < 0 || rank >= nranks, ncclInvalidArgument,
                  "ncclCommInitRankConfig: rank %d / nranks %d out of range", rank, nranks);
    GEO_CHECK(check_config(config));
    if (geoGroupActive())
        return geoGroupAddInit(comm, nranks, &commId, rank, config);
    return geoCommInitInternal(comm, nranks, &commId, rank, config, 1);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config)
{
    GEO_RETURN_IF(nId < 1 || commIds == NULL, ncclInvalidArgument,
                  "ncclCommInitRankScalable: need at least one unique id");
    /* One root serves all ranks; the other ids are accepted and unused. */
    return ncclCommInitRankConfig(newcomm, nranks, commIds[0], myrank, config);
}

typedef struct {
    ncclComm_t *out;
    int n, rank, dev;
    ncclUniqueId id;
    ncclResult_t res;
} allArgs;

static void *init_all_main(void *arg)
{
    allArgs *a = arg;
    geoInitDevice = a->dev;
    a->res = geoCommInitInternal(a->out, a->n, &a->id, a->rank, NULL, 0);
    return NULL;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    ncclUniqueId id;
    ncclResult_t res = ncclSuccess;
    GEO_RETURN_IF(comms == NULL, ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
    GEO_RETURN_IF(ndev < 1, ncclInvalidArgument, "ncclCommInitAll: ndev %d < 1", ndev);
    /* As NCCL: rank i on devlist[i], or on device i without a devlist;
     * without a GPU the communicators are host-only (device -1). */
    const int have_gpu = geoDevCurrent() >= 0;
    for (int i = 0; devlist && have_gpu && i < ndev; i++)
        GEO_RETURN_IF(devlist[i] < 0, ncclInvalidArgument,
                      "ncclCommInitAll: devlist[%d] = %d is not a device", i, devlist[i]);
    GEO_CHECK(geoBootstrapNewRoot(&id));
    allArgs *a = calloc((size_t)ndev, sizeof(*a));
    pthread_t *t = calloc((size_t)ndev, sizeof(*t));
    if (a == NULL || t == NULL) {
        free(a);
        free(t);
        GEO_RETURN_IF(1, ncclSystemError, "out of memory");
    }
    for (int i = 0; i < ndev; i++) {
        a[i] = (allArgs){.out = &comms[i], .n = ndev, .rank = i, .id = id, .res = ncclSuccess,
                         .dev = !have_gpu ? -1 : devlist ? devlist[i] : i};
        comms[i] = NULL;
        if (pthread_create(&t[i], NULL, init_all_main, &a[i]) != 0) {
            a[i].res = ncclSystemError;
            t[i] = 0;
        }
    }
    for (int i = 0; i < ndev; i++) {
        if (t[i])
            pthread_join(t[i], NULL);
        if (a[i].res != ncclSuccess && res == ncclSuccess)
            res = a[i].res;
    }
    if (res != ncclSuccess)
        for (int i = 0; i < ndev; i++)
            if (comms[i]) {
                comm_free(comms[i]);
                comms[i] = NULL;
            }
    free(a);
    free(t);
    return res;
}

/* ---- split ----------------------------------------------------------- */

static ncclResult_t run_allgather(struct ncclComm *comm, const void *send, void *recv,
                                  size_t bytes)
{
    geoOp op = {.type = GEO_OP_ALLGATHER, .comm = comm, .sendbuff = send, .recvbuff = recv,
                .count = bytes, .dt = ncclUint8, .op = ncclSum, .root = 0, .next = NULL};
    return geoRunCommOps(comm, NULL, &op);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    int32_t mine[2] = {color, key};
    int32_t *all = NULL;
    ncclUniqueId *ids = NULL, myid;
    ncclResult_t res;

    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommSplit") != ncclSuccess, ncclInvalidArgument,
                  "ncclCommSplit: comm is NULL or not a live communicator");
    GEO_RETURN_IF(newcomm == NULL, ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
    GEO_RETURN_IF(color < 0 && color != NCCL_SPLIT_NOCOLOR, ncclInvalidArgument,
                  "ncclCommSplit: color %d must be >= 0 or NCCL_SPLIT_NOCOLOR", color);
    GEO_CHECK(check_config(config));
    GEO_CHECK(geoCommAsyncError(comm));
    *newcomm = NULL;
    all = malloc(sizeof(int32_t) * 2 * (size_t)comm->nranks);
    ids = calloc((size_t)comm->nranks, sizeof(ncclUniqueId));
    if (all == NULL || ids == NULL) {
        res = ncclSystemError;
        goto out;
    }
    GEO_CHECK_GOTO(run_allgather(comm, mine, all, sizeof(mine)), res, out);

    /* My group, ordered by (key, old rank); its first member is the root. */
    int newrank = 0, newsize = 0, leader = -1, leader_key = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (all[2 * r] != color || color == NCCL_SPLIT_NOCOLOR)
            continue;
        newsize++;
        int k = all[2 * r + 1];
        if (k < key || (k == key && r < comm->rank))
            newrank++;
        if (leader < 0 || k < leader_key || (k == leader_key && r < leader)) {
            leader = r;
            leader_key = k;
        }
    }
    /* The child's secret never crosses the network: every member derives
     * it from the parent's (the same split count everywhere: all ranks
     * call), and the id travels without it. */
    uint8_t child[GEO_SHA256_BYTES];
    geoBootstrapChildSecret(comm->secret, comm->comm_hash, comm->split_count++, color, child);
    memset(&myid, 0, sizeof(myid));
    if (color != NCCL_SPLIT_NOCOLOR && leader == comm->rank) {
        GEO_CHECK_GOTO(geoBootstrapNewRootKeyed(child, &myid), res, out);
        geoBootstrapSetSecret(&myid, NULL);
    }
    GEO_CHECK_GOTO(run_allgather(comm, &myid, ids, sizeof(myid)), res, out);
    if (color == NCCL_SPLIT_NOCOLOR) {
        res = ncclSuccess;
        goto out;
    }
    geoBootstrapSetSecret(&ids[leader], child);
    if (comm->nosecret)
        geoBootstrapMarkNoSecret(&ids[leader]);
    geoWipe(child, sizeof(child));
    ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
    inherit.blocking = comm->blocking;
    geoInitParent = comm;
    res = geoCommInitInternal(newcomm, newsize, &ids[leader], newrank, config ? config : &inherit,
                              0);
    geoInitParent = NULL;
    if (res == ncclInProgress)
        res = ncclSuccess; /* non-blocking: the caller polls the new comm */
out:
    free(all);
    if (ids != NULL)
        geoWipe(ids, sizeof(ncclUniqueId) * (size_t)comm->nranks); /* the leader's holds a secret */
    free(ids);
    return res;
}

/* ---- shrink ---------------------------------------------------------- */

/* Every validation failure says why in the parent's error text. */
#define SHRINK_BAD(comm, ...)                                             \
    do {                                                                  \
        geoCommSetError((comm), "ncclCommShrink: " __VA_ARGS__);          \
        geoWarn(GEO_LOG_INIT, "%s", geoErrLast(&(comm)->err));                  \
        return ncclInvalidArgument;                                       \
    } while (0)

typedef struct {
    int32_t ok;                 /* the leader made a root */
    int32_t pad;
    ncclUniqueId id;
} shrinkIdMsg;

/* NCCL_SHRINK_DEFAULT: the leader makes a fresh root (as split does) and
 * sends its id to each other survivor over the parent's transport, without
 * its secret: every survivor derives that from the parent's and the
 * shrink's counter. */
static ncclResult_t shrink_id_send(struct ncclComm *comm, const uint8_t *excluded, int leader,
                                   uint32_t counter, ncclUniqueId *id)
{
    shrinkIdMsg msg;
    ncclResult_t res = ncclSuccess, made = ncclSuccess;
    uint8_t child[GEO_SHA256_BYTES];

    memset(&msg, 0, sizeof(msg));
    geoBootstrapChildSecret(comm->secret, comm->comm_hash, counter, -2, child);
    geoErrSetOp(&comm->err, "ncclCommShrink");
    __atomic_add_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    /* Queued device exchanges share the transport: they finish first. */
    GEO_CHECK_GOTO(geoDevDrain(comm), res, out);
    if (comm->rank == leader) {
        geoNetRequest *req = calloc((size_t)comm->nranks, sizeof(*req));
        if (req == NULL) {
            geoCommSetError(comm, "ncclCommShrink: out of memory");
            res = ncclSystemError;
            goto out;
        }
        made = geoBootstrapNewRootKeyed(child, &msg.id);
        geoBootstrapSetSecret(&msg.id, NULL);
        msg.ok = made == ncclSuccess;
        /* Sent even when it failed, so that nobody waits for nothing. */
        for (int r = 0; r < comm->nranks && res == ncclSuccess; r++)
            if (r != comm->rank && !excluded[r])
                res = geoNetIsend(&comm->net, r, &msg, sizeof(msg), &req[r]);
        for (int r = 0; r < comm->nranks; r++)
            if (req[r].size) {
                ncclResult_t w = geoNetWait(&comm->net, &req[r]);
                if (res == ncclSuccess)
                    res = w;
            }
        free(req);
        if (made != ncclSuccess) {
            geoCommSetError(comm, "ncclCommShrink: cannot start the new communicator's "
                            "bootstrap root: %s", geoThreadError());
            res = made;
        }
    } else {
        geoNetRequest req;
        memset(&req, 0, sizeof(req));
        GEO_CHECK_GOTO(geoNetIrecv(&comm->net, leader, &msg, sizeof(msg), &req), res, out);
        GEO_CHECK_GOTO(geoNetWait(&comm->net, &req), res, out);
        if (!msg.ok) {
            geoCommSetError(comm, "ncclCommShrink: rank %d, the lowest survivor, could not "
                            "start the new communicator's bootstrap root", leader);
            res = ncclRemoteError;
        }
    }
    if (res == ncclSuccess) {
        *id = msg.id;
        geoBootstrapSetSecret(id, child);
        if (comm->nosecret)
            geoBootstrapMarkNoSecret(id);
    }
out:
    geoWipe(child, sizeof(child));
    __atomic_sub_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    return res;
}

/* Design.  The survivors (the ranks not excluded, which alone call this)
 * form the new communicator through the ordinary bootstrap
 * (geoCommInitInternal) with nranks - count ranks, renumbered in the
 * parent's order; the two modes differ only in how they agree on its id.
 *  - NCCL_SHRINK_DEFAULT: the parent is healthy.  Its queued device
 *    exchanges complete, then the lowest survivor (the leader) makes a fresh
 *    root and sends the id point to point to every other survivor over the
 *    parent's transport; excluded ranks get nothing and are not waited for.
 *    The parent stays usable.
 *  - NCCL_SHRINK_ABORT: the parent may be broken (a peer died), so it
 *    carries nothing.  Its transport is broken first: operations in flight
 *    on it fail, as after ncclCommRevoke, and it can then only be destroyed
 *    or aborted.  Every survivor then computes the same id alone
 *    (geoBootstrapShrinkId) from what all ranks already share: the leader's
 *    data address from the bootstrap table, and a secret that is an HMAC of
 *    the parent's comm hash, this shrink's counter and the exclusion set
 *    under the parent's secret, so a stranger cannot derive it.  The leader
 *    listens at the first of 32 candidate ports it can bind (its old data
 *    port, then ports derived from the new secret); the others try the same
 *    sequence until a root accepts their proof, within GEOCCL_TIMEOUT.
 * The new communicator shares nothing with the parent: transport, regions,
 * rings, plan, error feedback and device state (its own NVIDIA NCCL
 * communicator, made at its first device call) are its own. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    uint8_t *excluded = NULL;
    ncclUniqueId id;
    ncclResult_t res;

    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommShrink") != ncclSuccess, ncclInvalidArgument,
                  "ncclCommShrink: comm is NULL or not a live communicator");
    if (newcomm == NULL)
        SHRINK_BAD(comm, "newcomm is NULL");
    *newcomm = NULL;
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
        SHRINK_BAD(comm, "shrinkFlags %#x is neither NCCL_SHRINK_DEFAULT (0) nor "
                   "NCCL_SHRINK_ABORT (1)", (unsigned)shrinkFlags);
    if (excludeRanksCount < 0)
        SHRINK_BAD(comm, "excludeRanksCount %d is negative", excludeRanksCount);
    if (excludeRanksCount >= comm->nranks)
        SHRINK_BAD(comm, "excludeRanksCount %d leaves no rank of %d", excludeRanksCount,
                   comm->nranks);
    if (excludeRanksCount > 0 && excludeRanksList == NULL)
        SHRINK_BAD(comm, "excludeRanksList is NULL with excludeRanksCount %d",
                   excludeRanksCount);
    if (check_config(config) != ncclSuccess) { /* which has logged why */
        geoCommSetError(comm, "ncclCommShrink: %s", geoThreadError());
        return ncclInvalidArgument;
    }
    excluded = calloc((size_t)comm->nranks, 1);
    if (excluded == NULL) {
        geoCommSetError(comm, "ncclCommShrink: out of memory");
        return ncclSystemError;
    }
    for (int i = 0; i < excludeRanksCount; i++) {
        int r = excludeRanksList[i];
        if (r < 0 || r >= comm->nranks || excluded[r] || r == comm->rank) {
            free(excluded);
            if (r < 0 || r >= comm->nranks)
                SHRINK_BAD(comm, "excludeRanksList[%d] = %d is outside [0, %d)", i, r,
                           comm->nranks);
            if (r == comm->rank)
                SHRINK_BAD(comm, "excludeRanksList[%d] = %d is the calling rank: excluded "
                           "ranks must not call ncclCommShrink", i, r);
            SHRINK_BAD(comm, "excludeRanksList[%d] = %d is listed twice", i, r);
        }
        excluded[r] = 1;
    }
    ncclResult_t state = geoCommAsyncError(comm);
    if (state == ncclInProgress) {
        free(excluded);
        geoCommSetError(comm, "ncclCommShrink: the communicator's non-blocking init has not "
                        "finished (poll ncclCommGetAsyncError first)");
        return ncclInvalidUsage;
    }
    if (state != ncclSuccess && shrinkFlags == NCCL_SHRINK_DEFAULT) {
        free(excluded);
        geoCommSetError(comm, "ncclCommShrink: the communicator is broken (%s: %s); "
                        "NCCL_SHRINK_ABORT builds the new one without it",
                        ncclGetErrorString(state), geoErrLast(&comm->err));
        return state;
    }

    int leader = -1, newrank = 0, newsize = comm->nranks - excludeRanksCount;
    for (int r = 0; r < comm->nranks; r++) {
        if (excluded[r])
            continue;
        if (leader < 0)
            leader = r;
        if (r < comm->rank)
            newrank++;
    }
    uint32_t counter = comm->shrink_count++;
    geoInfo(GEO_LOG_INIT, "ncclCommShrink(%s): rank %d of %d becomes rank %d of %d; lowest "
            "survivor %d", shrinkFlags == NCCL_SHRINK_ABORT ? "abort" : "default", comm->rank,
            comm->nranks, newrank, newsize, leader);
    if (shrinkFlags == NCCL_SHRINK_DEFAULT) {
        GEO_CHECK_GOTO(shrink_id_send(comm, excluded, leader, counter, &id), res, out);
    } else {
        if (state == ncclSuccess)
            geoCommSetError(comm, "communicator revoked by ncclCommShrink(NCCL_SHRINK_ABORT)");
        geoErrAbort(&comm->err); /* device exchanges and waits end */
        if (comm->net.ops && comm->net.state)
            geoNetBreak(&comm->net);
        geoBootstrapShrinkId(comm->secret, comm->comm_hash, comm->nranks,
                             &comm->peers[leader].net.addr, excluded, counter, &id);
        if (comm->nosecret)
            geoBootstrapMarkNoSecret(&id);
        if (comm->rank == leader) {
            geoUniqueIdInternal in;
            GEO_CHECK_GOTO(geoBootstrapDecode(&id, &in), res, out);
            res = geoBootstrapStartRoot(&in, newsize, comm->timeout);
            if (res != ncclSuccess) {
                geoCommSetError(comm, "ncclCommShrink: %s", geoThreadError());
                goto out;
            }
        }
    }
    ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
    inherit.blocking = comm->blocking;
    geoInitParent = comm;
    res = geoCommInitInternal(newcomm, newsize, &id, newrank, config ? config : &inherit, 0);
    geoInitParent = NULL;
    if (res == ncclInProgress)
        res = ncclSuccess; /* non-blocking: the caller polls the new comm */
    else if (res != ncclSuccess)
        geoCommSetError(comm, "ncclCommShrink: %s", geoThreadError());
out:
    free(excluded);
    return res;
}

/* ---- teardown --------------------------------------------------------- */

static void join_init(struct ncclComm *comm)
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
    join_init(comm);
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
    join_init(comm);
    comm_free(comm);
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
    join_init(comm);
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
    comm_free_ex(comm, 1);
    return ncclSuccess;
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclCommRevoke") != ncclSuccess, ncclInvalidArgument,
                  "ncclCommRevoke: comm is NULL or not a live communicator");
    GEO_RETURN_IF(revokeFlags != NCCL_REVOKE_DEFAULT, ncclInvalidArgument,
                  "ncclCommRevoke: revokeFlags must be 0");
    geoCommSetError(comm, "communicator revoked");
    if (comm->net.ops && comm->net.state)
        geoNetBreak(&comm->net);
    return ncclSuccess;
}

/* ---- queries ---------------------------------------------------------- */

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

/* ---- memory and registration ------------------------------------------- */

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
                geoCommSetError(comm, "ncclCommRegister: NVIDIA's NCCL refused the buffer: %s",
                                real->GetErrorString(r));
                return r;
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
        if (real && real->CommWindowRegister == NULL) {
            geoCommSetError(comm, "ncclCommWindowRegister: the real NCCL at %s (version %d) "
                            "has no ncclCommWindowRegister", real->path, real->version);
            return ncclInvalidUsage;
        }
        GEO_CHECK(geoDevRealComm(comm, "ncclCommWindowRegister", &rc));
        ncclResult_t r;
        GEO_REAL_CALL(r, real, CommWindowRegister, (geoRealComm)rc, buff, size, win, winFlags);
        return r;
    }
    geoCommSetError(comm, "ncclCommWindowRegister: symmetric memory windows are supported by "
                    "GeoCCL only on device memory of a single-region communicator on a GPU "
                    "with NVIDIA's NCCL loaded (%s)",
                    comm->regions.nregions != 1 ? "this one spans several regions"
                    : comm->cuda_dev < 0        ? "this one has no GPU"
                                                : "the buffer is not device memory");
    return ncclInvalidUsage;
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
    geoCommSetError(comm, "ncclCommWindowDeregister: no window was registered (GeoCCL "
                    "registers windows only on device memory of a single-region communicator)");
    return ncclInvalidUsage;
}

/* ---- PreMulSum --------------------------------------------------------- */

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclRedOpCreatePreMulSum") != ncclSuccess,
                  ncclInvalidArgument, "ncclRedOpCreatePreMulSum: NULL or dead comm");
    GEO_RETURN_IF(op == NULL || scalar == NULL, ncclInvalidArgument,
                  "ncclRedOpCreatePreMulSum: op or scalar is NULL");
    GEO_RETURN_IF(geoTypeSize(datatype) == 0, ncclInvalidArgument,
                  "ncclRedOpCreatePreMulSum: datatype %d is invalid", (int)datatype);
    GEO_RETURN_IF(residence != ncclScalarDevice && residence != ncclScalarHostImmediate,
                  ncclInvalidArgument, "ncclRedOpCreatePreMulSum: residence %d is invalid",
                  (int)residence);
    pthread_mutex_lock(&comm->lock);
    for (int i = 0; i < GEO_MAX_REDOPS; i++) {
        geoRedOp *r = &comm->redops[i];
        if (r->used)
            continue;
        r->used = 1;
        r->datatype = datatype;
        r->residence = residence;
        memset(r->scalar, 0, sizeof(r->scalar));
        memcpy(r->scalar, scalar, geoTypeSize(datatype));
        r->ptr = scalar;
        r->real_valid = 0; /* the real twin is made at its first device use */
        *op = (ncclRedOp_t)(ncclNumOps + i);
        pthread_mutex_unlock(&comm->lock);
        return ncclSuccess;
    }
    pthread_mutex_unlock(&comm->lock);
    geoCommSetError(comm, "ncclRedOpCreatePreMulSum: all %d op handles are in use",
                    GEO_MAX_REDOPS);
    return ncclInvalidUsage;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclRedOpDestroy") != ncclSuccess, ncclInvalidArgument,
                  "ncclRedOpDestroy: NULL or dead comm");
    GEO_RETURN_IF(op < ncclNumOps || op - ncclNumOps >= GEO_MAX_REDOPS ||
                      !comm->redops[op - ncclNumOps].used,
                  ncclInvalidArgument, "ncclRedOpDestroy: op %d is not a live handle", (int)op);
    geoDevRedOpDestroy(comm, op - ncclNumOps);
    pthread_mutex_lock(&comm->lock);
    comm->redops[op - ncclNumOps].used = 0;
    pthread_mutex_unlock(&comm->lock);
    return ncclSuccess;
}
