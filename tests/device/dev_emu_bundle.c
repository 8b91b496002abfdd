/*
 * What the device bundle's programs (tests/device/bundle.sh), built against
 * the real toolkit, ask of the emulated CUDA runtime beyond what
 * dev_emu_runtime.c emulates for the library: run.sh --emulate runs them
 * unchanged on it.  Linked beside dev_emu_runtime.c into the bundle's
 * emulated libcudart.so.13 only; dev_allreduce-emu does not need it.
 *
 *  - cudaGetDeviceProperties (codec_check prints the device first): the
 *    figures name the emulation, never a GPU: "CPU emulation", sm_90 (the
 *    architecture the bundle's kernels are built for), one multiprocessor.
 *  - cudaHostRegister / cudaHostUnregister (pinned_cma): host memory is
 *    host memory here, and the emulation's device reaches all of it; the
 *    registration is checked for its arguments and recorded nowhere.
 */
#include <cuda_runtime_api.h>

#include <string.h>

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return e;
    if (prop == NULL || device < 0 || device >= n)
        return cudaErrorInvalidValue;
    memset(prop, 0, sizeof(*prop));
    strncpy(prop->name, "CPU emulation of a CUDA device", sizeof(prop->name) - 1);
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1;
    prop->totalGlobalMem = (size_t)1 << 30;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    (void)flags;
    return ptr == NULL || size == 0 ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr)
{
    return ptr == NULL ? cudaErrorInvalidValue : cudaSuccess;
}
