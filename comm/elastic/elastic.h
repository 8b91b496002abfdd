/* What the rest of the library and the elastic files share
 * (docs/elastic.md): a communicator's membership in the store
 * (membership.c), the records and keys the store holds (records.c), and
 * the calls of geoccl.h's elastic section (grow.c, failed.c).
 *
 * The store is etcd when GEOCCL_ELASTIC_ETCD names members; otherwise, when
 * GEOCCL_ELASTIC_JOB is set, the process that holds the first bootstrap
 * root serves the same requests (store_root.c) at GEOCCL_COMM_ID's host,
 * one port above, and that region must survive.  Keys live under /geoccl/<job>/:
 *   c/<comm>/m/<rank>   a member (its process's lease): rank, pid, region, host
 *   c/<comm>/ok/<rank>  a survivor after an error (its lease)
 *   c/<comm>/dead       the dead set, created once by the first survivor
 *                       that saw every rank accounted for
 *   join/<id>           a process waiting to join (its lease)
 *   admit/<id>          its admission: where the new communicator's root is,
 *                       its rank, the size, the members' link figures
 *   comms/<comm>        a communicator's ranks and regions (rank 0's lease)
 * <comm> is the communicator's hash in hex.  Every value carries an
 * HMAC-SHA256 over key and value: communicator records under a key derived
 * from the communicator's secret, job records (join, admit) under one
 * derived from GEOCCL_COMM_SECRET; no value holds a secret. */
#ifndef GEOCCL_ELASTIC_H_
#define GEOCCL_ELASTIC_H_

#include "nccl.h"
#include "comm/base/crypto.h"
#include "comm/core/comm.h"
#include "comm/elastic/etcd.h"

#include <pthread.h>
#include <stdint.h>

#define GEO_ELASTIC_KEY_LEN 192

/* A communicator's membership: its lease, the thread that renews it and
 * reads how many joiners wait, and the keys it signs with. */
typedef struct geoElastic {
    geoEtcd store;
    char prefix[96];                    /* "/geoccl/<job>/" */
    char comm_dir[128];                 /* prefix "c/<comm hash>/" */
    uint8_t comm_key[GEO_SHA256_BYTES]; /* MACs of c/ records */
    int64_t lease;                      /* atomic: the renewal thread may replace it */
    int ttl;
    char member_key[GEO_ELASTIC_KEY_LEN];   /* this rank's member record, written again */
    uint8_t *member_val;                /* under a new lease if the old one lapsed */
    size_t member_len;
    int joiners;                        /* atomic: last count seen */
    int stop;                           /* atomic: the thread ends */
    pthread_t thread;
    int thread_live;
    pthread_mutex_t lock;               /* stop's condition */
    pthread_cond_t cv;
} geoElastic;

/* membership.c */

/* At the end of init: with a store configured, grant comm a lease, start
 * its renewal thread and record the member (c/<comm>/m/<rank>); nothing
 * without one.  A store that cannot be reached is logged at WARN and the
 * communicator works without elastic features (ncclSuccess). */
ncclResult_t geoElasticAttach(struct ncclComm *comm);
/* At destroy/abort: stop the thread, delete the member's records (not on
 * abort: the lease runs out), free. */
void geoElasticDetach(struct ncclComm *comm, int abort);
/* 1 when this process is to keep membership records: GEOCCL_ELASTIC_ETCD
 * is set, or GEOCCL_ELASTIC_JOB is and GEOCCL_COMM_ID says where the
 * store without etcd is. */
int geoElasticConfigured(void);
/* Open the store that GEOCCL_ELASTIC_ETCD or (GEOCCL_ELASTIC_JOB set)
 * GEOCCL_COMM_ID names into e, with prefix; ncclInvalidUsage (reported on
 * err) when there is none. */
ncclResult_t geoElasticStoreOpen(geoEtcd *e, char prefix[96], geoErr *err);

/* store_root.c */

/* Where the store without etcd listens: the root's address, one port up. */
void geoElasticStoreAddr(const geoSockAddr *root, geoSockAddr *out);
/* Serve it in this process (a detached thread), when GEOCCL_ELASTIC_JOB is
 * set and GEOCCL_ELASTIC_ETCD is not; called where rank 0 starts the
 * GEOCCL_COMM_ID root.  Logged, never fatal: the store is then missing. */
void geoElasticStoreMaybeServe(const geoSockAddr *root);

/* records.c */

/* The job key (from GEOCCL_COMM_SECRET, stretched as the bootstrap does,
 * salted with the job's name): ncclInvalidUsage when the secret is unset. */
ncclResult_t geoElasticJobKey(uint8_t key[GEO_SHA256_BYTES], geoErr *err);
/* The job key comm keeps (ncclComm.job_key), derived by geoElasticJobKey
 * only when comm has none yet; errors as geoElasticJobKey's.
 * geoElasticKeepJobKey: give comm (a communicator just made from one that
 * had it, or by a join) the key, so that its grows need no scrypt. */
ncclResult_t geoElasticCommJobKey(struct ncclComm *comm, uint8_t key[GEO_SHA256_BYTES],
                                  geoErr *err);
void geoElasticKeepJobKey(struct ncclComm *comm, const uint8_t key[GEO_SHA256_BYTES]);
/* The key of a communicator's records, from its secret. */
void geoElasticCommKey(const uint8_t *comm_secret, uint8_t key[GEO_SHA256_BYTES]);
/* Seal body (n bytes) for key name: a malloc'ed body | HMAC, *out_n long. */
uint8_t *geoElasticSeal(const uint8_t key[GEO_SHA256_BYTES], const char *name,
                        const void *body, size_t n, size_t *out_n);
/* 0 when val (vlen bytes, from the store under name) carries a valid MAC
 * for want bytes of body; -1 otherwise (forged, truncated, another job). */
int geoElasticOpen(const uint8_t key[GEO_SHA256_BYTES], const char *name,
                   const uint8_t *val, size_t vlen, size_t want);

/* The records (fixed layouts; both ends run the same library). */
#define GEO_ELASTIC_MAGIC 0x47454c31u /* "GEL1" */
#define GEO_ELASTIC_MAX_REGIONS 16

typedef struct {
    uint32_t magic;
    int32_t rank, nranks, pid;
    char region[32];
    char host[64];
} geoElasticMember;

typedef struct {
    uint32_t magic;
    int32_t count;                      /* dead ranks that follow (int32 each) */
} geoElasticDeadHead;

typedef struct {
    uint32_t magic;
    int32_t pid;
    char region[32];
    char host[64];
    uint64_t nonce;                     /* random: tells a joiner's records apart */
} geoElasticJoiner;

/* The link figures a joiner takes over (geoTopoInherit's, bounded). */
typedef struct {
    int32_t nregions, bw_known, bw_measured, pad;
    char names[GEO_ELASTIC_MAX_REGIONS][32];
    double egress[GEO_ELASTIC_MAX_REGIONS], ingress[GEO_ELASTIC_MAX_REGIONS];
    double oneway[GEO_ELASTIC_MAX_REGIONS];
    double rtt[GEO_ELASTIC_MAX_REGIONS * GEO_ELASTIC_MAX_REGIONS];
    double intra_Bps, intra_alpha;
} geoElasticFigures;

typedef struct {
    uint32_t magic;
    int32_t rank, nranks;               /* the joiner's in the new communicator */
    int32_t pad;
    uint64_t grow_nonce;                /* the new secret is derived from it */
    uint64_t joiner_nonce;              /* the registration it answers */
    ncclUniqueId id;                    /* the new communicator's, secret zeroed */
    geoElasticFigures figures;
} geoElasticAdmit;

/* Figures to and from a record: 0, or -1 when there are too many regions
 * (the joiner then measures). */
int geoElasticFiguresPack(const geoTopoInherit *inh, geoElasticFigures *f);
int geoElasticFiguresUnpack(const geoElasticFigures *f, const char *label,
                            geoTopoInherit *inh);
/* The secret of a grown communicator, computed alike by members and
 * joiners: HMAC(job key, label | grow nonce). */
void geoElasticGrowSecret(const uint8_t job_key[GEO_SHA256_BYTES], uint64_t grow_nonce,
                          uint8_t out[GEO_SHA256_BYTES]);

#endif
