/* Device-buffer all-reduce through GeoCCL on a lent GPU (tests/device/run.sh):
 *
 *   dev_allreduce NRANKS [MIB [CODEC]]
 *
 * forks NRANKS processes on the current GPU, each its own region
 * (GEOCCL_REGION=r<i>), so every all-reduce takes the cross-region device
 * path: NVIDIA's reduce-scatter in the region, the exchange between
 * regions, NVIDIA's all-gather, all on the caller's stream.
 *
 * CODEC "queued:<codec>": four compressed calls queued back to back, a
 * hash of their results printed (see check_queued).
 *
 * CODEC "pinned": float all-reduces of growing sizes (odd ones too, which
 * need a padded buffer), then the same sizes again; under the CPU
 * emulation (geoEmuPinnedCounts, geoEmuDeviceAllocCount) no pinned memory
 * may be freed during the calls, and the second pass may pin nothing new
 * nor allocate device memory from the driver (staging comes from the
 * communicator's pool, which keeps it across synchronisations).
 *
 * CODEC "abort": with one stream of the process stuck (a host function that
 * waits, as a collective whose peer died would) and the communicator's own
 * stream stuck before a queued all-reduce (which needs a larger staging
 * slot), the all-reduce must be enqueued and ncclCommAbort must return
 * within 10 s (a watchdog fails the rank at 20 s); then the streams are let
 * go and must finish.
 *
 * CODEC "hostfn": all-reduces beside another stream's blocked host
 * function must finish: no wait may hold a thread of CUDA's (see
 * check_host_fn_held).
 *
 * CODEC "efreuse": error-feedback residuals follow registrations
 * (geocclCommRegisterErrorFeedback), not addresses (see check_ef_reuse).
 *
 * "events" (alone): cudaEventElapsedTime's answers (see check_events).
 *
 * CODEC "staged": broadcast, all-gather, reduce-scatter, reduce and
 * all-to-all on device buffers across the regions (GeoCCL stages them
 * through the host), exact results checked; no figures.
 *
 * Without CODEC: exact transfer; checks sum and avg results on odd and even
 * counts against the exact sums (1, 7, 1000, 2^20 and 2^20 + 3;
 * DEV_ALLREDUCE_EXACT_BIG=N: N in place of the last two).  DEV_ALLREDUCE_OTHER_DEVICE=1 (needs 2
 * devices): the communicator and stream are on device 1 and each of these
 * calls is made with device 0 current, as from a thread that never set the
 * device; the calls must work and leave device 0 current.  With CODEC (int8, fp16, bf16, int4, sign,
 * topk:<k>, lossless; set with geocclCommSetCompression): the chunks are
 * encoded on the GPU (lossless: on the host); checks that every rank holds
 * bit-identical results (a hash per rank, compared by the parent), over two
 * calls on the same buffer (the second uses the error-feedback residuals),
 * and, for fp16, bf16, int8 and int4, that the relative RMS error against
 * the exact sum is within the codec's bound (DEV_ALLREDUCE_MAX_COUNT=N
 * leaves out the counts above N).  Then times MIB-sized float
 * all-reduces and prints the figures.  Exit 0 when every rank passed; 77
 * without a GPU, 1 when CUDA is unusable on a machine with a driver (too
 * old a driver: gpu_probe.h).  Prints PASS/FAIL lines. */
#define GEOCCL_HAVE_CUDA_RUNTIME 1
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "geoccl.h"
#include "gpu_probe.h"

#define CK(call)                                                                \
    do {                                                                        \
        cudaError_t e_ = (call);                                                \
        if (e_ != cudaSuccess) {                                                \
            fprintf(stderr, "rank %d: %s: %s\n", rank, #call, cudaGetErrorString(e_)); \
            return 1;                                                           \
        }                                                                       \
    } while (0)
#define NK(call)                                                                \
    do {                                                                        \
        ncclResult_t r_ = (call);                                               \
        if (r_ != ncclSuccess) {                                                \
            fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, #call,              \
                    ncclGetErrorString(r_), ncclGetLastError(comm));            \
            return 1;                                                           \
        }                                                                       \
    } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Rank r's element i: small integers, so float sums are exact. */
static float value(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 13) % 61) - 30); }

/* The hashes the ranks report: [case][rank]. */
#define MAX_CASES 16
static uint64_t *hashes;
/* The unique id, made by rank 0 (the bootstrap root is a thread of the
 * process that makes it, and a process that forks must not have threads)
 * and read by the others once ready is set (shared memory). */
static struct {
    ncclUniqueId id;
    int ready; /* 1: id is there; -1: rank 0 could not make it */
} *shared_id;

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Relative RMS error a codec may leave after one compressed all-reduce of
 * these values (two quantisations: the partial and the reduced part);
 * negative: not checked (sign, topk keep too little for one call). */
static double codec_bound(const char *codec)
{
    if (strcmp(codec, "lossless") == 0)
        return 0;
    if (strcmp(codec, "fp16") == 0)
        return 2e-3;
    if (strcmp(codec, "bf16") == 0)
        return 1e-2;
    if (strcmp(codec, "int8") == 0)
        return 3e-2;
    if (strcmp(codec, "int4") == 0)
        return 0.6;
    return -1;
}

/* Compressed runs: bit-identical results everywhere, error within bound. */
static int check_codec(int rank, int nranks, ncclComm_t comm, cudaStream_t s, const char *codec)
{
    const size_t counts[] = {1000, (1 << 20) + 3, 1 << 22};
    const double bound = codec_bound(codec);
    /* DEV_ALLREDUCE_MAX_COUNT: the larger counts are left out (the CPU
     * emulation of the kernels in make check cannot afford them) */
    const char *mc = getenv("DEV_ALLREDUCE_MAX_COUNT");
    const size_t max_count = mc && mc[0] ? (size_t)strtoull(mc, NULL, 10) : (size_t)-1;
    int bad = 0, cs = 0;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (int avg = 0; avg < 2 && counts[c] <= max_count; avg++) {
            /* one buffer for both calls, registered: the second call uses
             * the residuals the first left */
            float *d;
            void *reg;
            CK(cudaMalloc((void **)&d, counts[c] * sizeof(float)));
            NK(geocclCommRegisterErrorFeedback(comm, d, counts[c] * sizeof(float), &reg));
            for (int call = 0; call < 2; call++, cs++) {
                size_t n = counts[c];
                float *h = malloc(n * sizeof(float));
                for (size_t i = 0; i < n; i++)
                    h[i] = value(rank, i) * 0.37f + (float)(call + 1);
                CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
                NK(ncclAllReduce(d, d, n, ncclFloat, avg ? ncclAvg : ncclSum, comm, s));
                CK(cudaStreamSynchronize(s));
                CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
                hashes[cs * 16 + rank] = hash_bytes(h, n * sizeof(float));
                double se = 0, sw = 0;
                size_t nonfinite = 0;
                for (size_t i = 0; i < n; i++) {
                    double want = 0;
                    for (int r = 0; r < nranks; r++)
                        want += value(r, i) * 0.37f + (float)(call + 1);
                    if (avg)
                        want /= nranks;
                    if (!isfinite(h[i]))
                        nonfinite++;
                    se += (h[i] - want) * (h[i] - want);
                    sw += want * want;
                }
                double rel = sw > 0 ? sqrt(se / sw) : 0;
                if (nonfinite || (bound >= 0 && rel > bound + 1e-7)) {
                    fprintf(stderr, "rank %d: %s %s count %zu call %d: relative RMS error %.3g "
                            "(bound %.3g), %zu non-finite\n", rank, codec, avg ? "avg" : "sum",
                            n, call, rel, bound, nonfinite);
                    bad = 1;
                }
                if (rank == 0 && call == 1)
                    printf("dev_allreduce: %s %s count %zu: relative RMS error %.3g\n", codec,
                           avg ? "avg" : "sum", n, rel);
                free(h);
            }
            NK(geocclCommDeregisterErrorFeedback(comm, reg));
            cudaFree(d);
        }
    return bad;
}

/* dev_allreduce N MIB hostfn: a host function of someone else (another
 * library, another communicator's collective whose peer is late) blocks on
 * another stream until this rank's all-reduce has finished.  Where CUDA
 * runs every host function of the context on one thread (the emulation
 * does), a wait made of a host function would queue behind it and the
 * all-reduce could never finish: a deadlock.  The all-reduce (the GPU
 * codecs' path and the host exchange's) must finish with exact results
 * within 20 s (times GEOCCL_TEST_TIME_SCALE under the sanitizers, whose
 * emulated kernels run 5-10x slower, on a machine running another test
 * beside); the blocked host function is let go either way, at the latest
 * 10 s after that. */
static volatile int hold_release;
static double hold_limit = 20;

static void CUDART_CB hold_fn(void *arg)
{
    (void)arg;
    for (int i = 0; i < (int)((hold_limit + 10) * 1000) &&
                    !__atomic_load_n(&hold_release, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
}

static int check_host_fn_held(int rank, int nranks, ncclComm_t comm, cudaStream_t s)
{
    const size_t n = 200003;
    cudaStream_t other;
    float *h = malloc(n * sizeof(float)), *d;
    int32_t *hi = malloc(n * sizeof(int32_t)), *di;
    int bad = 0;
    CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&d, n * sizeof(float)));
    CK(cudaMalloc((void **)&di, n * sizeof(int32_t)));
    for (size_t i = 0; i < n; i++) {
        h[i] = value(rank, i);
        hi[i] = (int32_t)i + rank;
    }
    CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(di, hi, n * sizeof(int32_t), cudaMemcpyHostToDevice));
    const char *scale = getenv("GEOCCL_TEST_TIME_SCALE");
    if (scale && atof(scale) > 1)
        hold_limit = 20 * atof(scale);
    double t0 = now();
    CK(cudaLaunchHostFunc(other, hold_fn, NULL));
    NK(ncclAllReduce(d, d, n, ncclFloat, ncclSum, comm, s));     /* GPU codecs' path */
    NK(ncclAllReduce(di, di, n, ncclInt32, ncclSum, comm, s));   /* host exchange */
    cudaError_t e;
    while ((e = cudaStreamQuery(s)) == cudaErrorNotReady && now() - t0 < hold_limit)
        usleep(1000);
    double t = now() - t0;
    __atomic_store_n(&hold_release, 1, __ATOMIC_RELEASE);
    CK(cudaStreamSynchronize(other));
    CK(cudaStreamSynchronize(s));
    if (e != cudaSuccess || t >= hold_limit) {
        fprintf(stderr, "rank %d: hostfn: the all-reduces did not finish within %.0f s while "
                "another stream's host function was blocked (%s)\n", rank, hold_limit,
                e != cudaSuccess ? cudaGetErrorString(e) : "the calls themselves blocked");
        bad = 1;
    }
    CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hi, di, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        int32_t iwant = 0;
        for (int r = 0; r < nranks; r++) {
            want += value(r, i);
            iwant += (int32_t)i + r;
        }
        wrong += (h[i] != want) + (hi[i] != iwant);
    }
    if (wrong) {
        fprintf(stderr, "rank %d: hostfn: %zu wrong elements\n", rank, wrong);
        bad = 1;
    }
    if (rank == 0)
        printf("dev_allreduce: hostfn: all-reduces done in %.3f s beside a blocked host "
               "function, %s\n", t, bad ? "WRONG" : "exact");
    hashes[rank] = 0;
    cudaFree(d);
    cudaFree(di);
    cudaStreamDestroy(other);
    free(h);
    free(hi);
    return bad;
}

/* dev_allreduce N MIB efreuse: int8 error feedback on device buffers
 * follows registrations, not addresses.  The same input all-reduced into a
 * registered buffer twice: the second result differs (its residual was
 * used); the buffer deregistered and registered again, as the memory of
 * another tensor that a caching allocator placed at the same address: its
 * first result is the very first one (no residual inherited);
 * unregistered, two calls both give that result too (no residual kept). */
static int ef_call(int rank, ncclComm_t comm, cudaStream_t s, float *d, float *h, size_t n,
                   uint64_t *hash)
{
    for (size_t i = 0; i < n; i++)
        h[i] = value(rank, i) * 0.37f;
    CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    NK(ncclAllReduce(d, d, n, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    *hash = hash_bytes(h, n * sizeof(float));
    return 0;
}

static int check_ef_reuse(int rank, ncclComm_t comm, cudaStream_t s)
{
    const size_t n = 30000;
    float *h = malloc(n * sizeof(float)), *d;
    uint64_t h0, h1, h2, u1, u2;
    void *reg, *reg2;
    int bad = 0;
    NK(geocclCommSetCompression(comm, "int8"));
    CK(cudaMalloc((void **)&d, n * sizeof(float)));
    NK(geocclCommRegisterErrorFeedback(comm, d, n * sizeof(float), &reg));
    if (ef_call(rank, comm, s, d, h, n, &h0) || ef_call(rank, comm, s, d, h, n, &h1))
        return 1;
    NK(geocclCommDeregisterErrorFeedback(comm, reg));
    NK(geocclCommRegisterErrorFeedback(comm, d, n * sizeof(float), &reg2));
    if (ef_call(rank, comm, s, d, h, n, &h2))
        return 1;
    NK(geocclCommDeregisterErrorFeedback(comm, reg2));
    if (ef_call(rank, comm, s, d, h, n, &u1) || ef_call(rank, comm, s, d, h, n, &u2))
        return 1;
    if (h1 == h0) {
        fprintf(stderr, "rank %d: efreuse: the second call used no residual\n", rank);
        bad = 1;
    }
    if (h2 != h0) {
        fprintf(stderr, "rank %d: efreuse: a new registration of the same memory picked up "
                "the old residual\n", rank);
        bad = 1;
    }
    if (u1 != h0 || u2 != h0) {
        fprintf(stderr, "rank %d: efreuse: an unregistered buffer kept a residual\n", rank);
        bad = 1;
    }
    hashes[rank] = h0 ^ h1 ^ h2;
    if (rank == 0 && !bad)
        printf("dev_allreduce: efreuse: residuals follow registrations, not addresses\n");
    cudaFree(d);
    free(h);
    return bad;
}

/* The emulation's counts of cudaHostAlloc and cudaFreeHost calls
 * (tests/device/dev_emu_runtime.c); absent with the real runtime. */
void geoEmuPinnedCounts(unsigned long *allocs, unsigned long *frees) __attribute__((weak));
void geoEmuDeviceAllocCount(unsigned long *allocs) __attribute__((weak));

static int check_pinned(int rank, int nranks, ncclComm_t comm, cudaStream_t s)
{
    const size_t sizes[] = {1000, 30001, 300000, 1000001};
    const int nsz = (int)(sizeof(sizes) / sizeof(sizes[0]));
    unsigned long a0 = 0, f0 = 0, a1 = 0, f1 = 0, a2 = 0, f2 = 0, d1 = 0, d2 = 0;
    float *h = malloc(sizes[nsz - 1] * sizeof(float)), *d;
    int bad = 0;
    CK(cudaMalloc((void **)&d, sizes[nsz - 1] * sizeof(float)));
    if (geoEmuPinnedCounts)
        geoEmuPinnedCounts(&a0, &f0);
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < nsz; k++) {
            size_t n = sizes[k];
            for (size_t i = 0; i < n; i++)
                h[i] = value(rank, i);
            CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
            NK(ncclAllReduce(d, d, n, ncclFloat, ncclSum, comm, s));
            CK(cudaStreamSynchronize(s));
            CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
            size_t wrong = 0;
            for (size_t i = 0; i < n; i++) {
                float want = 0;
                for (int r = 0; r < nranks; r++)
                    want += value(r, i);
                wrong += h[i] != want;
            }
            if (wrong) {
                fprintf(stderr, "rank %d: pinned: count %zu: %zu wrong elements\n", rank, n,
                        wrong);
                bad = 1;
            }
        }
        if (geoEmuPinnedCounts)
            geoEmuPinnedCounts(pass == 0 ? &a1 : &a2, pass == 0 ? &f1 : &f2);
        if (geoEmuDeviceAllocCount)
            geoEmuDeviceAllocCount(pass == 0 ? &d1 : &d2);
    }
    if (geoEmuPinnedCounts) {
        if (f2 != f0) {
            fprintf(stderr, "rank %d: pinned: %lu cudaFreeHost calls during the all-reduces\n",
                    rank, f2 - f0);
            bad = 1;
        }
        if (a2 != a1) {
            fprintf(stderr, "rank %d: pinned: the repeated sizes pinned %lu new buffers\n", rank,
                    a2 - a1);
            bad = 1;
        }
        if (geoEmuDeviceAllocCount && d2 != d1) {
            fprintf(stderr, "rank %d: pinned: the repeated sizes allocated device memory from "
                    "the driver %lu times\n", rank, d2 - d1);
            bad = 1;
        }
        if (rank == 0)
            printf("dev_allreduce: pinned: %lu pinned allocations for the first pass, %lu for "
                   "the second, %lu frees; %lu device allocations in the second pass\n",
                   a1 - a0, a2 - a1, f2 - f0, d2 - d1);
    } else if (rank == 0) {
        printf("dev_allreduce: pinned: results checked; pinned-memory counts need the CPU "
               "emulation\n");
    }
    cudaFree(d);
    free(h);
    return bad;
}

/* Released by the main thread once ncclCommAbort returned; a stuck host
 * function gives up by itself after 60 s so that a failing run ends. */
static volatile int abort_release;

static void CUDART_CB stuck_fn(void *arg)
{
    (void)arg;
    for (int i = 0; i < 60000 && !__atomic_load_n(&abort_release, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
}

static void *abort_watchdog(void *arg)
{
    int rank = *(int *)arg;
    sleep(20);
    fprintf(stderr, "rank %d: FAIL: ncclAllReduce or ncclCommAbort still blocked after 20 s "
            "while a stream was stuck\n", rank);
    fflush(NULL);
    _exit(3);
    return NULL;
}

static int check_abort(int rank, int nranks, ncclComm_t comm, cudaStream_t s)
{
    enum { AN = 100000 };
    float *h = malloc(AN * sizeof(float)), *d;
    int *di;
    cudaStream_t other;
    (void)nranks;
    /* a compressed call first: pinned slots, the flag and device residuals
     * exist when the communicator is aborted */
    NK(geocclCommSetCompression(comm, "int8"));
    for (size_t i = 0; i < AN; i++)
        h[i] = value(rank, i) * 0.37f;
    CK(cudaMalloc((void **)&d, AN * sizeof(float)));
    CK(cudaMalloc((void **)&di, AN * sizeof(int)));
    CK(cudaMemcpy(d, h, AN * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemset(di, 0, AN * sizeof(int)));
    NK(ncclAllReduce(d, d, AN, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    /* from here on nothing may block on the stuck streams: neither the
     * enqueue (a staging slot that grows must not free pinned memory) nor
     * the abort */
    pthread_t wd;
    int wrank = rank;
    if (pthread_create(&wd, NULL, abort_watchdog, &wrank) != 0)
        return 1;
    /* another stream of the process, stuck */
    CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    CK(cudaLaunchHostFunc(other, stuck_fn, NULL));
    /* our stream stuck before a queued cross-region all-reduce (int32: the
     * host exchange, whose enqueue launches no kernel) */
    CK(cudaLaunchHostFunc(s, stuck_fn, NULL));
    NK(ncclAllReduce(di, di, AN, ncclInt32, ncclSum, comm, s));
    double t0 = now();
    ncclResult_t r = ncclCommAbort(comm);
    double t = now() - t0;
    pthread_cancel(wd);
    pthread_join(wd, NULL);
    __atomic_store_n(&abort_release, 1, __ATOMIC_RELEASE);
    CK(cudaStreamSynchronize(other));
    CK(cudaStreamSynchronize(s));
    cudaStreamDestroy(other);
    cudaFree(d);
    cudaFree(di);
    free(h);
    int ok = r == ncclSuccess && t < 10;
    printf("%s: rank %d: ncclCommAbort with two streams stuck returned %s in %.3f s\n",
           ok ? "PASS" : "FAIL", rank, ncclGetErrorString(r), t);
    return !ok;
}

/* dev_allreduce N MIB staged: the other collectives across regions on
 * device buffers (GeoCCL stages them through the host), exact results. */
static int check_one(int rank, const char *what, const float *got, size_t n,
                     float (*want)(int, int, size_t), int nranks)
{
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want(rank, nranks, i))
            wrong++;
    if (wrong)
        fprintf(stderr, "rank %d: %s: %zu of %zu elements wrong\n", rank, what, wrong, n);
    return wrong != 0;
}

#define SN 100003
static float w_bcast(int rank, int nranks, size_t i) { (void)rank; return value(nranks - 1, i); }
static float w_gather(int rank, int nranks, size_t i)
{
    (void)rank;
    (void)nranks;
    return value((int)(i / SN), i % SN);
}
static float w_rs(int rank, int nranks, size_t i)
{
    float t = 0;
    for (int r = 0; r < nranks; r++)
        t += value(r, (size_t)rank * SN + i);
    return t;
}
static float w_reduce(int rank, int nranks, size_t i)
{
    float t = 0;
    (void)rank;
    for (int r = 0; r < nranks; r++)
        t += value(r, i);
    return t;
}
static float w_a2a(int rank, int nranks, size_t i)
{
    (void)nranks;
    return value((int)(i / SN), (size_t)rank * SN + i % SN);
}

static int check_staged(int rank, int nranks, ncclComm_t comm, cudaStream_t s)
{
    const size_t N = (size_t)nranks, big = SN * N;
    float *h = malloc(big * sizeof(float)), *d_in, *d_out;
    int bad = 0;
    CK(cudaMalloc((void **)&d_in, big * sizeof(float)));
    CK(cudaMalloc((void **)&d_out, big * sizeof(float)));
    for (size_t i = 0; i < big; i++)
        h[i] = value(rank, i);
    CK(cudaMemcpy(d_in, h, big * sizeof(float), cudaMemcpyHostToDevice));

    /* broadcast from the last rank, in place */
    CK(cudaMemcpy(d_out, d_in, SN * sizeof(float), cudaMemcpyDeviceToDevice));
    NK(ncclBroadcast(d_out, d_out, SN, ncclFloat, nranks - 1, comm, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h, d_out, SN * sizeof(float), cudaMemcpyDeviceToHost));
    bad |= check_one(rank, "broadcast", h, SN, w_bcast, nranks);
    /* all-gather */
    NK(ncclAllGather(d_in, d_out, SN, ncclFloat, comm, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h, d_out, big * sizeof(float), cudaMemcpyDeviceToHost));
    bad |= check_one(rank, "all-gather", h, big, w_gather, nranks);
    /* reduce-scatter */
    NK(ncclReduceScatter(d_in, d_out, SN, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h, d_out, SN * sizeof(float), cudaMemcpyDeviceToHost));
    bad |= check_one(rank, "reduce-scatter", h, SN, w_rs, nranks);
    /* reduce to rank 0 */
    NK(ncclReduce(d_in, d_out, SN, ncclFloat, ncclSum, 0, comm, s));
    CK(cudaStreamSynchronize(s));
    if (rank == 0) {
        CK(cudaMemcpy(h, d_out, SN * sizeof(float), cudaMemcpyDeviceToHost));
        bad |= check_one(rank, "reduce", h, SN, w_reduce, nranks);
    }
    /* all-to-all */
    NK(ncclAlltoAll(d_in, d_out, SN, ncclFloat, comm, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h, d_out, big * sizeof(float), cudaMemcpyDeviceToHost));
    bad |= check_one(rank, "all-to-all", h, big, w_a2a, nranks);
    if (rank == 0)
        printf("dev_allreduce: staged broadcast, all-gather, reduce-scatter, reduce, all-to-all "
               "of %d x %d floats: %s\n", SN, nranks, bad ? "wrong results" : "correct");
    cudaFree(d_in);
    cudaFree(d_out);
    free(h);
    return bad;
}

/* dev_allreduce N MIB queued:CODEC: four compressed all-reduces queued on
 * the stream back to back (DEV_ALLREDUCE_SYNC_EACH set: each waited for
 * before the next); rank 0 prints a hash of the results.  With stochastic
 * rounding (GEOCCL_COMPRESS_STOCHASTIC) the hash must not depend on the
 * waiting: each call rounds with its own sequence number; nor on a
 * compression set for later calls while these are queued
 * (DEV_ALLREDUCE_SWITCH).  tests/device/run_dev_emu.sh compares.  100000
 * elements a call, or DEV_ALLREDUCE_MAX_COUNT when that is smaller. */
static int check_queued(int rank, ncclComm_t comm, cudaStream_t s)
{
    enum { K = 4 };
    size_t QN = 100000;
    const char *mc = getenv("DEV_ALLREDUCE_MAX_COUNT");
    if (mc && strtoul(mc, NULL, 10) > 0 && strtoul(mc, NULL, 10) < QN)
        QN = strtoul(mc, NULL, 10);
    const int sync_each = getenv("DEV_ALLREDUCE_SYNC_EACH") != NULL;
    float *h = malloc(QN * sizeof(float)), *d[K];
    uint64_t hash = 0;
    for (int k = 0; k < K; k++) {
        for (size_t i = 0; i < QN; i++)
            h[i] = value(rank, i) * 0.37f + (float)k;
        CK(cudaMalloc((void **)&d[k], QN * sizeof(float)));
        CK(cudaMemcpy(d[k], h, QN * sizeof(float), cudaMemcpyHostToDevice));
    }
    for (int k = 0; k < K; k++) {
        NK(ncclAllReduce(d[k], d[k], QN, ncclFloat, ncclSum, comm, s));
        if (sync_each)
            CK(cudaStreamSynchronize(s));
    }
    /* DEV_ALLREDUCE_SWITCH=SPEC: the next calls' compression, set while
     * these may still be queued; it must not change them */
    const char *sw = getenv("DEV_ALLREDUCE_SWITCH");
    if (sw && sw[0])
        NK(geocclCommSetCompression(comm, sw));
    CK(cudaStreamSynchronize(s));
    for (int k = 0; k < K; k++) {
        CK(cudaMemcpy(h, d[k], QN * sizeof(float), cudaMemcpyDeviceToHost));
        hash = hash * 1099511628211ull + hash_bytes(h, QN * sizeof(float));
        cudaFree(d[k]);
    }
    hashes[rank] = hash;
    if (rank == 0)
        printf("dev_allreduce: queued calls%s: hash %016llx\n", sync_each ? " (each waited for)"
               : "", (unsigned long long)hash);
    free(h);
    return 0;
}

/* "events": what the phase timing relies on from cudaEventElapsedTime, on
 * the emulated runtime as on CUDA: a never-recorded event and one made with
 * cudaEventDisableTiming are invalid handles; an event its stream has not
 * reached (behind a host function that waits) answers cudaErrorNotReady,
 * kept as the thread's last error; once reached, a time >= 0.  In-process. */
static volatile int events_gate;

static void CUDART_CB events_gate_fn(void *arg)
{
    (void)arg;
    for (int i = 0; i < 10000 && !__atomic_load_n(&events_gate, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
}

static int check_events(void)
{
    const int rank = 0;
    cudaStream_t s;
    cudaEvent_t a, b, nt;
    float ms = -1;
    const char *why = NULL;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming));
    if (cudaEventElapsedTime(&ms, a, b) != cudaErrorInvalidResourceHandle)
        why = "never-recorded events were not refused";
    cudaGetLastError();
    CK(cudaEventRecord(a, s));
    CK(cudaLaunchHostFunc(s, events_gate_fn, NULL));
    CK(cudaEventRecord(b, s));
    cudaError_t e = cudaEventElapsedTime(&ms, a, b);
    if (!why && e != cudaErrorNotReady)
        why = "an event the stream has not reached did not answer not ready";
    if (!why && cudaGetLastError() != cudaErrorNotReady)
        why = "its not-ready answer was not the thread's last error";
    __atomic_store_n(&events_gate, 1, __ATOMIC_RELEASE);
    CK(cudaStreamSynchronize(s));
    if (!why && (cudaEventElapsedTime(&ms, a, b) != cudaSuccess || !(ms >= 0)))
        why = "complete events gave no time";
    CK(cudaEventRecord(nt, s));
    CK(cudaStreamSynchronize(s));
    if (!why && cudaEventElapsedTime(&ms, a, nt) != cudaErrorInvalidResourceHandle)
        why = "an event made with cudaEventDisableTiming was not refused";
    cudaGetLastError();
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaEventDestroy(nt);
    cudaStreamDestroy(s);
    printf("%s: dev_allreduce events: cudaEventElapsedTime%s%s\n", why ? "FAIL" : "PASS",
           why ? ": " : " refuses what CUDA refuses", why ? why : "");
    return why != NULL;
}

/* The device path's phase times of the timed calls (geocclCommGetDeviceStats),
 * read once every call is counted (they are read when found complete;
 * nothing in the library waits for them): each phase non-negative, the
 * phases summing to the calls' span on the stream, that span within the
 * wall time of the calls, and every call counted.  0 when they hold. */
static int device_phases(int rank, int nranks, ncclComm_t comm, int iters, double wall,
                         geocclDeviceStats *ds)
{
    double t0 = now();
    (void)nranks;
    do {
        NK(geocclCommGetDeviceStats(comm, ds, sizeof(*ds)));
        if (ds->callsInFlight == 0)
            break;
        usleep(1000);
    } while (now() - t0 < 30);
    const double ph[] = {ds->secReduceScatter, ds->secEncode, ds->secCopyOut, ds->secWan,
                         ds->secCopyIn, ds->secDecode, ds->secAllGather, ds->secOther};
    double sum = 0;
    int neg = ds->secCall < 0 || ds->secExchange < 0;
    for (size_t i = 0; i < sizeof(ph) / sizeof(ph[0]); i++) {
        neg |= ph[i] < 0;
        sum += ph[i];
    }
    const char *why = ds->callsInFlight ? "calls still in flight after 30 s"
                      : ds->calls == 0 ? "no call timed"
                      : ds->calls + ds->callsUntimed != (unsigned long long)iters
                          ? "calls counted differ from calls made"
                      : neg ? "a negative time"
                      : sum > ds->secCall * (1 + 1e-6) + 1e-9 ? "phases sum past the calls' span"
                      : ds->secCall > wall * 1.01 + 1e-3 ? "the calls' span exceeds their wall time"
                      : ds->bytesWan == 0 ? "no WAN bytes"
                      : NULL;
    if (why) {
        fprintf(stderr, "rank %d: FAIL device phase times: %s (calls %llu, in flight %llu, "
                "untimed %llu of %d; span %.6f s, phases %.6f s, wall %.6f s)\n", rank, why,
                ds->calls, ds->callsInFlight, ds->callsUntimed, iters, ds->secCall, sum, wall);
        return 1;
    }
    return 0;
}

/* Rank 0's device phases per call, in seconds and as a share of the call's
 * span on the stream. */
static void print_phases(int nranks, const geocclDeviceStats *ds)
{
    const double k = ds->calls ? 1.0 / (double)ds->calls : 0;
    const double span = ds->secCall > 0 ? ds->secCall : 1;
    const struct {
        const char *name;
        double sec;
    } ph[] = {{"reduce-scatter", ds->secReduceScatter}, {"encode", ds->secEncode},
              {"copy out", ds->secCopyOut}, {"WAN wait", ds->secWan},
              {"copy in", ds->secCopyIn}, {"decode", ds->secDecode},
              {"all-gather", ds->secAllGather}, {"other", ds->secOther}};
    printf("dev_allreduce: rank 0 per call (%d processes sharing one GPU): device phases of "
           "%.6f s on the stream:", nranks, ds->secCall * k);
    for (size_t i = 0; i < sizeof(ph) / sizeof(ph[0]); i++)
        printf("%s %s %.6f s (%.1f%%)", i ? "," : "", ph[i].name, ph[i].sec * k,
               100.0 * ph[i].sec / span);
    printf("; exchange thread on the WAN %.6f s; WAN bytes %.0f encoded, %.0f raw "
           "(%llu calls timed)\n", ds->secExchange * k, (double)ds->bytesWan * k,
           (double)ds->bytesWanRaw * k, ds->calls);
}

static int rank_main(int rank, int nranks, size_t mib, const char *codec)
{
    ncclComm_t comm = NULL;
    ncclUniqueId id;
    char label[16];
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&shared_id->id);
        __atomic_store_n(&shared_id->ready, r == ncclSuccess ? 1 : -1, __ATOMIC_RELEASE);
        NK(r);
    }
    for (int waited = 0; __atomic_load_n(&shared_id->ready, __ATOMIC_ACQUIRE) == 0; waited++) {
        if (waited > 60 * 1000) {
            fprintf(stderr, "rank %d: no unique id from rank 0 within 60 s\n", rank);
            return 1;
        }
        usleep(1000);
    }
    if (shared_id->ready < 0)
        return 1;
    id = shared_id->id;
    snprintf(label, sizeof(label), "r%d", rank);
    setenv("GEOCCL_REGION", label, 1);
    /* DEV_ALLREDUCE_OTHER_DEVICE: everything on device 1 (see the top) */
    const int other = getenv("DEV_ALLREDUCE_OTHER_DEVICE") != NULL;
    CK(cudaSetDevice(other ? 1 : 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    NK(ncclCommInitRank(&comm, nranks, id, rank));
    int bad = 0;
    size_t counts[] = {1, 7, 1000, 1 << 20, (1 << 20) + 3};
    size_t ncounts = sizeof(counts) / sizeof(counts[0]);
    /* DEV_ALLREDUCE_EXACT_BIG=N: one large count, N, instead of the two
     * (run_dev_emu.sh under the sanitizers) */
    const char *eb = getenv("DEV_ALLREDUCE_EXACT_BIG");
    if (eb != NULL && strtoull(eb, NULL, 10) > 0) {
        counts[3] = (size_t)strtoull(eb, NULL, 10);
        ncounts = 4;
    }
    if (codec && strcmp(codec, "abort") == 0) {
        int bad_abort = check_abort(rank, nranks, comm, s);
        cudaStreamDestroy(s);
        return bad_abort; /* the communicator is gone */
    }
    if (codec && strcmp(codec, "pinned") == 0) {
        bad |= check_pinned(rank, nranks, comm, s);
        codec = NULL;
        mib = 0; /* checks only */
    } else if (codec && strcmp(codec, "hostfn") == 0) {
        bad |= check_host_fn_held(rank, nranks, comm, s);
        codec = NULL;
        mib = 0; /* checks only */
    } else if (codec && strcmp(codec, "efreuse") == 0) {
        bad |= check_ef_reuse(rank, comm, s);
        codec = NULL;
        mib = 0; /* checks only */
    } else if (codec && strcmp(codec, "staged") == 0) {
        bad |= check_staged(rank, nranks, comm, s);
        codec = NULL;
        mib = 0; /* checks only */
    } else if (codec && strncmp(codec, "queued:", 7) == 0) {
        NK(geocclCommSetCompression(comm, codec + 7));
        bad |= check_queued(rank, comm, s);
        codec = NULL;
        mib = 0; /* checks only */
    } else if (codec) {
        NK(geocclCommSetCompression(comm, codec));
        bad |= check_codec(rank, nranks, comm, s, codec);
    }
    const int staged_only = mib == 0;
    for (size_t c = 0; !codec && !staged_only && c < ncounts; c++) {
        for (int avg = 0; avg < 2; avg++) {
            size_t n = counts[c];
            float *h = malloc(n * sizeof(float)), *d_in, *d_out;
            for (size_t i = 0; i < n; i++)
                h[i] = value(rank, i);
            CK(cudaMalloc((void **)&d_in, n * sizeof(float)));
            CK(cudaMalloc((void **)&d_out, n * sizeof(float)));
            CK(cudaMemcpy(d_in, h, n * sizeof(float), cudaMemcpyHostToDevice));
            if (other)
                CK(cudaSetDevice(0));
            NK(ncclAllReduce(d_in, avg ? d_in : d_out, n, ncclFloat, avg ? ncclAvg : ncclSum, comm,
                             s));
            if (other) {
                int cur = -1;
                CK(cudaGetDevice(&cur));
                if (cur != 0) {
                    fprintf(stderr, "rank %d: ncclAllReduce left device %d current, the "
                            "caller's was 0\n", rank, cur);
                    bad = 1;
                }
                CK(cudaSetDevice(1));
            }
            CK(cudaStreamSynchronize(s));
            CK(cudaMemcpy(h, avg ? d_in : d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
            size_t wrong = 0;
            for (size_t i = 0; i < n; i++) {
                double want = 0;
                for (int r = 0; r < nranks; r++)
                    want += value(r, i);
                if (avg)
                    want /= nranks;
                if (fabs(h[i] - want) > (avg ? 1e-5 * fabs(want) + 1e-6 : 0))
                    wrong++;
            }
            if (wrong) {
                fprintf(stderr, "rank %d: %s count %zu%s: %zu wrong elements\n", rank,
                        avg ? "avg" : "sum", n, avg ? " in place" : "", wrong);
                bad = 1;
            }
            free(h);
            cudaFree(d_in);
            cudaFree(d_out);
        }
    }
    ncclResult_t ae = ncclSuccess;
    ncclCommGetAsyncError(comm, &ae);
    if (ae != ncclSuccess) {
        fprintf(stderr, "rank %d: async error %s: %s\n", rank, ncclGetErrorString(ae),
                ncclGetLastError(comm));
        bad = 1;
    }
    if (staged_only) {
        NK(ncclCommDestroy(comm));
        cudaStreamDestroy(s);
        return bad;
    }
    /* Figures: MIB MiB of floats, 2 warm-up calls, then 10 timed
     * (DEV_ALLREDUCE_ITERS=N: N timed, one warm-up when N is 1;
     * run_dev_emu.sh says 1: an emulated kernel's figures mean nothing,
     * only the pipelined compressed calls are wanted there). */
    const char *it = getenv("DEV_ALLREDUCE_ITERS");
    const int iters = it && atoi(it) > 0 ? atoi(it) : 10;
    size_t n = mib * (1 << 20) / sizeof(float);
    float *d;
    CK(cudaMalloc((void **)&d, n * sizeof(float)));
    CK(cudaMemset(d, 0, n * sizeof(float)));
    for (int i = 0; i < (iters > 1 ? 2 : 1); i++)
        NK(ncclAllReduce(d, d, n, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    NK(geocclCommResetStats(comm));
    double t0 = now();
    for (int i = 0; i < iters; i++)
        NK(ncclAllReduce(d, d, n, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    double t = (now() - t0) / iters;
    geocclStats gs;
    NK(geocclCommGetStats(comm, &gs));
    geocclDeviceStats ds;
    bad |= device_phases(rank, nranks, comm, iters, t * iters, &ds);
    if (rank == 0) {
        printf("dev_allreduce: %d ranks, %d regions, %zu MiB float sum%s%s: %.3f ms per call, "
               "algbw %.2f GB/s, busbw %.2f GB/s\n", nranks, nranks, mib, codec ? ", " : "",
               codec ? codec : "", t * 1e3,
               (double)n * 4 / t / 1e9, (double)n * 4 / t / 1e9 * 2.0 * (nranks - 1) / nranks);
        /* The library's own counters of the timed calls, per call (rank 0;
         * every rank runs as its own process on the one GPU). */
        printf("dev_allreduce: rank 0 per call (%d processes sharing one GPU): WAN bytes sent %.0f "
               "encoded, %.0f raw (%.2fx); ", nranks, (double)gs.bytesWan / iters,
               (double)gs.bytesWanRaw / iters,
               gs.bytesWan ? (double)gs.bytesWanRaw / (double)gs.bytesWan : 0.0);
        /* geocclStats times the host path's phases (the host codecs' work
         * on the exchange thread shows there); the device path's are
         * geocclDeviceStats'. */
        if (gs.secIntraReduceScatter + gs.secInter + gs.secIntraAllGather + gs.secCodec > 0)
            printf("host phase times (ms): reduce-scatter %.3f, inter-region %.3f, "
                   "all-gather %.3f, codec %.3f\n", gs.secIntraReduceScatter * 1e3 / iters,
                   gs.secInter * 1e3 / iters, gs.secIntraAllGather * 1e3 / iters,
                   gs.secCodec * 1e3 / iters);
        else
            printf("no host-path phase times\n");
        print_phases(nranks, &ds);
    }
    cudaFree(d);
    NK(ncclCommDestroy(comm));
    cudaStreamDestroy(s);
    return bad;
}

/* "driver old|none": the CUDA driver is too old for the runtime (old) or
 * absent (none); run under the emulation with GEO_EMU_DRIVER_VERSION set
 * to match.  old: ncclCommInitRank must fail with ncclUnhandledCudaError
 * and an error text that names the driver (it is printed; the caller
 * checks the versions in it); none: it must succeed, host-only (device
 * -1).  In-process, one rank. */
static int check_driver(const char *want)
{
    const int rank = 0;
    ncclComm_t comm = NULL;
    ncclUniqueId id;
    int rt = 0;
    CK(cudaRuntimeGetVersion(&rt));
    printf("dev_allreduce: CUDA runtime %d.%d\n", rt / 1000, rt % 1000 / 10);
    NK(ncclGetUniqueId(&id));
    ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
    const char *txt = ncclGetLastError(NULL);
    printf("dev_allreduce driver %s: ncclCommInitRank: %s: %s\n", want, ncclGetErrorString(r),
           r == ncclSuccess ? "-" : txt);
    if (strcmp(want, "old") == 0) {
        int ok = r == ncclUnhandledCudaError && strstr(txt, "driver") != NULL;
        printf("%s: dev_allreduce driver old: init refused, naming the driver\n",
               ok ? "PASS" : "FAIL");
        return !ok;
    }
    int d = 0;
    if (r == ncclSuccess)
        ncclCommCuDevice(comm, &d);
    int ok = r == ncclSuccess && d == -1;
    if (comm)
        ncclCommDestroy(comm);
    printf("%s: dev_allreduce driver none: host-only communicator (device %d)\n",
           ok ? "PASS" : "FAIL", d);
    return !ok;
}

/* "devices": communicators made off the caller's thread belong to the
 * device the caller chose: ncclCommInitAll's devlist, and inits inside
 * ncclGroupStart/End (run by GeoCCL on threads of its own) take the device
 * current in the calling thread at each ncclCommInitRank.  Needs 4
 * devices (the emulation: GEO_EMU_DEVICES=4).  In-process, no fork. */
/* One thread, one group: an in-place float sum on comms[i]'s device i+1
 * (rank i adds (i + 1) * (k % 97) at element k). */
static int group_loop(ncclComm_t *comms, int nc)
{
    const int rank = 0;
    const size_t n = 4099;
    ncclComm_t comm = comms[0];
    float *d[3] = {NULL, NULL, NULL};
    cudaStream_t s[3];
    float h[4099];
    int bad = 0;
    for (int i = 0; i < nc; i++) {
        CK(cudaSetDevice(i + 1));
        CK(cudaMalloc((void **)&d[i], n * sizeof(float)));
        CK(cudaStreamCreate(&s[i]));
        for (size_t k = 0; k < n; k++)
            h[k] = (float)((i + 1) * (int)(k % 97));
        CK(cudaMemcpy(d[i], h, n * sizeof(float), cudaMemcpyHostToDevice));
    }
    NK(ncclGroupStart());
    for (int i = 0; i < nc; i++) {
        comm = comms[i];
        CK(cudaSetDevice(i + 1));
        NK(ncclAllReduce(d[i], d[i], n, ncclFloat, ncclSum, comms[i], s[i]));
    }
    NK(ncclGroupEnd());
    const float total = (float)(nc * (nc + 1) / 2);
    for (int i = 0; i < nc; i++) {
        CK(cudaSetDevice(i + 1));
        CK(cudaStreamSynchronize(s[i]));
        CK(cudaMemcpy(h, d[i], n * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t k = 0; k < n && !bad; k++)
            if (h[k] != total * (float)(k % 97)) {
                fprintf(stderr, "grouped all-reduce: rank %d element %zu = %g, want %g\n", i,
                        k, (double)h[k], (double)(total * (float)(k % 97)));
                bad = 1;
            }
        CK(cudaStreamDestroy(s[i]));
        CK(cudaFree(d[i]));
    }
    return bad;
}

/* The graph calls are weak: the emulated runtime (dev_emu_runtime.c) has
 * no graphs, and its cudaStreamEndCapture gives none (the calls ran). */
#pragma weak cudaGraphInstantiate
#pragma weak cudaGraphLaunch
#pragma weak cudaGraphExecDestroy
#pragma weak cudaGraphDestroy

/* "capture [refuse]": one thread's grouped all-reduce over 2 devices (one
 * region) on streams under CUDA graph capture, or over device 0 alone on a
 * machine with fewer than 3 devices (the call then goes to NVIDIA's NCCL
 * unchanged).  NVIDIA's communicator made at init
 * (GEOCCL_NCCL_INIT=auto), the calls are captured, and the graph, launched,
 * gives the sums; with "refuse" (run with GEOCCL_NCCL_INIT=lazy) it does
 * not exist yet, and the call must say that it cannot be made during
 * capture, not try. */
static int check_capture(int refuse)
{
    const int rank = 0;
    const size_t n = 1031;
    ncclComm_t comm = NULL, comms[2] = {NULL, NULL};
    int devlist[2] = {1, 2};
    float *d[2];
    cudaStream_t s[2];
    cudaGraph_t g[2] = {NULL, NULL};
    float h[1031];
    int nd = 0, bad = 0;
    if (cudaGetDeviceCount(&nd) != cudaSuccess || nd == 0) {
        printf("SKIP: dev_allreduce capture: no GPU\n");
        return 77;
    }
    const int ndev = nd >= 3 ? 2 : 1;
    if (ndev == 1)
        devlist[0] = 0;
    NK(ncclCommInitAll(comms, ndev, devlist));
    comm = comms[0];
    for (int i = 0; i < ndev; i++) {
        CK(cudaSetDevice(devlist[i]));
        CK(cudaMalloc((void **)&d[i], n * sizeof(float)));
        CK(cudaStreamCreate(&s[i]));
        for (size_t k = 0; k < n; k++)
            h[k] = (float)((i + 1) * (int)(k % 31));
        CK(cudaMemcpy(d[i], h, n * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaStreamBeginCapture(s[i], cudaStreamCaptureModeGlobal));
    }
    ncclResult_t r[2] = {ncclSuccess, ncclSuccess};
    NK(ncclGroupStart());
    for (int i = 0; i < ndev; i++) {
        CK(cudaSetDevice(devlist[i]));
        r[i] = ncclAllReduce(d[i], d[i], n, ncclFloat, ncclSum, comms[i], s[i]);
    }
    ncclResult_t re = ncclGroupEnd();
    for (int i = 0; i < ndev; i++) {
        CK(cudaSetDevice(devlist[i]));
        cudaStreamEndCapture(s[i], &g[i]);
        cudaGetLastError();
    }
    if (refuse) {
        const char *why = ncclGetLastError(comms[0]);
        if (r[0] != ncclInvalidUsage || strstr(why, "capture") == NULL) {
            fprintf(stderr, "capture refuse: first call returned %s (%s), want "
                    "ncclInvalidUsage naming the capture\n", ncclGetErrorString(r[0]), why);
            bad = 1;
        } else {
            printf("dev_allreduce capture refuse: %s\n", why);
        }
    } else if (r[0] != ncclSuccess || r[1] != ncclSuccess || re != ncclSuccess) {
        fprintf(stderr, "capture: grouped all-reduce failed: %s / %s / %s (%s)\n",
                ncclGetErrorString(r[0]), ncclGetErrorString(r[1]), ncclGetErrorString(re),
                ncclGetLastError(comms[0]));
        bad = 1;
    } else {
        for (int i = 0; i < ndev && g[i] && cudaGraphInstantiate; i++) {
            cudaGraphExec_t ge;
            CK(cudaSetDevice(devlist[i]));
            CK(cudaGraphInstantiate(&ge, g[i], 0));
            CK(cudaGraphLaunch(ge, s[i]));
            CK(cudaStreamSynchronize(s[i]));
            CK(cudaGraphExecDestroy(ge));
        }
        const float want = (float)(ndev * (ndev + 1) / 2);
        for (int i = 0; i < ndev && !bad; i++) {
            CK(cudaSetDevice(devlist[i]));
            CK(cudaStreamSynchronize(s[i]));
            CK(cudaMemcpy(h, d[i], n * sizeof(float), cudaMemcpyDeviceToHost));
            for (size_t k = 0; k < n && !bad; k++)
                if (h[k] != want * (float)(k % 31)) {
                    fprintf(stderr, "capture: rank %d element %zu = %g\n", i, k, (double)h[k]);
                    bad = 1;
                }
        }
    }
    for (int i = 0; i < ndev; i++) {
        CK(cudaSetDevice(devlist[i]));
        cudaStreamSynchronize(s[i]);
        if (g[i] && cudaGraphDestroy)
            cudaGraphDestroy(g[i]);
        cudaStreamDestroy(s[i]);
        cudaFree(d[i]);
        ncclCommDestroy(comms[i]);
    }
    printf("%s: dev_allreduce capture%s (%d device%s)\n", bad ? "FAIL" : "PASS",
           refuse ? " refuse" : "", ndev, ndev > 1 ? "s, one region" : "");
    return bad;
}

static int check_devices(void)
{
    const int rank = 0;
    ncclComm_t comm = NULL, comms[3] = {NULL, NULL, NULL};
    int n = 0, bad = 0;
    const int devlist[3] = {2, 1, 3};
    CK(cudaGetDeviceCount(&n));
    if (n < 4) {
        printf("SKIP: dev_allreduce devices: %d device(s), 4 needed\n", n);
        return 77;
    }
    CK(cudaSetDevice(0));
    NK(ncclCommInitAll(comms, 3, devlist));
    for (int i = 0; i < 3; i++) {
        int d = -1;
        comm = comms[i];
        NK(ncclCommCuDevice(comms[i], &d));
        if (d != devlist[i]) {
            fprintf(stderr, "ncclCommInitAll: rank %d on device %d, devlist says %d\n", i, d,
                    devlist[i]);
            bad = 1;
        }
    }
    for (int i = 0; i < 3; i++)
        ncclCommDestroy(comms[i]);
    ncclUniqueId id;
    comm = NULL;
    NK(ncclGetUniqueId(&id));
    NK(ncclGroupStart());
    for (int i = 0; i < 3; i++) {
        CK(cudaSetDevice(i + 1));
        NK(ncclCommInitRank(&comms[i], 3, id, i));
    }
    NK(ncclGroupEnd());
    for (int i = 0; i < 3; i++) {
        int d = -1;
        comm = comms[i];
        NK(ncclCommCuDevice(comms[i], &d));
        if (d != i + 1) {
            fprintf(stderr, "grouped ncclCommInitRank: rank %d on device %d, the caller's "
                    "was %d\n", i, d, i + 1);
            bad = 1;
        }
    }
    /* The single-process loop over GPUs (nccl-tests -g N): one thread, one
     * group, a device all-reduce per communicator.  NVIDIA's communicator
     * of the region must exist by now (GEOCCL_NCCL_INIT=auto makes it at
     * init, each rank on a GPU of its own): made at the first call, its
     * collective creation would wait for ranks this thread calls later. */
    bad |= group_loop(comms, 3);
    for (int i = 0; i < 3; i++)
        ncclCommDestroy(comms[i]);
    printf("%s: dev_allreduce devices: ncclCommInitAll devlist, grouped inits, one thread's "
           "grouped all-reduce over 3 devices\n", bad ? "FAIL" : "PASS");
    return bad;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "devices") == 0)
        return check_devices();
    if (argc > 1 && strcmp(argv[1], "capture") == 0)
        return check_capture(argc > 2 && strcmp(argv[2], "refuse") == 0);
    if (argc > 2 && strcmp(argv[1], "driver") == 0)
        return check_driver(argv[2]);
    if (argc > 1 && strcmp(argv[1], "events") == 0)
        return check_events();

    int nranks = argc > 1 ? atoi(argv[1]) : 2;
    size_t mib = argc > 2 ? (size_t)atoi(argv[2]) : 64;
    const char *codec = argc > 3 ? argv[3] : NULL;
    ncclComm_t comm = NULL;
    (void)comm;

    if (nranks < 1 || nranks > 16 || mib < 1) {
        fprintf(stderr, "usage: dev_allreduce NRANKS(1..16) [MIB [CODEC]]\n");
        return 2;
    }
    /* Probe in a child: CUDA must not be initialised before fork.  It
     * prints why it skips or fails (gpu_probe.h). */
    fflush(stdout);
    pid_t p = fork();
    if (p == 0)
        _exit(gpu_probe("dev_allreduce"));
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st))
        return 1;
    if (WEXITSTATUS(st) != 0)
        return WEXITSTATUS(st);
    hashes = mmap(NULL, MAX_CASES * 16 * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (hashes == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(hashes, 0, MAX_CASES * 16 * sizeof(uint64_t));
    shared_id = mmap(NULL, sizeof(*shared_id), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared_id == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(shared_id, 0, sizeof(*shared_id));
    pid_t *pids = calloc((size_t)nranks, sizeof(pid_t));
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            int rc = rank_main(r, nranks, mib, codec);
            fflush(NULL); /* _exit does not flush: a pipe would lose the figures */
            _exit(rc);
        }
    }
    int failed = 0;
    for (int r = 0; r < nranks; r++) {
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed++;
    }
    int differ = 0;
    for (int c = 0; codec && !failed && c < MAX_CASES; c++)
        for (int r = 1; r < nranks; r++)
            if (hashes[c * 16 + r] != hashes[c * 16]) {
                fprintf(stderr, "case %d: rank %d's result differs from rank 0's\n", c, r);
                differ = 1;
            }
    failed += differ;
    printf("%s: dev_allreduce %d ranks (one region each), device buffers%s%s: %d rank(s) "
           "failed%s\n", failed ? "FAIL" : "PASS", nranks, codec ? ", " : "",
           codec ? codec : "", failed - differ,
           differ ? ", results not bit-identical" : codec ? ", bit-identical" : "");
    free(pids);
    return failed ? 1 : 0;
}
