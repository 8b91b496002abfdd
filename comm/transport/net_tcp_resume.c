/* Resume after a reset (net_tcp_internal.h, "Resume after a reset"): the
 * frames kept until the peer acknowledges them, taking a reset connection
 * down, dialling it again or probing the dialler's listener, accepting
 * resumes after set-up, and sending again what the peer lacks. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/transport/admit.h"
#include "comm/transport/net_tcp_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

tcpKept *tcpKeptAt(tcpConn *c, size_t i)
{
    return &c->kept[(c->k_head + i) % c->k_cap];
}

/* The slot the next kept frame goes to (growing the ring up to c->k_max
 * slots), with its buffer; NULL when the ring is full or memory is out. */
tcpKept *tcpKeptSlot(tcpConn *c)
{
    if (c->k_len == c->k_cap && c->k_cap < c->k_max) {
        size_t ncap = c->k_cap ? 2 * c->k_cap : 8;
        if (ncap > c->k_max)
            ncap = c->k_max;
        tcpKept *nk = calloc(ncap, sizeof(*nk));
        if (nk != NULL) {
            for (size_t i = 0; i < c->k_cap; i++)
                nk[i] = *tcpKeptAt(c, i); /* the unused slots' buffers move too */
            free(c->kept);
            c->kept = nk;
            c->k_head = 0;
            c->k_cap = ncap;
        }
    }
    tcpKept *k = c->k_len < c->k_cap ? tcpKeptAt(c, c->k_len) : NULL;
    if (k != NULL && k->data == NULL)
        k->data = malloc(GEO_TCP_FRAME + GEO_AEAD_TAG_BYTES);
    return k != NULL && k->data != NULL ? k : NULL;
}

/* Keep the frame just sent whole (frame number c->s_count): a copy of its
 * plaintext, or (sealed != NULL) the frame already sealed into the slot
 * tcpKeptSlot gave when it was sealed, with counter ctr.  Beyond c->k_max
 * slots keep none until the receiver has caught up: the connection is then
 * not resumable until it has (tcpConnResumed says so). */
void tcpKeptPush(tcpConn *c, const tcpFrameHdr *h, const void *payload,
                      const uint8_t *sealed, uint64_t ctr)
{
    tcpKept *k = sealed != NULL ? tcpKeptAt(c, c->k_len) : tcpKeptSlot(c);
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
        tcpKept *k = tcpKeptAt(c, i);
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
void tcpKeptAck(tcpConn *c, uint64_t n)
{
    while (c->k_len > 0 && c->k_base < n) {
        c->k_head = (c->k_head + 1) % c->k_cap;
        c->k_len--;
        c->k_base++;
    }
    if (c->k_len == 0 && c->k_base < n)
        c->k_base = n;
}

void tcpKeptFree(tcpConn *c)
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

/* Shut the resume handshakes still in progress (tcpBreakLocked). */
void tcpPendShut(tcpState *st)
{
    for (int i = 0; i < st->nrpend; i++)
        if (st->rpend[i].state < HS_DONE && st->rpend[i].fd >= 0)
            shutdown(st->rpend[i].fd, SHUT_RDWR);
}

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
    tcpConnKeysFree(c);
}

void tcpConnFail(tcpState *st, int p, int s, int err, const char *what)
{
    tcpConn *c = &st->peers[p].conns[s];
    char a[GEO_ADDR_STRLEN];
    if (st->broken || st->stop || c->down)
        return;
    if (!c->track || !st->running || st->reconnect_s <= 0 || !resettable(err)) {
        tcpPeerError(st, p, s, what);
        return;
    }
    geoWarn(GEO_LOG_NET, "rank %d (%s, host %s), stream %d: %s; %s (for up to %.0f s, "
            "GEOCCL_RECONNECT_TIMEOUT)", p, tcpPeerStr(st, p, a), st->ctx->peers[p].host, s,
            what, p < st->ctx->rank ? "dialling again" : "waiting for it to dial again",
            st->reconnect_s);
    conn_down(st, p, s);
    if (p < st->ctx->rank) {
        c->dial = calloc(1, sizeof(tcpHs));
        if (c->dial == NULL) {
            tcpPeerError(st, p, s, "reset the connection, and we are out of memory to dial again");
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
void tcpResumeClaim(tcpState *st, tcpHs *h)
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
            tcpHsDrop(st, o, "replaced by a newer resume of the same connection");
    }
}

void tcpConnFreeResume(tcpConn *c)
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

/* The new incarnation is up (c->fd) and the peer has n of our frames
 * whole: send the rest again, then go on. */
void tcpConnResumed(tcpState *st, int p, int s, uint64_t n)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    char why[256], redials[128] = "";
    if (c->dial != NULL && c->dial->drops > 0) /* strangers crowding its listener, or a path */
        snprintf(redials, sizeof(redials), "; %d of our dials before were closed during the "
                 "handshake and dialled again", c->dial->drops);
    tcpConnFreeResume(c);
    c->down = 0;
    c->refused_since = 0;
    geoSocketTune(c->fd);
    geoSocketSetNonBlocking(c->fd, 1);
    c->bbr_since = 0; /* a new connection: when its BBR's window began is not known */
    c->bbr_restarts = 0;
    if (peer->cc[0])
        setsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, peer->cc, (socklen_t)strlen(peer->cc));
    if (peer->pace)
        tcpConnPace(c, peer->pace, peer->active);
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
        tcpPeerError(st, p, s, why);
        return;
    }
    tcpKeptAck(c, n);
    c->a_got = n;
    c->again = n;
    c->a_sent = c->r_count; /* the handshake told it */
    uint64_t bytes = 0;
    for (size_t i = 0; i < c->k_len; i++)
        bytes += tcpKeptAt(c, i)->hdr.len;
    peer->reconnects++;
    geoInfo(GEO_LOG_NET, "rank %d, stream %d: resumed %.3f s after the reset (reconnect %llu "
            "with this rank); sending %llu frames (%llu bytes) again, it had %llu of %llu%s",
            p, s, geoNow() - c->down_since, (unsigned long long)peer->reconnects,
            (unsigned long long)c->k_len, (unsigned long long)bytes, (unsigned long long)n,
            (unsigned long long)c->s_count, redials);
}

/* The peer's process is gone (its listener refuses us): an error when
 * something is pending with it, else it only counts as closed. */
static void peer_gone(tcpState *st, int p, int s, const char *what)
{
    tcpPeer *peer = &st->peers[p];
    tcpConn *c = &peer->conns[s];
    if (peer->q[GEO_NET_SEND] != NULL || peer->q[GEO_NET_RECV] != NULL) {
        tcpPeerError(st, p, s, what);
        return;
    }
    geoInfo(GEO_LOG_NET, "rank %d, stream %d: %s; nothing was pending with it, so it counts "
            "as closed", p, s, what);
    tcpConnFreeResume(c);
    c->down = 0;
    c->closed = 1;
    peer->closed_by_peer = 1;
    peer->gone = 1;
}

int tcpRefusedForGood(tcpConn *c, double now)
{
    if (c->refused_since <= 0)
        c->refused_since = now;
    return now - c->refused_since >= GEO_GONE_CONFIRM_S;
}

/* A dial of ours failed (why: how); a refusal or a reset dials again. */
void tcpDialFailed(tcpState *st, int p, int s, const char *why)
{
    tcpConn *c = &st->peers[p].conns[s];
    if (c->dial->err == ECONNREFUSED && tcpRefusedForGood(c, geoNow())) {
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
         * GEOCCL_RECONNECT_TIMEOUT of the first reset (tcpPollDown). */
        if (c->dial->fd >= 0)
            close(c->dial->fd);
        *c->dial = (tcpHs){.fd = -1, .out = 1, .resume = 1, .state = HS_RETRY, .peer = p,
                           .stream = s, .when = geoNow() + 0.01, .backoff = 1e-3};
        return;
    }
    tcpBreakLocked(st, GEO_ERR(st->ctx->err, ncclRemoteError, "%s", why));
}

/* A connection that is down: give up after the reconnect timeout, drive
 * our dial, or probe the peer's listener.  Returns the entries used. */
int tcpPollDown(tcpState *st, int p, int s, double now, struct pollfd *pfd,
                     tcpPollRef *map, int n)
{
    geoNetCtx *ctx = st->ctx;
    tcpConn *c = &st->peers[p].conns[s];
    char why[200];
    if (now - c->down_since > st->reconnect_s) {
        snprintf(why, sizeof(why), "reset the connection and it was not re-established within "
                 "%.0f s (GEOCCL_RECONNECT_TIMEOUT)", st->reconnect_s);
        tcpPeerError(st, p, s, why);
        return n;
    }
    if (c->dial != NULL) {
        tcpHs *h = c->dial;
        if (h->state == HS_RETRY) {
            char fail[GEO_ERR_TEXT_LEN];
            int rc = tcpHsOutStep(st, h, now, c->down_since + st->reconnect_s, fail);
            if (rc > 0) {
                tcpConnResumed(st, p, s, h->ack.count);
                return n;
            }
            if (rc < 0) {
                tcpDialFailed(st, p, s, fail);
                return n;
            }
        }
        if (h->fd >= 0) {
            pfd[n] = (struct pollfd){.fd = h->fd, .events = tcpHsEvents(h)};
            map[n++] = (tcpPollRef){PK_DIAL, p, s, h->fd};
        }
        return n;
    }
    if (c->probe_fd < 0 && now >= c->probe_when &&
        geoSocketConnectStart(&ctx->peers[p].addr, &c->probe_fd) != 0) {
        c->probe_fd = -1;
        if (errno == ECONNREFUSED && tcpRefusedForGood(c, now)) {
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

void tcpProbeDone(tcpState *st, int p, int s, double now)
{
    tcpConn *c = &st->peers[p].conns[s];
    int err = geoSocketConnectResult(c->probe_fd);
    close(c->probe_fd);
    c->probe_fd = -1;
    if (err == ECONNREFUSED && tcpRefusedForGood(c, now)) {
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
 * dropping an unproven one of the loudest source prefix, never a proven
 * one: st->rpend_cap). */
void tcpAcceptResumes(tcpState *st, double now)
{
    for (int taken = 0; taken < 16; taken++) {
        tcpHs h = {.out = 0, .resume = 1, .state = HS_CHALLENGE, .peer = -1, .stream = -1};
        geoSockAddr from;
        int got = geoSocketAcceptNB(st->listen_fd, &h.fd, &from);
        if (got < 0 && (errno == EMFILE || errno == ENFILE) &&
            tcpMakeRoom(st, st->rpend, st->nrpend, NULL, 0, 0, "dropped to make room (out of "
                        "file descriptors)") != 0)
            /* None of ours to take back: leave the backlog alone a while
             * rather than spin on it (resumes wait there meanwhile). */
            st->listen_paused_until = now + GEO_ADMIT_PAUSE_S;
        if (got <= 0)
            return; /* nothing more, out of descriptors, or a transient error: the
                     * next pass tries again */
        geoAddrToString(&from, h.from);
        h.group = geoAdmitGroupOf(&st->known, &from);
        /* Slots held by resumes that have proved themselves are not the
         * strangers' to take. */
        int proven = 0;
        for (int k = 0; k < st->nrpend; k++)
            proven += st->rpend[k].state == HS_ACK;
        int room = tcpMakeRoom(st, st->rpend, st->nrpend, &h.group, st->rpend_group,
                               st->rpend_cap - proven, "dropped to make room for "
                               "newer connections (its source held the most)");
        int i = st->nrpend;
        if (i == st->rpend_cap) { /* reuse an entry done with or dropped */
            for (i = 0; i < st->nrpend && st->rpend[i].state < HS_DONE; i++)
                ;
        }
        if (room == GEO_ADMIT_REFUSE || i == st->rpend_cap) {
            tcpHsDrop(st, &h, "dropped: every slot holds a peer's resume");
            continue;
        }
        if (geoRandomBytes(h.challenge, sizeof(h.challenge)) != 0) {
            geoWarn(GEO_LOG_NET, "dropped connection from %s: no randomness for its challenge",
                    h.from);
            close(h.fd);
            continue;
        }
        h.when = now + GEO_TCP_HANDSHAKE_S;
        if (i == st->nrpend)
            st->nrpend++;
        st->rpend[i] = h;
        if (tcpHsInStep(st, &st->rpend[i]) <= 0)
            continue;
        if (st->rpend[i].lazy)
            tcpLazyUp(st, st->rpend[i].peer, st->rpend[i].stream);
        else
            tcpConnResumed(st, st->rpend[i].peer, st->rpend[i].stream, st->rpend[i].hello.count);
    }
}
