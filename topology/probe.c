#include "config.h"
#include "topology/probe.h"
#include "comm/base/checks.h"
#include "comm/transport/transport.h"
#include "comm/base/param.h"
#include "topology/cluster.h"
#include "topology/model.h"
#include "topology/nics.h"
#include "topology/wan_tuning.h"

#include <arpa/inet.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROBE_MSG 16                 /* ping/pong size */
#define PROBE_BW_MSG (256 * 1024)    /* bandwidth message: one frame */
#define PROBE_BW_SLOTS 4             /* messages in flight per direction and peer */
/* Unsent bytes a socket may hold during the transfer: what is queued when
 * it stops must still drain at the link's rate before the next message. */
#define PROBE_QUEUED_BYTES (512 * 1024)

enum { MSG_PING = 1, MSG_PONG = 2, MSG_DATA = 3, MSG_END = 4, MSG_PAD = 5 };

void geoTopoFree(geoTopo *t)
{
    free(t->node_of);
    free(t->leader);
    free(t->node_addr);
    free(t->rtt);
    free(t->nic_gbit);
    free(t->bw);
    free(t->egress);
    free(t->ingress);
    free(t->loss);
    free(t->loss_segs);
    free(t->rttvar);
    free(t->wan_choice);
    free(t->wan_why);
    free(t->region_rtt);
    free(t->oneway);
    memset(t, 0, sizeof(*t));
}

static int req_done(const geoNetRequest *r)
{
    return __atomic_load_n(&r->done, __ATOMIC_ACQUIRE);
}

static void pause_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* A poll loop's deadline: the communicator's timeout, as for every wait. */
static ncclResult_t check_deadline(geoProbeCtx *pc, double deadline, const char *what)
{
    if (geoErrAborted(pc->err)) {
        geoErrSet(pc->err, "init: probe %s: communicator aborted", what);
        geoNetBreak(pc->net);
        return ncclRemoteError;
    }
    if (geoNow() > deadline) {
        geoErrSet(pc->err, "init: probe %s: no answer within GEOCCL_TIMEOUT (%.0f s)", what,
                        pc->timeout);
        geoNetBreak(pc->net);
        return ncclRemoteError;
    }
    return ncclSuccess;
}

/* ---- nodes -------------------------------------------------------------- */

static ncclResult_t find_nodes(geoProbeCtx *pc, geoTopo *t)
{
    int n = pc->nranks;
    t->node_of = malloc(sizeof(int) * (size_t)n);
    t->leader = malloc(sizeof(int) * (size_t)n);
    t->node_addr = malloc(sizeof(*t->node_addr) * (size_t)n);
    t->nic_gbit = malloc(sizeof(double) * (size_t)n);
    if (!t->node_of || !t->leader || !t->node_addr || !t->nic_gbit)
        return ncclSystemError;
    for (int k = 0; k < n; k++)
        t->nic_gbit[k] = -1;
    t->nnodes = 0;
    for (int r = 0; r < n; r++) {
        char a[GEO_ADDR_STRLEN];
        geoAddrHost(&pc->net->ctx.peers[r].addr, a);
        int k;
        for (k = 0; k < t->nnodes; k++)
            if (strcmp(t->node_addr[k], a) == 0)
                break;
        if (k == t->nnodes) {
            memcpy(t->node_addr[k], a, 64);
            t->leader[k] = r;
            t->nnodes++;
        }
        t->node_of[r] = k;
    }
    t->nic_gbit[t->node_of[pc->rank]] = topoNicSpeed(pc->if_name);
    return ncclSuccess;
}

/* ---- small exchanges ---------------------------------------------------- */

/* Every rank in ranks[] sends its len bytes to every other; all[i*len] gets
 * ranks[i]'s.  Only members call it. */
static ncclResult_t exchange_among(geoProbeCtx *pc, const int *ranks, int n, int me,
                                   const void *mine, size_t len, void *all)
{
    geoNetRequest *rq = calloc((size_t)2 * (size_t)n, sizeof(geoNetRequest));
    ncclResult_t res = ncclSuccess;
    if (rq == NULL)
        return ncclSystemError;
    memcpy((char *)all + (size_t)me * len, mine, len);
    for (int i = 0; i < n && res == ncclSuccess; i++) {
        if (i == me)
            continue;
        res = geoNetIrecv(pc->net, ranks[i], (char *)all + (size_t)i * len, len, &rq[2 * i]);
        if (res == ncclSuccess)
            res = geoNetIsend(pc->net, ranks[i], mine, len, &rq[2 * i + 1]);
    }
    for (int i = 0; i < 2 * n; i++) {
        if (i / 2 == me || rq[i].buf == NULL)
            continue;
        ncclResult_t r = geoNetWait(pc->net, &rq[i]);
        if (res == ncclSuccess)
            res = r;
    }
    free(rq);
    return res;
}

/* src sends len bytes to each of dst[] (src itself skipped). */
static ncclResult_t fan_out(geoProbeCtx *pc, int src, const int *dst, int n, void *buf,
                            size_t len)
{
    if (pc->rank != src) {
        geoNetRequest r;
        GEO_CHECK(geoNetIrecv(pc->net, src, buf, len, &r));
        return geoNetWait(pc->net, &r);
    }
    geoNetRequest *rq = calloc((size_t)(n > 0 ? n : 1), sizeof(geoNetRequest));
    ncclResult_t res = ncclSuccess;
    if (rq == NULL)
        return ncclSystemError;
    for (int i = 0; i < n && res == ncclSuccess; i++)
        if (dst[i] != src)
            res = geoNetIsend(pc->net, dst[i], buf, len, &rq[i]);
    for (int i = 0; i < n; i++)
        if (dst[i] != src && rq[i].buf != NULL) {
            ncclResult_t r = geoNetWait(pc->net, &rq[i]);
            if (res == ncclSuccess)
                res = r;
        }
    free(rq);
    return res;
}

/* ---- round-trip times --------------------------------------------------- */

/* One leader's side: rounds of pings to every leader p with with[p] set
 * (the pairs are symmetric: p has me in its own set), each answered as soon
 * as it arrives.  Every pair runs its own rounds: when my ping of round k
 * to p is answered and p's ping of round k to me has arrived, I post the
 * two receives of round k + 1 and send its ping at once.  So a node with
 * few peers never waits for a landmark's slowest peer before it can ping
 * again: in lock-step rounds its next ping sat unread until the landmark
 * had heard from every far peer, and a same-region pair measured a WAN
 * round trip.  Per pair, p sends its ping of round k + 1 only after my
 * ping and pong of round k reached it, and it sent its own ping and pong
 * of round k before that, so the two receives of round k match p's two
 * messages of round k, in either order; the type word tells which. */
static ncclResult_t ping_rounds(geoProbeCtx *pc, const int *leaders, int L, int me,
                                const unsigned char *with, int rounds, double *row,
                                double *warm_end)
{
    size_t n2 = (size_t)L * 2;
    geoNetRequest *rr = calloc(n2, sizeof(geoNetRequest)), *sr = calloc(n2, sizeof(geoNetRequest));
    uint64_t(*in)[2] = calloc(n2, sizeof(*in));
    uint64_t(*out)[2] = calloc(n2, sizeof(*out));
    double *t0 = calloc((size_t)L, sizeof(double));
    unsigned char *st = calloc(n2, 1);
    int *round = calloc((size_t)L, sizeof(int));
    ncclResult_t res = ncclSuccess;
    double deadline = geoNow() + pc->timeout;
    int posted = 0, live = 0, warm_left = 0;

    if (!rr || !sr || !in || !out || !t0 || !st || !round) {
        res = ncclSystemError;
        goto out;
    }
    *warm_end = geoNow();
    for (int i = 0; i < L; i++)
        row[i] = i == me ? 0 : -1;
    /* Round 0 of every pair: the warm-up (its time is not kept). */
    for (int p = 0; p < L && res == ncclSuccess; p++) {
        if (p == me || !with[p])
            continue;
        posted = 1;
        live++;
        warm_left++;
        res = geoNetIrecv(pc->net, leaders[p], in[2 * p], PROBE_MSG, &rr[2 * p]);
        if (res == ncclSuccess)
            res = geoNetIrecv(pc->net, leaders[p], in[2 * p + 1], PROBE_MSG, &rr[2 * p + 1]);
        out[2 * p][0] = MSG_PING;
        out[2 * p][1] = 0;
        t0[p] = geoNow();
        if (res == ncclSuccess)
            res = geoNetIsend(pc->net, leaders[p], out[2 * p], PROBE_MSG, &sr[2 * p]);
    }
    while (live > 0 && res == ncclSuccess) {
        int moved = 0;
        for (int p = 0; p < L && res == ncclSuccess; p++) {
            if (p == me || !with[p] || round[p] > rounds)
                continue;
            for (int k = 0; k < 2 && res == ncclSuccess; k++) {
                geoNetRequest *r = &rr[2 * p + k];
                if (st[2 * p + k] || !req_done(r))
                    continue;
                st[2 * p + k] = 1;
                moved = 1;
                if (r->result != ncclSuccess) {
                    res = r->result;
                    break;
                }
                if (in[2 * p + k][0] == MSG_PING) {
                    if (sr[2 * p + 1].buf != NULL) {
                        res = geoNetWait(pc->net, &sr[2 * p + 1]);
                        sr[2 * p + 1].buf = NULL;
                    }
                    out[2 * p + 1][0] = MSG_PONG;
                    out[2 * p + 1][1] = in[2 * p + k][1];
                    if (res == ncclSuccess)
                        res = geoNetIsend(pc->net, leaders[p], out[2 * p + 1], PROBE_MSG,
                                          &sr[2 * p + 1]);
                } else if (in[2 * p + k][0] == MSG_PONG &&
                           in[2 * p + k][1] == (uint64_t)round[p]) {
                    double rtt = geoNow() - t0[p];
                    if (round[p] > 0 && (row[p] < 0 || rtt < row[p]))
                        row[p] = rtt;
                } else {
                    geoErrSet(pc->err, "init: probe: unexpected message %llu from rank %d",
                                    (unsigned long long)in[2 * p + k][0], leaders[p]);
                    res = ncclInternalError;
                }
            }
            if (res != ncclSuccess || !st[2 * p] || !st[2 * p + 1])
                continue;
            /* Both messages of this round are in: the pair's next round. */
            if (round[p] == 0 && --warm_left == 0)
                *warm_end = geoNow(); /* every peer has arrived */
            if (++round[p] > rounds) {
                live--;
                continue;
            }
            st[2 * p] = st[2 * p + 1] = 0;
            res = geoNetIrecv(pc->net, leaders[p], in[2 * p], PROBE_MSG, &rr[2 * p]);
            if (res == ncclSuccess)
                res = geoNetIrecv(pc->net, leaders[p], in[2 * p + 1], PROBE_MSG, &rr[2 * p + 1]);
            if (res == ncclSuccess && sr[2 * p].buf != NULL) {
                res = geoNetWait(pc->net, &sr[2 * p]);
                sr[2 * p].buf = NULL;
            }
            out[2 * p][0] = MSG_PING;
            out[2 * p][1] = (uint64_t)round[p];
            t0[p] = geoNow();
            if (res == ncclSuccess)
                res = geoNetIsend(pc->net, leaders[p], out[2 * p], PROBE_MSG, &sr[2 * p]);
        }
        if (!moved && res == ncclSuccess) {
            res = check_deadline(pc, deadline, "round trips");
            pause_us(10);
        }
    }
    for (size_t i = 0; i < n2; i++)
        if (sr[i].buf != NULL) {
            ncclResult_t r = geoNetWait(pc->net, &sr[i]);
            if (res == ncclSuccess)
                res = r;
            sr[i].buf = NULL;
        }
out:
    /* Receives may still be posted into these buffers: fail them first. */
    if (res != ncclSuccess && posted)
        geoNetBreak(pc->net);
    free(rr);
    free(sr);
    free(in);
    free(out);
    free(t0);
    free(st);
    free(round);
    return res;
}

/* Who reports a measured pair in the exchange: the end that measured fewer
 * pairs this round (a landmark measures many), the lower index on a tie.
 * Both ends measured it; one value is enough. */
static int reports(const int *cnt, int a, int j)
{
    return cnt[a] < cnt[j] || (cnt[a] == cnt[j] && a < j);
}

/* Round trips between node leaders, in rounds (topoRttSampleRound): with
 * up to 2 GEOCCL_PROBE_LANDMARKS nodes, every pair at once; with more,
 * every node and a few landmarks, then the nodes no landmark settled.
 * After each round the leaders exchange what they measured (per node only
 * the pairs it reports, so rows stay short), and every leader holds the same
 * sparse matrix to plan the next round from.  Then each leader hands the
 * matrix and the NIC rates to the other ranks of its node. */
static ncclResult_t measure_rtt(geoProbeCtx *pc, geoTopo *t)
{
    int L = t->nnodes, me = -1, K = pc->landmarks;
    size_t LL = (size_t)L * (size_t)L;
    /* What a leader hands its node: the matrix, the NIC rates, the pairs
     * measured and the rounds. */
    size_t share_bytes = sizeof(double) * (LL + (size_t)L + 2);
    double *share = malloc(share_bytes);
    ncclResult_t res = ncclSuccess;

    t->rtt = malloc(sizeof(double) * LL);
    if (share == NULL || t->rtt == NULL) {
        free(share);
        return ncclSystemError;
    }
    for (size_t x = 0; x < LL; x++)
        t->rtt[x] = x % ((size_t)L + 1) == 0 ? 0 : -1;
    for (int k = 0; k < L; k++)
        if (t->leader[k] == pc->rank)
            me = k;
    t->rtt_pairs = 0;
    t->rtt_rounds = 0;
    if (me >= 0) {
        int rounds = (int)geoParamInt(GEO_PARAM_PROBE_ROUNDS);
        unsigned char *landmark = calloc((size_t)L, 1), *with = malloc(LL);
        double *row = malloc(sizeof(double) * (size_t)(L + 1)), *all = NULL;
        int *cnt = malloc(sizeof(int) * (size_t)L);
        if (!landmark || !with || !row || !cnt)
            res = ncclSystemError;
        for (int round = 0; res == ncclSuccess; round++) {
            int npairs = topoRttSampleRound(L, K, round, t->rtt, landmark, with);
            if (npairs < 0)
                res = ncclSystemError;
            if (npairs <= 0)
                break;
            t->rtt_pairs += npairs;
            t->rtt_rounds++;
            double warm = 0;
            res = ping_rounds(pc, t->leader, L, me, &with[(size_t)me * (size_t)L],
                              rounds < 1 ? 1 : rounds, row, &warm);
            if (round == 0)
                t->t_arrived = warm;
            /* Row: my NIC's rate, then the pairs I report, ascending. */
            int cap = 0;
            for (int a = 0; a < L; a++) {
                cnt[a] = 0;
                for (int j = 0; j < L; j++)
                    cnt[a] += with[(size_t)a * (size_t)L + (size_t)j];
            }
            for (int a = 0; a < L; a++) {
                int c = 0;
                for (int j = 0; j < L; j++)
                    c += with[(size_t)a * (size_t)L + (size_t)j] && reports(cnt, a, j);
                cap = c > cap ? c : cap;
            }
            size_t row_bytes = sizeof(double) * (size_t)(cap + 1);
            double *na = realloc(all, row_bytes * (size_t)L);
            if (res == ncclSuccess && na == NULL)
                res = ncclSystemError;
            all = na ? na : all;
            if (res != ncclSuccess)
                break;
            double *mine = malloc(row_bytes);
            if (mine == NULL) {
                res = ncclSystemError;
                break;
            }
            int c = 1;
            mine[0] = t->nic_gbit[me];
            for (int j = 0; j < L; j++)
                if (with[(size_t)me * (size_t)L + (size_t)j] && reports(cnt, me, j))
                    mine[c++] = row[j];
            for (; c <= cap; c++)
                mine[c] = -1;
            res = exchange_among(pc, t->leader, L, me, mine, row_bytes, all);
            free(mine);
            for (int a = 0; a < L && res == ncclSuccess; a++) {
                const double *ra = all + (size_t)a * (size_t)(cap + 1);
                if (round == 0)
                    t->nic_gbit[a] = ra[0];
                int i = 1;
                for (int j = 0; j < L; j++)
                    if (with[(size_t)a * (size_t)L + (size_t)j] && reports(cnt, a, j)) {
                        t->rtt[(size_t)a * (size_t)L + (size_t)j] = ra[i];
                        t->rtt[(size_t)j * (size_t)L + (size_t)a] = ra[i];
                        i++;
                    }
            }
        }
        free(landmark);
        free(with);
        free(row);
        free(all);
        free(cnt);
        memcpy(share, t->rtt, sizeof(double) * LL);
        memcpy(share + LL, t->nic_gbit, sizeof(double) * (size_t)L);
        share[LL + (size_t)L] = t->rtt_pairs;
        share[LL + (size_t)L + 1] = t->rtt_rounds;
    }
    /* Each leader hands the matrix to the other ranks of its node. */
    if (res == ncclSuccess) {
        int node = t->node_of[pc->rank], *members = malloc(sizeof(int) * (size_t)pc->nranks);
        int m = 0;
        if (members == NULL) {
            free(share);
            return ncclSystemError;
        }
        for (int r = 0; r < pc->nranks; r++)
            if (t->node_of[r] == node)
                members[m++] = r;
        if (m > 1)
            res = fan_out(pc, t->leader[node], members, m, share, share_bytes);
        free(members);
    }
    if (res == ncclSuccess && me < 0) {
        memcpy(t->rtt, share, sizeof(double) * LL);
        memcpy(t->nic_gbit, share + LL, sizeof(double) * (size_t)L);
        t->rtt_pairs = (int)share[LL + (size_t)L];
        t->rtt_rounds = (int)share[LL + (size_t)L + 1];
    }
    free(share);
    t->rtt_measured = res == ncclSuccess;
    return res;
}

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
 * me = -1: none is me): region leaders measuring bandwidth (measure_bw), or
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
static ncclResult_t bw_transfer(geoProbeCtx *pc, const int *peers, int R, int me,
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
        return ncclSystemError;
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
            res = ncclSystemError;
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
                if (r->buf != NULL && !req_done(r))
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
                if (!b->rslot_live[s] || !req_done(r))
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
                            res = ncclSystemError;
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
                    geoErrSet(pc->err, "init: probe: unexpected bandwidth message %llu from "
                                    "rank %d", (unsigned long long)type, peers[q]);
                    res = ncclInternalError;
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
            res = check_deadline(pc, deadline, "bandwidth");
            pause_us(20);
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

/* Whether the rates col (measure_bw's layout: col[g * R + q] = rate q -> g)
 * set the regions apart: one region's egress (what it sent in all) more
 * than PROBE_BW_SPREAD below another's, or a flow into a region held back
 * as a slow downlink shows (topoIngressFromRates).  The same answer on
 * every leader: all hold the same col. */
#define PROBE_BW_SPREAD 1.10
static int bw_uneven(const double *col, int R)
{
    double lo = 0, hi = 0, *bw = malloc(sizeof(double) * 2 * (size_t)R * (size_t)R);
    if (bw == NULL)
        return 0;
    double *in = bw + (size_t)R * R;
    for (int g = 0; g < R; g++) {
        double e = 0;
        for (int h = 0; h < R; h++) {
            bw[g * R + h] = g == h ? 0 : col[h * R + g];
            e += bw[g * R + h];
        }
        lo = g == 0 || e < lo ? e : lo;
        hi = e > hi ? e : hi;
    }
    topoIngressFromRates(R, bw, in);
    int uneven = !(lo > 0) || hi > PROBE_BW_SPREAD * lo;
    for (int h = 0; h < R; h++)
        uneven |= in[h] > 0;
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

static ncclResult_t measure_bw(geoProbeCtx *pc, geoTopo *t)
{
    topoRegionMap *m = pc->regions;
    int R = m->nregions, me = -1;
    int *leaders = malloc(sizeof(int) * (size_t)R);
    double *in = malloc(sizeof(double) * (size_t)R), maxrtt = 0;
    ncclResult_t res = ncclSuccess;

    if (leaders == NULL || in == NULL) {
        free(leaders);
        free(in);
        return ncclSystemError;
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
            res = ncclSystemError;
        if (res == ncclSuccess) {
            geoWanCcForProbe(pc->net, leaders, R, me);
            res = bw_transfer(pc, leaders, R, me, dur, 0.3, 0.8, in);
        }
        /* Leaders exchange what each received: col[g*R + q] = rate q -> g. */
        if (res == ncclSuccess)
            res = exchange_among(pc, leaders, R, me, in, sizeof(double) * (size_t)R, col);
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
        if (res == ncclSuccess && bw_uneven(col, R) && bw_ramping(col, t->region_rtt, R)) {
            t->bw_again = 1;
            res = bw_transfer(pc, leaders, R, me, dur / 2, 0.05, 1.0, in);
            if (res == ncclSuccess)
                res = exchange_among(pc, leaders, R, me, in, sizeof(double) * (size_t)R, col);
        }
        /* Counted after that exchange: a leader finishes it only once every
         * other has received all of its transfer, so what it sent has
         * arrived or was lost, retransmissions included; the receiver's
         * count, taken after the same exchange, then tells the loss. */
        if (res == ncclSuccess) {
            link_stats(pc, leaders, R, me, seen);
            res = exchange_among(pc, leaders, R, me, seen, sizeof(double) * 3 * (size_t)R, all);
        }
        if (res == ncclSuccess)
            for (int g = 0; g < R; g++)
                for (int q = 0; q < R; q++) {
                    double sent = all[(size_t)g * 3 * R + q];
                    double got = all[(size_t)q * 3 * R + R + g];
                    t->bw[q * R + g] = col[g * R + q];
                    t->loss[g * R + q] = q == g || sent < 0 || got < 0 ? -1 : geoLinkLoss(sent, got);
                    t->loss_segs[g * R + q] = q == g || sent < 0 || got < 0 ? 0 : sent;
                    t->rttvar[g * R + q] = all[(size_t)g * 3 * R + 2 * R + q];
                }
        free(col);
        free(seen);
        free(all);
    }
    if (res == ncclSuccess) {
        int g = m->region_of[pc->rank];
        size_t sz = sizeof(double) * (size_t)R * (size_t)R;
        res = fan_out(pc, leaders[g], m->members[g], m->size[g], t->bw, sz);
        if (res == ncclSuccess)
            res = fan_out(pc, leaders[g], m->members[g], m->size[g], t->loss, sz);
        if (res == ncclSuccess)
            res = fan_out(pc, leaders[g], m->members[g], m->size[g], t->loss_segs, sz);
        if (res == ncclSuccess)
            res = fan_out(pc, leaders[g], m->members[g], m->size[g], t->rttvar, sz);
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
static ncclResult_t measure_intra(geoProbeCtx *pc, geoTopo *t)
{
    topoRegionMap *m = pc->regions;
    int R = m->nregions, g = m->region_of[pc->rank], lr = m->local_rank[pc->rank];
    double mine[2] = {0, 0}, *all = calloc((size_t)R * 2, sizeof(double));
    uint64_t msg[2] = {0, 0};
    ncclResult_t res = ncclSuccess;
    char *buf = NULL;

    if (all == NULL)
        return ncclSystemError;
    /* Every pair of local ranks (0-1, 2-3, ...) moves the same bytes at the
     * same time, in every region at once, so that the figure pair 0-1
     * reports is what a rank gets while all ranks of the host work, as in a
     * collective (on a host of many ranks and few cores, that is much less
     * than one pair alone gets). */
    int sender = (lr & 1) == 0;
    if ((lr ^ 1) < m->size[g]) {
        int peer = m->members[g][lr ^ 1];
        double best = -1;
        geoNetRequest a, b;
        buf = malloc(PROBE_INTRA_BYTES);
        if (buf == NULL)
            res = ncclSystemError;
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
            res = ncclSystemError;
        for (int q = 0; leaders && q < R; q++)
            leaders[q] = m->members[q][0];
        if (res == ncclSuccess && lr == 0)
            res = exchange_among(pc, leaders, R, g, mine, sizeof(mine), all);
        if (res == ncclSuccess)
            res = fan_out(pc, leaders[g], m->members[g], m->size[g], all,
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

/* ---- a parent's topology ------------------------------------------------ */

void geoTopoInheritFree(geoTopoInherit *inh)
{
    free(inh->names);
    free(inh->egress);
    free(inh->ingress);
    free(inh->oneway);
    free(inh->rtt);
    memset(inh, 0, sizeof(*inh));
}

int geoTopoInheritFrom(const geoTopo *t, const topoRegionMap *m, int rank,
                       const geoTopoInherit *parent_inh, geoTopoInherit *inh)
{
    int R = m->nregions;
    memset(inh, 0, sizeof(*inh));
    if (R < 1)
        return 0;
    inh->names = calloc((size_t)R, sizeof(*inh->names));
    inh->egress = calloc((size_t)R, sizeof(double));
    inh->ingress = calloc((size_t)R, sizeof(double));
    inh->oneway = calloc((size_t)R, sizeof(double));
    inh->rtt = calloc((size_t)R * (size_t)R, sizeof(double));
    if (!inh->names || !inh->egress || !inh->ingress || !inh->oneway || !inh->rtt) {
        geoTopoInheritFree(inh);
        return -1;
    }
    inh->nregions = R;
    snprintf(inh->label, sizeof(inh->label), "%s", m->names[m->region_of[rank]]);
    for (int g = 0; g < R; g++) {
        snprintf(inh->names[g], sizeof(inh->names[g]), "%s", m->names[g]);
        inh->egress[g] = t->egress ? t->egress[g] : 0;
        inh->ingress[g] = t->ingress ? t->ingress[g] : 0;
        inh->oneway[g] = t->oneway ? t->oneway[g] : 0;
        for (int h = 0; h < R; h++)
            inh->rtt[g * R + h] = t->region_rtt ? t->region_rtt[g * R + h] : -1;
    }
    inh->bw_known = t->bw_measured || t->from_file || t->inherited;
    inh->bw_measured = t->bw_measured || (t->inherited && parent_inh != NULL && parent_inh->bw_measured);
    inh->intra_Bps = t->intra_Bps;
    inh->intra_alpha = t->intra_alpha;
    inh->valid = 1;
    return 0;
}

/* The parent's figures for the regions this child has (matched by name). */
static void apply_inherit(const geoProbeCtx *pc, geoTopo *t)
{
    const geoTopoInherit *inh = pc->inherit;
    const topoRegionMap *m = pc->regions;
    int R = m->nregions, found = 0, idx[256];
    if (R > 256)
        return;
    for (int g = 0; g < R; g++) {
        idx[g] = -1;
        for (int k = 0; k < inh->nregions; k++)
            if (strncmp(inh->names[k], m->names[g], TOPO_REGION_LABEL_LEN) == 0)
                idx[g] = k;
        if (idx[g] >= 0 && inh->egress[idx[g]] > 0) {
            t->egress[g] = inh->egress[idx[g]];
            t->ingress[g] = inh->ingress[idx[g]];
            found++;
        }
        if (idx[g] >= 0)
            t->oneway[g] = inh->oneway[idx[g]];
    }
    for (int a = 0; a < R; a++)
        for (int b = 0; b < R; b++)
            if (a != b && idx[a] >= 0 && idx[b] >= 0)
                t->region_rtt[a * R + b] = inh->rtt[idx[a] * inh->nregions + idx[b]];
    t->intra_Bps = inh->intra_Bps;
    t->intra_alpha = inh->intra_alpha;
    t->inherited = inh->bw_known && found == R;
}

/* ---- the whole probe ---------------------------------------------------- */

/* Link figures a topology file gives for the regions in use; from_file when
 * it gives every region's rate (then there is nothing left to measure). */
static void apply_file(const geoProbeCtx *pc, geoTopo *t)
{
    const topoFile *tf = pc->file;
    const topoRegionMap *m = pc->regions;
    int R = m->nregions, rates = 0;
    for (int g = 0; g < R; g++)
        for (int k = 0; k < tf->nregions; k++) {
            if (strncmp(tf->regions[k].name, m->names[g], TOPO_REGION_LABEL_LEN) != 0)
                continue;
            if (tf->regions[k].bw_bytes > 0 && !t->bw_measured) {
                t->egress[g] = tf->regions[k].bw_bytes;
                t->ingress[g] = tf->regions[k].in_bytes;
                rates++;
            }
            if (tf->regions[k].delay_ms >= 0 && !t->rtt_measured)
                t->oneway[g] = tf->regions[k].delay_ms * 1e-3;
        }
    if (!t->rtt_measured) {
        for (int a = 0; a < R; a++)
            for (int b = 0; b < R; b++)
                t->region_rtt[a * R + b] = a == b ? 0 : t->oneway[a] + t->oneway[b];
        /* Measured RTTs the file kept win over the sums of delays. */
        for (int k = 0; k < tf->nrtts; k++) {
            int a = -1, b = -1;
            for (int g = 0; g < R; g++) {
                if (strncmp(tf->rtts[k].a, m->names[g], TOPO_REGION_LABEL_LEN) == 0)
                    a = g;
                if (strncmp(tf->rtts[k].b, m->names[g], TOPO_REGION_LABEL_LEN) == 0)
                    b = g;
            }
            if (a >= 0 && b >= 0 && a != b)
                t->region_rtt[a * R + b] = t->region_rtt[b * R + a] = tf->rtts[k].ms * 1e-3;
        }
    }
    /* Loss figures, unless measured now.  One the user wrote (no segment
     * count) is taken as a measurement. */
    for (int k = 0; k < tf->nlosses; k++) {
        int a = -1, b = -1;
        for (int g = 0; g < R; g++) {
            if (strncmp(tf->losses[k].from, m->names[g], TOPO_REGION_LABEL_LEN) == 0)
                a = g;
            if (strncmp(tf->losses[k].to, m->names[g], TOPO_REGION_LABEL_LEN) == 0)
                b = g;
        }
        if (a >= 0 && b >= 0 && a != b && !t->bw_measured) {
            t->loss[a * R + b] = tf->losses[k].fraction;
            t->loss_segs[a * R + b] = tf->losses[k].segs > 0 ? tf->losses[k].segs : 1e9;
        }
    }
    t->from_file = R > 1 && rates == R;
}

static void log_matrix(const geoTopo *t, int R)
{
    if (geoDebugLevel() < GEO_LEVEL_INFO)
        return;
    char line[512];
    for (int i = 0; i < R; i++) {
        int len = snprintf(line, sizeof(line), "probe: region %d ->", i);
        for (int j = 0; j < R && len < (int)sizeof(line) - 64; j++) {
            len += snprintf(line + len, sizeof(line) - (size_t)len, " %d:%.1fms/%.0fMbit", j,
                            t->region_rtt[i * R + j] * 1e3,
                            t->bw ? t->bw[i * R + j] * 8e-6 : 0.0);
            if (t->loss != NULL && t->loss[i * R + j] >= 0 && j != i)
                len += snprintf(line + len, sizeof(line) - (size_t)len, "/loss %.2g%% of %.0f",
                                t->loss[i * R + j] * 100, t->loss_segs[i * R + j]);
        }
        geoInfo(GEO_LOG_TOPO, "%s", line);
    }
}

/* Connections each WAN pair uses: as many as its link's bandwidth-delay
 * product needs at the smallest window (topoStreamsNeeded, the larger of
 * the two directions), at most the number connected, but only on links fast
 * enough that more streams than needed cost something.  TCP sizes its
 * segmentation-offload packets at about 1 ms of a stream's rate (2 segments
 * at least): where each connection of a hierarchical exchange would carry
 * 50 Mbit/s or more (a region's rate over its ranks and the connections),
 * fewer streams mean larger packets and fewer of them through every stack
 * on the way (measured, 3 emulated regions x 2 ranks at 1 Gbit/s, 256 MiB
 * all-reduce: 2 streams 4.1 s, 1 stream 3.2-3.3 s); on slower links the
 * packets are minimal either way, and two streams per pair kept a 100 Mbit/s
 * link fuller (64 MiB: 7.70 s against 8.00-8.04 s with one, twice each).
 * Computed from figures every rank holds (the link rates and round trips
 * the probe shared, or the topology file's), so both ends of a pair agree;
 * set at the end of the probe, where every pair's messages are matched.
 * GEOCCL_NSTREAMS given by hand: all of them, always. */
#define PROBE_BUSY_STREAM_BPS (50e6 / 8) /* 1 ms of it: 4 segments */

/* Whether each connection of a hierarchical exchange between regions g and
 * h would carry PROBE_BUSY_STREAM_BPS or more (rates g -> h and h -> g). */
static int pair_busy(const geoProbeCtx *pc, double bgh, double bhg, int g, int h)
{
    double per_conn =
        fmin(bgh / pc->regions->size[g], bhg / pc->regions->size[h]) / pc->nstreams;
    return per_conn >= PROBE_BUSY_STREAM_BPS;
}

static void apply_streams(geoProbeCtx *pc, geoTopo *t)
{
    int R = pc->regions->nregions, mine = pc->regions->region_of[pc->rank];
    t->streams_used = pc->nstreams;
    if (pc->net->ops->setStreams == NULL || R < 2 || pc->streams_set || t->bw == NULL ||
        t->region_rtt == NULL || pc->nstreams < 2)
        return;
    int used = 0;
    for (int g = 0; g < R; g++)
        for (int h = g + 1; h < R; h++) {
            int n = pc->nstreams;
            double bgh = t->bw[g * R + h], bhg = t->bw[h * R + g];
            double rtt = t->region_rtt[g * R + h];
            if (bgh > 0 && bhg > 0 && rtt > 0 && pair_busy(pc, bgh, bhg, g, h)) {
                int a = topoStreamsNeeded(bgh * (R - 1), rtt, t->window_bytes, 64);
                int b = topoStreamsNeeded(bhg * (R - 1), rtt, t->window_bytes, 64);
                n = a > b ? a : b;
                n = n > pc->nstreams ? pc->nstreams : n;
            }
            used = n > used ? n : used;
            if (g != mine && h != mine)
                continue;
            for (int p = 0; p < pc->nranks; p++)
                if (pc->regions->region_of[p] == (g == mine ? h : g))
                    pc->net->ops->setStreams(pc->net->state, p, n);
        }
    t->streams_used = used;
}

/* ---- warming the WAN connections ---------------------------------------- */

/* Congestion control learns a connection's rate only from traffic that
 * fills it: BBR paces every connection at its own estimate of the
 * bottleneck and never raises it from an application-limited burst, and
 * cubic's window stays at its initial ten segments.  A connection that
 * only ever carries the bursts of small all-reduces therefore sends them
 * slower than the link allows: on 3 emulated regions x 2 ranks at 1 Gbit/s
 * under BBR, a 1 MiB hierarchical all-reduce took 75-81 ms where the
 * region leaders' connections, which the probe's bandwidth transfer had
 * filled, finished ~20 ms before the others, and 65-67 ms with cubic
 * (BENCHMARKS.md).  So, once the stream counts are set, every WAN pair of
 * the hierarchical exchange (geoHierExchangePlan's peers, on the streams
 * that pair uses) carries the probe's transfer for 10 round trips at once:
 * about what slow start needs to reach a fair share of a 1 Gbit/s link at
 * 50 ms, and each connection's share is then what it gets in a
 * hierarchical all-reduce.  Which pairs (GEOCCL_WAN_WARMUP, rank 0's): 2,
 * pairs of regions whose connections would each carry 50 Mbit/s or more
 * (pair_busy; on slower links a burst is a few packets either way); 1,
 * every pair; 0, none.  Decided from figures every rank holds, so both ends
 * of a pair agree.  It runs with a topology file too (no measurement), and
 * its time is reported apart from the probe's (t_warm). */
static ncclResult_t warm_wan(geoProbeCtx *pc, geoTopo *t)
{
    const topoRegionMap *m = pc->regions;
    int R = m->nregions, mode = pc->warmup, g = m->region_of[pc->rank];
    double maxrtt = 0;
    ncclResult_t res;

    t->warm_pairs = 0;
    /* More than 64 regions: no hierarchical exchange (coll_hier.c), no pairs. */
    if (mode == 0 || R < 2 || R > 64 || t->nnodes < 2 || t->region_rtt == NULL)
        return ncclSuccess;
    unsigned char *warm = calloc((size_t)R * (size_t)R, 1);
    if (warm == NULL)
        return ncclSystemError;
    for (int a = 0; a < R; a++)
        for (int b = a + 1; b < R; b++) {
            double ab = geoWanPairRate(t, R, a, b), ba = geoWanPairRate(t, R, b, a);
            double rtt = t->region_rtt[a * R + b];
            if (rtt <= 0 || (mode == 2 && !(ab > 0 && ba > 0 && pair_busy(pc, ab, ba, a, b))))
                continue;
            warm[a * R + b] = warm[b * R + a] = 1;
            t->warm_pairs++;
            maxrtt = rtt > maxrtt ? rtt : maxrtt;
        }
    if (t->warm_pairs == 0) {
        free(warm);
        return ncclSuccess;
    }
    /* My partners in the exchange, once each, in the regions warmed with
     * mine.  The relation is symmetric (a piece's owners in two regions
     * exchange both ways), so each partner runs the transfer with me. */
    int *partners = NULL, np = 0;
    res = pc->partners(pc->arg, &partners, &np);
    if (res != ncclSuccess) {
        free(warm);
        return res;
    }
    int *peers = malloc(sizeof(int) * (size_t)(np + 1)), n = 0;
    if (peers == NULL)
        res = ncclSystemError;
    for (int i = 0; peers && i < np; i++)
        if (warm[g * R + m->region_of[partners[i]]])
            peers[n++] = partners[i];
    free(partners);
    double t0 = geoNow(), *in = malloc(sizeof(double) * (size_t)(n + 1));
    if (in == NULL)
        res = ncclSystemError;
    if (res == ncclSuccess && n > 0) {
        double dur = 10 * maxrtt;
        dur = dur < 0.1 ? 0.1 : dur > 1.0 ? 1.0 : dur;
        res = bw_transfer(pc, peers, n, -1, dur, 0.3, 0.8, in);
    }
    if (res == ncclSuccess && n > 0) {
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += in[i];
        t->t_warm = geoNow() - t0;
        geoInfo(GEO_LOG_TOPO | GEO_LOG_INIT,
                "probe: warmed the WAN connections to %d peer%s in %d pair%s of regions: "
                "%.3f s, %.0f Mbit/s received in steady state", n, n == 1 ? "" : "s",
                t->warm_pairs, t->warm_pairs == 1 ? "" : "s", t->t_warm, sum * 8e-6);
    }
    free(in);
    free(peers);
    free(warm);
    return res;
}

ncclResult_t geoProbeRun(geoProbeCtx *pc)
{
    geoTopo *t = pc->topo;
    int mode = pc->mode; /* 0 off, 1 auto, 2 always measure */
    int labelled = pc->labelled;
    double t_start = geoNow();
    ncclResult_t res;

    GEO_CHECK(find_nodes(pc, t));
    geoErrSetOp(pc->err, "init probe");
    if (t->leader[t->node_of[pc->rank]] == pc->rank && geoDebugLevel() >= GEO_LEVEL_INFO) {
        topoNic nics[16];
        char line[512] = "none";
        int n = topoNicList(nics, 16), len = 0;
        for (int i = 0; i < n && len < (int)sizeof(line) - 64; i++) {
            char rate[24] = "rate unknown";
            if (nics[i].gbit > 0)
                snprintf(rate, sizeof(rate), "%g Gbit/s", nics[i].gbit);
            len += snprintf(line + len, sizeof(line) - (size_t)len, "%s%s%s %s%s", i ? ", " : "",
                            nics[i].name, nics[i].rdma ? " (rdma)" : "", rate,
                            nics[i].up ? "" : " (down)");
        }
        geoInfo(GEO_LOG_TOPO, "probe: local NICs: %s; data on %s", line, pc->if_name);
    }

    /* Round trips: to find regions, because asked to measure, or because the
     * bandwidth below will be measured between labelled regions: its
     * transfer lasts 12 round trips, and a guess too short for a long link
     * (0.25 s is 5 round trips at 50 ms) ends in slow start and reported
     * 130-160 Mbit/s on a 1 Gbit/s link. */
    int bw_next = labelled && pc->regions->nregions > 1 && !(pc->file != NULL) &&
                  !(pc->inherit != NULL);
    if (t->nnodes > 1 && (mode == 2 || (mode == 1 && (!labelled || bw_next)))) {
        double t0 = geoNow();
        GEO_CHECK(measure_rtt(pc, t));
        t->t_rtt = geoNow() - t0;
        if (!labelled) {
            int *reg = malloc(sizeof(int) * (size_t)t->nnodes);
            if (reg == NULL)
                return ncclSystemError;
            int nreg = topoClusterRtt(t->nnodes, t->rtt, TOPO_MIN_WAN_RTT, TOPO_MAX_LAN_RTT,
                                      TOPO_MIN_GAP_RATIO, reg, &t->cut);
            if (nreg < 0) {
                free(reg);
                return ncclSystemError;
            }
            if (nreg > 1) {
                int *of_rank = malloc(sizeof(int) * (size_t)pc->nranks);
                if (of_rank == NULL) {
                    free(reg);
                    return ncclSystemError;
                }
                for (int r = 0; r < pc->nranks; r++)
                    of_rank[r] = reg[t->node_of[r]];
                res = pc->set_regions(pc->arg, of_rank);
                free(of_rank);
                if (res != ncclSuccess) {
                    free(reg);
                    return res;
                }
                t->regions_measured = 1;
            }
            geoInfo(GEO_LOG_TOPO, "probe: %d nodes form %d region%s (RTT cut %.2f ms)",
                    t->nnodes, nreg, nreg == 1 ? "" : "s", t->cut * 1e3);
            free(reg);
        }
    }

    /* Region-level figures. */
    int R = pc->regions->nregions;
    t->nregions = R;
    t->region_rtt = malloc(sizeof(double) * (size_t)R * (size_t)R);
    t->oneway = calloc((size_t)R, sizeof(double));
    t->bw = calloc((size_t)R * (size_t)R, sizeof(double));
    t->egress = calloc((size_t)R, sizeof(double));
    t->ingress = calloc((size_t)R, sizeof(double));
    t->loss = malloc(sizeof(double) * (size_t)R * (size_t)R);
    t->loss_segs = calloc((size_t)R * (size_t)R, sizeof(double));
    t->rttvar = calloc((size_t)R * (size_t)R, sizeof(double));
    if (!t->region_rtt || !t->oneway || !t->bw || !t->egress || !t->ingress || !t->loss ||
        !t->loss_segs ||
        !t->rttvar)
        return ncclSystemError;
    for (int i = 0; i < R * R; i++)
        t->region_rtt[i] = t->loss[i] = -1;
    if (t->rtt_measured)
        for (int a = 0; a < t->nnodes; a++)
            for (int b = 0; b < t->nnodes; b++) {
                double x = t->rtt[a * t->nnodes + b];
                int ga = pc->regions->region_of[t->leader[a]];
                int gb = pc->regions->region_of[t->leader[b]];
                double *y = &t->region_rtt[ga * R + gb];
                if (a != b && x >= 0 && (*y < 0 || x < *y))
                    *y = x;
            }
    for (int g = 0; g < R; g++)
        t->region_rtt[g * R + g] = 0;
    if (t->rtt_measured)
        topoSolveOneWay(R, t->region_rtt, t->oneway);
    if ((pc->file != NULL))
        apply_file(pc, t);
    if ((pc->inherit != NULL))
        apply_inherit(pc, t);
    /* The smallest window of any rank, so that every rank computes the same
     * stream counts (apply_streams). */
    t->window_bytes = pc->window;
    if (t->window_bytes <= 0)
        t->window_bytes = geoProbeStreamWindow();
    t->streams_needed = pc->nstreams;
    /* Bandwidth: between regions on different nodes (labels on one host
     * have no link to measure), unless the topology file gave it. */
    if (R > 1 && t->nnodes > 1 && (mode == 2 || (mode == 1 && !t->from_file && !t->inherited))) {
        double t0 = geoNow();
        GEO_CHECK(measure_bw(pc, t));
        GEO_CHECK(measure_intra(pc, t));
        t->t_bw = geoNow() - t0;
        double worst = 1;
        for (int g = 0; g < R; g++) {
            t->egress[g] = 0;
            for (int h = 0; h < R; h++)
                if (h != g) {
                    t->egress[g] += t->bw[g * R + h];
                    /* Streams a pair needs when it has the link to itself. */
                    double s = (double)topoStreamsNeeded(
                        t->bw[g * R + h] * (R - 1), t->region_rtt[g * R + h], t->window_bytes,
                        64);
                    if (s > worst)
                        worst = s;
                }
        }
        t->streams_needed = (int)worst;
        topoIngressFromRates(R, t->bw, t->ingress);
    }
    /* The probe's own cost starts when every leader has arrived (the
     * warm-up round trip); before that, ranks wait for slower peers. */
    if (t->t_arrived > t_start) {
        t->t_wait = t->t_arrived - t_start;
        t->t_rtt -= t->t_wait;
        t_start = t->t_arrived;
    }
    t->t_total = geoNow() - t_start;
    apply_streams(pc, t);
    GEO_CHECK(geoWanCcInit(pc->net, pc->regions, pc->rank, pc->nranks, pc->nstreams, t,
                           pc->wan_cc));
    GEO_CHECK(warm_wan(pc, t));
    if (t->rtt_measured || t->bw_measured) {
        log_matrix(t, R);
        geoInfo(GEO_LOG_TOPO | GEO_LOG_INIT,
                "probe: %d nodes, %d regions, %.3f s (round trips %.3f s over %d node pairs "
                "in %d round%s, bandwidth %.3f s%s; "
                "after %.3f s waiting for peers); %d stream%s per WAN pair needed (window "
                "%.1f MiB), using at most %d of %d connected; inside regions %.0f us, %.0f MB/s "
                "per rank",
                t->nnodes, R, t->t_total, t->t_rtt, t->rtt_pairs, t->rtt_rounds,
                t->rtt_rounds == 1 ? "" : "s", t->t_bw,
                t->bw_again ? ", measured again on warm connections: the first rates set "
                              "regions apart" : "",
                t->t_wait, t->streams_needed,
                t->streams_needed == 1 ? "" : "s", t->window_bytes / 1048576.0,
                t->streams_used, pc->nstreams,
                t->intra_alpha * 1e6, t->intra_Bps * 1e-6);
    }
    return ncclSuccess;
}

static void rate_str(double bps, char *out, size_t len)
{
    if (bps >= 1e9)
        snprintf(out, len, "%.3fgbit", bps * 8e-9);
    else
        snprintf(out, len, "%.1fmbit", bps * 8e-6);
}

int geoTopoWrite(const geoTopo *t, const topoRegionMap *m, int nranks, FILE *f)
{
    int R = m->nregions;
    time_t now = time(NULL);
    char when[64];

    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    fprintf(f, "# GeoCCL topology, written by the probe on %s\n", when);
    fprintf(f, "# %d ranks, %d nodes, %d regions; loaded with GEOCCL_TOPO_FILE, it skips the "
            "probe\n", nranks, t->nnodes, R);
    fprintf(f, "# bw: link rate estimated from the measured TCP goodput (x 1500/1448)\n");
    for (int g = 0; g < R; g++) {
        char rate[64] = "";
        if (t->bw_measured && t->egress && t->egress[g] > 0) {
            char r[24];
            /* Files hold link rates; what TCP measured is 1448/1500 of it. */
            rate_str(t->egress[g] * 1500.0 / 1448.0, r, sizeof(r));
            snprintf(rate, sizeof(rate), " bw=%s", r);
        }
        if (t->ingress && t->ingress[g] > 0) {
            char r[24];
            size_t len = strlen(rate);
            rate_str(t->bw_measured ? t->ingress[g] * 1500.0 / 1448.0 : t->ingress[g], r,
                     sizeof(r));
            snprintf(rate + len, sizeof(rate) - len, " in=%s", r);
        }
        fprintf(f, "region %s ranks=%d%s", m->names[g][0] ? m->names[g] : "default", m->size[g],
                rate);
        if (t->oneway && (t->rtt_measured || t->from_file))
            fprintf(f, " delay=%.3f", t->oneway[g] * 1e3);
        fprintf(f, "\n");
    }
    for (int k = 0; k < t->nnodes; k++) {
        const char *name = m->names[m->region_of[t->leader[k]]];
        fprintf(f, "host %s %s\n", t->node_addr[k], name[0] ? name : "default");
    }
    if (t->rtt_measured)
        for (int a = 0; a < R; a++)
            for (int b = a + 1; b < R; b++)
                if (t->region_rtt[a * R + b] >= 0)
                    fprintf(f, "rtt %s %s %.3f\n", m->names[a], m->names[b],
                            t->region_rtt[a * R + b] * 1e3);
    if (t->bw_measured)
        /* The connections to make next time: as many as needed, or those
         * kept in use on links slow enough that extra ones cost nothing. */
        fprintf(f, "streams %d\n",
                t->streams_used > t->streams_needed ? t->streams_used : t->streams_needed);
    if (t->bw_measured && t->loss != NULL)
        for (int a = 0; a < R; a++)
            for (int b = 0; b < R; b++)
                if (a != b && t->loss[a * R + b] >= 0 && t->loss_segs[a * R + b] > 0)
                    fprintf(f, "loss %s %s %.4g%% segments=%.0f\n", m->names[a], m->names[b],
                            t->loss[a * R + b] * 100, t->loss_segs[a * R + b]);
    if (t->intra_Bps > 0)
        fprintf(f, "intra bw=%.0f delay=%.4f\n", t->intra_Bps, t->intra_alpha * 1e3);
    return ferror(f) ? -1 : 0;
}
