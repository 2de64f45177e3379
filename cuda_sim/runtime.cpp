// cuda-sim's runtime state: the last error and the sticky fault, as the CUDA runtime keeps them
// (docs/CUDA-SIM.md "Errors"), and the launch that records them.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

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
  } catch (const InvalidLaunchArgument& error) {
    record(cudaErrorInvalidValue, error.what(), false);
  } catch (const std::exception& error) {
    record(cudaErrorLaunchFailure, error.what(), true);
  }
}

cudaError_t run_on_stream(cudaStream_t, const std::function<void()>& work) {
  {
    ErrorState& state = errors();
    const std::lock_guard lock(state.mutex);
    if (state.sticky != cudaSuccess) return state.sticky;
  }
  work();
  return cudaSuccess;
}

}  // namespace tandem::cuda_sim

namespace {

// Every allocation by cudaMalloc, for cudaFree and cudaMemGetInfo.
struct Allocations {
  std::mutex mutex;
  std::map<void*, std::size_t> sizes;
  std::size_t bytes = 0;
};
Allocations& allocations() {
  static Allocations* state = new Allocations;  // never destroyed: frees may come from static teardown
  return *state;
}

// What the host gives this process: its physical memory.
std::size_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_bytes > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_bytes) : 0;
}

cudaError_t sticky_error() {
  auto& state = tandem::cuda_sim::errors();
  const std::lock_guard lock(state.mutex);
  return state.sticky;
}

// Streams and events are handles only (every stream is synchronous): a distinct address each,
// holding the flags it was made with.
struct Flags {
  unsigned int flags = 0;
};

template <class Handle>
cudaError_t create_handle(Handle* handle, unsigned int flags) {
  if (handle == nullptr) return cudaErrorInvalidValue;
  *handle = reinterpret_cast<Handle>(new Flags{flags});
  return cudaSuccess;
}

template <class Handle>
cudaError_t destroy_handle(Handle handle) {
  delete reinterpret_cast<Flags*>(handle);
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidValue; }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
  if (properties == nullptr || device != 0) return cudaErrorInvalidValue;
  *properties = cudaDeviceProp{};
  std::strncpy(properties->name, "cuda-sim (sm_90 rules on the CPU)", sizeof(properties->name) - 1);
  properties->totalGlobalMem = host_memory_bytes();
  properties->sharedMemPerBlockOptin = tandem::cuda_sim::kMaxDynamicSharedBytes;
  properties->major = 9;
  properties->minor = 0;
  properties->multiProcessorCount = 1;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return cudaErrorInvalidValue;
  Allocations& state = allocations();
  const std::lock_guard lock(state.mutex);
  *total_bytes = host_memory_bytes();
  *free_bytes = *total_bytes > state.bytes ? *total_bytes - state.bytes : 0;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** pointer, std::size_t bytes) {
  if (pointer == nullptr) return cudaErrorInvalidValue;
  const std::size_t rounded = (bytes + 255) / 256 * 256;
  void* memory = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
  if (memory == nullptr) return cudaErrorMemoryAllocation;
  std::memset(memory, 0xFF, rounded == 0 ? 256 : rounded);
  Allocations& state = allocations();
  const std::lock_guard lock(state.mutex);
  state.sizes[memory] = bytes;
  state.bytes += bytes;
  *pointer = memory;
  return cudaSuccess;
}

cudaError_t cudaFree(void* pointer) {
  if (pointer == nullptr) return cudaSuccess;
  Allocations& state = allocations();
  const std::lock_guard lock(state.mutex);
  const auto found = state.sizes.find(pointer);
  if (found == state.sizes.end()) return cudaErrorInvalidValue;
  state.bytes -= found->second;
  state.sizes.erase(found);
  std::free(pointer);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* destination, int value, std::size_t bytes, cudaStream_t stream) {
  return tandem::cuda_sim::run_on_stream(stream, [&] { std::memset(destination, value, bytes); });
}

cudaError_t cudaMemcpyAsync(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidValue;
  return tandem::cuda_sim::run_on_stream(stream, [&] {
    if (bytes != 0) std::memmove(destination, source, bytes);
  });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) { return create_handle(stream, flags); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) { return destroy_handle(stream); }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return sticky_error(); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned int) {
  return event == nullptr ? cudaErrorInvalidValue : sticky_error();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) { return create_handle(event, flags); }
cudaError_t cudaEventDestroy(cudaEvent_t event) { return destroy_handle(event); }

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  return event == nullptr ? cudaErrorInvalidValue : sticky_error();
}

cudaError_t cuda_sim_func_set_attribute(const void* function, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      !tandem::cuda_sim::set_max_dynamic_shared(function, static_cast<std::size_t>(value))) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

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
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
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
    case cudaErrorMemoryAllocation: return "out of memory";
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
