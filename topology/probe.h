/* The topology probe at init (issue 5): after the bootstrap exchange and the
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
 * from its cost, the warm-up of the WAN connections (GEOCCL_WAN_WARMUP;
 * probe.c, warm_wan): 10 RTTs of the same transfer over every pair of the
 * hierarchical exchange on fast links, with or without a topology file. */
#ifndef GEOCCL_PROBE_H_
#define GEOCCL_PROBE_H_

#include <stdio.h>

#include "nccl.h"

struct ncclComm;

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
    double *bw;             /* [R*R] bytes/s from region i to j, all pairs at once */
    double *egress;         /* [R] sum of a region's outgoing rates */
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
    double *egress, *oneway, *rtt; /* [R], [R], [R*R] */
    int bw_known;           /* egress holds rates (measured or from a file) */
    int bw_measured;        /* they were measured (goodput), not link rates */
    double intra_Bps, intra_alpha;
} geoTopoInherit;

/* Fill *inh from parent for its rank; 0, or -1 when out of memory. */
int geoTopoInheritFrom(const struct ncclComm *parent, geoTopoInherit *inh);
void geoTopoInheritFree(geoTopoInherit *inh);

/* The largest window one TCP stream may reach on this host: half the receive
 * side's autotuning limit (tcp_rmem max), or of GEOCCL_SOCKET_BUFSIZE. */
double geoProbeStreamWindow(void);

/* Run the probe as GEOCCL_PROBE says (rank 0's value) and, when it found
 * the regions, rebuild the communicator's region map and rings.  Collective
 * over all ranks of comm; bounded by comm->timeout. */
ncclResult_t geoProbeRun(struct ncclComm *comm);
void geoTopoFree(geoTopo *t);
/* Write what is known (regions, hosts, link rates, RTTs, streams) as a
 * topology file the library loads (topology/topofile.h).  0 or -1 (errno). */
int geoTopoWrite(const struct ncclComm *comm, FILE *f);

#endif
