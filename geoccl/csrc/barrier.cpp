/*
 * monitored_barrier for the geoccl process group: a barrier that, instead
 * of hanging when a rank never arrives, fails on rank 0 naming the ranks
 * that did not reach it within the timeout, and fails on the others saying
 * that rank 0 reported errors.
 *
 * Contract (what users of gloo's monitored_barrier rely on):
 *  - rank 0 waits for every other rank, up to the barrier's timeout
 *    (the group's when none is given), then lets them all go: all ranks
 *    leave it, or none does;
 *  - without waitAllRanks, rank 0 fails at the first rank, in rank order,
 *    that does not arrive in time: "Rank R failed to pass monitoredBarrier
 *    in T ms", or "Rank 0 timed out in monitoredBarrier after T ms" when
 *    the time was up before rank 0 began to wait for R (a timeout of 0);
 *  - with waitAllRanks it waits for all of them at once, for the same
 *    timeout, and names every rank that missed it: "Ranks 1, 2 failed to
 *    pass monitoredBarrier in T ms";
 *  - the other ranks do not enforce the barrier's timeout (rank 0 is the
 *    one that reports the culprit); they fail with "Rank R successfully
 *    reached monitoredBarrier, but received errors while waiting for
 *    send/recv from rank 0" when rank 0 reports a failure, or when rank 0
 *    does not answer within the group's timeout.
 *
 * Why the store and not the communicator: a barrier that times out leaves
 * messages unmatched, and GeoCCL's point-to-point, like NCCL's, matches a
 * pair's messages in posting order, so a late arrival would be taken by
 * the next collective. The group's store (prefixed per group, so subgroups
 * count apart) holds three kinds of counters instead:
 *   geoccl_mb/reached/R  how many monitored barriers rank R has entered;
 *   geoccl_mb/passed     the number of the last one rank 0 let pass;
 *   geoccl_mb/failed     the number of the last one rank 0 failed, with
 *   geoccl_mb/why        rank 0's message for it.
 * Every rank numbers its calls 1, 2, ...; call k passes on rank R once
 * passed >= k (a later one cannot pass before R enters it) and fails once
 * failed >= k. Nothing goes through the communicator, so a failed
 * monitored barrier leaves the group's collectives usable. A rank that
 * skips a call (returns early, as the failing rank of a test does) has
 * numbered its calls one behind rank 0's from then on, and its later
 * monitored barriers fail; recreate the group after one has failed.
 *
 * Like gloo's it runs on the calling thread and does not wait for the
 * group's queued work: it tells which ranks' callers got there. Waits poll
 * the store (1 ms, doubling to 50 ms) and check the abort flag.
 */
#include "process_group.hpp"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>

namespace geoccl_torch {

namespace {

std::string reachedKey(int rank) { return c10::str("geoccl_mb/reached/", rank); }
const char kPassedKey[] = "geoccl_mb/passed";
const char kFailedKey[] = "geoccl_mb/failed";
const char kWhyKey[] = "geoccl_mb/why";

/* The next poll's pause: from 1 ms doubling to 50 ms, no later than deadline. */
void pauseUntil(std::chrono::milliseconds& pause, std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  std::this_thread::sleep_for(std::max(std::chrono::milliseconds(0), std::min(pause, left)));
  pause = std::min(pause * 2, std::chrono::milliseconds(50));
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

void ProcessGroupGeoCCL::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks) {
  const auto timeout = opts.timeout == ::c10d::kUnsetTimeout ? timeout_.load() : opts.timeout;
  const int64_t k = ++mbCalls_;
  const auto start = std::chrono::steady_clock::now();
  auto checkAbort = [this]() {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!aborted_, "geoccl: monitoredBarrier: the process group was aborted");
  };

  if (rank_ != 0) {
    store_->add(reachedKey(rank_), 1);
    // The group's timeout, or the barrier's when that is longer: rank 0
    // may enter later than this rank and still be in time.
    auto limit = std::max(timeout_.load(), timeout);
    if (limit <= std::chrono::milliseconds(0)) limit = std::chrono::milliseconds(1800000);
    const auto deadline = start + limit;
    auto pause = std::chrono::milliseconds(1);
    std::string cause;
    for (;;) {
      if (store_->add(kPassedKey, 0) >= k) return;
      if (store_->add(kFailedKey, 0) >= k) {
        std::vector<uint8_t> why = store_->get(kWhyKey);
        cause = c10::str("rank 0 reported: ", std::string(why.begin(), why.end()));
        break;
      }
      checkAbort();
      if (std::chrono::steady_clock::now() >= deadline) {
        cause = c10::str("rank 0 did not let it pass within ", limit.count(),
                         " ms (the longer of the group's timeout and the barrier's): rank 0 "
                         "has not reached it, or is stuck before it; where it has, its error "
                         "names the rank that failed");
        break;
      }
      pauseUntil(pause, deadline);
    }
    TORCH_CHECK(false, "geoccl: Rank ", rank_, " successfully reached monitoredBarrier, but "
                "received errors while waiting for send/recv from rank 0: ", cause);
  }

  const auto deadline = start + std::max(timeout, std::chrono::milliseconds(0));
  auto fail = [&](const std::string& why) {
    store_->set(kWhyKey, std::vector<uint8_t>(why.begin(), why.end()));
    store_->add(kFailedKey, k - mbFailed_);
    mbFailed_ = k;
    TORCH_CHECK(false, "geoccl: ", why);
  };
  auto reached = [&](int r) { return store_->add(reachedKey(r), 0) >= k; };

  if (waitAllRanks) {
    // All at once: each rank gets the whole timeout.
    std::vector<int> missing;
    for (int r = 1; r < size_; r++) missing.push_back(r);
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      missing.erase(std::remove_if(missing.begin(), missing.end(), reached), missing.end());
      if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
      checkAbort();
      pauseUntil(pause, deadline);
    }
    if (!missing.empty())
      fail(c10::str(missing.size() == 1 ? "Rank " : "Ranks ", joinRanks(missing),
                    " failed to pass monitoredBarrier in ", timeout.count(),
                    " ms (rank 0 waited for all ranks at once; a rank that failed has not "
                    "called monitored_barrier on this group, or is stuck before it)"));
  } else {
    for (int r = 1; r < size_; r++) {
      const bool timeLeft = std::chrono::steady_clock::now() < deadline;
      auto pause = std::chrono::milliseconds(1);
      while (!reached(r)) {
        if (!timeLeft)
          fail(c10::str("Rank 0 timed out in monitoredBarrier after ", timeout.count(), " ms: ",
                        r == 1   ? std::string()
                        : r == 2 ? std::string("rank 1 reached it, ")
                                 : c10::str("ranks 1 to ", r - 1, " reached it, "),
                        "rank ", r, " had not reached it when the time was up (ranks after "
                        "it were not waited for)"));
        if (std::chrono::steady_clock::now() >= deadline)
          fail(c10::str("Rank ", r, " failed to pass monitoredBarrier in ", timeout.count(),
                        " ms (it has not called monitored_barrier on this group, or is stuck "
                        "before it; ranks after it were not waited for)"));
        checkAbort();
        pauseUntil(pause, deadline);
      }
    }
  }
  store_->add(kPassedKey, k - mbPassed_);
  mbPassed_ = k;
}

}  // namespace geoccl_torch
