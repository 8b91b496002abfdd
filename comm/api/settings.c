/* What a communicator is set to: the ncclConfig_t a caller passes (checked
 * before anything is made of it), the environment parameters read at init,
 * and the compression policy, which geocclCommSetCompression may change
 * later.  Values outside their bounds are clamped or refused here, so that
 * the rest of the library can trust them. */
#include "config.h"
#include "comm/api/init_internal.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/coll/tuning.h"
#include "comm/core/comm.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

ncclResult_t geoCommCheckConfig(const ncclConfig_t *config)
{
    if (config == NULL)
        return ncclSuccess;
    GEO_RETURN_IF(config->magic != NCCL_CONFIG_MAGIC, ncclInvalidArgument,
                  "ncclConfig_t has magic %#x, not %#x: initialise it with "
                  "NCCL_CONFIG_INITIALIZER", config->magic, NCCL_CONFIG_MAGIC);
    GEO_RETURN_IF(config->size < offsetof(ncclConfig_t, blocking) + sizeof(int) ||
                      config->size > sizeof(ncclConfig_t) + 256,
                  ncclInvalidArgument, "ncclConfig_t has size %zu: initialise it with "
                  "NCCL_CONFIG_INITIALIZER", config->size);
    GEO_RETURN_IF(config->version < NCCL_VERSION(2, 14, 0) ||
                      config->version > NCCL_VERSION(2, 99, 99),
                  ncclInvalidArgument, "ncclConfig_t has version %u, which GeoCCL does not know",
                  config->version);
    GEO_RETURN_IF(config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
                      config->blocking != 1,
                  ncclInvalidArgument, "ncclConfig_t.blocking must be 0 or 1, not %d",
                  config->blocking);
    return ncclSuccess;
}

/* ---- compression policy --------------------------------------------- */

/* "auto" (the plan chooses among the exact codecs: none, lossless) or
 * "auto:c1,c2,..." (among none and the codecs listed, lossy ones
 * included: listing them is the user's consent). */
static ncclResult_t set_auto_codec(struct ncclComm *comm, const char *spec)
{
    unsigned mask = 1u << GEO_CODEC_LOSSLESS;
    geoCodecParams ap = comm->codec_params;
    if (spec[4] == ':') {
        char list[256], *save = NULL;
        snprintf(list, sizeof(list), "%s", spec + 5);
        mask = 0;
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            geoCodecId id;
            if (geoCodecParse(tok, &id, &ap) != ncclSuccess || id == GEO_CODEC_AUTO)
                return GEO_COMM_ERR(comm, ncclInvalidArgument, "compression '%s': '%s' is not "
                                    "none, lossless, fp16, bf16, int8, int4, sign or topk:<k>",
                                    spec, tok);
            if (id != GEO_CODEC_NONE)
                mask |= 1u << id;
        }
    }
    comm->codec_auto = 1;
    comm->auto_mask = mask;
    comm->auto_params = ap;
    comm->codec = GEO_CODEC_NONE;
    comm->compress_fallback_noted = 0;
    geoInfo(GEO_LOG_COMPRESS, "compression between regions: chosen per call by the plan "
            "(%s)", spec);
    /* Already connected (geocclCommSetCompression): plan again. */
    if (comm->regions.nregions > 0)
        return geoTuningInit(comm);
    return ncclSuccess;
}

ncclResult_t geoCommSetCodec(struct ncclComm *comm, const char *spec)
{
    geoCodecId id;
    geoCodecParams p = comm->codec_params;
    if (spec && strncmp(spec, "auto", 4) == 0 && (spec[4] == '\0' || spec[4] == ':'))
        return set_auto_codec(comm, spec);
    if (geoCodecParse(spec, &id, &p) != ncclSuccess)
        return GEO_COMM_ERR(comm, ncclInvalidArgument, "compression '%s' is not none, lossless, "
                            "fp16, bf16, int8, int4, sign or topk:<k> (0 < k <= 1)",
                            spec ? spec : "(null)");
    comm->codec_auto = 0;
    comm->codec = id;
    comm->codec_params = p;
    comm->compress_fallback_noted = 0;
    if (comm->regions.nregions > 0 && comm->plan != NULL)
        GEO_CHECK(geoTuningInit(comm)); /* a forced codec pins the plan */
    if (id != GEO_CODEC_NONE)
        geoInfo(GEO_LOG_COMPRESS, "compression between regions: %s%s", geoCodecGet(id)->name,
                geoCodecGet(id)->lossy ? (comm->ef_enabled ? " with error feedback"
                                                           : " without error feedback")
                                       : "");
    return ncclSuccess;
}

void geoCommCompressionInit(struct ncclComm *comm)
{
    int64_t block = geoParamInt(GEO_PARAM_COMPRESS_BLOCK);
    int64_t seed = geoParamInt(GEO_PARAM_COMPRESS_STOCHASTIC);
    int64_t efmax = geoParamInt(GEO_PARAM_EF_MAX_BYTES);
    geoCodecParamsInit(&comm->codec_params);
    if (block >= 8 && block % 8 == 0 && block <= GEO_CODEC_BLOCK_MAX)
        comm->codec_params.blockSize = (uint32_t)block;
    else
        geoWarn(GEO_LOG_COMPRESS, "GEOCCL_COMPRESS_BLOCK=%lld is not a multiple of 8 in "
                "[8, %u]: using %u", (long long)block, GEO_CODEC_BLOCK_MAX,
                comm->codec_params.blockSize);
    comm->codec_params.stochastic = seed != 0;
    comm->codec_params.seed = (uint64_t)seed;
    int64_t ef = geoParamInt(GEO_PARAM_EF);
    comm->ef_enabled = ef != 0;
    /* Unset: each codec's default (coll_hier_codec.c: first trip only for sign). */
    comm->ef_mode = !geoParamIsSet(GEO_PARAM_EF) ? 0 : ef >= 1 && ef <= 3 ? (int)ef : 1;
    geoEfInit(&comm->ef, efmax < 0 ? 0 : (size_t)efmax, NULL);
    const char *key = geoParamStr(GEO_PARAM_EF_KEY);
    comm->ef_by_address = key && strcmp(key, "address") == 0;
    if (key && !comm->ef_by_address && strcmp(key, "registered") != 0)
        geoWarn(GEO_LOG_COMPRESS, "GEOCCL_EF_KEY=%s is neither registered nor address: "
                "registered", key);
    comm->codec = GEO_CODEC_NONE;
    const char *spec = geoParamStr(GEO_PARAM_COMPRESS);
    /* A refused GEOCCL_COMPRESS was reported (WARN) where it was parsed;
     * the communicator goes on without compression. */
    if (spec && geoCommSetCodec(comm, spec) != ncclSuccess) {
        geoInfo(GEO_LOG_COMPRESS, "GEOCCL_COMPRESS=%s refused: exact transfer", spec);
        comm->codec = GEO_CODEC_NONE;
    }
}

/* ---- settings read at init ------------------------------------------- */

void geoCommApplySettings(struct ncclComm *comm, const ncclConfig_t *config)
{
    ncclConfig_t dflt_cfg = NCCL_CONFIG_INITIALIZER;
    comm->real_cfg = dflt_cfg;
    /* Only the members the caller's (possibly older, smaller) config has. */
#define GEO_CFG_HAS(m) (config && config->size >= offsetof(ncclConfig_t, m) + sizeof(config->m))
    if (GEO_CFG_HAS(cgaClusterSize))
        comm->real_cfg.cgaClusterSize = config->cgaClusterSize;
    if (GEO_CFG_HAS(minCTAs))
        comm->real_cfg.minCTAs = config->minCTAs;
    if (GEO_CFG_HAS(maxCTAs))
        comm->real_cfg.maxCTAs = config->maxCTAs;
    if (GEO_CFG_HAS(splitShare))
        comm->real_cfg.splitShare = config->splitShare;
#undef GEO_CFG_HAS
    comm->timeout = (double)geoParamInt(GEO_PARAM_TIMEOUT);
    if (comm->timeout <= 0)
        comm->timeout = 300;
    int64_t ns = geoParamInt(GEO_PARAM_NSTREAMS);
    comm->nstreams = (int)(ns < 1 ? 1 : ns > 64 ? 64 : ns);
    int64_t cs = geoParamInt(GEO_PARAM_CHUNK_SIZE);
    comm->chunk_size = (size_t)(cs < 64 ? 64 : cs);
    int64_t w = geoParamInt(GEO_PARAM_WINDOW);
    comm->window = (int)(w < 1 ? 1 : w > 1024 ? 1024 : w);
    comm->blocking = !(config && config->blocking == 0);
    const char *algo = geoParamStr(GEO_PARAM_ALGO);
    comm->algo = GEO_ALGO_AUTO;
    if (algo && strcasecmp(algo, "flat") == 0)
        comm->algo = GEO_ALGO_FLAT;
    else if (algo && (strcasecmp(algo, "hier") == 0 || strcasecmp(algo, "hierarchical") == 0))
        comm->algo = GEO_ALGO_HIER;
    else if (algo && strcasecmp(algo, "auto") != 0)
        geoWarn(GEO_LOG_TUNING, "GEOCCL_ALGO=%s is not auto, flat or hier: using auto", algo);
    int64_t hs = geoParamInt(GEO_PARAM_HIER_SLICE);
    comm->hier_slice = (size_t)(hs < 4096 ? 4096 : hs);
    int64_t hd = geoParamInt(GEO_PARAM_HIER_DEPTH);
    comm->hier_depth = hd < 0 ? 0 : hd > 64 ? 64 : (int)hd;
    int64_t dm = geoParamInt(GEO_PARAM_DIRECT_MAX);
    comm->direct_max = (size_t)(dm < 0 ? 0 : dm);
    geoCommCompressionInit(comm);
    if (config && config->commName)
        snprintf(comm->name, sizeof(comm->name), "%s", config->commName);
}
