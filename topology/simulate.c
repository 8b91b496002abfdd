/* geoccl-probe --simulate: what the cost model says about a described
 * topology, without running anything.  The tool's main parses the command
 * line and calls topoSimulate (model.h).
 *
 * The predicted all-reduce table uses the model's defaults (ring chunk,
 * slice, all the streams the file allows), i.e. what the library does when
 * nothing is tuned; the plan above it shows what tuning would choose.  The
 * stage table after it takes the exact hierarchical all-reduce as the plan
 * without codecs chooses it (slice, node stage or one ring per region) and
 * splits its time into the node, region and WAN stages, against the WAN
 * bound (topoHierStages); beside it, the best that one ring per region
 * could do at any slice, which is what the node stage saves. */
#include "config.h"
#include "topology/model.h"

#include <stdlib.h>
#include <string.h>

#define SIM_MIN_LOG2 10 /* 1 KiB */
#define SIM_MAX_LOG2 30 /* 1 GiB, in x4 steps */
#define SIM_STAGE_MIN_LOG2 20 /* the stage table from 1 MiB */

/* One row of the stage table: the exact plan's hierarchical all-reduce of
 * b bytes by stage, and the least time one ring per region takes at any
 * of the plan's slice sizes. */
typedef struct {
    topoHierStages st;
    double same_slice_s;   /* one ring per region at st.slice */
    double one_ring_s;     /* one ring per region at its best slice */
    size_t one_ring_slice;
} simStageRow;

static int stage_row(const topoModel *m, const topoPlan *exact, size_t b, simStageRow *row)
{
    static const size_t slices[] = {1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20,
                                    256 << 20};
    const topoPlanEntry *e = topoPlanLookup(exact, TOPO_COLL_ALLREDUCE, b);
    topoModel mm = *m;
    int hier = e != NULL && e->algo == TOPO_ALGO_HIER;
    mm.node_stage = hier ? e->node_stage : topoModelHasNodes(m);
    if (topoPredictHierStages(&mm, NULL, b, hier ? e->chunk : 0, hier ? e->nstreams : 0,
                              &row->st) != 0)
        return -1;
    mm.node_stage = 0;
    row->same_slice_s = topoPredict(&mm, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, b,
                                    row->st.slice, hier ? e->nstreams : 0);
    row->one_ring_s = -1;
    for (size_t i = 0; i < sizeof(slices) / sizeof(slices[0]); i++) {
        double t = topoPredict(&mm, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, b, slices[i], 0);
        if (t >= 0 && (row->one_ring_s < 0 || t < row->one_ring_s)) {
            row->one_ring_s = t;
            row->one_ring_slice = slices[i];
        }
    }
    return 0;
}

static void rate_text(double Bps, char *buf, size_t len)
{
    double bits = Bps * 8;
    if (bits >= 1e9)
        snprintf(buf, len, "%.4g Gbit/s", bits / 1e9);
    else if (bits >= 1e6)
        snprintf(buf, len, "%.4g Mbit/s", bits / 1e6);
    else
        snprintf(buf, len, "%.4g kbit/s", bits / 1e3);
}

/* A region name as a JSON string: names are any run of non-blank
 * characters, so quotes, backslashes and control bytes are escaped. */
static void json_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

static double rtt_of(const topoModel *m, int i, int j)
{
    if (m->rtt_s[i][j] > 0)
        return m->rtt_s[i][j];
    if (m->rtt_s[j][i] > 0)
        return m->rtt_s[j][i];
    return m->lat_s[i] + m->lat_s[j];
}

/* The stages a row ran: one ring per region, or the node stage and a
 * region stage by recursive halving (tree), a ring, or both (mixed
 * regions). */
static const char *stage_name(const topoHierStages *st)
{
    if (!st->node_stage)
        return "ring";
    return st->ring_regions == 0 ? "node+tree" : st->halving_regions == 0 ? "node+ring"
                                                                          : "node+mix";
}

static void print_stages_text(const topoModel *m, const topoPlan *exact, FILE *out)
{
    int G = 0;
    for (int q = 0; q < m->nregions; q++)
        G = m->node_ranks[q] > G ? m->node_ranks[q] : G;
    char r[32], rn[32];
    rate_text(m->intra_Bps, r, sizeof(r));
    rate_text(m->node_Bps, rn, sizeof(rn));
    if (G > 1)
        fprintf(out, "\nnodes: up to %d ranks per node; node link %.3g us, %s per rank; between "
                "nodes %.3g us, %s per rank\n", G, m->node_alpha_s * 1e6, rn,
                m->intra_alpha_s * 1e6, r);
    else
        fprintf(out, "\nnodes: not described (one intra link per region)\n");
    fprintf(out, "hierarchical all-reduce by stage (exact; slice and stages as the plan without "
            "codecs chooses; seconds)\n");
    fprintf(out, "  %10s %-9s %6s %9s %9s %9s %9s %9s %9s %6s %8s %9s %9s\n", "bytes", "stages",
            "slice", "node", "region", "WAN", "latency", "total", "bound", "ratio", "bw-ratio",
            "1 ring", "1 ring*");
    for (int k = SIM_STAGE_MIN_LOG2; k <= SIM_MAX_LOG2; k += 2) {
        size_t b = (size_t)1 << k;
        simStageRow row;
        if (stage_row(m, exact, b, &row) != 0)
            continue;
        const topoHierStages *st = &row.st;
        fprintf(out, "  %10zu %-9s %5zuM %9.4g %9.4g %9.4g %9.4g %9.4g %9.4g %6.3f %8.3f %9.4g "
                "%9.4g\n", b, stage_name(st), st->slice >> 20, st->node_s,
                st->region_s, st->wan_s, st->latency_s, st->total_s, st->bound_s,
                st->total_s / st->bound_s, st->total_s / st->bw_bound_s, row.same_slice_s,
                row.one_ring_s);
    }
    fprintf(out, "  (stages: ring, one ring per region; node+tree, a node stage then a "
            "region stage by recursive halving (power-of-two nodes), node+ring the same with "
            "a ring among the nodes; node, region: the caller's time in each stage, "
            "reduce-scatter and all-gather, all slices, slowest region; WAN: the exchange's "
            "transfers; stages "
            "overlap across slices.  bound: the WAN's bytes at the regions' rates plus its "
            "two one-way delays; ratio = total / bound, bw-ratio = total / the bytes' time "
            "alone; 1 ring: one ring per region instead of the node and region stages, at "
            "this slice; 1 ring*: the same at its best slice)\n");
}

static void print_text(const char *path, const topoModel *m, const topoPlan *plan,
                       const topoPlan *exact, const topoCodecCost *codecs, int ncodecs,
                       FILE *out)
{
    char r[32];
    fprintf(out, "# geoccl-probe --simulate %s\n", path);
    fprintf(out, "%d regions, %d ranks\n", plan->nregions, plan->nranks);
    int nodes = 0;
    for (int q = 0; q < m->nregions; q++)
        nodes |= m->node_ranks[q] > 1;
    fprintf(out, "  %-20s %8s %14s %14s %10s %16s%s\n", "region", "ranks", "WAN egress",
            "WAN ingress", "delay (ms)", "loss (control)", nodes ? "  nodes x ranks" : "");
    for (int q = 0; q < m->nregions; q++) {
        rate_text(m->egress_Bps[q], r, sizeof(r));
        char d[32], l[32] = "-", in[32] = "no limit";
        if (m->ingress_Bps[q] > 0)
            rate_text(m->ingress_Bps[q], in, sizeof(in));
        /* 0 with RTT lines: the file gave measured RTTs instead */
        snprintf(d, sizeof(d), m->lat_s[q] > 0 ? "%.3g" : "-", m->lat_s[q] * 1e3);
        if (m->loss[q] > 0)
            snprintf(l, sizeof(l), "%.3g%% (%s)", m->loss[q] * 100,
                     m->loss_driven[q] ? "cubic" : "bbr");
        char nd[40] = "";
        if (nodes && m->node_ranks[q] > 1)
            snprintf(nd, sizeof(nd), "  %d x %d", m->ranks[q] / m->node_ranks[q],
                     m->node_ranks[q]);
        else if (nodes)
            snprintf(nd, sizeof(nd), "  -");
        fprintf(out, "  %-20s %8d %14s %14s %10s %16s%s\n", m->names[q], m->ranks[q],
                m->nregions > 1 ? r : "-", m->nregions > 1 ? in : "-", d, l, nd);
    }
    rate_text(m->intra_Bps, r, sizeof(r));
    fprintf(out, "intra-region%s: %.3g us per message, %s per rank\n",
            nodes ? " (between nodes)" : "", m->intra_alpha_s * 1e6, r);
    if (m->stream_Bps > 0) {
        rate_text(m->stream_Bps, r, sizeof(r));
        fprintf(out, "WAN: %d streams per peer pair, %s per stream; payload %.1f%% of the "
                "link rate\n", m->wan_streams, r, m->wan_goodput * 100);
    } else {
        fprintf(out, "WAN: %d streams per peer pair, no per-stream cap; payload %.1f%% of the "
                "link rate\n", m->wan_streams, m->wan_goodput * 100);
    }
    if (m->nregions > 1) {
        fprintf(out, "links: RTT (ms) between regions\n  %-20s", "");
        for (int j = 0; j < m->nregions; j++)
            fprintf(out, " %10.10s", m->names[j]);
        fprintf(out, "\n");
        for (int i = 0; i < m->nregions; i++) {
            fprintf(out, "  %-20s", m->names[i]);
            for (int j = 0; j < m->nregions; j++) {
                if (i == j)
                    fprintf(out, " %10s", "-");
                else
                    fprintf(out, " %10.4g", rtt_of(m, i, j) * 1e3);
            }
            fprintf(out, "\n");
        }
    }
    {
        unsigned w[TOPO_MODEL_MAX_REGIONS], eq[TOPO_MODEL_MAX_REGIONS];
        topoModel e = *m;
        int uneven = topoHierShares(m, w);
        e.hier_equal = 1;
        topoHierShares(&e, eq);
        fprintf(out, "hierarchical shares (%s):", uneven ? "by WAN rate" : "equal");
        for (int q = 0; q < m->nregions; q++)
            fprintf(out, " %s %.1f%%", m->names[q], 100.0 * w[q] / TOPO_SHARE_ONE);
        fprintf(out, "\n  WAN bound of the hierarchical all-reduce: %.4g s per GiB with these "
                "shares, %.4g with equal ones\n", topoHierWanPerByte(m, w) * (1 << 30),
                topoHierWanPerByte(m, eq) * (1 << 30));
    }
    fprintf(out, "\n");
    topoPlanPrint(plan, out);
    fprintf(out, "\npredicted all-reduce time (s), default chunk %zu, slice %zu, %d streams\n",
            m->chunk, m->hier_slice, m->wan_streams);
    fprintf(out, "  %10s %10s %10s", "bytes", "flat", "hier");
    for (int c = 0; c < ncodecs; c++)
        if (codecs[c].id != TOPO_CODEC_NONE)
            fprintf(out, " %10.10s", codecs[c].name ? codecs[c].name : "?");
    fprintf(out, "\n");
    for (int k = SIM_MIN_LOG2; k <= SIM_MAX_LOG2; k += 2) {
        size_t b = (size_t)1 << k;
        fprintf(out, "  %10zu %10.4g %10.4g", b,
                topoPredict(m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_FLAT, NULL, b, 0, 0),
                topoPredict(m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, b, 0, 0));
        for (int c = 0; c < ncodecs; c++)
            if (codecs[c].id != TOPO_CODEC_NONE)
                fprintf(out, " %10.4g",
                        topoPredict(m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, &codecs[c], b, 0, 0));
        fprintf(out, "\n");
    }
    if (m->nregions > 1) {
        fprintf(out, "  (codec columns: hier with that codec)\n");
        print_stages_text(m, exact, out);
    }
}

static void print_json(const char *path, const topoModel *m, const topoPlan *plan,
                       const topoPlan *exact, const topoCodecCost *codecs, int ncodecs,
                       FILE *out)
{
    (void)path;
    fprintf(out, "{\"regions\": [");
    for (int q = 0; q < m->nregions; q++) {
        fprintf(out, "%s{\"name\": ", q ? ", " : "");
        json_str(out, m->names[q]);
        fprintf(out, ", \"ranks\": %d, \"egress_Bps\": %.6g, \"ingress_Bps\": %.6g, "
                "\"delay_s\": %.6g}", m->ranks[q], m->egress_Bps[q], m->ingress_Bps[q],
                m->lat_s[q]);
    }
    fprintf(out, "],\n \"intra\": {\"alpha_s\": %.6g, \"Bps\": %.6g},\n \"wan\": {\"streams\": %d, "
            "\"stream_Bps\": %.6g, \"goodput\": %.6g},\n \"rtt_s\": [", m->intra_alpha_s,
            m->intra_Bps, m->wan_streams, m->stream_Bps, m->wan_goodput);
    for (int i = 0; i < m->nregions; i++) {
        fprintf(out, "%s[", i ? ", " : "");
        for (int j = 0; j < m->nregions; j++)
            fprintf(out, "%s%.6g", j ? ", " : "", i == j ? 0.0 : rtt_of(m, i, j));
        fprintf(out, "]");
    }
    {
        unsigned w[TOPO_MODEL_MAX_REGIONS];
        topoHierShares(m, w);
        fprintf(out, "],\n \"hier_shares\": [");
        for (int q = 0; q < m->nregions; q++)
            fprintf(out, "%s%.6g", q ? ", " : "", (double)w[q] / TOPO_SHARE_ONE);
        fprintf(out, "], \"hier_wan_s_per_byte\": %.6g", topoHierWanPerByte(m, w));
    }
    fprintf(out, ",\n \"plan\": ");
    topoPlanJson(plan, out);
    fprintf(out, ",\n \"allreduce\": [");
    for (int k = SIM_MIN_LOG2; k <= SIM_MAX_LOG2; k += 2) {
        size_t b = (size_t)1 << k;
        fprintf(out, "%s\n  {\"bytes\": %zu, \"flat\": %.6g, \"hier\": %.6g, \"codecs\": {",
                k > SIM_MIN_LOG2 ? "," : "", b,
                topoPredict(m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_FLAT, NULL, b, 0, 0),
                topoPredict(m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, NULL, b, 0, 0));
        int first = 1;
        for (int c = 0; c < ncodecs; c++)
            if (codecs[c].id != TOPO_CODEC_NONE) {
                fprintf(out, "%s\"%s\": %.6g", first ? "" : ", ",
                        codecs[c].name ? codecs[c].name : "?",
                        topoPredict(m, TOPO_COLL_ALLREDUCE, TOPO_ALGO_HIER, &codecs[c], b, 0, 0));
                first = 0;
            }
        fprintf(out, "}}");
    }
    fprintf(out, "\n]");
    fprintf(out, ",\n \"node\": {\"alpha_s\": %.6g, \"Bps\": %.6g, \"ranks\": [",
            m->node_alpha_s, m->node_Bps);
    for (int q = 0; q < m->nregions; q++)
        fprintf(out, "%s%d", q ? ", " : "", m->node_ranks[q] > 1 ? m->node_ranks[q] : 1);
    fprintf(out, "]},\n \"hier_stages\": [");
    for (int k = SIM_STAGE_MIN_LOG2, first = 1; m->nregions > 1 && k <= SIM_MAX_LOG2; k += 2) {
        size_t b = (size_t)1 << k;
        simStageRow row;
        if (stage_row(m, exact, b, &row) != 0)
            continue;
        const topoHierStages *st = &row.st;
        fprintf(out, "%s\n  {\"bytes\": %zu, \"node_stage\": %d, \"stages\": \"%s\", "
                "\"slice\": %zu, "
                "\"nslices\": %zu, \"node_s\": %.6g, \"region_s\": %.6g, \"wan_s\": %.6g, "
                "\"latency_s\": %.6g, \"total_s\": %.6g, \"bound_s\": %.6g, "
                "\"bw_bound_s\": %.6g, \"ratio\": %.6g, \"one_ring_same_slice_s\": %.6g, "
                "\"one_ring_s\": %.6g, \"one_ring_slice\": %zu}", first ? "" : ",", b,
                st->node_stage, stage_name(st), st->slice, st->nslices, st->node_s, st->region_s, st->wan_s,
                st->latency_s, st->total_s, st->bound_s, st->bw_bound_s,
                st->total_s / st->bound_s, row.same_slice_s, row.one_ring_s,
                row.one_ring_slice);
        first = 0;
    }
    fprintf(out, "\n]}\n");
}

int topoSimulate(const char *path, int json, const topoCodecCost *codecs, int ncodecs,
                 FILE *out, char *err, size_t errlen)
{
    topoFile tf;
    topoModel m;
    topoPlan *plan, *exact;
    unsigned allowed = 0;
    if (codecs == NULL) {
        codecs = topoDefaultCodecCosts;
        ncodecs = topoDefaultNCodecs;
    }
    for (int c = 0; c < ncodecs; c++)
        if (codecs[c].id >= 0 && codecs[c].id < 32)
            allowed |= 1u << codecs[c].id;
    if (topoFileLoad(path, &tf, err, errlen) != 0)
        return -1;
    int rc = topoModelFromFile(&tf, &m, err, errlen);
    topoFileFree(&tf);
    if (rc != 0) {
        /* name the file: the message only names the region */
        char why[512];
        snprintf(why, sizeof(why), "%s", err);
        snprintf(err, errlen, "%s: %s", path, why);
        return -1;
    }
    /* about 10 KB each: not on the caller's stack */
    plan = malloc(sizeof(*plan));
    exact = malloc(sizeof(*exact));
    if (plan == NULL || exact == NULL) {
        free(plan);
        free(exact);
        snprintf(err, errlen, "out of memory for the plan");
        return -1;
    }
    if (topoPlanBuild(&m, codecs, ncodecs, allowed, NULL, plan) != 0 ||
        topoPlanBuild(&m, codecs, ncodecs, 0, NULL, exact) != 0) {
        snprintf(err, errlen, "%s: the model rejected this topology", path);
        free(plan);
        free(exact);
        return -1;
    }
    if (json)
        print_json(path, &m, plan, exact, codecs, ncodecs, out);
    else
        print_text(path, &m, plan, exact, codecs, ncodecs, out);
    free(plan);
    free(exact);
    if (ferror(out)) {
        snprintf(err, errlen, "cannot write the simulation: %m");
        return -1;
    }
    return 0;
}
