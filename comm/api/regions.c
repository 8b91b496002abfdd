/* The regions of a communicator: this process's label (GEOCCL_REGION, the
 * topology file, or none), the region map and the two rings built from the
 * bootstrap table's labels, the probe that measures regions where none are
 * labelled, and the topology file rank 0 writes so that the next start
 * loads what the probe found instead of measuring again.  Nothing
 * authenticates a label or the file: they shape the plan (regions, rates),
 * never which connections are encrypted (connect.c). */
#include "config.h"
#include "comm/api/init_internal.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/coll/coll.h"
#include "comm/core/comm.h"
#include "topology/topofile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void geoCommRingFree(geoRing *r)
{
    free(r->blk);
    free(r->pos_of);
    memset(r, 0, sizeof(*r));
}

/* This process's region label: GEOCCL_REGION, else the topology file's
 * answer for my rank, address or host name, else "" (one region). */
ncclResult_t geoCommResolveRegion(struct ncclComm *comm, const geoSockAddr *addr,
                                  const char *host, char out[TOPO_REGION_LABEL_LEN])
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
        if (strlen(label) >= TOPO_REGION_LABEL_LEN)
            return GEO_COMM_ERR(comm, ncclInvalidUsage, "init: GEOCCL_REGION '%s' is longer "
                                "than %d characters", label, TOPO_REGION_LABEL_LEN - 1);
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
        if (topoFileLoad(path, &comm->topo_file, err, sizeof(err)) != 0)
            return GEO_COMM_ERR(comm, ncclInvalidUsage, "init: %s", err);
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
    geoCommRingFree(&comm->ring);
    geoCommRingFree(&comm->region_ring);
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
    return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory for the region map");
}

/* Cache what the probe found where GEOCCL_TOPO_FILE points (rank 0).  A
 * failure to write is logged, not fatal: the communicator works.  The
 * file is written under a fresh name that mkstemp creates (O_EXCL, 0600)
 * beside it and renamed over it, so that a link planted in a shared
 * directory under a name we would use cannot make us write through it, and
 * a reader never sees half a file; then it is made readable by all, like
 * the files a next start (perhaps another user's) loads. */
void geoCommWriteTopoFile(struct ncclComm *comm)
{
    const char *path = geoParamStrLive(GEO_PARAM_TOPO_FILE);
    char tmp[4096];
    if (path == NULL || snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path) >= (int)sizeof(tmp))
        return;
    int fd = mkstemp(tmp);
    if (fd < 0) {
        geoWarn(GEO_LOG_TOPO, "cannot write topology file %s: cannot create a file beside it: "
                "%s", path, strerror(errno));
        return;
    }
    FILE *f = fdopen(fd, "w");
    if (f == NULL) {
        geoWarn(GEO_LOG_TOPO, "cannot write topology file %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return;
    }
    int bad = geoTopoWrite(&comm->topo, &comm->regions, comm->nranks, f);
    bad |= fchmod(fd, 0644) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        geoWarn(GEO_LOG_TOPO, "cannot write topology file %s: %s", path, strerror(errno));
        unlink(tmp);
        return;
    }
    geoInfo(GEO_LOG_TOPO, "wrote topology file %s: the next start loads it and skips the probe",
            path);
}

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
    hierXferPlan plan;
    *ranks = NULL;
    *n = 0;
    GEO_CHECK(geoHierExchangePlan(comm, (size_t)1 << 22, &plan));
    int *out = malloc(sizeof(int) * (size_t)(plan.ntx1 + 1)), k = 0;
    if (out == NULL) {
        geoHierExchangePlanFree(&plan);
        return GEO_COMM_ERR(comm, ncclSystemError,
                            "init: out of memory planning the warm-up");
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

ncclResult_t geoCommProbe(struct ncclComm *comm)
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
