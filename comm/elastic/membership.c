/* A communicator's membership in the store (elastic.h): at init each rank
 * takes a lease and records itself as a member under it; a thread of the
 * communicator renews the lease every third of its life and, in the same
 * pass, counts the joiners waiting (what geocclCommJoinersWaiting reports,
 * so that call sends nothing).  A process that dies stops renewing, its
 * lease runs out and its records go: that is how survivors tell the dead
 * from the slow (failed.c).  Rank 0 also records the communicator's ranks
 * and regions under comms/, for people and tools. */
#include "config.h"
#include "comm/elastic/elastic.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "geoccl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int geoElasticConfigured(void)
{
    const char *spec = geoParamStr(GEO_PARAM_ELASTIC_ETCD);
    const char *cid = geoParamStrLive(GEO_PARAM_COMM_ID);
    return (spec != NULL && spec[0] != '\0') ||
           (geoParamIsSet(GEO_PARAM_ELASTIC_JOB) && cid != NULL && cid[0] != '\0');
}

ncclResult_t geoElasticStoreOpen(geoEtcd *e, char prefix[96], geoErr *err)
{
    const char *spec = geoParamStr(GEO_PARAM_ELASTIC_ETCD);
    const char *job = geoParamStr(GEO_PARAM_ELASTIC_JOB);
    char why[256], fallback[GEO_ADDR_STRLEN + 8];
    if (spec == NULL || spec[0] == '\0') {
        const char *cid = geoParamStrLive(GEO_PARAM_COMM_ID);
        geoSockAddr root, at;
        if (!geoParamIsSet(GEO_PARAM_ELASTIC_JOB) || cid == NULL || cid[0] == '\0')
            return GEO_ERR(err, ncclInvalidUsage, "elastic: no store: set GEOCCL_ELASTIC_ETCD to "
                           "the etcd members (host:port,...), or GEOCCL_ELASTIC_JOB with "
                           "GEOCCL_COMM_ID (the first root's process keeps the records)");
        GEO_CHECK(geoAddrFromString(cid, &root));
        geoElasticStoreAddr(&root, &at);
        geoAddrToString(&at, fallback);
        spec = fallback;
    }
    if (job == NULL || job[0] == '\0' || strlen(job) > 48 || strchr(job, '/'))
        return GEO_ERR(err, ncclInvalidUsage, "elastic: GEOCCL_ELASTIC_JOB='%s' must be 1 to 48 "
                       "characters without '/'", job ? job : "");
    if (geoEtcdInit(e, spec, (double)geoParamInt(GEO_PARAM_ELASTIC_TIMEOUT), why,
                    sizeof(why)) != 0)
        return GEO_ERR(err, ncclInvalidUsage, "elastic: store %s: %s", spec, why);
    snprintf(prefix, 96, "/geoccl/%s/", job);
    return ncclSuccess;
}

/* Sleep up to sec or until stop is set; 1 when stopped. */
static int nap(geoElastic *el, double sec)
{
    struct timespec ts;
    int stop;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)((sec - (long)sec) * 1e9);
    ts.tv_sec += (time_t)sec + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_mutex_lock(&el->lock);
    while (!(stop = el->stop))
        if (pthread_cond_timedwait(&el->cv, &el->lock, &ts) == ETIMEDOUT)
            break;
    stop = el->stop;
    pthread_mutex_unlock(&el->lock);
    return stop;
}

/* The lease ran out (the store was unreachable, or without a leader,
 * longer than the lease lives): take a new one and write the member record
 * again, so that a later failure still finds this rank alive. */
static ncclResult_t re_lease(geoElastic *el, geoEtcd *store, char *why)
{
    int64_t old = __atomic_load_n(&el->lease, __ATOMIC_ACQUIRE), lease;
    GEO_CHECK(geoEtcdLeaseGrant(store, el->ttl, &lease, why));
    GEO_CHECK(geoEtcdPut(store, el->member_key, el->member_val, el->member_len, lease, why));
    __atomic_store_n(&el->lease, lease, __ATOMIC_RELEASE);
    geoWarn(GEO_LOG_INIT, "elastic: lease %" PRIx64 " had run out; %s is recorded again under "
            "lease %" PRIx64, old, el->member_key, lease);
    return ncclSuccess;
}

/* Renew the lease; count the joiners.  A failure is logged once per
 * change of state (the store may be down for a while), never fatal: the
 * communicator's own traffic does not depend on the store.  Renewals get
 * half the lease's life over all members, so one that hangs (no leader)
 * does not let the lease run out while another could renew it. */
static void *renew_main(void *arg)
{
    geoElastic *el = arg;
    double period = el->ttl / 3.0, poll_s = geoParamInt(GEO_PARAM_ELASTIC_POLL_MS) * 1e-3;
    double next_renew = geoNow() + period;
    int failing = 0;
    char key[GEO_ELASTIC_KEY_LEN], why[GEO_ETCD_WHY_LEN];
    geoEtcd quick = el->store;
    quick.timeout = el->ttl / 2.0;
    if (poll_s < 0.05)
        poll_s = 0.05;
    snprintf(key, sizeof(key), "%sjoin/", el->prefix);
    do {
        ncclResult_t r = ncclSuccess;
        if (geoNow() >= next_renew) {
            int64_t ttl = 0;
            r = geoEtcdLeaseKeepAlive(&quick, __atomic_load_n(&el->lease, __ATOMIC_ACQUIRE),
                                      &ttl, why);
            if (r == ncclSuccess && ttl <= 0)
                r = re_lease(el, &quick, why);
            next_renew = geoNow() + (r == ncclSuccess ? period : 0.2);
        }
        geoEtcdRange range;
        if (r == ncclSuccess && (r = geoEtcdGet(&quick, key, 1, 1, &range, why)) ==
                                    ncclSuccess) {
            __atomic_store_n(&el->joiners, (int)range.count, __ATOMIC_RELEASE);
            geoEtcdRangeFree(&range);
        }
        if (r != ncclSuccess && !failing)
            geoWarn(GEO_LOG_INIT, "elastic: the store does not answer (%s); membership "
                    "records may lapse", why);
        else if (r == ncclSuccess && failing)
            geoInfo(GEO_LOG_INIT, "elastic: the store answers again");
        failing = r != ncclSuccess;
    } while (!nap(el, poll_s < period ? poll_s : period));
    return NULL;
}

ncclResult_t geoElasticAttach(struct ncclComm *comm)
{
    char why[GEO_ETCD_WHY_LEN], key[GEO_ELASTIC_KEY_LEN];
    if (!geoElasticConfigured() || comm->nosecret)
        return ncclSuccess;
    geoElastic *el = calloc(1, sizeof(*el));
    if (el == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory");
    pthread_mutex_init(&el->lock, NULL);
    pthread_cond_init(&el->cv, NULL);
    if (geoElasticStoreOpen(&el->store, el->prefix, &comm->err) != ncclSuccess)
        goto fail;
    const char *spec = el->store.names[0];
    /* A store request of init must not hold init for a minute. */
    el->store.timeout = comm->timeout < 10 ? comm->timeout : 10;
    snprintf(el->comm_dir, sizeof(el->comm_dir), "%sc/%016" PRIx64 "/", el->prefix,
             comm->comm_hash);
    geoElasticCommKey(comm->secret, el->comm_key);
    el->ttl = (int)geoParamInt(GEO_PARAM_ELASTIC_TTL);
    if (el->ttl < 2)
        el->ttl = 2;
    if (geoEtcdLeaseGrant(&el->store, el->ttl, &el->lease, why) != ncclSuccess) {
        geoWarn(GEO_LOG_INIT, "elastic: cannot take a lease from the store at %s (%s): this "
                "communicator runs without membership records", spec, why);
        goto fail;
    }
    geoElasticMember me;
    memset(&me, 0, sizeof(me));
    me.magic = GEO_ELASTIC_MAGIC;
    me.rank = comm->rank;
    me.nranks = comm->nranks;
    me.pid = (int32_t)getpid();
    snprintf(me.region, sizeof(me.region), "%s", comm->peers[comm->rank].region);
    snprintf(me.host, sizeof(me.host), "%s", comm->peers[comm->rank].net.host);
    snprintf(el->member_key, sizeof(el->member_key), "%sm/%d", el->comm_dir, comm->rank);
    el->member_val = geoElasticSeal(el->comm_key, el->member_key, &me, sizeof(me),
                                    &el->member_len);
    ncclResult_t r = el->member_val ? geoEtcdPut(&el->store, el->member_key, el->member_val,
                                                 el->member_len, el->lease, why)
                                    : ncclSystemError;
    if (r == ncclSuccess && comm->rank == 0) {
        /* The communicator's ranks and regions, readable by anyone with the
         * store (etcdctl get --prefix /geoccl/<job>/comms/); not signed: no
         * decision is taken on it. */
        size_t cap = 64 + (size_t)comm->nranks * 40, len = 0;
        char *text = malloc(cap);
        if (text != NULL) {
            len += (size_t)snprintf(text, cap, "nranks=%d", comm->nranks);
            for (int i = 0; i < comm->nranks && len < cap; i++)
                len += (size_t)snprintf(text + len, cap - len, " %d:%.31s", i,
                                        comm->peers[i].region[0] ? comm->peers[i].region : "-");
            snprintf(key, sizeof(key), "%scomms/%016" PRIx64, el->prefix, comm->comm_hash);
            r = geoEtcdPut(&el->store, key, text, len < cap ? len : cap - 1, el->lease, why);
            free(text);
        }
    }
    if (r != ncclSuccess) {
        geoWarn(GEO_LOG_INIT, "elastic: cannot record rank %d in the store at %s (%s): this "
                "communicator runs without membership records", comm->rank, spec, why);
        goto fail;
    }
    el->store.timeout = (double)geoParamInt(GEO_PARAM_ELASTIC_TIMEOUT);
    int rc = pthread_create(&el->thread, NULL, renew_main, el);
    if (rc != 0) {
        geoWarn(GEO_LOG_INIT, "elastic: cannot start the lease thread: %s", strerror(rc));
        goto fail;
    }
    el->thread_live = 1;
    comm->elastic = el;
    geoInfo(GEO_LOG_INIT, "elastic: rank %d recorded as a member of %s in the store (%s), "
            "lease %" PRIx64 " of %d s", comm->rank, el->comm_dir, spec, el->lease, el->ttl);
    return ncclSuccess;
fail:
    pthread_cond_destroy(&el->cv);
    pthread_mutex_destroy(&el->lock);
    geoWipe(el->comm_key, sizeof(el->comm_key));
    free(el->member_val);
    free(el);
    return ncclSuccess;
}

void geoElasticDetach(struct ncclComm *comm, int abort)
{
    geoElastic *el = comm->elastic;
    char why[GEO_ETCD_WHY_LEN];
    if (el == NULL)
        return;
    comm->elastic = NULL;
    pthread_mutex_lock(&el->lock);
    el->stop = 1;
    pthread_cond_broadcast(&el->cv);
    pthread_mutex_unlock(&el->lock);
    if (el->thread_live)
        pthread_join(el->thread, NULL);
    /* Destroy: the lease and everything under it go now, so that nobody
     * waits for it to run out.  Abort: quickly, one try. */
    el->store.timeout = abort ? 1.0 : 5.0;
    if (geoEtcdLeaseRevoke(&el->store, __atomic_load_n(&el->lease, __ATOMIC_ACQUIRE), why) !=
        ncclSuccess)
        geoInfo(GEO_LOG_INIT, "elastic: cannot revoke lease %" PRIx64 " (%s): it runs out in "
                "%d s", el->lease, why, el->ttl);
    pthread_cond_destroy(&el->cv);
    pthread_mutex_destroy(&el->lock);
    geoWipe(el->comm_key, sizeof(el->comm_key));
    free(el->member_val);
    free(el);
}

ncclResult_t geocclCommJoinersWaiting(ncclComm_t comm, int *joiners)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommJoinersWaiting") != ncclSuccess ||
                  joiners == NULL, ncclInvalidArgument,
                  "geocclCommJoinersWaiting: NULL or dead comm, or NULL joiners");
    *joiners = comm->elastic ? __atomic_load_n(&comm->elastic->joiners, __ATOMIC_ACQUIRE) : 0;
    return ncclSuccess;
}
