/* Child communicators made from a parent: ncclCommSplit (by color and key,
 * every rank of the parent calls) and ncclCommShrink (without the ranks
 * listed, from a healthy parent or, with NCCL_SHRINK_ABORT, from a broken
 * one).  Either agrees on a unique id whose secret every member derives
 * from the parent's, so that it never crosses the network, then runs an
 * ordinary init with the parent's topology handed down (geoInitParent). */
#include "config.h"
#include "comm/api/group.h"
#include "comm/api/init_internal.h"
#include "comm/base/checks.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/coll/coll.h"
#include "comm/core/comm.h"
#include "comm/device/coll_device.h"

#include <stdlib.h>
#include <string.h>

static ncclResult_t allgather_bytes(struct ncclComm *comm, const void *send, void *recv,
                                   size_t bytes)
{
    geoOp op = {.type = GEO_OP_ALLGATHER, .comm = comm, .sendbuff = send, .recvbuff = recv,
                .count = bytes, .dt = ncclUint8, .op = ncclSum, .root = 0, .next = NULL};
    return geoRunCommOps(comm, NULL, &op);
}

/* A child is of the parent's elastic job: it keeps the job key the parent
 * derived, so that growing it runs no scrypt again (comm.h). */
static void hand_down_job_key(const struct ncclComm *parent, struct ncclComm *child)
{
    if (child == NULL || !parent->job_key_set)
        return;
    memcpy(child->job_key, parent->job_key, sizeof(child->job_key));
    child->job_key_set = 1;
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
    GEO_CHECK(geoCommCheckConfig(config));
    GEO_CHECK(geoCommAsyncError(comm));
    *newcomm = NULL;
    all = malloc(sizeof(int32_t) * 2 * (size_t)comm->nranks);
    ids = calloc((size_t)comm->nranks, sizeof(ncclUniqueId));
    if (all == NULL || ids == NULL) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "ncclCommSplit: out of memory");
        goto out;
    }
    GEO_CHECK_GOTO(allgather_bytes(comm, mine, all, sizeof(mine)), res, out);

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
        GEO_CHECK_GOTO(geoBootstrapNewRootKeyed(child, newsize, &myid), res, out);
        geoBootstrapSetSecret(&myid, NULL);
    }
    GEO_CHECK_GOTO(allgather_bytes(comm, &myid, ids, sizeof(myid)), res, out);
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
    if (res == ncclSuccess)
        hand_down_job_key(comm, *newcomm);
out:
    free(all);
    if (ids != NULL)
        geoWipe(ids, sizeof(ncclUniqueId) * (size_t)comm->nranks); /* the leader's holds a secret */
    free(ids);
    return res;
}

/* ---- shrink ---------------------------------------------------------- */

/* Every validation failure says why in the parent's error text. */
#define SHRINK_BAD(comm, ...) \
    return GEO_COMM_ERR((comm), ncclInvalidArgument, "ncclCommShrink: " __VA_ARGS__)

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
                                   int newsize, uint32_t counter, ncclUniqueId *id)
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
        made = geoBootstrapNewRootKeyed(child, newsize, &msg.id);
        geoBootstrapSetSecret(&msg.id, NULL);
        msg.ok = made == ncclSuccess;
        /* Sent even when it failed, so that nobody waits for nothing. */
        res = geoFanOut(comm, leader, excluded, &msg, sizeof(msg), "ncclCommShrink");
        if (made != ncclSuccess) { /* reported on this thread: carried here */
            geoErrSet(&comm->err, "ncclCommShrink: cannot start the new communicator's "
                      "bootstrap root: %s", geoThreadError());
            res = made;
        }
    } else {
        GEO_CHECK_GOTO(geoFanOut(comm, leader, excluded, &msg, sizeof(msg), "ncclCommShrink"),
                       res, out);
        if (!msg.ok)
            res = GEO_COMM_ERR(comm, ncclRemoteError, "ncclCommShrink: rank %d, the lowest "
                               "survivor, could not start the new communicator's bootstrap "
                               "root", leader);
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
    if (geoCommCheckConfig(config) != ncclSuccess) { /* which has reported why */
        geoErrSet(&comm->err, "ncclCommShrink: %s", geoThreadError());
        return ncclInvalidArgument;
    }
    excluded = calloc((size_t)comm->nranks, 1);
    if (excluded == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "ncclCommShrink: out of memory");
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
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "ncclCommShrink: the communicator's "
                            "non-blocking init has not finished (poll ncclCommGetAsyncError "
                            "first)");
    }
    if (state != ncclSuccess && shrinkFlags == NCCL_SHRINK_DEFAULT) {
        free(excluded);
        return GEO_COMM_ERR(comm, state, "ncclCommShrink: the communicator is broken (%s: %s); "
                            "NCCL_SHRINK_ABORT builds the new one without it",
                            ncclGetErrorString(state), geoErrLast(&comm->err));
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
        GEO_CHECK_GOTO(shrink_id_send(comm, excluded, leader, newsize, counter, &id), res, out);
    } else {
        /* Asked for, so no failure to report: the text is what the
         * parent's later calls fail with (ncclGetLastError). */
        if (state == ncclSuccess) {
            geoErrSet(&comm->err, "communicator revoked by ncclCommShrink(NCCL_SHRINK_ABORT)");
            geoInfo(GEO_LOG_INIT, "%s", geoErrLast(&comm->err));
        }
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
            if (res != ncclSuccess) { /* reported on this thread: carried here */
                geoErrSet(&comm->err, "ncclCommShrink: %s", geoThreadError());
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
    else if (res != ncclSuccess) /* the child's init reported why */
        geoErrSet(&comm->err, "ncclCommShrink: %s", geoThreadError());
    if (res == ncclSuccess) {
        hand_down_job_key(comm, *newcomm);
        if (*newcomm != NULL && geoCommEfInherit(comm, *newcomm) != ncclSuccess)
            geoWarn(GEO_LOG_INIT, "ncclCommShrink: out of memory carrying the error-feedback "
                    "registrations over: the new communicator has none");
    }
out:
    free(excluded);
    return res;
}
