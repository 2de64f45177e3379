// Work beside the compute, for Megatron's overlap of the data-parallel exchanges
// (--overlap-grad-reduce, --overlap-param-gather; production/trainer.hpp): a bucket's gradient
// reduction while the backward computes the buckets before it, a bucket's weight all-gather while
// the forward computes the layers before it.
//
// A lane runs the work submitted to it one item after another, in submission order, each after
// every backend op issued before its submission, beside the backend ops issued after it; `wait`
// orders the ops issued after it behind a ticket's work. On the cuda backend the work's ops and
// exchanges go to a second stream (events order the two); on the cpu backend a worker thread runs
// it (inline, in submission order, when the collectives may not be called from a second thread).
// Work may use the backend's copy and add and the collectives' data plane only.
//
// Every rank submits the same work in the same order (the exchanges pair up), and the caller
// drains the lane before it exchanges anything itself (the two must never interleave).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "production/arithmetic.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

class CommLane {
 public:
  using Ticket = std::int64_t;  // 1, 2, ... in submission order
  virtual ~CommLane() = default;
  CommLane() = default;
  CommLane(const CommLane&) = delete;
  CommLane& operator=(const CommLane&) = delete;

  virtual Ticket submit(std::function<void()> work) = 0;
  // Backend ops issued after this run after `ticket`'s work (and all work submitted before it).
  // Rethrows the exception of failed work.
  virtual void wait(Ticket ticket) = 0;
  // wait(the last ticket); nothing submitted: returns.
  void drain() { wait(submitted_); }
  Ticket submitted() const { return submitted_; }
  // "worker thread", "inline", "second cuda stream": for the log header.
  virtual const char* description() const = 0;

 protected:
  Ticket submitted_ = 0;
};

// The cpu backend's lanes: work on one worker thread, or inline on the caller's.
std::unique_ptr<CommLane> make_thread_lane();
std::unique_ptr<CommLane> make_inline_lane();

}  // namespace tandem::production
