/*
 * The kernel files of cuda/ as one C++ translation unit, for the CPU
 * emulation builds (GEO_CUDA_EMU: tests/device/codec_emu and
 * dev_allreduce-emu; see Makefile.am).  nvcc compiles each file on its own
 * for the library; here they must share one unit because
 * cuda_emu_device.h, which they include, keeps the emulated device in
 * per-unit statics (the block scheduler and, for codec_emu, the table of
 * allocations whose guard bytes every launch checks) and, without
 * GEO_CUDA_EMU_STREAMS, defines the emulated runtime's functions: compiled
 * once per file, the runtime would be defined several times and each
 * file's launches would check an allocation table of their own.
 */

/* The emulation switches stacks with _longjmp, which the checked longjmp
 * of _FORTIFY_SOURCE refuses; it must go before any system header. */
#undef _FORTIFY_SOURCE

#include "cuda/codec_cast.cu"
#include "cuda/codec_quant.cu"
#include "cuda/codec_sign.cu"
#include "cuda/codec_topk.cu"
#include "cuda/codec_decode.cu"
#include "cuda/stream_ops.cu"
#include "cuda/codec_kernels.cu"
