/* Making a communicator: the unique id, and the init entry points
 * (blocking, non-blocking, all devices of a process, scalable, and the
 * inits a group or a split runs through geoCommInitInternal).  Each
 * checks its arguments, makes the handle with its settings and identity,
 * then runs the connect stage (connect.c) now or on a thread of its own
 * (non-blocking: the caller polls ncclCommGetAsyncError). */
#include "config.h"
#include "comm/api/group.h"
#include "comm/api/init_internal.h"
#include "comm/base/checks.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/core/comm.h"
#include "comm/device/coll_device.h"
#include "comm/device/nccl_real.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    const geoNcclRealLib *real;
    if (geoNcclRealInCall() && (real = geoNcclReal()) != NULL)
        return real->GetUniqueId(uniqueId);
    GEO_RETURN_IF(uniqueId == NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    return geoBootstrapGetUniqueId(uniqueId);
}

typedef struct {
    struct ncclComm *comm;
    geoUniqueIdInternal id;
    int allow_env_root;
} initArgs;

static void *nonblocking_init_main(void *arg)
{
    initArgs *a = arg;
    ncclResult_t res = geoCommConnect(a->comm, &a->id, a->allow_env_root);
    /* A cause reported on this thread only (before the communicator's
     * state was at hand, e.g. a listen) goes where the caller looks. */
    if (res != ncclSuccess && geoErrLast(&a->comm->err)[0] == '\0')
        geoErrSet(&a->comm->err, "%s", geoThreadError());
    __atomic_store_n(&a->comm->err.async_error, res, __ATOMIC_RELEASE);
    free(a);
    return NULL;
}

__thread const struct ncclComm *geoInitParent;
__thread const geoTopoInherit *geoInitInherit;
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
    GEO_CHECK(geoCommCheckConfig(config));
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
        return GEO_ERR(NULL, ncclSystemError, "out of memory for the parent's topology");
    }
    if (geoInitParent == NULL && geoInitInherit != NULL &&
        geoTopoInheritCopy(geoInitInherit, &comm->inherit) != 0) {
        geoScratchFree(&comm->scratch);
        pthread_mutex_destroy(&comm->lock);
        pthread_mutex_destroy(&comm->ef_lock);
        geoErrDestroy(&comm->err);
        free(comm);
        return GEO_ERR(NULL, ncclSystemError, "out of memory for the members' topology");
    }
    /* NCCL's rule: the communicator belongs to the device current in the
     * caller's thread at the call (or devlist's entry); a thread of our own
     * that runs the init on the caller's behalf passes it in geoInitDevice,
     * since its own current device is 0. */
    comm->cuda_dev = geoInitDevice != GEO_INIT_DEV_CURRENT ? geoInitDevice : geoDevCurrent();
    geoCommApplySettings(comm, config);
    memcpy(comm->secret, id.secret, sizeof(comm->secret));
    comm->nosecret = (id.flags & GEO_ID_NOSECRET) != 0;
    comm->comm_hash = id.nonce ^ ((uint64_t)geoAddrPort(&id.root) << 48) ^
                      (uint64_t)id.root.sin.sin_addr.s_addr;
    geoErrSetOp(&comm->err, "init");

    if (!comm->blocking) {
        initArgs *a = malloc(sizeof(*a));
        if (a == NULL) {
            geoCommFree(comm);
            return GEO_ERR(NULL, ncclSystemError, "out of memory");
        }
        a->comm = comm;
        a->id = id;
        a->allow_env_root = allow_env_root;
        comm->err.async_error = ncclInProgress;
        int rc = pthread_create(&comm->init_thread, NULL, nonblocking_init_main, a);
        if (rc != 0) {
            free(a);
            geoCommFree(comm);
            return GEO_ERR(NULL, ncclSystemError, "cannot start the init thread: %s",
                           strerror(rc));
        }
        comm->init_thread_live = 1;
        *out = comm;
        return ncclInProgress;
    }
    res = geoCommConnect(comm, &id, allow_env_root);
    if (res != ncclSuccess) {
        /* Reported (logged) where it was found; the text stays with the
         * thread, as the communicator goes. */
        if (geoErrLast(&comm->err)[0] != '\0')
            geoErrSet(NULL, "%s", geoErrLast(&comm->err));
        geoCommFree(comm);
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
    GEO_CHECK(geoCommCheckConfig(config));
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
    GEO_CHECK(geoBootstrapNewRoot(ndev, &id));
    allArgs *a = calloc((size_t)ndev, sizeof(*a));
    pthread_t *t = calloc((size_t)ndev, sizeof(*t));
    if (a == NULL || t == NULL) {
        free(a);
        free(t);
        return GEO_ERR(NULL, ncclSystemError, "out of memory");
    }
    for (int i = 0; i < ndev; i++) {
        a[i] = (allArgs){.out = &comms[i], .n = ndev, .rank = i, .id = id, .res = ncclSuccess,
                         .dev = !have_gpu ? -1 : devlist ? devlist[i] : i};
        comms[i] = NULL;
        int rc = pthread_create(&t[i], NULL, init_all_main, &a[i]);
        if (rc != 0) {
            a[i].res = GEO_ERR(NULL, ncclSystemError, "ncclCommInitAll: cannot start the init "
                               "thread of rank %d: %s", i, strerror(rc));
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
                geoCommFree(comms[i]);
                comms[i] = NULL;
            }
    free(a);
    free(t);
    return res;
}
