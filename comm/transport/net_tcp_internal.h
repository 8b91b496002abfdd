/* The TCP transport's protocol, its state and the functions its files share.
 * Internal to comm/transport/net_tcp*.c; the rest of the library sees only
 * the geoNetTcp table (transport.h) and net_tcp_tune.h.
 *
 * The files, one concern each:
 *   net_tcp.c            the table: listen, connect, post, wait, break,
 *                        destroy, per-peer queries; breaking the communicator
 *   net_tcp_frame.c      frames: cutting messages, the send and receive
 *                        progress of one connection, acks
 *   net_tcp_handshake.c  one connection's handshake, both roles: hello MAC,
 *                        per-connection keys
 *   net_tcp_setup.c      opening every connection at init in one poll loop,
 *                        the table of accepted, unproven handshakes
 *   net_tcp_resume.c     resume after a reset: kept frames, re-dial, probe,
 *                        accepting resumes
 *   net_tcp_lazy.c       first use: dialling a pair that set-up skipped
 *   net_tcp_progress.c   the progress thread's loop
 *   net_tcp_rings.c      same-host shared-memory rings and mailboxes
 *   net_tcp_tune.c       socket tuning: pacing, congestion control, BBR
 *                        restarts, queued bytes, streams in use
 *
 * Locking: once the progress thread runs, the functions below that take a
 * tcpState run with st->lock held; before it starts, set-up
 * (tcpSetupConnections, tcpSetupRings and the handshakes they drive) runs
 * alone in the caller's thread and takes no lock.  Those that take the
 * table's void *state say what they lock.
 *
 * ---- The protocol ----
 *
 * nstreams connections per peer pair, non-blocking, driven by one progress
 * thread per communicator.
 *
 * A message is cut into frames of GEO_TCP_FRAME bytes; frame f of message
 * number seq travels on stream (f + seq) % nstreams, so one-frame messages
 * still spread over the streams.  Each stream keeps a send cursor and a
 * receive cursor (seq, frame); both sides compute the same assignment, so
 * each connection carries a deterministic sequence of frames and every
 * received header can be checked against what is expected (magic, sequence,
 * offset, length) before a byte of payload is written to the user's buffer.
 *
 * A receive cursor only reads when the matching receive has been posted:
 * until then unexpected data waits in the kernel (TCP flow control), so no
 * copy and no unbounded buffering.
 *
 * Connection set-up: every rank listens; rank i connects nstreams times to
 * each rank j < i and accepts from each j > i, for the pairs ctx->want
 * names (all of them when it is NULL).  The other pairs connect on first
 * use (net_tcp_lazy.c): the same roles, the same handshake, the higher
 * rank dialling when the pair's first message is posted, the lower one's
 * listener taking a fresh hello after set-up only for a slot that was
 * never connected.  Both ends prove the
 * communicator's secret: the acceptor sends a random challenge Ca; the
 * connector answers with its own random nonce Cc and HMAC(secret,
 * "geoccl/v2/hello" | comm_hash | from | to | stream | encrypt | cipher |
 * Ca | Cc); the acceptor checks it, claims the slot and answers with an
 * HMAC of the same fields under the label "geoccl/v2/accept" and its
 * choice of cipher, which the connector checks.  A relay can neither
 * answer for a rank nor redirect a connection to another rank (from and to
 * are bound), and a stranger on a peer's address is refused by the
 * connector.  A connection that cannot prove the secret is logged and
 * closed, and accepting goes on.  All handshakes of a rank run at once in
 * one poll() loop (tcpSetupConnections).
 *
 * Every TCP connection also gets a resumption secret at its first
 * handshake: both ends make an ephemeral X25519 exchange (bound in both
 * MACs, encrypted or not) and derive HKDF(secret | X25519 secret, salt
 * Ca | Cc, info: comm_hash, from, to, stream).  Only the two processes of
 * that handshake can know it: not a holder of the communicator's secret
 * who took no part (a reader of the store, a holder of an env id, a rank
 * excluded from a shrunken child), even with a recording of the handshake.
 * Each hello also carries the connector's random claim of its slot and a
 * second proof, cproof: for a fresh hello an HMAC under the communicator's
 * secret that binds the claim, for a resume one under the connection's
 * resumption secret (see "Resume after a reset").
 *
 * Encryption (GEOCCL_ENCRYPT; the communicator says which peers, in
 * ctx->encrypt).  On an encrypted connection each direction has its own
 * key, HKDF(secret, salt Ca | Cc, info: comm_hash, from, to, stream,
 * cipher, direction), fresh for every connection; frame k of a direction is
 * sealed with nonce k (AES-256-GCM, or ChaCha20-Poly1305 when either end
 * lacks AES instructions), its header as associated data and a 16-byte tag
 * after the payload.  The receiver takes the payload and tag into the
 * connection's own buffer, opens it with the number it expects, and only
 * then copies the plaintext into the user's buffer: an altered, replayed,
 * reordered or foreign frame fails the tag, breaks the communicator with
 * an error naming the peer and stream, and nothing of it is used.
 *
 * Same-host fast path (GEOCCL_SHM, net_local.h, shm_ring.h).  A connection
 * to a peer on the same host AND in the same network namespace is an
 * AF_UNIX stream socket instead of TCP.  Ranks of one host in different
 * namespaces (the emulated regions of tools/geoccl-wan) always use TCP: their
 * traffic must cross the shaped links between the namespaces, or every WAN
 * figure would be a lie.  The connector falls back to TCP when the peer's
 * socket file cannot be opened from here (another mount namespace, a
 * private /dev/shm): that open is the proof that the two share the host.
 * On each such connection, after the handshake, the connector offers a pair
 * of single-producer/single-consumer byte rings in a memfd (passed with
 * SCM_RIGHTS, see tcpSetupRings); once the acceptor has mapped it, frames
 * (the same checked headers and payloads, in the same order) are copied
 * into and out of the rings instead of sent, and the socket carries only
 * one-byte doorbells ("I moved bytes: look at the rings") plus what it
 * always told: a peer's death, as EOF or reset.
 *
 * Why this shape: keeping a socket per connection keeps everything the TCP
 * path already gets right (the HMAC handshake gating every connection,
 * ordering per stream, one poll loop, death detection through the file
 * descriptor, deadlines) and changes only where the bytes go.  On loopback,
 * 4 ranks, 64 MiB all-reduce (BENCHMARKS.md, "Same-host paths inside a
 * region", row "loopback, 4 ranks, 64 MiB: GEOCCL_SHM=1 ..."): AF_UNIX
 * sockets alone are 1.57x faster than loopback TCP, rings 1.85x (a ring
 * copy costs a memcpy into a cache-resident buffer; a socket adds a
 * syscall, an skb and a wake-up per piece); at 1 MiB, where wake-ups
 * dominate, both gain only 5-10%.  A single-copy path (process_vm_readv
 * from the sender's buffer, as Open MPI's vader does with CMA) moved
 * 256 KiB pieces no faster than the two memcpys through a 2 MiB ring, and
 * it needs ptrace rights, so it is not used.  GEOCCL_SHM=2 keeps the
 * sockets without rings; 0 is TCP only.
 *
 * Resume after a reset (TCP connections; a same-host socket shares the
 * peer's kernel and still fails hard).  NAT gateways, firewalls and route
 * changes reset connections that did nothing wrong; a dead peer closes
 * them (FIN) or refuses new ones.  Each TCP connection counts the data
 * frames it has sent whole and received whole, over all its incarnations.
 * The receiver tells its count to the sender in ack frames (a header with
 * magic GEOK, its count in seq, sealed like a frame when the connection is
 * encrypted), sent between two outgoing frames whenever it has received
 * more; so headers are read as soon as they arrive, and a data header
 * waits in tcpConn until its receive is posted, its payload waiting in the
 * kernel.  The sender keeps every frame it has sent whole until an ack
 * covers it: a copy of its plaintext on a clear connection; on an
 * encrypted one the frame is sealed straight into the slot that keeps it
 * and sent from there, so keeping costs no copy (opened in place only when
 * the connection is lost, to be sealed again under the next keys; a copy
 * cost 9% of the wall time on loopback, 4 ranks, 64 MiB: BENCHMARKS.md,
 * "Resume after a reset", row "resume, a plaintext copy of every frame
 * kept"), up to GEOCCL_RESUME_BUFFER bytes per peer, shared evenly by its
 * streams, so that a peer that never acknowledges pins no more than that
 * (beyond it a connection keeps none until the receiver has caught up, and
 * a reset in that window is an error saying so).  Keeping the frame, not the user's buffer, keeps
 * send completion eager: waiting for acks could deadlock two ranks that
 * send before they receive.
 *
 * On a reset (ECONNRESET, ECONNABORTED, EPIPE, ETIMEDOUT, unreachable),
 * the end that dialled at set-up dials again and both prove the secret in
 * the same handshake, with a resume flag and each end's received count
 * bound in both MACs (the listener stays open for the communicator's life
 * for this), and both prove the connection's resumption secret over the
 * acceptor's fresh challenge (cproof, in the hello and in the ack), so a
 * resume can be neither made by another holder of the communicator's
 * secret nor replayed.  The acceptor checks the proof and the count (no
 * more than it sent, no fewer than were acknowledged) before it touches
 * the connection the resume replaces: a resume that fails either is
 * closed alone, with a warning naming its address, and the live
 * connection goes on.  A half-received frame is dropped, each end sends
 * again what the other has not received whole, re-sealed under the new
 * connection's keys, and the cursors go on: the result is the same bits as
 * without the reset.
 *
 * A connector whose ack was lost (a reset during its handshake at set-up)
 * has no resumption secret: it dials a fresh hello again, and the acceptor
 * lets that replace the slot's connection only with the claim of the
 * slot's first hello, while nothing has arrived on it and before it is
 * confirmed: the connector sends its count (an ack frame) first thing on
 * a new connection, which shows that its handshake finished.  The claim
 * travels in the clear, so this window, until the connector's first frame,
 * is open to a holder of the communicator's secret that also records the
 * set-up handshake, and to no one else.  The other end meanwhile probes the dialler's listener: refused
 * connects (ECONNREFUSED: no process there any more) for 0.5 s end the
 * wait, as refused dials do (a single refusal may come from the path, not
 * the peer, e.g. while a link comes back up); otherwise the wait ends after
 * GEOCCL_RECONNECT_TIMEOUT.  A peer gone with nothing pending on the
 * connection counts as closed, like a FIN: an operation that needs it
 * fails when it is posted. */
#ifndef GEOCCL_NET_TCP_INTERNAL_H_
#define GEOCCL_NET_TCP_INTERNAL_H_

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/base/crypto.h"
#include "comm/transport/admit.h"
#include "comm/transport/shm_ring.h"
#include "comm/transport/transport.h"

#define GEO_TCP_FRAME GEO_NET_STRIPE_BYTES
#define GEO_FRAME_MAGIC 0x47454f46u /* "GEOF" */
#define GEO_HELLO_MAGIC 0x47454f32u /* "GEO2": the hello of this protocol */
#define GEO_ACCEPT_MAGIC 0x47454f41u /* "GEOA" */
#define GEO_ACK_MAGIC 0x47454f4bu /* "GEOK": data frames received whole */
/* Unproven resume handshakes served at once by the progress thread, in
 * all and from one source group (admit.h: a peer's host, or a /24, /64).
 * A newer one makes room by dropping an unproven one of the loudest group
 * of strangers, a peer's only when no stranger's is left, never one that
 * has proved the secret; a peer dropped so dials again.  A flood then only
 * replaces itself, and a resume dialled from a peer's own address gets
 * through whatever the flood.  Small: the slots are paid in descriptors
 * for the communicator's whole life, and a resume's handshake needs one
 * for a round trip. */
#define GEO_TCP_RESUME_PENDING 64
/* Unproven handshakes set-up serves at once, at most (net_tcp_setup.c);
 * after set-up too while pairs are left to connect on first use: a burst
 * of first messages (an all-to-all) brings one dial per stream of every
 * peer at once, which GEO_TCP_RESUME_PENDING would mostly drop and have
 * dialled again. */
#define GEO_TCP_MAX_PENDING 1024
#define GEO_CHALLENGE_BYTES 16
#define GEO_TCP_HANDSHAKE_S 5.0  /* an accepted connection proves itself by then */
/* A peer's listener refusing our dials this long means its process is
 * gone (one refusal may be a path's: a middlebox, a route coming back). */
#define GEO_GONE_CONFIRM_S 0.5
/* The first few drops are logged one by one, the rest only counted (a
 * scan or a flood must not bury the log) and summed up after set-up. */
#define GEO_TCP_DROP_LOG 8

typedef struct {
    uint32_t magic;
    uint32_t len;      /* payload bytes */
    uint64_t seq;      /* message number in this direction */
    uint64_t offset;   /* byte offset in the message */
    uint64_t total;    /* message bytes */
    uint64_t check;    /* a hash of the fields above */
} tcpFrameHdr;

/* A cursor's frame: not chosen yet, or none of this message on its stream. */
#define GEO_FRAME_UNSET ((size_t)-1)
#define GEO_FRAME_NONE ((size_t)-2)

typedef struct {
    uint32_t magic;
    int32_t rank;          /* from: the connector */
    int32_t to;            /* the rank it means to reach */
    int32_t stream;
    int32_t encrypt;       /* 1: the connector will encrypt this connection */
    int32_t cipher;        /* the connector's preferred cipher */
    int32_t resume;        /* 1: this replaces a connection that was reset */
    uint64_t count;        /* resume: data frames the connector has received whole */
    uint8_t nonce[GEO_CHALLENGE_BYTES];
    uint8_t pub[GEO_X25519_BYTES]; /* encrypted or TCP: the connector's ephemeral X25519 key */
    uint8_t proof[GEO_SHA256_BYTES]; /* under the communicator's secret */
    uint8_t claim[GEO_CHALLENGE_BYTES]; /* the connector's random value for this slot */
    uint8_t cproof[GEO_SHA256_BYTES]; /* resume: under the connection's resumption
                                       * secret; else under the communicator's, with claim */
} tcpHello;

typedef struct {
    uint32_t magic;
    int32_t cipher;        /* the acceptor's choice; GEO_CIPHER_NONE: clear */
    uint64_t count;        /* resume: data frames the acceptor has received whole */
    uint8_t pub[GEO_X25519_BYTES]; /* encrypted or TCP: the acceptor's ephemeral X25519 key */
    uint8_t proof[GEO_SHA256_BYTES]; /* under the communicator's secret */
    uint8_t cproof[GEO_SHA256_BYTES]; /* resume: under the connection's resumption secret */
} tcpAccept;

/* A frame sent whole, kept until the receiver's count covers it.  On an
 * encrypted connection the frame is sealed straight into its slot and sent
 * from there (no copy of the plaintext): it stays sealed under the
 * connection's key until the connection is lost, when it is opened in place
 * (kept_unseal, net_tcp_resume.c) to be sealed again under the next incarnation's keys. */
typedef struct {
    tcpFrameHdr hdr;
    uint8_t *data;         /* GEO_TCP_FRAME + tag bytes, owned by the slot */
    int sealed;            /* data holds the frame sealed with counter ctr */
    uint64_t ctr;
} tcpKept;

enum { SEND_DATA, SEND_ACK, SEND_AGAIN }; /* what a connection's s_hdr is */

struct tcpHs;

typedef struct {
    int fd;
    int local;             /* AF_UNIX (same-host fast path), not TCP */
    int ring;              /* frames go through tx/rx, the socket carries doorbells */
    geoShmRing tx, rx;
    void *seg;             /* the mapped segment holding tx and rx */
    uint64_t seg_cap;
    int connector;         /* this end made the segment: its ring and mailbox 0 go out */
    int kick;              /* bytes moved through a ring: ring the peer's doorbell */
    int closed;            /* peer closed or reset: no more polling */
    int acking;            /* set-up: we accepted it, our ack is still in flight */
    int enc;               /* frames are sealed (tx) and opened (rx) */
    geoAead tx_aead, rx_aead;
    geoAead tx_open;       /* our own key, to open frames kept sealed (resume) */
    uint64_t s_ctr, r_ctr; /* frames sealed and opened: the next nonce each way */
    uint8_t *s_buf, *r_buf; /* GEO_TCP_FRAME + tag: a sealed frame's payload */
    uint8_t *s_out;        /* where the half-sent frame was sealed: s_buf or a kept slot */
    /* send cursor */
    uint64_t s_seq;
    size_t s_frame;
    size_t s_off;          /* bytes of header+payload sent for current frame */
    int s_active;          /* a frame is half-sent */
    tcpFrameHdr s_hdr;
    /* receive cursor */
    uint64_t r_seq;
    size_t r_frame;
    size_t r_off;
    int r_checked;         /* r_hdr (a data header) matched the posted receive */
    tcpFrameHdr r_hdr;
    /* resume (track: a TCP connection) */
    int track;
    int s_kind;            /* SEND_*: what the half-sent s_hdr is */
    int down;              /* reset: waiting for its next incarnation */
    double down_since;
    struct tcpHs *dial;    /* down, we dialled at set-up: the new handshake */
    int probe_fd;          /* down, the peer dials: a connect to its listener */
    double refused_since;  /* down: when its listener first refused us (0: it has not) */
    double probe_when;
    uint64_t s_count;      /* data frames sent whole (all incarnations) */
    uint64_t r_count;      /* data frames received whole */
    uint64_t a_sent;       /* the count last told the peer */
    uint64_t a_got;        /* the count the peer last told */
    uint64_t again;        /* next kept frame to send again (== s_count: none) */
    /* Proves a resume of this connection: derived at its first handshake
     * from the X25519 exchange (tcpHello); set on TCP connections. */
    uint8_t resume_secret[GEO_SHA256_BYTES];
    int has_resume_secret;
    uint8_t claim[GEO_CHALLENGE_BYTES]; /* the connector's random value for this slot,
                                         * in each of its set-up hellos */
    int tell;              /* connector, new connection: send our count at once, which
                            * tells the acceptor that our handshake finished */
    int confirmed;         /* acceptor: the connector has sent on it (its handshake
                            * finished): no fresh hello may replace it any more */
    tcpKept *kept;         /* ring of k_cap slots, k_len from k_head: frames */
    size_t k_cap, k_head, k_len; /* k_base .. s_count - 1 */
    uint64_t k_base;
    size_t k_max;          /* slots allowed (GEOCCL_RESUME_BUFFER / nstreams) */
    double bbr_since;      /* restartBbr: since when its BBR's 10 s window may run: its
                            * last restart or skipped one; 0: not known (a new
                            * connection, a change of congestion control) */
    int bbr_restarts;      /* restartBbr: restarts in a row, since one was skipped */
    double q_at;           /* tcpConnSampleQueued: when it last looked (0: never) */
    int q_full;            /* what it saw then: more than GEO_TCP_QUEUED_FULL unsent */
    double full_total;     /* seconds the socket held more than that: data this rank
                            * had handed over that the path had not taken yet
                            * (linkStats' `full`) */
    int unopened;          /* never connected: set-up skipped the pair (ctx->want) or has
                            * not reached it; after set-up a fresh hello may take it, and
                            * the higher rank dials it on first use (net_tcp_lazy.c) */
} tcpConn;

typedef struct {
    tcpConn *conns;                 /* nstreams */
    geoNetRequest *q[2];            /* pending, in seq order */
    uint64_t posted[2];             /* next seq to assign */
    int active;                     /* streams new messages use (setStreams) */
    int closed_by_peer;
    int gone;                       /* reset, and its process is gone */
    uint64_t reconnects, resent;    /* connections resumed, payload bytes sent again */
    char cc[16];                    /* congestion control set on it ("" none) */
    uint64_t pace;                  /* bytes/s over its network connections
                                     * (setPacing), 0: none */
    int unopened;                   /* streams never connected (tcpConn.unopened) */
    double first_use;               /* we dial: when its first message started our
                                     * dials (0: not yet) */
} tcpPeer;

typedef struct {
    geoNetCtx *ctx;
    int listen_fd;
    int local_fd;                   /* same-host listener; -1: none */
    geoLocalInfo local;             /* what we published about it */
    int nstreams;
    tcpPeer *peers;
    pthread_t thread;
    int thread_live;
    int wake_fd;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    /* Threads asleep in tcp_wait (net_tcp.c), and what the sleeper waits for when
     * there is one: a completion wakes it only when that request is done
     * (complete_frame, net_tcp_frame.c).  NULL: not known (more than one sleeper, or one
     * left while another slept), so every completion wakes them. */
    int nwaiters;
    const geoNetRequest *waiting_for;
    int stop;
    int broken;
    ncclResult_t broken_res;
    int dropped;                    /* connections dropped during set-up */
    geoAdmitPeers known;            /* the peers' hosts, which strangers cannot crowd out */
    int fd_short;                   /* set-up: a dial of ours found no descriptor */
    int uncounted;                  /* set-up: counted slots since replaced (tcpHsInStep) */
    /* after set-up: resume handshakes accepted on listen_fd */
    int running;
    struct tcpHs *rpend;
    int nrpend;
    int rpend_cap;                  /* rpend's entries: GEO_TCP_RESUME_PENDING, or a set-up
                                     * sized budget while pairs connect on first use */
    int rpend_group;                /* of those, one source group's at most */
    double listen_paused_until;     /* out of descriptors: not accepting until then */
    double reconnect_s;             /* GEOCCL_RECONNECT_TIMEOUT */
    int lowat;                      /* limitQueued's value, for new connections */
} tcpState;

enum {
    HS_RETRY,     /* out: waiting to connect (again): refused or unreachable */
    HS_CONNECT,   /* out: TCP connect in flight */
    HS_CHALLENGE, /* out: receiving the challenge; in: sending it */
    HS_HELLO,     /* out: sending our hello; in: receiving the peer's */
    HS_ACK,       /* out: receiving the ack; in: sending it (slot claimed) */
    HS_DONE,      /* the connection is in peers[peer].conns[stream] */
    HS_DROPPED    /* in: logged and closed */
};

/* One connection's handshake, either role (net_tcp_handshake.c). */
typedef struct tcpHs {
    int fd;
    int out;        /* 1: we connect to (peer, stream); 0: we accepted */
    int resume;     /* after set-up: it replaces a connection that was reset */
    int lazy;       /* after set-up: the first connection of a slot set-up skipped
                     * (out: our first-use dial; in: set by tcpHsInStep) */
    int local;      /* out: over the peer's same-host socket; in: accepted there */
    int state;
    int peer;       /* in: -1 until a valid hello names it */
    int stream;
    double when;    /* out in HS_RETRY: next attempt; in: handshake deadline */
    double backoff; /* out: wait before the next attempt */
    int err;        /* out: errno of the last failed attempt */
    int drops;      /* out: times the peer closed it before proving itself */
    size_t off;     /* bytes of the current message moved */
    uint8_t challenge[GEO_CHALLENGE_BYTES];
    tcpHello hello;
    tcpAccept ack;
    void *eph;      /* out, encrypted or TCP: our ephemeral X25519 key until the ack */
    char from[GEO_ADDR_STRLEN]; /* in: the address it came from */
    geoAdmitGroup group;        /* in: its source group, for the per-source limits
                                 * (same-host sockets: one group) */
} tcpHs;

/* What an entry of the progress thread's poll set stands for. */
enum { PK_CONN, PK_DIAL, PK_PROBE, PK_PEND, PK_LISTEN, PK_WAKE, PK_LAZY };
typedef struct {
    int kind, p, s, fd;
} tcpPollRef;

/* The functions below are shared by the net_tcp*.c files only: hidden from
 * the library's exported symbols, as when they were one file's statics. */
#pragma GCC visibility push(hidden)

/* ---- net_tcp.c: failing, and waking the progress thread ---- */

/* Wake the progress thread out of its poll (any thread, no lock needed). */
void tcpWake(tcpState *st);
/* peer's address as text, in buf. */
const char *tcpPeerStr(tcpState *st, int peer, char buf[GEO_ADDR_STRLEN]);
/* Fail every request, shut every connection. */
void tcpBreakLocked(tcpState *st, ncclResult_t res);
/* A new connection is in its slot (c->fd): no longer unopened; kept frames
 * for resume on TCP, its socket tuned and non-blocking. */
void tcpConnReady(tcpState *st, tcpConn *c);
/* Whether set-up opens the connections to peer (ctx->want). */
int tcpWanted(const geoNetCtx *ctx, int peer);
/* Report "peer ... what (stream)" on the communicator (geoErrReport: one
 * WARN line, with the file:line of tcpPeerError's caller), then break it;
 * nothing once it is broken or stopping. */
void tcpPeerErrorAt(tcpState *st, int peer, int stream, const char *what, const char *file,
                    int line);
#define tcpPeerError(st, peer, stream, what)                                  \
    tcpPeerErrorAt((st), (peer), (stream), (what), __FILE__, __LINE__)

/* ---- net_tcp_frame.c ---- */

/* Frames of a message of size bytes (0 for an empty one). */
size_t tcpFrameCount(size_t size);
/* Move cursor (seq, frame) of stream s to the next frame it carries that
 * belongs to a posted request of direction dir; NULL when there is none. */
geoNetRequest *tcpCursorReq(tcpPeer *peer, int dir, int s, uint64_t *seq, size_t *frame);
/* Push (send) or pull (receive) bytes on connection s of peer p without
 * blocking; 1 if progress was made.  A failure breaks the communicator or,
 * on a reset TCP connection, takes it down for resume (c->down). */
int tcpProgressSend(tcpState *st, int p, int s, double now);
int tcpProgressRecv(tcpState *st, int p, int s, double now);

/* ---- net_tcp_handshake.c ---- */

/* Free an encrypted connection's keys and buffers (no-op when clear). */
void tcpConnKeysFree(tcpConn *c);
/* The poll events handshake h waits for in its state. */
short tcpHsEvents(const tcpHs *h);
/* Advance an outgoing handshake without blocking.  1: done, the connection
 * installed in its slot; 0: waiting (on its socket, or until h->when); -1:
 * failed, and why says how (nothing is reported: a resume dial that fails
 * may be tried again, so the caller decides whether it is the error).
 * deadline bounds retries. */
int tcpHsOutStep(tcpState *st, tcpHs *h, double now, double deadline,
                 char why[GEO_ERR_TEXT_LEN]);
/* Advance an accepted handshake without blocking.  1: done; 0: waiting;
 * -1: dropped (logged and closed).  At set-up, one that replaces its slot's
 * earlier connection adds 1 to st->uncounted. */
int tcpHsInStep(tcpState *st, tcpHs *h);
/* Log (the first GEO_TCP_DROP_LOG; why NULL: the caller has logged it)
 * and close an accepted handshake, releasing the slot it claimed. */
void tcpHsDrop(tcpState *st, tcpHs *h, const char *why);

/* ---- net_tcp_setup.c ---- */

/* Open every connection of this rank; bounded by ctx->timeout and the
 * abort flag.  The caller's thread, before the progress thread starts. */
ncclResult_t tcpSetupConnections(tcpState *st);
/* Make room in pend[0..npend) for one more connection of group `from`
 * within per_group and most (from NULL: out of descriptors, one must go):
 * drop the unproven handshake the admission policy picks (admit.h), logged
 * with why.  0 if one was dropped, -1 if none was, GEO_ADMIT_REFUSE if the
 * newcomer, a stranger, is to go instead of a peer's handshake. */
int tcpMakeRoom(tcpState *st, tcpHs *pend, int npend, const geoAdmitGroup *from, int per_group,
                int most, const char *why);

/* ---- net_tcp_resume.c ---- */

/* The kept frame i places after the oldest one kept. */
tcpKept *tcpKeptAt(tcpConn *c, size_t i);
/* The slot the next kept frame goes to, with its buffer; NULL when the
 * ring is full or memory is out. */
tcpKept *tcpKeptSlot(tcpConn *c);
/* Keep the frame just sent whole: a copy of payload, or (sealed != NULL)
 * the frame already sealed into tcpKeptSlot's slot with counter ctr. */
void tcpKeptPush(tcpConn *c, const tcpFrameHdr *h, const void *payload, const uint8_t *sealed,
                 uint64_t ctr);
/* The receiver has n frames whole: forget those. */
void tcpKeptAck(tcpConn *c, uint64_t n);
void tcpKeptFree(tcpConn *c);
/* A send or receive on connection s of peer p failed with err: a reset
 * TCP connection goes down to be resumed, the rest breaks the
 * communicator. */
void tcpConnFail(tcpState *st, int p, int s, int err, const char *what);
/* Before a resume of h's slot is acknowledged: the slot's incarnation and
 * an older resume of it go. */
void tcpResumeClaim(tcpState *st, tcpHs *h);
/* Close a down connection's dial or probe. */
void tcpConnFreeResume(tcpConn *c);
/* The new incarnation is up (c->fd) and the peer has n of our frames
 * whole: send the rest again, then go on. */
void tcpConnResumed(tcpState *st, int p, int s, uint64_t n);
/* Our resume dial of connection s of peer p failed (why: tcpHsOutStep's
 * text): dial again, or report it and break. */
void tcpDialFailed(tcpState *st, int p, int s, const char *why);
/* The peer's listener refused c's dial.  Its process is taken for gone
 * once refusals have lasted GEO_GONE_CONFIRM_S: one refusal may be a
 * path's (a middlebox, a route coming back) and not the peer's.  1: gone.
 * Starts the count at the first refusal; the caller resets refused_since
 * when a dial fails otherwise or succeeds. */
int tcpRefusedForGood(tcpConn *c, double now);
/* A connection that is down: give up after the reconnect timeout, drive
 * our dial, or probe the peer's listener; adds its poll entries from n on
 * and returns the entries used. */
int tcpPollDown(tcpState *st, int p, int s, double now, struct pollfd *pfd, tcpPollRef *map,
                int n);
/* The probe of the peer's listener finished. */
void tcpProbeDone(tcpState *st, int p, int s, double now);
/* Take the resume handshakes waiting on the listener after set-up. */
void tcpAcceptResumes(tcpState *st, double now);
/* Shut the resume handshakes still in progress (tcpBreakLocked). */
void tcpPendShut(tcpState *st);

/* ---- net_tcp_lazy.c ---- */

/* Peer p has streams never connected: when we are the higher rank and a
 * message to or from p is posted, start dialling them; drive the dials,
 * fail them past GEOCCL_TIMEOUT or when p's listener refuses them (gone);
 * adds their poll entries (PK_LAZY) from n on and returns the entries used. */
int tcpLazyPoll(tcpState *st, int p, double now, struct pollfd *pfd, tcpPollRef *map, int n);
/* Our first-use dial of stream s of p has an event. */
void tcpLazyStep(tcpState *st, int p, int s, double now);
/* Stream s of p, never connected before, is up (dialled or accepted). */
void tcpLazyUp(tcpState *st, int p, int s);

/* ---- net_tcp_progress.c ---- */

/* The progress thread (arg: the tcpState); takes st->lock itself. */
void *tcpProgressMain(void *arg);

/* ---- net_tcp_rings.c ---- */

/* Agree with every same-host peer on shared-memory rings, after the
 * handshakes; the caller's thread, bounded by ctx->timeout and the abort
 * flag. */
ncclResult_t tcpSetupRings(tcpState *st);
/* Ring the peer's doorbell when bytes moved through c's rings. */
void tcpConnKick(tcpConn *c);
/* Read the doorbells waiting on a ring connection's socket.  1 when the
 * peer has closed or reset it (c->closed is then set), else 0. */
int tcpRingDrain(tcpConn *c);
/* The table's hasMailbox and mail (transport.h); called without the lock,
 * mail takes it between its tries. */
int tcpHasMailbox(void *state, int peer);
ncclResult_t tcpMail(void *state, int peer, void *buf, size_t len, int send);

/* ---- net_tcp_tune.c ---- */

/* Pace connection c at its part of bytes_per_s over active streams; 0 lifts
 * it.  setsockopt's result. */
int tcpConnPace(tcpConn *c, uint64_t bytes_per_s, int active);
/* Bytes not yet sent in a connection's socket above which its path, not
 * the data this rank has to send, holds the sender back: more than one
 * frame waiting.  Sampled at most every GEO_TCP_QUEUED_EVERY seconds
 * (and after every write). */
#define GEO_TCP_QUEUED_FULL GEO_TCP_FRAME
#define GEO_TCP_QUEUED_EVERY 0.002
/* Sample the unsent bytes of TCP connection c (lock held) into its
 * full_total: the progress thread while c sends or was full, linkStats
 * when asked.  At most every GEO_TCP_QUEUED_EVERY seconds unless force
 * (after a write, and when the figures are read). */
void tcpConnSampleQueued(tcpConn *c, double now, int force);

/* The table's limitQueued and setStreams (transport.h); they take the lock. */
void tcpLimitQueued(void *state, int bytes);
void tcpSetStreams(void *state, int peer, int n);

#pragma GCC visibility pop

#endif
