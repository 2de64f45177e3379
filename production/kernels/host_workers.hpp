// The cpu backend's worker threads: one caller and `threads - 1` workers that split a kernel's
// independent tasks (a GEMM's output tiles, attention's (sample, group) pairs) among them. Every
// task is computed whole by one thread, in the order the single-threaded kernel computes it, so
// the results are the same bits for every thread count: threads change who computes an element,
// never the order of its sums.
//
// One HostWorkers per backend (each rank, on a process or a thread of its own, has its own).
// Not reentrant: a task must not call for_each on the same workers.
//
// Hand-off: a training step calls for_each hundreds of times, often for tens of microseconds of
// work each, with short single-threaded ops between; a sleeping thread takes tens of
// microseconds to wake (futex, more under a hypervisor), as long as the work it would share. So
// workers, and the caller waiting for them, spin on the atomics for up to kSpin before they sleep
// (C++20 atomic wait: a futex). Spinning changes who waits how, never a result.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "production/arithmetic.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

class HostWorkers {
 public:
  // threads >= 1 (throws std::invalid_argument otherwise); threads - 1 workers are started.
  explicit HostWorkers(int threads);
  ~HostWorkers();
  HostWorkers(const HostWorkers&) = delete;
  HostWorkers& operator=(const HostWorkers&) = delete;

  // How long a worker, or the caller, polls before it sleeps.
  static constexpr std::chrono::microseconds kSpin{100};

  int threads() const { return threads_; }
  // body(begin, end) on contiguous ranges of [0, tasks): thread w takes
  // [tasks * w / threads, tasks * (w + 1) / threads). Returns when every range is done.
  // With one thread, or fewer than two tasks, the caller runs body(0, tasks) alone.
  void for_each(std::int64_t tasks, const std::function<void(std::int64_t, std::int64_t)>& body);

 private:
  void work(int worker);

  int threads_;
  // One per for_each (and one more to stop): a worker runs each generation once. Its release
  // store publishes tasks_, body_ and stopping_; a worker's acquire load reads them.
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> pending_{0};    // workers still running this generation
  bool stopping_ = false;
  std::int64_t tasks_ = 0;
  const std::function<void(std::int64_t, std::int64_t)>* body_ = nullptr;
  std::vector<std::thread> workers_;
};

// The threads a process may use: its CPU affinity mask's size (sched_getaffinity), at least 1.
int usable_cpu_count();

}  // namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC
