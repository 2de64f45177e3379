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
  const void* function = nullptr;  // the kernel's entry (its cudaFuncSetAttribute limits)
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
// A launch asking more dynamic shared memory than its kernel's limit (it never starts; the runtime
// reports cudaErrorInvalidValue).
struct InvalidLaunchArgument : KernelFault {
  using KernelFault::KernelFault;
};

// What a launch call settles on the calling thread, before the launch runs (later, on a stream's
// worker, when the stream is not the null stream): its configuration checked, the thread order in
// force at the call and the launch's number (random order's draw), so neither depends on when the
// launch runs.
struct PreparedLaunch {
  LaunchSite site;
  OrderSetting order;
  std::uint64_t number = 0;
};
// Throws InvalidConfiguration or InvalidLaunchArgument for a launch sm_90 refuses, KernelFault for
// a launch from inside a kernel; takes the order and the next launch number.
PreparedLaunch prepare_launch(const LaunchSite& site);
// Runs `thread_body` once per thread of the launch, with threadIdx, blockIdx, blockDim and gridDim
// set, block after block (x fastest). Throws KernelFault on a fault; an exception thrown by the
// body ends the launch and is rethrown.
void run_prepared(const PreparedLaunch& launch, const std::function<void()>& thread_body);
// prepare_launch, then run_prepared.
void launch(const LaunchSite& site, const std::function<void()>& thread_body);

// Launches so far in this process (random order's per-launch draw).
std::uint64_t launch_count();

// __syncthreads() at file:line, called from a kernel's thread.
void sync_threads(const char* file, int line);

enum class ShuffleKind { xor_lane, down, up, index, exchange };
// A warp shuffle of `bits` (a value of up to 8 bytes): every lane of `mask` must arrive at the
// same call; the result is the bits of the source lane (down/up: your own when the source lane is
// outside your `width`-lane segment).
std::uint64_t shuffle(ShuffleKind kind, unsigned int mask, std::uint64_t bits, int lane_argument, int width,
                      const char* file, int line);

// A warp collective that gives every lane of `mask` every lane's `bytes` bytes at `send`:
// `receive` gets 32 slots of `bytes`, lane i's in slot i (slots of lanes outside the mask are left
// as they are). The tensor-core emulations (tensor_core.hpp) are built on it.
void warp_exchange(unsigned int mask, const void* send, void* receive, std::size_t bytes, const char* file, int line);

// The running block's dynamic shared memory (the launch's dynamic_shared_bytes, 16-byte aligned,
// filled with 0xFF bytes: CUDA leaves it undefined, and all-ones reads as NaN in float and bf16),
// and its size.
void* dynamic_shared();
std::size_t dynamic_shared_bytes();

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) as sm_90 takes
// it: up to 227 KiB (232,448 bytes) opted in; a launch asking more dynamic shared memory than its
// kernel's limit (48 KiB until raised) is refused. Returns false for a limit sm_90 refuses.
inline constexpr std::size_t kDefaultDynamicSharedBytes = 48 * 1024;
inline constexpr std::size_t kMaxDynamicSharedBytes = 232448;
bool set_max_dynamic_shared(const void* function, std::size_t bytes);
std::size_t max_dynamic_shared(const void* function);

// Whether the caller runs inside a simulated kernel thread.
bool in_kernel();
// The running thread's lane in its warp (its linear index in the block, modulo 32).
int thread_lane();

// The running thread's coordinates, for a fault raised outside the engine (tensor_core.cpp):
// throws KernelFault naming the kernel, launch site, block and thread, then `what`.
[[noreturn]] void thread_fault(const std::string& what);

}  // namespace tandem::cuda_sim
