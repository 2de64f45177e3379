// cuda-sim's runtime state: the last error and the sticky fault, as the CUDA runtime keeps them
// (docs/CUDA-SIM.md "Errors"), and the launch that records them.
#include <mutex>
#include <string>

#include "cuda_sim/include/cublasLt.h"
#include "cuda_sim/include/cuda_runtime.h"

namespace tandem::cuda_sim {
namespace {

struct ErrorState {
  std::mutex mutex;
  cudaError_t last = cudaSuccess;    // cleared by cudaGetLastError unless sticky
  cudaError_t sticky = cudaSuccess;  // a fault in a kernel: every later call reports it
  std::string text;                  // what the fault was (kernel, block, thread, line)
};

ErrorState& errors() {
  static ErrorState state;
  return state;
}

void record(cudaError_t error, const std::string& text, bool sticky) {
  ErrorState& state = errors();
  const std::lock_guard lock(state.mutex);
  if (state.sticky != cudaSuccess) return;  // the first fault is the one reported
  state.last = error;
  state.text = text;
  if (sticky) state.sticky = error;
}

}  // namespace

void run_launch(const LaunchSite& site, const std::function<void()>& thread_body) {
  {
    ErrorState& state = errors();
    const std::lock_guard lock(state.mutex);
    if (state.sticky != cudaSuccess) return;  // a faulted context runs nothing more
  }
  try {
    launch(site, thread_body);
  } catch (const InvalidConfiguration& error) {
    record(cudaErrorInvalidConfiguration, error.what(), false);
  } catch (const std::exception& error) {
    record(cudaErrorLaunchFailure, error.what(), true);
  }
}

}  // namespace tandem::cuda_sim

cudaError_t cudaGetLastError() {
  auto& state = tandem::cuda_sim::errors();
  const std::lock_guard lock(state.mutex);
  const cudaError_t error = state.last;
  if (state.sticky == cudaSuccess) state.last = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() {
  auto& state = tandem::cuda_sim::errors();
  const std::lock_guard lock(state.mutex);
  return state.last;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "unrecognized error code";
}

// The runtime's text for the code, and for the error cuda-sim recorded last, what it was.
const char* cudaGetErrorString(cudaError_t error) {
  auto& state = tandem::cuda_sim::errors();
  const std::lock_guard lock(state.mutex);
  if (error != cudaSuccess && error == state.last && !state.text.empty()) return state.text.c_str();
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unrecognized error code";
}

// Launches run to completion before they return: there is nothing to wait for but the error.
cudaError_t cudaDeviceSynchronize() {
  auto& state = tandem::cuda_sim::errors();
  const std::lock_guard lock(state.mutex);
  return state.sticky;
}

cudaError_t cudaDeviceReset() {
  auto& state = tandem::cuda_sim::errors();
  const std::lock_guard lock(state.mutex);
  state.last = cudaSuccess;
  state.sticky = cudaSuccess;
  state.text.clear();
  return cudaSuccess;
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "unrecognized status";
}
