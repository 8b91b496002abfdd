/*
 * A CPU emulation of the CUDA runtime and driver subset that the device
 * layer (comm/device/), tests/device/dev_allreduce.c and the emulated
 * NCCL (tests/device/nccl_emu.c) call, so that the device-
 * buffer path of GeoCCL runs end to end in make check without a GPU
 * (tests/device/dev_allreduce-emu, run by tests/device/run_dev_emu.sh).
 * The declarations are the CUDA toolkit's own (cuda.h,
 * cuda_runtime_api.h): the library compiles unchanged against them.
 *
 * Model:
 *  - One device (0).  "Device memory" is host memory recorded in an
 *    allocation table (cudaMalloc, cudaMallocAsync); cudaPointerGetAttributes
 *    says cudaMemoryTypeDevice for addresses inside one, cudaMemoryTypeHost
 *    for cudaHostAlloc'ed memory (mapped: its device address is its host
 *    address) and cudaMemoryTypeUnregistered for anything else.
 *  - A stream is an in-order queue of operations run by a worker thread of
 *    its own, so a stream blocked in a wait-value operation never blocks
 *    the thread that enqueues.  Kernel launches are queued too
 *    (cuda_emu_device.h with GEO_CUDA_EMU_STREAMS calls geoEmuStreamLaunch):
 *    the stream's worker runs the grid (kernels of different streams at the
 *    same time), and a launch never blocks its caller.
 *  - Host functions (cudaLaunchHostFunc) run on one thread of the process,
 *    in the order their streams reach them, as CUDA may run all host
 *    functions of a context on one thread: one that blocks holds the
 *    others, of every stream.
 *  - Stream 0 (legacy) and cudaStreamPerThread are one ordinary stream: no
 *    implicit synchronisation with other streams (the programs under test
 *    use non-blocking streams only, and synchronise explicitly).  The
 *    synchronous calls (cudaMemcpy, cudaMemset) wait for stream 0 and then
 *    copy on the calling thread; cudaFree and cudaFreeHost first wait for
 *    every stream (as CUDA synchronises the device).
 *  - cudaMemcpyAsync/cudaMemsetAsync from or to pageable host memory waits
 *    for the stream and copies at once, as CUDA does for pageable memory
 *    (the call returns when the host buffer may be reused).
 *  - Events complete when their stream reaches them; an event never
 *    recorded reads as complete, as in CUDA.  A query that answers
 *    cudaErrorNotReady (cudaEventQuery, cudaStreamQuery) leaves it as the
 *    thread's last error, as CUDA's runtime does (see emu_error), so a
 *    later cudaGetLastError that expects launch errors sees it.
 *    GEO_EMU_QUERY_LAG=N: cudaEventQuery sees each record's completion
 *    only at the N+1st query after it completed (a host that polls
 *    before the device's completion reaches it), so a query that answers
 *    not ready happens in every run, not only under load.
 *    cudaEventElapsedTime answers as CUDA's does: an event made with
 *    cudaEventDisableTiming, or never recorded, is an invalid handle; one
 *    whose last record the stream has not reached is cudaErrorNotReady,
 *    kept as the last error like a query's; else the time between the
 *    moments the streams reached them.
 *  - Every wait (stream worker in a wait-value, host in a synchronise) has
 *    a deadline, GEO_EMU_TIMEOUT seconds (default 120): past it the process
 *    aborts with a message naming the wait, so a bug shows as a failure of
 *    the test, never as a hang of make check.
 *  - cudaGetDriverEntryPoint(ByVersion) knows one driver function,
 *    cuStreamWaitValue32, emulated as a queued operation that polls the
 *    word; GEO_EMU_NO_WAIT_VALUE=1 hides it (the library then falls back
 *    to a polling host function).
 *  - GEO_EMU_DELAY_US=N: each queued operation first sleeps a random 0..N
 *    microseconds, so the "device" lags behind the host as a real one
 *    does, and a missing synchronisation shows as a wrong result.
 *  - Streams and events belong to the device current when they are made;
 *    recording an event on a stream of another device fails with
 *    cudaErrorInvalidResourceHandle, as in CUDA (the null stream is shared
 *    by every device here and takes any event).
 *  - GEO_EMU_DRIVER_VERSION=N: the CUDA version the emulated driver
 *    supports (cudaDriverGetVersion; default: the runtime's own,
 *    CUDART_VERSION).  A major version below the runtime's makes
 *    cudaGetDeviceCount fail with cudaErrorInsufficientDriver, as a real
 *    runtime does on an old driver; 0 stands for no driver installed.
 *  - Memory pools (cudaMemPoolCreate, cudaMallocFromPoolAsync) keep what is
 *    freed into them up to their release threshold and hand it out again;
 *    cudaMalloc, cudaMallocAsync (the default pool, which keeps nothing
 *    across a synchronisation) and a pool request no free block fits are
 *    counted as allocations from the driver (geoEmuDeviceAllocCount), so a
 *    test can tell whether a hot path allocates device memory per call.
 *    GEO_EMU_NO_POOLS=1: the device says it has no pools.
 *  - cudaHostAlloc and cudaMemPoolCreate wait for every stream first, as
 *    CUDA synchronises the device for them (see cudaHostAlloc), so a
 *    library that pins or makes a pool inside a stream-ordered call hangs
 *    behind another stream's blocked host function here too.
 *  - cudaFreeHost counts as a pinned free and cudaHostAlloc as a pinned
 *    allocation; geoEmuPinnedCounts() reads both, so a test can tell
 *    whether a hot path re-pins its staging.
 *  - GEO_EMU_STATS=1: cudaStreamDestroy prints what went through the
 *    emulation ("cuda emulation stats: ..."), so that a test can tell which
 *    path a call took.
 *
 * It is a test fixture, not a CUDA implementation: no kernels of its own,
 * no graphs, no peer access, one device.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- process state ------------------------------------------------------- */

typedef struct emuAlloc {
    char *base;
    size_t bytes;
    int host; /* cudaHostAlloc'ed (pinned, mapped) rather than device */
    struct emuAlloc *next;
} emuAlloc;

typedef struct emuOp {
    void (*run)(struct emuOp *op);
    struct emuOp *next;
    /* arguments; which ones depend on run */
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    cudaHostFn_t fn;
    void *arg;
    cudaEvent_t ev;
    unsigned long gen;
    volatile cuuint32_t *word;
    unsigned flags;
    struct emuOp *hf_next;   /* host functions: the host-function thread's queue */
    int hf_done;
} emuOp;

struct CUstream_st {
    pthread_t thread;
    emuOp *head, *tail;
    unsigned long enqueued, completed; /* operations */
    int stop;
    int dev;                 /* the device current at creation; -1: any */
    int capturing;           /* between cudaStreamBeginCapture and End */
    struct CUstream_st *next_stream;
};

struct CUevent_st {
    unsigned long recorded;  /* records so far */
    unsigned long completed; /* the last record the stream has reached */
    double t;                /* when it was reached */
    int refs;                /* queued operations that point at it */
    int destroyed;           /* freed when the last of them is done */
    int dev;                 /* the device current at creation */
    unsigned flags;          /* cudaEventCreateWithFlags' */
    unsigned long lag_gen;   /* GEO_EMU_QUERY_LAG: the record being held back */
    int lag_left;            /* ... for this many more queries */
};

/* One lock and one condition variable for everything: the emulation is for
 * correctness, and a single lock makes its own reasoning simple. */
static pthread_mutex_t emu_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t emu_cv = PTHREAD_COND_INITIALIZER;
static emuAlloc *emu_allocs;
static struct CUstream_st *emu_streams;
static struct CUstream_st *emu_null_stream;
static __thread cudaError_t emu_last_error;
/* GEO_EMU_STATS */
static unsigned long emu_n_launch, emu_n_wait_value, emu_n_host_fn, emu_n_copy;
static unsigned long emu_n_pin, emu_n_unpin, emu_n_dev_alloc;

static void emu_count(unsigned long *n) { __atomic_add_fetch(n, 1, __ATOMIC_RELAXED); }

static double emu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double emu_timeout(void)
{
    static double t;
    if (t == 0) {
        const char *e = getenv("GEO_EMU_TIMEOUT");
        double v = e ? atof(e) : 0;
        t = v > 0 ? v : 120;
    }
    return t;
}

static void emu_die(const char *what)
{
    fprintf(stderr, "cuda emulation: %s did not finish within GEO_EMU_TIMEOUT=%.0f s "
            "(a stream or a wait never released)\n", what, emu_timeout());
    abort();
}

/* GEO_EMU_QUERY_LAG=N: see the model above. */
static int emu_query_lag(void)
{
    static int lag = -1;
    if (lag < 0) {
        const char *e = getenv("GEO_EMU_QUERY_LAG");
        lag = e && atoi(e) > 0 ? atoi(e) : 0;
    }
    return lag;
}

/* Every call that fails records its error as the calling thread's last
 * error, cudaErrorNotReady of cudaEventQuery/cudaStreamQuery included:
 * NVIDIA's runtime reference says cudaGetLastError returns "the last error
 * that has been produced by any of the runtime calls in the same host
 * thread" and resets it, and a query's cudaErrorNotReady is such a result
 * (PyTorch's caching allocator and event queries clear it with
 * cudaGetLastError after every not-ready query for this reason: pytorch
 * pull requests 18584 and 61554).  It is not sticky: the next
 * cudaGetLastError clears it. */
static cudaError_t emu_error(cudaError_t e)
{
    if (e != cudaSuccess)
        emu_last_error = e;
    return e;
}

/* Wait on emu_cv (emu_lock held) until deadline; 0 when it passed. */
static int emu_wait_until(double deadline)
{
    double now = emu_now();
    if (now >= deadline)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double d = deadline - now;
    if (d > 0.05)
        d = 0.05;
    ts.tv_nsec += (long)(d * 1e9);
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&emu_cv, &emu_lock, &ts);
    return 1;
}

/* The allocation holding p (emu_lock held), or NULL. */
static emuAlloc *emu_find(const void *p)
{
    for (emuAlloc *a = emu_allocs; a; a = a->next)
        if ((const char *)p >= a->base && (const char *)p < a->base + (a->bytes ? a->bytes : 1))
            return a;
    return NULL;
}

static int emu_is_pageable(const void *p)
{
    pthread_mutex_lock(&emu_lock);
    int r = emu_find(p) == NULL;
    pthread_mutex_unlock(&emu_lock);
    return r;
}

/* Guard bytes before and after every allocation, checked when it is freed
 * (a write past either end by a copy, a kernel or the host aborts). */
#define EMU_GUARD 256
#define EMU_GUARD_BYTE 0xA5

static void emu_check_guards(const emuAlloc *a)
{
    const unsigned char *lo = (const unsigned char *)a->base - EMU_GUARD;
    const unsigned char *hi = (const unsigned char *)a->base + a->bytes;
    for (size_t i = 0; i < EMU_GUARD; i++)
        if (lo[i] != EMU_GUARD_BYTE || hi[i] != EMU_GUARD_BYTE) {
            fprintf(stderr, "cuda emulation: a write %s the %zu-byte %s allocation at %p\n",
                    lo[i] != EMU_GUARD_BYTE ? "before the start of" : "past the end of",
                    a->bytes, a->host ? "pinned host" : "device", (void *)a->base);
            abort();
        }
}

static cudaError_t emu_alloc(void **ptr, size_t bytes, int host)
{
    if (ptr == NULL)
        return emu_error(cudaErrorInvalidValue);
    emuAlloc *a = malloc(sizeof(*a));
    /* 256-byte aligned as cudaMalloc; filled with a pattern (CUDA does not
     * zero device memory) so that a read of uninitialised memory shows */
    char *b = aligned_alloc(256, EMU_GUARD + (bytes + 255) / 256 * 256 + EMU_GUARD);
    if (a == NULL || b == NULL) {
        free(a);
        free(b);
        return emu_error(cudaErrorMemoryAllocation);
    }
    memset(b, EMU_GUARD_BYTE, EMU_GUARD);
    b += EMU_GUARD;
    memset(b + bytes, EMU_GUARD_BYTE, EMU_GUARD);
    if (!host)
        memset(b, 0xCD, bytes);
    a->base = b;
    a->bytes = bytes;
    a->host = host;
    pthread_mutex_lock(&emu_lock);
    a->next = emu_allocs;
    emu_allocs = a;
    pthread_mutex_unlock(&emu_lock);
    *ptr = b;
    return cudaSuccess;
}

static cudaError_t emu_release(void *p, int host)
{
    if (p == NULL)
        return cudaSuccess;
    pthread_mutex_lock(&emu_lock);
    emuAlloc **pp = &emu_allocs;
    while (*pp && ((*pp)->base != p || (*pp)->host != host))
        pp = &(*pp)->next;
    emuAlloc *a = *pp;
    if (a)
        *pp = a->next;
    pthread_mutex_unlock(&emu_lock);
    if (a == NULL) {
        fprintf(stderr, "cuda emulation: %s of %p, which is no %s allocation\n",
                host ? "cudaFreeHost" : "cudaFree", p, host ? "host" : "device");
        return emu_error(cudaErrorInvalidValue);
    }
    emu_check_guards(a);
    free(a->base - EMU_GUARD);
    free(a);
    return cudaSuccess;
}

/* The calling thread's current device (cudaSetDevice). */
static __thread int emu_cur_dev;

/* ---- streams ------------------------------------------------------------- */

static void *emu_stream_main(void *arg)
{
    struct CUstream_st *s = arg;
    const char *d = getenv("GEO_EMU_DELAY_US");
    long delay = d ? atol(d) : 0;
    unsigned seed = (unsigned)(uintptr_t)s ^ (unsigned)getpid();
    pthread_mutex_lock(&emu_lock);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&emu_cv, &emu_lock);
        if (s->head == NULL)
            break;
        emuOp *op = s->head;
        pthread_mutex_unlock(&emu_lock);
        if (delay > 0) {
            long us = (long)(rand_r(&seed) % (unsigned)(delay + 1));
            struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
            nanosleep(&ts, NULL);
        }
        op->run(op); /* the head stays queued until it is done */
        pthread_mutex_lock(&emu_lock);
        s->head = op->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->completed++;
        free(op);
        pthread_cond_broadcast(&emu_cv);
    }
    pthread_mutex_unlock(&emu_lock);
    return NULL;
}

static struct CUstream_st *emu_stream_new(void)
{
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->dev = emu_cur_dev;
    if (pthread_create(&s->thread, NULL, emu_stream_main, s) != 0) {
        free(s);
        return NULL;
    }
    pthread_mutex_lock(&emu_lock);
    s->next_stream = emu_streams;
    emu_streams = s;
    pthread_mutex_unlock(&emu_lock);
    return s;
}

static struct CUstream_st *emu_stream(cudaStream_t s)
{
    if (s != NULL && s != cudaStreamLegacy && s != cudaStreamPerThread)
        return s;
    pthread_mutex_lock(&emu_lock);
    struct CUstream_st *n = emu_null_stream;
    pthread_mutex_unlock(&emu_lock);
    if (n == NULL) {
        n = emu_stream_new();
        if (n == NULL) {
            fprintf(stderr, "cuda emulation: cannot start the null stream's thread\n");
            abort();
        }
        n->dev = -1;
        pthread_mutex_lock(&emu_lock);
        if (emu_null_stream == NULL)
            emu_null_stream = n;
        else
            n->stop = 1; /* another thread won; this one ends at once */
        pthread_cond_broadcast(&emu_cv);
        n = emu_null_stream;
        pthread_mutex_unlock(&emu_lock);
    }
    return n;
}

static emuOp *emu_op(void (*run)(emuOp *))
{
    emuOp *op = calloc(1, sizeof(*op));
    if (op)
        op->run = run;
    return op;
}

static cudaError_t emu_enqueue(cudaStream_t stream, emuOp *op)
{
    if (op == NULL)
        return emu_error(cudaErrorMemoryAllocation);
    struct CUstream_st *s = emu_stream(stream);
    pthread_mutex_lock(&emu_lock);
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->enqueued++;
    pthread_cond_broadcast(&emu_cv);
    pthread_mutex_unlock(&emu_lock);
    return cudaSuccess;
}

/* Wait until s has completed everything enqueued before this call. */
static void emu_drain(struct CUstream_st *s, const char *what)
{
    double deadline = emu_now() + emu_timeout();
    pthread_mutex_lock(&emu_lock);
    unsigned long want = s->enqueued;
    while (s->completed < want)
        if (!emu_wait_until(deadline)) {
            pthread_mutex_unlock(&emu_lock);
            emu_die(what);
        }
    pthread_mutex_unlock(&emu_lock);
}

/* The hook of cuda_emu_device.h (GEO_CUDA_EMU_STREAMS): a kernel launch,
 * queued on the stream; the stream's worker runs the grid. */
static void run_kernel(emuOp *op) { op->fn(op->arg); }

void geoEmuStreamLaunch(cudaStream_t stream, void (*run)(void *), void *arg);
void geoEmuStreamLaunch(cudaStream_t stream, void (*run)(void *), void *arg)
{
    emu_count(&emu_n_launch);
    emuOp *op = emu_op(run_kernel);
    if (op == NULL) {
        fprintf(stderr, "cuda emulation: out of memory for a kernel launch\n");
        abort();
    }
    op->fn = run;
    op->arg = arg;
    emu_enqueue(stream, op);
}

static void emu_drain_all(const char *what)
{
    /* streams are never unlinked while in use (destroy drains first) */
    emu_stream(NULL);
    pthread_mutex_lock(&emu_lock);
    struct CUstream_st *list = emu_streams;
    pthread_mutex_unlock(&emu_lock);
    for (struct CUstream_st *s = list; s; s = s->next_stream)
        if (!s->stop)
            emu_drain(s, what);
}

int geoEmuIsDeviceAccessible(const void *p);
int geoEmuIsDeviceAccessible(const void *p) { return !emu_is_pageable(p); }
unsigned geoEmuLoadAcquire32(const volatile unsigned *p);
unsigned geoEmuLoadAcquire32(const volatile unsigned *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

/* ---- operations ---------------------------------------------------------- */

static void run_copy(emuOp *op)
{
    if (op->bytes)
        memmove(op->dst, op->src, op->bytes);
}

static void run_set(emuOp *op)
{
    if (op->bytes)
        memset(op->dst, op->value, op->bytes);
}

/* Host functions run on one thread of the process (CUDA may run all host
 * functions of a context on one thread): the stream that reaches one hands
 * it to that thread and waits until it has run, so a host function that
 * blocks holds every later host function, of every stream. */
static emuOp *emu_hf_head, *emu_hf_tail;
static int emu_hf_started;

static void *emu_hf_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&emu_lock);
    for (;;) {
        while (emu_hf_head == NULL)
            pthread_cond_wait(&emu_cv, &emu_lock);
        emuOp *op = emu_hf_head;
        emu_hf_head = op->hf_next;
        if (emu_hf_head == NULL)
            emu_hf_tail = NULL;
        pthread_mutex_unlock(&emu_lock);
        op->fn(op->arg);
        pthread_mutex_lock(&emu_lock);
        op->hf_done = 1;
        pthread_cond_broadcast(&emu_cv);
    }
    return NULL;
}

static void run_host_fn(emuOp *op)
{
    pthread_mutex_lock(&emu_lock);
    if (!emu_hf_started) {
        pthread_t t;
        if (pthread_create(&t, NULL, emu_hf_main, NULL) != 0) {
            pthread_mutex_unlock(&emu_lock);
            emu_die("starting the host-function thread");
        }
        pthread_detach(t);
        emu_hf_started = 1;
    }
    op->hf_next = NULL;
    if (emu_hf_tail)
        emu_hf_tail->hf_next = op;
    else
        emu_hf_head = op;
    emu_hf_tail = op;
    pthread_cond_broadcast(&emu_cv);
    double deadline = emu_now() + emu_timeout();
    while (!op->hf_done)
        if (!emu_wait_until(deadline)) {
            pthread_mutex_unlock(&emu_lock);
            emu_die("a host function (the host-function thread is held)");
        }
    pthread_mutex_unlock(&emu_lock);
}

/* A queued operation is done with its event (emu_lock held). */
static void emu_event_unref(cudaEvent_t ev)
{
    if (--ev->refs == 0 && ev->destroyed)
        free(ev);
}

static void run_record(emuOp *op)
{
    pthread_mutex_lock(&emu_lock);
    if (op->ev->completed < op->gen)
        op->ev->completed = op->gen;
    op->ev->t = emu_now();
    emu_event_unref(op->ev);
    pthread_mutex_unlock(&emu_lock);
}

static void run_wait_event(emuOp *op)
{
    double deadline = emu_now() + emu_timeout();
    pthread_mutex_lock(&emu_lock);
    while (op->ev->completed < op->gen)
        if (!emu_wait_until(deadline)) {
            pthread_mutex_unlock(&emu_lock);
            emu_die("cudaStreamWaitEvent");
        }
    emu_event_unref(op->ev);
    pthread_mutex_unlock(&emu_lock);
}

static int wait_value_met(cuuint32_t v, cuuint32_t want, unsigned flags)
{
    switch (flags & 0xf) {
    case CU_STREAM_WAIT_VALUE_EQ: return v == want;
    case CU_STREAM_WAIT_VALUE_AND: return (v & want) != 0;
    case CU_STREAM_WAIT_VALUE_NOR: return ~(v | want) != 0;
    default: return (int32_t)(v - want) >= 0; /* GEQ, with wrap as CUDA */
    }
}

static void run_wait_value(emuOp *op)
{
    double deadline = emu_now() + emu_timeout();
    long backoff = 1;
    while (!wait_value_met(__atomic_load_n(op->word, __ATOMIC_ACQUIRE), (cuuint32_t)op->value,
                           op->flags)) {
        if (emu_now() > deadline)
            emu_die("cuStreamWaitValue32");
        struct timespec ts = {0, backoff * 1000};
        nanosleep(&ts, NULL);
        if (backoff < 100)
            backoff *= 2;
    }
}

static void run_free(emuOp *op) { emu_release(op->dst, 0); }

/* ---- the runtime API ----------------------------------------------------- */

/* GEO_EMU_DEVICES=N (default 1, at most 16) devices, each thread with its
 * own current device starting at 0, as in CUDA: code that reads the
 * current device on a thread the caller did not set up sees device 0.
 * Memory and streams are not split between the devices. */
static int emu_ndev(void)
{
    const char *e = getenv("GEO_EMU_DEVICES");
    int n = e ? atoi(e) : 1;
    return n < 1 ? 1 : n > 16 ? 16 : n;
}

static int emu_driver_version(void)
{
    const char *e = getenv("GEO_EMU_DRIVER_VERSION");
    return e && e[0] ? atoi(e) : CUDART_VERSION;
}

cudaError_t cudaDriverGetVersion(int *version)
{
    if (version == NULL)
        return emu_error(cudaErrorInvalidValue);
    *version = emu_driver_version();
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version)
{
    if (version == NULL)
        return emu_error(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (count == NULL)
        return emu_error(cudaErrorInvalidValue);
    /* minor-version compatibility: within a major version an older driver
     * serves; below it (or without one) the runtime cannot start */
    if (emu_driver_version() / 1000 < CUDART_VERSION / 1000)
        return emu_error(cudaErrorInsufficientDriver);
    *count = emu_ndev();
    return cudaSuccess;
}

/* Device d sits at bus 0x10 + d of domain 0 (every process sees the same
 * devices: two ranks on one emulated device are two ranks on one GPU). */
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    if (pciBusId == NULL || len <= 0)
        return emu_error(cudaErrorInvalidValue);
    if (device < 0 || device >= emu_ndev())
        return emu_error(cudaErrorInvalidDevice);
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", 0x10 + device);
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= emu_ndev())
        return emu_error(cudaErrorInvalidDevice);
    emu_cur_dev = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (device == NULL)
        return emu_error(cudaErrorInvalidValue);
    *device = emu_cur_dev;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    if (attr == NULL)
        return emu_error(cudaErrorInvalidValue);
    memset(attr, 0, sizeof(*attr));
    pthread_mutex_lock(&emu_lock);
    emuAlloc *a = emu_find(ptr);
    if (a == NULL) {
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = -2;
    } else {
        attr->type = a->host ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
        attr->device = 0;
        attr->devicePointer = (void *)ptr;
        attr->hostPointer = a->host ? (void *)ptr : NULL;
    }
    pthread_mutex_unlock(&emu_lock);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    emu_count(&emu_n_dev_alloc);
    return emu_alloc(ptr, bytes, 0);
}

cudaError_t cudaFree(void *ptr)
{
    if (ptr == NULL)
        return cudaSuccess;
    emu_drain_all("cudaFree's device synchronisation");
    return emu_release(ptr, 0);
}

/* The device's default pool, as CUDA's with its release threshold left at
 * 0: memory freed into it goes back to the system at the next
 * synchronisation, so a cudaMallocAsync after one is a new allocation from
 * the driver.  The emulation never keeps any: every cudaMallocAsync is
 * counted as a driver allocation.  Allocated at once (usable by everything
 * later in the stream); freed when the stream reaches the free. */
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream)
{
    (void)stream;
    emu_count(&emu_n_dev_alloc);
    return emu_alloc(ptr, bytes, 0);
}

/* ---- memory pools (cudaMemPoolCreate) ------------------------------------
 * A pool keeps the blocks freed into it (cudaFreeAsync: when the stream
 * reaches the free) and hands them out again to cudaMallocFromPoolAsync,
 * smallest fitting block first; only a request no free block fits is a new
 * allocation from the driver (counted).  At a synchronisation a pool holds
 * on to at most its release threshold (cudaMemPoolAttrReleaseThreshold,
 * default 0, as in CUDA) of free blocks.  cudaMemPoolDestroy frees the free
 * blocks at once and the others when they are freed. */
typedef struct emuBlock {
    char *p;
    size_t bytes;
    int free_;               /* the stream reached its cudaFreeAsync */
    struct emuBlock *next;
} emuBlock;

struct CUmemPoolHandle_st {
    emuBlock *blocks;
    unsigned long long threshold;
    int destroyed;
    struct CUmemPoolHandle_st *next_pool;
};

static struct CUmemPoolHandle_st *emu_pools;

/* Caller holds emu_lock.  The block of a pool at p, and its pool. */
static emuBlock *emu_pool_block(const void *p, struct CUmemPoolHandle_st **pool)
{
    for (struct CUmemPoolHandle_st *m = emu_pools; m; m = m->next_pool)
        for (emuBlock *b = m->blocks; b; b = b->next)
            if (b->p == p) {
                *pool = m;
                return b;
            }
    return NULL;
}

/* Caller holds emu_lock: frees the pool's free blocks beyond keep bytes
 * (all of them once the pool is destroyed); returns them in *out to be
 * released without the lock. */
static void emu_pool_trim(struct CUmemPoolHandle_st *m, emuBlock **out)
{
    unsigned long long held = 0;
    for (emuBlock *b = m->blocks; b; b = b->next)
        held += b->free_ ? b->bytes : 0;
    emuBlock **pp = &m->blocks;
    while (*pp) {
        emuBlock *b = *pp;
        if (b->free_ && (m->destroyed || held > m->threshold)) {
            held -= b->bytes;
            *pp = b->next;
            b->next = *out;
            *out = b;
        } else {
            pp = &b->next;
        }
    }
}

static void emu_release_blocks(emuBlock *b)
{
    while (b) {
        emuBlock *n = b->next;
        emu_release(b->p, 0);
        free(b);
        b = n;
    }
}

/* At every synchronisation: pools give back what exceeds their threshold. */
static void emu_pools_sync(void)
{
    emuBlock *out = NULL;
    pthread_mutex_lock(&emu_lock);
    for (struct CUmemPoolHandle_st *m = emu_pools; m; m = m->next_pool)
        emu_pool_trim(m, &out);
    pthread_mutex_unlock(&emu_lock);
    emu_release_blocks(out);
}

static void run_pool_free(emuOp *op)
{
    struct CUmemPoolHandle_st *m = NULL;
    emuBlock *out = NULL;
    pthread_mutex_lock(&emu_lock);
    emuBlock *b = emu_pool_block(op->dst, &m);
    if (b) {
        b->free_ = 1;
        if (m->destroyed)
            emu_pool_trim(m, &out);
    }
    pthread_mutex_unlock(&emu_lock);
    emu_release_blocks(out);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    if (ptr == NULL)
        return cudaSuccess;
    struct CUmemPoolHandle_st *m = NULL;
    pthread_mutex_lock(&emu_lock);
    emuBlock *b = emu_pool_block(ptr, &m);
    int bad = b != NULL && b->free_;
    pthread_mutex_unlock(&emu_lock);
    if (bad) {
        fprintf(stderr, "cuda emulation: cudaFreeAsync of %p, already freed into its pool\n", ptr);
        return emu_error(cudaErrorInvalidValue);
    }
    emuOp *op = emu_op(b ? run_pool_free : run_free);
    if (op)
        op->dst = ptr;
    return emu_enqueue(stream, op);
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props)
{
    if (pool == NULL || props == NULL || props->allocType != cudaMemAllocationTypePinned ||
        props->location.type != cudaMemLocationTypeDevice || props->location.id < 0 ||
        props->location.id >= emu_ndev())
        return emu_error(cudaErrorInvalidValue);
    /* Treated as synchronising, as a device memory allocation of the same
     * list in the guide is (a pool maps device memory): it waits for every
     * stream, as cudaHostAlloc below. */
    emu_drain_all("cudaMemPoolCreate's device synchronisation");
    struct CUmemPoolHandle_st *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return emu_error(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&emu_lock);
    m->next_pool = emu_pools;
    emu_pools = m;
    pthread_mutex_unlock(&emu_lock);
    *pool = m;
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value)
{
    if (pool == NULL || value == NULL || attr != cudaMemPoolAttrReleaseThreshold)
        return emu_error(cudaErrorInvalidValue);
    pthread_mutex_lock(&emu_lock);
    pool->threshold = *(unsigned long long *)value;
    pthread_mutex_unlock(&emu_lock);
    return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool)
{
    if (pool == NULL)
        return emu_error(cudaErrorInvalidValue);
    emuBlock *out = NULL;
    pthread_mutex_lock(&emu_lock);
    pool->destroyed = 1; /* the handle stays listed: blocks still in use */
    emu_pool_trim(pool, &out);
    pthread_mutex_unlock(&emu_lock);
    emu_release_blocks(out);
    return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t bytes, cudaMemPool_t pool,
                                    cudaStream_t stream)
{
    (void)stream;
    if (ptr == NULL || pool == NULL)
        return emu_error(cudaErrorInvalidValue);
    pthread_mutex_lock(&emu_lock);
    if (pool->destroyed) {
        pthread_mutex_unlock(&emu_lock);
        return emu_error(cudaErrorInvalidValue);
    }
    emuBlock *best = NULL;
    for (emuBlock *b = pool->blocks; b; b = b->next)
        if (b->free_ && b->bytes >= bytes && (best == NULL || b->bytes < best->bytes))
            best = b;
    if (best) {
        best->free_ = 0;
        *ptr = best->p;
        pthread_mutex_unlock(&emu_lock);
        return cudaSuccess;
    }
    pthread_mutex_unlock(&emu_lock);
    emuBlock *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return emu_error(cudaErrorMemoryAllocation);
    emu_count(&emu_n_dev_alloc);
    cudaError_t e = emu_alloc((void **)&b->p, bytes, 0);
    if (e != cudaSuccess) {
        free(b);
        return e;
    }
    b->bytes = bytes;
    pthread_mutex_lock(&emu_lock);
    b->next = pool->blocks;
    pool->blocks = b;
    pthread_mutex_unlock(&emu_lock);
    *ptr = b->p;
    return cudaSuccess;
}

/* Memory pools are supported (the only attribute the library asks for),
 * unless GEO_EMU_NO_POOLS=1. */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (value == NULL || device < 0 || device >= emu_ndev() ||
        attr != cudaDevAttrMemoryPoolsSupported)
        return emu_error(cudaErrorInvalidValue);
    const char *no = getenv("GEO_EMU_NO_POOLS");
    *value = !(no && strcmp(no, "1") == 0);
    return cudaSuccess;
}

void geoEmuDeviceAllocCount(unsigned long *allocs);
void geoEmuDeviceAllocCount(unsigned long *allocs)
{
    *allocs = __atomic_load_n(&emu_n_dev_alloc, __ATOMIC_RELAXED);
}

/* Pinning synchronises the device: the CUDA C++ Programming Guide's
 * "Implicit Synchronization" lists a page-locked host memory allocation
 * among the operations between which commands of different streams do not
 * overlap.  So it waits for every stream, host functions included: a
 * library that pins inside a stream-ordered call hangs behind another
 * stream's blocked host function (until GEO_EMU_TIMEOUT, then aborts). */
cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags)
{
    (void)flags;
    emu_drain_all("cudaHostAlloc's device synchronisation");
    emu_count(&emu_n_pin);
    return emu_alloc(ptr, bytes, 1);
}

/* As CUDA's, it waits for every stream of the device: one stream stuck (a
 * collective whose peer died) holds it, whoever owns that stream. */
cudaError_t cudaFreeHost(void *ptr)
{
    if (ptr == NULL)
        return cudaSuccess;
    emu_count(&emu_n_unpin);
    emu_drain_all("cudaFreeHost's device synchronisation");
    return emu_release(ptr, 1);
}

void geoEmuPinnedCounts(unsigned long *allocs, unsigned long *frees);
void geoEmuPinnedCounts(unsigned long *allocs, unsigned long *frees)
{
    *allocs = __atomic_load_n(&emu_n_pin, __ATOMIC_RELAXED);
    *frees = __atomic_load_n(&emu_n_unpin, __ATOMIC_RELAXED);
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags)
{
    if (dev == NULL || flags != 0)
        return emu_error(cudaErrorInvalidValue);
    pthread_mutex_lock(&emu_lock);
    emuAlloc *a = emu_find(host);
    int ok = a != NULL && a->host;
    pthread_mutex_unlock(&emu_lock);
    if (!ok)
        return emu_error(cudaErrorInvalidValue);
    *dev = host;
    return cudaSuccess;
}

static int emu_is_device(const void *p)
{
    pthread_mutex_lock(&emu_lock);
    emuAlloc *a = emu_find(p);
    int r = a != NULL && !a->host;
    pthread_mutex_unlock(&emu_lock);
    return r;
}

/* A copy whose kind contradicts its pointers is undefined in CUDA: here an
 * error, with the reason on stderr. */
static int emu_kind_ok(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    if ((unsigned)kind > cudaMemcpyDefault || (bytes && (dst == NULL || src == NULL)))
        return 0;
    if (bytes == 0 || kind == cudaMemcpyDefault)
        return 1;
    int want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    int want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    if (emu_is_device(src) == want_src && emu_is_device(dst) == want_dst)
        return 1;
    fprintf(stderr, "cuda emulation: copy of %zu bytes from %s %p to %s %p with kind %d\n",
            bytes, emu_is_device(src) ? "device" : "host", src,
            emu_is_device(dst) ? "device" : "host", dst, (int)kind);
    return 0;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    if (!emu_kind_ok(dst, src, bytes, kind))
        return emu_error(cudaErrorInvalidValue);
    emu_count(&emu_n_copy);
    if (bytes && (emu_is_pageable(dst) || emu_is_pageable(src))) {
        emu_drain(emu_stream(stream), "cudaMemcpyAsync with pageable memory");
        memmove(dst, src, bytes);
        return cudaSuccess;
    }
    emuOp *op = emu_op(run_copy);
    if (op) {
        op->dst = dst;
        op->src = src;
        op->bytes = bytes;
    }
    return emu_enqueue(stream, op);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    if (!emu_kind_ok(dst, src, bytes, kind))
        return emu_error(cudaErrorInvalidValue);
    emu_drain(emu_stream(NULL), "cudaMemcpy");
    if (bytes)
        memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream)
{
    if (bytes && ptr == NULL)
        return emu_error(cudaErrorInvalidValue);
    if (bytes && emu_is_pageable(ptr)) {
        fprintf(stderr, "cuda emulation: cudaMemsetAsync of %p, which is no device memory\n", ptr);
        return emu_error(cudaErrorInvalidValue);
    }
    emuOp *op = emu_op(run_set);
    if (op) {
        op->dst = ptr;
        op->value = value;
        op->bytes = bytes;
    }
    return emu_enqueue(stream, op);
}

cudaError_t cudaMemset(void *ptr, int value, size_t bytes)
{
    cudaError_t e = cudaMemsetAsync(ptr, value, bytes, NULL);
    if (e == cudaSuccess)
        emu_drain(emu_stream(NULL), "cudaMemset");
    return e;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (event == NULL)
        return emu_error(cudaErrorInvalidValue);
    *event = calloc(1, sizeof(struct CUevent_st));
    if (*event == NULL)
        return emu_error(cudaErrorMemoryAllocation);
    (*event)->dev = emu_cur_dev;
    (*event)->flags = flags;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    if (event == NULL)
        return emu_error(cudaErrorInvalidResourceHandle);
    /* CUDA releases a pending event when it completes: the last queued
     * operation that points at it frees it */
    pthread_mutex_lock(&emu_lock);
    event->destroyed = 1;
    int last = event->refs == 0;
    pthread_mutex_unlock(&emu_lock);
    if (last)
        free(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (event == NULL)
        return emu_error(cudaErrorInvalidResourceHandle);
    struct CUstream_st *s = emu_stream(stream);
    if (s->dev >= 0 && s->dev != event->dev) {
        fprintf(stderr, "cuda emulation: cudaEventRecord of an event of device %d on a stream "
                "of device %d\n", event->dev, s->dev);
        return emu_error(cudaErrorInvalidResourceHandle);
    }
    emuOp *op = emu_op(run_record);
    if (op == NULL)
        return emu_error(cudaErrorMemoryAllocation);
    op->ev = event;
    pthread_mutex_lock(&emu_lock);
    op->gen = ++event->recorded;
    event->refs++;
    pthread_mutex_unlock(&emu_lock);
    return emu_enqueue(stream, op);
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    if (event == NULL)
        return emu_error(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&emu_lock);
    int done = event->completed >= event->recorded;
    if (done && emu_query_lag() > 0 && event->recorded > 0) {
        if (event->lag_gen != event->recorded) {
            event->lag_gen = event->recorded;
            event->lag_left = emu_query_lag();
        }
        if (event->lag_left > 0) {
            event->lag_left--;
            done = 0;
        }
    }
    pthread_mutex_unlock(&emu_lock);
    return done ? cudaSuccess : emu_error(cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    if (event == NULL)
        return emu_error(cudaErrorInvalidResourceHandle);
    double deadline = emu_now() + emu_timeout();
    pthread_mutex_lock(&emu_lock);
    unsigned long want = event->recorded;
    while (event->completed < want)
        if (!emu_wait_until(deadline)) {
            pthread_mutex_unlock(&emu_lock);
            emu_die("cudaEventSynchronize");
        }
    pthread_mutex_unlock(&emu_lock);
    emu_pools_sync();
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (ms == NULL)
        return emu_error(cudaErrorInvalidValue);
    if (start == NULL || end == NULL || (start->flags & cudaEventDisableTiming) ||
        (end->flags & cudaEventDisableTiming))
        return emu_error(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&emu_lock);
    cudaError_t e = cudaSuccess;
    if (start->recorded == 0 || end->recorded == 0)
        e = cudaErrorInvalidResourceHandle;
    else if (start->completed < start->recorded || end->completed < end->recorded)
        e = cudaErrorNotReady;
    else
        *ms = (float)((end->t - start->t) * 1e3);
    pthread_mutex_unlock(&emu_lock);
    return emu_error(e);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    (void)flags;
    if (stream == NULL)
        return emu_error(cudaErrorInvalidValue);
    *stream = emu_stream_new();
    return *stream ? cudaSuccess : emu_error(cudaErrorMemoryAllocation);
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    struct CUstream_st *s = stream;
    if (s == NULL || s == emu_null_stream)
        return emu_error(cudaErrorInvalidResourceHandle);
    /* CUDA lets queued work finish: so do we, then the worker ends */
    emu_drain(s, "cudaStreamDestroy");
    pthread_mutex_lock(&emu_lock);
    s->stop = 1;
    struct CUstream_st **pp = &emu_streams;
    while (*pp && *pp != s)
        pp = &(*pp)->next_stream;
    if (*pp)
        *pp = s->next_stream;
    pthread_cond_broadcast(&emu_cv);
    pthread_mutex_unlock(&emu_lock);
    pthread_join(s->thread, NULL);
    free(s);
    const char *stats = getenv("GEO_EMU_STATS");
    if (stats && strcmp(stats, "1") == 0)
        fprintf(stderr, "cuda emulation stats: pid %ld: %lu kernel launches, %lu stream waits "
                "on a word, %lu host functions, %lu async copies, %lu device allocations\n",
                (long)getpid(),
                __atomic_load_n(&emu_n_launch, __ATOMIC_RELAXED),
                __atomic_load_n(&emu_n_wait_value, __ATOMIC_RELAXED),
                __atomic_load_n(&emu_n_host_fn, __ATOMIC_RELAXED),
                __atomic_load_n(&emu_n_copy, __ATOMIC_RELAXED),
                __atomic_load_n(&emu_n_dev_alloc, __ATOMIC_RELAXED));
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    emu_drain(emu_stream(stream), "cudaStreamSynchronize");
    emu_pools_sync();
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    struct CUstream_st *s = emu_stream(stream);
    pthread_mutex_lock(&emu_lock);
    int done = s->completed == s->enqueued;
    pthread_mutex_unlock(&emu_lock);
    return done ? cudaSuccess : emu_error(cudaErrorNotReady);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    (void)flags;
    if (event == NULL)
        return emu_error(cudaErrorInvalidResourceHandle);
    emuOp *op = emu_op(run_wait_event);
    if (op == NULL)
        return emu_error(cudaErrorMemoryAllocation);
    op->ev = event;
    pthread_mutex_lock(&emu_lock);
    op->gen = event->recorded; /* the record it waits for: the latest one */
    event->refs++;
    pthread_mutex_unlock(&emu_lock);
    return emu_enqueue(stream, op);
}

/* Capture is a flag on the stream: what is enqueued meanwhile still runs
 * at once (graphs are not emulated, and EndCapture says so), but the
 * library sees a capturing stream as on a GPU and must refuse what cannot
 * be captured. */
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
    if (status == NULL)
        return emu_error(cudaErrorInvalidValue);
    struct CUstream_st *s = emu_stream(stream);
    *status = s && __atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    (void)mode;
    struct CUstream_st *s = emu_stream(stream);
    if (s == NULL || stream == NULL)
        return emu_error(cudaErrorStreamCaptureUnsupported);
    __atomic_store_n(&s->capturing, 1, __ATOMIC_RELEASE);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    struct CUstream_st *s = emu_stream(stream);
    if (graph)
        *graph = NULL;
    if (s == NULL || !__atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE))
        return emu_error(cudaErrorIllegalState);
    __atomic_store_n(&s->capturing, 0, __ATOMIC_RELEASE);
    return emu_error(cudaErrorNotSupported);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *arg)
{
    if (fn == NULL)
        return emu_error(cudaErrorInvalidValue);
    emu_count(&emu_n_host_fn);
    emuOp *op = emu_op(run_host_fn);
    if (op) {
        op->fn = fn;
        op->arg = arg;
    }
    return emu_enqueue(stream, op);
}

cudaError_t cudaDeviceSynchronize(void)
{
    emu_drain_all("cudaDeviceSynchronize");
    emu_pools_sync();
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = emu_last_error;
    emu_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return emu_last_error; }

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (emulated: one device)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle (emulated)";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNotSupported: return "operation not supported (emulated)";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version (emulated)";
    default: return "unknown error (emulated)";
    }
}

/* ---- the driver: cuStreamWaitValue32 through the entry-point query ------- */

static CUresult emu_cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                        unsigned int flags)
{
    if (addr == 0)
        return CUDA_ERROR_INVALID_VALUE;
    emu_count(&emu_n_wait_value);
    emuOp *op = emu_op(run_wait_value);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->word = (volatile cuuint32_t *)(uintptr_t)addr;
    op->value = (int)value;
    op->flags = flags;
    return emu_enqueue((cudaStream_t)stream, op) == cudaSuccess ? CUDA_SUCCESS
                                                                  : CUDA_ERROR_OUT_OF_MEMORY;
}

static cudaError_t emu_entry_point(const char *symbol, void **fn,
                                   enum cudaDriverEntryPointQueryResult *q)
{
    if (symbol == NULL || fn == NULL)
        return emu_error(cudaErrorInvalidValue);
    *fn = NULL;
    const char *hide = getenv("GEO_EMU_NO_WAIT_VALUE");
    if (strcmp(symbol, "cuStreamWaitValue32") == 0 && !(hide && strcmp(hide, "1") == 0))
        *fn = (void *)emu_cuStreamWaitValue32;
    if (q)
        *q = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *q)
{
    (void)version;
    (void)flags;
    return emu_entry_point(symbol, fn, q);
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *q)
{
    (void)flags;
    return emu_entry_point(symbol, fn, q);
}
