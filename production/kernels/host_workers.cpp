#include "production/kernels/host_workers.hpp"

#include <sched.h>

#include <stdexcept>
#include <string>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

namespace {

// Polls `value` until it differs from `old` or HostWorkers::kSpin has passed, then sleeps on it
// (futex) until it does; returns the new value.
template <typename T>
T wait_for_change(const std::atomic<T>& value, T old) {
  using Clock = std::chrono::steady_clock;
  const auto give_up = Clock::now() + HostWorkers::kSpin;
  for (int polls = 1;; ++polls) {
    const T now = value.load(std::memory_order_acquire);
    if (now != old) return now;
    if (polls % 64 == 0 && Clock::now() >= give_up) break;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  for (;;) {
    value.wait(old, std::memory_order_acquire);
    const T now = value.load(std::memory_order_acquire);
    if (now != old) return now;
  }
}

}  // namespace

HostWorkers::HostWorkers(int threads) : threads_(threads) {
  if (threads < 1) throw std::invalid_argument("cpu threads " + std::to_string(threads) + ": must be at least 1");
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int worker = 1; worker < threads; ++worker) workers_.emplace_back([this, worker] { work(worker); });
}

HostWorkers::~HostWorkers() {
  stopping_ = true;
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void HostWorkers::for_each(std::int64_t tasks, const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (threads_ == 1 || tasks < 2) {
    if (tasks > 0) body(0, tasks);
    return;
  }
  tasks_ = tasks;
  body_ = &body;
  pending_.store(threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  const std::int64_t end = tasks / threads_;
  if (end > 0) body(0, end);
  for (int left = pending_.load(std::memory_order_acquire); left != 0;) left = wait_for_change(pending_, left);
  body_ = nullptr;
}

void HostWorkers::work(int worker) {
  std::uint64_t seen = 0;
  for (;;) {
    seen = wait_for_change(generation_, seen);
    if (stopping_) return;
    const std::int64_t begin = tasks_ * worker / threads_;
    const std::int64_t end = tasks_ * (worker + 1) / threads_;
    if (begin < end) (*body_)(begin, end);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int count = CPU_COUNT(&set);
  return count > 0 ? count : 1;
}

}  // namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC
