/* Group semantics.  Within a group the point-to-point operations of one
 * communicator are posted together (so any exchange pattern completes),
 * then its collectives run in call order.  Every rank applies the same
 * rule, so the per-peer message order stays matched.  A group spanning
 * several communicators (one thread driving several ranks, as with
 * ncclCommInitAll) runs one thread per communicator. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/core/comm.h"
#include "comm/api/group.h"
#include "comm/device/coll_device.h"
#include "comm/device/nccl_real.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct geoInitJob {
    ncclComm_t *out;
    int nranks, rank;
    ncclUniqueId id;
    ncclConfig_t config;
    int has_config;
    int dev;                /* the caller's current device at the call */
    ncclResult_t res;
    struct geoInitJob *next;
} geoInitJob;


static __thread geoOp *group_ops, *group_ops_tail;
static __thread geoInitJob *group_inits;


ncclResult_t geoGroupAddOp(const geoOp *op)
{
    geoOp *c = malloc(sizeof(*c));
    GEO_RETURN_IF(c == NULL, ncclSystemError, "out of memory");
    *c = *op;
    c->next = NULL;
    if (group_ops_tail)
        group_ops_tail->next = c;
    else
        group_ops = c;
    group_ops_tail = c;
    return ncclSuccess;
}

ncclResult_t geoGroupAddInit(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                             const ncclConfig_t *config)
{
    geoInitJob *j = calloc(1, sizeof(*j));
    GEO_RETURN_IF(j == NULL, ncclSystemError, "out of memory");
    j->out = out;
    j->nranks = nranks;
    j->rank = rank;
    j->id = *id;
    j->dev = geoDevCurrent();
    if (config) {
        j->config = *config;
        j->has_config = 1;
    }
    j->next = group_inits;
    group_inits = j;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    geoGroupDepth++;
    return ncclSuccess;
}

ncclResult_t geoRunCommOps(struct ncclComm *comm, geoOp *p2p, geoOp *colls)
{
    ncclResult_t res = ncclSuccess;
    __atomic_add_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    /* Host operations share the transport with the exchange thread of
     * cross-region device all-reduces: let it finish first. */
    res = geoDevDrain(comm);
    if (res != ncclSuccess) {
        __atomic_sub_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
        return res;
    }
    if (p2p) {
        geoErrSetOp(&comm->err, "grouped send/recv #%llu",
                 (unsigned long long)++comm->op_seq);
        res = geoP2pRun(comm, p2p);
    }
    for (geoOp *o = colls; o && res == ncclSuccess; o = o->next) {
        geoErrSetOp(&comm->err, "%s #%llu (%zu elements)",
                 geoOpTypeName(o->type), (unsigned long long)++comm->op_seq, o->count);
        res = geoCollRun(o);
    }
    __atomic_sub_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    return res;
}

typedef struct {
    struct ncclComm *comm;
    geoOp *p2p, *colls;
    ncclResult_t res;
    pthread_t thread;
    int started;
} commWork;

static void *comm_work_main(void *arg)
{
    commWork *w = arg;
    geoDebugSetRank(w->comm->rank);
    w->res = geoRunCommOps(w->comm, w->p2p, w->colls);
    return NULL;
}

static void *init_job_main(void *arg)
{
    geoInitJob *j = arg;
    geoInitDevice = j->dev;
    j->res = geoCommInitInternal(j->out, j->nranks, &j->id, j->rank,
                                 j->has_config ? &j->config : NULL, 1);
    return NULL;
}

static void free_op_list(geoOp *o)
{
    while (o) {
        geoOp *n = o->next;
        free(o);
        o = n;
    }
}

static ncclResult_t run_inits(geoInitJob *jobs)
{
    ncclResult_t res = ncclSuccess;
    int n = 0, i = 0;
    for (geoInitJob *j = jobs; j; j = j->next)
        n++;
    pthread_t *t = calloc((size_t)n, sizeof(*t));
    int *started = calloc((size_t)n, sizeof(int));
    if (t == NULL || started == NULL)
        res = GEO_ERR(NULL, ncclSystemError, "ncclGroupEnd: out of memory for %d inits", n);
    for (geoInitJob *j = jobs; j && res == ncclSuccess; j = j->next, i++) {
        int rc = pthread_create(&t[i], NULL, init_job_main, j);
        started[i] = rc == 0;
        if (rc != 0)
            j->res = GEO_ERR(NULL, ncclSystemError, "ncclGroupEnd: cannot start the thread of "
                             "the init of rank %d: %s", j->rank, strerror(rc));
    }
    i = 0;
    for (geoInitJob *j = jobs; j; j = j->next, i++) {
        if (started && started[i])
            pthread_join(t[i], NULL);
        else if (res != ncclSuccess)
            j->res = res; /* out of memory, reported above */
        /* ncclInProgress (non-blocking init) is reported unless something failed. */
        if (j->res != ncclSuccess && (res == ncclSuccess || res == ncclInProgress))
            res = j->res;
    }
    free(t);
    free(started);
    return res;
}

ncclResult_t ncclGroupEnd(void)
{
    ncclResult_t res = ncclSuccess;
    GEO_RETURN_IF(geoGroupDepth <= 0, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--geoGroupDepth > 0)
        return ncclSuccess;
    /* Device operations of single-region communicators went to the real
     * NCCL inside its own group: end it first, so that they are issued
     * whatever happens to the host ones. */
    ncclResult_t real_res = geoNcclRealGroupClose();

    geoInitJob *inits = group_inits;
    geoOp *ops = group_ops;
    group_inits = NULL;
    group_ops = group_ops_tail = NULL;

    if (inits) {
        res = run_inits(inits);
        if (res == ncclInProgress && ops == NULL) {
            while (inits) {
                geoInitJob *n = inits->next;
                free(inits);
                inits = n;
            }
            return ncclInProgress;
        }
        while (inits) {
            geoInitJob *n = inits->next;
            free(inits);
            inits = n;
        }
    }

    /* Split by communicator, keeping call order. */
    int ncomm = 0;
    commWork *work = NULL;
    for (geoOp *o = ops; o; o = o->next) {
        int k;
        for (k = 0; k < ncomm; k++)
            if (work[k].comm == o->comm)
                break;
        if (k == ncomm) {
            commWork *nw = realloc(work, sizeof(*work) * (size_t)(ncomm + 1));
            if (nw == NULL) {
                res = GEO_ERR(NULL, ncclSystemError, "ncclGroupEnd: out of memory");
                break;
            }
            work = nw;
            memset(&work[ncomm], 0, sizeof(*work));
            work[ncomm++].comm = o->comm;
        }
    }
    if (res == ncclSuccess && ncomm > 0) {
        geoOp *o = ops;
        geoOp **tails_p2p = calloc((size_t)ncomm, sizeof(geoOp *));
        geoOp **tails_col = calloc((size_t)ncomm, sizeof(geoOp *));
        if (!tails_p2p || !tails_col) {
            res = GEO_ERR(NULL, ncclSystemError, "ncclGroupEnd: out of memory");
        } else {
            while (o) {
                geoOp *n = o->next;
                int k = 0;
                while (work[k].comm != o->comm)
                    k++;
                o->next = NULL;
                int is_p2p = o->type == GEO_OP_SEND || o->type == GEO_OP_RECV;
                geoOp **head = is_p2p ? &work[k].p2p : &work[k].colls;
                geoOp **tail = is_p2p ? &tails_p2p[k] : &tails_col[k];
                if (*tail)
                    (*tail)->next = o;
                else
                    *head = o;
                *tail = o;
                o = n;
            }
            ops = NULL;
            if (ncomm == 1) {
                work[0].res = geoRunCommOps(work[0].comm, work[0].p2p, work[0].colls);
            } else {
                for (int k = 0; k < ncomm; k++)
                    work[k].started =
                        pthread_create(&work[k].thread, NULL, comm_work_main, &work[k]) == 0;
                /* A communicator whose thread could not start runs here. */
                for (int k = 0; k < ncomm; k++)
                    if (!work[k].started)
                        work[k].res = geoRunCommOps(work[k].comm, work[k].p2p, work[k].colls);
                for (int k = 0; k < ncomm; k++)
                    if (work[k].started)
                        pthread_join(work[k].thread, NULL);
            }
            for (int k = 0; k < ncomm; k++)
                if (work[k].res != ncclSuccess && res == ncclSuccess)
                    res = work[k].res;
        }
        free(tails_p2p);
        free(tails_col);
    }
    for (int k = 0; k < ncomm; k++) {
        free_op_list(work[k].p2p);
        free_op_list(work[k].colls);
    }
    free(work);
    free_op_list(ops);
    if (res == ncclSuccess && real_res != ncclSuccess)
        res = real_res;
    return res;
}

ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    int had_host_ops = group_ops != NULL || group_inits != NULL;
    /* Dropping the group keeps the thread's state clean either way. */
    free_op_list(group_ops);
    group_ops = group_ops_tail = NULL;
    while (group_inits) {
        geoInitJob *n = group_inits->next;
        free(group_inits);
        group_inits = n;
    }
    geoGroupDepth = 0;
    GEO_RETURN_IF(simInfo == NULL || simInfo->magic != NCCL_SIM_INFO_MAGIC, ncclInvalidArgument,
                  "ncclGroupSimulateEnd: simInfo must start from NCCL_SIM_INFO_INITIALIZER");
    /* A group of device operations of single-region communicators only:
     * NVIDIA's NCCL has the time model for what it would run. */
    if (geoNcclRealGroupIsOpen() && !had_host_ops)
        return geoNcclRealGroupSimulate(simInfo);
    if (geoNcclRealGroupIsOpen())
        geoNcclRealGroupSimulate(simInfo); /* ends the real group; no estimate for the rest */
    return GEO_ERR(NULL, ncclInvalidUsage,
                   "ncclGroupSimulateEnd: GeoCCL has no time model for host-buffer or "
                   "cross-region operations yet (it comes with the topology probe); the "
                   "group's operations were dropped");
}
