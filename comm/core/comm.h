/* The communicator: what every module of comm/ shares.  Statistics,
 * reduction ops and error text belong to the communicator, never to
 * globals (STYLE.md rule 7). */
#ifndef GEOCCL_COMM_H_
#define GEOCCL_COMM_H_

#include <pthread.h>
#include <stdint.h>

#include "nccl.h"
#include "comm/base/error.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/base/crypto.h"
#include "comm/transport/socket.h"
#include "comm/transport/transport.h"
#include "compress/codec.h"
#include "compress/ef.h"
#include "topology/probe.h"
#include "topology/model.h"
#include "topology/regions.h"
#include "topology/replan.h"
#include "topology/topofile.h"
#include "topology/wan_tuning.h"
#include "comm/base/scratch.h"

#define GEO_COMM_MAGIC 0x47656f43634c4c31ULL /* "GeoCcLL1" */
#define GEO_MAX_REDOPS 64
#define GEO_HOSTNAME_LEN 64

/* A ring over some of the communicator's ranks: position i holds global
 * rank ranks[i] and segment number blk[i] of the buffer (the rank's own
 * block for all-gather/reduce-scatter); me is this rank's position.
 * pos_of[g] is the position of global rank g (full ring only). */
typedef struct {
    int n;
    int me;
    int *ranks;
    int *blk;
    int *pos_of;
} geoRing;

/* What each rank tells the others at bootstrap. */
typedef struct {
    geoNetPeer net;             /* data listener, same-host listener, host name */
    int32_t pid;
    int32_t nstreams;           /* rank 0's value is used by all */
    int64_t chunk_size;         /* rank 0's value is used by all */
    char region[TOPO_REGION_LABEL_LEN]; /* GEOCCL_REGION or topology file; "" */
    int32_t probe;              /* GEOCCL_PROBE; rank 0's value is used by all */
    int32_t ncpu;               /* CPUs online on this rank's host */
    int32_t streams_set;        /* GEOCCL_NSTREAMS given; rank 0's value is used by all */
    double window;              /* largest TCP window one stream can reach here (bytes) */
    int32_t warmup;             /* GEOCCL_WAN_WARMUP; rank 0's value is used by all */
    int32_t landmarks;          /* GEOCCL_PROBE_LANDMARKS; rank 0's value is used by all */
    int32_t encrypt;            /* GEOCCL_ENCRYPT: GEO_ENCRYPT_*; a pair uses the stronger */
    int32_t nccl_init;          /* GEOCCL_NCCL_INIT: GEO_NCCL_INIT_*; rank 0's value is used */
    int32_t dev_ready;          /* a CUDA device and NVIDIA's NCCL loaded (GEO_NCCL_INIT_LAZY:
                                 * not looked at, 0) */
    char dev_bus[16];           /* that device's PCI bus id ("" without one) */
    int32_t connect;            /* GEOCCL_CONNECT: GEO_CONNECT_*; rank 0's value is used */
} geoPeerInfo;

enum { GEO_NCCL_INIT_AUTO = 0, GEO_NCCL_INIT_EAGER = 1, GEO_NCCL_INIT_LAZY = 2 };

enum { GEO_CONNECT_AUTO = 0, GEO_CONNECT_ALL = 1, GEO_CONNECT_LAZY = 2 };

enum { GEO_ENCRYPT_OFF = 0, GEO_ENCRYPT_WAN = 1, GEO_ENCRYPT_ALL = 2 };

_Static_assert(sizeof(geoPeerInfo) <= GEO_BOOT_INFO_BYTES,
               "the bootstrap carries a peer info in GEO_BOOT_INFO_BYTES");

/* Per-communicator statistics (geocclCommGetStats). */
typedef struct {
    uint64_t calls_flat;
    uint64_t calls_hier;
    double t_intra_rs;          /* seconds in hierarchical phases */
    double t_inter;
    double t_intra_ag;
    double t_codec;             /* encoding and decoding */
} geoStats;

enum { GEO_ALGO_AUTO = 0, GEO_ALGO_FLAT, GEO_ALGO_HIER };

typedef struct {
    int used;
    ncclDataType_t datatype;
    ncclScalarResidence_t residence;
    unsigned char scalar[8];    /* host-immediate copy */
    const void *ptr;            /* ncclScalarDevice: read at each call */
    int real_valid;             /* real_op is its twin in the real NCCL */
    ncclRedOp_t real_op;
} geoRedOp;

struct geoDevState;             /* comm/device/dev_internal.h */
struct geoHierNodes;            /* comm/coll/hier_internal.h */

struct ncclComm {
    uint64_t magic;
    int rank;
    int nranks;
    int cuda_dev;               /* CUDA device current at init; -1: no GPU */
    char if_name[32];           /* the network interface of the data listener */
    ncclConfig_t real_cfg;      /* GPU tuning the user gave, for the real NCCL */
    struct geoDevState *dev;    /* device buffers: real NCCL, exchange thread */
    uint8_t secret[GEO_SHA256_BYTES];
    uint8_t *encrypt;           /* [nranks]: 1 where connections to that rank are encrypted */
    uint8_t *connect_want;      /* [nranks]: 1 where init connects to that rank, the others
                                 * on first use; NULL: every rank (GEOCCL_CONNECT) */
    int nosecret;               /* the secret follows from public values (GEO_ID_NOSECRET) */
    uint64_t comm_hash;         /* identifies the communicator in logs */
    geoPeerInfo *peers;

    geoNet net;                 /* the transport, its context and what it sent */
    int nstreams;
    size_t chunk_size;
    int window;
    double timeout;             /* seconds without progress */

    int blocking;
    char name[64];

    geoErr err;                 /* abort flag, first error, last error text,
                                 * operation in progress (base/error.h) */
    pthread_mutex_t lock;       /* redops, dev */
    geoScratch scratch;         /* receive buffers kept between calls */

    uint64_t op_seq;            /* collective calls issued */

    geoRedOp redops[GEO_MAX_REDOPS];

    topoRegionMap regions;
    geoRing ring;               /* all ranks in region order */
    geoRing region_ring;        /* my region's ranks, local order */
    int cma;                    /* my region's ranks read each other's memory (cma.h) */
    uint8_t cma_token[16];      /* what they read to check it */
    uint64_t *cma_peer_buf;     /* per call: each local rank's input, output, reachable */
    int cma_refused_noted;      /* a call's buffers could not be read: said once */
    struct geoHostSeg *hostseg; /* all ranks on this host: their shared segment
                                 * (comm/intra/hostseg.h); NULL: none */
    int algo;                   /* GEO_ALGO_* (GEOCCL_ALGO) */
    size_t hier_slice;          /* bytes per hierarchical slice */
    /* Region q's share of every piece of the hierarchical all-reduce,
     * hier_w[q] / TOPO_SHARE_ONE (topology/model.h topoHierShares); equal
     * unless the plan found the links uneven.  The same on every rank. */
    unsigned hier_w[64];
    int hier_uneven;
    struct geoHierNodes *hier_nodes; /* which ranks share a node (coll_hier_node.c) */
    geoWanTuning wan;           /* congestion control and pacing between regions
                                 * (topology/wan_tuning.h) */
    topoReplan replan;          /* the plan follows the links (comm/coll/replan.c) */
    int hier_depth;             /* GEOCCL_HIER_DEPTH: slices in flight; 0 auto */
    size_t direct_max;          /* all-reduce up to this many bytes: direct exchange */
    geoStats stats;
    geoTopo topo;               /* what the probe measured (probe.h) */
    geoTopoInherit inherit;     /* a split/shrink child: the parent's topology */
    topoFile topo_file;         /* GEOCCL_TOPO_FILE as loaded */
    int topo_file_loaded;
    int topo_file_missing;      /* GEOCCL_TOPO_FILE names no file: rank 0 writes it */

    /* Compression between regions (GEOCCL_COMPRESS, geocclCommSetCompression). */
    geoCodecId codec;
    geoCodecParams codec_params;
    int ef_enabled;             /* GEOCCL_EF != 0 */
    int ef_mode;                /* GEOCCL_EF: 1 both trips, 2 return only, 3 first only */
    geoEfStore ef;
    int ef_by_address;          /* GEOCCL_EF_KEY=address */
    struct geoEfReg *ef_regs;   /* geocclCommRegisterErrorFeedback (ef_lock) */
    uint64_t ef_next_tag;       /* tags of registrations: never reused */
    pthread_mutex_t ef_lock;
    int ef_unreg_noted;
    int codec_auto;             /* GEOCCL_COMPRESS=auto[:list]: the plan chooses */
    unsigned auto_mask;         /* codec ids (bits) auto may choose besides none */
    geoCodecParams auto_params; /* topk's fraction for auto */
    int call_codec;             /* the codec of the hierarchical call in progress */
    /* and, where the plan gives each region its own (host buffers only),
     * the codec of what each region sends (geoTuningRegionCodecs), or NULL */
    const unsigned char *call_region_codecs;
    topoPlan *plan;             /* comm/coll/tuning.h; NULL: no link figures */
    char plan_why[256];
    int plan_chunks;            /* the plan sets chunk/slice per call */
    int compress_fallback_noted;
    int ef_full_noted;

    pthread_t init_thread;      /* non-blocking init */
    int init_thread_live;
    int finalized;
    int active_calls;           /* API calls in flight (abort waits) */
    uint64_t split_count;       /* ncclCommSplit calls past validation (all ranks call) */
    struct geoElastic *elastic; /* membership in the store (comm/elastic); NULL without
                                 * one */
    int elastic_leaving;        /* geocclCommLeave was called (atomic) */
    uint32_t grow_count;        /* geocclCommGrow calls past validation (all ranks call) */
    /* The elastic job's key (geoElasticJobKey), once derived: scrypt runs
     * once per chain of grown, joined and shrunk communicators, each
     * handed the key of the one it came from; wiped at destroy. */
    uint8_t job_key[GEO_SHA256_BYTES];
    int job_key_set;
    uint32_t shrink_count;      /* ncclCommShrink calls past validation: every
                                 * survivor of a shrink has made the same ones */
};

/* Validate a handle: ncclInvalidArgument for NULL or a freed/foreign one. */
ncclResult_t geoCommCheck(const struct ncclComm *comm, const char *fn);
/* Report an error of an operation on comm where its cause is first known:
 * record the text that ncclGetLastError(comm) returns (and the thread's),
 * log it once at WARN with this file:line, evaluate to res.  The text
 * names the operation (geoErrOp), the peer and the cause.  It does not
 * mark the communicator broken: geoCommFail does, where the error is
 * asynchronous.  Typical use: `return GEO_COMM_ERR(comm, ncclSystemError,
 * "%s: out of memory", geoErrOp(&comm->err));`. */
#define GEO_COMM_ERR(comm, res, ...) GEO_ERR(&(comm)->err, (res), __VA_ARGS__)
/* Mark the communicator broken with res (first error wins). */
void geoCommFail(struct ncclComm *comm, ncclResult_t res);
ncclResult_t geoCommAsyncError(struct ncclComm *comm);

/* ncclGroupStart/End nesting of the calling thread: kept here, below the
 * API that changes it, so that the device path can ask. */
extern __thread int geoGroupDepth;
static inline int geoGroupActive(void) { return geoGroupDepth > 0; }

/* Compression settings from the environment (init) or geoccl.h. */
void geoCommCompressionInit(struct ncclComm *comm);
ncclResult_t geoCommSetCodec(struct ncclComm *comm, const char *spec);

/* Error feedback's keys (the rule is geoccl.h's, at
 * geocclCommRegisterErrorFeedback).  A registration is a byte range with a
 * tag no other registration of the communicator ever gets (from 2; 1 is
 * GEOCCL_EF_KEY=address, 0 no residual).  All three take comm->ef_lock. */
typedef struct geoEfReg {
    uintptr_t base;
    size_t bytes;
    uint64_t tag;
    struct geoEfReg *next;
} geoEfReg;
/* Adds [base, base + bytes): ncclInvalidArgument if it overlaps one already
 * registered (exactly the same memory: that registration's tag, success),
 * ncclSystemError without memory. */
ncclResult_t geoCommEfRegister(struct ncclComm *comm, const void *base, size_t bytes,
                               uint64_t *tag);
/* A communicator made from parent by ncclCommShrink or geocclCommGrow
 * starts with parent's registrations, under the same tags (the handles the
 * program holds), their residuals from zero (the new communicator's shards
 * differ); ncclSystemError without memory (child then has none). */
ncclResult_t geoCommEfInherit(struct ncclComm *parent, struct ncclComm *child);
/* Removes the registration of tag: 0, or -1 if there is none. */
int geoCommEfUnregister(struct ncclComm *comm, uint64_t tag);
/* The tag for a compressed all-reduce into [addr, addr + bytes): the
 * registration that holds all of it, 1 under GEOCCL_EF_KEY=address, else 0
 * (the call keeps no residual). */
uint64_t geoCommEfKey(struct ncclComm *comm, const void *addr, size_t bytes);

/* (Re)build the region map and rings from comm->peers[].region. */
ncclResult_t geoCommBuildRegions(struct ncclComm *comm);

/* Set by split/shrink around their geoCommInitInternal call (same thread):
 * the parent whose topology the child takes over. */
extern __thread const struct ncclComm *geoInitParent;
/* Set by geocclCommJoin around its geoCommInitInternal call: the figures a
 * joiner takes over from the members (no parent of its own); its label is
 * the joiner's region. */
extern __thread const geoTopoInherit *geoInitInherit;
/* The CUDA device a communicator initialised on this thread belongs to,
 * set by threads that init on a caller's behalf (ncclCommInitAll, inits
 * inside a group): GEO_INIT_DEV_CURRENT (the default) reads the thread's
 * current device, -1 is no GPU. */
#define GEO_INIT_DEV_CURRENT (-2)
extern __thread int geoInitDevice;

/* Bootstrap-level helpers used by split/shrink. */
ncclResult_t geoCommInitInternal(struct ncclComm **out, int nranks, const ncclUniqueId *id,
                                 int rank, const ncclConfig_t *config, int allow_env_root);

#endif
