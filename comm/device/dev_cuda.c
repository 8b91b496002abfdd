/* CUDA for the device layer: whether this process has usable GPUs (and
 * why not, when a driver is there but unusable), which buffers are device
 * memory, the PCI identity of a device, CUDA errors recorded on the
 * communicator, and the communicator's device made current for a call. */
#include "config.h"

#ifdef HAVE_CUDA
#include "comm/device/dev_internal.h"

#include <stdio.h>
#include <string.h>

static int gpu_count;
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
/* Set when a CUDA driver is installed but this runtime cannot use it (most
 * often a driver older than the runtime's major version needs): the machine
 * has GPUs that we must not silently treat as absent. */
static char gpu_problem[384];

/* "13.0" from CUDA's 1000 * major + 10 * minor. */
static void cuda_version_text(int v, char *buf, size_t len)
{
    snprintf(buf, len, "%d.%d", v / 1000, v % 1000 / 10);
}

static void count_gpus(void)
{
    int n = 0, drv = 0, rt = 0;
    char dtxt[16], rtxt[16];
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess) {
        gpu_count = n;
        return;
    }
    cudaGetLastError();
    gpu_count = 0;
    /* cudaDriverGetVersion answers 0 when no driver (libcuda.so.1) loads;
     * both answer without a usable device. */
    if (cudaDriverGetVersion(&drv) != cudaSuccess) {
        cudaGetLastError();
        drv = 0;
    }
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) {
        cudaGetLastError();
        rt = CUDART_VERSION;
    }
    cuda_version_text(drv, dtxt, sizeof(dtxt));
    cuda_version_text(rt, rtxt, sizeof(rtxt));
    if (e == cudaErrorNoDevice || drv == 0) {
        geoInfo(GEO_LOG_INIT | GEO_LOG_CUDA, "no GPU: %s; host buffers only",
                drv == 0 ? "no CUDA driver is installed (libcuda.so.1 not found)"
                         : "the CUDA driver sees no device");
        return;
    }
    if (e == cudaErrorInsufficientDriver)
        snprintf(gpu_problem, sizeof(gpu_problem),
                 "the CUDA driver supports CUDA %s, but GeoCCL's CUDA runtime is %s and needs "
                 "a driver for CUDA %d.x: update the driver, or build GeoCCL with a CUDA "
                 "toolkit no newer than %s (./configure --with-cuda=DIR)", dtxt, rtxt,
                 rt / 1000, dtxt);
    else
        snprintf(gpu_problem, sizeof(gpu_problem),
                 "the CUDA runtime %s cannot use the GPUs (driver for CUDA %s): "
                 "cudaGetDeviceCount failed with %s (%s)", rtxt, dtxt, cudaGetErrorName(e),
                 cudaGetErrorString(e));
    /* Not logged at WARN here: ncclCommInitRank refuses with this text
     * (geoDevProblem), and that report is the one WARN line. */
    geoInfo(GEO_LOG_INIT | GEO_LOG_CUDA, "%s", gpu_problem);
}

const char *geoDevProblem(void)
{
    pthread_once(&gpu_once, count_gpus);
    return gpu_problem[0] ? gpu_problem : NULL;
}

int geoDevCurrent(void)
{
    int d = -1;
    pthread_once(&gpu_once, count_gpus);
    if (gpu_count == 0)
        return -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return d;
}

int geoDevIsDevicePtr(const void *p)
{
    struct cudaPointerAttributes a;
    if (p == NULL)
        return 0;
    pthread_once(&gpu_once, count_gpus);
    if (gpu_count == 0)
        return 0;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

ncclResult_t devCudaErrorAt(struct ncclComm *comm, const char *file, int line, const char *what,
                            cudaError_t e)
{
    return geoErrReport(&comm->err, ncclUnhandledCudaError, file, line, "%s: %s (%s)",
                        geoErrOp(&comm->err), what, cudaGetErrorString(e));
}

/* The communicator's device made current for the duration of a call (see
 * devGuard). */
ncclResult_t devEnter(struct ncclComm *comm, devGuard *g)
{
    g->prev = -1;
    g->switched = 0;
    if (comm->cuda_dev < 0)
        return ncclSuccess;
    if (cudaGetDevice(&g->prev) != cudaSuccess) {
        cudaGetLastError();
        g->prev = -1;
    }
    if (g->prev == comm->cuda_dev)
        return ncclSuccess;
    cudaError_t e = cudaSetDevice(comm->cuda_dev);
    if (e != cudaSuccess)
        return devCudaError(comm, "selecting the communicator's CUDA device", e);
    g->switched = 1;
    return ncclSuccess;
}

void devLeave(const devGuard *g)
{
    if (g->switched && g->prev >= 0 && cudaSetDevice(g->prev) != cudaSuccess)
        cudaGetLastError();
}

int geoDevIdentify(int dev, char bus[16])
{
    memset(bus, 0, 16);
    if (dev < 0 || geoNcclReal() == NULL)
        return 0;
    if (cudaDeviceGetPCIBusId(bus, 16, dev) != cudaSuccess) {
        cudaGetLastError();
        memset(bus, 0, 16);
        return 0;
    }
    bus[15] = '\0';
    return 1;
}
#endif
