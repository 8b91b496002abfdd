/* What the files of the bootstrap share among themselves (root.c,
 * peer_table.c, join.c, unique_id.c): the wire format of the join
 * exchange, the MACs both ends compute over it, and the root's state,
 * which its listener loop (root.c) and its peer table (peer_table.c) both
 * work on.  Not for use outside comm/bootstrap: bootstrap.h is the
 * interface. */
#ifndef GEOCCL_BOOTSTRAP_INTERNAL_H_
#define GEOCCL_BOOTSTRAP_INTERNAL_H_

#include "comm/bootstrap/bootstrap.h"
#include "comm/base/crypto.h"
#include "comm/transport/admit.h"
#include "comm/transport/socket.h"

#include <stddef.h>
#include <stdint.h>

/* The words of the join exchange, each the first 4 bytes of a message. */
#define GEO_JOIN_MAGIC 0x47454f4au /* "GEOJ" */
#define GEO_TABLE_MAGIC 0x47454f54u /* "GEOT" */
#define GEO_REFUSED_MAGIC 0x47454f52u /* "GEOR": wrong proof, or rank taken */
#define GEO_EXPIRED_MAGIC 0x47454f58u /* "GEOX": the root gave up waiting */
#define GEO_CONFIRM_MAGIC 0x47454f47u /* "GEOG": the joiner has its table, proven */
#define GEO_CHALLENGE_BYTES 16

/* Joiner to root.  proof = HMAC(secret, "geoccl/v2/join" | root's challenge
 * | joiner's nonce | rank | nranks | id nonce | info | token): it proves the
 * secret, is fresh for the root's challenge, and binds what the rank says
 * of itself and the token it re-joins with, so a relay can change none of
 * it (a rewritten token would make the rank's own re-join a stranger's). */
typedef struct {
    uint32_t magic;
    int32_t rank;
    int32_t nranks;
    uint32_t pad;
    uint8_t nonce[GEO_CHALLENGE_BYTES];
    uint8_t proof[GEO_SHA256_BYTES];
    /* The same in every attempt of one join (random per geoBootstrapJoin):
     * a rank whose connection was reset joins again with it and takes its
     * own place back; another process claiming the rank is refused. */
    uint8_t token[GEO_CHALLENGE_BYTES];
    geoBootInfo info;
} geoJoinMsg;

typedef struct {
    geoUniqueIdInternal id;
    int listen_fd;
    double timeout;
    /* The communicator's size when the process starting the root knows it
     * (rank 0 under GEOCCL_COMM_ID, a split's or shrink's leader,
     * ncclCommInitAll); 0 for ncclGetUniqueId's root, where rank 0's join
     * says it.  The root allocates for this count only, and refuses a
     * join that claims another one before it allocates anything. */
    int nranks;
} geoBootRootArgs;

/* ---- the MACs of the join exchange (join.c) ---------------------------- */

/* The join proof: HMAC(secret, "geoccl/v2/join" | challenge | m's nonce |
 * rank | nranks | id nonce | m's info | m's token). */
void geoBootJoinProof(const geoUniqueIdInternal *id, const uint8_t *challenge,
                      const geoJoinMsg *m, uint8_t out[GEO_SHA256_BYTES]);
/* The table's MAC for one rank: binds the table's digest to that rank's
 * challenge and nonce, under a label of its own. */
void geoBootTableMac(const geoUniqueIdInternal *id, const uint8_t *challenge,
                     const uint8_t *nonce, int rank, int nranks,
                     const uint8_t table_digest[GEO_SHA256_BYTES],
                     uint8_t out[GEO_SHA256_BYTES]);

/* ---- the root (root.c, peer_table.c) ----------------------------------- */

/* A connection the root accepted that has not yet proved the secret: its
 * handshake (challenge out, join message in) runs with its own deadline. */
typedef struct {
    int fd;
    int stage;        /* 0: sending the challenge; 1: receiving the join; 2: proven,
                       * waiting for rank 0 to say how many ranks there are */
    size_t off;
    double deadline;
    char from[GEO_ADDR_STRLEN];
    geoAdmitGroup group;  /* its source prefix, for the per-source limits */
    uint8_t challenge[GEO_CHALLENGE_BYTES];
    geoJoinMsg m;
} geoBootJoiner;

typedef struct {
    int nranks;       /* 0 until known: from the root's start, or rank 0's join */
    double deadline;  /* the root gives up when not every rank joined by then */
    int joined;       /* ranks that joined (once each, whatever their rejoins) */
    int acked;        /* ranks that confirmed their table (GEO_CONFIRM_MAGIC) */
    int *fds;         /* per rank, -1 until it joined, or while its connection is lost */
    char *rank_state; /* per rank: 0 not joined; 1 joined; 2 confirmed its table */
    uint32_t *confirm; /* per rank: the confirmation being read */
    size_t *confirm_off;
    uint8_t (*token)[GEO_CHALLENGE_BYTES];
    int sent;         /* the tables went out: the table is final */
    uint8_t digest[GEO_SHA256_BYTES]; /* of the final table */
    geoBootInfo *table;
    uint8_t (*challenge)[GEO_CHALLENGE_BYTES]; /* per rank: what its table's MAC binds */
    uint8_t (*nonce)[GEO_CHALLENGE_BYTES];
    int dropped;      /* connections dropped: the first few are logged one by one */
} geoBootRootState;

/* Start the root's detached thread on the listening socket fd (taken over,
 * closed on failure) for a communicator of nranks ranks (0: not known
 * here; rank 0's join says it).  ncclSystemError when no thread can be
 * started. */
ncclResult_t geoBootRootStartThread(const geoUniqueIdInternal *id, int fd, double timeout,
                                    int nranks);
/* Log a dropped connection; past the first few only count it in *count. */
void geoBootRootDropped(int *count, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Allocate the peer table for n ranks (rs->nranks = n).  0, or -1 when
 * memory is out. */
int geoBootTableAlloc(geoBootRootState *rs, int n);
/* Advance one joiner's handshake without blocking.  1: it joined (its fd
 * is in rs->fds), or joined again after its connection was lost (the same
 * token: it takes its own place back); 0: waiting (stage 2: proven, until
 * rank 0 says the count); -1: dropped (logged, closed); -2: out of
 * memory. */
int geoBootTableAdmit(const geoBootRootArgs *a, geoBootRootState *rs, geoBootJoiner *j);
/* Every rank has joined: send each its table with its MAC, at once, within
 * 10 s; the table is final from here on. */
void geoBootTableSendAll(const geoBootRootArgs *a, geoBootRootState *rs);
/* Rank r joined again after the tables went out: its table, at once. */
void geoBootTableSendOne(const geoBootRootArgs *a, geoBootRootState *rs, int r);
/* Rank r's connection is readable after the tables went out: read its
 * confirmation, or note its connection lost until it joins again. */
void geoBootTableTakeConfirm(geoBootRootState *rs, int r);

#endif
