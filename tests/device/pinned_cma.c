/* Can the single-copy reads inside a region (comm/cma.c) read host memory
 * that CUDA allocated or registered?  Run by tests/device/run.sh on a GPU
 * machine; prints one line per kind of buffer:
 *
 *   pinned_cma: cudaHostAlloc(default): readable
 *
 * GeoCCL checks each call's buffers the same way (process_vm_readv of the
 * first and last byte, by their owner) and sends a call whose buffers fail
 * round the ring, so either answer is correct; this says which path such
 * buffers take.  Exit 77 without a GPU, 1 if a CUDA call fails. */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define SIZE (4u << 20)

/* Reads the first and last byte of buf through process_vm_readv on this
 * process, as cma.c's per-call check does. Returns 0 or an errno. */
static int self_read(const void *buf, size_t len, int host)
{
    unsigned char got[2];
    struct iovec local[2] = { { &got[0], 1 }, { &got[1], 1 } };
    struct iovec remote[2] = { { (void *)buf, 1 }, { (char *)buf + len - 1, 1 } };
    ssize_t n = process_vm_readv(getpid(), local, 2, remote, 2, 0);
    if (n != 2)
        return n < 0 ? errno : EIO;
    if (!host)
        return 0;
    const unsigned char *b = buf;
    return (got[0] == b[0] && got[1] == b[len - 1]) ? 0 : EIO;
}

static void report(const char *what, const void *buf, int host)
{
    int e = self_read(buf, SIZE, host);
    printf("pinned_cma: %-34s %s%s%s\n", what, e ? "not readable (" : "readable",
           e ? strerror(e) : "", e ? "): such calls take the ring" : "");
}

#define CK(call)                                                          \
    do {                                                                  \
        cudaError_t e_ = (call);                                          \
        if (e_ != cudaSuccess) {                                          \
            fprintf(stderr, "pinned_cma: %s: %s\n", #call, cudaGetErrorString(e_)); \
            return 1;                                                     \
        }                                                                 \
    } while (0)

int main(void)
{
    int ngpu = 0;
    if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu == 0) {
        printf("SKIP: pinned_cma: no GPU\n");
        return 77;
    }
    void *p;
    CK(cudaHostAlloc(&p, SIZE, cudaHostAllocDefault));
    memset(p, 0x5a, SIZE);
    report("cudaHostAlloc(default):", p, 1);
    CK(cudaFreeHost(p));

    CK(cudaHostAlloc(&p, SIZE, cudaHostAllocMapped | cudaHostAllocPortable));
    memset(p, 0x5b, SIZE);
    report("cudaHostAlloc(mapped|portable):", p, 1);
    CK(cudaFreeHost(p));

    CK(cudaHostAlloc(&p, SIZE, cudaHostAllocWriteCombined));
    memset(p, 0x5c, SIZE);
    report("cudaHostAlloc(write-combined):", p, 1);
    CK(cudaFreeHost(p));

    void *m = malloc(SIZE);
    if (!m)
        return 1;
    memset(m, 0x5d, SIZE);
    CK(cudaHostRegister(m, SIZE, cudaHostRegisterDefault));
    report("malloc + cudaHostRegister:", m, 1);
    CK(cudaHostUnregister(m));
    free(m);

    /* Device memory is not host memory: GeoCCL never reads it this way
     * (device buffers take the device path); shown for completeness. */
    CK(cudaMalloc(&p, SIZE));
    report("cudaMalloc (device pointer):", p, 0);
    CK(cudaFree(p));
    return 0;
}
