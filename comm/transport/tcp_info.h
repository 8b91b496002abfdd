/* What the kernel counts on a TCP connection (TCP_INFO), summed over the
 * connections of a pair: how the probe and the plan learn the loss and
 * the delay variation a WAN path shows. */
#ifndef GEOCCL_TCP_INFO_H_
#define GEOCCL_TCP_INFO_H_

#include <stdint.h>

typedef struct {
    uint64_t segs_out;  /* data segments sent, retransmissions included */
    uint64_t segs_in;   /* data segments received, duplicates included */
    uint64_t retrans;   /* segments sent again (tcpi_total_retrans): the
                         * path's losses, the spurious ones and, under a
                         * loss-driven control, the queue's own drops */
    double srtt;        /* seconds: the largest smoothed RTT of the connections */
    double rttvar;      /* seconds: the largest RTT variation (mean deviation) */
    uint64_t bytes_acked; /* bytes the peer acknowledged (tcpi_bytes_acked; 0 before 4.1) */
    double busy;        /* seconds: the longest time one of the connections had
                         * data in flight, not held by the receiver's window
                         * (tcpi_busy_time, which counts all three of the
                         * kernel's busy states, less tcpi_rwnd_limited;
                         * Linux 4.10, 0 before) */
    double full;        /* seconds: the longest time one of the connections had
                         * data waiting that its socket would not take (the
                         * transport's own count; 0 where it keeps none).  A
                         * sender whose data arrives no faster than the path
                         * takes it (forwarding what a slower region sends)
                         * is busy all the time and full almost never. */
    int conns;          /* connections counted */
} geoLinkStats;

/* Add connection fd's counters to *acc; 0, or -1 (errno) when the kernel
 * gives none (not TCP, or too old to count data segments: before 4.6). */
int geoTcpInfoAdd(int fd, geoLinkStats *acc);

/* Whether connection fd runs BBR and its own minimum RTT (TCP_CC_INFO)
 * is over factor times the kernel's minimum over the last 5 minutes
 * (tcpi_min_rtt): BBR measured the path again, after its 10 s window,
 * and found it longer.  1, 0, or -1 (not BBR, or the kernel says nothing). */
int geoTcpBbrRttGrew(int fd, double factor);

/* The loss of one direction of a pair's connections: of the `sent` data
 * segments one end has sent since the connections opened, those the other
 * end's `received` (its segs_in, taken once the data has arrived) does not
 * count.  A duplicate a spurious retransmission delivers is in both counts,
 * so this is the path's loss; the sender's own retransmission count is not
 * (on 1% loss with 10 ms of reordering, 5.8% where the receiver's count
 * said 0.99%: most retransmissions there were spurious and never reported
 * as duplicates).  0 where nothing was sent; never below 0 (a segment
 * counted on arrival but sent after the sender's snapshot). */
double geoLinkLoss(double sent, double received);

#endif
