/* The host segment's phases: arriving, waiting and noticing that a peer
 * is gone (hostseg_internal.h).
 *
 * Waiting must behave with more ranks than CPUs (256 ranks on 2 cores): a
 * rank that spins holds a CPU that the rank it waits for needs.  So a wait
 * spins only where every rank of the host has a CPU of its own, yields the
 * CPU for a short while after that (the rank it waits for may be
 * runnable, and a yield hands it the CPU without a sleep and a wake-up),
 * then sleeps on the segment's futex word, which the arrival that
 * completes a phase wakes.  The sleep has a short timeout so that the wait
 * checks, every 100 ms, the abort flag, the communicator's error, the
 * segment's broken word, whether the ranks it waits for still exist, and
 * the deadline (GEOCCL_TIMEOUT without an arrival). */
#define _GNU_SOURCE
#include "config.h"
#include "comm/intra/hostseg_internal.h"
#include "comm/base/checks.h"
#include "comm/core/comm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define HS_SLEEP_MS 100
#define HS_LIVENESS_S 0.5

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int ready(const geoHostSeg *hs, uint64_t p, int rank)
{
    if (rank >= 0)
        return atomic_load_explicit(&hs->lines[rank].phase, memory_order_acquire) >= p;
    return atomic_load_explicit(&hs->hdr->arrive, memory_order_acquire) >= (uint64_t)hs->n * p;
}

void hsArrive(geoHostSeg *hs, uint64_t p, int wake)
{
    hsHeader *h = hs->hdr;
    atomic_store_explicit(&hs->lines[hs->me].phase, p, memory_order_release);
    uint64_t old = atomic_fetch_add_explicit(&h->arrive, 1, memory_order_acq_rel);
    if (old + 1 == (uint64_t)hs->n * p) {
        hs->complete = p;
        wake = 1;
    }
    if (wake) {
        atomic_fetch_add_explicit(&h->gen, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&h->sleepers, memory_order_seq_cst) > 0)
            futex_wake_all(&h->gen);
    }
}

void hsBreak(geoHostSeg *hs, int blame, int why)
{
    uint32_t none = 0, word = ((uint32_t)why << 24) | (((uint32_t)blame + 1) & 0xffffffu);
    atomic_compare_exchange_strong(&hs->hdr->broken, &none, word);
    atomic_fetch_add_explicit(&hs->hdr->gen, 1, memory_order_seq_cst);
    futex_wake_all(&hs->hdr->gen);
}

void geoHostSegBreak(struct ncclComm *comm)
{
    if (comm->hostseg != NULL)
        hsBreak(comm->hostseg, comm->hostseg->me, HS_LEFT);
}

/* 1 when rank j's process is known to be gone: its pid means something
 * in our pid namespace and /proc says it no longer runs (no entry, or a
 * zombie its parent has not reaped yet). */
static int peer_gone(const geoHostSeg *hs, int j)
{
    const hsLine *l = &hs->lines[j];
    if (l->pid <= 0 || l->pidns == 0 || l->pidns != hs->pidns)
        return 0;
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)l->pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH;
    ssize_t r = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (r <= 0)
        return 0;
    buf[r] = '\0';
    const char *s = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    return s != NULL && s[1] == ' ' && (s[2] == 'Z' || s[2] == 'X');
}

/* The first rank that has not arrived at p (of those awaited), or -1. */
static int laggard(const geoHostSeg *hs, uint64_t p, int rank)
{
    for (int j = rank >= 0 ? rank : 0; j < (rank >= 0 ? rank + 1 : hs->n); j++)
        if (atomic_load_explicit(&hs->lines[j].phase, memory_order_acquire) < p)
            return j;
    return -1;
}

/* Why the wait cannot go on, or ncclSuccess. */
static ncclResult_t check_wait(struct ncclComm *comm, geoHostSeg *hs, uint64_t p, int rank,
                               double since, double waited)
{
    if (geoErrAborted(&comm->err))
        return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: the communicator was aborted",
                            geoErrOp(&comm->err));
    ncclResult_t broken = geoCommAsyncError(comm);
    if (broken != ncclSuccess && broken != ncclInProgress)
        return broken;
    uint32_t word = atomic_load_explicit(&hs->hdr->broken, memory_order_acquire);
    int who = (int)(word & 0xffffffu) - 1, why = (int)(word >> 24);
    if (word != 0 && !(who == hs->me && why == HS_LEFT)) {
        if (who == hs->me)
            return GEO_COMM_ERR(comm, ncclRemoteError, "%s: the other ranks gave up waiting "
                                "for this one in the host segment (stopped for longer than "
                                "GEOCCL_TIMEOUT?)", geoErrOp(&comm->err));
        if (why == HS_GONE)
            return GEO_COMM_ERR(comm, ncclRemoteError, "%s: rank %d (this host) is gone: its "
                                "process ended during a collective in the host segment",
                                geoErrOp(&comm->err), who);
        if (why == HS_LATE)
            return GEO_COMM_ERR(comm, ncclRemoteError, "%s: rank %d (this host) did not arrive "
                                "in the host segment within GEOCCL_TIMEOUT: stopped, stuck or "
                                "not in this collective", geoErrOp(&comm->err), who);
        return GEO_COMM_ERR(comm, ncclRemoteError, "%s: rank %d left the collective (an error "
                            "or an abort there; its log says which) while this rank waited in "
                            "the host segment", geoErrOp(&comm->err), who);
    }
    /* /proc is read only once a wait is long: each laggard costs a file. */
    for (int j = rank >= 0 ? rank : 0; waited >= HS_LIVENESS_S &&
                                       j < (rank >= 0 ? rank + 1 : hs->n); j++)
        if (atomic_load_explicit(&hs->lines[j].phase, memory_order_acquire) < p &&
            peer_gone(hs, j)) {
            hsBreak(hs, j, HS_GONE);
            return GEO_COMM_ERR(comm, ncclRemoteError, "%s: rank %d (pid %d, this host) is "
                                "gone: its process ended while this rank waited for it in the "
                                "host segment", geoErrOp(&comm->err), j, (int)hs->lines[j].pid);
        }
    if (geoNow() - since > comm->timeout) {
        int j = laggard(hs, p, rank);
        if (j < 0)
            return ncclSuccess; /* all arrived since the last look */
        hsBreak(hs, j, HS_LATE);
        return GEO_COMM_ERR(comm, ncclRemoteError, "%s: rank %d (pid %d, this host) did not "
                            "arrive in the host segment within %.0f s (GEOCCL_TIMEOUT): stopped, "
                            "stuck or not in this collective", geoErrOp(&comm->err), j,
                            j >= 0 ? (int)hs->lines[j].pid : -1, comm->timeout);
    }
    return ncclSuccess;
}

ncclResult_t hsWait(struct ncclComm *comm, geoHostSeg *hs, uint64_t p, int rank)
{
    hsHeader *h = hs->hdr;
    if (rank < 0 && hs->complete >= p)
        return ncclSuccess;
    for (int i = 0; i < hs->spins; i++) {
        if (ready(hs, p, rank))
            goto done;
        cpu_relax();
    }
    if (hs->yield_s > 0) {
        double t0 = geoNow();
        do {
            for (int i = 0; i < 8; i++) {
                if (ready(hs, p, rank))
                    goto done;
                sched_yield();
            }
        } while (geoNow() - t0 < hs->yield_s);
    }
    double since = geoNow(), start = since, checked = since;
    uint64_t seen = atomic_load_explicit(&h->arrive, memory_order_relaxed);
    for (;;) {
        atomic_fetch_add_explicit(&h->sleepers, 1, memory_order_seq_cst);
        uint32_t g = atomic_load_explicit(&h->gen, memory_order_seq_cst);
        if (ready(hs, p, rank)) {
            atomic_fetch_sub_explicit(&h->sleepers, 1, memory_order_relaxed);
            goto done;
        }
        struct timespec ts = {0, HS_SLEEP_MS * 1000000L};
        syscall(SYS_futex, &h->gen, FUTEX_WAIT, g, &ts, NULL, 0);
        atomic_fetch_sub_explicit(&h->sleepers, 1, memory_order_relaxed);
        if (ready(hs, p, rank))
            goto done;
        uint64_t now_arr = atomic_load_explicit(&h->arrive, memory_order_relaxed);
        if (now_arr != seen) { /* someone arrived: progress */
            seen = now_arr;
            since = geoNow();
        }
        double now = geoNow();
        if (now - checked < HS_SLEEP_MS * 1e-3 &&
            atomic_load_explicit(&h->broken, memory_order_relaxed) == 0)
            continue; /* woken for another phase's sake: checked recently */
        checked = now;
        ncclResult_t res = check_wait(comm, hs, p, rank, since, now - start);
        if (res != ncclSuccess) {
            hsBreak(hs, hs->me, HS_LEFT); /* when no cause was set yet */
            return res;
        }
    }
done:
    if (rank < 0)
        hs->complete = p;
    return ncclSuccess;
}

ncclResult_t hsBegin(struct ncclComm *comm, geoHostSeg *hs, uint64_t *p)
{
    if (hs->phase > 0)
        GEO_CHECK(hsWait(comm, hs, hs->phase, -1));
    *p = ++hs->phase;
    return ncclSuccess;
}
