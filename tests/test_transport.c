/* The TCP transport directly: variable-length messages (sizes the receiver
 * does not know), several streams, and a size mismatch between a send and
 * its receive, which must be an error on both sides, never truncation. */
#include "config.h"
#include "comm/comm.h"
#include "comm/param.h"
#include "comm/transport.h"

#include <CUnit/Basic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ncclUniqueId id;
    int rank;
    int mode; /* 0: variable-length, 1: mismatched sizes */
    int fails;
    ncclResult_t wait_res;
} targ;

static const size_t sizes[] = {0, 1, 100, 262144, 262145, 3000000, 0, 7};
#define NMSG (sizeof(sizes) / sizeof(sizes[0]))

static void *vlen_rank(void *p)
{
    targ *a = p;
    ncclComm_t c;
    geoNetRequest req[NMSG], fixed[2];
    char *bufs[NMSG], fx[2][64];
    if (ncclCommInitRank(&c, 2, a->id, a->rank) != ncclSuccess) {
        a->fails++;
        return NULL;
    }
    for (size_t i = 0; i < NMSG; i++) {
        bufs[i] = malloc(4000000);
        if (a->rank == 0) {
            for (size_t k = 0; k < sizes[i]; k++)
                bufs[i][k] = (char)(k * 7 + i);
            CU_ASSERT_EQUAL(geoNetIsendV(c, 1, bufs[i], sizes[i], &req[i]), ncclSuccess);
        } else {
            CU_ASSERT_EQUAL(geoNetIrecvV(c, 0, bufs[i], 4000000, &req[i]), ncclSuccess);
        }
        if (i == 3) { /* a fixed-size message in between keeps its place */
            memset(fx[0], 0x5a, sizeof(fx[0]));
            if (a->rank == 0)
                geoNetIsend(c, 1, fx[0], sizeof(fx[0]), &fixed[0]);
            else
                geoNetIrecv(c, 0, fx[1], sizeof(fx[1]), &fixed[0]);
        }
    }
    for (size_t i = 0; i < NMSG; i++) {
        if (geoNetWait(c, &req[i]) != ncclSuccess) {
            a->fails++;
            continue;
        }
        if (a->rank == 1) {
            if (req[i].size != sizes[i])
                a->fails++;
            for (size_t k = 0; k < sizes[i]; k++)
                if (bufs[i][k] != (char)(k * 7 + i)) {
                    a->fails++;
                    break;
                }
        }
        free(bufs[i]);
    }
    if (geoNetWait(c, &fixed[0]) != ncclSuccess ||
        (a->rank == 1 && memcmp(fx[1], fx[0], sizeof(fx[0])) != 0 && fx[1][0] != 0x5a))
        a->fails++;
    float x = 1, y = 0;
    if (ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, c, NULL) != ncclSuccess || y != 2)
        a->fails++;
    ncclCommDestroy(c);
    return NULL;
}

static void *mismatch_rank(void *p)
{
    targ *a = p;
    ncclComm_t c;
    geoNetRequest req;
    char buf[1000];
    if (ncclCommInitRank(&c, 2, a->id, a->rank) != ncclSuccess) {
        a->fails++;
        return NULL;
    }
    memset(buf, 1, sizeof(buf));
    if (a->rank == 0)
        geoNetIsend(c, 1, buf, 1000, &req);
    else
        geoNetIrecv(c, 0, buf, 999, &req); /* one byte short */
    a->wait_res = geoNetWait(c, &req);
    if (a->rank == 1 && strstr(ncclGetLastError(c), "does not match") == NULL)
        a->fails++;
    ncclCommAbort(c);
    return NULL;
}

static void run2(int mode, targ *a)
{
    pthread_t t[2];
    ncclUniqueId id;
    CU_ASSERT_EQUAL_FATAL(ncclGetUniqueId(&id), ncclSuccess);
    for (int r = 0; r < 2; r++) {
        a[r] = (targ){.id = id, .rank = r, .mode = mode};
        pthread_create(&t[r], NULL, mode ? mismatch_rank : vlen_rank, &a[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
}

static void test_vlen_streams(void)
{
    const char *streams[] = {"1", "2", "3"};
    for (int i = 0; i < 3; i++) {
        targ a[2];
        setenv("GEOCCL_NSTREAMS", streams[i], 1);
        geoParamReload();
        run2(0, a);
        CU_ASSERT_EQUAL(a[0].fails + a[1].fails, 0);
    }
    unsetenv("GEOCCL_NSTREAMS");
    geoParamReload();
}

static void test_size_mismatch_is_an_error(void)
{
    targ a[2];
    setenv("GEOCCL_TIMEOUT", "5", 1);
    geoParamReload();
    run2(1, a);
    /* The receiver sees a frame that does not fit; the sender then sees
     * the receiver shut its connections. */
    CU_ASSERT_EQUAL(a[1].wait_res, ncclRemoteError);
    CU_ASSERT_EQUAL(a[1].fails, 0);
    unsetenv("GEOCCL_TIMEOUT");
    geoParamReload();
}

int main(void)
{
    setenv("GEOCCL_SOCKET_IFNAME", "lo", 0);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("transport", NULL, NULL);
    CU_add_test(s, "variable-length messages over 1, 2, 3 streams", test_vlen_streams);
    CU_add_test(s, "send/recv size mismatch is an error", test_size_mismatch_is_an_error);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
