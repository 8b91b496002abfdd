/* ncclGroupStart/End: thread-local nesting; operations and inits issued
 * inside a group are recorded and run at the outermost ncclGroupEnd. */
#ifndef GEOCCL_GROUP_H_
#define GEOCCL_GROUP_H_

#include "nccl.h"
#include "comm/coll/coll.h"

/* Record a validated operation (copied). */
ncclResult_t geoGroupAddOp(const geoOp *op);
/* Record a communicator init to run at group end. */
ncclResult_t geoGroupAddInit(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                             const ncclConfig_t *config);
/* Run one communicator's list: sends/receives first (together), then the
 * collectives in call order. */
ncclResult_t geoRunCommOps(struct ncclComm *comm, geoOp *p2p, geoOp *colls);

#endif
