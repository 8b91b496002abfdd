/*
 * The error-feedback store (compress/ef.h): keyed lookups, zeroed new
 * entries, least-recently-used eviction at the memory bound, protection of
 * the running operation's entries, the eviction notice, reset, free and
 * a caller-supplied allocator.
 */
#include "config.h"
#include "compress/ef.h"

#include <CUnit/Basic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int allZero(const float *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (r[i] != 0.0f)
            return 0;
    return 1;
}

static void fillWith(float *r, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        r[i] = v;
}

static char bufA[1], bufB[1], bufC[1], bufD[1];

static void test_keys_and_zeroing(void)
{
    geoEfStore s;
    CU_ASSERT_EQUAL(geoEfInit(&s, SIZE_MAX, NULL), ncclSuccess);
    float *a = NULL, *a2 = NULL, *b = NULL, *c = NULL, *d = NULL;
    size_t ev = 99;
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 100, 0, &a, &ev), ncclSuccess);
    CU_ASSERT_EQUAL(ev, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT(allZero(a, 100));
    fillWith(a, 100, 1.5f);
    /* Same key: the same array with what was left in it. */
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 100, 0, &a2, NULL), ncclSuccess);
    CU_ASSERT_PTR_EQUAL(a2, a);
    CU_ASSERT_EQUAL(a2[99], 1.5f);
    /* Another slot, count or address: a new zeroed array. */
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 100, 1, &b, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 101, 0, &c, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufB, 100, 0, &d, NULL), ncclSuccess);
    CU_ASSERT(b != a && c != a && d != a && b != c && c != d && b != d);
    CU_ASSERT(allZero(b, 100) && allZero(c, 101) && allZero(d, 100));
    CU_ASSERT_EQUAL(s.entries, 4);
    CU_ASSERT_EQUAL(s.bytes, (100 + 100 + 101 + 100) * sizeof(float));
    CU_ASSERT_EQUAL(s.evictions, 0);
    CU_ASSERT_EQUAL(geoEfTakeEvictionNotice(&s), 0);
    geoEfFree(&s);
}

/* Another tag (a later registration of the same memory) never sees the
 * first one's residual, and dropping a tag frees only its entries. */
static void test_tags(void)
{
    geoEfStore s;
    CU_ASSERT_EQUAL(geoEfInit(&s, SIZE_MAX, NULL), ncclSuccess);
    float *a = NULL, *b = NULL, *a2 = NULL, *c = NULL;
    CU_ASSERT_EQUAL_FATAL(geoEfGet(&s, 2, bufA, 64, 1, &a, NULL), ncclSuccess);
    fillWith(a, 64, 3.0f);
    CU_ASSERT_EQUAL_FATAL(geoEfGet(&s, 3, bufA, 64, 1, &b, NULL), ncclSuccess);
    CU_ASSERT(b != a);
    CU_ASSERT(allZero(b, 64));
    fillWith(b, 64, 4.0f);
    CU_ASSERT_EQUAL_FATAL(geoEfGet(&s, 2, bufB, 64, 1, &c, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(s.entries, 3);
    geoEfDropTag(&s, 2);
    CU_ASSERT_EQUAL(s.entries, 1);
    CU_ASSERT_EQUAL(s.bytes, 64 * sizeof(float));
    /* tag 3's residual is still there; tag 2's comes back zeroed */
    CU_ASSERT_EQUAL_FATAL(geoEfGet(&s, 3, bufA, 64, 1, &b, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(b[63], 4.0f);
    CU_ASSERT_EQUAL_FATAL(geoEfGet(&s, 2, bufA, 64, 1, &a2, NULL), ncclSuccess);
    CU_ASSERT(allZero(a2, 64));
    geoEfDropTag(&s, 99); /* no entry: nothing happens */
    CU_ASSERT_EQUAL(s.entries, 2);
    geoEfFree(&s);
}

static void test_many_entries(void)
{
    /* Enough keys to grow the hash table several times. */
    geoEfStore s;
    CU_ASSERT_EQUAL(geoEfInit(&s, SIZE_MAX, NULL), ncclSuccess);
    static char base[2000];
    float *r;
    for (int i = 0; i < 2000; i++) {
        CU_ASSERT_EQUAL_FATAL(geoEfGet(&s, 7, base + i, 4, (uint32_t)(i % 3), &r, NULL), ncclSuccess);
        r[0] = (float)i;
    }
    CU_ASSERT_EQUAL(s.entries, 2000);
    int bad = 0;
    for (int i = 0; i < 2000; i++) {
        CU_ASSERT_EQUAL_FATAL(geoEfGet(&s, 7, base + i, 4, (uint32_t)(i % 3), &r, NULL), ncclSuccess);
        bad += r[0] != (float)i;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(s.entries, 2000);
    geoEfFree(&s);
}

static void test_lru_eviction(void)
{
    geoEfStore s;
    /* Room for three entries of 100 floats. */
    CU_ASSERT_EQUAL(geoEfInit(&s, 3 * 100 * sizeof(float), NULL), ncclSuccess);
    float *a, *b, *c, *d;
    size_t ev;
    geoEfBeginOp(&s);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 100, 0, &a, NULL), ncclSuccess);
    fillWith(a, 100, 1.0f);
    geoEfBeginOp(&s);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufB, 100, 0, &b, NULL), ncclSuccess);
    fillWith(b, 100, 2.0f);
    geoEfBeginOp(&s);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufC, 100, 0, &c, NULL), ncclSuccess);
    fillWith(c, 100, 3.0f);
    /* Touch A: B is now the least recently used. */
    geoEfBeginOp(&s);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 100, 0, &a, NULL), ncclSuccess);
    geoEfBeginOp(&s);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufD, 100, 0, &d, &ev), ncclSuccess);
    CU_ASSERT_EQUAL(ev, 1);
    CU_ASSERT(allZero(d, 100));
    CU_ASSERT_EQUAL(s.entries, 3);
    CU_ASSERT_EQUAL(s.bytes, 300 * sizeof(float));
    CU_ASSERT_EQUAL(s.evictions, 1);
    CU_ASSERT_EQUAL(s.evictedBytes, 100 * sizeof(float));
    CU_ASSERT_EQUAL(geoEfTakeEvictionNotice(&s), 1);
    CU_ASSERT_EQUAL(geoEfTakeEvictionNotice(&s), 0); /* once */
    /* A and C kept their values; B comes back zeroed. */
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 100, 0, &a, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(a[0], 1.0f);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufC, 100, 0, &c, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(c[0], 3.0f);
    /* All three (A, C, D) belong to this operation now: B cannot get in. */
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufB, 100, 0, &b, &ev), ncclInvalidUsage);
    CU_ASSERT_EQUAL(ev, 0);
    CU_ASSERT_EQUAL(s.entries, 3);
    CU_ASSERT_EQUAL(a[0], 1.0f);
    /* Next operation: B evicts the least recently used of them (D). */
    geoEfBeginOp(&s);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufB, 100, 0, &b, &ev), ncclSuccess);
    CU_ASSERT_EQUAL(ev, 1);
    CU_ASSERT(allZero(b, 100));
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufC, 100, 0, &c, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(c[0], 3.0f);
    /* A bigger entry evicts as many as it needs. */
    geoEfBeginOp(&s);
    float *big;
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufD, 250, 0, &big, &ev), ncclSuccess);
    CU_ASSERT_EQUAL(ev, 3);
    CU_ASSERT_EQUAL(s.entries, 1);
    CU_ASSERT_EQUAL(s.bytes, 250 * sizeof(float));
    CU_ASSERT_EQUAL(s.evictions, 5);
    /* Larger than the bound: refused, nothing evicted. */
    geoEfBeginOp(&s);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 301, 0, &a, &ev), ncclInvalidUsage);
    CU_ASSERT_EQUAL(ev, 0);
    CU_ASSERT_EQUAL(s.entries, 1);
    geoEfFree(&s);

    /* A zero bound lets nothing in. */
    CU_ASSERT_EQUAL(geoEfInit(&s, 0, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 1, 0, &a, NULL), ncclInvalidUsage);
    geoEfFree(&s);
}

static void test_reset_and_free(void)
{
    geoEfStore s;
    CU_ASSERT_EQUAL(geoEfInit(&s, 1 << 20, NULL), ncclSuccess);
    float *a, *b;
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 10, 0, &a, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufB, 10, 2, &b, NULL), ncclSuccess);
    fillWith(a, 10, 4.0f);
    fillWith(b, 10, 5.0f);
    geoEfReset(&s);
    CU_ASSERT_EQUAL(s.entries, 0);
    CU_ASSERT_EQUAL(s.bytes, 0);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 10, 0, &a, NULL), ncclSuccess);
    CU_ASSERT(allZero(a, 10));
    CU_ASSERT_EQUAL(s.entries, 1);
    geoEfReset(&s);
    geoEfReset(&s);
    geoEfFree(&s);
    geoEfFree(&s); /* twice is harmless */
    geoEfFree(NULL);
    geoEfReset(NULL);
    geoEfBeginOp(NULL);
    /* Usable again after a new init. */
    CU_ASSERT_EQUAL(geoEfInit(&s, 1 << 20, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 10, 0, &a, NULL), ncclSuccess);
    CU_ASSERT(allZero(a, 10));
    geoEfFree(&s);
}

static void test_bad_arguments(void)
{
    geoEfStore s;
    float *r = NULL;
    CU_ASSERT_EQUAL(geoEfInit(NULL, 1, NULL), ncclInvalidArgument);
    geoEfAllocator half = {NULL, NULL, NULL};
    CU_ASSERT_EQUAL(geoEfInit(&s, 1, &half), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geoEfInit(&s, SIZE_MAX, NULL), ncclSuccess);
    CU_ASSERT_EQUAL(geoEfGet(NULL, 7, bufA, 1, 0, &r, NULL), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 1, 0, NULL, NULL), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, 0, 0, &r, NULL), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA, SIZE_MAX / 2, 0, &r, NULL), ncclInvalidArgument);
    CU_ASSERT_PTR_NULL(r);
    geoEfFree(&s);
}

/* A caller allocator (what a CUDA caller passes for device memory). */
typedef struct {
    size_t live, allocs, releases;
    int failNext;
} counting;

static void *countAlloc(void *ctx, size_t bytes)
{
    counting *c = ctx;
    if (c->failNext) {
        c->failNext = 0;
        return NULL;
    }
    c->live += bytes;
    c->allocs++;
    return calloc(1, bytes);
}

static void countRelease(void *ctx, void *p, size_t bytes)
{
    counting *c = ctx;
    c->live -= bytes;
    c->releases++;
    free(p);
}

static void test_allocator(void)
{
    counting cnt = {0, 0, 0, 0};
    geoEfAllocator al = {countAlloc, countRelease, &cnt};
    geoEfStore s;
    CU_ASSERT_EQUAL(geoEfInit(&s, 1000 * sizeof(float), &al), ncclSuccess);
    float *r;
    for (int i = 0; i < 50; i++) {
        geoEfBeginOp(&s);
        CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufA + 0, 300, (uint32_t)i, &r, NULL), ncclSuccess);
        CU_ASSERT(s.bytes <= 1000 * sizeof(float));
        CU_ASSERT_EQUAL(cnt.live, s.bytes);
    }
    CU_ASSERT_EQUAL(s.entries, 3);
    cnt.failNext = 1;
    geoEfBeginOp(&s);
    CU_ASSERT_EQUAL(geoEfGet(&s, 7, bufB, 300, 0, &r, NULL), ncclSystemError);
    CU_ASSERT_EQUAL(cnt.live, s.bytes);
    geoEfFree(&s);
    CU_ASSERT_EQUAL(cnt.live, 0);
    CU_ASSERT_EQUAL(cnt.allocs, cnt.releases);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("ef", NULL, NULL);
    CU_add_test(s, "keys and zeroing", test_keys_and_zeroing);
    CU_add_test(s, "tags", test_tags);
    CU_add_test(s, "many entries", test_many_entries);
    CU_add_test(s, "LRU eviction at the bound", test_lru_eviction);
    CU_add_test(s, "reset and free", test_reset_and_free);
    CU_add_test(s, "bad arguments", test_bad_arguments);
    CU_add_test(s, "caller allocator", test_allocator);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
