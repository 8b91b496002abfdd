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
 * namespaces (the emulated regions of tools/geoccl-wan) always use TCP: their
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
 * used.  GEOCCL_SHM=2 keeps the sockets without rings; 0 is TCP only.
 *
 * Resume after a reset (TCP connections; a same-host socket shares the
 * peer's kernel and still fails hard).  NAT gateways, firewalls and route
 * changes reset connections that did nothing wrong; a dead peer closes
 * them (FIN) or refuses new ones.  Each TCP connection counts the data
 * frames it has sent whole and received whole, over all its incarnations.
 * The receiver tells its count to the sender in ack frames (a header with
 * magic GEOK, its count in seq, sealed like a frame when the connection is
 * encrypted), sent between two outgoing frames whenever it has received
 * more; so headers are read as soon as they arrive, and a data header
 * waits in tcpConn until its receive is posted, its payload in the kernel
 * as before.  The sender keeps every frame it has sent whole until an ack
 * covers it: a copy of its plaintext on a clear connection; on an
 * encrypted one the frame is sealed straight into the slot that keeps it
 * and sent from there, so keeping costs no copy (opened in place only when
 * the connection is lost, to be sealed again under the next keys; loopback,
 * 4 ranks, 64 MiB: the copy had cost 8-15% of the wall time), up to
 * GEOCCL_RESUME_BUFFER bytes per connection (beyond that it keeps none
 * until the receiver has caught up, and a reset in that window is an
 * error saying so).  Keeping the frame, not the user's buffer, keeps send
 * completion eager, as before: waiting for acks could deadlock two ranks
 * that send before they receive.
 *
 * On a reset (ECONNRESET, ECONNABORTED, EPIPE, ETIMEDOUT, unreachable),
 * the end that dialled at set-up dials again and both prove the secret in
 * the same handshake, with a resume flag and each end's received count
 * bound in both MACs (the listener stays open for the communicator's life
 * for this); a half-received frame is dropped, each end sends again what
 * the other has not received whole, re-sealed under the new connection's
 * keys, and the cursors go on: the result is the same bits as without the
 * reset.  The other end meanwhile probes the dialler's listener: refused
 * connects (ECONNREFUSED: no process there any more) for 0.5 s end the
 * wait, as refused dials do (one refusal may come from the path, not the
 * peer: after an emulated link came back up, a peer that was alive was once
 * taken for gone so);
 * otherwise the wait ends after
 * GEOCCL_RECONNECT_TIMEOUT.  A peer gone with nothing pending on the
 * connection counts as closed, like a FIN: an operation that needs it
 * fails when it is posted. */
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

#define GEO_TCP_FRAME GEO_NET_STRIPE_BYTES
#define GEO_FRAME_MAGIC 0x47454f46u /* "GEOF" */
#define GEO_HELLO_MAGIC 0x47454f32u /* "GEO2": the hello of this protocol */
#define GEO_ACCEPT_MAGIC 0x47454f41u /* "GEOA" */
#define GEO_ACK_MAGIC 0x47454f4bu /* "GEOK": data frames received whole */
/* Unproven resume handshakes served at once by the progress thread; more
 * evict one at random (a peer dropped so dials again). */
#define GEO_TCP_RESUME_PENDING 64
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
    int32_t resume;        /* 1: this replaces a connection that was reset */
    uint64_t count;        /* resume: data frames the connector has received whole */
    uint8_t nonce[GEO_CHALLENGE_BYTES];
    uint8_t pub[GEO_X25519_BYTES]; /* encrypted: the connector's ephemeral X25519 key */
    uint8_t proof[GEO_SHA256_BYTES];
} tcpHello;

typedef struct {
    uint32_t magic;
    int32_t cipher;        /* the acceptor's choice; GEO_CIPHER_NONE: clear */
    uint64_t count;        /* resume: data frames the acceptor has received whole */
    uint8_t pub[GEO_X25519_BYTES]; /* encrypted: the acceptor's ephemeral X25519 key */
    uint8_t proof[GEO_SHA256_BYTES];
} tcpAccept;

/* A frame sent whole, kept until the receiver's count covers it.  On an
 * encrypted connection the frame is sealed straight into its slot and sent
 * from there (no copy of the plaintext): it stays sealed under the
 * connection's key until the connection is lost, when it is opened in place
 * (kept_unseal) to be sealed again under the next incarnation's keys. */
typedef struct {
    tcpFrameHdr hdr;
    uint8_t *data;         /* GEO_TCP_FRAME + tag bytes, owned by the slot */
    int sealed;            /* data holds the frame sealed with counter ctr */
    uint64_t ctr;
} tcpKept;

enum { SEND_DATA, SEND_ACK, SEND_AGAIN }; /* what a connection's s_hdr is */

struct tcpHs;

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
    int acking;            /* set-up: we accepted it, our ack is still in flight */
    int enc;               /* frames are sealed (tx) and opened (rx) */
    geoAead tx_aead, rx_aead;
    geoAead tx_open;       /* our own key, to open frames kept sealed (resume) */
    uint64_t s_ctr, r_ctr; /* frames sealed and opened: the next nonce each way */
    uint8_t *s_buf, *r_buf; /* GEO_TCP_FRAME + tag: a sealed frame's payload */
    uint8_t *s_out;        /* where the half-sent frame was sealed: s_buf or a kept slot */
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
    int r_checked;         /* r_hdr (a data header) matched the posted receive */
    tcpFrameHdr r_hdr;
    /* resume (track: a TCP connection) */
    int track;
    int s_kind;            /* SEND_*: what the half-sent s_hdr is */
    int down;              /* reset: waiting for its next incarnation */
    double down_since;
    struct tcpHs *dial;    /* down, we dialled at set-up: the new handshake */
    int probe_fd;          /* down, the peer dials: a connect to its listener */
    double refused_since;  /* down: when its listener first refused us (0: it has not) */
    double probe_when;
    uint64_t s_count;      /* data frames sent whole (all incarnations) */
    uint64_t r_count;      /* data frames received whole */
    uint64_t a_sent;       /* the count last told the peer */
    uint64_t a_got;        /* the count the peer last told */
    uint64_t again;        /* next kept frame to send again (== s_count: none) */
    tcpKept *kept;         /* ring of k_cap slots, k_len from k_head: frames */
    size_t k_cap, k_head, k_len; /* k_base .. s_count - 1 */
    uint64_t k_base;
    size_t k_max;          /* slots allowed (GEOCCL_RESUME_BUFFER) */
    double bbr_since;      /* restartBbr: since when its BBR's 10 s window may run: its
                            * last restart or skipped one; 0: not known (a new
                            * connection, a change of congestion control) */
    int bbr_restarts;      /* restartBbr: restarts in a row, since one was skipped */
} tcpConn;

typedef struct {
    tcpConn *conns;                 /* nstreams */
    geoNetRequest *q[2];            /* pending, in seq order */
    uint64_t posted[2];             /* next seq to assign */
    int active;                     /* streams new messages use (setStreams) */
    int closed_by_peer;
    int gone;                       /* reset, and its process is gone */
    uint64_t reconnects, resent;    /* connections resumed, payload bytes sent again */
    char cc[16];                    /* congestion control set on it ("" none) */
    uint64_t pace;                  /* bytes/s over its network connections
                                     * (setPacing), 0: none */
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
    int uncounted;                  /* set-up: counted slots since replaced (hs_in_step) */
    /* after set-up: resume handshakes accepted on listen_fd */
    int running;
    struct tcpHs *rpend;
    int nrpend;
    double reconnect_s;             /* GEOCCL_RECONNECT_TIMEOUT */
    int lowat;                      /* limitQueued's value, for new connections */
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

static void pend_shut(tcpState *st);

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
    /* No resume is taken any more: a peer dialling again is refused at
     * once and knows we are gone. */
    if (st->running && st->listen_fd >= 0)
        shutdown(st->listen_fd, SHUT_RDWR);
    /* Handshakes half done on it end now, not at their deadline: whoever
     * dialled (a peer, or a survivor of ncclCommShrink trying our old port
     * for its new root) hears the close at once and moves on. */
    pend_shut(st);
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

/* ---- what resume keeps ---------------------------------------------- */

static void conn_fail(tcpState *st, int p, int s, int err, const char *what);

static tcpKept *kept_at(tcpConn *c, size_t i)
{
    return &c->kept[(c->k_head + i) % c->k_cap];
}

/* The slot the next kept frame goes to (growing the ring up to c->k_max
 * slots), with its buffer; NULL when the ring is full or memory is out. */
static tcpKept *kept_slot(tcpConn *c)
{
    if (c->k_len == c->k_cap && c->k_cap < c->k_max) {
        size_t ncap = c->k_cap ? 2 * c->k_cap : 8;
        if (ncap > c->k_max)
            ncap = c->k_max;
        tcpKept *nk = calloc(ncap, sizeof(*nk));
        if (nk != NULL) {
            for (size_t i = 0; i < c->k_cap; i++)
                nk[i] = *kept_at(c, i); /* the unused slots' buffers move too */
            free(c->kept);
            c->kept = nk;
            c->k_head = 0;
            c->k_cap = ncap;
        }
    }
    tcpKept *k = c->k_len < c->k_cap ? kept_at(c, c->k_len) : NULL;
    if (k != NULL && k->data == NULL)
        k->data = malloc(GEO_TCP_FRAME + GEO_AEAD_TAG_BYTES);
    return k != NULL && k->data != NULL ? k : NULL;
}

/* Keep the frame just sent whole (frame number c->s_count): a copy of its
 * plaintext, or (sealed != NULL) the frame already sealed into the slot
 * kept_slot gave when it was sealed, with counter ctr.  Beyond c->k_max
 * slots keep none until the receiver has caught up: the connection is then
 * not resumable until it has (conn_resumed says so). */
static void kept_push(tcpConn *c, const tcpFrameHdr *h, const void *payload,
                      const uint8_t *sealed, uint64_t ctr)
{
    tcpKept *k = sealed != NULL ? kept_at(c, c->k_len) : kept_slot(c);
    if (k == NULL || (sealed != NULL && k->data != sealed)) {
        /* Full (or out of memory): forget what is kept; frames before this
         * one cannot be sent again. */
        c->k_head = (c->k_head + c->k_len) % (c->k_cap ? c->k_cap : 1);
        c->k_len = 0;
        c->k_base = c->s_count + 1;
        return;
    }
    k->hdr = *h;
    k->sealed = sealed != NULL;
    k->ctr = ctr;
    if (sealed == NULL)
        memcpy(k->data, payload, h->len);
    c->k_len++;
}

/* The connection is lost: open the frames kept sealed under its key, in
 * place, to be sealed again under the next incarnation's.  One that does
 * not open (memory corrupted) ends what is kept, as a full ring does. */
static void kept_unseal(tcpConn *c)
{
    for (size_t i = 0; i < c->k_len; i++) {
        tcpKept *k = kept_at(c, i);
        if (!k->sealed)
            continue;
        if (geoAeadOpen(&c->tx_open, k->ctr, &k->hdr, sizeof(k->hdr), k->data, k->data,
                        k->hdr.len, k->data + k->hdr.len) != 0) {
            c->k_head = (c->k_head + c->k_len) % c->k_cap;
            c->k_len = 0;
            c->k_base = c->s_count;
            return;
        }
        k->sealed = 0;
    }
}

/* The receiver has n frames whole: forget those. */
static void kept_ack(tcpConn *c, uint64_t n)
{
    while (c->k_len > 0 && c->k_base < n) {
        c->k_head = (c->k_head + 1) % c->k_cap;
        c->k_len--;
        c->k_base++;
    }
    if (c->k_len == 0 && c->k_base < n)
        c->k_base = n;
}

static void kept_free(tcpConn *c)
{
    for (size_t i = 0; i < c->k_cap; i++) {
        if (c->kept[i].data != NULL)
            geoWipe(c->kept[i].data, GEO_TCP_FRAME + GEO_AEAD_TAG_BYTES);
        free(c->kept[i].data);
    }
    free(c->kept);
    c->kept = NULL;
    c->k_cap = c->k_len = c->k_head = 0;
}

static void hdr_fill(tcpFrameHdr *h, uint32_t magic, uint32_t len, uint64_t seq,
                     uint64_t offset, uint64_t total)
{
    h->magic = magic;
    h->len = len;
    h->seq = seq;
    h->offset = offset;
    h->total = total;
    h->check = hdr_check(h);
}

/* A failed send or receive: a reset on a TCP connection is resumed, the
 * rest breaks the communicator. */
static void io_failed(tcpState *st, int p, int s, int err, const char *what)
{
    if (st->peers[p].conns[s].track)
        conn_fail(st, p, s, err, what);
    else
        peer_error(st, p, s, what);
}

/* Push bytes on one connection: first an ack when we have received more
 * than we told, then frames kept from before a reset, then the cursor's.
 * Returns 1 if progress was made. */
static int progress_send(tcpState *st, int p, int s, double now)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    int moved = 0;

    for (;;) {
        geoNetRequest *r = NULL;
        const char *plain = NULL; /* what a data frame's payload is made of */
        if (!c->s_active) {
            if (c->track && c->r_count > c->a_sent)
                c->s_kind = SEND_ACK;
            else if (c->track && c->again < c->s_count)
                c->s_kind = SEND_AGAIN;
            else
                c->s_kind = SEND_DATA;
        }
        if (c->s_kind == SEND_DATA) {
            r = cursor_req(peer, GEO_NET_SEND, s, &c->s_seq, &c->s_frame);
            if (r == NULL)
                return moved;
            plain = r->buf + c->s_frame * GEO_TCP_FRAME;
        } else if (c->s_kind == SEND_AGAIN) {
            plain = (const char *)kept_at(c, (size_t)(c->again - c->k_base))->data;
        }
        if (!c->s_active) {
            if (c->s_kind == SEND_ACK) {
                hdr_fill(&c->s_hdr, GEO_ACK_MAGIC, 0, c->r_count, 0, 0);
                c->a_sent = c->r_count;
            } else if (c->s_kind == SEND_AGAIN) {
                c->s_hdr = kept_at(c, (size_t)(c->again - c->k_base))->hdr;
            } else {
                hdr_fill(&c->s_hdr, GEO_FRAME_MAGIC, (uint32_t)frame_len(r, c->s_frame), r->seq,
                         (uint64_t)c->s_frame * GEO_TCP_FRAME, r->size);
            }
            c->s_off = 0;
            c->s_active = 1;
            c->s_out = c->s_buf;
            if (c->enc && c->track && c->s_kind == SEND_DATA) {
                tcpKept *k = kept_slot(c); /* sealed into the slot it will be kept in */
                if (k != NULL)
                    c->s_out = k->data;
            }
            if (c->enc && geoAeadSeal(&c->tx_aead, c->s_ctr++, &c->s_hdr, sizeof(c->s_hdr),
                                      plain ? plain : (const char *)c->s_buf, c->s_out,
                                      c->s_hdr.len, c->s_out + c->s_hdr.len) != 0) {
                peer_error(st, p, s, "could not be sent a frame: encryption failed (out of "
                           "memory?)");
                return moved;
            }
        }
        size_t len = c->s_hdr.len;
        size_t flen = c->enc ? len + GEO_AEAD_TAG_BYTES : len; /* bytes after the header */
        char *payload = c->enc ? (char *)c->s_out : (char *)plain;
        struct iovec iov[2];
        int n = 0;
        if (c->s_off < sizeof(tcpFrameHdr)) {
            iov[n].iov_base = (char *)&c->s_hdr + c->s_off;
            iov[n++].iov_len = sizeof(tcpFrameHdr) - c->s_off;
            if (flen > 0) {
                iov[n].iov_base = payload;
                iov[n++].iov_len = flen;
            }
        } else {
            size_t done = c->s_off - sizeof(tcpFrameHdr);
            iov[n].iov_base = payload + done;
            iov[n++].iov_len = flen - done;
        }
        ssize_t w = conn_sendv(c, iov, n);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return moved;
            int err = errno;
            char why[128];
            snprintf(why, sizeof(why), "failed while we sent to it: %s", strerror(err));
            io_failed(st, p, s, err, why);
            return moved;
        }
        moved = 1;
        if (r != NULL)
            r->last_progress = now;
        c->s_off += (size_t)w;
        if (c->s_off < sizeof(tcpFrameHdr) + flen)
            return moved;
        c->s_active = 0;
        if (c->s_kind == SEND_AGAIN) {
            c->again++;
            peer->resent += len;
        } else if (c->s_kind == SEND_DATA) {
            if (c->track) {
                if (c->enc && c->s_out != c->s_buf)
                    kept_push(c, &c->s_hdr, NULL, c->s_out, c->s_ctr - 1);
                else
                    kept_push(c, &c->s_hdr, plain, NULL, 0);
                c->again = ++c->s_count;
            }
            c->s_frame += frame_step(r);
            complete_frame(st, peer, GEO_NET_SEND, r);
        }
    }
}

/* got <= 0 from conn_recv (not EAGAIN): the peer closed (0) or the
 * connection failed.  A close with nothing expected from it only marks
 * it closed (the peer has finished); r: the receive waiting on it. */
static void recv_failed(tcpState *st, int p, int s, ssize_t got, const geoNetRequest *r)
{
    tcpConn *c = &st->peers[p].conns[s];
    char why[160];
    if (got == 0) {
        uint64_t sq = c->s_seq;
        size_t sf = c->s_frame;
        if (r == NULL && cursor_req(&st->peers[p], GEO_NET_SEND, s, &sq, &sf) != NULL) {
            peer_error(st, p, s, "closed the connection while we sent to it (it died, or gave "
                       "up because of another rank's failure)");
            return;
        }
        if (r == NULL) {
            c->closed = 1;
            st->peers[p].closed_by_peer = 1;
            geoInfo(GEO_LOG_NET, "rank %d closed its connection (stream %d)", p, s);
            return;
        }
        snprintf(why, sizeof(why), "closed the connection while we waited for %zu bytes (it "
                 "died, or gave up because of another rank's failure)", r->size);
        peer_error(st, p, s, why);
        return;
    }
    int err = errno;
    snprintf(why, sizeof(why), "failed while we received from it: %s", strerror(err));
    io_failed(st, p, s, err, why);
}

/* An ack frame's header (and tag) is in: the peer has c->r_hdr.seq of our
 * frames whole.  0, or -1 after breaking the communicator. */
static int take_ack(tcpState *st, int p, int s)
{
    tcpConn *c = &st->peers[p].conns[s];
    const tcpFrameHdr *h = &c->r_hdr;
    char why[200];
    if (c->enc) {
        if (geoAeadOpen(&c->rx_aead, c->r_ctr, h, sizeof(*h), c->r_buf, c->r_buf, 0,
                        c->r_buf) != 0) {
            snprintf(why, sizeof(why), "sent an acknowledgement that fails authentication "
                     "(frame %llu of this connection: altered on the way, replayed, or not "
                     "from that rank)", (unsigned long long)c->r_ctr);
            peer_error(st, p, s, why);
            return -1;
        }
        c->r_ctr++;
    }
    if (h->seq > c->s_count || h->seq < c->a_got) {
        snprintf(why, sizeof(why), "acknowledged %llu frames where %llu were sent and %llu "
                 "acknowledged before (a corrupt stream)", (unsigned long long)h->seq,
                 (unsigned long long)c->s_count, (unsigned long long)c->a_got);
        peer_error(st, p, s, why);
        return -1;
    }
    c->a_got = h->seq;
    kept_ack(c, h->seq);
    return 0;
}

/* Pull bytes from one connection.  A TCP connection (c->track) reads
 * headers whenever they come, so that acks are taken at once; a data
 * header then waits until its receive is posted.  Others read only for a
 * posted receive. */
static int progress_recv(tcpState *st, int p, int s, double now)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    int moved = 0;

    for (;;) {
        geoNetRequest *r = cursor_req(peer, GEO_NET_RECV, s, &c->r_seq, &c->r_frame);
        ssize_t got;
        if (c->r_off < sizeof(tcpFrameHdr)) {
            if (r == NULL && (!c->track || c->closed))
                return moved;
            got = conn_recv(c, (char *)&c->r_hdr + c->r_off, sizeof(tcpFrameHdr) - c->r_off);
            if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                return moved;
            if (got <= 0) {
                recv_failed(st, p, s, got, r);
                return moved;
            }
            moved = 1;
            if (r != NULL)
                r->last_progress = now;
            c->r_off += (size_t)got;
            if (c->r_off < sizeof(tcpFrameHdr))
                continue;
            c->r_checked = 0;
        }
        const tcpFrameHdr *h = &c->r_hdr;
        if (c->track && h->magic == GEO_ACK_MAGIC) {
            if (h->check != hdr_check(h) || h->len != 0) {
                peer_error(st, p, s, "sent a malformed acknowledgement (a corrupt stream)");
                return moved;
            }
            size_t tlen = c->enc ? GEO_AEAD_TAG_BYTES : 0, done = c->r_off - sizeof(*h);
            if (done < tlen) {
                got = conn_recv(c, c->r_buf + done, tlen - done);
                if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                    return moved;
                if (got <= 0) {
                    recv_failed(st, p, s, got, r);
                    return moved;
                }
                moved = 1;
                c->r_off += (size_t)got;
                if (c->r_off < sizeof(*h) + tlen)
                    continue;
            }
            if (take_ack(st, p, s) != 0)
                return moved;
            c->r_off = 0;
            continue;
        }
        if (r == NULL)
            return moved; /* a data header, held until its receive is posted */
        if (!c->r_checked) {
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
            }
            size_t want = frame_len(r, c->r_frame);
            if (!hdr_ok || h->total != r->size ||
                h->offset != (uint64_t)c->r_frame * GEO_TCP_FRAME || h->len != want) {
                char why[256];
                snprintf(why, sizeof(why),
                         "sent a frame that does not match the posted receive (magic %#x seq "
                         "%llu offset %llu len %u; expected seq %llu offset %llu len %zu: "
                         "mismatched counts or a corrupt stream%s)",
                         h->magic, (unsigned long long)h->seq, (unsigned long long)h->offset,
                         h->len, (unsigned long long)r->seq,
                         (unsigned long long)c->r_frame * GEO_TCP_FRAME, want,
                         c->enc ? ", or the header was altered on the way" : "");
                peer_error(st, p, s, why);
                return moved;
            }
            c->r_checked = 1;
        }
        size_t len = h->len;
        size_t flen = c->enc ? len + GEO_AEAD_TAG_BYTES : len;
        /* A sealed frame lands in the connection's buffer: the user's sees
         * only plaintext that passed its tag. */
        char *payload = c->enc ? (char *)c->r_buf : r->buf + c->r_frame * GEO_TCP_FRAME;
        size_t done = c->r_off - sizeof(tcpFrameHdr);
        if (done < flen) {
            got = conn_recv(c, payload + done, flen - done);
            if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                return moved;
            if (got <= 0) {
                recv_failed(st, p, s, got, r);
                return moved;
            }
            moved = 1;
            r->last_progress = now;
            c->r_off += (size_t)got;
            if (c->r_off < sizeof(tcpFrameHdr) + flen)
                continue;
        }
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
        c->r_off = 0;
        c->r_count++;
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

/* ---- set-up ---------------------------------------------------------- */

/* HMAC(secret, label | comm_hash | from | to | stream | encrypt | cipher |
 * resume | connector's count | acceptor's count | Ca | Cc | connector's
 * X25519 key | acceptor's): the connector's proof (label "geoccl/v2/hello",
 * cipher its preference, no acceptor key or count yet) and the acceptor's
 * (label "geoccl/v2/accept", cipher its choice).  The ephemeral keys are
 * bound, so a relay cannot put its own in; the counts are, so that it
 * cannot make either end skip or repeat frames when a connection resumes. */
static void hello_mac(const geoNetCtx *ctx, const char *label, const uint8_t *challenge,
                      const tcpHello *m, int32_t cipher, const uint8_t *apub, uint64_t acount,
                      uint8_t out[GEO_SHA256_BYTES])
{
    enum { F = 32, C = F + 24, N = C + 16, K = N + 2 * GEO_CHALLENGE_BYTES };
    uint8_t msg[K + 2 * GEO_X25519_BYTES];
    int32_t f[6] = {m->rank, m->to, m->stream, m->encrypt, cipher, m->resume};
    uint64_t counts[2] = {m->count, acount};
    size_t l = strlen(label);
    memset(msg, 0, 24);
    memcpy(msg, label, l < 24 ? l : 24);
    memcpy(msg + 24, &ctx->comm_hash, 8);
    memcpy(msg + F, f, sizeof(f));
    memcpy(msg + C, counts, sizeof(counts));
    memcpy(msg + N, challenge, GEO_CHALLENGE_BYTES);
    memcpy(msg + N + GEO_CHALLENGE_BYTES, m->nonce, GEO_CHALLENGE_BYTES);
    memcpy(msg + K, m->pub, GEO_X25519_BYTES);
    if (apub != NULL)
        memcpy(msg + K + GEO_X25519_BYTES, apub, GEO_X25519_BYTES);
    else
        memset(msg + K + GEO_X25519_BYTES, 0, GEO_X25519_BYTES);
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
        geoAeadInit(&c->rx_aead, cipher, key[connector ? 1 : 0], 0) != 0 ||
        geoAeadInit(&c->tx_open, cipher, key[connector ? 0 : 1], 0) != 0) {
        geoAeadFree(&c->tx_aead);
        geoAeadFree(&c->rx_aead);
        geoAeadFree(&c->tx_open);
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
    geoAeadFree(&c->tx_open);
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

typedef struct tcpHs {
    int fd;
    int out;        /* 1: we connect to (peer, stream); 0: we accepted */
    int resume;     /* after set-up: it replaces a connection that was reset */
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
            h->hello.resume = h->resume;
            h->hello.count = h->resume ? st->peers[h->peer].conns[h->stream].r_count : 0;
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
            hello_mac(ctx, "geoccl/v2/hello", h->challenge, &h->hello, h->hello.cipher, NULL, 0,
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
                          h->ack.pub, h->ack.count, expect);
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
            st->peers[h->peer].conns[h->stream].bbr_since = 0; /* not known: restart it */
            h->fd = -1;
            h->state = HS_DONE;
            return 1;
        default:
            return h->state == HS_DONE;
        }
    }
connect_failed:
    /* After set-up a listener is open for the peer's whole life: a
     * refused connect means its process is gone. */
    if (geoSocketRetryable(h->err) && now < deadline && !(h->resume && h->err == ECONNREFUSED)) {
        h->state = HS_RETRY;
        h->when = now + h->backoff;
        if (h->backoff < 0.1)
            h->backoff *= 2;
        return 0;
    }
    geoErrSet(ctx->err, "%s: cannot connect to rank %d at %s (host %s), stream %d: %s%s",
                    h->resume ? geoErrOp(ctx->err) : "init", h->peer, peer_str(st, h->peer, pa), ctx->peers[h->peer].host, h->stream,
                    strerror(h->err), h->resume ? (h->err == ECONNREFUSED
                                                   ? " (its process is gone)"
                                                   : " (reconnecting after a reset)") : "");
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
    geoErrSet(ctx->err, "%s: rank %d at %s (host %s) closed our connection on stream %d "
                    "during the handshake %d times (%s): it refused our proof, or dropped us "
                    "among many unproven connections", h->resume ? geoErrOp(ctx->err) : "init",
                    h->peer, peer_str(st, h->peer, pa),
                    ctx->peers[h->peer].host, h->stream, h->drops, why);
    return -1;
refused:
    geoErrSet(ctx->err, "%s: refused rank %d at %s (host %s) on stream %d: %s",
                    h->resume ? geoErrOp(ctx->err) : "init", h->peer,
                    peer_str(st, h->peer, pa), ctx->peers[h->peer].host, h->stream, why);
    return -1;
}

/* The first few drops are logged one by one, the rest only counted (a
 * scan or a flood must not bury the log) and summed up after set-up. */
#define GEO_TCP_DROP_LOG 8

/* Shut the resume handshakes still in progress (break_locked). */
static void pend_shut(tcpState *st)
{
    for (int i = 0; i < st->nrpend; i++)
        if (st->rpend[i].state < HS_DONE && st->rpend[i].fd >= 0)
            shutdown(st->rpend[i].fd, SHUT_RDWR);
}

static void hs_drop(tcpState *st, tcpHs *h, const char *why)
{
    if (st->dropped++ < GEO_TCP_DROP_LOG)
        geoWarn(GEO_LOG_NET, "dropped connection from %s: %s%s", h->from, why,
                st->dropped == GEO_TCP_DROP_LOG ? " (further drops are only counted)" : "");
    if (h->state == HS_ACK) { /* release the slot it claimed */
        st->peers[h->peer].conns[h->stream].fd = -1;
        st->peers[h->peer].conns[h->stream].acking = 0;
        st->peers[h->peer].conns[h->stream].local = 0;
        conn_keys_free(&st->peers[h->peer].conns[h->stream]);
    }
    close(h->fd);
    h->fd = -1;
    h->state = HS_DROPPED;
}

static void resume_claim(tcpState *st, tcpHs *h);

/* Whether hello m may claim its slot on the connection h accepted.
 * At set-up (!h->resume) a fresh hello claims a free slot.  After set-up a
 * resume hello claims a TCP slot (track).  Both also take a fresh hello
 * for a TCP slot taken at set-up on which nothing has arrived: the dialler
 * lost that connection before our ack reached it whole (a reset during its
 * handshake), so it dials afresh; it has received nothing of ours, and
 * after set-up the slot resumes with its count 0 (what we sent meanwhile
 * is kept and goes again).  While our ack is still going out (acking) the
 * old attempt holds the slot: its failure frees it, and the dialler tries
 * again.  The hello's proof is checked after this. */
static int hello_fits(const tcpState *st, const tcpHs *h, const tcpHello *m)
{
    const tcpConn *c = &st->peers[m->rank].conns[m->stream];
    int again = !m->resume && m->count == 0 && c->r_count == 0;
    if (h->resume)
        return c->track && (m->resume || again);
    return !m->resume && (c->fd < 0 || (again && !c->acking && !c->local && !h->local));
}

/* Advance an accepted handshake without blocking.  A stranger gets 16
 * random bytes and nothing else.  1: done; 0: waiting; -1: dropped
 * (logged and closed).  At set-up, a handshake that replaces its slot's
 * earlier connection (which set-up counted as done) adds 1 to
 * st->uncounted when it closes that one. */
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
                m->stream >= st->nstreams || !hello_fits(st, h, m)) {
                hs_drop(st, h, "not a valid hello for this communicator");
                return -1;
            }
            hello_mac(ctx, "geoccl/v2/hello", h->challenge, m, m->cipher, NULL, 0, expect);
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
             * same rank and stream is refused while our ack is in flight.
             * A resume takes it from the connection it replaces (whose
             * reset we may not have seen yet) and from an older resume
             * (the peer gave that one up). */
            h->peer = m->rank;
            h->stream = m->stream;
            tcpConn *c = &st->peers[h->peer].conns[h->stream];
            if (h->resume) {
                if (!m->resume)
                    geoInfo(GEO_LOG_NET, "rank %d, stream %d: it dialled again at set-up after "
                            "our ack was lost, and our set-up is over: resuming the connection "
                            "from its start", h->peer, h->stream);
                resume_claim(st, h);
            } else if (c->fd >= 0) {
                /* Set-up, and the slot was taken by its earlier attempt,
                 * which our ack never reached whole (hello_fits): this
                 * proven attempt replaces it. */
                geoInfo(GEO_LOG_NET, "rank %d, stream %d: it dialled again at set-up after "
                        "our ack was lost; replacing its first connection", h->peer, h->stream);
                close(c->fd);
                c->fd = -1;
                c->local = 0;
                conn_keys_free(c);
                st->uncounted++;
            }
            memset(&h->ack, 0, sizeof(h->ack));
            h->ack.count = h->resume ? c->r_count : 0;
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
            if (!h->resume) { /* a resumed connection is installed once our ack is out */
                c->fd = h->fd;
                c->local = h->local;
                c->acking = 1;
                c->bbr_since = 0; /* when its BBR's window began is not known */
            }
            h->ack.magic = GEO_ACCEPT_MAGIC;
            h->ack.cipher = cipher;
            hello_mac(ctx, "geoccl/v2/accept", h->challenge, m, cipher, h->ack.pub, h->ack.count,
                      h->ack.proof);
            h->state = HS_ACK;
            h->off = 0;
            continue;
        }
        case HS_ACK:
            rc = geoSocketStep(h->fd, &h->ack, sizeof(h->ack), &h->off, 1, &why);
            if (rc <= 0)
                goto wait_or_drop;
            if (h->resume)
                st->peers[h->peer].conns[h->stream].fd = h->fd;
            st->peers[h->peer].conns[h->stream].acking = 0;
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
    if (h->resume && h->state == HS_HELLO && h->off == 0) {
        /* Closed before a byte of hello: a peer probing whether we are
         * alive (see conn_fail), or a scan. */
        geoTrace(GEO_LOG_NET, "connection from %s closed before its hello", h->from);
        close(h->fd);
        h->fd = -1;
        h->state = HS_DROPPED;
        return -1;
    }
    char text[128];
    snprintf(text, sizeof(text), "handshake failed (%s)", why);
    hs_drop(st, h, text);
    return -1;
}

/* An accepted handshake at set-up: how many more slots are taken for good
 * (1 when it finished, less one for an earlier connection it replaced). */
static int setup_in_step(tcpState *st, tcpHs *h)
{
    int done = hs_in_step(st, h) > 0 ? 1 : 0;
    done -= st->uncounted;
    st->uncounted = 0;
    return done;
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
                in_done += setup_in_step(st, &pend[-1 - map[k]]);
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
                in_done += setup_in_step(st, &pend[npend]);
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

/* ---- resume after a reset (see the top of this file) ------------------ */

static int resettable(int err)
{
    return err == ECONNRESET || err == ECONNABORTED || err == EPIPE || err == ETIMEDOUT ||
           err == EHOSTUNREACH || err == ENETUNREACH || err == ENETRESET || err == EHOSTDOWN;
}

/* Forget a connection's incarnation; what it counted and keeps stays. */
static void conn_down(tcpState *st, int p, int s)
{
    tcpConn *c = &st->peers[p].conns[s];
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->down = 1;
    c->down_since = geoNow();
    c->s_active = 0;  /* a half-sent frame starts again; it was not counted */
    c->r_off = 0;     /* a half-received one is dropped: the peer sends it again */
    c->r_checked = 0;
    if (c->enc)
        kept_unseal(c); /* before its key goes */
    conn_keys_free(c);
}

static void conn_fail(tcpState *st, int p, int s, int err, const char *what)
{
    tcpConn *c = &st->peers[p].conns[s];
    char a[GEO_ADDR_STRLEN];
    if (st->broken || st->stop || c->down)
        return;
    if (!c->track || !st->running || st->reconnect_s <= 0 || !resettable(err)) {
        peer_error(st, p, s, what);
        return;
    }
    geoWarn(GEO_LOG_NET, "rank %d (%s, host %s), stream %d: %s; %s (for up to %.0f s, "
            "GEOCCL_RECONNECT_TIMEOUT)", p, peer_str(st, p, a), st->ctx->peers[p].host, s,
            what, p < st->ctx->rank ? "dialling again" : "waiting for it to dial again",
            st->reconnect_s);
    conn_down(st, p, s);
    if (p < st->ctx->rank) {
        c->dial = calloc(1, sizeof(tcpHs));
        if (c->dial == NULL) {
            peer_error(st, p, s, "reset the connection, and we are out of memory to dial again");
            return;
        }
        *c->dial = (tcpHs){.fd = -1, .out = 1, .resume = 1, .state = HS_RETRY, .peer = p,
                           .stream = s, .when = c->down_since, .backoff = 1e-3};
    } else {
        c->probe_when = c->down_since;
    }
}

/* Before a resume of h's slot is acknowledged: the slot's incarnation, if
 * we have not seen it fail, and an older resume of it go. */
static void resume_claim(tcpState *st, tcpHs *h)
{
    tcpConn *c = &st->peers[h->peer].conns[h->stream];
    if (!c->down) {
        geoInfo(GEO_LOG_NET, "rank %d, stream %d: it dialled again before we saw the "
                "connection fail; replacing it", h->peer, h->stream);
        conn_down(st, h->peer, h->stream);
    }
    for (int i = 0; i < st->nrpend; i++) {
        tcpHs *o = &st->rpend[i];
        if (o != h && o->state == HS_ACK && o->peer == h->peer && o->stream == h->stream)
            hs_drop(st, o, "replaced by a newer resume of the same connection");
    }
}

static void conn_free_resume(tcpConn *c)
{
    if (c->dial != NULL) {
        if (c->dial->fd >= 0)
            close(c->dial->fd);
        geoX25519Free(c->dial->eph);
        free(c->dial);
        c->dial = NULL;
    }
    if (c->probe_fd >= 0)
        close(c->probe_fd);
    c->probe_fd = -1;
}

/* Pace connection c at its part of bytes_per_s, the pair's rate over its
 * active streams (frames rotate over them, so each carries an equal part);
 * 0 lifts the limit.  SO_MAX_PACING_RATE caps the kernel's pacing rate,
 * whatever the congestion control, and turns TCP's own pacing on where no
 * fq qdisc paces. */
static int conn_pace(tcpConn *c, uint64_t bytes_per_s, int active)
{
    unsigned v = ~0U;
    if (bytes_per_s > 0) {
        uint64_t per = bytes_per_s / (uint64_t)(active > 0 ? active : 1);
        v = per >= ~0U ? ~0U - 1 : per > 0 ? (unsigned)per : 1;
    }
    return setsockopt(c->fd, SOL_SOCKET, SO_MAX_PACING_RATE, &v, sizeof(v));
}

/* The new incarnation is up (c->fd) and the peer has n of our frames
 * whole: send the rest again, then go on. */
static void conn_resumed(tcpState *st, int p, int s, uint64_t n)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    char why[256];
    conn_free_resume(c);
    c->down = 0;
    c->refused_since = 0;
    geoSocketTune(c->fd);
    geoSocketSetNonBlocking(c->fd, 1);
    c->bbr_since = 0; /* a new connection: when its BBR's window began is not known */
    c->bbr_restarts = 0;
    if (peer->cc[0])
        setsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, peer->cc, (socklen_t)strlen(peer->cc));
    if (peer->pace)
        conn_pace(c, peer->pace, peer->active);
    if (st->lowat > 0)
        setsockopt(c->fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &(unsigned){(unsigned)st->lowat},
                   sizeof(unsigned));
    if (n > c->s_count || n < c->k_base) {
        if (n > c->s_count)
            snprintf(why, sizeof(why), "resumed the connection claiming %llu of our frames "
                     "where %llu were sent (a corrupt peer)", (unsigned long long)n,
                     (unsigned long long)c->s_count);
        else
            snprintf(why, sizeof(why), "resumed the connection, but %llu frames it has not "
                     "received are no longer kept here (more than GEOCCL_RESUME_BUFFER=%lld "
                     "bytes were unacknowledged when it was reset)",
                     (unsigned long long)(c->k_base - n),
                     (long long)geoParamInt(GEO_PARAM_RESUME_BUFFER));
        peer_error(st, p, s, why);
        return;
    }
    kept_ack(c, n);
    c->a_got = n;
    c->again = n;
    c->a_sent = c->r_count; /* the handshake told it */
    uint64_t bytes = 0;
    for (size_t i = 0; i < c->k_len; i++)
        bytes += kept_at(c, i)->hdr.len;
    peer->reconnects++;
    geoInfo(GEO_LOG_NET, "rank %d, stream %d: resumed %.3f s after the reset (reconnect %llu "
            "with this rank); sending %llu frames (%llu bytes) again, it had %llu of %llu",
            p, s, geoNow() - c->down_since, (unsigned long long)peer->reconnects,
            (unsigned long long)c->k_len, (unsigned long long)bytes, (unsigned long long)n,
            (unsigned long long)c->s_count);
}

/* The peer's process is gone (its listener refuses us): an error when
 * something is pending with it, else it only counts as closed. */
static void peer_gone(tcpState *st, int p, int s, const char *what)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    if (peer->q[GEO_NET_SEND] != NULL || peer->q[GEO_NET_RECV] != NULL) {
        peer_error(st, p, s, what);
        return;
    }
    geoInfo(GEO_LOG_NET, "rank %d, stream %d: %s; nothing was pending with it, so it counts "
            "as closed", p, s, what);
    conn_free_resume(c);
    c->down = 0;
    c->closed = 1;
    peer->closed_by_peer = 1;
    peer->gone = 1;
}

/* The peer's listener refused us.  Its process is taken for gone once
 * refusals have lasted GEO_GONE_CONFIRM_S: one refusal may be a path's
 * (a middlebox, a route coming back) and not the peer's.  1: gone. */
#define GEO_GONE_CONFIRM_S 0.5
static int refused_for_good(tcpConn *c, double now)
{
    if (c->refused_since <= 0)
        c->refused_since = now;
    return now - c->refused_since >= GEO_GONE_CONFIRM_S;
}

/* A dial of ours failed for good (ctx->err says how). */
static void dial_failed(tcpState *st, int p, int s)
{
    tcpConn *c = &st->peers[p].conns[s];
    if (c->dial->err == ECONNREFUSED && refused_for_good(c, geoNow())) {
        peer_gone(st, p, s, "reset the connection, and its listener refuses a new one (its "
                  "process is gone)");
        return;
    }
    if (c->dial->err == ECONNREFUSED) {
        if (c->dial->fd >= 0)
            close(c->dial->fd);
        *c->dial = (tcpHs){.fd = -1, .out = 1, .resume = 1, .state = HS_RETRY, .peer = p,
                           .stream = s, .when = geoNow() + 0.1, .backoff = 1e-3};
        return;
    }
    if (resettable(c->dial->err)) {
        /* The new connection was reset too (a middlebox, or a reset
         * meant for its predecessor): dial again, within
         * GEOCCL_RECONNECT_TIMEOUT of the first reset (poll_down). */
        if (c->dial->fd >= 0)
            close(c->dial->fd);
        *c->dial = (tcpHs){.fd = -1, .out = 1, .resume = 1, .state = HS_RETRY, .peer = p,
                           .stream = s, .when = geoNow() + 0.01, .backoff = 1e-3};
        return;
    }
    geoWarn(GEO_LOG_NET, "%s", geoErrLast(st->ctx->err));
    break_locked(st, ncclRemoteError);
}

enum { PK_CONN, PK_DIAL, PK_PROBE, PK_PEND, PK_LISTEN, PK_WAKE };
typedef struct {
    int kind, p, s, fd;
} tcpPollRef;

/* A connection that is down: give up after the reconnect timeout, drive
 * our dial, or probe the peer's listener.  Returns the entries used. */
static int poll_down(tcpState *st, int p, int s, double now, struct pollfd *pfd,
                     tcpPollRef *map, int n)
{
    geoNetCtx *ctx = st->ctx;
    tcpConn *c = &st->peers[p].conns[s];
    char why[200];
    if (now - c->down_since > st->reconnect_s) {
        snprintf(why, sizeof(why), "reset the connection and it was not re-established within "
                 "%.0f s (GEOCCL_RECONNECT_TIMEOUT)", st->reconnect_s);
        peer_error(st, p, s, why);
        return n;
    }
    if (c->dial != NULL) {
        tcpHs *h = c->dial;
        if (h->state == HS_RETRY) {
            int rc = hs_out_step(st, h, now, c->down_since + st->reconnect_s);
            if (rc > 0) {
                conn_resumed(st, p, s, h->ack.count);
                return n;
            }
            if (rc < 0) {
                dial_failed(st, p, s);
                return n;
            }
        }
        if (h->fd >= 0) {
            pfd[n] = (struct pollfd){.fd = h->fd, .events = hs_events(h)};
            map[n++] = (tcpPollRef){PK_DIAL, p, s, h->fd};
        }
        return n;
    }
    if (c->probe_fd < 0 && now >= c->probe_when &&
        geoSocketConnectStart(&ctx->peers[p].addr, &c->probe_fd) != 0) {
        c->probe_fd = -1;
        if (errno == ECONNREFUSED && refused_for_good(c, now)) {
            peer_gone(st, p, s, "reset the connection, and its listener refuses connections "
                      "(its process is gone)");
            return n;
        }
        c->probe_when = now + (errno == ECONNREFUSED ? 0.1 : 2.0);
    }
    if (c->probe_fd >= 0) {
        pfd[n] = (struct pollfd){.fd = c->probe_fd, .events = POLLOUT};
        map[n++] = (tcpPollRef){PK_PROBE, p, s, c->probe_fd};
    }
    return n;
}

static void probe_done(tcpState *st, int p, int s, double now)
{
    tcpConn *c = &st->peers[p].conns[s];
    int err = geoSocketConnectResult(c->probe_fd);
    close(c->probe_fd);
    c->probe_fd = -1;
    if (err == ECONNREFUSED && refused_for_good(c, now)) {
        peer_gone(st, p, s, "reset the connection, and its listener refuses connections (its "
                  "process is gone)");
        return;
    }
    if (err == ECONNREFUSED) {
        c->probe_when = now + 0.1;
        return;
    }
    c->refused_since = 0;
    c->probe_when = now + 2.0; /* alive (or not reachable yet): look again later */
}

/* Take what waits on the listener after set-up: resume handshakes, run
 * like those of set-up (challenge first, a deadline each, room made by
 * dropping an unproven one at random). */
static void accept_resumes(tcpState *st, double now)
{
    for (int taken = 0; taken < 16; taken++) {
        tcpHs h = {.out = 0, .resume = 1, .state = HS_CHALLENGE, .peer = -1, .stream = -1};
        geoSockAddr from;
        int got = geoSocketAcceptNB(st->listen_fd, &h.fd, &from);
        if (got < 0 && (errno == EMFILE || errno == ENFILE) &&
            evict_pending(st, st->rpend, st->nrpend, NULL, "dropped to make room (out of "
                          "file descriptors)") == 0)
            return; /* the slot frees when rpend is compacted */
        if (got <= 0)
            return; /* nothing more, or a transient accept error: the next pass retries */
        geoAddrToString(&from, h.from);
        h.src = from;
        if (st->nrpend == GEO_TCP_RESUME_PENDING &&
            evict_pending(st, st->rpend, st->nrpend, NULL, "dropped to make room for newer "
                          "connections") != 0) {
            close(h.fd);
            continue;
        }
        if (geoRandomBytes(h.challenge, sizeof(h.challenge)) != 0) {
            geoWarn(GEO_LOG_NET, "dropped connection from %s: no randomness for its challenge",
                    h.from);
            close(h.fd);
            continue;
        }
        h.when = now + GEO_TCP_HANDSHAKE_S;
        int i = st->nrpend;
        if (i == GEO_TCP_RESUME_PENDING) { /* one was evicted: reuse its entry */
            i = 0;
            while (st->rpend[i].state < HS_DONE)
                i++;
        } else {
            st->nrpend++;
        }
        st->rpend[i] = h;
        if (hs_in_step(st, &st->rpend[i]) > 0)
            conn_resumed(st, st->rpend[i].peer, st->rpend[i].stream, st->rpend[i].hello.count);
    }
}

static void *progress_main(void *arg)
{
    tcpState *st = arg;
    geoNetCtx *ctx = st->ctx;
    int nfds_max = ctx->nranks * st->nstreams + GEO_TCP_RESUME_PENDING + 2;
    struct pollfd *pfd = calloc((size_t)nfds_max, sizeof(*pfd));
    tcpPollRef *map = calloc((size_t)nfds_max, sizeof(*map));

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
                if (c->down) {
                    n = poll_down(st, p, s, now, pfd, map, n);
                    if (st->broken)
                        break;
                    continue;
                }
                if (c->fd < 0)
                    continue;
                if (!c->closed)
                    progress_send(st, p, s, now);
                if (st->broken)
                    break;
                /* A closed connection may still hold data sent before the
                 * close: it is read when its receive is posted. */
                if (!c->down)
                    progress_recv(st, p, s, now);
                if (st->broken)
                    break;
                if (c->down) {
                    n = poll_down(st, p, s, now, pfd, map, n);
                    if (st->broken)
                        break;
                    continue;
                }
                if (c->ring) {
                    /* Waits for ring space or data end at the peer's
                     * doorbell; the socket also tells of its death. */
                    conn_kick(c);
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
                    (cursor_req(&st->peers[p], GEO_NET_SEND, s, &sq, &sf) ||
                     (c->track && (c->r_count > c->a_sent || c->again < c->s_count))))
                    ev |= POLLOUT;
                /* A TCP connection reads acks at once; a data header then
                 * waits for its receive. */
                int held = c->r_off >= sizeof(tcpFrameHdr) && c->r_hdr.magic != GEO_ACK_MAGIC;
                if (cursor_req(&st->peers[p], GEO_NET_RECV, s, &rq, &rf) ||
                    (c->track && !c->closed && !held))
                    ev |= POLLIN;
                if (ev == 0)
                    continue;
                pfd[n] = (struct pollfd){.fd = c->fd, .events = ev};
                map[n++] = (tcpPollRef){PK_CONN, p, s, c->fd};
            }
        }
        for (int i = 0; i < st->nrpend && !st->broken; i++) {
            pfd[n] = (struct pollfd){.fd = st->rpend[i].fd, .events = hs_events(&st->rpend[i])};
            map[n++] = (tcpPollRef){PK_PEND, i, 0, st->rpend[i].fd};
        }
        if (st->running && !st->broken && st->listen_fd >= 0) {
            pfd[n] = (struct pollfd){.fd = st->listen_fd, .events = POLLIN};
            map[n++] = (tcpPollRef){PK_LISTEN, 0, 0, st->listen_fd};
        }
        pfd[n] = (struct pollfd){.fd = st->wake_fd, .events = POLLIN};
        map[n] = (tcpPollRef){PK_WAKE, 0, 0, st->wake_fd};
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
        now = geoNow();
        for (int i = 0; i < n && rc > 0 && !st->broken; i++) {
            if (pfd[i].revents == 0)
                continue;
            int p = map[i].p, s = map[i].s;
            if (map[i].kind == PK_LISTEN) {
                accept_resumes(st, now);
                continue;
            }
            if (map[i].kind == PK_PEND) {
                tcpHs *h = &st->rpend[p];
                if (h->fd == map[i].fd && h->state < HS_DONE && hs_in_step(st, h) > 0)
                    conn_resumed(st, h->peer, h->stream, h->hello.count);
                continue;
            }
            tcpConn *c = &st->peers[p].conns[s];
            if (map[i].kind == PK_DIAL) {
                if (c->dial == NULL || c->dial->fd != map[i].fd)
                    continue;
                int r = hs_out_step(st, c->dial, now, c->down_since + st->reconnect_s);
                if (r > 0)
                    conn_resumed(st, p, s, c->dial->ack.count);
                else if (r < 0)
                    dial_failed(st, p, s);
                continue;
            }
            if (map[i].kind == PK_PROBE) {
                if (c->probe_fd == map[i].fd)
                    probe_done(st, p, s, now);
                continue;
            }
            if (c->fd != map[i].fd || c->down)
                continue; /* replaced in this pass */
            if (c->ring) {
                if (!ring_drain(c))
                    continue;
            } else if (c->track && (pfd[i].revents & POLLERR)) {
                int err = 0;
                socklen_t el = sizeof(err);
                if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err == 0)
                    err = ECONNRESET;
                char why[128];
                snprintf(why, sizeof(why), "reset the connection: %s", strerror(err));
                conn_fail(st, p, s, err, why);
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
        /* Resume handshakes past their deadline go; the finished and the
         * dropped are forgotten. */
        int keep = 0;
        for (int i = 0; i < st->nrpend; i++) {
            if (st->rpend[i].state < HS_DONE && now >= st->rpend[i].when)
                hs_drop(st, &st->rpend[i], "handshake failed (timed out)");
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
            st->peers[p].conns[s].probe_fd = -1;
            st->peers[p].conns[s].s_frame = GEO_FRAME_UNSET;
            st->peers[p].conns[s].r_frame = GEO_FRAME_UNSET;
        }
    }
    res = setup_connections(st);
    /* The TCP listener stays open: peers dial it again after a reset. */
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
            c->track = !c->local;
            c->k_max = (size_t)(geoParamInt(GEO_PARAM_RESUME_BUFFER) / GEO_TCP_FRAME);
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
    st->reconnect_s = (double)geoParamInt(GEO_PARAM_RECONNECT_TIMEOUT);
    st->rpend = calloc(GEO_TCP_RESUME_PENDING, sizeof(tcpHs));
    GEO_RETURN_IF(st->rpend == NULL, ncclSystemError, "out of memory");
    st->running = 1;
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
    } else if (st->peers[req->peer].gone) {
        geoErrSet(ctx->err, "%s: rank %d (%s, host %s) is gone: its connection was reset and "
                  "its listener refuses new ones", geoErrOp(ctx->err), req->peer,
                  peer_str(st, req->peer, pa), ctx->peers[req->peer].host);
        break_locked(st, ncclRemoteError);
        res = ncclRemoteError;
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
    pthread_mutex_lock(&st->lock);
    for (int s = 0; s < st->nstreams; s++) {
        tcpConn *c = &st->peers[peer].conns[s];
        if (c->fd >= 0 && !c->local)
            geoTcpInfoAdd(c->fd, out);
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
        wake(st);
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
                conn_free_resume(c);
                kept_free(c);
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
    pthread_mutex_lock(&st->lock); /* the progress thread replaces reset connections */
    st->lowat = (int)v;
    for (int p = 0; p < st->ctx->nranks; p++)
        for (int s = 0; st->peers && p != st->ctx->rank && s < st->nstreams; s++)
            if (st->peers[p].conns[s].fd >= 0 && !st->peers[p].conns[s].local)
                setsockopt(st->peers[p].conns[s].fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v,
                           sizeof(v));
    pthread_mutex_unlock(&st->lock);
}

/* conn_pace on every network connection to the peer; 0, or the errno of
 * the first that refused.  Caller holds st->lock. */
static int peer_pace(tcpState *st, tcpPeer *pp, uint64_t bytes_per_s)
{
    int err = 0;
    for (int s = 0; s < st->nstreams; s++) {
        tcpConn *c = &pp->conns[s];
        if (c->fd >= 0 && !c->local && conn_pace(c, bytes_per_s, pp->active) != 0 && err == 0)
            err = errno;
    }
    return err;
}

static void tcp_set_streams(void *state, int peer, int n)
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
    .setPacing = tcp_set_pacing,
    .restartBbr = tcp_restart_bbr,
    .hasMailbox = tcp_has_mailbox,
    .mail = tcp_mail,
    .peerPid = tcp_peer_pid,
    .linkStats = tcp_link_stats,
    .resumeStats = tcp_resume_stats,
};
