/* Small collectives among the ranks of one host through one shared-memory
 * segment (the host segment), where the message-passing algorithms pay a
 * socket or ring round trip per step.  docs/small-collectives.md has the
 * algorithms, the switch-over rule and the waiting policy.
 *
 * Who has one: a communicator whose ranks all run on this host (one
 * kernel, one network namespace, the same-host fast path enabled on every
 * rank: geoLocalSamePlace), in one region, of two ranks or more, where
 * every rank could map the segment and none has GEOCCL_HOST_COLL=0.  The
 * decision is taken together at init (geoHostSegSetup); the same on every
 * rank.
 *
 * The segment is an anonymous memfd of rank 0, sealed against shrinking
 * and growing; the others open it through /proc/<pid>/fd/<fd>, which rank
 * 0 tells them over the transport, and accept it only when its header
 * carries a token derived from the communicator's secret.  It has no name
 * anyone could open, and it goes when the last rank unmaps it.
 *
 * Phases: every collective here is a sequence of phases, numbered alike on
 * every rank.  In phase p a rank writes its data into its slot of buffer
 * p % 2, arrives, and reads what the others wrote in phase p once they
 * have arrived.  Before a rank writes in phase p it waits until every rank
 * has arrived at phase p - 1 (so has read everything of phase p - 2, whose
 * buffer it reuses).  Waits spin briefly, then yield, then sleep on a futex
 * word in the segment; each has the communicator's deadline and abort
 * flag, and notices a peer process that is gone. */
#ifndef GEOCCL_HOSTSEG_H_
#define GEOCCL_HOSTSEG_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct ncclComm;

/* What the calibration measured (the same on every rank: rank 0's figures,
 * read from the segment): seconds per phase of all ranks, memory rates in
 * bytes per second, the existing path's seconds per message step. */
typedef struct {
    double alpha_seg;           /* one phase (arrive, everyone arrived) */
    double copy_Bps;            /* memcpy, bytes per second */
    double reduce_Bps;          /* dst = a op b (float sum), bytes of dst per second */
    double alpha_msg;           /* one message step of the transport (half a round trip) */
    double msg_Bps;             /* the transport's rate, one way, bytes per second */
    double cpu_share;           /* ranks per CPU on this host, at least 1 */
} geoHostSegCal;

/* The collectives the segment serves (geoHostSegChoose's type). */
enum {
    GEO_HOSTSEG_ALLREDUCE,
    GEO_HOSTSEG_REDUCE,
    GEO_HOSTSEG_BROADCAST,
    GEO_HOSTSEG_ALLGATHER,
    GEO_HOSTSEG_REDUCESCATTER,
    GEO_HOSTSEG_NCOLLS
};

/* The algorithms the segment offers (geoHostSegChoose). */
enum {
    GEO_HOSTSEG_NONE = 0,       /* the message-passing path */
    GEO_HOSTSEG_DIRECT,         /* one phase: every rank reduces every slot */
    GEO_HOSTSEG_SLICED,         /* two phases: reduce-scatter by slices, then gather */
};

/* Collective over the communicator, after the transport is connected and
 * the region map is final: sets comm->hostseg when the host segment is
 * used (see above), leaves it NULL otherwise.  Fails only when the
 * transport fails (the exchange of the decision); a segment that cannot
 * be made or mapped is no error, the communicator keeps its other paths. */
ncclResult_t geoHostSegSetup(struct ncclComm *comm);
/* Unmap (local; the segment goes with the last rank's mapping); abort: a
 * collective may be in progress elsewhere, tell the others (as
 * geoHostSegBreak). */
void geoHostSegFree(struct ncclComm *comm, int abort);

/* The algorithm for one call of type (GEO_HOSTSEG_ALLREDUCE ...) over
 * `bytes` (the whole buffer as the plan counts it: all-gather's output,
 * reduce-scatter's input), from the calibration: GEO_HOSTSEG_NONE where
 * the message-passing path is predicted faster, or where the communicator
 * has no segment.  GEOCCL_HOST_COLL=2 takes the segment for every size.
 * The same on every rank. */
int geoHostSegChoose(const struct ncclComm *comm, int type, size_t bytes);
/* Leave the segment's protocol for good (an error, an abort, a revoke):
 * the other ranks stop waiting for this one at once. */
void geoHostSegBreak(struct ncclComm *comm);

/* The collectives themselves are comm/coll/coll_hostseg.c's (geoHostSegRun,
 * comm/coll/coll.h): they reduce with the collectives' element-wise
 * operations. */

#endif
