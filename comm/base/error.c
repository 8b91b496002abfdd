/* A communicator's error state (error.h). */
#include "config.h"
#include "comm/base/error.h"
#include "comm/base/debug.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void geoErrInit(geoErr *e)
{
    memset(e, 0, sizeof(*e));
    pthread_mutex_init(&e->lock, NULL);
}

void geoErrDestroy(geoErr *e)
{
    pthread_mutex_destroy(&e->lock);
}

static void record(geoErr *e, const char *text)
{
    if (e != NULL) {
        pthread_mutex_lock(&e->lock);
        snprintf(e->last_error, sizeof(e->last_error), "%s", text);
        pthread_mutex_unlock(&e->lock);
    }
    geoSetThreadError("%s", text);
}

ncclResult_t geoErrReport(geoErr *e, ncclResult_t res, const char *file, int line,
                          const char *fmt, ...)
{
    /* Formatted once, before anything is written: an argument may be the
     * thread's or e's own last text (geoThreadError, geoErrLast). */
    char buf[GEO_ERR_TEXT_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    record(e, buf);
    geoLog(GEO_LEVEL_WARN, (unsigned)GEO_LOG_ALL, file, line, "%s", buf);
    return res;
}

void geoErrSet(geoErr *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    geoErrSetV(e, fmt, ap);
    va_end(ap);
}

void geoErrSetV(geoErr *e, const char *fmt, va_list ap)
{
    char buf[GEO_ERR_TEXT_LEN];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    record(e, buf);
}

void geoErrSetOp(geoErr *e, const char *fmt, ...)
{
    char buf[GEO_ERR_OP_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&e->lock);
    memcpy(e->op_desc, buf, sizeof(buf));
    pthread_mutex_unlock(&e->lock);
}

static const char *copy_locked(geoErr *e, const char *from, char *to, size_t len)
{
    pthread_mutex_lock(&e->lock);
    memcpy(to, from, len);
    pthread_mutex_unlock(&e->lock);
    return to;
}

const char *geoErrOp(geoErr *e)
{
    static __thread char copy[GEO_ERR_OP_LEN];
    return copy_locked(e, e->op_desc, copy, sizeof(copy));
}

const char *geoErrLast(geoErr *e)
{
    static __thread char copy[GEO_ERR_TEXT_LEN];
    return copy_locked(e, e->last_error, copy, sizeof(copy));
}

void geoErrFail(geoErr *e, ncclResult_t res)
{
    ncclResult_t expect = ncclSuccess;
    __atomic_compare_exchange_n(&e->async_error, &expect, res, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
}

ncclResult_t geoErrState(const geoErr *e)
{
    return __atomic_load_n(&e->async_error, __ATOMIC_ACQUIRE);
}
