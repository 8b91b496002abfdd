#include "config.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/transport/ifaces.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GEO_JOIN_MAGIC 0x47454f4au /* "GEOJ" */
#define GEO_TABLE_MAGIC 0x47454f54u /* "GEOT" */
#define GEO_REFUSED_MAGIC 0x47454f52u /* "GEOR": wrong proof, or rank taken */
#define GEO_EXPIRED_MAGIC 0x47454f58u /* "GEOX": the root gave up waiting */
#define GEO_GOT_MAGIC 0x47454f47u /* "GEOG": the joiner has its table, proven */
#define GEO_CHALLENGE_BYTES 16

/* Joiner to root.  proof = HMAC(secret, "geoccl/v2/join" | root's challenge
 * | joiner's nonce | rank | nranks | id nonce | info): it proves the secret,
 * is fresh for the root's challenge, and binds what the rank says of
 * itself, so a relay can change none of it. */
typedef struct {
    uint32_t magic;
    int32_t rank;
    int32_t nranks;
    uint32_t pad;
    uint8_t nonce[GEO_CHALLENGE_BYTES];
    uint8_t proof[GEO_SHA256_BYTES];
    /* The same in every attempt of one join (random per geoBootstrapJoin):
     * a rank whose connection was reset joins again with it and takes its
     * own place back; another process claiming the rank is refused. */
    uint8_t token[GEO_CHALLENGE_BYTES];
    geoBootInfo info;
} geoJoinMsg;

typedef struct {
    geoUniqueIdInternal id;
    int listen_fd;
    double timeout;
    int nranks_hint;            /* 0: learn from the first join */
} rootArgs;

/* HMAC(secret, label | challenge | nonce | rank | nranks | id nonce | body):
 * the join proof (body = the joiner's info) and the table's MAC (body =
 * SHA-256 of the table), under labels of their own so that neither can
 * stand for the other, nor for a data connection's hello. */
static void boot_mac(const geoUniqueIdInternal *id, const char *label, const uint8_t *challenge,
                     const uint8_t *nonce, int rank, int nranks, const void *body, size_t blen,
                     uint8_t out[GEO_SHA256_BYTES])
{
    uint8_t msg[24 + 2 * GEO_CHALLENGE_BYTES + 16 + GEO_BOOT_INFO_BYTES];
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
    geoHmacSha256(id->secret, sizeof(id->secret), msg, o + blen, out);
}

static void join_proof(const geoUniqueIdInternal *id, const uint8_t *challenge,
                       const geoJoinMsg *m, uint8_t out[GEO_SHA256_BYTES])
{
    boot_mac(id, "geoccl/v2/join", challenge, m->nonce, m->rank, m->nranks, &m->info,
             sizeof(m->info), out);
}

static void table_mac(const geoUniqueIdInternal *id, const uint8_t *challenge, const uint8_t *nonce,
                      int rank, int nranks, const uint8_t table_digest[GEO_SHA256_BYTES],
                      uint8_t out[GEO_SHA256_BYTES])
{
    boot_mac(id, "geoccl/v2/table", challenge, nonce, rank, nranks, table_digest,
             GEO_SHA256_BYTES, out);
}

/* The root: collects one join per rank, then sends everyone the table.
 * All joiners are handled at once in one poll() loop: each accepted
 * connection runs its own handshake (challenge out, join message in) with
 * its own deadline, so a WAN costs one round trip in all rather than one
 * per rank, and a stranger that never answers holds only its own slot. */
#define GEO_ROOT_HANDSHAKE_S 5.0  /* a joiner proves itself by then */
/* Unproven connections are all served at once (idle strangers cannot make
 * a rank wait in the backlog); beyond these bounds, over all sources and
 * per source address, one unproven connection chosen at random is dropped
 * to make room, and a rank dropped so joins again.  At most 64 are accepted
 * per pass, so that a flood cannot stop the handshakes under way. */
#define GEO_ROOT_MAX_PENDING 1024
#define GEO_ROOT_MAX_PENDING_PER_SOURCE 256

typedef struct {
    int fd;
    int stage;        /* 0: sending the challenge; 1: receiving the join */
    size_t off;
    double deadline;
    char from[GEO_ADDR_STRLEN];
    geoSockAddr src;
    uint8_t challenge[GEO_CHALLENGE_BYTES];
    geoJoinMsg m;
} rootJoiner;

typedef struct {
    int nranks;       /* 0 until the first valid join */
    int joined;       /* ranks that joined (once each, whatever their rejoins) */
    int acked;        /* ranks that confirmed their table (GEO_GOT_MAGIC) */
    int *fds;         /* per rank, -1 until it joined, or while its connection is lost */
    char *has;        /* per rank: 0 not joined; 1 joined; 2 confirmed its table */
    uint32_t *got;    /* per rank: the confirmation being read */
    size_t *got_off;
    uint8_t (*token)[GEO_CHALLENGE_BYTES];
    int sent;         /* the tables went out: the table is final */
    uint8_t digest[GEO_SHA256_BYTES]; /* of the final table */
    geoBootInfo *table;
    uint8_t (*challenge)[GEO_CHALLENGE_BYTES]; /* per rank: what its table's MAC binds */
    uint8_t (*nonce)[GEO_CHALLENGE_BYTES];
    int dropped;      /* connections dropped: the first few are logged one by one */
} rootState;

/* Log a dropped connection; past the first GEO_ROOT_DROP_LOG only count
 * it (a port scan or a flood must not bury the log), summed up at the end. */
#define GEO_ROOT_DROP_LOG 8
static void root_dropped(int *count, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void root_dropped(int *count, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    if ((*count)++ >= GEO_ROOT_DROP_LOG)
        return;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    geoWarn(GEO_LOG_INIT, "bootstrap root: dropped connection from %s%s", text,
            *count == GEO_ROOT_DROP_LOG ? " (further drops are only counted)" : "");
}

/* Drop the oldest unproven joiner when there are max of them (from src, or
 * from anywhere when src is NULL). */
static void root_make_room(rootState *rs, rootJoiner *pend, int npend, const geoSockAddr *src,
                           int max)
{
    int n = 0, pick = -1;
    uint32_t r = 0;
    for (int i = 0; i < npend; i++)
        n += pend[i].fd >= 0 && (src == NULL || geoAddrSameHost(&pend[i].src, src));
    if (n < max || n == 0)
        return;
    /* One chosen at random, so that a flood cannot aim at a rank's
     * handshake; a rank dropped so joins again (geoBootstrapJoin). */
    if (geoRandomBytes(&r, sizeof(r)) != 0)
        r = 0;
    for (int i = 0, k = (int)(r % (uint32_t)n); i < npend; i++)
        if (pend[i].fd >= 0 && (src == NULL || geoAddrSameHost(&pend[i].src, src)) && k-- == 0) {
            pick = i;
            break;
        }
    root_dropped(&rs->dropped, "%s (unproven; room for newer ones)", pend[pick].from);
    close(pend[pick].fd);
    pend[pick].fd = -1;
}

static void root_refuse(rootJoiner *j)
{
    uint32_t no = GEO_REFUSED_MAGIC;
    const char *why;
    geoSocketSendAll(j->fd, &no, sizeof(no), geoNow() + 1.0, &why);
    close(j->fd);
    j->fd = -1;
}

/* Advance one joiner without blocking.  1: it joined (its fd is in
 * rs->fds), or joined again after its connection was lost (the same
 * token: it takes its own place back, and its table is bound to the new
 * challenge); 0: waiting; -1: dropped (logged, closed); -2: out of
 * memory. */
static int root_step(const rootArgs *a, rootState *rs, rootJoiner *j)
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
    rc = geoSocketStep(j->fd, &j->m, sizeof(j->m), &j->off, 0, &why);
    if (rc <= 0)
        goto wait_or_drop;
    join_proof(&a->id, j->challenge, &j->m, expect);
    geoCryptoThreadDone(); /* this thread may wait long for the next joiner */
    if (j->m.magic != GEO_JOIN_MAGIC || !geoDigestEqual(expect, j->m.proof, sizeof(expect))) {
        root_dropped(&rs->dropped, "%s: it does not hold the communicator's secret", j->from);
        root_refuse(j);
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
        rs->fds = malloc(sizeof(int) * (size_t)j->m.nranks);
        rs->table = calloc((size_t)j->m.nranks, sizeof(*rs->table));
        rs->challenge = calloc((size_t)j->m.nranks, sizeof(*rs->challenge));
        rs->nonce = calloc((size_t)j->m.nranks, sizeof(*rs->nonce));
        rs->token = calloc((size_t)j->m.nranks, sizeof(*rs->token));
        rs->has = calloc((size_t)j->m.nranks, 1);
        rs->got = calloc((size_t)j->m.nranks, sizeof(*rs->got));
        rs->got_off = calloc((size_t)j->m.nranks, sizeof(*rs->got_off));
        if (rs->fds == NULL || rs->table == NULL || rs->challenge == NULL || rs->nonce == NULL ||
            rs->token == NULL || rs->has == NULL || rs->got == NULL || rs->got_off == NULL)
            return -2;
        rs->nranks = j->m.nranks;
        for (int i = 0; i < rs->nranks; i++)
            rs->fds[i] = -1;
    }
    const int r = j->m.rank;
    const int again = j->m.nranks == rs->nranks && r >= 0 && r < rs->nranks && rs->has[r] == 1 &&
                      memcmp(rs->token[r], j->m.token, GEO_CHALLENGE_BYTES) == 0;
    if (j->m.nranks != rs->nranks || r < 0 || r >= rs->nranks || (rs->has[r] && !again)) {
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
    rs->has[r] = 1;
    rs->fds[r] = j->fd;
    rs->got_off[r] = 0;
    rs->table[r] = j->m.info;
    memcpy(rs->challenge[r], j->challenge, GEO_CHALLENGE_BYTES);
    memcpy(rs->nonce[r], j->m.nonce, GEO_CHALLENGE_BYTES);
    memcpy(rs->token[r], j->m.token, GEO_CHALLENGE_BYTES);
    j->fd = -1;
    return 1;
wait_or_drop:
    if (rc == 0)
        return 0;
    root_dropped(&rs->dropped, "%s (%s)", j->from, why);
    close(j->fd);
    j->fd = -1;
    return -1;
}

/* Send [magic][table][MAC] to every rank at once; the MAC binds the
 * table to that rank's challenge and nonce, so a rank knows the table
 * comes from a holder of the secret and is not a replay.  A rank that does
 * not take it within 10 s is logged and left to its own timeout. */
static void root_send_tables(const rootArgs *a, rootState *rs)
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
        table_mac(&a->id, rs->challenge[r], rs->nonce[r], r, rs->nranks, digest, mac[r]);
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
                /* (a reset: it joins again, and root_send_one sends it then) */
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
static void root_send_one(const rootArgs *a, rootState *rs, int r)
{
    uint32_t magic = GEO_TABLE_MAGIC;
    uint8_t mac[GEO_SHA256_BYTES];
    const char *why = NULL;
    double dl = geoNow() + 5.0;
    table_mac(&a->id, rs->challenge[r], rs->nonce[r], r, rs->nranks, rs->digest, mac);
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
static void root_take_got(rootState *rs, int r)
{
    const char *why = NULL;
    int rc = geoSocketStep(rs->fds[r], &rs->got[r], sizeof(rs->got[r]), &rs->got_off[r], 0, &why);
    if (rc == 0)
        return;
    close(rs->fds[r]);
    rs->fds[r] = -1;
    if (rc > 0 && rs->got[r] == GEO_GOT_MAGIC) {
        rs->has[r] = 2;
        rs->acked++;
        return;
    }
    rs->got_off[r] = 0;
    geoInfo(GEO_LOG_INIT, "bootstrap root: rank %d's connection was lost before it confirmed "
            "its table (%s); waiting for it to join again", r, rc > 0 ? "not a confirmation" : why);
}

static void *root_main(void *arg)
{
    rootArgs *a = arg;
    double deadline = geoNow() + a->timeout;
    rootState rs = {0};
    rootJoiner *pend = NULL;
    struct pollfd *pfd = NULL;
    int npend = 0, cap = 0, pfd_cap = 0;
    int *rank_at = NULL; /* the ranks polled for their confirmation */
    double confirm_by = 0;

    if (geoSocketSetNonBlocking(a->listen_fd, 1) != 0) {
        geoWarn(GEO_LOG_INIT, "bootstrap root: cannot make the listener non-blocking: %s",
                strerror(errno));
        goto out;
    }
    /* Collect the joins; send the tables; then wait until every rank has
     * confirmed its table, taking back ranks whose connection was reset
     * meanwhile (they join again with their token, and get their table at
     * once when the tables are out). */
    for (;;) {
        if (!rs.sent && rs.nranks > 0 && rs.joined == rs.nranks) {
            root_send_tables(a, &rs);
            confirm_by = geoNow() + a->timeout;
        }
        if (rs.sent && rs.acked == rs.nranks)
            break;
        double now = geoNow(), wake = rs.sent ? confirm_by : deadline;

        if (!rs.sent && now >= deadline) {
            geoWarn(GEO_LOG_INIT, "bootstrap root: only %d of %d ranks joined within %.0f s; "
                    "giving up", rs.joined, rs.nranks, a->timeout);
            /* Tell the ranks that did join why they get no table. */
            for (int r = 0; r < rs.nranks; r++)
                if (rs.fds[r] >= 0) {
                    uint32_t x = GEO_EXPIRED_MAGIC;
                    const char *w;
                    geoSocketSendAll(rs.fds[r], &x, sizeof(x), geoNow() + 1.0, &w);
                }
            goto out;
        }
        if (rs.sent && now >= confirm_by) {
            geoWarn(GEO_LOG_INIT, "bootstrap root: %d of %d ranks did not confirm their table "
                    "within %.0f s (their connections were lost and they did not join again)",
                    rs.nranks - rs.acked, rs.nranks, a->timeout);
            break;
        }
        if (rs.sent && rank_at == NULL &&
            (rank_at = malloc(sizeof(int) * (size_t)rs.nranks)) == NULL) {
            geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory");
            goto out;
        }
        const int maxr = rs.sent ? rs.nranks : 0;
        if (cap < npend + 1) {
            int ncap = 2 * (npend + 1) + 16;
            rootJoiner *np = realloc(pend, sizeof(*pend) * (size_t)ncap);
            if (np)
                pend = np;
            if (np == NULL) {
                geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory");
                goto out;
            }
            cap = ncap;
        }
        if (pfd_cap < cap + 1 + maxr) {
            struct pollfd *nf = realloc(pfd, sizeof(*pfd) * (size_t)(cap + 1 + maxr));
            if (nf == NULL) {
                geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory");
                goto out;
            }
            pfd = nf;
            pfd_cap = cap + 1 + maxr;
        }
        for (int i = 0; i < npend; i++) {
            pfd[i] = (struct pollfd){.fd = pend[i].fd,
                                     .events = pend[i].stage == 0 ? POLLOUT : POLLIN};
            if (pend[i].deadline < wake)
                wake = pend[i].deadline;
        }
        pfd[npend] = (struct pollfd){.fd = a->listen_fd, .events = POLLIN};
        int nr = 0;
        for (int r = 0; r < maxr; r++)
            if (rs.fds[r] >= 0 && rs.has[r] == 1) {
                pfd[npend + 1 + nr] = (struct pollfd){.fd = rs.fds[r], .events = POLLIN};
                rank_at[nr++] = r;
            }
        double ms = (wake - now) * 1000.0;
        int rc = poll(pfd, (nfds_t)(npend + 1 + nr), ms <= 0 ? 0 : ms >= 100 ? 100 : (int)ms + 1);
        if (rc < 0 && errno != EINTR) {
            geoWarn(GEO_LOG_INIT, "bootstrap root: poll failed: %s", strerror(errno));
            goto out;
        }
        now = geoNow();
        for (int i = 0; i < npend; i++) {
            int r = 0;
            if (pfd[i].revents)
                r = root_step(a, &rs, &pend[i]);
            if (r == -2) {
                geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory");
                goto out;
            }
            if (r == 1 && rs.sent)
                root_send_one(a, &rs, pend[i].m.rank);
            if (r == 0 && now >= pend[i].deadline) {
                root_dropped(&rs.dropped, "%s (timed out)", pend[i].from);
                close(pend[i].fd);
                pend[i].fd = -1;
            }
        }
        for (int k = 0; k < nr; k++)
            if (pfd[npend + 1 + k].revents && rs.fds[rank_at[k]] >= 0)
                root_take_got(&rs, rank_at[k]);
        /* Take what arrived; each new joiner gets its challenge at once. */
        /* The listener's entry is pfd[npend] only until npend grows. */
        int lready = (pfd[npend].revents & POLLIN) != 0;
        for (int taken = 0; lready && npend < cap && taken < 64; taken++) {
            rootJoiner *j = &pend[npend];
            geoSockAddr from;
            int got = geoSocketAcceptNB(a->listen_fd, &j->fd, &from);
            if (got < 0 && (errno == EMFILE || errno == ENFILE)) {
                root_make_room(&rs, pend, npend, NULL, 1);
                break; /* the next round accepts again */
            }
            if (got < 0)
                geoWarn(GEO_LOG_INIT, "bootstrap root: accept failed: %s", strerror(errno));
            if (got <= 0)
                break;
            geoAddrToString(&from, j->from);
            j->src = from;
            root_make_room(&rs, pend, npend, &from, GEO_ROOT_MAX_PENDING_PER_SOURCE);
            root_make_room(&rs, pend, npend, NULL, GEO_ROOT_MAX_PENDING);
            j->stage = 0;
            j->off = 0;
            j->deadline = now + GEO_ROOT_HANDSHAKE_S;
            if (geoRandomBytes(j->challenge, sizeof(j->challenge)) != 0) {
                geoWarn(GEO_LOG_INIT, "bootstrap root: dropped connection from %s (no "
                        "randomness)", j->from);
                close(j->fd);
                continue;
            }
            npend++;
            int r1 = root_step(a, &rs, j);
            if (r1 == -2) {
                geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory");
                goto out;
            }
            if (r1 == 1 && rs.sent)
                root_send_one(a, &rs, j->m.rank);
        }
        int keep = 0;
        for (int i = 0; i < npend; i++)
            if (pend[i].fd >= 0)
                pend[keep++] = pend[i];
        npend = keep;
    }
    for (int i = 0; i < npend; i++) {
        root_dropped(&rs.dropped, "%s (handshake unfinished when every rank had its table)",
                     pend[i].from);
        close(pend[i].fd);
    }
    if (rs.dropped > GEO_ROOT_DROP_LOG)
        geoWarn(GEO_LOG_INIT, "bootstrap root: dropped %d connections in all before they "
                "proved the secret (timed out, refused or dropped for room; %d logged "
                "above)", rs.dropped, GEO_ROOT_DROP_LOG);
    npend = 0;
out:
    for (int i = 0; i < npend; i++)
        if (pend[i].fd >= 0)
            close(pend[i].fd);
    if (rs.fds)
        for (int r = 0; r < rs.nranks; r++)
            if (rs.fds[r] >= 0)
                close(rs.fds[r]);
    free(rs.fds);
    free(rs.table);
    free(rs.challenge);
    free(rs.nonce);
    free(rs.token);
    free(rs.has);
    free(rs.got);
    free(rs.got_off);
    free(rank_at);
    free(pend);
    free(pfd);
    close(a->listen_fd);
    geoWipe(a, sizeof(*a));
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

/* scrypt's cost for GEOCCL_COMM_SECRET passphrases: 2^15 x 8 x 128 bytes =
 * 32 MiB and about 0.1 s per rank at init, so that one sniffed handshake
 * costs a dictionary attack that much per guess on every guess. */
#define GEO_SCRYPT_N (1u << 15)
#define GEO_SCRYPT_R 8
#define GEO_SCRYPT_P 1

static int hex_key(const char *s, uint8_t out[GEO_SHA256_BYTES])
{
    if (strlen(s) != 2 * GEO_SHA256_BYTES)
        return 0;
    for (int i = 0; i < GEO_SHA256_BYTES; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1 || !isxdigit((unsigned char)s[2 * i]) ||
            !isxdigit((unsigned char)s[2 * i + 1]))
            return 0;
        out[i] = (uint8_t)v;
    }
    return 1;
}

static ncclResult_t env_id(geoUniqueIdInternal *id)
{
    const char *cid = geoParamStrLive(GEO_PARAM_COMM_ID);
    const char *secret = geoParamStrLive(GEO_PARAM_COMM_SECRET);
    uint8_t key[GEO_SHA256_BYTES];
    char salt[300];

    memset(id, 0, sizeof(id[0]));
    id->magic = GEO_ID_MAGIC;
    id->flags = GEO_ID_ENV;
    GEO_CHECK(geoAddrFromString(cid, &id->root));
    /* The salt is the GEOCCL_COMM_ID string: every rank of the job knows
     * it, and a guess tried against one job's handshake serves only jobs
     * with the same string (ranks must spell it alike, or they derive
     * different secrets and are refused as strangers). */
    snprintf(salt, sizeof(salt), "geoccl/v2/env:%s", cid);
    if (secret != NULL && hex_key(secret, key)) {
        geoHmacSha256(key, sizeof(key), salt, strlen(salt), id->secret);
    } else if (secret != NULL) {
        GEO_RETURN_IF(secret[0] == '\0', ncclInvalidArgument,
                      "GEOCCL_COMM_SECRET is set but empty");
        GEO_RETURN_IF(geoScrypt(secret, strlen(secret), salt, strlen(salt), GEO_SCRYPT_N,
                                GEO_SCRYPT_R, GEO_SCRYPT_P, id->secret, sizeof(id->secret)) != 0,
                      ncclSystemError, "cannot stretch GEOCCL_COMM_SECRET with scrypt (out of "
                      "memory?)");
    } else {
        /* No secret: every rank derives the same key from the address, so
         * connections are checked for consistency, but anyone who knows
         * the address can join.  Init refuses such a communicator when any
         * of its connections is to be encrypted (GEO_ID_NOSECRET). */
        id->flags |= GEO_ID_NOSECRET;
        geoHmacSha256(salt, strlen(salt), "geoccl/v2/no-secret", 19, id->secret);
    }
    geoWipe(key, sizeof(key));
    id->nonce = 0;
    return ncclSuccess;
}

static ncclResult_t new_root(const uint8_t *secret, ncclUniqueId *out)
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
    if (secret != NULL)
        memcpy(id.secret, secret, sizeof(id.secret));
    if ((secret == NULL && geoRandomBytes(id.secret, sizeof(id.secret)) != 0) ||
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

ncclResult_t geoBootstrapNewRoot(ncclUniqueId *out)
{
    return new_root(NULL, out);
}

ncclResult_t geoBootstrapNewRootKeyed(const uint8_t secret[GEO_SHA256_BYTES], ncclUniqueId *out)
{
    return new_root(secret, out);
}

void geoBootstrapChildSecret(const uint8_t *parent_secret, uint64_t parent_hash,
                             uint64_t counter, int64_t tag, uint8_t out[GEO_SHA256_BYTES])
{
    uint8_t msg[24 + 24] = "geoccl/v2/child";
    memcpy(msg + 24, &parent_hash, 8);
    memcpy(msg + 32, &counter, 8);
    memcpy(msg + 40, &tag, 8);
    geoHmacSha256(parent_secret, GEO_SHA256_BYTES, msg, sizeof(msg), out);
}

void geoBootstrapSetSecret(ncclUniqueId *uid, const uint8_t *secret)
{
    geoUniqueIdInternal id;
    memcpy(&id, uid->internal, sizeof(id));
    if (secret != NULL)
        memcpy(id.secret, secret, sizeof(id.secret));
    else
        memset(id.secret, 0, sizeof(id.secret));
    memcpy(uid->internal, &id, sizeof(id));
}

void geoBootstrapMarkNoSecret(ncclUniqueId *uid)
{
    geoUniqueIdInternal id;
    memcpy(&id, uid->internal, sizeof(id));
    id.flags |= GEO_ID_NOSECRET;
    memcpy(uid->internal, &id, sizeof(id));
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

void geoBootstrapCandidate(const geoUniqueIdInternal *id, int k, geoSockAddr *out)
{
    *out = id->root;
    if (k == 0)
        return;
    uint8_t msg[24] = "geoccl-shrink-port", h[GEO_SHA256_BYTES];
    int32_t kk = k;
    uint32_t v;
    memcpy(msg + 19, &kk, 4);
    geoHmacSha256(id->secret, sizeof(id->secret), msg, sizeof(msg), h);
    memcpy(&v, h, sizeof(v));
    /* Below Linux's ephemeral range (32768-60999), so that no outgoing
     * connection of the leader's host holds it. */
    uint16_t port = htons((uint16_t)(20000 + v % 12768));
    if (out->sa.sa_family == AF_INET6)
        out->sin6.sin6_port = port;
    else
        out->sin.sin_port = port;
}

void geoBootstrapShrinkId(const uint8_t *secret, uint64_t comm_hash, int nranks,
                          const geoSockAddr *leader_addr, const uint8_t *excluded,
                          uint32_t counter, ncclUniqueId *out)
{
    geoUniqueIdInternal id;
    size_t n = (size_t)nranks, len = 16 + 8 + 4 + 4 + n;
    uint8_t *msg = calloc(1, len), h[GEO_SHA256_BYTES];
    int32_t nr = nranks;

    memset(&id, 0, sizeof(id));
    id.magic = GEO_ID_MAGIC;
    id.flags = GEO_ID_SHRINK;
    id.root = *leader_addr;
    if (msg != NULL) {
        memcpy(msg, "geoccl-shrink-v1", 16);
        memcpy(msg + 16, &comm_hash, 8);
        memcpy(msg + 24, &counter, 4);
        memcpy(msg + 28, &nr, 4);
        for (size_t r = 0; r < n; r++)
            msg[32 + r] = excluded[r] ? 1 : 0;
        geoHmacSha256(secret, GEO_SHA256_BYTES, msg, len, id.secret);
        free(msg);
    } else {
        /* Without memory for the set, the counter alone separates shrinks;
         * every survivor takes this path only if all are out of memory,
         * and a mismatch fails as a refused join, not silently. */
        uint8_t small[32];
        memcpy(small, "geoccl-shrink-v1", 16);
        memcpy(small + 16, &comm_hash, 8);
        memcpy(small + 24, &counter, 4);
        memcpy(small + 28, &nr, 4);
        geoHmacSha256(secret, GEO_SHA256_BYTES, small, sizeof(small), id.secret);
    }
    geoHmacSha256(id.secret, sizeof(id.secret), "geoccl-shrink-nonce", 19, h);
    memcpy(&id.nonce, h, sizeof(id.nonce));
    memset(out, 0, sizeof(*out));
    memcpy(out->internal, &id, sizeof(id));
}

ncclResult_t geoBootstrapStartRoot(const geoUniqueIdInternal *id, int nranks, double timeout)
{
    int fd;
    geoSockAddr bound, cand;
    char a[GEO_ADDR_STRLEN];
    (void)nranks;
    if (!(id->flags & GEO_ID_SHRINK)) {
        GEO_CHECK(geoSocketListen(&id->root, &fd, &bound));
        return start_root_thread(id, fd, timeout);
    }
    for (int k = 0; k < GEO_SHRINK_PORTS; k++) {
        geoBootstrapCandidate(id, k, &cand);
        if (geoSocketListen(&cand, &fd, &bound) == ncclSuccess) {
            geoInfo(GEO_LOG_INIT, "shrink: bootstrap root listening on %s (candidate %d)",
                    geoAddrToString(&bound, a), k);
            return start_root_thread(id, fd, timeout);
        }
    }
    char last[256];
    snprintf(last, sizeof(last), "%s", geoThreadError());
    GEO_RETURN_IF(1, ncclSystemError, "cannot listen on any of the %d candidate ports of "
                  "the shrunk communicator's root at %s (the last error: %s)",
                  GEO_SHRINK_PORTS, geoAddrToString(&id->root, a), last);
}

/* Not on the wire: join_on's word for a root whose table's MAC is wrong. */
#define GEO_IMPOSTOR_MAGIC 0x47454f21u

/* One try at the root behind fd: challenge (by hs_deadline), proof and my
 * info, then the table and its MAC.  *magic: the root's last word
 * (GEO_IMPOSTOR_MAGIC: a table that does not prove the secret); *proved:
 * the proof went out. */
static ncclResult_t join_on(const geoBootSelf *self, const geoUniqueIdInternal *id, int fd,
                            const uint8_t token[GEO_CHALLENGE_BYTES], const geoBootInfo *mine,
                            geoBootInfo *all, double hs_deadline, double deadline,
                            uint32_t *magic, int *proved, const char **why)
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
    join_proof(id, challenge, &m, m.proof);
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
    table_mac(id, challenge, m.nonce, self->rank, self->nranks, digest, expect);
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
    uint32_t got = GEO_GOT_MAGIC;
    const char *w;
    geoSocketSendAll(fd, &got, sizeof(got), geoNow() + 1.0, &w);
    return ncclSuccess;
}

/* One connection attempt, quiet (a refused candidate is expected), bounded
 * by limit seconds.  -1 when nothing answers. */
static int connect_once(const geoSockAddr *addr, double limit)
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

    if (geoRandomBytes(token, sizeof(token)) != 0) {
        geoErrSet(self->err, "shrink: no randomness for the join");
        return ncclSystemError;
    }

    while (geoNow() < deadline) {
        for (int k = 0; k < GEO_SHRINK_PORTS && geoNow() < deadline; k++) {
            geoSockAddr cand;
            uint32_t magic = 0;
            int proved = 0, fd;
            if (refused[k])
                continue;
            geoBootstrapCandidate(id, k, &cand);
            if ((fd = connect_once(&cand, 1.0)) < 0)
                continue;
            tried++;
            double hs = geoNow() + 5.0 < deadline ? geoNow() + 5.0 : deadline;
            ncclResult_t r = join_on(self, id, fd, token, mine, all, hs, deadline, &magic,
                                     &proved, &why);
            close(fd);
            if (r == ncclSuccess) {
                geoInfo(GEO_LOG_INIT, "shrink: joined the root at %s (candidate %d)",
                        geoAddrToString(&cand, ra), k);
                return ncclSuccess;
            }
            if (magic == GEO_EXPIRED_MAGIC || (proved && magic != GEO_REFUSED_MAGIC &&
                                               magic != GEO_IMPOSTOR_MAGIC &&
                                               strcmp(why, "connection closed by peer") != 0 &&
                                               strcmp(why, strerror(ECONNRESET)) != 0)) {
                geoErrSet(self->err, "shrink: the bootstrap root at %s gave up or stopped "
                                "answering (%s): not all %d survivors joined within %.0f s",
                                geoAddrToString(&cand, ra), magic == GEO_EXPIRED_MAGIC
                                                                ? "expired" : why,
                                self->nranks, self->timeout);
                return ncclRemoteError;
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
    geoErrSet(self->err, "shrink: no bootstrap root of the shrunk communicator answered at "
                    "%s or its %d other candidate ports within %.0f s (%d answered but were "
                    "not ours; last cause: %s): the lowest surviving rank did not call "
                    "ncclCommShrink with the same exclude list, or could not listen",
                    geoAddrToString(&id->root, ra), GEO_SHRINK_PORTS - 1, self->timeout, tried,
                    why);
    return ncclRemoteError;
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
    if (geoRandomBytes(token, sizeof(token)) != 0) {
        geoErrSet(self->err, "init: no randomness for the join");
        return ncclSystemError;
    }
    geoAddrToString(&id->root, ra);
    if (geoSocketConnect(&id->root, deadline, &fd) != ncclSuccess) {
        geoErrSet(self->err, "init: cannot reach the bootstrap root at %s within %.0f s", ra,
                        self->timeout);
        return ncclRemoteError;
    }
    ncclResult_t r = join_on(self, id, fd, token, mine, all, deadline, deadline, &magic, &proved,
                             &why);
    close(fd);
    /* Closed or reset before any answer: the root may have dropped us
     * among a flood of unproven connections (root_make_room), or a
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
        if ((fd = connect_once(&id->root, 1.0)) < 0)
            break;
        r = join_on(self, id, fd, token, mine, all, deadline, deadline, &magic, &proved, &why);
        close(fd);
        if (r == ncclSuccess)
            geoInfo(GEO_LOG_INIT, "init: joined the bootstrap root at %s again after its "
                    "connection was lost", ra);
    }
    if (r == ncclSuccess)
        return ncclSuccess;
    if (magic == GEO_IMPOSTOR_MAGIC)
        geoErrSet(self->err,
                  "init: refused the bootstrap root at %s: its table does not prove the "
                  "communicator's secret (another program holds the root's address, or the "
                  "connection was altered); nothing it sent was used", ra);
    else if (magic == GEO_REFUSED_MAGIC)
        geoErrSet(self->err,
                        "init: the bootstrap root at %s refused rank %d: its ncclUniqueId does "
                        "not carry the root's secret, or rank %d of %d is already taken",
                        ra, self->rank, self->rank, self->nranks);
    else if (magic == GEO_EXPIRED_MAGIC)
        geoErrSet(self->err,
                        "init: the bootstrap root at %s gave up: not all %d ranks joined within "
                        "its timeout (GEOCCL_TIMEOUT of the process that made the id)",
                        ra, self->nranks);
    else if (proved && strcmp(why, "connection closed by peer") == 0)
        geoErrSet(self->err,
                        "init: the bootstrap root at %s closed the connection after rank %d "
                        "joined (the root's process ended, or it refused us)",
                        ra, self->rank);
    else
        geoErrSet(self->err,
                        "init: bootstrap with the root at %s failed (%s): not all %d ranks "
                        "joined within %.0f s",
                        ra, why, self->nranks, self->timeout);
    return ncclRemoteError;
}
