// cuda-sim's execution engine: runs a kernel launch on the CPU as CUDA would on sm_90, a grid of
// blocks, each block's threads as fibers (Boost.Context) that run straight through until their
// first barrier or warp collective, then wait there until the collective completes.
//
// Only the stand-in headers in cuda_sim/include/ and their tests include this; the project's .cu
// files reach it through <cuda_runtime.h> when they are compiled for cuda-sim (docs/CUDA-SIM.md).
// No Boost here: the fibers live in engine.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace tandem::cuda_sim {

// The order in which a block's runnable threads are resumed, each time the engine goes round them
// (every order is one CUDA allows: a kernel whose result depends on it lacks a barrier).
enum class ThreadOrder {
  forward,  // thread 0, 1, 2, ...
  reverse,  // the last thread first
  random,   // a permutation drawn per block from (seed, launch number, block)
};

struct OrderSetting {
  ThreadOrder order = ThreadOrder::forward;
  std::uint64_t seed = 0;  // random only
};

// TANDEM_CUDA_SIM_ORDER: "forward" (default), "reverse" or "random[:SEED]" (SEED default 1).
// Anything else throws std::invalid_argument naming the variable, the value and the choices.
OrderSetting order_from_environment();
// Overrides the environment for the launches that follow (tests).
void set_thread_order(OrderSetting setting);
OrderSetting thread_order();
std::string describe(OrderSetting setting);

struct Dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

// Where a launch was written and how it was configured.
struct LaunchSite {
  const char* kernel = "";  // the kernel as the launch names it, e.g. "add_kernel<T>"
  const char* file = "";
  int line = 0;
  Dim3 grid;
  Dim3 block;
  std::size_t dynamic_shared_bytes = 0;
  void* stream = nullptr;
};

// A fault inside a kernel (a divergent barrier, a warp collective a lane of its mask never
// reaches, an invalid launch): the message names the kernel, the block, the thread and the line.
struct KernelFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A launch whose grid or block sm_90 refuses (it never starts).
struct InvalidConfiguration : KernelFault {
  using KernelFault::KernelFault;
};

// Runs `thread_body` once per thread of the launch, with threadIdx, blockIdx, blockDim and gridDim
// set, block after block (x fastest). Throws KernelFault on a fault; an exception thrown by the
// body ends the launch and is rethrown.
void launch(const LaunchSite& site, const std::function<void()>& thread_body);

// Launches so far in this process (random order's per-launch draw).
std::uint64_t launch_count();

// __syncthreads() at file:line, called from a kernel's thread.
void sync_threads(const char* file, int line);

enum class ShuffleKind { xor_lane, down, up, index };
// A warp shuffle of `bits` (a value of up to 8 bytes): every lane of `mask` must arrive at the
// same call; the result is the bits of the source lane (down/up: your own when the source lane is
// outside your `width`-lane segment).
std::uint64_t shuffle(ShuffleKind kind, unsigned int mask, std::uint64_t bits, int lane_argument, int width,
                      const char* file, int line);

// Whether the caller runs inside a simulated kernel thread.
bool in_kernel();

}  // namespace tandem::cuda_sim
