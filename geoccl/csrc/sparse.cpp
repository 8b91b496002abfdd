/*
 * all_reduce (SUM) of a sparse COO tensor on CPU, which gloo offers and
 * GeoCCL's NCCL API, made for dense buffers, does not: a rank's nonzeros
 * are at indices the others do not know, so the sum is made from every
 * rank's entries.
 *
 * On the worker thread, in call order with the group's other calls:
 *  1. an all-gather of a header per rank: its number of nonzeros (nnz),
 *     sparse and dense dimensions, dtype and a hash of its sizes; ranks
 *     whose tensors differ all fail, with the same message, after it;
 *  2. an all-gather of every rank's indices, then one of its values, each
 *     padded to the largest nnz (the NCCL API's all-gather takes the same
 *     count from every rank);
 *  3. the entries of all ranks, cut back to each rank's nnz, make one
 *     sparse tensor of the input's sizes, coalesced, which sums the
 *     entries that share an index. Every rank adds the same entries in the
 *     same (rank) order, so the result is the same on every rank.
 * The result replaces the input's contents (copy_), as gloo's does. The
 * values travel as bytes, so any dtype that coalesce sums is carried.
 *
 * Other reductions, CUDA sparse tensors and every other collective on a
 * sparse tensor are refused before anything is queued.
 */
#include "process_group.hpp"

#include <algorithm>
#include <memory>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

namespace geoccl_torch {

namespace {

/* One rank's header: what every rank must agree on, and its nnz. */
enum { kNnz, kSparseDim, kDenseDim, kDtype, kSizesHash, kHeaderLen };

int64_t sizesHash(at::IntArrayRef sizes) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the dimension count and sizes
  auto mix = [&h](int64_t v) {
    for (int i = 0; i < 8; i++) {
      h ^= static_cast<uint64_t>(v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<int64_t>(sizes.size()));
  for (int64_t s : sizes) mix(s);
  return static_cast<int64_t>(h >> 1);
}

}  // namespace

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::allreduceSparse(
    at::Tensor& t, const ::c10d::AllreduceOptions& opts) {
  TORCH_CHECK(t.layout() == at::kSparse, "geoccl: all_reduce of a ", t.layout(),
              " tensor is not supported (dense and sparse COO tensors are)");
  TORCH_CHECK(opts.reduceOp == ::c10d::ReduceOp::SUM,
              "geoccl: all_reduce of a sparse tensor supports ReduceOp.SUM only");
  TORCH_CHECK(t.device().is_cpu(), "geoccl: all_reduce of a sparse tensor takes CPU tensors "
              "only; this one is on ", t.device(), " (move it to the CPU, or make it dense)");

  at::Tensor in = t.coalesce();
  at::Tensor indices = in._indices().contiguous();  // int64 [sparseDim, nnz]
  at::Tensor values = in._values().contiguous();    // [nnz, dense sizes...]
  const int64_t nnz = in._nnz();
  const int64_t sparseDim = in.sparse_dim();
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  std::vector<int64_t> denseSizes(values.sizes().begin() + 1, values.sizes().end());
  const int64_t rowElems = c10::multiply_integers(denseSizes);
  const int64_t rowBytesAll = rowElems * static_cast<int64_t>(values.element_size());

  at::Tensor header = at::empty({kHeaderLen}, at::TensorOptions().dtype(at::kLong));
  int64_t* h = header.data_ptr<int64_t>();
  h[kNnz] = nnz;
  h[kSparseDim] = sparseDim;
  h[kDenseDim] = in.dense_dim();
  h[kDtype] = static_cast<int64_t>(t.scalar_type());
  h[kSizesHash] = sizesHash(t.sizes());

  auto result = std::make_shared<at::Tensor>();
  const int size = size_;
  const at::TensorOptions valueOpts = values.options();
  const at::TensorOptions sparseOpts = valueOpts.layout(at::kSparse);
  return enqueueColl(opts,
      ::c10d::OpType::ALLREDUCE, "allreduce_sparse", {values, indices, header}, {t},
      [=](ncclComm_t comm, cudaStream_t s) {
        at::Tensor headers = at::empty({size, kHeaderLen}, header.options());
        ncclResult_t r = ncclAllGather(header.data_ptr(), headers.data_ptr(), kHeaderLen,
                                       ncclInt64, comm, s);
        if (r != ncclSuccess) return r;
        const int64_t* all = headers.data_ptr<int64_t>();
        int64_t maxNnz = 0;
        for (int p = 0; p < size; p++) {
          const int64_t* o = all + p * kHeaderLen;
          TORCH_CHECK(o[kSparseDim] == all[kSparseDim] && o[kDenseDim] == all[kDenseDim] &&
                          o[kDtype] == all[kDtype] && o[kSizesHash] == all[kSizesHash],
                      "geoccl: all_reduce of sparse tensors: rank ", p, "'s tensor differs "
                      "from rank 0's in sizes, sparse or dense dimensions, or dtype (every "
                      "rank passes a tensor of the same sizes, layout and dtype)");
          maxNnz = std::max(maxNnz, o[kNnz]);
        }
        if (maxNnz == 0) {
          *result = at::sparse_coo_tensor(indices, values, sizes, sparseOpts).coalesce();
          return ncclSuccess;
        }

        at::Tensor myIdx = at::zeros({sparseDim, maxNnz}, indices.options());
        myIdx.narrow(1, 0, nnz).copy_(indices);
        std::vector<int64_t> valShape{maxNnz};
        valShape.insert(valShape.end(), denseSizes.begin(), denseSizes.end());
        at::Tensor myVal = at::zeros(valShape, valueOpts);
        if (nnz) myVal.narrow(0, 0, nnz).copy_(values);

        at::Tensor allIdx = at::empty({size, sparseDim, maxNnz}, indices.options());
        std::vector<int64_t> allValShape{size};
        allValShape.insert(allValShape.end(), valShape.begin(), valShape.end());
        at::Tensor allVal = at::empty(allValShape, valueOpts);
        r = ncclAllGather(myIdx.data_ptr(), allIdx.data_ptr(), myIdx.numel(), ncclInt64, comm,
                          s);
        if (r != ncclSuccess) return r;
        if (rowBytesAll > 0) {  // a dense size of 0 leaves no values to carry
          r = ncclAllGather(myVal.data_ptr(), allVal.data_ptr(),
                            static_cast<size_t>(maxNnz * rowBytesAll), ncclUint8, comm, s);
          if (r != ncclSuccess) return r;
        }

        std::vector<at::Tensor> idxParts, valParts;
        for (int p = 0; p < size; p++) {
          const int64_t n = all[p * kHeaderLen + kNnz];
          if (n == 0) continue;
          idxParts.push_back(allIdx[p].narrow(1, 0, n));
          valParts.push_back(allVal[p].narrow(0, 0, n));
        }
        *result = at::sparse_coo_tensor(at::cat(idxParts, 1), at::cat(valParts, 0), sizes,
                                        sparseOpts)
                      .coalesce();
        return ncclSuccess;
      },
      [t, result]() {
        auto dst = t;
        dst.copy_(*result);
      });
}

}  // namespace geoccl_torch
