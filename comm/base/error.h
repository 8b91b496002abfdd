/* A communicator's error state, in a unit of its own so that every layer
 * can report an error without knowing the communicator: the transports,
 * the bootstrap and the probe get a pointer to it, the communicator embeds
 * one (comm->err).
 *
 * Who writes what: last_error is written by any thread that finds an
 * error (geoErrReport), under lock; each cause is logged once, where it is
 * found, and a later one overwrites the text, as ncclGetLastError reports
 * the latest;
 * async_error is set once, first error wins, by compare-and-swap, and read
 * with acquire loads (geoErrState); abort_flag is set by ncclCommAbort /
 * ncclCommRevoke and the transports' breakAll from any thread and polled by
 * every wait.  op_desc names the operation in progress, for messages: the
 * API thread and the device path's exchange thread both set it
 * (geoErrSetOp) and every thread reads it, so both go through the lock
 * (geoErrOp copies it), as do internal reads of last_error (geoErrLast).
 * Only ncclGetLastError hands out the buffer itself, as NCCL does. */
#ifndef GEOCCL_ERROR_H_
#define GEOCCL_ERROR_H_

#include <pthread.h>
#include <stdarg.h>

#include "nccl.h"

#define GEO_ERR_TEXT_LEN 1024
#define GEO_ERR_OP_LEN 96

typedef struct geoErr {
    pthread_mutex_t lock;               /* last_error, op_desc */
    char last_error[GEO_ERR_TEXT_LEN];  /* what ncclGetLastError returns */
    char op_desc[GEO_ERR_OP_LEN];       /* operation in progress, for messages */
    int abort_flag;                     /* atomic (geoErrAbort/geoErrAborted) */
    ncclResult_t async_error;           /* atomic; first error; ncclInProgress during init */
} geoErr;

void geoErrInit(geoErr *e);
void geoErrDestroy(geoErr *e);

/* Report an error where its cause is first known (STYLE.md 13): record
 * the text as the last error of e and of the calling thread (e NULL: of
 * the thread only, for failures before there is a communicator or outside
 * one), log it once at WARN with the caller's file:line, return res.  The
 * text names the operation, the peer and the cause; callers above pass res
 * on (GEO_CHECK) and neither record nor log it again.  Any thread may call.
 * Use it through GEO_ERR (or GEO_COMM_ERR, GEO_RETURN_IF), which pass the
 * site's file:line. */
ncclResult_t geoErrReport(geoErr *e, ncclResult_t res, const char *file, int line,
                          const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define GEO_ERR(e, res, ...) geoErrReport((e), (res), __FILE__, __LINE__, __VA_ARGS__)

/* Record without a log line, on e and the thread (e NULL: the thread
 * only): only to carry a cause already reported elsewhere to where the
 * caller will look, with context, e.g. a failed child's text onto the
 * parent communicator, or a communicator's onto the thread before it is
 * freed.  Never for a new cause: that is GEO_ERR's. */
void geoErrSet(geoErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void geoErrSetV(geoErr *e, const char *fmt, va_list ap);
/* Name the operation in progress. */
void geoErrSetOp(geoErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Copies of op_desc and last_error taken under the lock, in buffers of
 * the calling thread: valid until its next call of the same function. */
const char *geoErrOp(geoErr *e);
const char *geoErrLast(geoErr *e);
/* Mark the state failed with res (first error wins). */
void geoErrFail(geoErr *e, ncclResult_t res);
/* Abort: every wait of every thread gives up (release store). */
static inline void geoErrAbort(geoErr *e) { __atomic_store_n(&e->abort_flag, 1, __ATOMIC_RELEASE); }
static inline int geoErrAborted(const geoErr *e)
{
    return __atomic_load_n(&e->abort_flag, __ATOMIC_ACQUIRE);
}
/* The first error recorded, ncclSuccess, or ncclInProgress during init. */
ncclResult_t geoErrState(const geoErr *e);

#endif
