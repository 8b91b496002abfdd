/* First use: the connections of a pair that set-up skipped (ctx->want),
 * opened by the progress thread when the pair's first message is posted.
 *
 * Who dials is fixed, as at set-up: the higher rank, all of the pair's
 * streams at once, with the same handshake (hello MAC, claim, X25519
 * exchange, keys of an encrypted pair, resumption secret).  The lower rank
 * never dials: its listener, served by the progress thread after set-up,
 * takes a fresh hello for a slot that was never connected (hello_admit),
 * under the same admission control as resumes (tcpAcceptResumes).  So both
 * ends agree without a race: a message the lower rank posts waits for the
 * higher rank's dial, which comes when the higher rank posts its side of
 * the exchange; until then the request's own GEOCCL_TIMEOUT runs.
 *
 * The dial is bounded by GEOCCL_TIMEOUT from the first message; a listener
 * that refuses it for GEO_GONE_CONFIRM_S means the process is gone (the
 * listener is open from before the bootstrap to the communicator's end).
 * Either breaks the communicator with an error naming the peer.  A
 * connection opened here is a TCP one (the same-host listener closes after
 * set-up) and resumes after a reset like any other. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/transport/net_tcp_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Fail the pair's first connection: the communicator breaks (requests
 * waiting on the peer, and every other, get the error). */
static void lazy_fail(tcpState *st, int p, const char *why)
{
    char pa[GEO_ADDR_STRLEN];
    if (st->broken || st->stop)
        return;
    if (st->ctx->failed != NULL)
        __atomic_store_n(&st->ctx->failed[p], 1, __ATOMIC_RELEASE);
    tcpBreakLocked(st, GEO_ERR(st->ctx->err, ncclRemoteError, "%s: first message to rank %d "
                               "(%s, host %s): %s", geoErrOp(st->ctx->err), p,
                               tcpPeerStr(st, p, pa), st->ctx->peers[p].host, why));
}

/* The pair's first connection is due GEOCCL_TIMEOUT after its first
 * message: the dial's deadline and the check that fails the pair. */
static double lazy_deadline(const tcpState *st, int p)
{
    return st->peers[p].first_use + st->ctx->timeout;
}

/* Start our dials of every stream of peer p not connected yet. */
static int lazy_start(tcpState *st, int p, double now)
{
    tcpPeer *peer = &st->peers[p];
    peer->first_use = now;
    for (int s = 0; s < st->nstreams; s++) {
        tcpConn *c = &peer->conns[s];
        if (!c->unopened || c->dial != NULL)
            continue;
        c->dial = calloc(1, sizeof(tcpHs));
        if (c->dial == NULL || geoRandomBytes(c->claim, sizeof(c->claim)) != 0) {
            lazy_fail(st, p, "out of memory or randomness for the connection");
            return -1;
        }
        *c->dial = (tcpHs){.fd = -1, .out = 1, .lazy = 1, .state = HS_RETRY, .peer = p,
                           .stream = s, .when = now, .backoff = 1e-3};
        c->refused_since = 0;
    }
    geoInfo(GEO_LOG_NET, "rank %d: first message to it; dialling its %d streams", p,
            peer->unopened);
    return 0;
}

void tcpLazyUp(tcpState *st, int p, int s)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    tcpConnFreeResume(c);
    c->refused_since = 0;
    tcpConnReady(st, c);
    if (peer->cc[0])
        setsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, peer->cc, (socklen_t)strlen(peer->cc));
    if (peer->pace)
        tcpConnPace(c, peer->pace, peer->active);
    if (st->lowat > 0)
        setsockopt(c->fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &(unsigned){(unsigned)st->lowat},
                   sizeof(unsigned));
    if (--peer->unopened == 0) {
        if (peer->first_use > 0)
            geoInfo(GEO_LOG_NET, "rank %d: connected on first use, %d streams in %.3f s", p,
                    st->nstreams, geoNow() - peer->first_use);
        else
            geoInfo(GEO_LOG_NET, "rank %d: connected on its first use, %d streams", p,
                    st->nstreams);
    }
}

void tcpLazyStep(tcpState *st, int p, int s, double now)
{
    tcpConn *c = &st->peers[p].conns[s];
    char fail[GEO_ERR_TEXT_LEN];
    int r = tcpHsOutStep(st, c->dial, now, lazy_deadline(st, p), fail);
    if (r > 0)
        tcpLazyUp(st, p, s);
    else if (r < 0)
        lazy_fail(st, p, fail);
}

int tcpLazyPoll(tcpState *st, int p, double now, struct pollfd *pfd, tcpPollRef *map, int n)
{
    tcpPeer *peer = &st->peers[p];
    char why[200];
    if (p > st->ctx->rank)
        return n; /* it dials us */
    if (peer->first_use == 0) {
        if (peer->q[GEO_NET_SEND] == NULL && peer->q[GEO_NET_RECV] == NULL)
            return n;
        if (lazy_start(st, p, now) != 0)
            return n;
    }
    for (int s = 0; s < st->nstreams && !st->broken; s++) {
        tcpConn *c = &peer->conns[s];
        tcpHs *h = c->dial;
        if (!c->unopened || h == NULL)
            continue;
        if (now > lazy_deadline(st, p)) {
            snprintf(why, sizeof(why), "not connected within %.0f s (GEOCCL_TIMEOUT): stream "
                     "%d is %s", st->ctx->timeout, s,
                     h->state <= HS_CONNECT ? "still connecting" : "in its handshake");
            lazy_fail(st, p, why);
            return n;
        }
        if (h->state == HS_RETRY) {
            if (h->err == ECONNREFUSED) {
                if (tcpRefusedForGood(c, now)) {
                    lazy_fail(st, p, "its listener refuses connections (its process is gone)");
                    return n;
                }
            } else {
                c->refused_since = 0;
            }
            tcpLazyStep(st, p, s, now);
            if (st->broken || !c->unopened)
                continue;
        }
        if (h->fd >= 0 && h->state != HS_DONE) {
            pfd[n] = (struct pollfd){.fd = h->fd, .events = tcpHsEvents(h)};
            map[n++] = (tcpPollRef){PK_LAZY, p, s, h->fd};
        }
    }
    return n;
}
