// The cpu backend's lanes (comm_lane.hpp).
#include "production/comm_lane.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

class InlineLane final : public CommLane {
 public:
  Ticket submit(std::function<void()> work) override {
    work();
    return ++submitted_;
  }
  void wait(Ticket) override {}
  const char* description() const override { return "inline"; }
};

// One worker thread; tickets complete in order. The first failure is kept and rethrown by every
// later wait (the work after it still runs, so the other ranks' exchanges find their partner).
class ThreadLane final : public CommLane {
 public:
  ThreadLane() : worker_([this] { run(); }) {}
  ~ThreadLane() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }
  Ticket submit(std::function<void()> work) override {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(work));
    }
    changed_.notify_all();
    return ++submitted_;
  }
  void wait(Ticket ticket) override {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return completed_ >= ticket; });
    if (failure_) std::rethrow_exception(failure_);
  }
  const char* description() const override { return "worker thread"; }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr failure;
      try {
        work();
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      if (failure && !failure_) failure_ = failure;
      ++completed_;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  Ticket completed_ = 0;
  std::exception_ptr failure_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts once the members above exist
};

}  // namespace

std::unique_ptr<CommLane> make_thread_lane() { return std::make_unique<ThreadLane>(); }
std::unique_ptr<CommLane> make_inline_lane() { return std::make_unique<InlineLane>(); }

}  // namespace tandem::production
