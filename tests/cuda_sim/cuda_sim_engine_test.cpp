// cuda-sim's execution engine (cuda_sim/engine.hpp) on kernels written here: the built-in
// variables, a block's shared memory and barriers, warp shuffles, the thread orders, and the
// faults (divergent barriers, a shuffle a lane of its mask never reaches, an invalid launch) with
// the runtime's errors. Each test passes in every order (ctest runs forward and reverse); the
// negative control shows a missing barrier changes a result in some order.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "production/cuda/kernel_support.cuh"

namespace {

using tandem::cuda_sim::OrderSetting;
using tandem::cuda_sim::ThreadOrder;

// Every launch's error, then a clean runtime for the next test.
class CudaSim : public ::testing::Test {
 protected:
  void SetUp() override { cudaDeviceReset(); }
  void TearDown() override { cudaDeviceReset(); }
};

__global__ void builtins_kernel(unsigned int* out) {
  const unsigned int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned int threads = blockDim.x * blockDim.y * blockDim.z;
  out[block * threads + thread] = block * 1000 + thread;
}

TEST_F(CudaSim, EveryThreadSeesItsOwnIndicesInAThreeDimensionalLaunch) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  std::vector<unsigned int> out(12 * 24, 0xFFFFFFFFu);
  TANDEM_LAUNCH(grid, block, 0, nullptr, builtins_kernel)(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (unsigned int b = 0; b < 12; ++b) {
    for (unsigned int t = 0; t < 24; ++t) EXPECT_EQ(out[b * 24 + t], b * 1000 + t) << "block " << b << " thread " << t;
  }
}

constexpr int kThreads = 256;

// Each thread reads its neighbour's value from shared memory after a barrier.
__global__ void rotate_kernel(const int* in, int* out) {
  __shared__ int tile[kThreads];
  const unsigned int t = threadIdx.x;
  tile[t] = in[blockIdx.x * kThreads + t];
  __syncthreads();
  out[blockIdx.x * kThreads + t] = tile[(t + 1) % kThreads];
}

TEST_F(CudaSim, SharedMemoryIsTheBlocksAndABarrierOrdersItsWritesBeforeItsReads) {
  std::vector<int> in(4 * kThreads), out(in.size(), -1);
  std::iota(in.begin(), in.end(), 0);
  TANDEM_LAUNCH(4, kThreads, 0, nullptr, rotate_kernel)(in.data(), out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int b = 0; b < 4; ++b) {
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(out[b * kThreads + t], b * kThreads + (t + 1) % kThreads);
  }
}

// kernel_support.cuh's block_sum, the reduction every normalizing kernel uses.
__global__ void block_sum_kernel(const float* in, float* out) {
  __shared__ float scratch[kThreads];
  const float total = tandem::production::cuda_detail::block_sum(in[threadIdx.x], scratch);
  out[threadIdx.x] = total;
}

// The same tree without the barrier between the stores and the first level: the planted bug.
__global__ void block_sum_missing_barrier_kernel(const float* in, float* out) {
  __shared__ float scratch[kThreads];
  scratch[threadIdx.x] = in[threadIdx.x];
  for (unsigned int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) scratch[threadIdx.x] = scratch[threadIdx.x] + scratch[threadIdx.x + stride];
    __syncthreads();
  }
  out[threadIdx.x] = scratch[0];
}

// Runs one of the sums on 1..256 (exact in fp32: 32896) in `order`; returns thread 0's total.
float sum_in_order(void (*kernel)(const float*, float*), OrderSetting order) {
  std::vector<float> in(kThreads), out(kThreads, -1.0f);
  std::iota(in.begin(), in.end(), 1.0f);
  tandem::cuda_sim::set_thread_order(order);
  tandem::cuda_sim::KernelLaunch<const float*, float*>(
      kernel, tandem::cuda_sim::LaunchSite{"sum", __FILE__, __LINE__, {1, 1, 1}, {kThreads, 1, 1}, 0, nullptr})(
      in.data(), out.data());
  tandem::cuda_sim::set_thread_order(tandem::cuda_sim::order_from_environment());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return out[0];
}

TEST_F(CudaSim, TheBlockSumIsExactInEveryOrderAndAMissingBarrierChangesItInSomeOrder) {
  const float exact = 256.0f * 257.0f / 2.0f;
  const std::vector<OrderSetting> orders = {{ThreadOrder::forward, 0}, {ThreadOrder::reverse, 0},
                                            {ThreadOrder::random, 1}, {ThreadOrder::random, 2}};
  int wrong = 0;
  for (const OrderSetting& order : orders) {
    EXPECT_EQ(sum_in_order(block_sum_kernel, order), exact) << tandem::cuda_sim::describe(order);
    if (sum_in_order(block_sum_missing_barrier_kernel, order) != exact) ++wrong;
  }
  // Forward runs thread 0 through its first level before thread 128 has stored its value.
  EXPECT_GE(wrong, 1) << "the reduction without its first barrier gave the exact sum in every order";
  EXPECT_NE(sum_in_order(block_sum_missing_barrier_kernel, {ThreadOrder::forward, 0}), exact);
}

// Lane l shuffles the value 100 + l of every type the kernels shuffle.
__global__ void shuffle_kernel(int* xor_out, double* down_out, float* warp_sums) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  xor_out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, 100 + lane, 5);
  down_out[threadIdx.x] = __shfl_down_sync(0xFFFFFFFFu, 100.0 + lane, 3);
  float total = static_cast<float>(lane);
  for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xFFFFFFFFu, total, offset);
  warp_sums[warp * 32 + lane] = total;
}

TEST_F(CudaSim, ShufflesReadTheLanesTheyNameAndDownKeepsTheirOwnPastTheWarpsEnd) {
  std::vector<int> xor_out(64);
  std::vector<double> down_out(64);
  std::vector<float> warp_sums(64);
  TANDEM_LAUNCH(1, 64, 0, nullptr, shuffle_kernel)(xor_out.data(), down_out.data(), warp_sums.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    EXPECT_EQ(xor_out[t], 100 + (lane ^ 5)) << "thread " << t;
    EXPECT_EQ(down_out[t], 100.0 + (lane + 3 < 32 ? lane + 3 : lane)) << "thread " << t;
    EXPECT_EQ(warp_sums[t], 31.0f * 32.0f / 2.0f) << "thread " << t;
  }
}

// Threads that exit before a barrier do not hold it (sm_70 and later).
__global__ void early_exit_kernel(int* out) {
  if (threadIdx.x >= 40) return;
  __shared__ int tile[64];
  tile[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = tile[39 - threadIdx.x];
}

TEST_F(CudaSim, ThreadsThatExitedDoNotHoldABarrier) {
  std::vector<int> out(64, -1);
  TANDEM_LAUNCH(1, 64, 0, nullptr, early_exit_kernel)(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int t = 0; t < 40; ++t) EXPECT_EQ(out[t], 39 - t);
  EXPECT_EQ(out[40], -1);
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

TEST_F(CudaSim, ThreadsAtDifferentBarriersAreAStickyFaultNamingKernelBlockThreadsAndLines) {
  std::vector<int> out(32, 0);
  TANDEM_LAUNCH(2, 32, 0, nullptr, divergent_barrier_kernel)(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  const std::string text = cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_NE(text.find("kernel divergent_barrier_kernel"), std::string::npos) << text;
  EXPECT_NE(text.find("block (0,0,0)"), std::string::npos) << text;
  EXPECT_NE(text.find("threads wait at different barriers"), std::string::npos) << text;
  EXPECT_NE(text.find("cuda_sim_engine_test.cpp:" + std::to_string(__LINE__ - 15)), std::string::npos) << text;
  EXPECT_NE(text.find("cuda_sim_engine_test.cpp:" + std::to_string(__LINE__ - 14)), std::string::npos) << text;
  EXPECT_EQ(out[0], 0) << "no thread of the faulting block passes its barrier";
  // Sticky: the next call reports it and the next launch runs nothing, until cudaDeviceReset.
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  std::vector<unsigned int> ids(24, 7);
  TANDEM_LAUNCH(1, 24, 0, nullptr, builtins_kernel)(ids.data());
  EXPECT_EQ(ids[5], 7u);
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  TANDEM_LAUNCH(1, 24, 0, nullptr, builtins_kernel)(ids.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(ids[5], 5u);
}

__global__ void exited_lane_shuffle_kernel(int* out) {
  if (threadIdx.x == 7) return;
  out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, static_cast<int>(threadIdx.x), 1);
}

TEST_F(CudaSim, AShuffleWhoseMaskNamesALaneThatExitedIsAFault) {
  std::vector<int> out(32, 0);
  TANDEM_LAUNCH(1, 32, 0, nullptr, exited_lane_shuffle_kernel)(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  const std::string text = cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_NE(text.find("needs lane 7 (thread (7,0,0)), which has exited"), std::string::npos) << text;
  EXPECT_NE(text.find("exited_lane_shuffle_kernel"), std::string::npos) << text;
}

// A planted shuffle bug: offset 16 where a 16-lane segment (width 16) was meant.
__global__ void segment_sum_kernel(float* out, int first_offset) {
  float total = 1.0f;
  for (int offset = first_offset; offset > 0; offset /= 2) total += __shfl_xor_sync(0xFFFFFFFFu, total, offset);
  out[threadIdx.x] = total;
}

TEST_F(CudaSim, AShuffleWithTheWrongOffsetSumsTheWrongLanes) {
  std::vector<float> right(32), wrong(32);
  TANDEM_LAUNCH(1, 32, 0, nullptr, segment_sum_kernel)(right.data(), 8);
  TANDEM_LAUNCH(1, 32, 0, nullptr, segment_sum_kernel)(wrong.data(), 16);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(right[0], 16.0f);  // each 16-lane half sums its own ones
  EXPECT_NE(wrong[0], 16.0f);  // the wrong offset sums across halves: 32
}

TEST_F(CudaSim, AnInvalidConfigurationIsReportedOnceAndRunsNothing) {
  std::vector<unsigned int> ids(2048, 7);
  TANDEM_LAUNCH(1, 2048, 0, nullptr, builtins_kernel)(ids.data());
  ASSERT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(ids[0], 7u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a configuration error is not sticky";
  TANDEM_LAUNCH(dim3(1, 70000), 32, 0, nullptr, builtins_kernel)(ids.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
}

// Which thread ran first, second, ...: the engine resumes one thread at a time, so the order is
// the engine's and this kernel's writes never race.
std::vector<int> arrival;
__global__ void arrival_kernel() { arrival.push_back(static_cast<int>(threadIdx.x)); }

std::vector<int> arrivals(OrderSetting order) {
  arrival.clear();
  tandem::cuda_sim::set_thread_order(order);
  TANDEM_LAUNCH(1, 64, 0, nullptr, arrival_kernel)();
  tandem::cuda_sim::set_thread_order(tandem::cuda_sim::order_from_environment());
  return arrival;
}

TEST_F(CudaSim, TheOrdersAreForwardReverseAndASeededPermutationPerLaunch) {
  std::vector<int> forward(64);
  std::iota(forward.begin(), forward.end(), 0);
  EXPECT_EQ(arrivals({ThreadOrder::forward, 0}), forward);
  EXPECT_EQ(arrivals({ThreadOrder::reverse, 0}), std::vector<int>(forward.rbegin(), forward.rend()));
  const std::vector<int> first = arrivals({ThreadOrder::random, 5});
  const std::vector<int> second = arrivals({ThreadOrder::random, 5});
  std::vector<int> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, forward) << "a permutation of the block's threads";
  EXPECT_NE(first, forward);
  EXPECT_NE(first, second) << "each launch draws its own permutation";
}

// Every third thread exits before the barrier; the others record again after it (+100). The
// engine starts threads on shared fibers while each runs to its end (engine.cpp's runners): the
// threads must still run in the order, before the barrier and after it.
__global__ void arrival_around_a_barrier_kernel() {
  arrival.push_back(static_cast<int>(threadIdx.x));
  if (threadIdx.x % 3 == 0) return;
  __syncthreads();
  arrival.push_back(100 + static_cast<int>(threadIdx.x));
}

TEST_F(CudaSim, ThreadsRunInTheOrderBeforeAndAfterABarrierThatSomeOfThemNeverReach) {
  for (const OrderSetting order : {OrderSetting{ThreadOrder::forward, 0}, OrderSetting{ThreadOrder::reverse, 0},
                                   OrderSetting{ThreadOrder::random, 9}}) {
    arrival.clear();
    tandem::cuda_sim::set_thread_order(order);
    TANDEM_LAUNCH(1, 64, 0, nullptr, arrival_around_a_barrier_kernel)();
    tandem::cuda_sim::set_thread_order(tandem::cuda_sim::order_from_environment());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(arrival.size(), 64u + 42u) << tandem::cuda_sim::describe(order);
    const std::vector<int> first(arrival.begin(), arrival.begin() + 64);  // the order itself
    std::vector<int> sorted = first;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> all(64);
    std::iota(all.begin(), all.end(), 0);
    ASSERT_EQ(sorted, all) << tandem::cuda_sim::describe(order);
    if (order.order == ThreadOrder::forward) {
      EXPECT_EQ(first, all);
    } else if (order.order == ThreadOrder::reverse) {
      EXPECT_EQ(first, std::vector<int>(all.rbegin(), all.rend()));
    }
    std::vector<int> after;  // the waiting threads, in the same order
    for (const int t : first) {
      if (t % 3 != 0) after.push_back(100 + t);
    }
    EXPECT_EQ(std::vector<int>(arrival.begin() + 64, arrival.end()), after) << tandem::cuda_sim::describe(order);
  }
}

TEST(CudaSimOrder, TheEnvironmentNamesTheOrderAndAnythingElseIsRefusedWithTheChoices) {
  const char* saved = std::getenv("TANDEM_CUDA_SIM_ORDER");
  const std::string restore = saved == nullptr ? "" : saved;
  setenv("TANDEM_CUDA_SIM_ORDER", "random:42", 1);
  EXPECT_EQ(tandem::cuda_sim::order_from_environment().order, ThreadOrder::random);
  EXPECT_EQ(tandem::cuda_sim::order_from_environment().seed, 42u);
  setenv("TANDEM_CUDA_SIM_ORDER", "reverse", 1);
  EXPECT_EQ(tandem::cuda_sim::order_from_environment().order, ThreadOrder::reverse);
  setenv("TANDEM_CUDA_SIM_ORDER", "backwards", 1);
  try {
    tandem::cuda_sim::order_from_environment();
    ADD_FAILURE() << "\"backwards\" was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("TANDEM_CUDA_SIM_ORDER=\"backwards\""), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("forward, reverse, random or random:SEED"), std::string::npos);
  }
  if (saved == nullptr) {
    unsetenv("TANDEM_CUDA_SIM_ORDER");
  } else {
    setenv("TANDEM_CUDA_SIM_ORDER", restore.c_str(), 1);
  }
}

}  // namespace
