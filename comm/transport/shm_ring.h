/* Single-producer/single-consumer byte rings in shared memory, for the
 * same-host fast path of the TCP transport (net_tcp_rings.c).
 *
 * A segment is an anonymous memfd (never a name anyone else could open)
 * holding two rings, one per direction of a connection: the connector
 * creates it and hands the descriptor to the acceptor over their AF_UNIX
 * socket (SCM_RIGHTS), after the HMAC handshake.  Its size is sealed
 * (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL) before it is handed over, so
 * neither end can ever shrink it under the other's mapping.  Each ring is a power-of-
 * two array of bytes with two free-running 64-bit counters on their own
 * cache lines: head (bytes written, stored only by the producer with
 * release order) and tail (bytes read, stored only by the consumer with
 * release order); each side loads the other's counter with acquire order,
 * so the bytes it then copies are the ones the other side wrote.  Nothing
 * in a ring is trusted beyond that: the frames written into it carry the
 * same checked headers as on a socket, and a counter that claims more than
 * the capacity reads as a broken peer (see geoShmRingRead).
 *
 * Waking the other side is not the ring's business: net_tcp_rings.c sends a
 * one-byte doorbell on the socket after it moved bytes.
 *
 * The segment also holds a mailbox per direction: one small message (up to
 * GEO_SHM_MAIL_BYTES) at a time, which the threads at both ends put and
 * take themselves, waiting on futex words in the segment.  It carries the
 * region's signals (cma.h) with one wake-up, where a message goes through
 * both ends' progress threads and the doorbell (four). */
#ifndef GEOCCL_SHM_RING_H_
#define GEOCCL_SHM_RING_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define GEO_SHM_MAIL_BYTES 48

/* The largest capacity of one ring (1 GiB).  net_tcp_rings.c makes rings of a
 * few MiB; the limit is far above that, and low enough that the size of a
 * segment (4 KiB + 2 x capacity) cannot wrap even in a 32-bit size_t.  A
 * capacity read from a peer's header is checked against it before any
 * arithmetic: unchecked, 1 << 63 makes the size wrap to 4 KiB, so a 4 KiB
 * memfd would pass for a segment whose rings lie outside the mapping. */
#define GEO_SHM_MAX_CAPACITY ((uint64_t)1 << 30)

/* One direction, as seen by this process. */
typedef struct {
    struct geoShmRingCtl *ctl; /* head/tail in the shared segment */
    char *data;                /* capacity bytes */
    uint64_t capacity;         /* a power of two, at most GEO_SHM_MAX_CAPACITY;
                                * this process's copy, never the header's */
} geoShmRing;

/* Bytes to map for a segment of two rings of capacity bytes each; 0 when
 * capacity is zero, not a power of two or above GEO_SHM_MAX_CAPACITY. */
size_t geoShmSegmentSize(uint64_t capacity);
/* Create a segment (memfd, sized, sealed against resizing, mapped, header
 * written).  0: [out] fd
 * (close-on-exec; to be passed to the peer, then closed) and base (the
 * mapping, geoShmSegmentSize bytes); -1: cause in errno, nothing left
 * (EINVAL: capacity not one geoShmSegmentSize accepts). */
int geoShmSegmentCreate(uint64_t capacity, int *fd, void **base);
/* Map a segment received from the peer and check its header.  The header
 * is read once; the capacity returned is the only one to use afterwards
 * (the peer may rewrite the header at any time).  0: [out] base and
 * capacity; -1: errno (EINVAL: not a segment of ours: not a memfd, not
 * sealed against shrinking and growing, too small or larger than any
 * segment can be, wrong magic, size not that of its capacity;
 * EPROTO: the header's capacity is zero, not a power of two or above
 * GEO_SHM_MAX_CAPACITY, a broken or hostile peer). */
int geoShmSegmentMap(int fd, void **base, uint64_t *capacity);
void geoShmSegmentUnmap(void *base, uint64_t capacity);
/* Ring i (0: connector to acceptor, 1: back) of a mapped segment. */
void geoShmSegmentRing(void *base, uint64_t capacity, int i, geoShmRing *ring);

/* Producer: copy as much of iov[0..n) as there is room for.  Returns the
 * bytes written (0: full). */
size_t geoShmRingWrite(geoShmRing *r, const struct iovec *iov, int n);
/* Mailbox i (0: connector to acceptor, 1: back) of a mapped segment. */
typedef struct geoShmMailbox geoShmMailbox;
geoShmMailbox *geoShmSegmentMailbox(void *base, int i);
/* Producer: post len (<= GEO_SHM_MAIL_BYTES) bytes and wake the consumer.
 * 1: posted; 0: the previous message is still there (or len too big). */
int geoShmMailPut(geoShmMailbox *b, const void *buf, size_t len);
/* Consumer: take the message, which must be len bytes.  1: taken; 0: none
 * yet; -1: counters or length impossible (a corrupt or hostile peer). */
int geoShmMailTake(geoShmMailbox *b, void *buf, size_t len);
/* Sleep until a put (put = 1) or a take (0) may succeed, at most ms. */
void geoShmMailWait(geoShmMailbox *b, int put, int ms);

/* Consumer: copy up to len bytes.  Returns the bytes read (0: empty);
 * (size_t)-1 when the producer's counter is impossible (more than the
 * capacity ahead: a corrupt or hostile peer). */
size_t geoShmRingRead(geoShmRing *r, void *dst, size_t len);

#endif
