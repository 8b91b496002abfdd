/*
 * The geoccl process group's life: its Work objects, the communicator made
 * through the store, the worker thread that runs queued calls, abort and
 * destruction (process_group.hpp).  The collectives themselves, with their
 * argument checks on the caller's thread, are in collectives.cpp.
 */
// first, as Python asks of its header
#include <Python.h>

#include "process_group.hpp"

#include <cstring>
#include <stdexcept>

#include <ATen/core/ivalue.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#ifdef GEOCCL_TORCH_CUDA
#include <cuda_runtime.h>
#ifdef GEOCCL_TORCH_C10_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#endif

namespace geoccl_torch {

namespace {

const char kIdKey[] = "geoccl_unique_id";

std::string describe(const char* name, uint64_t seq, const at::Tensor& t) {
  return c10::str(name, " #", seq, " (", dtypeName(t), ", ", t.numel(), " elements)");
}

[[noreturn]] void geoFail(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw std::runtime_error(c10::str("geoccl: ", what, " failed: ", ncclGetErrorString(r),
                                    (last && *last) ? ": " : "", last ? last : ""));
}

#ifdef GEOCCL_TORCH_CUDA
void cudaCheck(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    throw std::runtime_error(c10::str("geoccl: ", call, " failed: ", cudaGetErrorString(e)));
}
#endif

#ifdef GEOCCL_TORCH_C10_CUDA
/* Tells the caching allocator that stream uses the tensors' memory: when
 * the last reference to one goes (the caller's, or the work's, even after
 * a failure), its block is handed on only once stream has passed that
 * point, not when the stream it was allocated on has. Memory the allocator
 * did not make is left alone by it. */
void recordOn(const std::vector<at::Tensor>& tensors, cudaStream_t stream, int device) {
  c10::cuda::CUDAStream s = c10::cuda::getStreamFromExternal(stream, device);
  for (const auto& t : tensors)
    if (t.defined() && t.device().is_cuda())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), s);
}
#endif

}  // namespace


/*
 * Work
 */
WorkGeoCCL::WorkGeoCCL(int rank, ::c10d::OpType type, const char* title,
                       std::vector<at::Tensor> outputs, std::chrono::milliseconds defaultTimeout)
    : BaseWork(rank, type, title),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))),
      defaultTimeout_(defaultTimeout),
      title_(title) {}

WorkGeoCCL::~WorkGeoCCL() = default;

bool WorkGeoCCL::wait(std::chrono::milliseconds timeout) {
  if (timeout == kNoTimeout) timeout = defaultTimeout_;
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout <= kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    TORCH_CHECK(false, "geoccl: ", title_, " did not complete within ", timeout.count(),
                " ms: wait's timeout passed first (GeoCCL's own limit is GEOCCL_TIMEOUT)");
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

std::vector<at::Tensor> WorkGeoCCL::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> WorkGeoCCL::getFuture() { return future_; }

void WorkGeoCCL::complete(std::exception_ptr error) {
  // The future first: whoever wait() wakes may look at it at once.
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
  finish(error);
}

/*
 * Process group
 */
ProcessGroupGeoCCL::ProcessGroupGeoCCL(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : BaseGroup(rank, size), store_(store), timeout_(timeout) {
  TORCH_CHECK(store, "geoccl: the process group needs a store");
  TORCH_CHECK(size > 0 && rank >= 0 && rank < size, "geoccl: rank ", rank,
              " is out of range for a group of ", size, " ranks");
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) geoFail(r, nullptr, "ncclGetUniqueId");
    const uint8_t* b = reinterpret_cast<const uint8_t*>(id.internal);
    store->set(kIdKey, std::vector<uint8_t>(b, b + sizeof id.internal));
  } else {
    std::vector<uint8_t> b = store->get(kIdKey);
    TORCH_CHECK(b.size() == sizeof id.internal, "geoccl: the store's ", kIdKey, " holds ",
                b.size(), " bytes, not the ", sizeof id.internal, " of an ncclUniqueId");
    std::memcpy(id.internal, b.data(), sizeof id.internal);
  }
  ncclResult_t r = ncclCommInitRank(&comm_, size, id, rank);
  std::memset(&id, 0, sizeof id);  // it holds the communicator's secret
  if (r != ncclSuccess) {
    comm_ = nullptr;
    geoFail(r, nullptr, c10::str("ncclCommInitRank (rank ", rank, " of ", size, ")"));
  }
  worker_ = std::thread([this] { run(); });
}

ProcessGroupGeoCCL::~ProcessGroupGeoCCL() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) {
    // Python drops its last reference to the group holding the GIL, and
    // the worker may then be dropping the last reference to a call's
    // tensor that Python also holds, or completing a future with Python
    // callbacks: both take the GIL. So the GIL is let go while it waits.
    PyThreadState* saved =
        Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
    worker_.join();
    if (saved) PyEval_RestoreThread(saved);
  }
#ifdef GEOCCL_TORCH_CUDA
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
  if (comm_) ncclCommDestroy(comm_);
}

void ProcessGroupGeoCCL::abort() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
  }
  if (comm_) ncclCommRevoke(comm_, 0);
}

uint64_t ProcessGroupGeoCCL::getSequenceNumberForGroup() {
  std::lock_guard<std::mutex> lock(mutex_);
  return userCalls_;
}

c10::intrusive_ptr<BaseWork> ProcessGroupGeoCCL::enqueue(::c10d::OpType type, const char* name,
                                                         const std::vector<at::Tensor>& inputs,
                                                         std::vector<at::Tensor> outputs, Job job,
                                                         std::function<void()> post, bool hold) {
  Item item;
  item.type = type;
  item.device = false;
  item.deviceIndex = -1;
  item.readyEvent = nullptr;
  const at::Tensor* first = !inputs.empty() ? &inputs[0] : (!outputs.empty() ? &outputs[0] : nullptr);
  for (const auto& t : inputs)
    if (t.device().is_cuda()) item.device = true, item.deviceIndex = t.device().index();
  for (const auto& t : outputs)
    if (t.device().is_cuda()) item.device = true, item.deviceIndex = t.device().index();
  for (const auto& t : inputs)
    TORCH_CHECK(t.device().is_cuda() == item.device, "geoccl: ", name,
                " mixes CPU and CUDA tensors");
  for (const auto& t : outputs)
    TORCH_CHECK(t.device().is_cuda() == item.device, "geoccl: ", name,
                " mixes CPU and CUDA tensors");

  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!aborted_, "geoccl: the process group was aborted");
    seq = ++seq_;
    if (hold) ++userCalls_;
  }
  item.what = first ? describe(name, seq, *first) : c10::str(name, " #", seq);

#ifdef GEOCCL_TORCH_CUDA
  if (item.device) {
#ifndef GEOCCL_TORCH_C10_CUDA
    TORCH_CHECK(false, "geoccl: ", name, ": ", kNoC10Cuda);
#else
    // The call must see what the caller's stream wrote before it.
    int prev = 0;
    cudaCheck(cudaGetDevice(&prev), "cudaGetDevice");
    cudaCheck(cudaSetDevice(item.deviceIndex), "cudaSetDevice");
    cudaEvent_t ev;
    cudaCheck(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    cudaStream_t caller = c10::cuda::getCurrentCUDAStream(item.deviceIndex).stream();
    cudaCheck(cudaEventRecord(ev, caller), "cudaEventRecord");
    cudaSetDevice(prev);
    item.readyEvent = ev;
#endif
  }
#endif

  item.tensors = inputs;
  item.tensors.insert(item.tensors.end(), outputs.begin(), outputs.end());

  item.work =
      c10::make_intrusive<WorkGeoCCL>(rank_, type, name, std::move(outputs), timeout_.load());
  item.job = std::move(job);
  item.post = std::move(post);
  auto work = item.work;
  push(std::move(item), hold);
  return work;
}

void ProcessGroupGeoCCL::push(Item item, bool hold) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (coalescing_ && hold) {
      batch_.push_back(std::move(item));
      return;
    }
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
}

void ProcessGroupGeoCCL::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left to run
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    runOne(item);
  }
}

void ProcessGroupGeoCCL::runOne(Item& item) {
  std::exception_ptr error;
  cudaStream_t stream = nullptr;  // set once work may be enqueued on it
  try {
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress)
      geoFail(async, comm_, item.what + " (the communicator failed earlier)");
#ifdef GEOCCL_TORCH_CUDA
    if (item.device) {
      cudaCheck(cudaSetDevice(item.deviceIndex), "cudaSetDevice");
      if (!stream_ || streamDevice_ != item.deviceIndex) {
        if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
        cudaStream_t s;
        cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
        stream_ = s;
        streamDevice_ = item.deviceIndex;
      }
      cudaStream_t s = static_cast<cudaStream_t>(stream_);
      cudaEvent_t ev = static_cast<cudaEvent_t>(item.readyEvent);
      item.readyEvent = nullptr;
      cudaError_t e = cudaStreamWaitEvent(s, ev, 0);
      cudaEventDestroy(ev);
      cudaCheck(e, "cudaStreamWaitEvent");
      stream = s;
#ifdef GEOCCL_TORCH_C10_CUDA
      recordOn(item.tensors, stream, item.deviceIndex);
#endif
    }
#endif
    ncclResult_t r = item.job(comm_, stream);
    if (r != ncclSuccess) geoFail(r, comm_, item.what);
#if defined(GEOCCL_TORCH_CUDA) && defined(GEOCCL_TORCH_C10_CUDA)
    if (item.device) {
      if (item.post) {
        // On the group's stream, after the call: the copies read what it wrote.
        c10::cuda::CUDAStreamGuard guard(
            c10::cuda::getStreamFromExternal(stream, item.deviceIndex));
        item.post();
      }
      cudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    } else if (item.post) {
      item.post();
    }
#else
    if (item.post) item.post();
#endif
  } catch (...) {
    error = std::current_exception();
#ifdef GEOCCL_TORCH_CUDA
    // Part of the call may be enqueued: the work completes (and its caller
    // may reuse the tensors) only once that part has finished. GeoCCL lets
    // its own waits of a failed call pass. The first error is the one told.
    if (stream && cudaStreamSynchronize(stream) != cudaSuccess) (void)cudaGetLastError();
#endif
  }
#ifdef GEOCCL_TORCH_CUDA
  if (item.readyEvent) cudaEventDestroy(static_cast<cudaEvent_t>(item.readyEvent));
#endif
  item.work->complete(error);
}

/*
 * Collectives
 */
}  // namespace geoccl_torch
