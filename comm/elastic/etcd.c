/* The etcd requests (etcd.h): one HTTP/1.1 POST per request on a fresh
 * connection ("Connection: close", so an answer ends where the stream
 * does, chunked or not), to the member that answered last and then to the
 * others.  A member that refuses the connection, times out, or answers a
 * server error (no leader, no quorum) is left for the next one; the request
 * fails when every member failed within the deadline, or at once when one
 * answers a client error (4xx: a lease or key that is not there; not 408
 * or 429, which are about the moment), which every member would (a joiner's revoke of a lease that had run out was
 * tried on every member for the whole 60 s deadline, and the new
 * communicator's first call waited for it).  Bodies are built with
 * snprintf from base64 and decimal numbers, so nothing needs escaping. */
#include "config.h"
#include "comm/elastic/etcd.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define ETCD_MAX_ANSWER (8 << 20)
#define ETCD_ATTEMPT_S 3.0 /* one member's share of a request, at most */

static void set_why(char *why, const char *fmt, ...)
{
    va_list ap;
    if (why == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(why, GEO_ETCD_WHY_LEN, fmt, ap);
    va_end(ap);
}

int geoEtcdInit(geoEtcd *e, const char *spec, double timeout, char *why, size_t len)
{
    memset(e, 0, sizeof(*e));
    e->timeout = timeout;
    const char *p = spec;
    while (p && *p) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n > 0) {
            if (e->n == GEO_ETCD_MAX_MEMBERS || n >= sizeof(e->names[0])) {
                snprintf(why, len, "more than %d members or a name too long",
                         GEO_ETCD_MAX_MEMBERS);
                return -1;
            }
            memcpy(e->names[e->n], p, n);
            e->names[e->n][n] = '\0';
            if (geoAddrFromString(e->names[e->n], &e->addr[e->n]) != ncclSuccess) {
                snprintf(why, len, "'%s' is not host:port (or does not resolve)",
                         e->names[e->n]);
                return -1;
            }
            e->n++;
        }
        p = comma ? comma + 1 : NULL;
    }
    if (e->n == 0) {
        snprintf(why, len, "no member given");
        return -1;
    }
    return 0;
}

/* Connect to addr by deadline without retrying a refusal (the next member
 * is tried instead).  fd, or -1 with errno's text in why. */
static int dial(const geoSockAddr *addr, double deadline, char *why)
{
    int fd;
    if (geoSocketConnectStart(addr, &fd) != 0) {
        set_why(why, "connect: %s", strerror(errno));
        return -1;
    }
    for (;;) {
        double left = deadline - geoNow();
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (left <= 0) {
            set_why(why, "connect: timed out");
            close(fd);
            return -1;
        }
        int rc = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc > 0)
            break;
        if (rc < 0) {
            set_why(why, "poll: %s", strerror(errno));
            close(fd);
            return -1;
        }
    }
    int err = geoSocketConnectResult(fd);
    if (err != 0) {
        set_why(why, "connect: %s", strerror(err));
        close(fd);
        return -1;
    }
    return fd;
}

/* Read until the peer closes (or the deadline); malloc'ed, NUL-ended. */
static char *recv_all(int fd, double deadline, size_t *len, char *why)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL) {
        set_why(why, "out of memory");
        return NULL;
    }
    for (;;) {
        if (n + 1 >= cap) {
            if (cap >= ETCD_MAX_ANSWER) {
                set_why(why, "answer longer than %d bytes", ETCD_MAX_ANSWER);
                free(buf);
                return NULL;
            }
            char *b = realloc(buf, cap * 2);
            if (b == NULL) {
                set_why(why, "out of memory");
                free(buf);
                return NULL;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
        if (r > 0) {
            n += (size_t)r;
            continue;
        }
        if (r == 0)
            break;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            set_why(why, "recv: %s", strerror(errno));
            free(buf);
            return NULL;
        }
        double left = deadline - geoNow();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) == 0) {
            set_why(why, "no answer in time");
            free(buf);
            return NULL;
        }
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* The body of an HTTP answer in place (de-chunked): pointer into ans, or
 * NULL when it is not a 200 answer (why says what it was, *status_out its
 * status; 0: not HTTP). */
static char *http_body(char *ans, size_t len, char *why, int *status_out)
{
    int status = 0;
    *status_out = 0;
    if (sscanf(ans, "HTTP/1.%*d %d", &status) != 1) {
        set_why(why, "not an HTTP answer");
        return NULL;
    }
    char *body = strstr(ans, "\r\n\r\n");
    if (body == NULL) {
        set_why(why, "HTTP answer without a body");
        return NULL;
    }
    *body = '\0';
    body += 4;
    int chunked = 0;
    for (char *h = strstr(ans, "\r\n"); h != NULL; h = strstr(h + 2, "\r\n"))
        if (strncasecmp(h + 2, "transfer-encoding:", 18) == 0 && strstr(h + 20, "chunked"))
            chunked = 1;
    if (chunked) {
        char *in = body, *out = body, *end = ans + len;
        for (;;) {
            char *stop;
            unsigned long sz = strtoul(in, &stop, 16);
            char *line = strstr(in, "\r\n");
            if (stop == in || line == NULL)
                break;
            in = line + 2;
            if (sz == 0 || sz > (unsigned long)(end - in))
                break;
            memmove(out, in, sz);
            out += sz;
            in += sz;
            if (in + 2 <= end && in[0] == '\r' && in[1] == '\n')
                in += 2;
        }
        *out = '\0';
    }
    *status_out = status;
    if (status != 200) {
        set_why(why, "HTTP %d: %.160s", status, body);
        return NULL;
    }
    return body;
}

/* POST body to path on one member after another; the answer's JSON
 * (malloc'ed block: free *block) or NULL. */
static const char *request_st(geoEtcd *e, const char *path, const char *body, char **block,
                              char *why, int *refused)
{
    if (refused != NULL)
        *refused = 0;
    double deadline = geoNow() + e->timeout;
    int first = __atomic_load_n(&e->cur, __ATOMIC_RELAXED);
    char last[GEO_ETCD_WHY_LEN] = "no member tried";
    char answer[GEO_ETCD_WHY_LEN] = ""; /* a member's refusal says more than a timeout */
    size_t blen = strlen(body);
    char head[512];
    *block = NULL;
    for (int pass = 0; geoNow() < deadline; pass++) {
        for (int k = 0; k < e->n; k++) {
            int m = (first + k) % e->n;
            double now = geoNow();
            if (now >= deadline)
                break;
            /* A member that hangs (no leader) may hold at most a share of
             * a short deadline, so that the others get their turn. */
            double share = e->timeout / e->n < ETCD_ATTEMPT_S ? e->timeout / e->n
                                                               : ETCD_ATTEMPT_S;
            double end = now + (share < 0.3 ? 0.3 : share) * (pass + 1);
            if (end > deadline)
                end = deadline;
            int hl = snprintf(head, sizeof(head), "POST %s HTTP/1.1\r\nHost: %s\r\n"
                              "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                              "Connection: close\r\n\r\n", path, e->names[m], blen);
            int fd = dial(&e->addr[m], end, last);
            if (fd < 0)
                continue;
            size_t alen = 0;
            char *ans = NULL;
            const char *cause = NULL;
            if (geoSocketSendAll(fd, head, (size_t)hl, end, &cause) == ncclSuccess &&
                geoSocketSendAll(fd, body, blen, end, &cause) == ncclSuccess)
                ans = recv_all(fd, end, &alen, last);
            else
                set_why(last, "send: %s", cause);
            close(fd);
            if (ans == NULL)
                continue;
            int status = 0;
            char *json = http_body(ans, alen, last, &status);
            if (json == NULL && status >= 400 && status < 500 && status != 408 &&
                status != 429) {
                /* The cluster refused the request itself (a lease or key
                 * that is not there, a bad request): every member would
                 * answer the same, so this is the answer, at once.  Only a
                 * member that is not serving (no leader, no quorum: 5xx)
                 * leaves the request to the next one. */
                __atomic_store_n(&e->cur, m, __ATOMIC_RELAXED);
                free(ans);
                set_why(why, "etcd refused %s: %s", path, last);
                if (refused != NULL)
                    *refused = status;
                return NULL;
            }
            if (json == NULL) {
                snprintf(answer, sizeof(answer), "%s", last);
                free(ans);
                continue;
            }
            __atomic_store_n(&e->cur, m, __ATOMIC_RELAXED);
            *block = ans;
            return json;
        }
        /* Every member failed at once (all refusing): a short pause
         * before the next pass rather than a spin. */
        if (geoNow() + 0.1 < deadline)
            usleep(100 * 1000);
    }
    if (answer[0] != '\0')
        set_why(why, "no etcd member took %s within %.1f s (last answer: %s)", path, e->timeout,
                answer);
    else
        set_why(why, "no etcd member answered %s within %.1f s (last: %s)", path, e->timeout,
                last);
    return NULL;
}

static const char *request(geoEtcd *e, const char *path, const char *body, char **block,
                           char *why)
{
    return request_st(e, path, body, block, why, NULL);
}

/* The base64 end of the range of every key that starts with key. */
static char *prefix_end(const char *key)
{
    size_t n = strlen(key);
    uint8_t *k = malloc(n + 1);
    if (k == NULL)
        return NULL;
    memcpy(k, key, n);
    while (n > 0 && k[n - 1] == 0xff)
        n--;
    char *s;
    if (n == 0) {
        s = strdup("AA=="); /* "\0": every key */
    } else {
        k[n - 1]++;
        s = geoB64EncodeAlloc(k, n);
    }
    free(k);
    return s;
}

ncclResult_t geoEtcdPut(geoEtcd *e, const char *key, const void *val, size_t vlen,
                        int64_t lease, char *why)
{
    char *k = geoB64EncodeAlloc(key, strlen(key)), *v = geoB64EncodeAlloc(val, vlen);
    char *block = NULL, *body = NULL;
    ncclResult_t res = ncclRemoteError;
    if (k && v && asprintf(&body, "{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%" PRId64 "\"}",
                           k, v, lease) >= 0 &&
        request(e, "/v3/kv/put", body, &block, why) != NULL)
        res = ncclSuccess;
    else if (!k || !v)
        set_why(why, "out of memory");
    free(k), free(v), free(body), free(block);
    return res;
}

static int parse_kv(const char *p, geoEtcdKv *kv)
{
    memset(kv, 0, sizeof(*kv));
    const char *k = geoJsonGet(p, "key"), *v = geoJsonGet(p, "value"), *x;
    size_t klen = 0, vlen = 0;
    char *ks = NULL, *vs = NULL;
    int rc = -1;
    /* the array's last element is not checked by the scan that found it */
    const char *kend = k ? geoJsonSkip(k) : NULL, *vend = v ? geoJsonSkip(v) : NULL;
    if (kend == NULL || (v != NULL && vend == NULL))
        return -1;
    klen = (size_t)(kend - k);
    ks = malloc(klen + 1);
    vlen = v ? (size_t)(vend - v) : 2;
    vs = malloc(vlen + 1);
    kv->key = malloc(klen + 4);
    kv->value = malloc(vlen + 4);
    if (!ks || !vs || !kv->key || !kv->value)
        goto out;
    int kn = geoJsonString(k, ks, klen + 1), vn = v ? geoJsonString(v, vs, vlen + 1) : 0;
    size_t n;
    if (kn < 0 || vn < 0 || geoB64Decode(ks, (size_t)kn, (uint8_t *)kv->key, &n) != 0)
        goto out;
    kv->key[n] = '\0';
    if (geoB64Decode(vs, (size_t)vn, kv->value, &kv->vlen) != 0)
        goto out;
    /* a number that is there but no int64 makes the record malformed */
    if ((x = geoJsonGet(p, "create_revision")) != NULL && geoJsonInt(x, &kv->create_rev) != 0)
        goto out;
    if ((x = geoJsonGet(p, "mod_revision")) != NULL && geoJsonInt(x, &kv->mod_rev) != 0)
        goto out;
    if ((x = geoJsonGet(p, "lease")) != NULL && geoJsonInt(x, &kv->lease) != 0)
        goto out;
    rc = 0;
out:
    free(ks);
    free(vs);
    if (rc != 0)
        geoEtcdKvFree(kv);
    return rc;
}

void geoEtcdKvFree(geoEtcdKv *kv)
{
    free(kv->key);
    free(kv->value);
    memset(kv, 0, sizeof(*kv));
}

void geoEtcdRangeFree(geoEtcdRange *r)
{
    for (int i = 0; i < r->n; i++)
        geoEtcdKvFree(&r->kvs[i]);
    free(r->kvs);
    memset(r, 0, sizeof(*r));
}

/* The kvs of a range answer (the object at p) into out. */
static int parse_range(const char *p, geoEtcdRange *out, char *why)
{
    const char *x;
    memset(out, 0, sizeof(*out));
    const char *h = geoJsonGet(p, "header"), *c = geoJsonGet(p, "count");
    const char *rev = h ? geoJsonGet(h, "revision") : NULL;
    if ((c != NULL && geoJsonInt(c, &out->count) != 0) ||
        (rev != NULL && geoJsonInt(rev, &out->revision) != 0)) {
        set_why(why, "a count or revision in the answer is no 64-bit integer");
        return -1;
    }
    const char *arr = geoJsonGet(p, "kvs");
    int n = 0;
    for (x = arr ? geoJsonFirst(arr) : NULL; x; x = geoJsonNext(x))
        n++;
    if (n == 0)
        return 0;
    out->kvs = calloc((size_t)n, sizeof(geoEtcdKv));
    if (out->kvs == NULL) {
        set_why(why, "out of memory");
        return -1;
    }
    for (x = geoJsonFirst(arr); x && out->n < n; x = geoJsonNext(x)) {
        if (parse_kv(x, &out->kvs[out->n]) != 0) {
            set_why(why, "malformed key-value in the answer");
            geoEtcdRangeFree(out);
            return -1;
        }
        out->n++;
    }
    return 0;
}

ncclResult_t geoEtcdGet(geoEtcd *e, const char *key, int prefix, int count_only,
                        geoEtcdRange *out, char *why)
{
    char *k = geoB64EncodeAlloc(key, strlen(key)), *end = prefix ? prefix_end(key) : NULL;
    char *block = NULL, *body = NULL;
    ncclResult_t res = ncclRemoteError;
    memset(out, 0, sizeof(*out));
    if (k == NULL || (prefix && end == NULL)) {
        set_why(why, "out of memory");
    } else if (asprintf(&body, "{\"key\":\"%s\"%s%s%s%s}", k, prefix ? ",\"range_end\":\"" : "",
                        prefix ? end : "", prefix ? "\"" : "",
                        count_only ? ",\"count_only\":true" : "") >= 0) {
        const char *json = request(e, "/v3/kv/range", body, &block, why);
        if (json != NULL && parse_range(json, out, why) == 0)
            res = ncclSuccess;
    }
    free(k), free(end), free(body), free(block);
    return res;
}

ncclResult_t geoEtcdCreate(geoEtcd *e, const char *key, const void *val, size_t vlen,
                           int64_t lease, int *created, geoEtcdKv *existing, char *why)
{
    char *k = geoB64EncodeAlloc(key, strlen(key)), *v = geoB64EncodeAlloc(val, vlen);
    char *block = NULL, *body = NULL;
    ncclResult_t res = ncclRemoteError;
    if (existing)
        memset(existing, 0, sizeof(*existing));
    if (!k || !v) {
        set_why(why, "out of memory");
    } else if (asprintf(&body, "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\","
                        "\"create_revision\":\"0\"}],\"success\":[{\"request_put\":{\"key\":"
                        "\"%s\",\"value\":\"%s\",\"lease\":\"%" PRId64 "\"}}],\"failure\":"
                        "[{\"request_range\":{\"key\":\"%s\"}}]}", k, k, v, lease, k) >= 0) {
        const char *json = request(e, "/v3/kv/txn", body, &block, why);
        if (json != NULL) {
            const char *ok = geoJsonGet(json, "succeeded");
            *created = ok != NULL && strncmp(ok, "true", 4) == 0;
            res = ncclSuccess;
            if (!*created && existing) {
                const char *r = geoJsonFirst(geoJsonGet(json, "responses"));
                const char *rr = r ? geoJsonGet(r, "response_range") : NULL;
                geoEtcdRange range;
                if (rr == NULL || parse_range(rr, &range, why) != 0) {
                    set_why(why, "malformed transaction answer");
                    res = ncclRemoteError;
                } else if (range.n > 0) {
                    *existing = range.kvs[0];
                    memset(&range.kvs[0], 0, sizeof(range.kvs[0]));
                    geoEtcdRangeFree(&range);
                } else {
                    geoEtcdRangeFree(&range); /* deleted meanwhile: nothing to show */
                }
            }
        }
    }
    free(k), free(v), free(body), free(block);
    return res;
}

ncclResult_t geoEtcdDelete(geoEtcd *e, const char *key, int prefix, char *why)
{
    char *k = geoB64EncodeAlloc(key, strlen(key)), *end = prefix ? prefix_end(key) : NULL;
    char *block = NULL, *body = NULL;
    ncclResult_t res = ncclRemoteError;
    if (k == NULL || (prefix && end == NULL))
        set_why(why, "out of memory");
    else if (asprintf(&body, "{\"key\":\"%s\"%s%s%s}", k, prefix ? ",\"range_end\":\"" : "",
                      prefix ? end : "", prefix ? "\"" : "") >= 0 &&
             request(e, "/v3/kv/deleterange", body, &block, why) != NULL)
        res = ncclSuccess;
    free(k), free(end), free(body), free(block);
    return res;
}

ncclResult_t geoEtcdLeaseGrant(geoEtcd *e, int ttl, int64_t *id, char *why)
{
    char body[64], *block = NULL;
    snprintf(body, sizeof(body), "{\"TTL\":%d}", ttl);
    const char *json = request(e, "/v3/lease/grant", body, &block, why);
    const char *x = json ? geoJsonGet(json, "ID") : NULL;
    ncclResult_t res = ncclRemoteError;
    if (x != NULL && geoJsonInt(x, id) == 0 && *id != 0)
        res = ncclSuccess;
    else if (json != NULL)
        set_why(why, "lease grant answered without an ID");
    free(block);
    return res;
}

ncclResult_t geoEtcdLeaseKeepAlive(geoEtcd *e, int64_t id, int64_t *ttl, char *why)
{
    char body[64], *block = NULL;
    snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", id);
    const char *json = request(e, "/v3/lease/keepalive", body, &block, why);
    if (json == NULL)
        return ncclRemoteError;
    /* A stream of answers, each {"result": {...}}; a lease that is gone
     * comes back without a TTL. */
    const char *r = geoJsonGet(json, "result"), *x = r ? geoJsonGet(r, "TTL") : NULL;
    *ttl = 0;
    if (x != NULL && geoJsonInt(x, ttl) != 0) {
        set_why(why, "keepalive answered with a TTL that is no 64-bit integer");
        free(block);
        return ncclRemoteError;
    }
    free(block);
    return ncclSuccess;
}

ncclResult_t geoEtcdLeaseRevoke(geoEtcd *e, int64_t id, char *why)
{
    char body[64], *block = NULL;
    snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", id);
    int refused = 0;
    const char *json = request_st(e, "/v3/lease/revoke", body, &block, why, &refused);
    free(block);
    /* a lease that ran out first is revoked all the same */
    if (json == NULL && refused == 404 && why != NULL && strstr(why, "lease not found"))
        return ncclSuccess;
    return json ? ncclSuccess : ncclRemoteError;
}
