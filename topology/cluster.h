/* Finding regions from measured round-trip times, and what the measurements
 * say about each region's WAN link.  Pure functions over matrices: the
 * measuring itself needs the transport and lives in topology/probe*.c.
 *
 * The rule (topoClusterRtt):
 *  1. Each pair's RTT is the minimum of its samples (queueing and scheduling
 *     only ever add delay, so the minimum is the path's own latency; one
 *     jittery sample cannot move it down, and every sample must be slow to
 *     move it up), and the pair's value is the smaller of the two
 *     directions' measurements.
 *  2. Sort the pairs' RTTs and find the largest ratio between neighbours
 *     v[k+1] / max(v[k], TOPO_RTT_FLOOR), counting only gaps that could
 *     separate a data centre from a WAN: upper value at least min_wan_rtt,
 *     lower value below max_lan_rtt, ratio at least min_ratio.
 *  3. The cut is the geometric mean of that gap's two values, or
 *     min_wan_rtt when there is no such gap; nodes joined by an RTT below
 *     the cut are in the same region, transitively (single linkage,
 *     union-find over the measured pairs).  So pairs at least max_lan_rtt
 *     apart are never joined, and pairs below min_wan_rtt always are
 *     unless a wide gap says the WAN starts lower.
 *  4. Regions are numbered in order of their lowest node, so every rank
 *     that runs the rule on the same matrix gets the same answer.
 * Why this rule: inside a data centre RTTs are tens to hundreds of
 * microseconds, between regions milliseconds to hundreds of milliseconds;
 * the two populations are separated by the widest gap on a log scale, and
 * the floor keeps tiny loopback values (which vary by factors of two) from
 * being taken for a gap. */
#ifndef GEOCCL_TOPO_CLUSTER_H_
#define GEOCCL_TOPO_CLUSTER_H_

/* RTTs below this (seconds) count as this much when ratios are taken. */
#define TOPO_RTT_FLOOR 100e-6
#define TOPO_MIN_WAN_RTT 2e-3
#define TOPO_MAX_LAN_RTT 10e-3
#define TOPO_MIN_GAP_RATIO 3.0

/* n nodes; rtt[i*n+j] in seconds (< 0 or NaN: not measured; the diagonal is
 * ignored); thresholds in seconds (defaults: TOPO_MIN_WAN_RTT,
 * TOPO_MAX_LAN_RTT, TOPO_MIN_GAP_RATIO).  Writes region[i] for every node and returns the number of
 * regions; *cut gets the threshold used (0 when one region).  Returns -1
 * when out of memory. */
int topoClusterRtt(int n, const double *rtt, double min_wan_rtt, double max_lan_rtt,
                   double min_ratio, int *region, double *cut);

/* The cut of rule step 3 over the measured pairs of rtt (the same
 * arguments as topoClusterRtt); -1 when out of memory. */
double topoRttCut(int n, const double *rtt, double min_wan_rtt, double max_lan_rtt,
                  double min_ratio);

/* Which node pairs the probe measures, for many nodes (GEOCCL_PROBE_LANDMARKS
 * = k0): instead of all n(n-1)/2 pairs, rounds of landmarks.
 *  round 0: k0 landmarks evenly spaced over the nodes (ranks are usually
 *           placed region by region, so they land in different regions);
 *           every node measures every landmark.  A node whose region holds
 *           a landmark is settled: its round trip to it is below the cut.
 *  round r: the nodes still unsettled (regions no landmark fell in; with
 *           the cut of topoRttCut over everything measured so far) measure
 *           k0 * 2^r new landmarks taken evenly among them.
 * A round with at most twice its landmark count of nodes left (round 0:
 * n <= 2 k0) measures every pair of them instead, and settles them all.
 * So every node pair in one region is joined through a landmark of it (its
 * members all measured that landmark), every pair of regions has a measured
 * pair, single linkage (topoClusterRtt over the sparse matrix) finds the
 * regions as with every pair, and the pairs measured are about n k0 per
 * round that has unsettled nodes, k doubling so that rounds stay
 * logarithmic even when every node is a region of its own.
 * rtt: what is measured so far (n*n, < 0 unknown; both directions count);
 * landmark[n]: kept by the caller between rounds (round 0 resets it).
 * Writes with[i*n+j] = with[j*n+i] = 1 for each pair to measure now and
 * returns their number: 0 when done, -1 when out of memory.  A pure
 * function of its inputs, so every node computes the same rounds. */
int topoRttSampleRound(int n, int k0, int round, const double *rtt, unsigned char *landmark,
                       unsigned char *with);

/* One-way delay of each of R regions' links from the RTTs between regions
 * (rtt[i*R+j], seconds; < 0 unknown), under the emulator's and most
 * clouds' model RTT(i,j) = d_i + d_j, by least squares over the known
 * pairs.  Two regions split their RTT evenly.  Negative solutions are
 * clamped to 0. */
void topoSolveOneWay(int R, const double *rtt, double *oneway);

/* TCP streams needed to keep a link of bw bytes/s and round trip rtt
 * seconds full when one stream's window can grow to at most win bytes:
 * ceil(bw * rtt / win), at least 1, at most max_streams. */
int topoStreamsNeeded(double bw, double rtt, double win, int max_streams);

/* Steady-state rate of a transfer from the completion times t[i] (seconds,
 * ascending) of messages of bytes[i] bytes: the least-squares slope of
 * bytes completed against time, over the messages completed between the
 * fractions `skip` and `upto` of the transfer's duration.  Slow start is
 * left out at the front; at the back, the drain of what was queued when the
 * sender stopped, which runs alone on the link once the sender's other
 * flows have drained and would overstate this flow's share.  0 when fewer
 * than 3 messages. */
double topoSteadyRate(int n, const double *t, const double *bytes, double skip, double upto);

#endif
