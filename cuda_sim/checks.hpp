// The hooks of cuda-sim's hazard checks (cuda_sim/hazards.cpp, docs/CUDA-SIM.md "Hazard checks"):
// what the engine and the runtime call where a checked executable has installed them (before its
// first launch or cudaMalloc). In any other executable nothing is installed and no hook is called.
// Only cuda-sim's own files include this.
#pragma once

#include <cstddef>
#include <string>

namespace tandem::cuda_sim {

// The engine's (engine.cpp), each called on the block's OS thread.
struct EngineChecks {
  // Before the block's first thread runs: its dynamic shared memory (kSharedRedZoneBytes past its
  // 16-byte rounded end are allocated too, for the checks' red zone).
  void (*block_begins)(void* dynamic_shared, std::size_t bytes) = nullptr;
  void (*barrier_released)() = nullptr;           // every waiting thread of the block left __syncthreads
  void (*warp_synchronized)(int warp) = nullptr;  // warp collectives of warp `warp` completed
  void (*thread_ends)() = nullptr;                // a thread's body returned: may throw KernelFault
};
void install_checks(const EngineChecks& checks);
inline constexpr std::size_t kSharedRedZoneBytes = 256;

// The text engine.hpp's thread_fault starts with: "cuda-sim: kernel K (launched at F:L), block
// (x,y,z): thread (x,y,z)"; and the running thread's linear index in its block (x fastest).
std::string running_thread_text();
int thread_rank();

// The runtime's (runtime.cpp, streams.cpp, cublaslt.cpp): device memory.
struct DeviceMemoryChecks {
  void* (*allocate)(std::size_t bytes) = nullptr;  // 256-byte aligned, 0xFF-filled, red zones around
  void (*release)(void* memory) = nullptr;         // quarantined: never handed out again
  // What the runtime and cuBLASLt write into device memory (kernels' stores are seen as they run).
  void (*written)(void* destination, std::size_t bytes) = nullptr;
  void (*copied)(void* destination, const void* source, std::size_t bytes) = nullptr;
};
void install_device_memory_checks(const DeviceMemoryChecks& checks);
const DeviceMemoryChecks* device_memory_checks();  // null unless installed

}  // namespace tandem::cuda_sim
