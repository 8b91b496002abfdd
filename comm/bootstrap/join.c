/* The joining rank's side of the bootstrap, and the MACs both sides
 * compute.  A rank connects to the root, answers its challenge with a
 * proof of the secret bound to its rank and peer info, and takes the
 * table only if its MAC proves the root holds the secret too.  A rank
 * whose connection is reset joins again with the same token and takes its
 * place back; for a shrunk communicator's id it dials every candidate
 * root at once and tries those that answer until one is ours. */
#include "config.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/bootstrap_internal.h"
#include "comm/base/checks.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* HMAC(secret, label | challenge | nonce | rank | nranks | id nonce | body |
 * tail): the join proof (body = the joiner's info, tail = its token) and
 * the table's MAC (body = SHA-256 of the table, no tail), under labels of
 * their own so that neither can stand for the other, nor for a data
 * connection's hello. */
static void boot_mac(const geoUniqueIdInternal *id, const char *label, const uint8_t *challenge,
                     const uint8_t *nonce, int rank, int nranks, const void *body, size_t blen,
                     const uint8_t *tail, uint8_t out[GEO_SHA256_BYTES])
{
    uint8_t msg[24 + 2 * GEO_CHALLENGE_BYTES + 16 + GEO_BOOT_INFO_BYTES + GEO_CHALLENGE_BYTES];
    size_t l = strlen(label), o = 0;
    int32_t r = rank, n = nranks;
    memset(msg, 0, 24);
    memcpy(msg, label, l < 24 ? l : 24);
    o = 24;
    memcpy(msg + o, challenge, GEO_CHALLENGE_BYTES);
    o += GEO_CHALLENGE_BYTES;
    memcpy(msg + o, nonce, GEO_CHALLENGE_BYTES);
    o += GEO_CHALLENGE_BYTES;
    memcpy(msg + o, &r, 4);
    memcpy(msg + o + 4, &n, 4);
    memcpy(msg + o + 8, &id->nonce, 8);
    o += 16;
    if (blen > GEO_BOOT_INFO_BYTES)
        blen = GEO_BOOT_INFO_BYTES;
    memcpy(msg + o, body, blen);
    o += blen;
    if (tail != NULL) {
        memcpy(msg + o, tail, GEO_CHALLENGE_BYTES);
        o += GEO_CHALLENGE_BYTES;
    }
    geoHmacSha256(id->secret, sizeof(id->secret), msg, o, out);
}

void geoBootJoinProof(const geoUniqueIdInternal *id, const uint8_t *challenge,
                      const geoJoinMsg *m, uint8_t out[GEO_SHA256_BYTES])
{
    boot_mac(id, "geoccl/v2/join", challenge, m->nonce, m->rank, m->nranks, &m->info,
             sizeof(m->info), m->token, out);
}

void geoBootTableMac(const geoUniqueIdInternal *id, const uint8_t *challenge,
                     const uint8_t *nonce, int rank, int nranks,
                     const uint8_t table_digest[GEO_SHA256_BYTES],
                     uint8_t out[GEO_SHA256_BYTES])
{
    boot_mac(id, "geoccl/v2/table", challenge, nonce, rank, nranks, table_digest,
             GEO_SHA256_BYTES, NULL, out);
}

/* Not on the wire: join_over_fd's word for a root whose table's MAC is wrong. */
#define GEO_IMPOSTOR_MAGIC 0x47454f21u

/* One try at the root behind fd: challenge (by hs_deadline), proof and my
 * info, then the table and its MAC.  *magic: the root's last word
 * (GEO_IMPOSTOR_MAGIC: a table that does not prove the secret); *proved:
 * the proof went out. */
static ncclResult_t join_over_fd(const geoBootSelf *self, const geoUniqueIdInternal *id, int fd,
                                 const uint8_t token[GEO_CHALLENGE_BYTES],
                                 const geoBootInfo *mine, geoBootInfo *all, double hs_deadline,
                                 double deadline, uint32_t *magic, int *proved, const char **why)
{
    uint8_t challenge[GEO_CHALLENGE_BYTES], mac[GEO_SHA256_BYTES], expect[GEO_SHA256_BYTES];
    uint8_t digest[GEO_SHA256_BYTES];
    size_t tlen = sizeof(*all) * (size_t)self->nranks;
    geoJoinMsg m;

    *magic = 0;
    *proved = 0;
    memset(&m, 0, sizeof(m));
    m.magic = GEO_JOIN_MAGIC;
    m.rank = self->rank;
    m.nranks = self->nranks;
    m.info = *mine;
    memcpy(m.token, token, sizeof(m.token));
    if (geoRandomBytes(m.nonce, sizeof(m.nonce)) != 0) {
        *why = "no randomness for our nonce";
        return ncclSystemError;
    }
    if (geoSocketRecvAll(fd, challenge, sizeof(challenge), hs_deadline, why) != ncclSuccess)
        return ncclRemoteError;
    geoBootJoinProof(id, challenge, &m, m.proof);
    if (geoSocketSendAll(fd, &m, sizeof(m), deadline, why) != ncclSuccess)
        return ncclRemoteError;
    *proved = 1;
    if (geoSocketRecvAll(fd, magic, sizeof(*magic), deadline, why) != ncclSuccess ||
        *magic != GEO_TABLE_MAGIC)
        return ncclRemoteError;
    if (geoSocketRecvAll(fd, all, tlen, deadline, why) != ncclSuccess ||
        geoSocketRecvAll(fd, mac, sizeof(mac), deadline, why) != ncclSuccess)
        return ncclRemoteError;
    geoSha256(all, tlen, digest);
    geoBootTableMac(id, challenge, m.nonce, self->rank, self->nranks, digest, expect);
    if (!geoDigestEqual(mac, expect, sizeof(mac)) ||
        memcmp(&all[self->rank], mine, sizeof(*mine)) != 0) {
        memset(all, 0, tlen); /* nothing of it is used */
        *magic = GEO_IMPOSTOR_MAGIC;
        *why = "its table does not prove the communicator's secret";
        return ncclRemoteError;
    }
    /* The root keeps listening until every rank has said this: a rank
     * whose connection is reset before it has its table joins again.  Lost,
     * it costs the root's thread a wait, not this rank's init. */
    uint32_t confirm = GEO_CONFIRM_MAGIC;
    const char *w;
    geoSocketSendAll(fd, &confirm, sizeof(confirm), geoNow() + 1.0, &w);
    return ncclSuccess;
}

/* One connection attempt, quiet (a refused candidate is expected), bounded
 * by limit seconds.  -1 when nothing answers. */
static int connect_quiet(const geoSockAddr *addr, double limit)
{
    int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), err = 0;
    socklen_t len = sizeof(err);
    struct pollfd p = {.fd = s, .events = POLLOUT};
    if (s < 0)
        return -1;
    if (connect(s, &addr->sa, geoAddrLen(addr)) != 0 &&
        (errno != EINPROGRESS || poll(&p, 1, (int)(limit * 1000)) != 1 ||
         getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)) {
        close(s);
        return -1;
    }
    return s;
}

/* Dial every candidate not ruled out (skip[k]) at once, quietly (refusals
 * are expected), and wait until each has answered or refused, at most
 * limit seconds: fds[k] the connected ones, -1 the others; how many
 * connected.  At once, because a candidate that refuses costs a round trip:
 * tried in turn, the 31 other ports cost 1.5 s at 25 ms one way whenever a
 * survivor reached candidate 0 before the leader's root listened there. */
static int connect_candidates(const geoUniqueIdInternal *id, const int *skip, double limit,
                              int fds[GEO_SHRINK_PORTS])
{
    struct pollfd p[GEO_SHRINK_PORTS];
    int at[GEO_SHRINK_PORTS], n = 0, got = 0;
    for (int k = 0; k < GEO_SHRINK_PORTS; k++) {
        geoSockAddr cand;
        fds[k] = -1;
        if (skip[k])
            continue;
        geoBootstrapCandidate(id, k, &cand);
        int s = socket(cand.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (s < 0)
            continue;
        if (connect(s, &cand.sa, geoAddrLen(&cand)) == 0) {
            fds[k] = s;
            got++;
        } else if (errno == EINPROGRESS) {
            p[n] = (struct pollfd){.fd = s, .events = POLLOUT};
            at[n++] = k;
        } else {
            close(s);
        }
    }
    double end = geoNow() + limit;
    while (n > 0) {
        double left = end - geoNow();
        int rc = left > 0 ? poll(p, (nfds_t)n, (int)(left * 1000) + 1) : 0;
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            break;
        int keep = 0;
        for (int i = 0; i < n; i++) {
            int err = 0;
            socklen_t len = sizeof(err);
            if (p[i].revents == 0) {
                p[keep] = p[i];
                at[keep++] = at[i];
                continue;
            }
            if (getsockopt(p[i].fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
                fds[at[i]] = p[i].fd;
                got++;
            } else {
                close(p[i].fd);
            }
        }
        n = keep;
    }
    for (int i = 0; i < n; i++) /* no answer within the limit */
        close(p[i].fd);
    return got;
}

/* A GEO_ID_SHRINK id: the survivors agreed on the candidates but not on
 * which one the leader could bind, so try each in turn until one answers
 * as our root: it sends a challenge within a few seconds and does not
 * refuse our proof (another root, e.g. of an earlier shrink, refuses it). */
static ncclResult_t join_candidates(const geoBootSelf *self, const geoUniqueIdInternal *id,
                                    const geoBootInfo *mine, geoBootInfo *all, double deadline)
{
    char ra[GEO_ADDR_STRLEN];
    const char *why = "no candidate answered";
    int refused[GEO_SHRINK_PORTS] = {0}, tried = 0;
    useconds_t backoff = 10000;
    uint8_t token[GEO_CHALLENGE_BYTES];

    if (geoRandomBytes(token, sizeof(token)) != 0)
        return GEO_ERR(self->err, ncclSystemError, "shrink: no randomness for the join");

    while (geoNow() < deadline) {
        int fds[GEO_SHRINK_PORTS];
        connect_candidates(id, refused, 1.0, fds);
        for (int k = 0; k < GEO_SHRINK_PORTS; k++) {
            geoSockAddr cand;
            uint32_t magic = 0;
            int proved = 0, fd = fds[k];
            if (fd < 0)
                continue;
            fds[k] = -1;
            if (geoNow() >= deadline) {
                close(fd);
                continue;
            }
            geoBootstrapCandidate(id, k, &cand);
            tried++;
            double hs = geoNow() + 5.0 < deadline ? geoNow() + 5.0 : deadline;
            ncclResult_t r = join_over_fd(self, id, fd, token, mine, all, hs, deadline, &magic,
                                     &proved, &why);
            close(fd);
            if (r == ncclSuccess) {
                geoInfo(GEO_LOG_INIT, "shrink: joined the root at %s (candidate %d)",
                        geoAddrToString(&cand, ra), k);
                for (int j = k + 1; j < GEO_SHRINK_PORTS; j++)
                    if (fds[j] >= 0)
                        close(fds[j]);
                return ncclSuccess;
            }
            if (magic == GEO_EXPIRED_MAGIC || (proved && magic != GEO_REFUSED_MAGIC &&
                                               magic != GEO_IMPOSTOR_MAGIC &&
                                               strcmp(why, "connection closed by peer") != 0 &&
                                               strcmp(why, strerror(ECONNRESET)) != 0)) {
                for (int j = k + 1; j < GEO_SHRINK_PORTS; j++)
                    if (fds[j] >= 0)
                        close(fds[j]);
                return GEO_ERR(self->err, ncclRemoteError, "shrink: the bootstrap root at %s "
                               "gave up or stopped answering (%s): not all %d survivors joined "
                               "within %.0f s", geoAddrToString(&cand, ra),
                               magic == GEO_EXPIRED_MAGIC ? "expired" : why, self->nranks,
                               self->timeout);
            }
            /* Not our root: it refused the proof.  One that hung up on
             * it (a close or a reset) may be the parent's data listener of
             * the leader, which takes resumed connections until the
             * leader breaks the parent, on the very port its shrink root
             * will take once it is free (candidate 0); a
             * silent one may be ours, busy with a rank that died in its
             * handshake: both are tried again next round. */
            if (proved && (magic == GEO_REFUSED_MAGIC || magic == GEO_IMPOSTOR_MAGIC))
                refused[k] = 1;
            if (magic == GEO_IMPOSTOR_MAGIC)
                geoWarn(GEO_LOG_INIT, "shrink: the listener at %s (candidate %d) answered as "
                        "a bootstrap root but its table does not prove the communicator's "
                        "secret: not ours, ignored", geoAddrToString(&cand, ra), k);
        }
        usleep(backoff);
        if (backoff < 200000)
            backoff *= 2;
    }
    return GEO_ERR(self->err, ncclRemoteError, "shrink: no bootstrap root of the shrunk "
                   "communicator answered at %s or its %d other candidate ports within %.0f s "
                   "(%d answered but were not ours; last cause: %s): the lowest surviving rank "
                   "did not call ncclCommShrink with the same exclude list, or could not listen",
                   geoAddrToString(&id->root, ra), GEO_SHRINK_PORTS - 1, self->timeout, tried,
                   why);
}

ncclResult_t geoBootstrapJoin(const geoBootSelf *self, const geoUniqueIdInternal *id,
                              const geoBootInfo *mine, geoBootInfo *all)
{
    double deadline = geoNow() + self->timeout;
    char ra[GEO_ADDR_STRLEN];
    const char *why = "unknown";
    uint32_t magic = 0;
    int proved = 0;
    int fd;
    uint8_t token[GEO_CHALLENGE_BYTES];

    if (id->flags & GEO_ID_SHRINK)
        return join_candidates(self, id, mine, all, deadline);
    if (geoRandomBytes(token, sizeof(token)) != 0)
        return GEO_ERR(self->err, ncclSystemError, "init: no randomness for the join");
    geoAddrToString(&id->root, ra);
    if (geoSocketConnect(&id->root, deadline, &fd) != ncclSuccess) {
        /* geoSocketConnect reported why; the communicator gets it with
         * what it means here. */
        geoErrSet(self->err, "init: cannot reach the bootstrap root at %s within %.0f s", ra,
                  self->timeout);
        return ncclRemoteError;
    }
    ncclResult_t r = join_over_fd(self, id, fd, token, mine, all, deadline, deadline, &magic,
                                  &proved, &why);
    close(fd);
    /* Closed or reset before any answer: the root may have dropped us
     * among a flood of unproven connections (root.c's root_make_room), or a
     * middlebox reset the connection while we waited for the table or read
     * it (the root then takes us back by our token and sends it again).  Join again while it still
     * listens; a root that is gone refuses the connection and is reported
     * below at once. */
    for (useconds_t backoff = 10000;
         r != ncclSuccess && (magic == 0 || magic == GEO_TABLE_MAGIC) &&
         geoNow() + backoff * 1e-6 < deadline &&
         (strcmp(why, "connection closed by peer") == 0 || strcmp(why, strerror(ECONNRESET)) == 0 ||
          strcmp(why, strerror(ECONNABORTED)) == 0 || strcmp(why, strerror(EPIPE)) == 0 ||
          strcmp(why, strerror(ETIMEDOUT)) == 0);
         backoff = backoff < 200000 ? 2 * backoff : backoff) {
        usleep(backoff);
        if ((fd = connect_quiet(&id->root, 1.0)) < 0)
            break;
        r = join_over_fd(self, id, fd, token, mine, all, deadline, deadline, &magic, &proved, &why);
        close(fd);
        if (r == ncclSuccess)
            geoInfo(GEO_LOG_INIT, "init: joined the bootstrap root at %s again after its "
                    "connection was lost", ra);
    }
    if (r == ncclSuccess)
        return ncclSuccess;
    if (magic == GEO_IMPOSTOR_MAGIC)
        return GEO_ERR(self->err, ncclRemoteError, "init: refused the bootstrap root at %s: its "
                       "table does not prove the communicator's secret (another program holds "
                       "the root's address, or the connection was altered); nothing it sent "
                       "was used", ra);
    if (magic == GEO_REFUSED_MAGIC)
        return GEO_ERR(self->err, ncclRemoteError, "init: the bootstrap root at %s refused rank "
                       "%d: its ncclUniqueId does not carry the root's secret, or rank %d of %d "
                       "is already taken", ra, self->rank, self->rank, self->nranks);
    if (magic == GEO_EXPIRED_MAGIC)
        return GEO_ERR(self->err, ncclRemoteError, "init: the bootstrap root at %s gave up: not "
                       "all %d ranks joined within its timeout (GEOCCL_TIMEOUT of the process "
                       "that made the id)", ra, self->nranks);
    if (proved && strcmp(why, "connection closed by peer") == 0)
        return GEO_ERR(self->err, ncclRemoteError, "init: the bootstrap root at %s closed the "
                       "connection after rank %d joined (the root's process ended, or it "
                       "refused us)", ra, self->rank);
    return GEO_ERR(self->err, ncclRemoteError, "init: bootstrap with the root at %s failed (%s): "
                   "not all %d ranks joined within %.0f s", ra, why, self->nranks,
                   self->timeout);
}
