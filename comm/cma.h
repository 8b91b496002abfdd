/* Single-copy reads between the ranks of a region that share a host:
 * process_vm_readv(2) ("cross-memory attach", as Open MPI's CMA support
 * calls it) copies straight from another process's buffer into ours.
 *
 * The hierarchical all-reduce's intra-region reduce-scatter uses it: each
 * rank reads its segment of every other local rank's input and sums it,
 * instead of the ring passing partial sums through the shared-memory rings
 * (two copies per piece, a wake-up per message).  Whether a region uses it
 * is decided once, at init, by every rank of the region together
 * (geoCmaSetup): all on one host, GEOCCL_CMA=1, and each rank could read a
 * random token from every other one at the address that rank gave (which
 * also proves that the pid names the same process: ranks in other pid
 * namespaces, or where ptrace rules or a seccomp filter forbid it, fail
 * the check and keep the ring). */
#ifndef GEOCCL_CMA_H_
#define GEOCCL_CMA_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct ncclComm;

/* Collective over my region (after the region map is final): sets
 * comm->cma to 1 when every rank of the region can read every other. */
ncclResult_t geoCmaSetup(struct ncclComm *comm);

/* Exchange, with the other ranks of my region, the address of this call's
 * input: peer_buf[j] is local rank j's (mine at my index).  Only when
 * comm->cma. */
ncclResult_t geoCmaExchange(struct ncclComm *comm, const void *mine, uint64_t *peer_buf);

/* Copy bytes at address src in global rank peer's memory to dst. */
ncclResult_t geoCmaRead(struct ncclComm *comm, int peer, void *dst, uint64_t src, size_t bytes);

#endif
