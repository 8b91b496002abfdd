/* The TCP transport's table (geoNetTcp, transport.h): listen, connect,
 * post, wait, break, destroy and the per-peer queries, and the one way it
 * fails (tcpPeerError, tcpBreakLocked).  The protocol, the state and the
 * other files' parts are described in net_tcp_internal.h. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/transport/admit.h"
#include "comm/transport/net_tcp_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Send buffer of a same-host socket: the default (net.core.wmem_default,
 * often 208 KiB) holds less than one frame, so every frame took several
 * wake-ups of both sides; 1 MiB made 64 MiB all-reduces of 4 ranks on
 * loopback about 10% faster, more gained nothing. */
#define GEO_LOCAL_SNDBUF (1 << 20)

void tcpWake(tcpState *st)
{
    uint64_t one = 1;
    ssize_t rc = write(st->wake_fd, &one, sizeof(one));
    (void)rc;
}

const char *tcpPeerStr(tcpState *st, int peer, char buf[GEO_ADDR_STRLEN])
{
    return geoAddrToString(&st->ctx->peers[peer].addr, buf);
}

/* Fail every request, shut every connection.  Lock held. */
void tcpBreakLocked(tcpState *st, ncclResult_t res)
{
    geoNetCtx *ctx = st->ctx;
    if (!st->broken) {
        st->broken = 1;
        st->broken_res = res;
        geoErrFail(ctx->err, res);
    }
    for (int p = 0; p < ctx->nranks; p++) {
        tcpPeer *peer = &st->peers[p];
        for (int d = 0; d < 2; d++) {
            for (geoNetRequest *r = peer->q[d]; r; r = r->next) {
                r->result = st->broken_res;
                __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE); /* geoNetWait's fast path */
            }
            peer->q[d] = NULL;
        }
        if (peer->conns)
            for (int s = 0; s < st->nstreams; s++)
                if (peer->conns[s].fd >= 0)
                    shutdown(peer->conns[s].fd, SHUT_RDWR);
    }
    /* No resume is taken any more: a peer dialling again is refused at
     * once and knows we are gone. */
    if (st->running && st->listen_fd >= 0)
        shutdown(st->listen_fd, SHUT_RDWR);
    /* Handshakes half done on it end now, not at their deadline: whoever
     * dialled (a peer, or a survivor of ncclCommShrink trying our old port
     * for its new root) hears the close at once and moves on. */
    tcpPendShut(st);
    pthread_cond_broadcast(&st->cv);
}

void tcpPeerErrorAt(tcpState *st, int peer, int stream, const char *what, const char *file,
                    int line)
{
    char a[GEO_ADDR_STRLEN];
    if (st->broken || st->stop)
        return;
    if (st->ctx->failed != NULL)
        __atomic_store_n(&st->ctx->failed[peer], 1, __ATOMIC_RELEASE);
    geoErrReport(st->ctx->err, ncclRemoteError, file, line, "%s: rank %d (%s, host %s) %s "
                 "(stream %d%s)", geoErrOp(st->ctx->err), peer, tcpPeerStr(st, peer, a),
                 st->ctx->peers[peer].host, what, stream,
                 st->peers[peer].conns[stream].local ? ", same-host socket" : "");
    tcpBreakLocked(st, ncclRemoteError);
}

int tcpWanted(const geoNetCtx *ctx, int peer)
{
    return ctx->want == NULL || ctx->want[peer];
}

void tcpConnReady(tcpState *st, tcpConn *c)
{
    c->unopened = 0;
    c->track = !c->local;
    /* GEOCCL_RESUME_BUFFER bounds a peer, not a connection: a peer that
     * never acknowledges pins that much of our memory, however many
     * streams rank 0 asked for. */
    c->k_max = (size_t)(geoParamInt(GEO_PARAM_RESUME_BUFFER) / st->nstreams / GEO_TCP_FRAME);
    if (!c->local)
        geoSocketTune(c->fd);
    else
        setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &(int){GEO_LOCAL_SNDBUF}, sizeof(int));
    geoSocketSetNonBlocking(c->fd, 1);
}

static int tcp_can_connect(geoNetCtx *ctx)
{
    (void)ctx;
    return 1;
}

static ncclResult_t tcp_listen(geoNetCtx *ctx, void **state, geoNetAddr *addr)
{
    tcpState *st = calloc(1, sizeof(*st));
    geoSockAddr bound;
    ncclResult_t res;

    if (st == NULL)
        return GEO_ERR(ctx->err, ncclSystemError, "out of memory");
    st->ctx = ctx;
    st->listen_fd = -1;
    st->local_fd = -1;
    st->wake_fd = -1;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->cv, NULL);
    geoAdmitRaiseFdLimit();
    GEO_CHECK_GOTO(geoSocketListen(&addr->addr, &st->listen_fd, &bound), res, fail);
    /* Taken now, before strangers can take descriptors at set-up. */
    st->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (st->wake_fd < 0) {
        res = GEO_ERR(ctx->err, ncclSystemError, "init: eventfd failed: %s", strerror(errno));
        goto fail;
    }
    addr->addr = bound;
    geoLocalIdentify(&st->local);
    if (geoParamInt(GEO_PARAM_SHM) != 0 && geoLocalListen(ctx->rank, &st->local_fd,
                                                          &st->local) != 0)
        /* Not fatal: every peer can still reach us over TCP. */
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "no same-host fast path: cannot create a local "
                "socket in /dev/shm or /tmp: %s", strerror(errno));
    addr->local = st->local;
    *state = st;
    return ncclSuccess;
fail:
    if (st->listen_fd >= 0)
        close(st->listen_fd);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cv);
    free(st);
    return res;
}

static ncclResult_t tcp_connect(geoNetCtx *ctx, void *state)
{
    tcpState *st = state;
    ncclResult_t res;

    st->nstreams = ctx->nstreams;
    st->peers = calloc((size_t)ctx->nranks, sizeof(tcpPeer));
    if (st->peers == NULL)
        return GEO_ERR(ctx->err, ncclSystemError, "out of memory");
    for (int p = 0; p < ctx->nranks; p++) {
        st->peers[p].conns = calloc((size_t)st->nstreams, sizeof(tcpConn));
        st->peers[p].active = st->nstreams;
        if (st->peers[p].conns == NULL)
            return GEO_ERR(ctx->err, ncclSystemError, "out of memory");
        for (int s = 0; s < st->nstreams; s++) {
            st->peers[p].conns[s].fd = -1;
            st->peers[p].conns[s].probe_fd = -1;
            st->peers[p].conns[s].s_frame = GEO_FRAME_UNSET;
            st->peers[p].conns[s].r_frame = GEO_FRAME_UNSET;
            st->peers[p].conns[s].unopened = p != ctx->rank;
        }
    }
    res = tcpSetupConnections(st);
    /* The TCP listener stays open: peers dial it again after a reset. */
    /* Every peer that will ever connect has: the socket file need not
     * outlive init (nor be left behind by a crash later). */
    if (st->local_fd >= 0)
        close(st->local_fd);
    st->local_fd = -1;
    geoLocalUnlink(&st->local);
    if (res != ncclSuccess)
        return res;

    int local_peers = 0, mixed = 0, connected = 0;
    for (int p = 0; p < ctx->nranks; p++) {
        int nlocal = 0;
        for (int s = 0; s < st->nstreams && p != ctx->rank; s++) {
            tcpConn *c = &st->peers[p].conns[s];
            /* A pair set-up skipped, or one whose first-use dial came
             * while set-up ran and did not finish in it, connects later
             * (net_tcp_lazy.c). */
            if (c->fd < 0) {
                st->peers[p].unopened++;
                continue;
            }
            nlocal += c->local;
            tcpConnReady(st, c);
        }
        connected += p != ctx->rank && st->peers[p].unopened == 0;
        local_peers += nlocal == st->nstreams;
        mixed += nlocal > 0 && nlocal < st->nstreams;
    }
    ctx->local_peers = local_peers;
    res = tcpSetupRings(st);
    if (res != ncclSuccess)
        return res;
    int ring_peers = 0;
    for (int p = 0; p < ctx->nranks; p++) {
        int nring = 0;
        for (int s = 0; s < st->nstreams && p != ctx->rank; s++)
            nring += st->peers[p].conns[s].ring;
        ring_peers += nring == st->nstreams;
    }
    ctx->ring_peers = ring_peers;
    st->reconnect_s = (double)geoParamInt(GEO_PARAM_RECONNECT_TIMEOUT);
    st->rpend_cap = GEO_TCP_RESUME_PENDING;
    if (connected < ctx->nranks - 1) {
        int needs = 2 * (ctx->nranks - 1) * st->nstreams + GEO_ADMIT_SLACK;
        int budget = geoAdmitBudget("first use", needs, GEO_TCP_MAX_PENDING);
        st->rpend_cap = budget > st->rpend_cap ? budget : st->rpend_cap;
    }
    st->rpend_group = geoAdmitPerGroup(st->rpend_cap);
    st->rpend = calloc((size_t)st->rpend_cap, sizeof(tcpHs));
    if (st->rpend == NULL)
        return GEO_ERR(ctx->err, ncclSystemError, "out of memory");
    st->running = 1;
    int rc = pthread_create(&st->thread, NULL, tcpProgressMain, st);
    if (rc != 0)
        return GEO_ERR(ctx->err, ncclSystemError, "init: cannot start the progress thread: %s",
                       strerror(rc));
    st->thread_live = 1;
    geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "connected to %d of %d peers (the rest on first use), "
            "%d streams each; same-host fast path to %d of them (%d through shared-memory "
            "rings, %d AF_UNIX only)%s%s", connected, ctx->nranks - 1, st->nstreams,
            local_peers, ring_peers, local_peers - ring_peers,
            geoParamInt(GEO_PARAM_SHM) ? "" : " (GEOCCL_SHM=0)",
            mixed ? ", some streams of a peer over TCP after a local socket failed" : "");
    return ncclSuccess;
}

static ncclResult_t tcp_post(void *state, geoNetRequest *req)
{
    tcpState *st = state;
    geoNetCtx *ctx = st->ctx;
    char pa[GEO_ADDR_STRLEN];
    ncclResult_t res = ncclSuccess;

    req->next = NULL;
    req->nframes = tcpFrameCount(req->size);
    if (req->vlen && (req->nframes == 0 || req->dir == GEO_NET_RECV))
        req->nframes = 1; /* a receive learns the rest from the first frame; an
                           * empty variable-length message is one empty frame */
    req->frames_done = 0;
    req->done = 0;
    req->result = ncclInProgress;
    req->last_progress = geoNow();
    pthread_mutex_lock(&st->lock);
    if (st->broken) {
        res = st->broken_res;
    } else if (st->peers[req->peer].gone) {
        if (ctx->failed != NULL)
            __atomic_store_n(&ctx->failed[req->peer], 1, __ATOMIC_RELEASE);
        res = GEO_ERR(ctx->err, ncclRemoteError, "%s: rank %d (%s, host %s) is gone: its "
                      "connection was reset and its listener refuses new ones",
                      geoErrOp(ctx->err), req->peer, tcpPeerStr(st, req->peer, pa),
                      ctx->peers[req->peer].host);
        tcpBreakLocked(st, res);
    } else if (req->dir == GEO_NET_SEND && st->peers[req->peer].closed_by_peer) {
        if (ctx->failed != NULL)
            __atomic_store_n(&ctx->failed[req->peer], 1, __ATOMIC_RELEASE);
        res = GEO_ERR(ctx->err, ncclRemoteError, "%s: rank %d (%s, host %s) has closed its "
                      "connections", geoErrOp(ctx->err), req->peer,
                      tcpPeerStr(st, req->peer, pa), ctx->peers[req->peer].host);
        tcpBreakLocked(st, res);
    } else {
        tcpPeer *peer = &st->peers[req->peer];
        geoNetRequest **pp = &peer->q[req->dir];
        req->seq = peer->posted[req->dir]++;
        req->streams = peer->active;
        while (*pp)
            pp = &(*pp)->next;
        *pp = req;
    }
    pthread_mutex_unlock(&st->lock);
    if (res == ncclSuccess)
        tcpWake(st);
    else
        req->result = res, req->done = 1; /* never queued: no other thread saw it */
    return res;
}

static ncclResult_t tcp_wait(void *state, geoNetRequest *req)
{
    tcpState *st = state;
    geoNetCtx *ctx = st->ctx;
    ncclResult_t res;

    pthread_mutex_lock(&st->lock);
    while (!req->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        st->waiting_for = st->nwaiters++ == 0 ? req : NULL;
        pthread_cond_timedwait(&st->cv, &st->lock, &ts);
        if (--st->nwaiters > 0)
            st->waiting_for = NULL;
        if (req->done)
            break;
        if (geoErrAborted(ctx->err)) {
            if (!st->broken)
                GEO_ERR(ctx->err, ncclRemoteError, "%s: communicator aborted",
                        geoErrOp(ctx->err));
            tcpBreakLocked(st, ncclRemoteError);
            break;
        }
        double idle = geoNow() - req->last_progress;
        if (idle > ctx->timeout) {
            char pa[GEO_ADDR_STRLEN];
            const tcpPeer *peer = &st->peers[req->peer];
            if (ctx->failed != NULL && !st->broken)
                __atomic_store_n(&ctx->failed[req->peer], 1, __ATOMIC_RELEASE);
            GEO_ERR(ctx->err, ncclRemoteError, "%s: timed out after %.0f s without progress %s "
                    "rank %d (%s, host %s); %zu of %zu frames done%s", geoErrOp(ctx->err), idle,
                    req->dir == GEO_NET_SEND ? "sending to" : "receiving from", req->peer,
                    tcpPeerStr(st, req->peer, pa), ctx->peers[req->peer].host,
                    req->frames_done, req->nframes,
                    !peer->unopened ? ""
                    : req->peer < ctx->rank ? "; our first-use dials of it never finished"
                                            : "; it never dialled us (its first use: it is "
                                              "gone, or has not posted its side)");
            tcpBreakLocked(st, ncclRemoteError);
            break;
        }
    }
    res = req->result;
    pthread_mutex_unlock(&st->lock);
    return res;
}

static int tcp_peer_pid(void *state, int peer)
{
    tcpState *st = state;
    int pid = 0;
    if (st->peers == NULL || peer < 0 || peer >= st->ctx->nranks || peer == st->ctx->rank ||
        st->peers[peer].conns == NULL)
        return 0;
    for (int s = 0; s < st->nstreams; s++) {
        tcpConn *c = &st->peers[peer].conns[s];
        struct ucred cred;
        socklen_t len = sizeof(cred);
        if (!c->local || c->fd < 0 ||
            getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0 ||
            (pid != 0 && cred.pid != pid))
            return 0;
        pid = cred.pid;
    }
    return pid;
}

void tcpConnSampleQueued(tcpConn *c, double now, int force)
{
    if (c->fd < 0 || c->local || c->ring || c->closed || c->down ||
        (!force && c->q_at > 0 && now - c->q_at < GEO_TCP_QUEUED_EVERY))
        return;
    int unsent = 0;
    if (ioctl(c->fd, SIOCOUTQNSD, &unsent) != 0)
        return;
    /* Between two looks the socket is taken to have stayed as the first
     * saw it: the progress thread looks every GEO_TCP_QUEUED_EVERY while
     * the connection sends or is full, and stops looking only after a look
     * that saw it not full with nothing more to send. */
    if (c->q_at > 0 && now > c->q_at && c->q_full)
        c->full_total += now - c->q_at;
    int full = unsent > GEO_TCP_QUEUED_FULL;
    c->q_at = now;
    c->q_full = full;
}

static int tcp_link_stats(void *state, int peer, geoLinkStats *out)
{
    tcpState *st = state;
    memset(out, 0, sizeof(*out));
    if (st->peers == NULL || peer < 0 || peer >= st->ctx->nranks || peer == st->ctx->rank ||
        st->peers[peer].conns == NULL)
        return -1;
    pthread_mutex_lock(&st->lock);
    double now = geoNow();
    for (int s = 0; s < st->nstreams; s++) {
        tcpConn *c = &st->peers[peer].conns[s];
        if (c->fd < 0 || c->local || geoTcpInfoAdd(c->fd, out) != 0)
            continue;
        tcpConnSampleQueued(c, now, 1);
        if (c->full_total > out->full)
            out->full = c->full_total;
    }
    pthread_mutex_unlock(&st->lock);
    return out->conns > 0 ? 0 : -1;
}

static int tcp_resume_stats(void *state, int peer, uint64_t *reconnects, uint64_t *resent)
{
    tcpState *st = state;
    if (st->peers == NULL || peer < 0 || peer >= st->ctx->nranks)
        return -1;
    pthread_mutex_lock(&st->lock);
    *reconnects = st->peers[peer].reconnects;
    *resent = st->peers[peer].resent;
    pthread_mutex_unlock(&st->lock);
    return 0;
}

static int tcp_descriptors(void *state, int *peers)
{
    tcpState *st = state;
    int n = 0;
    *peers = 0;
    pthread_mutex_lock(&st->lock);
    n += (st->listen_fd >= 0) + (st->local_fd >= 0) + (st->wake_fd >= 0);
    for (int i = 0; st->rpend != NULL && i < st->nrpend; i++)
        n += st->rpend[i].state < HS_DONE && st->rpend[i].fd >= 0;
    for (int p = 0; st->peers != NULL && p < st->ctx->nranks; p++) {
        int k = 0;
        for (int s = 0; s < st->nstreams && st->peers[p].conns != NULL; s++) {
            const tcpConn *c = &st->peers[p].conns[s];
            k += c->fd >= 0;
            n += (c->fd >= 0) + (c->dial != NULL && c->dial->fd >= 0) + (c->probe_fd >= 0);
        }
        *peers += k > 0;
    }
    pthread_mutex_unlock(&st->lock);
    return n;
}

static void tcp_break(void *state)
{
    tcpState *st = state;
    pthread_mutex_lock(&st->lock);
    tcpBreakLocked(st, ncclRemoteError);
    pthread_mutex_unlock(&st->lock);
    tcpWake(st);
}

/* Frames this rank sent that live connections' peers have not yet
 * acknowledged, and (*acked) how many they have.  Caller holds st->lock. */
static uint64_t unacked(const tcpState *st, uint64_t *acked)
{
    uint64_t n = 0;
    *acked = 0;
    for (int p = 0; st->peers != NULL && p < st->ctx->nranks; p++) {
        const tcpPeer *peer = &st->peers[p];
        if (peer->conns == NULL || peer->gone || peer->closed_by_peer)
            continue;
        for (int s = 0; s < st->nstreams; s++) {
            const tcpConn *c = &peer->conns[s];
            if (c->track && (c->fd >= 0 || c->down) && c->a_got < c->s_count)
                n += c->s_count - c->a_got;
            *acked += c->a_got;
        }
    }
    return n;
}

static void tcp_destroy(void *state)
{
    tcpState *st = state;
    if (st == NULL)
        return;
    /* Linger until the peers have acknowledged every frame we sent, the
     * communicator broke, or no acknowledgement came for ctx->timeout: a
     * sent message may still sit in the kernel's buffer when its call
     * returns (a paced or slow link drains it for a while), and the peer
     * acknowledges each frame it receives; acknowledgements reaching a
     * socket we have closed would be answered with a reset, which the
     * peer, still inside its call, would take for a lost connection whose
     * process is gone. */
    uint64_t acked = 0, last = UINT64_MAX;
    double until = 0;
    for (int more = 1; more && st->thread_live;) {
        pthread_mutex_lock(&st->lock);
        more = !st->broken && unacked(st, &acked) > 0;
        pthread_mutex_unlock(&st->lock);
        if (acked != last) {
            last = acked;
            until = geoNow() + st->ctx->timeout;
        }
        if (more && geoNow() < until)
            usleep(1000);
        else
            more = 0;
    }
    pthread_mutex_lock(&st->lock);
    st->stop = 1;
    pthread_mutex_unlock(&st->lock);
    if (st->thread_live) {
        tcpWake(st);
        pthread_join(st->thread, NULL);
    }
    /* First no resume can reach us: a peer dialling is refused at once. */
    if (st->listen_fd >= 0)
        close(st->listen_fd);
    st->listen_fd = -1;
    for (int i = 0; st->rpend != NULL && i < st->nrpend; i++)
        if (st->rpend[i].state < HS_DONE && st->rpend[i].fd >= 0)
            close(st->rpend[i].fd);
    free(st->rpend);
    if (st->peers) {
        for (int p = 0; p < st->ctx->nranks; p++) {
            if (st->peers[p].conns == NULL)
                continue;
            for (int s = 0; s < st->nstreams; s++) {
                tcpConn *c = &st->peers[p].conns[s];
                if (c->fd >= 0 && c->track) {
                    /* Acks still unread would make close() reset the
                     * connection, and the peer take that for a middlebox's
                     * reset: read them, then close with a FIN. */
                    char sink[4096];
                    while (recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
                        ;
                    shutdown(c->fd, SHUT_WR);
                }
                tcpConnFreeResume(c);
                tcpKeptFree(c);
                if (st->peers[p].conns[s].fd >= 0)
                    close(st->peers[p].conns[s].fd);
                if (st->peers[p].conns[s].ring)
                    geoShmSegmentUnmap(st->peers[p].conns[s].seg, st->peers[p].conns[s].seg_cap);
                tcpConnKeysFree(&st->peers[p].conns[s]);
                geoWipe(c->resume_secret, sizeof(c->resume_secret));
            }
            free(st->peers[p].conns);
        }
        free(st->peers);
    }
    if (st->listen_fd >= 0)
        close(st->listen_fd);
    if (st->local_fd >= 0)
        close(st->local_fd);
    geoLocalUnlink(&st->local); /* init failed before connect() removed it */
    if (st->wake_fd >= 0)
        close(st->wake_fd);
    geoAdmitPeersFree(&st->known);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cv);
    free(st);
}

const geoNetTransport geoNetTcp = {
    .name = "tcp",
    .canConnect = tcp_can_connect,
    .listen = tcp_listen,
    .connect = tcp_connect,
    .post = tcp_post,
    .wait = tcp_wait,
    .breakAll = tcp_break,
    .destroy = tcp_destroy,
    .limitQueued = tcpLimitQueued,
    .setStreams = tcpSetStreams,
    .hasMailbox = tcpHasMailbox,
    .mail = tcpMail,
    .peerPid = tcp_peer_pid,
    .linkStats = tcp_link_stats,
    .resumeStats = tcp_resume_stats,
    .descriptors = tcp_descriptors,
};
