/* The cost model built from a topology file (topoModelFromFile,
 * model.h): regions, rates, delays and round trips, the intra-region
 * link, streams and losses as the file gives them, the model's defaults
 * (topoModelInit) for what it leaves out.  Kept apart from the formulas
 * (model.c): this is parsing and checking, that is arithmetic. */
#include "config.h"
#include "topology/model.h"
#include "topology/model_internal.h"
#include "topology/wan_tuning.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* File rates are link (shaper) rates: TCP/IP headers take their share. */
#define TCP_GOODPUT (1448.0 / 1500.0)

int topoModelFromFile(const topoFile *tf, topoModel *out, char *err, size_t errlen)
{
    topoModel m;
    topoModelInit(&m);
    if (tf->nregions < 1) {
        snprintf(err, errlen, "the topology file declares no region");
        return -1;
    }
    if (tf->nregions > TOPO_MODEL_MAX_REGIONS) {
        snprintf(err, errlen, "the topology file has %d regions; the model takes at most %d",
                 tf->nregions, TOPO_MODEL_MAX_REGIONS);
        return -1;
    }
    m.nregions = tf->nregions;
    m.wan_goodput = TCP_GOODPUT; /* file rates are link (shaper) rates */
    for (int i = 0; i < tf->nrtts; i++) {
        int a = -1, b = -1;
        for (int q = 0; q < tf->nregions; q++) {
            if (strcmp(tf->regions[q].name, tf->rtts[i].a) == 0)
                a = q;
            if (strcmp(tf->regions[q].name, tf->rtts[i].b) == 0)
                b = q;
        }
        if (a < 0 || b < 0) { /* the parser declares every region it names */
            snprintf(err, errlen, "rtt line names an unknown region");
            return -1;
        }
        m.rtt_s[a][b] = m.rtt_s[b][a] = tf->rtts[i].ms / 1000.0;
    }
    for (int q = 0; q < tf->nregions; q++) {
        const topoFileRegion *g = &tf->regions[q];
        snprintf(m.names[q], sizeof(m.names[q]), "%s", g->name);
        m.ranks[q] = g->ranks;
        if (m.ranks[q] == 0)
            for (int i = 0; i < tf->nrules; i++)
                if (tf->rules[i].kind == 0 && strcmp(tf->rules[i].region, g->name) == 0)
                    m.ranks[q]++;
        if (m.ranks[q] == 0) {
            snprintf(err, errlen, "region '%s' has no size: give it ranks=N or rank lines",
                     g->name);
            return -1;
        }
        if (tf->nregions == 1) { /* no WAN: rate and delay unused */
            m.egress_Bps[q] = g->bw_bytes > 0 ? g->bw_bytes : 1;
            m.lat_s[q] = g->delay_ms > 0 ? g->delay_ms / 1000.0 : 0;
            continue;
        }
        if (!(g->bw_bytes > 0)) {
            snprintf(err, errlen, "region '%s' has no bw= (the rate of its WAN egress, e.g. "
                     "bw=10gbit)", g->name);
            return -1;
        }
        m.egress_Bps[q] = g->bw_bytes;
        m.ingress_Bps[q] = g->in_bytes;
        if (g->delay_ms >= 0) {
            m.lat_s[q] = g->delay_ms / 1000.0;
            continue;
        }
        for (int j = 0; j < tf->nregions; j++)
            if (j != q && !(m.rtt_s[q][j] > 0)) {
                snprintf(err, errlen, "region '%s' has no delay= and no rtt line to region "
                         "'%s'", g->name, tf->regions[j].name);
                return -1;
            }
        m.lat_s[q] = 0; /* every pair with q has a measured RTT */
    }
    if (tf->intra_delay_ms >= 0)
        m.intra_alpha_s = tf->intra_delay_ms / 1000.0;
    if (tf->intra_bw_bytes > 0)
        m.intra_Bps = tf->intra_bw_bytes;
    /* The node link: the file's `node` line, else the intra link (a file
     * that names no node link describes one link inside a region). */
    m.node_alpha_s = tf->node_delay_ms >= 0 ? tf->node_delay_ms / 1000.0 : m.intra_alpha_s;
    m.node_Bps = tf->node_bw_bytes > 0 ? tf->node_bw_bytes : m.intra_Bps;
    for (int q = 0; q < m.nregions; q++) {
        int g = tf->regions[q].node_ranks > 0 ? tf->regions[q].node_ranks : tf->node_ranks;
        /* a region smaller than a node is one node of its own ranks */
        if (g > 1 && g < m.ranks[q] && m.ranks[q] % g != 0) {
            snprintf(err, errlen, "region '%s' has %d ranks, not a whole number of nodes of %d",
                     m.names[q], m.ranks[q], g);
            return -1;
        }
        m.node_ranks[q] = g > m.ranks[q] ? m.ranks[q] : g;
    }
    if (tf->streams > 0) {
        /* The probe needed this many streams to fill a link: one stream
         * carries about the fastest egress over that many. */
        double fastest = 0;
        for (int q = 0; q < m.nregions; q++)
            fastest = fmax(fastest, m.egress_Bps[q] * m.wan_goodput);
        m.wan_streams = tf->streams;
        m.stream_Bps = m.nregions > 1 ? fastest / tf->streams : 0;
    }
    /* Loss lines: each region's worst outgoing pair, under what
     * GEOCCL_WAN_CC=auto would run there (topoWanCcChoice with bbr). */
    for (int k = 0; k < tf->nlosses; k++)
        for (int q = 0; q < m.nregions; q++)
            if (strcmp(tf->losses[k].from, m.names[q]) == 0)
                m.loss[q] = fmax(m.loss[q], tf->losses[k].fraction);
    for (int q = 0; q < m.nregions && m.nregions > 1; q++) {
        char why[192];
        int n;
        double rtt = 0, segs = 1e9;
        for (int j = 0; j < m.nregions; j++)
            if (j != q)
                rtt = fmax(rtt, 2 * topoModelOneway(&m, q, j));
        double share = m.egress_Bps[q] * m.wan_goodput / (m.nregions - 1) / m.ranks[q];
        m.loss_driven[q] = m.loss[q] > 0 &&
                           topoWanCcChoice(share, rtt, m.loss[q], segs, m.wan_streams, 1,
                                           m.wan_streams, &n, why, sizeof(why)) == TOPO_CC_CUBIC;
    }
    *out = m;
    return 0;
}
