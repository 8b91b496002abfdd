/* The host segment's layout and phase primitives, shared by its files
 * (hostseg.h says what the segment is for and the phase rule).
 *
 * Layout: a header page, a page of per-rank lines (one cache line each,
 * written only by that rank), then the data: two buffers (phase parity),
 * each of nranks slots of `slot` bytes.  Everything a peer wrote is read
 * as data only: sizes and offsets come from this process's own copies,
 * set at setup. */
#ifndef GEOCCL_HOSTSEG_INTERNAL_H_
#define GEOCCL_HOSTSEG_INTERNAL_H_

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "comm/intra/hostseg.h"

struct ncclComm;

#define HS_LINE 64
#define HS_PAGE 4096
#define HS_MAGIC 0x47454f484f535431ULL /* "GEOHOST1" */
#define HS_NCAL 6

typedef struct {
    _Alignas(HS_LINE) uint64_t magic;
    uint64_t nranks;
    uint64_t slot;
    uint64_t size;
    uint8_t token[32];          /* HMAC of the communicator's secret: proves the segment */
    double cal[HS_NCAL];        /* rank 0's calibration (geoHostSegCal order) */
    /* Arrivals of every rank at every phase so far: phase p is complete
     * when it reaches nranks * p. */
    _Alignas(HS_LINE) _Atomic uint64_t arrive;
    /* The futex word: bumped (then woken, when someone sleeps) by the
     * arrival that completes a phase and by a broadcast's root. */
    _Alignas(HS_LINE) _Atomic uint32_t gen;
    _Alignas(HS_LINE) _Atomic uint32_t sleepers;
    /* Set once, by the first rank that leaves the segment's protocol: the
     * rank to blame + 1 in the low 24 bits, why (HS_LEFT, HS_GONE,
     * HS_LATE) in the high 8; the others stop waiting at once and say it. */
    _Alignas(HS_LINE) _Atomic uint32_t broken;
} hsHeader;

typedef struct {
    _Alignas(HS_LINE) _Atomic uint64_t phase; /* the last phase this rank arrived at */
    int32_t pid;                /* as the rank sees itself */
    uint32_t pad;
    uint64_t pidns;             /* inode of its pid namespace: its pid means
                                 * something here only when it equals ours */
} hsLine;

_Static_assert(sizeof(hsHeader) <= HS_PAGE, "the header fits its page");
_Static_assert(sizeof(hsLine) == HS_LINE, "one cache line per rank");

struct geoHostSeg {
    char *base;
    size_t size;
    hsHeader *hdr;
    hsLine *lines;
    char *data;
    int n, me;
    size_t slot;                /* bytes per rank and buffer */
    uint64_t phase;             /* the last phase this rank began */
    uint64_t complete;          /* the highest phase known complete */
    int spins;                  /* waiting policy: pause loops, then yields for */
    double yield_s;             /* this long, then the futex */
    uint64_t pidns;
    int mode;                   /* GEOCCL_HOST_COLL agreed: 1 auto, 2 every size */
    geoHostSegCal cal;
};
typedef struct geoHostSeg geoHostSeg;

/* Bytes of the segment for n ranks with slot bytes each (0: too large). */
size_t hsSegmentSize(int n, size_t slot);
/* The slot for n ranks: the same on every rank. */
size_t hsSlotBytes(int n);
/* Point hs's views at a mapping of `size` bytes. */
void hsViews(geoHostSeg *hs, void *base, size_t size);

/* Buffer b (a phase's parity) slot j. */
static inline char *hsSlot(const geoHostSeg *hs, uint64_t phase, int j)
{
    return hs->data + ((size_t)(phase & 1) * (size_t)hs->n + (size_t)j) * hs->slot;
}

/* Measure what geoHostSegChoose needs (hostseg_model.c) and set the
 * waiting policy; collective over the segment (and ranks 0 and 1 over the
 * transport). */
ncclResult_t hsCalibrate(struct ncclComm *comm, geoHostSeg *hs);

/* Start the next phase: wait until the previous one is complete (the
 * buffer about to be written was read by everyone), then *p = its number. */
ncclResult_t hsBegin(struct ncclComm *comm, geoHostSeg *hs, uint64_t *p);
/* Arrive at phase p (my data of p is written, my reads of p - 1 are
 * done).  wake: wake sleepers even when the phase is not complete yet
 * (someone waits for this rank alone: a broadcast's root). */
void hsArrive(geoHostSeg *hs, uint64_t p, int wake);
/* Wait until every rank arrived at p (rank < 0) or rank `rank` did. */
ncclResult_t hsWait(struct ncclComm *comm, geoHostSeg *hs, uint64_t p, int rank);
/* Leave the protocol: tell the others to stop waiting, blaming rank
 * `blame` for `why` (HS_LEFT: an error or abort at blame itself; HS_GONE:
 * its process ended; HS_LATE: it did not arrive within GEOCCL_TIMEOUT). */
enum { HS_LEFT = 1, HS_GONE = 2, HS_LATE = 3 };
void hsBreak(geoHostSeg *hs, int blame, int why);

#endif
