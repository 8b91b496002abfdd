#include "config.h"
#include "topology/cluster.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int uf_find(int *parent, int i)
{
    while (parent[i] != i) {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    return i;
}

/* The pair's value: the smaller known direction; < 0 when neither is. */
static double pair_rtt(int n, const double *rtt, int i, int j)
{
    double a = rtt[(size_t)i * (size_t)n + (size_t)j];
    double b = rtt[(size_t)j * (size_t)n + (size_t)i];
    int ka = a >= 0 && !isnan(a), kb = b >= 0 && !isnan(b);
    if (ka && kb)
        return a < b ? a : b;
    return ka ? a : kb ? b : -1;
}

double topoRttCut(int n, const double *rtt, double min_wan_rtt, double max_lan_rtt,
                  double min_ratio)
{
    size_t npairs = 0, cap = (size_t)n * (size_t)(n > 1 ? n - 1 : 1) / 2 + 1;
    double *v = malloc(sizeof(double) * cap), thr = 0, best = 0;

    if (v == NULL)
        return -1;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            double x = pair_rtt(n, rtt, i, j);
            if (x >= 0)
                v[npairs++] = x;
        }
    qsort(v, npairs, sizeof(double), cmp_double);
    for (size_t k = 0; k + 1 < npairs; k++) {
        double lo = v[k] > TOPO_RTT_FLOOR ? v[k] : TOPO_RTT_FLOOR;
        double ratio = v[k + 1] / lo;
        if (v[k + 1] >= min_wan_rtt && v[k] < max_lan_rtt && ratio >= min_ratio &&
            ratio > best) {
            best = ratio;
            thr = sqrt(lo * v[k + 1]);
        }
    }
    free(v);
    return thr > 0 ? thr : min_wan_rtt;
}

int topoClusterRtt(int n, const double *rtt, double min_wan_rtt, double max_lan_rtt,
                   double min_ratio, int *region, double *cut)
{
    int *parent = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    int *id = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    double thr = topoRttCut(n, rtt, min_wan_rtt, max_lan_rtt, min_ratio);
    int nreg = 0;

    if (parent == NULL || id == NULL || thr < 0) {
        free(parent);
        free(id);
        return -1;
    }
    for (int i = 0; i < n; i++)
        parent[i] = i;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            double x = pair_rtt(n, rtt, i, j);
            if (x >= 0 && x < thr) {
                int a = uf_find(parent, i), b = uf_find(parent, j);
                if (a != b)
                    parent[a > b ? a : b] = a < b ? a : b;
            }
        }
    /* Number regions by lowest node: roots are their set's lowest node. */
    for (int i = 0; i < n; i++)
        id[i] = -1;
    for (int i = 0; i < n; i++) {
        int r = uf_find(parent, i);
        if (id[r] < 0)
            id[r] = nreg++;
        region[i] = id[r];
    }
    if (cut)
        *cut = nreg > 1 ? thr : 0;
    free(parent);
    free(id);
    return nreg;
}

void topoSolveOneWay(int R, const double *rtt, double *oneway)
{
    if (R <= 0)
        return;
    if (R == 1) {
        oneway[0] = 0;
        return;
    }
    /* Normal equations of min sum (d_i + d_j - rtt_ij)^2 over known pairs,
     * solved by Gauss-Seidel: d_i = mean over known j of (rtt_ij - d_j).
     * With every pair known this converges to the closed form; unknown
     * pairs simply drop out. */
    for (int i = 0; i < R; i++)
        oneway[i] = 0;
    for (int iter = 0; iter < 200; iter++) {
        double change = 0;
        for (int i = 0; i < R; i++) {
            double s = 0;
            int k = 0;
            for (int j = 0; j < R; j++) {
                if (j == i)
                    continue;
                double x = pair_rtt(R, rtt, i, j);
                if (x < 0)
                    continue;
                s += x - oneway[j];
                k++;
            }
            if (k == 0)
                continue;
            double d = s / k;
            if (R == 2) {
                /* Two regions: one equation, two unknowns; split evenly. */
                double x = pair_rtt(R, rtt, 0, 1);
                oneway[0] = oneway[1] = x >= 0 ? x / 2 : 0;
                return;
            }
            change += fabs(d - oneway[i]);
            oneway[i] = d;
        }
        if (change < 1e-9)
            break;
    }
    for (int i = 0; i < R; i++)
        if (oneway[i] < 0)
            oneway[i] = 0;
}

int topoStreamsNeeded(double bw, double rtt, double win, int max_streams)
{
    if (max_streams < 1)
        max_streams = 1;
    if (!(bw > 0) || !(rtt > 0) || !(win > 0))
        return 1;
    double s = ceil(bw * rtt / win);
    if (s < 1)
        s = 1;
    return s > max_streams ? max_streams : (int)s;
}

double topoSteadyRate(int n, const double *t, const double *bytes, double skip, double upto)
{
    if (n < 3)
        return 0;
    double t0 = t[0], t1 = t[n - 1];
    double from = t0 + skip * (t1 - t0), to = t0 + upto * (t1 - t0);
    int k = 0, e = n - 1;
    while (k < n - 2 && t[k] < from)
        k++;
    while (e > k + 1 && t[e] > to)
        e--;
    /* Least-squares slope of cumulative bytes against completion time over
     * messages k..e: a completion noticed late (the receiver was not
     * scheduled) moves one point, not the whole estimate as it would if it
     * were an end point. */
    double cum = 0, st = 0, sb = 0, stt = 0, stb = 0;
    int m = 0;
    for (int i = k; i <= e; i++) {
        if (i > k)
            cum += bytes[i];
        st += t[i];
        sb += cum;
        stt += t[i] * t[i];
        stb += t[i] * cum;
        m++;
    }
    double den = m * stt - st * st;
    if (m < 2 || !(den > 0))
        return 0;
    double slope = (m * stb - st * sb) / den;
    return slope > 0 ? slope : 0;
}

/* Nodes evenly spaced over the candidates (cand[0..m)), k of them. */
static void spread(const int *cand, int m, int k, unsigned char *mark)
{
    for (int j = 0; j < k && j < m; j++)
        mark[cand[(size_t)j * (size_t)m / (size_t)k]] = 1;
}

int topoRttSampleRound(int n, int k0, int round, const double *rtt, unsigned char *landmark,
                       unsigned char *with)
{
    int *orphan = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)), m = 0;
    unsigned char *fresh = calloc((size_t)(n > 0 ? n : 1), 1);
    int k = k0 < 1 ? 1 : k0, pairs = 0;

    if (orphan == NULL || fresh == NULL) {
        free(orphan);
        free(fresh);
        return -1;
    }
    memset(with, 0, (size_t)n * (size_t)n);
    for (int r = 0; r < round && k < n; r++)
        k *= 2;
    if (round == 0) {
        memset(landmark, 0, (size_t)n);
        for (int i = 0; i < n; i++)
            orphan[m++] = i;
    } else {
        /* Settled: a landmark, or a node with a round trip below the cut
         * to some node (every node of a region with a landmark has one:
         * it measured that landmark). */
        double cut = topoRttCut(n, rtt, TOPO_MIN_WAN_RTT, TOPO_MAX_LAN_RTT, TOPO_MIN_GAP_RATIO);
        if (cut < 0) {
            free(orphan);
            free(fresh);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            int settled = landmark[i];
            for (int j = 0; j < n && !settled; j++) {
                double x = pair_rtt(n, rtt, i, j);
                settled = j != i && x >= 0 && x < cut;
            }
            if (!settled)
                orphan[m++] = i;
        }
    }
    if (m >= 2 && m <= 2 * k) {
        /* Few enough: every pair of them, and they are all settled. */
        for (int a = 0; a < m; a++) {
            landmark[orphan[a]] = 1;
            for (int b = 0; b < m; b++)
                if (a != b && pair_rtt(n, rtt, orphan[a], orphan[b]) < 0)
                    with[(size_t)orphan[a] * (size_t)n + (size_t)orphan[b]] = 1;
        }
    } else if (m > 2 * k) {
        spread(orphan, m, k, fresh);
        for (int a = 0; a < m; a++)
            for (int b = 0; b < m; b++) {
                int i = orphan[a], j = orphan[b];
                if (i != j && (fresh[i] || fresh[j]) && pair_rtt(n, rtt, i, j) < 0)
                    with[(size_t)i * (size_t)n + (size_t)j] = 1;
            }
        for (int i = 0; i < n; i++)
            landmark[i] |= fresh[i];
    }
    for (size_t x = 0; x < (size_t)n * (size_t)n; x++)
        pairs += with[x];
    free(orphan);
    free(fresh);
    return pairs / 2;
}
