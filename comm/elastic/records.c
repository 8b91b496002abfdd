/* The store's records (elastic.h): the keys they are sealed with, the
 * seal itself (HMAC-SHA256 over the key's name and the value, so a record
 * cannot be forged or moved to another key by whoever can write to the
 * store), the link figures a joiner takes over, and the secret of a grown
 * communicator.  Nothing sealed here is secret: the keys never leave the
 * process, and a new secret is derived at both ends, never stored. */
#include "config.h"
#include "comm/elastic/elastic.h"
#include "comm/base/checks.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/base/param.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ncclResult_t geoElasticJobKey(uint8_t key[GEO_SHA256_BYTES], geoErr *err)
{
    const char *secret = geoParamStrLive(GEO_PARAM_COMM_SECRET);
    const char *job = geoParamStr(GEO_PARAM_ELASTIC_JOB);
    char salt[160];
    if (secret == NULL || secret[0] == '\0')
        return GEO_ERR(err, ncclInvalidUsage, "elastic: GEOCCL_COMM_SECRET is not set: members "
                       "and joiners derive the new communicator's secret and the records' "
                       "MAC key from it; set the same passphrase in every process of the job");
    /* Salted apart from the bootstrap's own derivation (unique_id.c), so
     * the two keys never coincide. */
    snprintf(salt, sizeof(salt), "geoccl/v2/elastic:%s", job ? job : "");
    if (geoBootstrapSecretKey(secret, salt, key) != 0)
        return GEO_ERR(err, ncclSystemError, "elastic: cannot stretch GEOCCL_COMM_SECRET with "
                       "scrypt (out of memory?)");
    return ncclSuccess;
}

ncclResult_t geoElasticCommJobKey(struct ncclComm *comm, uint8_t key[GEO_SHA256_BYTES],
                                  geoErr *err)
{
    if (!comm->job_key_set) {
        GEO_CHECK(geoElasticJobKey(comm->job_key, err));
        comm->job_key_set = 1;
    }
    memcpy(key, comm->job_key, GEO_SHA256_BYTES);
    return ncclSuccess;
}

void geoElasticKeepJobKey(struct ncclComm *comm, const uint8_t key[GEO_SHA256_BYTES])
{
    memcpy(comm->job_key, key, GEO_SHA256_BYTES);
    comm->job_key_set = 1;
}

void geoElasticCommKey(const uint8_t *comm_secret, uint8_t key[GEO_SHA256_BYTES])
{
    geoHmacSha256(comm_secret, GEO_SHA256_BYTES, "geoccl/v2/elastic-records", 25, key);
}

static void mac(const uint8_t key[GEO_SHA256_BYTES], const char *name, const void *body,
                size_t n, uint8_t out[GEO_SHA256_BYTES])
{
    size_t nl = strlen(name);
    uint8_t *msg = malloc(nl + 1 + n);
    if (msg == NULL) { /* a MAC nobody can match: the record is refused */
        memset(out, 0, GEO_SHA256_BYTES);
        return;
    }
    memcpy(msg, name, nl + 1); /* the NUL separates name from body */
    memcpy(msg + nl + 1, body, n);
    geoHmacSha256(key, GEO_SHA256_BYTES, msg, nl + 1 + n, out);
    free(msg);
}

uint8_t *geoElasticSeal(const uint8_t key[GEO_SHA256_BYTES], const char *name,
                        const void *body, size_t n, size_t *out_n)
{
    uint8_t *v = malloc(n + GEO_SHA256_BYTES);
    if (v == NULL)
        return NULL;
    memcpy(v, body, n);
    mac(key, name, body, n, v + n);
    *out_n = n + GEO_SHA256_BYTES;
    return v;
}

int geoElasticOpen(const uint8_t key[GEO_SHA256_BYTES], const char *name,
                   const uint8_t *val, size_t vlen, size_t want)
{
    uint8_t m[GEO_SHA256_BYTES];
    uint32_t magic;
    if (val == NULL || vlen != want + GEO_SHA256_BYTES || want < sizeof(magic))
        return -1;
    mac(key, name, val, want, m);
    memcpy(&magic, val, sizeof(magic));
    return geoDigestEqual(m, val + want, GEO_SHA256_BYTES) && magic == GEO_ELASTIC_MAGIC ? 0
                                                                                        : -1;
}

int geoElasticFiguresPack(const geoTopoInherit *inh, geoElasticFigures *f)
{
    int R = inh->valid ? inh->nregions : 0;
    memset(f, 0, sizeof(*f));
    if (R < 1 || R > GEO_ELASTIC_MAX_REGIONS)
        return -1;
    f->nregions = R;
    f->bw_known = inh->bw_known;
    f->bw_measured = inh->bw_measured;
    for (int g = 0; g < R; g++) {
        memcpy(f->names[g], inh->names[g], sizeof(f->names[g]));
        f->names[g][sizeof(f->names[g]) - 1] = '\0';
        f->egress[g] = inh->egress[g];
        f->ingress[g] = inh->ingress[g];
        f->oneway[g] = inh->oneway[g];
        for (int h = 0; h < R; h++)
            f->rtt[g * GEO_ELASTIC_MAX_REGIONS + h] = inh->rtt[g * R + h];
    }
    f->intra_Bps = inh->intra_Bps;
    f->intra_alpha = inh->intra_alpha;
    return 0;
}

int geoElasticFiguresUnpack(const geoElasticFigures *f, const char *label,
                            geoTopoInherit *inh)
{
    int R = f->nregions;
    memset(inh, 0, sizeof(*inh));
    if (R < 1 || R > GEO_ELASTIC_MAX_REGIONS)
        return -1;
    inh->names = calloc((size_t)R, sizeof(*inh->names));
    inh->egress = calloc((size_t)R, sizeof(double));
    inh->ingress = calloc((size_t)R, sizeof(double));
    inh->oneway = calloc((size_t)R, sizeof(double));
    inh->rtt = calloc((size_t)R * (size_t)R, sizeof(double));
    if (!inh->names || !inh->egress || !inh->ingress || !inh->oneway || !inh->rtt) {
        geoTopoInheritFree(inh);
        return -1;
    }
    inh->nregions = R;
    for (int g = 0; g < R; g++) {
        memcpy(inh->names[g], f->names[g], sizeof(inh->names[g]));
        inh->names[g][sizeof(inh->names[g]) - 1] = '\0';
        inh->egress[g] = f->egress[g];
        inh->ingress[g] = f->ingress[g];
        inh->oneway[g] = f->oneway[g];
        for (int h = 0; h < R; h++)
            inh->rtt[g * R + h] = f->rtt[g * GEO_ELASTIC_MAX_REGIONS + h];
    }
    inh->bw_known = f->bw_known;
    inh->bw_measured = f->bw_measured;
    inh->intra_Bps = f->intra_Bps;
    inh->intra_alpha = f->intra_alpha;
    snprintf(inh->label, sizeof(inh->label), "%s", label ? label : "");
    inh->valid = 1;
    return 0;
}

void geoElasticGrowSecret(const uint8_t job_key[GEO_SHA256_BYTES], uint64_t grow_nonce,
                          uint8_t out[GEO_SHA256_BYTES])
{
    uint8_t msg[24] = "geoccl/v2/grow";
    memcpy(msg + 16, &grow_nonce, sizeof(grow_nonce));
    geoHmacSha256(job_key, GEO_SHA256_BYTES, msg, sizeof(msg), out);
}
