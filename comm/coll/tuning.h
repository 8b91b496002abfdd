/* The plan in force: the cost model (topology/model.h) fed with what the
 * probe measured or the topology file gave, and the user's choices.
 *
 * Per call, with GEOCCL_ALGO=auto the plan picks flat or hierarchical;
 * with GEOCCL_COMPRESS=auto[:codec,...] it picks the codec among those
 * allowed ("auto" alone allows the exact ones: none and lossless); unless
 * GEOCCL_CHUNK_SIZE or GEOCCL_HIER_SLICE is set, it also sets the chunk
 * (flat) or slice (hierarchical) of that call.  Streams are fixed when the
 * connections are made, so the plan is built for the streams in use; the
 * probe's advice goes to the topology file (`streams N`), which the next
 * init uses.  Every rank builds the same plan from the same figures (rank
 * 0's settings, the matrices every rank received), so the choices agree.
 *
 * Without link figures (labels on one host, GEOCCL_PROBE=0 and no rates in
 * a topology file) there is no plan: hierarchical whenever there are
 * several regions, and compression as GEOCCL_COMPRESS says. */
#ifndef GEOCCL_TUNING_H_
#define GEOCCL_TUNING_H_

#include <stddef.h>
#include <stdio.h>

#include "nccl.h"
#include "comm/coll/coll.h"

struct ncclComm;

/* (Re)build comm->plan; logs the table at INFO (TUNING).  Local. */
ncclResult_t geoTuningInit(struct ncclComm *comm);
void geoTuningFree(struct ncclComm *comm);

/* The choice for one call of `bytes` (whole buffer, as the model counts):
 * *hier = 1 for the hierarchical algorithm, *codec = the codec id to use
 * (only meaningful for the hierarchical all-reduce), *chunk = bytes per
 * chunk or slice, 0 = the communicator's setting. */
/* Returns 1 when the plan made the choice, 0 when there is no plan (the
 * communicator's defaults were returned). */
int geoTuningChoose(struct ncclComm *comm, geoOpType type, size_t bytes, int *hier, int *codec,
                    size_t *chunk);

/* The codec per sending region (topoPlanEntry.region_codec, codec ids) the
 * plan gives a hierarchical all-reduce of `bytes`, or NULL where it gives
 * one codec for all (no plan, a codec forced, or no mix that pays).  The
 * array lives as long as the plan. */
const unsigned char *geoTuningRegionCodecs(const struct ncclComm *comm, size_t bytes);

/* Whether a hierarchical all-reduce of `bytes` runs the node stage where a
 * region has one (topoPlanEntry.node_stage): the plan's choice, or 1 where
 * there is no plan or the plan chose the flat algorithm for the size (the
 * node stage costs no bytes and saves message latencies). */
int geoTuningNodeStage(const struct ncclComm *comm, size_t bytes);

/* The plan as text or JSON; "no plan" and why when there is none. */
/* What the plan's WAN figures are in: 1 where they are measured goodput,
 * 1448/1500 of a link rate where a topology file gave them. */
double geoTuningGoodput(const struct ncclComm *comm);

/* Re-planning while the job runs (comm/coll/replan.c; topology/replan.h):
 * around each hierarchical all-reduce on host buffers of `bytes`.  Start
 * observes the call (when large enough) and posts the exchange of the last
 * observed call's rates; End takes the call's result, finishes the
 * exchange and, where the rule fires, makes the plan again for the next
 * call.  Both return the first error. */
ncclResult_t geoReplanCallStart(struct ncclComm *comm, size_t bytes);
ncclResult_t geoReplanCallEnd(struct ncclComm *comm, ncclResult_t res);
void geoReplanFree(struct ncclComm *comm);

void geoTuningPrint(const struct ncclComm *comm, FILE *f, int json);

#endif
