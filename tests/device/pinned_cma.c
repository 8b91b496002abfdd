/* Can the single-copy transfers inside a region (comm/coll/cma.c) read and
 * write host memory that CUDA allocated or registered?  Run by
 * tests/device/run.sh on a GPU machine; prints one line per kind of buffer:
 *
 *   pinned_cma: cudaHostAlloc(default): readable and writable
 *
 * GeoCCL checks each call's buffers the same way (process_vm_readv of the
 * first and last byte by their owner, and process_vm_writev of the output's)
 * and sends a call whose buffers fail round the ring, so either answer is
 * correct; this says which path such buffers take.  Exit 77 without a GPU,
 * 1 if a CUDA call fails. */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "gpu_probe.h"

#define SIZE (4u << 20)

/* Reads the first and last byte of buf through process_vm_readv on this
 * process, as cma.c's per-call check does (with write: then writes them
 * back changed through process_vm_writev, checks, and restores them).
 * Returns 0 or an errno. */
static int self_reach(void *buf, size_t len, int host, int write)
{
    unsigned char got[2];
    struct iovec local[2] = { { &got[0], 1 }, { &got[1], 1 } };
    struct iovec remote[2] = { { (void *)buf, 1 }, { (char *)buf + len - 1, 1 } };
    ssize_t n = process_vm_readv(getpid(), local, 2, remote, 2, 0);
    if (n != 2)
        return n < 0 ? errno : EIO;
    if (!host)
        return 0;
    unsigned char *b = buf;
    if (got[0] != b[0] || got[1] != b[len - 1])
        return EIO;
    if (!write)
        return 0;
    unsigned char old[2] = { got[0], got[1] };
    got[0] ^= 0xff;
    got[1] ^= 0xff;
    n = process_vm_writev(getpid(), local, 2, remote, 2, 0);
    int e = n != 2 ? (n < 0 ? errno : EIO) : (b[0] != got[0] || b[len - 1] != got[1]) ? EIO : 0;
    b[0] = old[0];
    b[len - 1] = old[1];
    return e;
}

static void report(const char *what, void *buf, int host)
{
    int e = self_reach(buf, SIZE, host, 0);
    /* a device pointer is never written through the host (nor here) */
    int w = e || !host ? e : self_reach(buf, SIZE, host, 1);
    printf("pinned_cma: %-34s %s%s%s\n", what,
           e ? "not readable (" : w ? "readable, not writable ("
                                    : host ? "readable and writable" : "readable",
           w ? strerror(w) : "", w ? "): such calls take the ring" : "");
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
    int probe = gpu_probe("pinned_cma");
    if (probe != 0)
        return probe;
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
