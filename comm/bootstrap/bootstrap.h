/* Bootstrap: forms a communicator from a unique id.
 *
 * The id carries the root's address and a 32-byte random secret (under
 * GEOCCL_COMM_ID: derived from GEOCCL_COMM_SECRET with scrypt).  The root
 * (a thread in the process that called ncclGetUniqueId, or rank 0 under
 * GEOCCL_COMM_ID) sends each connecting rank a random challenge; the rank
 * answers with its own random nonce, its peer info and an HMAC of both
 * under the secret, bound to its rank and the communicator.  Connections
 * that cannot prove the secret are logged and dropped; when all nranks
 * ranks have proved it, each receives the table of all peer infos with an
 * HMAC bound to its challenge and nonce: the root proves the secret too,
 * and a rank uses nothing from a root that cannot.  Every MAC carries a
 * label of its own (domain separation).  Nothing here is encrypted: the
 * table holds addresses and host names, no secret. */
#ifndef GEOCCL_BOOTSTRAP_H_
#define GEOCCL_BOOTSTRAP_H_

#include "nccl.h"
#include "comm/base/error.h"
#include "comm/base/crypto.h"
#include "comm/transport/socket.h"

#include <stdint.h>

#define GEO_ID_MAGIC 0x47454f49u /* "GEOI" */

/* scrypt's cost for GEOCCL_COMM_SECRET passphrases (the bootstrap's key
 * and the elastic records' key): 2^15 x 8 x 128 bytes =
 * 32 MiB and about 0.1 s per rank at init, so that one sniffed handshake
 * costs a dictionary attack that much per guess on every guess. */
#define GEO_SCRYPT_N (1u << 15)
#define GEO_SCRYPT_R 8
#define GEO_SCRYPT_P 1

/* What each rank tells the others: opaque here (the communicator's peer
 * info, which must fit), carried and tabled as it is. */
#define GEO_BOOT_INFO_BYTES 512
typedef struct {
    uint8_t bytes[GEO_BOOT_INFO_BYTES];
} geoBootInfo;

/* The joining rank, as the bootstrap needs it. */
typedef struct {
    int rank, nranks;
    double timeout;             /* seconds to wait for every rank */
    geoErr *err;                /* where a failure is reported */
} geoBootSelf;

typedef struct {
    uint32_t magic;
    uint32_t flags;             /* GEO_ID_ENV: root is started by rank 0 */
    geoSockAddr root;
    uint8_t secret[GEO_SHA256_BYTES];
    uint64_t nonce;             /* distinguishes communicators of one root */
} geoUniqueIdInternal;

#define GEO_ID_ENV 1u
/* Made by ncclCommShrink(NCCL_SHRINK_ABORT) on every survivor alike, with
 * no message: the root listens on the first of GEO_SHRINK_PORTS candidate
 * addresses that its process could bind (geoBootstrapCandidate), and a
 * joining rank tries them in turn until one answers as the root. */
#define GEO_ID_SHRINK 2u
/* A GEOCCL_COMM_ID id made without GEOCCL_COMM_SECRET, which only
 * GEOCCL_INSECURE_NO_SECRET=1 allows: its key is derived from the address
 * alone, so it proves nothing to a stranger (init refuses ranks on other
 * hosts and connections to be encrypted). */
#define GEO_ID_NOSECRET 4u
#define GEO_SHRINK_PORTS 32

_Static_assert(sizeof(geoUniqueIdInternal) <= NCCL_UNIQUE_ID_BYTES, "unique id too large");

/* Fill id for a new root; starts the root thread unless GEOCCL_COMM_ID is
 * set (then only encodes it: ncclInvalidArgument when GEOCCL_COMM_SECRET
 * is not set and GEOCCL_INSECURE_NO_SECRET is not 1). */
ncclResult_t geoBootstrapGetUniqueId(ncclUniqueId *id);
/* Same with an explicit choice (ncclCommInitAll uses a fresh root even
 * under env), for a communicator of nranks ranks (0: not known here; then
 * rank 0's join says it, and the root allocates nothing before). */
ncclResult_t geoBootstrapNewRoot(int nranks, ncclUniqueId *id);
/* Same, with the given secret instead of a random one (a child
 * communicator's, derived by every member from the parent's: see
 * geoBootstrapChildSecret). */
ncclResult_t geoBootstrapNewRootKeyed(const uint8_t secret[GEO_SHA256_BYTES], int nranks,
                                      ncclUniqueId *id);
/* A 256-bit key for the one use that salt names, from the non-empty value
 * of GEOCCL_COMM_SECRET: 64 hex digits are a key already and give
 * HMAC(that key, salt); anything else is a passphrase, stretched with
 * scrypt (GEO_SCRYPT_*).  Every process with the same secret and salt gets
 * the same key.  0, or -1 when scrypt fails (out of memory). */
int geoBootstrapSecretKey(const char *secret, const char *salt,
                          uint8_t out[GEO_SHA256_BYTES]);
/* The secret of a child of the communicator whose secret and hash are
 * given: HMAC(parent secret, label | parent hash | counter | tag).  Every
 * member computes it alone, so a child's id can cross the network without
 * its secret (geoBootstrapStripSecret). */
void geoBootstrapChildSecret(const uint8_t *parent_secret, uint64_t parent_hash,
                             uint64_t counter, int64_t tag, uint8_t out[GEO_SHA256_BYTES]);
/* Overwrite the secret in id (before it is sent) with zeros, or (after it
 * arrived) with secret. */
void geoBootstrapSetSecret(ncclUniqueId *id, const uint8_t *secret);
/* Flag id GEO_ID_NOSECRET: a child of a communicator whose secret anyone
 * can derive has such a secret too, and init refuses it likewise. */
void geoBootstrapMarkNoSecret(ncclUniqueId *id);
/* Decode and validate an id; ncclInvalidArgument when it is not one. */
ncclResult_t geoBootstrapDecode(const ncclUniqueId *id, geoUniqueIdInternal *out);
/* Start serving the root of id in this process (rank 0 under env; the
 * lowest survivor for a GEO_ID_SHRINK id, at the first candidate it can
 * bind) for nranks ranks: a join claiming another count is refused.
 * ncclSystemError when no address can be bound. */
ncclResult_t geoBootstrapStartRoot(const geoUniqueIdInternal *id, int nranks, double timeout);
/* Candidate k (0 <= k < GEO_SHRINK_PORTS) of a GEO_ID_SHRINK id's root:
 * id->root for k = 0, then the same host at ports derived from the id's
 * secret (so every holder of the id computes the same sequence). */
void geoBootstrapCandidate(const geoUniqueIdInternal *id, int k, geoSockAddr *out);
/* The id of the communicator that ncclCommShrink(NCCL_SHRINK_ABORT) makes
 * of parent without the ranks marked in excluded[] (nranks bytes, 1 =
 * excluded), computed alike by every survivor from what they share: root
 * at leader_addr, the data address of the lowest survivor; secret
 * HMAC(parent secret, parent's comm hash | counter | exclusion set), so only the
 * parent's members can join; counter distinguishes successive shrinks. */
void geoBootstrapShrinkId(const uint8_t *secret, uint64_t comm_hash, int nranks,
                          const geoSockAddr *leader_addr, const uint8_t *excluded,
                          uint32_t counter, ncclUniqueId *out);
/* Join: prove the secret, send my info, receive everyone's (nranks
 * entries, caller-allocated).  Blocks until all joined or timeout.  For a
 * GEO_ID_SHRINK id, tries the candidate roots in turn until one sends a
 * challenge and does not refuse our proof. */
ncclResult_t geoBootstrapJoin(const geoBootSelf *self, const geoUniqueIdInternal *id,
                              const geoBootInfo *mine, geoBootInfo *all);

#endif
