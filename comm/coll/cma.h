/* Single-copy transfers between the ranks of a region that share a host:
 * process_vm_readv(2) and process_vm_writev(2) ("cross-memory attach", as
 * Open MPI's CMA support calls it) copy straight between another process's
 * buffer and ours.
 *
 * The hierarchical all-reduce's intra-region phases use it: in the
 * reduce-scatter each rank reads its segment of every other local rank's
 * input and sums it, in the all-gather it writes its finished segment into
 * the others' outputs, instead of the ring passing pieces through the
 * shared-memory rings (two copies per piece, a wake-up per message).  Whether a region uses it
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

/* Where init opens only the connections the plans use (GEOCCL_CONNECT),
 * single-copy is tried only in regions of at most this many ranks: its
 * set-up and each call signal every pair of the region, so those pairs
 * are connected at init (comm/api/connect.c) and hold descriptors for the
 * communicator's life.  A larger region keeps the ring. */
#define GEO_CMA_LAZY_MAX_RANKS 8

/* Collective over my region (after the region map is final): sets
 * comm->cma to 1 when every rank of the region can read every other. */
ncclResult_t geoCmaSetup(struct ncclComm *comm);

/* Exchange, with the other ranks of my region, the addresses of this
 * call's input and output (bytes each): comm->cma_peer_buf[3j] and
 * [3j + 1] are local rank j's (mine at my index).  *use: 1 when every
 * rank's input can be read with process_vm_readv and its output read and
 * written with process_vm_readv/writev (each checks its own first and last
 * byte), the same on every rank; 0: this call keeps the ring.  Only when
 * comm->cma. */
ncclResult_t geoCmaExchange(struct ncclComm *comm, const void *send, const void *recv,
                            size_t bytes, int *use);

/* Send token to every other rank of my region and wait for theirs, which
 * must be the same (else the call fails: a rank is out of step).  Each
 * rank has then reached the point the token names. */
ncclResult_t geoCmaSignal(struct ncclComm *comm, uint64_t token);

/* Copy bytes at address src in global rank peer's memory to dst. */
ncclResult_t geoCmaRead(struct ncclComm *comm, int peer, void *dst, uint64_t src, size_t bytes);

/* Copy bytes from src to address dst in global rank peer's memory
 * (process_vm_writev). */
ncclResult_t geoCmaWrite(struct ncclComm *comm, int peer, uint64_t dst, const void *src,
                         size_t bytes);

#endif
