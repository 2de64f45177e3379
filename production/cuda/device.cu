// Device discovery for the cuda backend (see device.hpp).
#include "production/cuda/device.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace tandem::cuda::inline TANDEM_CUDA_TARGET {

int device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later queries start clean
    return 0;
  }
  return count;
}

void use_device(int index) {
  const cudaError_t status = cudaSetDevice(index);
  if (status != cudaSuccess) {
    throw std::runtime_error("cudaSetDevice(" + std::to_string(index) + ") failed: " + cudaGetErrorString(status));
  }
}

std::string device_description(int index) {
  cudaDeviceProp properties{};
  const cudaError_t status = cudaGetDeviceProperties(&properties, index);
  if (status != cudaSuccess) return cudaGetErrorString(status);
  const double gib = static_cast<double>(properties.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  return std::string(properties.name) + " (sm_" + std::to_string(properties.major) +
         std::to_string(properties.minor) + ", " + std::to_string(static_cast<int>(gib)) + " GiB)";
}

DeviceMemory device_memory(int index) {
  DeviceMemory memory;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  cudaError_t status = cudaSetDevice(index);
  if (status == cudaSuccess) status = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("cudaMemGetInfo on device ") + std::to_string(index) + ": " +
                             cudaGetErrorString(status));
  }
  memory.free_bytes = static_cast<std::int64_t>(free_bytes);
  memory.total_bytes = static_cast<std::int64_t>(total_bytes);
  return memory;
}

}  // namespace tandem::cuda::inline TANDEM_CUDA_TARGET
