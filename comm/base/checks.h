/* One way to fail (STYLE.md 2, 3, 13).  The function that first knows why
 * something failed reports it once: GEO_COMM_ERR(comm, res, ...) on a
 * communicator (comm/core/comm.h), GEO_ERR(e, res, ...) on another error
 * state or, with e NULL, on the thread (error.h), GEO_RETURN_IF here for a
 * condition.  Each records the text (what ncclGetLastError returns: the
 * operation, the peer, the cause), logs it at WARN with file:line and gives
 * back the code.  Every caller above passes the code on with GEO_CHECK /
 * GEO_CHECK_GOTO, which trace the path and add no second message. */
#ifndef GEOCCL_CHECKS_H_
#define GEOCCL_CHECKS_H_

#include <errno.h>
#include "nccl.h"
#include "comm/base/debug.h"
#include "comm/base/error.h"

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

/* Retry a system call on EINTR; on failure report it with errno (on the
 * thread) and return ncclSystemError. */
#define SYS_CHECK(call, name)                                             \
    do {                                                                  \
        int geo_sys_;                                                     \
        do {                                                              \
            geo_sys_ = (int)(call);                                       \
        } while (geo_sys_ == -1 && errno == EINTR);                       \
        if (geo_sys_ == -1)                                               \
            return GEO_ERR(NULL, ncclSystemError, "%s failed: %s", name,  \
                           strerror(errno));                              \
    } while (0)

/* If cond holds, report the message on the thread (GEO_ERR(NULL, ...))
 * and return err: for checks made before a communicator is known good,
 * such as arguments.  With a live communicator at hand, use
 * `return GEO_COMM_ERR(comm, err, ...)` so that ncclGetLastError(comm)
 * has it. */
#define GEO_RETURN_IF(cond, err, ...)                                     \
    do {                                                                  \
        if (cond)                                                         \
            return GEO_ERR(NULL, (err), __VA_ARGS__);                     \
    } while (0)

#endif
