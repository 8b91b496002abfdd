/* What the files of the communicator's life cycle share among themselves
 * (init.c, settings.c, connect.c, regions.c, teardown.c, split.c): the
 * stages of an init that live in a file of their own, and the one way to
 * free a communicator.  Not for use outside comm/api: the rest of the
 * library reaches these stages only through comm/core/comm.h. */
#ifndef GEOCCL_API_INIT_INTERNAL_H_
#define GEOCCL_API_INIT_INTERNAL_H_

#include "nccl.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/core/comm.h"
#include "topology/topofile.h"

/* settings.c */

/* A caller's ncclConfig_t, before anything is made of it: NULL is the
 * default; otherwise its magic, size, version and blocking must be ones
 * NCCL's initialiser gives.  ncclInvalidArgument (with the thread's error
 * text) when not. */
ncclResult_t geoCommCheckConfig(const ncclConfig_t *config);
/* Fill comm's settings from config (already checked; NULL: the defaults)
 * and from the environment parameters: timeouts, streams, chunk and slice
 * sizes, algorithm, compression policy, name. */
void geoCommApplySettings(struct ncclComm *comm, const ncclConfig_t *config);

/* connect.c */

/* Everything after the handle exists: bootstrap (starting the
 * GEOCCL_COMM_ID root on rank 0 when allow_env_root), connect, probe,
 * plan.  The cause of a failure is in comm->err. */
ncclResult_t geoCommConnect(struct ncclComm *comm, const geoUniqueIdInternal *id,
                            int allow_env_root);

/* regions.c */

/* Free a ring's arrays (not its ranks, which the region map owns). */
void geoCommRingFree(geoRing *r);
/* This process's region label (see regions.c); loads GEOCCL_TOPO_FILE
 * into comm->topo_file when it exists. */
ncclResult_t geoCommResolveRegion(struct ncclComm *comm, const geoSockAddr *addr,
                                  const char *host, char out[TOPO_REGION_LABEL_LEN]);
/* Run the probe over the connected transport; its traffic is not counted
 * as the user's. */
ncclResult_t geoCommProbe(struct ncclComm *comm);
/* Rank 0: cache what the probe found at GEOCCL_TOPO_FILE (logged, never
 * fatal). */
void geoCommWriteTopoFile(struct ncclComm *comm);

/* teardown.c */

/* Free everything comm holds and comm itself (no thread may use it). */
void geoCommFree(struct ncclComm *comm);

#endif
