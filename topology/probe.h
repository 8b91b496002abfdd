/* The topology probe at init: after the bootstrap exchange and the
 * connections, node leaders measure round-trip times to each other, the
 * nodes are grouped into regions by those times (topology/cluster.h), and
 * region leaders measure the bandwidth between regions with a short
 * concurrent transfer.  Region labels (GEOCCL_REGION, a topology file) win
 * over the measurement; a topology file that also gives the link rates
 * skips the probe altogether.
 *
 * Nodes are told apart by the address of their data listener, not by host
 * name: emulated regions share one host name, and so do many cloud images.
 *
 * Cost: one warm-up and GEOCCL_PROBE_ROUNDS round trips between leaders (all
 * pairs at once), two exchanges among leaders, and one transfer of
 * clamp(12 RTT, 0.25 s, 1.5 s) between region leaders (all pairs at once).
 * Printed at INFO (subsystem TOPO) with every figure.  After it, apart
 * from its cost, the congestion control of the WAN connections
 * (topology/wan_tuning.h, geoWanCcInit) and the warm-up of the WAN
 * connections (GEOCCL_WAN_WARMUP; probe.c, warm_wan): 10 RTTs of the same
 * transfer over every pair of the hierarchical exchange on fast links,
 * with or without a topology file. */
#ifndef GEOCCL_PROBE_H_
#define GEOCCL_PROBE_H_

#include <stdint.h>
#include <stdio.h>

#include "nccl.h"
#include "comm/base/error.h"
#include "comm/transport/transport.h"
#include "topology/regions.h"
#include "topology/topofile.h"

#define GEO_PROBE_WHY_LEN 192

typedef struct {
    int nnodes;
    int *node_of;           /* [nranks] node of each rank */
    int *leader;            /* [nnodes] lowest rank of each node */
    char (*node_addr)[64];  /* [nnodes] numeric address (GEO_ADDR_STRLEN) */
    double *rtt;            /* [nnodes*nnodes] seconds, min of samples; -1 unmeasured */
    double *nic_gbit;       /* [nnodes] nominal rate of each node's data NIC; <= 0 unknown */
    int rtt_measured;
    int rtt_pairs;          /* node pairs measured (GEOCCL_PROBE_LANDMARKS) */
    int rtt_rounds;         /* rounds of the sampling that measured them */
    int regions_measured;   /* the region map came from the RTTs */
    double cut;             /* RTT threshold that separated regions (s) */
    int nregions;           /* size of the arrays below */
    int bw_measured;
    int bw_again;           /* leaders: the first rates set regions apart, so the
                             * transfer ran twice (probe_bw.c) */
    double *bw;             /* [R*R] bytes/s from region i to j, all pairs at once */
    double *egress;         /* [R] sum of a region's outgoing rates */
    double *ingress;        /* [R] what reaches a region when its downlink held
                             * it back (topoIngressFromRates), or a file's
                             * in=; 0: no limit of its own seen */
    double *loss;           /* [R*R] fraction of the data segments region i's
                             * leader sent to j's, bandwidth transfer included,
                             * that j's never received (TCP_INFO: i's segments
                             * out less j's in), -1 unmeasured */
    double *loss_segs;      /* [R*R] segments sent that figure counts */
    double *rttvar;         /* [R*R] seconds: the kernel's RTT variation then */
    int *wan_choice;        /* [R*R] GEOCCL_WAN_CC=auto's choice from region i to j
                             * (TOPO_CC_*), -1 none; every rank computes every pair */
    char (*wan_why)[GEO_PROBE_WHY_LEN]; /* [R*R] why, in words */
    double *region_rtt;     /* [R*R] seconds, min over node pairs; -1 unknown */
    double *oneway;         /* [R] one-way delay of each region's link (s) */
    int streams_needed;     /* per WAN pair, from BDP and the socket window */
    int streams_used;       /* most connections a WAN pair uses (setStreams) */
    double intra_Bps;       /* intra-region bandwidth per rank; 0 unmeasured */
    double intra_alpha;     /* intra-region latency per message (s) */
    double window_bytes;    /* largest TCP window one stream can have here */
    double t_rtt, t_bw, t_total; /* seconds the probe itself took (from t_arrived) */
    double t_arrived;       /* geoNow() when every leader had arrived */
    double t_wait;          /* seconds waited for slower peers before that */
    int from_file;          /* link figures came from a topology file */
    int inherited;          /* ... or from the parent communicator (split, shrink) */
    unsigned char *fresh;   /* [R] regions the inherited figures do not cover:
                             * only the pairs with one of them were measured
                             * (probeInheritFresh); NULL: no such partial probe */
    int pairs_measured;     /* pairs of regions whose link figures the probe measured */
    int pairs_inherited;    /* pairs of regions whose figures came from the parent */
    int warm_pairs;         /* pairs of regions whose connections were warmed */
    double t_warm;          /* seconds this rank's warm-up took (0: none) */
} geoTopo;

/* What a communicator made by ncclCommSplit or ncclCommShrink takes from
 * its parent instead of probing again: this rank's region label and the
 * parent's figures per region (by name).  Copied at the child's creation,
 * so the parent may go away while the child initialises. */
typedef struct {
    int valid;
    char label[32];
    int nregions;
    char (*names)[32];
    double *egress, *ingress, *oneway, *rtt; /* [R], [R], [R], [R*R] */
    int bw_known;           /* egress holds rates (measured or from a file) */
    int bw_measured;        /* they were measured (goodput), not link rates */
    double intra_Bps, intra_alpha;
} geoTopoInherit;

/* Fill *inh from a parent's figures t and regions m for the parent's rank
 * (parent_inh: what the parent itself inherited, or NULL); regions the
 * parent_inh knew and m lacks (a region that was lost or left) are kept
 * after m's, so that a region coming back finds its figures.  0, or -1
 * when out of memory. */
int geoTopoInheritFrom(const geoTopo *t, const topoRegionMap *m, int rank,
                       const geoTopoInherit *parent_inh, geoTopoInherit *inh);
void geoTopoInheritFree(geoTopoInherit *inh);
/* A deep copy of src into dst; 0, or -1 when out of memory. */
int geoTopoInheritCopy(const geoTopoInherit *src, geoTopoInherit *dst);

/* The largest window one TCP stream may reach on this host: half the receive
 * side's autotuning limit (tcp_rmem max), or of GEOCCL_SOCKET_BUFSIZE. */
double geoProbeStreamWindow(void);

#define GEO_PROBE_CC_LEN 16

/* What the probe measures with and where its results go.  It reaches the
 * communicator only through this: messages over net (identity, peers'
 * addresses, timeout and error state in net->ctx), the region map it reads,
 * and set_regions when it found regions by measurement. */
typedef struct geoProbeCtx {
    geoNet *net;
    int rank, nranks;
    double timeout;             /* seconds for each exchange */
    geoErr *err;                /* failures; abort flag; op_desc set to the probe */
    topoRegionMap *regions;     /* the current map (set_regions replaces it) */
    geoTopo *topo;              /* out: what was measured */
    const char *if_name;        /* this rank's data interface, for the log */
    int nstreams;               /* connections per pair */
    /* Rank 0's settings, which every rank follows. */
    int mode;                   /* GEOCCL_PROBE: 0 off, 1 auto, 2 always measure */
    int landmarks;              /* GEOCCL_PROBE_LANDMARKS */
    int warmup;                 /* GEOCCL_WAN_WARMUP */
    int streams_set;            /* GEOCCL_NSTREAMS given: keep every connection */
    int labelled;               /* regions came from labels or a parent */
    double window;              /* smallest TCP window of any rank; <= 0 unknown */
    const topoFile *file;       /* topology file as loaded, or NULL */
    const geoTopoInherit *inherit; /* a parent's figures, or NULL */
    char *wan_cc;               /* out: [GEO_PROBE_CC_LEN] congestion control set on
                                 * WAN connections, "" none */
    /* Regions found by measurement: region index of each rank; rebuilds
     * *regions (and whatever else hangs on it) before returning. */
    ncclResult_t (*set_regions)(void *arg, const int *region_of_rank);
    /* The ranks of other regions this rank exchanges with in the
     * hierarchical all-reduce, each once (malloc'ed, *n of them): the
     * connections the warm-up opens up. */
    ncclResult_t (*partners)(void *arg, int **ranks, int *n);
    void *arg;
} geoProbeCtx;

/* Run the probe as pc->mode says and, when it found the regions, hand them
 * to set_regions.  Collective over all ranks; bounded by pc->timeout. */
ncclResult_t geoProbeRun(geoProbeCtx *pc);
void geoTopoFree(geoTopo *t);
/* Write what is known (regions, hosts, link rates, RTTs, streams) as a
 * topology file the library loads (topology/topofile.h).  0 or -1 (errno). */
int geoTopoWrite(const geoTopo *t, const topoRegionMap *m, int nranks, FILE *f);

#endif
