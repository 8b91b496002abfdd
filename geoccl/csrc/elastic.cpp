/*
 * Re-forming a geoccl process group when its membership changes
 * (geoccl/elastic.py drives it): a group made around a communicator that
 * already exists; the group of the survivors made from the communicator of
 * this one (ncclCommShrink); and geoccl.h's elastic membership: the dead
 * set agreed in the store, joiners waiting, leaving, and the grown group of
 * the members and the joiners (geocclCommGrow, geocclCommJoin).
 *
 * Contract: shrink() is called by every surviving rank, with the same
 * exclusion list, at the same point of its calls (after the same failed
 * or completed call). It ends this group for good: the work in progress
 * fails (after a failure, with NCCL_SHRINK_ABORT) or must be done (a
 * graceful leave), the worker thread is joined, and only then is the
 * communicator shrunk, on the calling thread: GeoCCL allows one thread at
 * a time on a communicator, and nothing runs on it any more. The new group
 * owns the new communicator; this one keeps the old one until it is
 * destroyed.
 */
#include "process_group.hpp"

#include <algorithm>
#include <stdexcept>

#include <geoccl.h>

#include <c10/util/Exception.h>

namespace geoccl_torch {

namespace {

[[noreturn]] void elasticFail(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw std::runtime_error(c10::str("geoccl: ", what, " failed: ", ncclGetErrorString(r),
                                    (last && *last) ? ": " : "", last ? last : ""));
}

int commRank(ncclComm_t comm) {
  int rank = -1;
  TORCH_CHECK(comm, "geoccl: a process group needs a communicator");
  ncclResult_t r = ncclCommUserRank(comm, &rank);
  if (r != ncclSuccess) elasticFail(r, comm, "ncclCommUserRank");
  return rank;
}

int commSize(ncclComm_t comm) {
  int size = 0;
  TORCH_CHECK(comm, "geoccl: a process group needs a communicator");
  ncclResult_t r = ncclCommCount(comm, &size);
  if (r != ncclSuccess) elasticFail(r, comm, "ncclCommCount");
  return size;
}

}  // namespace

ProcessGroupGeoCCL::ProcessGroupGeoCCL(ncclComm_t comm,
                                       const c10::intrusive_ptr<::c10d::Store>& store,
                                       std::chrono::milliseconds timeout)
    : BaseGroup(commRank(comm), commSize(comm)), comm_(comm), store_(store), timeout_(timeout) {
  TORCH_CHECK(store, "geoccl: the process group needs a store");
  worker_ = std::thread([this] { run(); });
}

void ProcessGroupGeoCCL::quiesce() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;  // later calls are refused: this group has ended
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

c10::intrusive_ptr<ProcessGroupGeoCCL> ProcessGroupGeoCCL::shrink(
    const std::vector<int>& exclude, bool failed,
    const c10::intrusive_ptr<::c10d::Store>& store) {
  TORCH_CHECK(comm_, "geoccl: shrink: this group has no communicator");
  // After a failure the call in flight may wait on a dead peer: revoke the
  // communicator first, so that it fails and the worker can be joined.
  if (failed) {
    // Unrevoked, the worker may never be joined: fail here, not hang.
    ncclResult_t rv = ncclCommRevoke(comm_, 0);
    if (rv != ncclSuccess) elasticFail(rv, comm_, "ncclCommRevoke (before the shrink)");
  }
  quiesce();
  std::vector<int> ex(exclude);
  ncclComm_t child = nullptr;
  ncclResult_t r = ncclCommShrink(comm_, ex.empty() ? nullptr : ex.data(), (int)ex.size(),
                                  &child, nullptr,
                                  failed ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT);
  if (r != ncclSuccess)
    elasticFail(r, comm_, c10::str("ncclCommShrink (rank ", rank_, " of ", size_, ", ",
                                   ex.size(), " excluded)"));
  return c10::make_intrusive<ProcessGroupGeoCCL>(child, store ? store : store_, timeout_.load());
}

std::vector<int> ProcessGroupGeoCCL::failedRanks() {
  TORCH_CHECK(comm_, "geoccl: failed_ranks: this group has no communicator");
  std::vector<int> ranks((size_t)size_);
  int count = 0;
  ncclResult_t r = geocclCommGetFailedRanks(comm_, ranks.data(), size_, &count);
  if (r != ncclSuccess) elasticFail(r, comm_, "geocclCommGetFailedRanks");
  ranks.resize((size_t)std::max(0, std::min(count, size_)));
  for (int x : ranks)
    TORCH_CHECK(x >= 0 && x < size_, "geoccl: failed_ranks: rank ", x, " outside this group of ",
                size_);
  return ranks;
}

int ProcessGroupGeoCCL::joinersWaiting() {
  TORCH_CHECK(comm_, "geoccl: joiners_waiting: this group has no communicator");
  int n = 0;
  ncclResult_t r = geocclCommJoinersWaiting(comm_, &n);
  if (r != ncclSuccess) elasticFail(r, comm_, "geocclCommJoinersWaiting");
  return n;
}

void ProcessGroupGeoCCL::leave() {
  TORCH_CHECK(comm_, "geoccl: leave: this group has no communicator");
  ncclResult_t r = geocclCommLeave(comm_);
  if (r != ncclSuccess) elasticFail(r, comm_, "geocclCommLeave");
}

c10::intrusive_ptr<ProcessGroupGeoCCL> ProcessGroupGeoCCL::grow(
    const c10::intrusive_ptr<::c10d::Store>& store) {
  ncclComm_t child = nullptr;
  // A collective on this group's communicator: after the work queued before.
  callOnWorker("geocclCommGrow",
               [&child](ncclComm_t comm) { return geocclCommGrow(comm, &child, nullptr); });
  if (!child) return {};  // this rank left, or nothing changed
  quiesce();
  return c10::make_intrusive<ProcessGroupGeoCCL>(child, store ? store : store_, timeout_.load());
}

c10::intrusive_ptr<ProcessGroupGeoCCL> ProcessGroupGeoCCL::join(
    const c10::intrusive_ptr<::c10d::Store>& store, std::chrono::milliseconds timeout) {
  ncclComm_t comm = nullptr;
  ncclResult_t r = geocclCommJoin(&comm, nullptr);
  if (r != ncclSuccess) elasticFail(r, nullptr, "geocclCommJoin");
  return c10::make_intrusive<ProcessGroupGeoCCL>(comm, store, timeout);
}

}  // namespace geoccl_torch
