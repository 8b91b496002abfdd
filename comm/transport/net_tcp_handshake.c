/* One connection's handshake, in either role: the connector's hello and
 * the acceptor's answer, each an HMAC of the communicator's secret over
 * both ends' fresh values, the ephemeral X25519 exchange, the per-
 * connection keys of an encrypted connection and the resumption secret of
 * a TCP one, which a resume must prove, and which hellos may take a slot
 * (hello_admit).  Non-blocking steps, driven by set-up (net_tcp_setup.c)
 * and, for resumes, by the progress thread (net_tcp_resume.c).  The
 * protocol: net_tcp_internal.h. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/transport/net_tcp_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* HMAC(key, label | comm_hash | from | to | stream | encrypt | cipher |
 * resume | connector's count | acceptor's count | Ca | Cc | connector's
 * X25519 key | acceptor's [| claim]).  Under the communicator's secret,
 * without claim: the connector's proof (label "geoccl/v2/hello", cipher its
 * preference, no acceptor key or count yet) and the acceptor's (label
 * "geoccl/v2/accept", cipher its choice).  With claim: the connector's
 * second proof, cproof (tcpHello), under the communicator's secret for a
 * fresh hello ("geoccl/v2/claim") and under the connection's resumption
 * secret for a resume ("geoccl/v2/resume"), and the acceptor's answer to a
 * resume ("geoccl/v2/resumed").  The ephemeral keys are bound, so a relay
 * cannot put its own in; the counts are, so that it cannot make either end
 * skip or repeat frames when a connection resumes. */
static void hello_mac(const uint8_t *key, const geoNetCtx *ctx, const char *label,
                      const uint8_t *challenge, const tcpHello *m, int32_t cipher,
                      const uint8_t *apub, uint64_t acount, const uint8_t *claim,
                      uint8_t out[GEO_SHA256_BYTES])
{
    enum { F = 32, C = F + 24, N = C + 16, K = N + 2 * GEO_CHALLENGE_BYTES,
           L = K + 2 * GEO_X25519_BYTES };
    uint8_t msg[L + GEO_CHALLENGE_BYTES];
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
    if (claim != NULL)
        memcpy(msg + L, claim, GEO_CHALLENGE_BYTES);
    geoHmacSha256(key, GEO_SHA256_BYTES, msg, claim != NULL ? sizeof(msg) : L, out);
}

/* The resumption secret of a TCP connection, made at its first handshake:
 * HKDF of the communicator's secret and the ephemeral X25519 secret dh of
 * the two ends, salted with both ends' fresh nonces and bound to both ranks
 * and the stream.  Whoever holds the communicator's secret but took no part
 * in the exchange cannot derive it, even from a recording of the handshake;
 * a resume must prove it (cproof), so only the two ends of this connection
 * can replace it.  0 or -1. */
static int resume_secret(const geoNetCtx *ctx, const uint8_t *challenge, const tcpHello *m,
                         const uint8_t dh[GEO_X25519_BYTES], uint8_t out[GEO_SHA256_BYTES])
{
    uint8_t salt[2 * GEO_CHALLENGE_BYTES], info[24 + 8 + 12];
    uint8_t ikm[GEO_SHA256_BYTES + GEO_X25519_BYTES];
    int32_t f[3] = {m->rank, m->to, m->stream};
    memcpy(ikm, ctx->secret, GEO_SHA256_BYTES);
    memcpy(ikm + GEO_SHA256_BYTES, dh, GEO_X25519_BYTES);
    memcpy(salt, challenge, GEO_CHALLENGE_BYTES);
    memcpy(salt + GEO_CHALLENGE_BYTES, m->nonce, GEO_CHALLENGE_BYTES);
    memset(info, 0, 24);
    memcpy(info, "geoccl/v2/resumption", 20);
    memcpy(info + 24, &ctx->comm_hash, 8);
    memcpy(info + 32, f, sizeof(f));
    int rc = geoHkdf(ikm, sizeof(ikm), salt, sizeof(salt), info, sizeof(info), out,
                     GEO_SHA256_BYTES);
    geoWipe(ikm, sizeof(ikm));
    return rc;
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

void tcpConnKeysFree(tcpConn *c)
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

short tcpHsEvents(const tcpHs *h)
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

/* Whether a handshake makes an ephemeral X25519 exchange: for the keys of
 * an encrypted connection, and for the resumption secret of a TCP one (made
 * at its first handshake; a resume keeps it). */
static int exchanges(int encrypt, int local, int resume)
{
    return encrypt || (!local && !resume);
}

static int out_of_fds(int err)
{
    return err == EMFILE || err == ENFILE;
}

/* An encrypted connection with cipher is up: ctx->cipher_used says which
 * cipher the encrypted connections use.  Atomic: after set-up the progress
 * thread opens connections (first use, resume) while the communicator's
 * threads read it. */
static void note_cipher(geoNetCtx *ctx, int cipher)
{
    int used = __atomic_load_n(&ctx->cipher_used, __ATOMIC_RELAXED);
    __atomic_store_n(&ctx->cipher_used, used && used != cipher ? GEO_CIPHER_MIXED : cipher,
                     __ATOMIC_RELAXED);
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
 * 1: done; 0: waiting (on its socket, or until h->when); -1: failed, fail
 * says how.  It reports nothing: at set-up the failure is the init's error
 * (tcpSetupConnections reports it), a resume dial may be tried again
 * (tcpDialFailed decides). */
int tcpHsOutStep(tcpState *st, tcpHs *h, double now, double deadline,
                 char fail[GEO_ERR_TEXT_LEN])
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
                if (h->local && h->err != EAGAIN && !out_of_fds(h->err)) {
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
            {
                const tcpConn *c = &st->peers[h->peer].conns[h->stream];
                h->hello.count = h->resume ? c->r_count : 0;
                memcpy(h->hello.claim, c->claim, sizeof(h->hello.claim));
                if (h->resume && !c->has_resume_secret) {
                    why = "this connection has no resumption secret";
                    goto refused;
                }
                if (geoRandomBytes(h->hello.nonce, sizeof(h->hello.nonce)) != 0) {
                    why = "no randomness for our nonce";
                    goto refused;
                }
                geoX25519Free(h->eph);
                h->eph = NULL;
                if (exchanges(h->hello.encrypt, h->local, h->resume) &&
                    geoX25519New(&h->eph, h->hello.pub) != 0) {
                    why = "cannot make an X25519 key (out of memory?)";
                    goto refused;
                }
                hello_mac(ctx->secret, ctx, "geoccl/v2/hello", h->challenge, &h->hello,
                          h->hello.cipher, NULL, 0, NULL, h->hello.proof);
                hello_mac(h->resume ? c->resume_secret : ctx->secret, ctx,
                          h->resume ? "geoccl/v2/resume" : "geoccl/v2/claim", h->challenge,
                          &h->hello, h->hello.cipher, NULL, 0, h->hello.claim, h->hello.cproof);
            }
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
                tcpConn *c = &st->peers[h->peer].conns[h->stream];
                hello_mac(ctx->secret, ctx, "geoccl/v2/accept", h->challenge, &h->hello,
                          h->ack.cipher, h->ack.pub, h->ack.count, NULL, expect);
                if (h->ack.magic != GEO_ACCEPT_MAGIC ||
                    !geoDigestEqual(expect, h->ack.proof, sizeof(expect))) {
                    why = "it did not prove the communicator's secret: another program on "
                          "its address, or the connection was altered";
                    goto refused;
                }
                if (h->resume) {
                    hello_mac(c->resume_secret, ctx, "geoccl/v2/resumed", h->challenge,
                              &h->hello, h->ack.cipher, h->ack.pub, h->ack.count,
                              h->hello.claim, expect);
                    if (!geoDigestEqual(expect, h->ack.cproof, sizeof(expect))) {
                        why = "it did not prove this connection's resumption secret: not "
                              "the process this connection was made with";
                        goto refused;
                    }
                }
                if (h->hello.encrypt && want_cipher != GEO_CIPHER_AES256GCM &&
                    want_cipher != GEO_CIPHER_CHACHA20POLY1305) {
                    why = "it chose no cipher for an encrypted connection";
                    goto refused;
                }
                uint8_t dh[GEO_X25519_BYTES], rs[GEO_SHA256_BYTES];
                int fresh = !h->resume && !h->local; /* its resumption secret is made now */
                int bad = h->eph != NULL && geoX25519Shared(h->eph, h->ack.pub, dh) != 0;
                bad = bad || (fresh && resume_secret(ctx, h->challenge, &h->hello, dh, rs) != 0);
                bad = bad || (h->hello.encrypt &&
                              conn_keys(ctx, c, h->challenge, &h->hello, want_cipher, 1, dh) != 0);
                if (!bad && fresh) {
                    memcpy(c->resume_secret, rs, sizeof(rs));
                    c->has_resume_secret = 1;
                    c->tell = 1;
                }
                geoWipe(rs, sizeof(rs));
                geoWipe(dh, sizeof(dh));
                geoX25519Free(h->eph);
                h->eph = NULL;
                if (bad) {
                    why = "cannot set up its encryption (a bad X25519 key, or out of memory)";
                    goto refused;
                }
                if (h->hello.encrypt)
                    note_cipher(ctx, want_cipher);
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
    /* Out of descriptors: set-up drops a stranger to make room (st->fd_short),
     * and the dial is tried again like a refused one (a resume dial too). */
    if (out_of_fds(h->err) && !h->resume)
        st->fd_short = 1;
    /* After set-up a listener is open for the peer's whole life: a
     * refused connect means its process is gone. */
    if ((geoSocketRetryable(h->err) || out_of_fds(h->err)) && now < deadline &&
        !(h->resume && h->err == ECONNREFUSED)) {
        h->state = HS_RETRY;
        h->when = now + h->backoff;
        if (h->backoff < 0.1)
            h->backoff *= 2;
        return 0;
    }
    snprintf(fail, GEO_ERR_TEXT_LEN, "%s: cannot connect to rank %d at %s (host %s), stream "
             "%d: %s%s", h->resume || h->lazy ? geoErrOp(ctx->err) : "init", h->peer,
             tcpPeerStr(st, h->peer, pa), ctx->peers[h->peer].host, h->stream, strerror(h->err),
             h->resume ? (h->err == ECONNREFUSED ? " (its process is gone)"
                                                 : " (reconnecting after a reset)")
                       : "");
    return -1;
wait_or_refused:
    if (rc == 0)
        return 0;
    /* Closed or reset before the peer proved itself: it may have dropped
     * us among a flood of unproven connections (tcpSetupConnections makes
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
    snprintf(fail, GEO_ERR_TEXT_LEN, "%s: rank %d at %s (host %s) closed our connection on "
             "stream %d during the handshake %d times (%s): it refused our proof, or dropped "
             "us among many unproven connections",
             h->resume || h->lazy ? geoErrOp(ctx->err) : "init",
             h->peer, tcpPeerStr(st, h->peer, pa), ctx->peers[h->peer].host, h->stream, h->drops,
             why);
    return -1;
refused:
    snprintf(fail, GEO_ERR_TEXT_LEN, "%s: refused rank %d at %s (host %s) on stream %d: %s",
             h->resume || h->lazy ? geoErrOp(ctx->err) : "init", h->peer,
             tcpPeerStr(st, h->peer, pa), ctx->peers[h->peer].host, h->stream, why);
    return -1;
}

void tcpHsDrop(tcpState *st, tcpHs *h, const char *why)
{
    if (why != NULL && st->dropped++ < GEO_TCP_DROP_LOG)
        geoWarn(GEO_LOG_NET, "dropped connection from %s: %s%s", h->from, why,
                st->dropped == GEO_TCP_DROP_LOG ? " (further drops are only counted)" : "");
    if (h->state == HS_ACK) { /* release the slot it claimed */
        tcpConn *c = &st->peers[h->peer].conns[h->stream];
        c->fd = -1;
        c->acking = 0;
        c->local = 0;
        tcpConnKeysFree(c);
        if (!h->resume || h->lazy) { /* never connected: the slot is free again */
            geoWipe(c->resume_secret, sizeof(c->resume_secret));
            c->has_resume_secret = 0;
        }
    }
    close(h->fd);
    h->fd = -1;
    h->state = HS_DROPPED;
}

/* Whether hello m, which proved the communicator's secret, may take its
 * slot on the connection h accepted: 0 if so; else the reason in text and
 * 1 where the rank itself may send it (a resume before our set-up is
 * over, a re-dial while our ack is still going out: it tries again), -1
 * where only a confused or hostile holder of the secret would.
 *  - A resume (after set-up, on a TCP slot) must prove the slot's
 *    resumption secret, bound to our fresh challenge, and claim a count of
 *    our frames between those it acknowledged and those we sent: one that
 *    does not is refused alone, and the connection it would replace is
 *    kept.  Holding the communicator's secret is not enough.
 *  - A fresh hello takes a free slot at set-up.  It also takes a TCP slot
 *    already taken when its connector lost our ack (a reset during its
 *    handshake) and so dials afresh: only with the slot's claim (the random
 *    value of the connector's first hello), with nothing received on the
 *    slot and before the connector has sent on it (confirmed: its
 *    handshake finished, it knows the resumption secret).  After set-up the
 *    slot then resumes with its count 0 (what we sent meanwhile is kept and
 *    goes again).  While our ack is still going out (acking) the old
 *    attempt holds the slot: its failure frees it, and the dialler tries
 *    again.
 *  - After set-up a fresh hello takes a slot that was never connected
 *    (unopened: set-up skipped the pair, which connects on first use), on
 *    the same terms as a free slot at set-up. */
static int hello_admit(const tcpState *st, const tcpHs *h, const tcpHello *m, char *text,
                       size_t len)
{
    const geoNetCtx *ctx = st->ctx;
    const tcpConn *c = &st->peers[m->rank].conns[m->stream];
    uint8_t expect[GEO_SHA256_BYTES];
    if (m->resume) {
        if (!h->resume || !c->track || !c->has_resume_secret) {
            snprintf(text, len, "rank %d, stream %d: a resume of a connection that is not "
                     "resumed (%s)", m->rank, m->stream,
                     !h->resume ? "our set-up is not over" : "a same-host socket");
            return 1;
        }
        hello_mac(c->resume_secret, ctx, "geoccl/v2/resume", h->challenge, m, m->cipher, NULL,
                  0, m->claim, expect);
        if (!geoDigestEqual(expect, m->cproof, sizeof(expect))) {
            snprintf(text, len, "claiming rank %d, stream %d: its resume does not prove the "
                     "connection's resumption secret (it holds the communicator's secret but "
                     "is not that end of the connection); the connection is kept", m->rank,
                     m->stream);
            return -1;
        }
        if (m->count > c->s_count || m->count < c->a_got) {
            snprintf(text, len, "rank %d, stream %d: its resume claims %llu of our frames, "
                     "where %llu were sent and %llu acknowledged; the connection is kept",
                     m->rank, m->stream, (unsigned long long)m->count,
                     (unsigned long long)c->s_count, (unsigned long long)c->a_got);
            return -1;
        }
        return 0;
    }
    hello_mac(ctx->secret, ctx, "geoccl/v2/claim", h->challenge, m, m->cipher, NULL, 0,
              m->claim, expect);
    if (!geoDigestEqual(expect, m->cproof, sizeof(expect))) {
        snprintf(text, len, "claiming rank %d, stream %d: its hello was altered on the way",
                 m->rank, m->stream);
        return -1;
    }
    if (!h->resume && c->fd < 0)
        return 0; /* set-up: a free slot */
    if (h->resume && c->unopened && c->fd < 0 && m->count == 0) {
        if (!c->acking)
            return 0; /* first use */
        snprintf(text, len, "rank %d, stream %d: dialled again while our ack to its first "
                 "connection is still going out", m->rank, m->stream);
        return 1;
    }
    if (m->count != 0 || c->r_count != 0 || c->confirmed ||
        !geoDigestEqual(m->claim, c->claim, sizeof(c->claim)) ||
        (h->resume ? !c->track : c->local || h->local)) {
        snprintf(text, len, "claiming rank %d, stream %d: a fresh connection for one that is "
                 "up (only a resume proving its resumption secret may replace it); the "
                 "connection is kept", m->rank, m->stream);
        return -1;
    }
    if (!h->resume && c->acking) {
        snprintf(text, len, "rank %d, stream %d: dialled again while our ack to its previous "
                 "connection is still going out", m->rank, m->stream);
        return 1;
    }
    return 0;
}

/* Advance an accepted handshake without blocking.  A stranger gets 16
 * random bytes and nothing else.  1: done; 0: waiting; -1: dropped
 * (logged and closed).  At set-up, a handshake that replaces its slot's
 * earlier connection (which set-up counted as done) adds 1 to
 * st->uncounted when it closes that one. */
int tcpHsInStep(tcpState *st, tcpHs *h)
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
                m->stream >= st->nstreams) {
                tcpHsDrop(st, h, "not a valid hello for this communicator");
                return -1;
            }
            hello_mac(ctx->secret, ctx, "geoccl/v2/hello", h->challenge, m, m->cipher, NULL, 0,
                      NULL, expect);
            if (!geoDigestEqual(expect, m->proof, sizeof(expect))) {
                char claim[96];
                snprintf(claim, sizeof(claim), "claiming rank %d: it does not hold the "
                         "communicator's secret", m->rank);
                tcpHsDrop(st, h, claim);
                return -1;
            }
            /* Refused after proving the communicator's secret: a holder of
             * it, not a stranger, so each is logged (strangers' drops are
             * only counted beyond the first few). */
            char refusal[320];
            int admit = hello_admit(st, h, m, refusal, sizeof(refusal));
            if (admit < 0)
                geoWarn(GEO_LOG_NET, "dropped connection from %s: %s", h->from, refusal);
            if (admit != 0) {
                tcpHsDrop(st, h, admit < 0 ? NULL : refusal);
                return -1;
            }
            int enc = ctx->encrypt != NULL && ctx->encrypt[m->rank];
            if (m->encrypt != enc) {
                char claim[128];
                snprintf(claim, sizeof(claim), "rank %d %s encrypt this connection, we %s: "
                         "the two ends disagree on the table", m->rank,
                         m->encrypt ? "would" : "would not", enc ? "would" : "would not");
                tcpHsDrop(st, h, claim);
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
            h->lazy = h->resume && !m->resume && c->unopened;
            if (h->lazy) {
                c->acking = 1; /* the slot is ours; installed once our ack is out */
            } else if (h->resume) {
                if (!m->resume)
                    geoInfo(GEO_LOG_NET, "rank %d, stream %d: it dialled again at set-up after "
                            "our ack was lost, and our set-up is over: resuming the connection "
                            "from its start", h->peer, h->stream);
                tcpResumeClaim(st, h);
            } else if (c->fd >= 0) {
                /* Set-up, and the slot was taken by its earlier attempt,
                 * which our ack never reached whole (hello_admit): this
                 * proven attempt replaces it. */
                geoInfo(GEO_LOG_NET, "rank %d, stream %d: it dialled again at set-up after "
                        "our ack was lost; replacing its first connection", h->peer, h->stream);
                close(c->fd);
                c->fd = -1;
                c->local = 0;
                tcpConnKeysFree(c);
                st->uncounted++;
            }
            /* A proven resume shows that the connector finished its first
             * handshake; a fresh claim is the connector's first. */
            c->confirmed = m->resume;
            if (!m->resume)
                memcpy(c->claim, m->claim, sizeof(c->claim));
            memset(&h->ack, 0, sizeof(h->ack));
            h->ack.count = h->resume ? c->r_count : 0;
            if (exchanges(enc, h->local, m->resume)) {
                void *eph = NULL;
                uint8_t dh[GEO_X25519_BYTES], rs[GEO_SHA256_BYTES];
                int fresh = !m->resume && !h->local; /* its resumption secret is made now */
                int bad = geoX25519New(&eph, h->ack.pub) != 0 ||
                          geoX25519Shared(eph, m->pub, dh) != 0 ||
                          (fresh && resume_secret(ctx, h->challenge, m, dh, rs) != 0) ||
                          (enc && conn_keys(ctx, c, h->challenge, m, cipher, 0, dh) != 0);
                if (!bad && fresh) {
                    memcpy(c->resume_secret, rs, sizeof(rs));
                    c->has_resume_secret = 1;
                }
                geoX25519Free(eph);
                geoWipe(rs, sizeof(rs));
                geoWipe(dh, sizeof(dh));
                if (bad) {
                    tcpHsDrop(st, h, "cannot set up its keys (a bad X25519 key, or out of "
                            "memory)");
                    return -1;
                }
            }
            if (enc)
                note_cipher(ctx, cipher);
            if (!h->resume) { /* a resumed connection is installed once our ack is out */
                c->fd = h->fd;
                c->local = h->local;
                c->acking = 1;
                c->bbr_since = 0; /* when its BBR's window began is not known */
            }
            h->ack.magic = GEO_ACCEPT_MAGIC;
            h->ack.cipher = cipher;
            hello_mac(ctx->secret, ctx, "geoccl/v2/accept", h->challenge, m, cipher, h->ack.pub,
                      h->ack.count, NULL, h->ack.proof);
            if (m->resume)
                hello_mac(c->resume_secret, ctx, "geoccl/v2/resumed", h->challenge, m, cipher,
                          h->ack.pub, h->ack.count, m->claim, h->ack.cproof);
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
         * alive (see tcpConnFail), or a scan. */
        geoTrace(GEO_LOG_NET, "connection from %s closed before its hello", h->from);
        close(h->fd);
        h->fd = -1;
        h->state = HS_DROPPED;
        return -1;
    }
    char text[128];
    snprintf(text, sizeof(text), "handshake failed (%s)", why);
    tcpHsDrop(st, h, text);
    return -1;
}
