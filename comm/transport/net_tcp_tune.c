/* Socket tuning of a TCP communicator's connections: pacing, congestion
 * control and BBR restarts (net_tcp_tune.h), and the table's limitQueued
 * and setStreams.  Each setting is remembered on the peer so that the
 * connections replacing reset ones get it too (tcpConnResumed). */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/transport/net_tcp_internal.h"
#include "comm/transport/net_tcp_tune.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>

/* Pace connection c at its part of bytes_per_s, the pair's rate over its
 * active streams (frames rotate over them, so each carries an equal part);
 * 0 lifts the limit.  SO_MAX_PACING_RATE caps the kernel's pacing rate,
 * whatever the congestion control, and turns TCP's own pacing on where no
 * fq qdisc paces. */
int tcpConnPace(tcpConn *c, uint64_t bytes_per_s, int active)
{
    unsigned v = ~0U;
    if (bytes_per_s > 0) {
        uint64_t per = bytes_per_s / (uint64_t)(active > 0 ? active : 1);
        v = per >= ~0U ? ~0U - 1 : per > 0 ? (unsigned)per : 1;
    }
    return setsockopt(c->fd, SOL_SOCKET, SO_MAX_PACING_RATE, &v, sizeof(v));
}

void tcpLimitQueued(void *state, int bytes)
{
    tcpState *st = state;
    /* 0 on a socket means the system's net.ipv4.tcp_notsent_lowat (no
     * limit unless set there), which is what "back to the default" is. */
    unsigned v = bytes > 0 ? (unsigned)bytes : 0;
    pthread_mutex_lock(&st->lock); /* the progress thread replaces reset connections */
    st->lowat = (int)v;
    for (int p = 0; p < st->ctx->nranks; p++)
        for (int s = 0; st->peers && p != st->ctx->rank && s < st->nstreams; s++)
            if (st->peers[p].conns[s].fd >= 0 && !st->peers[p].conns[s].local)
                setsockopt(st->peers[p].conns[s].fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v,
                           sizeof(v));
    pthread_mutex_unlock(&st->lock);
}

/* tcpConnPace on every network connection to the peer; 0, or the errno of
 * the first that refused.  Caller holds st->lock. */
static int peer_pace(tcpState *st, tcpPeer *pp, uint64_t bytes_per_s)
{
    int err = 0;
    for (int s = 0; s < st->nstreams; s++) {
        tcpConn *c = &pp->conns[s];
        if (c->fd >= 0 && !c->local && tcpConnPace(c, bytes_per_s, pp->active) != 0 && err == 0)
            err = errno;
    }
    return err;
}

void tcpSetStreams(void *state, int peer, int n)
{
    tcpState *st = state;
    if (st->peers == NULL || peer < 0 || peer >= st->ctx->nranks)
        return;
    pthread_mutex_lock(&st->lock);
    tcpPeer *pp = &st->peers[peer];
    pp->active = n < 1 ? 1 : n > st->nstreams ? st->nstreams : n;
    if (pp->pace) /* the same rate over n */
        peer_pace(st, pp, pp->pace);
    pthread_mutex_unlock(&st->lock);
}

static int tcp_set_pacing(void *state, int peer, uint64_t bytes_per_s)
{
    tcpState *st = state;
    int err = 0;
    if (st->peers == NULL || peer < 0 || peer >= st->ctx->nranks || peer == st->ctx->rank)
        return EINVAL;
    pthread_mutex_lock(&st->lock); /* the progress thread replaces reset connections */
    tcpPeer *pp = &st->peers[peer];
    if (pp->pace != bytes_per_s) {
        err = peer_pace(st, pp, bytes_per_s);
        pp->pace = bytes_per_s; /* for the connections that replace these */
    }
    pthread_mutex_unlock(&st->lock);
    return err;
}

static int tcp_restart_bbr(void *state, int peer, double older_than_s, int max_in_row)
{
    tcpState *st = state;
    int n = 0;
    if (st->peers == NULL || peer < 0 || peer >= st->ctx->nranks || peer == st->ctx->rank)
        return -1;
    const double now = geoNow();
    pthread_mutex_lock(&st->lock); /* the progress thread replaces reset connections */
    for (int s = 0; s < st->nstreams; s++) {
        tcpConn *c = &st->peers[peer].conns[s];
        char cc[16] = "";
        socklen_t len = sizeof(cc) - 1;
        if (c->fd < 0 || c->local || c->down ||
            getsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, cc, &len) != 0 ||
            strcmp(cc, "bbr") != 0) {
            c->bbr_since = 0;
            continue;
        }
        /* not known (0): BBR's window began at its connection or at a change
         * of congestion control, which may lie well before its handshake
         * here ended; a restart now makes it known */
        if (c->bbr_since > 0 && now - c->bbr_since < older_than_s)
            continue;
        c->bbr_since = now;
        if (c->bbr_restarts >= max_in_row) {
            c->bbr_restarts = 0; /* BBR's own PROBE_RTT, once */
            continue;
        }
        /* A restart takes BBR's minimum RTT from the kernel's filter of
         * the last 5 minutes: not where BBR's own PROBE_RTT found the path
         * longer than that (its delay grew) */
        if (geoTcpBbrRttGrew(c->fd, 1.1) == 1)
            continue;
        /* Setting the one it has is a no-op: through reno and back, BBR's
         * init runs (mode STARTUP, min RTT from the kernel's own filter) */
        if (setsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4) != 0)
            continue;
        if (setsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, "bbr", 3) != 0) {
            int e = errno;
            geoWarn(GEO_LOG_NET, "connection %d to rank %d: bbr refused after a restart "
                    "through reno (%s); it stays on reno", s, peer, strerror(e));
            c->bbr_since = 0;
            continue;
        }
        c->bbr_restarts++;
        n++;
    }
    pthread_mutex_unlock(&st->lock);
    return n;
}

static int tcp_set_congestion(void *state, int peer, const char *cc)
{
    tcpState *st = state;
    int err = 0;
    if (st->peers == NULL || peer < 0 || peer >= st->ctx->nranks || peer == st->ctx->rank)
        return EINVAL;
    pthread_mutex_lock(&st->lock); /* the progress thread replaces reset connections */
    for (int s = 0; s < st->nstreams; s++) {
        tcpConn *c = &st->peers[peer].conns[s];
        char was[16] = "";
        socklen_t wl = sizeof(was) - 1;
        if (c->fd < 0 || c->local)
            continue;
        if (getsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, was, &wl) != 0)
            was[0] = '\0';
        if (setsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) != 0)
            err = err ? err : errno;
        else if (strcmp(was, cc) != 0) {
            c->bbr_since = 0; /* a new one (setting the one it has is a no-op) */
            c->bbr_restarts = 0;
        }
    }
    if (err == 0 && strlen(cc) < sizeof(st->peers[peer].cc))
        strcpy(st->peers[peer].cc, cc); /* for the connections that replace these */
    pthread_mutex_unlock(&st->lock);
    return err;
}

/* TCP-only tuning (net_tcp_tune.h): reached through the communicator's
 * transport only when that transport is this one. */
int geoNetTcpTunable(const geoNet *net)
{
    return net != NULL && net->ops == &geoNetTcp && net->state != NULL;
}

int geoNetTcpSetCongestion(geoNet *net, int peer, const char *cc)
{
    if (cc == NULL)
        return EINVAL;
    return geoNetTcpTunable(net) ? tcp_set_congestion(net->state, peer, cc) : EOPNOTSUPP;
}

int geoNetTcpSetPacing(geoNet *net, int peer, uint64_t bytes_per_s)
{
    return geoNetTcpTunable(net) ? tcp_set_pacing(net->state, peer, bytes_per_s) : EOPNOTSUPP;
}

int geoNetTcpRestartBbr(geoNet *net, int peer, double older_than_s, int max_in_row)
{
    return geoNetTcpTunable(net) ? tcp_restart_bbr(net->state, peer, older_than_s, max_in_row)
                                 : -1;
}
