/* Device-buffer all-reduce through GeoCCL on a lent GPU (tests/device/run.sh):
 *
 *   dev_allreduce NRANKS [MIB]
 *
 * forks NRANKS processes on the current GPU, each its own region
 * (GEOCCL_REGION=r<i>), so every all-reduce takes the cross-region device
 * path: NVIDIA's reduce-scatter in the region, the host exchange, NVIDIA's
 * all-gather, all on the caller's stream.  Checks sum and avg results on
 * odd and even counts, then times MIB-sized float all-reduces and prints
 * the figures.  Exit 0 when every rank passed; 77 without a GPU.  Prints
 * PASS/FAIL lines. */
#define GEOCCL_HAVE_CUDA_RUNTIME 1
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

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

static int rank_main(int rank, int nranks, ncclUniqueId id, size_t mib)
{
    ncclComm_t comm = NULL;
    char label[16];
    snprintf(label, sizeof(label), "r%d", rank);
    setenv("GEOCCL_REGION", label, 1);
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    NK(ncclCommInitRank(&comm, nranks, id, rank));
    int bad = 0;
    const size_t counts[] = {1, 7, 1000, 1 << 20, (1 << 20) + 3};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        for (int avg = 0; avg < 2; avg++) {
            size_t n = counts[c];
            float *h = malloc(n * sizeof(float)), *d_in, *d_out;
            for (size_t i = 0; i < n; i++)
                h[i] = value(rank, i);
            CK(cudaMalloc((void **)&d_in, n * sizeof(float)));
            CK(cudaMalloc((void **)&d_out, n * sizeof(float)));
            CK(cudaMemcpy(d_in, h, n * sizeof(float), cudaMemcpyHostToDevice));
            NK(ncclAllReduce(d_in, avg ? d_in : d_out, n, ncclFloat, avg ? ncclAvg : ncclSum, comm,
                             s));
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
    /* Figures: MIB MiB of floats, 2 warm-up calls, then 10 timed. */
    size_t n = mib * (1 << 20) / sizeof(float);
    float *d;
    CK(cudaMalloc((void **)&d, n * sizeof(float)));
    CK(cudaMemset(d, 0, n * sizeof(float)));
    for (int i = 0; i < 2; i++)
        NK(ncclAllReduce(d, d, n, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    const int iters = 10;
    double t0 = now();
    for (int i = 0; i < iters; i++)
        NK(ncclAllReduce(d, d, n, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    double t = (now() - t0) / iters;
    if (rank == 0)
        printf("dev_allreduce: %d ranks, %d regions, %zu MiB float sum: %.3f ms per call, "
               "algbw %.2f GB/s, busbw %.2f GB/s\n", nranks, nranks, mib, t * 1e3,
               (double)n * 4 / t / 1e9, (double)n * 4 / t / 1e9 * 2.0 * (nranks - 1) / nranks);
    cudaFree(d);
    NK(ncclCommDestroy(comm));
    cudaStreamDestroy(s);
    return bad;
}

int main(int argc, char **argv)
{
    int nranks = argc > 1 ? atoi(argv[1]) : 2;
    size_t mib = argc > 2 ? (size_t)atoi(argv[2]) : 64;
    int ngpu = 0, rank = -1;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    (void)comm;

    if (nranks < 1 || nranks > 16 || mib < 1) {
        fprintf(stderr, "usage: dev_allreduce NRANKS(1..16) [MIB]\n");
        return 2;
    }
    /* Count GPUs in a child: CUDA must not be initialised before fork. */
    pid_t p = fork();
    if (p == 0)
        _exit(cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu > 0 ? 0 : 77);
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        printf("SKIP: dev_allreduce: no GPU\n");
        return 77;
    }
    NK(ncclGetUniqueId(&id));
    pid_t *pids = calloc((size_t)nranks, sizeof(pid_t));
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(rank_main(r, nranks, id, mib));
    }
    int failed = 0;
    for (int r = 0; r < nranks; r++) {
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed++;
    }
    printf("%s: dev_allreduce %d ranks (one region each), device buffers: %d rank(s) failed\n",
           failed ? "FAIL" : "PASS", nranks, failed);
    free(pids);
    return failed ? 1 : 0;
}
