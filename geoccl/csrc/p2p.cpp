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
 * Batches: torch brackets calls with startCoalescing and endCoalescing
 * (torch 1.x around batch_isend_irecv's isend and irecv; torch 2.x, for a
 * backend whose supportsCoalescing() is true, around batch_isend_irecv's
 * and around any calls made in a _coalescing_manager block, collectives
 * too). The worker runs one call at a time and GeoCCL's host calls return
 * when done, so a batch that receives before it sends, on every rank,
 * would wait forever one call at a time. The calls of a batch are held
 * back, then run in one item of the worker: its sends and receives as one
 * GeoCCL group, which posts them all together, then its collectives in
 * call order, the order a GeoCCL group gives them; each call keeps its own
 * work, completed when the batch is, and torch 2.x gets one more for the
 * whole batch.
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

bool isP2p(::c10d::OpType t) {
  return t == ::c10d::OpType::SEND || t == ::c10d::OpType::RECV ||
         t == ::c10d::OpType::RECVANYSOURCE;
}

/* The error of the call that failed a batch; every call of the batch
 * fails with it (the batch runs as one, and its later calls never start). */
std::exception_ptr batchError(const std::string& what, size_t n, ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return std::make_exception_ptr(std::runtime_error(
      c10::str("geoccl: ", what, " (in a batch of ", n, " calls) failed: ", ncclGetErrorString(r),
               (last && *last) ? ": " : "", last ? last : "")));
}

}  // namespace

void ProcessGroupGeoCCL::enableAnySource() {
  received_.assign(static_cast<size_t>(size_), 0);
  anySource_ = true;
}

void ProcessGroupGeoCCL::announceSend(int dst) { store_->add(counterKey(rank_, dst), 1); }

int ProcessGroupGeoCCL::waitAnySource() {
  // How long to look: the group's timeout, as every other wait of it.
  const auto timeout = timeout_.load();
  const auto limit = timeout > std::chrono::milliseconds(0) ? timeout
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

#if GEOCCL_TORCH_COALESCING != 0
void ProcessGroupGeoCCL::startCoalescing() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!coalescing_, "geoccl: startCoalescing twice without endCoalescing");
  coalescing_ = true;
}
#endif

#if GEOCCL_TORCH_COALESCING == 1
void ProcessGroupGeoCCL::endCoalescing(std::vector<c10::intrusive_ptr<BaseWork>>&) {
  flushBatch();
}
#elif GEOCCL_TORCH_COALESCING == 2
c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::endCoalescing() { return flushBatch(); }
#endif

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::flushBatch() {
  std::vector<Item> items;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(coalescing_, "geoccl: endCoalescing without startCoalescing");
    coalescing_ = false;
    items.swap(batch_);
  }
  if (items.empty()) {
    auto none = c10::make_intrusive<WorkGeoCCL>(rank_, ::c10d::OpType::UNKNOWN, "batch",
                                                std::vector<at::Tensor>(), timeout_.load());
    none->complete(nullptr);
    return none;
  }
  bool device = false;
  size_t p2p = 0;
  for (const auto& it : items) {
    device = device || it.device;
    if (isP2p(it.type)) p2p++;
  }
  if (p2p < 2 || device) {
    // Nothing to post together, or the device path, which keeps its events
    // and stream per call: the worker runs the calls in order, so the last
    // one's work completes last.
    c10::intrusive_ptr<BaseWork> last = items.back().work;
    for (auto& it : items) push(std::move(it));
    return last;
  }
  // One item for the worker: its job runs the calls' jobs, its post their
  // posts, then completes each call's work; its own work, the batch's,
  // completes after them, failed with the first error among them.
  auto members = std::make_shared<std::vector<Item>>(std::move(items));
  Item all;
  all.type = ::c10d::OpType::UNKNOWN;
  all.device = false;
  all.deviceIndex = -1;
  all.readyEvent = nullptr;
  all.what = c10::str("batch of ", members->size(), " calls");
  all.work = c10::make_intrusive<WorkGeoCCL>(rank_, ::c10d::OpType::UNKNOWN, "batch",
                                             std::vector<at::Tensor>(), timeout_.load());
  all.job = [members](ncclComm_t comm, cudaStream_t s) {
    const size_t n = members->size();
    std::exception_ptr error;
    // false once a call has failed: the later ones are not started
    auto run = [&](Item& m) {
      try {
        ncclResult_t r = m.job(comm, s);
        if (r == ncclSuccess) return true;
        error = batchError(m.what, n, r, comm);
      } catch (...) {
        error = std::current_exception();
      }
      return false;
    };
    // The sends and receives in one group. The sends' jobs first: a
    // receive from any source waits for a peer's send to count itself,
    // and the group posts them together whatever their order (each
    // pair's sends, and its receives, keep theirs).
    ncclResult_t r = ncclGroupStart();
    bool ok = r == ncclSuccess;
    if (!ok) error = batchError("ncclGroupStart", n, r, comm);
    for (int pass = 0; pass < 2 && ok; pass++)
      for (auto& m : *members)
        if (ok && isP2p(m.type) && (m.type == ::c10d::OpType::SEND) == (pass == 0)) ok = run(m);
    if (r == ncclSuccess) {
      // Closed after a failure too, or every later call of the worker
      // would be recorded into this group; the calls posted run.
      r = ncclGroupEnd();
      if (ok && r != ncclSuccess) {
        ok = false;
        error = batchError("its sends and receives", n, r, comm);
      }
    }
    // Then the collectives, in call order, as GeoCCL's groups run them
    // (a collective's job may read what one of its own calls returned).
    for (auto& m : *members)
      if (ok && !isP2p(m.type)) ok = run(m);
    if (ok) return ncclSuccess;
    for (auto& m : *members) m.work->complete(error);
    std::rethrow_exception(error);
  };
  all.post = [members]() {
    std::exception_ptr first;
    for (auto& m : *members) {
      std::exception_ptr error;
      try {
        if (m.post) m.post();
      } catch (...) {
        error = std::current_exception();
        if (!first) first = error;
      }
      m.work->complete(error);
    }
    if (first) std::rethrow_exception(first);
  };
  c10::intrusive_ptr<BaseWork> work = all.work;
  push(std::move(all));
  return work;
}

}  // namespace geoccl_torch
