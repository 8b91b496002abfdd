/* What the kernel counts on a TCP connection (TCP_INFO), summed over the
 * connections of a pair: how the probe and the plan learn the loss and
 * the delay variation a WAN path shows. */
#ifndef GEOCCL_TCP_INFO_H_
#define GEOCCL_TCP_INFO_H_

#include <stdint.h>

typedef struct {
    uint64_t segs_out;  /* data segments sent, retransmissions included */
    uint64_t retrans;   /* segments retransmitted */
    uint64_t spurious;  /* retransmissions the receiver reported as duplicates (DSACK) */
    double srtt;        /* seconds: the largest smoothed RTT of the connections */
    double rttvar;      /* seconds: the largest RTT variation (mean deviation) */
    int conns;          /* connections counted */
} geoLinkStats;

/* Add connection fd's counters to *acc; 0, or -1 (errno) when the kernel
 * gives none (not TCP, or too old to count data segments: before 4.6). */
int geoTcpInfoAdd(int fd, geoLinkStats *acc);

/* The loss a window of counters shows: retransmissions that were not
 * spurious, over segments sent, between snapshots a and b of one pair. */
double geoLinkLoss(const geoLinkStats *a, const geoLinkStats *b);

#endif
