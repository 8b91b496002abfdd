/* Transports between ranks.  A transport is a table of function pointers;
 * geoNetTransports[] lists them in order of preference and the first whose
 * canConnect() says yes carries the communicator (TCP always can; ibverbs
 * joins here later).
 *
 * Matching rule: messages between two ranks are matched in the order they
 * were posted, separately per direction: the k-th send posted from A to B
 * meets the k-th receive posted on B from A, and both must have the same
 * size (a mismatch is a malformed-frame error, not silent truncation).
 * Zero-byte messages are never posted, except variable-length ones: a
 * variable-length send (vlen) meets a variable-length receive whose buffer
 * is at least as large; the receive learns the size from the first frame
 * (compressed chunks whose size only the sender knows). */
#ifndef GEOCCL_TRANSPORT_H_
#define GEOCCL_TRANSPORT_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "comm/transport/tcp_info.h"
#include "comm/base/error.h"
#include "comm/transport/net_local.h"
#include "comm/transport/socket.h"

#define GEO_NET_HOST_LEN 64

/* Where a rank's transport listens: what peers need to connect to it. */
typedef struct {
    geoSockAddr addr;           /* TCP: every peer can use it */
    geoLocalInfo local;         /* same-host fast path (net_local.h); local.path
                                 * "" when this rank offers none */
} geoNetAddr;

/* Where a peer listens and what to call it in messages. */
typedef struct {
    geoSockAddr addr;
    geoLocalInfo local;
    char host[GEO_NET_HOST_LEN];
} geoNetPeer;

/* What a transport knows of the communicator it serves; the communicator
 * fills it and keeps it alive as long as the transport's state.  The
 * transport reports errors through err and reads its abort flag; it never
 * sees the communicator itself. */
typedef struct {
    int rank, nranks;
    int nstreams;               /* connections per pair of ranks */
    double timeout;             /* seconds without progress before an error */
    const uint8_t *secret;      /* GEO_SHA256_BYTES; proves membership on connect */
    uint64_t comm_hash;         /* binds a connection to its communicator */
    geoNetPeer *peers;          /* [nranks]: set before connect() */
    geoErr *err;                /* error text, abort flag, operation in progress */
    const uint8_t *encrypt;     /* [nranks]: 1 where connections to that peer carry
                                 * authenticated, encrypted frames; set before connect()
                                 * alike at both ends (NULL: none) */
    int cipher;                 /* the cipher this rank prefers (crypto.h) */
    uint8_t *failed;            /* [nranks] or NULL: the transport stores 1 (atomic
                                 * byte) for the peer whose loss broke it: gone,
                                 * closed, reset past resuming, or silent past the
                                 * timeout (geocclCommGetFailedRanks reads it) */
    /* Set by connect(): */
    int cipher_used;            /* cipher of the encrypted connections; 0: none */
    int local_peers;            /* peers reached over the same-host fast path */
    int ring_peers;             /* of those, with shared-memory rings on every stream */
} geoNetCtx;

enum { GEO_NET_SEND = 0, GEO_NET_RECV = 1 };

/* One posted message.  Owned by the caller, who must keep it (and its
 * buffer) alive until wait() returns for it. */
typedef struct geoNetRequest {
    struct geoNetRequest *next; /* transport's queue link */
    int peer;
    int dir;                    /* GEO_NET_SEND / GEO_NET_RECV */
    char *buf;
    size_t size;                /* bytes; a vlen receive: the size that arrived */
    size_t capacity;            /* vlen receive: room in buf */
    int vlen;                   /* variable-length message (see above) */
    uint64_t seq;               /* set by post(): per (peer, dir) order */
    int streams;                /* set by post(): connections it spreads over */
    size_t nframes;
    size_t frames_done;
    int done;                   /* 1 once complete or failed */
    ncclResult_t result;
    double last_progress;       /* geoNow() of the last byte moved */
} geoNetRequest;

typedef struct geoNetTransport {
    const char *name;
    /* 1 if this transport can connect every pair of comm's ranks. */
    int (*canConnect)(geoNetCtx *ctx);
    /* Open this rank's listeners before the bootstrap exchange.  On entry
     * listen_addr->addr is the interface address to bind (port 0: any); on
     * success it holds what peers must use (bound TCP address and, if
     * offered, the same-host listener). */
    ncclResult_t (*listen)(geoNetCtx *ctx, void **state, geoNetAddr *listen_addr);
    /* Connect to every peer (addresses in ctx->peers) and start the
     * progress thread.  Collective; bounded by ctx->timeout. */
    ncclResult_t (*connect)(geoNetCtx *ctx, void *state);
    /* Queue req; never blocks on the network.  Fails at once with the
     * communicator's error if it is broken. */
    ncclResult_t (*post)(void *state, geoNetRequest *req);
    /* Block until req completes, the communicator breaks, it is aborted,
     * or no byte of req moved for ctx->timeout seconds (then the
     * communicator is broken with a message naming peer and operation). */
    ncclResult_t (*wait)(void *state, geoNetRequest *req);
    /* Fail everything in flight and shut the connections (peers see it at
     * once).  Any thread; idempotent. */
    void (*breakAll)(void *state);
    /* Stop the progress thread, close and free.  Local. */
    void (*destroy)(void *state);
    /* Optional (may be NULL): bound the bytes queued in the kernel but not
     * yet sent on every connection (0: the system's default).  The probe
     * sets it while it measures, so that what is queued when a transfer
     * stops drains quickly. */
    void (*limitQueued)(void *state, int bytes);
    /* Optional (may be NULL): messages to and from peer posted from now on
     * use only the first n of the pair's connections (1..connected; all of
     * them until set).  Both ends must set the same n at the same point of
     * their message sequence with that peer: the probe does it at its end,
     * where every message between every pair has been matched. */
    void (*setStreams)(void *state, int peer, int n);
    /* Optional (may be NULL): a mailbox per pair of same-host ranks, one
     * message of at most GEO_NET_MAIL_BYTES at a time each way, outside
     * the ordered stream above, put and taken by the calling threads
     * themselves (no progress thread in between).  hasMailbox: whether
     * the pair has one (the same answer at both ends).  mail: put (send)
     * or take len bytes, waiting while the previous message is still
     * there or none has come; fails like wait (broken, aborted, the peer
     * gone, or ctx->timeout). */
    int (*hasMailbox)(void *state, int peer);
    ncclResult_t (*mail)(void *state, int peer, void *buf, size_t len, int send);
    /* Optional (may be NULL): the process id of peer as the kernel vouches
     * for it (SO_PEERCRED of the pair's same-host sockets, all streams
     * agreeing), in this process's pid namespace; 0 when the pair has no
     * same-host socket or the streams disagree.  What a peer says of its
     * own pid is never used for access to memory. */
    int (*peerPid)(void *state, int peer);
    /* Optional (may be NULL): the kernel's counters of the network
     * connections to peer (same-host ones left out), summed; 0, or -1 when
     * the pair has none or the kernel counts nothing. */
    int (*linkStats)(void *state, int peer, geoLinkStats *out);
    /* Optional: connections to peer resumed after a reset, and payload
     * bytes sent to it again because of them; 0, or -1 (no such peer). */
    int (*resumeStats)(void *state, int peer, uint64_t *reconnects, uint64_t *resent);
} geoNetTransport;

#define GEO_NET_MAIL_BYTES 48

extern const geoNetTransport geoNetTcp;
extern const geoNetTransport *const geoNetTransports[];

/* A message crosses a pair's connections in pieces of this many bytes,
 * each piece on the next connection (net_tcp_frame.c's frames). */
#define GEO_NET_STRIPE_BYTES (256 * 1024)

/* Bytes the wrappers below sent, by where they went. */
typedef struct {
    uint64_t intra;             /* to ranks of my region */
    uint64_t wan;               /* to ranks of other regions */
    uint64_t wan_raw;           /* what that would have been uncompressed */
    uint64_t wan_msgs;          /* messages to ranks of other regions */
} geoNetBytes;

/* A communicator's transport as the layers above use it. */
typedef struct geoNet {
    const geoNetTransport *ops; /* NULL until one is chosen */
    void *state;                /* ops's, NULL until listen() */
    geoNetCtx ctx;
    const int *region_of;       /* [nranks] region of each rank; NULL: one region */
    geoNetBytes sent;
} geoNet;

/* Posting wrappers on net's transport; a zero-byte fixed-size message is
 * complete at once and never posted. */
ncclResult_t geoNetIsend(geoNet *net, int peer, const void *buf, size_t size,
                         geoNetRequest *req);
ncclResult_t geoNetIrecv(geoNet *net, int peer, void *buf, size_t size, geoNetRequest *req);
/* A control message (buffer addresses, flags): like geoNetIsend, but not
 * counted in the byte statistics, which count the collectives' data. */
ncclResult_t geoNetIsendCtl(geoNet *net, int peer, const void *buf, size_t size,
                            geoNetRequest *req);
/* Variable-length messages (both sides must use these for a message). */
ncclResult_t geoNetIsendV(geoNet *net, int peer, const void *buf, size_t size,
                          geoNetRequest *req);
ncclResult_t geoNetIrecvV(geoNet *net, int peer, void *buf, size_t capacity,
                          geoNetRequest *req);
/* Wait; a NULL-size request (never posted) returns at once. */
ncclResult_t geoNetWait(geoNet *net, geoNetRequest *req);
/* Fail everything in flight (breakAll), when a transport is up. */
void geoNetBreak(geoNet *net);

#endif
