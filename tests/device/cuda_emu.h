/*
 * The CUDA runtime subset that tests/device/codec_check.c and the
 * kernel files of cuda/ use, for the CPU emulation build (GEO_CUDA_EMU):
 * plain C declarations with the CUDA runtime's names.  The definitions are
 * in cuda_emu_device.h, compiled into the emulated kernels' object.
 *
 * The emulation exists to test the kernels' indexing, bounds, barriers and
 * warp-level logic on machines without a GPU (make check); it says nothing
 * about speed and is not a CUDA implementation.
 */
#ifndef GEOCCL_CUDA_EMU_H_
#define GEOCCL_CUDA_EMU_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorNotReady = 600
} cudaError_t;

typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMemoryClockRate = 36,
    cudaDevAttrGlobalMemoryBusWidth = 37
};

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major;
    int minor;
    int multiProcessorCount;
};

struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;
struct CUevent_st;
typedef struct CUevent_st *cudaEvent_t;

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaRuntimeGetVersion(int *version);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t err);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

#ifdef __cplusplus
}
#endif

#endif
