/* TCP transport: nstreams connections per peer pair, non-blocking, driven by
 * one progress thread per communicator.
 *
 * A message is cut into frames of GEO_TCP_FRAME bytes; frame f of message
 * number seq travels on stream (f + seq) % nstreams, so one-frame messages
 * still spread over the streams.  Each stream keeps a send cursor and a
 * receive cursor (seq, frame); both sides compute the same assignment, so
 * each connection carries a deterministic sequence of frames and every
 * received header can be checked against what is expected (magic, sequence,
 * offset, length) before a byte of payload is written to the user's buffer.
 *
 * A receive cursor only reads when the matching receive has been posted:
 * until then unexpected data waits in the kernel (TCP flow control), so no
 * copy and no unbounded buffering.
 *
 * Connection set-up: every rank listens; rank i connects nstreams times to
 * each rank j < i and accepts from each j > i.  An acceptor first sends a
 * random challenge; the connector answers with HMAC-SHA256(secret,
 * challenge | rank | stream | comm_hash).  A connection that cannot prove the
 * secret is logged and closed, and accepting goes on. */
#include "config.h"
#include "comm/checks.h"
#include "comm/comm.h"
#include "comm/param.h"
#include "comm/transport.h"

#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define GEO_TCP_FRAME (256 * 1024)
#define GEO_FRAME_MAGIC 0x47454f46u /* "GEOF" */
#define GEO_HELLO_MAGIC 0x47454f48u /* "GEOH" */
#define GEO_CHALLENGE_BYTES 16

typedef struct {
    uint32_t magic;
    uint32_t len;      /* payload bytes */
    uint64_t seq;      /* message number in this direction */
    uint64_t offset;   /* byte offset in the message */
    uint64_t total;    /* message bytes */
    uint64_t check;    /* a hash of the fields above */
} tcpFrameHdr;

#define GEO_FRAME_UNSET ((size_t)-1)
#define GEO_FRAME_NONE ((size_t)-2)

typedef struct {
    uint32_t magic;
    int32_t rank;
    int32_t stream;
    uint32_t pad;
    uint8_t proof[GEO_SHA256_BYTES];
} tcpHello;

typedef struct {
    int fd;
    int closed;            /* peer closed or reset: no more polling */
    /* send cursor */
    uint64_t s_seq;
    size_t s_frame;
    size_t s_off;          /* bytes of header+payload sent for current frame */
    int s_active;          /* a frame is half-sent */
    tcpFrameHdr s_hdr;
    /* receive cursor */
    uint64_t r_seq;
    size_t r_frame;
    size_t r_off;
    int r_active;
    tcpFrameHdr r_hdr;
} tcpConn;

typedef struct {
    tcpConn *conns;                 /* nstreams */
    geoNetRequest *q[2];            /* pending, in seq order */
    uint64_t posted[2];             /* next seq to assign */
    int closed_by_peer;
} tcpPeer;

typedef struct {
    struct ncclComm *comm;
    int listen_fd;
    int nstreams;
    tcpPeer *peers;
    pthread_t thread;
    int thread_live;
    int wake_fd;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int stop;
    int broken;
    ncclResult_t broken_res;
} tcpState;

static uint64_t hdr_check(const tcpFrameHdr *h)
{
    uint64_t x = ((uint64_t)h->magic << 32 | h->len) ^ h->seq ^ (h->offset * 0x9e3779b97f4a7c15ULL) ^
                 (h->total * 0xc2b2ae3d27d4eb4fULL);
    return (x << 13) | (x >> 51);
}

static size_t nframes_of(size_t size)
{
    return (size + GEO_TCP_FRAME - 1) / GEO_TCP_FRAME;
}

static size_t frame_len(const geoNetRequest *r, size_t f)
{
    size_t off = f * GEO_TCP_FRAME;
    return r->size - off < GEO_TCP_FRAME ? r->size - off : GEO_TCP_FRAME;
}

/* First frame of message seq carried by stream s.  A variable-length
 * message travels whole on stream seq % nstreams (the receiver learns its
 * length from its first frame); others are spread frame by frame. */
static size_t first_frame(const tcpState *st, const geoNetRequest *r, int s)
{
    uint64_t ns = (uint64_t)st->nstreams;
    if (r->vlen)
        return (uint64_t)s == r->seq % ns ? 0 : GEO_FRAME_NONE;
    return (size_t)(((uint64_t)s + ns - r->seq % ns) % ns);
}

static size_t frame_step(const tcpState *st, const geoNetRequest *r)
{
    return r->vlen ? 1 : (size_t)st->nstreams;
}

static void wake(tcpState *st)
{
    uint64_t one = 1;
    ssize_t rc = write(st->wake_fd, &one, sizeof(one));
    (void)rc;
}

static const char *peer_str(tcpState *st, int peer, char buf[GEO_ADDR_STRLEN])
{
    return geoAddrToString(&st->comm->peers[peer].addr, buf);
}

/* Fail every request, shut every connection.  Lock held. */
static void break_locked(tcpState *st, ncclResult_t res)
{
    struct ncclComm *comm = st->comm;
    if (!st->broken) {
        st->broken = 1;
        st->broken_res = res;
        geoCommFail(comm, res);
    }
    for (int p = 0; p < comm->nranks; p++) {
        tcpPeer *peer = &st->peers[p];
        for (int d = 0; d < 2; d++) {
            for (geoNetRequest *r = peer->q[d]; r; r = r->next) {
                r->result = st->broken_res;
                r->done = 1;
            }
            peer->q[d] = NULL;
        }
        if (peer->conns)
            for (int s = 0; s < st->nstreams; s++)
                if (peer->conns[s].fd >= 0)
                    shutdown(peer->conns[s].fd, SHUT_RDWR);
    }
    pthread_cond_broadcast(&st->cv);
}

static void peer_error(tcpState *st, int peer, int stream, const char *what)
{
    char a[GEO_ADDR_STRLEN];
    if (st->broken || st->stop)
        return;
    geoCommSetError(st->comm, "%s: rank %d (%s, host %s) %s (stream %d)", st->comm->op_desc,
                    peer, peer_str(st, peer, a), st->comm->peers[peer].host, what, stream);
    geoWarn(GEO_LOG_NET, "%s", st->comm->last_error);
    break_locked(st, ncclRemoteError);
}

static geoNetRequest *find_req(tcpPeer *peer, int dir, uint64_t seq)
{
    for (geoNetRequest *r = peer->q[dir]; r; r = r->next)
        if (r->seq == seq)
            return r;
        else if (r->seq > seq)
            break;
    return NULL;
}

/* Move cursor (seq, frame) to the next frame this stream carries that
 * belongs to a posted request; NULL when there is none yet. */
static geoNetRequest *cursor_req(tcpState *st, tcpPeer *peer, int dir, int s, uint64_t *seq,
                                 size_t *frame)
{
    for (;;) {
        if (*seq >= peer->posted[dir])
            return NULL;
        geoNetRequest *r = find_req(peer, dir, *seq);
        if (r != NULL && *frame == GEO_FRAME_UNSET)
            *frame = first_frame(st, r, s);
        if (r != NULL && *frame < r->nframes)
            return r;
        /* Completed (removed) or no frame left for this stream: next one. */
        (*seq)++;
        *frame = GEO_FRAME_UNSET;
    }
}

static void complete_frame(tcpState *st, tcpPeer *peer, int dir, geoNetRequest *r)
{
    if (++r->frames_done < r->nframes)
        return;
    geoNetRequest **pp = &peer->q[dir];
    while (*pp && *pp != r)
        pp = &(*pp)->next;
    if (*pp)
        *pp = r->next;
    r->result = ncclSuccess;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&st->cv);
}

/* Push bytes on one connection.  Returns 1 if progress was made. */
static int progress_send(tcpState *st, int p, int s, double now)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    int moved = 0;

    for (;;) {
        geoNetRequest *r = cursor_req(st, peer, GEO_NET_SEND, s, &c->s_seq, &c->s_frame);
        if (r == NULL)
            return moved;
        size_t len = frame_len(r, c->s_frame);
        if (!c->s_active) {
            c->s_hdr.magic = GEO_FRAME_MAGIC;
            c->s_hdr.len = (uint32_t)len;
            c->s_hdr.seq = r->seq;
            c->s_hdr.offset = (uint64_t)c->s_frame * GEO_TCP_FRAME;
            c->s_hdr.total = r->size;
            c->s_hdr.check = hdr_check(&c->s_hdr);
            c->s_off = 0;
            c->s_active = 1;
        }
        struct iovec iov[2];
        int n = 0;
        if (c->s_off < sizeof(tcpFrameHdr)) {
            iov[n].iov_base = (char *)&c->s_hdr + c->s_off;
            iov[n++].iov_len = sizeof(tcpFrameHdr) - c->s_off;
            iov[n].iov_base = r->buf + c->s_frame * GEO_TCP_FRAME;
            iov[n++].iov_len = len;
        } else {
            size_t done = c->s_off - sizeof(tcpFrameHdr);
            iov[n].iov_base = r->buf + c->s_frame * GEO_TCP_FRAME + done;
            iov[n++].iov_len = len - done;
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return moved;
            char why[128];
            snprintf(why, sizeof(why), "failed while we sent to it: %s", strerror(errno));
            peer_error(st, p, s, why);
            return moved;
        }
        moved = 1;
        r->last_progress = now;
        c->s_off += (size_t)w;
        if (c->s_off < sizeof(tcpFrameHdr) + len)
            return moved;
        c->s_active = 0;
        c->s_frame += frame_step(st, r);
        complete_frame(st, peer, GEO_NET_SEND, r);
    }
}

static int progress_recv(tcpState *st, int p, int s, double now)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    int moved = 0;

    for (;;) {
        geoNetRequest *r = cursor_req(st, peer, GEO_NET_RECV, s, &c->r_seq, &c->r_frame);
        if (r == NULL)
            return moved;
        size_t len = frame_len(r, c->r_frame);
        if (!c->r_active) {
            c->r_off = 0;
            c->r_active = 1;
        }
        ssize_t got;
        if (c->r_off < sizeof(tcpFrameHdr)) {
            got = recv(c->fd, (char *)&c->r_hdr + c->r_off, sizeof(tcpFrameHdr) - c->r_off,
                       MSG_DONTWAIT);
        } else {
            size_t done = c->r_off - sizeof(tcpFrameHdr);
            got = recv(c->fd, r->buf + c->r_frame * GEO_TCP_FRAME + done, len - done,
                       MSG_DONTWAIT);
        }
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return moved;
        if (got <= 0) {
            char why[160];
            if (got == 0)
                snprintf(why, sizeof(why), "closed the connection while we waited for %zu "
                         "bytes (it died, or gave up because of another rank's failure)",
                         r->size);
            else
                snprintf(why, sizeof(why), "failed while we received from it: %s",
                         strerror(errno));
            peer_error(st, p, s, why);
            return moved;
        }
        moved = 1;
        r->last_progress = now;
        size_t before = c->r_off;
        c->r_off += (size_t)got;
        if (before < sizeof(tcpFrameHdr) && c->r_off == sizeof(tcpFrameHdr)) {
            const tcpFrameHdr *h = &c->r_hdr;
            int hdr_ok = h->magic == GEO_FRAME_MAGIC && h->check == hdr_check(h) &&
                         h->seq == r->seq;
            if (hdr_ok && r->vlen && c->r_frame == 0) {
                /* The first frame says how long the message is. */
                if (h->total > r->capacity) {
                    char why[200];
                    snprintf(why, sizeof(why), "sent a %llu-byte message where at most %zu "
                             "were expected", (unsigned long long)h->total, r->capacity);
                    peer_error(st, p, s, why);
                    return moved;
                }
                r->size = h->total;
                r->nframes = h->total ? nframes_of(h->total) : 1;
                len = frame_len(r, c->r_frame);
            }
            if (!hdr_ok || h->total != r->size ||
                h->offset != (uint64_t)c->r_frame * GEO_TCP_FRAME || h->len != len) {
                char why[256];
                snprintf(why, sizeof(why),
                         "sent a frame that does not match the posted receive (magic %#x seq "
                         "%llu offset %llu len %u; expected seq %llu offset %llu len %zu: "
                         "mismatched counts or a corrupt stream)",
                         h->magic, (unsigned long long)h->seq, (unsigned long long)h->offset,
                         h->len, (unsigned long long)r->seq,
                         (unsigned long long)c->r_frame * GEO_TCP_FRAME, len);
                peer_error(st, p, s, why);
                return moved;
            }
        }
        if (c->r_off < sizeof(tcpFrameHdr) + len)
            continue;
        c->r_active = 0;
        c->r_frame += frame_step(st, r);
        complete_frame(st, peer, GEO_NET_RECV, r);
    }
}

static void *progress_main(void *arg)
{
    tcpState *st = arg;
    struct ncclComm *comm = st->comm;
    int nfds_max = comm->nranks * st->nstreams + 1;
    struct pollfd *pfd = calloc((size_t)nfds_max, sizeof(*pfd));
    int *map = calloc((size_t)nfds_max, sizeof(int));

    geoDebugSetRank(comm->rank);
    if (pfd == NULL || map == NULL) {
        pthread_mutex_lock(&st->lock);
        geoCommSetError(comm, "out of memory in progress thread");
        break_locked(st, ncclSystemError);
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
        for (int p = 0; p < comm->nranks; p++) {
            if (p == comm->rank || st->broken)
                continue;
            for (int s = 0; s < st->nstreams; s++) {
                tcpConn *c = &st->peers[p].conns[s];
                if (c->fd < 0)
                    continue;
                if (!c->closed)
                    progress_send(st, p, s, now);
                if (st->broken)
                    break;
                /* A closed connection may still hold data sent before the
                 * close: it is read when its receive is posted. */
                progress_recv(st, p, s, now);
                if (st->broken)
                    break;
                short ev = c->closed ? 0 : POLLRDHUP;
                uint64_t sq = c->s_seq, rq = c->r_seq;
                size_t sf = c->s_frame, rf = c->r_frame;
                if (!c->closed && cursor_req(st, &st->peers[p], GEO_NET_SEND, s, &sq, &sf))
                    ev |= POLLOUT;
                if (cursor_req(st, &st->peers[p], GEO_NET_RECV, s, &rq, &rf))
                    ev |= POLLIN;
                if (ev == 0)
                    continue;
                pfd[n].fd = c->fd;
                pfd[n].events = ev;
                pfd[n].revents = 0;
                map[n++] = p * st->nstreams + s;
            }
        }
        pfd[n].fd = st->wake_fd;
        pfd[n].events = POLLIN;
        pfd[n].revents = 0;
        pthread_mutex_unlock(&st->lock);
        int rc = poll(pfd, (nfds_t)n + 1, 200);
        pthread_mutex_lock(&st->lock);
        if (rc < 0 && errno != EINTR) {
            geoCommSetError(comm, "poll failed in progress thread: %s", strerror(errno));
            break_locked(st, ncclSystemError);
            continue;
        }
        if (pfd[n].revents & POLLIN) {
            uint64_t v;
            ssize_t r = read(st->wake_fd, &v, sizeof(v));
            (void)r;
        }
        for (int i = 0; i < n && rc > 0; i++) {
            if (!(pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) ||
                (pfd[i].revents & POLLIN && pfd[i].events & POLLIN))
                continue;
            /* Hang-up on a connection with no receive posted: remember it;
             * an operation that needs this peer fails when it is posted. */
            int p = map[i] / st->nstreams, s = map[i] % st->nstreams;
            tcpConn *c = &st->peers[p].conns[s];
            if (c->closed)
                continue;
            uint64_t sq = c->s_seq;
            size_t sf = c->s_frame;
            if (cursor_req(st, &st->peers[p], GEO_NET_SEND, s, &sq, &sf) ||
                (pfd[i].revents & POLLERR)) {
                peer_error(st, p, s, "closed or reset the connection (it died, or gave up "
                           "because of another rank's failure)");
                break;
            }
            c->closed = 1;
            st->peers[p].closed_by_peer = 1;
            geoInfo(GEO_LOG_NET, "rank %d closed its connection (stream %d)", p, s);
        }
    }
    pthread_mutex_unlock(&st->lock);
    free(pfd);
    free(map);
    return NULL;
}

/* ---- set-up ---------------------------------------------------------- */

static void hello_proof(const struct ncclComm *comm, const uint8_t *challenge, int rank,
                        int stream, uint8_t out[GEO_SHA256_BYTES])
{
    uint8_t msg[GEO_CHALLENGE_BYTES + 16];
    int32_t r = rank, s = stream;
    uint64_t h = comm->comm_hash;
    memcpy(msg, challenge, GEO_CHALLENGE_BYTES);
    memcpy(msg + GEO_CHALLENGE_BYTES, &r, 4);
    memcpy(msg + GEO_CHALLENGE_BYTES + 4, &s, 4);
    memcpy(msg + GEO_CHALLENGE_BYTES + 8, &h, 8);
    geoHmacSha256(comm->secret, sizeof(comm->secret), msg, sizeof(msg), out);
}

static int tcp_can_connect(struct ncclComm *comm)
{
    (void)comm;
    return 1;
}

static ncclResult_t tcp_listen(struct ncclComm *comm, void **state, void *listen_addr)
{
    tcpState *st = calloc(1, sizeof(*st));
    geoSockAddr *addr = listen_addr;
    geoSockAddr bound;
    ncclResult_t res;

    GEO_RETURN_IF(st == NULL, ncclSystemError, "out of memory");
    st->comm = comm;
    st->listen_fd = -1;
    st->wake_fd = -1;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->cv, NULL);
    GEO_CHECK_GOTO(geoSocketListen(addr, &st->listen_fd, &bound), res, fail);
    *addr = bound;
    *state = st;
    return ncclSuccess;
fail:
    free(st);
    return res;
}

typedef struct {
    tcpState *st;
    int expected;
    ncclResult_t res;
    double deadline;
} acceptArgs;

/* Accept connections from higher ranks until all are there. */
static void *accept_main(void *arg)
{
    acceptArgs *a = arg;
    tcpState *st = a->st;
    struct ncclComm *comm = st->comm;
    int got = 0;

    geoDebugSetRank(comm->rank);
    while (got < a->expected) {
        geoSockAddr from;
        int fd;
        char fa[GEO_ADDR_STRLEN];
        const char *why = NULL;
        uint8_t challenge[GEO_CHALLENGE_BYTES], expect[GEO_SHA256_BYTES];
        tcpHello h;
        ncclResult_t res = geoSocketAccept(st->listen_fd, a->deadline, &comm->abort_flag, &fd,
                                           &from);
        if (res != ncclSuccess) {
            geoCommSetError(comm, "init: %d of %d connections from higher ranks arrived "
                            "before the %.0f s timeout", got, a->expected, comm->timeout);
            a->res = ncclRemoteError;
            return NULL;
        }
        geoAddrToString(&from, fa);
        /* A stranger gets 16 random bytes and nothing else. */
        double hs_deadline = geoNow() + 5.0;
        if (geoRandomBytes(challenge, sizeof(challenge)) != 0 ||
            geoSocketSendAll(fd, challenge, sizeof(challenge), hs_deadline, &why) ||
            geoSocketRecvAll(fd, &h, sizeof(h), hs_deadline, &why)) {
            geoWarn(GEO_LOG_NET, "dropped connection from %s: handshake failed (%s)", fa,
                    why ? why : "no randomness");
            close(fd);
            continue;
        }
        if (h.magic != GEO_HELLO_MAGIC || h.rank <= comm->rank || h.rank >= comm->nranks ||
            h.stream < 0 || h.stream >= st->nstreams ||
            st->peers[h.rank].conns[h.stream].fd >= 0) {
            geoWarn(GEO_LOG_NET, "dropped connection from %s: not a valid hello for this "
                    "communicator", fa);
            close(fd);
            continue;
        }
        hello_proof(comm, challenge, h.rank, h.stream, expect);
        if (!geoDigestEqual(expect, h.proof, sizeof(expect))) {
            geoWarn(GEO_LOG_NET, "dropped connection from %s claiming rank %d: it does not "
                    "hold the communicator's secret", fa, h.rank);
            close(fd);
            continue;
        }
        uint32_t ok = GEO_HELLO_MAGIC;
        if (geoSocketSendAll(fd, &ok, sizeof(ok), hs_deadline, &why)) {
            geoWarn(GEO_LOG_NET, "dropped connection from %s: %s", fa, why);
            close(fd);
            continue;
        }
        st->peers[h.rank].conns[h.stream].fd = fd;
        got++;
    }
    a->res = ncclSuccess;
    return NULL;
}

static ncclResult_t connect_one(tcpState *st, int peer, int stream, double deadline)
{
    struct ncclComm *comm = st->comm;
    char pa[GEO_ADDR_STRLEN];
    const char *why = NULL;
    uint8_t challenge[GEO_CHALLENGE_BYTES];
    uint32_t ok = 0;
    tcpHello h;
    int fd;

    if (geoSocketConnect(&comm->peers[peer].addr, deadline, &fd) != ncclSuccess) {
        geoCommSetError(comm, "init: cannot connect to rank %d at %s (host %s)", peer,
                        peer_str(st, peer, pa), comm->peers[peer].host);
        return ncclRemoteError;
    }
    memset(&h, 0, sizeof(h));
    h.magic = GEO_HELLO_MAGIC;
    h.rank = comm->rank;
    h.stream = stream;
    if (geoSocketRecvAll(fd, challenge, sizeof(challenge), deadline, &why) == ncclSuccess) {
        hello_proof(comm, challenge, comm->rank, stream, h.proof);
        if (geoSocketSendAll(fd, &h, sizeof(h), deadline, &why) == ncclSuccess &&
            geoSocketRecvAll(fd, &ok, sizeof(ok), deadline, &why) == ncclSuccess &&
            ok == GEO_HELLO_MAGIC) {
            st->peers[peer].conns[stream].fd = fd;
            return ncclSuccess;
        }
    }
    geoCommSetError(comm, "init: rank %d at %s refused our connection (%s)", peer,
                    peer_str(st, peer, pa), why ? why : "bad acknowledgement");
    close(fd);
    return ncclRemoteError;
}

static ncclResult_t tcp_connect(struct ncclComm *comm, void *state)
{
    tcpState *st = state;
    ncclResult_t res = ncclSuccess;
    pthread_t acc;
    acceptArgs a;

    st->nstreams = comm->nstreams;
    st->peers = calloc((size_t)comm->nranks, sizeof(tcpPeer));
    GEO_RETURN_IF(st->peers == NULL, ncclSystemError, "out of memory");
    for (int p = 0; p < comm->nranks; p++) {
        st->peers[p].conns = calloc((size_t)st->nstreams, sizeof(tcpConn));
        GEO_RETURN_IF(st->peers[p].conns == NULL, ncclSystemError, "out of memory");
        for (int s = 0; s < st->nstreams; s++) {
            st->peers[p].conns[s].fd = -1;
            st->peers[p].conns[s].s_frame = GEO_FRAME_UNSET;
            st->peers[p].conns[s].r_frame = GEO_FRAME_UNSET;
        }
    }
    a.st = st;
    a.expected = (comm->nranks - 1 - comm->rank) * st->nstreams;
    a.res = ncclSuccess;
    a.deadline = geoNow() + comm->timeout;
    if (pthread_create(&acc, NULL, accept_main, &a) != 0) {
        geoCommSetError(comm, "init: cannot start the accept thread: %s", strerror(errno));
        return ncclSystemError;
    }
    for (int p = 0; p < comm->rank && res == ncclSuccess; p++)
        for (int s = 0; s < st->nstreams && res == ncclSuccess; s++)
            res = connect_one(st, p, s, a.deadline);
    if (res != ncclSuccess)
        comm->abort_flag = 1; /* stop the acceptor early */
    pthread_join(acc, NULL);
    if (res == ncclSuccess)
        res = a.res;
    close(st->listen_fd);
    st->listen_fd = -1;
    if (res != ncclSuccess)
        return res;

    for (int p = 0; p < comm->nranks; p++)
        for (int s = 0; s < st->nstreams && p != comm->rank; s++) {
            geoSocketTune(st->peers[p].conns[s].fd);
            geoSocketSetNonBlocking(st->peers[p].conns[s].fd, 1);
        }
    st->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (st->wake_fd < 0) {
        geoCommSetError(comm, "init: eventfd failed: %s", strerror(errno));
        return ncclSystemError;
    }
    if (pthread_create(&st->thread, NULL, progress_main, st) != 0) {
        geoCommSetError(comm, "init: cannot start the progress thread: %s", strerror(errno));
        return ncclSystemError;
    }
    st->thread_live = 1;
    geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "connected to %d peers, %d TCP streams each",
            comm->nranks - 1, st->nstreams);
    return ncclSuccess;
}

static ncclResult_t tcp_post(void *state, geoNetRequest *req)
{
    tcpState *st = state;
    struct ncclComm *comm = st->comm;
    char pa[GEO_ADDR_STRLEN];
    ncclResult_t res = ncclSuccess;

    req->next = NULL;
    req->nframes = nframes_of(req->size);
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
    } else if (req->dir == GEO_NET_SEND && st->peers[req->peer].closed_by_peer) {
        geoCommSetError(comm, "%s: rank %d (%s, host %s) has closed its connections", comm->op_desc,
                        req->peer, peer_str(st, req->peer, pa), comm->peers[req->peer].host);
        break_locked(st, ncclRemoteError);
        res = ncclRemoteError;
    } else {
        tcpPeer *peer = &st->peers[req->peer];
        geoNetRequest **pp = &peer->q[req->dir];
        req->seq = peer->posted[req->dir]++;
        while (*pp)
            pp = &(*pp)->next;
        *pp = req;
    }
    pthread_mutex_unlock(&st->lock);
    if (res == ncclSuccess)
        wake(st);
    else
        req->done = 1, req->result = res;
    return res;
}

static ncclResult_t tcp_wait(void *state, geoNetRequest *req)
{
    tcpState *st = state;
    struct ncclComm *comm = st->comm;
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
        pthread_cond_timedwait(&st->cv, &st->lock, &ts);
        if (req->done)
            break;
        if (comm->abort_flag) {
            if (!st->broken)
                geoCommSetError(comm, "%s: communicator aborted", comm->op_desc);
            break_locked(st, ncclRemoteError);
            break;
        }
        double idle = geoNow() - req->last_progress;
        if (idle > comm->timeout) {
            char pa[GEO_ADDR_STRLEN];
            geoCommSetError(comm,
                            "%s: timed out after %.0f s without progress %s rank %d (%s, host "
                            "%s); %zu of %zu frames done",
                            comm->op_desc, idle, req->dir == GEO_NET_SEND ? "sending to"
                                                                          : "receiving from",
                            req->peer, peer_str(st, req->peer, pa), comm->peers[req->peer].host,
                            req->frames_done, req->nframes);
            geoWarn(GEO_LOG_NET, "%s", comm->last_error);
            break_locked(st, ncclRemoteError);
            break;
        }
    }
    res = req->result;
    pthread_mutex_unlock(&st->lock);
    return res;
}

static void tcp_break(void *state)
{
    tcpState *st = state;
    pthread_mutex_lock(&st->lock);
    break_locked(st, ncclRemoteError);
    pthread_mutex_unlock(&st->lock);
    wake(st);
}

static void tcp_destroy(void *state)
{
    tcpState *st = state;
    if (st == NULL)
        return;
    pthread_mutex_lock(&st->lock);
    st->stop = 1;
    pthread_mutex_unlock(&st->lock);
    if (st->thread_live) {
        wake(st);
        pthread_join(st->thread, NULL);
    }
    if (st->peers) {
        for (int p = 0; p < st->comm->nranks; p++) {
            if (st->peers[p].conns == NULL)
                continue;
            for (int s = 0; s < st->nstreams; s++)
                if (st->peers[p].conns[s].fd >= 0)
                    close(st->peers[p].conns[s].fd);
            free(st->peers[p].conns);
        }
        free(st->peers);
    }
    if (st->listen_fd >= 0)
        close(st->listen_fd);
    if (st->wake_fd >= 0)
        close(st->wake_fd);
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
};
