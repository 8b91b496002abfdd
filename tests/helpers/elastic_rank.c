/*
 * One process of the elastic test over the emulated WAN
 * (tests/wan/test_elastic.sh starts one per rank in its region's namespace).
 *
 *   RANK=r NRANKS=n GEOCCL_COMM_ID=host:port elastic_rank member BYTES CTRL
 *   elastic_rank join BYTES CTRL
 *
 * member: ncclCommInitRank from the environment; join: geocclCommJoin.
 * Then rounds until the script says stop: each round ELASTIC_BOUNDARY
 * (default 1) all-reduces of BYTES of floats (sum; rank k of n puts
 * k + 1 + (i % 13) in element i, so every element's sum is an exact
 * integer the rank checks), then, at the round boundary, an all-reduce
 * (max) of three flags: joiners waiting
 * (geocclCommJoinersWaiting), "I leave" (SIGUSR1 received) and "stop"
 * (the file CTRL/stop exists); any joiner or leaver: geocclCommGrow; stop:
 * every rank ends after the same round.
 *
 * A failed call: geocclCommGetFailedRanks, ncclCommShrink(NCCL_SHRINK_ABORT)
 * without them, ncclCommAbort of the old one, and on with the new one.  A
 * shrink that fails (a survivor died in it) is tried again from the
 * agreement, on the same communicator, up to three times.  A process whose
 * pid is in the file CTRL/die_in_shrink exits (status 3) once the dead set
 * is agreed, before its shrink: the second loss of such a test.  A
 * geocclCommGrow that fails (a member died as the others grew) is a failed
 * call: agree, shrink, and admit the joiners at the next round boundary.
 * A process whose pid is in CTRL/die_in_grow exits (status 3) at the
 * boundary where it would grow.
 *
 * Lines the script reads (T: seconds since the epoch):
 *   rank R: ready n=N at T               (after init or join; joiners add
 *                                         "joined", with the probe's figures;
 *                                         members started with ELASTIC_TOPO=1 too)
 *   rank R: error in call K at T: ...    (a failed call)
 *   rank R: shrink failed at T: ...      (then it agrees and shrinks again)
 *   rank R: shrunk to N at T dead=a,b    (after the shrink)
 *   rank R: grow failed at T: ...        (then it agrees and shrinks)
 *   rank R: exact n=N at T               (first exact call at each new size)
 *   rank R: grown to N at T probe=P s inherited=I bw_measured=B
 *           pairs_measured=M pairs_inherited=H  (pairs of regions)
 *   rank R: left at T                    (after a graceful leave)
 *   rank 0: call K n=N s=S joiners=J     (rank 0 of the moment, each call)
 *   rank R: done calls=K                 (exit 0)
 * A wrong value exits 1; any other failure exits 2.
 */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "geoccl.h"
#include "nccl.h"

static volatile sig_atomic_t leave_asked;
static int me = -1; /* this process's rank of the moment, for messages */

static void on_usr1(int sig) { (void)sig; leave_asked = 1; }

static double wall(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define DIE(code, ...)                                                  \
    do {                                                                \
        printf("rank %d: ", me);                                        \
        printf(__VA_ARGS__);                                            \
        printf("\n");                                                   \
        fflush(stdout);                                                 \
        exit(code);                                                     \
    } while (0)

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    printf("rank %d: ", me);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static char ctrl[4000]; /* the script's control directory */

/* This process dies here when CTRL/<file> names its pid: the test's
 * loss in the middle of a re-form (die_in_shrink) or a grow (die_in_grow). */
static void maybe_die(const char *file, const char *where)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", ctrl, file);
    FILE *f = fopen(path, "r");
    long pid = 0;
    if (f == NULL)
        return;
    if (fscanf(f, "%ld", &pid) == 1 && pid == (long)getpid()) {
        say("dies in the %s at %.3f", where, wall());
        _exit(3);
    }
    fclose(f);
}

/* Every rank keeps one error-feedback registration of ef_buf: made at
 * its first communicator, carried over by each shrink and grow (the same
 * handle), checked there: the same memory registered again is it, and the
 * handle deregisters it (then it is registered again). */
static float ef_buf[64];
static void *ef_handle;

static void ef_carried(ncclComm_t next, const char *how)
{
    void *again = NULL;
    if (geocclCommRegisterErrorFeedback(next, ef_buf, sizeof(ef_buf), &again) != ncclSuccess ||
        again != ef_handle ||
        geocclCommDeregisterErrorFeedback(next, ef_handle) != ncclSuccess ||
        geocclCommRegisterErrorFeedback(next, ef_buf, sizeof(ef_buf), &ef_handle) != ncclSuccess)
        DIE(2, "%s: the error-feedback registration was not carried over", how);
}

/* After a failed call: agree on the dead, shrink without them; where the
 * shrink fails, agree again (the agreement on a communicator is per shrink
 * attempt, so it sees a survivor that died in the shrink). */
static ncclComm_t recover(ncclComm_t comm)
{
    int dead[64], count = 0, n;
    ncclComm_t next = NULL;
    for (int attempt = 0;; attempt++) {
        ncclResult_t r = geocclCommGetFailedRanks(comm, dead, 64, &count);
        if (r != ncclSuccess)
            DIE(2, "geocclCommGetFailedRanks: %s: %s", ncclGetErrorString(r),
                ncclGetLastError(comm));
        if (count == 0 || count > 64)
            DIE(2, "geocclCommGetFailedRanks found %d dead ranks", count);
        maybe_die("die_in_shrink", "shrink");
        r = ncclCommShrink(comm, dead, count, &next, NULL, NCCL_SHRINK_ABORT);
        if (r == ncclSuccess)
            break;
        if (attempt == 2)
            DIE(2, "ncclCommShrink: %s: %s", ncclGetErrorString(r), ncclGetLastError(comm));
        say("shrink failed at %.3f: %s: %s", wall(), ncclGetErrorString(r),
            ncclGetLastError(comm));
    }
    ef_carried(next, "ncclCommShrink");
    ncclCommAbort(comm);
    char list[256] = "";
    size_t len = 0;
    for (int i = 0; i < count && len + 12 < sizeof(list); i++)
        len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%d", i ? "," : "", dead[i]);
    ncclCommCount(next, &n);
    ncclCommUserRank(next, &me);
    say("shrunk to %d at %.3f dead=%s", n, wall(), list);
    return next;
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[1], "member") != 0 && strcmp(argv[1], "join") != 0)) {
        fprintf(stderr, "usage: elastic_rank member|join BYTES CTRLDIR\n");
        return 2;
    }
    size_t count = (size_t)strtoull(argv[2], NULL, 10) / sizeof(float);
    char stopfile[4096];
    snprintf(stopfile, sizeof(stopfile), "%s/stop", argv[3]);
    snprintf(ctrl, sizeof(ctrl), "%s", argv[3]);
    const char *b = getenv("ELASTIC_BOUNDARY");
    int boundary = b != NULL && atoi(b) > 0 ? atoi(b) : 1;
    signal(SIGUSR1, on_usr1);
    setvbuf(stdout, NULL, _IOLBF, 0);

    ncclComm_t comm = NULL;
    ncclResult_t r;
    int n = 0;
    if (strcmp(argv[1], "member") == 0) {
        const char *rs = getenv("RANK"), *ns = getenv("NRANKS");
        ncclUniqueId id;
        if (rs == NULL || ns == NULL)
            DIE(2, "RANK and NRANKS must be set");
        me = atoi(rs);
        if ((r = ncclGetUniqueId(&id)) != ncclSuccess ||
            (r = ncclCommInitRank(&comm, atoi(ns), id, me)) != ncclSuccess)
            DIE(2, "init: %s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
        ncclCommCount(comm, &n);
        if (getenv("ELASTIC_TOPO") != NULL) {
            geocclTopology topo;
            geocclCommGetTopology(comm, &topo);
            say("ready n=%d at %.3f probe=%.3f s bw=%.3f s bw_measured=%d pairs_measured=%d",
                n, wall(), topo.secProbe, topo.secBw, topo.bwMeasured, topo.pairsMeasured);
        } else {
            say("ready n=%d at %.3f", n, wall());
        }
    } else {
        double t0 = wall();
        if ((r = geocclCommJoin(&comm, NULL)) != ncclSuccess)
            DIE(2, "geocclCommJoin: %s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
        geocclTopology topo;
        ncclCommUserRank(comm, &me);
        ncclCommCount(comm, &n);
        geocclCommGetTopology(comm, &topo);
        say("ready n=%d at %.3f joined after %.2f s probe=%.3f s bw=%.3f s inherited=%d "
            "bw_measured=%d pairs_measured=%d pairs_inherited=%d", n, wall(), wall() - t0,
            topo.secProbe, topo.secBw, topo.inherited, topo.bwMeasured, topo.pairsMeasured,
            topo.pairsInherited);
    }

    if ((r = geocclCommRegisterErrorFeedback(comm, ef_buf, sizeof(ef_buf), &ef_handle)) !=
        ncclSuccess)
        DIE(2, "geocclCommRegisterErrorFeedback: %s", ncclGetErrorString(r));
    float *in = malloc(count * sizeof(float)), *out = malloc(count * sizeof(float));
    if (in == NULL || out == NULL)
        DIE(2, "out of memory");
    int exact_at = -1; /* the size whose first exact call was reported */
    int rounds = 0, calls = 0; /* calls: on the communicator of the moment */
    for (;; rounds++, calls++) {
        ncclCommUserRank(comm, &me);
        ncclCommCount(comm, &n);
        for (size_t i = 0; i < count; i++)
            in[i] = (float)(me + 1 + (int)(i % 13));
        double t0 = mono();
        r = ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, NULL);
        if (r != ncclSuccess) {
            say("error in call %d at %.3f: %s: %s", rounds, wall(), ncclGetErrorString(r),
                ncclGetLastError(comm));
            comm = recover(comm);
            calls = -1;
            continue;
        }
        double secs = mono() - t0;
        for (size_t i = 0; i < count; i++) {
            float want = (float)(n * (n + 1) / 2 + n * (int)(i % 13));
            if (out[i] != want)
                DIE(1, "wrong value in call %d at %zu: %g, expected %g (n=%d)", rounds, i,
                    (double)out[i], (double)want, n);
        }
        if (exact_at != n) {
            say("exact n=%d at %.3f", n, wall());
            exact_at = n;
        }
        int joiners = 0;
        geocclCommJoinersWaiting(comm, &joiners);
        if (me == 0)
            say("call %d n=%d s=%.4f joiners=%d", rounds, n, secs, joiners);
        if ((calls + 1) % boundary != 0)
            continue;
        /* The round boundary: agree on what happens next. */
        int32_t flags[3] = {joiners, leave_asked ? 1 : 0, access(stopfile, F_OK) == 0}, all[3];
        r = ncclAllReduce(flags, all, 3, ncclInt32, ncclMax, comm, NULL);
        if (r != ncclSuccess) {
            say("error in call %d at %.3f: %s: %s", rounds, wall(), ncclGetErrorString(r),
                ncclGetLastError(comm));
            comm = recover(comm);
            calls = -1;
            continue;
        }
        if (all[2])
            break;
        if (all[0] > 0 || all[1] > 0) {
            ncclComm_t next = NULL;
            if (leave_asked)
                geocclCommLeave(comm);
            maybe_die("die_in_grow", "grow");
            r = geocclCommGrow(comm, &next, NULL);
            if (r != ncclSuccess) {
                say("grow failed at %.3f: %s: %s", wall(), ncclGetErrorString(r),
                    ncclGetLastError(comm));
                comm = recover(comm);
                calls = -1;
                continue;
            }
            if (leave_asked) {
                ncclCommDestroy(comm);
                say("left at %.3f", wall());
                say("done calls=%d", rounds + 1);
                free(in);
                free(out);
                return 0;
            }
            if (next != NULL) {
                geocclTopology topo;
                ef_carried(next, "geocclCommGrow");
                ncclCommDestroy(comm);
                comm = next;
                ncclCommCount(comm, &n);
                ncclCommUserRank(comm, &me);
                geocclCommGetTopology(comm, &topo);
                say("grown to %d at %.3f probe=%.3f s bw=%.3f s inherited=%d bw_measured=%d "
                    "pairs_measured=%d pairs_inherited=%d", n, wall(), topo.secProbe, topo.secBw,
                    topo.inherited, topo.bwMeasured, topo.pairsMeasured, topo.pairsInherited);
                calls = -1; /* the joiners count from their first call */
            }
        }
    }
    ncclCommDestroy(comm);
    say("done calls=%d", rounds + 1);
    free(in);
    free(out);
    return 0;
}
