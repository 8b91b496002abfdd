/* Opening every connection of a rank at init: all handshakes, outgoing and
 * accepted, in one poll() loop with one deadline, and the bounded table of
 * accepted connections that have not proved themselves yet (shared with the
 * resumes accepted after set-up).  The handshake itself:
 * net_tcp_handshake.c. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/transport/admit.h"
#include "comm/transport/net_tcp_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Set-up runs in the calling thread as one poll() loop that drives every
 * handshake at once, in both directions: the connections this rank opens
 * (all started together) and those it accepts (each accepted at once and
 * given its own deadline).  Over a WAN init then costs a few round trips,
 * not a few per connection, and a stranger that never answers holds only
 * its own slot until its deadline, never a legitimate peer. */

/* Unproven accepted connections are all served at once, so that idle
 * strangers cannot make a peer wait its turn in the backlog; a stranger
 * costs one descriptor until its deadline.  How many may be held, in all
 * and from one source (a peer's host, or a prefix), follows from
 * RLIMIT_NOFILE (admit.h), at most GEO_TCP_MAX_PENDING (each pass of the
 * loop polls them all); beyond that a stranger's of the loudest source
 * gives way, a peer's only when no stranger's is left (a peer dropped so
 * dials again until the deadline).  At most GEO_TCP_ACCEPTS_PER_PASS are
 * taken per pass, so that a flood cannot keep the loop from driving the
 * handshakes already under way. */
#define GEO_TCP_ACCEPTS_PER_PASS 64

/* An accepted handshake at set-up: how many more of the slots set-up
 * waits for are taken for good (1 when it finished, less one for an
 * earlier connection it replaced).  A peer set-up does not wait for (not
 * in ctx->want) may dial all the same, for its first message after its
 * own init: its connection is taken, and not counted. */
static int setup_in_step(tcpState *st, tcpHs *h)
{
    int done = tcpHsInStep(st, h) > 0 ? 1 : 0;
    done -= st->uncounted;
    st->uncounted = 0;
    return h->peer >= 0 && !tcpWanted(st->ctx, h->peer) ? 0 : done;
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

/* Report the deadline's passing, naming the first connection still
 * missing; note ends the text (what else went wrong, or ""). */
static ncclResult_t setup_timeout_error(tcpState *st, const tcpHs *out, int nout, int out_done,
                                        int in_done, int nin, const char *note)
{
    geoNetCtx *ctx = st->ctx;
    char pa[GEO_ADDR_STRLEN], stage[96];

    for (int i = 0; i < nout; i++) {
        const tcpHs *h = &out[i];
        if (h->state == HS_DONE)
            continue;
        return GEO_ERR(ctx->err, ncclRemoteError, "init: timed out after %.0f s connecting "
                       "to rank %d at %s (host %s), stream %d (%s); %d of %d outgoing and %d "
                       "of %d incoming connections were up%s", ctx->timeout, h->peer,
                       tcpPeerStr(st, h->peer, pa), ctx->peers[h->peer].host, h->stream,
                       hs_out_stage(h, stage), out_done, nout, in_done, nin, note);
    }
    for (int p = ctx->rank + 1; p < ctx->nranks; p++)
        for (int s = 0; s < st->nstreams; s++) {
            if (st->peers[p].conns[s].fd >= 0 || !tcpWanted(ctx, p))
                continue;
            return GEO_ERR(ctx->err, ncclRemoteError, "init: timed out after %.0f s waiting "
                           "for rank %d at %s (host %s) to connect stream %d; %d of %d "
                           "incoming connections were up%s", ctx->timeout, p,
                           tcpPeerStr(st, p, pa), ctx->peers[p].host, s, in_done, nin, note);
        }
    return GEO_ERR(ctx->err, ncclRemoteError, "init: timed out after %.0f s acknowledging "
                   "incoming connections; %d of %d were up%s", ctx->timeout, in_done, nin, note);
}

/* An accepted handshake's source group while it is unproven (waiting for
 * a hello): what the admission policy may drop. */
static const geoAdmitGroup *unproven_group(const void *tab, int i)
{
    const tcpHs *h = (const tcpHs *)tab + i;
    return h->state < HS_ACK ? &h->group : NULL;
}

/* Make room for a connection of group `from` (NULL: out of descriptors,
 * one must go) by dropping the unproven handshake the admission policy
 * picks (geoAdmitVictim): a stranger's of the loudest group, at random,
 * so that a flood can neither aim at a peer's nor crowd it out; a peer
 * dropped all the same dials again (tcpHsOutStep).  A proven one never
 * goes. */
int tcpMakeRoom(tcpState *st, tcpHs *pend, int npend, const geoAdmitGroup *from, int per_group,
                int most, const char *why)
{
    int i = geoAdmitVictim(pend, npend, unproven_group, from, per_group, most);
    if (i < 0)
        return i;
    tcpHsDrop(st, &pend[i], why);
    return 0;
}

static int out_of_fds(int err)
{
    return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

/* Open every connection of this rank that ctx->want names; bounded by
 * ctx->timeout and the abort flag. */
ncclResult_t tcpSetupConnections(tcpState *st)
{
    geoNetCtx *ctx = st->ctx;
    int nout = 0, nin = 0;
    for (int p = 0; p < ctx->nranks; p++)
        if (p != ctx->rank && tcpWanted(ctx, p))
            *(p < ctx->rank ? &nout : &nin) += st->nstreams;
    int out_done = 0, in_done = 0, npend = 0, cap_pend = 0, cap_pfd = 0, starved = 0;
    double start = geoNow(), deadline = start + ctx->timeout, paused_until = 0;
    /* Descriptors this communicator will hold for itself: each connection,
     * a second one while it is dialled again after a reset, and the resume
     * listener's table; strangers get a share of the rest. */
    int needs = 2 * (ctx->nranks - 1) * st->nstreams + GEO_TCP_RESUME_PENDING + GEO_ADMIT_SLACK;
    int budget = geoAdmitBudget("init", needs, GEO_TCP_MAX_PENDING);
    int per_group = geoAdmitPerGroup(budget);
    tcpHs *out = calloc((size_t)(nout > 0 ? nout : 1), sizeof(*out));
    tcpHs *pend = NULL;           /* accepted, not yet done */
    struct pollfd *pfd = NULL;
    int *map = NULL;              /* pfd index -> out index, or -1 - pend index */
    ncclResult_t res = ncclSuccess;
    char fail[GEO_ERR_TEXT_LEN];

    if (out == NULL)
        goto oom;
    {
        /* The peers' hosts: a connection from one is counted apart from
         * strangers, and dropped for room only when no stranger's is left. */
        geoSockAddr *hosts = calloc((size_t)ctx->nranks, sizeof(*hosts));
        for (int p = 0; hosts != NULL && p < ctx->nranks; p++)
            if (p != ctx->rank)
                hosts[p] = ctx->peers[p].addr;
        if (hosts == NULL || geoAdmitPeersInit(&st->known, hosts, ctx->nranks) != 0) {
            free(hosts);
            goto oom;
        }
        free(hosts);
    }
    if (geoSocketSetNonBlocking(st->listen_fd, 1) != 0) { /* the local one already is */
        res = GEO_ERR(ctx->err, ncclSystemError, "init: cannot make the listener "
                      "non-blocking: %s", strerror(errno));
        goto done;
    }
    for (int p = 0, i = 0; p < ctx->rank; p++)
        for (int s = 0; s < st->nstreams && tcpWanted(ctx, p); s++, i++)
            out[i] = (tcpHs){.fd = -1, .out = 1, .state = HS_RETRY, .peer = p, .stream = s,
                             .when = start, .backoff = 1e-3,
                             .local = geoLocalSamePlace(&st->local, &ctx->peers[p].local)};
    /* Each slot's random claim, in every hello of the slot: a re-dial after
     * a lost ack may replace the connection the acceptor took (hello_admit). */
    for (int i = 0; i < nout; i++) {
        tcpConn *c = &st->peers[out[i].peer].conns[out[i].stream];
        if (geoRandomBytes(c->claim, sizeof(c->claim)) != 0) {
            res = GEO_ERR(ctx->err, ncclSystemError, "init: no randomness for our connections");
            goto done;
        }
    }
    while (out_done < nout || in_done < nin) {
        double now = geoNow(), wake = deadline;
        int n = 0, listening[2] = {-1, -1}; /* pfd index: TCP, same-host listener */

        if (geoErrAborted(ctx->err)) {
            res = GEO_ERR(ctx->err, ncclRemoteError, "init: aborted while connecting to peers "
                          "(%d of %d outgoing and %d of %d incoming connections were up)",
                          out_done, nout, in_done, nin);
            break;
        }
        if (now >= deadline) {
            char note[160] = "";
            if (starved)
                snprintf(note, sizeof(note), "; this process ran out of file descriptors %d "
                         "times with no stranger's to take back (RLIMIT_NOFILE: ulimit -n)",
                         starved);
            res = setup_timeout_error(st, out, nout, out_done, in_done, nin, note);
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
                int rc = tcpHsOutStep(st, h, now, deadline, fail);
                if (rc < 0) {
                    res = GEO_ERR(ctx->err, ncclRemoteError, "%s", fail);
                    goto done;
                }
                if (h->state == HS_RETRY && h->when < wake)
                    wake = h->when;
            }
            if (h->fd >= 0 && h->state != HS_DONE) {
                pfd[n] = (struct pollfd){.fd = h->fd, .events = tcpHsEvents(h)};
                map[n++] = i;
            }
        }
        if (st->fd_short) { /* a dial of ours found no descriptor */
            st->fd_short = 0;
            tcpMakeRoom(st, pend, npend, NULL, 0, 0, "dropped to make room (out of file "
                        "descriptors)");
        }
        for (int i = 0; i < npend; i++) {
            pfd[n] = (struct pollfd){.fd = pend[i].fd, .events = tcpHsEvents(&pend[i])};
            map[n++] = -1 - i;
            if (pend[i].when < wake)
                wake = pend[i].when;
        }
        if (paused_until > now && paused_until < wake)
            wake = paused_until;
        if (in_done < nin && now >= paused_until) {
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
            res = GEO_ERR(ctx->err, ncclSystemError, "init: poll failed while connecting to "
                          "peers: %s", strerror(errno));
            break;
        }
        now = geoNow();
        for (int k = 0; k < n && rc > 0; k++) {
            if (pfd[k].revents == 0 || k == listening[0] || k == listening[1])
                continue;
            if (map[k] >= 0) {
                int r = tcpHsOutStep(st, &out[map[k]], now, deadline, fail);
                if (r < 0) {
                    res = GEO_ERR(ctx->err, ncclRemoteError, "%s", fail);
                    goto done;
                }
                out_done += r;
            } else {
                in_done += setup_in_step(st, &pend[-1 - map[k]]);
            }
        }
        for (int i = 0; i < npend; i++)
            if (pend[i].state < HS_DONE && now >= pend[i].when)
                tcpHsDrop(st, &pend[i], "handshake failed (timed out)");
        for (int l = 0; l < 2; l++) {
            for (int taken = 0; listening[l] >= 0 && (pfd[listening[l]].revents & POLLIN) &&
                                taken < GEO_TCP_ACCEPTS_PER_PASS; taken++) {
                tcpHs h = {.out = 0, .state = HS_CHALLENGE, .peer = -1, .stream = -1, .local = l};
                geoSockAddr from; /* an AF_UNIX peer's address is truncated to fit: unused */
                int got = geoSocketAcceptNB(l ? st->local_fd : st->listen_fd, &h.fd, &from);
                if (got < 0 && out_of_fds(errno)) {
                    int e = errno;
                    if (tcpMakeRoom(st, pend, npend, NULL, 0, 0, "dropped to make room (out "
                                    "of file descriptors)") == 0)
                        continue;
                    /* No stranger's to take back: the rest of the process
                     * holds them.  Peers wait in the backlog meanwhile;
                     * only the deadline ends the wait. */
                    if (starved++ == 0)
                        geoWarn(GEO_LOG_NET, "init: accept on %s: %s, and no unproven "
                                "connection of ours to drop; trying again every %.0f ms",
                                l ? st->local.path : tcpPeerStr(st, ctx->rank, h.from),
                                strerror(e), GEO_ADMIT_PAUSE_S * 1000);
                    paused_until = now + GEO_ADMIT_PAUSE_S;
                    break;
                }
                if (got < 0) {
                    res = GEO_ERR(ctx->err, ncclSystemError, "init: accept on %s failed: %s",
                                  l ? st->local.path : tcpPeerStr(st, ctx->rank, h.from),
                                  strerror(errno));
                    goto done;
                }
                if (got == 0)
                    break;
                if (l) {
                    snprintf(h.from, sizeof(h.from), "the same-host socket");
                    memset(&from, 0, sizeof(from)); /* same-host sockets: one group */
                } else {
                    geoAddrToString(&from, h.from);
                }
                h.group = geoAdmitGroupOf(&st->known, &from);
                if (tcpMakeRoom(st, pend, npend, &h.group, per_group, budget, "dropped to make "
                                "room for newer connections (its source held the most)") ==
                    GEO_ADMIT_REFUSE) {
                    tcpHsDrop(st, &h, "dropped: every unproven connection is a peer's");
                    continue;
                }
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
     * strangers (every legitimate slot is taken), or, where set-up skips
     * pairs, a peer's first-use dial that came early: it dials again and
     * the progress thread takes it. */
    for (int i = 0; i < npend; i++) {
        if (res == ncclSuccess && ctx->want != NULL &&
            (pend[i].peer < 0 || !tcpWanted(ctx, pend[i].peer))) {
            geoInfo(GEO_LOG_NET, "closed connection from %s, unfinished when set-up ended (a "
                    "peer's first-use dial dials again)", pend[i].from);
            tcpHsDrop(st, &pend[i], NULL);
        }
        else if (res == ncclSuccess)
            tcpHsDrop(st, &pend[i], "handshake unfinished when every peer was connected");
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
    int redials = 0;
    for (int i = 0; out != NULL && i < nout; i++)
        redials += out[i].drops;
    if (redials > 0)
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "init: our connections were closed during their "
                "handshake and dialled again %d times (their peers dropped them among unproven "
                "connections, or refused our proof)", redials);
    if (res == ncclSuccess)
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "opened %d and accepted %d connections in %.3f s%s",
                nout, nin, geoNow() - start,
                ctx->want != NULL ? " (the pairs the plans use; the rest on first use)" : "");
    free(out);
    free(pend);
    free(pfd);
    free(map);
    return res;
oom:
    res = GEO_ERR(ctx->err, ncclSystemError, "init: out of memory while connecting to peers");
    goto done;
}
