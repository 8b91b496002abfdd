/* A minimal etcd v3 client over the JSON gateway (plain HTTP/1.1, one
 * connection per request): what the job's membership needs and nothing
 * more, so that no gRPC or JSON library is required.  etcd.c holds the
 * requests and the fail-over between members, etcd_json.c the base64 and
 * JSON scanning they need.
 *
 * The gateway takes and returns keys and values in base64 and 64-bit
 * numbers as decimal strings.  Every request goes to the member that
 * answered last, then to the others in the order given, each within what
 * is left of the caller's deadline, so that losing any one member (a
 * region) costs one failed connect.  Nothing here is secret: what the
 * callers store carries a MAC (membership.c), nothing is encrypted. */
#ifndef GEOCCL_ELASTIC_ETCD_H_
#define GEOCCL_ELASTIC_ETCD_H_

#include "nccl.h"
#include "comm/transport/socket.h"

#include <stddef.h>
#include <stdint.h>

#define GEO_ETCD_MAX_MEMBERS 16
#define GEO_ETCD_WHY_LEN 256

typedef struct {
    int n;                              /* members */
    char names[GEO_ETCD_MAX_MEMBERS][96];   /* "host:port" as given */
    geoSockAddr addr[GEO_ETCD_MAX_MEMBERS];
    int cur;                            /* atomic: the member that answered last */
    double timeout;                     /* seconds one request may take, all members */
} geoEtcd;

/* One key-value pair of a range answer (malloc'ed strings, NUL-ended). */
typedef struct {
    char *key;
    uint8_t *value;
    size_t vlen;
    int64_t create_rev, mod_rev, lease;
} geoEtcdKv;

typedef struct {
    geoEtcdKv *kvs;
    int n;
    int64_t count;                      /* all that matched (count_only too) */
    int64_t revision;                   /* the store's revision then */
} geoEtcdRange;

/* Parse "host:port,host:port" (names resolved now).  0, or -1 with why. */
int geoEtcdInit(geoEtcd *e, const char *spec, double timeout, char *why, size_t len);

/* Each returns ncclSuccess, or ncclRemoteError with the cause in why
 * (GEO_ETCD_WHY_LEN bytes; nothing is logged: the caller reports). */
ncclResult_t geoEtcdPut(geoEtcd *e, const char *key, const void *val, size_t vlen,
                        int64_t lease, char *why);
/* Put only if key does not exist (one transaction): [out] created 1 if
 * this put made it, 0 if it was there (then *existing, when not NULL,
 * receives the stored pair: free with geoEtcdKvFree). */
ncclResult_t geoEtcdCreate(geoEtcd *e, const char *key, const void *val, size_t vlen,
                           int64_t lease, int *created, geoEtcdKv *existing, char *why);
/* key alone, or (prefix) every key that starts with it; count_only: only
 * out->count.  Free with geoEtcdRangeFree. */
ncclResult_t geoEtcdGet(geoEtcd *e, const char *key, int prefix, int count_only,
                        geoEtcdRange *out, char *why);
ncclResult_t geoEtcdDelete(geoEtcd *e, const char *key, int prefix, char *why);
ncclResult_t geoEtcdLeaseGrant(geoEtcd *e, int ttl, int64_t *id, char *why);
/* [out] ttl: seconds left, 0 when the lease is gone. */
ncclResult_t geoEtcdLeaseKeepAlive(geoEtcd *e, int64_t id, int64_t *ttl, char *why);
ncclResult_t geoEtcdLeaseRevoke(geoEtcd *e, int64_t id, char *why);
void geoEtcdRangeFree(geoEtcdRange *r);
void geoEtcdKvFree(geoEtcdKv *kv);

/* ---- etcd_json.c: what the requests need of base64 and JSON ---------- */

/* Standard base64 with padding; out has room for 4 * ceil(n / 3) + 1. */
void geoB64Encode(const void *in, size_t n, char *out);
/* The same into a malloc'ed string; NULL when out of memory. */
char *geoB64EncodeAlloc(const void *in, size_t n);
/* Decode len characters (padding optional, no white space); [out] n.
 * 0, or -1 on a character outside the alphabet or a bad length.  out has
 * room for 3 * len / 4 + 3. */
int geoB64Decode(const char *in, size_t len, uint8_t *out, size_t *n);

/* Scanners over a NUL-ended JSON text; each takes a pointer to a value
 * (leading white space allowed) and returns NULL when the text is not
 * what is asked for, never reading past the NUL. */
/* Past the value at p. */
const char *geoJsonSkip(const char *p);
/* The value of member key of the object at p (top level of it only). */
const char *geoJsonGet(const char *p, const char *key);
/* The first element of the array at p, or NULL when empty or not one;
 * geoJsonNext: the element after the one at p, NULL after the last. */
const char *geoJsonFirst(const char *p);
const char *geoJsonNext(const char *p);
/* The string at p without its quotes (escapes decoded; \u beyond ASCII
 * becomes '?'), in out (len bytes, truncated): its length, or -1. */
int geoJsonString(const char *p, char *out, size_t len);
/* A number or a string holding one (etcd writes int64 as strings). */
int geoJsonInt(const char *p, int64_t *out);

#endif
