/* When the host segment pays (hostseg.h): a cost model fed with figures
 * measured at init, the same on every rank (docs/small-collectives.md).
 *
 * Measured (rank 0's figures, published in the segment for all to read):
 *   alpha_seg   one phase of all n ranks (arrive, wait for all), averaged
 *               over 8 empty phases;
 *   copy_Bps    memcpy of 8 MiB; reduce_Bps: a float sum of 8 MiB;
 *   alpha_msg   half the round trip of an 8-byte message between ranks 0
 *               and 1 over the transport: one step of the message-passing
 *               algorithms (ring, chain, direct exchange);
 *   msg_Bps     the same for 1 MiB, less alpha_msg: the transport's rate.
 * The host's CPU share s = max(1, ranks / CPUs) scales every rank's
 * memory and transfer work (ranks take turns on the CPUs) and alpha_msg (a
 * step waits for a process that shares its CPU; alpha_seg was measured
 * with all ranks running, so it already holds this).
 *
 * Per call of B bytes, n ranks, slot C, P = ceil(B / C) pieces, c = s B /
 * copy_Bps, r = s B / reduce_Bps, m = s B / msg_Bps, a = s alpha_msg:
 *   all-reduce direct   P alpha_seg + 2c + (n-1) r
 *              sliced   2P alpha_seg + (2 + 1/n) c + (n-1)/n r
 *              messages 2(n-1) (a + m/n) + (n-1)/n r                 (ring)
 *   reduce              as all-reduce (direct: only the root combines);
 *                       messages (n-1) a + m + r                     (chain)
 *   broadcast           ceil(B / nC) alpha_seg + 2c; messages (n-1) a + m
 *   all-gather (B out)  ceil(B / nC) alpha_seg + (1 + 1/n) c;
 *                       messages (n-1) (a + m/n)
 *   reduce-scatter (B in) P alpha_seg + (1 + 1/n) c + (n-1)/n r;
 *                       messages (n-1) (a + m/n) + (n-1)/n r
 * The cheapest wins; the switch-over sizes follow from the figures, and
 * rank 0 logs them at INFO (TUNING). */
#include "config.h"
#include "comm/intra/hostseg_internal.h"
#include "comm/base/checks.h"
#include "comm/base/debug.h"
#include "comm/base/param.h"
#include "comm/core/comm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAL_BYTES ((size_t)8 << 20)
#define CAL_MSG_BYTES ((size_t)1 << 20)
#define CAL_PHASES 8
#define CAL_PINGS 8

static double phase_time(struct ncclComm *comm, geoHostSeg *hs, ncclResult_t *res)
{
    double t0 = 0;
    for (int i = 0; i < CAL_PHASES + 2 && *res == ncclSuccess; i++) {
        uint64_t p;
        if (i == 2)
            t0 = geoNow();
        *res = hsBegin(comm, hs, &p);
        if (*res == ncclSuccess) {
            hsArrive(hs, p, 0);
            *res = hsWait(comm, hs, p, -1);
        }
    }
    return (geoNow() - t0) / CAL_PHASES;
}

/* Bytes per second of memcpy (reduce 0) or a float sum (1). */
static double mem_rate(int reduce)
{
    char *a = malloc(CAL_BYTES), *b = malloc(CAL_BYTES);
    double best = 0;
    if (a == NULL || b == NULL) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 0, CAL_BYTES);
    memset(b, 0, CAL_BYTES);
    for (int i = 0; i < 3; i++) {
        double t0 = geoNow();
        if (reduce) {
            float *x = (float *)(void *)a;
            const float *y = (const float *)(const void *)b;
            for (size_t j = 0; j < CAL_BYTES / sizeof(float); j++)
                x[j] += y[j];
            __asm__ __volatile__("" : : "r"(x) : "memory"); /* the sums are used */
        } else
            memcpy(a, b, CAL_BYTES);
        double dt = geoNow() - t0;
        if (dt > 0 && CAL_BYTES / dt > best)
            best = CAL_BYTES / dt;
    }
    free(a);
    free(b);
    return best;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Ranks 0 and 1: half the median round trip of `bytes` bytes. */
static ncclResult_t round_trip(struct ncclComm *comm, char *buf, size_t bytes, int n, double *t)
{
    double rt[CAL_PINGS];
    const int me = comm->rank, peer = 1 - me;
    geoNetRequest req;
    for (int i = 0; i < n + 1; i++) {
        double t0 = geoNow();
        for (int leg = 0; leg < 2; leg++) {
            if (leg == me) {
                GEO_CHECK(geoNetIsendCtl(&comm->net, peer, buf, bytes, &req));
            } else {
                GEO_CHECK(geoNetIrecv(&comm->net, peer, buf, bytes, &req));
            }
            GEO_CHECK(geoNetWait(&comm->net, &req));
        }
        if (i > 0)
            rt[i - 1] = geoNow() - t0;
    }
    qsort(rt, (size_t)n, sizeof(rt[0]), cmp_double);
    *t = rt[n / 2] / 2;
    return ncclSuccess;
}

/* Ranks 0 and 1: the transport's latency and rate (one way). */
static ncclResult_t message_figures(struct ncclComm *comm, double *alpha, double *Bps)
{
    char *buf = calloc(1, CAL_MSG_BYTES);
    double big = 0;
    if (buf == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory calibrating");
    ncclResult_t res = round_trip(comm, buf, 8, CAL_PINGS, alpha);
    if (res == ncclSuccess)
        res = round_trip(comm, buf, CAL_MSG_BYTES, 3, &big);
    free(buf);
    *Bps = big > *alpha ? CAL_MSG_BYTES / (big - *alpha) : 0;
    return res;
}

static double within(double v, double lo, double hi)
{
    return isfinite(v) && v >= lo ? (v <= hi ? v : hi) : lo;
}

/* Predicted seconds of type over bytes: the best segment algorithm in
 * *algo, its time returned; *msg: the message-passing path's. */
static double predict(const geoHostSeg *hs, int type, double B, int *algo, double *msg)
{
    const geoHostSegCal *k = &hs->cal;
    const double n = hs->n, s = k->cpu_share, C = (double)hs->slot;
    const double c = s * B / k->copy_Bps, r = s * B / k->reduce_Bps, m = s * B / k->msg_Bps;
    const double am = s * k->alpha_msg, as = k->alpha_seg;
    const double P = ceil(B / C) > 1 ? ceil(B / C) : 1;
    const double Pn = ceil(B / (n * C)) > 1 ? ceil(B / (n * C)) : 1;
    double direct = INFINITY, sliced = INFINITY, seg;
    switch (type) {
    case GEO_HOSTSEG_ALLREDUCE:
    case GEO_HOSTSEG_REDUCE:
        direct = P * as + 2 * c + (n - 1) * r;
        sliced = 2 * P * as + (2 + 1 / n) * c + (n - 1) / n * r;
        *msg = type == GEO_HOSTSEG_ALLREDUCE ? 2 * (n - 1) * (am + m / n) + (n - 1) / n * r
                                             : (n - 1) * am + m + r;
        break;
    case GEO_HOSTSEG_BROADCAST:
        direct = Pn * as + 2 * c;
        *msg = (n - 1) * am + m;
        break;
    case GEO_HOSTSEG_ALLGATHER:
        direct = Pn * as + (1 + 1 / n) * c;
        *msg = (n - 1) * (am + m / n);
        break;
    case GEO_HOSTSEG_REDUCESCATTER:
        direct = P * as + (1 + 1 / n) * c + (n - 1) / n * r;
        *msg = (n - 1) * (am + m / n) + (n - 1) / n * r;
        break;
    default:
        *algo = GEO_HOSTSEG_NONE;
        *msg = 0;
        return INFINITY;
    }
    *algo = sliced < direct ? GEO_HOSTSEG_SLICED : GEO_HOSTSEG_DIRECT;
    seg = sliced < direct ? sliced : direct;
    return seg;
}

int geoHostSegChoose(const struct ncclComm *comm, int type, size_t bytes)
{
    const geoHostSeg *hs = comm->hostseg;
    int algo;
    double msg;
    if (hs == NULL || bytes == 0)
        return GEO_HOSTSEG_NONE;
    double seg = predict(hs, type, (double)bytes, &algo, &msg);
    if (algo == GEO_HOSTSEG_NONE)
        return GEO_HOSTSEG_NONE;
    return hs->mode == 2 || seg < msg ? algo : GEO_HOSTSEG_NONE;
}

static void format_size(double b, char *out, size_t len)
{
    if (b >= (1 << 30))
        snprintf(out, len, "%.0f GiB", b / (1 << 30));
    else if (b >= (1 << 20))
        snprintf(out, len, "%.0f MiB", b / (1 << 20));
    else if (b >= 1024)
        snprintf(out, len, "%.0f KiB", b / 1024);
    else
        snprintf(out, len, "%.0f B", b);
}

/* Rank 0 logs, per collective, up to which size (powers of two) each
 * segment algorithm is chosen. */
static void log_table(const struct ncclComm *comm, const geoHostSeg *hs)
{
    static const char *const names[GEO_HOSTSEG_NCOLLS] = {"all-reduce", "reduce", "broadcast",
                                                          "all-gather", "reduce-scatter"};
    const geoHostSegCal *k = &hs->cal;
    geoInfo(GEO_LOG_TUNING, "host segment: %d ranks, phase %.1f us, copy %.2f GB/s, reduce "
            "%.2f GB/s, message %.1f us + %.2f GB/s, CPU share %.1f, slot %zu KiB%s", hs->n,
            k->alpha_seg * 1e6, k->copy_Bps / 1e9, k->reduce_Bps / 1e9, k->alpha_msg * 1e6,
            k->msg_Bps / 1e9,
            k->cpu_share, hs->slot >> 10, hs->mode == 2 ? " (GEOCCL_HOST_COLL=2: every size)" : "");
    for (int t = 0; t < GEO_HOSTSEG_NCOLLS; t++) {
        char line[256], a[32];
        int o = snprintf(line, sizeof(line), "host segment: %s:", names[t]);
        int prev = -1;
        for (int e = 3; e <= 32; e++) {
            int algo = geoHostSegChoose(comm, t, (size_t)1 << e);
            if (algo != prev && o < (int)sizeof(line) - 48) {
                format_size((double)((size_t)1 << e), a, sizeof(a));
                o += snprintf(line + o, sizeof(line) - (size_t)o, " %s from %s",
                              algo == GEO_HOSTSEG_DIRECT ? "segment (one phase)"
                              : algo == GEO_HOSTSEG_SLICED ? "segment (sliced)"
                                                            : "messages",
                              a);
                prev = algo;
            }
        }
        geoInfo(GEO_LOG_TUNING, "%s", line);
    }
}

ncclResult_t hsCalibrate(struct ncclComm *comm, geoHostSeg *hs)
{
    int ncpu = 0;
    for (int r = 0; r < comm->nranks; r++)
        if (comm->peers[r].ncpu > 0 && (ncpu == 0 || comm->peers[r].ncpu < ncpu))
            ncpu = comm->peers[r].ncpu;
    if (ncpu < 1)
        ncpu = 1;
    /* Waiting policy (hostseg_sync.c): spin a little only with a CPU per
     * rank (other processes may still hold the CPUs: a long spin cost 15
     * to 20 us per 8-byte all-reduce of 2 ranks on 2 busy cores, against 1
     * us yielding at once); yield for 20 us (4 ranks on 2 cores: the same
     * as 200 us; 64 ranks: 270 us per call against 460 us with 200 us and
     * 1 ms with 2 ms); then sleep on the futex (sleeping at once: 16 ranks
     * took ms per call, every arrival a wake-up). */
    hs->spins = hs->n <= ncpu ? 100 : 0;
    hs->yield_s = 20e-6;
    ncclResult_t res = ncclSuccess;
    double alpha_seg = phase_time(comm, hs, &res), alpha_msg = 0, msg_Bps = 0;
    if (res != ncclSuccess)
        return res;
    if (comm->rank <= 1)
        GEO_CHECK(message_figures(comm, &alpha_msg, &msg_Bps));
    uint64_t p;
    if (comm->rank == 0) {
        double *cal = hs->hdr->cal;
        cal[0] = alpha_seg;
        cal[1] = mem_rate(0);
        cal[2] = mem_rate(1);
        cal[3] = alpha_msg;
        cal[4] = (double)hs->n / ncpu;
        cal[5] = msg_Bps;
    }
    GEO_CHECK(hsBegin(comm, hs, &p));
    hsArrive(hs, p, 0);
    GEO_CHECK(hsWait(comm, hs, p, -1));
    /* Read once, bounded: every rank reads the same bytes, so every rank
     * bounds them alike. */
    double cal[HS_NCAL];
    memcpy(cal, hs->hdr->cal, sizeof(cal));
    hs->cal.alpha_seg = within(cal[0], 1e-7, 1);
    hs->cal.copy_Bps = within(cal[1], 1e7, 1e12);
    hs->cal.reduce_Bps = within(cal[2], 1e7, 1e12);
    hs->cal.alpha_msg = within(cal[3], 1e-7, 1);
    hs->cal.cpu_share = within(cal[4], 1, 1e4);
    hs->cal.msg_Bps = within(cal[5], 1e6, 1e12);
    if (comm->rank == 0)
        log_table(comm, hs);
    return ncclSuccess;
}
