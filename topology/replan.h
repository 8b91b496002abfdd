/* Re-planning while a job runs: what the hierarchical all-reduce's own
 * calls achieve on each region's uplink, and the rule that says when the
 * plan made from the probe's figures no longer fits the links.
 *
 * The probe measures each region's uplink once, at init.  Links between
 * clouds do not hold still (a policer cuts a path to a quarter, another
 * tenant's backup starts), and a probe on a busy CPU may misread a link.
 * So each rank counts, over a large call, what its connections to other
 * regions carried (TCP_INFO's bytes acknowledged) and how long they had
 * data in flight (busy and send-buffer-limited time; not the time the
 * receiver's window held them, which is the receiving rank being behind,
 * not the link): its achieved rate.  A region's ranks send at once, so
 * their rates add up to what the region's uplink gave.  The transport
 * also counts how long a connection's socket held data not yet sent
 * (full): the path, not this rank's own data, held it back.  No extra
 * traffic is sent to measure.
 *
 * The rule (topoReplanObserve, pure): a region whose achieved uplink rate
 * stays outside [1 - band, 1 + band] of the plan's figure, in the same
 * direction, for `calls` observed calls in a row gets the mean of those
 * calls as its new figure, and the plan is made again from it.  Every rank
 * applies the rule to the same figures (comm/coll/replan.c exchanges them),
 * so all switch after the same call.  Two guards:
 *  - a slower reading counts only where the region's uplink was busy most
 *    of the call (TOPO_REPLAN_BUSY_MIN): a region that did not limit the
 *    call sent in bursts, each ending in a round trip's wait, and reads
 *    slow on a fast link; and only where its sockets were full at least
 *    about as long as the fullest region's (TOPO_REPLAN_FULL_*): regions
 *    forwarding a slow one's data as it comes are busy all the call at
 *    its rate (1 Gbit/s links, one cut to 250: all read 230-260 Mbit/s
 *    at 100% busy; full 100% on the cut one, 15% on the others);
 *  - where the region's readings since the last re-plan were not settled
 *    (fewer than two, or spread wider than the band), the run must last
 *    twice as long.  A link that flaps (its rate changing every few
 *    seconds) gives each call a different mix of its rates; with 16 MiB
 *    calls at 100/25 Mbit/s changing every 2 s they read 43-65 Mbit/s in
 *    pairs, and the plain rule made the plan again 8 times in a minute
 *    (tests/wan/test_replan.sh SCENARIO=flap).  A link that dropped and
 *    stayed reads the same each call: settled, so its return is followed
 *    after `calls` calls;
 *  - a faster reading from a region whose uplink was not busy, or not
 *    full, most of the call (under TOPO_REPLAN_BUSY_FULL) says the link is
 *    at least that fast,
 *    not how fast: its data came in bursts, each starting slowly again.  A
 *    region given no share while its link was cut sends only its own data
 *    once when the link returns, finishes first and read 70-77 Mbit/s of a
 *    100 Mbit/s link at 77-83% busy; planned at that, it got a share of
 *    0.155 where 0.33 was right, and its later readings (83-87 Mbit/s)
 *    stayed inside the band: calls at 1.21x the bound for the rest of the
 *    job.  So an upward re-plan on such readings takes the larger of their
 *    mean and the figure last measured for the region with its uplink
 *    full (`known`: the probe's at init).  Where that is too high, the
 *    region now limits the calls, reads with its uplink busy, and a
 *    slower reading outside the band corrects it;
 *  - a region planned under its known figure is paced at its plan's
 *    figure (topology/wan_pace.c: its connections kept to their shares of
 *    the lowered link), so a link that comes back shows no more than the
 *    cap: a reading that reached TOPO_REPLAN_CAP_HELD of the caps the
 *    region's ranks set in the call counts as faster whatever the band,
 *    and as a floor, which takes the plan back to the known figure. */
#ifndef GEOCCL_TOPO_REPLAN_H_
#define GEOCCL_TOPO_REPLAN_H_

#include <stdint.h>

#include "comm/transport/transport.h"
#include "topology/regions.h"

#define TOPO_REPLAN_MAX_REGIONS 64
#define TOPO_REPLAN_HIST 16    /* readings kept per region since the last re-plan */
#define TOPO_REPLAN_FIG 4      /* figures per rank and region: rate, busy, full, cap */

typedef struct {
    int run[TOPO_REPLAN_MAX_REGIONS];      /* observed calls in a row outside the band */
    int dir[TOPO_REPLAN_MAX_REGIONS];      /* their direction: -1 slower, +1 faster */
    double sum[TOPO_REPLAN_MAX_REGIONS];   /* sum of their rates (bytes/s) */
    double busy[TOPO_REPLAN_MAX_REGIONS];  /* sum of their saturated shares (busy, or
                                            * full where it is the smaller) */
    double hist[TOPO_REPLAN_MAX_REGIONS][TOPO_REPLAN_HIST]; /* readings since the last
                                            * re-plan, oldest first */
    int nhist[TOPO_REPLAN_MAX_REGIONS];
    int held[TOPO_REPLAN_MAX_REGIONS];     /* of the run, calls held at the pace's cap */
    int replans;                           /* plans made again so far */
} topoReplanState;

/* A region whose uplink was busy less than this share of the call did not
 * limit it: its rate is a lower bound (its data came in bursts, each ending
 * with a round trip's wait), no evidence of a slower link. */
#define TOPO_REPLAN_BUSY_MIN 0.7
/* Where some region's sockets were full (data waiting that the path would
 * not take) at least TOPO_REPLAN_FULL_MIN of the call, a slower reading
 * counts only from a region full at least TOPO_REPLAN_FULL_SHARE of the
 * fullest one's share: the others were held back by it, forwarding its
 * data as it came, busy all the time at its rate on faster links. */
#define TOPO_REPLAN_FULL_MIN 0.3
#define TOPO_REPLAN_FULL_SHARE 0.5
/* Busy at least this share of the call: the region limited it, and its
 * rate is what its uplink gives; under it, a faster reading is a floor. */
#define TOPO_REPLAN_BUSY_FULL 0.9

/* A region whose uplink rate reached this share of the pace's cap
 * (cap[g] below) was held by the cap, not by its link. */
#define TOPO_REPLAN_CAP_HELD 0.9

/* One observed call: obs[g] the achieved uplink rate of region g (bytes/s;
 * <= 0: not observed this call, which ends its run), busy[g] the share of
 * the call its uplink was busy, full[g] the share its sockets were full
 * (NULL: not counted), plan[g] the figure the current plan uses,
 * known[g] a figure measured for it with its uplink full (the probe's at
 * init; NULL: none), cap[g] what the uplink pace let region g's
 * connections send in all (bytes/s; 0 or NULL: not paced).
 * A region planned under known[g] whose rate reached TOPO_REPLAN_CAP_HELD
 * of its cap counts as a faster reading, whatever the band, and as a
 * floor (the cap, not the link, held its sockets full): a link that
 * returns shows no more than the cap lets through (wan_pace.c).
 * A rate over the band counts whatever busy says; one under it only where
 * busy >= TOPO_REPLAN_BUSY_MIN and the full guard above holds.  When some
 * region's run reaches `calls`, writes the new figures into next[] (the
 * others copied from plan): the run's mean, or for a faster run whose mean
 * saturated share (busy, or full where smaller) is under
 * TOPO_REPLAN_BUSY_FULL the larger of that and known[g]; resets every run
 * and returns 1, with why (size whylen) naming the regions and rates;
 * else 0.  Deterministic: same inputs, same answer on every rank. */
int topoReplanObserve(topoReplanState *s, int R, const double *plan, const double *known,
                      const double *obs, const double *busy, const double *full,
                      const double *cap, double band, int calls, char names[][32],
                      double *next, char *why, int whylen);

/* This rank's counters over its connections to each rank of another
 * region, at the start of a call (per peer: bytes acknowledged, and the
 * longest busy time of its connections); topoReplanRate turns two of them
 * into the rate between. */
typedef struct {
    int n;              /* ranks */
    uint64_t *acked;    /* [n] */
    double *busy;       /* [n] */
    double *full;       /* [n] the longest time a connection's socket was full */
    int valid;
} topoReplanSnap;

/* 0, or -1 when out of memory (snap stays invalid).  Ranks of my own region
 * and pairs the transport counts nothing for are left at 0. */
int topoReplanSnapshot(const geoNet *net, const topoRegionMap *m, int rank, int nranks,
                       topoReplanSnap *snap);
void topoReplanSnapFree(topoReplanSnap *snap);

/* A communicator's re-planning (comm/coll/replan.c runs it). */
typedef struct {
    topoReplanState rule;
    topoReplanSnap start, end;
    int observing;          /* the call in progress is observed */
    int pending;            /* mine holds the last observed call's rate */
    double mine[TOPO_REPLAN_FIG]; /* this rank's achieved rate in that call (bytes/s),
                             * the share of the call its connections were busy and
                             * the share they were full */
    double t0;              /* when the observed call started (geoNow) */
    int inflight;           /* its exchange was posted this call */
    double *agg;            /* [FIG R] each region's rate (sum of its ranks'), busy
                             * and full shares (its busiest rank's) */
    double *from;           /* [FIG nranks] what my region's ranks sent me (leader) */
    geoNetRequest *req;     /* [nranks + R] the exchange's messages */
    int nreq;
    double *probe;          /* [R] the uplink figures at init (bytes/s, as the
                             * topology holds them), kept at the first re-plan */
    double wan_per_byte;    /* the plan's WAN seconds per byte of an all-reduce */
    char why[320];          /* the last re-plan's reason; "" none */
} topoReplan;

/* Bytes/s this rank's connections to other regions carried between a and
 * b while they had data in flight: the bytes acknowledged over the longest
 * busy time of a peer that was sent anything (the peers are sent to at
 * once), that time in [out] busy (seconds), and the longest time a
 * connection to such a peer was full in [out] full.  0 when nothing moved
 * or the kernel counted nothing. */
double topoReplanRate(const topoReplanSnap *a, const topoReplanSnap *b, double *busy,
                      double *full);

#endif
