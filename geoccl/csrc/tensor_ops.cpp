/*
 * The tensor and reduction-op helpers of the geoccl process group's
 * collectives (tensor_ops.hpp says what each does).
 */
#include "tensor_ops.hpp"

#include <c10/util/Exception.h>

namespace geoccl_torch {

namespace {

/* The factor tensor of a PREMUL_SUM, undefined when the factor is a
 * double: torch 1.13 keeps a list of them (tensor_factors), 2.x one
 * (tensor_factor). */
template <typename S>
auto premulFactor(const S& s, int) -> decltype(s.tensor_factors, at::Tensor()) {
  return s.tensor_factors.empty() ? at::Tensor() : s.tensor_factors[0];
}
template <typename S>
auto premulFactor(const S& s, long) -> decltype(s.tensor_factor, at::Tensor()) {
  return s.tensor_factor;
}

}  // namespace

ncclDataType_t ncclType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    case at::kBool: return ncclUint8;
    default:
      TORCH_CHECK(false, "geoccl: tensors of dtype ", dtypeName(t),
                  " are not supported (float32, float64, float16, bfloat16, int32, int64, "
                  "uint8, int8, bool are)");
  }
  return ncclFloat32;  // not reached
}

const char* opName(const ::c10d::ReduceOp& op) {
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM: return "SUM";
    case ::c10d::ReduceOp::AVG: return "AVG";
    case ::c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case ::c10d::ReduceOp::MIN: return "MIN";
    case ::c10d::ReduceOp::MAX: return "MAX";
    case ::c10d::ReduceOp::BAND: return "BAND";
    case ::c10d::ReduceOp::BOR: return "BOR";
    case ::c10d::ReduceOp::BXOR: return "BXOR";
    case ::c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

RedOp ncclOp(const ::c10d::ReduceOp& op, const at::Tensor& t) {
  const bool isBool = t.scalar_type() == at::kBool;
  RedOp r;
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM: r.op = isBool ? ncclMax : ncclSum; return r;       // logical or
    case ::c10d::ReduceOp::PRODUCT: r.op = isBool ? ncclMin : ncclProd; return r;  // logical and
    case ::c10d::ReduceOp::MIN: r.op = ncclMin; return r;
    case ::c10d::ReduceOp::MAX: r.op = ncclMax; return r;
    case ::c10d::ReduceOp::AVG:
      TORCH_CHECK(!isBool, "geoccl: ReduceOp.AVG is not defined on bool tensors");
      r.op = ncclAvg;
      return r;
    case ::c10d::ReduceOp::PREMUL_SUM: {
      // as NCCL's PyTorch backend: a factor that is not an integer has no
      // meaning in an integer sum (a cast would turn 0.5 into 0)
      TORCH_CHECK(at::isFloatingType(t.scalar_type()),
                  "geoccl: ReduceOp.PREMUL_SUM needs a floating-point tensor (float32, "
                  "float64, float16, bfloat16), got ", dtypeName(t));
      auto* sup = dynamic_cast<::c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(sup != nullptr,
                  "geoccl: ReduceOp.PREMUL_SUM needs its factor (make the op with "
                  "torch.distributed._make_nccl_premul_sum(factor))");
      const at::Tensor f = premulFactor(*sup, 0);
      if (!f.defined()) {
        r.factor = sup->double_factor;
      } else {
        TORCH_CHECK(f.numel() == 1, "geoccl: PREMUL_SUM's factor tensor has ", f.numel(),
                    " elements; it needs 1");
        r.factor = f.item<double>();
      }
      r.premul = true;
      return r;
    }
    default:
      TORCH_CHECK(false, "geoccl: ReduceOp.", opName(op),
                  " is not supported (SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM are)");
  }
  return r;  // not reached
}

void checkTensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "geoccl: ", what, " is an undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "geoccl: ", what, " must be a dense tensor, not ",
              t.layout(), " (of sparse tensors, geoccl has all_reduce with SUM only)");
#if defined(GEOCCL_TORCH_CUDA) && defined(GEOCCL_TORCH_C10_CUDA)
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "geoccl: ", what,
              " is on device ", t.device(), "; CPU and CUDA tensors are supported");
#elif defined(GEOCCL_TORCH_CUDA)
  TORCH_CHECK(t.device().is_cpu(), "geoccl: ", what, " is on device ", t.device(), "; ",
              kNoC10Cuda);
#else
  TORCH_CHECK(t.device().is_cpu(), "geoccl: ", what, " is on device ", t.device(),
              "; this build of geoccl supports CPU tensors only (built without CUDA)");
#endif
  (void)ncclType(t);
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "geoccl: ", op, " takes exactly one tensor per process, got ",
              tensors.size());
  checkTensor(tensors[0], "the tensor");
  return tensors[0];
}

void checkLike(const at::Tensor& t, const at::Tensor& ref, const char* what) {
  checkTensor(t, what);
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "geoccl: ", what, " has dtype ",
              dtypeName(t), " but the input has ", dtypeName(ref));
  TORCH_CHECK(t.device() == ref.device(), "geoccl: ", what, " is on ", t.device(),
              " but the input is on ", ref.device());
}

void checkRoot(int64_t root, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "geoccl: ", op, " root rank ", root,
              " is out of range for a group of ", size, " ranks");
}

at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

char* bytesAt(const at::Tensor& t, int64_t elements) {
  return static_cast<char*>(t.data_ptr()) + elements * static_cast<int64_t>(t.element_size());
}

DensePairs::DensePairs(const std::vector<at::Tensor>& outputs,
                       const std::vector<at::Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); i++) {
    srcs.push_back(dense(inputs[i]));
    dsts.push_back(dense(outputs[i]));
    back.add(outputs[i], dsts.back());
  }
  used = srcs;
  used.insert(used.end(), dsts.begin(), dsts.end());
}

#if GEOCCL_TORCH_TENSOR_COALESCED
void checkPairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                int size, bool bigOut, const char* op) {
  TORCH_CHECK(outputs.size() == inputs.size(), "geoccl: ", op, " has ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); i++) {
    checkTensor(inputs[i], "an input");
    TORCH_CHECK(inputs[i].device() == inputs[0].device(), "geoccl: ", op, " input ", i,
                " is on ", inputs[i].device(), " but input 0 is on ", inputs[0].device());
    checkLike(outputs[i], inputs[i], "an output");
    const int64_t small = bigOut ? inputs[i].numel() : outputs[i].numel();
    const int64_t big = bigOut ? outputs[i].numel() : inputs[i].numel();
    TORCH_CHECK(big == small * size, "geoccl: ", op, " ", bigOut ? "output " : "input ", i,
                " has ", big, " elements; it needs ", size, " x ", small);
  }
}
#endif

}  // namespace geoccl_torch
