/* Tuning that only a TCP transport can do: congestion control, pacing and
 * BBR restarts of a communicator's network connections.  Kept out of the
 * generic transport table (transport.h), which holds only what every
 * transport does; the WAN tuning module (topology/wan_tuning.h) is the one
 * caller.  Each function is a no-op that says so (EOPNOTSUPP, or -1) when
 * the communicator's transport is not TCP.  Any thread; each takes the
 * transport's lock, since its progress thread replaces reset connections. */
#ifndef GEOCCL_NET_TCP_TUNE_H_
#define GEOCCL_NET_TCP_TUNE_H_

#include <stdint.h>
#include "comm/transport/transport.h"

/* 1 when net's transport is TCP and listening (the calls below act). */
int geoNetTcpTunable(const geoNet *net);

/* The TCP congestion control (TCP_CONGESTION) of every network connection
 * to peer, from now on and on the connections that replace them after a
 * reset (same-host ones are left alone).  0, EINVAL (no such peer),
 * EOPNOTSUPP (not TCP), or the errno of the first connection that
 * refused. */
int geoNetTcpSetCongestion(geoNet *net, int peer, const char *cc);

/* Pace what goes to peer at bytes_per_s in all over its network
 * connections (SO_MAX_PACING_RATE, split over the streams in use), from now
 * on and on connections that replace them; 0 lifts it.  0, EINVAL,
 * EOPNOTSUPP, or the errno of the first connection that refused. */
int geoNetTcpSetPacing(geoNet *net, int peer, uint64_t bytes_per_s);

/* Start BBR again on each network connection to peer that runs it, where
 * older_than_s seconds have passed since its last restart or skipped one,
 * or none was made since its connection or the last change of its
 * congestion control (when its BBR began is not known here); after
 * max_in_row restarts in a row one is skipped, so that BBR runs its own
 * PROBE_RTT, and none where that PROBE_RTT found the path 10% longer than
 * the kernel's 5-minute minimum (a restart would put that minimum back).
 * Why (Linux's BBR): a connection that has not seen an RTT under its
 * minimum for 10 s holds its window to 4 segments for at least 200 ms
 * (PROBE_RTT), which a connection sharing a queue with others always comes
 * to, in the middle of whatever it carries; a restart at a point where the
 * caller waits anyway starts the 10 s again from the kernel's own minimum
 * RTT.  The number restarted, or -1 (no such peer, or not TCP). */
int geoNetTcpRestartBbr(geoNet *net, int peer, double older_than_s, int max_in_row);

#endif
