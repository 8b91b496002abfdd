/* The store without etcd (elastic.h, docs/elastic.md "Without etcd"): the
 * process that serves the first bootstrap root at GEOCCL_COMM_ID also
 * answers, one port above it, the etcd gateway requests the client sends
 * (etcd.c: put, range, deleterange, the create-if-absent transaction, and
 * leases with their expiry), from memory, in one detached thread for the
 * process's life.  It is no replicated store: it lives and dies with that
 * process, which is why the region holding it must survive.
 *
 * Requests come from the network and nothing authenticates them (as with
 * an etcd without TLS): the records they carry are sealed (records.c), so
 * a stranger can delete or delay, never forge.  What one stranger can hold
 * is bounded: requests of at most 1 MiB, 64 connections at once, each with
 * a deadline, 100000 keys.  The one thread never blocks on a client: answers
 * are sent as the client takes them, under a deadline, so a client that
 * stops reading is dropped and costs the others nothing. */
#include "config.h"
#include "comm/elastic/elastic.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define STORE_MAX_REQUEST (1 << 20)
#define STORE_MAX_CONNS 64
#define STORE_MAX_KEYS 100000
/* all values together: the job's records are a few hundred bytes each */
#define STORE_MAX_BYTES ((size_t)64 << 20)
#define STORE_CONN_S 5.0
/* an answer's time to leave once made */
#define STORE_SEND_S 5.0
/* answers waiting to be sent, all connections together: one answer holding
 * every value (base64 and the JSON around it) always fits */
#define STORE_MAX_OUT (3 * STORE_MAX_BYTES)

typedef struct {
    char *key;
    uint8_t *val;
    size_t vlen;
    int64_t create_rev, mod_rev, lease;
} storeKv;

typedef struct {
    int64_t id, ttl;
    double expiry;
} storeLease;

typedef struct {
    int fd;
    double deadline;
    char *buf;
    size_t len, cap;
    char *out; /* the answer being sent; NULL while the request is read */
    size_t olen, osent;
} storeConn;

typedef struct {
    int lfd;
    storeKv *kv;
    int nkv, capkv;
    size_t bytes; /* of all values */
    storeLease *lease;
    int nlease, caplease;
    int64_t rev, next_lease;
    storeConn conn[STORE_MAX_CONNS];
    int nconn;
    size_t out_bytes; /* of all answers not yet sent */
} storeState;

/* ---- the data ------------------------------------------------------- */

static void kv_drop(storeState *s, int i)
{
    free(s->kv[i].key);
    free(s->kv[i].val);
    s->bytes -= s->kv[i].vlen;
    s->kv[i] = s->kv[--s->nkv];
}

static int kv_find(const storeState *s, const char *key)
{
    for (int i = 0; i < s->nkv; i++)
        if (strcmp(s->kv[i].key, key) == 0)
            return i;
    return -1;
}

static storeLease *lease_find(storeState *s, int64_t id)
{
    for (int i = 0; i < s->nlease; i++)
        if (s->lease[i].id == id)
            return &s->lease[i];
    return NULL;
}

static void lease_drop(storeState *s, int64_t id)
{
    for (int i = 0; i < s->nkv;)
        if (s->kv[i].lease == id)
            kv_drop(s, i);
        else
            i++;
    for (int i = 0; i < s->nlease; i++)
        if (s->lease[i].id == id) {
            s->lease[i] = s->lease[--s->nlease];
            break;
        }
    s->rev++;
}

static void expire(storeState *s)
{
    double now = geoNow();
    for (int i = 0; i < s->nlease;)
        if (s->lease[i].expiry < now)
            lease_drop(s, s->lease[i].id); /* moves the last one here */
        else
            i++;
}

/* 0, or -1 (out of room, or the lease does not exist). */
static int kv_put(storeState *s, const char *key, const uint8_t *val, size_t vlen, int64_t lease)
{
    if (lease != 0 && lease_find(s, lease) == NULL)
        return -1;
    int i = kv_find(s, key);
    if (s->bytes - (i >= 0 ? s->kv[i].vlen : 0) + vlen > STORE_MAX_BYTES)
        return -1;
    uint8_t *v = malloc(vlen + 1);
    if (v == NULL)
        return -1;
    memcpy(v, val, vlen);
    s->rev++;
    if (i >= 0) {
        free(s->kv[i].val);
        s->bytes += vlen - s->kv[i].vlen;
        s->kv[i].val = v;
        s->kv[i].vlen = vlen;
        s->kv[i].mod_rev = s->rev;
        s->kv[i].lease = lease;
        return 0;
    }
    if (s->nkv == s->capkv && s->nkv < STORE_MAX_KEYS) {
        storeKv *grown = realloc(s->kv, sizeof(*s->kv) * (size_t)(2 * s->capkv + 16));
        if (grown != NULL) {
            s->kv = grown;
            s->capkv = 2 * s->capkv + 16;
        }
    }
    if (s->nkv == STORE_MAX_KEYS || s->nkv == s->capkv) {
        free(v);
        return -1;
    }
    storeKv *k = &s->kv[s->nkv];
    if ((k->key = strdup(key)) == NULL) {
        free(v);
        return -1;
    }
    k->val = v;
    k->vlen = vlen;
    s->bytes += vlen;
    k->create_rev = k->mod_rev = s->rev;
    k->lease = lease;
    s->nkv++;
    return 0;
}

/* key in [lo, hi): hi NULL is key == lo; hi "" (etcd's "\0") all >= lo. */
static int in_range(const char *key, const char *lo, const char *hi)
{
    if (hi == NULL)
        return strcmp(key, lo) == 0;
    return strcmp(key, lo) >= 0 && (hi[0] == '\0' || strcmp(key, hi) < 0);
}

/* ---- requests --------------------------------------------------------- */

/* A base64 string member of obj, decoded (NUL-ended, malloc'ed) or NULL. */
static uint8_t *b64_member(const char *obj, const char *name, size_t *n)
{
    const char *v = geoJsonGet(obj, name);
    if (v == NULL)
        return NULL;
    const char *end = geoJsonSkip(v);
    if (end == NULL)
        return NULL;
    size_t len = (size_t)(end - v);
    char *s = malloc(len + 1);
    uint8_t *out = malloc(len + 4);
    int sl = s ? geoJsonString(v, s, len + 1) : -1;
    if (sl < 0 || out == NULL || geoB64Decode(s, (size_t)sl, out, n) != 0) {
        free(s);
        free(out);
        return NULL;
    }
    out[*n] = '\0';
    free(s);
    return out;
}

/* A number member of obj: 0 when absent, 1 for true, -1 when it is no
 * int64 (no TTL, lease or ID is negative, so the request is refused). */
static int64_t int_member(const char *obj, const char *name)
{
    int64_t v = 0;
    const char *x = geoJsonGet(obj, name);
    if (x != NULL && strncmp(x, "true", 4) == 0)
        return 1;
    if (x != NULL && geoJsonInt(x, &v) != 0)
        return -1;
    return v;
}

/* A growing answer. */
typedef struct {
    char *s;
    size_t len, cap;
    int bad;
} text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text *t, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        size_t room = t->cap - t->len;
        va_start(ap, fmt);
        int n = t->s ? vsnprintf(t->s + t->len, room, fmt, ap) : -1;
        va_end(ap);
        if (n >= 0 && (size_t)n < room) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap * 2 + (n > 0 ? (size_t)n : 0) + 256;
        char *s = realloc(t->s, cap);
        if (s == NULL) {
            t->bad = 1;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
}

static void add_b64(text *t, const void *p, size_t n)
{
    char *b = geoB64EncodeAlloc(p, n);
    if (b == NULL) {
        t->bad = 1;
        return;
    }
    add(t, "%s", b);
    free(b);
}

static void add_range(storeState *s, text *t, const char *lo, const char *hi, int count_only)
{
    int n = 0;
    add(t, "{\"header\":{\"revision\":\"%" PRId64 "\"}", s->rev);
    if (!count_only)
        add(t, ",\"kvs\":[");
    for (int i = 0; i < s->nkv; i++) {
        const storeKv *k = &s->kv[i];
        if (!in_range(k->key, lo, hi))
            continue;
        if (!count_only) {
            add(t, "%s{\"key\":\"", n ? "," : "");
            add_b64(t, k->key, strlen(k->key));
            add(t, "\",\"create_revision\":\"%" PRId64 "\",\"mod_revision\":\"%" PRId64
                "\",\"lease\":\"%" PRId64 "\",\"value\":\"", k->create_rev, k->mod_rev, k->lease);
            add_b64(t, k->val, k->vlen);
            add(t, "\"}");
        }
        n++;
    }
    if (!count_only)
        add(t, "]");
    add(t, ",\"count\":\"%d\"}", n);
}

/* Answer one request: the status and the JSON body in t. */
static int handle(storeState *s, const char *path, const char *body, text *t)
{
    size_t n, m;
    if (strcmp(path, "/v3/lease/grant") == 0) {
        int64_t ttl = int_member(body, "TTL");
        if (ttl < 1 || ttl > 3600 || s->nlease >= STORE_MAX_KEYS)
            return 400;
        if (s->nlease == s->caplease) {
            storeLease *l = realloc(s->lease, sizeof(*l) * (size_t)(s->caplease * 2 + 16));
            if (l == NULL)
                return 500;
            s->lease = l;
            s->caplease = s->caplease * 2 + 16;
        }
        int64_t id = ++s->next_lease;
        s->lease[s->nlease++] = (storeLease){id, ttl, geoNow() + (double)ttl};
        add(t, "{\"header\":{\"revision\":\"%" PRId64 "\"},\"ID\":\"%" PRId64 "\",\"TTL\":\"%"
            PRId64 "\"}", s->rev, id, ttl);
        return 200;
    }
    if (strcmp(path, "/v3/lease/keepalive") == 0 || strcmp(path, "/v3/lease/revoke") == 0) {
        int64_t id = int_member(body, "ID");
        storeLease *l = lease_find(s, id);
        if (path[10] == 'r') {
            if (l != NULL)
                lease_drop(s, id);
            add(t, "{\"header\":{\"revision\":\"%" PRId64 "\"}}", s->rev);
            return 200;
        }
        if (l != NULL)
            l->expiry = geoNow() + (double)l->ttl;
        add(t, "{\"result\":{\"header\":{\"revision\":\"%" PRId64 "\"},\"ID\":\"%" PRId64 "\"",
            s->rev, id);
        if (l != NULL)
            add(t, ",\"TTL\":\"%" PRId64 "\"", l->ttl);
        add(t, "}}");
        return 200;
    }
    const char *txn = NULL;
    if (strcmp(path, "/v3/kv/txn") == 0) {
        /* Only the client's form: create the key if it does not exist. */
        const char *cmp = geoJsonFirst(geoJsonGet(body, "compare"));
        const char *ok = geoJsonFirst(geoJsonGet(body, "success"));
        txn = ok ? geoJsonGet(ok, "request_put") : NULL;
        if (cmp == NULL || txn == NULL)
            return 400;
        body = txn;
    }
    uint8_t *key = b64_member(body, "key", &n);
    if (key == NULL || n == 0 || strlen((char *)key) != n) {
        free(key);
        return 400;
    }
    int status = 200;
    if (strcmp(path, "/v3/kv/put") == 0 || txn != NULL) {
        uint8_t *val = b64_member(body, "value", &m);
        int exists = kv_find(s, (char *)key) >= 0;
        if (val == NULL && geoJsonGet(body, "value") == NULL)
            val = calloc(1, 1), m = 0;
        if (val == NULL) {
            status = 400;
        } else if (txn != NULL && exists) {
            add(t, "{\"header\":{\"revision\":\"%" PRId64 "\"},\"succeeded\":false,\"responses\":"
                "[{\"response_range\":", s->rev);
            add_range(s, t, (char *)key, NULL, 0);
            add(t, "}]}");
        } else if (kv_put(s, (char *)key, val, m, int_member(body, "lease")) != 0) {
            status = 400; /* no such lease, or no room */
        } else {
            add(t, "{\"header\":{\"revision\":\"%" PRId64 "\"}%s}", s->rev,
                txn ? ",\"succeeded\":true" : "");
        }
        free(val);
    } else if (strcmp(path, "/v3/kv/range") == 0 || strcmp(path, "/v3/kv/deleterange") == 0) {
        uint8_t *end = geoJsonGet(body, "range_end") ? b64_member(body, "range_end", &m) : NULL;
        const char *hi = end == NULL ? NULL : (m == 1 && end[0] == 0) ? "" : (char *)end;
        if (geoJsonGet(body, "range_end") != NULL && end == NULL) {
            status = 400;
        } else if (path[7] == 'r') {
            add_range(s, t, (char *)key, hi, int_member(body, "count_only") > 0);
        } else {
            int gone = 0;
            for (int i = 0; i < s->nkv;)
                if (in_range(s->kv[i].key, (char *)key, hi))
                    kv_drop(s, i), gone++;
                else
                    i++;
            s->rev += gone > 0;
            add(t, "{\"header\":{\"revision\":\"%" PRId64 "\"},\"deleted\":\"%d\"}", s->rev, gone);
        }
        free(end);
    } else {
        status = 404;
    }
    free(key);
    return status;
}

/* A whole request in c->buf: make its answer c->out, to be sent by
 * flush; 1 when the connection is done, 0 when it waits for more of the
 * request or for the answer to leave. */
static int serve(storeState *s, storeConn *c)
{
    char *head_end = strstr(c->buf, "\r\n\r\n"), *cl, path[64];
    if (head_end == NULL)
        return 0;
    *head_end = '\0';
    cl = strcasestr(c->buf, "\r\ncontent-length:");
    size_t blen = cl ? strtoul(cl + 17, NULL, 10) : 0;
    size_t have = c->len - (size_t)(head_end + 4 - c->buf);
    if (blen > STORE_MAX_REQUEST)
        return 1;
    if (have < blen) {
        *head_end = '\r';
        return 0;
    }
    head_end[4 + blen] = '\0';
    text t = {0};
    int status = 400;
    if (sscanf(c->buf, "POST %63s HTTP/1.", path) == 1)
        status = handle(s, path, head_end + 4, &t);
    if (t.bad)
        status = 500;
    if (status == 200 && s->out_bytes + t.len > STORE_MAX_OUT)
        status = 503;
    if (status != 200) {
        t.len = 0;
        add(&t, "{\"error\":\"request refused\",\"code\":%d}", status);
    }
    char head[160];
    int hl = snprintf(head, sizeof(head), "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n", status,
                      status == 200 ? "OK" : "Error", t.bad ? 0 : t.len);
    size_t blen_out = t.bad ? 0 : t.len;
    c->out = malloc((size_t)hl + blen_out);
    if (c->out == NULL) {
        free(t.s);
        return 1;
    }
    memcpy(c->out, head, (size_t)hl);
    if (blen_out > 0)
        memcpy(c->out + hl, t.s, blen_out);
    free(t.s);
    c->olen = (size_t)hl + blen_out;
    c->osent = 0;
    s->out_bytes += c->olen;
    c->deadline = geoNow() + STORE_SEND_S;
    return 0;
}

/* Send what of c's answer the socket takes now, never waiting: 1 when
 * the connection is done (all sent, or the client went away). */
static int flush(storeConn *c)
{
    const char *why;
    return geoSocketStep(c->fd, c->out, c->olen, &c->osent, 1, &why) != 0;
}

static void conn_close(storeState *s, int i)
{
    close(s->conn[i].fd);
    free(s->conn[i].buf);
    free(s->conn[i].out);
    s->out_bytes -= s->conn[i].olen;
    s->conn[i] = s->conn[--s->nconn];
}

static void *store_main(void *arg)
{
    storeState *s = arg;
    struct pollfd pfd[STORE_MAX_CONNS + 1];
    for (;;) {
        expire(s);
        /* full: the listener waits (asking would wake the loop at once) */
        pfd[0] = (struct pollfd){.fd = s->lfd, .events = s->nconn < STORE_MAX_CONNS ? POLLIN : 0};
        for (int i = 0; i < s->nconn; i++)
            pfd[1 + i] = (struct pollfd){.fd = s->conn[i].fd,
                                         .events = s->conn[i].out ? POLLOUT : POLLIN};
        int rc = poll(pfd, (nfds_t)(1 + s->nconn), 200);
        if (rc < 0 && errno != EINTR)
            break;
        double now = geoNow();
        for (int i = s->nconn - 1; i >= 0; i--) {
            storeConn *c = &s->conn[i];
            int done = 0;
            if (pfd[1 + i].revents && c->out != NULL) {
                done = flush(c);
            } else if (pfd[1 + i].revents) {
                if (c->cap - c->len < 4096) {
                    size_t cap = c->cap * 2 + 8192;
                    char *b = cap <= STORE_MAX_REQUEST + 8192 ? realloc(c->buf, cap) : NULL;
                    if (b == NULL) {
                        conn_close(s, i);
                        continue;
                    }
                    c->buf = b;
                    c->cap = cap;
                }
                ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
                if (r <= 0 && !(r < 0 && (errno == EAGAIN || errno == EINTR))) {
                    done = 1;
                } else if (r > 0) {
                    c->len += (size_t)r;
                    c->buf[c->len] = '\0';
                    done = serve(s, c);
                    if (!done && c->out != NULL)
                        done = flush(c);
                }
            }
            if (done || now > c->deadline)
                conn_close(s, i);
        }
        if (pfd[0].revents & POLLIN) {
            int fd;
            geoSockAddr peer;
            while (s->nconn < STORE_MAX_CONNS && geoSocketAcceptNB(s->lfd, &fd, &peer) == 1) {
                s->conn[s->nconn++] = (storeConn){.fd = fd, .deadline = now + STORE_CONN_S};
            }
        }
    }
    return NULL;
}

void geoElasticStoreAddr(const geoSockAddr *root, geoSockAddr *out)
{
    *out = *root;
    int port = geoAddrPort(root) + 1;
    if (out->sa.sa_family == AF_INET6)
        out->sin6.sin6_port = htons((uint16_t)port);
    else
        out->sin.sin_port = htons((uint16_t)port);
}

void geoElasticStoreMaybeServe(const geoSockAddr *root)
{
    const char *spec = geoParamStr(GEO_PARAM_ELASTIC_ETCD);
    if ((spec != NULL && spec[0] != '\0') || !geoParamIsSet(GEO_PARAM_ELASTIC_JOB))
        return;
    geoSockAddr at, bound;
    char a[GEO_ADDR_STRLEN];
    int fd;
    pthread_t t;
    pthread_attr_t attr;
    geoElasticStoreAddr(root, &at);
    if (geoSocketListenQuiet(&at, &fd, &bound) != ncclSuccess) {
        geoInfo(GEO_LOG_INIT, "elastic: no membership store at %s (%s): one of this process "
                "may serve it already", geoAddrToString(&at, a), strerror(errno));
        return;
    }
    storeState *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        close(fd);
        return;
    }
    geoSocketSetNonBlocking(fd, 1);
    s->lfd = fd;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, store_main, s) != 0) {
        close(fd);
        free(s);
    } else {
        geoInfo(GEO_LOG_INIT, "elastic: serving the membership store at %s (no "
                "GEOCCL_ELASTIC_ETCD): this process's region must survive",
                geoAddrToString(&bound, a));
    }
    pthread_attr_destroy(&attr);
}
