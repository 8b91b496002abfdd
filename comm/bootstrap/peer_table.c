/* The root's peer table: a joiner whose proof checks is admitted at its
 * rank (the count is the one the root was started with, or else rank 0's:
 * a join claiming another is refused, and nothing is allocated for a count
 * no one who knows it has confirmed; a rank taken by another token is
 * refused), the table goes to every rank with a MAC bound
 * to that rank's challenge and nonce, a rank that joins again after the
 * tables went out gets its table at once, and each rank's confirmation is
 * read back.  All of it runs on the root's thread (root.c) without
 * blocking, but for the single table a re-joined rank gets. */
#include "config.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/bootstrap_internal.h"
#include "comm/base/checks.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void root_refuse(geoBootJoiner *j)
{
    uint32_t no = GEO_REFUSED_MAGIC;
    const char *why;
    geoSocketSendAll(j->fd, &no, sizeof(no), geoNow() + 1.0, &why);
    close(j->fd);
    j->fd = -1;
}

int geoBootTableAlloc(geoBootRootState *rs, int n)
{
    rs->fds = malloc(sizeof(int) * (size_t)n);
    rs->table = calloc((size_t)n, sizeof(*rs->table));
    rs->challenge = calloc((size_t)n, sizeof(*rs->challenge));
    rs->nonce = calloc((size_t)n, sizeof(*rs->nonce));
    rs->token = calloc((size_t)n, sizeof(*rs->token));
    rs->rank_state = calloc((size_t)n, 1);
    rs->confirm = calloc((size_t)n, sizeof(*rs->confirm));
    rs->confirm_off = calloc((size_t)n, sizeof(*rs->confirm_off));
    if (rs->fds == NULL || rs->table == NULL || rs->challenge == NULL || rs->nonce == NULL ||
        rs->token == NULL || rs->rank_state == NULL || rs->confirm == NULL ||
        rs->confirm_off == NULL)
        return -1; /* freed with the root's state */
    rs->nranks = n;
    for (int i = 0; i < n; i++)
        rs->fds[i] = -1;
    return 0;
}

/* A proven joiner waiting for rank 0 sent something or hung up: either
 * way it is no rank waiting for its table.  1 when it is still there. */
static int parked_alive(const geoBootJoiner *j)
{
    char b;
    ssize_t n = recv(j->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

/* Advance one joiner without blocking.  1: it joined (its fd is in
 * rs->fds), or joined again after its connection was lost (the same
 * token: it takes its own place back, and its table is bound to the new
 * challenge); 0: waiting (stage 2: proven, until rank 0's join says the
 * count); -1: dropped (logged, closed); -2: out of memory. */
int geoBootTableAdmit(const geoBootRootArgs *a, geoBootRootState *rs, geoBootJoiner *j)
{
    uint8_t expect[GEO_SHA256_BYTES];
    const char *why = NULL;
    int rc;

    if (j->stage == 0) {
        rc = geoSocketStep(j->fd, j->challenge, sizeof(j->challenge), &j->off, 1, &why);
        if (rc <= 0)
            goto wait_or_drop;
        j->stage = 1;
        j->off = 0;
    }
    if (j->stage == 1) {
        rc = geoSocketStep(j->fd, &j->m, sizeof(j->m), &j->off, 0, &why);
        if (rc <= 0)
            goto wait_or_drop;
        geoBootJoinProof(&a->id, j->challenge, &j->m, expect);
        geoCryptoThreadDone(); /* this thread may wait long for the next joiner */
        if (j->m.magic != GEO_JOIN_MAGIC || !geoDigestEqual(expect, j->m.proof, sizeof(expect))) {
            geoBootRootDropped(&rs->dropped, "%s: its proof does not check (it does not hold "
                               "the communicator's secret, or its join was altered on the way)",
                               j->from);
            root_refuse(j);
            return -1;
        }
        j->stage = 2;
        if (rs->nranks == 0 && j->m.rank != 0) {
            /* The count is not known yet (ncclGetUniqueId's root): only
             * rank 0's word fixes it, so that another rank's claim costs
             * no memory.  Proven, it waits for that without a handshake
             * deadline (the root's own is the limit). */
            j->deadline = rs->deadline;
            geoInfo(GEO_LOG_INIT, "bootstrap root: rank %d (of %d, it says) from %s waits for "
                    "rank 0, which says how many ranks there are", j->m.rank, j->m.nranks,
                    j->from);
            return 0;
        }
    } else if (rs->nranks == 0) {
        /* Waiting for rank 0, and its socket turned readable. */
        if (parked_alive(j))
            return 0;
        geoBootRootDropped(&rs->dropped, "%s (rank %d hung up while waiting for rank 0)",
                           j->from, j->m.rank);
        close(j->fd);
        j->fd = -1;
        return -1;
    }
    if (rs->nranks == 0) {
        if (j->m.nranks < 1 || j->m.nranks > (1 << 20)) {
            geoWarn(GEO_LOG_INIT, "bootstrap root: dropped connection from %s: it claims "
                    "%d ranks", j->from, j->m.nranks);
            close(j->fd);
            j->fd = -1;
            return -1;
        }
        if (geoBootTableAlloc(rs, j->m.nranks) != 0)
            return -2;
    }
    const int r = j->m.rank;
    const int again = j->m.nranks == rs->nranks && r >= 0 && r < rs->nranks &&
                      rs->rank_state[r] == 1 &&
                      memcmp(rs->token[r], j->m.token, GEO_CHALLENGE_BYTES) == 0;
    if (j->m.nranks != rs->nranks || r < 0 || r >= rs->nranks || (rs->rank_state[r] && !again)) {
        geoWarn(GEO_LOG_INIT, "bootstrap root: rank %d of %d from %s conflicts with the "
                "communicator being formed (%d ranks); dropped", j->m.rank, j->m.nranks,
                j->from, rs->nranks);
        root_refuse(j);
        return -1;
    }
    if (again && rs->sent && memcmp(&rs->table[r], &j->m.info, sizeof(j->m.info)) != 0) {
        geoWarn(GEO_LOG_INIT, "bootstrap root: rank %d joined again from %s saying other "
                "things of itself than the table already sent; dropped", r, j->from);
        root_refuse(j);
        return -1;
    }
    if (again) {
        /* Its old connection was reset (a middlebox) or is about to be
         * found dead: this one replaces it. */
        geoInfo(GEO_LOG_INIT, "bootstrap root: rank %d joined again from %s (its connection "
                "was lost)", r, j->from);
        if (rs->fds[r] >= 0)
            close(rs->fds[r]);
    } else {
        rs->joined++;
    }
    rs->rank_state[r] = 1;
    rs->fds[r] = j->fd;
    rs->confirm_off[r] = 0;
    rs->table[r] = j->m.info;
    memcpy(rs->challenge[r], j->challenge, GEO_CHALLENGE_BYTES);
    memcpy(rs->nonce[r], j->m.nonce, GEO_CHALLENGE_BYTES);
    memcpy(rs->token[r], j->m.token, GEO_CHALLENGE_BYTES);
    j->fd = -1;
    return 1;
wait_or_drop:
    if (rc == 0)
        return 0;
    geoBootRootDropped(&rs->dropped, "%s (%s)", j->from, why);
    close(j->fd);
    j->fd = -1;
    return -1;
}

/* Send [magic][table][MAC] to every rank at once; the MAC binds the
 * table to that rank's challenge and nonce, so a rank knows the table
 * comes from a holder of the secret and is not a replay.  A rank that does
 * not take it within 10 s is logged and left to its own timeout. */
void geoBootTableSendAll(const geoBootRootArgs *a, geoBootRootState *rs)
{
    size_t len = sizeof(uint32_t) + sizeof(*rs->table) * (size_t)rs->nranks;
    char *msg = malloc(len);
    size_t *off = calloc((size_t)rs->nranks, sizeof(size_t));
    size_t *moff = calloc((size_t)rs->nranks, sizeof(size_t));
    uint8_t (*mac)[GEO_SHA256_BYTES] = calloc((size_t)rs->nranks, sizeof(*mac));
    struct pollfd *pfd = calloc((size_t)rs->nranks, sizeof(*pfd));
    int *rank_of = calloc((size_t)rs->nranks, sizeof(int));
    double deadline = geoNow() + 10.0;
    int left = rs->nranks;
    uint32_t magic = GEO_TABLE_MAGIC;
    uint8_t digest[GEO_SHA256_BYTES];

    if (msg == NULL || off == NULL || moff == NULL || mac == NULL || pfd == NULL ||
        rank_of == NULL) {
        geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory for the table");
        goto out;
    }
    memcpy(msg, &magic, sizeof(magic));
    memcpy(msg + sizeof(magic), rs->table, len - sizeof(magic));
    geoSha256(rs->table, len - sizeof(magic), digest);
    memcpy(rs->digest, digest, sizeof(digest));
    rs->sent = 1;
    for (int r = 0; r < rs->nranks; r++)
        geoBootTableMac(&a->id, rs->challenge[r], rs->nonce[r], r, rs->nranks, digest, mac[r]);
    /* The last libcrypto call of this detached thread: once a rank has its
     * table its process may exit, and so unload libcrypto, before this
     * thread has returned. */
    geoCryptoThreadDone();
    while (left > 0) {
        int n = 0;
        for (int r = 0; r < rs->nranks; r++) {
            const char *why = NULL;
            if (rs->fds[r] < 0 || moff[r] == GEO_SHA256_BYTES)
                continue;
            int rc = off[r] < len ? geoSocketStep(rs->fds[r], msg, len, &off[r], 1, &why) : 1;
            if (rc > 0)
                rc = geoSocketStep(rs->fds[r], mac[r], GEO_SHA256_BYTES, &moff[r], 1, &why);
            if (rc == 0) {
                pfd[n] = (struct pollfd){.fd = rs->fds[r], .events = POLLOUT};
                rank_of[n++] = r;
                continue;
            }
            if (rc < 0) {
                /* (a reset: it joins again, and geoBootTableSendOne sends it then) */
                geoInfo(GEO_LOG_INIT, "bootstrap root: could not send the table to rank %d: "
                        "%s", r, why);
                close(rs->fds[r]);
                rs->fds[r] = -1;
            }
            moff[r] = GEO_SHA256_BYTES;
            left--;
        }
        if (n == 0)
            break;
        double ms = (deadline - geoNow()) * 1000.0;
        if (ms <= 0) {
            for (int i = 0; i < n; i++)
                geoWarn(GEO_LOG_INIT, "bootstrap root: could not send the table to rank %d: "
                        "timed out", rank_of[i]);
            break;
        }
        if (poll(pfd, (nfds_t)n, ms > 100 ? 100 : (int)ms + 1) < 0 && errno != EINTR) {
            geoWarn(GEO_LOG_INIT, "bootstrap root: poll failed: %s", strerror(errno));
            break;
        }
    }
out:
    free(msg);
    free(off);
    free(moff);
    free(mac);
    free(pfd);
    free(rank_of);
}

/* A rank that joined again once the tables were out: its table, bound to
 * its new challenge and nonce, at once (blocking, 5 s at most: a table is
 * 512 bytes a rank).  On failure its connection is lost again. */
void geoBootTableSendOne(const geoBootRootArgs *a, geoBootRootState *rs, int r)
{
    uint32_t magic = GEO_TABLE_MAGIC;
    uint8_t mac[GEO_SHA256_BYTES];
    const char *why = NULL;
    double dl = geoNow() + 5.0;
    geoBootTableMac(&a->id, rs->challenge[r], rs->nonce[r], r, rs->nranks, rs->digest, mac);
    geoCryptoThreadDone();
    if (geoSocketSendAll(rs->fds[r], &magic, sizeof(magic), dl, &why) != ncclSuccess ||
        geoSocketSendAll(rs->fds[r], rs->table, sizeof(*rs->table) * (size_t)rs->nranks, dl,
                         &why) != ncclSuccess ||
        geoSocketSendAll(rs->fds[r], mac, sizeof(mac), dl, &why) != ncclSuccess) {
        geoInfo(GEO_LOG_INIT, "bootstrap root: could not send the table to rank %d again: %s",
                r, why);
        close(rs->fds[r]);
        rs->fds[r] = -1;
    }
}

/* A rank's connection is readable once the tables are out: its
 * confirmation (then it is done and closed), or a close or reset (then
 * it is lost until it joins again). */
void geoBootTableTakeConfirm(geoBootRootState *rs, int r)
{
    const char *why = NULL;
    int rc = geoSocketStep(rs->fds[r], &rs->confirm[r], sizeof(rs->confirm[r]),
                           &rs->confirm_off[r], 0, &why);
    if (rc == 0)
        return;
    close(rs->fds[r]);
    rs->fds[r] = -1;
    if (rc > 0 && rs->confirm[r] == GEO_CONFIRM_MAGIC) {
        rs->rank_state[r] = 2;
        rs->acked++;
        return;
    }
    rs->confirm_off[r] = 0;
    geoInfo(GEO_LOG_INIT, "bootstrap root: rank %d's connection was lost before it confirmed "
            "its table (%s); waiting for it to join again", r, rc > 0 ? "not a confirmation" : why);
}
