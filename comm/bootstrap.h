/* Bootstrap: forms a communicator from a unique id.
 *
 * The id carries the root's address and a 32-byte random secret.  The root
 * (a thread in the process that called ncclGetUniqueId, or rank 0 under
 * GEOCCL_COMM_ID) sends each connecting rank a random challenge; the rank
 * answers HMAC-SHA256(secret, challenge | rank | nranks) and its peer info.
 * Connections that cannot prove the secret are logged and dropped; when all
 * nranks ranks have proved it, each receives the table of all peer infos. */
#ifndef GEOCCL_BOOTSTRAP_H_
#define GEOCCL_BOOTSTRAP_H_

#include "nccl.h"
#include "comm/comm.h"

#define GEO_ID_MAGIC 0x47454f49u /* "GEOI" */

typedef struct {
    uint32_t magic;
    uint32_t flags;             /* GEO_ID_ENV: root is started by rank 0 */
    geoSockAddr root;
    uint8_t secret[GEO_SHA256_BYTES];
    uint64_t nonce;             /* distinguishes communicators of one root */
} geoUniqueIdInternal;

#define GEO_ID_ENV 1u

_Static_assert(sizeof(geoUniqueIdInternal) <= NCCL_UNIQUE_ID_BYTES, "unique id too large");

/* Fill id for a new root; starts the root thread unless GEOCCL_COMM_ID is
 * set (then only encodes it). */
ncclResult_t geoBootstrapGetUniqueId(ncclUniqueId *id);
/* Same with an explicit choice (split uses a fresh root even under env). */
ncclResult_t geoBootstrapNewRoot(ncclUniqueId *id);
/* Decode and validate an id; ncclInvalidArgument when it is not one. */
ncclResult_t geoBootstrapDecode(const ncclUniqueId *id, geoUniqueIdInternal *out);
/* Start serving the root of id in this process (rank 0 under env). */
ncclResult_t geoBootstrapStartRoot(const geoUniqueIdInternal *id, int nranks, double timeout);
/* Join: prove the secret, send my info, receive everyone's (nranks
 * entries, caller-allocated).  Blocks until all joined or timeout. */
ncclResult_t geoBootstrapJoin(struct ncclComm *comm, const geoUniqueIdInternal *id,
                              const geoPeerInfo *mine, geoPeerInfo *all);

#endif
