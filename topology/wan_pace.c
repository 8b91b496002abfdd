/* Pacing of the connections between regions during the hierarchical
 * all-reduce (GEOCCL_WAN_PACE; wan_tuning.h): which regions' downlinks
 * and which uplink are paced, from the plan's model, and per call the cap
 * of each of this rank's connections to other regions, the BBR restarts
 * under the uplink's cap, and the gains each call adjusts from what its
 * connections counted.  The caller (comm/coll) says what the call sends
 * each peer; the setsockopt calls go through net_tcp_tune.h. */
#include "config.h"
#include "topology/wan_tuning.h"
#include "comm/base/debug.h"
#include "comm/base/param.h"
#include "comm/transport/net_tcp_tune.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define PACE_UP_RESTART 1.5 /* a plan raising the uplink's figure this much restarts BBR */
#define PACE_UP_HEADROOM 1.2     /* the cap over the uplink's figure (geoWanPace) */
#define PACE_UP_HEADROOM_LOW 1.4 /* the same over a figure a re-plan lowered */

void geoWanPaceReset(geoWanPaceState *p)
{
    memset(p->pace, 0, sizeof(p->pace));
    p->up = 0;
    p->up_gain = 1;
    p->up_headroom = PACE_UP_HEADROOM;
    p->paced = 0;
}

/* GEOCCL_WAN_PACE: a region whose downlink takes less than the others can
 * send it (the probe saw its incoming flows held back, or the topology file
 * gave in=) gets what they send it during the hierarchical all-reduce paced
 * at its downlink's goodput.  A policing downlink (a token bucket that
 * drops what exceeds it, as a provider's port limit does) otherwise drops
 * the excess of every sender at once: 3x2 with 1 Gbit/s uplinks and one
 * 100 Mbit/s downlink lost 11-12% of the segments into it at init, and the
 * 64 MiB all-reduce ran 1.30x its bound unpaced, 1.12x paced
 * (BENCHMARKS.md, "Uneven links").  My region's uplink goodput (up)
 * paces each of my connections to other regions at its share of it
 * (geoWanPace). */
void geoWanPaceSetup(geoWanPaceState *p, const topoModel *m, const topoRegionMap *rm, int rank,
                     int lowered)
{
    const int R = m->nregions;
    char line[512];
    int o = 0;
    for (int h = 0; h < R; h++) {
        double in = m->ingress_Bps[h] * m->wan_goodput, sent = 0;
        for (int q = 0; q < R; q++)
            if (q != h)
                sent += m->egress_Bps[q] * m->wan_goodput / (R - 1);
        p->pace[h] = geoParamInt(GEO_PARAM_WAN_PACE) != 0 && in > 0 && in < sent ? in : 0;
        p->gain[h] = 1;
        if (p->pace[h] > 0 && o < (int)sizeof(line) - 64)
            o += snprintf(line + o, sizeof(line) - (size_t)o, "%s%s %.1f Mbit/s (the others "
                          "send %.1f)", p->paced ? ", " : "", m->names[h], in * 8e-6,
                          sent * 8e-6);
        p->paced |= p->pace[h] > 0;
    }
    if (p->paced && rank == 0)
        geoInfo(GEO_LOG_TUNING, "hierarchical all-reduce paced into regions whose downlink "
                "limits: %s; GEOCCL_WAN_PACE=0 turns it off", line);
    const int g = rm->region_of[rank];
    p->up = geoParamInt(GEO_PARAM_WAN_PACE) != 0 && g >= 0 && g < R
                ? m->egress_Bps[g] * m->wan_goodput : 0;
    p->up_gain = 1;
    /* Under a figure a re-plan lowered, the cap sits PACE_UP_HEADROOM_LOW
     * over it: a region's connections are not all busy at once (they wait
     * for the stages of the pipeline), and at 1.2x those that are could
     * not take what the others left: 3x2, region 0 cut from 100 to 25
     * Mbit/s, 16 MiB, its calls took 6.12-6.39 s over five runs at 1.2x,
     * 6.10-6.11 s in two at 1.4x (1 Gbit/s cut to 250: 2.29-2.37 s at 1.4x,
     * 2.31-2.34 at 1.2x).  At init and on unchanged links 1.2x: at 1.4x
     * the 1 Gbit/s calls took 0.79-0.81 s against 0.77-0.79. */
    p->up_headroom = lowered ? PACE_UP_HEADROOM_LOW : PACE_UP_HEADROOM;
    /* A plan made again that raises my uplink's figure (its link came
     * back: topology/replan.h) lifts a cap my connections were held to
     * for many calls, and BBR's estimate of the path is that cap: it
     * would take 25% more per 8 round trips (3x2, 100 Mbit/s back from
     * 25, 16 MiB: the three calls after the re-plan 2.02-2.21 s against
     * 1.95).  The next paced call starts BBR again. */
    p->up_restart = p->up > 0 && p->up_plan > 0 && p->up > PACE_UP_RESTART * p->up_plan;
    if (p->up > 0)
        p->up_plan = p->up;
    p->paced |= p->up > 0;
    if (p->up > 0 && rank == rm->members[g][0])
        geoInfo(GEO_LOG_TUNING, "hierarchical all-reduce: region %s sends at %.1f Mbit/s in "
                "all, each connection at its share; GEOCCL_WAN_PACE=0 turns it off",
                m->names[g], p->up * 8e-6);
}

int geoWanPaceOn(const geoWanPaceState *p, const geoNet *net)
{
    return p->paced && geoNetTcpTunable(net);
}

/* GEOCCL_WAN_PACE (geoWanPaceSetup), uplink: in an uncompressed call
 * that keeps my region's uplink busy PACE_UP_MIN_S or more at the probe's
 * rate (busy), each of my connections to other regions is capped at its
 * share of that uplink: what this slice's plan sends the peer over what
 * my region sends in all, (1 + (R-2) w_g) len, times the probe's uplink
 * goodput, PACE_UP_HEADROOM and up_gain.  BBR's connections sharing one
 * uplink otherwise settle on rates that stay apart for many round trips,
 * and a call ends with its slowest connection.  The probe reads a lossy
 * uplink low, so the cap sits PACE_UP_HEADROOM over its figure, and a
 * call whose capped connections had acknowledged PACE_UP_BINDING of their
 * caps or more (they were held back) raises up_gain by PACE_UP_RAISE, up
 * to PACE_UP_GAIN_MAX; at that, still held back, the uplink is no longer
 * paced.  A smaller call is sent unpaced: its connections are not all
 * busy at once, and a cap at the share held them back (3x2, 100 Mbit/s,
 * 25 ms: a 1 MiB call, 0.11 s at the probe's rate, took 0.244-0.250 s
 * paced and 0.176-0.183 s not; 16 MiB 1.92-1.93 s against 1.92-2.08 s;
 * BENCHMARKS.md, "Lossy and jittery paths").
 *
 * Under that cap, a connection on BBR is started again at the call's
 * start (net_tcp_tune.h geoNetTcpRestartBbr) where the call may end past
 * BBR's 10 s window (its last restart is older than PACE_BBR_WINDOW_S -
 * PACE_BBR_SLACK busy: a call may take twice its time at the probe's
 * rate) and lasts PACE_BBR_MIN_RTTS round trips or more: BBR holds each
 * connection that shares a queue to 4 segments for 200-300 ms every 10 s
 * (PROBE_RTT), wherever in a call that falls, and the restart begins the
 * 10 s again at a point where the call waits anyway; the cap keeps its
 * STARTUP from flooding the link.  3x2, 1 Gbit/s, 25 ms, 0.1% loss,
 * 64 MiB: see BENCHMARKS.md, "Lossy and jittery paths" (WPACE).
 *
 * Downlink: while on, pace my connections to each rank of a region h
 * whose downlink limits, so that what all ranks send h adds up to its
 * downlink's goodput P_h.  Per slice of len elements, h receives
 * len (1 + (R-2) w_h): w_h len from each of the R-1 other regions in X1
 * and (1 - w_h) len in all in X2.  My part of that is what this slice's
 * plan sends the peer (X1 and X2: its to[].amount), so the peer's rate is
 * P_h x mine / all: every sender finishes with the others.  off lifts the
 * cap, so other collectives between the same ranks are not held back to
 * it (TCP keeps pacing those connections at its own rate from then on).
 * A call returns when its sends are in the kernel's buffer, so the tail
 * of what it sent into h leaves at that rate, no longer capped.
 *
 * P_h is the probe's figure (or a file's in=) times this rank's gain for h,
 * which each call adjusts from what its connections into h sent again
 * (TCP_INFO, over at least PACE_MIN_SEGS segments), against the share its
 * connections to the regions it does not pace sent again in the same call
 * (the paths' own random loss, which pacing cannot help): no more than
 * that, and the next call paces PACE_UP faster; PACE_LOSS of the segments
 * or more beyond it (a policer's drops when the senders together exceed
 * it), PACE_DOWN slower; in between it stays.  Why: the probe's figure is
 * read through lossy flows and is no rate a policer keeps to.  Into a
 * 100 Mbit/s policer from two 1 Gbit/s regions (BENCHMARKS.md, "Uneven
 * links", WDOWN): in one run the first call paced at it sent 8% of its
 * segments again (1024 of 12290) and the gain settled at 0.84-0.94; in
 * another no call sent any again until the gain reached 1.16, then it
 * stayed at 1.08-1.16.  With 1% random loss on every path as well, the
 * connections into the policer sent 1.1-1.4% again, as those to the other
 * regions did, and the gain rose (1.13 after 8 calls) instead of falling
 * for loss that pacing cannot help. */
#define PACE_MIN_SEGS 1000
#define PACE_UP 1.03
#define PACE_DOWN 0.95
#define PACE_LOSS 0.01
#define PACE_GAIN_MAX 1.3
#define PACE_GAIN_MIN 0.7
#define PACE_UP_BINDING 0.9
#define PACE_UP_RAISE 1.1
#define PACE_UP_GAIN_MAX 2.0
#define PACE_UP_MIN_S 0.5
#define PACE_BBR_WINDOW_S 9.0
#define PACE_BBR_SLACK 2.0
#define PACE_BBR_MIN_RTTS 5
#define PACE_BBR_MIN_S 0.5
#define PACE_BBR_IN_ROW 5
void geoWanPace(geoWanPaceState *p, geoNet *net, const topoRegionMap *m, int rank,
                const unsigned *shares, const double *region_rtt, const geoWanSend *to, int n,
                size_t len, double call_bytes, int on)
{
    const geoNetTransport *ops = net->ops;
    if (!p->paced || !geoNetTcpTunable(net) || len == 0)
        return;
    const int R = m->nregions < 64 ? m->nregions : 64, g = m->region_of[rank];
    /* what my region sends per slice: (1 - w_g) len in X1, w_g len to each
     * of the R-1 others in X2 */
    const double spread = 1 + (m->nregions - 2) * (double)shares[g] / TOPO_SHARE_ONE;
    const double sent = (double)len * spread;
    /* how long the call keeps my region's uplink busy at its rate */
    const double busy = p->up > 0 ? call_bytes * spread / p->up : 0;
    const int up_on = busy >= PACE_UP_MIN_S;
    double segs[64] = {0}, ret[64] = {0}, up_cap = 0, up_acked = 0;
    int down_held[64] = {0}; /* some connection into h held at the downlink's rate */
    for (int i = 0; i < n; i++) {
        const geoWanSend *x = &to[i];
        int h = m->region_of[x->peer];
        if (h >= 64)
            continue;
        geoLinkStats ls;
        int have = ops->linkStats != NULL && ops->linkStats(net->state, x->peer, &ls) == 0;
        if (have) {
            segs[h] += (double)ls.segs_out;
            ret[h] += (double)ls.retrans;
        }
        if (!(p->pace[h] > 0) && !up_on)
            continue;
        double mine = x->amount;
        double all = (double)len * (1 + (m->nregions - 2) * (double)shares[h] / TOPO_SHARE_ONE);
        /* the same on and off: the gains change only after this loop */
        double down = mine > 0 && p->pace[h] > 0 ? p->pace[h] * p->gain[h] * mine / all : 0;
        double up = mine > 0 && up_on ? p->up * p->up_headroom * p->up_gain * mine / sent : 0;
        double rate = down > 0 && (up == 0 || down <= up) ? down : up;
        if (down > 0 && rate == down)
            down_held[h] = 1;
        if (up > 0 && rate == up) {
            up_cap += up;
            up_acked += have ? (double)ls.bytes_acked : 0;
        }
        geoNetTcpSetPacing(net, x->peer, on && rate > 0 ? (uint64_t)rate + 1 : 0);
        /* restart BBR where the call may outlast its 10 s window, and where
         * it lasts long enough (PACE_BBR_MIN_RTTS) for STARTUP to end
         * under the cap */
        double rtt = region_rtt != NULL ? region_rtt[g * m->nregions + h] : -1;
        if (on && up > 0 && rate == up && p->up_restart)
            geoNetTcpRestartBbr(net, x->peer, 0, PACE_BBR_IN_ROW + 1);
        else if (on && up > 0 && rate == up &&
                 busy >= (rtt > 0 ? PACE_BBR_MIN_RTTS * rtt : PACE_BBR_MIN_S))
            geoNetTcpRestartBbr(net, x->peer, fmax(0, PACE_BBR_WINDOW_S - PACE_BBR_SLACK * busy),
                                PACE_BBR_IN_ROW);
    }
    if (on && up_on)
        p->up_restart = 0;
    /* Only a call that set the pace adjusts it (an error before that
     * lifts a pace this call never set); what leaves after the call
     * returns, uncapped, counts in the next call's figures. */
    const int armed = p->armed;
    p->armed = on;
    if (on) {
        memcpy(p->segs, segs, sizeof(segs));
        memcpy(p->retrans, ret, sizeof(ret));
        memcpy(p->down_held, down_held, sizeof(down_held));
        p->up_t0 = geoNow();
        p->up_acked0 = up_acked;
        p->up_cap = up_cap;
        p->call_cap = up_cap;
        return;
    }
    if (!armed)
        return;
    /* the uplink: what the capped connections had acknowledged over the
     * call, against their caps (a connection replaced by resume counts
     * from 0 again: then this call says nothing) */
    const double took = geoNow() - p->up_t0;
    if (p->up_cap > 0 && took > 0 && up_acked >= p->up_acked0) {
        const double went = (up_acked - p->up_acked0) / took;
        if (went >= PACE_UP_BINDING * p->up_cap) {
            double gain = fmin(p->up_gain * PACE_UP_RAISE, PACE_UP_GAIN_MAX);
            geoTrace(GEO_LOG_NET, "uplink pace: the call sent %.1f Mbit/s under caps of %.1f in "
                     "all; gain %.3f -> %.3f", went * 8e-6, p->up_cap * 8e-6, p->up_gain, gain);
            if (p->up_gain >= PACE_UP_GAIN_MAX) {
                geoInfo(GEO_LOG_NET | GEO_LOG_TUNING, "uplink pace: calls still ran at their "
                        "caps at %.1fx the probe's uplink rate; the uplink is no longer paced",
                        p->up_headroom * PACE_UP_GAIN_MAX);
                p->up = 0;
            }
            p->up_gain = gain;
        }
    }
    /* the downlinks: only regions some connection was held into at the
     * downlink's rate; against the share sent again to regions not paced
     * at a downlink (the paths' own loss, which pacing cannot help) */
    double bs = 0, br = 0;
    for (int h = 0; h < R; h++)
        if (!(p->pace[h] > 0)) {
            bs += segs[h] - p->segs[h];
            br += ret[h] - p->retrans[h];
        }
    const double base = bs >= PACE_MIN_SEGS && br > 0 ? br / bs : 0;
    for (int h = 0; h < R; h++) {
        if (!(p->pace[h] > 0) || !p->down_held[h])
            continue;
        double ds = segs[h] - p->segs[h], dr = ret[h] - p->retrans[h];
        if (!(ds >= PACE_MIN_SEGS) || dr < 0)
            continue;
        double gn = p->gain[h];
        if (dr <= base * ds)
            gn = fmin(gn * PACE_UP, PACE_GAIN_MAX);
        else if (dr > (PACE_LOSS + base) * ds)
            gn = fmax(gn * PACE_DOWN, PACE_GAIN_MIN);
        if (gn != p->gain[h])
            geoTrace(GEO_LOG_NET, "pacing into region %d: %.0f of %.0f segments sent again in "
                     "the call (%.3g%% to unpaced regions); gain %.3f -> %.3f", h, dr, ds,
                     base * 100, p->gain[h], gn);
        p->gain[h] = gn;
    }
}
