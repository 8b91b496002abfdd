/* The progress thread: one per communicator, it moves every connection's
 * frames as far as they go without blocking, drives resumes, then sleeps in
 * one poll() over all of them, the listener and its wake-up eventfd. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/transport/net_tcp_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void *tcpProgressMain(void *arg)
{
    tcpState *st = arg;
    geoNetCtx *ctx = st->ctx;
    int nfds_max = ctx->nranks * st->nstreams + st->rpend_cap + 2;
    struct pollfd *pfd = calloc((size_t)nfds_max, sizeof(*pfd));
    tcpPollRef *map = calloc((size_t)nfds_max, sizeof(*map));

    geoDebugSetRank(ctx->rank);
    if (pfd == NULL || map == NULL) {
        pthread_mutex_lock(&st->lock);
        tcpBreakLocked(st, GEO_ERR(ctx->err, ncclSystemError, "out of memory in progress "
                                   "thread"));
        pthread_mutex_unlock(&st->lock);
        free(pfd);
        free(map);
        return NULL;
    }
    pthread_mutex_lock(&st->lock);
    while (!st->stop) {
        double now = geoNow();
        int n = 0;
        /* Make all progress possible without blocking, then sleep in poll. */
        for (int p = 0; p < ctx->nranks; p++) {
            if (p == ctx->rank || st->broken)
                continue;
            if (st->peers[p].unopened) {
                n = tcpLazyPoll(st, p, now, pfd, map, n);
                if (st->broken)
                    break;
            }
            for (int s = 0; s < st->nstreams; s++) {
                tcpConn *c = &st->peers[p].conns[s];
                if (c->down) {
                    n = tcpPollDown(st, p, s, now, pfd, map, n);
                    if (st->broken)
                        break;
                    continue;
                }
                if (c->fd < 0)
                    continue;
                if (!c->closed) {
                    int wrote = tcpProgressSend(st, p, s, now);
                    /* only while it sends (a socket with room takes a whole
                     * message at once: nothing is left queued here), or its
                     * socket held data unsent at the last look: an idle
                     * connection costs nothing.  Always after a write: a
                     * write that filled the socket may be followed by a
                     * poll that sleeps until the path takes more (200 ms
                     * and longer), and the look before that sleep decides
                     * how the sleep counts (a look skipped there counted a
                     * sender held 400 ms as full for 0.19 s). */
                    if (wrote)
                        tcpConnSampleQueued(c, geoNow(), 1);
                    else if (c->s_active || c->q_full || st->peers[p].q[GEO_NET_SEND] != NULL)
                        tcpConnSampleQueued(c, now, 0);
                }
                if (st->broken)
                    break;
                /* A closed connection may still hold data sent before the
                 * close: it is read when its receive is posted. */
                if (!c->down)
                    tcpProgressRecv(st, p, s, now);
                if (st->broken)
                    break;
                if (c->down) {
                    n = tcpPollDown(st, p, s, now, pfd, map, n);
                    if (st->broken)
                        break;
                    continue;
                }
                if (c->ring) {
                    /* Waits for ring space or data end at the peer's
                     * doorbell; the socket also tells of its death. */
                    tcpConnKick(c);
                    if (c->closed)
                        continue;
                    pfd[n] = (struct pollfd){.fd = c->fd, .events = POLLIN | POLLRDHUP};
                    map[n++] = (tcpPollRef){PK_CONN, p, s, c->fd};
                    continue;
                }
                short ev = c->closed ? 0 : POLLRDHUP;
                uint64_t sq = c->s_seq, rq = c->r_seq;
                size_t sf = c->s_frame, rf = c->r_frame;
                if (!c->closed &&
                    (tcpCursorReq(&st->peers[p], GEO_NET_SEND, s, &sq, &sf) ||
                     (c->track && (c->r_count > c->a_sent || c->tell || c->again < c->s_count))))
                    ev |= POLLOUT;
                /* A TCP connection reads acks at once; a data header then
                 * waits for its receive. */
                int held = c->r_off >= sizeof(tcpFrameHdr) && c->r_hdr.magic != GEO_ACK_MAGIC;
                if (tcpCursorReq(&st->peers[p], GEO_NET_RECV, s, &rq, &rf) ||
                    (c->track && !c->closed && !held))
                    ev |= POLLIN;
                if (ev == 0)
                    continue;
                pfd[n] = (struct pollfd){.fd = c->fd, .events = ev};
                map[n++] = (tcpPollRef){PK_CONN, p, s, c->fd};
            }
        }
        for (int i = 0; i < st->nrpend && !st->broken; i++) {
            pfd[n] = (struct pollfd){.fd = st->rpend[i].fd, .events = tcpHsEvents(&st->rpend[i])};
            map[n++] = (tcpPollRef){PK_PEND, i, 0, st->rpend[i].fd};
        }
        int wait_ms = 200;
        if (st->running && !st->broken && st->listen_fd >= 0) {
            if (now < st->listen_paused_until) { /* out of descriptors (tcpAcceptResumes) */
                wait_ms = (int)((st->listen_paused_until - now) * 1000) + 1;
            } else {
                pfd[n] = (struct pollfd){.fd = st->listen_fd, .events = POLLIN};
                map[n++] = (tcpPollRef){PK_LISTEN, 0, 0, st->listen_fd};
            }
        }
        pfd[n] = (struct pollfd){.fd = st->wake_fd, .events = POLLIN};
        map[n] = (tcpPollRef){PK_WAKE, 0, 0, st->wake_fd};
        pthread_mutex_unlock(&st->lock);
        int rc = poll(pfd, (nfds_t)n + 1, wait_ms);
        pthread_mutex_lock(&st->lock);
        if (rc < 0 && errno != EINTR) {
            if (!st->broken) /* reported once: the loop polls on until stopped */
                tcpBreakLocked(st, GEO_ERR(ctx->err, ncclSystemError, "poll failed in progress "
                                           "thread: %s", strerror(errno)));
            continue;
        }
        if (pfd[n].revents & POLLIN) {
            uint64_t v;
            ssize_t r = read(st->wake_fd, &v, sizeof(v));
            (void)r;
        }
        now = geoNow();
        for (int i = 0; i < n && rc > 0 && !st->broken; i++) {
            if (pfd[i].revents == 0)
                continue;
            int p = map[i].p, s = map[i].s;
            if (map[i].kind == PK_LISTEN) {
                tcpAcceptResumes(st, now);
                continue;
            }
            if (map[i].kind == PK_PEND) {
                tcpHs *h = &st->rpend[p];
                if (h->fd == map[i].fd && h->state < HS_DONE && tcpHsInStep(st, h) > 0) {
                    if (h->lazy)
                        tcpLazyUp(st, h->peer, h->stream);
                    else
                        tcpConnResumed(st, h->peer, h->stream, h->hello.count);
                }
                continue;
            }
            tcpConn *c = &st->peers[p].conns[s];
            if (map[i].kind == PK_LAZY) {
                if (c->dial != NULL && c->dial->fd == map[i].fd && c->unopened)
                    tcpLazyStep(st, p, s, now);
                continue;
            }
            if (map[i].kind == PK_DIAL) {
                if (c->dial == NULL || c->dial->fd != map[i].fd)
                    continue;
                char fail[GEO_ERR_TEXT_LEN];
                int r = tcpHsOutStep(st, c->dial, now, c->down_since + st->reconnect_s, fail);
                if (r > 0)
                    tcpConnResumed(st, p, s, c->dial->ack.count);
                else if (r < 0)
                    tcpDialFailed(st, p, s, fail);
                continue;
            }
            if (map[i].kind == PK_PROBE) {
                if (c->probe_fd == map[i].fd)
                    tcpProbeDone(st, p, s, now);
                continue;
            }
            if (c->fd != map[i].fd || c->down)
                continue; /* replaced in this pass */
            if (c->ring) {
                if (!tcpRingDrain(c))
                    continue;
            } else if (c->track && (pfd[i].revents & POLLERR)) {
                int err = 0;
                socklen_t el = sizeof(err);
                if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err == 0)
                    err = ECONNRESET;
                char why[128];
                snprintf(why, sizeof(why), "reset the connection: %s", strerror(err));
                tcpConnFail(st, p, s, err, why);
                continue;
            } else if (!(pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) ||
                       (pfd[i].revents & POLLIN && pfd[i].events & POLLIN)) {
                continue;
            }
            /* Hang-up on a connection with no receive posted: remember it;
             * an operation that needs this peer fails when it is posted.
             * (A ring connection's receive fails once its ring is empty,
             * see conn_recv in net_tcp_frame.c.) */
            if (c->closed && !c->ring)
                continue;
            uint64_t sq = c->s_seq;
            size_t sf = c->s_frame;
            /* A peer that closes a ring connection with our doorbells
             * unread resets it (POLLERR, ECONNRESET): still a plain close;
             * what it wrote stays readable in the ring. */
            if (tcpCursorReq(&st->peers[p], GEO_NET_SEND, s, &sq, &sf) ||
                (!c->ring && (pfd[i].revents & POLLERR))) {
                tcpPeerError(st, p, s, "closed or reset the connection (it died, or gave up "
                           "because of another rank's failure)");
                break;
            }
            c->closed = 1;
            st->peers[p].closed_by_peer = 1;
            geoInfo(GEO_LOG_NET, "rank %d closed its connection (stream %d)", p, s);
        }
        /* Resume handshakes past their deadline go; the finished and the
         * dropped are forgotten. */
        int keep = 0;
        for (int i = 0; i < st->nrpend; i++) {
            if (st->rpend[i].state < HS_DONE && now >= st->rpend[i].when)
                tcpHsDrop(st, &st->rpend[i], "handshake failed (timed out)");
            if (st->rpend[i].state < HS_DONE)
                st->rpend[keep++] = st->rpend[i];
        }
        st->nrpend = keep;
    }
    pthread_mutex_unlock(&st->lock);
    free(pfd);
    free(map);
    return NULL;
}
