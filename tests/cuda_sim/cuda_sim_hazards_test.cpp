// cuda-sim's hazard checks (cuda_sim/hazards.cpp, docs/CUDA-SIM.md "Hazard checks") on kernels
// written here, this file compiled with -fsanitize=thread as the checked kernels are: each hazard
// planted once and reported as an error naming the check, the kernel, the block, the thread, the
// address and this file's line; the same kernel with the hazard removed runs clean (the negative
// control of every report). One thread order, forward, set here: the reports name threads of it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_sim/hazards.hpp"

namespace {

using tandem::cuda_sim::OrderSetting;
using tandem::cuda_sim::ThreadOrder;

class CudaSimHazards : public ::testing::Test {
 protected:
  void SetUp() override {
    tandem::cuda_sim::set_thread_order(OrderSetting{ThreadOrder::forward, 0});
    cudaDeviceReset();
  }
  void TearDown() override {
    for (void* memory : allocations_) cudaFree(memory);
    cudaDeviceReset();
  }
  template <class T>
  T* device(std::size_t count) {
    void* memory = nullptr;
    EXPECT_EQ(cudaMalloc(&memory, count * sizeof(T)), cudaSuccess);
    allocations_.push_back(memory);
    return static_cast<T*>(memory);
  }
  // The launch's error text, after checking it is the sticky launch failure.
  static std::string fault_text() {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    return cudaGetErrorString(cudaErrorLaunchFailure);
  }
  std::vector<void*> allocations_;
};

std::string hex(const void* address) {
  std::ostringstream text;
  text << "0x" << std::hex << reinterpret_cast<std::uintptr_t>(address);
  return text.str();
}

std::string here(int line) { return std::string("cuda_sim_hazards_test.cpp:") + std::to_string(line); }

constexpr int kTwoWarps = 64;

// Each thread stores its index, then reads the other warp's mirror lane: with `barrier`, after
// every store; without, thread 0 reads element 32 before thread 32 stores it.
constexpr int kDynamicWriteLine = __LINE__ + 4;
__global__ void dynamic_exchange_kernel(int* out, bool barrier) {
  TANDEM_DYNAMIC_SHARED(int, shared);
  const unsigned int t = threadIdx.x;
  shared[t] = static_cast<int>(t);
  if (barrier) __syncthreads();
  out[t] = shared[(t + 32) % kTwoWarps];
}

TEST_F(CudaSimHazards, RacecheckReportsAWriteAfterAnotherWarpsReadOfDynamicSharedMemoryWithNoBarrier) {
  int* out = device<int>(kTwoWarps);
  TANDEM_LAUNCH(1, kTwoWarps, kTwoWarps * sizeof(int), nullptr, dynamic_exchange_kernel)(out, false);
  const std::string text = fault_text();
  EXPECT_NE(text.find("kernel dynamic_exchange_kernel"), std::string::npos) << text;
  EXPECT_NE(text.find("block (0,0,0): thread (32,0,0) racecheck: write of 4 bytes at 0x"), std::string::npos) << text;
  EXPECT_NE(text.find("(dynamic shared memory, byte 128 of 256) after thread (0,0,0)'s read"), std::string::npos)
      << text;
  EXPECT_NE(text.find(here(kDynamicWriteLine)), std::string::npos) << text;
}

TEST_F(CudaSimHazards, RacecheckIsCleanWithTheBarrierAndTheExchangeIsRight) {
  int* out = device<int>(kTwoWarps);
  TANDEM_LAUNCH(1, kTwoWarps, kTwoWarps * sizeof(int), nullptr, dynamic_exchange_kernel)(out, true);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
  std::vector<int> host(kTwoWarps, -1);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), out, kTwoWarps * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int t = 0; t < kTwoWarps; ++t) EXPECT_EQ(host[static_cast<std::size_t>(t)], (t + 32) % kTwoWarps) << t;
}

// The same exchange through a static __shared__ array (a thread-local of the block's OS thread).
constexpr int kStaticWriteLine = __LINE__ + 4;
__global__ void static_exchange_kernel(int* out, bool barrier) {
  __shared__ int tile[kTwoWarps];
  const unsigned int t = threadIdx.x;
  tile[t] = static_cast<int>(t);
  if (barrier) __syncthreads();
  out[t] = tile[(t + 32) % kTwoWarps];
}

TEST_F(CudaSimHazards, RacecheckCoversStaticSharedMemory) {
  ASSERT_TRUE(tandem::cuda_sim::static_shared_checked());
  int* out = device<int>(kTwoWarps);
  TANDEM_LAUNCH(1, kTwoWarps, 0, nullptr, static_exchange_kernel)(out, true);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
  TANDEM_LAUNCH(1, kTwoWarps, 0, nullptr, static_exchange_kernel)(out, false);
  const std::string text = fault_text();
  EXPECT_NE(text.find("block (0,0,0): thread (32,0,0) racecheck: write of 4 bytes at 0x"), std::string::npos) << text;
  EXPECT_NE(text.find("(static __shared__ memory) after thread (0,0,0)'s read"), std::string::npos) << text;
  EXPECT_NE(text.find(here(kStaticWriteLine)), std::string::npos) << text;
}

// Lanes of one warp: lane l reads lane l ^ 1's store. A warp collective between orders them (as
// __syncwarp would); without one it is a hazard, as racecheck reports it on sm_70 and later.
constexpr int kLaneWriteLine = __LINE__ + 4;
__global__ void lane_exchange_kernel(int* out, bool synchronize) {
  TANDEM_DYNAMIC_SHARED(int, shared);
  const unsigned int lane = threadIdx.x;
  shared[lane] = static_cast<int>(lane);
  const int partner = synchronize ? __shfl_xor_sync(0xFFFFFFFFu, static_cast<int>(lane ^ 1u), 0) : static_cast<int>(lane ^ 1u);
  out[lane] = shared[partner];
}

TEST_F(CudaSimHazards, AWarpCollectiveOrdersItsLanesAndWithoutOneLanesRace) {
  int* out = device<int>(32);
  TANDEM_LAUNCH(1, 32, 32 * sizeof(int), nullptr, lane_exchange_kernel)(out, true);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
  TANDEM_LAUNCH(1, 32, 32 * sizeof(int), nullptr, lane_exchange_kernel)(out, false);
  const std::string text = fault_text();
  // Lane 0 reads lane 1's element before lane 1 stores it.
  EXPECT_NE(text.find("thread (1,0,0) racecheck: write of 4 bytes at 0x"), std::string::npos) << text;
  EXPECT_NE(text.find("(dynamic shared memory, byte 4 of 128) after thread (0,0,0)'s read"), std::string::npos) << text;
  EXPECT_NE(text.find(here(kLaneWriteLine)), std::string::npos) << text;
}

constexpr int kCopyReadLine = __LINE__ + 3;
__global__ void copy_kernel(const float* in, float* out, int count) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < count) out[i] = in[i];
}

TEST_F(CudaSimHazards, InitcheckReportsAReadOfDeviceMemoryNeverWritten) {
  float* in = device<float>(kTwoWarps);
  float* out = device<float>(kTwoWarps);
  TANDEM_LAUNCH(2, 32, 0, nullptr, copy_kernel)(in, out, kTwoWarps);
  const std::string text = fault_text();
  EXPECT_NE(text.find("kernel copy_kernel"), std::string::npos) << text;
  EXPECT_NE(text.find("block (0,0,0): thread (0,0,0) initcheck: read of 4 bytes at " + hex(in) +
                      " reads device memory never written (byte 0 of the allocation of 256 bytes at " + hex(in) + ")"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(here(kCopyReadLine)), std::string::npos) << text;
}

TEST_F(CudaSimHazards, InitcheckIsCleanAfterAMemsetOrACopyAndFollowsACopyOfUnwrittenMemory) {
  float* in = device<float>(kTwoWarps);
  float* out = device<float>(kTwoWarps);
  ASSERT_EQ(cudaMemsetAsync(in, 0, kTwoWarps * sizeof(float)), cudaSuccess);
  TANDEM_LAUNCH(2, 32, 0, nullptr, copy_kernel)(in, out, kTwoWarps);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
  const std::vector<float> host(kTwoWarps, 0.5f);
  ASSERT_EQ(cudaMemcpyAsync(in, host.data(), kTwoWarps * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  TANDEM_LAUNCH(2, 32, 0, nullptr, copy_kernel)(in, out, kTwoWarps);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
  // A device-to-device copy of memory never written leaves its destination unwritten.
  float* unwritten = device<float>(kTwoWarps);
  ASSERT_EQ(cudaMemcpyAsync(in, unwritten, kTwoWarps * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
  TANDEM_LAUNCH(2, 32, 0, nullptr, copy_kernel)(in, out, kTwoWarps);
  EXPECT_NE(fault_text().find("initcheck"), std::string::npos);
}

TEST_F(CudaSimHazards, MemcheckReportsAStoreOneElementPastTheEndOfAnAllocation) {
  float* in = device<float>(kTwoWarps);
  ASSERT_EQ(cudaMemsetAsync(in, 0, kTwoWarps * sizeof(float)), cudaSuccess);
  float* out = device<float>(kTwoWarps - 1);  // 252 bytes: the last thread's store is past its end
  TANDEM_LAUNCH(2, 32, 0, nullptr, copy_kernel)(in, out, kTwoWarps);
  const std::string text = fault_text();
  EXPECT_NE(text.find("block (1,0,0): thread (31,0,0) memcheck: write of 4 bytes at " + hex(out + kTwoWarps - 1) +
                      ", outside every live allocation: 0 bytes past the end of the allocation of 252 bytes at " +
                      hex(out)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(here(kCopyReadLine)), std::string::npos) << text;
  // The negative control: the allocation's own size runs clean.
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  TANDEM_LAUNCH(2, 32, 0, nullptr, copy_kernel)(in, out, kTwoWarps - 1);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
}

TEST_F(CudaSimHazards, MemcheckReportsAReadAfterCudaFree) {
  float* in = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), kTwoWarps * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(in, 0, kTwoWarps * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaFree(in), cudaSuccess);
  float* out = device<float>(kTwoWarps);
  TANDEM_LAUNCH(2, 32, 0, nullptr, copy_kernel)(in, out, kTwoWarps);
  const std::string text = fault_text();
  EXPECT_NE(text.find("block (0,0,0): thread (0,0,0) memcheck: read of 4 bytes at " + hex(in) +
                      ", outside every live allocation: byte 0 of a freed allocation (cudaFree) of 256 bytes at " +
                      hex(in)),
            std::string::npos)
      << text;
}

// Reads element `index` of a dynamic shared buffer of 32 ints, after every thread stored its own.
constexpr int kSharedReadLine = __LINE__ + 5;
__global__ void shared_tail_kernel(int* out, int index) {
  TANDEM_DYNAMIC_SHARED(int, shared);
  shared[threadIdx.x] = 1;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = shared[index];
}

TEST_F(CudaSimHazards, MemcheckReportsAReadPastTheEndOfDynamicSharedMemory) {
  int* out = device<int>(1);
  TANDEM_LAUNCH(1, 32, 32 * sizeof(int), nullptr, shared_tail_kernel)(out, 31);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
  TANDEM_LAUNCH(1, 32, 32 * sizeof(int), nullptr, shared_tail_kernel)(out, 32);
  const std::string text = fault_text();
  EXPECT_NE(text.find("thread (0,0,0) memcheck: read of 4 bytes at 0x"), std::string::npos) << text;
  EXPECT_NE(text.find("past the end of the block's 128 bytes of dynamic shared memory (byte 128)"), std::string::npos)
      << text;
  EXPECT_NE(text.find(here(kSharedReadLine)), std::string::npos) << text;
}

// kernel_support.cuh's block reduction without its first barrier (the planted bug
// tests/cuda_sim/mutants.cmake's block_sum_without_its_first_barrier makes in the shipped file):
// racecheck names it on the first level, whatever the values.
constexpr int kReductionStoreLine = __LINE__ + 3;
__global__ void block_sum_missing_barrier_kernel(float* out) {
  __shared__ float scratch[kTwoWarps];
  scratch[threadIdx.x] = 1.0f;
  for (unsigned int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      scratch[threadIdx.x] = scratch[threadIdx.x] + scratch[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = scratch[0];
}

TEST_F(CudaSimHazards, RacecheckReportsABlockReductionWithoutItsFirstBarrier) {
  float* out = device<float>(1);
  TANDEM_LAUNCH(1, kTwoWarps, 0, nullptr, block_sum_missing_barrier_kernel)(out);
  const std::string text = fault_text();
  // Thread 0 read element 32 before thread 32 stored it.
  EXPECT_NE(text.find("thread (32,0,0) racecheck: write of 4 bytes"), std::string::npos) << text;
  EXPECT_NE(text.find("after thread (0,0,0)'s read"), std::string::npos) << text;
  EXPECT_NE(text.find(here(kReductionStoreLine)), std::string::npos) << text;
}

}  // namespace
