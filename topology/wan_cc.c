/* Congestion control of the connections between regions (wan_tuning.h):
 * the rules that choose it (topoWanCcChoice at init, topoWanCcRevisit
 * after), the choice set at init for the probe's transfer and then per
 * pair of regions (GEOCCL_WAN_CC), and the watch that moves a pair from
 * BBR to cubic once what it carries is known.  Every setting goes through
 * net_tcp_tune.h; each rank sets only its own sending side, from figures
 * every rank holds, so the ranks of a region agree. */
#include "config.h"
#include "topology/wan_tuning.h"
#include "comm/base/debug.h"
#include "comm/base/param.h"
#include "comm/transport/net_tcp_tune.h"
#include "comm/transport/socket.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the rules ----------------------------------------------------------- */

int topoWanCcChoice(double share, double rtt, double loss, double segs, int streams,
                    int bbr_ok, int max_streams, int *streams_out, char *why, size_t len)
{
    const double mss = 1448;
    int n = streams < 1 ? 1 : streams;
    *streams_out = n;
    if (loss < 0 || segs < TOPO_LOSS_MIN_SEGS) {
        snprintf(why, len, bbr_ok ? "loss not measured"
                                  : "loss not measured, no bbr in this kernel");
        return bbr_ok ? TOPO_CC_BBR : TOPO_CC_CUBIC;
    }
    /* Judged at the loss the count cannot rule out: k segments lost of N
     * is consistent (one-sided, about 95%) with a rate up to
     * (k + 2 + 1.645 sqrt(k + 1)) / N; none lost of 3400 still allows
     * 0.11%, at which cubic holds 9 Mbit/s per connection at 50 ms. */
    double lost = loss * segs, hi = (lost + 2 + 1.645 * sqrt(lost + 1)) / segs;
    double per = topoLossRate(rtt, hi, mss);
    if (n * per >= TOPO_CC_HEADROOM * share) {
        snprintf(why, len, "loss %.3g%% (%.0f of %.0f segments, at most %.3g%%): %d stream%s "
                 "of cubic hold %.0f Mbit/s >= %.2f x %.0f needed", loss * 100, lost, segs,
                 hi * 100, n, n == 1 ? "" : "s", n * per * 8e-6, TOPO_CC_HEADROOM,
                 share * 8e-6);
        return TOPO_CC_CUBIC;
    }
    if (bbr_ok) {
        snprintf(why, len, "loss %.3g%% (%.0f of %.0f segments, at most %.3g%%): cubic might "
                 "hold only %.1f Mbit/s on %d stream%s, %.0f needed", loss * 100, lost, segs,
                 hi * 100, n * per * 8e-6, n, n == 1 ? "" : "s", share * 8e-6);
        return TOPO_CC_BBR;
    }
    /* Without BBR, streams for the loss measured (not its bound). */
    per = topoLossRate(rtt, loss, mss);
    double want = isinf(per) ? n : ceil(TOPO_CC_HEADROOM * share / per);
    *streams_out = want > max_streams ? max_streams : want < n ? n : (int)want;
    snprintf(why, len, "loss %.3g%% (%.0f of %.0f segments), no bbr in this kernel: %d "
             "stream%s of cubic at %.1f Mbit/s each for %.0f needed", loss * 100, lost, segs,
             *streams_out, *streams_out == 1 ? "" : "s", fmin(per, 1e12) * 8e-6, share * 8e-6);
    return TOPO_CC_CUBIC;
}

int topoWanCcRevisit(double msg, double stripe, double share, double rtt, double retrans,
                     double segs, int streams, int paused, int calls, int restart_idle,
                     char *why, size_t len)
{
    const double mss = 1448;
    int n = streams < 1 ? 1 : streams;
    if (restart_idle && paused * 8 > calls) {
        snprintf(why, len, "%d of %d calls came after a pause of over %.0f ms: cubic would "
                 "start its window again after each, BBR does not", paused, calls,
                 TOPO_RTO_MIN_S * 1e3);
        return TOPO_CC_BBR;
    }
    if (segs < TOPO_LOSS_MIN_SEGS || !(rtt > 0) || !(msg > 0)) {
        snprintf(why, len, "too little counted yet (%.0f segments)", segs);
        return TOPO_CC_BBR;
    }
    /* the same bound as topoWanCcChoice's */
    double hi = (retrans + 2 + 1.645 * sqrt(retrans + 1)) / segs;
    double window = sqrt(1.5 / hi);
    double conns = fmin(n, fmax(1, ceil(msg / fmax(stripe, 1))));
    double need = msg / conns / mss;
    if (window >= need) {
        snprintf(why, len, "%.0f of %.0f segments sent again, loss at most %.3g%%: cubic's mean "
                 "window of %.0f segments holds a %.0f KB message's %.0f per connection",
                 retrans, segs, hi * 100, window, msg / 1e3, need);
        return TOPO_CC_CUBIC;
    }
    char inner[192];
    int m;
    int c = topoWanCcChoice(share, rtt, retrans / segs, segs, n, 1, n, &m, inner, sizeof(inner));
    snprintf(why, len, "%s; cubic's mean window of %.0f segments is short of a %.0f KB "
             "message's %.0f per connection", inner, window, msg / 1e3, need);
    return c;
}

double geoWanPairRate(const geoTopo *t, int R, int g, int h)
{
    if (t->bw != NULL && t->bw[g * R + h] > 0)
        return t->bw[g * R + h];
    return t->egress != NULL && t->egress[g] > 0 ? t->egress[g] / (R - 1) : 0;
}

/* ---- at init ------------------------------------------------------------ */

/* Whether this kernel offers the congestion control name. */
static int kernel_has_cc(const char *name)
{
    char buf[256] = "";
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_available_congestion_control", "r");
    if (f == NULL)
        return 0;
    if (fgets(buf, sizeof(buf), f) == NULL)
        buf[0] = '\0';
    fclose(f);
    char *save = NULL;
    for (char *tok = strtok_r(buf, " \n", &save); tok != NULL;
         tok = strtok_r(NULL, " \n", &save))
        if (strcmp(tok, name) == 0)
            return 1;
    return 0;
}

/* The congestion control the bandwidth transfer runs under, on the
 * leaders' connections to each other: with GEOCCL_WAN_CC=auto, BBR where the
 * kernel has it, so that the rate measured is the link's and not what a
 * loss-driven control keeps of it on a lossy path (cubic at 1% random loss
 * holds a few Mbit/s per connection at 50 ms), and the loss counted is the
 * path's; the plan then chooses (geoWanCcInit).  Otherwise what the user
 * chose, set here already. */
void geoWanCcForProbe(geoNet *net, const int *leaders, int R, int me)
{
    const char *cc = geoSocketWanCc();
    if (!geoNetTcpTunable(net) || cc == NULL)
        return;
    if (strcmp(cc, "auto") == 0)
        cc = "bbr";
    for (int q = 0; q < R; q++)
        if (q != me)
            geoNetTcpSetCongestion(net, leaders[q], cc);
}

/* GEOCCL_WAN_CC=auto: per region this rank sends to, from the loss the
 * probe's transfer counted on that pair of regions (topoWanCcChoice):
 * cubic where no segment was lost or the loss leaves cubic enough, BBR
 * elsewhere and where nothing was measured (a topology file, a labelled
 * single host).  Each rank sets its own sending side; the choice is made
 * from figures every rank holds, so the ranks of a region agree. */
static ncclResult_t cc_auto(geoNet *net, const topoRegionMap *m, int rank, int nranks,
                            int nstreams, geoTopo *t, char *cc_out)
{
    int R = m->nregions, g = m->region_of[rank], set = 0, bbr_ok = kernel_has_cc("bbr");
    const char *chosen = NULL;

    free(t->wan_choice);
    free(t->wan_why);
    t->wan_choice = malloc(sizeof(int) * (size_t)R * (size_t)R);
    t->wan_why = calloc((size_t)R * (size_t)R, sizeof(*t->wan_why));
    if (t->wan_choice == NULL || t->wan_why == NULL)
        return GEO_ERR(net->ctx.err, ncclSystemError, "init: out of memory choosing the "
                       "congestion control of %d regions", R);
    int streams = t->streams_used > 0 ? t->streams_used : nstreams;
    for (int a = 0; a < R; a++)
        for (int b = 0; b < R; b++) {
            int want, k = a * R + b;
            t->wan_choice[k] = -1;
            if (a == b)
                continue;
            double share = geoWanPairRate(t, R, a, b) / m->size[a];
            double rtt = t->region_rtt != NULL ? t->region_rtt[k] : 0;
            double loss = t->loss != NULL ? t->loss[k] : -1;
            double segs = t->loss_segs != NULL ? t->loss_segs[k] : 0;
            t->wan_choice[k] = topoWanCcChoice(share, rtt, loss, segs, streams, bbr_ok,
                                               nstreams, &want, t->wan_why[k],
                                               sizeof(t->wan_why[k]));
            if (a == g && want > streams)
                geoWarn(GEO_LOG_NET, "WAN region %d -> %d: cubic needs %d streams on this "
                        "loss, %d in use; set GEOCCL_NSTREAMS=%d or install bbr", a, b, want,
                        streams, want);
        }
    for (int h = 0; h < R; h++) {
        if (h == g)
            continue;
        const char *cc = t->wan_choice[g * R + h] == TOPO_CC_BBR ? "bbr" : "cubic";
        int err = 0, n = 0;
        for (int r = 0; r < nranks; r++)
            if (m->region_of[r] == h) {
                int e = geoNetTcpSetCongestion(net, r, cc);
                err = err ? err : e;
                n++;
            }
        if (err != 0) {
            geoInfo(GEO_LOG_NET, "WAN connections to region %d keep the host's congestion "
                    "control (%s refused: %s)", h, cc, strerror(err));
            t->wan_choice[g * R + h] = -1;
            continue;
        }
        if (rank == m->members[g][0] || geoDebugLevel() >= GEO_LEVEL_TRACE)
            geoInfo(GEO_LOG_NET | GEO_LOG_INIT, "WAN plan: region %d -> %d (%d peer%s): %s (%s; "
                    "GEOCCL_WAN_CC=auto)", g, h, n, n == 1 ? "" : "s", cc,
                    t->wan_why[g * R + h]);
        chosen = chosen == NULL || strcmp(chosen, cc) == 0 ? cc : "mixed";
        set++;
    }
    if (set > 0)
        snprintf(cc_out, GEO_PROBE_CC_LEN, "%s", chosen);
    return ncclSuccess;
}

/* The congestion control of the connections to other regions
 * (GEOCCL_WAN_CC), set before the warm-up so that it is the one warmed.
 * auto (the default) chooses per pair of regions (cc_auto);
 * a name forces one; host leaves the host's.  Why a choice and not one
 * control: on the emulated 3 x 2 regions at 1 Gbit/s, 25 ms, a 256 MiB
 * hierarchical all-reduce took 3.02-3.05 s with cubic and 3.2-3.3 s with
 * BBR (bound 2.86 s): the exchange's WAN flows carry fixed shares and the
 * slowest sets the pace; when some finish early, cubic's windows fill the
 * link at once, while BBR paces each remaining flow at the share it
 * measured and widens it by a quarter every eight round trips.  On a path
 * with random loss cubic backs off at every loss and BBR does not (3x2 at
 * 100 Mbit/s with 0.1% loss, 64 MiB: 18.1 s against 8.4 s, bound 7.16 s;
 * BENCHMARKS.md, "Lossy and jittery paths").
 * Cubic also restarts its window after a retransmission timeout of idle
 * (net.ipv4.tcp_slow_start_after_idle; BBR is exempt): a 1 MiB all-reduce
 * after 0.5 s of idle took 120-135 ms against BBR's 67 ms.  Each rank sets
 * its own sending side; the peer's choice is the peer's. */
ncclResult_t geoWanCcInit(geoNet *net, const topoRegionMap *m, int rank, int nranks,
                          int nstreams, geoTopo *t, char *cc_out)
{
    const char *cc = geoSocketWanCc();
    int g = m->region_of[rank], n = 0, err = 0, who = -1;

    cc_out[0] = '\0';
    if (cc == NULL || m->nregions < 2 || !geoNetTcpTunable(net))
        return ncclSuccess;
    if (strcmp(cc, "auto") == 0)
        return cc_auto(net, m, rank, nranks, nstreams, t, cc_out);
    for (int r = 0; r < nranks; r++) {
        if (r == rank || m->region_of[r] == g)
            continue;
        int e = geoNetTcpSetCongestion(net, r, cc);
        if (e != 0 && err == 0) {
            err = e;
            who = r;
        }
        n++;
    }
    if (n == 0)
        return ncclSuccess;
    if (err != 0) {
        /* Checked at init when the user named it; the default may simply
         * not be in this kernel. */
        if (geoParamIsSet(GEO_PARAM_WAN_CC))
            geoWarn(GEO_LOG_NET, "GEOCCL_WAN_CC=%s: a connection to rank %d refused it (%s); "
                    "those keep their congestion control", cc, who, strerror(err));
        else
            geoInfo(GEO_LOG_NET, "WAN connections keep the host's congestion control (%s "
                    "refused on the connection to rank %d: %s; GEOCCL_WAN_CC)", cc, who,
                    strerror(err));
        return ncclSuccess;
    }
    snprintf(cc_out, GEO_PROBE_CC_LEN, "%s", cc);
    geoInfo(GEO_LOG_NET | GEO_LOG_INIT, "WAN connections to %d peer%s use congestion control %s "
            "(GEOCCL_WAN_CC)", n, n == 1 ? "" : "s", cc);
    return ncclSuccess;
}

/* ---- after init (GEOCCL_WAN_CC=auto; wan_tuning.h, geoWanWatch) ------- */

static int read_sysctl_int(const char *path, int dflt)
{
    FILE *f = fopen(path, "r");
    int v = dflt;
    if (f == NULL)
        return dflt;
    if (fscanf(f, "%d", &v) != 1)
        v = dflt;
    fclose(f);
    return v;
}

void geoWanWatchCallStart(geoWanWatch *w, double now)
{
    if (w->on <= 0 || w->last_end <= 0)
        return;
    w->calls++;
    w->paused += now - w->last_end > TOPO_RTO_MIN_S;
}

static void wan_watch_window(geoWanWatch *w, const geoNet *net, double now)
{
    w->since = now;
    w->calls = w->paused = 0;
    w->bytes = net->sent.wan;
    w->msgs = net->sent.wan_msgs;
}

static int wan_watch_init(geoWanWatch *w, const geoTopo *t, const topoRegionMap *m, int rank,
                          geoNet *net, double now)
{
    const char *cc = geoSocketWanCc();
    int R = m->nregions, g = m->region_of[rank], any = 0;
    if (cc == NULL || strcmp(cc, "auto") != 0 || t->wan_choice == NULL || R < 2 ||
        net->ops->linkStats == NULL || !geoNetTcpTunable(net) ||
        !kernel_has_cc("cubic"))
        return -1;
    w->cc = malloc(sizeof(int) * (size_t)R);
    w->why = calloc((size_t)R, sizeof(*w->why));
    if (w->cc == NULL || w->why == NULL) {
        free(w->cc);
        free(w->why);
        w->cc = NULL;
        w->why = NULL;
        return -1;
    }
    for (int h = 0; h < R; h++) {
        w->cc[h] = h == g ? -1 : t->wan_choice[g * R + h];
        any += w->cc[h] == TOPO_CC_BBR;
    }
    if (!any)
        return -1;
    w->restart_idle = read_sysctl_int("/proc/sys/net/ipv4/tcp_slow_start_after_idle", 1);
    wan_watch_window(w, net, now);
    return 1;
}

void geoWanWatchCallEnd(geoWanWatch *w, const geoTopo *t, const topoRegionMap *m, int rank,
                        int nranks, int nstreams, geoNet *net, double now)
{
    if (w->on == 0)
        w->on = wan_watch_init(w, t, m, rank, net, now);
    if (w->on <= 0)
        return;
    w->last_end = now;
    double span = now - w->since;
    if (net->sent.wan_msgs < w->msgs || net->sent.wan < w->bytes) {
        /* the counters were reset (geocclCommResetStats): a new window */
        wan_watch_window(w, net, now);
        return;
    }
    if (span < GEO_WAN_WATCH_S || w->calls < GEO_WAN_WATCH_CALLS)
        return;
    const int R = m->nregions, g = m->region_of[rank];
    const int streams = t->streams_used > 0 ? t->streams_used : nstreams;
    const uint64_t msgs = net->sent.wan_msgs - w->msgs;
    const double msg = msgs > 0 ? (double)(net->sent.wan - w->bytes) / (double)msgs : 0;
    int left = 0;
    for (int h = 0; h < R; h++) {
        if (w->cc[h] != TOPO_CC_BBR)
            continue;
        double segs = 0, retrans = 0;
        for (int r = 0; r < nranks; r++) {
            geoLinkStats ls;
            if (m->region_of[r] != h || net->ops->linkStats(net->state, r, &ls) != 0)
                continue;
            segs += (double)ls.segs_out;
            retrans += (double)ls.retrans;
        }
        char why[GEO_PROBE_WHY_LEN];
        double rtt = t->region_rtt != NULL ? t->region_rtt[g * R + h] : 0;
        double share = geoWanPairRate(t, R, g, h) / m->size[g];
        if (msgs == 0 ||
            topoWanCcRevisit(msg, GEO_NET_STRIPE_BYTES, share, rtt, retrans, segs, streams,
                             w->paused, w->calls, w->restart_idle, why,
                             sizeof(why)) != TOPO_CC_CUBIC) {
            geoTrace(GEO_LOG_NET, "WAN region %d -> %d: bbr still, for what this rank's "
                     "connections carried in the last %.1f s (%s)", g, h, span,
                     msgs == 0 ? "no messages" : why);
            left++;
            continue;
        }
        int err = 0;
        for (int r = 0; r < nranks; r++)
            if (m->region_of[r] == h) {
                int e = geoNetTcpSetCongestion(net, r, "cubic");
                err = err ? err : e;
            }
        if (err != 0) {
            geoInfo(GEO_LOG_NET, "WAN region %d -> %d: staying on bbr (cubic refused: %s)", g, h,
                    strerror(err));
            for (int r = 0; r < nranks; r++)
                if (m->region_of[r] == h)
                    geoNetTcpSetCongestion(net, r, "bbr");
            w->cc[h] = -1;
            continue;
        }
        w->cc[h] = TOPO_CC_CUBIC;
        snprintf(w->why[h], sizeof(w->why[h]), "after init, for what the connections carried: "
                 "%s", why);
        geoInfo(GEO_LOG_NET, "WAN plan: region %d -> %d: cubic from now on, for what this "
                "rank's connections carried in the last %.1f s (%s; %d of %d calls after a "
                "pause of over %.0f ms; GEOCCL_WAN_CC=auto)", g, h, span, why, w->paused,
                w->calls, TOPO_RTO_MIN_S * 1e3);
    }
    if (left == 0)
        w->on = -1; /* nothing left on BBR */
    wan_watch_window(w, net, now);
}

void geoWanWatchFree(geoWanWatch *w)
{
    free(w->cc);
    free(w->why);
    memset(w, 0, sizeof(*w));
}

void geoWanTuningFree(geoWanTuning *w)
{
    geoWanWatchFree(&w->watch);
    memset(w, 0, sizeof(*w));
}
