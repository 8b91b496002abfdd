/*
 * GeoCCL's own additions to the NCCL API.
 *
 * Everything here is optional: a trainer that only calls nccl.h gets
 * GeoCCL's behaviour through environment variables.  All functions are
 * thread-safe and never block on the network, except the elastic calls at
 * the end, which say so.
 */
#ifndef GEOCCL_H_
#define GEOCCL_H_

#include <stdint.h>
#include <stdio.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One environment parameter as GeoCCL read it. */
typedef struct {
    const char *name;    /* e.g. "GEOCCL_TIMEOUT" */
    const char *value;   /* value in force (default or environment); may be NULL */
    const char *dflt;    /* default; may be NULL */
    const char *help;    /* one line */
    int is_set;          /* 1 when taken from the environment */
} geocclParamInfo;

/* Number of environment parameters GeoCCL reads. */
int geocclParamCount(void);

/* [out] info: parameter i (0 <= i < geocclParamCount()).
 * Returns ncclSuccess, or ncclInvalidArgument for a bad index or NULL info. */
ncclResult_t geocclParamGet(int i, geocclParamInfo *info);

/* One NCCL variable GeoCCL reads: a twin of a GEOCCL_ parameter, read when
 * that parameter is unset (the GEOCCL_ variable wins when both are set),
 * or one accepted with no twin (NCCL_IB_DISABLE). */
typedef struct {
    const char *name;    /* e.g. "NCCL_SOCKET_IFNAME" */
    const char *geoccl;  /* the parameter it stands in for; NULL: none */
    const char *how;     /* how its value maps, or what GeoCCL makes of it */
    const char *value;   /* its value in the environment now; NULL: unset */
} geocclNcclVarInfo;

/* Number of NCCL variables GeoCCL reads. */
int geocclNcclVarCount(void);

/* [out] info: NCCL variable i (0 <= i < geocclNcclVarCount()).
 * Returns ncclSuccess, or ncclInvalidArgument for a bad index or NULL info. */
ncclResult_t geocclNcclVarGet(int i, geocclNcclVarInfo *info);

/* Version of GeoCCL itself ("0.1.0"), distinct from ncclGetVersion's NCCL
 * API level. */
const char *geocclVersionString(void);

/* Communication settings the communicator agreed on at init (rank 0's
 * values win).  [out] nstreams: TCP connections per peer; [out] chunkBytes:
 * pipelining chunk; [out] timeoutSec: GEOCCL_TIMEOUT in force.  Any output
 * may be NULL.  ncclInvalidArgument for a NULL or dead comm. */
ncclResult_t geocclCommGetTransportInfo(ncclComm_t comm, int *nstreams, size_t *chunkBytes,
                                        double *timeoutSec);

/* [out] localPeers: how many peers this rank reaches over the same-host
 * fast path (GEOCCL_SHM: AF_UNIX sockets to ranks of the same host AND the
 * same network namespace; every other peer is reached over TCP).  Local to
 * the calling rank; any thread.  ncclInvalidArgument for a NULL or dead
 * comm or a NULL localPeers. */
ncclResult_t geocclCommGetLocalPeers(ncclComm_t comm, int *localPeers);

/* [out] reconnects: how many times a TCP connection to peer was reset (by
 * a NAT gateway, a firewall, a route change) and resumed, nothing lost or
 * repeated (GEOCCL_RECONNECT_TIMEOUT); [out] bytesResent: payload bytes sent
 * to peer again because of that.  peer -1: summed over every peer.  Local
 * to the calling rank; any thread.  Either output may be NULL.
 * ncclInvalidArgument for a NULL or dead comm or a peer out of range. */
ncclResult_t geocclCommGetReconnects(ncclComm_t comm, int peer, uint64_t *reconnects,
                                     uint64_t *bytesResent);

/* [out] singleCopy: 1 when the ranks of this rank's region, all on one
 * host, read each other's inputs directly (process_vm_readv) in the
 * hierarchical all-reduce's reduce-scatter; 0 when they pass them round
 * the ring (GEOCCL_CMA=0 on any of them, other hosts, or a kernel that
 * refused the check at init).  The same on every rank of a region.
 * ncclInvalidArgument for a NULL or dead comm or a NULL singleCopy. */
ncclResult_t geocclCommGetSingleCopy(ncclComm_t comm, int *singleCopy);

/* [out] encryptedPeers: how many peers this rank's connections to carry
 * authenticated, encrypted frames (GEOCCL_ENCRYPT); [out] cipher (may be
 * NULL): "aes-256-gcm", "chacha20-poly1305", a sentence naming both when
 * peers differ, or "none" when there is no such peer; the cipher is that of
 * the encrypted connections open so far (GEOCCL_CONNECT: pairs the plans do
 * not use connect on their first message), "none" before the first.  Local to the calling rank; any thread.  ncclInvalidArgument
 * for a NULL or dead comm or a NULL encryptedPeers. */
ncclResult_t geocclCommGetEncryption(ncclComm_t comm, int *encryptedPeers, const char **cipher);

/* Where this rank sits.  [out] nregions: regions in the communicator;
 * [out] region: this rank's region (0-based, numbered by lowest rank);
 * [out] localRank / regionSize: index and count within its region;
 * [out] name: the region's label (GEOCCL_REGION or topology file; "" for the
 * default region), valid while comm lives.  Any output may be NULL.
 * ncclInvalidArgument for a NULL or dead comm. */
ncclResult_t geocclCommGetRegion(ncclComm_t comm, int *nregions, int *region, int *localRank,
                                 int *regionSize, const char **name);

/* Counters since init (or the last reset), per communicator. */
typedef struct {
    unsigned long long bytesIntra;   /* payload bytes this rank sent inside its region */
    unsigned long long bytesWan;     /* payload bytes this rank sent to other regions */
    unsigned long long callsFlat;    /* collectives run with flat algorithms */
    unsigned long long callsHier;    /* all-reduces run hierarchically */
    double secIntraReduceScatter;    /* time in the hierarchical phases */
    double secInter;
    double secIntraAllGather;
    double secCodec;                 /* encoding and decoding compressed chunks */
    unsigned long long bytesWanRaw;  /* what bytesWan would have been uncompressed */
} geocclStats;

/* [out] stats.  Call from the thread that issues collectives on comm.
 * Device calls still queued on the exchange thread count too: this waits
 * until they are done (as geocclCommSetCompression does), since that
 * thread updates these counters.  geocclCommResetStats zeroes these and
 * geocclDeviceStats (below). */
ncclResult_t geocclCommGetStats(ncclComm_t comm, geocclStats *stats);
ncclResult_t geocclCommResetStats(ncclComm_t comm);

/* Where the time of the cross-region collectives on device buffers goes,
 * since init (or the last geocclCommResetStats), this rank.  The stream
 * phases are measured with CUDA events on the call's stream and tile its
 * span there, so they sum to secCall; secExchange is the exchange thread's
 * wall time, which overlaps them.  A call is counted once its stream work
 * is complete and its exchange is finished; nothing waits for that (the
 * events are read when they are found complete), so calls still running
 * are in callsInFlight and counted by a later read.  Calls on one region
 * (NVIDIA's NCCL alone) are not timed here.  Fields are only ever added at
 * the end: pass sizeof(geocclDeviceStats) as the caller knows it. */
typedef struct {
    unsigned long long calls;         /* calls counted below */
    unsigned long long callsInFlight; /* issued, not counted yet */
    unsigned long long callsUntimed;  /* not timed: failed, or too many in flight */
    double secCall;                   /* the calls' spans on their streams */
    double secReduceScatter;          /* NVIDIA's reduce-scatter in the region */
    double secEncode;                 /* GPU encode kernels */
    double secCopyOut;                /* copies to pinned host memory */
    double secWan;                    /* the stream waiting for the exchange between regions */
    double secCopyIn;                 /* copies back from pinned host memory */
    double secDecode;                 /* GPU decode, accumulate and average kernels */
    double secAllGather;              /* NVIDIA's all-gather in the region */
    double secOther;                  /* padding uneven counts, status words, ordering */
    double secExchange;               /* exchange thread: from the first data on the host to
                                         the last transfer done (host codecs included) */
    unsigned long long bytesWan;      /* payload bytes these calls sent to other regions */
    unsigned long long bytesWanRaw;   /* what bytesWan would have been uncompressed */
} geocclDeviceStats;

/* [out] stats: the figures above, the first statsBytes bytes of them
 * (statsBytes <= sizeof(geocclDeviceStats) of this header; a larger value
 * fills only what this library knows and zeroes the rest).  Does not
 * block.  Call from the thread that issues collectives on comm.  Returns
 * ncclSuccess, or ncclInvalidArgument for a NULL or dead comm or a NULL
 * stats. */
ncclResult_t geocclCommGetDeviceStats(ncclComm_t comm, geocclDeviceStats *stats,
                                      size_t statsBytes);

/* Compression of the all-reduce between regions for this communicator,
 * overriding GEOCCL_COMPRESS: "none", "lossless", "fp16", "bf16", "int8",
 * "int4", "sign" or "topk:<k>" (0 < k <= 1).  Lossy codecs apply only to
 * float32 sum/avg all-reduces (others are sent exactly) and use error
 * feedback unless GEOCCL_EF=0.  Takes effect at the next call; collective
 * in effect: every rank must choose the same codec.  Blocks until the
 * device all-reduces already issued on comm have finished their exchange
 * between regions (they keep the compression they were issued with).
 * Returns ncclSuccess, ncclInvalidArgument for a NULL/dead comm or an
 * unknown spec, or ncclSystemError when those exchanges did not finish
 * within GEOCCL_TIMEOUT. */
ncclResult_t geocclCommSetCompression(ncclComm_t comm, const char *spec);

/* [out] name: the codec in force ("none", "int8", ..., or "auto" when the
 * plan chooses per call), static string. */
ncclResult_t geocclCommGetCompression(ncclComm_t comm, const char **name);

/* Forgets all error-feedback residuals of comm (e.g. when the model's
 * buckets change).  Memory for them is bounded by GEOCCL_EF_MAX_BYTES:
 * beyond it the least recently used residuals are dropped (logged once at
 * INFO).  Blocks until the device all-reduces already issued on comm have
 * finished their exchange between regions (they use the residuals).
 * ncclSystemError when they did not within GEOCCL_TIMEOUT. */
ncclResult_t geocclCommResetErrorFeedback(ncclComm_t comm);

/* Error feedback and buffer identity.  A lossy codec's residual (what the
 * last encode of a buffer lost) is added to the next encode of the same
 * tensor; added to another tensor, it is a silent error in that tensor's
 * gradient.  An address does not name a tensor: allocators (PyTorch's
 * caching allocator, FSDP's flat parameters, temporaries) place other
 * tensors where a freed one was, often with the same size.  So the rule:
 *
 *   A compressed all-reduce keeps and uses residuals only when its recvbuff
 *   lies wholly inside memory registered with
 *   geocclCommRegisterErrorFeedback; the residual belongs to that
 *   registration and to the call's (address, count) within it, and dies
 *   with geocclCommDeregisterErrorFeedback (or ncclCommDestroy).  A later
 *   registration of the same memory starts from zero residuals.  Any other
 *   compressed call is encoded without error feedback (said once at INFO).
 *
 * A communicator made from comm by ncclCommShrink or geocclCommGrow (the
 * survivors, or the grown group: the same training buffers) starts with
 * comm's registrations under the same handles, their residuals from zero;
 * deregister on it what it should no longer keep.  Other communicators,
 * ncclCommSplit's included, start with none.  Registering exactly the
 * memory of a registration comm has returns that registration's handle
 * (one registration: a single deregistration drops it).
 *
 * Register memory that holds the same tensor from call to call (DDP's
 * gradient buckets, an optimiser's flat gradient, DiLoCo's pseudo-
 * gradient), and deregister it before that memory holds anything else.
 * Which registration a call uses is decided when the call is made.
 * GEOCCL_EF_KEY=address keys the residuals of calls outside every
 * registration by address and count instead, for unmodified programs that
 * all-reduce only persistent buffers (with the risk above).
 *
 * Register: [in] buff, bytes (> 0) the memory, host or device; it must not
 * overlap another registration of comm, unless it is exactly its memory.  [out] handle.  Returns
 * ncclSuccess, ncclInvalidArgument (NULL or dead comm, NULL buff or handle,
 * bytes 0, an overlap) or ncclSystemError (no memory).  Deregister: frees
 * the registration's residuals after the device all-reduces already issued
 * on comm have finished their exchange between regions; ncclInvalidArgument
 * for a handle comm did not return (or already deregistered), ncclSystemError
 * when those exchanges did not finish within GEOCCL_TIMEOUT. */
ncclResult_t geocclCommRegisterErrorFeedback(ncclComm_t comm, void *buff, size_t bytes,
                                             void **handle);
ncclResult_t geocclCommDeregisterErrorFeedback(ncclComm_t comm, void *handle);

/* What the topology probe found at init (see geoccl-probe).  Nodes are
 * the distinct listening addresses of the ranks; regions as in
 * geocclCommGetRegion. */
typedef struct {
    int nnodes;
    int nregions;
    int rttMeasured;       /* round trips between node leaders were measured */
    int regionsMeasured;   /* the regions came from those RTTs (no labels) */
    int bwMeasured;        /* bandwidth between regions was measured */
    int fromFile;          /* link rates came from GEOCCL_TOPO_FILE */
    int inherited;         /* regions and link figures came from the parent
                              communicator (ncclCommSplit, ncclCommShrink) */
    double rttCutMs;       /* RTT that separated regions (0: one region) */
    int streamsNeeded;     /* TCP streams per WAN pair to fill the links */
    double windowBytes;    /* largest window one TCP stream may reach here */
    double secProbe;       /* time the probe took at init once every node had arrived, */
    double secRtt;         /* and its parts */
    double secBw;
    double secWait;        /* time this rank waited before that for slower peers */
    int pairsMeasured;     /* pairs of regions whose link figures were measured */
    int pairsInherited;    /* pairs of regions whose link figures came from the
                              parent (or a joiner's admission).  A grow that
                              brings a region the parent's figures lack
                              measures only the pairs with it: then both are
                              non-zero (docs/elastic.md) */
} geocclTopology;

/* [out] topo.  ncclInvalidArgument for a NULL/dead comm or NULL topo. */
ncclResult_t geocclCommGetTopology(ncclComm_t comm, geocclTopology *topo);

/* The warm-up of the WAN connections at init, after the probe
 * (GEOCCL_WAN_WARMUP): [out] regionPairs, pairs of regions whose
 * connections carried it (the same on every rank; 0: none), [out] sec, the
 * time this rank spent in it.  Either may be NULL.
 * ncclInvalidArgument for a NULL/dead comm. */
ncclResult_t geocclCommGetWarmup(ncclComm_t comm, int *regionPairs, double *sec);

/* [out] name: the TCP congestion control this rank set on its connections
 * to other regions at init (GEOCCL_WAN_CC; "mixed" where auto chose per
 * pair), or "" when they kept the others' (one region, GEOCCL_WAN_CC=host,
 * or a kernel that refused it).  Pairs moved from bbr to cubic after init
 * are not reflected: geocclCommGetWanPlan says those.  Valid while
 * comm lives.  ncclInvalidArgument for a NULL/dead comm or NULL name. */
ncclResult_t geocclCommGetWanCongestion(ncclComm_t comm, const char **name);

/* What GEOCCL_WAN_CC=auto (the default) chose for the connections from
 * region `from` to region `to`: [out] cc "cubic" or "bbr" ("" where it did
 * not choose: GEOCCL_WAN_CC named one, or one region), [out] why, the
 * reason in words, [out] loss, the share of TCP segments the probe's
 * transfer lost on that pair (< 0: not measured).  Every rank computes
 * every pair from the figures all ranks hold; whether the kernel has bbr
 * is this rank's.  For this rank's own region (from), a pair it moved
 * from bbr to cubic after init, once its connections' own counts showed
 * cubic would do (docs/wan-tuning.md, "The watch"), says
 * cubic and why.  Any output may be NULL; valid while comm lives.
 * ncclInvalidArgument for a NULL/dead comm or a region out of range. */
ncclResult_t geocclCommGetWanPlan(ncclComm_t comm, int from, int to, const char **cc,
                                  const char **why, double *loss);

/* The plan following the links (GEOCCL_REPLAN, docs/wan-tuning.md): [out]
 * replans, how many times this communicator made its plan again from what
 * its calls achieved (every rank the same); [out] shares, nregions long,
 * each region's share of the hierarchical all-reduce now (sum 1);
 * [out] why, the last re-plan's reason in words ("" none; valid while comm
 * lives).  geocclCommGetLinks's egressMbit gives the uplink figures the
 * plan now uses.  Any output may be NULL.  ncclInvalidArgument for a
 * NULL/dead comm. */
ncclResult_t geocclCommGetReplan(ncclComm_t comm, int *replans, double *shares,
                                 const char **why);

/* Node `node` (0 <= node < nnodes): [out] addr (numeric, valid while comm
 * lives), [out] leaderRank (its lowest rank), [out] region, [out] nicGbit
 * (nominal rate of the node's data interface as its kernel reports it; -1
 * unknown: virtual links, or a node whose figures were not exchanged
 * because no RTT was measured).  Any output may be NULL.
 * ncclInvalidArgument for a bad comm or index. */
ncclResult_t geocclCommGetNode(ncclComm_t comm, int node, const char **addr, int *leaderRank,
                               int *region, double *nicGbit);

/* [out] rttMs: nnodes x nnodes round-trip times in ms, row-major (minimum
 * of the samples; -1 where not measured).  ncclInvalidArgument for a bad
 * comm or NULL rttMs; ncclInvalidUsage when no RTT was measured. */
ncclResult_t geocclCommGetRtt(ncclComm_t comm, double *rttMs);

/* Links between regions, each output nregions x nregions row-major or
 * nregions long, any may be NULL: [out] bwMbit: rate measured from region i
 * to j while every region sent to every other at once (0 unknown);
 * [out] rttMs: RTT between regions (-1 unknown); [out] egressMbit: all
 * that region i sent per second (its WAN link); [out] onewayMs: each
 * region's one-way delay under RTT(i,j) = d_i + d_j. */
ncclResult_t geocclCommGetLinks(ncclComm_t comm, double *bwMbit, double *rttMs,
                                double *egressMbit, double *onewayMs);

/* [out] ingressMbit, nregions long: the rate that reaches region i from the
 * others where its downlink held flows back while every region sent to
 * every other (or a topology file's in=), 0 where no limit of its own was
 * seen.  The hierarchical all-reduce's shares use the slower of a region's
 * egress and ingress.  ncclInvalidArgument for a bad comm or NULL output. */
ncclResult_t geocclCommGetIngress(ncclComm_t comm, double *ingressMbit);

/* Writes the regions, node addresses and link figures as a topology file
 * (the format GEOCCL_TOPO_FILE loads; with it the next init skips the
 * probe).  ncclInvalidArgument for a bad comm or NULL path; ncclSystemError
 * when the file cannot be written (last error says why). */
ncclResult_t geocclCommWriteTopology(ncclComm_t comm, const char *path);

/* Writes the plan in force to out: per collective and message-size range
 * the algorithm (flat or hier), codec, chunk or slice, streams and the
 * predicted time, as a table or (json != 0) one JSON object; without link
 * figures, one line saying why there is no plan.  ncclInvalidArgument for
 * a bad comm or NULL out. */
ncclResult_t geocclCommPrintPlan(ncclComm_t comm, FILE *out, int json);

/* The planning tool behind geoccl-probe --simulate: reads a described
 * topology (the GEOCCL_TOPO_FILE format with ranks= per region; any scale)
 * and writes to out the regions, links, the plan and the predicted
 * all-reduce times per message size for flat, hierarchical and each codec,
 * as text or (json != 0) JSON.  Runs nothing.  ncclInvalidArgument for a
 * NULL path or out; ncclInvalidUsage when the file cannot be read or lacks
 * what the model needs (ncclGetLastError(NULL) names file and line). */
ncclResult_t geocclSimulate(const char *topoFile, int json, FILE *out);

/* ---- Elastic membership (docs/elastic.md) ---------------------------------
 *
 * A job whose regions may vanish and come back.  These calls sit beside the
 * NCCL life cycle rather than replacing it:
 *  - losing ranks: the call in flight fails (never a wrong value, never a
 *    hang); every survivor asks geocclCommGetFailedRanks for the dead set,
 *    which is the same on every survivor when a membership store is
 *    configured, and passes it to ncclCommShrink(..., NCCL_SHRINK_ABORT):
 *    the child keeps the parent's measured topology (no probe);
 *  - adding ranks: ncclCommInitRank cannot admit a process that does not
 *    hold the communicator's unique id, and ncclCommSplit/ncclCommShrink
 *    only make subsets, so a new or restarted process calls geocclCommJoin
 *    (it registers in the store and waits), and every member calls
 *    geocclCommGrow at a point it chooses (between training rounds), which
 *    makes a new communicator of the members and the joiners, as
 *    ncclCommSplit makes one of a subset: the parent stays usable and is
 *    destroyed by the caller; the child's secret is derived from
 *    GEOCCL_COMM_SECRET, never sent;
 *  - leaving on purpose: a rank calls geocclCommLeave, then geocclCommGrow
 *    with the others at the next round boundary; nobody sees an error.
 * The store is etcd (GEOCCL_ELASTIC_ETCD, GEOCCL_ELASTIC_JOB).  Without it,
 * when GEOCCL_ELASTIC_JOB is set, the process holding the first bootstrap
 * root serves the same records next to GEOCCL_COMM_ID (its port + 1), so
 * that region must survive.  Every process of the job,
 * members and joiners, shares GEOCCL_COMM_SECRET; records in the store hold
 * no secret and carry a MAC under a key derived from it. */

/* [out] ranks (up to maxRanks of them, ascending), [out] count (all of
 * them, which may exceed maxRanks): the ranks of comm that are dead.  On a
 * healthy comm, none (count 0).  After an error, with a store, this rank
 * says it is alive and waits (within GEOCCL_ELASTIC_TIMEOUT) until every
 * rank of comm has said so too or lost its lease, and the first survivor to
 * see that records the dead set; every survivor then gets that same set.
 * Without a store: the ranks this rank's transport found dead, and those
 * whose death the others' errors named, which survivors can disagree on.
 * Called again on the same comm after its ncclCommShrink failed (a
 * survivor died during the shrink), it agrees afresh: the agreement is per
 * shrink attempt.
 * Blocks (store round trips); any thread.  ncclInvalidArgument for a bad
 * comm or count NULL (ranks may be NULL when maxRanks is 0);
 * ncclRemoteError when the store cannot be reached or the survivors do not
 * settle within the timeout; ncclSystemError out of memory. */
ncclResult_t geocclCommGetFailedRanks(ncclComm_t comm, int *ranks, int maxRanks, int *count);

/* [out] joiners: processes registered through geocclCommJoin and not yet
 * admitted, as this process last saw them (a background thread reads the
 * store every GEOCCL_ELASTIC_POLL_MS; this call sends nothing).  Ranks can
 * see different counts for a moment: agree before calling geocclCommGrow
 * (e.g. an all-reduce of the counts with ncclMax).  0 without a store or
 * GEOCCL_ELASTIC_JOB.  ncclInvalidArgument for a bad comm or NULL joiners. */
ncclResult_t geocclCommJoinersWaiting(ncclComm_t comm, int *joiners);

/* Mark the calling rank as leaving comm: at the next geocclCommGrow this
 * rank gets *newcomm = NULL and the others a communicator without it.
 * Local (nothing is sent until geocclCommGrow); any thread.
 * ncclInvalidArgument for a bad comm. */
ncclResult_t geocclCommLeave(ncclComm_t comm);

/* Every rank of comm calls it at the same point (a collective call on comm,
 * which must be healthy).  Every rank first tells the others whether it
 * called geocclCommLeave; then the lowest rank that stays decides which
 * joiners are admitted (those registered when it looks, at most 64, in
 * registration order) and tells the others over comm.
 * [out] newcomm: a communicator of comm's remaining ranks in their order,
 * then the joiners; NULL for a rank that leaves, and for every rank when
 * there was nobody to admit and nobody leaving (comm is then unchanged).
 * The links between known regions are not measured again (the parent's
 * figures, kept for regions that left, are handed to the joiners); a region
 * never seen before is measured.  The parent stays usable; destroy it when
 * done.  config: as ncclCommSplit's (NULL: the parent's blocking mode).
 * Blocks until the new communicator is made.  ncclInvalidArgument for a
 * bad comm or NULL newcomm; ncclInvalidUsage when GEOCCL_COMM_SECRET is
 * not set (the new secret derives from it); the error of the exchange or
 * of the new communicator's init otherwise (comm's last error says which). */
ncclResult_t geocclCommGrow(ncclComm_t comm, ncclComm_t *newcomm, ncclConfig_t *config);

/* A process that is not a member yet (a region restarted after
 * preemption, or a new one) registers in the store with its region
 * (GEOCCL_REGION) and waits until the members call geocclCommGrow, within
 * GEOCCL_ELASTIC_JOIN_TIMEOUT (default 600 s: members admit joiners only
 * between rounds).  [out] newcomm: the communicator it joined; its rank and
 * size through ncclCommUserRank and ncclCommCount.  config: as
 * ncclCommInitRankConfig's.  Blocks.  ncclInvalidUsage when
 * GEOCCL_COMM_SECRET is not set, or neither GEOCCL_ELASTIC_ETCD nor
 * GEOCCL_ELASTIC_JOB with GEOCCL_COMM_ID says where the job is; ncclRemoteError when the store
 * cannot be reached or the wait times out; the init's error otherwise. */
ncclResult_t geocclCommJoin(ncclComm_t *newcomm, ncclConfig_t *config);

#ifdef __cplusplus
}
#endif

#endif
