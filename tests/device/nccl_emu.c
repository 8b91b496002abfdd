/*
 * A stand-in for NVIDIA's libnccl, for the CPU emulation of the device path
 * (tests/device/dev_allreduce-emu): built as tests/device/libnccl_emu.so and
 * loaded by comm/device/nccl_real.c through GEOCCL_NCCL_LIB.
 *
 * It exports every function nccl_real.c requires (and the collectives it
 * may use) with NCCL's signatures.  With one rank (the processes of the
 * emulated test, every rank its own region) every collective is a copy of
 * the input to the output (a reduction of one contribution; the average
 * divides by one), enqueued on the caller's stream with cudaMemcpyAsync,
 * so it is stream-ordered like NVIDIA's kernels.  Communicators of several
 * ranks are threads of one process (ncclCommInitAll, grouped inits: the
 * single-process loop over several GPUs of nccl-tests -g N): a clique
 * keyed by the unique id joins them, init blocks until all have joined,
 * as NVIDIA's does, and all-reduce, all-gather, reduce-scatter and
 * broadcast run on the callers' streams, each rank's part waiting in
 * stream order for every rank's call of the same number.  The CUDA runtime
 * it calls is not linked in: it is the emulated one
 * (tests/device/dev_emu_runtime.c) that the test program exports
 * (-rdynamic).
 *
 * NCCL_COMM_ID is read as NVIDIA's NCCL reads it (src/bootstrap.cc,
 * src/init.cc): ncclGetUniqueId makes no root and returns an id holding
 * that address; rank 0's ncclCommInitRank(Config) opens the bootstrap
 * root there, a TCP listener on that address (kept here until the
 * communicator goes), and fails when it cannot: so a library that lets
 * NVIDIA's NCCL see another bootstrap's NCCL_COMM_ID finds the port taken
 * (by that bootstrap's root, or by another region's NCCL root).
 *
 * It exports no geocclXXX symbol and lives in its own object, so
 * nccl_real.c's check that the library is not GeoCCL itself passes.
 */
#include "nccl.h"

#include <cuda_runtime_api.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The emulated runtime's stream-ordered launch (tests/device/dev_emu_runtime.c). */
void geoEmuStreamLaunch(cudaStream_t stream, void (*run)(void *), void *arg);

/* What one rank's call of a multi-rank collective brings. */
typedef struct {
    const void *s;
    void *r;
} emuSlot;

/* The ranks of one multi-rank communicator (threads of this process). */
typedef struct emuClique {
    char key[NCCL_UNIQUE_ID_BYTES];
    int nranks;
    int joined;   /* ranks that called init */
    int live;     /* ranks not yet destroyed */
    int count;    /* ranks at the barrier */
    uint64_t gen; /* barrier generation */
    emuSlot *slots;
    struct emuClique *next;
} emuClique;

struct ncclComm {
    int nranks;
    int rank;
    int destroyed;
    emuClique *q; /* several ranks: the clique */
    int root_fd;  /* NCCL_COMM_ID: rank 0's bootstrap root, else -1 */
};

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;
static emuClique *q_list;

static __thread char emu_error[256];

static ncclResult_t fail(ncclResult_t r, const char *what)
{
    snprintf(emu_error, sizeof(emu_error), "emulated NCCL: %s", what);
    return r;
}

static size_t type_size(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

/* The one-rank collective: count elements (times mult) from s to r on the
 * stream. */
static ncclResult_t copy(const void *s, void *r, size_t count, size_t mult, ncclDataType_t dt,
                         ncclComm_t comm, cudaStream_t st)
{
    size_t es = type_size(dt);
    if (comm == NULL || comm->destroyed)
        return fail(ncclInvalidArgument, "invalid communicator");
    if (comm->nranks > 1)
        return fail(ncclInvalidUsage, "with several ranks only all-reduce, all-gather, "
                    "reduce-scatter and broadcast are emulated");
    if (es == 0)
        return fail(ncclInvalidArgument, "unsupported data type");
    if (count == 0 || s == r)
        return ncclSuccess;
    if (cudaMemcpyAsync(r, s, count * mult * es, cudaMemcpyDefault, st) != cudaSuccess) {
        cudaGetLastError();
        return fail(ncclUnhandledCudaError, "cudaMemcpyAsync failed");
    }
    return ncclSuccess;
}

static ncclResult_t check_op(ncclRedOp_t op)
{
    /* sum, prod, max, min, avg: one contribution is the result */
    return (int)op >= 0 && (int)op < (int)ncclNumOps
               ? ncclSuccess
               : fail(ncclInvalidArgument, "PreMulSum ops are not emulated");
}

ncclResult_t ncclGetVersion(int *version)
{
    if (version == NULL)
        return fail(ncclInvalidArgument, "version is NULL");
    *version = 22809; /* what nccl_real.c needs: >= 2.19 */
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (id == NULL)
        return fail(ncclInvalidArgument, "id is NULL");
    memset(id, 0, sizeof(*id));
    const char *env = getenv("NCCL_COMM_ID");
    if (env && env[0]) /* NVIDIA's: the id is that address, no root made */
        snprintf(id->internal, sizeof(id->internal), "nccl-emu root %s", env);
    else
        snprintf(id->internal, sizeof(id->internal), "nccl-emu %ld %ld", (long)getpid(),
                 (long)time(NULL));
    return ncclSuccess;
}

/* NCCL_COMM_ID set: rank 0 opens the bootstrap root at that address
 * ("a.b.c.d:port"), as NVIDIA's init does; -1 with the reason in emu_error
 * when it cannot. */
static int open_root(const char *addr)
{
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || (size_t)(colon - addr) >= sizeof(host)) {
        fail(ncclInvalidArgument, "invalid NCCL_COMM_ID, not <ipv4>:<port>");
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, strcmp(host, "localhost") == 0 ? "127.0.0.1" : host,
                  &sa.sin_addr) != 1) {
        fail(ncclInvalidArgument, "invalid NCCL_COMM_ID, not <ipv4>:<port>");
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 16) != 0) {
        char why[200];
        snprintf(why, sizeof(why), "NCCL_COMM_ID=%s: cannot open the bootstrap root there: %s",
                 addr, strerror(errno));
        if (fd >= 0)
            close(fd);
        fail(ncclSystemError, why);
        return -1;
    }
    return fd;
}

static double emu_timeout(void)
{
    const char *e = getenv("GEO_EMU_TIMEOUT");
    double t = e ? atof(e) : 0;
    return t > 0 ? t : 120;
}

static struct timespec deadline_in(double s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)s;
    return ts;
}

/* Wait until every rank of q has arrived (q_lock held).  -1 past
 * GEO_EMU_TIMEOUT: a rank never came (its caller hangs with NVIDIA's). */
static int q_barrier(emuClique *q)
{
    uint64_t gen = q->gen;
    struct timespec dl = deadline_in(emu_timeout());
    if (++q->count == q->nranks) {
        q->count = 0;
        q->gen++;
        pthread_cond_broadcast(&q_cv);
        return 0;
    }
    while (q->gen == gen)
        if (pthread_cond_timedwait(&q_cv, &q_lock, &dl) == ETIMEDOUT)
            return -1;
    return 0;
}

static void init_undo(struct ncclComm *c)
{
    if (c->root_fd >= 0)
        close(c->root_fd);
    free(c);
}

/* The library never calls its own exports: a sanitizer build loads it
 * without RTLD_DEEPBIND (comm/device/nccl_real.c), where such a call would
 * bind to GeoCCL's function of the same name. */
static ncclResult_t init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *id, int rank)
{
    if (comm == NULL)
        return fail(ncclInvalidArgument, "comm is NULL");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "rank out of range");
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return fail(ncclSystemError, "out of memory");
    c->nranks = nranks;
    c->rank = rank;
    c->root_fd = -1;
    const char *env = getenv("NCCL_COMM_ID");
    if (env && env[0] && rank == 0 && (c->root_fd = open_root(env)) < 0) {
        free(c);
        return ncclSystemError;
    }
    if (nranks > 1) {
        pthread_mutex_lock(&q_lock);
        emuClique *q = q_list;
        while (q && memcmp(q->key, id->internal, sizeof(q->key)) != 0)
            q = q->next;
        if (q == NULL && (q = calloc(1, sizeof(*q))) != NULL &&
            (q->slots = calloc((size_t)nranks, sizeof(emuSlot))) == NULL) {
            free(q);
            q = NULL;
        }
        if (q == NULL) {
            pthread_mutex_unlock(&q_lock);
            init_undo(c);
            return fail(ncclSystemError, "out of memory");
        }
        if (q->nranks == 0) {
            memcpy(q->key, id->internal, sizeof(q->key));
            q->nranks = nranks;
            q->next = q_list;
            q_list = q;
        }
        if (q->nranks != nranks || q->joined >= nranks) {
            pthread_mutex_unlock(&q_lock);
            init_undo(c);
            return fail(ncclInvalidUsage, "ranks of one id disagree on nranks, or joined twice");
        }
        q->joined++;
        q->live++;
        c->q = q;
        /* NVIDIA's init returns once every rank has joined; ranks in
         * another process never do (threads of one process only). */
        int bad = q_barrier(q);
        pthread_mutex_unlock(&q_lock);
        if (bad) {
            init_undo(c);
            return fail(ncclSystemError, "init: not every rank joined within GEO_EMU_TIMEOUT "
                        "(multi-rank communicators are threads of one process)");
        }
    }
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    (void)config;
    return init_rank(comm, nranks, &id, rank);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return init_rank(comm, nranks, &id, rank);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    return comm ? ncclSuccess : fail(ncclInvalidArgument, "comm is NULL");
}

static ncclResult_t destroy(ncclComm_t comm)
{
    if (comm == NULL)
        return fail(ncclInvalidArgument, "comm is NULL");
    emuClique *q = comm->q;
    if (q != NULL) {
        pthread_mutex_lock(&q_lock);
        if (--q->live == 0) {
            emuClique **pp = &q_list;
            while (*pp != q)
                pp = &(*pp)->next;
            *pp = q->next;
            free(q->slots);
            free(q);
        }
        pthread_mutex_unlock(&q_lock);
    }
    if (comm->root_fd >= 0)
        close(comm->root_fd);
    free(comm);
    return ncclSuccess;
}

/* ---- multi-rank collectives ---------------------------------------------- */

typedef enum { Q_ALLREDUCE, Q_ALLGATHER, Q_REDUCESCATTER, Q_BROADCAST } qKind;

typedef struct {
    qKind kind;
    struct ncclComm *comm;
    emuSlot mine;
    size_t n; /* elements per rank's block (all-reduce, broadcast: the whole count) */
    ncclDataType_t dt;
    ncclRedOp_t op;
    int root;
} qCall;

#define Q_REDUCE(T)                                                                   \
    do {                                                                              \
        T *out = (T *)tmp;                                                            \
        for (size_t i = 0; i < c->n; i++) {                                           \
            T acc = ((const T *)q->slots[0].s)[off + i];                              \
            for (int k = 1; k < q->nranks; k++) {                                     \
                T v = ((const T *)q->slots[k].s)[off + i];                            \
                acc = c->op == ncclProd  ? acc * v                                    \
                      : c->op == ncclMax ? (v > acc ? v : acc)                        \
                      : c->op == ncclMin ? (v < acc ? v : acc)                        \
                                         : acc + v;                                   \
            }                                                                         \
            out[i] = c->op == ncclAvg ? (T)(acc / (T)q->nranks) : acc;                \
        }                                                                             \
    } while (0)

/* Reduce element block off .. off + n of every rank's input into tmp. */
static void q_reduce(const qCall *c, const emuClique *q, size_t off, void *tmp)
{
    switch (c->dt) {
    case ncclFloat32: Q_REDUCE(float); break;
    case ncclFloat64: Q_REDUCE(double); break;
    case ncclInt32: Q_REDUCE(int32_t); break;
    case ncclUint32: Q_REDUCE(uint32_t); break;
    case ncclInt64: Q_REDUCE(int64_t); break;
    case ncclUint64: Q_REDUCE(uint64_t); break;
    default: break; /* refused when called */
    }
}

/* One rank's part, in its stream's order: publish the input and output,
 * wait for all, compute this rank's output from the others' inputs, wait
 * until every rank has read them (an input may be overwritten after). */
static void q_run(void *arg)
{
    qCall *c = arg;
    emuClique *q = c->comm->q;
    const int me = c->comm->rank;
    const size_t es = type_size(c->dt);
    /* a reduction's result waits here until every rank has read the inputs
     * (in place, the output is this rank's input) */
    void *tmp = NULL;
    if ((c->kind == Q_ALLREDUCE || c->kind == Q_REDUCESCATTER) &&
        (tmp = malloc(c->n * es + 1)) == NULL) {
        fprintf(stderr, "emulated NCCL: out of memory\n");
        abort();
    }
    pthread_mutex_lock(&q_lock);
    q->slots[me] = c->mine;
    int bad = q_barrier(q);
    pthread_mutex_unlock(&q_lock);
    if (!bad) {
        switch (c->kind) {
        case Q_ALLREDUCE: q_reduce(c, q, 0, tmp); break;
        case Q_REDUCESCATTER: q_reduce(c, q, (size_t)me * c->n, tmp); break;
        case Q_ALLGATHER:
            for (int k = 0; k < q->nranks; k++)
                memcpy((char *)c->mine.r + (size_t)k * c->n * es, q->slots[k].s, c->n * es);
            break;
        case Q_BROADCAST:
            if (q->slots[c->root].s != c->mine.r)
                memcpy(c->mine.r, q->slots[c->root].s, c->n * es);
            break;
        }
        pthread_mutex_lock(&q_lock);
        bad = q_barrier(q);
        pthread_mutex_unlock(&q_lock);
        if (tmp != NULL)
            memcpy(c->mine.r, tmp, c->n * es);
    }
    free(tmp);
    if (bad) {
        fprintf(stderr, "emulated NCCL: rank %d of %d: a collective waited past "
                "GEO_EMU_TIMEOUT for the other ranks' calls\n", me, q->nranks);
        abort();
    }
    free(c);
}

/* Enqueue one rank's part of a multi-rank collective.  In place is allowed
 * where NCCL allows it; the reductions reading other ranks' inputs finish
 * (second barrier) before any rank's next call can write them. */
static ncclResult_t q_call(qKind kind, const void *s, void *r, size_t n, ncclDataType_t dt,
                           ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t st)
{
    if (type_size(dt) == 0)
        return fail(ncclInvalidArgument, "unsupported data type");
    if ((kind == Q_ALLREDUCE || kind == Q_REDUCESCATTER) &&
        (dt == ncclFloat16 || dt == ncclBfloat16 || dt == ncclInt8 || dt == ncclUint8 ||
         (int)op < 0 || (int)op >= (int)ncclNumOps))
        return fail(ncclInvalidUsage, "multi-rank reductions of this type or op are not "
                    "emulated");
    if (kind == Q_BROADCAST && (root < 0 || root >= comm->nranks))
        return fail(ncclInvalidArgument, "root out of range");
    qCall *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return fail(ncclSystemError, "out of memory");
    *c = (qCall){.kind = kind, .comm = comm, .mine = {s, r}, .n = n, .dt = dt, .op = op,
                 .root = root};
    geoEmuStreamLaunch(st, q_run, c);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return destroy(comm); }

ncclResult_t ncclCommAbort(ncclComm_t comm) { return destroy(comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    if (comm == NULL || err == NULL)
        return fail(ncclInvalidArgument, "NULL argument");
    *err = ncclSuccess;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated NCCL)";
    case ncclSystemError: return "unhandled system error (emulated NCCL)";
    case ncclInternalError: return "internal error (emulated NCCL)";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
    default: return "unknown result (emulated NCCL)";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return emu_error;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t st)
{
    if (check_op(op) != ncclSuccess)
        return ncclInvalidArgument;
    if (comm && comm->q)
        return q_call(Q_ALLREDUCE, s, r, n, dt, op, 0, comm, st);
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t st)
{
    if (comm && comm->q)
        return q_call(Q_ALLGATHER, s, r, n, dt, ncclSum, 0, comm, st);
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t st)
{
    if (check_op(op) != ncclSuccess)
        return ncclInvalidArgument;
    if (comm && comm->q)
        return q_call(Q_REDUCESCATTER, s, r, n, dt, op, 0, comm, st);
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t dt, int root,
                           ncclComm_t comm, cudaStream_t st)
{
    if (comm && comm->q)
        return q_call(Q_BROADCAST, s, r, n, dt, ncclSum, root, comm, st);
    if (root != 0)
        return fail(ncclInvalidArgument, "root out of range");
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclReduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t st)
{
    if (root != 0)
        return fail(ncclInvalidArgument, "root out of range");
    if (check_op(op) != ncclSuccess)
        return ncclInvalidArgument;
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclAlltoAll(const void *s, void *r, size_t n, ncclDataType_t dt, ncclComm_t comm,
                          cudaStream_t st)
{
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclGather(const void *s, void *r, size_t n, ncclDataType_t dt, int root,
                        ncclComm_t comm, cudaStream_t st)
{
    if (root != 0)
        return fail(ncclInvalidArgument, "root out of range");
    return copy(s, r, n, 1, dt, comm, st);
}

ncclResult_t ncclScatter(const void *s, void *r, size_t n, ncclDataType_t dt, int root,
                         ncclComm_t comm, cudaStream_t st)
{
    if (root != 0)
        return fail(ncclInvalidArgument, "root out of range");
    return copy(s, r, n, 1, dt, comm, st);
}

/* Point-to-point to oneself would need a matching send and receive inside
 * a group; the emulated test never does that. */
ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm,
                      cudaStream_t st)
{
    (void)s, (void)n, (void)dt, (void)peer, (void)comm, (void)st;
    return fail(ncclInvalidUsage, "send/recv are not emulated");
}

ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm,
                      cudaStream_t st)
{
    (void)r, (void)n, (void)dt, (void)peer, (void)comm, (void)st;
    return fail(ncclInvalidUsage, "send/recv are not emulated");
}

/* Every call is complete when it returns (enqueued), so a group is empty. */
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
