/* Re-planning while a job runs (replan.h): the rule over observed uplink
 * rates, and this rank's achieved rate from its connections' counters. */
#include "config.h"
#include "topology/replan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether the readings of region g before its current run, since the
 * last re-plan, show a settled link: at least two, all within the band of
 * each other. */
static int settled(const topoReplanState *s, int g, double band)
{
    int n = s->nhist[g] - s->run[g];
    if (n < 2)
        return 0;
    double lo = s->hist[g][0], hi = lo;
    for (int i = 1; i < n; i++) {
        double v = s->hist[g][i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    return hi <= lo * (1 + band);
}

int topoReplanObserve(topoReplanState *s, int R, const double *plan, const double *known,
                      const double *obs, const double *busy, const double *full,
                      const double *cap, double band, int calls, char names[][32],
                      double *next, char *why, int whylen)
{
    int fire = 0, need[TOPO_REPLAN_MAX_REGIONS];
    if (R > TOPO_REPLAN_MAX_REGIONS)
        R = TOPO_REPLAN_MAX_REGIONS;
    if (calls < 1)
        calls = 1;
    double fullest = 0;
    for (int g = 0; full != NULL && g < R; g++)
        if (obs[g] > 0 && full[g] > fullest)
            fullest = full[g];
    for (int g = 0; g < R; g++) {
        int d = 0, informative = 0;
        /* a region planned under its known figure whose uplink ran at the
         * pace's cap: the link took all the cap let through, so it is at
         * least that fast; how much faster only an unpaced call shows */
        const int held = cap != NULL && cap[g] > 0 && known != NULL && plan[g] < known[g] &&
                         obs[g] >= TOPO_REPLAN_CAP_HELD * cap[g];
        if (held) {
            d = 1;
        } else if (obs[g] > 0 && plan[g] > 0) {
            double ratio = obs[g] / plan[g];
            d = ratio < 1 - band ? -1 : ratio > 1 + band ? 1 : 0;
            informative = 1;
            if (ratio < 1 && (!(busy[g] >= TOPO_REPLAN_BUSY_MIN) ||
                              (fullest >= TOPO_REPLAN_FULL_MIN &&
                               full[g] < TOPO_REPLAN_FULL_SHARE * fullest))) {
                d = 0;
                informative = 0;
            }
        }
        if (d == 0 || d != s->dir[g]) {
            s->run[g] = 0;
            s->sum[g] = 0;
            s->busy[g] = 0;
            s->held[g] = 0;
        }
        s->dir[g] = d;
        if (informative) {
            if (s->nhist[g] == TOPO_REPLAN_HIST) { /* the oldest goes */
                memmove(s->hist[g], s->hist[g] + 1, sizeof(double) * (TOPO_REPLAN_HIST - 1));
                s->nhist[g]--;
            }
            s->hist[g][s->nhist[g]++] = obs[g];
        }
        need[g] = calls;
        if (d != 0) {
            s->run[g]++;
            s->sum[g] += obs[g];
            /* how much of the call the region's uplink was saturated:
             * busy, and where the transport counts it, full */
            double sat = busy[g];
            if (full != NULL && full[g] < sat)
                sat = full[g];
            if (held) {
                sat = 0; /* full of what the cap held back: a floor */
                s->held[g]++;
            }
            s->busy[g] += sat;
            /* A link that has not settled since the last re-plan (its
             * readings spread wider than the band, or too few to say) must
             * hold the new rate twice as long: a flapping link's calls
             * read a different mix of its rates each time. */
            if (!settled(s, g, band))
                need[g] = 2 * calls;
            fire |= s->run[g] >= need[g];
        }
    }
    if (!fire)
        return 0;
    int o = 0;
    if (whylen > 0)
        why[0] = '\0';
    for (int g = 0; g < R; g++) {
        next[g] = plan[g];
        if (s->dir[g] != 0 && s->run[g] >= need[g]) {
            next[g] = s->sum[g] / s->run[g];
            /* faster while not limiting the calls: a floor, not the rate */
            int floor = s->dir[g] > 0 && s->busy[g] / s->run[g] < TOPO_REPLAN_BUSY_FULL;
            double read = next[g];
            if (floor && known != NULL && known[g] > next[g])
                next[g] = known[g];
            char taken[48] = "";
            if (next[g] > read)
                snprintf(taken, sizeof(taken), ", so the probe's %.1f", next[g] * 8e-6);
            char how[48];
            if (s->held[g] > 0)
                snprintf(how, sizeof(how), "%d held at the pace's cap", s->held[g]);
            else
                snprintf(how, sizeof(how), "%.0f%% %s", 100 * s->busy[g] / s->run[g],
                         full != NULL ? "full" : "busy");
            if (o < whylen - 1)
                o += snprintf(why + o, (size_t)(whylen - o), "%s%s's uplink %s%.1f Mbit/s over "
                              "%d calls at %s%s, planned %.1f", o ? "; " : "", names[g],
                              floor ? "at least " : "", read * 8e-6, s->run[g], how, taken,
                              plan[g] * 8e-6);
        }
    }
    for (int g = 0; g < R; g++) {
        s->run[g] = 0;
        s->sum[g] = 0;
        s->busy[g] = 0;
        s->held[g] = 0;
        s->dir[g] = 0;
        s->nhist[g] = 0;
    }
    s->replans++;
    return 1;
}

int topoReplanSnapshot(const geoNet *net, const topoRegionMap *m, int rank, int nranks,
                       topoReplanSnap *snap)
{
    if (snap->n != nranks) {
        topoReplanSnapFree(snap);
        snap->acked = calloc((size_t)nranks, sizeof(*snap->acked));
        snap->busy = calloc((size_t)nranks, sizeof(*snap->busy));
        snap->full = calloc((size_t)nranks, sizeof(*snap->full));
        if (snap->acked == NULL || snap->busy == NULL || snap->full == NULL) {
            topoReplanSnapFree(snap);
            return -1;
        }
        snap->n = nranks;
    }
    snap->valid = net->ops != NULL && net->ops->linkStats != NULL;
    const int me = m->region_of[rank];
    for (int r = 0; r < nranks; r++) {
        geoLinkStats ls;
        snap->acked[r] = 0;
        snap->busy[r] = 0;
        snap->full[r] = 0;
        if (!snap->valid || r == rank || m->region_of[r] == me ||
            net->ops->linkStats(net->state, r, &ls) != 0)
            continue;
        snap->acked[r] = ls.bytes_acked;
        snap->busy[r] = ls.busy;
        snap->full[r] = ls.full;
    }
    return 0;
}

void topoReplanSnapFree(topoReplanSnap *snap)
{
    free(snap->acked);
    free(snap->busy);
    free(snap->full);
    memset(snap, 0, sizeof(*snap));
}

double topoReplanRate(const topoReplanSnap *a, const topoReplanSnap *b, double *busy_out,
                      double *full_out)
{
    *busy_out = 0;
    *full_out = 0;
    if (!a->valid || !b->valid || a->n != b->n)
        return 0;
    double bytes = 0, busy = 0, full = 0;
    for (int r = 0; r < a->n; r++) {
        if (b->acked[r] <= a->acked[r])
            continue;
        bytes += (double)(b->acked[r] - a->acked[r]);
        double t = b->busy[r] - a->busy[r];
        if (t > busy)
            busy = t;
        t = b->full[r] - a->full[r];
        if (t > full)
            full = t;
    }
    *busy_out = busy;
    *full_out = full;
    return bytes > 0 && busy > 1e-3 ? bytes / busy : 0;
}
