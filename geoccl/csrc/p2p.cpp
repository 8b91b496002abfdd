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
 *
 * Batches (torch 1.x's batch_isend_irecv brackets its isend and irecv
 * calls with startCoalescing and endCoalescing): the worker runs one call
 * at a time and GeoCCL's host calls return when done, so a batch that
 * receives before it sends, on every rank, would wait forever one call at
 * a time. The calls of a batch are held back and run as one GeoCCL group,
 * which posts all their sends and receives together; each call keeps its
 * own work, completed when the group is.
 */
#include "process_group.hpp"

#include <algorithm>
#include <exception>
#include <memory>
#include <stdexcept>
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

#if TORCH_VERSION_MAJOR < 2
void ProcessGroupGeoCCL::startCoalescing() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!coalescing_, "geoccl: startCoalescing twice without endCoalescing");
  coalescing_ = true;
}

void ProcessGroupGeoCCL::endCoalescing(std::vector<c10::intrusive_ptr<BaseWork>>&) {
  std::vector<Item> items;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(coalescing_, "geoccl: endCoalescing without startCoalescing");
    coalescing_ = false;
    items.swap(batch_);
  }
  bool device = false;
  for (const auto& it : items) device = device || it.device;
  if (items.size() < 2 || device) {
    // the device path keeps its events and stream per call
    for (auto& it : items) push(std::move(it));
    return;
  }
  // One item for the worker: its job runs the calls' jobs in one group, its
  // post their posts, then completes each call's work; its own work has no
  // one waiting.
  auto members = std::make_shared<std::vector<Item>>(std::move(items));
  Item all;
  all.device = false;
  all.deviceIndex = -1;
  all.readyEvent = nullptr;
  all.what = c10::str("batch of ", members->size(), " sends and receives");
  all.work = c10::make_intrusive<WorkGeoCCL>(rank_, ::c10d::OpType::UNKNOWN, "batch",
                                             std::vector<at::Tensor>(), timeout_);
  all.job = [members](ncclComm_t comm, cudaStream_t s) {
    ncclResult_t first = ncclGroupStart();
    for (size_t i = 0; i < members->size() && first == ncclSuccess; i++)
      first = (*members)[i].job(comm, s);
    ncclResult_t r = ncclGroupEnd();
    if (first == ncclSuccess) first = r;
    if (first != ncclSuccess) {
      const char* last = ncclGetLastError(comm);
      auto error = std::make_exception_ptr(std::runtime_error(
          c10::str("geoccl: ", (*members)[0].what, " (in a batch of ", members->size(),
                   ") failed: ", ncclGetErrorString(first), (last && *last) ? ": " : "",
                   last ? last : "")));
      for (auto& m : *members) m.work->complete(error);
    }
    return first;
  };
  all.post = [members]() {
    for (auto& m : *members) {
      std::exception_ptr error;
      try {
        if (m.post) m.post();
      } catch (...) {
        error = std::current_exception();
      }
      m.work->complete(error);
    }
  };
  push(std::move(all));
}
#endif

}  // namespace geoccl_torch
