// Device discovery for the cuda backend (see device.hpp).
#include "production/cuda/device.hpp"

#include <cuda_runtime.h>

namespace tandem::cuda {

int device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later queries start clean
    return 0;
  }
  return count;
}

std::string device_description(int index) {
  cudaDeviceProp properties{};
  const cudaError_t status = cudaGetDeviceProperties(&properties, index);
  if (status != cudaSuccess) return cudaGetErrorString(status);
  const double gib = static_cast<double>(properties.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  return std::string(properties.name) + " (sm_" + std::to_string(properties.major) +
         std::to_string(properties.minor) + ", " + std::to_string(static_cast<int>(gib)) + " GiB)";
}

}  // namespace tandem::cuda
