/* Changing a healthy communicator's members between rounds: geocclCommGrow
 * (every member calls it), geocclCommJoin (a process that is not a member
 * yet) and geocclCommLeave (a member that will go at the next grow).
 *
 * Grow in two exchanges over the parent's transport, so nothing waits on
 * the store except the one rank that decides:
 *  1. every rank tells every other whether it leaves; all now know the
 *     stayers and the lowest of them, the leader;
 *  2. the leader reads the joiners registered in the store (join/<id>, in
 *     the order they registered), starts the new communicator's bootstrap
 *     root keyed with a secret derived from GEOCCL_COMM_SECRET and a fresh
 *     random nonce, writes each joiner its admission (admit/<id>: the id
 *     without its secret, the nonce, its rank, and the parent's link
 *     figures), removes their registrations, and sends the same id and
 *     nonce to every other stayer.
 * Stayers then init the new communicator with the parent's topology handed
 * down (as ncclCommSplit does); joiners with the figures of their
 * admission, so the probe measures only where a region is new to both.
 * Leavers return at once with no communicator, and nobody sees an error.
 * Joiners are admitted only by a grow: until then they cost the members
 * nothing but the lease thread's count (membership.c). */
#include "config.h"
#include "comm/elastic/elastic.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/coll/coll.h"
#include "comm/device/coll_device.h"
#include "geoccl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GEO_ELASTIC_MAX_JOIN 64

typedef struct {
    int32_t ok;                 /* the leader made the root and wrote the admissions */
    int32_t njoin;
    int32_t newsize;
    int32_t figures;            /* the joiners got the parent's link figures */
    uint64_t grow_nonce;
    ncclUniqueId id;            /* secret zeroed */
} growDecision;

/* Every rank sends out[] (one int each) to every other and receives
 * theirs into in[]: one round trip, all at once. */
static ncclResult_t exchange_flags(struct ncclComm *comm, int32_t mine, int32_t *in)
{
    int n = comm->nranks;
    geoNetRequest *req = calloc(2 * (size_t)n, sizeof(*req));
    ncclResult_t res = ncclSuccess;
    if (req == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "geocclCommGrow: out of memory");
    in[comm->rank] = mine;
    for (int r = 0; r < n && res == ncclSuccess; r++)
        if (r != comm->rank) {
            res = geoNetIrecv(&comm->net, r, &in[r], sizeof(in[r]), &req[2 * r]);
            if (res == ncclSuccess)
                res = geoNetIsend(&comm->net, r, &mine, sizeof(mine), &req[2 * r + 1]);
        }
    for (int i = 0; i < 2 * n; i++)
        if (req[i].size) {
            ncclResult_t w = geoNetWait(&comm->net, &req[i]);
            if (res == ncclSuccess)
                res = w;
        }
    free(req);
    return res;
}

typedef struct {
    char id[32];
    uint64_t nonce;
    int64_t rev;
} joinerRef;

static int by_rev(const void *a, const void *b)
{
    const joinerRef *x = a, *y = b;
    return x->rev < y->rev ? -1 : x->rev > y->rev;
}

/* The leader's part: read the joiners, make the root, admit them.  The
 * decision is filled in any case (ok = 0 on failure, so nobody waits for
 * nothing); the failure is reported here. */
static ncclResult_t lead(struct ncclComm *comm, int nstay, int any_leaver,
                         const uint8_t *job_key, growDecision *d)
{
    geoElastic *el = comm->elastic;
    char key[GEO_ELASTIC_KEY_LEN], why[GEO_ETCD_WHY_LEN];
    joinerRef *js = NULL;
    ncclResult_t res = ncclSuccess;
    geoTopoInherit inh;
    memset(&inh, 0, sizeof(inh));
    memset(d, 0, sizeof(*d));
    d->newsize = nstay;
    if (el != NULL) {
        geoEtcdRange range;
        snprintf(key, sizeof(key), "%sjoin/", el->prefix);
        if (geoEtcdGet(&el->store, key, 1, 0, &range, why) != ncclSuccess)
            return GEO_COMM_ERR(comm, ncclRemoteError, "geocclCommGrow: cannot read the "
                                "joiners from the store: %s", why);
        js = calloc((size_t)range.n + 1, sizeof(*js));
        if (js == NULL) {
            geoEtcdRangeFree(&range);
            return GEO_COMM_ERR(comm, ncclSystemError, "geocclCommGrow: out of memory");
        }
        for (int i = 0; i < range.n; i++) {
            const geoEtcdKv *kv = &range.kvs[i];
            geoElasticJoiner j;
            const char *name = strrchr(kv->key, '/');
            if (name == NULL || strlen(name + 1) >= sizeof(js[0].id) ||
                geoElasticOpen(job_key, kv->key, kv->value, kv->vlen, sizeof(j)) != 0) {
                geoWarn(GEO_LOG_INIT, "elastic: the registration %s does not carry a valid MAC "
                        "(another secret or job?): not admitted", kv->key);
                continue;
            }
            memcpy(&j, kv->value, sizeof(j));
            snprintf(js[d->njoin].id, sizeof(js[0].id), "%s", name + 1);
            js[d->njoin].nonce = j.nonce;
            js[d->njoin].rev = kv->create_rev;
            d->njoin++;
        }
        geoEtcdRangeFree(&range);
        qsort(js, (size_t)d->njoin, sizeof(*js), by_rev);
        if (d->njoin > GEO_ELASTIC_MAX_JOIN)
            d->njoin = GEO_ELASTIC_MAX_JOIN; /* the rest wait for the next grow */
    }
    d->newsize = nstay + d->njoin;
    if (d->njoin == 0 && !any_leaver) {
        d->ok = 1;
        goto out;
    }
    uint8_t secret[GEO_SHA256_BYTES];
    if (geoRandomBytes(&d->grow_nonce, sizeof(d->grow_nonce)) != 0) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "geocclCommGrow: no randomness");
        goto out;
    }
    geoElasticGrowSecret(job_key, d->grow_nonce, secret);
    res = geoBootstrapNewRootKeyed(secret, d->newsize, &d->id);
    geoWipe(secret, sizeof(secret));
    if (res != ncclSuccess) { /* reported on this thread: carried here */
        geoErrSet(&comm->err, "geocclCommGrow: cannot start the new communicator's bootstrap "
                  "root: %s", geoThreadError());
        goto out;
    }
    geoBootstrapSetSecret(&d->id, NULL);
    if (d->njoin > 0) {
        geoElasticAdmit a;
        memset(&a, 0, sizeof(a));
        d->figures = geoTopoInheritFrom(&comm->topo, &comm->regions, comm->rank,
                                        comm->inherit.valid ? &comm->inherit : NULL, &inh) == 0 &&
                     geoElasticFiguresPack(&inh, &a.figures) == 0;
        if (!d->figures) /* everyone then measures, members too (see below) */
            memset(&a.figures, 0, sizeof(a.figures));
        a.magic = GEO_ELASTIC_MAGIC;
        a.nranks = d->newsize;
        a.grow_nonce = d->grow_nonce;
        a.id = d->id;
        for (int i = 0; i < d->njoin && res == ncclSuccess; i++) {
            size_t vn;
            a.rank = nstay + i;
            a.joiner_nonce = js[i].nonce;
            snprintf(key, sizeof(key), "%sadmit/%s", el->prefix, js[i].id);
            uint8_t *v = geoElasticSeal(job_key, key, &a, sizeof(a), &vn);
            res = v ? geoEtcdPut(&el->store, key, v, vn,
                                 __atomic_load_n(&el->lease, __ATOMIC_ACQUIRE), why)
                      : ncclSystemError;
            free(v);
            if (res != ncclSuccess)
                res = GEO_COMM_ERR(comm, ncclRemoteError, "geocclCommGrow: cannot write the "
                                   "admission of joiner %s to the store: %s", js[i].id, why);
            snprintf(key, sizeof(key), "%sjoin/%s", el->prefix, js[i].id);
            if (res == ncclSuccess && geoEtcdDelete(&el->store, key, 0, why) != ncclSuccess)
                geoInfo(GEO_LOG_INIT, "elastic: cannot remove %s (%s): it goes with its "
                        "joiner's lease", key, why);
        }
    }
    d->ok = res == ncclSuccess;
out:
    geoTopoInheritFree(&inh);
    free(js);
    return res;
}

ncclResult_t geocclCommGrow(ncclComm_t comm, ncclComm_t *newcomm, ncclConfig_t *config)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGrow") != ncclSuccess || newcomm == NULL,
                  ncclInvalidArgument, "geocclCommGrow: NULL or dead comm, or NULL newcomm");
    *newcomm = NULL;
    ncclResult_t state = geoCommAsyncError(comm);
    if (state != ncclSuccess)
        return GEO_COMM_ERR(comm, state == ncclInProgress ? ncclInvalidUsage : state,
                            "geocclCommGrow: the communicator is %s; a broken one shrinks "
                            "first (geocclCommGetFailedRanks, ncclCommShrink)",
                            state == ncclInProgress ? "still initialising" : "broken");
    int n = comm->nranks, leaving = __atomic_load_n(&comm->elastic_leaving, __ATOMIC_ACQUIRE);
    int32_t *flags = calloc((size_t)n, sizeof(int32_t));
    uint8_t *gone = calloc((size_t)n, 1); /* the leavers, as geoFanOut skips them */
    uint8_t job_key[GEO_SHA256_BYTES];
    int have_key = 0;
    growDecision d;
    ncclResult_t res = ncclSuccess;
    double t0 = geoNow();

    if (flags == NULL || gone == NULL) {
        free(flags);
        free(gone);
        return GEO_COMM_ERR(comm, ncclSystemError, "geocclCommGrow: out of memory");
    }
    memset(&d, 0, sizeof(d));
    geoErrSetOp(&comm->err, "geocclCommGrow");
    __atomic_add_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    uint32_t counter = comm->grow_count++;
    /* Queued device exchanges share the transport: they finish first. */
    GEO_CHECK_GOTO(geoDevDrain(comm), res, out);
    GEO_CHECK_GOTO(exchange_flags(comm, leaving, flags), res, out);
    int leader = -1, nstay = 0, newrank = 0, any_leaver = 0;
    for (int r = 0; r < n; r++) {
        if (flags[r]) {
            any_leaver = gone[r] = 1;
            continue;
        }
        if (leader < 0)
            leader = r;
        if (r < comm->rank)
            newrank++;
        nstay++;
    }
    if (leaving) {
        geoInfo(GEO_LOG_INIT, "geocclCommGrow: rank %d leaves (%d of %d stay)", comm->rank,
                nstay, n);
        goto out;
    }
    if (comm->rank == leader) {
        ncclResult_t made = geoElasticCommJobKey(comm, job_key, &comm->err);
        have_key = made == ncclSuccess;
        if (made == ncclSuccess)
            made = lead(comm, nstay, any_leaver, job_key, &d);
        /* Sent even when it failed, so that nobody waits for nothing. */
        res = geoFanOut(comm, leader, gone, &d, sizeof(d), "geocclCommGrow");
        if (made != ncclSuccess)
            res = made;
    } else {
        GEO_CHECK_GOTO(geoFanOut(comm, leader, gone, &d, sizeof(d), "geocclCommGrow"), res, out);
        if (!d.ok)
            res = GEO_COMM_ERR(comm, ncclRemoteError, "geocclCommGrow: rank %d, the lowest "
                               "staying rank, could not admit the joiners (its last error says "
                               "why)", leader);
    }
    if (res != ncclSuccess || (d.njoin == 0 && !any_leaver))
        goto out;
    if (d.njoin < 0 || d.njoin > GEO_ELASTIC_MAX_JOIN || d.newsize != nstay + d.njoin) {
        res = GEO_COMM_ERR(comm, ncclRemoteError, "geocclCommGrow: rank %d, the lowest staying "
                           "rank, sent %d joiner(s) and a size of %d for %d staying ranks",
                           leader, d.njoin, d.newsize, nstay);
        goto out;
    }
    if (!have_key)
        GEO_CHECK_GOTO(geoElasticCommJobKey(comm, job_key, &comm->err), res, out);
    have_key = 1;
    uint8_t secret[GEO_SHA256_BYTES];
    geoElasticGrowSecret(job_key, d.grow_nonce, secret);
    geoBootstrapSetSecret(&d.id, secret);
    geoWipe(secret, sizeof(secret));
    geoInfo(GEO_LOG_INIT, "geocclCommGrow #%u: rank %d of %d becomes rank %d of %d (%d "
            "joiner(s), %d leaver(s)); deciding took %.3f s", counter, comm->rank, n, newrank,
            d.newsize, d.njoin, n - nstay, geoNow() - t0);
    ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
    inherit.blocking = comm->blocking;
    /* The probe runs alike on every rank only if all start from the same
     * figures: without them for the joiners, the members drop theirs. */
    geoInitParent = d.njoin == 0 || d.figures ? comm : NULL;
    res = geoCommInitInternal(newcomm, d.newsize, &d.id, newrank, config ? config : &inherit, 0);
    geoInitParent = NULL;
    if (res == ncclInProgress)
        res = ncclSuccess; /* non-blocking: the caller polls the new comm */
    else if (res != ncclSuccess) /* the child's init reported why */
        geoErrSet(&comm->err, "geocclCommGrow: %s", geoThreadError());
    if (res == ncclSuccess && *newcomm != NULL) {
        geoElasticKeepJobKey(*newcomm, job_key);
        if (geoCommEfInherit(comm, *newcomm) != ncclSuccess)
            geoWarn(GEO_LOG_INIT, "geocclCommGrow: out of memory carrying the error-feedback "
                    "registrations over: the new communicator has none");
    }
out:
    if (have_key)
        geoWipe(job_key, sizeof(job_key));
    geoWipe(&d.id, sizeof(d.id));
    free(flags);
    free(gone);
    __atomic_sub_fetch(&comm->active_calls, 1, __ATOMIC_ACQ_REL);
    return res;
}

ncclResult_t geocclCommLeave(ncclComm_t comm)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommLeave") != ncclSuccess, ncclInvalidArgument,
                  "geocclCommLeave: NULL or dead comm");
    __atomic_store_n(&comm->elastic_leaving, 1, __ATOMIC_RELEASE);
    geoInfo(GEO_LOG_INIT, "geocclCommLeave: rank %d leaves at the next geocclCommGrow",
            comm->rank);
    return ncclSuccess;
}

/* The joiner's wait: renew its lease, look for its admission. */
static ncclResult_t await_admission(geoEtcd *store, const char *key, int64_t lease, int ttl,
                                    const uint8_t *job_key, uint64_t nonce, geoElasticAdmit *a)
{
    double limit = (double)geoParamInt(GEO_PARAM_ELASTIC_JOIN_TIMEOUT), t0 = geoNow();
    double poll_s = geoParamInt(GEO_PARAM_ELASTIC_POLL_MS) * 1e-3, renewed = t0;
    char why[GEO_ETCD_WHY_LEN];
    if (poll_s < 0.05)
        poll_s = 0.05;
    if (poll_s > ttl / 3.0)
        poll_s = ttl / 3.0;
    for (;;) {
        geoEtcdRange range;
        if (geoNow() - renewed >= ttl / 3.0) {
            int64_t left = 0;
            if (geoEtcdLeaseKeepAlive(store, lease, &left, why) == ncclSuccess && left > 0)
                renewed = geoNow();
            else if (geoNow() - renewed > ttl)
                return GEO_ERR(NULL, ncclRemoteError, "geocclCommJoin: the registration's "
                               "lease lapsed while waiting (%s)",
                               left <= 0 ? "expired" : why);
        }
        if (geoEtcdGet(store, key, 0, 0, &range, why) == ncclSuccess) {
            int found = 0;
            for (int i = 0; i < range.n && !found; i++) {
                const geoEtcdKv *kv = &range.kvs[i];
                if (geoElasticOpen(job_key, key, kv->value, kv->vlen, sizeof(*a)) != 0) {
                    geoWarn(GEO_LOG_INIT, "elastic: %s does not carry a valid MAC: ignored",
                            key);
                    continue;
                }
                memcpy(a, kv->value, sizeof(*a));
                found = a->joiner_nonce == nonce && a->nranks > 0 && a->rank >= 0 &&
                        a->rank < a->nranks;
            }
            geoEtcdRangeFree(&range);
            if (found)
                return ncclSuccess;
        }
        if (geoNow() - t0 > limit)
            return GEO_ERR(NULL, ncclRemoteError, "geocclCommJoin: no member admitted this "
                           "process within GEOCCL_ELASTIC_JOIN_TIMEOUT=%.0f s (they admit "
                           "joiners when they call geocclCommGrow)", limit);
        usleep((useconds_t)(poll_s * 1e6));
    }
}

ncclResult_t geocclCommJoin(ncclComm_t *newcomm, ncclConfig_t *config)
{
    geoEtcd store;
    char prefix[96], key[GEO_ELASTIC_KEY_LEN], akey[GEO_ELASTIC_KEY_LEN], jid[24];
    char why[GEO_ETCD_WHY_LEN];
    uint8_t job_key[GEO_SHA256_BYTES];
    int64_t lease = 0;
    ncclResult_t res;
    geoElasticJoiner me;
    geoElasticAdmit a;
    geoTopoInherit inh;
    double t0 = geoNow();

    GEO_RETURN_IF(newcomm == NULL, ncclInvalidArgument, "geocclCommJoin: newcomm is NULL");
    *newcomm = NULL;
    memset(&inh, 0, sizeof(inh));
    GEO_CHECK(geoElasticStoreOpen(&store, prefix, NULL));
    GEO_CHECK(geoElasticJobKey(job_key, NULL));
    int ttl = (int)geoParamInt(GEO_PARAM_ELASTIC_TTL);
    if (ttl < 2)
        ttl = 2;
    memset(&me, 0, sizeof(me));
    me.magic = GEO_ELASTIC_MAGIC;
    me.pid = (int32_t)getpid();
    const char *region = geoParamStrLive(GEO_PARAM_REGION);
    snprintf(me.region, sizeof(me.region), "%s", region ? region : "");
    gethostname(me.host, sizeof(me.host) - 1);
    if (geoRandomBytes(&me.nonce, sizeof(me.nonce)) != 0) {
        res = GEO_ERR(NULL, ncclSystemError, "geocclCommJoin: no randomness");
        goto out;
    }
    snprintf(jid, sizeof(jid), "%016" PRIx64, me.nonce);
    snprintf(key, sizeof(key), "%sjoin/%s", prefix, jid);
    snprintf(akey, sizeof(akey), "%sadmit/%s", prefix, jid);
    if (geoEtcdLeaseGrant(&store, ttl, &lease, why) != ncclSuccess) {
        res = GEO_ERR(NULL, ncclRemoteError, "geocclCommJoin: cannot take a lease from the "
                      "store: %s", why);
        goto out;
    }
    {
        size_t vn;
        uint8_t *v = geoElasticSeal(job_key, key, &me, sizeof(me), &vn);
        res = v ? geoEtcdPut(&store, key, v, vn, lease, why) : ncclSystemError;
        free(v);
        if (res != ncclSuccess) {
            res = GEO_ERR(NULL, ncclRemoteError, "geocclCommJoin: cannot register in the "
                          "store: %s", why);
            goto out;
        }
    }
    geoInfo(GEO_LOG_INIT, "geocclCommJoin: registered as %s (region '%s'); waiting for the "
            "members to grow", key, me.region);
    GEO_CHECK_GOTO(await_admission(&store, akey, lease, ttl, job_key, me.nonce, &a), res, out);
    geoInfo(GEO_LOG_INIT, "geocclCommJoin: admitted as rank %d of %d after %.2f s", a.rank,
            a.nranks, geoNow() - t0);
    uint8_t secret[GEO_SHA256_BYTES];
    geoElasticGrowSecret(job_key, a.grow_nonce, secret);
    geoBootstrapSetSecret(&a.id, secret);
    geoWipe(secret, sizeof(secret));
    int have_figures = geoElasticFiguresUnpack(&a.figures, me.region, &inh) == 0;
    geoInitInherit = have_figures ? &inh : NULL;
    res = geoCommInitInternal(newcomm, a.nranks, &a.id, a.rank, config, 0);
    geoInitInherit = NULL;
    if (res == ncclInProgress)
        res = ncclSuccess;
    if (res == ncclSuccess && *newcomm != NULL)
        geoElasticKeepJobKey(*newcomm, job_key);
    if (geoEtcdDelete(&store, akey, 0, why) != ncclSuccess)
        geoInfo(GEO_LOG_INIT, "elastic: cannot remove %s (%s): it goes with the admitting "
                "rank's lease", akey, why);
out:
    if (lease != 0)
        geoEtcdLeaseRevoke(&store, lease, why); /* the registration and admission go */
    geoWipe(job_key, sizeof(job_key));
    geoWipe(&a, sizeof(a));
    geoTopoInheritFree(&inh);
    return res;
}
