// cuda-sim's runtime state: the last error and the sticky fault, as the CUDA runtime keeps them
// (docs/CUDA-SIM.md "Errors"), devices and memory. Streams, events and the work queued on them
// are streams.cpp's.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cuda_sim/checks.hpp"
#include "cuda_sim/include/cuda_runtime.h"
#include "cuda_sim/runtime_internal.hpp"

namespace tandem::cuda_sim {
namespace {

struct ErrorState {
  std::mutex mutex;                  // taken to record or read an error, never to check `sticky`
  cudaError_t last = cudaSuccess;    // cleared by cudaGetLastError unless sticky
  std::atomic<cudaError_t> sticky{cudaSuccess};  // a fault in a kernel: every later call reports it
  std::string text;                  // what the error recorded last was (kernel, block, thread, line)
  cudaError_t text_error = cudaSuccess;  // its code: cudaGetLastError clears `last`, not the text
};

ErrorState& errors() {
  static ErrorState* state = new ErrorState;  // never destroyed: a stream's worker may record at exit
  return *state;
}

}  // namespace

// Relaxed: a stale cudaSuccess only lets one more operation start, which a device allows too
// (the fault is asynchronous to it); a stronger order would be a happens-before between every
// two streams, hiding their races from ThreadSanitizer.
cudaError_t sticky_error() { return errors().sticky.load(std::memory_order_relaxed); }

void record_error(cudaError_t error, const std::string& text, bool sticky) {
  ErrorState& state = errors();
  const std::lock_guard lock(state.mutex);
  if (state.sticky.load(std::memory_order_relaxed) != cudaSuccess) return;  // the first fault is the one reported
  state.last = error;
  state.text = text;
  state.text_error = error;
  if (sticky) state.sticky.store(error, std::memory_order_relaxed);
}

namespace {
DeviceMemoryChecks memory_checks;
bool memory_checks_installed = false;  // set once, before the first cudaMalloc
}  // namespace

void install_device_memory_checks(const DeviceMemoryChecks& checks) {
  memory_checks = checks;
  memory_checks_installed = true;
}

const DeviceMemoryChecks* device_memory_checks() { return memory_checks_installed ? &memory_checks : nullptr; }

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

}  // namespace

namespace tandem::cuda_sim {
namespace {

// This thread's device (cudaSetDevice's): a name only, every device sharing the process's memory,
// streams and sticky error; what tells them apart is NCCL's rule of one rank a device (nccl.cpp).
thread_local int current_device_index = 0;

}  // namespace

int device_count() {
  const char* text = std::getenv("TANDEM_CUDA_SIM_DEVICES");
  if (text == nullptr || *text == '\0') return kDefaultDevices;
  char* end = nullptr;
  const long count = std::strtol(text, &end, 10);
  if (*end != '\0' || count < 1 || count > kMaxDevices) {
    throw std::invalid_argument(std::string("TANDEM_CUDA_SIM_DEVICES=") + text + ": must be a whole number from 1 to " +
                                std::to_string(kMaxDevices) + " (the devices cuda-sim answers for)");
  }
  return static_cast<int>(count);
}

int current_device() { return current_device_index; }
void set_current_device(int device) { current_device_index = device; }

}  // namespace tandem::cuda_sim

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  try {
    *count = tandem::cuda_sim::device_count();
  } catch (const std::invalid_argument& error) {
    tandem::cuda_sim::record_error(cudaErrorInvalidValue, error.what(), false);
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  int count = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) return status;
  if (device < 0 || device >= count) return cudaErrorInvalidDevice;
  tandem::cuda_sim::set_current_device(device);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
  int count = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) return status;
  if (properties == nullptr) return cudaErrorInvalidValue;
  if (device < 0 || device >= count) return cudaErrorInvalidDevice;
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
  const auto* checks = tandem::cuda_sim::device_memory_checks();
  void* memory = checks != nullptr ? checks->allocate(bytes) : std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
  if (memory == nullptr) return cudaErrorMemoryAllocation;
  if (checks == nullptr) std::memset(memory, 0xFF, rounded == 0 ? 256 : rounded);
  Allocations& state = allocations();
  const std::lock_guard lock(state.mutex);
  state.sizes[memory] = bytes;
  state.bytes += bytes;
  *pointer = memory;
  return cudaSuccess;
}

// As on a device, cudaFree first waits for the work queued on every stream (which may use it).
cudaError_t cudaFree(void* pointer) {
  if (pointer == nullptr) return cudaSuccess;
  tandem::cuda_sim::drain_all_streams();
  Allocations& state = allocations();
  const std::lock_guard lock(state.mutex);
  const auto found = state.sizes.find(pointer);
  if (found == state.sizes.end()) return cudaErrorInvalidValue;
  state.bytes -= found->second;
  state.sizes.erase(found);
  const auto* checks = tandem::cuda_sim::device_memory_checks();
  if (checks != nullptr) {
    checks->release(pointer);
  } else {
    std::free(pointer);
  }
  return cudaSuccess;
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
  if (state.sticky.load(std::memory_order_relaxed) == cudaSuccess) state.last = cudaSuccess;
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
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
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
  if (error != cudaSuccess && error == state.text_error && !state.text.empty()) return state.text.c_str();
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unrecognized error code";
}

// Waits for every stream's work (dropped when the context has faulted), then clears the errors;
// streams and allocations stay (a device's reset would destroy them).
cudaError_t cudaDeviceReset() {
  tandem::cuda_sim::drain_all_streams();
  auto& state = tandem::cuda_sim::errors();
  const std::lock_guard lock(state.mutex);
  state.last = cudaSuccess;
  state.sticky.store(cudaSuccess, std::memory_order_relaxed);
  state.text.clear();
  state.text_error = cudaSuccess;
  return cudaSuccess;
}
