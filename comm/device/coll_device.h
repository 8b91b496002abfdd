/* Device (GPU) buffers: NVIDIA's NCCL inside a region, GeoCCL between
 * regions, stream-ordered on the user's stream (coll_device.c).  Without
 * CUDA at configure time these report "no GPU" and never see a device
 * buffer. */
#ifndef GEOCCL_COLL_DEVICE_H_
#define GEOCCL_COLL_DEVICE_H_

#include "nccl.h"
#include "geoccl.h"
#include "comm/coll/coll.h"

struct ncclComm;

/* The calling thread's CUDA device, or -1 when there is no GPU (no driver,
 * no device, or a build without CUDA). */
int geoDevCurrent(void);
/* NULL, or why a CUDA driver is installed but the runtime GeoCCL was built
 * with cannot use it (for instance a driver older than the runtime's major
 * version needs), naming the driver's and the runtime's CUDA versions:
 * such a machine has GPUs that must not be taken for absent.  Logged at
 * INFO the first time the GPUs are counted; the caller that refuses to go
 * on for it (ncclCommInitRank) reports it, the one WARN line. */
const char *geoDevProblem(void);
/* 1 when p is device or managed memory (which the host path must not
 * touch), 0 for host memory or without a GPU. */
int geoDevIsDevicePtr(const void *p);
/* Arguments the device path cannot serve, checked before anything is sent:
 * ncclInvalidUsage with the reason in the communicator's error text. */
ncclResult_t geoDevCheck(struct ncclComm *comm, const geoOp *op, const char *fn);
/* Issue a validated device-buffer operation on op->stream (inside a group:
 * within the real group this thread opened).  Returns once the work is
 * queued on the stream, as NCCL does. */
ncclResult_t geoDevEnqueue(geoOp *op, const char *fn);
/* Wait until every queued cross-region device job of comm has finished its
 * host exchange: host-path operations share the transport and must not
 * interleave with them.  Bounded by the communicator's timeout. */
ncclResult_t geoDevDrain(struct ncclComm *comm);
/* Drop the residuals of one registration the device path keeps
 * (geocclCommDeregisterErrorFeedback; after geoDevDrain). */
void geoDevDropErrorFeedback(struct ncclComm *comm, uint64_t tag);
/* The phase times of the cross-region device calls read so far (the calls
 * found complete are read now; nothing waits): geocclCommGetDeviceStats.
 * User thread. */
void geoDevGetStats(struct ncclComm *comm, geocclDeviceStats *out);
/* Zero them (geocclCommResetStats); calls in flight are not counted. */
void geoDevResetStats(struct ncclComm *comm);
/* Drop the residuals the device path keeps (geocclCommResetErrorFeedback). */
void geoDevResetErrorFeedback(struct ncclComm *comm);
/* The real communicator's asynchronous error (ncclSuccess without one). */
ncclResult_t geoDevAsyncError(struct ncclComm *comm);
/* ncclCommFinalize: drain, then finalize the real communicator. */
ncclResult_t geoDevFinalize(struct ncclComm *comm);
/* Free the device state: abort != 0 fails queued jobs and aborts the real
 * communicator, else waits for them and destroys it. */
void geoDevFree(struct ncclComm *comm, int abort);
/* Forget the real twin of PreMulSum handle index i (ncclRedOpDestroy). */
void geoDevRedOpDestroy(struct ncclComm *comm, int i);
/* 1 when CUDA device dev exists and NVIDIA's NCCL is loaded (loading it),
 * with the device's PCI bus id in bus; else 0 and bus "". */
int geoDevIdentify(int dev, char bus[16]);
/* At the end of init (the region map final), collective over the region:
 * make NVIDIA's NCCL communicator of comm's region now, as GEOCCL_NCCL_INIT
 * (rank 0's, in peers[0].nccl_init) says.  auto: when every rank of the
 * region has a device and NCCL (peers[].dev_ready) and no two share a GPU
 * (host and bus id), else leave it to the first device-buffer call;
 * eager: ncclInvalidUsage saying why when that does not hold; lazy:
 * nothing.  Made at init, a single-process loop over several GPUs (one
 * thread, grouped calls) and CUDA graph capture never meet its collective
 * creation. */
ncclResult_t geoDevInitAtInit(struct ncclComm *comm);
/* The real communicator of a single-region communicator on a GPU, created
 * now if needed (collective over the region, so only from calls every rank
 * makes).  ncclInvalidUsage with the reason otherwise. */
ncclResult_t geoDevRealComm(struct ncclComm *comm, const char *fn, void **real);

#endif
