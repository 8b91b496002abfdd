/*
 * The tensor and reduction-op helpers the geoccl process group's
 * collectives share (collectives.cpp): GeoCCL's datatype and reduction for
 * a tensor and a c10d op (PREMUL_SUM's factor made into an op on the worker
 * thread), the checks a call makes on the caller's thread before anything
 * is queued, and what a call does around non-contiguous tensors.
 */
#ifndef GEOCCL_TORCH_TENSOR_OPS_HPP_
#define GEOCCL_TORCH_TENSOR_OPS_HPP_

#include "process_group.hpp"

#include <cstring>
#include <utility>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace geoccl_torch {

/* GeoCCL's datatype for t; throws for the types the NCCL API lacks. Bool
 * travels as uint8 (its reductions are remapped by ncclOp). */
ncclDataType_t ncclType(const at::Tensor& t);

const char* opName(const ::c10d::ReduceOp& op);

/* GeoCCL's reduction for op on t: a built-in one, or PREMUL_SUM's factor
 * (torch's _make_nccl_premul_sum: a double, or a one-element tensor per
 * input), which becomes an ncclRedOpCreatePreMulSum op on the worker thread
 * for the call and is destroyed after it (the op needs the communicator).
 * Throws, before anything is queued, for the ones NCCL's API lacks. */
struct RedOp {
  ncclRedOp_t op = ncclSum;
  bool premul = false;
  double factor = 0;

  /* The op for one call on comm with elements of dt into *out. */
  ncclResult_t make(ncclComm_t comm, ncclDataType_t dt, ncclRedOp_t* out) const {
    if (!premul) {
      *out = op;
      return ncclSuccess;
    }
    union {
      float f;
      double d;
      uint16_t h;
    } v;
    memset(&v, 0, sizeof(v));
    switch (dt) {
      case ncclFloat32: v.f = static_cast<float>(factor); break;
      case ncclFloat64: v.d = factor; break;
      case ncclFloat16: v.h = c10::Half(static_cast<float>(factor)).x; break;
      case ncclBfloat16: v.h = c10::BFloat16(static_cast<float>(factor)).x; break;
      default: return ncclInvalidArgument;
    }
    return ncclRedOpCreatePreMulSum(out, &v, dt, ncclScalarHostImmediate, comm);
  }
  /* call(op) with the op made for comm and dt, destroyed after it. */
  template <typename F>
  ncclResult_t with(ncclComm_t comm, ncclDataType_t dt, F call) const {
    ncclRedOp_t o;
    ncclResult_t r = make(comm, dt, &o);
    if (r != ncclSuccess) return r;
    r = call(o);
    if (premul) ncclRedOpDestroy(o, comm);
    return r;
  }
};

/* The reduction for op on t's elements (bool's SUM and PRODUCT are MAX
 * and MIN); throws, before anything is queued, for what NCCL's API lacks. */
RedOp ncclOp(const ::c10d::ReduceOp& op, const at::Tensor& t);

/* Checks on the caller's thread: a dense tensor of a supported dtype on a
 * supported device; exactly one tensor; t like the input ref (dtype,
 * device); a root rank in range. Each throws with what was wrong. */
void checkTensor(const at::Tensor& t, const char* what);
const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* op);
void checkLike(const at::Tensor& t, const at::Tensor& ref, const char* what);
void checkRoot(int64_t root, int size, const char* op);

/* A contiguous tensor with t's data (t itself when it already is). */
at::Tensor dense(const at::Tensor& t);

/* The address of element `elements` of t. */
char* bytesAt(const at::Tensor& t, int64_t elements);

/* What the post step must do for an output that was not contiguous:
 * copy the contiguous buffer the call wrote back into it. */
struct CopyBack {
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;  // (destination, source)
  void add(const at::Tensor& dst, const at::Tensor& src) {
    if (!dst.is_same(src)) pairs.emplace_back(dst, src);
  }
  void operator()() const {
    for (const auto& p : pairs) {
      auto dst = p.first;
      dst.copy_(p.second.view(dst.sizes()));
    }
  }
};

/* The buffers of a call on pairs of tensors: inputs[i] and outputs[i]
 * made contiguous (srcs, dsts), every tensor the call uses (used), and the
 * copy back into the outputs that were not contiguous (back). */
struct DensePairs {
  std::vector<at::Tensor> srcs, dsts, used;
  CopyBack back;
  DensePairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs);
};

#if GEOCCL_TORCH_TENSOR_COALESCED
/* call(i) for every i < n as one GeoCCL group, which runs them in call
 * order when it ends; the first error of a call, else the group's. The
 * group is closed after a failed call too (the calls posted run). */
template <typename F>
ncclResult_t inOneGroup(size_t n, F call) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  ncclResult_t first = ncclSuccess;
  for (size_t i = 0; i < n && first == ncclSuccess; i++) first = call(i);
  r = ncclGroupEnd();
  return first != ncclSuccess ? first : r;
}

/* The checks both tensor-coalesced calls share: as many outputs as
 * inputs, each pair alike (dtype, device), all on the first input's
 * device, and output i bigOut ? size x : 1 / size of input i. */
void checkPairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                int size, bool bigOut, const char* op);
#endif

}  // namespace geoccl_torch

#endif
