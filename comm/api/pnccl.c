/* The p-prefixed profiling entry points that NVIDIA's library exports:
 * each forwards to its ncclX twin. */
#include "config.h"
#include "nccl.h"

ncclResult_t pncclMemAlloc(void **ptr, size_t size)
{
    return ncclMemAlloc(ptr, size);
}

ncclResult_t pncclMemFree(void *ptr)
{
    return ncclMemFree(ptr);
}

ncclResult_t pncclGetVersion(int *version)
{
    return ncclGetVersion(version);
}

ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId)
{
    return ncclGetUniqueId(uniqueId);
}

ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, config);
}

ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRank(comm, nranks, commId, rank);
}

ncclResult_t pncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    return ncclCommInitAll(comm, ndev, devlist);
}

ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds, ncclConfig_t *config)
{
    return ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds, config);
}

ncclResult_t pncclCommFinalize(ncclComm_t comm)
{
    return ncclCommFinalize(comm);
}

ncclResult_t pncclCommDestroy(ncclComm_t comm)
{
    return ncclCommDestroy(comm);
}

ncclResult_t pncclCommAbort(ncclComm_t comm)
{
    return ncclCommAbort(comm);
}

ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    return ncclCommRevoke(comm, revokeFlags);
}

ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    return ncclCommSplit(comm, color, key, newcomm, config);
}

ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    return ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
}

const char *pncclGetErrorString(ncclResult_t result)
{
    return ncclGetErrorString(result);
}

const char *pncclGetLastError(ncclComm_t comm)
{
    return ncclGetLastError(comm);
}

void pncclResetDebugInit(void)
{
    ncclResetDebugInit();
}

ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    return ncclCommGetAsyncError(comm, asyncError);
}

ncclResult_t pncclCommCount(const ncclComm_t comm, int *count)
{
    return ncclCommCount(comm, count);
}

ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device)
{
    return ncclCommCuDevice(comm, device);
}

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank)
{
    return ncclCommUserRank(comm, rank);
}

ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    return ncclCommRegister(comm, buff, size, handle);
}

ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle)
{
    return ncclCommDeregister(comm, handle);
}

ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags)
{
    return ncclCommWindowRegister(comm, buff, size, win, winFlags);
}

ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    return ncclCommWindowDeregister(comm, win);
}

ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm)
{
    return ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm);
}

ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    return ncclRedOpDestroy(op, comm);
}

ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return ncclBcast(buff, count, datatype, root, comm, stream);
}

ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream);
}

ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return ncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return ncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream)
{
    return ncclSend(sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream)
{
    return ncclRecv(recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t pncclGroupStart(void)
{
    return ncclGroupStart();
}

ncclResult_t pncclGroupEnd(void)
{
    return ncclGroupEnd();
}

ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    return ncclGroupSimulateEnd(simInfo);
}
