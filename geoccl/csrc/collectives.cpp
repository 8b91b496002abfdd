/*
 * The geoccl process group's collectives: each checks its tensors on the
 * caller's thread and queues the GeoCCL calls that the group's worker
 * thread runs (process_group.cpp); the helpers they share are in
 * tensor_ops.{hpp,cpp}.
 */
#include "process_group.hpp"
#include "tensor_ops.hpp"

#include <cstring>
#include <stdexcept>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#ifdef GEOCCL_TORCH_CUDA
#include <cuda_runtime.h>
#ifdef GEOCCL_TORCH_C10_CUDA
#include <c10/cuda/CUDAStream.h>
#endif
#endif

namespace geoccl_torch {

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                           const ::c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse())
    return allreduceSparse(tensors[0], opts);  // sparse.cpp
  const at::Tensor& t = single(tensors, "allreduce");
  RedOp op = ncclOp(opts.reduceOp, t);
  ncclDataType_t dt = ncclType(t);
  at::Tensor buf = dense(t);
  CopyBack back;
  back.add(t, buf);
  return enqueueColl(opts,
      ::c10d::OpType::ALLREDUCE, "allreduce", {buf}, {t},
      [buf, op, dt](ncclComm_t comm, cudaStream_t s) {
        return op.with(comm, dt, [&](ncclRedOp_t o) {
          return ncclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, o, comm, s);
        });
      },
      back);
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "geoccl: allreduce_coalesced needs at least one tensor");
  std::vector<at::Tensor> bufs;
  std::vector<RedOp> ops;
  CopyBack back;
  for (const auto& t : tensors) {
    checkLike(t, tensors[0], "a tensor of allreduce_coalesced");
    ops.push_back(ncclOp(opts.reduceOp, t));
    bufs.push_back(dense(t));
    back.add(t, bufs.back());
  }
  return enqueueColl(opts,
      ::c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", bufs, tensors,
      [bufs, ops](ncclComm_t comm, cudaStream_t s) {
        for (size_t i = 0; i < bufs.size(); i++) {
          ncclResult_t r = ops[i].with(comm, ncclType(bufs[i]), [&](ncclRedOp_t o) {
            return ncclAllReduce(bufs[i].data_ptr(), bufs[i].data_ptr(), bufs[i].numel(),
                                 ncclType(bufs[i]), o, comm, s);
          });
          if (r != ncclSuccess) return r;
        }
        return ncclSuccess;
      },
      back);
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                           const ::c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single(tensors, "broadcast");
  TORCH_CHECK(opts.rootTensor == 0, "geoccl: broadcast rootTensor must be 0, got ",
              opts.rootTensor);
  checkRoot(opts.rootRank, size_, "broadcast");
  int root = static_cast<int>(opts.rootRank);
  ncclDataType_t dt = ncclType(t);
  at::Tensor buf = dense(t);
  CopyBack back;
  back.add(t, buf);
  return enqueueColl(opts,
      ::c10d::OpType::BROADCAST, "broadcast", {buf}, {t},
      [buf, dt, root](ncclComm_t comm, cudaStream_t s) {
        return ncclBroadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, root, comm, s);
      },
      back);
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::reduce(std::vector<at::Tensor>& tensors,
                                                        const ::c10d::ReduceOptions& opts) {
  const at::Tensor& t = single(tensors, "reduce");
  TORCH_CHECK(opts.rootTensor == 0, "geoccl: reduce rootTensor must be 0, got ", opts.rootTensor);
  checkRoot(opts.rootRank, size_, "reduce");
  int root = static_cast<int>(opts.rootRank);
  RedOp op = ncclOp(opts.reduceOp, t);
  ncclDataType_t dt = ncclType(t);
  at::Tensor buf = dense(t);
  CopyBack back;
  if (rank_ == root) back.add(t, buf);
  return enqueueColl(opts,
      ::c10d::OpType::REDUCE, "reduce", {buf}, {t},
      [buf, op, dt, root](ncclComm_t comm, cudaStream_t s) {
        return op.with(comm, dt, [&](ncclRedOp_t o) {
          return ncclReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, o, root, comm, s);
        });
      },
      back);
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  const at::Tensor& in = single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, "geoccl: allgather takes one output list per process, got ",
              outputs.size());
  auto& outs = outputs[0];
  TORCH_CHECK(static_cast<int>(outs.size()) == size_, "geoccl: allgather needs ", size_,
              " output tensors (one per rank), got ", outs.size());
  for (const auto& o : outs) {
    checkLike(o, in, "an allgather output");
    TORCH_CHECK(o.numel() == in.numel(), "geoccl: allgather output has ", o.numel(),
                " elements but the input has ", in.numel());
  }
  ncclDataType_t dt = ncclType(in);
  at::Tensor src = dense(in);
  at::Tensor flat = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
  std::vector<at::Tensor> outCopy = outs;
  int64_t n = in.numel();
  return enqueueColl(opts,
      ::c10d::OpType::ALLGATHER, "allgather", {src, flat}, outs,
      [src, flat, dt](ncclComm_t comm, cudaStream_t s) {
        return ncclAllGather(src.data_ptr(), flat.data_ptr(), src.numel(), dt, comm, s);
      },
      [outCopy, flat, n]() {
        for (size_t i = 0; i < outCopy.size(); i++) {
          auto dst = outCopy[i];
          dst.copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(dst.sizes()));
        }
      });
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::_allgather_base(at::Tensor& output,
                                                                 at::Tensor& input,
                                                                 const ::c10d::AllgatherOptions& opts) {
  checkTensor(input, "the allgather input");
  checkLike(output, input, "the allgather output");
  TORCH_CHECK(output.numel() == input.numel() * size_, "geoccl: _allgather_base output has ",
              output.numel(), " elements; it needs ", size_, " x ", input.numel());
  ncclDataType_t dt = ncclType(input);
  at::Tensor src = dense(input);
  at::Tensor dst = dense(output);
  CopyBack back;
  back.add(output, dst);
  return enqueueColl(opts,
      ::c10d::OpType::_ALLGATHER_BASE, "_allgather_base", {src, dst}, {output},
      [src, dst, dt](ncclComm_t comm, cudaStream_t s) {
        return ncclAllGather(src.data_ptr(), dst.data_ptr(), src.numel(), dt, comm, s);
      },
      back);
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_, "geoccl: allgather_coalesced needs ",
              size_, " output lists (one per rank), got ", outputs.size());
  std::vector<at::Tensor> srcs, flats, outs;
  for (size_t i = 0; i < inputs.size(); i++) {
    checkTensor(inputs[i], "an allgather_coalesced input");
    srcs.push_back(dense(inputs[i]));
    flats.push_back(at::empty({static_cast<int64_t>(size_) * inputs[i].numel()},
                              inputs[i].options()));
  }
  for (int r = 0; r < size_; r++) {
    TORCH_CHECK(outputs[r].size() == inputs.size(), "geoccl: allgather_coalesced output list ",
                r, " has ", outputs[r].size(), " tensors for ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); i++) {
      checkLike(outputs[r][i], inputs[i], "an allgather_coalesced output");
      TORCH_CHECK(outputs[r][i].numel() == inputs[i].numel(), "geoccl: allgather_coalesced "
                  "output ", i, " of rank ", r, " has ", outputs[r][i].numel(),
                  " elements but input ", i, " has ", inputs[i].numel());
      outs.push_back(outputs[r][i]);
    }
  }
  std::vector<std::vector<at::Tensor>> outCopy = outputs;
  return enqueueColl(opts,
      ::c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", srcs, outs,
      [srcs, flats](ncclComm_t comm, cudaStream_t s) {
        for (size_t i = 0; i < srcs.size(); i++) {
          ncclResult_t r = ncclAllGather(srcs[i].data_ptr(), flats[i].data_ptr(),
                                         srcs[i].numel(), ncclType(srcs[i]), comm, s);
          if (r != ncclSuccess) return r;
        }
        return ncclSuccess;
      },
      [outCopy, flats]() {
        for (size_t r = 0; r < outCopy.size(); r++)
          for (size_t i = 0; i < flats.size(); i++) {
            auto dst = outCopy[r][i];
            int64_t n = dst.numel();
            dst.copy_(flats[i].narrow(0, static_cast<int64_t>(r) * n, n).view(dst.sizes()));
          }
      });
}

#if GEOCCL_TORCH_TENSOR_COALESCED
c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  checkPairs(outputs, inputs, size_, true, "allgather_into_tensor_coalesced");
  const DensePairs b(outputs, inputs);
  return enqueueColl(opts,
      ::c10d::OpType::COALESCED, "allgather_into_tensor_coalesced", b.used, outputs,
      [srcs = b.srcs, dsts = b.dsts](ncclComm_t comm, cudaStream_t s) {
        return inOneGroup(srcs.size(), [&](size_t i) {
          return ncclAllGather(srcs[i].data_ptr(), dsts[i].data_ptr(), srcs[i].numel(),
                               ncclType(srcs[i]), comm, s);
        });
      },
      b.back);
}
#endif

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::GatherOptions& opts) {
  const at::Tensor& in = single(inputs, "gather");
  checkRoot(opts.rootRank, size_, "gather");
  int root = static_cast<int>(opts.rootRank);
  ncclDataType_t dt = ncclType(in);
  at::Tensor src = dense(in);
  int64_t n = in.numel();
  std::vector<at::Tensor> outs;
  at::Tensor flat;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "geoccl: gather's root needs one list of ", size_, " output tensors");
    for (const auto& o : outputs[0]) {
      checkLike(o, in, "a gather output");
      TORCH_CHECK(o.numel() == n, "geoccl: gather output has ", o.numel(),
                  " elements but the input has ", n);
    }
    outs = outputs[0];
    flat = at::empty({static_cast<int64_t>(size_) * n}, in.options());
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "geoccl: gather takes output tensors on the root rank only (this is rank ",
                rank_, ", the root is ", root, ")");
  }
  std::vector<at::Tensor> ins{src};
  if (flat.defined()) ins.push_back(flat);
  return enqueueColl(opts,
      ::c10d::OpType::GATHER, "gather", ins, outs,
      [src, flat, dt, root](ncclComm_t comm, cudaStream_t s) {
        return ncclGather(src.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr, src.numel(),
                          dt, root, comm, s);
      },
      [outs, flat, n]() {
        for (size_t i = 0; i < outs.size(); i++) {
          auto dst = outs[i];
          dst.copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(dst.sizes()));
        }
      });
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "scatter");
  checkRoot(opts.rootRank, size_, "scatter");
  int root = static_cast<int>(opts.rootRank);
  ncclDataType_t dt = ncclType(out);
  int64_t n = out.numel();
  at::Tensor flat;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "geoccl: scatter's root needs one list of ", size_, " input tensors");
    for (const auto& i : inputs[0]) {
      checkLike(i, out, "a scatter input");
      TORCH_CHECK(i.numel() == n, "geoccl: scatter input has ", i.numel(),
                  " elements but the output has ", n);
    }
    std::vector<at::Tensor> flats;
    for (const auto& i : inputs[0]) flats.push_back(i.reshape({-1}));
    flat = at::cat(flats);
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "geoccl: scatter takes input tensors on the root rank only (this is rank ",
                rank_, ", the root is ", root, ")");
  }
  at::Tensor dst = dense(out);
  CopyBack back;
  back.add(out, dst);
  std::vector<at::Tensor> ins;
  if (flat.defined()) ins.push_back(flat);
  ins.push_back(dst);
  return enqueueColl(opts,
      ::c10d::OpType::SCATTER, "scatter", ins, {out},
      [flat, dst, dt, root](ncclComm_t comm, cudaStream_t s) {
        return ncclScatter(flat.defined() ? flat.data_ptr() : nullptr, dst.data_ptr(), dst.numel(),
                           dt, root, comm, s);
      },
      back);
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "geoccl: reduce_scatter needs one list of ", size_, " input tensors");
  int64_t n = out.numel();
  for (const auto& i : inputs[0]) {
    checkLike(i, out, "a reduce_scatter input");
    TORCH_CHECK(i.numel() == n, "geoccl: reduce_scatter input has ", i.numel(),
                " elements but the output has ", n);
  }
  RedOp op = ncclOp(opts.reduceOp, out);
  ncclDataType_t dt = ncclType(out);
  std::vector<at::Tensor> flats;
  for (const auto& i : inputs[0]) flats.push_back(i.reshape({-1}));
  at::Tensor flat = at::cat(flats);
  at::Tensor dst = dense(out);
  CopyBack back;
  back.add(out, dst);
  return enqueueColl(opts,
      ::c10d::OpType::REDUCE_SCATTER, "reduce_scatter", {flat, dst}, {out},
      [flat, dst, op, dt](ncclComm_t comm, cudaStream_t s) {
        return op.with(comm, dt, [&](ncclRedOp_t o) {
          return ncclReduceScatter(flat.data_ptr(), dst.data_ptr(), dst.numel(), dt, o, comm, s);
        });
      },
      back);
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) {
  checkTensor(input, "the reduce_scatter input");
  checkLike(output, input, "the reduce_scatter output");
  TORCH_CHECK(input.numel() == output.numel() * size_, "geoccl: _reduce_scatter_base input has ",
              input.numel(), " elements; it needs ", size_, " x ", output.numel());
  RedOp op = ncclOp(opts.reduceOp, input);
  ncclDataType_t dt = ncclType(input);
  at::Tensor src = dense(input);
  at::Tensor dst = dense(output);
  CopyBack back;
  back.add(output, dst);
  return enqueueColl(opts,
      ::c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", {src, dst}, {output},
      [src, dst, op, dt](ncclComm_t comm, cudaStream_t s) {
        return op.with(comm, dt, [&](ncclRedOp_t o) {
          return ncclReduceScatter(src.data_ptr(), dst.data_ptr(), dst.numel(), dt, o, comm, s);
        });
      },
      back);
}

#if GEOCCL_TORCH_TENSOR_COALESCED
c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  checkPairs(outputs, inputs, size_, false, "reduce_scatter_tensor_coalesced");
  std::vector<RedOp> ops;
  for (const auto& t : inputs) ops.push_back(ncclOp(opts.reduceOp, t));
  const DensePairs b(outputs, inputs);
  return enqueueColl(opts,
      ::c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", b.used, outputs,
      [srcs = b.srcs, dsts = b.dsts, ops](ncclComm_t comm, cudaStream_t s) {
        // PREMUL_SUM's ops must outlive the group, which runs at its end
        const size_t n = srcs.size();
        std::vector<ncclRedOp_t> made(n);
        size_t nmade = 0;
        ncclResult_t r = ncclSuccess;
        for (; nmade < n; nmade++) {
          r = ops[nmade].make(comm, ncclType(srcs[nmade]), &made[nmade]);
          if (r != ncclSuccess) break;
        }
        if (r == ncclSuccess)
          r = inOneGroup(n, [&](size_t i) {
            return ncclReduceScatter(srcs[i].data_ptr(), dsts[i].data_ptr(), dsts[i].numel(),
                                     ncclType(srcs[i]), made[i], comm, s);
          });
        for (size_t i = 0; i < nmade; i++)
          if (ops[i].premul) ncclRedOpDestroy(made[i], comm);
        return r;
      },
      b.back);
}
#endif

namespace {

/* Element counts and offsets of an all-to-all split along dimension 0. */
void splitsOf(const at::Tensor& t, const std::vector<int64_t>& splits, int size, const char* what,
              std::vector<int64_t>& counts, std::vector<int64_t>& offsets) {
  counts.assign(size, 0);
  offsets.assign(size, 0);
  if (splits.empty()) {
    TORCH_CHECK(t.dim() > 0 && t.size(0) % size == 0, "geoccl: alltoall_base ", what,
                " needs a first dimension divisible by ", size, " (or split sizes)");
    for (int p = 0; p < size; p++) {
      counts[p] = t.numel() / size;
      offsets[p] = p * counts[p];
    }
    return;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == size, "geoccl: alltoall_base ", what,
              " split sizes have ", splits.size(), " entries for ", size, " ranks");
  TORCH_CHECK(t.dim() > 0, "geoccl: alltoall_base ", what, " must have a first dimension");
  int64_t row = t.size(0) ? t.numel() / t.size(0) : 0;
  int64_t sum = 0;
  for (int p = 0; p < size; p++) {
    TORCH_CHECK(splits[p] >= 0, "geoccl: alltoall_base ", what, " split size ", splits[p],
                " is negative");
    counts[p] = splits[p] * row;
    offsets[p] = sum * row;
    sum += splits[p];
  }
  TORCH_CHECK(sum == t.size(0), "geoccl: alltoall_base ", what, " split sizes add up to ", sum,
              " but its first dimension is ", t.size(0));
}

/* The rank's own part is a local copy; the others are one group of sends
 * and receives. */
ncclResult_t exchange(ncclComm_t comm, cudaStream_t s, int rank, int size,
                      const std::vector<char*>& sendPtr, const std::vector<int64_t>& sendCount,
                      const std::vector<char*>& recvPtr, const std::vector<int64_t>& recvCount,
                      ncclDataType_t dt, size_t elemSize, bool device) {
  if (sendCount[rank] > 0) {
    size_t bytes = static_cast<size_t>(sendCount[rank]) * elemSize;
#ifdef GEOCCL_TORCH_CUDA
    if (device) {
      if (cudaMemcpyAsync(recvPtr[rank], sendPtr[rank], bytes, cudaMemcpyDeviceToDevice, s) !=
          cudaSuccess)
        return ncclUnhandledCudaError;
    } else
#endif
      std::memmove(recvPtr[rank], sendPtr[rank], bytes);
  }
  (void)device;
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  ncclResult_t first = ncclSuccess;
  for (int p = 0; p < size && first == ncclSuccess; p++) {
    if (p == rank) continue;
    if (sendCount[p] > 0) first = ncclSend(sendPtr[p], sendCount[p], dt, p, comm, s);
    if (first == ncclSuccess && recvCount[p] > 0)
      first = ncclRecv(recvPtr[p], recvCount[p], dt, p, comm, s);
  }
  r = ncclGroupEnd();
  return first != ncclSuccess ? first : r;
}

}  // namespace

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits, const ::c10d::AllToAllOptions& opts) {
  checkTensor(input, "the alltoall input");
  checkLike(output, input, "the alltoall output");
  std::vector<int64_t> sc, so, rc, ro;
  splitsOf(input, inputSplits, size_, "input", sc, so);
  splitsOf(output, outputSplits, size_, "output", rc, ro);
  ncclDataType_t dt = ncclType(input);
  at::Tensor src = dense(input);
  at::Tensor dst = dense(output);
  CopyBack back;
  back.add(output, dst);
  int rank = rank_, size = size_;
  bool device = input.device().is_cuda();
  bool equal = inputSplits.empty() && outputSplits.empty();
  if (equal)
    TORCH_CHECK(input.numel() == output.numel(), "geoccl: alltoall_base input has ",
                input.numel(), " elements and the output ", output.numel());
  return enqueueColl(opts,
      ::c10d::OpType::ALLTOALL_BASE, "alltoall_base", {src, dst}, {output},
      [=](ncclComm_t comm, cudaStream_t s) {
        if (equal) return ncclAlltoAll(src.data_ptr(), dst.data_ptr(), sc[0], dt, comm, s);
        std::vector<char*> sp(size), rp(size);
        for (int p = 0; p < size; p++) {
          sp[p] = bytesAt(src, so[p]);
          rp[p] = bytesAt(dst, ro[p]);
        }
        return exchange(comm, s, rank, size, sp, sc, rp, rc, dt, src.element_size(), device);
      },
      back);
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const ::c10d::AllToAllOptions& opts) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ &&
                  static_cast<int>(outputs.size()) == size_,
              "geoccl: alltoall needs ", size_, " input and ", size_,
              " output tensors, got ", inputs.size(), " and ", outputs.size());
  checkTensor(inputs[0], "an alltoall input");
  for (const auto& t : inputs) checkLike(t, inputs[0], "an alltoall input");
  for (const auto& t : outputs) checkLike(t, inputs[0], "an alltoall output");
  TORCH_CHECK(inputs[rank_].numel() == outputs[rank_].numel(), "geoccl: alltoall input ",
              rank_, " (to this rank) has ", inputs[rank_].numel(), " elements, output ", rank_,
              " has ", outputs[rank_].numel());
  ncclDataType_t dt = ncclType(inputs[0]);
  std::vector<at::Tensor> srcs, dsts;
  std::vector<int64_t> sc, rc;
  CopyBack back;
  for (int p = 0; p < size_; p++) {
    srcs.push_back(dense(inputs[p]));
    dsts.push_back(dense(outputs[p]));
    back.add(outputs[p], dsts.back());
    sc.push_back(inputs[p].numel());
    rc.push_back(outputs[p].numel());
  }
  int rank = rank_, size = size_;
  bool device = inputs[0].device().is_cuda();
  std::vector<at::Tensor> used = srcs;
  used.insert(used.end(), dsts.begin(), dsts.end());
  return enqueueColl(opts,
      ::c10d::OpType::ALLTOALL, "alltoall", used, outputs,
      [=](ncclComm_t comm, cudaStream_t s) {
        std::vector<char*> sp(size), rp(size);
        for (int p = 0; p < size; p++) {
          sp[p] = static_cast<char*>(srcs[p].data_ptr());
          rp[p] = static_cast<char*>(dsts[p].data_ptr());
        }
        return exchange(comm, s, rank, size, sp, sc, rp, rc, dt, srcs[0].element_size(), device);
      },
      back);
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::send(std::vector<at::Tensor>& tensors,
                                                      int dstRank, int /* tag */) {
  const at::Tensor& t = single(tensors, "send");
  checkRoot(dstRank, size_, "send");
  TORCH_CHECK(dstRank != rank_, "geoccl: send to its own rank ", dstRank);
  ncclDataType_t dt = ncclType(t);
  at::Tensor buf = dense(t);
  return enqueue(::c10d::OpType::SEND, "send", {buf}, {},
                 [this, buf, dt, dstRank](ncclComm_t comm, cudaStream_t s) {
                   if (anySource_) announceSend(dstRank);
                   return ncclSend(buf.data_ptr(), buf.numel(), dt, dstRank, comm, s);
                 });
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::recv(std::vector<at::Tensor>& tensors,
                                                      int srcRank, int /* tag */) {
  const at::Tensor& t = single(tensors, "recv");
  checkRoot(srcRank, size_, "recv");
  TORCH_CHECK(srcRank != rank_, "geoccl: recv from its own rank ", srcRank);
  ncclDataType_t dt = ncclType(t);
  at::Tensor buf = dense(t);
  CopyBack back;
  back.add(t, buf);
  return enqueue(
      ::c10d::OpType::RECV, "recv", {buf}, {t},
      [this, buf, dt, srcRank](ncclComm_t comm, cudaStream_t s) {
        ncclResult_t r = ncclRecv(buf.data_ptr(), buf.numel(), dt, srcRank, comm, s);
        if (r == ncclSuccess && anySource_) received_[srcRank]++;
        return r;
      },
      back);
}

void ProcessGroupGeoCCL::callOnWorker(const char* name,
                                      std::function<ncclResult_t(ncclComm_t)> fn) {
  // Not held back by a batch: its caller waits for it now.
  auto work = enqueue(::c10d::OpType::UNKNOWN, name, {}, {},
                      [fn](ncclComm_t comm, cudaStream_t) { return fn(comm); }, nullptr, false);
  work->wait(kNoTimeout);
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::barrier(const ::c10d::BarrierOptions& opts) {
  // One element on the host path: it runs after everything queued before it.
  at::Tensor flag = at::zeros({1}, at::TensorOptions().dtype(at::kInt));
  return enqueueColl(opts, ::c10d::OpType::BARRIER, "barrier", {}, {},
                     [flag](ncclComm_t comm, cudaStream_t) {
                       return ncclAllReduce(flag.data_ptr(), flag.data_ptr(), 1, ncclInt32,
                                            ncclSum, comm, nullptr);
                     });
}

}  // namespace geoccl_torch
