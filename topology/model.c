/* Alpha-beta cost model of GeoCCL's collectives, and the plan built on it.
 *
 * Notation.  R regions, P_q ranks in region q, N = sum P_q.  S = bytes of
 * the call (model.h says which buffer).  E_q = the rate region q's ranks
 * get through its WAN egress = egress_Bps[q] * wan_goodput, lowered to
 * (streams leaving q) * stream_Bps when a stream cap is known.  ow(i,j) =
 * one-way delay between regions i and j = rtt_s[i][j] / 2 if measured, else
 * (lat_s[i] + lat_s[j]) / 2; ow = the largest over pairs.  Intra-region:
 * a message of b bytes costs a + b / B (a = intra_alpha_s, B = intra_Bps).
 *
 * FLAT ring (coll_ring.c; all-reduce 2(N-1) steps, all-gather and
 * reduce-scatter N-1 steps, segments of S/N cut into chunks of at most
 * `chunk`).  The ring has N edges: P_q - 1 intra edges in each region and
 * one WAN edge from region q's last rank to region q+1's first, which
 * carries the whole ring's traffic through q's egress on one peer pair
 * (E_q capped by nstreams * stream_Bps).  An edge serves a chunk c in
 * svc_e = c / rate_e (+ a on intra edges) and delivers it lat_e later
 * (ow(q, q+1) on WAN edges, 0 inside a region).  Chunk j of step s at rank
 * r needs chunk j of step s-1 from rank r-1, so the ring is a max-plus
 * system with two kinds of circuits: each edge serialising its own chunks
 * (per step nchunk * svc_e) and the whole ring (a chunk goes once around
 * the N edges in N steps: sum_e (lat_e + svc_e) / N per step).  The step
 * time is the larger of the two, and the last step's data still has to
 * cross one WAN hop:
 *     T = steps * max(max_e step_e, sum_e (lat_e + svc_e) / N) + max_e lat_e
 * where step_e = S/N / rate_e (+ nchunk a on intra edges) and svc_e is for
 * a full chunk (chunks are `chunk` bytes but the last, as in coll_ring.c).
 * On a WAN the first term is the WAN edge's bytes, 2(N-1)/N * S / E_q for
 * all-reduce; the second matters when few ranks sit between WAN hops (3x2:
 * a WAN hop every second step, so each step waits half a delay) and for
 * small messages.
 *
 * FLAT direct all-reduce (S <= direct_max and 2 <= N <= 32; the library
 * takes it unless the plan chose HIER for the size): every rank sends S to every other
 * rank at once; region q's egress carries P_q (N - P_q) S:
 *     T = max_q P_q (N - P_q) S / E_q + ow + a + max_q (P_q - 1) S / B
 *
 * FLAT broadcast: a chain from rank 0 through the ring order (N-1 edges),
 * chunked: the first chunk c crosses every edge, the rest follow at the
 * slowest edge's pace:
 *     T = sum_chain (lat_e + svc_e(c)) + max_chain (S - c) / rate_e
 * HIER broadcast is the same chain (the library has no hierarchical
 * broadcast, and a chain in region order already crosses each region
 * boundary once).
 *
 * HIER all-reduce (coll_hier.c).  The buffer is cut into slices of
 * L = min(S, `chunk` (GEOCCL_HIER_SLICE)) bytes, n = S / L of them (the
 * last one partial).  Per slice, for region q:
 *     RS_q = AG_q = (P_q - 1) (a + L / P_q / B)         intra ring phases
 *            (in a region of nodes, the node and region stages or one
 *            ring across the nodes: intra_phase below)
 *     W_q  = 2 (R-1)/R * L / ratio / E_q                 X1 out and X2 back
 *     C_q  = L / P_q * (1 / enc + 2 (R-1)/R / dec)       codec on my shard:
 *            encode my shard's parts for X1 and my finished part for X2,
 *            decode R-1 partials and R-1 finished parts of my shard
 * with E_q capped by P_q nstreams stream_Bps (every rank talks to its
 * counterparts in the R-1 other regions).  RS, AG, encode and decode run in
 * the caller's thread one after the other; the WAN transfers run beside
 * them on the progress thread.  So per slice the caller needs
 * K = max_q (RS_q + AG_q + C_q), the WAN needs W = max_q W_q, and a slice's
 * round trip must fit in the pipeline depth D (X1 of slice s is reduced
 * D iterations later; D = topoHierDepthAuto, a quarter of the slices, 2
 * to 16, as the library takes it): period = max(K, W, (ow + W/2) / D).
 * The first slice goes through all stages; each further one adds a period:
 *     T = K + W + 2 ow + (n - 1) * period
 * (one slice: RS + X1 + X2 + AG back to back; many: the slower of the
 * caller and the WAN, the faster one hidden, which is how compression's
 * CPU cost disappears behind a slow link and shows on a fast one).
 *
 * HIER all-gather (S = output, block S/N): each rank sends its block to its
 * handler in every other region, then handlers forward inside the region:
 *     T = max_q P_q S/N / E_q + ow + a
 *       + max_q [(P_q - 1) a + (S - S/N - (N - P_q) S/N / P_q) / B]
 * HIER reduce-scatter (S = input): the mirror image: intra to the block's
 * handler first, then one WAN transfer of the region's share:
 *     T = max_q [(P_q - 1) a + (P_q - 1)/P_q S / B] + max_q (N - P_q) S/N / E_q + ow
 * Neither is pipelined in the library, so neither is here.
 *
 * Ingress.  A region whose downlink is slower than what the others send it
 * (ingress_Bps, I_q) receives at that rate: every formula above takes, per
 * region, the slower of sending its bytes at E_q and receiving its bytes at
 * I_q (the hierarchical all-reduce sends and receives the same amount, so
 * its shares and bound use min(E_q, I_q)); a ring or chain edge into
 * region q+1 runs at min(E_q, I_{q+1}).  I_q = 0: no limit of its own.
 *
 * Not modelled: TCP slow start (connections stay warm between calls) and reduction
 * arithmetic (memory-bound, far above WAN rates).  CPU contention between
 * ranks that share cores only as a factor (cpu_share, ranks per CPU on the
 * most crowded host) on the hierarchical all-reduce's caller work per
 * slice, which also counts one message latency per wait of the slice
 * (2 (R-1) + 2): on 6 ranks sharing 2 cores these wake-ups made 1 MiB
 * slices 15-20% slower than 4-8 MiB ones, which the plan chose before.
 * The intra transfers of that work are scaled too, unless intra_Bps was
 * measured with every rank of the host busy (intra_shared: the probe's
 * figure), which has the sharing in it already: scaling it again made the
 * plan take the flat ring on 2 regions x 4 ranks at 1 Gbit/s from 8 MiB,
 * where the hierarchical all-reduce took 0.62-0.67 s at 64 MiB and the
 * ring 1.01 s.
 *
 * The plan built on the model (topoPlanBuild, topoPlanLookup, the print
 * functions) is in model_plan.c; the model read from a topology file
 * (topoModelFromFile) in model_file.c.
 *
 * Calibration (full runs of tests/perf/bench_wan.sh and bench_codecs.sh on a
 * 2-core VM, tbf egress shaping, 25 ms one way).  tests/unit/test_model.c holds the
 * measured rows.  Model: examples/topo/3x2-100mbit.topo's settings (and
 * the same with 2x4 and 1gbit): goodput 1448/1500, intra 0.2 ms and
 * 140 MB/s per rank (the 64 MiB sign run spent 0.248 s in reduce-scatter
 * and 0.216 s in all-gather moving 32 MiB per rank each: 135-155 MB/s),
 * 2 streams, 512 KiB chunks, 4 MiB slices, codecs topoDefaultCodecCosts.
 * predicted / measured (tests/unit/test_model.c recomputes and checks these):
 *
 *   3x2 100 Mbit/s     1 MiB  4 MiB  16 MiB  64 MiB  256 MiB
 *     hier             0.88   0.95   0.92    0.97    0.96
 *     flat             0.84   0.86   0.82    0.95    -
 *   2x4 100 Mbit/s
 *     hier             1.04   1.04   1.01    0.97    0.97
 *     flat             1.00   0.98   0.90    0.97    -
 *   3x2 1 Gbit/s (CPU-bound emulator, as that run's report said)
 *     hier             0.52   0.95   0.82    0.48    0.41
 *     flat             0.81   0.92   0.70    0.63    0.60
 *   2x4 1 Gbit/s (CPU-bound)
 *     hier             0.59   1.10   0.74    0.92    0.71
 *     flat             1.01   1.11   0.64    0.66    0.56
 *   3x2 100 Mbit/s, 64 MiB, hier with a codec (geoccl-perf input)
 *     none 0.95, fp16 0.76, bf16 0.95, int8 0.92, int4 0.80,
 *     sign 0.63, topk:0.01 0.68; lossless on Gaussian data (ratio 1.19) 0.96
 *
 * So at 100 Mbit/s, where the links are the limit, every all-reduce row at
 * 1 MiB and above is within 25% (0.82-1.04), and so are the codecs whose
 * time the link sets (none, lossless, fp16, bf16, int8: 0.76-0.96).  The
 * 1 Gbit/s rows are not: there the 2 shared cores (delay lines at about one core per Gbit/s, six
 * or eight ranks) set the time, which a link model does not describe; and
 * sign and topk, whose codec phase took 0.45 s per call in the all-reduce
 * against 30 ms at the single-core rates, are under-predicted for the same
 * reason.  The model is meant for machines where each rank has its cores.
 */
#include "config.h"
#include "topology/model.h"
#include "topology/model_internal.h"
#include "topology/wan_tuning.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int topoHierDepthAuto(size_t nslices)
{
    size_t d = nslices / 4;
    return d < 2 ? 2 : d > 16 ? 16 : (int)d;
}

/* Default intra link when a topology file does not say: a modest
 * NVLink/PCIe/IB-class figure; WAN-bound plans hardly depend on it. */
#define DEFAULT_INTRA_ALPHA 20e-6
#define DEFAULT_INTRA_BPS 5e9

/* Per-core throughputs: tests/unit/test_codec in the first codec run
 * (BENCHMARKS.md's "CPU codec throughput per core" is within 15% of these
 * but for sign, 3.29 / 4.58 GB/s there once built at -O3), one thread, 64 MiB of
 * Gaussian float32, GB/s of float32 input.  Ratios: lossless ~1.1 on gradients (1.19 measured on
 * Gaussian data, less on real gradients); casts 2; int8, int4 and sign with
 * one float32 scale per 256-element block: 4 / (1 + 4/256) = 3.94,
 * 4 / (0.5 + 4/256) = 7.76, 4 / (1/8 + 4/256) = 28.4; topk keeps 1% as
 * (index, value) pairs: 4 / (8 * 0.01) = 50.  `none` is a plain send: the
 * uncompressed path copies nothing, so it is free (6.66 GB/s measured for a
 * copy it does not make). */
const topoCodecCost topoDefaultCodecCosts[] = {
    {0, "none", 1.0, 0, 0, 0},
    {1, "lossless", 1.1, 0.42e9, 0.91e9, 0},
    {2, "fp16", 2.0, 1.90e9, 4.61e9, 1},
    {3, "bf16", 2.0, 2.95e9, 4.87e9, 1},
    {4, "int8", 3.94, 3.66e9, 6.67e9, 1},
    {5, "int4", 7.76, 3.53e9, 7.01e9, 1},
    {6, "sign", 28.4, 2.08e9, 3.34e9, 1},
    {7, "topk:0.01", 50.0, 1.33e9, 6.95e9, 1},
};
const int topoDefaultNCodecs = (int)(sizeof(topoDefaultCodecCosts) /
                                     sizeof(topoDefaultCodecCosts[0]));

void topoModelInit(topoModel *m)
{
    memset(m, 0, sizeof(*m));
    m->intra_alpha_s = DEFAULT_INTRA_ALPHA;
    m->intra_Bps = DEFAULT_INTRA_BPS;
    m->wan_streams = 2;
    m->stream_Bps = 0;
    m->wan_goodput = 1;
    m->chunk = 512 << 10;
    m->hier_slice = 4 << 20;
    m->direct_max = 16 << 10;
    m->cpu_share = 1;
    m->node_alpha_s = DEFAULT_INTRA_ALPHA;
    m->node_Bps = DEFAULT_INTRA_BPS;
    m->node_stage = 1;
}

/* ---- model checks and link helpers ------------------------------------- */

int topoModelOk(const topoModel *m)
{
    if (m == NULL || m->nregions < 1 || m->nregions > TOPO_MODEL_MAX_REGIONS)
        return 0;
    if (!(m->intra_Bps > 0) || !(m->intra_alpha_s >= 0) || m->wan_streams < 1 ||
        !(m->stream_Bps >= 0) || !(m->wan_goodput > 0 && m->wan_goodput <= 1) ||
        m->chunk == 0 || m->hier_slice == 0)
        return 0;
    for (int q = 0; q < m->nregions; q++)
        if (!(m->loss[q] >= 0 && m->loss[q] < 1))
            return 0;
    for (int q = 0; q < m->nregions; q++)
        if (m->node_ranks[q] < 0 ||
            (m->node_ranks[q] > 1 && m->ranks[q] % m->node_ranks[q] != 0))
            return 0;
    if (topoModelHasNodes(m) && (!(m->node_Bps > 0) || !(m->node_alpha_s >= 0)))
        return 0;
    for (int q = 0; q < m->nregions; q++)
        if (m->ranks[q] < 1 || !(m->egress_Bps[q] > 0) || !(m->lat_s[q] >= 0) ||
            !isfinite(m->egress_Bps[q]) || !isfinite(m->lat_s[q]) ||
            !(m->ingress_Bps[q] >= 0) || !isfinite(m->ingress_Bps[q]))
            return 0;
    return 1;
}

/* Region q's nodes when the node stage applies there: G ranks on each of
 * H nodes, both >= 2; else 0. */
static int node_split(const topoModel *m, int q, int *G, int *H)
{
    int g = m->node_ranks[q];
    if (g < 2 || m->ranks[q] % g != 0 || m->ranks[q] / g < 2)
        return 0;
    *G = g;
    *H = m->ranks[q] / g;
    return 1;
}

int topoModelHasNodes(const topoModel *m)
{
    int G, H;
    for (int q = 0; q < m->nregions; q++)
        if (node_split(m, q, &G, &H))
            return 1;
    return 0;
}

/* One intra-region phase (reduce-scatter, or all-gather: the same steps
 * and bytes) of a slice of L bytes in region q: the node stage's time in
 * *node, the region stage's in *region.  Staged: a ring over the G ranks
 * of each node on the whole slice, then, among the H ranks that hold the
 * same node segment on every node, on L / G, recursive halving where H is
 * a power of two (log2 H exchanges), else a ring (H - 1 steps):
 *     node   = (G - 1) (a_n + L / G / B_n)
 *     region = log2(H) a + (H - 1) L / P / B    or    (H - 1) (a + L / P / B)
 * Both move the same bytes, so alpha decides, and for a power of two the
 * halving always wins; comm/coll/coll_hier_node.c runs the same rule.
 * One ring over the region's P ranks instead (nodes in turn): each step
 * waits for its slowest edge, a hop between nodes where there are several:
 *     (P - 1) max(a + L / P / B, a_n + L / P / B_n)
 * a region on one node runs that ring on the node link (counted as node
 * time), and without nodes described it is (P - 1)(a + L / P / B). */
static void intra_phase(const topoModel *m, int q, double L, int staged, double *node,
                        double *region)
{
    const double a = m->intra_alpha_s, B = m->intra_Bps;
    const double an = m->node_alpha_s, Bn = m->node_Bps;
    const double P = m->ranks[q];
    int G, H;
    *node = *region = 0;
    if (P < 2)
        return;
    if (staged && node_split(m, q, &G, &H)) {
        *node = (G - 1) * (an + L / G / Bn);
        /* recursive halving where H is a power of two: the same bytes in
         * log2 H steps */
        int steps = (H & (H - 1)) == 0 ? (int)lround(log2(H)) : H - 1;
        *region = steps * a + (H - 1) * L / P / B;
        return;
    }
    if (m->node_ranks[q] >= P) /* one node: the node link throughout */
        *node = (P - 1) * (an + L / P / Bn);
    else if (m->node_ranks[q] >= 2)
        *region = (P - 1) * fmax(a + L / P / B, an + L / P / Bn);
    else
        *region = (P - 1) * (a + L / P / B);
}

int topoModelNranks(const topoModel *m)
{
    int n = 0;
    for (int q = 0; q < m->nregions; q++)
        n += m->ranks[q];
    return n;
}

double topoModelOneway(const topoModel *m, int i, int j)
{
    if (m->rtt_s[i][j] > 0)
        return m->rtt_s[i][j] / 2;
    if (m->rtt_s[j][i] > 0)
        return m->rtt_s[j][i] / 2;
    return (m->lat_s[i] + m->lat_s[j]) / 2;
}

static double max_oneway(const topoModel *m)
{
    double ow = 0;
    for (int i = 0; i < m->nregions; i++)
        for (int j = i + 1; j < m->nregions; j++)
            ow = fmax(ow, topoModelOneway(m, i, j));
    return ow;
}

/* What `streams` TCP streams leaving region q can carry: its egress at
 * goodput, or the streams' caps if lower. */
static double wan_rate(const topoModel *m, int q, double streams)
{
    double r = m->egress_Bps[q] * m->wan_goodput;
    if (m->stream_Bps > 0)
        r = fmin(r, streams * m->stream_Bps);
    if (m->loss[q] > 0 && m->loss_driven[q]) {
        /* Each stream at the loss term of the region's longest round trip
         * (the exchange's pace is its slowest pair's). */
        double rtt = 0;
        for (int j = 0; j < m->nregions; j++)
            if (j != q)
                rtt = fmax(rtt, 2 * topoModelOneway(m, q, j));
        r = fmin(r, streams * topoLossRate(rtt, m->loss[q], 1448));
    }
    return r;
}

/* What can reach region q from the others: its ingress limit at goodput,
 * or no limit of its own (INFINITY: the senders' egress sets the pace). */
static double in_rate(const topoModel *m, int q)
{
    return m->ingress_Bps[q] > 0 ? m->ingress_Bps[q] * m->wan_goodput : INFINITY;
}

/* Seconds for region q to send out bytes and receive in bytes over the WAN
 * at once (full duplex: the slower direction sets it). */
static double wan_time(const topoModel *m, int q, double streams, double out, double in)
{
    return fmax(out / wan_rate(m, q, streams), in / in_rate(m, q));
}

/* ---- flat ---------------------------------------------------------------- */

/* Ring of `steps` steps with segments of seg bytes (the header comment's
 * max-plus formula).  Edges are handled per region, so this is O(R)
 * whatever N is. */
static double ring_time(const topoModel *m, int N, int steps, double seg, size_t chunk, int ns)
{
    if (N < 2 || steps < 1)
        return 0;
    /* Chunks are `chunk` bytes but the last: the ring circuit carries a
     * full chunk, the edges all of seg plus a per-chunk alpha.  (Cutting seg
     * into equal parts instead would make a slightly larger message
     * cheaper.) */
    double nchunk = seg > 0 ? ceil(seg / (double)chunk) : 1;
    double c = fmin(seg, (double)chunk);
    const double a = m->intra_alpha_s;
    double edge = nchunk * a + seg / m->intra_Bps; /* an intra edge's step */
    double cycle = 0, max_lat = 0;
    int R = m->nregions;
    if (R == 1) {
        cycle = N * (a + c / m->intra_Bps);
    } else {
        if (N == R) /* no intra edge */
            edge = 0;
        for (int q = 0; q < R; q++) {
            /* The WAN edge into the next region: its ingress may be lower. */
            double rate = fmin(wan_rate(m, q, ns), in_rate(m, (q + 1) % R));
            double lat = topoModelOneway(m, q, (q + 1) % R);
            edge = fmax(edge, seg / rate);
            max_lat = fmax(max_lat, lat);
            cycle += (m->ranks[q] - 1) * (a + c / m->intra_Bps) + c / rate + lat;
        }
    }
    return steps * fmax(edge, cycle / N) + max_lat;
}

static double direct_time(const topoModel *m, int N, double S, int ns)
{
    double wan = 0, intra = 0;
    for (int q = 0; q < m->nregions; q++) {
        double pairs = (double)m->ranks[q] * (N - m->ranks[q]);
        if (pairs > 0)
            wan = fmax(wan, wan_time(m, q, pairs * ns, pairs * S, pairs * S));
        intra = fmax(intra, (m->ranks[q] - 1) * S / m->intra_Bps);
    }
    return wan + (m->nregions > 1 ? max_oneway(m) : 0) + m->intra_alpha_s + intra;
}

/* Chain from rank 0 along the ring order (broadcast): the first (full)
 * chunk crosses every edge, the rest follow at the slowest edge's pace. */
static double chain_time(const topoModel *m, int N, double S, size_t chunk, int ns)
{
    if (N < 2)
        return 0;
    double nchunk = S > 0 ? ceil(S / (double)chunk) : 1;
    double c = fmin(S, (double)chunk), rest = S - c;
    const double a = m->intra_alpha_s;
    double first = 0, slowest = 0;
    for (int q = 0; q < m->nregions; q++) {
        if (m->ranks[q] > 1) {
            first += (m->ranks[q] - 1) * (a + c / m->intra_Bps);
            slowest = fmax(slowest, (nchunk - 1) * a + rest / m->intra_Bps);
        }
        if (q + 1 < m->nregions) {
            double rate = fmin(wan_rate(m, q, ns), in_rate(m, q + 1));
            first += topoModelOneway(m, q, q + 1) + c / rate;
            slowest = fmax(slowest, rest / rate);
        }
    }
    return first + slowest;
}

static double predict_flat(const topoModel *m, int coll, double S, size_t chunk, int ns)
{
    int N = topoModelNranks(m);
    switch (coll) {
    case TOPO_COLL_ALLREDUCE:
        if (N < 2)
            return 0;
        if (N <= 32 && S <= (double)m->direct_max)
            return direct_time(m, N, S, ns);
        return ring_time(m, N, 2 * (N - 1), S / N, chunk, ns);
    case TOPO_COLL_ALLGATHER:
    case TOPO_COLL_REDUCESCATTER:
        return ring_time(m, N, N - 1, S / N, chunk, ns);
    case TOPO_COLL_BROADCAST:
        return chain_time(m, N, S, chunk, ns);
    default:
        return -1;
    }
}

/* ---- hierarchical --------------------------------------------------------- */

/* The rate region q's share of the hierarchical all-reduce moves at: it
 * sends and receives the same bytes, so the slower of its egress and its
 * ingress. */
static double hier_egress(const topoModel *m, int q)
{
    return fmin(wan_rate(m, q, m->ranks[q] * (m->nregions - 1) * (double)m->wan_streams),
                in_rate(m, q));
}

double topoHierWanPerByte(const topoModel *m, const unsigned *w)
{
    double t = 0;
    for (int q = 0; q < m->nregions; q++)
        t = fmax(t, (1 + (m->nregions - 2) * (double)w[q] / TOPO_SHARE_ONE) / hier_egress(m, q));
    return t;
}

void topoIngressFromRates(int R, const double *bw, double *ingress)
{
    for (int h = 0; h < R; h++) {
        int held = 0;
        double in = 0, out = 0;
        for (int g = 0; g < R; g++) {
            if (g == h)
                continue;
            double rate = bw[g * R + h], best = 0, sent = 0;
            for (int k = 0; k < R; k++)
                if (k != g) {
                    sent += bw[g * R + k] > 0 ? bw[g * R + k] : 0;
                    if (k != h)
                        best = fmax(best, bw[g * R + k]);
                }
            in += rate > 0 ? rate : 0;
            out = fmax(out, sent);
            held |= rate >= 0 && best > 0 && rate < 0.5 * best;
        }
        ingress[h] = held && in > 0 && in < 0.5 * out ? in : 0;
    }
}

int topoHierShares(const topoModel *m, unsigned w[TOPO_MODEL_MAX_REGIONS])
{
    const int R = m->nregions;
    double f[TOPO_MODEL_MAX_REGIONS], E[TOPO_MODEL_MAX_REGIONS];
    unsigned eq[TOPO_MODEL_MAX_REGIONS];
    for (int q = 0; q < R; q++)
        w[q] = eq[q] = (unsigned)((uint64_t)TOPO_SHARE_ONE * (q + 1) / R -
                                  (uint64_t)TOPO_SHARE_ONE * q / R);
    if (R < 3 || m->hier_equal)
        return 0;
    for (int q = 0; q < R; q++)
        if (!((E[q] = hier_egress(m, q)) > 0))
            return 0;
    /* The least time T at which the shares each region can take by then,
     * (T E_q - 1) / (R - 2), add up to one; bisection between the bound
     * (every share zero) and the equal split, which always fits. */
    double lo = 0, hi = 0, c = R - 2;
    for (int q = 0; q < R; q++) {
        lo = fmax(lo, 1 / E[q]);
        hi = fmax(hi, (1 + c / R) / E[q]);
    }
    for (int it = 0; it < 100; it++) {
        double mid = 0.5 * (lo + hi), sum = 0;
        for (int q = 0; q < R; q++)
            sum += fmax(0, (mid * E[q] - 1) / c);
        if (sum >= 1)
            hi = mid;
        else
            lo = mid;
    }
    double sum = 0;
    for (int q = 0; q < R; q++)
        sum += (f[q] = fmax(0, (hi * E[q] - 1) / c));
    /* Fixed point; what rounding leaves over goes to the fastest region. */
    unsigned total = 0;
    int fastest = 0;
    for (int q = 0; q < R; q++) {
        w[q] = (unsigned)floor(f[q] / sum * TOPO_SHARE_ONE);
        total += w[q];
        if (E[q] > E[fastest])
            fastest = q;
    }
    w[fastest] += TOPO_SHARE_ONE - total;
    /* Split unevenly only where the model gains TOPO_SHARES_MIN_GAIN: the
     * probe's rates are not exact, and a split made on a difference that
     * is not there loads one region with more than its part. */
    if (topoHierWanPerByte(m, eq) < TOPO_SHARES_MIN_GAIN * topoHierWanPerByte(m, w)) {
        memcpy(w, eq, sizeof(unsigned) * (size_t)R);
        return 0;
    }
    return 1;
}

/* The hierarchical all-reduce with codec cq[q] on what region q sends
 * (NULL or id none: exact).  Per slice of L bytes, with shares f_q:
 *   out_q = L (1 + (R-2) f_q) / rho_q          its X1 partials and X2 parts
 *   in_q  = sum_{r != q} L (f_q + f_r) / rho_r  the others' X1 partials of
 *                                              its share, their X2 parts
 *   C_q   = seg / enc_q + sum_{r != q} seg (f_q + f_r) / dec_r
 * (seg = L / P_q: a rank encodes its shard once, its X1 partials and its
 * finished part, and decodes what each other region sends it in that
 * region's codec).  With one codec and equal shares that is the header's
 * W_q and C_q. */
static double hier_allreduce_by(const topoModel *m, const topoCodecCost *const *cq, double S,
                                size_t slice, int ns, topoHierStages *st)
{
    const int R = m->nregions;
    const double a = m->intra_alpha_s;
    double rho[TOPO_MODEL_MAX_REGIONS], enc[TOPO_MODEL_MAX_REGIONS], dec[TOPO_MODEL_MAX_REGIONS];
    double f[TOPO_MODEL_MAX_REGIONS];
    unsigned w[TOPO_MODEL_MAX_REGIONS];
    topoHierShares(m, w);
    /* sums over every region r of 1 / rho_r, f_r / rho_r, 1 / dec_r and
     * f_r / dec_r: each region's in_q and C_q is the total less its own */
    double s_rho = 0, s_frho = 0, s_dec = 0, s_fdec = 0;
    for (int q = 0; q < R; q++) {
        const topoCodecCost *c = cq ? cq[q] : NULL;
        int on = c != NULL && c->id != TOPO_CODEC_NONE;
        rho[q] = on && c->ratio > 0 ? c->ratio : 1;
        enc[q] = on ? c->enc_Bps : 0;
        dec[q] = on ? c->dec_Bps : 0;
        f[q] = (double)w[q] / TOPO_SHARE_ONE;
        s_rho += 1 / rho[q];
        s_frho += f[q] / rho[q];
        s_dec += dec[q] > 0 ? 1 / dec[q] : 0;
        s_fdec += dec[q] > 0 ? f[q] / dec[q] : 0;
    }
    /* Slices are `slice` bytes but the last; the bytes after the first
     * slice add periods in proportion (so that a larger message never
     * comes out cheaper). */
    double L = fmin(S, (double)slice);
    double more = L > 0 ? (S - L) / L : 0;
    double K = 0, W = 0, node_max = 0, region_max = 0;
    for (int q = 0; q < R; q++) {
        double P = m->ranks[q], seg = L / P, node_t, region_t;
        intra_phase(m, q, L, m->node_stage, &node_t, &region_t);
        double rs = node_t + region_t;
        node_max = fmax(node_max, 2 * node_t);
        region_max = fmax(region_max, 2 * region_t);
        double idec = dec[q] > 0 ? 1 / dec[q] : 0;
        double c = (enc[q] > 0 ? seg / enc[q] : 0) +
                   seg * (f[q] * (s_dec - idec) + (s_fdec - f[q] * idec));
        /* and per slice the caller waits for the X1 and X2 receives of
         * R - 1 regions and hands each phase to the progress thread: one
         * message latency each, that many more wake-ups on shared cores */
        double waits = 2 * (R - 1) + 2;
        double crowd = m->cpu_share > 1 ? m->cpu_share : 1;
        K = fmax(K, (m->intra_shared ? 1 : crowd) * 2 * rs + crowd * (c + waits * a));
        double out = (1 + (R - 2) * f[q]) * L / rho[q];
        double in = L * (f[q] * (s_rho - 1 / rho[q]) + (s_frho - f[q] / rho[q]));
        W = fmax(W, wan_time(m, q, P * (R - 1) * ns, out, in));
    }
    double ow = max_oneway(m);
    double period = fmax(fmax(K, W), (ow + W / 2) / topoHierDepthAuto((size_t)ceil(S / fmax(L, 1))));
    if (st != NULL) {
        double crowd = m->intra_shared || !(m->cpu_share > 1) ? 1 : m->cpu_share;
        st->node_s = (1 + more) * crowd * node_max;
        st->region_s = (1 + more) * crowd * region_max;
        st->wan_s = (1 + more) * W;
        st->latency_s = 2 * ow;
        st->slice = (size_t)L;
        st->nslices = (size_t)ceil(S / fmax(L, 1));
    }
    return K + W + 2 * ow + more * period;
}

static double hier_allreduce(const topoModel *m, const topoCodecCost *codec, double S,
                             size_t slice, int ns)
{
    const topoCodecCost *cq[TOPO_MODEL_MAX_REGIONS];
    for (int q = 0; q < m->nregions; q++)
        cq[q] = codec;
    return hier_allreduce_by(m, cq, S, slice, ns, NULL);
}

double topoPredictHierByRegion(const topoModel *m, const topoCodecCost *const *codecs,
                               size_t bytes, size_t slice, int nstreams)
{
    if (!topoModelOk(m))
        return -1;
    if (m->nregions == 1)
        return topoPredict(m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, bytes, slice, nstreams);
    return hier_allreduce_by(m, codecs, (double)bytes, slice ? slice : m->hier_slice,
                             nstreams > 0 ? nstreams : m->wan_streams, NULL);
}

int topoPredictHierStages(const topoModel *m, const topoCodecCost *codec, size_t bytes,
                          size_t slice, int nstreams, topoHierStages *out)
{
    const topoCodecCost *cq[TOPO_MODEL_MAX_REGIONS];
    unsigned w[TOPO_MODEL_MAX_REGIONS];
    topoHierStages st;
    if (!topoModelOk(m) || m->nregions < 2 || out == NULL)
        return -1;
    memset(&st, 0, sizeof(st));
    for (int q = 0; q < m->nregions; q++)
        cq[q] = codec;
    st.total_s = hier_allreduce_by(m, cq, (double)bytes, slice ? slice : m->hier_slice,
                                   nstreams > 0 ? nstreams : m->wan_streams, &st);
    topoHierShares(m, w);
    st.bw_bound_s = (double)bytes * topoHierWanPerByte(m, w) /
                    (codec && codec->ratio > 0 ? codec->ratio : 1);
    st.bound_s = st.bw_bound_s + st.latency_s;
    st.node_stage = m->node_stage && topoModelHasNodes(m);
    for (int q = 0, G, H; st.node_stage && q < m->nregions; q++)
        if (node_split(m, q, &G, &H)) {
            st.halving_regions += (H & (H - 1)) == 0;
            st.ring_regions += (H & (H - 1)) != 0;
        }
    *out = st;
    return 0;
}

static double predict_hier(const topoModel *m, int coll, const topoCodecCost *codec, double S,
                           size_t chunk, int ns)
{
    const int N = topoModelNranks(m), R = m->nregions;
    const double a = m->intra_alpha_s, B = m->intra_Bps, blk = N > 0 ? S / N : 0;
    double t1 = 0, t2 = 0;
    if (R == 1 || coll == TOPO_COLL_BROADCAST)
        return predict_flat(m, coll, S, chunk ? chunk : m->chunk, ns);
    switch (coll) {
    case TOPO_COLL_ALLREDUCE:
        /* The library takes the direct exchange below direct_max only when
         * the plan says flat (comm/coll/coll_ring.c), so HIER is always the
         * hierarchical algorithm here. */
        return hier_allreduce(m, codec, S, chunk ? chunk : m->hier_slice, ns);
    case TOPO_COLL_ALLGATHER:
        for (int q = 0; q < R; q++) {
            double P = m->ranks[q];
            /* out: my blocks to R-1 regions; in: the other regions' blocks */
            t1 = fmax(t1, wan_time(m, q, P * (R - 1) * ns, (R - 1) * P * blk, (N - P) * blk));
            t2 = fmax(t2, (P - 1) * a + (S - blk - (N - P) * blk / P) / B);
        }
        return t1 + max_oneway(m) + a + t2;
    case TOPO_COLL_REDUCESCATTER:
        for (int q = 0; q < R; q++) {
            double P = m->ranks[q];
            t1 = fmax(t1, (P - 1) * a + (P - 1) / P * S / B);
            t2 = fmax(t2, wan_time(m, q, P * (R - 1) * ns, (N - P) * blk, (R - 1) * P * blk));
        }
        return t1 + t2 + max_oneway(m);
    default:
        return -1;
    }
}

double topoPredict(const topoModel *m, int coll, int algo, const topoCodecCost *codec,
                   size_t bytes, size_t chunk, int nstreams)
{
    if (!topoModelOk(m) || coll < 0 || coll >= TOPO_COLL_COUNT || algo < 0 ||
        algo >= TOPO_ALGO_COUNT)
        return -1;
    int ns = nstreams > 0 ? nstreams : m->wan_streams;
    if (algo == TOPO_ALGO_HIER)
        return predict_hier(m, coll, codec, (double)bytes, chunk, ns);
    return predict_flat(m, coll, (double)bytes, chunk ? chunk : m->chunk, ns);
}

/* ---- congestion control between regions ------------------------------- */

double topoLossRate(double rtt, double p, double mss)
{
    if (p <= 0 || rtt <= 0)
        return INFINITY;
    return mss / rtt * sqrt(1.5 / p);
}
