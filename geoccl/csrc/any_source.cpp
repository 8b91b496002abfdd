/*
 * Receives from any source (torch.distributed's recv and irecv without
 * src) on top of GeoCCL's point-to-point, which, like NCCL's, only
 * receives from a named rank: messages between two ranks meet in the order
 * they were posted, so a receive cannot be posted "to everyone" and taken
 * back from the peers that did not send.
 *
 * The group's store says who sent. With enableAnySource(), each send from
 * S to D first adds one to the store's counter "geoccl_p2p/S/D" (the
 * group's store is prefixed per group, so subgroups count apart); every
 * receive on D from S, named or not, counts what D has taken from S. A
 * receive from any source looks through the peers' counters for one that
 * sent more than this rank has taken, then receives the next message of
 * that pair with ncclRecv, which the pair's order makes the one counted.
 * Sends and named receives pay nothing else; each send pays one store
 * round trip, which is why it is asked for (GEOCCL_TORCH_ANY_SOURCE=1)
 * rather than always on. Both run on the worker thread, in call order
 * with the group's other calls.
 */
#include "process_group.hpp"

#include <algorithm>
#include <memory>
#include <thread>

#include <c10/util/Exception.h>

namespace geoccl_torch {

namespace {

std::string counterKey(int src, int dst) { return c10::str("geoccl_p2p/", src, "/", dst); }

}  // namespace

void ProcessGroupGeoCCL::enableAnySource() {
  received_.assign(static_cast<size_t>(size_), 0);
  anySource_ = true;
}

void ProcessGroupGeoCCL::announceSend(int dst) { store_->add(counterKey(rank_, dst), 1); }

int ProcessGroupGeoCCL::waitAnySource() {
  // How long to look: the group's timeout, as every other wait of it.
  const auto limit = timeout_ > std::chrono::milliseconds(0) ? timeout_
                                                             : std::chrono::milliseconds(1800000);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    // Start after the peer taken last, so that a busy sender does not
    // starve the others.
    for (int i = 1; i <= size_; i++) {
      int p = (lastAnySource_ + i) % size_;
      if (p == rank_) continue;
      int64_t sent = store_->add(counterKey(p, rank_), 0);
      if (sent > static_cast<int64_t>(received_[p])) {
        lastAnySource_ = p;
        return p;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TORCH_CHECK(!aborted_, "geoccl: recv from any source: the process group was aborted");
    }
    TORCH_CHECK(std::chrono::steady_clock::now() < deadline,
                "geoccl: recv from any source on rank ", rank_, ": no rank sent to it within ",
                limit.count(), " ms (the group's timeout); a send counts only where its rank "
                "also set GEOCCL_TORCH_ANY_SOURCE=1");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::recvAnysource(std::vector<at::Tensor>& tensors,
                                                               int /* tag */) {
  TORCH_CHECK(anySource_, "geoccl: recv without a source rank needs GEOCCL_TORCH_ANY_SOURCE=1 "
              "on every rank of the job (each send then also counts itself in the process "
              "group's store: one store round trip per send); or pass src=");
  TORCH_CHECK(tensors.size() == 1, "geoccl: recv takes exactly one tensor per process, got ",
              tensors.size());
  at::Tensor t = tensors[0];
  TORCH_CHECK(t.defined() && t.layout() == at::kStrided, "geoccl: recv needs a dense tensor");
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  // The source the job below finds, for the work's sourceRank(). The
  // receive is of bytes: a pair's messages meet by size, whatever dtype
  // each end names.
  auto source = std::make_shared<std::atomic<int>>(-1);
  const size_t bytes = static_cast<size_t>(buf.numel()) * buf.element_size();
  auto work = enqueue(
      ::c10d::OpType::RECVANYSOURCE, "recvAnySource", {}, {t},
      [this, buf, bytes, source](ncclComm_t comm, cudaStream_t s) {
        int src = waitAnySource();
        source->store(src);
        ncclResult_t r = ncclRecv(buf.data_ptr(), bytes, ncclUint8, src, comm, s);
        if (r == ncclSuccess) received_[src]++;
        return r;
      },
      [t, buf]() {
        if (!t.is_same(buf)) {
          auto dst = t;
          dst.copy_(buf.view(dst.sizes()));
        }
      });
  c10::static_intrusive_pointer_cast<WorkGeoCCL>(work)->setSource(source);
  return work;
}

}  // namespace geoccl_torch
