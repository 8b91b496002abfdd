/*
 * Whether a device test program has a GPU to run on, for the programs
 * that tests/device/run.sh runs (codec_check, dev_allreduce, pinned_cma,
 * passthrough_bench).  Their exit 77 means "skipped: no GPU here", so it
 * must only come back where the machine has none:
 *  - cudaGetDeviceCount answers cudaErrorNoDevice (a driver that sees no
 *    device), or finds 0 devices;
 *  - no CUDA driver is installed: cudaDriverGetVersion reports version 0,
 *    which the runtime answers exactly when it cannot load libcuda.so.1
 *    (cudaGetDeviceCount then says cudaErrorInsufficientDriver too).
 * Any other failure is a GPU machine that cannot be used, most often a
 * driver older than the runtime (cudaErrorInsufficientDriver with a
 * driver version): that fails the program, naming the error and both
 * versions, rather than reading as an absent GPU.  The library makes the
 * same distinction (comm/device/dev_cuda.c).
 *
 * Include after cuda_runtime.h (or tests/device/cuda_emu.h).  What it
 * prints is flushed, so that a forked child may _exit after it.
 */
#ifndef GEOCCL_TESTS_GPU_PROBE_H_
#define GEOCCL_TESTS_GPU_PROBE_H_

#include <stdio.h>

/* 0: at least one GPU is usable; 77: none here (printed as "no GPU");
 * 1: CUDA fails on a machine with a driver (printed with both versions).
 * prog names the program in the line it prints. */
static inline int gpu_probe(const char *prog)
{
    int n = 0, drv = 0, rt = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0)
        return 0;
    cudaGetLastError();
    if (cudaDriverGetVersion(&drv) != cudaSuccess)
        drv = -1;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess)
        rt = -1;
    cudaGetLastError();
    if (e == cudaSuccess || e == cudaErrorNoDevice) {
        printf("SKIP: %s: no GPU (the CUDA driver sees no device)\n", prog);
        fflush(stdout);
        return 77;
    }
    if (drv == 0) {
        printf("SKIP: %s: no GPU (no CUDA driver installed: cudaDriverGetVersion reports 0)\n",
               prog);
        fflush(stdout);
        return 77;
    }
    printf("FAIL: %s: cudaGetDeviceCount: %s (error %d) with a CUDA driver installed: "
           "cudaDriverGetVersion %d (CUDA %d.%d), cudaRuntimeGetVersion %d (CUDA %d.%d)%s\n",
           prog, cudaGetErrorString(e), (int)e, drv, drv / 1000, drv % 1000 / 10, rt, rt / 1000,
           rt % 1000 / 10,
           e == cudaErrorInsufficientDriver && drv / 1000 < rt / 1000
               ? ": the driver is older than the runtime needs" : "");
    fflush(stdout);
    return 1;
}

#endif
