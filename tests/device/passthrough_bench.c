/* Single-region pass-through cost (tests/device/run.sh).  Built against
 * NVIDIA's nccl.h and linked with NVIDIA's libnccl, like a trainer; run once
 * alone and once with LD_PRELOAD=libgeoccl.so:
 *
 *   passthrough_bench [MIB]
 *   passthrough_bench version
 *
 * version: prints the version ncclGetVersion of the loaded NCCL reports
 * and the file it was loaded from (no GPU needed; run.sh names the NCCL it
 * found with it).
 * One rank on the current GPU: ncclAllReduce of MIB MiB of floats (and of
 * one float, where per-call overhead shows) on a stream; prints the time
 * per call, which the script compares.  Also checks the result.  Exit 77
 * without a GPU. */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_probe.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define CK(call)                                                                      \
    do {                                                                              \
        if ((call) != 0) {                                                            \
            fprintf(stderr, "passthrough_bench: %s failed\n", #call);                 \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

/* The loaded NCCL's own version and the file that holds ncclGetVersion. */
static int print_version(void)
{
    int v = 0;
    Dl_info info;
    void *sym = dlsym(RTLD_DEFAULT, "ncclGetVersion");
    if (ncclGetVersion(&v) != ncclSuccess) {
        printf("passthrough_bench: ncclGetVersion failed\n");
        return 1;
    }
    const char *file = sym && dladdr(sym, &info) && info.dli_fname ? info.dli_fname : "?";
    printf("nccl: version %d.%d.%d (ncclGetVersion %d) from %s\n", v / 10000, v / 100 % 100,
           v % 100, v, file);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "version") == 0)
        return print_version();
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 64;
    int v = 0;
    int probe = gpu_probe("passthrough_bench");
    if (probe != 0)
        return probe;
    CK(cudaSetDevice(0));
    ncclUniqueId id;
    ncclComm_t comm;
    cudaStream_t s;
    CK(ncclGetVersion(&v));
    CK(ncclGetUniqueId(&id));
    CK(ncclCommInitRank(&comm, 1, id, 0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t n = mib * (1 << 20) / sizeof(float);
    float *a, *b, h[4];
    CK(cudaMalloc((void **)&a, n * sizeof(float)));
    CK(cudaMalloc((void **)&b, n * sizeof(float)));
    CK(cudaMemset(a, 0, n * sizeof(float)));
    float three = 3.0f;
    CK(cudaMemcpy(a + n - 1, &three, sizeof(float), cudaMemcpyHostToDevice));
    for (int i = 0; i < 5; i++)
        CK(ncclAllReduce(a, b, n, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h, b + n - 1, sizeof(float), cudaMemcpyDeviceToHost));
    if (h[0] != 3.0f) {
        printf("FAIL: passthrough_bench: result %g, not 3\n", h[0]);
        return 1;
    }
    const int iters = 50, small_iters = 2000;
    double t0 = now();
    for (int i = 0; i < iters; i++)
        CK(ncclAllReduce(a, b, n, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    double big = (now() - t0) / iters;
    t0 = now();
    for (int i = 0; i < small_iters; i++)
        CK(ncclAllReduce(a, b, 1, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    double small = (now() - t0) / small_iters;
    /* One line the script parses: big_us small_us */
    printf("passthrough_bench: version %d, %zu MiB: %.2f us per call (%.1f GB/s); 4 B: %.2f us "
           "per call\nRESULT %.3f %.3f\n", v, mib, big * 1e6, (double)n * 4 / big / 1e9,
           small * 1e6, big * 1e6, small * 1e6);
    cudaFree(a);
    cudaFree(b);
    ncclCommDestroy(comm);
    return 0;
}
