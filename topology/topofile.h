/* The topology file (GEOCCL_TOPO_FILE): a text file that says which region
 * each rank or host is in and, when known, how fast each region's WAN link
 * is.  Format, one statement per line, '#' starts a comment:
 *
 *   region NAME [bw=RATE] [in=RATE] [delay=MS] [ranks=N] [node_ranks=G]
 *                                      declare a region; RATE like 100mbit,
 *                                      1gbit, 10gbit or bytes/s (125M): the
 *                                      rate of the region's WAN egress, which
 *                                      all its traffic to other regions
 *                                      shares; in= the rate of what reaches
 *                                      it from the others, when that is
 *                                      lower (a slow downlink; default: no
 *                                      limit of its own); delay is the one-way WAN delay
 *                                      in ms (RTT between two regions = the
 *                                      sum of their delays); ranks is how
 *                                      many ranks the region has (for
 *                                      geoccl-probe --simulate; otherwise the
 *                                      communicator knows).  A region may be
 *                                      declared again: later attributes win.
 *                                      node_ranks: ranks per node (host)
 *                                      in this region, overriding the
 *                                      `node ranks=` line's (read by
 *                                      geoccl-probe --simulate only, as
 *                                      the node line's ranks=)
 *   rank N NAME                        global rank N is in region NAME
 *   host ADDR-OR-NAME NAME             ranks whose address (or hostname) is
 *                                      ADDR-OR-NAME are in region NAME
 *   intra [bw=RATE] [delay=MS]         the link between two ranks of one
 *                                      region: bandwidth per rank and
 *                                      latency per message (ms, fractions
 *                                      allowed: 0.01 = 10 us); with a
 *                                      `node` line, between two ranks on
 *                                      different nodes of one region
 *   node [ranks=G] [bw=RATE] [delay=MS]
 *                                      the nodes (hosts) inside every
 *                                      region: G ranks each (the region's
 *                                      ranks a multiple of G), and the
 *                                      link between two ranks of one node
 *                                      (bandwidth per rank, latency per
 *                                      message); absent: no node level,
 *                                      `intra` joins every pair.  ranks=
 *                                      is read by geoccl-probe --simulate
 *                                      only: a communicator groups its
 *                                      ranks by host name and boot id, or
 *                                      GEOCCL_NODE_RANKS; bw= and delay=
 *                                      price its node link as well
 *   streams N                          TCP streams per peer pair to connect
 *                                      (1..1024): what the probe found the
 *                                      WAN needs, or the streams it kept in
 *                                      use where each carries < 50 Mbit/s
 *   rtt NAME1 NAME2 MS                 measured round-trip time between two
 *                                      (different) regions; the model uses
 *                                      it instead of the sum of delays
 *   loss FROM TO PERCENT [segments=N]  share of TCP segments lost from
 *                                      region FROM to region TO (what the
 *                                      probe counted over N segments; N
 *                                      omitted: a figure the user knows);
 *                                      GEOCCL_WAN_CC=auto chooses from it
 *
 * A rank line wins over a host line; addresses win over host names.  A
 * region named in a rank/host/rtt line need not be declared.  For intra,
 * streams and rtt of the same pair, the last line wins.  Errors name the
 * file and line. */
#ifndef GEOCCL_TOPO_FILE_H_
#define GEOCCL_TOPO_FILE_H_

#include <stddef.h>

#include "topology/regions.h"

typedef struct {
    char name[TOPO_REGION_LABEL_LEN];
    double bw_bytes;  /* bytes/s; 0 unknown */
    double in_bytes;  /* in=: ingress limit, bytes/s; 0 none known */
    double delay_ms;  /* one-way; < 0 unknown */
    int ranks;        /* ranks=; 0 unknown */
    int node_ranks;   /* node_ranks=: ranks per node; 0 unknown (--simulate only) */
} topoFileRegion;

typedef struct {
    int kind;         /* 0 rank, 1 host */
    long rank;
    char host[256];
    char region[TOPO_REGION_LABEL_LEN];
} topoFileRule;

typedef struct {
    char a[TOPO_REGION_LABEL_LEN], b[TOPO_REGION_LABEL_LEN];
    double ms;        /* round-trip time, > 0 */
} topoFileRtt;

typedef struct {
    char from[TOPO_REGION_LABEL_LEN], to[TOPO_REGION_LABEL_LEN];
    double fraction;  /* lost / sent, 0..1 */
    double segs;      /* segments counted; 0: given by the user */
} topoFileLoss;

typedef struct {
    topoFileRegion *regions;
    int nregions;
    topoFileRule *rules;
    int nrules;
    topoFileRtt *rtts;
    int nrtts;
    topoFileLoss *losses;
    int nlosses;
    double intra_bw_bytes;  /* intra bw=, bytes/s; 0 unknown */
    double intra_delay_ms;  /* intra delay=; < 0 unknown */
    int streams;            /* streams N; 0 unknown */
    int node_ranks;         /* node ranks=: ranks per node; 0 unknown (--simulate only) */
    double node_bw_bytes;   /* node bw=, bytes/s; 0 unknown */
    double node_delay_ms;   /* node delay=; < 0 unknown */
} topoFile;

/* Parse path.  Returns 0; or -1 with a message in err (file:line: what). */
int topoFileLoad(const char *path, topoFile *tf, char *err, size_t errlen);
/* Parse text held in memory (same rules; `name` used in messages). */
int topoFileParse(const char *text, const char *name, topoFile *tf, char *err, size_t errlen);
void topoFileFree(topoFile *tf);
/* Region label for a rank with address `addr` (numeric, no port) and host
 * name `host`; NULL when the file does not say. */
const char *topoFileRegionFor(const topoFile *tf, int rank, const char *addr, const char *host);
/* Parse "100mbit", "1gbit", "125M" (bytes/s) into bytes/s; -1 if bad. */
double topoParseRate(const char *s);

#endif
