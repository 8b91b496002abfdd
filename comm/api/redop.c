/* Custom reduction ops: ncclRedOpCreatePreMulSum hands out one of the
 * communicator's GEO_MAX_REDOPS handles (a host-immediate scalar copied
 * at the call, a device-resident one read at each use), ncclRedOpDestroy
 * returns it and drops its twin in the real NCCL. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/coll/reduce.h"
#include "comm/core/comm.h"
#include "comm/device/coll_device.h"

#include <pthread.h>
#include <string.h>

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclRedOpCreatePreMulSum") != ncclSuccess,
                  ncclInvalidArgument, "ncclRedOpCreatePreMulSum: NULL or dead comm");
    GEO_RETURN_IF(op == NULL || scalar == NULL, ncclInvalidArgument,
                  "ncclRedOpCreatePreMulSum: op or scalar is NULL");
    GEO_RETURN_IF(geoTypeSize(datatype) == 0, ncclInvalidArgument,
                  "ncclRedOpCreatePreMulSum: datatype %d is invalid", (int)datatype);
    GEO_RETURN_IF(residence != ncclScalarDevice && residence != ncclScalarHostImmediate,
                  ncclInvalidArgument, "ncclRedOpCreatePreMulSum: residence %d is invalid",
                  (int)residence);
    pthread_mutex_lock(&comm->lock);
    for (int i = 0; i < GEO_MAX_REDOPS; i++) {
        geoRedOp *r = &comm->redops[i];
        if (r->used)
            continue;
        r->used = 1;
        r->datatype = datatype;
        r->residence = residence;
        memset(r->scalar, 0, sizeof(r->scalar));
        memcpy(r->scalar, scalar, geoTypeSize(datatype));
        r->ptr = scalar;
        r->real_valid = 0; /* the real twin is made at its first device use */
        *op = (ncclRedOp_t)(ncclNumOps + i);
        pthread_mutex_unlock(&comm->lock);
        return ncclSuccess;
    }
    pthread_mutex_unlock(&comm->lock);
    return GEO_COMM_ERR(comm, ncclInvalidUsage,
                        "ncclRedOpCreatePreMulSum: all %d op handles are in use", GEO_MAX_REDOPS);
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    GEO_RETURN_IF(geoCommCheck(comm, "ncclRedOpDestroy") != ncclSuccess, ncclInvalidArgument,
                  "ncclRedOpDestroy: NULL or dead comm");
    GEO_RETURN_IF(op < ncclNumOps || op - ncclNumOps >= GEO_MAX_REDOPS ||
                      !comm->redops[op - ncclNumOps].used,
                  ncclInvalidArgument, "ncclRedOpDestroy: op %d is not a live handle", (int)op);
    geoDevRedOpDestroy(comm, op - ncclNumOps);
    pthread_mutex_lock(&comm->lock);
    comm->redops[op - ncclNumOps].used = 0;
    pthread_mutex_unlock(&comm->lock);
    return ncclSuccess;
}
