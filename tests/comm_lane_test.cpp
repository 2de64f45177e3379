// The lanes the overlap options run their exchanges on (production/comm_lane.hpp): the cpu
// backend's worker thread and inline lane (the cuda backend's second stream is tested in
// production_cuda_ops_test.cpp, which ci/gpu-check runs). Kind of comparison: exact (order,
// values, which thread).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "production/backend.hpp"
#include "production/comm_lane.hpp"

namespace tandem {
namespace {

using production::CommLane;

TEST(ThreadLane, RunsWorkOnAnotherThreadInSubmissionOrderAndWaitReturnsAfterIt) {
  const std::unique_ptr<CommLane> lane = production::make_thread_lane();
  EXPECT_STREQ(lane->description(), "worker thread");
  std::mutex mutex;
  std::vector<int> order;
  std::atomic<bool> slow_done{false};
  std::thread::id worker;
  // The first item is slow: a wait for the second must still find the first done.
  const CommLane::Ticket first = lane->submit([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    slow_done = true;
    std::lock_guard lock(mutex);
    order.push_back(1);
    worker = std::this_thread::get_id();
  });
  const CommLane::Ticket second = lane->submit([&] {
    std::lock_guard lock(mutex);
    order.push_back(2);
  });
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 2);
  EXPECT_EQ(lane->submitted(), 2);
  lane->wait(second);
  EXPECT_TRUE(slow_done.load());
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(order, (std::vector<int>{1, 2}));
    EXPECT_NE(worker, std::this_thread::get_id());
  }
  lane->wait(first);  // an older ticket: already done
  lane->drain();
}

TEST(ThreadLane, AFailureIsRethrownByEveryLaterWaitAndTheWorkAfterItStillRuns) {
  const std::unique_ptr<CommLane> lane = production::make_thread_lane();
  std::atomic<bool> after{false};
  const CommLane::Ticket failing = lane->submit([] { throw std::runtime_error("exchange failed"); });
  const CommLane::Ticket next = lane->submit([&] { after = true; });
  EXPECT_THROW(lane->wait(failing), std::runtime_error);
  EXPECT_THROW(lane->wait(next), std::runtime_error);
  EXPECT_TRUE(after.load());  // the other ranks' exchanges still find their partner
}

TEST(ThreadLane, TheDestructorFinishesTheQueuedWork) {
  std::atomic<int> done{0};
  {
    const std::unique_ptr<CommLane> lane = production::make_thread_lane();
    for (int i = 0; i < 5; ++i) {
      lane->submit([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        ++done;
      });
    }
  }
  EXPECT_EQ(done.load(), 5);
}

TEST(InlineLane, RunsWorkAtSubmission) {
  const std::unique_ptr<CommLane> lane = production::make_inline_lane();
  EXPECT_STREQ(lane->description(), "inline");
  bool ran = false;
  std::thread::id where;
  EXPECT_EQ(lane->submit([&] {
    ran = true;
    where = std::this_thread::get_id();
  }), 1);
  EXPECT_TRUE(ran);
  EXPECT_EQ(where, std::this_thread::get_id());
  EXPECT_THROW(lane->submit([] { throw std::runtime_error("at once"); }), std::runtime_error);
}

TEST(HostBackend, MakesAWorkerThreadLaneOnlyWhenTheCollectivesAllowIt) {
  const auto backend = production::make_backend(production::Device::cpu, 0);
  EXPECT_STREQ(backend->make_comm_lane(true)->description(), "worker thread");
  EXPECT_STREQ(backend->make_comm_lane(false)->description(), "inline");
}

}  // namespace
}  // namespace tandem
