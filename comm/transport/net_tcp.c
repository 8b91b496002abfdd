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
 * each rank j < i and accepts from each j > i.  Both ends prove the
 * communicator's secret: the acceptor sends a random challenge Ca; the
 * connector answers with its own random nonce Cc and HMAC(secret,
 * "geoccl/v2/hello" | comm_hash | from | to | stream | encrypt | cipher |
 * Ca | Cc); the acceptor checks it, claims the slot and answers with an
 * HMAC of the same fields under the label "geoccl/v2/accept" and its
 * choice of cipher, which the connector checks.  A relay can neither
 * answer for a rank nor redirect a connection to another rank (from and to
 * are bound), and a stranger on a peer's address is refused by the
 * connector.  A connection that cannot prove the secret is logged and
 * closed, and accepting goes on.  All handshakes of a rank run at once in
 * one poll() loop (see setup_connections).
 *
 * Encryption (GEOCCL_ENCRYPT; the communicator says which peers, in
 * ctx->encrypt).  On an encrypted connection each direction has its own
 * key, HKDF(secret, salt Ca | Cc, info: comm_hash, from, to, stream,
 * cipher, direction), fresh for every connection; frame k of a direction is
 * sealed with nonce k (AES-256-GCM, or ChaCha20-Poly1305 when either end
 * lacks AES instructions), its header as associated data and a 16-byte tag
 * after the payload.  The receiver takes the payload and tag into the
 * connection's own buffer, opens it with the number it expects, and only
 * then copies the plaintext into the user's buffer: an altered, replayed,
 * reordered or foreign frame fails the tag, breaks the communicator with
 * an error naming the peer and stream, and nothing of it is used.
 *
 * Same-host fast path (GEOCCL_SHM, net_local.h, shm_ring.h).  A connection
 * to a peer on the same host AND in the same network namespace is an
 * AF_UNIX stream socket instead of TCP.  Ranks of one host in different
 * namespaces (the emulated regions of examples/wan) always use TCP: their
 * traffic must cross the shaped links between the namespaces, or every WAN
 * figure would be a lie.  The connector falls back to TCP when the peer's
 * socket file cannot be opened from here (another mount namespace, a
 * private /dev/shm): that open is the proof that the two share the host.
 * On each such connection, after the handshake, the connector offers a pair
 * of single-producer/single-consumer byte rings in a memfd (passed with
 * SCM_RIGHTS, see setup_rings); once the acceptor has mapped it, frames (the
 * same checked headers and payloads, in the same order) are copied into and
 * out of the rings instead of sent, and the socket carries only one-byte
 * doorbells ("I moved bytes: look at the rings") plus what it always told:
 * a peer's death, as EOF or reset.
 *
 * Why this shape: keeping a socket per connection keeps everything the TCP
 * path already gets right (the HMAC handshake gating every connection,
 * ordering per stream, one poll loop, death detection through the file
 * descriptor, deadlines) and changes only where the bytes go.  Measured on
 * this project's 2-core VM (BENCHMARKS.md, 2026-11-29), 4 ranks, 64 MiB
 * all-reduce, medians of 5 rounds: AF_UNIX sockets alone 1.57x faster than
 * loopback TCP, rings 1.85x (a ring copy costs a memcpy into a cache-
 * resident buffer; a socket adds a syscall, an skb and a wake-up per
 * piece); at 1 MiB, where wake-ups dominate, both gain only 5-10%.  A single-copy path
 * (process_vm_readv from the sender's buffer, as Open MPI's vader does with
 * CMA) was measured too: 256 KiB pieces moved no faster than the two
 * memcpys through a 2 MiB ring, and it needs ptrace rights, so it is not
 * used.  GEOCCL_SHM=2 keeps the sockets without rings; 0 is TCP only. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/base/crypto.h"
#include "comm/base/param.h"
#include "comm/transport/shm_ring.h"
#include "comm/transport/transport.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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
#define GEO_HELLO_MAGIC 0x47454f32u /* "GEO2": the hello of this protocol */
#define GEO_ACCEPT_MAGIC 0x47454f41u /* "GEOA" */
#define GEO_CHALLENGE_BYTES 16
/* Send buffer of a same-host socket: the default (net.core.wmem_default,
 * often 208 KiB) holds less than one frame, so every frame took several
 * wake-ups of both sides; 1 MiB made 64 MiB all-reduces of 4 ranks about
 * 10% faster here (BENCHMARKS.md, 2026-11-29), more gained nothing. */
#define GEO_LOCAL_SNDBUF (1 << 20)
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
    int32_t rank;          /* from: the connector */
    int32_t to;            /* the rank it means to reach */
    int32_t stream;
    int32_t encrypt;       /* 1: the connector will encrypt this connection */
    int32_t cipher;        /* the connector's preferred cipher */
    uint8_t nonce[GEO_CHALLENGE_BYTES];
    uint8_t pub[GEO_X25519_BYTES]; /* encrypted: the connector's ephemeral X25519 key */
    uint8_t proof[GEO_SHA256_BYTES];
} tcpHello;

typedef struct {
    uint32_t magic;
    int32_t cipher;        /* the acceptor's choice; GEO_CIPHER_NONE: clear */
    uint8_t pub[GEO_X25519_BYTES]; /* encrypted: the acceptor's ephemeral X25519 key */
    uint8_t proof[GEO_SHA256_BYTES];
} tcpAccept;

typedef struct {
    int fd;
    int local;             /* AF_UNIX (same-host fast path), not TCP */
    int ring;              /* frames go through tx/rx, the socket carries doorbells */
    geoShmRing tx, rx;
    void *seg;             /* the mapped segment holding tx and rx */
    uint64_t seg_cap;
    int connector;         /* this end made the segment: its ring and mailbox 0 go out */
    int kick;              /* bytes moved through a ring: ring the peer's doorbell */
    int closed;            /* peer closed or reset: no more polling */
    int enc;               /* frames are sealed (tx) and opened (rx) */
    geoAead tx_aead, rx_aead;
    uint64_t s_ctr, r_ctr; /* frames sealed and opened: the next nonce each way */
    uint8_t *s_buf, *r_buf; /* GEO_TCP_FRAME + tag: a sealed frame's payload */
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
    int active;                     /* streams new messages use (setStreams) */
    int closed_by_peer;
} tcpPeer;

typedef struct {
    geoNetCtx *ctx;
    int listen_fd;
    int local_fd;                   /* same-host listener; -1: none */
    geoLocalInfo local;             /* what we published about it */
    int nstreams;
    tcpPeer *peers;
    pthread_t thread;
    int thread_live;
    int wake_fd;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    /* Threads asleep in tcp_wait, and what the sleeper waits for when
     * there is one: a completion wakes it only when that request is done
     * (complete_frame).  NULL: not known (more than one sleeper, or one
     * left while another slept), so every completion wakes them. */
    int nwaiters;
    const geoNetRequest *waiting_for;
    int stop;
    int broken;
    ncclResult_t broken_res;
    int dropped;                    /* connections dropped during set-up */
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

/* First frame of message seq carried by stream s.  A message uses the
 * first r->streams of the pair's connections (fixed when it was posted);
 * a variable-length one travels whole on stream seq % r->streams (the
 * receiver learns its length from its first frame); others are spread
 * frame by frame. */
static size_t first_frame(const geoNetRequest *r, int s)
{
    uint64_t ns = (uint64_t)r->streams;
    if ((uint64_t)s >= ns)
        return GEO_FRAME_NONE; /* a stream the message does not use */
    if (r->vlen)
        return (uint64_t)s == r->seq % ns ? 0 : GEO_FRAME_NONE;
    return (size_t)(((uint64_t)s + ns - r->seq % ns) % ns);
}

static size_t frame_step(const geoNetRequest *r)
{
    return r->vlen ? 1 : (size_t)r->streams;
}

static void wake(tcpState *st)
{
    uint64_t one = 1;
    ssize_t rc = write(st->wake_fd, &one, sizeof(one));
    (void)rc;
}

static const char *peer_str(tcpState *st, int peer, char buf[GEO_ADDR_STRLEN])
{
    return geoAddrToString(&st->ctx->peers[peer].addr, buf);
}

/* Fail every request, shut every connection.  Lock held. */
static void break_locked(tcpState *st, ncclResult_t res)
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
    pthread_cond_broadcast(&st->cv);
}

static void peer_error(tcpState *st, int peer, int stream, const char *what)
{
    char a[GEO_ADDR_STRLEN];
    if (st->broken || st->stop)
        return;
    geoErrSet(st->ctx->err, "%s: rank %d (%s, host %s) %s (stream %d%s)", geoErrOp(st->ctx->err),
                    peer, peer_str(st, peer, a), st->ctx->peers[peer].host, what, stream,
                    st->peers[peer].conns[stream].local ? ", same-host socket" : "");
    geoWarn(GEO_LOG_NET, "%s", geoErrLast(st->ctx->err));
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
static geoNetRequest *cursor_req(tcpPeer *peer, int dir, int s, uint64_t *seq, size_t *frame)
{
    for (;;) {
        if (*seq >= peer->posted[dir])
            return NULL;
        geoNetRequest *r = find_req(peer, dir, *seq);
        if (r != NULL && *frame == GEO_FRAME_UNSET)
            *frame = first_frame(r, s);
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
    /* Waking the caller for a request it is not waiting on costs two
     * context switches for nothing: on 2 regions x 4 ranks, 64 MiB at
     * 1 Gbit/s, ranks switched ~2500 times per call (BENCHMARKS.md). */
    if (st->nwaiters > 0 && (st->waiting_for == NULL || st->waiting_for == r))
        pthread_cond_broadcast(&st->cv);
}

/* Send/receive on a connection like sendmsg()/recv() with MSG_DONTWAIT:
 * through the socket, or, for a ring connection, through its rings (a full
 * or empty ring reads as EAGAIN; the peer's doorbell wakes us when that
 * changes). */
static ssize_t conn_sendv(tcpConn *c, struct iovec *iov, int n)
{
    if (!c->ring) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        return sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (c->closed) {
        errno = EPIPE;
        return -1;
    }
    size_t w = geoShmRingWrite(&c->tx, iov, n);
    if (w == 0) {
        errno = EAGAIN;
        return -1;
    }
    c->kick = 1;
    return (ssize_t)w;
}

static ssize_t conn_recv(tcpConn *c, void *buf, size_t len)
{
    if (!c->ring)
        return recv(c->fd, buf, len, MSG_DONTWAIT);
    size_t got = geoShmRingRead(&c->rx, buf, len);
    if (got == (size_t)-1) {
        errno = EPROTO; /* its counters make no sense */
        return -1;
    }
    if (got > 0) {
        c->kick = 1;
        return (ssize_t)got;
    }
    if (c->closed) /* it wrote everything it ever will before it closed */
        return 0;
    errno = EAGAIN;
    return -1;
}

/* After a pass that moved ring bytes: one byte on the socket wakes the
 * peer's progress thread, which then looks at both rings.  A full socket
 * means the peer has doorbells it has not read yet: nothing lost. */
static void conn_kick(tcpConn *c)
{
    if (!c->kick)
        return;
    c->kick = 0;
    ssize_t rc = send(c->fd, "", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)rc; /* a dead peer shows as EOF where we drain doorbells */
}

/* Push bytes on one connection.  Returns 1 if progress was made. */
static int progress_send(tcpState *st, int p, int s, double now)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    int moved = 0;

    for (;;) {
        geoNetRequest *r = cursor_req(peer, GEO_NET_SEND, s, &c->s_seq, &c->s_frame);
        if (r == NULL)
            return moved;
        size_t len = frame_len(r, c->s_frame);
        size_t flen = c->enc ? len + GEO_AEAD_TAG_BYTES : len; /* bytes after the header */
        char *payload = c->enc ? (char *)c->s_buf : r->buf + c->s_frame * GEO_TCP_FRAME;
        if (!c->s_active) {
            c->s_hdr.magic = GEO_FRAME_MAGIC;
            c->s_hdr.len = (uint32_t)len;
            c->s_hdr.seq = r->seq;
            c->s_hdr.offset = (uint64_t)c->s_frame * GEO_TCP_FRAME;
            c->s_hdr.total = r->size;
            c->s_hdr.check = hdr_check(&c->s_hdr);
            c->s_off = 0;
            c->s_active = 1;
            if (c->enc && geoAeadSeal(&c->tx_aead, c->s_ctr++, &c->s_hdr, sizeof(c->s_hdr),
                                      r->buf + c->s_frame * GEO_TCP_FRAME, c->s_buf, len,
                                      c->s_buf + len) != 0) {
                peer_error(st, p, s, "could not be sent a frame: encryption failed (out of "
                           "memory?)");
                return moved;
            }
        }
        struct iovec iov[2];
        int n = 0;
        if (c->s_off < sizeof(tcpFrameHdr)) {
            iov[n].iov_base = (char *)&c->s_hdr + c->s_off;
            iov[n++].iov_len = sizeof(tcpFrameHdr) - c->s_off;
            iov[n].iov_base = payload;
            iov[n++].iov_len = flen;
        } else {
            size_t done = c->s_off - sizeof(tcpFrameHdr);
            iov[n].iov_base = payload + done;
            iov[n++].iov_len = flen - done;
        }
        ssize_t w = conn_sendv(c, iov, n);
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
        if (c->s_off < sizeof(tcpFrameHdr) + flen)
            return moved;
        c->s_active = 0;
        c->s_frame += frame_step(r);
        complete_frame(st, peer, GEO_NET_SEND, r);
    }
}

static int progress_recv(tcpState *st, int p, int s, double now)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    int moved = 0;

    for (;;) {
        geoNetRequest *r = cursor_req(peer, GEO_NET_RECV, s, &c->r_seq, &c->r_frame);
        if (r == NULL)
            return moved;
        size_t len = frame_len(r, c->r_frame);
        size_t flen = c->enc ? len + GEO_AEAD_TAG_BYTES : len;
        /* A sealed frame lands in the connection's buffer: the user's sees
         * only plaintext that passed its tag. */
        char *payload = c->enc ? (char *)c->r_buf : r->buf + c->r_frame * GEO_TCP_FRAME;
        if (!c->r_active) {
            c->r_off = 0;
            c->r_active = 1;
        }
        ssize_t got;
        if (c->r_off < sizeof(tcpFrameHdr)) {
            got = conn_recv(c, (char *)&c->r_hdr + c->r_off, sizeof(tcpFrameHdr) - c->r_off);
        } else {
            size_t done = c->r_off - sizeof(tcpFrameHdr);
            got = conn_recv(c, payload + done, flen - done);
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
                             "were expected%s", (unsigned long long)h->total, r->capacity,
                             c->enc ? " (or the header was altered on the way)" : "");
                    peer_error(st, p, s, why);
                    return moved;
                }
                r->size = h->total;
                r->nframes = h->total ? nframes_of(h->total) : 1;
                len = frame_len(r, c->r_frame);
                flen = c->enc ? len + GEO_AEAD_TAG_BYTES : len;
            }
            if (!hdr_ok || h->total != r->size ||
                h->offset != (uint64_t)c->r_frame * GEO_TCP_FRAME || h->len != len) {
                char why[256];
                snprintf(why, sizeof(why),
                         "sent a frame that does not match the posted receive (magic %#x seq "
                         "%llu offset %llu len %u; expected seq %llu offset %llu len %zu: "
                         "mismatched counts or a corrupt stream%s)",
                         h->magic, (unsigned long long)h->seq, (unsigned long long)h->offset,
                         h->len, (unsigned long long)r->seq,
                         (unsigned long long)c->r_frame * GEO_TCP_FRAME, len,
                         c->enc ? ", or the header was altered on the way" : "");
                peer_error(st, p, s, why);
                return moved;
            }
        }
        if (c->r_off < sizeof(tcpFrameHdr) + flen)
            continue;
        if (c->enc) {
            if (geoAeadOpen(&c->rx_aead, c->r_ctr, &c->r_hdr, sizeof(c->r_hdr), c->r_buf,
                            c->r_buf, len, c->r_buf + len) != 0) {
                char why[256];
                snprintf(why, sizeof(why), "sent a frame that fails authentication (frame "
                         "%llu of this connection, message %llu, offset %llu: altered on the "
                         "way, replayed, or not from that rank); none of it was used",
                         (unsigned long long)c->r_ctr, (unsigned long long)r->seq,
                         (unsigned long long)c->r_hdr.offset);
                peer_error(st, p, s, why);
                return moved;
            }
            c->r_ctr++;
            memcpy(r->buf + c->r_frame * GEO_TCP_FRAME, c->r_buf, len);
        }
        c->r_active = 0;
        c->r_frame += frame_step(r);
        complete_frame(st, peer, GEO_NET_RECV, r);
    }
}

/* Read the doorbells waiting on a ring connection's socket.  1 when the
 * peer has closed or reset it (c->closed is then set), else 0. */
static int ring_drain(tcpConn *c)
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

static void *progress_main(void *arg)
{
    tcpState *st = arg;
    geoNetCtx *ctx = st->ctx;
    int nfds_max = ctx->nranks * st->nstreams + 1;
    struct pollfd *pfd = calloc((size_t)nfds_max, sizeof(*pfd));
    int *map = calloc((size_t)nfds_max, sizeof(int));

    geoDebugSetRank(ctx->rank);
    if (pfd == NULL || map == NULL) {
        pthread_mutex_lock(&st->lock);
        geoErrSet(ctx->err, "out of memory in progress thread");
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
        for (int p = 0; p < ctx->nranks; p++) {
            if (p == ctx->rank || st->broken)
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
                if (c->ring) {
                    /* Waits for ring space or data end at the peer's
                     * doorbell; the socket also tells of its death. */
                    conn_kick(c);
                    if (c->closed)
                        continue;
                    pfd[n] = (struct pollfd){.fd = c->fd, .events = POLLIN | POLLRDHUP};
                    map[n++] = p * st->nstreams + s;
                    continue;
                }
                short ev = c->closed ? 0 : POLLRDHUP;
                uint64_t sq = c->s_seq, rq = c->r_seq;
                size_t sf = c->s_frame, rf = c->r_frame;
                if (!c->closed && cursor_req(&st->peers[p], GEO_NET_SEND, s, &sq, &sf))
                    ev |= POLLOUT;
                if (cursor_req(&st->peers[p], GEO_NET_RECV, s, &rq, &rf))
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
            geoErrSet(ctx->err, "poll failed in progress thread: %s", strerror(errno));
            break_locked(st, ncclSystemError);
            continue;
        }
        if (pfd[n].revents & POLLIN) {
            uint64_t v;
            ssize_t r = read(st->wake_fd, &v, sizeof(v));
            (void)r;
        }
        for (int i = 0; i < n && rc > 0; i++) {
            int p = map[i] / st->nstreams, s = map[i] % st->nstreams;
            tcpConn *c = &st->peers[p].conns[s];
            if (c->ring) {
                if (pfd[i].revents == 0 || !ring_drain(c))
                    continue;
            } else if (!(pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) ||
                       (pfd[i].revents & POLLIN && pfd[i].events & POLLIN)) {
                continue;
            }
            /* Hang-up on a connection with no receive posted: remember it;
             * an operation that needs this peer fails when it is posted.
             * (A ring connection's receive fails once its ring is empty,
             * see conn_recv.) */
            if (c->closed && !c->ring)
                continue;
            uint64_t sq = c->s_seq;
            size_t sf = c->s_frame;
            /* A peer that closes a ring connection with our doorbells
             * unread resets it (POLLERR, ECONNRESET): still a plain close;
             * what it wrote stays readable in the ring. */
            if (cursor_req(&st->peers[p], GEO_NET_SEND, s, &sq, &sf) ||
                (!c->ring && (pfd[i].revents & POLLERR))) {
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

/* HMAC(secret, label | comm_hash | from | to | stream | encrypt | cipher |
 * Ca | Cc | connector's X25519 key | acceptor's): the connector's proof
 * (label "geoccl/v2/hello", cipher its preference, no acceptor key yet)
 * and the acceptor's (label "geoccl/v2/accept", cipher its choice).  The
 * ephemeral keys are bound, so a relay cannot put its own in. */
static void hello_mac(const geoNetCtx *ctx, const char *label, const uint8_t *challenge,
                      const tcpHello *m, int32_t cipher, const uint8_t *apub,
                      uint8_t out[GEO_SHA256_BYTES])
{
    uint8_t msg[24 + 8 + 20 + 2 * GEO_CHALLENGE_BYTES + 2 * GEO_X25519_BYTES];
    int32_t f[5] = {m->rank, m->to, m->stream, m->encrypt, cipher};
    size_t l = strlen(label);
    memset(msg, 0, 24);
    memcpy(msg, label, l < 24 ? l : 24);
    memcpy(msg + 24, &ctx->comm_hash, 8);
    memcpy(msg + 32, f, sizeof(f));
    memcpy(msg + 52, challenge, GEO_CHALLENGE_BYTES);
    memcpy(msg + 52 + GEO_CHALLENGE_BYTES, m->nonce, GEO_CHALLENGE_BYTES);
    memcpy(msg + 52 + 2 * GEO_CHALLENGE_BYTES, m->pub, GEO_X25519_BYTES);
    if (apub != NULL)
        memcpy(msg + 52 + 2 * GEO_CHALLENGE_BYTES + GEO_X25519_BYTES, apub, GEO_X25519_BYTES);
    else
        memset(msg + 52 + 2 * GEO_CHALLENGE_BYTES + GEO_X25519_BYTES, 0, GEO_X25519_BYTES);
    geoHmacSha256(ctx->secret, GEO_SHA256_BYTES, msg, sizeof(msg), out);
}

/* The keys of an encrypted connection, one per direction: HKDF of the
 * secret and the ephemeral X25519 secret dh of the two ends (forward
 * secrecy: once the key pairs are gone, the communicator's secret alone
 * cannot open recorded traffic), salted with both ends' fresh nonces;
 * connector is this end's role.  0 or -1 (nothing left allocated). */
static int conn_keys(const geoNetCtx *ctx, tcpConn *c, const uint8_t *challenge,
                     const tcpHello *m, int cipher, int connector,
                     const uint8_t dh[GEO_X25519_BYTES])
{
    uint8_t salt[2 * GEO_CHALLENGE_BYTES], info[24 + 8 + 20], key[2][GEO_AEAD_KEY_BYTES];
    uint8_t ikm[GEO_SHA256_BYTES + GEO_X25519_BYTES];
    int rc = 0;
    memcpy(ikm, ctx->secret, GEO_SHA256_BYTES);
    memcpy(ikm + GEO_SHA256_BYTES, dh, GEO_X25519_BYTES);
    memcpy(salt, challenge, GEO_CHALLENGE_BYTES);
    memcpy(salt + GEO_CHALLENGE_BYTES, m->nonce, GEO_CHALLENGE_BYTES);
    memset(info, 0, 24);
    memcpy(info, "geoccl/v2/frames", 16);
    memcpy(info + 24, &ctx->comm_hash, 8);
    for (int32_t dir = 0; dir < 2 && rc == 0; dir++) { /* 0: connector to acceptor */
        int32_t f[5] = {m->rank, m->to, m->stream, cipher, dir};
        memcpy(info + 32, f, sizeof(f));
        rc = geoHkdf(ikm, sizeof(ikm), salt, sizeof(salt), info, sizeof(info), key[dir],
                     GEO_AEAD_KEY_BYTES);
    }
    c->s_buf = rc == 0 ? malloc(GEO_TCP_FRAME + GEO_AEAD_TAG_BYTES) : NULL;
    c->r_buf = c->s_buf ? malloc(GEO_TCP_FRAME + GEO_AEAD_TAG_BYTES) : NULL;
    if (c->r_buf == NULL || geoAeadInit(&c->tx_aead, cipher, key[connector ? 0 : 1], 1) != 0 ||
        geoAeadInit(&c->rx_aead, cipher, key[connector ? 1 : 0], 0) != 0) {
        geoAeadFree(&c->tx_aead);
        free(c->s_buf);
        free(c->r_buf);
        c->s_buf = c->r_buf = NULL;
        rc = -1;
    }
    geoWipe(key, sizeof(key));
    geoWipe(ikm, sizeof(ikm));
    c->enc = rc == 0;
    c->s_ctr = c->r_ctr = 0;
    return rc;
}

static void conn_keys_free(tcpConn *c)
{
    if (!c->enc)
        return;
    geoAeadFree(&c->tx_aead);
    geoAeadFree(&c->rx_aead);
    /* the last frames' plaintext */
    geoWipe(c->s_buf, GEO_TCP_FRAME + GEO_AEAD_TAG_BYTES);
    geoWipe(c->r_buf, GEO_TCP_FRAME + GEO_AEAD_TAG_BYTES);
    free(c->s_buf);
    free(c->r_buf);
    c->s_buf = c->r_buf = NULL;
    c->enc = 0;
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

    GEO_RETURN_IF(st == NULL, ncclSystemError, "out of memory");
    st->ctx = ctx;
    st->listen_fd = -1;
    st->local_fd = -1;
    st->wake_fd = -1;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->cv, NULL);
    GEO_CHECK_GOTO(geoSocketListen(&addr->addr, &st->listen_fd, &bound), res, fail);
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
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cv);
    free(st);
    return res;
}

/* Set-up runs in the calling thread as one poll() loop that drives every
 * handshake at once, in both directions: the connections this rank opens
 * (all started together) and those it accepts (each accepted at once and
 * given its own deadline).  Over a WAN init then costs a few round trips,
 * not a few per connection, and a stranger that never answers holds only
 * its own slot until its deadline, never a legitimate peer. */

#define GEO_TCP_HANDSHAKE_S 5.0  /* an accepted connection proves itself by then */
/* Unproven accepted connections are all served at once, so that idle
 * strangers cannot make a peer wait its turn in the backlog; a stranger
 * costs one descriptor until its deadline.  Beyond these bounds (all
 * sources; one source address) an unproven one chosen at random is dropped
 * to make room; a peer dropped so dials again until the deadline.  At most
 * GEO_TCP_ACCEPTS_PER_PASS are taken per pass of the loop, so that a flood
 * cannot keep it from driving the handshakes already under way. */
#define GEO_TCP_MAX_PENDING 1024
#define GEO_TCP_MAX_PENDING_PER_SOURCE 256
#define GEO_TCP_ACCEPTS_PER_PASS 64

enum {
    HS_RETRY,     /* out: waiting to connect (again): refused or unreachable */
    HS_CONNECT,   /* out: TCP connect in flight */
    HS_CHALLENGE, /* out: receiving the challenge; in: sending it */
    HS_HELLO,     /* out: sending our hello; in: receiving the peer's */
    HS_ACK,       /* out: receiving the ack; in: sending it (slot claimed) */
    HS_DONE,      /* the connection is in peers[peer].conns[stream] */
    HS_DROPPED    /* in: logged and closed */
};

typedef struct {
    int fd;
    int out;        /* 1: we connect to (peer, stream); 0: we accepted */
    int local;      /* out: over the peer's same-host socket; in: accepted there */
    int state;
    int peer;       /* in: -1 until a valid hello names it */
    int stream;
    double when;    /* out in HS_RETRY: next attempt; in: handshake deadline */
    double backoff; /* out: wait before the next attempt */
    int err;        /* out: errno of the last failed attempt */
    int drops;      /* out: times the peer closed it before proving itself */
    size_t off;     /* bytes of the current message moved */
    uint8_t challenge[GEO_CHALLENGE_BYTES];
    tcpHello hello;
    tcpAccept ack;
    void *eph;      /* out, encrypted: our ephemeral X25519 key until the ack */
    char from[GEO_ADDR_STRLEN]; /* in: the address it came from */
    geoSockAddr src;            /* in: the same, for per-source limits (local: zeroed) */
} tcpHs;

static short hs_events(const tcpHs *h)
{
    switch (h->state) {
    case HS_CONNECT:
        return POLLOUT;
    case HS_CHALLENGE:
    case HS_ACK:
        return h->out ? POLLIN : POLLOUT;
    case HS_HELLO:
        return h->out ? POLLOUT : POLLIN;
    default:
        return 0;
    }
}

/* The peer's same-host socket cannot be opened from here (another mount
 * namespace, a private /dev/shm): it is not the same host for us, so this
 * stream goes over TCP, at once. */
static void local_fallback(tcpHs *h)
{
    geoInfo(GEO_LOG_NET, "rank %d, stream %d: its same-host socket cannot be opened from here "
            "(%s); using TCP", h->peer, h->stream, strerror(h->err));
    h->local = 0;
    h->err = 0;
}

/* Advance an outgoing handshake as far as it goes without blocking.
 * 1: done; 0: waiting (on its socket, or until h->when); -1: failed, the
 * communicator's error says how. */
static int hs_out_step(tcpState *st, tcpHs *h, double now, double deadline)
{
    geoNetCtx *ctx = st->ctx;
    char pa[GEO_ADDR_STRLEN];
    const char *why = NULL;
    int rc;

    for (;;) {
        switch (h->state) {
        case HS_RETRY:
            if (now < h->when)
                return 0;
            rc = h->local ? geoLocalConnectStart(ctx->peers[h->peer].local.path, &h->fd)
                          : geoSocketConnectStart(&ctx->peers[h->peer].addr, &h->fd);
            if (rc != 0) {
                h->err = errno;
                if (h->local && h->err != EAGAIN) {
                    local_fallback(h);
                    continue;
                }
                goto connect_failed;
            }
            h->state = HS_CONNECT;
            return 0; /* completion shows as POLLOUT */
        case HS_CONNECT:
            h->err = geoSocketConnectResult(h->fd);
            if (h->err != 0) {
                close(h->fd);
                h->fd = -1;
                if (h->local && h->err != EAGAIN) {
                    h->state = HS_RETRY;
                    local_fallback(h);
                    continue;
                }
                goto connect_failed;
            }
            h->state = HS_CHALLENGE;
            h->off = 0;
            continue;
        case HS_CHALLENGE:
            rc = geoSocketStep(h->fd, h->challenge, sizeof(h->challenge), &h->off, 0, &why);
            if (rc <= 0)
                goto wait_or_refused;
            memset(&h->hello, 0, sizeof(h->hello));
            h->hello.magic = GEO_HELLO_MAGIC;
            h->hello.rank = ctx->rank;
            h->hello.to = h->peer;
            h->hello.stream = h->stream;
            h->hello.encrypt = ctx->encrypt != NULL && ctx->encrypt[h->peer];
            h->hello.cipher = ctx->cipher;
            if (geoRandomBytes(h->hello.nonce, sizeof(h->hello.nonce)) != 0) {
                why = "no randomness for our nonce";
                goto refused;
            }
            geoX25519Free(h->eph);
            h->eph = NULL;
            if (h->hello.encrypt && geoX25519New(&h->eph, h->hello.pub) != 0) {
                why = "cannot make an X25519 key (out of memory?)";
                goto refused;
            }
            hello_mac(ctx, "geoccl/v2/hello", h->challenge, &h->hello, h->hello.cipher, NULL,
                      h->hello.proof);
            h->state = HS_HELLO;
            h->off = 0;
            continue;
        case HS_HELLO:
            rc = geoSocketStep(h->fd, &h->hello, sizeof(h->hello), &h->off, 1, &why);
            if (rc <= 0)
                goto wait_or_refused;
            h->state = HS_ACK;
            h->off = 0;
            continue;
        case HS_ACK:
            rc = geoSocketStep(h->fd, &h->ack, sizeof(h->ack), &h->off, 0, &why);
            if (rc <= 0)
                goto wait_or_refused;
            {
                uint8_t expect[GEO_SHA256_BYTES];
                int want_cipher = h->hello.encrypt ? h->ack.cipher : GEO_CIPHER_NONE;
                hello_mac(ctx, "geoccl/v2/accept", h->challenge, &h->hello, h->ack.cipher,
                          h->ack.pub, expect);
                if (h->ack.magic != GEO_ACCEPT_MAGIC ||
                    !geoDigestEqual(expect, h->ack.proof, sizeof(expect))) {
                    why = "it did not prove the communicator's secret: another program on "
                          "its address, or the connection was altered";
                    goto refused;
                }
                if (h->hello.encrypt && want_cipher != GEO_CIPHER_AES256GCM &&
                    want_cipher != GEO_CIPHER_CHACHA20POLY1305) {
                    why = "it chose no cipher for an encrypted connection";
                    goto refused;
                }
                tcpConn *c = &st->peers[h->peer].conns[h->stream];
                uint8_t dh[GEO_X25519_BYTES];
                int bad = h->hello.encrypt &&
                          (geoX25519Shared(h->eph, h->ack.pub, dh) != 0 ||
                           conn_keys(ctx, c, h->challenge, &h->hello, want_cipher, 1, dh) != 0);
                geoWipe(dh, sizeof(dh));
                geoX25519Free(h->eph);
                h->eph = NULL;
                if (bad) {
                    why = "cannot set up its encryption (a bad X25519 key, or out of memory)";
                    goto refused;
                }
                if (h->hello.encrypt)
                    ctx->cipher_used = ctx->cipher_used && ctx->cipher_used != want_cipher
                                           ? GEO_CIPHER_MIXED : want_cipher;
            }
            st->peers[h->peer].conns[h->stream].fd = h->fd;
            st->peers[h->peer].conns[h->stream].local = h->local;
            h->fd = -1;
            h->state = HS_DONE;
            return 1;
        default:
            return h->state == HS_DONE;
        }
    }
connect_failed:
    if (geoSocketRetryable(h->err) && now < deadline) {
        h->state = HS_RETRY;
        h->when = now + h->backoff;
        if (h->backoff < 0.1)
            h->backoff *= 2;
        return 0;
    }
    geoErrSet(ctx->err, "init: cannot connect to rank %d at %s (host %s), stream %d: %s",
                    h->peer, peer_str(st, h->peer, pa), ctx->peers[h->peer].host, h->stream,
                    strerror(h->err));
    return -1;
wait_or_refused:
    if (rc == 0)
        return 0;
    /* Closed or reset before the peer proved itself: it may have dropped
     * us among a flood of unproven connections (setup_connections makes
     * room by dropping some), so dial again, with a fresh nonce, until the
     * deadline.  Nothing of this connection was used. */
    close(h->fd);
    h->fd = -1;
    h->drops++;
    if (now < deadline) {
        h->state = HS_RETRY;
        h->when = now + h->backoff;
        if (h->backoff < 0.1)
            h->backoff *= 2;
        return 0;
    }
    geoErrSet(ctx->err, "init: rank %d at %s (host %s) closed our connection on stream %d "
                    "during the handshake %d times (%s): it refused our proof, or dropped us "
                    "among many unproven connections", h->peer, peer_str(st, h->peer, pa),
                    ctx->peers[h->peer].host, h->stream, h->drops, why);
    return -1;
refused:
    geoErrSet(ctx->err, "init: refused rank %d at %s (host %s) on stream %d: %s", h->peer,
                    peer_str(st, h->peer, pa), ctx->peers[h->peer].host, h->stream, why);
    return -1;
}

/* The first few drops are logged one by one, the rest only counted (a
 * scan or a flood must not bury the log) and summed up after set-up. */
#define GEO_TCP_DROP_LOG 8

static void hs_drop(tcpState *st, tcpHs *h, const char *why)
{
    if (st->dropped++ < GEO_TCP_DROP_LOG)
        geoWarn(GEO_LOG_NET, "dropped connection from %s: %s%s", h->from, why,
                st->dropped == GEO_TCP_DROP_LOG ? " (further drops are only counted)" : "");
    if (h->state == HS_ACK) { /* release the slot it claimed */
        st->peers[h->peer].conns[h->stream].fd = -1;
        st->peers[h->peer].conns[h->stream].local = 0;
        conn_keys_free(&st->peers[h->peer].conns[h->stream]);
    }
    close(h->fd);
    h->fd = -1;
    h->state = HS_DROPPED;
}

/* Advance an accepted handshake without blocking.  A stranger gets 16
 * random bytes and nothing else.  1: done; 0: waiting; -1: dropped
 * (logged and closed). */
static int hs_in_step(tcpState *st, tcpHs *h)
{
    geoNetCtx *ctx = st->ctx;
    uint8_t expect[GEO_SHA256_BYTES];
    const char *why = NULL;
    int rc;

    for (;;) {
        switch (h->state) {
        case HS_CHALLENGE:
            rc = geoSocketStep(h->fd, h->challenge, sizeof(h->challenge), &h->off, 1, &why);
            if (rc <= 0)
                goto wait_or_drop;
            h->state = HS_HELLO;
            h->off = 0;
            continue;
        case HS_HELLO: {
            const tcpHello *m = &h->hello;
            rc = geoSocketStep(h->fd, &h->hello, sizeof(h->hello), &h->off, 0, &why);
            if (rc <= 0)
                goto wait_or_drop;
            if (m->magic != GEO_HELLO_MAGIC || m->rank <= ctx->rank ||
                m->rank >= ctx->nranks || m->to != ctx->rank || m->stream < 0 ||
                m->stream >= st->nstreams || st->peers[m->rank].conns[m->stream].fd >= 0) {
                hs_drop(st, h, "not a valid hello for this communicator");
                return -1;
            }
            hello_mac(ctx, "geoccl/v2/hello", h->challenge, m, m->cipher, NULL, expect);
            if (!geoDigestEqual(expect, m->proof, sizeof(expect))) {
                char claim[96];
                snprintf(claim, sizeof(claim), "claiming rank %d: it does not hold the "
                         "communicator's secret", m->rank);
                hs_drop(st, h, claim);
                return -1;
            }
            int enc = ctx->encrypt != NULL && ctx->encrypt[m->rank];
            if (m->encrypt != enc) {
                char claim[128];
                snprintf(claim, sizeof(claim), "rank %d %s encrypt this connection, we %s: "
                         "the two ends disagree on the table", m->rank,
                         m->encrypt ? "would" : "would not", enc ? "would" : "would not");
                hs_drop(st, h, claim);
                return -1;
            }
            /* AES only where both ends have AES instructions (or asked
             * for it): ChaCha20 is the faster software cipher. */
            int cipher = !enc ? GEO_CIPHER_NONE
                         : m->cipher == GEO_CIPHER_AES256GCM && ctx->cipher == GEO_CIPHER_AES256GCM
                             ? GEO_CIPHER_AES256GCM
                             : GEO_CIPHER_CHACHA20POLY1305;
            /* Claim the slot now, so that a second connection claiming the
             * same rank and stream is refused while our ack is in flight. */
            h->peer = m->rank;
            h->stream = m->stream;
            tcpConn *c = &st->peers[h->peer].conns[h->stream];
            memset(&h->ack, 0, sizeof(h->ack));
            if (enc) {
                void *eph = NULL;
                uint8_t dh[GEO_X25519_BYTES];
                int bad = geoX25519New(&eph, h->ack.pub) != 0 ||
                          geoX25519Shared(eph, m->pub, dh) != 0 ||
                          conn_keys(ctx, c, h->challenge, m, cipher, 0, dh) != 0;
                geoX25519Free(eph);
                geoWipe(dh, sizeof(dh));
                if (bad) {
                    hs_drop(st, h, "cannot set up its encryption (a bad X25519 key, or out of "
                            "memory)");
                    return -1;
                }
            }
            if (enc)
                ctx->cipher_used = ctx->cipher_used && ctx->cipher_used != cipher
                                       ? GEO_CIPHER_MIXED : cipher;
            c->fd = h->fd;
            c->local = h->local;
            h->ack.magic = GEO_ACCEPT_MAGIC;
            h->ack.cipher = cipher;
            hello_mac(ctx, "geoccl/v2/accept", h->challenge, m, cipher, h->ack.pub,
                      h->ack.proof);
            h->state = HS_ACK;
            h->off = 0;
            continue;
        }
        case HS_ACK:
            rc = geoSocketStep(h->fd, &h->ack, sizeof(h->ack), &h->off, 1, &why);
            if (rc <= 0)
                goto wait_or_drop;
            h->fd = -1; /* now owned by peers[peer].conns[stream] */
            h->state = HS_DONE;
            return 1;
        default:
            return h->state == HS_DONE ? 1 : -1;
        }
    }
wait_or_drop:
    if (rc == 0)
        return 0;
    char text[128];
    snprintf(text, sizeof(text), "handshake failed (%s)", why);
    hs_drop(st, h, text);
    return -1;
}

static const char *hs_out_stage(const tcpHs *h, char buf[96])
{
    switch (h->state) {
    case HS_RETRY:
        snprintf(buf, 96, "connecting: %s", h->err ? strerror(h->err) : "not tried yet");
        return buf;
    case HS_CONNECT:
        return "no answer to the TCP connect";
    case HS_CHALLENGE:
        return "connected, but its challenge never came";
    case HS_HELLO:
        return "could not send our proof";
    default:
        return "our proof was never acknowledged";
    }
}

/* Name the first connection still missing after the deadline. */
static void setup_timeout_error(tcpState *st, const tcpHs *out, int nout, int out_done,
                                int in_done, int nin)
{
    geoNetCtx *ctx = st->ctx;
    char pa[GEO_ADDR_STRLEN], stage[96];

    for (int i = 0; i < nout; i++) {
        const tcpHs *h = &out[i];
        if (h->state == HS_DONE)
            continue;
        geoErrSet(ctx->err, "init: timed out after %.0f s connecting to rank %d at %s (host "
                        "%s), stream %d (%s); %d of %d outgoing and %d of %d incoming "
                        "connections were up", ctx->timeout, h->peer,
                        peer_str(st, h->peer, pa), ctx->peers[h->peer].host, h->stream,
                        hs_out_stage(h, stage), out_done, nout, in_done, nin);
        return;
    }
    for (int p = ctx->rank + 1; p < ctx->nranks; p++)
        for (int s = 0; s < st->nstreams; s++) {
            if (st->peers[p].conns[s].fd >= 0)
                continue;
            geoErrSet(ctx->err, "init: timed out after %.0f s waiting for rank %d at %s (host "
                            "%s) to connect stream %d; %d of %d incoming connections were up",
                            ctx->timeout, p, peer_str(st, p, pa), ctx->peers[p].host, s,
                            in_done, nin);
            return;
        }
    geoErrSet(ctx->err, "init: timed out after %.0f s acknowledging incoming connections; "
                    "%d of %d were up", ctx->timeout, in_done, nin);
}

/* Handshakes still unproven (waiting for a hello), from src or from all. */
static int count_pending(const tcpHs *pend, int npend, const geoSockAddr *src)
{
    int n = 0;
    for (int i = 0; i < npend; i++)
        n += pend[i].state < HS_ACK && (src == NULL || geoAddrSameHost(&pend[i].src, src));
    return n;
}

/* Drop an unproven handshake (from src, or any), chosen at random: a
 * flood cannot aim at the oldest, which may be a peer's, and a peer that is
 * dropped all the same dials again (hs_out_step).  0 if one was. */
static int evict_pending(tcpState *st, tcpHs *pend, int npend, const geoSockAddr *src,
                         const char *why)
{
    uint32_t r = 0;
    if (npend == 0)
        return -1;
    if (geoRandomBytes(&r, sizeof(r)) != 0)
        r = (uint32_t)npend / 2;
    for (int k = 0; k < npend; k++) {
        int i = (int)((r + (uint32_t)k) % (uint32_t)npend);
        if (pend[i].state < HS_ACK && (src == NULL || geoAddrSameHost(&pend[i].src, src))) {
            hs_drop(st, &pend[i], why);
            return 0;
        }
    }
    return -1;
}

/* Open every connection of this rank; bounded by ctx->timeout and the
 * abort flag. */
static ncclResult_t setup_connections(tcpState *st)
{
    geoNetCtx *ctx = st->ctx;
    int nout = ctx->rank * st->nstreams;
    int nin = (ctx->nranks - 1 - ctx->rank) * st->nstreams;
    int out_done = 0, in_done = 0, npend = 0, cap_pend = 0, cap_pfd = 0;
    double start = geoNow(), deadline = start + ctx->timeout;
    tcpHs *out = calloc((size_t)(nout > 0 ? nout : 1), sizeof(*out));
    tcpHs *pend = NULL;           /* accepted, not yet done */
    struct pollfd *pfd = NULL;
    int *map = NULL;              /* pfd index -> out index, or -1 - pend index */
    ncclResult_t res = ncclSuccess;

    if (out == NULL)
        goto oom;
    if (geoSocketSetNonBlocking(st->listen_fd, 1) != 0) { /* the local one already is */
        geoErrSet(ctx->err, "init: cannot make the listener non-blocking: %s",
                        strerror(errno));
        res = ncclSystemError;
        goto done;
    }
    for (int i = 0; i < nout; i++) {
        int p = i / st->nstreams;
        out[i] = (tcpHs){.fd = -1, .out = 1, .state = HS_RETRY, .peer = p,
                         .stream = i % st->nstreams, .when = start, .backoff = 1e-3,
                         .local = geoLocalSamePlace(&st->local, &ctx->peers[p].local)};
    }
    while (out_done < nout || in_done < nin) {
        double now = geoNow(), wake = deadline;
        int n = 0, listening[2] = {-1, -1}; /* pfd index: TCP, same-host listener */

        if (geoErrAborted(ctx->err)) {
            geoErrSet(ctx->err, "init: aborted while connecting to peers (%d of %d outgoing "
                            "and %d of %d incoming connections were up)", out_done, nout,
                            in_done, nin);
            res = ncclRemoteError;
            break;
        }
        if (now >= deadline) {
            setup_timeout_error(st, out, nout, out_done, in_done, nin);
            res = ncclRemoteError;
            break;
        }
        if (cap_pfd < nout + npend + 2) {
            cap_pfd = 2 * (nout + npend + 2);
            struct pollfd *np = realloc(pfd, sizeof(*pfd) * (size_t)cap_pfd);
            int *nm = np ? realloc(map, sizeof(*map) * (size_t)cap_pfd) : NULL;
            if (np)
                pfd = np;
            if (nm == NULL)
                goto oom;
            map = nm;
        }
        for (int i = 0; i < nout; i++) {
            tcpHs *h = &out[i];
            if (h->state == HS_RETRY) {
                int rc = hs_out_step(st, h, now, deadline);
                if (rc < 0) {
                    res = ncclRemoteError;
                    goto done;
                }
                if (h->state == HS_RETRY && h->when < wake)
                    wake = h->when;
            }
            if (h->fd >= 0 && h->state != HS_DONE) {
                pfd[n] = (struct pollfd){.fd = h->fd, .events = hs_events(h)};
                map[n++] = i;
            }
        }
        for (int i = 0; i < npend; i++) {
            pfd[n] = (struct pollfd){.fd = pend[i].fd, .events = hs_events(&pend[i])};
            map[n++] = -1 - i;
            if (pend[i].when < wake)
                wake = pend[i].when;
        }
        if (in_done < nin) {
            pfd[n] = (struct pollfd){.fd = st->listen_fd, .events = POLLIN};
            listening[0] = n++;
            if (st->local_fd >= 0) {
                pfd[n] = (struct pollfd){.fd = st->local_fd, .events = POLLIN};
                listening[1] = n++;
            }
        }
        double left_ms = (wake - now) * 1000.0;
        int ms = left_ms <= 0 ? 0 : left_ms >= 100 ? 100 : (int)left_ms + 1;
        int rc = poll(pfd, (nfds_t)n, ms);
        if (rc < 0 && errno != EINTR) {
            geoErrSet(ctx->err, "init: poll failed while connecting to peers: %s",
                            strerror(errno));
            res = ncclSystemError;
            break;
        }
        now = geoNow();
        for (int k = 0; k < n && rc > 0; k++) {
            if (pfd[k].revents == 0 || k == listening[0] || k == listening[1])
                continue;
            if (map[k] >= 0) {
                int r = hs_out_step(st, &out[map[k]], now, deadline);
                if (r < 0) {
                    res = ncclRemoteError;
                    goto done;
                }
                out_done += r;
            } else {
                in_done += hs_in_step(st, &pend[-1 - map[k]]) > 0;
            }
        }
        for (int i = 0; i < npend; i++)
            if (pend[i].state < HS_DONE && now >= pend[i].when)
                hs_drop(st, &pend[i], "handshake failed (timed out)");
        for (int l = 0; l < 2; l++) {
            for (int taken = 0; listening[l] >= 0 && (pfd[listening[l]].revents & POLLIN) &&
                                taken < GEO_TCP_ACCEPTS_PER_PASS; taken++) {
                tcpHs h = {.out = 0, .state = HS_CHALLENGE, .peer = -1, .stream = -1, .local = l};
                geoSockAddr from; /* an AF_UNIX peer's address is truncated to fit: unused */
                int got = geoSocketAcceptNB(l ? st->local_fd : st->listen_fd, &h.fd, &from);
                if (got < 0 && (errno == EMFILE || errno == ENFILE) &&
                    evict_pending(st, pend, npend, NULL, "dropped to make room (out of file "
                                  "descriptors)") == 0)
                    continue;
                if (got < 0) {
                    geoErrSet(ctx->err, "init: accept on %s failed: %s",
                                    l ? st->local.path : peer_str(st, ctx->rank, h.from),
                                    strerror(errno));
                    res = ncclSystemError;
                    goto done;
                }
                if (got == 0)
                    break;
                memset(&h.src, 0, sizeof(h.src));
                if (l) {
                    snprintf(h.from, sizeof(h.from), "the same-host socket");
                } else {
                    geoAddrToString(&from, h.from);
                    h.src = from;
                }
                if (count_pending(pend, npend, &h.src) >= GEO_TCP_MAX_PENDING_PER_SOURCE)
                    evict_pending(st, pend, npend, &h.src, "dropped to make room for newer "
                                  "connections from the same address");
                if (count_pending(pend, npend, NULL) >= GEO_TCP_MAX_PENDING)
                    evict_pending(st, pend, npend, NULL, "dropped to make room for newer "
                                  "connections");
                if (geoRandomBytes(h.challenge, sizeof(h.challenge)) != 0) {
                    geoWarn(GEO_LOG_NET, "dropped connection from %s: no randomness for its "
                            "challenge", h.from);
                    close(h.fd);
                    continue;
                }
                h.when = now + GEO_TCP_HANDSHAKE_S < deadline ? now + GEO_TCP_HANDSHAKE_S
                                                              : deadline;
                if (npend == cap_pend) {
                    tcpHs *np = realloc(pend, sizeof(*pend) * (size_t)(cap_pend * 2 + 16));
                    if (np == NULL) {
                        close(h.fd);
                        goto oom;
                    }
                    pend = np;
                    cap_pend = cap_pend * 2 + 16;
                }
                pend[npend] = h;
                in_done += hs_in_step(st, &pend[npend]) > 0;
                npend++;
            }
        }
        /* Forget the finished and the dropped. */
        int keep = 0;
        for (int i = 0; i < npend; i++)
            if (pend[i].state < HS_DONE)
                pend[keep++] = pend[i];
        npend = keep;
    }
done:
    /* Connections still in a handshake once every peer is connected are
     * strangers (every legitimate slot is taken). */
    for (int i = 0; i < npend; i++) {
        if (res == ncclSuccess)
            hs_drop(st, &pend[i], "handshake unfinished when every peer was connected");
        else if (pend[i].state != HS_ACK) /* an HS_ACK fd is in conns: destroy closes it */
            close(pend[i].fd);
    }
    for (int i = 0; out != NULL && i < nout; i++) {
        if (out[i].fd >= 0)
            close(out[i].fd);
        geoX25519Free(out[i].eph);
    }
    if (st->dropped > GEO_TCP_DROP_LOG)
        geoWarn(GEO_LOG_NET, "dropped %d connections in all before they proved the "
                "communicator's secret (timed out, refused or dropped for room; %d logged "
                "above)", st->dropped, GEO_TCP_DROP_LOG);
    if (res == ncclSuccess)
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "opened %d and accepted %d connections in %.3f s",
                nout, nin, geoNow() - start);
    free(out);
    free(pend);
    free(pfd);
    free(map);
    return res;
oom:
    geoErrSet(ctx->err, "init: out of memory while connecting to peers");
    res = ncclSystemError;
    goto done;
}

/* ---- shared-memory rings on same-host connections --------------------- */

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

static ncclResult_t setup_rings(tcpState *st)
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
        geoErrSet(ctx->err, "init: out of memory setting up shared-memory rings");
        res = ncclSystemError;
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
                geoShmSegmentUnmap(seg, ring_capacity(st->nstreams));
                geoErrSet(ctx->err, "init: cannot send to rank %d at %s (host %s) on its "
                                "same-host socket, stream %d: %s", p, peer_str(st, p, pa),
                                ctx->peers[p].host, s, strerror(errno));
                res = ncclRemoteError;
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
            geoErrSet(ctx->err, "init: %s while waiting for rank %d at %s (host %s) to "
                            "agree on shared-memory rings (stream %d)",
                            geoErrAborted(ctx->err) ? "aborted" : "timed out", p, peer_str(st, p, pa),
                            ctx->peers[p].host, i % st->nstreams);
            res = ncclRemoteError;
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
            geoErrSet(ctx->err, "init: poll failed setting up shared-memory rings: %s",
                            strerror(errno));
            res = ncclSystemError;
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
                geoErrSet(ctx->err, "init: rank %d at %s (host %s) %s on its same-host "
                                "socket (stream %d) before agreeing on shared-memory rings",
                                p, peer_str(st, p, pa), ctx->peers[p].host,
                                errno ? strerror(errno) : "closed the connection", s);
                if (fd >= 0)
                    close(fd);
                res = ncclRemoteError;
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
                geoShmSegmentUnmap(seg, cap);
                geoErrSet(ctx->err, "init: cannot answer rank %d at %s (host %s) on its "
                                "same-host socket, stream %d: %s", p, peer_str(st, p, pa),
                                ctx->peers[p].host, s, strerror(errno));
                res = ncclRemoteError;
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

static ncclResult_t tcp_connect(geoNetCtx *ctx, void *state)
{
    tcpState *st = state;
    ncclResult_t res;

    st->nstreams = ctx->nstreams;
    st->peers = calloc((size_t)ctx->nranks, sizeof(tcpPeer));
    GEO_RETURN_IF(st->peers == NULL, ncclSystemError, "out of memory");
    for (int p = 0; p < ctx->nranks; p++) {
        st->peers[p].conns = calloc((size_t)st->nstreams, sizeof(tcpConn));
        st->peers[p].active = st->nstreams;
        GEO_RETURN_IF(st->peers[p].conns == NULL, ncclSystemError, "out of memory");
        for (int s = 0; s < st->nstreams; s++) {
            st->peers[p].conns[s].fd = -1;
            st->peers[p].conns[s].s_frame = GEO_FRAME_UNSET;
            st->peers[p].conns[s].r_frame = GEO_FRAME_UNSET;
        }
    }
    res = setup_connections(st);
    close(st->listen_fd);
    st->listen_fd = -1;
    /* Every peer that will ever connect has: the socket file need not
     * outlive init (nor be left behind by a crash later). */
    if (st->local_fd >= 0)
        close(st->local_fd);
    st->local_fd = -1;
    geoLocalUnlink(&st->local);
    if (res != ncclSuccess)
        return res;

    int local_peers = 0, mixed = 0;
    for (int p = 0; p < ctx->nranks; p++) {
        int nlocal = 0;
        for (int s = 0; s < st->nstreams && p != ctx->rank; s++) {
            tcpConn *c = &st->peers[p].conns[s];
            nlocal += c->local;
            if (!c->local)
                geoSocketTune(c->fd);
            else
                setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &(int){GEO_LOCAL_SNDBUF}, sizeof(int));
            geoSocketSetNonBlocking(c->fd, 1);
        }
        local_peers += nlocal == st->nstreams;
        mixed += nlocal > 0 && nlocal < st->nstreams;
    }
    ctx->local_peers = local_peers;
    res = setup_rings(st);
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
    st->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (st->wake_fd < 0) {
        geoErrSet(ctx->err, "init: eventfd failed: %s", strerror(errno));
        return ncclSystemError;
    }
    if (pthread_create(&st->thread, NULL, progress_main, st) != 0) {
        geoErrSet(ctx->err, "init: cannot start the progress thread: %s", strerror(errno));
        return ncclSystemError;
    }
    st->thread_live = 1;
    geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "connected to %d peers, %d streams each; same-host "
            "fast path to %d of them (%d through shared-memory rings, %d AF_UNIX only)%s%s",
            ctx->nranks - 1, st->nstreams, local_peers, ring_peers, local_peers - ring_peers,
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
        geoErrSet(ctx->err, "%s: rank %d (%s, host %s) has closed its connections", geoErrOp(ctx->err),
                        req->peer, peer_str(st, req->peer, pa), ctx->peers[req->peer].host);
        break_locked(st, ncclRemoteError);
        res = ncclRemoteError;
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
        wake(st);
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
                geoErrSet(ctx->err, "%s: communicator aborted", geoErrOp(ctx->err));
            break_locked(st, ncclRemoteError);
            break;
        }
        double idle = geoNow() - req->last_progress;
        if (idle > ctx->timeout) {
            char pa[GEO_ADDR_STRLEN];
            geoErrSet(ctx->err,
                            "%s: timed out after %.0f s without progress %s rank %d (%s, host "
                            "%s); %zu of %zu frames done",
                            geoErrOp(ctx->err), idle, req->dir == GEO_NET_SEND ? "sending to"
                                                                          : "receiving from",
                            req->peer, peer_str(st, req->peer, pa), ctx->peers[req->peer].host,
                            req->frames_done, req->nframes);
            geoWarn(GEO_LOG_NET, "%s", geoErrLast(ctx->err));
            break_locked(st, ncclRemoteError);
            break;
        }
    }
    res = req->result;
    pthread_mutex_unlock(&st->lock);
    return res;
}

/* The pair's mailbox: stream 0's segment, when that connection is a ring
 * (both ends agree on that in the handshake). */
static int tcp_has_mailbox(void *state, int peer)
{
    tcpState *st = state;
    return st->peers != NULL && peer >= 0 && peer < st->ctx->nranks &&
           peer != st->ctx->rank && st->peers[peer].conns != NULL &&
           st->peers[peer].conns[0].ring;
}

_Static_assert(GEO_NET_MAIL_BYTES == GEO_SHM_MAIL_BYTES, "one mailbox size");

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

static int tcp_link_stats(void *state, int peer, geoLinkStats *out)
{
    tcpState *st = state;
    memset(out, 0, sizeof(*out));
    if (st->peers == NULL || peer < 0 || peer >= st->ctx->nranks || peer == st->ctx->rank ||
        st->peers[peer].conns == NULL)
        return -1;
    for (int s = 0; s < st->nstreams; s++) {
        tcpConn *c = &st->peers[peer].conns[s];
        if (c->fd >= 0 && !c->local)
            geoTcpInfoAdd(c->fd, out);
    }
    return out->conns > 0 ? 0 : -1;
}

static ncclResult_t tcp_mail(void *state, int peer, void *buf, size_t len, int send)
{
    tcpState *st = state;
    geoNetCtx *ctx = st->ctx;
    char pa[GEO_ADDR_STRLEN];
    tcpConn *c = &st->peers[peer].conns[0];
    /* the connector's puts go through mailbox 0, the acceptor's through 1 */
    geoShmMailbox *b = geoShmSegmentMailbox(c->seg, (send != 0) == c->connector ? 0 : 1);
    const double start = geoNow();
    ncclResult_t res = ncclSuccess;

    if (len > GEO_SHM_MAIL_BYTES) {
        geoErrSet(ctx->err, "%s: a %zu-byte signal does not fit a mailbox", geoErrOp(ctx->err), len);
        return ncclInternalError;
    }
    for (;;) {
        int r = send ? geoShmMailPut(b, buf, len) : geoShmMailTake(b, buf, len);
        if (r > 0)
            return ncclSuccess;
        pthread_mutex_lock(&st->lock);
        if (st->broken) {
            res = st->broken_res;
        } else if (r < 0) {
            geoErrSet(ctx->err, "%s: malformed signal from rank %d (%s, host %s)",
                            geoErrOp(ctx->err), peer, peer_str(st, peer, pa), ctx->peers[peer].host);
            res = ncclRemoteError;
        } else if (geoErrAborted(ctx->err)) {
            geoErrSet(ctx->err, "%s: communicator aborted", geoErrOp(ctx->err));
            res = ncclRemoteError;
        } else if (c->closed) {
            geoErrSet(ctx->err, "%s: rank %d (%s, host %s) has closed its connections",
                            geoErrOp(ctx->err), peer, peer_str(st, peer, pa), ctx->peers[peer].host);
            res = ncclRemoteError;
        } else if (geoNow() - start > ctx->timeout) {
            geoErrSet(ctx->err, "%s: timed out after %.0f s %s rank %d (%s, host %s)",
                            geoErrOp(ctx->err), geoNow() - start,
                            send ? "signalling" : "waiting for a signal from", peer,
                            peer_str(st, peer, pa), ctx->peers[peer].host);
            res = ncclRemoteError;
        }
        if (res != ncclSuccess) {
            if (!st->broken) {
                geoWarn(GEO_LOG_NET, "%s", geoErrLast(ctx->err));
                break_locked(st, res);
            }
            pthread_mutex_unlock(&st->lock);
            wake(st);
            return res;
        }
        pthread_mutex_unlock(&st->lock);
        geoShmMailWait(b, send, 20);
    }
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
        for (int p = 0; p < st->ctx->nranks; p++) {
            if (st->peers[p].conns == NULL)
                continue;
            for (int s = 0; s < st->nstreams; s++) {
                if (st->peers[p].conns[s].fd >= 0)
                    close(st->peers[p].conns[s].fd);
                if (st->peers[p].conns[s].ring)
                    geoShmSegmentUnmap(st->peers[p].conns[s].seg, st->peers[p].conns[s].seg_cap);
                conn_keys_free(&st->peers[p].conns[s]);
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
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cv);
    free(st);
}

static void tcp_limit_queued(void *state, int bytes)
{
    tcpState *st = state;
    /* 0 on a socket means the system's net.ipv4.tcp_notsent_lowat (no
     * limit unless set there), which is what "back to the default" is. */
    unsigned v = bytes > 0 ? (unsigned)bytes : 0;
    for (int p = 0; p < st->ctx->nranks; p++)
        for (int s = 0; st->peers && p != st->ctx->rank && s < st->nstreams; s++)
            if (st->peers[p].conns[s].fd >= 0 && !st->peers[p].conns[s].local)
                setsockopt(st->peers[p].conns[s].fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v,
                           sizeof(v));
}

static void tcp_set_streams(void *state, int peer, int n)
{
    tcpState *st = state;
    if (st->peers == NULL || peer < 0 || peer >= st->ctx->nranks)
        return;
    pthread_mutex_lock(&st->lock);
    st->peers[peer].active = n < 1 ? 1 : n > st->nstreams ? st->nstreams : n;
    pthread_mutex_unlock(&st->lock);
}

static int tcp_set_congestion(void *state, int peer, const char *cc)
{
    tcpState *st = state;
    int err = 0;
    if (st->peers == NULL || peer < 0 || peer >= st->ctx->nranks || peer == st->ctx->rank)
        return EINVAL;
    for (int s = 0; s < st->nstreams; s++) {
        tcpConn *c = &st->peers[peer].conns[s];
        if (c->fd >= 0 && !c->local &&
            setsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) != 0 &&
            err == 0)
            err = errno;
    }
    return err;
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
    .limitQueued = tcp_limit_queued,
    .setStreams = tcp_set_streams,
    .setCongestion = tcp_set_congestion,
    .hasMailbox = tcp_has_mailbox,
    .mail = tcp_mail,
    .peerPid = tcp_peer_pid,
    .linkStats = tcp_link_stats,
};
