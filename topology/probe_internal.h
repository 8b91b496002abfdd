/* What the probe's files share and nothing else sees: probe.c (the run,
 * nodes, streams, warm-up), probe_rtt.c (round trips between node
 * leaders), probe_bw.c (bandwidth, loss and jitter between regions, and
 * inside them), probe_known.c (figures taken from a topology file or a
 * parent communicator, and the file written).  The message types that
 * share the leaders' connections, the poll loops' helpers, the small
 * exchanges among ranks, and each stage's entry.  Each function takes the
 * probe's context (probe.h, geoProbeCtx); those that exchange messages
 * are collective over the ranks they name and bounded by pc->timeout. */
#ifndef GEOCCL_PROBE_INTERNAL_H_
#define GEOCCL_PROBE_INTERNAL_H_

#include <stddef.h>
#include <time.h>

#include "nccl.h"
#include "comm/transport/transport.h"
#include "topology/probe.h"

/* The first word of every probe message: distinct over all stages, so
 * that a message of one is never taken for another's. */
enum { MSG_PING = 1, MSG_PONG = 2, MSG_DATA = 3, MSG_END = 4, MSG_PAD = 5 };

static inline int probeReqDone(const geoNetRequest *r)
{
    return __atomic_load_n(&r->done, __ATOMIC_ACQUIRE);
}

static inline void probePauseUs(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* probe.c: a poll loop's deadline (ncclRemoteError once past it or
 * aborted, the transport broken and the cause recorded); every rank in
 * ranks[0..n) sends its len bytes to every other, all[i * len] getting
 * ranks[i]'s (members only, me: my index); src sends len bytes to each of
 * dst[0..n) (src itself skipped). */
ncclResult_t probeCheckDeadline(geoProbeCtx *pc, double deadline, const char *what);
ncclResult_t probeExchangeAmong(geoProbeCtx *pc, const int *ranks, int n, int me,
                                const void *mine, size_t len, void *all);
ncclResult_t probeFanOut(geoProbeCtx *pc, int src, const int *dst, int n, void *buf,
                         size_t len);

/* probe_rtt.c: round trips between node leaders into t->rtt (and the NIC
 * rates into t->nic_gbit), every rank of a node getting its leader's;
 * with t->fresh, only the pairs of nodes one of which holds a rank of a
 * fresh region (the others stay -1). */
ncclResult_t probeMeasureRtt(geoProbeCtx *pc, geoTopo *t);

/* probe_bw.c: an all-pairs transfer among peers[0..R) for dur seconds,
 * in[q] the steady rate from peers[q] (me: my index, or -1); the rates,
 * loss and RTT variation between regions (t->bw, loss, loss_segs, rttvar);
 * the figures inside regions (t->intra_Bps, intra_alpha).  With t->fresh,
 * only the pairs of regions with a fresh one, and inside fresh regions. */
ncclResult_t probeBwTransfer(geoProbeCtx *pc, const int *peers, int R, int me, double dur,
                             double from, double upto, double *in);
ncclResult_t probeMeasureBw(geoProbeCtx *pc, geoTopo *t);
ncclResult_t probeMeasureIntra(geoProbeCtx *pc, geoTopo *t);

/* probe_known.c: a topology file's figures (pc->file) and a parent's
 * (pc->inherit) for the regions in use; the regions a parent's figures
 * leave out where they cover others (t->fresh: the probe then measures
 * only the pairs with one of them; 0, or -1 out of memory). */
void probeApplyFile(const geoProbeCtx *pc, geoTopo *t);
void probeApplyInherit(const geoProbeCtx *pc, geoTopo *t);
int probeInheritFresh(const geoProbeCtx *pc, geoTopo *t);

#endif
