/* Bandwidth between regions and inside them (probe_internal.h): the
 * all-pairs transfer (probeBwTransfer, which the warm-up in probe.c runs
 * too), the region leaders' rates measured with it and measured again
 * where they set regions apart while still ramping up, the loss and RTT
 * variation read from the connections' TCP_INFO after it, and the latency
 * and rate between the ranks of each region. */
#include "config.h"
#include "topology/probe.h"
#include "topology/probe_internal.h"
#include "comm/base/param.h"
#include "topology/cluster.h"
#include "topology/model.h"
#include "topology/wan_tuning.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROBE_BW_MSG (256 * 1024)    /* bandwidth message: one frame */
#define PROBE_BW_SLOTS 4             /* messages in flight per direction and peer */
/* Unsent bytes a socket may hold during the transfer: what is queued when
 * it stops must still drain at the link's rate before the next message. */
#define PROBE_QUEUED_BYTES (512 * 1024)

/* ---- bandwidth between regions ----------------------------------------- */

typedef struct {
    geoNetRequest sreq[PROBE_BW_SLOTS], rreq[PROBE_BW_SLOTS], creq[PROBE_BW_SLOTS];
    uint64_t ctl[PROBE_BW_SLOTS][2];
    char *rbuf;                 /* PROBE_BW_SLOTS receive buffers */
    int spending;               /* data sends in flight */
    int send_end;               /* END and pads posted */
    uint64_t ndata;             /* data messages sent */
    int rslot_live[PROBE_BW_SLOTS];
    uint64_t posted, processed, total; /* receives; total known at END */
    int got_end, finished;
    int nt, cap;
    double *tt, *tb;            /* completion times and sizes */
} bwPeer;

/* One side of an all-pairs transfer among peers[0..R) (skipping peers[me];
 * me = -1: none is me): region leaders measuring bandwidth (probeMeasureBw), or
 * the exchange's WAN pairs warming their connections (warm_wan).  It sends
 * to every peer for `dur` seconds, then END (carrying how many data
 * messages it sent) and PROBE_BW_SLOTS - 1 pads.  The receiver keeps
 * at most PROBE_BW_SLOTS + (data messages seen) receives posted, so when
 * END arrives it has posted at most data + PROBE_BW_SLOTS receives, which
 * the pads are there to meet; from END on it posts up to exactly that
 * total.  Every receive is matched and none is left for later operations.
 * in[q]: the steady rate from peer q to me, taken over the messages that
 * arrived between the shares `from` and `upto` of the transfer's span
 * (topoSteadyRate). */
ncclResult_t probeBwTransfer(geoProbeCtx *pc, const int *peers, int R, int me,
                             double dur, double from, double upto, double *in)
{
    bwPeer *p = calloc((size_t)R, sizeof(bwPeer));
    char *sbuf = calloc(1, PROBE_BW_MSG);
    ncclResult_t res = ncclSuccess;
    double start, deadline = geoNow() + pc->timeout + dur;
    int live = 0;

    if (p == NULL || sbuf == NULL) {
        free(p);
        free(sbuf);
        return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for a transfer "
                       "with %d peers", R);
    }
    ((uint64_t *)(void *)sbuf)[0] = MSG_DATA;
    /* What a socket holds unsent when the transfer stops must drain at the
     * link's rate before the next message. */
    if (pc->net->ops->limitQueued)
        pc->net->ops->limitQueued(pc->net->state, PROBE_QUEUED_BYTES);
    for (int q = 0; q < R && res == ncclSuccess; q++) {
        in[q] = 0;
        if (q == me)
            continue;
        p[q].rbuf = malloc((size_t)PROBE_BW_SLOTS * PROBE_BW_MSG);
        p[q].cap = 1024;
        p[q].tt = malloc(sizeof(double) * (size_t)p[q].cap);
        p[q].tb = malloc(sizeof(double) * (size_t)p[q].cap);
        if (!p[q].rbuf || !p[q].tt || !p[q].tb) {
            res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for the "
                          "receives from rank %d", peers[q]);
            break;
        }
        for (int s = 0; s < PROBE_BW_SLOTS && res == ncclSuccess; s++) {
            res = geoNetIrecvV(pc->net, peers[q], p[q].rbuf + (size_t)s * PROBE_BW_MSG,
                               PROBE_BW_MSG, &p[q].rreq[s]);
            p[q].rslot_live[s] = 1;
            p[q].posted++;
        }
        live++;
    }
    start = geoNow();
    while (live > 0 && res == ncclSuccess) {
        int moved = 0;
        double now = geoNow();
        for (int q = 0; q < R && res == ncclSuccess; q++) {
            bwPeer *b = &p[q];
            if (q == me || b->finished)
                continue;
            /* Sending side: keep the slots full until dur, then END + pads. */
            for (int s = 0; s < PROBE_BW_SLOTS && res == ncclSuccess; s++) {
                geoNetRequest *r = &b->sreq[s];
                if (r->buf != NULL && !probeReqDone(r))
                    continue;
                if (r->buf != NULL) {
                    if ((res = r->result) != ncclSuccess)
                        break;
                    r->buf = NULL;
                    b->spending--;
                    moved = 1;
                }
                if (!b->send_end && now - start < dur) {
                    res = geoNetIsendV(pc->net, peers[q], sbuf, PROBE_BW_MSG, r);
                    b->spending++;
                    b->ndata++;
                }
            }
            if (!b->send_end && now - start >= dur && res == ncclSuccess) {
                for (int s = 0; s < PROBE_BW_SLOTS && res == ncclSuccess; s++) {
                    b->ctl[s][0] = s == 0 ? MSG_END : MSG_PAD;
                    b->ctl[s][1] = b->ndata;
                    res = geoNetIsendV(pc->net, peers[q], b->ctl[s], sizeof(b->ctl[s]),
                                       &b->creq[s]);
                }
                b->send_end = 1;
                moved = 1;
            }
            /* Receiving side. */
            for (int s = 0; s < PROBE_BW_SLOTS && res == ncclSuccess; s++) {
                geoNetRequest *r = &b->rreq[s];
                if (!b->rslot_live[s] || !probeReqDone(r))
                    continue;
                if ((res = r->result) != ncclSuccess)
                    break;
                b->rslot_live[s] = 0;
                b->processed++;
                moved = 1;
                uint64_t *w = (uint64_t *)(void *)r->buf;
                uint64_t type = r->size >= 16 ? w[0] : 0;
                if (type == MSG_DATA) {
                    if (b->nt == b->cap) {
                        int nc = b->cap * 2;
                        double *x = realloc(b->tt, sizeof(double) * (size_t)nc);
                        if (x)
                            b->tt = x;
                        double *y = realloc(b->tb, sizeof(double) * (size_t)nc);
                        if (y)
                            b->tb = y;
                        if (!x || !y) {
                            res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of "
                                          "memory for %d arrival times", nc);
                            break;
                        }
                        b->cap = nc;
                    }
                    b->tt[b->nt] = geoNow();
                    b->tb[b->nt++] = (double)r->size;
                } else if (type == MSG_END && !b->got_end) {
                    b->got_end = 1;
                    b->total = w[1] + PROBE_BW_SLOTS;
                } else if (type != MSG_PAD) {
                    res = GEO_ERR(pc->err, ncclInternalError, "init: probe: unexpected bandwidth "
                                  "message %llu from rank %d", (unsigned long long)type, peers[q]);
                    break;
                }
            }
            /* Refill free slots up to what the sender can still send: before
             * END, one receive for each data message seen (never more than it
             * sends, since END and pads follow); after END, the total. */
            uint64_t limit = b->got_end ? b->total : (uint64_t)b->nt + PROBE_BW_SLOTS;
            for (int s = 0; s < PROBE_BW_SLOTS && res == ncclSuccess && b->posted < limit; s++)
                if (!b->rslot_live[s]) {
                    res = geoNetIrecvV(pc->net, peers[q], b->rbuf + (size_t)s * PROBE_BW_MSG,
                                       PROBE_BW_MSG, &b->rreq[s]);
                    b->rslot_live[s] = 1;
                    b->posted++;
                }
            if (res == ncclSuccess && b->send_end && b->spending == 0 && b->got_end &&
                b->processed == b->total) {
                for (int s = 0; s < PROBE_BW_SLOTS && res == ncclSuccess; s++)
                    res = geoNetWait(pc->net, &b->creq[s]);
                in[q] = topoSteadyRate(b->nt, b->tt, b->tb, from, upto);
                b->finished = 1;
                live--;
            }
        }
        if (!moved && res == ncclSuccess) {
            res = probeCheckDeadline(pc, deadline, "bandwidth");
            probePauseUs(20);
        }
    }
    if (res != ncclSuccess)
        geoNetBreak(pc->net); /* requests in flight point at our buffers */
    for (int q = 0; q < R; q++) {
        free(p[q].rbuf);
        free(p[q].tt);
        free(p[q].tb);
    }
    if (pc->net->ops->limitQueued)
        pc->net->ops->limitQueued(pc->net->state, 0);
    free(p);
    free(sbuf);
    return res;
}

/* The largest window one TCP stream may reach: the receive side's
 * autotuning limit (tcp_rmem max, of which the kernel advertises about
 * half by default), or the fixed GEOCCL_SOCKET_BUFSIZE. */
double geoProbeStreamWindow(void)
{
    int64_t fixed = geoParamInt(GEO_PARAM_SOCKET_BUFSIZE);
    if (fixed > 0)
        return (double)fixed / 2;
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_rmem", "r");
    long a = 0, b = 0, c = 0;
    if (f != NULL) {
        if (fscanf(f, "%ld %ld %ld", &a, &b, &c) != 3)
            c = 0;
        fclose(f);
    }
    return c > 0 ? (double)c / 2 : 3 * 1024 * 1024;
}

/* TCP_INFO of this rank's connections to peers[q] (q != me), summed over
 * their streams and counted since they opened: out[q] = data segments
 * sent, out[R + q] = received, out[2R + q] = RTT variation (-1, -1, 0 where
 * the transport counts nothing). */
static void link_stats(geoProbeCtx *pc, const int *peers, int R, int me, double *out)
{
    for (int q = 0; q < R; q++) {
        geoLinkStats now;
        int ok = q != me && pc->net->ops->linkStats != NULL &&
                 pc->net->ops->linkStats(pc->net->state, peers[q], &now) == 0;
        out[q] = ok ? (double)now.segs_out : -1;
        out[R + q] = ok ? (double)now.segs_in : -1;
        out[2 * R + q] = ok ? now.rttvar : 0;
    }
}

/* Whether the rates col (probeMeasureBw's layout: col[g * R + q] = rate q -> g)
 * set the regions apart: one region's egress (what it sent in all) more
 * than PROBE_BW_SPREAD below another's, or a flow into a region held back
 * as a slow downlink shows (topoIngressFromRates).  The same answer on
 * every leader: all hold the same col. */
#define PROBE_BW_SPREAD 1.10
static int bw_uneven(const double *col, int R, const unsigned char *fresh)
{
    double lo = 0, hi = 0, *bw = malloc(sizeof(double) * 2 * (size_t)R * (size_t)R);
    int first = 1;
    if (bw == NULL)
        return 0;
    double *in = bw + (size_t)R * R;
    for (int g = 0; g < R; g++) {
        double e = 0;
        for (int h = 0; h < R; h++) {
            bw[g * R + h] = g == h ? 0 : col[h * R + g];
            e += bw[g * R + h];
        }
        /* With t->fresh, only a fresh region sent to every other. */
        if (fresh != NULL && !fresh[g])
            continue;
        lo = first || e < lo ? e : lo;
        first = 0;
        hi = e > hi ? e : hi;
    }
    topoIngressFromRates(R, bw, in);
    int uneven = !(lo > 0) || hi > PROBE_BW_SPREAD * lo;
    for (int h = 0; h < R; h++)
        uneven |= in[h] > 0 && (fresh == NULL || fresh[h]);
    free(bw);
    return uneven;
}

/* Whether some flow of the transfer (col as above, rtt[g * R + h] in
 * seconds) carries more than its congestion control's window reaches by
 * where the steady rate starts to be taken (0.3 of the 12 round trips:
 * 3.6 of them): BBR's startup multiplies the window by 2.89 a round trip
 * from 10 segments, so some 455 segments, 659 KB.  Such a flow was still
 * speeding up when the rate was taken.  At 50 ms a flow of 500 Mbit/s
 * (two flows out of a 1 Gbit/s region) needs 3.1 MB; of 50 Mbit/s, 312 KB. */
#define PROBE_RAMP_BYTES (10 * 1448 * 45.5)
static int bw_ramping(const double *col, const double *rtt, int R)
{
    for (int g = 0; g < R; g++)
        for (int q = 0; q < R; q++)
            if (q != g && col[g * R + q] * rtt[q * R + g] > PROBE_RAMP_BYTES)
                return 1;
    return 0;
}

/* The transfer among the region leaders (me: my region): every pair, or
 * with t->fresh only the pairs with a fresh region, where a covered
 * region's leader sends to and hears from the fresh regions' leaders
 * alone.  in[q]: the rate from leaders[q]; 0 for a pair not measured. */
static ncclResult_t leaders_transfer(geoProbeCtx *pc, const geoTopo *t, const int *leaders,
                                     int R, int me, double dur, double from, double upto,
                                     double *in)
{
    if (t->fresh == NULL)
        return probeBwTransfer(pc, leaders, R, me, dur, from, upto, in);
    int *sub = calloc((size_t)R, sizeof(int)), n = 0, subme = -1;
    double *got = malloc(sizeof(double) * (size_t)R);
    ncclResult_t res = ncclSuccess;
    if (sub == NULL || got == NULL)
        res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d regions", R);
    for (int q = 0; res == ncclSuccess && q < R; q++)
        if (q == me || t->fresh[me] || t->fresh[q]) {
            if (q == me)
                subme = n;
            sub[n++] = leaders[q];
        }
    if (res == ncclSuccess)
        res = probeBwTransfer(pc, sub, n, subme, dur, from, upto, got);
    for (int q = 0, i = 0; res == ncclSuccess && q < R; q++)
        in[q] = q == me || t->fresh[me] || t->fresh[q] ? got[i++] : 0;
    free(sub);
    free(got);
    return res;
}

ncclResult_t probeMeasureBw(geoProbeCtx *pc, geoTopo *t)
{
    topoRegionMap *m = pc->regions;
    int R = m->nregions, me = -1;
    int *leaders = malloc(sizeof(int) * (size_t)R);
    double *in = malloc(sizeof(double) * (size_t)R), maxrtt = 0;
    ncclResult_t res = ncclSuccess;

    if (leaders == NULL || in == NULL) {
        free(leaders);
        free(in);
        return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d regions",
                       R);
    }
    for (int g = 0; g < R; g++) {
        leaders[g] = m->members[g][0];
        if (leaders[g] == pc->rank)
            me = g;
        for (int h = 0; h < R; h++)
            if (t->region_rtt[g * R + h] > maxrtt)
                maxrtt = t->region_rtt[g * R + h];
    }
    /* Slow start needs about log2(BDP / 14 KiB) round trips (9 for 1 Gbit/s
     * at 50 ms); the rate is taken over the second half of the transfer,
     * when HyStart has usually left slow start. */
    double dur = 12 * maxrtt;
    dur = dur < 0.25 ? 0.25 : dur > 1.5 ? 1.5 : dur;
    if (me >= 0) {
        double *col = malloc(sizeof(double) * (size_t)R * (size_t)R);
        /* What this leader's connections to each other leader counted:
         * [sent, received, RTT variation] per region. */
        double *seen = malloc(sizeof(double) * 3 * (size_t)R);
        double *all = malloc(sizeof(double) * 3 * (size_t)R * (size_t)R);
        if (col == NULL || seen == NULL || all == NULL)
            res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for the "
                          "figures of %d regions", R);
        if (res == ncclSuccess) {
            geoWanCcForProbe(pc->net, leaders, R, me);
            res = leaders_transfer(pc, t, leaders, R, me, dur, 0.3, 0.8, in);
        }
        /* Leaders exchange what each received: col[g*R + q] = rate q -> g. */
        if (res == ncclSuccess)
            res = probeExchangeAmong(pc, leaders, R, me, in, sizeof(double) * (size_t)R, col);
        /* Rates that set the regions apart, taken while a flow may still
         * have been speeding up, are measured again on the connections the
         * first transfer warmed: there a flow starts at the rate its
         * congestion control found, not from slow start, so half the time
         * suffices, and the rate is taken over all of it.  Why: at 1 Gbit/s,
         * 50 ms and 0.1% loss on symmetric links, where random loss cuts
         * BBR's window in startup, five inits put one region's egress 1-22%
         * below another's, and one read two slow flows into a region as a
         * 340 Mbit/s downlink; the plan then split the work unevenly and
         * paced into that region (BENCHMARKS.md, "Lossy and jittery
         * paths").  Measured again: 6-17%, and no false downlink.  A real
         * one (100 Mbit/s into a region, 1 Gbit/s elsewhere) read 92.9-93.0
         * Mbit/s in two inits, where one transfer read 69-107. */
        if (res == ncclSuccess && bw_uneven(col, R, t->fresh) && bw_ramping(col, t->region_rtt, R)) {
            t->bw_again = 1;
            res = leaders_transfer(pc, t, leaders, R, me, dur / 2, 0.05, 1.0, in);
            if (res == ncclSuccess)
                res = probeExchangeAmong(pc, leaders, R, me, in, sizeof(double) * (size_t)R, col);
        }
        /* Counted after that exchange: a leader finishes it only once every
         * other has received all of its transfer, so what it sent has
         * arrived or was lost, retransmissions included; the receiver's
         * count, taken after the same exchange, then tells the loss. */
        if (res == ncclSuccess) {
            link_stats(pc, leaders, R, me, seen);
            res = probeExchangeAmong(pc, leaders, R, me, seen, sizeof(double) * 3 * (size_t)R, all);
        }
        if (res == ncclSuccess)
            for (int g = 0; g < R; g++)
                for (int q = 0; q < R; q++) {
                    double sent = all[(size_t)g * 3 * R + q];
                    double got = all[(size_t)q * 3 * R + R + g];
                    /* A pair of covered regions (t->fresh): not measured. */
                    int skip = q == g || (t->fresh != NULL && !t->fresh[g] && !t->fresh[q]);
                    t->bw[q * R + g] = col[g * R + q];
                    t->loss[g * R + q] = skip || sent < 0 || got < 0 ? -1 : geoLinkLoss(sent, got);
                    t->loss_segs[g * R + q] = skip || sent < 0 || got < 0 ? 0 : sent;
                    t->rttvar[g * R + q] = skip && q != g ? 0 : all[(size_t)g * 3 * R + 2 * R + q];
                }
        free(col);
        free(seen);
        free(all);
    }
    if (res == ncclSuccess) {
        int g = m->region_of[pc->rank];
        size_t sz = sizeof(double) * (size_t)R * (size_t)R;
        res = probeFanOut(pc, leaders[g], m->members[g], m->size[g], t->bw, sz);
        if (res == ncclSuccess)
            res = probeFanOut(pc, leaders[g], m->members[g], m->size[g], t->loss, sz);
        if (res == ncclSuccess)
            res = probeFanOut(pc, leaders[g], m->members[g], m->size[g], t->loss_segs, sz);
        if (res == ncclSuccess)
            res = probeFanOut(pc, leaders[g], m->members[g], m->size[g], t->rttvar, sz);
    }
    free(leaders);
    free(in);
    t->bw_measured = res == ncclSuccess;
    return res;
}

/* ---- inside a region ----------------------------------------------------- */

#define PROBE_INTRA_BYTES (4 << 20)

/* Local ranks 0 and 1 of every region with two or more ranks: a few round
 * trips (alpha = half the smallest) and one 4 MiB message acknowledged
 * (bandwidth = bytes / (time - one round trip)); the other pairs of local
 * ranks do the same alongside.  All regions at once; the model gets the
 * slowest region's figures, which every rank learns through the region
 * leaders. */
ncclResult_t probeMeasureIntra(geoProbeCtx *pc, geoTopo *t)
{
    topoRegionMap *m = pc->regions;
    int R = m->nregions, g = m->region_of[pc->rank], lr = m->local_rank[pc->rank];
    double mine[2] = {0, 0}, *all = calloc((size_t)R * 2, sizeof(double));
    uint64_t msg[2] = {0, 0};
    ncclResult_t res = ncclSuccess;
    char *buf = NULL;

    if (all == NULL)
        return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d regions",
                       R);
    /* Every pair of local ranks (0-1, 2-3, ...) moves the same bytes at the
     * same time, in every region at once, so that the figure pair 0-1
     * reports is what a rank gets while all ranks of the host work, as in a
     * collective (on a host of many ranks and few cores, that is much less
     * than one pair alone gets). */
    int sender = (lr & 1) == 0;
    /* With t->fresh, a covered region keeps the parent's figures. */
    if ((lr ^ 1) < m->size[g] && (t->fresh == NULL || t->fresh[g])) {
        int peer = m->members[g][lr ^ 1];
        double best = -1;
        geoNetRequest a, b;
        buf = malloc(PROBE_INTRA_BYTES);
        if (buf == NULL)
            res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d bytes",
                          PROBE_INTRA_BYTES);
        for (int k = 0; k < 5 && res == ncclSuccess; k++) {
            double t0 = geoNow();
            if (sender) {
                res = geoNetIsend(pc->net, peer, msg, sizeof(msg), &a);
                if (res == ncclSuccess)
                    res = geoNetIrecv(pc->net, peer, msg, sizeof(msg), &b);
            } else {
                res = geoNetIrecv(pc->net, peer, msg, sizeof(msg), &b);
                if (res == ncclSuccess)
                    res = geoNetWait(pc->net, &b);
                if (res == ncclSuccess)
                    res = geoNetIsend(pc->net, peer, msg, sizeof(msg), &a);
            }
            if (res == ncclSuccess)
                res = geoNetWait(pc->net, &a);
            if (res == ncclSuccess)
                res = geoNetWait(pc->net, &b);
            double rtt = geoNow() - t0;
            if (best < 0 || rtt < best)
                best = rtt;
        }
        if (res == ncclSuccess) {
            double t0 = geoNow();
            if (sender) {
                memset(buf, 0, PROBE_INTRA_BYTES);
                res = geoNetIsend(pc->net, peer, buf, PROBE_INTRA_BYTES, &a);
                if (res == ncclSuccess)
                    res = geoNetIrecv(pc->net, peer, msg, sizeof(msg), &b);
                if (res == ncclSuccess)
                    res = geoNetWait(pc->net, &a);
                if (res == ncclSuccess)
                    res = geoNetWait(pc->net, &b);
                double dt = geoNow() - t0 - best;
                mine[0] = best / 2;
                mine[1] = dt > 0 ? PROBE_INTRA_BYTES / dt : 0;
            } else {
                res = geoNetIrecv(pc->net, peer, buf, PROBE_INTRA_BYTES, &b);
                if (res == ncclSuccess)
                    res = geoNetWait(pc->net, &b);
                if (res == ncclSuccess)
                    res = geoNetIsend(pc->net, peer, msg, sizeof(msg), &a);
                if (res == ncclSuccess)
                    res = geoNetWait(pc->net, &a);
            }
        }
    }
    free(buf);
    /* Region leaders share their figures, then tell their regions. */
    if (res == ncclSuccess) {
        int *leaders = malloc(sizeof(int) * (size_t)R);
        if (leaders == NULL)
            res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d regions",
                          R);
        for (int q = 0; leaders && q < R; q++)
            leaders[q] = m->members[q][0];
        if (res == ncclSuccess && lr == 0)
            res = probeExchangeAmong(pc, leaders, R, g, mine, sizeof(mine), all);
        if (res == ncclSuccess)
            res = probeFanOut(pc, leaders[g], m->members[g], m->size[g], all,
                              sizeof(double) * 2 * (size_t)R);
        free(leaders);
    }
    if (res == ncclSuccess)
        for (int q = 0; q < R; q++)
            if (all[2 * q + 1] > 0) {
                if (t->intra_Bps == 0 || all[2 * q + 1] < t->intra_Bps)
                    t->intra_Bps = all[2 * q + 1];
                if (all[2 * q] > t->intra_alpha)
                    t->intra_alpha = all[2 * q];
            }
    free(all);
    return res;
}
