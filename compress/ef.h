/*
 * Error-feedback store: the residuals (what lossy encoding lost) that the
 * next encode of the same buffer adds back, kept per communicator.
 *
 * The communicator owns one geoEfStore value (no globals).  A residual is
 * keyed by (tag, buffer address, element count, slot).  The tag names the
 * memory the caller declared as one tensor's from call to call (the
 * registration of geocclCommRegisterErrorFeedback, never reused), so that
 * another tensor placed at the same address later, once that registration
 * is gone, cannot pick up its residual; address and count then name a
 * bucket inside it.  The slot separates residuals of one buffer that must
 * not mix, such as the two phases of a compressed all-reduce (the shard
 * each rank sends, and the reduced shard re-encoded for the return trip),
 * or chunk positions.  geoEfDropTag frees one registration's residuals,
 * geoEfReset everything (geoccl.h exposes both to users).
 *
 * Memory bound.  Residual arrays (count * 4 bytes each; the bookkeeping is
 * not counted) never add up to more than maxBytes (GEOCCL_EF_MAX_BYTES, read
 * by the caller).  A new entry that would exceed it evicts entries, least
 * recently used first; an evicted residual is simply lost (that bucket's
 * next step runs without the correction, as after a reset).  Entries
 * handed out since the last geoEfBeginOp are never evicted, so pointers a
 * running operation holds stay valid; if the new entry cannot fit without
 * evicting one of those, or is larger than maxBytes on its own, geoEfGet
 * fails with ncclInvalidUsage and evicts nothing: the caller encodes that
 * buffer without error feedback.  Evictions are counted (evictions,
 * evictedBytes) and geoEfTakeEvictionNotice lets the caller log the first
 * one once at INFO.
 *
 * Threads: a store is not thread-safe; one thread at a time (the
 * communicator's proxy thread) may call these functions on it.  None
 * blocks.
 */
#ifndef GEOCCL_COMPRESS_EF_H_
#define GEOCCL_COMPRESS_EF_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where residual arrays live: host memory by default; a CUDA caller passes
 * functions that allocate zeroed device memory. */
typedef struct {
    /* Returns bytes of zeroed memory suitably aligned for float, or NULL. */
    void *(*allocZeroed)(void *ctx, size_t bytes);
    /* Releases memory from allocZeroed (bytes as allocated). */
    void (*release)(void *ctx, void *ptr, size_t bytes);
    void *ctx;
} geoEfAllocator;

typedef struct geoEfEntry geoEfEntry;

/* One communicator's residuals.  Fields are private except the counters
 * marked read-only. */
typedef struct {
    geoEfEntry **buckets; /* hash chains, nbuckets (a power of two) */
    size_t nbuckets;
    geoEfEntry *mru, *lru; /* recency list, most recent first */
    size_t maxBytes;
    uint64_t epoch;        /* operation number (geoEfBeginOp) */
    geoEfAllocator alloc;
    int noticeTaken;
    /* Read-only counters. */
    size_t entries;        /* residual arrays held */
    size_t bytes;          /* their bytes (<= maxBytes) */
    uint64_t evictions;    /* entries evicted since geoEfInit */
    uint64_t evictedBytes; /* their bytes */
} geoEfStore;

/*
 * Prepares an empty store.
 *   [out] store     the store to set up
 *   [in]  maxBytes  bound on residual bytes; SIZE_MAX for none, 0 lets
 *                   nothing in
 *   [in]  alloc     NULL for host memory (calloc/free), else copied
 * Returns ncclSuccess, or ncclInvalidArgument (store NULL, or alloc with a
 * NULL function).
 */
ncclResult_t geoEfInit(geoEfStore *store, size_t maxBytes, const geoEfAllocator *alloc);

/* Starts a new operation: entries handed out before this call may be
 * evicted again (their pointers become invalid at the next geoEfGet). */
void geoEfBeginOp(geoEfStore *store);

/*
 * The residual of (tag, addr, count, slot): count float32 values, zeroed when the
 * entry is new, otherwise what the last encode left.  The pointer stays valid
 * until the next geoEfBeginOp is followed by a geoEfGet that evicts it, or
 * geoEfReset / geoEfFree.
 *   [in,out] store     the store
 *   [in]     tag       the registration the buffer belongs to
 *   [in]     addr      the user's buffer (only its value is used)
 *   [in]     count     elements (> 0)
 *   [in]     slot      which residual of that buffer
 *   [out]    residual  the array, on success only
 *   [out]    evicted   optional: entries this call evicted (0 if none)
 * Returns ncclSuccess; ncclInvalidArgument (NULL store or residual, count 0,
 * count * 4 overflows); ncclInvalidUsage when the entry does not fit under
 * the bound (larger than maxBytes, or only evicting entries of the running
 * operation would make room; nothing is evicted then); ncclSystemError when
 * memory could not be allocated.
 */
ncclResult_t geoEfGet(geoEfStore *store, uint64_t tag, const void *addr, size_t count,
                      uint32_t slot, float **residual, size_t *evicted);

/* 1 the first time it is called after an eviction happened, else 0: the
 * caller logs the first eviction once. */
int geoEfTakeEvictionNotice(geoEfStore *store);

/* Frees every residual (the next geoEfGet of any key returns zeros);
 * counters other than entries and bytes are kept.  Pointers from geoEfGet
 * become invalid. */
void geoEfReset(geoEfStore *store);

/* Frees every residual of tag (entries of the running operation too: call
 * it between operations).  Pointers to them become invalid. */
void geoEfDropTag(geoEfStore *store, uint64_t tag);

/* Frees everything the store holds; it must be set up with geoEfInit before
 * further use.  Safe on a store that geoEfInit set up and was freed since. */
void geoEfFree(geoEfStore *store);

#ifdef __cplusplus
}
#endif

#endif
