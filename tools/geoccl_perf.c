/*
 * geoccl_perf.c: geoccl-perf, the nccl-tests style benchmark of GeoCCL's
 * collectives on host buffers.
 *
 *   geoccl-perf -N 4 -b 1K -e 256M            4 local ranks, forked here
 *   GEOCCL_COMM_ID=host:port RANK=r NRANKS=n geoccl-perf ...
 *                                              one rank of an n-rank job
 *                                              (OMPI_COMM_WORLD_RANK/SIZE or
 *                                              PMI_RANK/SIZE serve too)
 *   mpirun -np 4 geoccl-perf-mpi ...          built with -DGEOCCL_PERF_MPI:
 *                                              MPI starts the ranks and
 *                                              carries the unique id
 *
 * With -N, GEOCCL_PERF_REGIONS=a,a,b,b puts forked rank r in the r-th
 * region (GEOCCL_REGION), to try the hierarchical algorithms on one machine.
 *
 * -C picks the collective (allreduce, broadcast, allgather, reducescatter);
 * the other options are nccl-tests' (-b -e -f -i -n -w -c -d -o -r, plus
 * -T, a watchdog per size). Rank 0 prints the table; see perf_common.h for
 * what it holds. --data gauss feeds gradient-like values instead of the
 * exact integer pattern.
 *
 * With a lossy GEOCCL_COMPRESS, a float sum/avg all-reduce that ran
 * hierarchically is checked against the codec's error bound (perf_common.c,
 * codec_bound; the bound per codec is lossy_bound's below), and a line per
 * size gives the largest error and the bound; --check-exact checks it as if
 * the codec were off.
 *
 * Exit status: 0 all results right (exact, or within the bound); 1 some
 * element wrong or written out of bounds; 2 bad options; 3 a GeoCCL call failed (the message names the call
 * and ncclGetLastError's text); 4 the -T watchdog fired. With -N the parent
 * ends the other ranks when one fails, and exits with that rank's status.
 */
#define _GNU_SOURCE
#include "perf_common.h"

#include <nccl.h>
#include <geoccl.h>
#ifdef GEOCCL_PERF_MPI
#include <mpi.h>
#endif

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef GEOCCL_PERF_MPI
#define TOOL "geoccl-perf-mpi"
#else
#define TOOL "geoccl-perf"
#endif

/* perfType and perfOp are numbered as nccl.h so that a cast converts them. */
_Static_assert((int)PERF_INT8 == (int)ncclInt8 && (int)PERF_UINT8 == (int)ncclUint8 &&
                   (int)PERF_INT32 == (int)ncclInt32 && (int)PERF_UINT32 == (int)ncclUint32 &&
                   (int)PERF_INT64 == (int)ncclInt64 && (int)PERF_UINT64 == (int)ncclUint64 &&
                   (int)PERF_HALF == (int)ncclFloat16 && (int)PERF_FLOAT == (int)ncclFloat32 &&
                   (int)PERF_DOUBLE == (int)ncclFloat64 &&
                   (int)PERF_BFLOAT16 == (int)ncclBfloat16 &&
                   (int)PERF_FP8E4M3 == (int)ncclFloat8e4m3 &&
                   (int)PERF_FP8E5M2 == (int)ncclFloat8e5m2,
               "perfType must be numbered as ncclDataType_t");
_Static_assert((int)PERF_SUM == (int)ncclSum && (int)PERF_PROD == (int)ncclProd &&
                   (int)PERF_MAX == (int)ncclMax && (int)PERF_MIN == (int)ncclMin &&
                   (int)PERF_AVG == (int)ncclAvg,
               "perfOp must be numbered as ncclRedOp_t");

typedef struct {
    ncclComm_t comm;
    int rank;
    int token; /* the barrier's one-element all-reduce */
    unsigned long long hier0; /* callsHier before the checked call */
    /* The all-reduce's output buffer, registered for error feedback (it is
     * the same memory from call to call, as a trainer's gradient bucket) */
    void *ef_reg;
    const char *ef_base;
    size_t ef_bytes;
} geoCtx;

static int failed(const geoCtx *c, const char *call, ncclResult_t r)
{
    fprintf(stderr, "%s: rank %d: %s failed: %s: %s\n", TOOL, c->rank, call,
            ncclGetErrorString(r), ncclGetLastError(c->comm));
    return 1;
}

static int geo_coll(void *ctx, const perfCall *k)
{
    geoCtx *c = ctx;
    ncclDataType_t dt = (ncclDataType_t)k->type;
    ncclRedOp_t op = (ncclRedOp_t)k->op;
    const char *name = "?";
    ncclResult_t r = ncclInvalidUsage;

    switch (k->coll) {
    case PERF_ALLREDUCE:
        name = "ncclAllReduce";
        {
            const char *rb = k->recvbuff;
            size_t bytes = k->count * perfTypeSize(k->type);
            if (bytes > 0 && (c->ef_reg == NULL || rb < c->ef_base ||
                              rb + bytes > c->ef_base + c->ef_bytes)) {
                if (c->ef_reg && (r = geocclCommDeregisterErrorFeedback(c->comm, c->ef_reg)) !=
                                     ncclSuccess)
                    return failed(c, "geocclCommDeregisterErrorFeedback", r);
                c->ef_reg = NULL;
                if ((r = geocclCommRegisterErrorFeedback(c->comm, k->recvbuff, bytes,
                                                         &c->ef_reg)) != ncclSuccess)
                    return failed(c, "geocclCommRegisterErrorFeedback", r);
                c->ef_base = rb;
                c->ef_bytes = bytes;
            }
        }
        r = ncclAllReduce(k->sendbuff, k->recvbuff, k->count, dt, op, c->comm, NULL);
        break;
    case PERF_BROADCAST:
        name = "ncclBroadcast";
        r = ncclBroadcast(k->sendbuff, k->recvbuff, k->count, dt, k->root, c->comm, NULL);
        break;
    case PERF_ALLGATHER:
        name = "ncclAllGather";
        r = ncclAllGather(k->sendbuff, k->recvbuff, k->count, dt, c->comm, NULL);
        break;
    case PERF_REDUCESCATTER:
        name = "ncclReduceScatter";
        r = ncclReduceScatter(k->sendbuff, k->recvbuff, k->count, dt, op, c->comm, NULL);
        break;
    default:
        break;
    }
    if (r == ncclSuccess)
        return 0;
    char what[160];
    snprintf(what, sizeof(what), "%s(count %zu, %s, %s, %s)", name, k->count,
             perfTypeName(k->type), perfOpName(k->op), k->inplace ? "in-place" : "out-of-place");
    return failed(c, what, r);
}

static int geo_barrier(void *ctx)
{
    geoCtx *c = ctx;
    ncclResult_t r = ncclAllReduce(&c->token, &c->token, 1, ncclInt32, ncclSum, c->comm, NULL);
    return r == ncclSuccess ? 0 : failed(c, "ncclAllReduce (barrier)", r);
}

static int geo_reduce_doubles(void *ctx, double *v, int n, int max)
{
    geoCtx *c = ctx;
    ncclResult_t r = ncclAllReduce(v, v, (size_t)n, ncclDouble, max ? ncclMax : ncclSum,
                                   c->comm, NULL);
    return r == ncclSuccess ? 0 : failed(c, "ncclAllReduce of the times/counts", r);
}

static int geo_gather_bytes(void *ctx, const void *mine, void *all, size_t bytes)
{
    geoCtx *c = ctx;
    ncclResult_t r = ncclAllGather(mine, all, bytes, ncclUint8, c->comm, NULL);
    return r == ncclSuccess ? 0 : failed(c, "ncclAllGather of the rank list", r);
}

static void geo_describe(void *ctx, FILE *out)
{
    geoCtx *c = ctx;
    int version = 0, nstreams = 0, local = 0, nranks = 0;
    size_t chunk = 0;
    double timeout = 0;

    ncclGetVersion(&version);
    fprintf(out, "# GeoCCL %s, NCCL API %d.%d.%d\n", geocclVersionString(), version / 10000,
            version / 100 % 100, version % 100);
    if (geocclCommGetTransportInfo(c->comm, &nstreams, &chunk, &timeout) == ncclSuccess)
        fprintf(out, "# transport: %d connection%s per peer, chunk %zu bytes, timeout %.0f s\n",
                nstreams, nstreams == 1 ? "" : "s", chunk, timeout);
    if (geocclCommGetLocalPeers(c->comm, &local) == ncclSuccess &&
        ncclCommCount(c->comm, &nranks) == ncclSuccess)
        fprintf(out, "# same-host fast path (GEOCCL_SHM) to %d of %d peers of this rank\n", local,
                nranks - 1);
    int enc = 0;
    const char *cipher = "none";
    if (geocclCommGetEncryption(c->comm, &enc, &cipher) == ncclSuccess)
        fprintf(out, "# encrypted frames (GEOCCL_ENCRYPT) to %d of %d peers of this rank: %s\n",
                enc, nranks - 1, cipher);
    int single = 0;
    if (geocclCommGetSingleCopy(c->comm, &single) == ncclSuccess && single)
        fprintf(out, "# region's ranks read and write each other's buffers directly (GEOCCL_CMA)\n");
    /* The settings that were not left at their defaults; a secret is
     * named, never printed. */
    int n = geocclParamCount(), shown = 0;
    for (int i = 0; i < n; i++) {
        geocclParamInfo p;
        if (geocclParamGet(i, &p) != ncclSuccess || !p.is_set)
            continue;
        fprintf(out, "%s %s=%s", shown++ ? "" : "# environment:", p.name,
                strstr(p.name, "SECRET") ? "(set)" : p.value ? p.value : "");
    }
    if (shown)
        fprintf(out, "\n");
}

/* The WAN bytes column: the most any rank sent to other regions per call
 * (out-of-place run). */
static double geo_wan_bytes(void *ctx)
{
    geoCtx *c = ctx;
    geocclStats st;
    return geocclCommGetStats(c->comm, &st) == ncclSuccess ? (double)st.bytesWan : 0.0;
}

static int geo_region(void *ctx, int *region, int *nregions)
{
    geoCtx *c = ctx;
    ncclResult_t r = geocclCommGetRegion(c->comm, nregions, region, NULL, NULL, NULL);
    return r == ncclSuccess ? 0 : failed(c, "geocclCommGetRegion", r);
}

/* The checked call starts from zero error-feedback residuals: with them,
 * every encode codes the value itself and its error is one round trip's,
 * which the codec documents.  (With the residuals of the timed calls, a
 * call's error is its own round trip's plus the previous residual, which
 * is not bounded for sign and topk.) */
static int geo_check_begin(void *ctx)
{
    geoCtx *c = ctx;
    geocclStats st;
    ncclResult_t r = geocclCommResetErrorFeedback(c->comm);
    if (r != ncclSuccess)
        return failed(c, "geocclCommResetErrorFeedback", r);
    if ((r = geocclCommGetStats(c->comm, &st)) != ncclSuccess)
        return failed(c, "geocclCommGetStats", r);
    c->hier0 = st.callsHier;
    return 0;
}

static const char *param_value(const char *name)
{
    geocclParamInfo p;
    for (int i = 0; i < geocclParamCount(); i++)
        if (geocclParamGet(i, &p) == ncclSuccess && strcmp(p.name, name) == 0)
            return p.value;
    return NULL;
}

static size_t param_size(const char *name, size_t dflt)
{
    const char *v = param_value(name);
    char *end;
    if (v == NULL)
        return dflt;
    unsigned long long n = strtoull(v, &end, 10);
    switch (*end) {
    case 'k': case 'K': n <<= 10; break;
    case 'm': case 'M': n <<= 20; break;
    case 'g': case 'G': n <<= 30; break;
    default: break;
    }
    return end == v || n == 0 ? dflt : (size_t)n;
}

/*
 * One round trip's error through each lossy codec, as compress/codec.h
 * states it with binary32 rounding included (perfCodecBound's form:
 * rel |v| + block W + abs, beyond sat saturation):
 *   fp16  2^-11 |v| (normal range), 2^-25 below it; saturates at 65504
 *   bf16  2^-8 |v|, 2^-134 below the normal range; saturates at 0x1.FEp127
 *   int8  W (1/254 + 2^-21) nearest, W (1/127 + 2^-21) stochastic; 2^-100
 *         (blocks below it decode to 0)
 *   int4  W (1/14 + 2^-21), stochastic W (1/7 + 2^-21); 2^-100
 *   sign  |v| + scale, scale <= W (1 + (B/32 + 6) 2^-23)
 *   topk  |v| (an element is kept exactly or dropped)
 * B (GEOCCL_COMPRESS_BLOCK) is the block of int8, int4 and sign.
 */
static int lossy_bound(const char *name, size_t B, int stochastic, perfCodecBound *b)
{
    size_t n = strcspn(name, ":");
    double rel = 0, blk = 0, abs = 0, sat = 0;
    if (n == 4 && strncmp(name, "fp16", 4) == 0) {
        rel = 0x1p-11; abs = 0x1p-25; sat = 65504.0;
    } else if (n == 4 && strncmp(name, "bf16", 4) == 0) {
        rel = 0x1p-8; abs = 0x1p-134; sat = 0x1.FEp127;
    } else if (n == 4 && strncmp(name, "int8", 4) == 0) {
        blk = (stochastic ? 1.0 / 127 : 1.0 / 254) + 0x1p-21; abs = 0x1p-100;
    } else if (n == 4 && strncmp(name, "int4", 4) == 0) {
        blk = (stochastic ? 1.0 / 7 : 1.0 / 14) + 0x1p-21; abs = 0x1p-100;
    } else if (n == 4 && strncmp(name, "sign", 4) == 0) {
        rel = 1; blk = 1 + ((double)B / 32 + 6) * 0x1p-23;
    } else if (n == 4 && strncmp(name, "topk", 4) == 0) {
        rel = 1;
    } else {
        return 0; /* none, lossless: exact */
    }
    /* several codecs (auto:...): the loosest of each term */
    b->rel = rel > b->rel ? rel : b->rel;
    b->block = blk > b->block ? blk : b->block;
    b->abs = abs > b->abs ? abs : b->abs;
    b->sat = b->sat == 0 || (sat > 0 && sat < b->sat) ? sat : b->sat;
    b->blockSize = b->block > 0 ? B : 1;
    return 1;
}

/* Whether the checked call's result went through a lossy codec, and how far
 * off that may leave it.  Lossy codecs apply only to float sum/avg
 * all-reduces that ran hierarchically (comm/coll_hier.c; the flat and
 * direct algorithms and one region send everything exactly): callsHier
 * tells.  The codec is geocclCommGetCompression's; "auto" chooses per call
 * among none, lossless and, with GEOCCL_COMPRESS=auto:c1,c2,..., the codecs
 * listed: the bound is then the loosest of theirs. */
static int geo_check_codec(void *ctx, const perfCall *k, perfCodecBound *b)
{
    geoCtx *c = ctx;
    geocclStats st;
    const char *name = NULL;
    ncclResult_t r;

    memset(b, 0, sizeof(*b));
    if (k->coll != PERF_ALLREDUCE || k->type != PERF_FLOAT ||
        (k->op != PERF_SUM && k->op != PERF_AVG))
        return 0;
    if ((r = geocclCommGetStats(c->comm, &st)) != ncclSuccess)
        return failed(c, "geocclCommGetStats", r), -1;
    if (st.callsHier == c->hier0)
        return 0;
    if ((r = geocclCommGetCompression(c->comm, &name)) != ncclSuccess)
        return failed(c, "geocclCommGetCompression", r), -1;
    size_t B = param_size("GEOCCL_COMPRESS_BLOCK", 256);
    const char *seed = param_value("GEOCCL_COMPRESS_STOCHASTIC");
    int stochastic = seed != NULL && strcmp(seed, "0") != 0 && *seed != '\0';
    int lossy = 0;
    if (strcmp(name, "auto") == 0) {
        const char *spec = param_value("GEOCCL_COMPRESS");
        if (spec == NULL || strncmp(spec, "auto:", 5) != 0)
            return 0;
        char list[256], *save = NULL;
        snprintf(list, sizeof(list), "%s", spec + 5);
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
            lossy |= lossy_bound(t, B, stochastic, b);
        snprintf(b->name, sizeof(b->name), "%s", spec);
    } else {
        lossy = lossy_bound(name, B, stochastic, b);
        snprintf(b->name, sizeof(b->name), "%s%s", name,
                 stochastic && (strcmp(name, "int8") == 0 || strcmp(name, "int4") == 0)
                     ? " stochastic" : "");
    }
    return lossy;
}

static const perfBackend geo_backend = {
    .name = TOOL,
    .coll = geo_coll,
    .barrier = geo_barrier,
    .reduceDoubles = geo_reduce_doubles,
    .gatherBytes = geo_gather_bytes,
    .describe = geo_describe,
    .wanBytes = geo_wan_bytes,
    .region = geo_region,
    .checkBegin = geo_check_begin,
    .checkCodec = geo_check_codec,
};

/* One rank, start to end. Returns perfRun's status, or 3 when the
 * communicator could not be made. */
static int run_rank(const perfOptions *o, int rank, int nranks, ncclUniqueId id,
                    const char *launch)
{
    geoCtx c = {.comm = NULL, .rank = rank};
    ncclResult_t r = ncclCommInitRank(&c.comm, nranks, id, rank);
    if (r != ncclSuccess) {
        char what[64];
        snprintf(what, sizeof(what), "ncclCommInitRank(%d ranks)", nranks);
        failed(&c, what, r);
        return 3;
    }
    int res = perfRun(&geo_backend, &c, o, rank, nranks, launch);
    uint64_t nre = 0, resent = 0;
    if (geocclCommGetReconnects(c.comm, -1, &nre, &resent) == ncclSuccess && nre > 0)
        printf("# rank %d: %llu connections resumed after a reset, %llu bytes sent again\n",
               rank, (unsigned long long)nre, (unsigned long long)resent);
    /* After a failed call the other ranks may be stuck in a collective;
     * ncclCommDestroy would wait for them, so the caller ends the job. */
    if (res < 3) {
        r = ncclCommDestroy(c.comm);
        if (r != ncclSuccess) {
            failed(&c, "ncclCommDestroy", r);
            res = 3;
        }
    }
    fflush(stdout);
    return res;
}

#ifdef GEOCCL_PERF_MPI

int main(int argc, char **argv)
{
    int rank, nranks, ok, res;
    perfOptions o;
    ncclUniqueId id;
    char launch[96];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    res = perfParseArgs(argc, argv, TOOL, PERF_OPT_COLL | PERF_OPT_ROOT, &o);
    if (res != 0) {
        MPI_Finalize();
        return res == 1 ? 0 : 2;
    }
    /* Rank 0 makes the id (and with it the bootstrap listener); MPI only
     * carries its bytes. */
    memset(&id, 0, sizeof(id));
    ok = 1;
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            fprintf(stderr, "%s: rank 0: ncclGetUniqueId failed: %s: %s\n", TOOL,
                    ncclGetErrorString(r), ncclGetLastError(NULL));
            ok = 0;
        }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) {
        MPI_Finalize();
        return 3;
    }
    MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    snprintf(launch, sizeof(launch), "started by MPI, unique id sent with MPI_Bcast");
    res = run_rank(&o, rank, nranks, id, launch);
    if (res >= 3)
        MPI_Abort(MPI_COMM_WORLD, res);
    MPI_Finalize();
    return res;
}

#else /* !GEOCCL_PERF_MPI */

/* Reads a rank and a rank count from the first pair of variables that is
 * set. Returns 1 when found and valid, 0 when none is set, -1 (after a
 * message) when set but unusable. */
static int env_ranks(int *rank, int *nranks, const char **which)
{
    static const char *const pairs[][3] = {
        {"RANK", "NRANKS", "RANK/NRANKS"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK/SIZE"},
        {"PMI_RANK", "PMI_SIZE", "PMI_RANK/SIZE"},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        const char *r = getenv(pairs[i][0]), *n = getenv(pairs[i][1]);
        char *e1, *e2;
        if (r == NULL || n == NULL)
            continue;
        long rv = strtol(r, &e1, 10), nv = strtol(n, &e2, 10);
        if (*r == '\0' || *e1 != '\0' || *n == '\0' || *e2 != '\0' || nv < 1 || rv < 0 ||
            rv >= nv || nv > 1 << 20) {
            fprintf(stderr, "%s: %s=%s %s=%s: need 0 <= rank < count\n", TOOL, pairs[i][0], r,
                    pairs[i][1], n);
            return -1;
        }
        *rank = (int)rv;
        *nranks = (int)nv;
        *which = pairs[i][2];
        return 1;
    }
    return 0;
}

/* Reads the unique id from the parent; 0 on success, -1 at EOF (the parent
 * could not make one, and has said why). */
static int read_id(int fd, ncclUniqueId *id)
{
    size_t got = 0;
    while (got < sizeof(*id)) {
        ssize_t n = read(fd, (char *)id + got, sizeof(*id) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* Forks nranks ranks, then makes the unique id and hands it to them through
 * a pipe; this process keeps the bootstrap listener that ncclGetUniqueId
 * starts, so it outlives the ranks. The id is made after the forks, not
 * before, so that no fork happens while the listener thread runs: a child
 * forked while that thread holds a lock (malloc's, the logger's) would
 * inherit the lock held forever.
 *
 * When a rank fails, the others would wait in a collective until
 * GEOCCL_TIMEOUT: they are ended at once. Returns the first failed rank's
 * status, else the highest status (0 or 1). */
static int run_forked(const perfOptions *o, int nranks, const char *launch)
{
    ncclUniqueId id;
    pid_t *pids;
    int idpipe[2], worst = 0, failed_status = -1, live = 0;

    /* All ranks are on this machine: loopback, unless the user chose. */
    setenv("GEOCCL_SOCKET_IFNAME", "lo", 0);
    pids = calloc((size_t)nranks, sizeof(*pids));
    if (pids == NULL) {
        fprintf(stderr, "%s: out of memory\n", TOOL);
        return 3;
    }
    if (pipe(idpipe) != 0) {
        fprintf(stderr, "%s: pipe: %s\n", TOOL, strerror(errno));
        free(pids);
        return 3;
    }
    fflush(stdout);
    fflush(stderr);
    for (int rank = 0; rank < nranks; rank++) {
        pid_t pid = fork();
        if (pid == 0) {
            close(idpipe[1]);
            if (read_id(idpipe[0], &id) != 0)
                _exit(3);
            close(idpipe[0]);
            /* GEOCCL_PERF_REGIONS=a,a,b,b gives forked rank r the r-th label
             * as its GEOCCL_REGION: regions on one machine, links not
             * shaped. */
            const char *labels = getenv("GEOCCL_PERF_REGIONS");
            if (labels) {
                char buf[4096], *save = NULL, *tok;
                int i = 0;
                snprintf(buf, sizeof(buf), "%s", labels);
                for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), i++)
                    if (i == rank)
                        setenv("GEOCCL_REGION", tok, 1);
            }
            /* Only rank 0 prints the table. */
            if (rank != 0 && freopen("/dev/null", "w", stdout) == NULL)
                _exit(3);
            int res = run_rank(o, rank, nranks, id, launch);
            fflush(stdout);
            fflush(stderr);
            _exit(res);
        }
        if (pid < 0) {
            fprintf(stderr, "%s: fork of rank %d failed: %s\n", TOOL, rank, strerror(errno));
            failed_status = 3;
            break;
        }
        pids[rank] = pid;
        live++;
    }
    close(idpipe[0]);
    if (failed_status < 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            fprintf(stderr, "%s: ncclGetUniqueId failed: %s: %s\n", TOOL,
                    ncclGetErrorString(r), ncclGetLastError(NULL));
            failed_status = 3;
        }
    }
    /* One id per rank; each write is smaller than PIPE_BUF, so it is never
     * interleaved with another and every read gets a whole id. */
    for (int rank = 0; rank < nranks && failed_status < 0; rank++) {
        ssize_t n;
        do {
            n = write(idpipe[1], &id, sizeof(id));
        } while (n < 0 && errno == EINTR);
        if (n != (ssize_t)sizeof(id)) {
            fprintf(stderr, "%s: cannot pass the unique id to the ranks: %s\n", TOOL,
                    n < 0 ? strerror(errno) : "short write");
            failed_status = 3;
        }
    }
    /* Without an id the ranks read EOF and exit with status 3. */
    close(idpipe[1]);
    while (live > 0) {
        int st, rank;
        pid_t pid = waitpid(-1, &st, 0);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "%s: waitpid: %s\n", TOOL, strerror(errno));
            break;
        }
        for (rank = 0; rank < nranks && pids[rank] != pid; rank++)
            ;
        if (rank == nranks)
            continue;
        pids[rank] = 0;
        live--;
        int status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (status > worst)
            worst = status;
        if (status >= 2 && failed_status < 0) {
            if (WIFEXITED(st))
                fprintf(stderr, "%s: rank %d (pid %d) exited with status %d", TOOL, rank,
                        (int)pid, status);
            else
                fprintf(stderr, "%s: rank %d (pid %d) was killed by signal %d (%s)", TOOL, rank,
                        (int)pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
            fprintf(stderr, "%s\n", live ? "; ending the other ranks" : "");
            failed_status = status;
            for (int q = 0; q < nranks; q++)
                if (pids[q] > 0)
                    kill(pids[q], SIGTERM);
        }
    }
    free(pids);
    return failed_status >= 0 ? failed_status : worst;
}

int main(int argc, char **argv)
{
    perfOptions o;
    int rank = 0, nranks = 0, found;
    const char *which = NULL;
    char launch[256];

    int res = perfParseArgs(argc, argv, TOOL, PERF_OPT_COLL | PERF_OPT_ROOT | PERF_OPT_NPROCS, &o);
    if (res != 0)
        return res == 1 ? 0 : 2;

    if (o.nprocs > 0) {
        if (o.coll == PERF_BROADCAST && o.root >= o.nprocs) {
            fprintf(stderr, "%s: -r %d: the root must be a rank in 0..%d\n", TOOL, o.root,
                    o.nprocs - 1);
            return 2;
        }
        snprintf(launch, sizeof(launch), "forked by -N %d", o.nprocs);
        return run_forked(&o, o.nprocs, launch);
    }
    found = env_ranks(&rank, &nranks, &which);
    if (found < 0)
        return 2;
    const char *cid = getenv("GEOCCL_COMM_ID");
    if (cid != NULL && *cid != '\0') {
        if (found == 0) {
            fprintf(stderr, "%s: GEOCCL_COMM_ID is set but not this rank's number: set RANK "
                            "and NRANKS (or run under mpirun)\n", TOOL);
            return 2;
        }
        /* With GEOCCL_COMM_ID every rank computes the same id locally;
         * rank 0 listens at that address. */
        ncclUniqueId id;
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            fprintf(stderr, "%s: rank %d: ncclGetUniqueId failed: %s: %s\n", TOOL, rank,
                    ncclGetErrorString(r), ncclGetLastError(NULL));
            return 3;
        }
        snprintf(launch, sizeof(launch), "bootstrap at GEOCCL_COMM_ID=%s, ranks from %s", cid,
                 which);
        return run_rank(&o, rank, nranks, id, launch);
    }
    if (found > 0 && nranks > 1) {
        fprintf(stderr, "%s: %s say this is rank %d of %d, but the ranks cannot meet: set "
                        "GEOCCL_COMM_ID=host:port (rank 0's machine), or use geoccl-perf-mpi "
                        "under mpirun, or -N to fork local ranks\n", TOOL, which, rank, nranks);
        return 2;
    }
    snprintf(launch, sizeof(launch), "forked (no -N, no GEOCCL_COMM_ID: one rank)");
    return run_forked(&o, 1, launch);
}

#endif /* GEOCCL_PERF_MPI */
