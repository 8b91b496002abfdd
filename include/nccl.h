/*
 * GeoCCL's NCCL-compatible public header.
 *
 * Declares the functions and types of the NCCL 2.28 API with the same names,
 * values and layouts, so that a program built against NVIDIA's nccl.h runs
 * unchanged on libgeoccl.so (LD_PRELOAD or -lgeoccl) and a program built
 * against this header runs on NVIDIA's library.  Unlike NVIDIA's header it
 * does not need the CUDA toolkit: without <cuda_runtime.h> the stream type is
 * declared as the same opaque pointer the CUDA runtime uses.
 *
 * Every function returns an ncclResult_t:
 *   ncclSuccess          the call did what it says;
 *   ncclInvalidArgument  an argument is out of range (bad datatype, op, root,
 *                        peer, NULL buffer with count > 0, NULL comm, bad
 *                        config); nothing was sent;
 *   ncclInvalidUsage     the call is valid NCCL but not in this state or not
 *                        supported by GeoCCL (ncclGetLastError says which);
 *   ncclSystemError      a system call failed (socket, memory, thread);
 *   ncclRemoteError      a peer died, closed its connection, sent a malformed
 *                        frame or stopped answering for GEOCCL_TIMEOUT seconds;
 *   ncclInProgress       a non-blocking communicator is still initialising;
 *   ncclInternalError    a bug in GeoCCL.
 * The text of the last error, naming the peer rank, its address and the
 * operation, is returned by ncclGetLastError(comm).
 *
 * Threads: a communicator may be used by one thread at a time; different
 * communicators may be used concurrently.  ncclCommAbort and
 * ncclCommGetAsyncError may be called from any thread at any time.
 */
#ifndef GEOCCL_NCCL_H_
#define GEOCCL_NCCL_H_
/* Claim NVIDIA's guard too: a translation unit that includes both headers
 * gets one set of declarations. */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>

#if defined(GEOCCL_HAVE_CUDA_RUNTIME) || defined(__CUDACC__)
#include <cuda_runtime.h>
#else
/* Same opaque type as the CUDA runtime's cudaStream_t. */
struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) \
    (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) \
                            : (X) * 10000 + (Y) * 100 + (Z))

/* GeoCCL's own version, reported by geoccl-info and in logs. */
#define GEOCCL_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
/* Opaque to the user: GeoCCL packs the bootstrap root's address and a random
 * secret in it.  Share it only with the ranks of the communicator. */
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

#define NCCL_REVOKE_DEFAULT 0x00

/* Communicator options.  Always start from NCCL_CONFIG_INITIALIZER: the
 * size, magic and version members are checked and a config that lacks them
 * is refused with ncclInvalidArgument.  GeoCCL honours `blocking` (0 makes
 * init return ncclInProgress and finish in the background) and `commName`
 * (used in log lines); the GPU tuning members are accepted and ignored on
 * host buffers. */
typedef struct ncclConfig_v22800 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_MAGIC 0xcafebeef
#define NCCL_CONFIG_INITIALIZER {                                  \
    sizeof(ncclConfig_t),                                          \
    NCCL_CONFIG_MAGIC,                                             \
    NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),              \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                  \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                  \
    NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                  \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR,                  \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                  \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                  \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                   \
}

/* Filled by ncclGroupSimulateEnd. */
typedef struct ncclSimInfo_v22200 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_MAGIC 0x74685283
#define NCCL_SIM_INFO_INITIALIZER {                                \
    sizeof(ncclSimInfo_t), NCCL_SIM_INFO_MAGIC,                    \
    NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),              \
    NCCL_UNDEF_FLOAT                                               \
}

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
/* Built-in reductions.  Values from ncclNumOps up are handles returned by
 * ncclRedOpCreatePreMulSum. */
typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
    ncclInt8 = 0, ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2, ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6, ncclHalf = 6,
    ncclFloat32 = 7, ncclFloat = 7,
    ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
    /* The scalar is read when the collective runs (GeoCCL: at each call). */
    ncclScalarDevice = 0,
    /* The scalar is copied before ncclRedOpCreatePreMulSum returns. */
    ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* Each function below is also exported with a `p` prefix (pncclAllReduce,
 * ...), as NVIDIA's library does for profilers. */

/* Allocates size bytes usable as a collective buffer (host memory when no
 * GPU is present).  [out] ptr.  Blocks. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t pncclMemAlloc(void **ptr, size_t size);
/* Frees memory from ncclMemAlloc. */
ncclResult_t ncclMemFree(void *ptr);
ncclResult_t pncclMemFree(void *ptr);

/* [out] version: NCCL_VERSION_CODE of the API GeoCCL implements (22809). */
ncclResult_t ncclGetVersion(int *version);
ncclResult_t pncclGetVersion(int *version);

/* Starts a bootstrap root listener in this process (it lives until the
 * communicator is formed or GEOCCL_TIMEOUT passes) and returns its address
 * and a fresh random secret.  With GEOCCL_COMM_ID=host:port set, no listener
 * is started here: rank 0 of the communicator listens on that address. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId);

/* Forms a communicator of nranks ranks; collective over all of them; blocks
 * until all have joined (or GEOCCL_TIMEOUT passes) unless config->blocking
 * is 0, in which case it returns ncclInProgress and ncclCommGetAsyncError
 * reports when it is done.  [out] comm. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                    int rank, ncclConfig_t *config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                     int rank, ncclConfig_t *config);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
/* Forms ndev communicators inside this process (one thread each).
 * [out] comm: array of ndev handles.  devlist may be NULL. */
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t pncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
/* Like ncclCommInitRankConfig; GeoCCL uses commIds[0] as the root. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId *commIds, ncclConfig_t *config);

/* Waits for every operation issued on comm; no further collective may be
 * issued.  Collective over the communicator's ranks. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);
/* Frees the communicator.  Local; never blocks on peers. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);
/* Stops every operation in progress on comm (they return an error), closes
 * its connections and frees it.  Always returns; any thread. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);
/* Makes every operation in progress on comm fail; the comm can then only be
 * destroyed, split or shrunk.  revokeFlags must be 0. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* Collective over comm: ranks passing the same color form a new
 * communicator ordered by key (ties by old rank); NCCL_SPLIT_NOCOLOR gives
 * *newcomm = NULL.  config NULL inherits comm's. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                            ncclConfig_t *config);
/* Collective over the ranks not in excludeRanksList, which alone call it
 * (the excluded ones may be dead): [out] newcomm gets a communicator of
 * nranks - excludeRanksCount ranks, numbered in comm's order; config NULL
 * inherits comm's blocking mode.  shrinkFlags NCCL_SHRINK_DEFAULT: comm is
 * healthy, its queued work completes first and it stays usable.
 * NCCL_SHRINK_ABORT: comm may be broken; its operations in flight are
 * failed, the new communicator is formed without any message over comm,
 * and comm can then only be destroyed or aborted.  Blocks until the
 * survivors have joined (GEOCCL_TIMEOUT).  Returns ncclInvalidArgument,
 * before anything is sent, for a NULL newcomm, a count < 0 or >= nranks,
 * a rank out of range, listed twice or the caller's own, unknown flags or
 * a bad config; with NCCL_SHRINK_DEFAULT on a broken comm, its error;
 * ncclRemoteError when the survivors cannot meet in time. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                             ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);

/* A static string naming the code. */
const char *ncclGetErrorString(ncclResult_t result);
const char *pncclGetErrorString(ncclResult_t result);
/* The text of the last error on comm (NULL: on this thread); "" if none. */
const char *ncclGetLastError(ncclComm_t comm);
const char *pncclGetLastError(ncclComm_t comm);
/* Re-reads GEOCCL_DEBUG / GEOCCL_DEBUG_SUBSYS. */
void ncclResetDebugInit(void);
void pncclResetDebugInit(void);

/* [out] asyncError: ncclInProgress while a non-blocking init runs, the error
 * that broke the communicator (peer death, timeout, abort), or ncclSuccess. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int *count);
/* [out] device: the CUDA device of the comm, -1 when it runs on host memory. */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank);

/* Buffer registration: accepted as a no-op on host buffers (*handle is set
 * to a token that ncclCommDeregister accepts). */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle);
/* Symmetric memory windows need GPU memory: ncclInvalidUsage here. */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                     int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* A reduction that multiplies each rank's input by *scalar then sums.
 * datatype must be a floating-point type.  [out] op, valid on comm only. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* Collectives.  On host buffers each call (outside a group) returns when its
 * result is in recvbuff; inside ncclGroupStart/End the work runs at
 * ncclGroupEnd.  In-place variants follow NCCL: all-gather in place has
 * sendbuff == recvbuff + rank * sendcount, reduce-scatter in place has
 * sendbuff == recvbuff - rank * recvcount... i.e. recvbuff == sendbuff +
 * rank * recvcount.  count 0 is valid and sends nothing. */
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
/* count elements go from every rank to every rank; sendbuff != recvbuff. */
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* Point to point.  A send must meet a receive of the same count and
 * datatype on the peer.  Several of them that must progress together (a
 * ring exchange) go inside one ncclGroupStart/ncclGroupEnd. */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* Groups nest; the outermost ncclGroupEnd runs everything issued since the
 * matching ncclGroupStart: point-to-point operations first, all at once, then
 * the collectives in call order, one thread per communicator when the group
 * spans several.  Thread-local. */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);
/* Runs nothing; fills simInfo->estimatedTime (microseconds) from the cost
 * model and drops the group's operations. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
#endif /* GEOCCL_NCCL_H_ */
