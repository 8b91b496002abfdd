/*
 * The `geoccl` backend of torch.distributed: a c10d process group whose
 * collectives are GeoCCL's NCCL API calls.
 *
 * Which PyTorch API it implements is chosen when it is compiled:
 *  - torch 1.x: a subclass of c10d::ProcessGroup (the collectives are its
 *    virtual methods); its work objects are c10d::Work where the headers
 *    have torch/csrc/distributed/c10d/Work.hpp, else ProcessGroup::Work;
 *  - torch 2.x: a subclass of c10d::Backend, which a c10d::ProcessGroup
 *    made by torch.distributed dispatches to.
 *
 * Threads: every collective is queued, in call order, to one worker thread
 * per process group, which makes GeoCCL's calls (a GeoCCL communicator is
 * used by one thread at a time). The calling thread returns at once with a
 * work object; wait() blocks until the worker has run the call and raises
 * the GeoCCL error text (ncclGetErrorString and ncclGetLastError) when it
 * failed. The communicator is only touched by the worker, except
 * ncclCommAbort, which GeoCCL allows from any thread.
 *
 * Buffers: CPU tensors take GeoCCL's host path (the call returns with the
 * result in place). CUDA tensors, when the extension was built with the
 * CUDA toolkit against a torch with CUDA (libc10_cuda: the caller's current
 * stream, the caching allocator), take its device path on a stream of the
 * process group that waits for the caller's stream first. Every tensor the
 * call uses is recorded on that stream (the caching allocator hands its
 * memory on only once the stream is past it), the copies into the caller's
 * tensors run on it too, and the worker waits for that stream before it
 * completes the work, failed or not: a call that failed after part of it
 * was enqueued completes once that part has finished.
 */
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#define GEOCCL_TORCH_BASE_NAME "Backend"
#define GEOCCL_TORCH_OVERRIDE_2 override
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#if defined(__has_include)
#if __has_include(<torch/csrc/distributed/c10d/Work.hpp>)
#include <torch/csrc/distributed/c10d/Work.hpp>
#define GEOCCL_TORCH_HAVE_WORK_HPP 1
#endif
#endif
#define GEOCCL_TORCH_BASE_NAME "ProcessGroup"
#define GEOCCL_TORCH_OVERRIDE_2
#endif

/* How the torch brackets a batch of calls (startCoalescing, then the calls,
 * then endCoalescing), chosen by its version:
 * 1: torch 1.x: endCoalescing(reqs), around batch_isend_irecv's calls,
 *    whose works the caller keeps;
 * 2: torch 2.1 and later: endCoalescing() returns the batch's one work;
 *    batch_isend_irecv and _coalescing_manager bracket any calls, p2p
 *    and collectives, for a backend whose supportsCoalescing() is true
 *    (2.1 to 2.5: for CUDA tensors only, whatever the backend says);
 * 0: torch 2.0, which brackets batches for NCCL only: not implemented. */
#if TORCH_VERSION_MAJOR < 2
#define GEOCCL_TORCH_COALESCING 1
#elif TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 1
#define GEOCCL_TORCH_COALESCING 2
#else
#define GEOCCL_TORCH_COALESCING 0
#endif

/* torch 2.1 and later: the Backend's collectives over lists of flat
 * tensors, allgather_into_tensor_coalesced and
 * reduce_scatter_tensor_coalesced (since 2.15 the deprecated names of
 * all_gather_single_coalesced and reduce_scatter_single_coalesced, which
 * forward to them). */
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define GEOCCL_TORCH_TENSOR_COALESCED 1
#else
#define GEOCCL_TORCH_TENSOR_COALESCED 0
#endif

#include <nccl.h>

namespace geoccl_torch {

/* A tensor's element type by name, for messages (process_group.cpp,
 * collectives.cpp). */
inline std::string dtypeName(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type()));
}

#if defined(GEOCCL_TORCH_CUDA) && !defined(GEOCCL_TORCH_C10_CUDA)
/* Why CUDA tensors are refused by a build with the CUDA toolkit but a torch
 * without libc10_cuda (configure found none): the device path needs the
 * caller's current stream and the caching allocator, and another stream
 * (the legacy default one) would race with the caller's. */
inline constexpr const char kNoC10Cuda[] =
    "this build of geoccl has no CUDA path: it was compiled against a torch without "
    "libc10_cuda (a CPU-only torch, or one whose libc10_cuda.so configure did not find), and "
    "the CUDA path needs torch's current stream and caching allocator; rebuild geoccl against "
    "the CUDA build of torch it runs with";
#endif

#if TORCH_VERSION_MAJOR >= 2
using BaseGroup = ::c10d::Backend;
using BaseWork = ::c10d::Work;
#elif defined(GEOCCL_TORCH_HAVE_WORK_HPP)
using BaseGroup = ::c10d::ProcessGroup;
using BaseWork = ::c10d::Work;
#else
using BaseGroup = ::c10d::ProcessGroup;
using BaseWork = ::c10d::ProcessGroup::Work;
#endif

/* Whether a call's options have asyncOp (torch 2.x's, since it tells the
 * backend whether the caller waits at once). */
template <typename Opts, typename = void>
struct HasAsyncOp : std::false_type {};
template <typename Opts>
struct HasAsyncOp<Opts, std::void_t<decltype(std::declval<const Opts&>().asyncOp)>>
    : std::true_type {};

/* One queued collective. Completes once, from the worker thread; wait()
 * (the base class's) then returns or rethrows the error. */
class WorkGeoCCL : public BaseWork {
 public:
  WorkGeoCCL(int rank, ::c10d::OpType type, const char* title,
             std::vector<at::Tensor> outputs, std::chrono::milliseconds defaultTimeout);
  ~WorkGeoCCL() override;

  /* timeout kNoTimeout: the group's timeout (init_process_group's); when
   * it passes first, throws saying so (the call itself goes on until
   * GeoCCL finishes or fails it). */
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  /* Called once by the worker: error is null on success. */
  void complete(std::exception_ptr error);

  /* A receive from any source: the rank it took its message from, which
   * the worker stores in source before complete(); -1 for every other
   * work. */
  int sourceRank() const override { return source_ ? source_->load() : -1; }
  void setSource(std::shared_ptr<const std::atomic<int>> source) { source_ = std::move(source); }

 private:
  std::shared_ptr<const std::atomic<int>> source_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::chrono::milliseconds defaultTimeout_;
  std::string title_;
};

class ProcessGroupGeoCCL : public BaseGroup {
 public:
  /* Forms the GeoCCL communicator of size ranks: rank 0 makes the unique
   * id (address and secret of its bootstrap root) and puts it in store;
   * the others read it from there (waiting up to the store's timeout).
   * Blocks until every rank has joined (GEOCCL_TIMEOUT). Throws with
   * GeoCCL's error text when that fails. timeout is the default of
   * wait() on this group's work (kNoTimeout: none beyond GeoCCL's own). */
  ProcessGroupGeoCCL(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout);
  /* elastic.cpp: the group of comm, a communicator already formed
   * (ncclCommShrink's, ...), which this group owns and destroys. */
  ProcessGroupGeoCCL(ncclComm_t comm, const c10::intrusive_ptr<::c10d::Store>& store,
                     std::chrono::milliseconds timeout);
  ~ProcessGroupGeoCCL() override;

  const std::string getBackendName() const override { return "geoccl"; }

  c10::intrusive_ptr<BaseWork> broadcast(std::vector<at::Tensor>& tensors,
                                         const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<BaseWork> allreduce(std::vector<at::Tensor>& tensors,
                                         const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<BaseWork> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<BaseWork> reduce(std::vector<at::Tensor>& tensors,
                                      const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<BaseWork> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                         std::vector<at::Tensor>& inputs,
                                         const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<BaseWork> _allgather_base(at::Tensor& output, at::Tensor& input,
                                               const ::c10d::AllgatherOptions& opts) override;
  /* outputs[r][i] gets input i of rank r; one all-gather per input. */
  c10::intrusive_ptr<BaseWork> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const ::c10d::AllgatherOptions& opts) override;
#if GEOCCL_TORCH_TENSOR_COALESCED
  /* outputs[i] gets input i of every rank, in rank order (what
   * _allgather_base gives for that pair); one all-gather per pair, all in
   * one GeoCCL group. */
  c10::intrusive_ptr<BaseWork> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
#endif
  c10::intrusive_ptr<BaseWork> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                      std::vector<at::Tensor>& inputs,
                                      const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<BaseWork> scatter(std::vector<at::Tensor>& outputs,
                                       std::vector<std::vector<at::Tensor>>& inputs,
                                       const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<BaseWork> reduce_scatter(std::vector<at::Tensor>& outputs,
                                              std::vector<std::vector<at::Tensor>>& inputs,
                                              const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<BaseWork> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) override;
#if GEOCCL_TORCH_TENSOR_COALESCED
  /* outputs[i] gets this rank's part of the reduction of inputs[i] (what
   * _reduce_scatter_base gives for that pair); one reduce-scatter per
   * pair, all in one GeoCCL group. */
  c10::intrusive_ptr<BaseWork> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
#endif
  c10::intrusive_ptr<BaseWork> alltoall_base(at::Tensor& output, at::Tensor& input,
                                             std::vector<int64_t>& outputSplits,
                                             std::vector<int64_t>& inputSplits,
                                             const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<BaseWork> alltoall(std::vector<at::Tensor>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<BaseWork> send(std::vector<at::Tensor>& tensors, int dstRank,
                                    int tag) override;
  c10::intrusive_ptr<BaseWork> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                    int tag) override;
  /* Refused unless enableAnySource() was called (p2p.cpp). */
  c10::intrusive_ptr<BaseWork> recvAnysource(std::vector<at::Tensor>& tensors,
                                             int tag) override;
  c10::intrusive_ptr<BaseWork> barrier(const ::c10d::BarrierOptions& opts) override;
  /* barrier.cpp: on the calling thread, through the store; rank 0 names
   * the ranks that miss opts.timeout, the others fail when it does. */
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks = false) override;

#if TORCH_VERSION_MAJOR >= 2
  /* dist.set_timeout: the group's timeout (init_process_group's) for the
   * works made from now on, and for the waits of receives from any source
   * and of monitoredBarrier that start from now on. Declared without
   * `override`: the 2.x releases before Backend had it have no such
   * virtual, and there torch does not ask. */
  void setTimeout(std::chrono::milliseconds timeout) { timeout_.store(timeout); }
#endif

  /* The group's sequence number, which torch reads (subgroups'
   * all_gather_into_tensor, the checks of TORCH_DISTRIBUTED_DEBUG=DETAIL):
   * the calls queued so far by its user (collectives, sends, receives), the
   * same count on every rank that made the same calls; the backend's own
   * calls (callOnWorker) are not counted. It starts at 0 on every rank, so
   * setting it needs nothing. */
  uint64_t getSequenceNumberForGroup() override;
  void setSequenceNumberForGroup() override {}

  /* Stops the work in progress (it fails) and every later call on this
   * group; any thread. With torch 2.x it overrides Backend::abort, which
   * the ProcessGroup's abort() calls. */
  void abort() GEOCCL_TORCH_OVERRIDE_2;
  /* Runs fn(comm) on the worker thread after the work queued before it
   * (geoccl.h's queries and settings want the thread that issues the
   * collectives) and waits; throws GeoCCL's error text when it fails. */
  void callOnWorker(const char* name, std::function<ncclResult_t(ncclComm_t)> fn);

  /* elastic.cpp: ends this group (later calls are refused) once the
   * work queued on it has run; the communicator stays until destruction. */
  void quiesce();
  /* elastic.cpp: the group of the ranks not in exclude (this group's
   * numbering), made by every one of them at the same point from this
   * group's communicator with ncclCommShrink: NCCL_SHRINK_ABORT when
   * failed (the communicator is revoked first, so that the call in flight
   * fails), else NCCL_SHRINK_DEFAULT (the excluded ranks left at a round
   * boundary). This group ends (quiesce). store: the new group's (null:
   * this one's). Throws GeoCCL's error text when the survivors cannot meet. */
  c10::intrusive_ptr<ProcessGroupGeoCCL> shrink(const std::vector<int>& exclude, bool failed,
                                                const c10::intrusive_ptr<::c10d::Store>& store);

  /* elastic.cpp, geoccl.h's elastic membership (GEOCCL_ELASTIC_ETCD):
   * failedRanks: the dead ranks of this broken group, the same on every
   * survivor (geocclCommGetFailedRanks; blocks on the store). joinersWaiting:
   * processes waiting in join(), as this rank last saw (agree before grow).
   * leave: this rank goes at the next grow. grow: every rank, at the same
   * point, after the work queued before; the group of the members that
   * stay and the joiners, or null for a rank that leaves and for every rank
   * when nothing changed (this group then goes on); a new group ends this
   * one. join: a process that is not a member waits to be admitted (blocks
   * up to GEOCCL_ELASTIC_JOIN_TIMEOUT). All throw GeoCCL's error text. */
  std::vector<int> failedRanks();
  int joinersWaiting();
  void leave();
  c10::intrusive_ptr<ProcessGroupGeoCCL> grow(const c10::intrusive_ptr<::c10d::Store>& store);
  static c10::intrusive_ptr<ProcessGroupGeoCCL> join(
      const c10::intrusive_ptr<::c10d::Store>& store, std::chrono::milliseconds timeout);

  /* Batches (p2p.cpp): the calls made between startCoalescing and
   * endCoalescing are held back, then run in one item of the worker: the
   * batch's sends and receives as one GeoCCL group, which posts them all
   * at once (one by one, a receive that waits for a peer that itself first
   * receives would wait forever), then its collectives in call order (the
   * order GeoCCL's own groups keep). Each call keeps its own work. */
#if GEOCCL_TORCH_COALESCING == 1
  void startCoalescing() override;
  void endCoalescing(std::vector<c10::intrusive_ptr<BaseWork>>& reqs) override;
#elif GEOCCL_TORCH_COALESCING == 2
  /* Declared without `override`: the releases from 2.1 until this
   * virtual came have no such member, and there torch does not ask. */
  bool supportsCoalescing() const { return true; }
  void startCoalescing() override;
  /* The batch's work: completes after every call of it, with the first
   * error among them; a completed one for an empty batch. */
  c10::intrusive_ptr<BaseWork> endCoalescing() override;
#endif

  /* Receives without a source rank (p2p.cpp): from now on every
   * send counts itself in the group's store, where a receive from any
   * source looks for a peer that sent more than this rank has taken from
   * it. Every rank of the group must call it, right after the group is
   * made and before any send (geoccl.torch does, with
   * GEOCCL_TORCH_ANY_SOURCE=1). */
  void enableAnySource();

  /* What the worker runs for one work: the GeoCCL calls, returning the
   * first result that is not ncclSuccess. */
  using Job = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;

 private:
  struct Item {
    c10::intrusive_ptr<WorkGeoCCL> work;
    std::vector<at::Tensor> tensors;  // every tensor job and post use (inputs, outputs)
    Job job;
    std::function<void()> post;  // after the call: copies into the caller's tensors
    std::string what;  // "allreduce #3 (float32, 1024 elements)"
    ::c10d::OpType type;  // SEND, RECV and RECVANYSOURCE form a batch's group
    bool device;
    int deviceIndex;
    void* readyEvent;  // cudaEvent_t recorded on the caller's stream
  };

  /* Queues job (then post) for the worker. inputs: every tensor the call
   * reads, and every buffer it writes besides outputs (a contiguous copy,
   * a flat buffer); outputs: the caller's tensors, the work's result. All
   * are on one device; on CUDA they are the ones recorded on the stream.
   * hold false: to the worker even between startCoalescing and
   * endCoalescing (a call of the backend's own that its caller waits for,
   * not one of the caller's batch). */
  c10::intrusive_ptr<BaseWork> enqueue(::c10d::OpType type, const char* name,
                                       const std::vector<at::Tensor>& inputs,
                                       std::vector<at::Tensor> outputs, Job job,
                                       std::function<void()> post = nullptr, bool hold = true);

  /* enqueue() for a collective called with opts (collectives.cpp). torch
   * 2.x passes asyncOp false when its caller waits for the work at once,
   * which it skips when the work is null. Between startCoalescing and
   * endCoalescing such a call is held back until the batch runs, so it
   * returns no work: the caller goes on, and the end of its coalescing
   * block waits for the batch's work, as torch expects of a backend that
   * coalesces. Otherwise, and with torch releases whose options have no
   * asyncOp, the call's work. */
  template <typename Opts>
  c10::intrusive_ptr<BaseWork> enqueueColl(const Opts& opts, ::c10d::OpType type,
                                           const char* name,
                                           const std::vector<at::Tensor>& inputs,
                                           std::vector<at::Tensor> outputs, Job job,
                                           std::function<void()> post = nullptr) {
    c10::intrusive_ptr<BaseWork> work =
        enqueue(type, name, inputs, std::move(outputs), std::move(job), std::move(post));
    if (callerWaits(opts)) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (coalescing_) return c10::intrusive_ptr<BaseWork>();
    }
    return work;
  }
  template <typename Opts>
  static bool callerWaits(const Opts& opts) {
    if constexpr (HasAsyncOp<Opts>::value)
      return !opts.asyncOp;
    else
      return false;
  }

  void run();
  void push(Item item, bool hold = true);  // to the worker's queue, or to batch_ while
                                           // coalescing_ unless !hold
  void runOne(Item& item);

  /* sparse.cpp: allreduce of a sparse COO tensor (SUM, CPU). */
  c10::intrusive_ptr<BaseWork> allreduceSparse(at::Tensor& t,
                                               const ::c10d::AllreduceOptions& opts);

  /* p2p.cpp: queues the calls held back since startCoalescing; returns
   * the work that completes after all of them (a completed one when there
   * were none). */
  c10::intrusive_ptr<BaseWork> flushBatch();

  /* p2p.cpp; both used by the worker only. */
  void announceSend(int dst);
  int waitAnySource();

  ncclComm_t comm_ = nullptr;
  c10::intrusive_ptr<::c10d::Store> store_;
  bool anySource_ = false;
  std::vector<uint64_t> received_;  // messages taken from each peer (worker only)
  int lastAnySource_ = 0;            // where the next look for a sender starts
  // the default of wait() on new works; setTimeout may change it while the
  // worker reads it (receives from any source)
  std::atomic<std::chrono::milliseconds> timeout_;
  uint64_t seq_ = 0;
  uint64_t userCalls_ = 0;  // getSequenceNumberForGroup
  // monitoredBarrier (barrier.cpp): calls made; on rank 0, the last
  // passed and failed numbers it wrote to the store
  int64_t mbCalls_ = 0, mbPassed_ = 0, mbFailed_ = 0;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool coalescing_ = false;  // startCoalescing: calls wait in batch_ for endCoalescing
  std::vector<Item> batch_;
  bool stop_ = false;
  bool aborted_ = false;
  std::thread worker_;

  void* stream_ = nullptr;  // cudaStream_t of the device path, made at first use
  int streamDevice_ = -1;
};

}  // namespace geoccl_torch
