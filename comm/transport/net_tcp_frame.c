/* Frames: how a message is cut and spread over a pair's streams, and the
 * send and receive progress of one connection (data frames, acks, frames
 * sent again after a resume), each header checked before a byte of its
 * payload lands.  The wire format and its rules: net_tcp_internal.h. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/transport/net_tcp_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

static uint64_t hdr_check(const tcpFrameHdr *h)
{
    uint64_t x = ((uint64_t)h->magic << 32 | h->len) ^ h->seq ^ (h->offset * 0x9e3779b97f4a7c15ULL) ^
                 (h->total * 0xc2b2ae3d27d4eb4fULL);
    return (x << 13) | (x >> 51);
}

size_t tcpFrameCount(size_t size)
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
geoNetRequest *tcpCursorReq(tcpPeer *peer, int dir, int s, uint64_t *seq, size_t *frame)
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
     * 1 Gbit/s, ranks switched ~2500 times per call. */
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
        tcpConnFail(st, p, s, err, what);
    else
        tcpPeerError(st, p, s, what);
}

/* Push bytes on one connection: first an ack when we have received more
 * than we told, then frames kept from before a reset, then the cursor's.
 * Returns 1 if progress was made. */
int tcpProgressSend(tcpState *st, int p, int s, double now)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    int moved = 0;

    for (;;) {
        geoNetRequest *r = NULL;
        const char *plain = NULL; /* what a data frame's payload is made of */
        if (!c->s_active) {
            if (c->track && (c->r_count > c->a_sent || c->tell))
                c->s_kind = SEND_ACK;
            else if (c->track && c->again < c->s_count)
                c->s_kind = SEND_AGAIN;
            else
                c->s_kind = SEND_DATA;
        }
        if (c->s_kind == SEND_DATA) {
            r = tcpCursorReq(peer, GEO_NET_SEND, s, &c->s_seq, &c->s_frame);
            if (r == NULL)
                return moved;
            plain = r->buf + c->s_frame * GEO_TCP_FRAME;
        } else if (c->s_kind == SEND_AGAIN) {
            plain = (const char *)tcpKeptAt(c, (size_t)(c->again - c->k_base))->data;
        }
        if (!c->s_active) {
            if (c->s_kind == SEND_ACK) {
                hdr_fill(&c->s_hdr, GEO_ACK_MAGIC, 0, c->r_count, 0, 0);
                c->a_sent = c->r_count;
                c->tell = 0;
            } else if (c->s_kind == SEND_AGAIN) {
                c->s_hdr = tcpKeptAt(c, (size_t)(c->again - c->k_base))->hdr;
            } else {
                hdr_fill(&c->s_hdr, GEO_FRAME_MAGIC, (uint32_t)frame_len(r, c->s_frame), r->seq,
                         (uint64_t)c->s_frame * GEO_TCP_FRAME, r->size);
            }
            c->s_off = 0;
            c->s_active = 1;
            c->s_out = c->s_buf;
            if (c->enc && c->track && c->s_kind == SEND_DATA) {
                tcpKept *k = tcpKeptSlot(c); /* sealed into the slot it will be kept in */
                if (k != NULL)
                    c->s_out = k->data;
            }
            if (c->enc && geoAeadSeal(&c->tx_aead, c->s_ctr++, &c->s_hdr, sizeof(c->s_hdr),
                                      plain ? plain : (const char *)c->s_buf, c->s_out,
                                      c->s_hdr.len, c->s_out + c->s_hdr.len) != 0) {
                tcpPeerError(st, p, s, "could not be sent a frame: encryption failed (out of "
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
                    tcpKeptPush(c, &c->s_hdr, NULL, c->s_out, c->s_ctr - 1);
                else
                    tcpKeptPush(c, &c->s_hdr, plain, NULL, 0);
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
        if (r == NULL && tcpCursorReq(&st->peers[p], GEO_NET_SEND, s, &sq, &sf) != NULL) {
            tcpPeerError(st, p, s, "closed the connection while we sent to it (it died, or gave "
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
        tcpPeerError(st, p, s, why);
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
            tcpPeerError(st, p, s, why);
            return -1;
        }
        c->r_ctr++;
    }
    if (h->seq > c->s_count || h->seq < c->a_got) {
        snprintf(why, sizeof(why), "acknowledged %llu frames where %llu were sent and %llu "
                 "acknowledged before (a corrupt stream)", (unsigned long long)h->seq,
                 (unsigned long long)c->s_count, (unsigned long long)c->a_got);
        tcpPeerError(st, p, s, why);
        return -1;
    }
    c->a_got = h->seq;
    c->confirmed = 1; /* the connector's handshake finished: see hello_admit */
    tcpKeptAck(c, h->seq);
    return 0;
}

/* Pull bytes from one connection.  A TCP connection (c->track) reads
 * headers whenever they come, so that acks are taken at once; a data
 * header then waits until its receive is posted.  Others read only for a
 * posted receive. */
int tcpProgressRecv(tcpState *st, int p, int s, double now)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    int moved = 0;

    for (;;) {
        geoNetRequest *r = tcpCursorReq(peer, GEO_NET_RECV, s, &c->r_seq, &c->r_frame);
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
                tcpPeerError(st, p, s, "sent a malformed acknowledgement (a corrupt stream)");
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
                    tcpPeerError(st, p, s, why);
                    return moved;
                }
                r->size = h->total;
                r->nframes = h->total ? tcpFrameCount(h->total) : 1;
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
                tcpPeerError(st, p, s, why);
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
                tcpPeerError(st, p, s, why);
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
