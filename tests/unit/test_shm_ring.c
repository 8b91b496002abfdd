/* The shared-memory rings of the same-host fast path (comm/transport/shm_ring.c):
 * writes and reads that wrap around the end, full and empty rings, a
 * segment that is not ours, counters a broken peer could leave, segments a
 * hostile peer could forge (a capacity whose size arithmetic wraps, a memfd
 * left unsealed so it could shrink under the mapping), and a producer and a consumer in two threads moving 64 MiB through a small ring
 * in odd-sized pieces, checked byte for byte; and the segment's mailboxes:
 * one message at a time each way, wrong lengths refused, two threads
 * passing numbered messages with futex waits. */
#include "config.h"
#include "comm/transport/shm_ring.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CAP 4096u

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_wrap_full_empty(void)
{
    int fd;
    void *base;
    geoShmRing tx, rx;
    char in[3000], out[3000];

    CU_ASSERT_FATAL(geoShmSegmentCreate(CAP, &fd, &base) == 0);
    close(fd);
    geoShmSegmentRing(base, CAP, 0, &tx);
    geoShmSegmentRing(base, CAP, 0, &rx);
    for (size_t i = 0; i < sizeof(in); i++)
        in[i] = (char)(i * 31 + 7);
    CU_ASSERT_EQUAL(geoShmRingRead(&rx, out, sizeof(out)), 0); /* empty */
    /* Move the counters near the end so the next write wraps. */
    struct iovec iov = {in, sizeof(in)};
    CU_ASSERT_EQUAL(geoShmRingWrite(&tx, &iov, 1), sizeof(in));
    CU_ASSERT_EQUAL(geoShmRingRead(&rx, out, sizeof(out)), sizeof(out));
    CU_ASSERT_EQUAL(memcmp(in, out, sizeof(in)), 0);
    /* Two pieces, the second wrapping around; then the ring is full. */
    struct iovec two[2] = {{in, 1000}, {in + 1000, 2000}};
    CU_ASSERT_EQUAL(geoShmRingWrite(&tx, two, 2), 3000);
    iov = (struct iovec){in, sizeof(in)};
    CU_ASSERT_EQUAL(geoShmRingWrite(&tx, &iov, 1), CAP - 3000); /* only what fits */
    CU_ASSERT_EQUAL(geoShmRingWrite(&tx, &iov, 1), 0);          /* full */
    memset(out, 0, sizeof(out));
    CU_ASSERT_EQUAL(geoShmRingRead(&rx, out, sizeof(out)), 3000);
    CU_ASSERT_EQUAL(memcmp(in, out, 3000), 0);
    CU_ASSERT_EQUAL(geoShmRingRead(&rx, out, sizeof(out)), CAP - 3000);
    CU_ASSERT_EQUAL(memcmp(in, out, CAP - 3000), 0);
    CU_ASSERT_EQUAL(geoShmRingRead(&rx, out, sizeof(out)), 0);
    geoShmSegmentUnmap(base, CAP);
}

/* A head more than the capacity ahead of the tail (a broken or hostile
 * peer) must read as an error, never as a huge copy. */
static void test_impossible_counters(void)
{
    int fd;
    void *base;
    geoShmRing tx, rx;
    char out[64];

    CU_ASSERT_FATAL(geoShmSegmentCreate(CAP, &fd, &base) == 0);
    close(fd);
    geoShmSegmentRing(base, CAP, 1, &tx);
    geoShmSegmentRing(base, CAP, 1, &rx);
    /* The controls are the only shared words besides the data: write a
     * head far ahead through the producer's view. */
    uint64_t *head = (uint64_t *)tx.ctl;
    *head = 10 * (uint64_t)CAP;
    CU_ASSERT_EQUAL(geoShmRingRead(&rx, out, sizeof(out)), (size_t)-1);
    struct iovec iov = {out, sizeof(out)};
    CU_ASSERT_EQUAL(geoShmRingWrite(&tx, &iov, 1), 0);
    geoShmSegmentUnmap(base, CAP);
}

static void test_foreign_segment_refused(void)
{
    void *base;
    uint64_t cap;
    /* Sealed like ours, so that the header is what refuses it. */
    int fd = memfd_create("not-a-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(ftruncate(fd, 3 * 4096), 0);
    CU_ASSERT_EQUAL(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    errno = 0;
    CU_ASSERT_EQUAL(geoShmSegmentMap(fd, &base, &cap), -1);
    CU_ASSERT_EQUAL(errno, EINVAL);
    close(fd);
    /* One of ours maps, with its capacity. */
    CU_ASSERT_FATAL(geoShmSegmentCreate(CAP, &fd, &base) == 0);
    void *peer;
    CU_ASSERT_EQUAL(geoShmSegmentMap(fd, &peer, &cap), 0);
    CU_ASSERT_EQUAL(cap, CAP);
    geoShmSegmentUnmap(peer, cap);
    geoShmSegmentUnmap(base, CAP);
    close(fd);
}

/* A memfd of size bytes whose first page is a real segment's header with
 * the capacity word replaced, as a hostile peer could make it.  The header
 * starts with two 64-bit words, the magic and then the capacity (shm_ring.c);
 * the rest of the page is copied as it is.  memfd_flags says whether the
 * memfd may be sealed at all, seals what is added after sizing it.
 * Returns the descriptor, or -1 after a failed assertion. */
static int forge_segment(size_t size, uint64_t cap, unsigned memfd_flags, int seals)
{
    static unsigned char page[4096];
    int fd;
    void *base;

    if (geoShmSegmentCreate(CAP, &fd, &base) != 0) {
        CU_FAIL("cannot create a segment to copy the header from");
        return -1;
    }
    close(fd);
    memcpy(page, base, sizeof(page));
    geoShmSegmentUnmap(base, CAP);
    memcpy(page + sizeof(uint64_t), &cap, sizeof(cap));
    fd = memfd_create("forged-ring", MFD_CLOEXEC | memfd_flags);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 ||
        pwrite(fd, page, sizeof(page), 0) != (ssize_t)sizeof(page) ||
        (seals != 0 && fcntl(fd, F_ADD_SEALS, seals) != 0)) {
        CU_FAIL("cannot forge a segment");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* A sealed 4 KiB memfd whose header claims a capacity that cannot be ours.
 * 1 << 63 is the dangerous one: 4096 + 2 * capacity wraps to 4096, the
 * size of the memfd, so a check of the size alone passes and the rings
 * would lie far outside the mapping.  Each must be refused as a broken
 * header (EPROTO) before any arithmetic on it, not mapped. */
static void test_forged_capacity_refused(void)
{
    const uint64_t bad[] = {(uint64_t)1 << 63, 0, 3 * 4096, 2 * (uint64_t)GEO_SHM_MAX_CAPACITY,
                            UINT64_MAX};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        void *base = NULL;
        uint64_t cap = 0;
        int fd = forge_segment(4096, bad[i], MFD_ALLOW_SEALING,
                               F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
        if (fd < 0)
            return;
        errno = 0;
        int rc = geoShmSegmentMap(fd, &base, &cap);
        CU_ASSERT_EQUAL(rc, -1);
        CU_ASSERT_EQUAL(errno, EPROTO);
        if (rc == 0)
            munmap(base, 4096); /* the memfd's size, whatever cap says */
        close(fd);
    }
}

/* A segment of the right size with a right header, but not sealed against
 * shrinking and growing: the peer could truncate it later and turn every
 * access into SIGBUS, so it is refused (EINVAL: ours are always sealed).
 * Shrink and grow seals without F_SEAL_SEAL are enough. */
static void test_unsealed_refused(void)
{
    const struct {
        unsigned memfd_flags;
        int seals;
    } bad[] = {{0, 0}, /* no sealing possible at all */
               {MFD_ALLOW_SEALING, 0},
               {MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_SEAL},
               {MFD_ALLOW_SEALING, F_SEAL_GROW | F_SEAL_SEAL}};
    size_t size = geoShmSegmentSize(CAP);
    void *base = NULL;
    uint64_t cap = 0;
    int fd;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if ((fd = forge_segment(size, CAP, bad[i].memfd_flags, bad[i].seals)) < 0)
            return;
        errno = 0;
        int rc = geoShmSegmentMap(fd, &base, &cap);
        CU_ASSERT_EQUAL(rc, -1);
        CU_ASSERT_EQUAL(errno, EINVAL);
        if (rc == 0)
            geoShmSegmentUnmap(base, cap);
        close(fd);
    }
    if ((fd = forge_segment(size, CAP, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW)) < 0)
        return;
    CU_ASSERT_EQUAL(geoShmSegmentMap(fd, &base, &cap), 0);
    CU_ASSERT_EQUAL(cap, CAP);
    geoShmSegmentUnmap(base, cap);
    close(fd);
}

/* Once mapped, a segment can never change size, not even by its creator,
 * and no one can add seals (F_SEAL_WRITE would stop the creator's own
 * writes); the creator still writes, and the mapping side sees it. */
static void test_segment_size_is_fixed(void)
{
    int fd;
    void *base, *peer;
    uint64_t cap;
    struct stat sb;

    CU_ASSERT_FATAL(geoShmSegmentCreate(CAP, &fd, &base) == 0);
    CU_ASSERT_FATAL(geoShmSegmentMap(fd, &peer, &cap) == 0);
    int seals = fcntl(fd, F_GET_SEALS);
    CU_ASSERT_EQUAL(seals, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    geoShmRing tx, rx;
    char out[5] = {0};
    geoShmSegmentRing(base, CAP, 0, &tx);
    geoShmSegmentRing(peer, cap, 0, &rx);
    struct iovec iov = {"hello", 5};
    CU_ASSERT_EQUAL(geoShmRingWrite(&tx, &iov, 1), 5);
    CU_ASSERT_EQUAL(geoShmRingRead(&rx, out, sizeof(out)), 5);
    CU_ASSERT_EQUAL(memcmp(out, "hello", 5), 0);
    errno = 0;
    CU_ASSERT_EQUAL(ftruncate(fd, 4096), -1);
    CU_ASSERT_EQUAL(errno, EPERM);
    errno = 0;
    CU_ASSERT_EQUAL(ftruncate(fd, 2 * (off_t)geoShmSegmentSize(CAP)), -1);
    CU_ASSERT_EQUAL(errno, EPERM);
    errno = 0;
    CU_ASSERT_EQUAL(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
    CU_ASSERT_EQUAL(errno, EPERM);
    CU_ASSERT_EQUAL(fstat(fd, &sb), 0);
    CU_ASSERT_EQUAL((size_t)sb.st_size, geoShmSegmentSize(CAP));
    /* Not touched again: on a memfd that did shrink, access is SIGBUS. */
    geoShmSegmentUnmap(peer, cap);
    geoShmSegmentUnmap(base, CAP);
    close(fd);
}

#define MOVE_BYTES ((size_t)64 << 20)

typedef struct {
    geoShmRing ring;
    const unsigned char *src;
    unsigned char *dst;
    volatile int stop; /* the consumer gave up */
} moveArg;

static void *producer(void *p)
{
    moveArg *a = p;
    size_t done = 0, piece = 1;
    while (done < MOVE_BYTES && !a->stop) {
        size_t len = piece < MOVE_BYTES - done ? piece : MOVE_BYTES - done;
        struct iovec iov[2] = {{(void *)(a->src + done), len / 3},
                               {(void *)(a->src + done + len / 3), len - len / 3}};
        size_t w = geoShmRingWrite(&a->ring, iov, 2);
        if (w == 0)
            sched_yield();
        done += w;
        piece = piece * 7 % 9973 + 1; /* odd sizes, up to about 2.4 x CAP */
    }
    return NULL;
}

static void test_two_threads(void)
{
    int fd;
    void *base;
    pthread_t t;
    moveArg a;
    unsigned char *src = malloc(MOVE_BYTES), *dst = malloc(MOVE_BYTES);
    CU_ASSERT_FATAL(src != NULL && dst != NULL);
    for (size_t i = 0; i < MOVE_BYTES; i++)
        src[i] = (unsigned char)((i * 2654435761u) >> 13);
    memset(dst, 0, MOVE_BYTES);
    CU_ASSERT_FATAL(geoShmSegmentCreate(CAP, &fd, &base) == 0);
    close(fd);
    geoShmSegmentRing(base, CAP, 0, &a.ring);
    a.src = src;
    a.dst = dst;
    a.stop = 0;
    pthread_create(&t, NULL, producer, &a);
    geoShmRing rx;
    geoShmSegmentRing(base, CAP, 0, &rx);
    size_t done = 0, piece = 5;
    while (done < MOVE_BYTES) {
        size_t len = piece < MOVE_BYTES - done ? piece : MOVE_BYTES - done;
        size_t got = geoShmRingRead(&rx, dst + done, len);
        if (got == (size_t)-1) {
            CU_FAIL("the ring's counters went impossible");
            a.stop = 1;
            break;
        }
        if (got == 0)
            sched_yield();
        done += got;
        piece = piece * 5 % 7919 + 1;
    }
    pthread_join(t, NULL);
    CU_ASSERT_EQUAL(memcmp(src, dst, MOVE_BYTES), 0);
    geoShmSegmentUnmap(base, CAP);
    free(src);
    free(dst);
}

static void test_mailbox(void)
{
    int fd;
    void *base;
    CU_ASSERT_FATAL(geoShmSegmentCreate(CAP, &fd, &base) == 0);
    close(fd);
    geoShmMailbox *to = geoShmSegmentMailbox(base, 0), *back = geoShmSegmentMailbox(base, 1);
    uint64_t v = 42, w = 0;
    char big[GEO_SHM_MAIL_BYTES + 1] = {0};
    CU_ASSERT_EQUAL(geoShmMailTake(to, &w, sizeof(w)), 0);      /* empty */
    CU_ASSERT_EQUAL(geoShmMailPut(to, big, sizeof(big)), 0);    /* too long */
    CU_ASSERT_EQUAL(geoShmMailPut(to, &v, sizeof(v)), 1);
    v = 43;
    CU_ASSERT_EQUAL(geoShmMailPut(to, &v, sizeof(v)), 0);       /* full */
    CU_ASSERT_EQUAL(geoShmMailTake(back, &w, sizeof(w)), 0);    /* the other way is apart */
    uint32_t small;
    CU_ASSERT_EQUAL(geoShmMailTake(to, &small, sizeof(small)), -1); /* not the length sent */
    CU_ASSERT_EQUAL(geoShmMailTake(to, &w, sizeof(w)), 1);
    CU_ASSERT_EQUAL(w, 42);
    CU_ASSERT_EQUAL(geoShmMailTake(to, &w, sizeof(w)), 0);
    CU_ASSERT_EQUAL(geoShmMailPut(to, &v, sizeof(v)), 1);
    CU_ASSERT_EQUAL(geoShmMailTake(to, &w, sizeof(w)), 1);
    CU_ASSERT_EQUAL(w, 43);
    /* a waiter on an empty mailbox sleeps its time out and comes back */
    double t0 = now_s();
    geoShmMailWait(to, 0, 30);
    CU_ASSERT(now_s() - t0 > 0.02);
    geoShmSegmentUnmap(base, CAP);
}

#define PINGS 20000
static void *ponger(void *p)
{
    void *base = p;
    geoShmMailbox *in = geoShmSegmentMailbox(base, 0), *out = geoShmSegmentMailbox(base, 1);
    for (uint64_t i = 0; i < PINGS; i++) {
        uint64_t got;
        int r;
        while ((r = geoShmMailTake(in, &got, sizeof(got))) == 0)
            geoShmMailWait(in, 0, 1000);
        if (r < 0 || got != i)
            return (void *)1;
        got = ~got;
        while (geoShmMailPut(out, &got, sizeof(got)) == 0)
            geoShmMailWait(out, 1, 1000);
    }
    return NULL;
}

static void test_mailbox_two_threads(void)
{
    int fd;
    void *base, *ret = (void *)1;
    pthread_t t;
    CU_ASSERT_FATAL(geoShmSegmentCreate(CAP, &fd, &base) == 0);
    close(fd);
    geoShmMailbox *out = geoShmSegmentMailbox(base, 0), *in = geoShmSegmentMailbox(base, 1);
    pthread_create(&t, NULL, ponger, base);
    int bad = 0;
    for (uint64_t i = 0; i < PINGS && !bad; i++) {
        uint64_t got;
        int r;
        while (geoShmMailPut(out, &i, sizeof(i)) == 0)
            geoShmMailWait(out, 1, 1000);
        while ((r = geoShmMailTake(in, &got, sizeof(got))) == 0)
            geoShmMailWait(in, 0, 1000);
        bad = r < 0 || got != ~i;
    }
    CU_ASSERT_FALSE(bad);
    pthread_join(t, &ret);
    CU_ASSERT_PTR_NULL(ret);
    geoShmSegmentUnmap(base, CAP);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return CU_get_error();
    CU_pSuite s = CU_add_suite("shm_ring", NULL, NULL);
    CU_add_test(s, "writes and reads wrap around; full and empty", test_wrap_full_empty);
    CU_add_test(s, "impossible counters are an error", test_impossible_counters);
    CU_add_test(s, "a memfd that is not a ring segment is refused", test_foreign_segment_refused);
    CU_add_test(s, "a header whose capacity is impossible is refused", test_forged_capacity_refused);
    CU_add_test(s, "a memfd not sealed against resizing is refused", test_unsealed_refused);
    CU_add_test(s, "a mapped segment cannot shrink or grow", test_segment_size_is_fixed);
    CU_add_test(s, "64 MiB through a 4 KiB ring, two threads, odd pieces", test_two_threads);
    CU_add_test(s, "mailbox: one message each way, full, empty, wrong length", test_mailbox);
    CU_add_test(s, "mailbox: 20000 round trips between two threads", test_mailbox_two_threads);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
