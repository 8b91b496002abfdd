/* Scratch buffers kept between calls (comm/base/scratch.h): a buffer given back
 * is handed out again (the smallest idle one that fits), a busy one never
 * twice, the bytes kept stay within GEO_SCRATCH_MAX_BYTES, and threads
 * sharing one pool never get the same buffer at once. */
#include "config.h"
#include "comm/base/scratch.h"

#include <CUnit/Basic.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void test_reuse(void)
{
    geoScratch s;
    geoScratchInit(&s);
    char *a = geoScratchGet(&s, 1 << 20);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    memset(a, 1, 1 << 20);
    char *b = geoScratchGet(&s, 1 << 20);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_PTR_NOT_EQUAL(a, b); /* a is busy */
    geoScratchPut(&s, a);
    char *c = geoScratchGet(&s, 512 << 10); /* fits in a */
    CU_ASSERT_PTR_EQUAL(c, a);
    geoScratchPut(&s, b);
    char *d = geoScratchGet(&s, 2 << 20); /* neither fits: b, idle and too small, is replaced */
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    CU_ASSERT_PTR_NOT_EQUAL(d, c);
    memset(d, 2, 2 << 20);
    CU_ASSERT_EQUAL(s.kept, (size_t)(1 << 20) + (2 << 20));
    geoScratchPut(&s, c);
    geoScratchPut(&s, d);
    geoScratchPut(&s, NULL);
    /* Best fit: a 1 MiB request takes the 1 MiB buffer, not the 2 MiB one. */
    CU_ASSERT_PTR_EQUAL(geoScratchGet(&s, 1 << 20), a);
    CU_ASSERT_PTR_EQUAL(geoScratchGet(&s, 1), d);
    geoScratchPut(&s, a);
    geoScratchPut(&s, d);
    geoScratchFree(&s);
}

static void test_bound(void)
{
    geoScratch s;
    geoScratchInit(&s);
    const size_t big = 100 << 20;
    void *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = geoScratchGet(&s, big); /* 400 MiB asked, at most 256 kept */
        CU_ASSERT_PTR_NOT_NULL_FATAL(p[i]);
        CU_ASSERT(s.kept <= GEO_SCRATCH_MAX_BYTES);
    }
    CU_ASSERT_EQUAL(s.kept, 2 * big);
    for (int i = 0; i < 4; i++)
        geoScratchPut(&s, p[i]); /* the two not kept are freed */
    CU_ASSERT_EQUAL(s.kept, 2 * big);
    /* More buffers than slots: the extra ones are plain allocations. */
    void *q[GEO_SCRATCH_SLOTS + 4];
    for (int i = 0; i < GEO_SCRATCH_SLOTS + 4; i++) {
        q[i] = geoScratchGet(&s, 4096);
        CU_ASSERT_PTR_NOT_NULL_FATAL(q[i]);
        for (int j = 0; j < i; j++)
            CU_ASSERT_PTR_NOT_EQUAL(q[i], q[j]);
    }
    for (int i = 0; i < GEO_SCRATCH_SLOTS + 4; i++)
        geoScratchPut(&s, q[i]);
    geoScratchFree(&s);
}

static geoScratch shared;
static int clashes;

static void *worker(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    for (int k = 0; k < 2000; k++) {
        size_t n = 4096 + (size_t)((k * 7 + (int)id * 13) % 5) * 4096;
        unsigned char *p = geoScratchGet(&shared, n);
        if (p == NULL) {
            __atomic_add_fetch(&clashes, 1, __ATOMIC_RELAXED);
            continue;
        }
        memset(p, (int)id, n);
        for (volatile int spin = 0; spin < 200; spin++)
            ;
        for (size_t i = 0; i < n; i += 512)
            if (p[i] != (unsigned char)id) {
                __atomic_add_fetch(&clashes, 1, __ATOMIC_RELAXED);
                break;
            }
        geoScratchPut(&shared, p);
    }
    return NULL;
}

static void test_threads(void)
{
    pthread_t t[6];
    geoScratchInit(&shared);
    clashes = 0;
    for (uintptr_t i = 0; i < 6; i++)
        CU_ASSERT_EQUAL_FATAL(pthread_create(&t[i], NULL, worker, (void *)(i + 1)), 0);
    for (int i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    CU_ASSERT_EQUAL(clashes, 0);
    for (int i = 0; i < GEO_SCRATCH_SLOTS; i++)
        CU_ASSERT_FALSE(shared.buf[i].busy);
    geoScratchFree(&shared);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("scratch", NULL, NULL);
    CU_add_test(s, "a buffer given back is reused, best fit", test_reuse);
    CU_add_test(s, "bytes kept are bounded; more buffers than slots", test_bound);
    CU_add_test(s, "threads never share a buffer", test_threads);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    int failed = (int)CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
