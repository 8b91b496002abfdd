/* What the probe takes instead of measuring, and what it writes
 * (probe.h): a parent communicator's figures for a split or shrunk child
 * (geoTopoInheritFrom, probeApplyInherit), the regions those do not
 * cover, whose pairs alone are measured (probeInheritFresh), a topology file's
 * (probeApplyFile), and the topology file written from what is known
 * (geoTopoWrite). */
#include "config.h"
#include "topology/probe.h"
#include "topology/probe_internal.h"
#include "topology/topofile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- a parent's topology ------------------------------------------------ */

void geoTopoInheritFree(geoTopoInherit *inh)
{
    free(inh->names);
    free(inh->egress);
    free(inh->ingress);
    free(inh->oneway);
    free(inh->rtt);
    memset(inh, 0, sizeof(*inh));
}

int geoTopoInheritFrom(const geoTopo *t, const topoRegionMap *m, int rank,
                       const geoTopoInherit *parent_inh, geoTopoInherit *inh)
{
    int M = m->nregions, R = M;
    memset(inh, 0, sizeof(*inh));
    if (M < 1)
        return 0;
    /* Regions the parent remembered that this map lacks. */
    int *extra = calloc((size_t)(parent_inh ? parent_inh->nregions : 0) + 1, sizeof(int));
    if (extra == NULL)
        return -1;
    for (int k = 0; parent_inh != NULL && k < parent_inh->nregions; k++) {
        int known = 0;
        for (int g = 0; g < M; g++)
            known |= strncmp(parent_inh->names[k], m->names[g], sizeof(parent_inh->names[k])) == 0;
        if (!known)
            extra[R++ - M] = k;
    }
    inh->names = calloc((size_t)R, sizeof(*inh->names));
    inh->egress = calloc((size_t)R, sizeof(double));
    inh->ingress = calloc((size_t)R, sizeof(double));
    inh->oneway = calloc((size_t)R, sizeof(double));
    inh->rtt = calloc((size_t)R * (size_t)R, sizeof(double));
    if (!inh->names || !inh->egress || !inh->ingress || !inh->oneway || !inh->rtt) {
        free(extra);
        geoTopoInheritFree(inh);
        return -1;
    }
    inh->nregions = R;
    snprintf(inh->label, sizeof(inh->label), "%s", m->names[m->region_of[rank]]);
    for (int g = 0; g < M; g++) {
        snprintf(inh->names[g], sizeof(inh->names[g]), "%s", m->names[g]);
        inh->egress[g] = t->egress ? t->egress[g] : 0;
        inh->ingress[g] = t->ingress ? t->ingress[g] : 0;
        inh->oneway[g] = t->oneway ? t->oneway[g] : 0;
        for (int h = 0; h < M; h++)
            inh->rtt[g * R + h] = t->region_rtt ? t->region_rtt[g * M + h] : -1;
    }
    /* The remembered ones: their own figures, and their RTTs to the
     * regions the parent knew by the same names. */
    for (int g = M; g < R; g++) {
        const geoTopoInherit *p = parent_inh;
        int k = extra[g - M];
        snprintf(inh->names[g], sizeof(inh->names[g]), "%s", p->names[k]);
        inh->egress[g] = p->egress[k];
        inh->ingress[g] = p->ingress[k];
        inh->oneway[g] = p->oneway[k];
        for (int h = 0; h < R; h++) {
            int kh = -1;
            for (int j = 0; j < p->nregions; j++)
                if (strncmp(p->names[j], inh->names[h], sizeof(p->names[j])) == 0)
                    kh = j;
            double x = kh < 0 ? -1 : p->rtt[k * p->nregions + kh];
            inh->rtt[g * R + h] = inh->rtt[h * R + g] = h == g ? 0 : x;
        }
    }
    free(extra);
    inh->bw_known = t->bw_measured || t->from_file || t->inherited;
    inh->bw_measured = t->bw_measured || (t->inherited && parent_inh != NULL && parent_inh->bw_measured);
    inh->intra_Bps = t->intra_Bps;
    inh->intra_alpha = t->intra_alpha;
    inh->valid = 1;
    return 0;
}

int geoTopoInheritCopy(const geoTopoInherit *src, geoTopoInherit *dst)
{
    int R = src->nregions;
    memset(dst, 0, sizeof(*dst));
    if (!src->valid)
        return 0;
    *dst = *src;
    dst->names = calloc((size_t)R + 1, sizeof(*dst->names));
    dst->egress = calloc((size_t)R + 1, sizeof(double));
    dst->ingress = calloc((size_t)R + 1, sizeof(double));
    dst->oneway = calloc((size_t)R + 1, sizeof(double));
    dst->rtt = calloc((size_t)R * (size_t)R + 1, sizeof(double));
    if (!dst->names || !dst->egress || !dst->ingress || !dst->oneway || !dst->rtt) {
        geoTopoInheritFree(dst);
        return -1;
    }
    memcpy(dst->names, src->names, sizeof(*dst->names) * (size_t)R);
    memcpy(dst->egress, src->egress, sizeof(double) * (size_t)R);
    memcpy(dst->ingress, src->ingress, sizeof(double) * (size_t)R);
    memcpy(dst->oneway, src->oneway, sizeof(double) * (size_t)R);
    memcpy(dst->rtt, src->rtt, sizeof(double) * (size_t)R * (size_t)R);
    return 0;
}

/* The parent's figures for the regions this child has (matched by name). */
void probeApplyInherit(const geoProbeCtx *pc, geoTopo *t)
{
    const geoTopoInherit *inh = pc->inherit;
    const topoRegionMap *m = pc->regions;
    int R = m->nregions, found = 0, idx[256];
    if (R > 256)
        return;
    for (int g = 0; g < R; g++) {
        idx[g] = -1;
        for (int k = 0; k < inh->nregions; k++)
            if (strncmp(inh->names[k], m->names[g], TOPO_REGION_LABEL_LEN) == 0)
                idx[g] = k;
        if (idx[g] >= 0 && inh->egress[idx[g]] > 0) {
            t->egress[g] = inh->egress[idx[g]];
            t->ingress[g] = inh->ingress[idx[g]];
            found++;
        }
        if (idx[g] >= 0)
            t->oneway[g] = inh->oneway[idx[g]];
    }
    /* A fresh region's round trips (t->fresh) are the ones measured. */
    for (int a = 0; a < R; a++)
        for (int b = 0; b < R; b++)
            if (a != b && idx[a] >= 0 && idx[b] >= 0 &&
                !(t->fresh != NULL && (t->fresh[a] || t->fresh[b])))
                t->region_rtt[a * R + b] = inh->rtt[idx[a] * inh->nregions + idx[b]];
    t->intra_Bps = inh->intra_Bps;
    t->intra_alpha = inh->intra_alpha;
    t->inherited = inh->bw_known && found == R;
}

/* Regions the parent's figures do not cover (no region of that name, or
 * no rate for it: a region never seen before, joining), while they cover
 * the others: then only the pairs of regions with one of them are measured
 * (t->fresh) and the figures among the covered ones are the parent's.
 * Covered as probeApplyInherit counts it.  Every rank holds the same
 * figures (stayers the parent's, joiners their admission's, made from the
 * same), so every rank decides alike.  No fresh region, or no covered one:
 * t->fresh stays NULL (nothing to measure, or the whole probe).  0, or -1
 * when out of memory. */
int probeInheritFresh(const geoProbeCtx *pc, geoTopo *t)
{
    const geoTopoInherit *inh = pc->inherit;
    const topoRegionMap *m = pc->regions;
    int R = m->nregions, nfresh = 0;
    if (inh == NULL || !inh->bw_known || pc->file != NULL || R < 2)
        return 0;
    unsigned char *fresh = calloc((size_t)R, 1);
    if (fresh == NULL)
        return -1;
    for (int g = 0; g < R; g++) {
        int covered = 0;
        for (int k = 0; k < inh->nregions; k++)
            covered |= strncmp(inh->names[k], m->names[g], TOPO_REGION_LABEL_LEN) == 0 &&
                       inh->egress[k] > 0;
        fresh[g] = !covered;
        nfresh += fresh[g];
    }
    if (nfresh == 0 || nfresh == R) {
        free(fresh);
        return 0;
    }
    t->fresh = fresh;
    return 0;
}

/* ---- a topology file --------------------------------------------------- */

/* Link figures a topology file gives for the regions in use; from_file when
 * it gives every region's rate (then there is nothing left to measure). */
void probeApplyFile(const geoProbeCtx *pc, geoTopo *t)
{
    const topoFile *tf = pc->file;
    const topoRegionMap *m = pc->regions;
    int R = m->nregions, rates = 0;
    for (int g = 0; g < R; g++)
        for (int k = 0; k < tf->nregions; k++) {
            if (strncmp(tf->regions[k].name, m->names[g], TOPO_REGION_LABEL_LEN) != 0)
                continue;
            if (tf->regions[k].bw_bytes > 0 && !t->bw_measured) {
                t->egress[g] = tf->regions[k].bw_bytes;
                t->ingress[g] = tf->regions[k].in_bytes;
                rates++;
            }
            if (tf->regions[k].delay_ms >= 0 && !t->rtt_measured)
                t->oneway[g] = tf->regions[k].delay_ms * 1e-3;
        }
    if (!t->rtt_measured) {
        for (int a = 0; a < R; a++)
            for (int b = 0; b < R; b++)
                t->region_rtt[a * R + b] = a == b ? 0 : t->oneway[a] + t->oneway[b];
        /* Measured RTTs the file kept win over the sums of delays. */
        for (int k = 0; k < tf->nrtts; k++) {
            int a = -1, b = -1;
            for (int g = 0; g < R; g++) {
                if (strncmp(tf->rtts[k].a, m->names[g], TOPO_REGION_LABEL_LEN) == 0)
                    a = g;
                if (strncmp(tf->rtts[k].b, m->names[g], TOPO_REGION_LABEL_LEN) == 0)
                    b = g;
            }
            if (a >= 0 && b >= 0 && a != b)
                t->region_rtt[a * R + b] = t->region_rtt[b * R + a] = tf->rtts[k].ms * 1e-3;
        }
    }
    /* Loss figures, unless measured now.  One the user wrote (no segment
     * count) is taken as a measurement. */
    for (int k = 0; k < tf->nlosses; k++) {
        int a = -1, b = -1;
        for (int g = 0; g < R; g++) {
            if (strncmp(tf->losses[k].from, m->names[g], TOPO_REGION_LABEL_LEN) == 0)
                a = g;
            if (strncmp(tf->losses[k].to, m->names[g], TOPO_REGION_LABEL_LEN) == 0)
                b = g;
        }
        if (a >= 0 && b >= 0 && a != b && !t->bw_measured) {
            t->loss[a * R + b] = tf->losses[k].fraction;
            t->loss_segs[a * R + b] = tf->losses[k].segs > 0 ? tf->losses[k].segs : 1e9;
        }
    }
    t->from_file = R > 1 && rates == R;
}


static void rate_str(double bps, char *out, size_t len)
{
    if (bps >= 1e9)
        snprintf(out, len, "%.3fgbit", bps * 8e-9);
    else
        snprintf(out, len, "%.1fmbit", bps * 8e-6);
}

int geoTopoWrite(const geoTopo *t, const topoRegionMap *m, int nranks, FILE *f)
{
    int R = m->nregions;
    time_t now = time(NULL);
    char when[64];

    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    fprintf(f, "# GeoCCL topology, written by the probe on %s\n", when);
    fprintf(f, "# %d ranks, %d nodes, %d regions; loaded with GEOCCL_TOPO_FILE, it skips the "
            "probe\n", nranks, t->nnodes, R);
    fprintf(f, "# bw: link rate estimated from the measured TCP goodput (x 1500/1448)\n");
    for (int g = 0; g < R; g++) {
        char rate[64] = "";
        if (t->bw_measured && t->egress && t->egress[g] > 0) {
            char r[24];
            /* Files hold link rates; what TCP measured is 1448/1500 of it. */
            rate_str(t->egress[g] * 1500.0 / 1448.0, r, sizeof(r));
            snprintf(rate, sizeof(rate), " bw=%s", r);
        }
        if (t->ingress && t->ingress[g] > 0) {
            char r[24];
            size_t len = strlen(rate);
            rate_str(t->bw_measured ? t->ingress[g] * 1500.0 / 1448.0 : t->ingress[g], r,
                     sizeof(r));
            snprintf(rate + len, sizeof(rate) - len, " in=%s", r);
        }
        fprintf(f, "region %s ranks=%d%s", m->names[g][0] ? m->names[g] : "default", m->size[g],
                rate);
        if (t->oneway && (t->rtt_measured || t->from_file))
            fprintf(f, " delay=%.3f", t->oneway[g] * 1e3);
        fprintf(f, "\n");
    }
    for (int k = 0; k < t->nnodes; k++) {
        const char *name = m->names[m->region_of[t->leader[k]]];
        fprintf(f, "host %s %s\n", t->node_addr[k], name[0] ? name : "default");
    }
    if (t->rtt_measured)
        for (int a = 0; a < R; a++)
            for (int b = a + 1; b < R; b++)
                if (t->region_rtt[a * R + b] >= 0)
                    fprintf(f, "rtt %s %s %.3f\n", m->names[a], m->names[b],
                            t->region_rtt[a * R + b] * 1e3);
    if (t->bw_measured)
        /* The connections to make next time: as many as needed, or those
         * kept in use on links slow enough that extra ones cost nothing. */
        fprintf(f, "streams %d\n",
                t->streams_used > t->streams_needed ? t->streams_used : t->streams_needed);
    if (t->bw_measured && t->loss != NULL)
        for (int a = 0; a < R; a++)
            for (int b = 0; b < R; b++)
                if (a != b && t->loss[a * R + b] >= 0 && t->loss_segs[a * R + b] > 0)
                    fprintf(f, "loss %s %s %.4g%% segments=%.0f\n", m->names[a], m->names[b],
                            t->loss[a * R + b] * 100, t->loss_segs[a * R + b]);
    if (t->intra_Bps > 0)
        fprintf(f, "intra bw=%.0f delay=%.4f\n", t->intra_Bps, t->intra_alpha * 1e3);
    return ferror(f) ? -1 : 0;
}
