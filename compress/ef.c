/* Error-feedback store: a hash table of residual arrays with an LRU list
 * (contract in ef.h). */
#include "config.h"
#include "compress/ef.h"
#include "compress/codec.h"

#include <stdlib.h>
#include <string.h>

struct geoEfEntry {
    uint64_t tag;
    uintptr_t addr;
    size_t count;
    uint32_t slot;
    uint64_t epoch;         /* last geoEfGet's operation */
    float *residual;
    size_t bytes;
    geoEfEntry *chain;      /* next in the hash bucket */
    geoEfEntry *prev, *next; /* recency list; prev is more recent */
};

static void *efCalloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return calloc(1, bytes);
}

static void efFreeMem(void *ctx, void *ptr, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    free(ptr);
}

static size_t efHash(uint64_t tag, uintptr_t addr, size_t count, uint32_t slot)
{
    uint64_t h = geoCodecMix64((uint64_t)addr ^ geoCodecMix64((uint64_t)count * 31u + slot) ^
                               geoCodecMix64(tag + 0x9e3779b97f4a7c15ull));
    return (size_t)h;
}

ncclResult_t geoEfInit(geoEfStore *store, size_t maxBytes, const geoEfAllocator *alloc)
{
    if (!store)
        return ncclInvalidArgument;
    if (alloc && (!alloc->allocZeroed || !alloc->release))
        return ncclInvalidArgument;
    memset(store, 0, sizeof(*store));
    store->maxBytes = maxBytes;
    store->epoch = 1;
    if (alloc)
        store->alloc = *alloc;
    else
        store->alloc = (geoEfAllocator){efCalloc, efFreeMem, NULL};
    return ncclSuccess;
}

void geoEfBeginOp(geoEfStore *store)
{
    if (store)
        store->epoch++;
}

static void lruUnlink(geoEfStore *s, geoEfEntry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        s->mru = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        s->lru = e->prev;
    e->prev = e->next = NULL;
}

static void lruPushFront(geoEfStore *s, geoEfEntry *e)
{
    e->prev = NULL;
    e->next = s->mru;
    if (s->mru)
        s->mru->prev = e;
    s->mru = e;
    if (!s->lru)
        s->lru = e;
}

/* Removes e from its bucket chain, the list and the counters, and frees it. */
static void efDrop(geoEfStore *s, geoEfEntry *e)
{
    geoEfEntry **pp = &s->buckets[efHash(e->tag, e->addr, e->count, e->slot) & (s->nbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->chain;
    *pp = e->chain;
    lruUnlink(s, e);
    s->entries--;
    s->bytes -= e->bytes;
    s->alloc.release(s->alloc.ctx, e->residual, e->bytes);
    free(e);
}

/* Doubles the bucket array (or makes the first one); 0 on failure, which
 * only leaves chains longer. */
static int efGrow(geoEfStore *s)
{
    size_t n = s->nbuckets ? 2 * s->nbuckets : 16;
    geoEfEntry **b = calloc(n, sizeof(*b));
    if (!b)
        return 0;
    for (size_t i = 0; i < s->nbuckets; i++) {
        geoEfEntry *e = s->buckets[i];
        while (e) {
            geoEfEntry *next = e->chain;
            size_t j = efHash(e->tag, e->addr, e->count, e->slot) & (n - 1);
            e->chain = b[j];
            b[j] = e;
            e = next;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
    return 1;
}

ncclResult_t geoEfGet(geoEfStore *store, uint64_t tag, const void *addr, size_t count,
                      uint32_t slot, float **residual, size_t *evicted)
{
    if (evicted)
        *evicted = 0;
    if (!store || !residual || count == 0 || count > SIZE_MAX / sizeof(float))
        return ncclInvalidArgument;
    uintptr_t a = (uintptr_t)addr;
    if (store->nbuckets) {
        for (geoEfEntry *e = store->buckets[efHash(tag, a, count, slot) & (store->nbuckets - 1)];
             e; e = e->chain) {
            if (e->tag == tag && e->addr == a && e->count == count && e->slot == slot) {
                lruUnlink(store, e);
                lruPushFront(store, e);
                e->epoch = store->epoch;
                *residual = e->residual;
                return ncclSuccess;
            }
        }
    }

    size_t bytes = count * sizeof(float);
    if (bytes > store->maxBytes)
        return ncclInvalidUsage;
    /* Entries of the running operation sit at the front of the list (every
     * geoEfGet moves its entry there); they cannot go. */
    size_t pinned = 0;
    for (geoEfEntry *e = store->mru; e && e->epoch == store->epoch; e = e->next)
        pinned += e->bytes;
    if (bytes > store->maxBytes - pinned)
        return ncclInvalidUsage;

    if (store->entries + 1 > store->nbuckets)
        efGrow(store);
    if (!store->nbuckets)
        return ncclSystemError;
    geoEfEntry *e = calloc(1, sizeof(*e));
    if (!e)
        return ncclSystemError;

    size_t n = 0;
    while (bytes > store->maxBytes - store->bytes) {
        geoEfEntry *victim = store->lru; /* not pinned: the check above */
        store->evictions++;
        store->evictedBytes += victim->bytes;
        efDrop(store, victim);
        n++;
    }
    e->residual = store->alloc.allocZeroed(store->alloc.ctx, bytes);
    if (!e->residual) {
        free(e);
        if (evicted)
            *evicted = n;
        return ncclSystemError;
    }
    e->tag = tag;
    e->addr = a;
    e->count = count;
    e->slot = slot;
    e->bytes = bytes;
    e->epoch = store->epoch;
    size_t j = efHash(tag, a, count, slot) & (store->nbuckets - 1);
    e->chain = store->buckets[j];
    store->buckets[j] = e;
    lruPushFront(store, e);
    store->entries++;
    store->bytes += bytes;
    if (evicted)
        *evicted = n;
    *residual = e->residual;
    return ncclSuccess;
}

int geoEfTakeEvictionNotice(geoEfStore *store)
{
    if (!store || store->evictions == 0 || store->noticeTaken)
        return 0;
    store->noticeTaken = 1;
    return 1;
}

void geoEfReset(geoEfStore *store)
{
    if (!store)
        return;
    while (store->mru)
        efDrop(store, store->mru);
}

void geoEfDropTag(geoEfStore *store, uint64_t tag)
{
    if (!store)
        return;
    for (geoEfEntry *e = store->mru, *next; e; e = next) {
        next = e->next;
        if (e->tag == tag)
            efDrop(store, e);
    }
}

void geoEfFree(geoEfStore *store)
{
    if (!store)
        return;
    geoEfReset(store);
    free(store->buckets);
    store->buckets = NULL;
    store->nbuckets = 0;
}
