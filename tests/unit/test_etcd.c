/* The etcd client's own parts (comm/elastic/etcd.h): base64 both ways
 * against the standard's vectors and random round trips; the JSON scanners
 * on answers the gateway gives, and on every truncation and corruption of
 * them (an error, never a read past the text); and the requests against a
 * stand-in gateway on loopback: a member that refuses is passed over, a
 * chunked answer is put back together, a range's keys and values come back
 * decoded, a transaction that finds the key reports it; and the store
 * without etcd (store_root.c): a client that asks for a large answer and
 * never reads it neither delays the next client nor keeps its connection
 * past the answer's deadline. */
#include "config.h"
#include "comm/elastic/elastic.h"
#include "comm/elastic/etcd.h"

#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void test_base64(void)
{
    static const char *const plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=",
                                        "Zm9vYmFy"};
    char out[64];
    uint8_t back[64];
    size_t n;
    for (int i = 0; i < 7; i++) {
        geoB64Encode(plain[i], strlen(plain[i]), out);
        CU_ASSERT_STRING_EQUAL(out, coded[i]);
        CU_ASSERT_EQUAL(geoB64Decode(coded[i], strlen(coded[i]), back, &n), 0);
        CU_ASSERT_EQUAL(n, strlen(plain[i]));
        CU_ASSERT(memcmp(back, plain[i], n) == 0);
    }
    srand(7);
    for (int len = 0; len < 40; len++) {
        uint8_t in[40];
        char enc[64];
        for (int i = 0; i < len; i++)
            in[i] = (uint8_t)rand();
        geoB64Encode(in, (size_t)len, enc);
        CU_ASSERT_EQUAL(geoB64Decode(enc, strlen(enc), back, &n), 0);
        CU_ASSERT_EQUAL(n, (size_t)len);
        CU_ASSERT(memcmp(back, in, n) == 0);
    }
    CU_ASSERT_EQUAL(geoB64Decode("Zm9v!", 5, back, &n), -1);
    CU_ASSERT_EQUAL(geoB64Decode("Z", 1, back, &n), -1);
}

static const char range_answer[] =
    "{\"header\":{\"cluster_id\":\"324952591200643719\",\"revision\":\"2\"},\"kvs\":[{\"key\":"
    "\"L2EvYg==\",\"create_revision\":\"2\",\"mod_revision\":\"2\",\"version\":\"1\",\"value\":"
    "\"aGVsbG8=\",\"lease\":\"7\"},{\"key\":\"L2EvYw==\",\"create_revision\":\"3\",\"value\":"
    "\"\"}],\"count\":\"2\",\"more\":false,\"esc\":\"a\\\"b\\\\c\\u0041\"}";

static void test_json(void)
{
    char s[64];
    int64_t v = 0;
    const char *kvs = geoJsonGet(range_answer, "kvs"), *x;
    CU_ASSERT_PTR_NOT_NULL_FATAL(kvs);
    CU_ASSERT_EQUAL(geoJsonInt(geoJsonGet(range_answer, "count"), &v), 0);
    CU_ASSERT_EQUAL(v, 2);
    CU_ASSERT_EQUAL(geoJsonInt(geoJsonGet(geoJsonGet(range_answer, "header"), "revision"), &v),
                    0);
    CU_ASSERT_EQUAL(v, 2);
    x = geoJsonFirst(kvs);
    CU_ASSERT_PTR_NOT_NULL_FATAL(x);
    CU_ASSERT_EQUAL(geoJsonString(geoJsonGet(x, "key"), s, sizeof(s)), 8);
    CU_ASSERT_STRING_EQUAL(s, "L2EvYg==");
    CU_ASSERT_EQUAL(geoJsonInt(geoJsonGet(x, "lease"), &v), 0);
    CU_ASSERT_EQUAL(v, 7);
    x = geoJsonNext(x);
    CU_ASSERT_PTR_NOT_NULL_FATAL(x);
    CU_ASSERT_EQUAL(geoJsonString(geoJsonGet(x, "value"), s, sizeof(s)), 0);
    CU_ASSERT_PTR_NULL(geoJsonNext(x));
    CU_ASSERT_EQUAL(geoJsonString(geoJsonGet(range_answer, "esc"), s, sizeof(s)), 6);
    CU_ASSERT_STRING_EQUAL(s, "a\"b\\cA");
    CU_ASSERT_PTR_NULL(geoJsonGet(range_answer, "absent"));
    CU_ASSERT_PTR_NULL(geoJsonFirst("[]"));
    CU_ASSERT_EQUAL(geoJsonInt("\"12x\"", &v), -1);
    /* Past int64, quoted or bare, of any length: an error, never clamped. */
    v = 5;
    CU_ASSERT_EQUAL(geoJsonInt("\"9223372036854775808\"", &v), -1);
    CU_ASSERT_EQUAL(geoJsonInt("-9223372036854775809", &v), -1);
    CU_ASSERT_EQUAL(geoJsonInt("99999999999999999999999999999999999999999", &v), -1);
    CU_ASSERT_EQUAL(v, 5);
    CU_ASSERT_EQUAL(geoJsonInt("\"9223372036854775807\"", &v), 0);
    CU_ASSERT_EQUAL(v, INT64_MAX);
    CU_ASSERT_EQUAL(geoJsonInt("-9223372036854775808", &v), 0);
    CU_ASSERT_EQUAL(v, INT64_MIN);
    /* Every truncation and a corrupted byte at every place: whatever the
     * scanners make of it, they stay inside the text (run under the
     * sanitizers by tests/run-sanitizers.sh). */
    size_t len = strlen(range_answer);
    char *cut = malloc(len + 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cut);
    for (size_t k = 0; k <= len; k++) {
        for (int corrupt = 0; corrupt < 2; corrupt++) {
            memcpy(cut, range_answer, len + 1);
            if (corrupt)
                cut[k < len ? k : 0] = "{\"[,:\\"[k % 7];
            else
                cut[k] = '\0';
            const char *a = geoJsonGet(cut, "kvs");
            for (const char *e = a ? geoJsonFirst(a) : NULL; e; e = geoJsonNext(e)) {
                geoJsonString(geoJsonGet(e, "key"), s, sizeof(s));
                geoJsonInt(geoJsonGet(e, "create_revision"), &v);
            }
            geoJsonSkip(cut);
            geoJsonInt(geoJsonGet(cut, "count"), &v);
        }
    }
    free(cut);
    /* Nesting deeper than the scanners follow is refused, not recursed. */
    char deep[400];
    memset(deep, '[', 300);
    deep[300] = '\0';
    CU_ASSERT_PTR_NULL(geoJsonSkip(deep));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- a stand-in gateway --------------------------------------------- */

static int gw_fd;
static int gw_served;

static void *gateway_main(void *arg)
{
    (void)arg;
    for (;;) {
        int c = accept(gw_fd, NULL, NULL);
        if (c < 0)
            return NULL;
        char req[8192];
        size_t n = 0;
        ssize_t r;
        /* Headers and the whole body (the client sends both at once). */
        while (n < sizeof(req) - 1 && (r = recv(c, req + n, sizeof(req) - 1 - n, 0)) > 0) {
            n += (size_t)r;
            req[n] = '\0';
            char *h = strstr(req, "\r\n\r\n"), *cl = strstr(req, "Content-Length: ");
            if (h && cl && (size_t)(h + 4 - req) + (size_t)atoi(cl + 16) <= n)
                break;
        }
        req[n] = '\0';
        const char *ans;
        char buf[4096];
        if (strstr(req, "POST /v3/lease/keepalive")) {
            /* Chunked, in two pieces, as the gateway streams it. */
            ans = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                  "a\r\n{\"result\":\r\n"
                  "1d\r\n{\"ID\":\"5\",\"TTL\":\"3\"},\"x\":1}\r\n0\r\n\r\n";
        } else if (strstr(req, "POST /v3/kv/range") && strstr(req, "L2h1Z2U=")) {
            /* "/huge": a revision past int64 */
            ans = "HTTP/1.1 200 OK\r\n\r\n{\"header\":{\"revision\":\"99999999999999999999\"},"
                  "\"count\":\"0\"}";
        } else if (strstr(req, "POST /v3/kv/range")) {
            snprintf(buf, sizeof(buf), "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(range_answer), range_answer);
            ans = buf;
        } else if (strstr(req, "POST /v3/kv/txn")) {
            ans = "HTTP/1.1 200 OK\r\n\r\n{\"header\":{},\"succeeded\":false,\"responses\":"
                  "[{\"response_range\":{\"kvs\":[{\"key\":\"L2EvYg==\",\"value\":\"aGVsbG8=\","
                  "\"create_revision\":\"2\"}],\"count\":\"1\"}}]}";
        } else if (strstr(req, "POST /v3/lease/revoke")) {
            /* a lease that has run out, as etcd's gateway says it */
            ans = "HTTP/1.1 404 Not Found\r\n\r\n{\"error\":\"etcdserver: requested lease "
                  "not found\",\"code\":5,\"message\":\"etcdserver: requested lease not "
                  "found\"}";
        } else if (strstr(req, "POST /v3/kv/deleterange")) {
            ans = "HTTP/1.1 400 Bad Request\r\n\r\n{\"error\":\"etcdserver: key is not "
                  "provided\",\"code\":3}";
        } else {
            ans = "HTTP/1.1 503 Service Unavailable\r\n\r\n{\"error\":\"etcdserver: no leader\"}";
        }
        send(c, ans, strlen(ans), MSG_NOSIGNAL);
        close(c);
        __atomic_add_fetch(&gw_served, 1, __ATOMIC_RELAXED);
    }
}

static void test_requests(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    gw_fd = socket(AF_INET, SOCK_STREAM, 0);
    CU_ASSERT_FATAL(gw_fd >= 0);
    CU_ASSERT_FATAL(bind(gw_fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    CU_ASSERT_FATAL(listen(gw_fd, 16) == 0);
    getsockname(gw_fd, (struct sockaddr *)&a, &al);
    /* A port nobody listens on: taken and closed again. */
    int dead = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in d = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t dl = sizeof(d);
    bind(dead, (struct sockaddr *)&d, sizeof(d));
    getsockname(dead, (struct sockaddr *)&d, &dl);
    close(dead);
    pthread_t t;
    CU_ASSERT_FATAL(pthread_create(&t, NULL, gateway_main, NULL) == 0);

    char spec[128], why[GEO_ETCD_WHY_LEN];
    snprintf(spec, sizeof(spec), "127.0.0.1:%d,127.0.0.1:%d", ntohs(d.sin_port),
             ntohs(a.sin_port));
    geoEtcd e;
    CU_ASSERT_EQUAL_FATAL(geoEtcdInit(&e, spec, 5.0, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(e.n, 2);

    geoEtcdRange range;
    CU_ASSERT_EQUAL_FATAL(geoEtcdGet(&e, "/a/", 1, 0, &range, why), ncclSuccess);
    CU_ASSERT_EQUAL(e.cur, 1); /* the refusing member was passed over */
    CU_ASSERT_EQUAL(range.n, 2);
    CU_ASSERT_EQUAL(range.count, 2);
    CU_ASSERT_STRING_EQUAL(range.kvs[0].key, "/a/b");
    CU_ASSERT_EQUAL(range.kvs[0].vlen, 5);
    CU_ASSERT(memcmp(range.kvs[0].value, "hello", 5) == 0);
    CU_ASSERT_EQUAL(range.kvs[0].lease, 7);
    CU_ASSERT_STRING_EQUAL(range.kvs[1].key, "/a/c");
    CU_ASSERT_EQUAL(range.kvs[1].vlen, 0);
    geoEtcdRangeFree(&range);
    /* A revision past int64 makes the answer an error, not a clamped one. */
    CU_ASSERT_EQUAL(geoEtcdGet(&e, "/huge", 0, 0, &range, why), ncclRemoteError);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "64-bit"));
    geoEtcdRangeFree(&range);

    int64_t ttl = 0;
    CU_ASSERT_EQUAL(geoEtcdLeaseKeepAlive(&e, 5, &ttl, why), ncclSuccess);
    CU_ASSERT_EQUAL(ttl, 3);

    int created = 1;
    geoEtcdKv kv;
    CU_ASSERT_EQUAL(geoEtcdCreate(&e, "/a/b", "x", 1, 0, &created, &kv, why), ncclSuccess);
    CU_ASSERT_EQUAL(created, 0);
    CU_ASSERT_STRING_EQUAL(kv.key, "/a/b");
    CU_ASSERT_EQUAL(kv.create_rev, 2);
    geoEtcdKvFree(&kv);

    /* A client error is the cluster's answer: at once, not after every
     * member and the whole deadline (60 s in a joiner's revoke of a lease
     * that had run out); a lease already gone counts as revoked. */
    geoEtcd slow;
    CU_ASSERT_EQUAL_FATAL(geoEtcdInit(&slow, spec, 30.0, why, sizeof(why)), 0);
    double t0 = now_s();
    CU_ASSERT_EQUAL(geoEtcdLeaseRevoke(&slow, 5, why), ncclSuccess);
    CU_ASSERT_EQUAL(geoEtcdDelete(&slow, "/a/b", 0, why), ncclRemoteError);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "400"));
    CU_ASSERT(now_s() - t0 < 2.0);

    /* A member without a leader answers 503: an error naming it. */
    snprintf(spec, sizeof(spec), "127.0.0.1:%d", ntohs(a.sin_port));
    CU_ASSERT_EQUAL_FATAL(geoEtcdInit(&e, spec, 0.5, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(geoEtcdPut(&e, "/a/b", "x", 1, 0, why), ncclRemoteError);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "503"));

    char bad[64];
    CU_ASSERT_EQUAL(geoEtcdInit(&e, "nohostport", 1.0, bad, sizeof(bad)), -1);
    CU_ASSERT_EQUAL(geoEtcdInit(&e, ",,", 1.0, bad, sizeof(bad)), -1);
    shutdown(gw_fd, SHUT_RDWR);
    close(gw_fd);
    pthread_join(t, NULL);
}

/* The store's thread serves every connection in turn: one that stops
 * reading its answer must not hold it.  The answer here (16 values of
 * 600 KiB, 13 MiB in base64) is far more than the socket buffers take. */
static void test_store_slow_reader(void)
{
    char spec[64], why[GEO_ETCD_WHY_LEN], a[GEO_ADDR_STRLEN];
    geoSockAddr root = {0}, at;
    root.sin.sin_family = AF_INET;
    root.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* a port free now for the store, one above the root's */
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t pl = sizeof(root.sin);
    CU_ASSERT_FATAL(bind(probe, &root.sa, sizeof(root.sin)) == 0);
    getsockname(probe, &root.sa, &pl);
    close(probe);
    root.sin.sin_port = htons((uint16_t)(ntohs(root.sin.sin_port) - 1));
    geoElasticStoreMaybeServe(&root);
    geoElasticStoreAddr(&root, &at);
    snprintf(spec, sizeof(spec), "%s", geoAddrToString(&at, a));
    geoEtcd e;
    CU_ASSERT_EQUAL_FATAL(geoEtcdInit(&e, spec, 5.0, why, sizeof(why)), 0);
    size_t vlen = 600 << 10;
    char *val = malloc(vlen);
    CU_ASSERT_PTR_NOT_NULL_FATAL(val);
    memset(val, 'v', vlen);
    for (int i = 0; i < 16; i++) {
        char key[16];
        snprintf(key, sizeof(key), "/s/%02d", i);
        CU_ASSERT_EQUAL_FATAL(geoEtcdPut(&e, key, val, vlen, 0, why), ncclSuccess);
    }
    free(val);

    int slow = socket(AF_INET, SOCK_STREAM, 0), small = 4096;
    setsockopt(slow, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    CU_ASSERT_FATAL(connect(slow, &at.sa, sizeof(at.sin)) == 0);
    const char body[] = "{\"key\":\"L3Mv\",\"range_end\":\"L3Mw\"}"; /* "/s/" to "/s0" */
    char req[256];
    int rl = snprintf(req, sizeof(req), "POST /v3/kv/range HTTP/1.1\r\nContent-Length: %zu\r\n"
                      "\r\n%s", strlen(body), body);
    CU_ASSERT_EQUAL(send(slow, req, (size_t)rl, MSG_NOSIGNAL), rl);
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL); /* the store has the request and is answering */

    geoEtcdRange range;
    double t0 = geoNow();
    CU_ASSERT_EQUAL(geoEtcdGet(&e, "/s/00", 0, 1, &range, why), ncclSuccess);
    CU_ASSERT(geoNow() - t0 < 1.0);
    CU_ASSERT_EQUAL(range.count, 1);
    geoEtcdRangeFree(&range);

    /* Past the answer's deadline the store has dropped the slow client:
     * reading now ends well short of the whole answer. */
    struct timespec wait = {6, 0};
    nanosleep(&wait, NULL);
    size_t got = 0;
    char buf[65536];
    ssize_t r;
    while ((r = recv(slow, buf, sizeof(buf), 0)) > 0)
        got += (size_t)r;
    CU_ASSERT(got < 16 * vlen);
    close(slow);
}

int main(void)
{
    /* the store without etcd serves only for a job and without an etcd */
    setenv("GEOCCL_ELASTIC_JOB", "test-etcd", 1);
    unsetenv("GEOCCL_ELASTIC_ETCD");
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("etcd", NULL, NULL);
    CU_add_test(s, "base64: the standard's vectors, round trips, bad input", test_base64);
    CU_add_test(s, "JSON: a range answer, escapes, every truncation and corruption", test_json);
    CU_add_test(s, "requests: fail-over, chunked answers, range, keepalive, txn, 503",
                test_requests);
    CU_add_test(s, "store without etcd: a client that stops reading holds no one up",
                test_store_slow_reader);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    int failed = (int)CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
