/* WAN tuning: what GeoCCL does to its TCP connections between regions
 * beyond sending on them, in one place.  Three things, each from figures
 * every rank holds (the probe's, or a topology file's), each rank for its
 * own sending side:
 *
 *  - congestion control at init (wan_cc.c): the one the probe's bandwidth
 *    transfer runs under (geoWanCcForProbe), then per pair of regions the
 *    one the WAN connections keep (geoWanCcInit: topoWanCcChoice, from the
 *    loss the probe counted);
 *  - congestion control after init (wan_cc.c, geoWanWatch): a pair left on
 *    BBR moves to cubic once what its connections carry shows cubic serves
 *    it (topoWanCcRevisit);
 *  - pacing during the hierarchical all-reduce (wan_pace.c): each
 *    connection capped at its share of its region's uplink, and of the
 *    downlink of a region whose downlink limits, with the gains each call
 *    adjusts, and BBR restarted under the uplink's cap (geoWanPace).
 *
 * This module is the only caller of comm/transport/net_tcp_tune.h.  Over
 * another transport (not TCP) none of it acts.  Its state per
 * communicator is a geoWanTuning, which the communicator embeds; the
 * callers pass plain inputs (the transport, the region map, the probe's
 * figures, what a call sends each peer) and see no communicator here.
 *
 * What turns what off (comm/base/param.c):
 *  - GEOCCL_WAN_CC=host: no congestion control is set on any WAN
 *    connection, for the probe's transfer or after (they keep
 *    GEOCCL_TCP_CC or the host's default), and nothing is watched after
 *    init.  A name (cubic, bbr, ...): that one on every WAN connection,
 *    from the probe's transfer on, and nothing watched after init.  auto
 *    (the default): BBR for the probe's transfer, the per-pair choice at
 *    init, and the watch after it.
 *  - GEOCCL_WAN_PACE=0: no pacing, uplink or downlink, and so no BBR
 *    restarts (they are made only under the uplink's cap).  Compressed
 *    calls are never paced at the uplink (their bytes on the wire are not
 *    the call's bytes), only into a region whose downlink limits.
 *
 * The warm-up of the WAN connections at init (GEOCCL_WAN_WARMUP) is the
 * probe's (probe.c, warm_wan): it sends on them and sets nothing.
 *
 * Layering: topology/ sits below the communicator; everything here reaches
 * the connections through the transport (comm/transport). */
#ifndef GEOCCL_TOPO_WAN_TUNING_H_
#define GEOCCL_TOPO_WAN_TUNING_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "comm/transport/transport.h"
#include "topology/model.h"
#include "topology/probe.h"
#include "topology/regions.h"

/* ---- the rules (pure functions; wan_cc.c) ------------------------------- */

#define TOPO_LOSS_MIN_SEGS 500 /* segments below which a loss figure is not one */
#define TOPO_CC_HEADROOM 1.25  /* what a loss-driven control must hold beyond the share */

enum { TOPO_CC_CUBIC = 0, TOPO_CC_BBR = 1 };

/* The congestion control for this rank's connections to one peer in
 * another region, and the streams they need (*streams, at most
 * max_streams):
 * - loss measured (segs >= TOPO_LOSS_MIN_SEGS) and, at the highest loss
 *   its count leaves plausible (about 95%, one-sided), streams x
 *   topoLossRate >= TOPO_CC_HEADROOM x share: cubic (on a clean path it
 *   fills the link sooner after a pair's flows finish: 3 emulated regions
 *   x 2 ranks at 1 Gbit/s, 256 MiB: 3.02-3.13 s against BBR's 3.18-3.24 s);
 *   the probe's few thousand segments rarely suffice, a topology file's
 *   "loss A B 0" (a figure the user knows) does;
 * - otherwise BBR when the kernel has it (bbr_ok);
 * - otherwise cubic on as many streams as the loss term asks.
 * share: the bytes/s this rank's connections to the peer carry in a
 * hierarchical all-reduce; rtt: seconds; loss: lost/sent (< 0 unknown);
 * segs: segments it counts.  why gets the reason in words. */
int topoWanCcChoice(double share, double rtt, double loss, double segs, int streams,
                    int bbr_ok, int max_streams, int *streams_out, char *why, size_t len);

/* GEOCCL_WAN_CC=auto after init, for a pair left on BBR (wan_cc.c,
 * geoWanWatchCallEnd): whether this rank's connections to it may now run
 * cubic.  msg: the mean bytes of the messages sent across regions in the
 * last window; stripe: the bytes a message puts on one connection before
 * the next (it spreads over min(streams, msg / stripe) of them); share: a
 * bulk transfer's bytes/s per rank to the pair, as at init; retrans of
 * segs: what the connections sent again of all they sent since they opened
 * (the probe's transfer included; spurious ones count, so the loss is
 * overstated, never understated); paused of calls: how many of the
 * window's calls came after a pause longer than TOPO_RTO_MIN_S;
 * restart_idle: the kernel's tcp_slow_start_after_idle.  Cubic where, at
 * the highest loss the counts leave plausible (topoWanCcChoice's bound),
 * either cubic's mean window on each connection holds a message's share
 * of it (sqrt(3 / (2p)) segments: such messages cross in about one round
 * trip, as with BBR), or the streams hold the bulk share as
 * topoWanCcChoice asks at init; and at most one call in 8 follows such a
 * pause (after an idle retransmission timeout, at least TOPO_RTO_MIN_S,
 * cubic starts its window again and BBR does not: DiLoCo's outer
 * all-reduce, 450 ms of local steps apart, took 154 ms a round under
 * cubic against 119 ms under BBR).  BBR otherwise.  why gets the reason
 * in words. */
#define TOPO_RTO_MIN_S 0.2 /* Linux's TCP_RTO_MIN */
int topoWanCcRevisit(double msg, double stripe, double share, double rtt, double retrans,
                     double segs, int streams, int paused, int calls, int restart_idle,
                     char *why, size_t len);

/* The rate (bytes/s) from region g to h of the R in t: measured, or the
 * region's egress (a topology file's rate) shared by the other regions;
 * 0 unknown. */
double geoWanPairRate(const geoTopo *t, int R, int g, int h);

/* ---- congestion control at init (wan_cc.c) ------------------------------ */

/* The congestion control the probe's bandwidth transfer runs under, on
 * this region leader's connections to the other leaders (leaders[q], q !=
 * me, of R): BBR under GEOCCL_WAN_CC=auto, the one named otherwise,
 * nothing under host or over another transport. */
void geoWanCcForProbe(geoNet *net, const int *leaders, int R, int me);

/* The congestion control of this rank's connections to the other regions
 * (GEOCCL_WAN_CC), set once the regions and the probe's figures t are
 * known, before the warm-up.  auto: per pair (t->wan_choice and
 * t->wan_why filled for every pair, every rank alike); a name: that one.
 * cc_out (GEO_PROBE_CC_LEN bytes) gets what was set ("mixed" when pairs
 * differ, "" when nothing).  A connection that refuses is left as it was
 * (said at INFO, or WARN when the user named it).  ncclSuccess, or
 * ncclSystemError when out of memory.  Every rank, once, at init. */
ncclResult_t geoWanCcInit(geoNet *net, const topoRegionMap *m, int rank, int nranks,
                          int nstreams, geoTopo *t, char *cc_out);

/* ---- congestion control after init (wan_cc.c) --------------------------- */

/* GEOCCL_WAN_CC=auto after init.  The probe's few thousand segments can
 * rarely rule out the loss at which cubic would be too slow for a bulk
 * transfer, so most pairs start on BBR.  But on traffic that is small and
 * frequent (a DDP step's gradients: one 340 KB all-reduce per step) BBR
 * costs time twice: it paces at its estimate of the rate, which such
 * traffic keeps low, and every 10 s it holds each connection to 4 packets
 * for 200 ms (PROBE_RTT).  3 regions x 2 ranks, 100 Mbit/s, 25 ms: DDP
 * steps of 130 ms against cubic's 98 ms, with no packet lost
 * (BENCHMARKS.md, "PyTorch on emulated regions").  So each rank watches
 * what its connections to each region carry, per window of
 * GEO_WAN_WATCH_S and GEO_WAN_WATCH_CALLS: the mean size of its messages
 * to other regions, the segments sent and sent again (TCP_INFO), and the
 * pauses between calls;
 * and a pair on BBR moves to cubic once topoWanCcRevisit says cubic's
 * window holds such messages at the loss counted.  The move is
 * made once, each rank for its own sending side; a pair does not go back
 * (under cubic, its own drops at a full queue would count as loss). */
#define GEO_WAN_WATCH_S 1.0     /* a window lasts this long ... */
#define GEO_WAN_WATCH_CALLS 8   /* ... and this many calls at least */
typedef struct {
    int on;                 /* watching (auto, and some pair on BBR); -1: never */
    double since;           /* start of the window */
    double last_end;        /* when the last call ended; 0: none yet */
    int calls, paused;      /* calls in the window; those after a pause over TOPO_RTO_MIN_S */
    uint64_t bytes, msgs;   /* net->sent.wan and .wan_msgs at the window's start */
    int *cc;                /* [R] TOPO_CC_* of my connections to each region; -1 not ours */
    char (*why)[2 * GEO_PROBE_WHY_LEN]; /* [R] why a pair moved to cubic */
    int restart_idle;       /* net.ipv4.tcp_slow_start_after_idle */
} geoWanWatch;

/* Around every collective call: Start notes the pause since the last
 * call; End, once a window is over, judges the pairs still on BBR and
 * moves those that qualify (said at INFO, subsystem NET).  t, m and net:
 * the communicator's. */
void geoWanWatchCallStart(geoWanWatch *w, double now);
void geoWanWatchCallEnd(geoWanWatch *w, const geoTopo *t, const topoRegionMap *m, int rank,
                        int nranks, int nstreams, geoNet *net, double now);
void geoWanWatchFree(geoWanWatch *w);

/* ---- pacing (wan_pace.c) ------------------------------------------------ */

#define GEO_WAN_MAX_REGIONS 64 /* regions the pace keeps figures for */

/* What this rank keeps for the pace between calls. */
typedef struct {
    /* Goodput (bytes/s) at which what all other regions send region h
     * during the hierarchical all-reduce is paced: its downlink's, where
     * that limits; 0: not paced. */
    double pace[GEO_WAN_MAX_REGIONS];
    /* Goodput (bytes/s) of my region's uplink, at which what its ranks
     * send during the hierarchical all-reduce is paced, each connection
     * at its share; 0: not paced. */
    double up;
    /* this rank's factor on up, raised after a call whose capped
     * connections ran at their caps; the call's start, the caps it set in
     * all, and what those connections had had acknowledged then */
    double up_gain, up_t0, up_cap, up_acked0;
    /* the caps the call in progress set on my connections' uplink in all
     * (bytes/s; 0: none), for the re-plan's reading (topology/replan.h) */
    double call_cap;
    /* the uplink figure of the plan before (kept across geoWanPaceReset),
     * and whether the next paced call restarts BBR: the plan raised my
     * uplink's figure well over it */
    double up_plan;
    int up_restart;
    double up_headroom; /* the cap over up: higher under a figure a re-plan lowered */
    int down_held[GEO_WAN_MAX_REGIONS]; /* the call held some connection into h at pace[h] */
    int paced;              /* some region is, or the uplink is */
    /* this rank's factor on pace[h], adjusted after each paced call, and
     * its connections' counts at the call's start */
    double gain[GEO_WAN_MAX_REGIONS], segs[GEO_WAN_MAX_REGIONS],
        retrans[GEO_WAN_MAX_REGIONS];
    int armed;              /* the call in progress set the pace */
} geoWanPaceState;

/* No pacing, gains at 1: before the plan, and with one region. */
void geoWanPaceReset(geoWanPaceState *p);

/* From the plan's model m (its regions' egress and ingress rates and
 * goodput factor): which regions' downlinks are paced into and at what
 * rate, and my region's uplink rate (rm, rank: the communicator's map and
 * this rank; lowered: a re-plan put my region's uplink under the probe's
 * figure, which sets its cap higher over it, wan_pace.c).  Said at INFO
 * (subsystem TUNING) by rank 0 and my region's first rank.
 * GEOCCL_WAN_PACE=0: nothing paced. */
void geoWanPaceSetup(geoWanPaceState *p, const topoModel *m, const topoRegionMap *rm, int rank,
                     int lowered);

/* Whether geoWanPace may act at all: something is paced and net is TCP.
 * A caller may skip building geoWanPace's inputs when it is 0. */
int geoWanPaceOn(const geoWanPaceState *p, const geoNet *net);

/* What one call sends one peer in another region: amount in any unit, the
 * same as geoWanPace's len. */
typedef struct {
    int peer;
    double amount;
} geoWanSend;

/* Set (on = 1, before a hierarchical all-reduce's first message) or lift
 * (on = 0, once it is over, with the same inputs) the pace of this rank's
 * connections to the peers in to[0..n) (each peer once, in the order its
 * first message goes out: the order of the setsockopt calls), and after
 * lifting, adjust the gains from what the connections counted over the
 * call.  The inputs: len, a slice of the call (what to[] holds is that
 * slice's messages, X1 and X2 together, in the same unit); call_bytes, the
 * bytes of the whole call (0 for a compressed call: no uplink pace);
 * shares, each region's share of a piece (model.h topoHierShares,
 * [nregions], summing to TOPO_SHARE_ONE); region_rtt, the probe's [R*R]
 * RTTs in seconds, or NULL; m and rank, the region map and this rank.
 * Why each rule: wan_pace.c.  Nothing to do unless geoWanPaceOn. */
void geoWanPace(geoWanPaceState *p, geoNet *net, const topoRegionMap *m, int rank,
                const unsigned *shares, const double *region_rtt, const geoWanSend *to, int n,
                size_t len, double call_bytes, int on);

/* ---- one communicator's state -------------------------------------------- */

typedef struct {
    char cc[GEO_PROBE_CC_LEN]; /* congestion control set at init (geoWanCcInit), "" none */
    geoWanWatch watch;         /* after init (GEOCCL_WAN_CC=auto) */
    geoWanPaceState pace;      /* GEOCCL_WAN_PACE */
} geoWanTuning;

void geoWanTuningFree(geoWanTuning *w);

#endif
