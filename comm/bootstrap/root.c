/* The bootstrap root: a detached thread that listens at the id's address,
 * accepts every connection at once, runs each one's handshake in one
 * poll() loop (peer_table.c admits those that prove the secret), sends the
 * tables when every rank has joined, and stays until every rank has
 * confirmed its table, taking back ranks whose connection was lost.  It
 * bounds what strangers can hold: unproven connections in all and per
 * source prefix, from the descriptors the process has (admit.h), and the
 * log lines their drops cost. */
#include "config.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/bootstrap_internal.h"
#include "comm/base/checks.h"
#include "comm/transport/admit.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The root: collects one join per rank, then sends everyone the table.
 * All joiners are handled at once in one poll() loop: each accepted
 * connection runs its own handshake (challenge out, join message in) with
 * its own deadline, so a WAN costs one round trip in all rather than one
 * per rank, and a stranger that never answers holds only its own slot. */
#define GEO_ROOT_HANDSHAKE_S 5.0  /* a joiner proves itself by then */
/* Unproven connections are all served at once (idle strangers cannot make
 * a rank wait in the backlog).  How many may be held, in all and from one
 * source prefix, follows from RLIMIT_NOFILE (admit.h: the root shares its
 * process with a rank, or with the application), at most
 * GEO_ROOT_MAX_PENDING (each pass polls them all); beyond that an unproven
 * one of the loudest prefix is dropped to make room, and a rank dropped so
 * joins again.  At most 64 are accepted per pass, so that a flood cannot
 * stop the handshakes under way. */
#define GEO_ROOT_MAX_PENDING 1024

/* Log a dropped connection; past the first GEO_ROOT_DROP_LOG only count
 * it (a port scan or a flood must not bury the log), summed up at the end. */
#define GEO_ROOT_DROP_LOG 8
void geoBootRootDropped(int *count, const char *fmt, ...)
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

/* A joiner's source group while its handshake runs (a proven one has
 * left the table for rs->fds). */
static const geoAdmitGroup *joiner_group(const void *tab, int i)
{
    const geoBootJoiner *j = (const geoBootJoiner *)tab + i;
    return j->fd >= 0 ? &j->group : NULL;
}

/* Make room for one more joiner of group `from` within per_group and most
 * (from NULL: out of descriptors, one must go): drop one unproven joiner
 * of the loudest source prefix, at random, so that a flood can neither aim
 * at a rank's handshake nor crowd it out from other prefixes; a rank
 * dropped so joins again (geoBootstrapJoin).  0 if one was dropped.  (The
 * root knows no peer before they join: every source is a prefix.) */
static int root_make_room(geoBootRootState *rs, geoBootJoiner *pend, int npend,
                          const geoAdmitGroup *from, int per_group, int most)
{
    int pick = geoAdmitVictim(pend, npend, joiner_group, from, per_group, most);
    if (pick < 0)
        return -1;
    geoBootRootDropped(&rs->dropped, "%s (unproven; room for newer ones)", pend[pick].from);
    close(pend[pick].fd);
    pend[pick].fd = -1;
    return 0;
}

static void *root_main(void *arg)
{
    geoBootRootArgs *a = arg;
    double deadline = geoNow() + a->timeout;
    geoBootRootState rs = {0};
    geoBootJoiner *pend = NULL;
    struct pollfd *pfd = NULL;
    int npend = 0, cap = 0, pfd_cap = 0;
    int *rank_at = NULL; /* the ranks polled for their confirmation */
    double confirm_by = 0, paused_until = 0;
    int starved = 0;

    geoAdmitRaiseFdLimit();
    /* Its own needs are a descriptor per rank until it confirms, not known
     * before the first join: slack only; running short later drops
     * strangers, never a rank. */
    const int budget = geoAdmitBudget("bootstrap root", GEO_ADMIT_SLACK, GEO_ROOT_MAX_PENDING);
    const int per_group = geoAdmitPerGroup(budget);

    rs.deadline = deadline;
    if (geoSocketSetNonBlocking(a->listen_fd, 1) != 0) {
        geoWarn(GEO_LOG_INIT, "bootstrap root: cannot make the listener non-blocking: %s",
                strerror(errno));
        goto out;
    }
    if (a->nranks > 0 && geoBootTableAlloc(&rs, a->nranks) != 0) {
        geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory for %d ranks", a->nranks);
        goto out;
    }
    /* Collect the joins; send the tables; then wait until every rank has
     * confirmed its table, taking back ranks whose connection was reset
     * meanwhile (they join again with their token, and get their table at
     * once when the tables are out). */
    for (;;) {
        if (!rs.sent && rs.nranks > 0 && rs.joined == rs.nranks) {
            geoBootTableSendAll(a, &rs);
            confirm_by = geoNow() + a->timeout;
        }
        if (rs.sent && rs.acked == rs.nranks)
            break;
        double now = geoNow(), wake = rs.sent ? confirm_by : deadline;

        if (!rs.sent && now >= deadline) {
            uint32_t x = GEO_EXPIRED_MAGIC;
            const char *w;
            int waited = 0;
            for (int i = 0; i < npend; i++)
                waited += pend[i].fd >= 0 && pend[i].stage == 2;
            if (rs.nranks > 0)
                geoWarn(GEO_LOG_INIT, "bootstrap root: only %d of %d ranks joined within %.0f "
                        "s; giving up", rs.joined, rs.nranks, a->timeout);
            else
                geoWarn(GEO_LOG_INIT, "bootstrap root: rank 0, which says how many ranks there "
                        "are, did not join within %.0f s (%d other ranks waited for it); giving "
                        "up", a->timeout, waited);
            /* Tell the ranks that did join, or waited for rank 0, why they
             * get no table. */
            for (int r = 0; r < rs.nranks; r++)
                if (rs.fds[r] >= 0)
                    geoSocketSendAll(rs.fds[r], &x, sizeof(x), geoNow() + 1.0, &w);
            for (int i = 0; i < npend; i++)
                if (pend[i].fd >= 0 && pend[i].stage == 2)
                    geoSocketSendAll(pend[i].fd, &x, sizeof(x), geoNow() + 1.0, &w);
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
            geoBootJoiner *np = realloc(pend, sizeof(*pend) * (size_t)ncap);
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
        /* Out of descriptors, the listener is left alone for a while. */
        pfd[npend] = (struct pollfd){.fd = now < paused_until ? -1 : a->listen_fd,
                                     .events = POLLIN};
        if (now < paused_until && paused_until < wake)
            wake = paused_until;
        int nr = 0;
        for (int r = 0; r < maxr; r++)
            if (rs.fds[r] >= 0 && rs.rank_state[r] == 1) {
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
        const int counted = rs.nranks > 0;
        for (int i = 0; i < npend; i++) {
            int r = 0;
            /* Rank 0 just said the count: the proven joiners that waited
             * for it are admitted (or refused) now. */
            if (pfd[i].revents || (!counted && rs.nranks > 0 && pend[i].stage == 2))
                r = geoBootTableAdmit(a, &rs, &pend[i]);
            if (r == -2) {
                geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory");
                goto out;
            }
            if (r == 1 && rs.sent)
                geoBootTableSendOne(a, &rs, pend[i].m.rank);
            /* (A proven joiner waiting for rank 0 is told when the root
             * gives up, above.) */
            if (r == 0 && now >= pend[i].deadline && pend[i].stage != 2) {
                geoBootRootDropped(&rs.dropped, "%s (timed out)", pend[i].from);
                close(pend[i].fd);
                pend[i].fd = -1;
            }
        }
        for (int k = 0; k < nr; k++)
            if (pfd[npend + 1 + k].revents && rs.fds[rank_at[k]] >= 0)
                geoBootTableTakeConfirm(&rs, rank_at[k]);
        /* Take what arrived; each new joiner gets its challenge at once. */
        /* The listener's entry is pfd[npend] only until npend grows. */
        int lready = (pfd[npend].revents & POLLIN) != 0;
        for (int taken = 0; lready && npend < cap && taken < 64; taken++) {
            geoBootJoiner *j = &pend[npend];
            geoSockAddr from;
            int accepted = geoSocketAcceptNB(a->listen_fd, &j->fd, &from);
            if (accepted < 0 && (errno == EMFILE || errno == ENFILE)) {
                int e = errno;
                if (root_make_room(&rs, pend, npend, NULL, 0, 0) == 0)
                    continue;
                /* None of ours to take back: the rest of the process holds
                 * them; the ranks wait in the backlog meanwhile. */
                if (starved++ == 0)
                    geoWarn(GEO_LOG_INIT, "bootstrap root: accept: %s, and no unproven "
                            "connection to drop; trying again every %.0f ms", strerror(e),
                            GEO_ADMIT_PAUSE_S * 1000);
                paused_until = now + GEO_ADMIT_PAUSE_S;
                break;
            }
            if (accepted < 0)
                geoWarn(GEO_LOG_INIT, "bootstrap root: accept failed: %s", strerror(errno));
            if (accepted <= 0)
                break;
            geoAddrToString(&from, j->from);
            j->group = geoAdmitGroupOf(NULL, &from);
            root_make_room(&rs, pend, npend, &j->group, per_group, budget);
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
            int r1 = geoBootTableAdmit(a, &rs, j);
            if (r1 == -2) {
                geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory");
                goto out;
            }
            if (r1 == 1 && rs.sent)
                geoBootTableSendOne(a, &rs, j->m.rank);
        }
        /* Rank 0 came in among the new ones: the joiners that waited for
         * it are admitted (or refused) now. */
        for (int i = 0; !counted && rs.nranks > 0 && i < npend; i++)
            if (pend[i].fd >= 0 && pend[i].stage == 2) {
                int r2 = geoBootTableAdmit(a, &rs, &pend[i]);
                if (r2 == -2) {
                    geoWarn(GEO_LOG_INIT, "bootstrap root: out of memory");
                    goto out;
                }
            }
        int keep = 0;
        for (int i = 0; i < npend; i++)
            if (pend[i].fd >= 0)
                pend[keep++] = pend[i];
        npend = keep;
    }
    for (int i = 0; i < npend; i++) {
        geoBootRootDropped(&rs.dropped, "%s (handshake unfinished when every rank had its table)",
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
    free(rs.rank_state);
    free(rs.confirm);
    free(rs.confirm_off);
    free(rank_at);
    free(pend);
    free(pfd);
    close(a->listen_fd);
    geoWipe(a, sizeof(*a));
    free(a);
    return NULL;
}

ncclResult_t geoBootRootStartThread(const geoUniqueIdInternal *id, int fd, double timeout,
                                    int nranks)
{
    pthread_t t;
    pthread_attr_t attr;
    geoBootRootArgs *a = calloc(1, sizeof(*a));
    GEO_RETURN_IF(a == NULL, ncclSystemError, "out of memory");
    a->id = *id;
    a->listen_fd = fd;
    a->timeout = timeout;
    a->nranks = nranks;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, root_main, a);
    if (rc != 0) {
        pthread_attr_destroy(&attr);
        free(a);
        close(fd);
        return GEO_ERR(NULL, ncclSystemError, "cannot start the bootstrap root thread: %s",
                       strerror(rc));
    }
    pthread_attr_destroy(&attr);
    return ncclSuccess;
}
