/* Round trips between node leaders (probe_internal.h, probeMeasureRtt):
 * rounds of pings in which every pair runs at its own pace, the rounds
 * planned from landmarks (cluster.h, topoRttSampleRound) on many nodes,
 * the sparse matrix every leader ends with, and its hand-over to the
 * other ranks of each node.  The regions are then grouped from it
 * (probe.c). */
#include "config.h"
#include "topology/probe.h"
#include "topology/probe_internal.h"
#include "comm/base/param.h"
#include "topology/cluster.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PROBE_MSG 16                 /* ping/pong size */

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
        res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for round trips "
                      "with %d nodes", L);
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
                if (st[2 * p + k] || !probeReqDone(r))
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
                    res = GEO_ERR(pc->err, ncclInternalError, "init: probe: unexpected message "
                                  "%llu from rank %d", (unsigned long long)in[2 * p + k][0],
                                  leaders[p]);
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
            res = probeCheckDeadline(pc, deadline, "round trips");
            probePauseUs(10);
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
static int reports_pair(const int *cnt, int a, int j)
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
ncclResult_t probeMeasureRtt(geoProbeCtx *pc, geoTopo *t)
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
        return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for the round "
                       "trips of %d nodes", L);
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
        /* Nodes holding a rank of a fresh region (t->fresh): only pairs
         * with one of them are measured; all nodes without it. */
        unsigned char *need = calloc((size_t)L, 1);
        if (!landmark || !with || !row || !cnt || !need)
            res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for the round "
                          "trips of %d nodes", L);
        for (int r = 0; need && r < pc->nranks; r++)
            need[t->node_of[r]] |= t->fresh == NULL || t->fresh[pc->regions->region_of[r]];
        for (int round = 0; res == ncclSuccess; round++) {
            int npairs = topoRttSampleRound(L, K, round, t->rtt, landmark, with);
            if (npairs < 0)
                res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory choosing "
                              "the pairs of round %d", round);
            if (npairs <= 0)
                break;
            /* The pairs between nodes of covered regions only are left
             * unmeasured; the sampling goes on, with more landmarks each
             * round, until it has no pair left to choose (every node is
             * then a landmark), so it ends as without the mask. */
            npairs = 0;
            for (int a = 0; a < L; a++)
                for (int j = 0; j < L; j++) {
                    unsigned char *w = &with[(size_t)a * (size_t)L + (size_t)j];
                    *w = *w && (need[a] || need[j]);
                    npairs += *w;
                }
            if (npairs == 0)
                continue;
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
                    c += with[(size_t)a * (size_t)L + (size_t)j] && reports_pair(cnt, a, j);
                cap = c > cap ? c : cap;
            }
            size_t row_bytes = sizeof(double) * (size_t)(cap + 1);
            double *na = realloc(all, row_bytes * (size_t)L);
            if (res == ncclSuccess && na == NULL)
                res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for the "
                              "reports of %d nodes", L);
            all = na ? na : all;
            if (res != ncclSuccess)
                break;
            double *mine = malloc(row_bytes);
            if (mine == NULL) {
                res = GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for a "
                              "report");
                break;
            }
            int c = 1;
            mine[0] = t->nic_gbit[me];
            for (int j = 0; j < L; j++)
                if (with[(size_t)me * (size_t)L + (size_t)j] && reports_pair(cnt, me, j))
                    mine[c++] = row[j];
            for (; c <= cap; c++)
                mine[c] = -1;
            res = probeExchangeAmong(pc, t->leader, L, me, mine, row_bytes, all);
            free(mine);
            for (int a = 0; a < L && res == ncclSuccess; a++) {
                const double *ra = all + (size_t)a * (size_t)(cap + 1);
                if (round == 0)
                    t->nic_gbit[a] = ra[0];
                int i = 1;
                for (int j = 0; j < L; j++)
                    if (with[(size_t)a * (size_t)L + (size_t)j] && reports_pair(cnt, a, j)) {
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
        free(need);
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
            return GEO_ERR(pc->err, ncclSystemError, "init: probe: out of memory for %d ranks",
                           pc->nranks);
        }
        for (int r = 0; r < pc->nranks; r++)
            if (t->node_of[r] == node)
                members[m++] = r;
        if (m > 1)
            res = probeFanOut(pc, t->leader[node], members, m, share, share_bytes);
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
