/* Shared-memory rings on same-host connections (net_tcp_internal.h,
 * "Same-host fast path"): agreeing on them after the handshakes, the
 * doorbells on the socket, and the pair's mailbox in the ring segment. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/transport/net_tcp_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Shared memory per same-host pair and direction, split among the
 * streams' rings (2 MiB each with the default 2 streams: eight frames, so
 * that a sender is rarely held up by a receiver that has not caught up);
 * never less than two frames per ring.  A host with L ranks holds
 * L(L-1)/2 x 2 x 4 MiB of rings (224 MiB for 8 ranks), touched as used. */
#define GEO_SHM_PAIR_BYTES (4u << 20)

static uint64_t ring_capacity(int nstreams)
{
    uint64_t cap = 2 * GEO_TCP_FRAME;
    while (cap * 2 * (uint64_t)nstreams <= GEO_SHM_PAIR_BYTES)
        cap *= 2;
    return cap;
}

/* After a pass that moved ring bytes: one byte on the socket wakes the
 * peer's progress thread, which then looks at both rings.  A full socket
 * means the peer has doorbells it has not read yet: nothing lost. */
void tcpConnKick(tcpConn *c)
{
    if (!c->kick)
        return;
    c->kick = 0;
    ssize_t rc = send(c->fd, "", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)rc; /* a dead peer shows as EOF where we drain doorbells */
}

/* Read the doorbells waiting on a ring connection's socket.  1 when the
 * peer has closed or reset it (c->closed is then set), else 0. */
int tcpRingDrain(tcpConn *c)
{
    char sink[512];
    for (;;) {
        ssize_t got = recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (got > 0)
            continue;
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        c->closed = 1;
        return 1;
    }
}

/* After the handshakes, on every same-host connection: the connector
 * offers a ring segment ('R' with the memfd, SCM_RIGHTS) or declines ('S',
 * GEOCCL_SHM=2 or no memfd here); the acceptor answers 'Y' once it has
 * mapped the segment, else 'N'.  Both then agree: rings, or frames in-band
 * on the socket.  Every offer is sent before any answer is awaited, so no
 * rank waits on another that is waiting too; bounded by ctx->timeout and
 * the abort flag. */
enum { RING_OFFER = 'R', RING_NO_OFFER = 'S', RING_YES = 'Y', RING_NO = 'N' };

static int ring_send_byte(int fd, char b, int pass_fd)
{
    struct iovec iov = {.iov_base = &b, .iov_len = 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (pass_fd >= 0) {
        memset(&u, 0, sizeof(u));
        mh.msg_control = u.buf;
        mh.msg_controllen = sizeof(u.buf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    for (;;) {
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w == 1)
            return 0;
        if (w < 0 && errno == EINTR)
            continue;
        return -1; /* a fresh socket with room for 1 MiB is never full */
    }
}

/* 1: [out] *b (and *got_fd, -1 if none came); 0: nothing yet; -1: closed
 * or failed (errno; 0 for a close). */
static int ring_recv_byte(int fd, char *b, int *got_fd)
{
    struct iovec iov = {.iov_base = b, .iov_len = 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof(u.buf)};
    ssize_t got;
    *got_fd = -1;
    do
        got = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    if (got < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    if (got == 0) {
        errno = 0;
        return -1;
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
            cm->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(got_fd, CMSG_DATA(cm), sizeof(int));
    if (mh.msg_flags & MSG_CTRUNC) { /* more than one descriptor: not ours */
        if (*got_fd >= 0)
            close(*got_fd);
        *got_fd = -1;
        *b = 0;
    }
    return 1;
}

static void ring_attach(tcpConn *c, void *seg, uint64_t cap, int connector)
{
    c->seg = seg;
    c->seg_cap = cap;
    c->connector = connector != 0;
    geoShmSegmentRing(seg, cap, connector ? 0 : 1, &c->tx);
    geoShmSegmentRing(seg, cap, connector ? 1 : 0, &c->rx);
    c->ring = 1;
}

ncclResult_t tcpSetupRings(tcpState *st)
{
    geoNetCtx *ctx = st->ctx;
    int offer = geoParamInt(GEO_PARAM_SHM) == 1, nwait = 0, n;
    double deadline = geoNow() + ctx->timeout;
    char pa[GEO_ADDR_STRLEN];
    int *waiting = calloc((size_t)ctx->nranks * (size_t)st->nstreams, sizeof(int));
    struct pollfd *pfd = calloc((size_t)ctx->nranks * (size_t)st->nstreams, sizeof(*pfd));
    int *map = calloc((size_t)ctx->nranks * (size_t)st->nstreams, sizeof(int));
    ncclResult_t res = ncclSuccess;

    if (waiting == NULL || pfd == NULL || map == NULL) {
        res = GEO_ERR(ctx->err, ncclSystemError, "init: out of memory setting up shared-memory "
                      "rings");
        goto out;
    }
    /* Offers first (we connected to the lower ranks). */
    for (int p = 0; p < ctx->rank; p++)
        for (int s = 0; s < st->nstreams; s++) {
            tcpConn *c = &st->peers[p].conns[s];
            int fd = -1;
            void *seg = NULL;
            if (!c->local)
                continue;
            if (offer && geoShmSegmentCreate(ring_capacity(st->nstreams), &fd, &seg) != 0) {
                geoInfo(GEO_LOG_NET, "rank %d, stream %d: no shared-memory ring (memfd: %s); "
                        "frames go through the socket", p, s, strerror(errno));
                fd = -1;
            }
            int rc = ring_send_byte(c->fd, fd >= 0 ? RING_OFFER : RING_NO_OFFER, fd);
            if (fd >= 0)
                close(fd); /* the mapping, and the peer's copy, keep it alive */
            if (rc != 0) {
                int e = errno;
                geoShmSegmentUnmap(seg, ring_capacity(st->nstreams));
                res = GEO_ERR(ctx->err, ncclRemoteError, "init: cannot send to rank %d at %s "
                              "(host %s) on its same-host socket, stream %d: %s", p,
                              tcpPeerStr(st, p, pa), ctx->peers[p].host, s, strerror(e));
                goto out;
            }
            c->seg = seg; /* attached when the answer is yes */
            c->seg_cap = ring_capacity(st->nstreams);
            waiting[p * st->nstreams + s] = 1;
            nwait++;
        }
    for (int p = ctx->rank + 1; p < ctx->nranks; p++)
        for (int s = 0; s < st->nstreams; s++)
            if (st->peers[p].conns[s].local) {
                waiting[p * st->nstreams + s] = 1;
                nwait++;
            }
    while (nwait > 0) {
        double now = geoNow();
        if (geoErrAborted(ctx->err) || now >= deadline) {
            int i = 0;
            while (!waiting[i])
                i++;
            int p = i / st->nstreams;
            res = GEO_ERR(ctx->err, ncclRemoteError, "init: %s while waiting for rank %d at %s "
                          "(host %s) to agree on shared-memory rings (stream %d)",
                          geoErrAborted(ctx->err) ? "aborted" : "timed out", p,
                          tcpPeerStr(st, p, pa), ctx->peers[p].host, i % st->nstreams);
            goto out;
        }
        n = 0;
        for (int i = 0; i < ctx->nranks * st->nstreams; i++)
            if (waiting[i]) {
                pfd[n] = (struct pollfd){.fd = st->peers[i / st->nstreams]
                                                   .conns[i % st->nstreams].fd,
                                         .events = POLLIN};
                map[n++] = i;
            }
        int ms = (int)((deadline - now) * 1000.0) + 1;
        if (poll(pfd, (nfds_t)n, ms > 100 ? 100 : ms) < 0 && errno != EINTR) {
            res = GEO_ERR(ctx->err, ncclSystemError, "init: poll failed setting up shared-memory "
                          "rings: %s", strerror(errno));
            goto out;
        }
        for (int k = 0; k < n; k++) {
            int i = map[k], p = i / st->nstreams, s = i % st->nstreams, fd;
            tcpConn *c = &st->peers[p].conns[s];
            char b;
            if (pfd[k].revents == 0)
                continue;
            int rc = ring_recv_byte(c->fd, &b, &fd);
            if (rc == 0)
                continue;
            if (rc < 0) {
                res = GEO_ERR(ctx->err, ncclRemoteError, "init: rank %d at %s (host %s) %s on "
                              "its same-host socket (stream %d) before agreeing on shared-memory "
                              "rings", p, tcpPeerStr(st, p, pa), ctx->peers[p].host,
                              errno ? strerror(errno) : "closed the connection", s);
                if (fd >= 0)
                    close(fd);
                goto out;
            }
            waiting[i] = 0;
            nwait--;
            if (p < ctx->rank) { /* the answer to our offer */
                if (b == RING_YES && c->seg != NULL) {
                    ring_attach(c, c->seg, c->seg_cap, 1);
                } else {
                    geoShmSegmentUnmap(c->seg, c->seg_cap);
                    c->seg = NULL;
                }
                if (fd >= 0)
                    close(fd);
                continue;
            }
            /* An offer to us. */
            void *seg = NULL;
            uint64_t cap = 0;
            int yes = offer && b == RING_OFFER && fd >= 0 && geoShmSegmentMap(fd, &seg, &cap) == 0;
            if (b == RING_OFFER && offer && !yes)
                geoWarn(GEO_LOG_NET, "rank %d, stream %d: cannot map its shared-memory ring "
                        "(%s); frames go through the socket", p, s,
                        fd < 0 ? "no descriptor came" : strerror(errno));
            if (fd >= 0)
                close(fd);
            if (ring_send_byte(c->fd, yes ? RING_YES : RING_NO, -1) != 0) {
                int e = errno;
                geoShmSegmentUnmap(seg, cap);
                res = GEO_ERR(ctx->err, ncclRemoteError, "init: cannot answer rank %d at %s "
                              "(host %s) on its same-host socket, stream %d: %s", p,
                              tcpPeerStr(st, p, pa), ctx->peers[p].host, s, strerror(e));
                goto out;
            }
            if (yes)
                ring_attach(c, seg, cap, 0);
        }
    }
out:
    /* Offers never answered: unmapped here, not left to destroy as rings. */
    for (int p = 0; p < ctx->rank && res != ncclSuccess; p++)
        for (int s = 0; s < st->nstreams; s++) {
            tcpConn *c = &st->peers[p].conns[s];
            if (!c->ring && c->seg != NULL) {
                geoShmSegmentUnmap(c->seg, c->seg_cap);
                c->seg = NULL;
            }
        }
    free(waiting);
    free(pfd);
    free(map);
    return res;
}

/* The pair's mailbox: stream 0's segment, when that connection is a ring
 * (both ends agree on that in the handshake). */
int tcpHasMailbox(void *state, int peer)
{
    tcpState *st = state;
    return st->peers != NULL && peer >= 0 && peer < st->ctx->nranks &&
           peer != st->ctx->rank && st->peers[peer].conns != NULL &&
           st->peers[peer].conns[0].ring;
}

_Static_assert(GEO_NET_MAIL_BYTES == GEO_SHM_MAIL_BYTES, "one mailbox size");

ncclResult_t tcpMail(void *state, int peer, void *buf, size_t len, int send)
{
    tcpState *st = state;
    geoNetCtx *ctx = st->ctx;
    char pa[GEO_ADDR_STRLEN];
    tcpConn *c = &st->peers[peer].conns[0];
    /* the connector's puts go through mailbox 0, the acceptor's through 1 */
    geoShmMailbox *b = geoShmSegmentMailbox(c->seg, (send != 0) == c->connector ? 0 : 1);
    const double start = geoNow();
    ncclResult_t res = ncclSuccess;

    if (len > GEO_SHM_MAIL_BYTES)
        return GEO_ERR(ctx->err, ncclInternalError, "%s: a %zu-byte signal does not fit a "
                       "mailbox", geoErrOp(ctx->err), len);
    for (;;) {
        int r = send ? geoShmMailPut(b, buf, len) : geoShmMailTake(b, buf, len);
        if (r > 0)
            return ncclSuccess;
        pthread_mutex_lock(&st->lock);
        if (st->broken) {
            res = st->broken_res;
        } else if (r < 0) {
            res = GEO_ERR(ctx->err, ncclRemoteError, "%s: malformed signal from rank %d (%s, "
                          "host %s)", geoErrOp(ctx->err), peer, tcpPeerStr(st, peer, pa),
                          ctx->peers[peer].host);
        } else if (geoErrAborted(ctx->err)) {
            res = GEO_ERR(ctx->err, ncclRemoteError, "%s: communicator aborted",
                          geoErrOp(ctx->err));
        } else if (c->closed) {
            res = GEO_ERR(ctx->err, ncclRemoteError, "%s: rank %d (%s, host %s) has closed its "
                          "connections", geoErrOp(ctx->err), peer, tcpPeerStr(st, peer, pa),
                          ctx->peers[peer].host);
        } else if (geoNow() - start > ctx->timeout) {
            res = GEO_ERR(ctx->err, ncclRemoteError, "%s: timed out after %.0f s %s rank %d "
                          "(%s, host %s)", geoErrOp(ctx->err), geoNow() - start,
                          send ? "signalling" : "waiting for a signal from", peer,
                          tcpPeerStr(st, peer, pa), ctx->peers[peer].host);
        }
        if (res != ncclSuccess) {
            if (!st->broken)
                tcpBreakLocked(st, res);
            pthread_mutex_unlock(&st->lock);
            tcpWake(st);
            return res;
        }
        pthread_mutex_unlock(&st->lock);
        geoShmMailWait(b, send, 20);
    }
}
