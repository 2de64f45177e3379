// What cuda-sim's runtime files share (runtime.cpp: the errors and memory; streams.cpp: streams,
// events and the work queued on them). Not for the project's sources or tests.
#pragma once

#include <string>

#include "cuda_sim/include/cuda_runtime.h"

namespace tandem::cuda_sim {

// The sticky error (a fault in a kernel), cudaSuccess while there is none: one relaxed atomic
// load, no lock, so that checking it before every operation orders nothing between streams.
cudaError_t sticky_error();
// Records an error as the runtime would: the last error, its text for cudaGetErrorString, and
// with `sticky` the error every later call returns. The first sticky error is kept.
void record_error(cudaError_t error, const std::string& text, bool sticky);
// The devices cuda-sim answers for: TANDEM_CUDA_SIM_DEVICES, kDefaultDevices when unset (enough
// for the 8-rank layouts on threads, one device a rank as NCCL requires); std::invalid_argument
// naming the variable for a value outside [1, kMaxDevices].
inline constexpr int kDefaultDevices = 8;
inline constexpr int kMaxDevices = 1024;
int device_count();
int current_device();  // this thread's, cudaSetDevice's (0 until it is called)
void set_current_device(int device);

// Waits until every stream of the calling thread's device has run everything queued on it
// (deferred mode: runs it).
void drain_all_streams();

}  // namespace tandem::cuda_sim
