/* Per-communicator scratch buffers kept between calls.
 *
 * The collectives need receive buffers of a few MiB per call (ring slots,
 * the hierarchical exchange's partials).  Allocated per call, they come
 * from mmap (glibc maps large blocks) or from memory the heap gave back, so
 * the first write into every page faults and the kernel zeroes it: during a
 * 256 MiB hierarchical all-reduce on 3 emulated regions x 2 ranks at
 * 1 Gbit/s, perf showed 5.4% of all CPU time in clear_page under TCP
 * receives into such buffers (BENCHMARKS.md).  A communicator keeps up to
 * GEO_SCRATCH_SLOTS of them, at most GEO_SCRATCH_MAX_BYTES in all, and
 * hands them out again; what does not fit is allocated and freed as
 * before.  Thread-safe (one mutex per communicator). */
#ifndef GEOCCL_SCRATCH_H_
#define GEOCCL_SCRATCH_H_

#include <pthread.h>
#include <stddef.h>

#define GEO_SCRATCH_SLOTS 16
#define GEO_SCRATCH_MAX_BYTES ((size_t)256 << 20)

typedef struct {
    struct {
        void *p;
        size_t size;
        int busy;
    } buf[GEO_SCRATCH_SLOTS];
    size_t kept;                /* bytes held, busy or not */
    pthread_mutex_t lock;
} geoScratch;

void geoScratchInit(geoScratch *s);
void geoScratchFree(geoScratch *s);   /* every buffer must have been put back */
/* A buffer of at least bytes (uninitialised), or NULL when out of memory. */
void *geoScratchGet(geoScratch *s, size_t bytes);
/* Give back a buffer from geoScratchGet (NULL is ignored). */
void geoScratchPut(geoScratch *s, void *p);

#endif
