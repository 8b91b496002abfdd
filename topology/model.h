/* The cost model and the plan.
 *
 * A topoModel describes regions joined by a WAN: how many ranks each region
 * has, the rate of its WAN egress (everything the region sends to other
 * regions shares it: that is how clouds and the emulator shape), its one-way
 * WAN delay, the intra-region link (and, where described, the nodes of a
 * region and the link inside a node), and how many TCP streams a WAN peer
 * pair may use.  topoPredict turns that into seconds for one collective with one
 * algorithm, codec, chunk size and stream count (the formulas and the
 * measurements they were checked against are in model.c's top comment);
 * topoPlanBuild (model_plan.c) picks, per collective and message-size
 * range, the cheapest choice, which the library and geoccl-probe print and
 * obey.
 *
 * Everything here is a pure function of its arguments: no I/O except the
 * print functions, no global state, no allocation.  Any thread may call any
 * of them.  Layering: codecs are described by plain topoCodecCost values so
 * that this module does not include compress/ (comm/ fills them in from
 * compress/codec.h; topoDefaultCodecCosts has the measured defaults).
 */
#ifndef GEOCCL_TOPO_MODEL_H_
#define GEOCCL_TOPO_MODEL_H_

#include <stddef.h>
#include <stdio.h>

#include "topology/regions.h"
#include "topology/topofile.h"

#define TOPO_MODEL_MAX_REGIONS 64

/* Collectives the model predicts.  `bytes` always means the whole buffer:
 * all-reduce and broadcast: the buffer; all-gather: the output (every
 * rank's block); reduce-scatter: the input (every rank's block). */
enum {
    TOPO_COLL_ALLREDUCE = 0,
    TOPO_COLL_ALLGATHER = 1,
    TOPO_COLL_REDUCESCATTER = 2,
    TOPO_COLL_BROADCAST = 3,
    TOPO_COLL_COUNT = 4
};

/* Algorithms: FLAT is one ring (chain for broadcast) over all ranks in
 * region order, with the direct exchange for small all-reduces; HIER is
 * comm/coll/coll_hier.c. */
enum { TOPO_ALGO_FLAT = 0, TOPO_ALGO_HIER = 1, TOPO_ALGO_COUNT = 2 };

/* Codec id of "no compression" (compress/codec.h's GEO_CODEC_NONE). */
#define TOPO_CODEC_NONE 0

typedef struct {
    int nregions;                              /* 1..TOPO_MODEL_MAX_REGIONS */
    char names[TOPO_MODEL_MAX_REGIONS][TOPO_REGION_LABEL_LEN]; /* for printing */
    int ranks[TOPO_MODEL_MAX_REGIONS];         /* ranks per region, >= 1 */
    double egress_Bps[TOPO_MODEL_MAX_REGIONS]; /* WAN egress rate, bytes/s, > 0 */
    /* Limit on what reaches region q from the others, bytes/s (a slow
     * downlink; the same goodput factor as egress_Bps); 0: none of its own. */
    double ingress_Bps[TOPO_MODEL_MAX_REGIONS];
    double lat_s[TOPO_MODEL_MAX_REGIONS];      /* one-way WAN delay, s, >= 0 */
    /* Measured RTT between regions i and j in seconds; 0 = unknown, use
     * lat_s[i] + lat_s[j].  Symmetric (both halves are read). */
    double rtt_s[TOPO_MODEL_MAX_REGIONS][TOPO_MODEL_MAX_REGIONS];
    double intra_alpha_s;  /* intra-region latency per message, s */
    double intra_Bps;      /* intra-region bandwidth per rank, bytes/s, > 0 */
    int wan_streams;       /* TCP streams available per WAN peer pair, >= 1 */
    double stream_Bps;     /* throughput cap of one stream (window / RTT), 0 = none */
    /* Payload fraction of egress_Bps: 1448/1500 when egress_Bps is a link
     * or shaper rate (TCP/IP headers count against it), 1 when it is a
     * measured goodput (what the probe reports). */
    double wan_goodput;
    size_t chunk;          /* default ring chunk (GEOCCL_CHUNK_SIZE, 512 KiB) */
    size_t hier_slice;     /* default hierarchical slice (GEOCCL_HIER_SLICE, 4 MiB) */
    size_t direct_max;     /* direct exchange up to this (GEOCCL_DIRECT_MAX, 16 KiB) */
    /* Ranks per CPU on the most crowded host (1: each rank has a core of
     * its own).  Above 1 the caller's work per slice, and every wait in it,
     * takes that many times longer: the emulated regions run 6 ranks on 2
     * cores. */
    double cpu_share;
    /* 1: the hierarchical all-reduce splits every piece equally among the
     * regions whatever their links (GEOCCL_HIER_SHARES=equal), 0: by
     * topoHierShares. */
    int hier_equal;
    /* intra_Bps was measured with every rank of the host moving data at
     * once (the probe's figure, or a topology file's): the sharing of cores
     * is in it already, so cpu_share does not scale the intra transfers. */
    int intra_shared;
    /* Share of TCP segments lost on region i's egress (0: none), and
     * whether its connections run a loss-driven congestion control
     * (cubic, reno: 1) or BBR (0).  A loss-driven connection holds
     * topoLossRate of the region's RTTs and that loss, whatever the link
     * could carry; BBR has no such term. */
    double loss[TOPO_MODEL_MAX_REGIONS];
    int loss_driven[TOPO_MODEL_MAX_REGIONS];
    /* The node level inside a region.  node_ranks[q]: ranks per node
     * (host) in region q, the same on every node of the region; 0 or 1:
     * not described, and intra_alpha_s / intra_Bps join any two ranks of
     * the region, as without nodes.  Where it is >= 2, intra_* is the
     * fabric between nodes (per rank: each rank has its share of the
     * node's NICs) and node_alpha_s / node_Bps the link between two ranks
     * of one node (NVLink, PCIe, shared memory). */
    int node_ranks[TOPO_MODEL_MAX_REGIONS];
    double node_alpha_s;
    double node_Bps;
    /* 1: the hierarchical all-reduce runs its intra-region phases in two
     * stages in every region of two nodes or more with two ranks or more
     * each (a node stage among the ranks of a node, then a region stage
     * among the ranks with the same place on every node); 0: one ring
     * over the whole region.  The plan tries both (topoPlanEntry). */
    int node_stage;
} topoModel;

/* One codec's costs.  Throughputs are of raw (uncompressed) bytes on one
 * core; 0 means free.  ratio = raw bytes / encoded bytes (1 = none). */
typedef struct {
    int id;            /* compress/codec.h's geoCodecId (0 = none) */
    const char *name;  /* as GEOCCL_COMPRESS spells it */
    double ratio;
    double enc_Bps, dec_Bps;
    int lossy;         /* 1: needs the user's consent (allowed_mask) */
} topoCodecCost;

/* The per-core throughputs tests/unit/test_codec measured (64 MiB of Gaussian
 * float32, one thread; model.c says which run) and the ratios of block 256 /
 * topk 0.01; indexed by id (none, lossless, fp16, bf16, int8, int4, sign,
 * topk). */
extern const topoCodecCost topoDefaultCodecCosts[];
extern const int topoDefaultNCodecs;

/* Fills every field with a default: no regions, intra 20 us / 5 GB/s,
 * 2 streams, no stream cap, goodput 1, chunk 512 KiB, slice 4 MiB, direct
 * 16 KiB (the library's defaults, comm/base/param.c); no nodes described,
 * a node link equal to the intra link, node stage on. */
void topoModelInit(topoModel *m);

/* Builds a model from a topology file: regions in file order with their
 * ranks= (or the number of `rank` lines naming them), bw=, in=, delay= and
 * node_ranks= (else the `node ranks=` line's); `rtt` lines, `intra`,
 * `node` and `streams` (defaults of topoModelInit where absent; a region
 * whose ranks a node does not divide evenly is an error).  File rates are link rates, so wan_goodput = 1448/1500.  Returns
 * 0; or -1 with a message in err naming the region and what it lacks
 * (ranks, bw, or a delay/rtt to every other region). */
int topoModelFromFile(const topoFile *tf, topoModel *out, char *err, size_t errlen);

/* Predicted seconds for one call.
 *   coll     TOPO_COLL_*; algo TOPO_ALGO_* (HIER on one region = FLAT)
 *   codec    NULL = none; applies to all-reduce HIER only (the library
 *            compresses nothing else), ignored otherwise
 *   bytes    whole buffer (see TOPO_COLL_*)
 *   chunk    FLAT: ring chunk; HIER: slice; 0 = the model's default
 *   nstreams streams per WAN peer pair; <= 0 = m->wan_streams
 * Returns the time (>= 0), or -1 for an invalid model or argument. */
double topoPredict(const topoModel *m, int coll, int algo, const topoCodecCost *codec,
                   size_t bytes, size_t chunk, int nstreams);
/* The hierarchical all-reduce with codecs[q] on what region q sends (its
 * X1 partials and X2 parts; NULL: exact), slice and streams as
 * topoPredict's chunk and nstreams.  codecs NULL: none anywhere. */
double topoPredictHierByRegion(const topoModel *m, const topoCodecCost *const *codecs,
                               size_t bytes, size_t slice, int nstreams);

/* The hierarchical all-reduce's time by stage, for geoccl-probe
 * --simulate.  node_s and region_s: the caller's time in the node stage
 * and in the region stage (reduce-scatter and all-gather together, every
 * slice, the slowest region); wan_s: the WAN stage's transfer time (X1
 * and X2, every slice, the slowest region); latency_s: the two one-way
 * delays of the first slice.  Stages overlap across slices, so total_s is
 * not their sum.  bound_s: the WAN bound, what the WAN alone takes for
 * the call: its bytes at the regions' rates (topoHierWanPerByte, the same
 * shares) plus the two one-way delays X1 and X2 take in turn (bw_bound_s:
 * the bytes alone). */
typedef struct {
    double total_s, node_s, region_s, wan_s, latency_s, bound_s, bw_bound_s;
    size_t slice;
    size_t nslices;
    int node_stage;   /* 1: at least one region ran the node stage */
    /* of the regions that ran it, how many run the region stage by
     * recursive halving (a power-of-two number of nodes), how many as a
     * ring */
    int halving_regions, ring_regions;
} topoHierStages;

/* The hierarchical all-reduce of `bytes` exact (codec NULL) or with one
 * codec for all regions, slice and nstreams as topoPredict's, the node
 * stage as m->node_stage says.  Returns 0, or -1 for an invalid model,
 * argument or a single region. */
int topoPredictHierStages(const topoModel *m, const topoCodecCost *codec, size_t bytes,
                          size_t slice, int nstreams, topoHierStages *out);
/* 1 when some region of m has two nodes or more of two ranks or more
 * each (the node stage applies there), else 0. */
int topoModelHasNodes(const topoModel *m);

/* ---- plan ---------------------------------------------------------------- */

/* Size buckets: [2^k, 2^(k+1)) for 1 KiB <= 2^k <= 4 GiB (the first also
 * takes everything below 1 KiB, the last everything above); each bucket's
 * choice is made at 1.5 x 2^k (the first's at 1 KiB). */
#define TOPO_PLAN_MIN_LOG2 10
#define TOPO_PLAN_MAX_LOG2 32
#define TOPO_PLAN_BUCKETS (TOPO_PLAN_MAX_LOG2 - TOPO_PLAN_MIN_LOG2 + 1)

/* Pins choices the user forced by env; -1 = free.  A forced codec counts
 * as the user's consent (it may be outside allowed_mask) but still applies
 * only where the chosen algorithm compresses (all-reduce HIER). */
typedef struct {
    int algo;
    int codec;       /* codec id */
    int nstreams;
    long long chunk; /* bytes */
} topoPlanForce;

#define TOPO_PLAN_FORCE_NONE {-1, -1, -1, -1}

typedef struct {
    size_t lo, hi;    /* message sizes [lo, hi]; hi = SIZE_MAX for the last */
    int algo;         /* TOPO_ALGO_* */
    int codec;        /* codec id, TOPO_CODEC_NONE when uncompressed */
    char codec_name[24];
    size_t chunk;     /* FLAT: ring chunk; HIER: slice */
    int nstreams;
    double sec_lo;    /* predicted at the first bucket's size (1.5 x its start) */
    double sec_top;   /* predicted at the last bucket's size */
    /* All-reduce HIER with a codec not forced: 1 when each region sends
     * in a codec of its own, region_codec[q] (id; none where compressing
     * its link does not pay), 0 when every region uses `codec`.  `codec`
     * is still the best single codec (what a call that does not mix
     * codecs, any all-reduce of device buffers across regions, uses). */
    int by_region;
    unsigned char region_codec[TOPO_MODEL_MAX_REGIONS];
    /* All-reduce HIER: 1 when the intra-region phases run node stage then
     * region stage (topoModel.node_stage), 0 for one ring per region. */
    int node_stage;
} topoPlanEntry;

typedef struct {
    int nregions, nranks;
    int nentries[TOPO_COLL_COUNT];
    topoPlanEntry entries[TOPO_COLL_COUNT][TOPO_PLAN_BUCKETS];
    char codec_names[32][24]; /* by codec id, from topoPlanBuild's table */
    char region_names[TOPO_MODEL_MAX_REGIONS][TOPO_REGION_LABEL_LEN]; /* the model's */
} topoPlan;

/* Chooses, per collective and size bucket, algorithm, codec (among codecs
 * whose id bit is set in allowed_mask, and none, which is always allowed),
 * chunk and streams with the least predicted time; among choices within 1%
 * of the least, the simplest (flat, no codec, codecs in table order, the
 * default chunk, fewer streams).  Where that is the hierarchical
 * all-reduce and no codec is forced, it then chooses a codec per sending
 * region (by_region): from the best single codec, each region takes
 * another allowed codec where that gains over 1%, region by region until
 * nothing changes; then each region sends exactly where the time stays
 * within 1% of what that reached.  The mix is kept when it differs from
 * one codec for all.  So a slow link compresses and a fast one, where
 * compressing saves no time (another region sets the pace, or encoding
 * costs what the link time saves), sends exactly.  Then merges
 * neighbouring buckets with the same choice.
 * One region: always flat, no codec.  codecs may be NULL (ncodecs 0);
 * force may be NULL.  Returns 0, or -1 for an invalid model (out
 * untouched). */
int topoPlanBuild(const topoModel *m, const topoCodecCost *codecs, int ncodecs,
                  unsigned allowed_mask, const topoPlanForce *force, topoPlan *out);

/* The entry whose range holds bytes (binary search); NULL for a bad coll. */
const topoPlanEntry *topoPlanLookup(const topoPlan *plan, int coll, size_t bytes);

/* Human table, one line per range. */
void topoPlanPrint(const topoPlan *plan, FILE *f);
/* The same as one JSON object (no trailing newline). */
void topoPlanJson(const topoPlan *plan, FILE *f);

/* Shares of the hierarchical all-reduce.  Each piece of a slice is split
 * among the regions; region q reduces share f_q of it (coll_hier.c's X1)
 * and sends the result back (X2), so per slice of L bytes it sends, and
 * receives, L (1 + (R-2) f_q): its partial of the others' shares once, and
 * its own share to R-1 regions.  With two regions that is L whatever the
 * split; with more, equal shares make the slowest link carry as much as the
 * fastest.  topoHierShares picks the split that minimises the slowest
 * region's time max_q L (1 + (R-2) f_q) / E_q (E_q: the slower of its
 * egress and its ingress goodput):
 * water-filling, where every region with a share finishes together and a
 * region too slow for any share (f_q = 0) still sends its partial once,
 * so L / min_q E_q is the least any split can take.  Shares are fixed-point,
 * w[q] / TOPO_SHARE_ONE, summing to TOPO_SHARE_ONE, computed alike on every
 * rank from the same model, so every rank cuts the same parts.  Returns 1
 * when the split is uneven, 0 when it is equal (R < 3, a gain under
 * TOPO_SHARES_MIN_GAIN, hier_equal set, or rates unknown). */
#define TOPO_SHARE_ONE 65536u
/* Least gain (equal shares' WAN time over the split's) for which
 * topoHierShares splits unevenly.  On symmetric 3x2 links at 100 Mbit/s
 * the probe's rates put one region 11% below (clean) and 25% above (1%
 * loss) the others; with a 3% threshold the plan split unevenly there, and the
 * region given the larger share sent 1.04x and 1.16x the bytes of an equal
 * split, which set the call's time (BENCHMARKS.md, "Lossy and jittery
 * paths"); the rates behind the third such run (0.01% loss) put one
 * region 20% below the fastest and 16% below the other, a gain of 1.148.
 * With three regions, 1.15 still splits where one is 18.4% slower or 1.45x
 * faster than the other two, and every uneven topology measured gains
 * 1.34x or more. */
#define TOPO_SHARES_MIN_GAIN 1.15
int topoHierShares(const topoModel *m, unsigned w[TOPO_MODEL_MAX_REGIONS]);
/* Seconds per byte of the slowest region's WAN traffic in the hierarchical
 * all-reduce with shares w: max_q (1 + (R-2) w_q / ONE) / E_q.  Times the
 * message size it is the all-reduce's WAN bound for that split. */
double topoHierWanPerByte(const topoModel *m, const unsigned *w);

/* A region's ingress limit from the probe's rates bw[g * R + h] (region g
 * to h, bytes/s, every pair sending at once): a downlink that holds flows
 * back shows as a flow g -> h at under half the rate of g's fastest flow to
 * a third region (the sender had the capacity: its other flows got it),
 * with all that h received under half of what the busiest sender sent in
 * all; then what h received is its ingress.  ingress[h] = 0 otherwise
 * (nothing to tell it from the senders' egress).  The second condition
 * keeps one slow flow from passing for a downlink: at 1 Gbit/s with 0.1%
 * loss the probe's 0.6 s transfer once saw r0 -> r2 at a third of r0 -> r1
 * while r2 received as much as the others, and a downlink read into that
 * split the work unevenly and paced the flows into r2.  Needs 3 regions
 * or more (with two, each sender has one flow and a slow downlink reads
 * as the other's slow uplink, which the model treats alike). */
void topoIngressFromRates(int R, const double *bw, double *ingress);

/* Slices in flight of the hierarchical all-reduce when GEOCCL_HIER_DEPTH
 * is 0 (comm/coll/coll_hier.c geoHierDepth, and the prediction here): a quarter
 * of the slices, 2 to 16.  Why: coll_hier.c's comment on geoHierDepth. */
int topoHierDepthAuto(size_t nslices);

const char *topoCollName(int coll);
const char *topoAlgoName(int algo);

/* ---- simulate (simulate.c) ----------------------------------------------- */

/* geoccl-probe --simulate: loads the topology file at path, builds its
 * model and plan, and writes to out the regions and links, the plan, and
 * predicted all-reduce times (1 KiB .. 1 GiB, x4) for flat, hier and hier
 * with each codec; json = 1 writes one JSON object instead.  codecs NULL
 * means topoDefaultCodecCosts; every given codec is allowed in the plan.
 * Returns 0, or -1 with the reason in err (file:line for a bad file). */
int topoSimulate(const char *path, int json, const topoCodecCost *codecs, int ncodecs,
                 FILE *out, char *err, size_t errlen);

/* ---- congestion control between regions ------------------------------- */

/* The rate (bytes/s) one loss-driven TCP connection (Reno, cubic at these
 * windows) holds on a path with round trip rtt and random loss p, segments
 * of mss bytes: mss / rtt * sqrt(3 / (2p)) (Mathis, Semke, Mahdavi, Ott,
 * 1997).  BBR has no such term: it paces at the bottleneck rate it
 * measures and does not back off at a loss.  INFINITY for p <= 0. */
double topoLossRate(double rtt, double p, double mss);

/* Which congestion control the connections between regions run, and the
 * rules that choose it (topoWanCcChoice, TOPO_CC_*): topology/wan_tuning.h. */

#endif
