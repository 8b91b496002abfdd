/* geocclCommGetFailedRanks: which ranks of a broken communicator are dead,
 * the same answer on every survivor, so that each passes the same list to
 * ncclCommShrink (whose new secret and root follow from that list).
 *
 * A transport sees only its own side: the peer whose loss broke it, or a
 * live peer that closed its connections because its own transport broke
 * first (the error spreads).  The store settles it: each survivor records
 * itself (c/<comm>/ok/<rank>, under its lease); a rank counts as accounted
 * for once it has, or once its member record is gone (its lease ran out:
 * its process stopped renewing).  The first survivor that sees every rank
 * accounted for creates c/<comm>/dead, once (an etcd transaction), with
 * the ranks that never said they live; everyone else reads that record.
 * Both are per attempt (c/<comm>/ok/<attempt>/<rank>, c/<comm>/dead/<attempt>,
 * the attempt being the shrinks started on this communicator, the same on
 * every survivor): a survivor that dies while the others shrink makes that
 * shrink fail on all of them, and the next agreement on this communicator
 * must start from nothing to see it.  So a slow survivor delays the answer (within GEOCCL_ELASTIC_TIMEOUT)
 * and is never declared dead while its lease lives.  Without a store the
 * answer is this rank's transport's, which survivors may not share. */
#include "config.h"
#include "comm/elastic/elastic.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "geoccl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The dead set recorded under key, sealed with the communicator's key:
 * 0 and dead[] filled, or -1 when the record is not a valid one. */
static int read_dead(const geoElastic *el, const char *key, const geoEtcdKv *kv, int nranks,
                     uint8_t *dead)
{
    geoElasticDeadHead h;
    if (kv->vlen < sizeof(h) + GEO_SHA256_BYTES)
        return -1;
    memcpy(&h, kv->value, sizeof(h));
    if (h.count < 0 || h.count > nranks ||
        geoElasticOpen(el->comm_key, key, kv->value, kv->vlen,
                       sizeof(h) + sizeof(int32_t) * (size_t)h.count) != 0)
        return -1;
    memset(dead, 0, (size_t)nranks);
    for (int i = 0; i < h.count; i++) {
        int32_t r;
        memcpy(&r, kv->value + sizeof(h) + sizeof(r) * (size_t)i, sizeof(r));
        if (r < 0 || r >= nranks)
            return -1;
        dead[r] = 1;
    }
    return 0;
}

/* With a store: agree on the dead set (see the top of this file). */
static ncclResult_t agree(struct ncclComm *comm, uint8_t *dead)
{
    geoElastic *el = comm->elastic;
    char key[GEO_ELASTIC_KEY_LEN], dkey[GEO_ELASTIC_KEY_LEN], why[GEO_ETCD_WHY_LEN] = "";
    int n = comm->nranks;
    double timeout = (double)geoParamInt(GEO_PARAM_ELASTIC_TIMEOUT), t0 = geoNow();
    uint8_t *member = calloc((size_t)n, 1), *ok = calloc((size_t)n, 1);
    ncclResult_t res = ncclSuccess;
    size_t vn;
    uint8_t *v;

    if (member == NULL || ok == NULL) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "geocclCommGetFailedRanks: out of memory");
        goto out;
    }
    const unsigned attempt = comm->shrink_count;
    snprintf(dkey, sizeof(dkey), "%sdead/%u", el->comm_dir, attempt);
    {
        geoElasticMember me;
        memset(&me, 0, sizeof(me));
        me.magic = GEO_ELASTIC_MAGIC;
        me.rank = comm->rank;
        me.nranks = n;
        me.pid = (int32_t)getpid();
        snprintf(key, sizeof(key), "%sok/%u/%d", el->comm_dir, attempt, comm->rank);
        v = geoElasticSeal(el->comm_key, key, &me, sizeof(me), &vn);
        res = v ? geoEtcdPut(&el->store, key, v, vn,
                                 __atomic_load_n(&el->lease, __ATOMIC_ACQUIRE), why)
                      : ncclSystemError;
        free(v);
        if (res != ncclSuccess) {
            res = GEO_COMM_ERR(comm, ncclRemoteError, "geocclCommGetFailedRanks: cannot record "
                               "rank %d as a survivor in the store: %s", comm->rank, why);
            goto out;
        }
    }
    for (;;) {
        geoEtcdRange range;
        res = geoEtcdGet(&el->store, el->comm_dir, 1, 0, &range, why);
        if (res != ncclSuccess) {
            res = GEO_COMM_ERR(comm, ncclRemoteError, "geocclCommGetFailedRanks: cannot read "
                               "the survivors from the store: %s", why);
            goto out;
        }
        memset(member, 0, (size_t)n);
        memset(ok, 0, (size_t)n);
        int decided = 0;
        size_t dl = strlen(el->comm_dir);
        for (int i = 0; i < range.n; i++) {
            const geoEtcdKv *kv = &range.kvs[i];
            const char *rest = kv->key + (strncmp(kv->key, el->comm_dir, dl) == 0 ? dl : 0);
            int r = -1, is_ok = 0;
            unsigned a = 0;
            if (strcmp(rest, dkey + dl) == 0) {
                if (read_dead(el, kv->key, kv, n, dead) == 0)
                    decided = 1;
                else
                    geoWarn(GEO_LOG_INIT, "elastic: %s does not carry a valid MAC: ignored",
                            kv->key);
                continue;
            }
            if (sscanf(rest, "m/%d", &r) != 1 &&
                (is_ok = sscanf(rest, "ok/%u/%d", &a, &r) == 2 && a == attempt) == 0)
                continue;
            if (r < 0 || r >= n ||
                geoElasticOpen(el->comm_key, kv->key, kv->value, kv->vlen,
                               sizeof(geoElasticMember)) != 0)
                continue; /* forged or foreign: counts as absent */
            (is_ok ? ok : member)[r] = 1;
        }
        geoEtcdRangeFree(&range);
        if (decided)
            break;
        int pending = 0;
        for (int r = 0; r < n; r++)
            pending += !ok[r] && member[r];
        if (pending == 0 || geoNow() - t0 > timeout) {
            if (pending)
                geoWarn(GEO_LOG_INIT, "elastic: %d rank(s) of %s neither said they survived "
                        "nor lost their lease within %.0f s: counted as dead", pending,
                        el->comm_dir, timeout);
            int32_t *list = malloc(sizeof(int32_t) * (size_t)(n + 2));
            int cnt = 0;
            if (list == NULL) {
                res = GEO_COMM_ERR(comm, ncclSystemError, "geocclCommGetFailedRanks: out of "
                                   "memory");
                goto out;
            }
            for (int r = 0; r < n; r++)
                if (!ok[r])
                    list[2 + cnt++] = r;
            geoElasticDeadHead h = {.magic = GEO_ELASTIC_MAGIC, .count = cnt};
            memcpy(list, &h, sizeof(h));
            v = geoElasticSeal(el->comm_key, dkey, list, sizeof(h) + sizeof(int32_t) * (size_t)cnt,
                               &vn);
            free(list);
            /* Not under this communicator's lease: it is revoked when its
             * rank destroys it, perhaps before a slower survivor reads
             * the record; a lease of its own lets it go later. */
            int64_t lease = 0;
            int created = 0;
            geoEtcdKv existing;
            if (geoEtcdLeaseGrant(&el->store, (int)(10 * timeout) + 60, &lease, why) !=
                ncclSuccess)
                lease = 0;
            res = v ? geoEtcdCreate(&el->store, dkey, v, vn, lease, &created, &existing, why)
                    : ncclSystemError;
            free(v);
            if (res != ncclSuccess) {
                res = GEO_COMM_ERR(comm, ncclRemoteError, "geocclCommGetFailedRanks: cannot "
                                   "record the dead set in the store: %s", why);
                goto out;
            }
            if (created) {
                memset(dead, 0, (size_t)n);
                for (int r = 0; r < n; r++)
                    dead[r] = !ok[r];
                geoInfo(GEO_LOG_INIT, "elastic: rank %d recorded the dead set of %s (%d "
                        "rank(s)) after %.2f s", comm->rank, el->comm_dir, cnt, geoNow() - t0);
                break;
            }
            if (lease != 0)
                geoEtcdLeaseRevoke(&el->store, lease, why);
            int valid = existing.key != NULL && read_dead(el, dkey, &existing, n, dead) == 0;
            geoEtcdKvFree(&existing);
            if (valid)
                break;
            if (geoNow() - t0 > timeout) {
                res = GEO_COMM_ERR(comm, ncclRemoteError, "geocclCommGetFailedRanks: %s holds "
                                   "no valid record and cannot be made one", dkey);
                goto out;
            }
        }
        /* Every survivor reads the whole directory each look: 50 ms
         * apart (a survivor that sees the record late makes the shrink's
         * bootstrap wait for it), slower in proportion past 64 ranks, so
         * that the store answers at most about 1,300 of these a second. */
        usleep((useconds_t)(n <= 64 ? 50000 : 50000 * ((n + 63) / 64)));
    }
out:
    free(member);
    free(ok);
    return res;
}

ncclResult_t geocclCommGetFailedRanks(ncclComm_t comm, int *ranks, int maxRanks, int *count)
{
    GEO_RETURN_IF(geoCommCheck(comm, "geocclCommGetFailedRanks") != ncclSuccess ||
                  count == NULL || maxRanks < 0 || (ranks == NULL && maxRanks > 0),
                  ncclInvalidArgument, "geocclCommGetFailedRanks: NULL or dead comm, NULL count, "
                  "or NULL ranks with maxRanks %d", maxRanks);
    *count = 0;
    ncclResult_t state = geoCommAsyncError(comm);
    if (state == ncclSuccess || state == ncclInProgress)
        return ncclSuccess;
    uint8_t *dead = calloc((size_t)comm->nranks, 1);
    if (dead == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "geocclCommGetFailedRanks: out of memory");
    ncclResult_t res = ncclSuccess;
    if (comm->elastic != NULL) {
        res = agree(comm, dead);
    } else if (comm->net.ctx.failed != NULL) {
        for (int r = 0; r < comm->nranks; r++)
            dead[r] = __atomic_load_n(&comm->net.ctx.failed[r], __ATOMIC_ACQUIRE);
    }
    if (res == ncclSuccess) {
        int n = 0;
        char list[256];
        size_t len = 0;
        list[0] = '\0';
        for (int r = 0; r < comm->nranks; r++) {
            if (!dead[r])
                continue;
            if (n < maxRanks)
                ranks[n] = r;
            if (len + 16 < sizeof(list))
                len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%d", n ? "," : "", r);
            n++;
        }
        *count = n;
        geoInfo(GEO_LOG_INIT, "geocclCommGetFailedRanks: %d dead rank(s) of %d: %s (%s)", n,
                comm->nranks, n ? list : "none",
                comm->elastic ? "agreed in the store" : "this rank's transport's view");
    }
    free(dead);
    return res;
}
