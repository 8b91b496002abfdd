/* The one table of environment parameters.  Values are read once, on first
 * use, and cached; every value set in the environment is logged at INFO
 * (subsystem ENV).  geoccl-info prints the whole table with its help. */
#ifndef GEOCCL_PARAM_H_
#define GEOCCL_PARAM_H_

#include <stdint.h>

typedef enum {
    GEO_PARAM_DEBUG,
    GEO_PARAM_DEBUG_SUBSYS,
    GEO_PARAM_TIMEOUT,
    GEO_PARAM_NSTREAMS,
    GEO_PARAM_SOCKET_IFNAME,
    GEO_PARAM_COMM_ID,
    GEO_PARAM_COMM_SECRET,
    GEO_PARAM_CHUNK_SIZE,
    GEO_PARAM_WINDOW,
    GEO_PARAM_SOCKET_BUFSIZE,
    GEO_PARAM_REGION,
    GEO_PARAM_TOPO_FILE,
    GEO_PARAM_ALGO,
    GEO_PARAM_HIER_SLICE,
    GEO_PARAM_DIRECT_MAX,
    GEO_PARAM_COMPRESS,
    GEO_PARAM_EF,
    GEO_PARAM_EF_MAX_BYTES,
    GEO_PARAM_COMPRESS_BLOCK,
    GEO_PARAM_COMPRESS_STOCHASTIC,
    GEO_PARAM_PROBE,
    GEO_PARAM_PROBE_ROUNDS,
    GEO_PARAM_NCCL_LIB,
    GEO_PARAM_CUDA_CODECS,
    GEO_PARAM_NCCL_INIT,
    GEO_PARAM_HIER_DEPTH,
    GEO_PARAM_SHM,
    GEO_PARAM_TCP_CC,
    GEO_PARAM_WAN_CC,
    GEO_PARAM_WAN_WARMUP,
    GEO_PARAM_PROBE_LANDMARKS,
    GEO_PARAM_CMA,
    GEO_PARAM_ENCRYPT,
    GEO_PARAM_CIPHER,
    GEO_PARAM_HIER_SHARES,
    GEO_PARAM_WAN_PACE,
    GEO_PARAM_KEEPALIVE,
    GEO_PARAM_RECONNECT_TIMEOUT,
    GEO_PARAM_RESUME_BUFFER,
    GEO_PARAM_EF_KEY,
    GEO_PARAM_INSECURE_NO_SECRET,
    GEO_PARAM_COUNT
} geoParamId;

typedef enum { GEO_PARAM_INT, GEO_PARAM_STR } geoParamType;

typedef struct {
    const char *name;     /* environment variable */
    geoParamType type;
    const char *dflt;     /* default as text; NULL: unset */
    const char *help;     /* one line */
} geoParamDesc;

/* Integer value (parsed with suffixes K, M, G); the default if unset or
 * unparsable (the latter logged once). */
int64_t geoParamInt(geoParamId id);
/* String value or the default (may be NULL). */
const char *geoParamStr(geoParamId id);
/* Read the environment now rather than the cache: for the bootstrap
 * variables (GEOCCL_COMM_ID, GEOCCL_COMM_SECRET, GEOCCL_INSECURE_NO_SECRET),
 * which programs often set with setenv after their first library call, as
 * NCCL_COMM_ID is read at each ncclGetUniqueId in NCCL. */
const char *geoParamStrLive(geoParamId id);
/* 1 when the variable is set in the environment. */
int geoParamIsSet(geoParamId id);
const geoParamDesc *geoParamDescribe(geoParamId id);
/* Forget cached values and read the environment again (tests, and
 * ncclResetDebugInit).  The logger follows at its next line. */
void geoParamReload(void);
/* How many times the environment was read: the logger (debug.c, above
 * this unit) re-reads its settings when it changes. */
unsigned geoParamGeneration(void);
/* Parse "123", "4K", "8M", "1G"; returns 0 and sets *out, or -1. */
int geoParseSize(const char *s, int64_t *out);

#endif
