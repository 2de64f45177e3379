#include "production/kernels/host_workers.hpp"

#include <sched.h>

#include <stdexcept>
#include <string>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

HostWorkers::HostWorkers(int threads) : threads_(threads) {
  if (threads < 1) throw std::invalid_argument("cpu threads " + std::to_string(threads) + ": must be at least 1");
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int worker = 1; worker < threads; ++worker) workers_.emplace_back([this, worker] { work(worker); });
}

HostWorkers::~HostWorkers() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void HostWorkers::for_each(std::int64_t tasks, const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (threads_ == 1 || tasks < 2) {
    if (tasks > 0) body(0, tasks);
    return;
  }
  {
    const std::lock_guard lock(mutex_);
    tasks_ = tasks;
    body_ = &body;
    pending_ = threads_ - 1;
    ++generation_;
  }
  start_.notify_all();
  const std::int64_t end = tasks / threads_;
  if (end > 0) body(0, end);
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
  body_ = nullptr;
}

void HostWorkers::work(int worker) {
  std::uint64_t seen = 0;
  for (;;) {
    std::int64_t begin = 0, end = 0;
    const std::function<void(std::int64_t, std::int64_t)>* body = nullptr;
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      begin = tasks_ * worker / threads_;
      end = tasks_ * (worker + 1) / threads_;
      body = body_;
    }
    if (begin < end) (*body)(begin, end);
    {
      const std::lock_guard lock(mutex_);
      --pending_;
    }
    done_.notify_one();
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
