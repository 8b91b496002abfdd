#include "config.h"
#include "comm/bootstrap.h"
#include "comm/checks.h"
#include "comm/param.h"
#include "topology/ifaces.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GEO_JOIN_MAGIC 0x47454f4au /* "GEOJ" */
#define GEO_TABLE_MAGIC 0x47454f54u /* "GEOT" */
#define GEO_REFUSED_MAGIC 0x47454f52u /* "GEOR": wrong proof, or rank taken */
#define GEO_EXPIRED_MAGIC 0x47454f58u /* "GEOX": the root gave up waiting */
#define GEO_CHALLENGE_BYTES 16

typedef struct {
    uint32_t magic;
    int32_t rank;
    int32_t nranks;
    uint32_t pad;
    uint8_t proof[GEO_SHA256_BYTES];
    geoPeerInfo info;
} geoJoinMsg;

typedef struct {
    geoUniqueIdInternal id;
    int listen_fd;
    double timeout;
    int nranks_hint;            /* 0: learn from the first join */
} rootArgs;

static void join_proof(const geoUniqueIdInternal *id, const uint8_t *challenge, int rank,
                       int nranks, uint8_t out[GEO_SHA256_BYTES])
{
    uint8_t msg[GEO_CHALLENGE_BYTES + 16];
    int32_t r = rank, n = nranks;
    memcpy(msg, challenge, GEO_CHALLENGE_BYTES);
    memcpy(msg + GEO_CHALLENGE_BYTES, &r, 4);
    memcpy(msg + GEO_CHALLENGE_BYTES + 4, &n, 4);
    memcpy(msg + GEO_CHALLENGE_BYTES + 8, &id->nonce, 8);
    geoHmacSha256(id->secret, sizeof(id->secret), msg, sizeof(msg), out);
}

/* The root: collects one join per rank, then sends everyone the table. */
static void *root_main(void *arg)
{
    rootArgs *a = arg;
    double deadline = geoNow() + a->timeout;
    int nranks = 0, joined = 0;
    int *fds = NULL;
    geoPeerInfo *table = NULL;

    while (nranks == 0 || joined < nranks) {
        geoSockAddr from;
        char fa[GEO_ADDR_STRLEN];
        const char *why = NULL;
        uint8_t challenge[GEO_CHALLENGE_BYTES], expect[GEO_SHA256_BYTES];
        geoJoinMsg m;
        int fd;

        if (geoSocketAccept(a->listen_fd, deadline, NULL, &fd, &from) != ncclSuccess) {
            geoWarn(GEO_LOG_INIT, "bootstrap root: only %d of %d ranks joined within %.0f s; "
                    "giving up", joined, nranks, a->timeout);
            /* Tell the ranks that did join why they get no table. */
            for (int r = 0; fds && r < nranks; r++)
                if (fds[r] >= 0) {
                    uint32_t x = GEO_EXPIRED_MAGIC;
                    const char *w;
                    geoSocketSendAll(fds[r], &x, sizeof(x), geoNow() + 1.0, &w);
                }
            goto out;
        }
        geoAddrToString(&from, fa);
        double hs = geoNow() + 5.0;
        if (geoRandomBytes(challenge, sizeof(challenge)) != 0 ||
            geoSocketSendAll(fd, challenge, sizeof(challenge), hs, &why) != ncclSuccess ||
            geoSocketRecvAll(fd, &m, sizeof(m), hs, &why) != ncclSuccess) {
            geoWarn(GEO_LOG_INIT, "bootstrap root: dropped connection from %s (%s)", fa,
                    why ? why : "no randomness");
            close(fd);
            continue;
        }
        join_proof(&a->id, challenge, m.rank, m.nranks, expect);
        if (m.magic != GEO_JOIN_MAGIC || !geoDigestEqual(expect, m.proof, sizeof(expect))) {
            uint32_t no = GEO_REFUSED_MAGIC;
            geoWarn(GEO_LOG_INIT, "bootstrap root: dropped connection from %s: it does not "
                    "hold the communicator's secret", fa);
            geoSocketSendAll(fd, &no, sizeof(no), geoNow() + 1.0, &why);
            close(fd);
            continue;
        }
        if (nranks == 0) {
            if (m.nranks < 1 || m.nranks > (1 << 20)) {
                close(fd);
                continue;
            }
            nranks = m.nranks;
            fds = malloc(sizeof(int) * (size_t)nranks);
            table = calloc((size_t)nranks, sizeof(*table));
            if (fds == NULL || table == NULL) {
                geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory");
                close(fd);
                goto out;
            }
            for (int i = 0; i < nranks; i++)
                fds[i] = -1;
        }
        if (m.nranks != nranks || m.rank < 0 || m.rank >= nranks || fds[m.rank] >= 0) {
            uint32_t no = GEO_REFUSED_MAGIC;
            geoWarn(GEO_LOG_INIT, "bootstrap root: rank %d of %d from %s conflicts with the "
                    "communicator being formed (%d ranks); dropped", m.rank, m.nranks, fa,
                    nranks);
            geoSocketSendAll(fd, &no, sizeof(no), geoNow() + 1.0, &why);
            close(fd);
            continue;
        }
        fds[m.rank] = fd;
        table[m.rank] = m.info;
        joined++;
    }
    for (int r = 0; r < nranks; r++) {
        const char *why = NULL;
        uint32_t magic = GEO_TABLE_MAGIC;
        double dl = geoNow() + 10.0;
        if (geoSocketSendAll(fds[r], &magic, sizeof(magic), dl, &why) != ncclSuccess ||
            geoSocketSendAll(fds[r], table, sizeof(*table) * (size_t)nranks, dl, &why) !=
                ncclSuccess)
            geoWarn(GEO_LOG_INIT, "bootstrap root: could not send the table to rank %d: %s", r,
                    why);
    }
out:
    if (fds)
        for (int r = 0; r < nranks; r++)
            if (fds[r] >= 0)
                close(fds[r]);
    free(fds);
    free(table);
    close(a->listen_fd);
    free(a);
    return NULL;
}

static ncclResult_t start_root_thread(const geoUniqueIdInternal *id, int fd, double timeout)
{
    pthread_t t;
    pthread_attr_t attr;
    rootArgs *a = calloc(1, sizeof(*a));
    GEO_RETURN_IF(a == NULL, ncclSystemError, "out of memory");
    a->id = *id;
    a->listen_fd = fd;
    a->timeout = timeout;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, root_main, a) != 0) {
        pthread_attr_destroy(&attr);
        free(a);
        close(fd);
        GEO_RETURN_IF(1, ncclSystemError, "cannot start the bootstrap root thread");
    }
    pthread_attr_destroy(&attr);
    return ncclSuccess;
}

static ncclResult_t env_id(geoUniqueIdInternal *id)
{
    const char *cid = geoParamStrLive(GEO_PARAM_COMM_ID);
    const char *secret = geoParamStrLive(GEO_PARAM_COMM_SECRET);
    geoSha256 s;

    memset(id, 0, sizeof(*id));
    id->magic = GEO_ID_MAGIC;
    id->flags = GEO_ID_ENV;
    GEO_CHECK(geoAddrFromString(cid, &id->root));
    /* Without GEOCCL_COMM_SECRET every rank derives the same key from the
     * address: connections are still checked for consistency, but anyone
     * who knows the address can join. */
    geoSha256Init(&s);
    geoSha256Update(&s, "geoccl-env-secret:", 18);
    if (secret)
        geoSha256Update(&s, secret, strlen(secret));
    else
        geoSha256Update(&s, cid, strlen(cid));
    geoSha256Final(&s, id->secret);
    id->nonce = 0;
    return ncclSuccess;
}

ncclResult_t geoBootstrapNewRoot(ncclUniqueId *out)
{
    geoUniqueIdInternal id;
    topoIface ifs[1];
    geoSockAddr addr;
    int fd;

    memset(&id, 0, sizeof(id));
    id.magic = GEO_ID_MAGIC;
    if (topoFindIfaces(geoParamStr(GEO_PARAM_SOCKET_IFNAME), NULL, ifs, 1) < 1) {
        GEO_RETURN_IF(1, ncclSystemError, "no usable network interface (GEOCCL_SOCKET_IFNAME=%s)",
                      geoParamStr(GEO_PARAM_SOCKET_IFNAME) ? geoParamStr(GEO_PARAM_SOCKET_IFNAME)
                                                           : "unset");
    }
    memset(&addr, 0, sizeof(addr));
    memcpy(&addr, &ifs[0].addr, ifs[0].addr.ss_family == AF_INET6 ? sizeof(addr.sin6)
                                                                  : sizeof(addr.sin));
    GEO_CHECK(geoSocketListen(&addr, &fd, &id.root));
    if (geoRandomBytes(id.secret, sizeof(id.secret)) != 0 ||
        geoRandomBytes(&id.nonce, sizeof(id.nonce)) != 0) {
        close(fd);
        GEO_RETURN_IF(1, ncclSystemError, "getrandom failed: %s", strerror(errno));
    }
    GEO_CHECK(start_root_thread(&id, fd, (double)geoParamInt(GEO_PARAM_TIMEOUT)));
    memset(out, 0, sizeof(*out));
    memcpy(out->internal, &id, sizeof(id));
    char a[GEO_ADDR_STRLEN];
    geoInfo(GEO_LOG_INIT, "bootstrap root listening on %s (%s)", geoAddrToString(&id.root, a),
            ifs[0].name);
    return ncclSuccess;
}

ncclResult_t geoBootstrapGetUniqueId(ncclUniqueId *out)
{
    if (geoParamStrLive(GEO_PARAM_COMM_ID) != NULL) {
        geoUniqueIdInternal id;
        GEO_CHECK(env_id(&id));
        memset(out, 0, sizeof(*out));
        memcpy(out->internal, &id, sizeof(id));
        return ncclSuccess;
    }
    return geoBootstrapNewRoot(out);
}

ncclResult_t geoBootstrapDecode(const ncclUniqueId *in, geoUniqueIdInternal *out)
{
    memcpy(out, in->internal, sizeof(*out));
    GEO_RETURN_IF(out->magic != GEO_ID_MAGIC ||
                      (out->root.sa.sa_family != AF_INET && out->root.sa.sa_family != AF_INET6),
                  ncclInvalidArgument,
                  "the ncclUniqueId was not made by ncclGetUniqueId of GeoCCL (bad magic)");
    return ncclSuccess;
}

ncclResult_t geoBootstrapStartRoot(const geoUniqueIdInternal *id, int nranks, double timeout)
{
    int fd;
    geoSockAddr bound;
    (void)nranks;
    GEO_CHECK(geoSocketListen(&id->root, &fd, &bound));
    return start_root_thread(id, fd, timeout);
}

ncclResult_t geoBootstrapJoin(struct ncclComm *comm, const geoUniqueIdInternal *id,
                              const geoPeerInfo *mine, geoPeerInfo *all)
{
    double deadline = geoNow() + comm->timeout;
    char ra[GEO_ADDR_STRLEN];
    const char *why = "unknown";
    uint8_t challenge[GEO_CHALLENGE_BYTES];
    uint32_t magic = 0;
    int proved = 0;
    geoJoinMsg m;
    int fd;

    geoAddrToString(&id->root, ra);
    if (geoSocketConnect(&id->root, deadline, &fd) != ncclSuccess) {
        geoCommSetError(comm, "init: cannot reach the bootstrap root at %s within %.0f s", ra,
                        comm->timeout);
        return ncclRemoteError;
    }
    memset(&m, 0, sizeof(m));
    m.magic = GEO_JOIN_MAGIC;
    m.rank = comm->rank;
    m.nranks = comm->nranks;
    m.info = *mine;
    if (geoSocketRecvAll(fd, challenge, sizeof(challenge), deadline, &why) == ncclSuccess) {
        join_proof(id, challenge, comm->rank, comm->nranks, m.proof);
        proved = geoSocketSendAll(fd, &m, sizeof(m), deadline, &why) == ncclSuccess;
        if (proved &&
            geoSocketRecvAll(fd, &magic, sizeof(magic), deadline, &why) == ncclSuccess &&
            magic == GEO_TABLE_MAGIC &&
            geoSocketRecvAll(fd, all, sizeof(*all) * (size_t)comm->nranks, deadline, &why) ==
                ncclSuccess) {
            close(fd);
            return ncclSuccess;
        }
    }
    close(fd);
    if (magic == GEO_REFUSED_MAGIC)
        geoCommSetError(comm,
                        "init: the bootstrap root at %s refused rank %d: its ncclUniqueId does "
                        "not carry the root's secret, or rank %d of %d is already taken",
                        ra, comm->rank, comm->rank, comm->nranks);
    else if (magic == GEO_EXPIRED_MAGIC)
        geoCommSetError(comm,
                        "init: the bootstrap root at %s gave up: not all %d ranks joined within "
                        "its timeout (GEOCCL_TIMEOUT of the process that made the id)",
                        ra, comm->nranks);
    else if (proved && strcmp(why, "connection closed by peer") == 0)
        geoCommSetError(comm,
                        "init: the bootstrap root at %s closed the connection after rank %d "
                        "joined (the root's process ended, or it refused us)",
                        ra, comm->rank);
    else
        geoCommSetError(comm,
                        "init: bootstrap with the root at %s failed (%s): not all %d ranks "
                        "joined within %.0f s",
                        ra, why, comm->nranks, comm->timeout);
    return ncclRemoteError;
}
