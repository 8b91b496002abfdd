/* Result propagation macros.  The function that first sees an error logs its
 * concrete cause (geoWarn / geoSetError); callers only pass the code on. */
#ifndef GEOCCL_CHECKS_H_
#define GEOCCL_CHECKS_H_

#include <errno.h>
#include "nccl.h"
#include "comm/base/debug.h"

/* Propagate a non-success result. */
#define GEO_CHECK(call)                                                   \
    do {                                                                  \
        ncclResult_t geo_res_ = (call);                                   \
        if (geo_res_ != ncclSuccess && geo_res_ != ncclInProgress) {      \
            geoTrace(GEO_LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__,      \
                     (int)geo_res_);                                      \
            return geo_res_;                                              \
        }                                                                 \
    } while (0)

/* Store a non-success result in `res` and jump to `label` (undo path). */
#define GEO_CHECK_GOTO(call, res, label)                                  \
    do {                                                                  \
        (res) = (call);                                                   \
        if ((res) != ncclSuccess && (res) != ncclInProgress) {            \
            geoTrace(GEO_LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__,      \
                     (int)(res));                                         \
            goto label;                                                   \
        }                                                                 \
    } while (0)

/* Retry a system call on EINTR; on failure log it with errno and return
 * ncclSystemError. */
#define SYS_CHECK(call, name)                                             \
    do {                                                                  \
        int geo_sys_;                                                     \
        do {                                                              \
            geo_sys_ = (int)(call);                                       \
        } while (geo_sys_ == -1 && errno == EINTR);                       \
        if (geo_sys_ == -1) {                                             \
            geoWarn(GEO_LOG_ALL, "%s failed: %s", name, strerror(errno)); \
            return ncclSystemError;                                       \
        }                                                                 \
    } while (0)

/* Return `err` with a message naming the failed condition. */
#define GEO_RETURN_IF(cond, err, ...)                                     \
    do {                                                                  \
        if (cond) {                                                       \
            geoSetThreadError(__VA_ARGS__);                               \
            geoWarn(GEO_LOG_ALL, __VA_ARGS__);                            \
            return (err);                                                 \
        }                                                                 \
    } while (0)

#endif
