/* The plan (model.h): per collective and message-size bucket, the
 * algorithm, codec (one for all regions, or one per sending region),
 * chunk and streams with the least time the cost model (model.c)
 * predicts, near ties going to the simpler choice; then the lookup a call
 * makes, and the plan printed as a table and as JSON. */
#include "config.h"
#include "topology/model.h"
#include "topology/model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The buckets go up to 4 GiB. */
_Static_assert(SIZE_MAX >= UINT64_MAX, "the plan's size buckets need a 64-bit size_t");

/* Choices within this share of the least time count as ties. */
#define PREFER_MARGIN 0.01

/* ---- plan ----------------------------------------------------------------- */

const char *topoCollName(int coll)
{
    static const char *const names[TOPO_COLL_COUNT] = {"allreduce", "allgather",
                                                       "reducescatter", "broadcast"};
    return coll >= 0 && coll < TOPO_COLL_COUNT ? names[coll] : "?";
}

const char *topoAlgoName(int algo)
{
    return algo == TOPO_ALGO_FLAT ? "flat" : algo == TOPO_ALGO_HIER ? "hier" : "?";
}

typedef struct {
    int algo, nstreams;
    const topoCodecCost *codec; /* NULL = none */
    size_t chunk;
    double sec;
    int by_region;              /* region_codec holds a codec per region */
    unsigned char region_codec[TOPO_MODEL_MAX_REGIONS];
    int node_stage;             /* all-reduce HIER: node stage, then region stage */
} planChoice;

static int same_choice(const topoPlanEntry *e, const planChoice *c, int R)
{
    int id = c->codec ? c->codec->id : TOPO_CODEC_NONE;
    return e->algo == c->algo && e->codec == id && e->chunk == c->chunk &&
           e->nstreams == c->nstreams && e->by_region == c->by_region &&
           e->node_stage == c->node_stage &&
           (!c->by_region || memcmp(e->region_codec, c->region_codec, (size_t)R) == 0);
}

/* topoPlanBuild's codec per sending region for a hierarchical all-reduce
 * whose best single codec c chose (model.h says how).  Sets c->by_region
 * and region_codec when a mix is kept. */
static void choose_by_region(const topoModel *m, const topoCodecCost *codecs, int ncodecs,
                             unsigned allowed, size_t bytes, planChoice *c)
{
    const int R = m->nregions;
    const topoCodecCost *cands[33], *cur[TOPO_MODEL_MAX_REGIONS];
    int ncand = 0;
    cands[ncand++] = NULL;
    for (int j = 0; j < ncodecs && ncand < 33; j++)
        if (codecs[j].id > TOPO_CODEC_NONE && codecs[j].id < 32 &&
            (allowed >> codecs[j].id) & 1u)
            cands[ncand++] = &codecs[j];
    if (ncand < 2 || R < 2)
        return;
    for (int q = 0; q < R; q++)
        cur[q] = c->codec;
    const double ref = c->sec;
    double t = ref;
    /* First each region takes the codec that gains over the margin, region
     * by region until a pass changes nothing (the time falls at every
     * change, so this ends); then each region sends exactly where the
     * time stays within the margin of what the first phase reached, each
     * checked against that same figure, so the two never undo each other. */
    for (int pass = 0, changed = 1; pass < 16 && changed; pass++) {
        changed = 0;
        for (int q = 0; q < R; q++) {
            const topoCodecCost *keep = cur[q];
            for (int j = 0; j < ncand; j++) {
                if (cands[j] == keep)
                    continue;
                cur[q] = cands[j];
                double tt = topoPredictHierByRegion(m, cur, bytes, c->chunk, c->nstreams);
                if (tt >= 0 && tt < t * (1 - PREFER_MARGIN)) {
                    keep = cands[j];
                    t = tt;
                    changed = 1;
                }
            }
            cur[q] = keep;
        }
    }
    const double reached = t;
    for (int q = 0; q < R; q++) {
        const topoCodecCost *keep = cur[q];
        if (keep == NULL)
            continue;
        cur[q] = NULL;
        double tt = topoPredictHierByRegion(m, cur, bytes, c->chunk, c->nstreams);
        if (tt >= 0 && tt <= reached * (1 + PREFER_MARGIN))
            t = tt;
        else
            cur[q] = keep;
    }
    int mixed = 0;
    for (int q = 1; q < R; q++)
        mixed |= cur[q] != cur[0];
    if (!mixed || t > ref * (1 + PREFER_MARGIN))
        return;
    c->by_region = 1;
    c->sec = t;
    for (int q = 0; q < R; q++)
        c->region_codec[q] = (unsigned char)(cur[q] ? cur[q]->id : TOPO_CODEC_NONE);
}

/* Candidate chunks: the default first (preferred on a near tie), then
 * sizes around it that the library has been run with. */
static int chunk_candidates(const topoModel *m, int coll, int algo, const topoPlanForce *f,
                            size_t *out)
{
    static const size_t flat_c[] = {128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20};
    /* large slices amortise the intra rings' (P-1) alphas on big regions */
    static const size_t hier_c[] = {1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20,
                                    256 << 20};
    if (f->chunk > 0) {
        out[0] = (size_t)f->chunk;
        return 1;
    }
    int hier = algo == TOPO_ALGO_HIER && coll != TOPO_COLL_BROADCAST && m->nregions > 1;
    int n = 0;
    out[n++] = hier ? m->hier_slice : m->chunk;
    /* only the hierarchical all-reduce is sliced */
    if (hier && coll != TOPO_COLL_ALLREDUCE)
        return n;
    int ncand = hier ? (int)(sizeof(hier_c) / sizeof(hier_c[0]))
                     : (int)(sizeof(flat_c) / sizeof(flat_c[0]));
    for (int i = 0; i < ncand; i++) {
        size_t c = hier ? hier_c[i] : flat_c[i];
        if (c != out[0])
            out[n++] = c;
    }
    return n;
}

/* ms[0]: the model with one ring per region, ms[1]: with the node
 * stage (topoModel.node_stage). */
static void choose(const topoModel *const ms[2], const topoCodecCost *codecs, int ncodecs,
                   unsigned allowed, const topoPlanForce *f, const topoCodecCost *forced,
                   int coll, size_t bytes, planChoice *best)
{
    const topoModel *m = ms[0];
    /* (algorithm, node stage) in order of preference: the node stage only
     * for the hierarchical all-reduce where some region has nodes */
    int algos[3], nodes[3], nalgo = 0;
    int staged = coll == TOPO_COLL_ALLREDUCE && topoModelHasNodes(m);
    if (f->algo >= 0) {
        algos[nalgo] = m->nregions > 1 ? f->algo : TOPO_ALGO_FLAT;
        nodes[nalgo++] = 0;
    } else {
        algos[nalgo] = TOPO_ALGO_FLAT;
        nodes[nalgo++] = 0;
        if (m->nregions > 1) {
            algos[nalgo] = TOPO_ALGO_HIER;
            nodes[nalgo++] = 0;
        }
    }
    if (staged && algos[nalgo - 1] == TOPO_ALGO_HIER) {
        algos[nalgo] = TOPO_ALGO_HIER;
        nodes[nalgo++] = 1;
    }
    int streams[16], nst = 0;
    if (f->nstreams > 0)
        streams[nst++] = f->nstreams;
    else {
        for (int s = 1; s < m->wan_streams && nst < 15; s *= 2)
            streams[nst++] = s;
        streams[nst++] = m->wan_streams;
    }
    /* Two passes: the least time, then the first candidate in preference
     * order (flat, none, codecs in table order, the default chunk, fewer
     * streams) within PREFER_MARGIN of it, so that near ties go to the
     * simpler choice and the plan does not flicker between equals. */
    best->sec = -1;
    double least = -1;
    for (int pass = 0; pass < 2 && best->sec < 0; pass++)
        for (int ia = 0; ia < nalgo && best->sec < 0; ia++) {
            int algo = algos[ia];
            m = ms[nodes[ia]];
            const topoCodecCost *cands[65];
            int ncand = 0;
            int compresses = coll == TOPO_COLL_ALLREDUCE && algo == TOPO_ALGO_HIER &&
                             m->nregions > 1;
            if (compresses && f->codec >= 0)
                cands[ncand++] = forced; /* NULL when none was forced */
            else {
                cands[ncand++] = NULL;
                for (int j = 0; compresses && j < ncodecs && ncand < 65; j++)
                    if (codecs[j].id != TOPO_CODEC_NONE && codecs[j].id >= 0 &&
                        codecs[j].id < 32 && (allowed >> codecs[j].id) & 1u)
                        cands[ncand++] = &codecs[j];
            }
            size_t chunks[16];
            int nch = chunk_candidates(m, coll, algo, f, chunks);
            for (int ic = 0; ic < ncand && best->sec < 0; ic++)
                for (int k = 0; k < nch && best->sec < 0; k++)
                    for (int is = 0; is < nst; is++) {
                        double t = topoPredict(m, coll, algo, cands[ic], bytes, chunks[k],
                                               streams[is]);
                        if (t < 0)
                            continue;
                        if (pass == 0) {
                            if (least < 0 || t < least)
                                least = t;
                        } else if (t <= least * (1 + PREFER_MARGIN)) {
                            best->algo = algo;
                            best->codec = cands[ic] && cands[ic]->id != TOPO_CODEC_NONE
                                              ? cands[ic] : NULL;
                            best->chunk = chunks[k];
                            best->nstreams = streams[is];
                            best->node_stage = nodes[ia];
                            best->sec = t;
                            break;
                        }
                    }
        }
}

int topoPlanBuild(const topoModel *m, const topoCodecCost *codecs, int ncodecs,
                  unsigned allowed_mask, const topoPlanForce *force, topoPlan *out)
{
    static const topoPlanForce none = TOPO_PLAN_FORCE_NONE;
    const topoPlanForce *f = force ? force : &none;
    const topoCodecCost *forced = NULL;
    if (!topoModelOk(m) || (ncodecs > 0 && codecs == NULL) || ncodecs < 0)
        return -1;
    if (f->algo >= TOPO_ALGO_COUNT || (f->nstreams == 0) || f->chunk == 0)
        return -1;
    if (f->codec > TOPO_CODEC_NONE) {
        for (int j = 0; j < ncodecs; j++)
            if (codecs[j].id == f->codec)
                forced = &codecs[j];
        if (forced == NULL) /* no costs for it: nothing to predict with */
            return -1;
    }
    topoModel m0 = *m, m1 = *m;
    m0.node_stage = 0;
    m1.node_stage = 1;
    const topoModel *const ms[2] = {&m0, &m1};
    topoPlan p;
    memset(&p, 0, sizeof(p));
    p.nregions = m->nregions;
    p.nranks = topoModelNranks(m);
    memcpy(p.region_names, m->names, sizeof(p.region_names));
    snprintf(p.codec_names[TOPO_CODEC_NONE], sizeof(p.codec_names[0]), "none");
    for (int j = 0; j < ncodecs; j++)
        if (codecs[j].id > TOPO_CODEC_NONE && codecs[j].id < 32 && codecs[j].name)
            snprintf(p.codec_names[codecs[j].id], sizeof(p.codec_names[0]), "%s",
                     codecs[j].name);
    for (int coll = 0; coll < TOPO_COLL_COUNT; coll++) {
        for (int k = TOPO_PLAN_MIN_LOG2; k <= TOPO_PLAN_MAX_LOG2; k++) {
            size_t bytes = (size_t)1 << k;
            /* Chosen at 1.5 x the bucket's start, not at the start: a
             * threshold of the library (GEOCCL_DIRECT_MAX, a power of two)
             * would otherwise make the start's regime speak for a bucket
             * whose other sizes all run another algorithm. */
            size_t rep = k > TOPO_PLAN_MIN_LOG2 ? bytes + bytes / 2 : bytes;
            planChoice c;
            memset(&c, 0, sizeof(c));
            c.sec = -1;
            choose(ms, codecs, ncodecs, allowed_mask, f, forced, coll, rep, &c);
            if (c.sec < 0)
                return -1;
            if (coll == TOPO_COLL_ALLREDUCE && c.algo == TOPO_ALGO_HIER && f->codec < 0)
                choose_by_region(ms[c.node_stage], codecs, ncodecs, allowed_mask, rep, &c);
            topoPlanEntry *last = p.nentries[coll] ? &p.entries[coll][p.nentries[coll] - 1] : NULL;
            if (last != NULL && same_choice(last, &c, m->nregions)) {
                last->hi = k == TOPO_PLAN_MAX_LOG2 ? SIZE_MAX : ((size_t)1 << (k + 1)) - 1;
                last->sec_top = c.sec;
                continue;
            }
            topoPlanEntry *e = &p.entries[coll][p.nentries[coll]++];
            e->lo = k == TOPO_PLAN_MIN_LOG2 ? 0 : bytes;
            e->hi = k == TOPO_PLAN_MAX_LOG2 ? SIZE_MAX : ((size_t)1 << (k + 1)) - 1;
            e->algo = c.algo;
            e->codec = c.codec ? c.codec->id : TOPO_CODEC_NONE;
            snprintf(e->codec_name, sizeof(e->codec_name), "%s",
                     c.codec && c.codec->name ? c.codec->name : "none");
            e->chunk = c.chunk;
            e->nstreams = c.nstreams;
            e->sec_lo = e->sec_top = c.sec;
            e->by_region = c.by_region;
            e->node_stage = c.node_stage;
            memcpy(e->region_codec, c.region_codec, sizeof(e->region_codec));
        }
    }
    *out = p;
    return 0;
}

const topoPlanEntry *topoPlanLookup(const topoPlan *plan, int coll, size_t bytes)
{
    if (plan == NULL || coll < 0 || coll >= TOPO_COLL_COUNT || plan->nentries[coll] < 1)
        return NULL;
    int lo = 0, hi = plan->nentries[coll] - 1;
    while (lo < hi) { /* the last entry whose lo <= bytes; entries[0].lo == 0 */
        int mid = (lo + hi + 1) / 2;
        if (plan->entries[coll][mid].lo <= bytes)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &plan->entries[coll][lo];
}

/* "512K", "4M", "1G", or bytes; a power of two's exact suffix form. */
static const char *fmt_size(size_t v, char *buf, size_t len)
{
    static const char sfx[] = "KMGTP";
    int i = -1;
    while (v >= 1024 && v % 1024 == 0 && i < 4) {
        v /= 1024;
        i++;
    }
    if (i < 0)
        snprintf(buf, len, "%zu", v);
    else
        snprintf(buf, len, "%zu%c", v, sfx[i]);
    return buf;
}

static const char *fmt_sec(double s, char *buf, size_t len)
{
    if (s < 1e-3)
        snprintf(buf, len, "%.1f us", s * 1e6);
    else if (s < 1)
        snprintf(buf, len, "%.2f ms", s * 1e3);
    else
        snprintf(buf, len, "%.3f s", s);
    return buf;
}

/* A region's name in a plan; its index where the model had none. */
static const char *region_label(const topoPlan *plan, int q)
{
    static __thread char buf[16];
    if (plan->region_names[q][0])
        return plan->region_names[q];
    snprintf(buf, sizeof(buf), "region %d", q);
    return buf;
}

void topoPlanPrint(const topoPlan *plan, FILE *f)
{
    char a[32], b[32], c[32], t1[32], t2[32];
    fprintf(f, "plan for %d regions, %d ranks\n", plan->nregions, plan->nranks);
    fprintf(f, "  %-14s %-16s %-9s %-10s %-7s %-7s %s\n", "collective", "sizes", "algo",
            "codec", "chunk", "streams", "predicted (first - last size)");
    for (int coll = 0; coll < TOPO_COLL_COUNT; coll++)
        for (int i = 0; i < plan->nentries[coll]; i++) {
            const topoPlanEntry *e = &plan->entries[coll][i];
            char range[40];
            if (e->hi == SIZE_MAX)
                snprintf(range, sizeof(range), "%s and up", fmt_size(e->lo, a, sizeof(a)));
            else
                snprintf(range, sizeof(range), "%s-%s", fmt_size(e->lo, a, sizeof(a)),
                         fmt_size(e->hi + 1, b, sizeof(b)));
            fprintf(f, "  %-14s %-16s %-9s %-10s %-7s %-7d %s - %s\n", topoCollName(coll),
                    range, e->node_stage ? "hier+node" : topoAlgoName(e->algo), e->by_region ? "by region" : e->codec_name,
                    fmt_size(e->chunk, c, sizeof(c)), e->nstreams,
                    fmt_sec(e->sec_lo, t1, sizeof(t1)), fmt_sec(e->sec_top, t2, sizeof(t2)));
            if (e->by_region) {
                fprintf(f, "  %-14s %-16s codec of what each region sends:", "", "");
                for (int q = 0; q < plan->nregions; q++)
                    fprintf(f, "%s %s %s", q ? "," : "", region_label(plan, q),
                            plan->codec_names[e->region_codec[q] & 31]);
                fprintf(f, " (one codec for all: %s)\n", e->codec_name);
            }
        }
    fprintf(f, "  (sizes: from lo up to, not including, hi; hier+node: the hierarchical "
            "all-reduce's node stage, then its region stage, in regions of several nodes)\n");
}

void topoPlanJson(const topoPlan *plan, FILE *f)
{
    fprintf(f, "{\"nregions\": %d, \"nranks\": %d, \"entries\": [", plan->nregions,
            plan->nranks);
    int first = 1;
    for (int coll = 0; coll < TOPO_COLL_COUNT; coll++)
        for (int i = 0; i < plan->nentries[coll]; i++) {
            const topoPlanEntry *e = &plan->entries[coll][i];
            char hi[32];
            if (e->hi == SIZE_MAX)
                snprintf(hi, sizeof(hi), "null");
            else
                snprintf(hi, sizeof(hi), "%zu", e->hi);
            fprintf(f, "%s\n  {\"coll\": \"%s\", \"lo\": %zu, \"hi\": %s, \"algo\": \"%s\", "
                    "\"codec\": \"%s\", \"codec_id\": %d, \"chunk\": %zu, \"streams\": %d, "
                    "\"sec_lo\": %.6g, \"sec_top\": %.6g", first ? "" : ",", topoCollName(coll),
                    e->lo, hi, topoAlgoName(e->algo), e->codec_name, e->codec, e->chunk,
                    e->nstreams, e->sec_lo, e->sec_top);
            if (e->algo == TOPO_ALGO_HIER && coll == TOPO_COLL_ALLREDUCE)
                fprintf(f, ", \"node_stage\": %d", e->node_stage);
            if (e->by_region) {
                fprintf(f, ", \"region_codecs\": {");
                for (int q = 0; q < plan->nregions; q++) {
                    fprintf(f, "%s\"", q ? ", " : "");
                    for (const char *n = region_label(plan, q); *n; n++)
                        fputc(*n == '"' || *n == '\\' ? '_' : *n, f);
                    fprintf(f, "\": \"%s\"", plan->codec_names[e->region_codec[q] & 31]);
                }
                fprintf(f, "}");
            }
            fprintf(f, "}");
            first = 0;
        }
    fprintf(f, "\n]}");
}
