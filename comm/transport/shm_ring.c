/* SPSC byte rings in a shared memfd; see shm_ring.h. */
#include "config.h"
#include "comm/transport/shm_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define GEO_SHM_MAGIC 0x47454f52494e4731ULL /* "GEORING1" */
#define GEO_CACHELINE 64

struct geoShmRingCtl {
    _Alignas(GEO_CACHELINE) _Atomic uint64_t head; /* producer's */
    _Alignas(GEO_CACHELINE) _Atomic uint64_t tail; /* consumer's */
};

/* One direction's mailbox: posted and taken count messages (the futex
 * words: shared, so the futex key is the memfd's page, not an address). */
struct geoShmMailbox {
    _Alignas(GEO_CACHELINE) _Atomic uint32_t posted; /* producer's */
    uint32_t len;
    unsigned char data[GEO_SHM_MAIL_BYTES];
    _Alignas(GEO_CACHELINE) _Atomic uint32_t taken;  /* consumer's */
};

/* Segment: header, two controls, two mailboxes, then the two data arrays
 * (page aligned). */
typedef struct {
    /* Written once by the creator; the mapping side loads each once (the
     * peer may change them at any time after) and keeps its own copy. */
    _Alignas(GEO_CACHELINE) _Atomic uint64_t magic;
    _Atomic uint64_t capacity;
    struct geoShmRingCtl ctl[2];
    struct geoShmMailbox mail[2];
} geoShmHeader;

#define GEO_SHM_DATA_OFF 4096

/* What a segment's size must be sealed with before the mapping side trusts
 * it: without these the peer could shrink the memfd under our mapping (a
 * SIGBUS on the next access) at any time.  Seals are never removed, so once
 * seen they hold for as long as the memfd lives.  F_SEAL_SEAL, which the
 * creator adds as well, is not required: no seal added later can hurt a
 * mapping that exists (F_SEAL_WRITE cannot be added while there is a
 * writable shared mapping; F_SEAL_FUTURE_WRITE spares existing ones). */
#define GEO_SHM_SIZE_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

/* Every capacity, ours or a peer's, is judged here before any arithmetic
 * on it. */
static int capacity_ok(uint64_t capacity)
{
    return capacity != 0 && capacity <= GEO_SHM_MAX_CAPACITY &&
           (capacity & (capacity - 1)) == 0;
}

size_t geoShmSegmentSize(uint64_t capacity)
{
    _Static_assert(GEO_SHM_DATA_OFF + 2 * GEO_SHM_MAX_CAPACITY <= SIZE_MAX,
                   "the largest segment's size fits a size_t");
    if (!capacity_ok(capacity))
        return 0;
    return GEO_SHM_DATA_OFF + 2 * (size_t)capacity;
}

int geoShmSegmentCreate(uint64_t capacity, int *fd, void **base)
{
    _Static_assert(sizeof(geoShmHeader) <= GEO_SHM_DATA_OFF, "header fits its page");
    size_t size = geoShmSegmentSize(capacity);
    int err, f;
    if (size == 0) {
        errno = EINVAL;
        return -1;
    }
    f = memfd_create("geoccl-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (f < 0)
        return -1;
    /* Sized, then sealed for good: the peer that maps it can count on the
     * size (geoShmSegmentMap refuses a segment without these seals).  Not
     * F_SEAL_WRITE: both ends write to it. */
    if (ftruncate(f, (off_t)size) != 0 ||
        fcntl(f, F_ADD_SEALS, GEO_SHM_SIZE_SEALS | F_SEAL_SEAL) != 0)
        goto err_close;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (p == MAP_FAILED)
        goto err_close;
    geoShmHeader *h = p;
    atomic_init(&h->magic, GEO_SHM_MAGIC);
    atomic_init(&h->capacity, capacity);
    for (int i = 0; i < 2; i++) {
        atomic_init(&h->ctl[i].head, 0);
        atomic_init(&h->ctl[i].tail, 0);
        atomic_init(&h->mail[i].posted, 0);
        atomic_init(&h->mail[i].taken, 0);
    }
    *fd = f;
    *base = p;
    return 0;
err_close:
    err = errno;
    close(f);
    errno = err;
    return -1;
}

int geoShmSegmentMap(int fd, void **base, uint64_t *capacity)
{
    struct stat sb;
    /* The seals first: the size is worth checking only once it cannot
     * change.  F_GET_SEALS fails with EINVAL on anything but a memfd. */
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        return -1;
    if ((seals & GEO_SHM_SIZE_SEALS) != GEO_SHM_SIZE_SEALS) {
        errno = EINVAL; /* ours are always sealed */
        return -1;
    }
    if (fstat(fd, &sb) != 0)
        return -1;
    /* No larger than the largest segment: a peer's sparse memfd of any
     * size would otherwise take as much address space. */
    if (sb.st_size < GEO_SHM_DATA_OFF ||
        (uint64_t)sb.st_size > geoShmSegmentSize(GEO_SHM_MAX_CAPACITY)) {
        errno = EINVAL;
        return -1;
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -1;
    geoShmHeader *h = p;
    /* Loaded once each: the peer can rewrite them while we look, and only
     * these local copies are checked and used from here on. */
    uint64_t magic = atomic_load_explicit(&h->magic, memory_order_relaxed);
    uint64_t cap = atomic_load_explicit(&h->capacity, memory_order_relaxed);
    int err = 0;
    if (magic != GEO_SHM_MAGIC)
        err = EINVAL;
    else if (!capacity_ok(cap))
        err = EPROTO; /* before geoShmSegmentSize: 1 << 63 would wrap it to 4096 */
    else if (geoShmSegmentSize(cap) != (size_t)sb.st_size)
        err = EINVAL;
    if (err != 0) {
        munmap(p, (size_t)sb.st_size);
        errno = err;
        return -1;
    }
    *base = p;
    *capacity = cap;
    return 0;
}

void geoShmSegmentUnmap(void *base, uint64_t capacity)
{
    if (base != NULL)
        munmap(base, geoShmSegmentSize(capacity));
}

void geoShmSegmentRing(void *base, uint64_t capacity, int i, geoShmRing *ring)
{
    geoShmHeader *h = base;
    ring->ctl = &h->ctl[i];
    ring->data = (char *)base + GEO_SHM_DATA_OFF + (size_t)i * capacity;
    ring->capacity = capacity;
}

size_t geoShmRingWrite(geoShmRing *r, const struct iovec *iov, int n)
{
    uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
    uint64_t room = r->capacity - (head - tail), done = 0;

    if (head - tail > r->capacity) /* the consumer's counter is garbage */
        return 0;
    for (int i = 0; i < n && room > 0; i++) {
        const char *src = iov[i].iov_base;
        size_t len = iov[i].iov_len < room ? iov[i].iov_len : (size_t)room;
        size_t pos = (size_t)((head + done) & (r->capacity - 1));
        size_t first = len < r->capacity - pos ? len : (size_t)(r->capacity - pos);
        memcpy(r->data + pos, src, first);
        memcpy(r->data, src + first, len - first);
        done += len;
        room -= len;
        if (len < iov[i].iov_len)
            break;
    }
    if (done > 0)
        atomic_store_explicit(&r->ctl->head, head + done, memory_order_release);
    return (size_t)done;
}

size_t geoShmRingRead(geoShmRing *r, void *dst, size_t len)
{
    uint64_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
    uint64_t avail = head - tail;

    if (avail > r->capacity)
        return (size_t)-1;
    if (len > avail)
        len = (size_t)avail;
    if (len == 0)
        return 0;
    size_t pos = (size_t)(tail & (r->capacity - 1));
    size_t first = len < r->capacity - pos ? len : (size_t)(r->capacity - pos);
    memcpy(dst, r->data + pos, first);
    memcpy((char *)dst + first, r->data, len - first);
    atomic_store_explicit(&r->ctl->tail, tail + len, memory_order_release);
    return len;
}

geoShmMailbox *geoShmSegmentMailbox(void *base, int i)
{
    return &((geoShmHeader *)base)->mail[i];
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

int geoShmMailPut(geoShmMailbox *b, const void *buf, size_t len)
{
    uint32_t p = atomic_load_explicit(&b->posted, memory_order_relaxed);
    uint32_t t = atomic_load_explicit(&b->taken, memory_order_acquire);
    if (p != t || len > GEO_SHM_MAIL_BYTES)
        return 0;
    memcpy(b->data, buf, len);
    b->len = (uint32_t)len;
    atomic_store_explicit(&b->posted, p + 1, memory_order_release);
    futex_wake_all(&b->posted);
    return 1;
}

int geoShmMailTake(geoShmMailbox *b, void *buf, size_t len)
{
    uint32_t t = atomic_load_explicit(&b->taken, memory_order_relaxed);
    uint32_t p = atomic_load_explicit(&b->posted, memory_order_acquire);
    if (p == t)
        return 0;
    if (p != t + 1 || b->len != len)
        return -1;
    memcpy(buf, b->data, len);
    atomic_store_explicit(&b->taken, t + 1, memory_order_release);
    futex_wake_all(&b->taken);
    return 1;
}

void geoShmMailWait(geoShmMailbox *b, int put, int ms)
{
    /* Asleep only while the state is what made the caller wait: empty
     * (posted == taken) for a take, full (posted != taken) for a put. */
    _Atomic uint32_t *word = put ? &b->taken : &b->posted;
    uint32_t p = atomic_load_explicit(&b->posted, memory_order_acquire);
    uint32_t t = atomic_load_explicit(&b->taken, memory_order_acquire);
    if (put ? p == t : p != t)
        return;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    syscall(SYS_futex, word, FUTEX_WAIT, put ? t : p, &ts, NULL, 0);
}
