/* The one table of environment parameters.  Values are read once, on first
 * use, and cached; every value set in the environment is logged at INFO
 * (subsystem ENV).  geoccl-info prints the whole table with its help.
 *
 * A parameter may name NCCL twins: NVIDIA's variables with the same
 * meaning (NCCL_SOCKET_IFNAME for GEOCCL_SOCKET_IFNAME), read when the
 * GEOCCL_ variable is unset, so that job scripts written for NCCL keep
 * their settings when GeoCCL replaces it.  The GEOCCL_ variable wins when
 * both are set.  How a twin's value becomes GeoCCL's is param_nccl.c's. */
#ifndef GEOCCL_PARAM_H_
#define GEOCCL_PARAM_H_

#include <stddef.h>
#include <stdint.h>

typedef enum {
    GEO_PARAM_DEBUG,
    GEO_PARAM_DEBUG_SUBSYS,
    GEO_PARAM_DEBUG_TIMESTAMP_FORMAT,
    GEO_PARAM_DEBUG_TIMESTAMP_LEVELS,
    GEO_PARAM_DEBUG_FILE,
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
    GEO_PARAM_CONNECT,
    GEO_PARAM_EF_KEY,
    GEO_PARAM_INSECURE_NO_SECRET,
    GEO_PARAM_REPLAN,
    GEO_PARAM_REPLAN_BAND,
    GEO_PARAM_REPLAN_MIN_MS,
    GEO_PARAM_NODE_RANKS,
    GEO_PARAM_HOST_COLL,
    GEO_PARAM_ELASTIC_ETCD,
    GEO_PARAM_ELASTIC_JOB,
    GEO_PARAM_ELASTIC_TTL,
    GEO_PARAM_ELASTIC_POLL_MS,
    GEO_PARAM_ELASTIC_TIMEOUT,
    GEO_PARAM_ELASTIC_JOIN_TIMEOUT,
    GEO_PARAM_COUNT
} geoParamId;

typedef enum { GEO_PARAM_INT, GEO_PARAM_STR } geoParamType;

typedef struct {
    const char *name;     /* environment variable */
    geoParamType type;
    const char *dflt;     /* default as text; NULL: unset */
    const char *help;     /* one line */
    const char *const *nccl; /* NCCL twins read when the variable is unset,
                              * NULL-terminated; NULL: none */
    const char *nccl_map; /* how the twins' value becomes this one's; NULL:
                           * taken as it is */
} geoParamDesc;

/* Integer value (parsed with suffixes K, M, G); the default if unset or
 * unparsable (the latter logged once). */
int64_t geoParamInt(geoParamId id);
/* String value or the default (may be NULL). */
const char *geoParamStr(geoParamId id);
/* Read the environment now rather than the cache: for the bootstrap
 * variables (GEOCCL_COMM_ID, GEOCCL_COMM_SECRET, GEOCCL_INSECURE_NO_SECRET),
 * which programs often set with setenv after their first library call, as
 * NCCL_COMM_ID is read at each ncclGetUniqueId in NCCL.  A twin taken as it
 * is (NCCL_COMM_ID) stands in for an unset variable here too. */
const char *geoParamStrLive(geoParamId id);
/* Hide the variable name (a string of static storage) from the
 * environment until the matching geoParamEnvRestore: for calls into
 * another library that would read it with another meaning (NVIDIA's NCCL
 * opens its bootstrap root at NCCL_COMM_ID, GeoCCL's root's address).
 * Hides of one name nest, across threads too (the last restore puts the
 * value back, unless the variable was set again meanwhile); the live reads
 * above still see the value; a getenv elsewhere does not.  Returns 0, or -1
 * (nothing hidden, no restore due) when another name is hidden now or
 * memory ran out. */
int geoParamEnvHide(const char *name);
void geoParamEnvRestore(const char *name);
/* 1 when the variable, or an NCCL twin that gave it a value, is set in
 * the environment. */
int geoParamIsSet(geoParamId id);
/* What set the value, for messages: "GEOCCL_X=v", "NCCL_Y=v (read as
 * GEOCCL_X)" or "GEOCCL_X unset"; written to buf (len bytes), returned. */
const char *geoParamSetting(geoParamId id, char *buf, size_t len);
/* The NCCL twins behind the value, with their values ("NCCL_SOCKET_IFNAME=lo");
 * NULL when the value did not come from a twin.  Valid until the next
 * geoParamReload. */
const char *geoParamNcclOrigin(geoParamId id);
/* Why an NCCL twin that is set gave no value (its setting has no GeoCCL
 * counterpart, e.g. NCCL_ALGO=Tree); NULL when none.  Valid until the
 * next geoParamReload. */
const char *geoParamNcclNote(geoParamId id);
const geoParamDesc *geoParamDescribe(geoParamId id);
/* Forget cached values and read the environment again (tests, and
 * ncclResetDebugInit).  The logger follows at its next line. */
void geoParamReload(void);
/* How many times the environment was read: the logger (debug.c, above
 * this unit) re-reads its settings when it changes. */
unsigned geoParamGeneration(void);
/* The NCCL variables GeoCCL reads: i from 0 until it returns NULL.  *id:
 * the parameter it is a twin of, or -1 for one accepted with no twin
 * (NCCL_IB_DISABLE); *how: how its value maps, or what GeoCCL makes of it. */
const char *geoParamNcclVar(int i, int *id, const char **how);
/* The NCCL_ variables set in the environment that GeoCCL neither maps nor
 * accepts, comma-separated in buf (len bytes; "and N more" when it is too
 * short); returns how many. */
int geoParamNcclIgnored(char *buf, size_t len);
/* Parse "123", "4K", "8M", "1G"; returns 0 and sets *out, or -1. */
int geoParseSize(const char *s, int64_t *out);

#endif
