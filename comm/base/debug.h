/* Logging: GEOCCL_DEBUG=WARN|INFO|TRACE, GEOCCL_DEBUG_SUBSYS=INIT,NET,...
 * (unset, their NCCL twins NCCL_DEBUG and NCCL_DEBUG_SUBSYS: param.c).
 * Each line is prefixed host:pid:rank; WARN and TRACE lines also name the
 * source file:line.  The subsystem mask filters INFO and TRACE only: a WARN
 * line always prints.  Thread-safe.
 *
 * An error of an operation is reported with GEO_ERR / GEO_COMM_ERR
 * (error.h, comm.h), which record it and log it once; geoWarn is for
 * warnings that are no error of the call: a fallback taken, an option
 * refused that the code survives, a setting that will hurt. */
#ifndef GEOCCL_DEBUG_H_
#define GEOCCL_DEBUG_H_

#include <stdarg.h>
#include <string.h>

enum geoLogLevel { GEO_LEVEL_NONE = 0, GEO_LEVEL_WARN, GEO_LEVEL_INFO, GEO_LEVEL_TRACE };

enum geoLogSubsys {
    GEO_LOG_INIT = 1 << 0,
    GEO_LOG_NET = 1 << 1,
    GEO_LOG_TOPO = 1 << 2,
    GEO_LOG_TUNING = 1 << 3,
    GEO_LOG_COMPRESS = 1 << 4,
    GEO_LOG_CUDA = 1 << 5,
    GEO_LOG_COLL = 1 << 6,
    GEO_LOG_ENV = 1 << 7,
    GEO_LOG_ALL = ~0
};

void geoLog(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Re-read GEOCCL_DEBUG / GEOCCL_DEBUG_SUBSYS. */
void geoDebugInit(void);
/* Rank shown in this thread's log prefix (-1: none). */
void geoDebugSetRank(int rank);
int geoDebugLevel(void);

/* Thread-local text of the last error, for ncclGetLastError(NULL).
 * Written through error.h: GEO_ERR(NULL, ...) for a new cause,
 * geoErrSet(NULL, ...) to carry one already reported. */
void geoSetThreadError(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *geoThreadError(void);

#define geoWarn(sub, ...) geoLog(GEO_LEVEL_WARN, (sub), __FILE__, __LINE__, __VA_ARGS__)
#define geoInfo(sub, ...)                                                  \
    do {                                                                   \
        if (geoDebugLevel() >= GEO_LEVEL_INFO)                             \
            geoLog(GEO_LEVEL_INFO, (sub), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define geoTrace(sub, ...)                                                  \
    do {                                                                    \
        if (geoDebugLevel() >= GEO_LEVEL_TRACE)                             \
            geoLog(GEO_LEVEL_TRACE, (sub), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#endif
